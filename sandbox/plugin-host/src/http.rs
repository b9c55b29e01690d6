//! A minimal blocking HTTP/1.1 client over a Unix socket: one request per connection
//! (`Connection: close`), bodies with `Content-Length` or chunked, bounded in size and
//! time. Enough for kilnd's JSON API without an async runtime.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;

/// Largest response accepted, in bytes (headers and body).
pub const MAX_RESPONSE_BYTES: u64 = 96 << 20;

/// Why an HTTP exchange failed.
#[derive(Debug, Error)]
pub enum HttpError {
    /// Connecting, writing or reading failed (a timeout included).
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The response is not HTTP/1.x, or too large.
    #[error("malformed response: {0}")]
    Malformed(String),
}

/// A response: status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Body, de-chunked.
    pub body: Vec<u8>,
}

/// A client for one socket and one bearer token.
#[derive(Clone)]
pub struct Client {
    socket: PathBuf,
    token: String,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        f.debug_struct("Client")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client that sends `Authorization: Bearer {token}` to the socket at `socket`.
    pub fn new(socket: &Path, token: String) -> Self {
        Client {
            socket: socket.to_path_buf(),
            token,
        }
    }

    /// Sends one request and reads the whole response, within `timeout` for each read
    /// and write.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Response, HttpError> {
        let mut stream = UnixStream::connect(&self.socket)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: kilnd\r\nAuthorization: Bearer {}\r\nAccept: application/json\r\nConnection: close\r\n",
            self.token
        );
        if let Some(b) = body {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                b.len()
            ));
        } else if method != "GET" {
            head.push_str("Content-Length: 0\r\n");
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes())?;
        if let Some(b) = body {
            stream.write_all(b)?;
        }
        stream.flush()?;
        let mut raw = Vec::new();
        stream.take(MAX_RESPONSE_BYTES + 1).read_to_end(&mut raw)?;
        if raw.len() as u64 > MAX_RESPONSE_BYTES {
            return Err(HttpError::Malformed(format!(
                "larger than {MAX_RESPONSE_BYTES} bytes"
            )));
        }
        parse_response(&raw)
    }
}

/// Parses a complete HTTP/1.x response.
pub fn parse_response(raw: &[u8]) -> Result<Response, HttpError> {
    let bad = |m: &str| HttpError::Malformed(m.to_string());
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let head = std::str::from_utf8(&raw[..split]).map_err(|_| bad("headers are not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or_else(|| bad("no status line"))?;
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(bad("not HTTP/1.x"));
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad status code"))?;
    let mut length: Option<usize> = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(value.parse().map_err(|_| bad("bad content-length"))?);
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            && value.to_ascii_lowercase().contains("chunked")
        {
            chunked = true;
        }
    }
    let rest = &raw[split + 4..];
    let body = if chunked {
        dechunk(rest).ok_or_else(|| bad("bad chunked body"))?
    } else if let Some(n) = length {
        rest.get(..n)
            .ok_or_else(|| bad("body shorter than content-length"))?
            .to_vec()
    } else {
        rest.to_vec()
    };
    Ok(Response { status, body })
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = data.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&data[..eol]).ok()?;
        let size_text = size_text.split(';').next()?.trim();
        let size = usize::from_str_radix(size_text, 16).ok()?;
        data = &data[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_length_and_chunked_bodies() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}").expect("parses");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"{}"[..]));
        let r = parse_response(
            b"HTTP/1.1 202 Accepted\r\ntransfer-encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n",
        )
        .expect("parses");
        assert_eq!(r.body, b"{\"a\":1}");
        let r = parse_response(b"HTTP/1.1 204 No Content\r\n\r\n").expect("parses");
        assert_eq!((r.status, r.body.len()), (204, 0));
        assert!(parse_response(b"garbage").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}").is_err());
    }
}
