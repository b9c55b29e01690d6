//! A fake kilnd: the plugin host ↔ kilnd protocol (docs/plugins.md) served on a Unix
//! socket over a `FakeBridge`, so the real binary and its HTTP client are tested
//! against the documented JSON. It checks the bearer token and the search id in the
//! path, as kilnd must.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use kiln_plugin_host::bridge::fake::FakeBridge;
use kiln_plugin_host::bridge::{Bridge, BridgeError};
use kiln_plugin_host::protocol::{ChatRequest, Checkpoint, Finish, LogLine, WaitRequest};

pub struct FakeKilnd {
    pub socket: PathBuf,
    pub bridge: FakeBridge,
    _dir: tempfile::TempDir,
}

impl FakeKilnd {
    pub fn start(bridge: FakeBridge, token: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("kiln.sock");
        let listener = UnixListener::bind(&socket).expect("bind");
        let served = bridge.clone();
        let token = token.to_string();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { break };
                let mut bridge = served.clone();
                let token = token.clone();
                std::thread::spawn(move || serve(conn, &mut bridge, &token));
            }
        });
        FakeKilnd {
            socket,
            bridge,
            _dir: dir,
        }
    }
}

fn respond(mut conn: UnixStream, status: u16, body: &str) {
    let head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = conn.write_all(head.as_bytes());
    let _ = conn.write_all(body.as_bytes());
}

fn error(status: u16, code: &str, message: &str) -> (u16, String) {
    let body = serde_json::json!({"error": {"code": code, "message": message}});
    (status, body.to_string())
}

fn serve(conn: UnixStream, bridge: &mut FakeBridge, token: &str) {
    let mut reader = BufReader::new(conn.try_clone().expect("clone"));
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut parts = request_line.split_whitespace();
    let (method, path) = (
        parts.next().unwrap_or_default().to_string(),
        parts.next().unwrap_or_default().to_string(),
    );
    let mut length = 0usize;
    let mut auth = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            } else if k.eq_ignore_ascii_case("authorization") {
                auth = v.trim().to_string();
            }
        }
    }
    let mut body = vec![0u8; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let (status, reply) = route(bridge, token, &auth, &method, &path, &body);
    respond(conn, status, &reply);
}

fn route(
    bridge: &mut FakeBridge,
    token: &str,
    auth: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> (u16, String) {
    if auth != format!("Bearer {token}") {
        return error(401, "unauthorized", "bad or missing bearer token");
    }
    let search = bridge.state().context.search_id.clone();
    let Some(suffix) = path.strip_prefix(&format!("/v1/searches/{search}/")) else {
        return error(403, "forbidden", "this token is for another search");
    };
    let text = String::from_utf8_lossy(body).into_owned();
    let json = |v: Result<serde_json::Value, BridgeError>, ok: u16| match v {
        Ok(v) => (ok, v.to_string()),
        Err(BridgeError::Refused {
            status,
            code,
            message,
        }) => error(status, &code, &message),
        Err(e) => error(500, "internal", &e.to_string()),
    };
    let to = |v: serde_json::Result<serde_json::Value>| {
        v.map_err(|e| BridgeError::Protocol(e.to_string()))
    };
    let parse_err = |e: serde_json::Error| error(400, "invalid_json", &e.to_string());
    match (method, suffix) {
        ("GET", "context") => json(
            bridge.context().and_then(|c| to(serde_json::to_value(c))),
            200,
        ),
        ("POST", "candidates") => json(
            bridge
                .submit(&text)
                .and_then(|s| to(serde_json::to_value(s))),
            202,
        ),
        ("POST", "wait") => match serde_json::from_slice::<WaitRequest>(body) {
            Ok(r) => json(
                bridge.wait(&r).and_then(|w| to(serde_json::to_value(w))),
                200,
            ),
            Err(e) => parse_err(e),
        },
        ("GET", "archive") => json(
            bridge.archive().and_then(|a| to(serde_json::to_value(a))),
            200,
        ),
        ("POST", "llm") => match serde_json::from_slice::<ChatRequest>(body) {
            Ok(r) => json(
                bridge.chat(&r).and_then(|c| to(serde_json::to_value(c))),
                200,
            ),
            Err(e) => parse_err(e),
        },
        ("PUT", "checkpoint") => match serde_json::from_slice::<Checkpoint>(body) {
            Ok(Checkpoint { data: Some(d) }) => match base64::Engine::decode(&base64::engine::general_purpose::STANDARD, d.trim()).ok() {
                Some(bytes) => json(
                    bridge
                        .put_checkpoint(&bytes)
                        .map(|()| serde_json::json!({})),
                    200,
                ),
                None => error(400, "invalid_field", "data is not base64"),
            },
            Ok(_) => error(400, "invalid_field", "data is missing"),
            Err(e) => parse_err(e),
        },
        ("GET", "checkpoint") => json(
            bridge.get_checkpoint().map(
                |c| serde_json::json!({"data": c.map(|b| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &b))}),
            ),
            200,
        ),
        ("POST", "log") => match serde_json::from_slice::<LogLine>(body) {
            Ok(l) => json(bridge.log(&l).map(|()| serde_json::json!({})), 200),
            Err(e) => parse_err(e),
        },
        ("GET", "budget") => json(
            bridge.budget().and_then(|b| to(serde_json::to_value(b))),
            200,
        ),
        ("POST", "finish") => match serde_json::from_slice::<Finish>(body) {
            Ok(f) => json(bridge.finish(&f).map(|()| serde_json::json!({})), 200),
            Err(e) => parse_err(e),
        },
        _ => error(404, "not_found", "no such route"),
    }
}
