//! The worker's side of a runner: spawn it (fork + exec of `kiln-worker runner`, so it
//! starts with a fresh address space holding nothing of the worker's), write its buffers,
//! start a run, take the time, stop it, read its buffers.
//!
//! Timing is taken here, on the worker's monotonic clock: from just before the `G` byte is
//! written to just after the `D` byte is read. Right after, the runner is stopped
//! (SIGSTOP, waited for with WUNTRACED) before any output is read, so code that answers
//! `D` early and keeps writing is frozen mid-way and its outputs fail the checks.
//! Everything it prints is drained into a capped capture; past the cap it is killed.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use super::layout::{Call, Layout};
use super::runner::{Ready, SIGSYS_EXIT, Setup, parse_fault};
use crate::jail::seccomp::syscall_name;
use crate::jail::sys;
use crate::protocol;

/// Bytes of captured output kept for evidence.
const EXCERPT: usize = 2048;

/// How one command to a runner ended.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEnd {
    /// Answered `D`; the time between `G` and `D` on the worker's clock.
    Done(Duration),
    /// No answer within the run timeout; the runner was killed.
    Timeout,
    /// The runner died: the fault (`SIGSEGV`, `forbidden syscall socket`...).
    Died(String),
    /// The runner printed more than the limit; it was killed.
    Flood(u64),
}

/// A live runner.
pub struct Runner {
    pid: libc::pid_t,
    go: OwnedFd,
    done: std::fs::File,
    fault: std::fs::File,
    capture: std::fs::File,
    map: sys::SharedMap,
    /// Buffers in the memfd.
    pub layout: Layout,
    stopped: bool,
    alive: bool,
    last_status: Option<libc::c_int>,
    printed: u64,
    excerpt: Vec<u8>,
    output_limit: u64,
    /// Leads a process group of its own (a hosted runner), killed as a whole.
    group: bool,
    /// Milliseconds from the setup message to the ready one (loading the artifact; for a
    /// hosted runner importing the file and building `ModelNew`, compiles included).
    pub load_ms: f64,
}

/// What the runner is started with.
pub struct RunnerConfig<'a> {
    /// `kiln-worker`, as a path valid in this process's root.
    pub exe: &'a Path,
    /// Tag in argv, so stray processes can be attributed to a job.
    pub tag: &'a str,
    /// The artifact file.
    pub artifact: &'a Path,
    /// RLIMIT_AS of the runner.
    pub as_bytes: u64,
    /// RLIMIT_CPU of the runner.
    pub cpu_s: u64,
    /// Output cap.
    pub output_limit: u64,
    /// How long loading may take.
    pub load_timeout: Duration,
}

/// What a runner process holds.
pub enum Program<'a> {
    /// `kiln-worker runner`: loads [`RunnerConfig::artifact`] and runs these calls.
    Artifact(Vec<Call>),
    /// `kiln-worker hosted-runner` (`engine::hosted::wrapper`), which execs `python` on
    /// `script`: a hosted `ModelNew` file, set up by the JSON message `setup`, with the
    /// environment `env`.
    Hosted {
        /// The python with torch.
        python: &'a Path,
        /// The runner script.
        script: &'a Path,
        /// The runner's whole environment.
        env: Vec<(String, String)>,
        /// The setup message's body.
        setup: serde_json::Value,
        /// Descriptors the runner gets from fd 7 on, in order (a GPU's exported tensors).
        fds: Vec<OwnedFd>,
        /// May it start processes (a GPU runner's compilers; see `seccomp::HOSTED_DENY`)?
        processes: bool,
    },
}

impl Runner {
    /// Spawns a runner for `calls` over `layout` and waits until it is loaded. `Err` is an
    /// infrastructure failure; a loaded runner reports missing symbols or a load error in
    /// [`Ready`], and one that dies while loading in the `RunEnd`.
    pub fn spawn(
        cfg: &RunnerConfig,
        layout: Layout,
        calls: Vec<Call>,
    ) -> Result<(Runner, Result<Ready, RunEnd>), String> {
        Runner::spawn_program(cfg, layout, Program::Artifact(calls))
    }

