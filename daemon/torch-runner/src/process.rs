//! kiln's trusted torch runner (`daemon/torch-runner/kiln_torch.py`) as a child process: where it is
//! ([`TorchRunner::find`]), starting it ([`RunnerProcess::start`]) and one framed call at
//! a time with a deadline ([`RunnerProcess::call`]); and its `describe` of KernelBench
//! files for the importer ([`describe`]).
//!
//! The helper is kiln's own code, run by the python that has torch. It runs outside the
//! jail (python and torch need their whole prefix, which no jail shows) with a cleared
//! environment (PATH, HOME, `CUDA_VISIBLE_DEVICES` naming the lane's GPU or nothing),
//! in its own process group, killed whole when a call passes its deadline or the process
//! is dropped. It talks kiln's framing ([`kiln_protocol`]): a JSON envelope, then raw
//! blobs (tensor bytes), on its stdin and stdout; its own stdout prints go to stderr.
//! docs/security.md says what it may run: the problem's own PyTorch code (trusted, from
//! the problem's author) and kiln's fixed op registry, never candidate code.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;
use thiserror::Error;

use kiln_protocol as protocol;

/// File name of the helper, installed next to `kiln-worker` (or `share/kiln/` above it).
pub const SCRIPT_NAME: &str = "kiln_torch.py";

/// Most blob bytes one answer of the helper may carry (trusted code; a torch reference's
/// outputs on the largest GPU).
const ANSWER_BYTES: u64 = 256 << 30;

/// Where the helper and python are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TorchRunner {
    /// The python interpreter (`python3`, or a venv's).
    pub python: PathBuf,
    /// The helper script.
    pub script: PathBuf,
    /// Wall-clock limit of one call (a baselines measurement is a few calls).
    pub timeout: Duration,
}

impl TorchRunner {
    /// The helper next to `worker_exe`, in `../share/kiln/` beside it (installed
    /// layouts), or in `daemon/torch-runner/` above it (a build tree's
    /// `target/{debug,release}`);
    /// `None` when none exists.
    pub fn find(worker_exe: &Path, python: &str, timeout: Duration) -> Option<TorchRunner> {
        let dir = worker_exe.parent()?;
        let script = std::iter::successors(Some(dir), |d| d.parent())
            .take(4)
            .flat_map(|d| {
                [
                    d.join(SCRIPT_NAME),
                    d.join("share/kiln").join(SCRIPT_NAME),
                    d.join("daemon/torch-runner").join(SCRIPT_NAME),
                ]
            })
            .find(|p| p.is_file())?;
        Some(TorchRunner {
            python: resolve(python),
            script,
            timeout,
        })
    }
}

/// A bare interpreter name resolved on the caller's own PATH (the helper runs with a
/// short fixed PATH, which may not lead to the python that has torch).
pub fn resolve(python: &str) -> PathBuf {
    if python.contains('/') {
        return PathBuf::from(python);
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(python))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| PathBuf::from(python))
}

/// Why a call to the helper gave no answer.
#[derive(Debug, Error)]
pub enum RunnerError {
    /// The interpreter could not be started.
    #[error(
        "cannot start {python} ({source}): no python here, or [gpu] python names the wrong one"
    )]
    Start {
        /// The interpreter.
        python: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The call passed its deadline; the helper was killed.
    #[error("the torch runner did not answer within {0:.0} s and was killed")]
    Timeout(f64),
    /// The pipe broke or the answer did not parse (the helper died: its log says why).
    #[error("the torch runner failed: {message}; its log: {log}")]
    Broken {
        /// What failed.
        message: String,
        /// The end of its stderr.
        log: String,
    },
    /// The helper answered with an error of its own.
    #[error("{0}")]
    Answer(String),
}

/// A running helper (`kiln_torch.py serve`).
pub struct RunnerProcess {
    child: Child,
    /// A Unix socket (not a pipe): descriptors of a GPU worker's shared tensors travel on it
    /// (`SCM_RIGHTS`, `kiln_protocol::fds`).
    stdin: UnixStream,
    stdout: ChildStdout,
    log: std::sync::Arc<std::sync::Mutex<String>>,
    dead: bool,
}

