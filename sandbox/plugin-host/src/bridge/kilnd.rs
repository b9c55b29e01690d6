//! [`KilndBridge`]: the plugin's imports as HTTP/1.1 JSON calls to kilnd on its Unix
//! socket, with the search's bearer token. The endpoints and bodies are in
//! docs/plugins.md ("Plugin host ↔ kilnd protocol") and [`crate::protocol`].

use base64::Engine;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Bridge, BridgeError, WAIT_SLACK};
use crate::http::Client;
use crate::protocol::{
    ArchiveReply, Budget, ChatReply, ChatRequest, Checkpoint, Context, ErrorBody, Finish, LogLine,
    Submitted, WaitReply, WaitRequest,
};

/// Timeout of every call except `wait` and `llm`.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Timeout of an `llm` call (the gateway retries with backoff inside it).
const LLM_TIMEOUT: Duration = Duration::from_secs(600);

/// The real bridge: one search's endpoints on kilnd's socket.
#[derive(Debug, Clone)]
pub struct KilndBridge {
    client: Client,
    base: String,
}

impl KilndBridge {
    /// A bridge for search `search` on the socket at `socket`, authenticating with `token`.
    pub fn new(socket: &Path, search: &str, token: String) -> Self {
        KilndBridge {
            client: Client::new(socket, token),
            base: format!("/v1/searches/{search}"),
        }
    }

    fn call_raw(
        &self,
        method: &str,
        suffix: &str,
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Vec<u8>, BridgeError> {
        let path = format!("{}/{suffix}", self.base);
        let r = self
            .client
            .request(method, &path, body, timeout)
            .map_err(|e| BridgeError::Transport(format!("{method} {path}: {e}")))?;
        if (200..300).contains(&r.status) {
            return Ok(r.body);
        }
        Err(match serde_json::from_slice::<ErrorBody>(&r.body) {
            Ok(e) => BridgeError::Refused {
                status: r.status,
                code: e.error.code,
                message: e.error.message,
            },
            Err(_) => BridgeError::Refused {
                status: r.status,
                code: format!("http_{}", r.status),
                message: String::from_utf8_lossy(&r.body).chars().take(500).collect(),
            },
        })
    }

    fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        suffix: &str,
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<T, BridgeError> {
        let bytes = self.call_raw(method, suffix, body, timeout)?;
        serde_json::from_slice(&bytes)
            .map_err(|e| BridgeError::Protocol(format!("{method} {suffix}: {e}")))
    }

    fn json<B: Serialize>(body: &B) -> Result<Vec<u8>, BridgeError> {
        serde_json::to_vec(body).map_err(|e| BridgeError::Protocol(e.to_string()))
    }
}

impl Bridge for KilndBridge {
    fn context(&mut self) -> Result<Context, BridgeError> {
        self.call("GET", "context", None, CALL_TIMEOUT)
    }

    fn submit(&mut self, candidate_json: &str) -> Result<Submitted, BridgeError> {
        self.call(
            "POST",
            "candidates",
            Some(candidate_json.as_bytes()),
            CALL_TIMEOUT,
        )
    }

    fn wait(&mut self, request: &WaitRequest) -> Result<WaitReply, BridgeError> {
        let timeout = Duration::from_millis(request.timeout_ms) + WAIT_SLACK;
        self.call("POST", "wait", Some(&Self::json(request)?), timeout)
    }

    fn archive(&mut self) -> Result<ArchiveReply, BridgeError> {
        self.call("GET", "archive", None, CALL_TIMEOUT)
    }

    fn chat(&mut self, request: &ChatRequest) -> Result<ChatReply, BridgeError> {
        self.call("POST", "llm", Some(&Self::json(request)?), LLM_TIMEOUT)
    }

    fn put_checkpoint(&mut self, data: &[u8]) -> Result<(), BridgeError> {
        let body = Self::json(&Checkpoint {
            data: Some(base64::engine::general_purpose::STANDARD.encode(data)),
        })?;
        self.call_raw("PUT", "checkpoint", Some(&body), CALL_TIMEOUT)
            .map(drop)
    }

    fn get_checkpoint(&mut self) -> Result<Option<Vec<u8>>, BridgeError> {
        let c: Checkpoint = self.call("GET", "checkpoint", None, CALL_TIMEOUT)?;
        c.data
            .map(|d| {
                base64::engine::general_purpose::STANDARD
                    .decode(d.trim())
                    .ok()
                    .ok_or_else(|| BridgeError::Protocol("checkpoint is not base64".into()))
            })
            .transpose()
    }

    fn log(&mut self, line: &LogLine) -> Result<(), BridgeError> {
        self.call_raw("POST", "log", Some(&Self::json(line)?), CALL_TIMEOUT)
            .map(drop)
    }

    fn budget(&mut self) -> Result<Budget, BridgeError> {
        self.call("GET", "budget", None, CALL_TIMEOUT)
    }

    fn finish(&mut self, report: &Finish) -> Result<(), BridgeError> {
        self.call_raw("POST", "finish", Some(&Self::json(report)?), CALL_TIMEOUT)
            .map(drop)
    }
}