    /// [`Runner::spawn`] for any [`Program`].
    pub fn spawn_program(
        cfg: &RunnerConfig,
        layout: Layout,
        program: Program,
    ) -> Result<(Runner, Result<Ready, RunEnd>), String> {
        fn io(what: &'static str) -> impl Fn(std::io::Error) -> String {
            move |e| format!("runner {what}: {e}")
        }
        let mem = sys::memfd(c"kiln-buffers", layout.total).map_err(io("memfd"))?;
        let map = sys::SharedMap::new(mem.as_raw_fd(), layout.total as usize).map_err(io("map"))?;
        let (go_r, go_w) = sys::pipe().map_err(io("pipe"))?;
        let (done_r, done_w) = sys::pipe().map_err(io("pipe"))?;
        let (fault_r, fault_w) = sys::pipe().map_err(io("pipe"))?;
        let (cap_r, cap_w) = sys::pipe().map_err(io("pipe"))?;
        let devnull = std::fs::File::open("/dev/null").map_err(io("open /dev/null"))?;
        let exe = sys::cstr(cfg.exe).map_err(io("path"))?;
        let cs = |s: String| CString::new(s).map_err(|e| e.to_string());
        let tag = cs(format!("--tag={}", cfg.tag))?;
        let (argv_s, env_s) = match &program {
            Program::Artifact(_) => (vec![exe.clone(), CString::from(c"runner"), tag], vec![]),
            Program::Hosted {
                python,
                script,
                env,
                processes,
                ..
            } => (
                [
                    exe.clone(),
                    CString::from(c"hosted-runner"),
                    cs(format!("--python={}", python.display()))?,
                    cs(format!("--script={}", script.display()))?,
                    cs(format!("--cpu-s={}", cfg.cpu_s))?,
                    tag,
                ]
                .into_iter()
                .chain(processes.then(|| CString::from(c"--processes")))
                .collect(),
                env.iter()
                    .map(|(k, v)| cs(format!("{k}={v}")))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        let argv: Vec<*const libc::c_char> = argv_s
            .iter()
            .map(|c| c.as_ptr())
            .chain([std::ptr::null()])
            .collect();
        let envp: Vec<*const libc::c_char> = env_s
            .iter()
            .map(|c| c.as_ptr())
            .chain([std::ptr::null()])
            .collect();
        // Source fds in the order of their targets 0..=6, then a hosted runner's extra ones.
        let extra: Vec<i32> = match &program {
            Program::Hosted { fds, .. } => fds.iter().map(AsRawFd::as_raw_fd).collect(),
            Program::Artifact(_) => Vec::new(),
        };
        let sources: Vec<i32> = [
            devnull.as_raw_fd(),
            cap_w.as_raw_fd(),
            cap_w.as_raw_fd(),
            go_r.as_raw_fd(),
            done_w.as_raw_fd(),
            fault_w.as_raw_fd(),
            mem.as_raw_fd(),
        ]
        .into_iter()
        .chain(extra)
        .collect();
        let mut high = vec![0; sources.len()];
        // A hosted runner leads a process group of its own, which it cannot leave (its
        // filter refuses setsid and setpgid): everything it starts is killed with it.
        let group = matches!(program, Program::Hosted { .. });
        let keep = sources.len() as i32;
        let pid = match sys::fork().map_err(io("fork"))? {
            sys::Forked::Child => {
                // Between fork and exec: only async-signal-safe calls, no allocation.
                let _ = sys::set_parent_death_signal(libc::SIGKILL);
                if group {
                    // SAFETY: setpgid(0, 0) has no pointer arguments and is async-signal-safe.
                    unsafe { libc::setpgid(0, 0) };
                }
                for (i, &fd) in sources.iter().enumerate() {
                    // SAFETY: F_DUPFD takes an int; moves every source above the targets.
                    high[i] = unsafe { libc::fcntl(fd, libc::F_DUPFD, keep + 16) };
                }
                for (target, &fd) in high.iter().enumerate() {
                    if fd < 0 || sys::dup2(fd, target as i32).is_err() {
                        // SAFETY: _exit never returns and is async-signal-safe.
                        unsafe { libc::_exit(127) };
                    }
                }
                let _ = sys::close_fds_from(keep);
                let _ = sys::execve(&exe, &argv, &envp);
                // SAFETY: as above.
                unsafe { libc::_exit(127) };
            }
            sys::Forked::Parent(pid) => pid,
        };
        drop((go_r, done_w, fault_w, cap_w, mem, devnull));
        let done = std::fs::File::from(done_r);
        let capture = std::fs::File::from(cap_r);
        let fault = std::fs::File::from(fault_r);
        for f in [&done, &capture, &fault] {
            sys::set_nonblocking(f, true).map_err(io("nonblocking"))?;
        }
        let mut runner = Runner {
            pid,
            go: go_w,
            done,
            fault,
            capture,
            map,
            layout,
            stopped: false,
            alive: true,
            last_status: None,
            printed: 0,
            excerpt: Vec::new(),
            output_limit: cfg.output_limit,
            group,
            load_ms: 0.0,
        };
        let mut frame = Vec::new();
        match program {
            Program::Artifact(calls) => {
                let setup = Setup {
                    artifact: cfg.artifact.to_path_buf(),
                    map_len: runner.layout.total,
                    guards: runner
                        .layout
                        .guards()
                        .into_iter()
                        .map(|r| (r.start as u64, r.end as u64))
                        .collect(),
                    calls,
                    slots: runner.layout.slots,
                    slot_bytes: runner.layout.slot_bytes,
                    as_bytes: cfg.as_bytes.saturating_add(runner.layout.total),
                    cpu_s: cfg.cpu_s,
                };
                protocol::write_message(&mut frame, &setup, &[])
            }
            Program::Hosted { setup, .. } => protocol::write_message(&mut frame, &setup, &[]),
        }
        .map_err(|e| e.to_string())?;
        if sys::write_all(runner.go.as_raw_fd(), &frame).is_err() {
            let end = runner.reap_died();
            return Ok((runner, Err(end)));
        }
        let loading = Instant::now();
        let ready = runner.read_ready(cfg.load_timeout);
        runner.load_ms = loading.elapsed().as_secs_f64() * 1e3;
        if ready.is_ok() {
            runner.stop();
        }
        Ok((runner, ready))
    }

    /// Reads the ready frame (length-prefixed JSON) with a deadline.
    fn read_ready(&mut self, timeout: Duration) -> Result<Ready, RunEnd> {
        self.read_frame("ready", timeout)
    }

    /// Sends `cmd` and reads the one message it answers with (no `D`) within `timeout`,
    /// then stops the runner again. Everything in it is the runner's claim.
    pub fn ask<T: serde::de::DeserializeOwned>(
        &mut self,
        cmd: u8,
        timeout: Duration,
    ) -> Result<T, RunEnd> {
        if !self.alive {
            return Err(RunEnd::Died("runner already gone".into()));
        }
        if self.stopped {
            let _ = sys::kill(self.pid, libc::SIGCONT);
            self.stopped = false;
        }
        if sys::write_all(self.go.as_raw_fd(), &[cmd]).is_err() {
            return Err(self.reap_died());
        }
        let answer = self.read_frame("answer", timeout);
        if answer.is_ok() && !self.stop() {
            return Err(self.reap_died());
        }
        answer
    }

    /// Reads one length-prefixed message of kiln's framing from the done pipe.
    fn read_frame<T: serde::de::DeserializeOwned>(
        &mut self,
        what: &str,
        timeout: Duration,
    ) -> Result<T, RunEnd> {
        let deadline = Instant::now() + timeout;
        let mut buf = Vec::new();
        loop {
            if buf.len() >= 4 {
                let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
                if len > 1 << 20 {
                    self.kill();
                    return Err(RunEnd::Died(format!(
                        "runner sent a malformed {what} frame"
                    )));
                }
                if buf.len() >= 4 + len {
                    let parsed: Result<(T, _), _> = protocol::read_message(&mut &buf[..4 + len]);
                    return parsed.map(|(r, _)| r).map_err(|e| {
                        self.kill();
                        RunEnd::Died(format!("runner sent a malformed {what} frame: {e}"))
                    });
                }
            }
            match self.wait_done_bytes(deadline, &mut buf) {
                Ok(()) => {}
                Err(end) => return Err(end),
            }
        }
    }

    /// Waits until the done pipe yields bytes (appended to `buf`), draining the capture.
    fn wait_done_bytes(&mut self, deadline: Instant, buf: &mut Vec<u8>) -> Result<(), RunEnd> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.kill();
                return Err(RunEnd::Timeout);
            }
            let ms = (left.as_micros().div_ceil(1000)).min(1000) as i32;
            let rev = match sys::poll(
                &[
                    (self.done.as_raw_fd(), libc::POLLIN),
                    (self.capture.as_raw_fd(), libc::POLLIN),
                ],
                ms,
            ) {
                Ok(r) => r,
                Err(_) => return Err(self.reap_died()),
            };
            if rev[1] != 0
                && let Some(end) = self.drain_capture()
            {
                return Err(end);
            }
            if rev[0] != 0 {
                let mut tmp = [0u8; 4096];
                match sys::read(self.done.as_raw_fd(), &mut tmp) {
                    Ok(0) => return Err(self.reap_died()),
                    Ok(n) => {
                        buf.extend_from_slice(&tmp[..n]);
                        return Ok(());
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => return Err(self.reap_died()),
                }
            }
        }
    }

