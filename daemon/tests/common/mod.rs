//! Test harness: a real kilnd on a temporary socket and state directory.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use kiln_daemon::client::Client;
use serde_json::{Value, json};

/// The `kiln` CLI binary (crate kiln-cli), built beside kilnd by `cargo test --workspace`
/// (kiln-cli's own tests need it) or `cargo build --workspace`.
pub fn kiln_cli() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_kilnd")).with_file_name("kiln");
    assert!(
        path.exists(),
        "{} is missing: build the CLI first (cargo build -p kiln-cli)",
        path.display()
    );
    path
}

/// A running kilnd, killed on drop.
pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub state: PathBuf,
    pub config: PathBuf,
    child: Option<Child>,
}

/// Config every test daemon gets: short timing so evaluations are quick.
pub const FAST_CONFIG: &str = r#"
[evaluation]
trials = 2
run_timeout_ms = 2000
compile_timeout_secs = 20
[evaluation.timing]
warmup = 1
min_samples = 5
min_time_ms = 5.0
max_rse = 0.05
max_samples = 200
wall_cap_ms = 500.0
recheck_fraction = 0.2
"#;

impl Daemon {
    /// Starts kilnd with `extra` appended to the fast config.
    pub fn start(extra: &str) -> Daemon {
        Self::start_with_config(&format!("{FAST_CONFIG}\n{extra}"))
    }

    /// Starts kilnd with exactly this config file.
    pub fn start_with_config(text: &str) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("kiln.sock");
        let state = dir.path().join("state");
        let config = dir.path().join("kiln.toml");
        std::fs::write(&config, text).expect("write config");
        let mut d = Daemon {
            dir,
            socket,
            state,
            config,
            child: None,
        };
        d.spawn();
        d
    }

    /// Starts (again) the kilnd process on the same socket and state.
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("kilnd.log"))
            .expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_kilnd"))
            .arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--config")
            .arg(&self.config)
            .env("KILN_LOG", "info,kiln_daemon=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn kilnd");
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("kilnd exited early with {status}; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("kilnd did not come up; log:\n{}", self.log());
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kilnd.log")).unwrap_or_default()
    }

    /// A client for this daemon.
    pub fn client(&self) -> Client {
        Client::new(&self.socket)
    }

    /// SIGKILL, no chance to clean up.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit; returns the exit status's success.
    pub fn terminate(&mut self) -> bool {
        if let Some(mut c) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(c.id()).expect("pid"));
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            return c.wait().map(|s| s.success()).unwrap_or(false);
        }
        false
    }

    /// SIGTERM and wait up to `limit` for the exit: `Some(success)`, or `None` when it
    /// did not exit in time (it is then killed).
    pub fn terminate_within(&mut self, limit: Duration) -> Option<bool> {
        let mut c = self.child.take()?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(c.id()).expect("pid"));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + limit;
        loop {
            match c.try_wait() {
                Ok(Some(status)) => return Some(status.success()),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                _ => {
                    let _ = c.kill();
                    let _ = c.wait();
                    return None;
                }
            }
        }
    }

    /// The pid of the running daemon.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Writes a tiny host problem `name` (y = 2x over 1024 floats) into `dir`.
pub fn write_double_problem(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::create_dir_all(&p).expect("mkdir");
    std::fs::write(
        p.join("problem.toml"),
        format!(
            r#"
name = "{name}"
summary = "y = 2x"
[[tensor]]
name = "x"
dtype = "f32"
shape = [1024]
role = "input"
[[tensor]]
name = "y"
dtype = "f32"
shape = [1024]
role = "output"
[tolerance]
atol = 1e-6
rtol = 1e-6
[reference.host]
file = "reference.c"
launches = [{{ kernel = "ref_double", args = ["x", "y", {{ i32 = 1024 }}] }}]
[seed.host]
file = "seed.c"
launches = [{{ kernel = "double_it", args = ["x", "y", {{ i32 = 1024 }}] }}]
"#
        ),
    )
    .expect("problem.toml");
    std::fs::write(
        p.join("reference.c"),
        "void ref_double(const float *x, float *y, int n) { for (int i = 0; i < n; i++) y[i] = (float)(2.0 * (double)x[i]); }\n",
    )
    .expect("reference.c");
    std::fs::write(
        p.join("seed.c"),
        "void double_it(const float *x, float *y, int n) { for (int i = 0; i < n; i++) y[i] = 2.0f * x[i]; }\n",
    )
    .expect("seed.c");
    p
}

/// Registers a problem folder through the API, as the CLI does.
pub async fn register(client: &Client, dir: &Path) -> Value {
    let spec = kiln_types::ProblemSpec::load_dir(dir).expect("load problem");
    client
        .post("/v1/problems", &serde_json::to_value(&spec).expect("json"))
        .await
        .expect("register")
        .1
}

/// A host candidate for the double problem with a given body.
pub fn double_candidate(problem: &str, body: &str) -> Value {
    json!({
        "problem": problem,
        "language": "c",
        "source": format!("void k(const float *x, float *y, int n) {{ {body} }}\n"),
        "launches": [{"kernel": "k", "args": ["x", "y", {"i32": 1024}]}],
    })
}

/// Sends raw bytes as one HTTP request and returns (status, body).
pub fn raw_request(socket: &Path, request: &[u8]) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(request).expect("write");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Builds `plugins` with `scripts/build-plugins.sh` (installed as
/// `target/debug/proposers/NAME.wasm`), the plugin host and the jail helper (kiln-worker),
/// once per test binary.
pub fn build_search_tools(plugins: &[&str]) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let root = repo_root();
        let st = Command::new(root.join("scripts/build-plugins.sh"))
            .current_dir(&root)
            .args(plugins)
            .status()
            .expect("run scripts/build-plugins.sh");
        assert!(st.success(), "scripts/build-plugins.sh failed");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .current_dir(&root)
            .args(["build", "-p", "kiln-plugin-host", "-p", "kiln-sandbox"])
            .status()
            .expect("run cargo build");
        assert!(
            st.success(),
            "building kiln-plugin-host and kiln-worker failed"
        );
    });
}

/// Config for search tests: timing with enough samples for 95 % intervals that separate
/// kernels on a small machine, and the proposers installed by [`build_search_tools`];
/// `extra` is appended.
pub fn search_config(extra: &str) -> String {
    format!(
        r#"
[evaluation]
trials = 2
run_timeout_ms = 5000
compile_timeout_secs = 30
[evaluation.timing]
warmup = 1
min_samples = 12
min_time_ms = 20.0
max_rse = 0.02
max_samples = 80
wall_cap_ms = 1500.0
recheck_fraction = 0.1
[search]
proposers_dir = "{}"
{extra}
"#,
        repo_root().join("target/debug/proposers").display()
    )
}
