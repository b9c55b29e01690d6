//! One search's `kiln-plugin-host`, started inside the jail (role [`Role::PluginHost`]).
//!
//! The search's plugin and token are copied into the job's scratch (`plugin.wasm`,
//! `token`). The scratch is the jailed process's working directory with or without a
//! private root, so the host gets relative paths and finds them either way. kilnd's socket
//! is bound read-only at its own canonical path, the only piece of the host's filesystem
//! besides the system libraries; a filesystem socket works across network namespaces,
//! and connecting to one needs no write access to the mount. The daemon's state
//! directory and everything else stay hidden. No `RLIMIT_AS`: wasmtime reserves large
//! virtual regions, and caps the plugin's linear memory itself; a delegated cgroup (when
//! configured) caps the real memory of the whole host.
//!
//! [`start`] is blocking (it starts the helper and reads its report); [`PluginHost::wait`]
//! blocks until the host exits. An async caller runs both on a blocking thread and keeps
//! a [`Killer`] to end the host early.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use crate::config::SandboxConfig;
use crate::error::SandboxError;
use crate::jail::{self, CgroupSpec, JailSpec, JailedChild, Killer, LayerStatus, Limits, Role};

/// System paths the host needs: its shared libraries and the loader's cache.
const RO_PATHS: &[&str] = &[
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/libx32",
    "/etc/ld.so.cache",
];

/// Time past the plugin's wall-clock budget before the jail kills the host: covers the
/// compilation before the budget starts and the host's own 60 s watchdog grace.
const DEADLINE_GRACE: Duration = Duration::from_secs(300);

/// Memory beyond the plugin's linear memory that the host may use in the cgroup
/// (wasmtime, compiled code, buffers).
const HOST_OVERHEAD_BYTES: u64 = 512 << 20;

/// How much of the host's stdout is kept (its last line is the report).
const STDOUT_TAIL: usize = 16 << 10;

/// What to run: one search's plugin, and how to reach kilnd.
#[derive(Debug, Clone)]
pub struct PluginHostSpec<'a> {
    /// The `kiln-plugin-host` executable.
    pub host_exe: &'a Path,
    /// kilnd's Unix socket (host path).
    pub socket: &'a Path,
    /// The search the host serves.
    pub search_id: &'a str,
    /// The plugin component.
    pub wasm: &'a [u8],
    /// The search's bearer token.
    pub token: &'a str,
    /// Cap on the plugin's linear memory, MiB.
    pub memory_mb: u64,
    /// The plugin's wall-clock budget, seconds.
    pub wall_secs: u64,
}

/// A running, jailed plugin host.
pub struct PluginHost {
    child: JailedChild,
    _dir: JobDir,
}

/// How a plugin host ended.
#[derive(Debug, Clone)]
pub struct PluginHostEnd {
    /// The host's exit code (0, 10-16, 1, 2: see `kiln-plugin-host`), when it exited.
    pub code: Option<i32>,
    /// The signal that killed the host (or its jail), when it did not exit.
    pub signal: Option<i32>,
    /// True if and only if the jail's deadline killed it.
    pub timed_out: bool,
    /// The end of its stdout; the last line is its report.
    pub stdout_tail: String,
    /// The end of its stderr (its log).
    pub stderr_tail: String,
}

impl PluginHostEnd {
    fn from_status(status: Option<ExitStatus>) -> (Option<i32>, Option<i32>) {
        use std::os::unix::process::ExitStatusExt;
        match status {
            // The monitor passes on the payload's status, 128 + N for signal N.
            Some(s) => match s.code() {
                Some(c) if c > 128 => (None, Some(c - 128)),
                Some(c) => (Some(c), None),
                None => (None, s.signal()),
            },
            None => (None, None),
        }
    }
}

/// Copies the plugin and the token into a fresh job directory and starts the host in the
/// jail. The layers in force are in [`PluginHost::layers`].
pub fn start(cfg: &SandboxConfig, spec: &PluginHostSpec) -> Result<PluginHost, SandboxError> {
    let dir = JobDir::new(cfg, spec.search_id)?;
    let work = dir.base.join("work");
    write_private(&work.join("plugin.wasm"), spec.wasm)?;
    write_private(&work.join("token"), spec.token.as_bytes())?;
    let jail_spec = jail_spec(cfg, spec, &dir)?;
    let deadline = Duration::from_secs(spec.wall_secs).saturating_add(DEADLINE_GRACE);
    let child = jail::spawn(&cfg.worker_exe, &jail_spec, deadline)?;
    Ok(PluginHost { child, _dir: dir })
}

impl PluginHost {
    /// The jail's layers, active or not, with the reasons.
    pub fn layers(&self) -> &[LayerStatus] {
        &self.child.report.layers
    }

