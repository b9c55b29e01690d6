//! Device `printf` in a GPU worker: captured, counted and bounded.
//!
//! The CUDA driver writes what kernels print (through a FIFO of
//! `CU_LIMIT_PRINTF_FIFO_SIZE` bytes, flushed at synchronisation points) to the process's
//! standard output — which, in a worker, is the protocol pipe to kilnd. So before anything
//! touches CUDA, [`install`] moves the protocol to a duplicate of fd 1 and points fd 1 at
//! a pipe drained by a thread of this process: it counts every byte and keeps the first
//! [`EXCERPT`] bytes since the last [`reset`]. The evaluation checks [`printed`] after each
//! candidate run and ends a flood (more than the run limits' `output_limit_bytes`) with a
//! `runtime_fault`; what was printed shows up as the evaluation's output excerpt.

use std::fs::File;
use std::io::Read;
use std::os::fd::{FromRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Bytes of printed output kept for the evaluation's excerpt.
pub const EXCERPT: usize = 4096;

struct Capture {
    total: AtomicU64,
    base: AtomicU64,
    head: Mutex<Vec<u8>>,
}

static CAPTURE: OnceLock<Capture> = OnceLock::new();

fn os(call: &str) -> String {
    format!("{call}: {}", std::io::Error::last_os_error())
}

/// Moves the protocol off fd 1 and captures fd 1; returns the protocol's new output.
/// Call once, before CUDA is initialised.
pub fn install() -> Result<File, String> {
    // SAFETY: plain descriptor calls on descriptors this process owns; fds are checked.
    let proto: RawFd = unsafe { libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3) };
    if proto < 0 {
        return Err(os("dup(1)"));
    }
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(os("pipe2"));
    }
    // SAFETY: fd 1 becomes the pipe's write end; the original is kept in `proto`.
    if unsafe { libc::dup2(fds[1], 1) } < 0 {
        return Err(os("dup2"));
    }
    // SAFETY: `fds[1]` is ours and now duplicated onto fd 1.
    unsafe { libc::close(fds[1]) };
    let capture = CAPTURE.get_or_init(|| Capture {
        total: AtomicU64::new(0),
        base: AtomicU64::new(0),
        head: Mutex::new(Vec::new()),
    });
    // SAFETY: `fds[0]` is the pipe's read end, owned by the File from here on.
    let mut reader = unsafe { File::from_raw_fd(fds[0]) };
    std::thread::Builder::new()
        .name("printf-drain".into())
        .spawn(move || {
            let mut buf = [0u8; 16 << 10];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                capture.total.fetch_add(n as u64, Ordering::SeqCst);
                let mut head = capture.head.lock().unwrap_or_else(|p| p.into_inner());
                if head.len() < EXCERPT {
                    let take = n.min(EXCERPT - head.len());
                    head.extend_from_slice(&buf[..take]);
                }
            }
        })
        .map_err(|e| format!("printf drain thread: {e}"))?;
    // SAFETY: `proto` is a fresh duplicate of the original fd 1, owned by the File.
    Ok(unsafe { File::from_raw_fd(proto) })
}

/// Starts counting afresh (a new evaluation).
pub fn reset() {
    if let Some(c) = CAPTURE.get() {
        c.base
            .store(c.total.load(Ordering::SeqCst), Ordering::SeqCst);
        c.head.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// Bytes printed since the last [`reset`] (0 when nothing is captured).
pub fn printed() -> u64 {
    CAPTURE.get().map_or(0, |c| {
        c.total
            .load(Ordering::SeqCst)
            .saturating_sub(c.base.load(Ordering::SeqCst))
    })
}

/// The first bytes printed since the last [`reset`], if any.
pub fn excerpt() -> Option<String> {
    let c = CAPTURE.get()?;
    let head = c.head.lock().unwrap_or_else(|p| p.into_inner());
    (!head.is_empty()).then(|| String::from_utf8_lossy(&head).into_owned())
}