    /// Reads what the runner printed; kills it past the limit.
    fn drain_capture(&mut self) -> Option<RunEnd> {
        let mut tmp = [0u8; 16384];
        loop {
            match sys::read(self.capture.as_raw_fd(), &mut tmp) {
                Ok(0) => return None,
                Ok(n) => {
                    self.printed += n as u64;
                    if self.excerpt.len() < EXCERPT {
                        let take = n.min(EXCERPT - self.excerpt.len());
                        self.excerpt.extend_from_slice(&tmp[..take]);
                    }
                    if self.printed > self.output_limit {
                        self.kill();
                        return Some(RunEnd::Flood(self.printed));
                    }
                }
                Err(_) => return None,
            }
        }
    }

    /// Runs one command: `b'G'` (the launch list on slot 0) or `b'E'` (empty, for the
    /// timer's overhead). The runner is stopped again before this returns.
    pub fn run(&mut self, cmd: u8, timeout: Duration) -> RunEnd {
        self.command(&[cmd], timeout)
    }

    /// Runs the launch list on slots `0..n`, in order, as one command (one timed sample of
    /// `n` runs); `n` is at most the layout's slots.
    pub fn run_slots(&mut self, n: usize, timeout: Duration) -> RunEnd {
        let n = n.clamp(1, self.layout.slots as usize).min(255);
        self.command(&[b'T', n as u8], timeout)
    }

