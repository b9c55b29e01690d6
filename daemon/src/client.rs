//! A small HTTP/1.1 client over kilnd's Unix socket, used by the `kiln` CLI and the tests.
//!
//! One connection per request keeps it simple; the event stream reads Server-Sent Events
//! frame by frame.

use std::path::{Path, PathBuf};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use thiserror::Error;
use tokio::net::UnixStream;

/// What can go wrong talking to kilnd.
#[derive(Debug, Error)]
pub enum ClientError {
    /// Nothing answers on the socket.
    #[error(
        "kilnd is not running at {socket}.\nStart it with `kilnd` (user mode) or `sudo systemctl start kilnd` (system service), or point --socket / KILN_SOCKET at the right socket"
    )]
    NotRunning {
        /// The socket tried.
        socket: PathBuf,
        /// The connect error.
        source: std::io::Error,
    },
    /// kilnd answered with an error.
    #[error("kilnd refused the request ({status}, {code}): {message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// Error code from the body.
        code: String,
        /// Message from the body.
        message: String,
    },
    /// The HTTP exchange broke.
    #[error("talking to kilnd: {0}")]
    Http(String),
}

/// A client bound to one socket.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
}

impl Client {
    /// A client for `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Client {
            socket: socket.into(),
        }
    }

    /// The socket this client talks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Response<Incoming>, ClientError> {
        let stream =
            UnixStream::connect(&self.socket)
                .await
                .map_err(|source| ClientError::NotRunning {
                    socket: self.socket.clone(),
                    source,
                })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ClientError::Http(e.to_string()))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://localhost{path}"))
            .header("host", "localhost");
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| ClientError::Http(e.to_string()))?;
        sender
            .send_request(req)
            .await
            .map_err(|e| ClientError::Http(e.to_string()))
    }

    async fn json_response(resp: Response<Incoming>) -> Result<(StatusCode, Value), ClientError> {
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError::Http(e.to_string()))?
            .to_bytes();
        let value: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        if !status.is_success() {
            let code = value["error"]["code"]
                .as_str()
                .unwrap_or("unknown")
                .to_string();
            let message = value["error"]["message"]
                .as_str()
                .map_or_else(|| value.to_string(), str::to_string);
            return Err(ClientError::Api {
                status: status.as_u16(),
                code,
                message,
            });
        }
        Ok((status, value))
    }

    /// `GET path`, JSON back.
    pub async fn get(&self, path: &str) -> Result<Value, ClientError> {
        let resp = self.send(Method::GET, path, None).await?;
        Ok(Self::json_response(resp).await?.1)
    }

    /// `GET path`, text back (for `/metrics` and the HTML reports).
    pub async fn get_text(&self, path: &str) -> Result<String, ClientError> {
        let resp = self.send(Method::GET, path, None).await?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError::Http(e.to_string()))?
            .to_bytes();
        if !status.is_success() {
            // Errors are kilnd's JSON error body, as for every other route.
            let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            return Err(ClientError::Api {
                status: status.as_u16(),
                code: v["error"]["code"].as_str().unwrap_or("unknown").to_string(),
                message: v["error"]["message"].as_str().map_or_else(
                    || String::from_utf8_lossy(&bytes).into_owned(),
                    str::to_string,
                ),
            });
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// `POST path` with a JSON body; status and JSON back.
    pub async fn post(&self, path: &str, body: &Value) -> Result<(u16, Value), ClientError> {
        let bytes = serde_json::to_vec(body).map_err(|e| ClientError::Http(e.to_string()))?;
        let resp = self.send(Method::POST, path, Some(bytes)).await?;
        let (status, v) = Self::json_response(resp).await?;
        Ok((status.as_u16(), v))
    }

    /// Opens the event stream; call [`EventStream::next`] for each event.
    pub async fn events(&self) -> Result<EventStream, ClientError> {
        let resp = self.send(Method::GET, "/v1/events", None).await?;
        if !resp.status().is_success() {
            Self::json_response(resp).await?;
            return Err(ClientError::Http("the event stream was refused".into()));
        }
        Ok(EventStream {
            body: resp.into_body(),
            buf: String::new(),
        })
    }
}

/// Server-Sent Events from kilnd.
pub struct EventStream {
    body: Incoming,
    buf: String,
}

impl EventStream {
    /// The next event as (name, JSON data); `None` when the stream ends.
    pub async fn next(&mut self) -> Option<(String, Value)> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut name = String::from("message");
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if data.is_empty() {
                    continue; // keep-alive comment
                }
                let value = serde_json::from_str(&data).unwrap_or(Value::String(data));
                return Some((name, value));
            }
            let frame = self.body.frame().await?.ok()?;
            if let Ok(bytes) = frame.into_data() {
                self.buf.push_str(&String::from_utf8_lossy(&bytes));
            }
        }
    }
}
