//! The caller side of the jail: start `kiln-worker jail SPEC`, read its report, enforce
//! the wall-clock deadline, and kill and reap the whole tree.
//!
//! Safe to call from a multithreaded process: the helper is started with
//! `std::process::Command` (posix_spawn or fork+exec inside std, no `pre_exec` closure).
//! The helper leads its own process group; the deadline kills that group, which takes the
//! monitor, and with it (parent-death signal, PID namespace) every process of the jail.
//! A payload that left the group with `setsid` still dies with the PID namespace, or is
//! caught by `cgroup.kill` when a cgroup is configured.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{CgroupSpec, JailError, JailReport, JailSpec, cgroup, sys};
use crate::protocol;

/// How much of the payload's stderr (its log) is kept for error messages.
const STDERR_TAIL: usize = 8 << 10;

/// A started, jailed process.
pub struct JailedChild {
    child: Child,
    /// The helper's report: which layers are in force.
    pub report: JailReport,
    /// The payload's stdin (requests); `None` once closed.
    pub stdin: Option<ChildStdin>,
    /// The payload's stdout (responses), positioned after the report frame. A Unix socket,
    /// not a pipe, so that a GPU worker can pass descriptors of the memory it shares with
    /// the torch runner (`SCM_RIGHTS`, `kiln_protocol::fds`).
    pub stdout: UnixStream,
    stderr: Arc<StderrTail>,
    watchdog: Option<(mpsc::Sender<Watch>, JoinHandle<()>)>,
    timed_out: Arc<AtomicBool>,
    cgroup: Option<CgroupSpec>,
    finished: bool,
}

/// How a jailed process ended.
#[derive(Debug)]
pub struct Ended {
    /// Exit status of the helper's monitor (the payload's status, or 128+signal).
    pub status: Option<ExitStatus>,
    /// True if and only if the deadline killed the tree.
    pub timed_out: bool,
    /// The end of the payload's stderr.
    pub stderr_tail: String,
}

/// Starts `helper jail SPEC` and reads its report. The deadline runs from now.
pub fn spawn(helper: &Path, spec: &JailSpec, deadline: Duration) -> Result<JailedChild, JailError> {
    spec.validate()?;
    let json = serde_json::to_string(spec).map_err(|e| JailError::Report(e.to_string()))?;
    let (stdout, theirs) = UnixStream::pair().map_err(|source| JailError::SpawnHelper {
        path: helper.to_path_buf(),
        source,
    })?;
    // `theirs` moves into the command, which closes it when dropped after the spawn: the
    // payload then holds the only other end, and its exit is our end of stream.
    let mut child = Command::new(helper)
        .arg("jail")
        .arg(json)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|source| JailError::SpawnHelper {
            path: helper.to_path_buf(),
            source,
        })?;
    let pgid = child.id() as libc::pid_t;
    let timed_out = Arc::new(AtomicBool::new(false));
    let watchdog = start_watchdog(pgid, deadline, timed_out.clone());
    let stderr = Arc::new(StderrTail::default());
    if let Some(err) = child.stderr.take() {
        let tail = stderr.clone();
        // Detached on purpose: if some escaped process kept the pipe open, `finish` must
        // not hang on it; it waits briefly for the end of the log and moves on.
        std::thread::spawn(move || tail.drain(err));
    }
    let Some(stdin) = child.stdin.take() else {
        return Err(JailError::Report("helper pipes missing".into()));
    };
    let mut jailed = JailedChild {
        child,
        report: JailReport {
            layers: Vec::new(),
            error: None,
        },
        stdin: Some(stdin),
        stdout,
        stderr,
        watchdog: Some(watchdog),
        timed_out,
        cgroup: spec.cgroup.clone(),
        finished: false,
    };
    let report: Result<(JailReport, _), _> = protocol::read_message(&mut jailed.stdout);
    match report {
        Ok((report, _)) => {
            if let Some(err) = &report.error {
                let err = err.clone();
                let ended = jailed.finish();
                return Err(JailError::Setup(format!(
                    "{err}; helper log: {}",
                    ended.stderr_tail.trim()
                )));
            }
            for l in report.layers.iter().filter(|l| !l.active) {
                tracing::debug!(layer = %l.name, reason = %l.detail, "jail layer not active");
            }
            jailed.report = report;
            Ok(jailed)
        }
        Err(e) => {
            let ended = jailed.finish();
            Err(JailError::Report(format!(
                "{e} (helper {}; log: {})",
                ended
                    .status
                    .map_or("status unknown".to_string(), |s| s.to_string()),
                ended.stderr_tail.trim()
            )))
        }
    }
}