    fn command(&mut self, cmd: &[u8], timeout: Duration) -> RunEnd {
        if !self.alive {
            return RunEnd::Died("runner already gone".into());
        }
        if self.stopped {
            let _ = sys::kill(self.pid, libc::SIGCONT);
            self.stopped = false;
        }
        // Stale bytes (a `D` written ahead of time) must not answer this run.
        let mut stale = [0u8; 256];
        while matches!(sys::read(self.done.as_raw_fd(), &mut stale), Ok(n) if n > 0) {}
        let start = Instant::now();
        if sys::write_all(self.go.as_raw_fd(), cmd).is_err() {
            return self.reap_died();
        }
        let mut buf = Vec::new();
        let end = match self.wait_done_bytes(start + timeout, &mut buf) {
            Ok(()) => RunEnd::Done(start.elapsed()),
            Err(end) => return end,
        };
        if !self.stop() {
            return self.reap_died();
        }
        end
    }

    /// SIGSTOP and wait until stopped; false if it died instead.
    fn stop(&mut self) -> bool {
        if sys::kill(self.pid, libc::SIGSTOP).is_err() {
            return false;
        }
        match sys::waitpid(self.pid, libc::WUNTRACED) {
            Ok((_, s)) if libc::WIFSTOPPED(s) => {
                self.stopped = true;
                true
            }
            Ok((_, s)) => {
                self.alive = false;
                self.last_status = Some(s);
                false
            }
            Err(_) => false,
        }
    }
}