/// Bytes of the helper's stderr kept for error messages.
const LOG_TAIL: usize = 4 << 10;

impl RunnerProcess {
    /// Starts `python script serve` seeing only `gpu` (a UUID, or `""` for no GPU at
    /// all; `None`: the machine's GPUs, torch's device 0 first).
    pub fn start(helper: &TorchRunner, gpu: Option<&str>) -> Result<RunnerProcess, RunnerError> {
        let mut cmd = Command::new(&helper.python);
        cmd.arg(&helper.script)
            .arg("serve")
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let (stdin, theirs) = UnixStream::pair().map_err(|source| RunnerError::Start {
            python: helper.python.display().to_string(),
            source,
        })?;
        cmd.stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)));
        if let Some(gpu) = gpu {
            cmd.env("CUDA_VISIBLE_DEVICES", gpu);
        }
        if let Some(home) = std::env::var_os("HOME") {
            cmd.env("HOME", home);
        }
        // torch.compile writes its caches; keep them under a directory it may write.
        let cache = std::env::temp_dir().join(format!("kiln-torch-{}", nix::unistd::getuid()));
        cmd.env("TORCHINDUCTOR_CACHE_DIR", cache.join("inductor"))
            .env("TRITON_CACHE_DIR", cache.join("triton"));
        let mut child = cmd.spawn().map_err(|source| RunnerError::Start {
            python: helper.python.display().to_string(),
            source,
        })?;
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        if let Some(mut err) = child.stderr.take() {
            let log = log.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = err.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let mut l = log.lock().unwrap_or_else(|p| p.into_inner());
                    l.push_str(&String::from_utf8_lossy(&buf[..n]));
                    if l.len() > 2 * LOG_TAIL {
                        let cut = l.len() - LOG_TAIL;
                        let cut = (cut..l.len()).find(|&i| l.is_char_boundary(i)).unwrap_or(0);
                        l.drain(..cut);
                    }
                }
            });
        }
        // The command holds the runner's end of the socket until it is dropped: the runner
        // must hold the only one, so that its exit is seen.
        drop(cmd);
        let Some(stdout) = child.stdout.take() else {
            return Err(RunnerError::Broken {
                message: "the helper's pipes are missing".into(),
                log: String::new(),
            });
        };
        Ok(RunnerProcess {
            child,
            stdin,
            stdout,
            log,
            dead: false,
        })
    }

    /// The end of the helper's log.
    pub fn log_tail(&self) -> String {
        let l = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let start = l.len().saturating_sub(LOG_TAIL);
        let start = (start..l.len())
            .find(|&i| l.is_char_boundary(i))
            .unwrap_or(0);
        l[start..].trim().to_string()
    }

    /// True once a call failed (the process is gone or killed): start a new one.
    pub fn is_dead(&self) -> bool {
        self.dead
    }

    /// Sends `body` (and `blobs`) and waits up to `deadline` for the answer; an answer
    /// with an `error` field is [`RunnerError::Answer`]. Past the deadline the helper's
    /// process group is killed.
    pub fn call(
        &mut self,
        body: &Value,
        blobs: &[&[u8]],
        deadline: Duration,
    ) -> Result<(Value, Vec<Vec<u8>>), RunnerError> {
        self.call_with_fds(body, blobs, &[], deadline)
    }

    /// [`RunnerProcess::call`], with `fds` sent after the message (`SCM_RIGHTS`); the
    /// body must say how many follow.
    pub fn call_with_fds(
        &mut self,
        body: &Value,
        blobs: &[&[u8]],
        fds: &[std::os::fd::BorrowedFd<'_>],
        deadline: Duration,
    ) -> Result<(Value, Vec<Vec<u8>>), RunnerError> {
        if self.dead {
            return Err(self.broken("the helper already failed".into()));
        }
        let (done, wait) = mpsc::channel::<()>();
        let pgid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let watchdog = std::thread::spawn(move || {
            if wait.recv_timeout(deadline) == Err(mpsc::RecvTimeoutError::Timeout) {
                // The helper leads its own process group: stop all of it.
                let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
                return true;
            }
            false
        });
        let reply = protocol::write_message(&mut self.stdin, body, blobs)
            .and_then(|()| {
                if fds.is_empty() {
                    Ok(())
                } else {
                    kiln_protocol::fds::send_fds(&self.stdin, fds).map_err(Into::into)
                }
            })
            .and_then(|()| protocol::read_message_within::<Value>(&mut self.stdout, ANSWER_BYTES));
        let _ = done.send(());
        let killed = watchdog.join().unwrap_or(false);
        match reply {
            _ if killed => {
                self.dead = true;
                Err(RunnerError::Timeout(deadline.as_secs_f64()))
            }
            Err(e) => {
                self.dead = true;
                Err(self.broken(e.to_string()))
            }
            Ok((v, _)) if v.get("error").is_some() => Err(RunnerError::Answer(
                v["error"].as_str().unwrap_or("unknown error").to_string(),
            )),
            Ok(ok) => Ok(ok),
        }
    }

    fn broken(&self, message: String) -> RunnerError {
        // Give the log reader a moment to catch the helper's last words.
        std::thread::sleep(Duration::from_millis(50));
        RunnerError::Broken {
            message,
            log: self.log_tail(),
        }
    }
}

