//! Compiling a C candidate inside the jail (compile role): the system `cc`, fixed base
//! flags plus allow-listed ones, a wall-clock timeout, and the jail's rlimits (address
//! space, file size, CPU) against compile-time bombs.
//!
//! Runs in kiln-worker with the scratch directory as the working directory.

use std::fs;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kiln_types::{Candidate, CompileInfo};

use super::flags;
use crate::jail::sys;

/// Most compiler output kept in the log.
const LOG_CAP: usize = 16 << 10;

/// The result of one compile.
pub struct Compiled {
    /// The shared object, when the compile succeeded.
    pub artifact: Option<Vec<u8>>,
    /// Duration and log.
    pub info: CompileInfo,
    /// Why it failed (empty on success).
    pub message: String,
}

/// Output of a child run with a deadline.
pub struct Captured {
    /// Raw wait status, `None` if it could not be collected.
    pub status: Option<libc::c_int>,
    /// True if and only if the deadline killed it.
    pub timed_out: bool,
    /// Merged stdout and stderr, capped.
    pub output: String,
}

/// Runs `cmd` in its own process group with stdout and stderr merged into one capped
/// pipe; kills the group at the deadline.
pub fn run_captured(cmd: &mut Command, timeout: Duration, cap: usize) -> std::io::Result<Captured> {
    let (rd, wr) = sys::pipe()?;
    let wr2 = wr.try_clone()?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::from(wr))
        .stderr(Stdio::from(wr2))
        .process_group(0)
        .spawn()?;
    // `cmd` still owns the write ends; replace them so that only the child holds one and
    // the read below sees end-of-file when the compiler and its helpers are done.
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let pid = child.id() as libc::pid_t;
    let mut rd = fs::File::from(rd);
    sys::set_nonblocking(&rd, true)?;
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    let mut timed_out = false;
    let mut buf = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            timed_out = true;
            break;
        }
        let ms = left.as_millis().min(1000) as i32;
        let rev = sys::poll(&[(rd.as_raw_fd(), libc::POLLIN)], ms)?;
        if rev[0] == 0 {
            continue;
        }
        match rd.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if out.len() < cap {
                    out.extend_from_slice(&buf[..n.min(cap - out.len())]);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    if timed_out {
        let _ = sys::killpg(pid, libc::SIGKILL);
    }
    let status = sys::waitpid(pid, 0).ok().map(|(_, s)| s);
    // Already reaped above; std's own wait would only report ECHILD.
    let _ = child.try_wait();
    if !timed_out {
        // Helpers of the compiler that outlived it (they share its group).
        let _ = sys::killpg(pid, libc::SIGKILL);
    }
    Ok(Captured {
        status,
        timed_out,
        output: String::from_utf8_lossy(&out).into_owned(),
    })
}

/// Compiles `candidate` with `cc`; files go under the current directory (scratch).
pub fn compile(candidate: &Candidate, cc: &Path, timeout: Duration) -> Compiled {
    let started = Instant::now();
    let fail = |message: String, log: String, started: Instant| Compiled {
        artifact: None,
        info: crate::engine::compile_info(started, log),
        message,
    };
    if let Err(e) = flags::check_all(&candidate.flags) {
        return fail(e, String::new(), started);
    }
    let prepared = (|| -> std::io::Result<std::path::PathBuf> {
        let dir = std::env::current_dir()?;
        fs::create_dir_all(dir.join("tmp"))?;
        fs::write(dir.join("candidate.c"), &candidate.source)?;
        Ok(dir)
    })();
    let dir = match prepared {
        Ok(d) => d,
        Err(e) => {
            return fail(
                format!("cannot write the source into scratch: {e}"),
                String::new(),
                started,
            );
        }
    };
    let out = dir.join("candidate.so");
    let mut cmd = Command::new(cc);
    cmd.args(flags::BASE_FLAGS)
        .args(&candidate.flags)
        .arg("-o")
        .arg(&out)
        .arg(dir.join("candidate.c"))
        .arg("-lm")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("TMPDIR", dir.join("tmp"))
        .env("LANG", "C")
        .current_dir(&dir);
    let run = match run_captured(&mut cmd, timeout, LOG_CAP) {
        Ok(r) => r,
        Err(e) => {
            return fail(
                format!("cannot run the compiler {}: {e}", cc.display()),
                String::new(),
                started,
            );
        }
    };
    let log = run.output;
    if run.timed_out {
        return fail(
            format!("compile timed out after {:.1} s", timeout.as_secs_f64()),
            log,
            started,
        );
    }
    match run.status {
        Some(s) if libc::WIFEXITED(s) && libc::WEXITSTATUS(s) == 0 => {}
        Some(s) => {
            let first_error = log
                .lines()
                .find(|l| {
                    l.contains("error") || l.contains("out of memory") || l.contains("File size")
                })
                .unwrap_or("")
                .trim()
                .to_string();
            let message = match crate::engine::limits::compiler_limit(Some(s), &log) {
                Some(limit) => format!("compiler {}: {limit}", sys::describe_status(s)),
                None => format!("compiler {}: {first_error}", sys::describe_status(s)),
            };
            return fail(message, log, started);
        }
        None => return fail("compiler status lost".into(), log, started),
    }
    match fs::read(&out) {
        Ok(bytes) => Compiled {
            artifact: Some(bytes),
            info: crate::engine::compile_info(started, log),
            message: String::new(),
        },
        Err(e) => fail(format!("compiler produced no artifact: {e}"), log, started),
    }
}