    /// The jail helper's pid (the process group of the whole tree).
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Kills the host from another thread; a no-op once it has ended.
    pub fn killer(&self) -> Option<Killer> {
        self.child.killer()
    }

    /// Waits for the host to exit (or be killed), then reaps the jail and removes the
    /// job directory.
    pub fn wait(mut self) -> PluginHostEnd {
        let stdout_tail = read_tail(&mut self.child.stdout, STDOUT_TAIL);
        let ended = self.child.finish();
        let (code, signal) = PluginHostEnd::from_status(ended.status);
        PluginHostEnd {
            code,
            signal,
            timed_out: ended.timed_out,
            stdout_tail,
            stderr_tail: ended.stderr_tail,
        }
    }
}

/// Removes the job directories of plugin hosts a previous daemon left behind (killed
/// before it could clean up). Call at start, before any host is started: one daemon owns
/// a state directory. Returns how many were removed.
pub fn remove_stale(cfg: &SandboxConfig) -> usize {
    let Ok(entries) = std::fs::read_dir(&cfg.scratch_root) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("plugin-"))
        .filter(|e| std::fs::remove_dir_all(e.path()).is_ok())
        .count()
}

/// Describes the layers as one line: the active ones, then the others with the reason.
pub fn describe_layers(layers: &[LayerStatus]) -> String {
    let on: Vec<&str> = layers
        .iter()
        .filter(|l| l.active)
        .map(|l| l.name.as_str())
        .collect();
    let off: Vec<String> = layers
        .iter()
        .filter(|l| !l.active)
        .map(|l| format!("{} ({})", l.name, l.detail))
        .collect();
    let mut s = format!("active: {}", on.join(", "));
    if !off.is_empty() {
        s.push_str(&format!("; not active: {}", off.join(", ")));
    }
    s
}

fn jail_spec(
    cfg: &SandboxConfig,
    spec: &PluginHostSpec,
    dir: &JobDir,
) -> Result<JailSpec, SandboxError> {
    let canonical = |what: &'static str, p: &Path| {
        std::fs::canonicalize(p).map_err(|source| SandboxError::Path {
            what,
            path: p.to_path_buf(),
            source,
        })
    };
    let program = canonical("the plugin host", spec.host_exe)?;
    let socket = canonical("kilnd's socket", spec.socket)?;
    let mut ro_paths: Vec<PathBuf> = RO_PATHS.iter().map(PathBuf::from).collect();
    ro_paths.push(socket.clone());
    // Inside a private root only the socket file is bound, never its directories, so a
    // hidden directory above the socket holds nothing else there; covering it would
    // only cut the host off from kilnd.
    let hidden_paths = cfg
        .hidden_paths
        .iter()
        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
        .filter(|p| !socket.starts_with(p))
        .collect();
    let args = vec![
        "--socket".into(),
        socket.display().to_string(),
        "--search".into(),
        spec.search_id.to_string(),
        "--token-file".into(),
        "token".into(),
        "--wasm".into(),
        "plugin.wasm".into(),
        "--memory-mb".into(),
        spec.memory_mb.to_string(),
        "--wall-secs".into(),
        spec.wall_secs.to_string(),
    ];
    let memory_bytes = spec.memory_mb.saturating_mul(1 << 20);
    let threads = thread_allowance();
    Ok(JailSpec {
        role: Role::PluginHost,
        program,
        args,
        env: Vec::new(),
        scratch: canonical("the job's scratch", &dir.base.join("work"))?,
        root_dir: canonical("the job's root", &dir.base.join("root"))?,
        ro_paths,
        ro_binds: Vec::new(),
        hidden_paths,
        devices: Vec::new(),
        optional_ro_paths: Vec::new(),
        namespaces: !cfg.disable_namespaces,
        limits: Limits {
            // The guest runs on one thread for at most its wall-clock budget; compiling
            // it comes on top.
            cpu_s: spec.wall_secs.saturating_mul(2).saturating_add(300),
            nofile: 128,
            nproc: threads,
            // The host writes no file; memory images (memfds) hold at most the plugin's
            // initial memory.
            fsize_bytes: memory_bytes.saturating_add(16 << 20),
            as_bytes: None,
        },
        cgroup: cfg.cgroup_parent.as_ref().map(|parent| CgroupSpec {
            parent: parent.clone(),
            name: dir.name.clone(),
            memory_max: memory_bytes.saturating_add(HOST_OVERHEAD_BYTES),
            pids_max: threads,
        }),
    })
}