impl Drop for RunnerProcess {
    fn drop(&mut self) {
        let pgid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// Runs the helper's `describe` on KernelBench-format `files` (their Python runs, as the
/// caller: trusted problem code) and parses one description per file. `run_limits`:
/// (bytes, flops) under which a module is also run once on the CPU; `tol`: the tolerance
/// the problems will get (the helper says how many outputs a zero would pass under it).
pub fn describe(
    helper: &TorchRunner,
    files: &[PathBuf],
    run_limits: (u64, u64),
    tol: kiln_types::Tolerance,
) -> Result<Vec<kiln_types::kernelbench::Description>, RunnerError> {
    let out = Command::new(&helper.python)
        .arg(&helper.script)
        .arg("describe")
        .arg("--run-limit-bytes")
        .arg(run_limits.0.to_string())
        .arg("--run-limit-flops")
        .arg(run_limits.1.to_string())
        .arg("--atol")
        .arg(tol.atol.to_string())
        .arg("--rtol")
        .arg(tol.rtol.to_string())
        .args(files)
        .output()
        .map_err(|source| RunnerError::Start {
            python: helper.python.display().to_string(),
            source,
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut v = Vec::new();
    for line in text.lines().filter(|l| l.starts_with('{')) {
        v.push(serde_json::from_str(line).map_err(|e| RunnerError::Broken {
            message: format!("a description did not parse ({e}): {line}"),
            log: String::new(),
        })?);
    }
    if v.len() != files.len() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(8).collect();
        return Err(RunnerError::Broken {
            message: format!(
                "described {} of {} files (exit {:?})",
                v.len(),
                files.len(),
                out.status.code()
            ),
            log: tail.into_iter().rev().collect::<Vec<_>>().join(" | "),
        });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_python_is_a_start_error_not_a_panic() {
        let helper = TorchRunner {
            python: PathBuf::from("/nonexistent/python3"),
            script: PathBuf::from("/nonexistent/kiln_torch.py"),
            timeout: Duration::from_secs(5),
        };
        let err = RunnerProcess::start(&helper, None)
            .err()
            .expect("no such python");
        assert!(matches!(err, RunnerError::Start { .. }), "{err}");
    }

    #[test]
    fn a_helper_that_never_answers_is_killed_at_the_deadline() {
        // `sh -c 'sleep 30'` stands in for a helper that hangs.
        let dir = tempfile::tempdir().expect("tmp");
        let script = dir.path().join("hang.sh");
        std::fs::write(&script, "sleep 30\n").expect("write");
        let helper = TorchRunner {
            python: PathBuf::from("/bin/sh"),
            script,
            timeout: Duration::from_secs(1),
        };
        let mut p = RunnerProcess::start(&helper, None).expect("starts");
        let t0 = std::time::Instant::now();
        let err = p
            .call(
                &serde_json::json!({"cmd": "hello"}),
                &[],
                Duration::from_millis(300),
            )
            .expect_err("no answer");
        assert!(matches!(err, RunnerError::Timeout(_)), "{err}");
        assert!(p.is_dead());
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "killed, not waited out"
        );
    }
}
