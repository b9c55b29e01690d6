//! [`Captured`]: the plugin's stderr and stdout, kept in memory and bounded.
//!
//! wasmtime-wasi's `MemoryOutputPipe` traps the guest once it is full; a plugin that
//! prints too much should not die of it, so this stream accepts every write and keeps
//! only the last `cap` bytes, counting what it dropped.

use std::sync::{Arc, Mutex, MutexGuard};

use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

#[derive(Debug, Default)]
struct Buffer {
    kept: std::collections::VecDeque<u8>,
    dropped: u64,
}

/// A bounded in-memory output stream; clones share the buffer.
#[derive(Debug, Clone)]
pub struct Captured {
    cap: usize,
    buf: Arc<Mutex<Buffer>>,
}

impl Captured {
    /// A stream keeping the last `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Captured {
            cap,
            buf: Arc::new(Mutex::new(Buffer::default())),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Buffer> {
        self.buf.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, bytes: &[u8]) {
        let mut b = self.lock();
        let skip = bytes.len().saturating_sub(self.cap);
        b.dropped += skip as u64;
        b.kept.extend(&bytes[skip..]);
        let over = b.kept.len().saturating_sub(self.cap);
        if over > 0 {
            b.kept.drain(..over);
            b.dropped += over as u64;
        }
    }

    /// What was kept, lossily decoded, with a first line saying how much was dropped.
    pub fn text(&self) -> String {
        let b = self.lock();
        let (front, back) = b.kept.as_slices();
        let body = String::from_utf8_lossy(&[front, back].concat()).into_owned();
        if b.dropped > 0 {
            format!("[{} earlier bytes dropped]\n{body}", b.dropped)
        } else {
            body
        }
    }
}

impl IsTerminal for Captured {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Captured {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        // Only the WASIp3 bindings use this, and they are not linked; a pipe that
        // keeps nothing is a safe answer.
        Box::new(MemoryOutputPipe::new(0))
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for Captured {
    fn write(&mut self, bytes: bytes::Bytes) -> Result<(), StreamError> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(64 << 10)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Captured {
    async fn ready(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_tail_and_counts_the_rest() {
        let c = Captured::new(8);
        c.push(b"hello ");
        assert_eq!(c.text(), "hello ");
        c.push(b"world, again");
        assert_eq!(c.text(), "[10 earlier bytes dropped]\nd, again");
        c.push(&[b'z'; 20]);
        assert!(c.text().ends_with("zzzzzzzz"));
    }
}