/// Threads the host may have: tokio starts one worker per CPU (wasmtime-wasi's runtime),
/// plus the main, epoch and watchdog threads. The seccomp filter allows threads only, so
/// this bounds threads, not processes.
fn thread_allowance() -> u64 {
    let cpus = std::thread::available_parallelism().map_or(64, |n| n.get() as u64);
    cpus.saturating_mul(2).saturating_add(64)
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), SandboxError> {
    use std::io::Write;
    let err = |source| SandboxError::Scratch {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(err)?;
    f.write_all(bytes).map_err(err)
}

/// Reads `r` to its end, keeping the last `keep` bytes.
fn read_tail(r: &mut impl Read, keep: usize) -> String {
    let mut tail: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > keep {
                    let cut = tail.len() - keep;
                    tail.drain(..cut);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&tail).into_owned()
}

/// The host's job directory (`root`, the private root's mount point, and `work`, its
/// scratch), removed on drop.
struct JobDir {
    base: PathBuf,
    name: String,
}

impl JobDir {
    fn new(cfg: &SandboxConfig, search_id: &str) -> Result<JobDir, SandboxError> {
        let id: String = search_id
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .take(40)
            .collect();
        let name = format!(
            "plugin-{id}-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        );
        let base = cfg.scratch_root.join(&name);
        for sub in ["root", "work"] {
            let p = base.join(sub);
            std::fs::create_dir_all(&p).map_err(|source| SandboxError::Scratch {
                path: p.clone(),
                source,
            })?;
        }
        Ok(JobDir { base, name })
    }
}

impl Drop for JobDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.base) {
            tracing::warn!(dir = %self.base.display(), "cannot remove the plugin host's directory: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_of_the_monitor_becomes_code_or_signal() {
        use std::os::unix::process::ExitStatusExt;
        let exit = |c: i32| Some(ExitStatus::from_raw(c << 8));
        assert_eq!(PluginHostEnd::from_status(exit(14)), (Some(14), None));
        assert_eq!(PluginHostEnd::from_status(exit(0)), (Some(0), None));
        assert_eq!(PluginHostEnd::from_status(exit(137)), (None, Some(9)));
        let killed = Some(ExitStatus::from_raw(9));
        assert_eq!(PluginHostEnd::from_status(killed), (None, Some(9)));
        assert_eq!(PluginHostEnd::from_status(None), (None, None));
    }

    #[test]
    fn layers_are_described_on_one_line() {
        let line = describe_layers(&[
            LayerStatus::on("seccomp", "x"),
            LayerStatus::off("cgroup", "no delegated cgroup v2 directory configured"),
        ]);
        assert_eq!(
            line,
            "active: seccomp; not active: cgroup (no delegated cgroup v2 directory configured)"
        );
    }

    #[test]
    fn spec_binds_the_socket_uncovered_and_stale_job_dirs_are_removed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let tmp_path = std::fs::canonicalize(tmp.path()).expect("canonical");
        let socket = tmp_path.join("kiln.sock");
        std::fs::write(&socket, "").expect("socket stand-in");
        let mut cfg = SandboxConfig::new(tmp_path.join("scratch"));
        let state = tmp_path.join("state");
        cfg.hidden_paths = vec![state.clone(), tmp_path.clone()];
        let spec = PluginHostSpec {
            host_exe: Path::new("/bin/sh"),
            socket: &socket,
            search_id: "s-1/../x",
            wasm: b"\0asm",
            token: "t",
            memory_mb: 64,
            wall_secs: 10,
        };
        let dir = JobDir::new(&cfg, spec.search_id).expect("job dir");
        assert!(dir.name.starts_with("plugin-s-1x-"), "{}", dir.name);
        let js = jail_spec(&cfg, &spec, &dir).expect("spec");
        js.validate().expect("valid");
        assert_eq!(js.role, Role::PluginHost);
        assert!(js.ro_paths.contains(&socket));
        assert_eq!(js.hidden_paths, vec![state]);
        assert_eq!(js.limits.as_bytes, None);
        let arg = |flag: &str| {
            let i = js.args.iter().position(|a| a == flag).expect(flag);
            js.args[i + 1].clone()
        };
        assert_eq!(arg("--wasm"), "plugin.wasm");
        assert_eq!(arg("--token-file"), "token");
        assert_eq!(arg("--socket"), socket.display().to_string());
        assert_eq!(arg("--memory-mb"), "64");
        let stale = JobDir::new(&cfg, "s-2").expect("job dir");
        std::mem::forget(stale);
        assert_eq!(remove_stale(&cfg), 2);
        std::mem::forget(dir);
        assert!(
            !tmp_path
                .join("scratch")
                .read_dir()
                .expect("ls")
                .any(|_| true)
        );
    }
}