impl Runner {
    /// Kills the runner (if alive) and reaps it.
    pub fn kill(&mut self) {
        if self.group {
            // The processes a hosted runner started, alive or not.
            let _ = sys::killpg(self.pid, libc::SIGKILL);
        }
        if self.alive {
            let _ = sys::kill(self.pid, libc::SIGKILL);
            if let Ok((_, s)) = sys::waitpid(self.pid, 0) {
                self.last_status = Some(s);
            }
            self.alive = false;
        }
    }

    /// Reaps a runner that died (or kills it if it is still alive) and names the fault.
    fn reap_died(&mut self) -> RunEnd {
        if self.alive {
            // It closed its pipe or failed a write: give it a moment to finish dying.
            let until = Instant::now() + Duration::from_millis(500);
            while self.alive && Instant::now() < until {
                if let Ok((pid, s)) = sys::waitpid(self.pid, libc::WNOHANG)
                    && pid == self.pid
                {
                    self.last_status = Some(s);
                    self.alive = false;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            self.kill();
        }
        let _ = self.drain_capture();
        let Some(s) = self.last_status else {
            return RunEnd::Died("runner vanished".into());
        };
        let sigsys = (libc::WIFSIGNALED(s) && libc::WTERMSIG(s) == libc::SIGSYS)
            || (libc::WIFEXITED(s) && libc::WEXITSTATUS(s) == SIGSYS_EXIT);
        if sigsys {
            let mut msg = [0u8; 64];
            let n = sys::read(self.fault.as_raw_fd(), &mut msg).unwrap_or(0);
            let text = String::from_utf8_lossy(&msg[..n]);
            return RunEnd::Died(match parse_fault(&text) {
                Some(nr) => format!(
                    "forbidden syscall {} (#{nr}), stopped by seccomp",
                    syscall_name(nr)
                ),
                None => "forbidden syscall (SIGSYS), stopped by seccomp".into(),
            });
        }
        if libc::WIFSIGNALED(s) {
            let sig = libc::WTERMSIG(s);
            let what = match sig {
                libc::SIGSEGV => {
                    "segmentation fault: bad pointer, stack overflow, a guard page past a buffer, or memory refused by the address-space limit"
                }
                libc::SIGBUS => "bus error",
                libc::SIGABRT => "abort",
                libc::SIGFPE => "arithmetic exception",
                libc::SIGILL => "illegal instruction",
                libc::SIGXCPU | libc::SIGKILL => "CPU time limit reached or killed",
                libc::SIGXFSZ => "file size limit",
                _ => "signal",
            };
            return RunEnd::Died(format!("{} ({what})", sys::signal_name(sig)));
        }
        RunEnd::Died(format!(
            "runner {} (candidate code ended the process)",
            sys::describe_status(s)
        ))
    }

    /// Bytes of a buffer in slot 0 (read only while the runner is stopped).
    pub fn bytes(&self, name: &str) -> &[u8] {
        self.bytes_in(0, name)
    }

    /// Mutable bytes of a buffer in slot 0 (written only while the runner is stopped).
    pub fn bytes_mut(&mut self, name: &str) -> &mut [u8] {
        self.bytes_in_mut(0, name)
    }

    /// Bytes of a buffer in `slot` (empty if either does not exist).
    pub fn bytes_in(&self, slot: usize, name: &str) -> &[u8] {
        match self.layout.range_in(slot, name) {
            Some(r) => self.map.bytes(r),
            None => &[],
        }
    }

    /// Mutable bytes of a buffer in `slot` (empty if either does not exist).
    pub fn bytes_in_mut(&mut self, slot: usize, name: &str) -> &mut [u8] {
        match self.layout.range_in(slot, name) {
            Some(r) => self.map.bytes_mut(r),
            None => &mut [],
        }
    }

    /// What the runner printed so far (an excerpt), if anything.
    pub fn output_excerpt(&self) -> Option<String> {
        if self.printed == 0 {
            return None;
        }
        let mut s = String::from_utf8_lossy(&self.excerpt).into_owned();
        if self.printed > self.excerpt.len() as u64 {
            s.push_str(&format!("\n[... {} bytes in all]", self.printed));
        }
        Some(s)
    }

    /// Asks the runner to quit and reaps it.
    pub fn quit(mut self) {
        self.kill();
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.kill();
    }
}