/// The last bytes of the payload's stderr, filled by a reader thread.
#[derive(Default)]
struct StderrTail {
    buf: std::sync::Mutex<Vec<u8>>,
    done: AtomicBool,
}

impl StderrTail {
    fn drain(&self, mut err: std::process::ChildStderr) {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = err.read(&mut chunk) {
            if n == 0 {
                break;
            }
            for line in String::from_utf8_lossy(&chunk[..n]).lines() {
                tracing::debug!(target: "kiln_worker", "{line}");
            }
            if let Ok(mut tail) = self.buf.lock() {
                tail.extend_from_slice(&chunk[..n]);
                if tail.len() > STDERR_TAIL {
                    let excess = tail.len() - STDERR_TAIL;
                    tail.drain(..excess);
                }
            }
        }
        self.done.store(true, Ordering::SeqCst);
    }

    fn wait_and_take(&self, wait: Duration) -> String {
        let until = Instant::now() + wait;
        while !self.done.load(Ordering::SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
        self.buf
            .lock()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }
}

/// What the watchdog thread is told.
#[derive(Debug, Clone, Copy)]
enum Watch {
    /// Move the deadline to this instant (a warm worker's next request).
    Rearm(Instant),
    /// Kill the tree now (a [`Killer`]).
    Kill,
    /// The child is being finished: stop watching.
    Stop,
}

/// The watchdog kills the tree at the deadline, or earlier when a [`Killer`] asks; a
/// rearm moves the deadline; `Stop` (from `finish`) ends it. It is the only thread that
/// kills the group before the helper is reaped, so the group id cannot have been reused.
fn start_watchdog(
    pgid: libc::pid_t,
    deadline: Duration,
    flag: Arc<AtomicBool>,
) -> (mpsc::Sender<Watch>, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<Watch>();
    let handle = std::thread::spawn(move || {
        let mut until = Instant::now() + deadline;
        loop {
            match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(Watch::Rearm(t)) => until = t,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    flag.store(true, Ordering::SeqCst);
                    let _ = sys::killpg(pgid, libc::SIGKILL);
                    return;
                }
                Ok(Watch::Kill) => {
                    let _ = sys::killpg(pgid, libc::SIGKILL);
                    return;
                }
                Ok(Watch::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    });
    (tx, handle)
}

/// Kills a jailed tree from another thread (a cancelled search, a stopping daemon) while
/// the thread that owns the [`JailedChild`] waits on it. Does nothing once the child is
/// finished.
#[derive(Debug, Clone)]
pub struct Killer(mpsc::Sender<Watch>);

impl Killer {
    /// SIGKILL to the whole tree now (through the watchdog thread).
    pub fn kill(&self) {
        let _ = self.0.send(Watch::Kill);
    }
}

impl JailedChild {
    /// The helper's pid (the process group id of the tree).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A handle that kills the tree from another thread; `None` once finished.
    pub fn killer(&self) -> Option<Killer> {
        self.watchdog.as_ref().map(|(tx, _)| Killer(tx.clone()))
    }

    /// Moves the wall-clock deadline to `deadline` from now (a warm worker gets one per
    /// request). No effect once the deadline has fired or the child was finished.
    pub fn arm(&self, deadline: Duration) {
        if let Some((tx, _)) = &self.watchdog {
            let _ = tx.send(Watch::Rearm(Instant::now() + deadline));
        }
    }

    /// True if and only if the deadline has fired.
    pub fn timed_out(&self) -> bool {
        self.timed_out.load(Ordering::SeqCst)
    }

    /// Closes stdin, gives the payload a moment to exit on its own, then kills whatever is
    /// left of the tree and reaps the helper.
    pub fn finish(&mut self) -> Ended {
        self.stdin = None;
        let pgid = self.child.id() as libc::pid_t;
        if !self.finished {
            let grace = Instant::now() + Duration::from_secs(2);
            while !sys::has_exited(pgid) && Instant::now() < grace {
                std::thread::sleep(Duration::from_millis(2));
            }
            // The monitor is still unreaped here, so the group id cannot have been reused.
            let _ = sys::killpg(pgid, libc::SIGKILL);
        }
        if let Some((tx, handle)) = self.watchdog.take() {
            let _ = tx.send(Watch::Stop);
            let _ = handle.join();
        }
        let status = self.child.wait().ok();
        self.finished = true;
        if let Some(cg) = &self.cgroup {
            cgroup::remove(cg);
        }
        let stderr_tail = self.stderr.wait_and_take(Duration::from_millis(500));
        Ended {
            status,
            timed_out: self.timed_out(),
            stderr_tail,
        }
    }
}

impl Drop for JailedChild {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.finish();
        }
    }
}
