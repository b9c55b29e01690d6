//! kilnd's configuration: the TOML schema, its defaults, and where files live.
//!
//! Every key is optional. [`DEFAULT_CONFIG_TOML`] is the commented reference printed by
//! `kilnd --print-default-config`; a unit test checks that it parses to exactly
//! [`Config::default`], so the two cannot drift apart.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The commented default configuration, printed by `kilnd --print-default-config`.
pub const DEFAULT_CONFIG_TOML: &str = include_str!("default-config.toml");

/// Why the configuration could not be loaded.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the key.
        message: String,
    },
    /// A value is out of range.
    #[error("config: {0}")]
    Invalid(String),
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Socket, state and limits of the API server.
    pub server: ServerConfig,
    /// Who may talk to the daemon.
    pub access: AccessConfig,
    /// The durable job queue and its workers.
    pub queue: QueueConfig,
    /// How candidates are evaluated.
    pub evaluation: EvaluationConfig,
    /// The jail for untrusted code.
    pub jail: JailConfig,
    /// GPUs and clock policy.
    pub gpu: GpuConfig,
    /// CUDA compiles: the toolkit's headers.
    pub cuda: CudaConfig,
    /// Triton candidates: the python whose triton compiles them.
    pub triton: TritonConfig,
    /// Searches and their proposer plugins.
    pub search: SearchConfig,
    /// The LLM gateway.
    pub llm: LlmConfig,
    /// Several kilnd nodes sharing one PostgreSQL database.
    pub cluster: ClusterConfig,
    /// Logging.
    pub log: LogConfig,
}

/// `[cluster]`: absent or with an empty `database_url`, kilnd is a single host (SQLite).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// `postgres://user@host/db?sslmode=require` (libpq URL or key=value form); the
    /// environment variable `KILN_DATABASE_URL` overrides it. Empty: a single host.
    pub database_url: String,
    /// A PEM file of CA certificates trusted for the database's TLS besides the system's.
    pub ca_file: String,
    /// This node's id, unique in the cluster; empty: the host name.
    pub node_id: String,
    /// Replaces the automatic part of this node's GPU classes (`cuda/<model>/<driver>/
    /// <clock policy>`, `host/<cpu>`): the class becomes `<backend>/<this>`. Empty: automatic.
    pub gpu_class: String,
    /// Claim and evaluate jobs; false makes the node a gateway (it serves the API and
    /// queues work for the others).
    pub evaluate: bool,
    /// Run the plugin hosts of searches (this node's own and those whose host died).
    pub run_searches: bool,
    /// Lease of a claimed job or a hosted search, seconds: a node silent this long loses
    /// them.
    pub lease_secs: f64,
    /// Heartbeat period, seconds (renews the node's leases; keep it at most a third of
    /// the lease).
    pub heartbeat_secs: f64,
    /// How often this node's reaper re-queues expired leases, seconds.
    pub reaper_secs: f64,
    /// How often finished jobs are read when no notification came, ms.
    pub poll_ms: u64,
    /// Connections to the database.
    pub pool_size: usize,
    /// Calibrate this node against its class every this many seconds (and when it joins);
    /// 0: never.
    pub calibrate_every_secs: u64,
    /// A node whose calibration is further than this fraction from its class's median
    /// stops claiming (0.10 = 10 %).
    pub drift_threshold: f64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            database_url: String::new(),
            ca_file: String::new(),
            node_id: String::new(),
            gpu_class: String::new(),
            evaluate: true,
            run_searches: true,
            lease_secs: 30.0,
            heartbeat_secs: 10.0,
            reaper_secs: 5.0,
            poll_ms: 1000,
            pool_size: 8,
            calibrate_every_secs: 3600,
            drift_threshold: 0.10,
        }
    }
}

impl ClusterConfig {
    /// Whether this node is part of a cluster.
    pub fn enabled(&self) -> bool {
        !self.database_url.trim().is_empty()
    }
}

/// `[search]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SearchConfig {
    /// Folder of installed proposers (`NAME.wasm`); empty: `proposers/` beside kilnd, then
    /// `../share/kiln/proposers` beside kilnd, then `/usr/lib/kiln/proposers`.
    pub proposers_dir: String,
    /// The plugin host binary; empty: `kiln-plugin-host` beside kilnd.
    pub plugin_host: String,
    /// Memory cap of a plugin's linear memory, MiB.
    pub plugin_memory_mb: u64,
    /// Candidate budget when a search does not give one.
    pub default_budget: u64,
    /// Time limit when a search does not give one, seconds.
    pub default_time_limit_secs: u64,
    /// LLM token budget when a search does not give one.
    pub default_llm_tokens: u64,
    /// Jobs one search may have queued or running at once; more submissions wait.
    pub queue_cap: u64,
    /// Race the incumbent: a search's candidate stops timing once it is clearly slower than
    /// the search's best (still `ok`, marked raced out).
    pub race: bool,
    /// How much slower than the best's upper bound a candidate's lower bound must be to be
    /// raced out (0.05 = 5 %); also the default for single submissions that ask to race.
    pub race_margin: f64,
    /// Most lines a search's plugin may write to the search's log; later ones are dropped.
    pub log_max_rows: u64,
    /// Most bytes of messages a search's plugin may write to the search's log.
    pub log_max_bytes: u64,
}

impl Default for SearchConfig {
    fn default() -> Self {
        SearchConfig {
            proposers_dir: String::new(),
            plugin_host: String::new(),
            plugin_memory_mb: 256,
            default_budget: 50,
            default_time_limit_secs: 1800,
            default_llm_tokens: 200_000,
            queue_cap: 8,
            race: true,
            race_margin: 0.05,
            log_max_rows: 20_000,
            log_max_bytes: 8 << 20,
        }
    }
}

/// `[llm]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LlmConfig {
    /// `none`, `openai` (any OpenAI-compatible endpoint) or `replay`.
    pub provider: String,
    /// Endpoint base URL (`…/v1`).
    pub base_url: String,
    /// Model name sent to the endpoint.
    pub model: String,
    /// Environment variable holding the API key.
    pub api_key_env: String,
    /// File holding the API key (wins over the variable).
    pub api_key_file: String,
    /// Timeout of one HTTP attempt, seconds.
    pub timeout_secs: u64,
    /// Retries after a rate limit, server error, timeout or network failure.
    pub max_retries: u32,
    /// First backoff between retries, ms (doubles each retry).
    pub backoff_ms: u64,
    /// Most tokens one call may generate.
    pub max_tokens_per_call: u32,
    /// JSONL file of recorded replies for the `replay` provider.
    pub replay_file: String,
    /// Price per 1000 prompt tokens (0: cost not recorded).
    pub price_prompt_per_1k: f64,
    /// Price per 1000 completion tokens.
    pub price_completion_per_1k: f64,
}

impl Default for LlmConfig {
    fn default() -> Self {
        LlmConfig {
            provider: "none".into(),
            base_url: "https://api.openai.com/v1".into(),
            model: String::new(),
            api_key_env: "OPENAI_API_KEY".into(),
            api_key_file: String::new(),
            timeout_secs: 120,
            max_retries: 3,
            backoff_ms: 500,
            max_tokens_per_call: 4096,
            replay_file: String::new(),
            price_prompt_per_1k: 0.0,
            price_completion_per_1k: 0.0,
        }
    }
}

/// `[server]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Unix socket path; empty means the mode's default.
    pub socket: String,
    /// State directory; empty means the mode's default.
    pub state_dir: String,
    /// Largest accepted request body, bytes.
    pub max_body_bytes: usize,
    /// How long SIGTERM waits for running jobs before stopping anyway, seconds.
    pub shutdown_timeout_secs: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            socket: String::new(),
            state_dir: String::new(),
            max_body_bytes: 4 << 20,
            shutdown_timeout_secs: 30,
        }
    }
}

/// `[access]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccessConfig {
    /// Allow the uid the daemon runs as.
    pub allow_daemon_user: bool,
    /// Allow uid 0.
    pub allow_root: bool,
    /// Members of this group (primary or supplementary) are allowed; empty disables.
    pub group: String,
    /// Further uids allowed.
    pub allow_uids: Vec<u32>,
    /// Further gids allowed (matched against the caller's primary gid).
    pub allow_gids: Vec<u32>,
}

impl Default for AccessConfig {
    fn default() -> Self {
        AccessConfig {
            allow_daemon_user: true,
            allow_root: true,
            group: "kiln".into(),
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
        }
    }
}

/// `[queue]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// A job whose evaluation was cut short by a daemon crash this many times is marked
    /// failed (claims, compiles and waits for a lane are not counted).
    pub max_attempts: u32,
    /// Concurrent compile jobs; 0 means one per CPU.
    pub compile_workers: usize,
    /// Jobs each lane has compiled ahead (claimed from the queue, compiling or waiting
    /// for it) besides the one it evaluates, at least; more while compiles take longer
    /// than evaluations (`sched::ahead`). The rest stay queued.
    pub lane_prefetch: usize,
    /// Jobs ahead of each lane at most, however slow compiles are (they are bounded by
    /// the compile slots too).
    pub max_lane_ahead: usize,
    /// Jobs waiting (queued, compiling or compiled) at most: `POST /v1/candidates` answers
    /// 429 `queue_full` beyond it, so a client that submits faster than the lanes evaluate
    /// is slowed down instead of growing the queue without bound.
    pub max_waiting: u64,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            max_attempts: 3,
            compile_workers: 0,
            lane_prefetch: 2,
            max_lane_ahead: 32,
            max_waiting: 100_000,
        }
    }
}

/// Default host peak bandwidth for the floor check: 2 TB/s, above what one core moves even
/// from its L1 cache (two or three 64-byte loads a cycle at 5-6 GHz is about 1 TB/s). The
/// host runner is single-threaded (seccomp refuses threads), so no honest kernel comes
/// near it, while a time that implies more cannot have read its inputs.
pub const HOST_PEAK_BYTES_PER_S: f64 = 2e12;
/// Default host peak compute for the floor check: 2 Tflop/s, over five times one core's
/// f32 peak with AVX-512 (2 FMA units × 16 lanes × 2 flops × 6 GHz ≈ 0.38 Tflop/s).
pub const HOST_PEAK_FLOPS: f64 = 2e12;

/// `[evaluation]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvaluationConfig {
    /// Correctness trials on the problem's distributions (a shifted one is added).
    pub trials: u32,
    /// Wall-clock limit for one run of a launch list, milliseconds.
    pub run_timeout_ms: u64,
    /// Wall-clock limit for one compile, seconds (default 180: published kernels that
    /// instantiate many templates take up to ~100 s under NVRTC; docs/corpus.md).
    pub compile_timeout_secs: u64,
    /// Memory limit for each jailed child, MiB.
    pub memory_limit_mb: u64,
    /// Host backend peak memory bandwidth for the floor check, bytes/s (0 disables).
    pub host_peak_bytes_per_s: f64,
    /// Host backend peak compute for the floor check, flop/s (0 disables).
    pub host_peak_flops: f64,
    /// The timing stop rule.
    pub timing: kiln_types::TimingPlan,
}

impl Default for EvaluationConfig {
    fn default() -> Self {
        EvaluationConfig {
            trials: 3,
            run_timeout_ms: 5_000,
            compile_timeout_secs: 180,
            memory_limit_mb: 2048,
            host_peak_bytes_per_s: HOST_PEAK_BYTES_PER_S,
            host_peak_flops: HOST_PEAK_FLOPS,
            timing: kiln_types::TimingPlan::default(),
        }
    }
}

/// `[jail]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct JailConfig {
    /// Do not create namespaces even where the kernel allows them (other layers stay).
    pub disable_namespaces: bool,
    /// A delegated cgroup v2 directory under which each child gets its own cgroup with
    /// `memory.max` and `pids.max`; empty means none (the log says so).
    pub cgroup_parent: String,
}

/// `[gpu]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuConfig {
    /// `observe` (never touch clocks) or `lock` (NVML locked SM clocks around each
    /// evaluation, reset afterwards; needs the permission `kiln doctor` checks).
    pub clock_policy: String,
    /// With `lock`: the SM clock to lock at, MHz; 0 = the GPU's base clock.
    pub lock_mhz: u32,
    /// GPUs to use, by UUID or index (as `kiln devices` lists them); empty = all found. A
    /// name that matches no GPU stops kilnd at start (`crate::gpu::selection`).
    pub devices: Vec<String>,
    /// A GPU lane's warm worker is replaced after this many evaluations (and after any
    /// fault or timeout).
    pub worker_max_evals: u32,
    /// Extra directories searched for the baseline libraries (cuBLAS, cuDNN), appended to
    /// the GPU workers' `LD_LIBRARY_PATH` and shown read-only in their jails.
    pub library_dirs: Vec<String>,
    /// Also look for cuDNN/cuBLAS inside python's `nvidia` wheels (torch ships cuDNN
    /// there), by asking `python` once at start.
    pub discover_python_libraries: bool,
    /// The python that runs the torch runner (torch baselines); empty = none.
    pub python: String,
    /// Wall-clock limit of the torch runner, seconds.
    pub torch_timeout_secs: u64,
    /// Where GPU workers find CUPTI for kernel timing: `auto` (the loader's path, then the
    /// CUDA toolkit's usual directories), `off` (events only), or an absolute directory
    /// holding `libcupti.so.13` (used when the loader finds none; shown read-only in the
    /// workers' jails).
    pub cupti: String,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            clock_policy: "observe".into(),
            lock_mhz: 0,
            devices: Vec::new(),
            worker_max_evals: 500,
            library_dirs: Vec::new(),
            discover_python_libraries: true,
            python: "python3".into(),
            torch_timeout_secs: 600,
            cupti: "auto".into(),
        }
    }
}

/// `[cuda]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CudaConfig {
    /// The toolkit's include folders (absolute); empty = discovered (see
    /// `kiln_sandbox::engine::cuda::toolkit`).
    pub include_dirs: Vec<String>,
    /// Whether compiles of candidates whose leading `#include`s name toolkit headers start
    /// from NVRTC precompiled headers (`kiln_sandbox::engine::cuda::pch`), kept in
    /// `<state_dir>/scratch/pch`.
    pub precompiled_headers: bool,
}

impl Default for CudaConfig {
    fn default() -> Self {
        CudaConfig {
            include_dirs: Vec::new(),
            precompiled_headers: true,
        }
    }
}

/// `[triton]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TritonConfig {
    /// The python whose `triton` compiles Triton candidates (in the compile jail, its
    /// directories shown read-only); empty = `[gpu] python`, the one that has torch.
    pub python: String,
}

impl Config {
    /// The python asked for triton: `[triton] python`, else `[gpu] python`.
    pub fn triton_python(&self) -> &str {
        if self.triton.python.is_empty() {
            &self.gpu.python
        } else {
            &self.triton.python
        }
    }
}

/// `[log]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Filter in `tracing` syntax; `KILN_LOG` overrides it.
    pub level: String,
    /// `text` or `json` (stderr); journald is used instead when run under systemd.
    pub format: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".into(),
            format: "text".into(),
        }
    }
}

impl Config {
    /// Parses TOML text; `origin` names the file in errors.
    pub fn from_toml(text: &str, origin: &Path) -> Result<Self, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| {
            let mut message = e.to_string();
            if message.contains("fresh_inputs_every") {
                message.push_str(
                    "\nevaluation.timing.fresh_inputs_every was removed: every timed sample \
                     now runs on fresh inputs, so the key has nothing left to set; delete it",
                );
            }
            ConfigError::Parse {
                path: origin.to_path_buf(),
                message,
            }
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and parses a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(&text, path)
    }

    /// Range checks that the schema cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.to_string()));
        if self.server.max_body_bytes < 1024 {
            return bad("server.max_body_bytes must be at least 1024");
        }
        if self.queue.max_attempts == 0 {
            return bad("queue.max_attempts must be at least 1");
        }
        if self.evaluation.trials == 0 {
            return bad("evaluation.trials must be at least 1");
        }
        if self.evaluation.run_timeout_ms == 0 || self.evaluation.compile_timeout_secs == 0 {
            return bad("evaluation timeouts must be positive");
        }
        let t = &self.evaluation.timing;
        if t.min_samples == 0 || t.max_samples < t.min_samples {
            return bad("evaluation.timing: need 1 <= min_samples <= max_samples");
        }
        if t.max_rse.is_nan() || t.max_rse <= 0.0 || t.wall_cap_ms.is_nan() || t.wall_cap_ms <= 0.0
        {
            return bad("evaluation.timing: max_rse and wall_cap_ms must be positive");
        }
        if !(0.0..=1.0).contains(&t.recheck_fraction) {
            return bad("evaluation.timing.recheck_fraction must be within 0..=1");
        }
        if !matches!(self.gpu.clock_policy.as_str(), "observe" | "lock") {
            return bad("gpu.clock_policy must be \"observe\" or \"lock\"");
        }
        if let Err(e) = kiln_sandbox::kiln_gpu::cupti::CuptiSetting::parse(&self.gpu.cupti) {
            return Err(ConfigError::Invalid(format!("gpu.{e}")));
        }
        if self.gpu.worker_max_evals == 0 {
            return bad("gpu.worker_max_evals must be at least 1");
        }
        if !matches!(self.llm.provider.as_str(), "none" | "openai" | "replay") {
            return bad("llm.provider must be \"none\", \"openai\" or \"replay\"");
        }
        if self.search.queue_cap == 0 || self.search.plugin_memory_mb == 0 {
            return bad("search.queue_cap and search.plugin_memory_mb must be positive");
        }
        if !(self.search.race_margin.is_finite() && (0.0..=10.0).contains(&self.search.race_margin))
        {
            return bad("search.race_margin must be within 0..=10");
        }
        let c = &self.cluster;
        let positive = |v: f64| v.is_finite() && v > 0.0;
        let timings_ok = c.lease_secs >= 1.0
            && positive(c.lease_secs)
            && positive(c.heartbeat_secs)
            && positive(c.reaper_secs);
        if !timings_ok {
            return bad(
                "cluster: lease_secs must be at least 1, heartbeat_secs and reaper_secs positive",
            );
        }
        if c.heartbeat_secs * 2.0 > c.lease_secs {
            return bad("cluster.heartbeat_secs must be at most half of cluster.lease_secs");
        }
        if c.poll_ms == 0 || c.pool_size == 0 {
            return bad("cluster.poll_ms and cluster.pool_size must be positive");
        }
        if !(c.drift_threshold.is_finite() && c.drift_threshold > 0.0) {
            return bad("cluster.drift_threshold must be positive");
        }
        if c.gpu_class.contains('/') || c.node_id.contains(char::is_whitespace) {
            return bad("cluster.gpu_class may not contain '/', cluster.node_id no spaces");
        }
        if !matches!(self.log.format.as_str(), "text" | "json") {
            return bad("log.format must be \"text\" or \"json\"");
        }
        if self.cuda.include_dirs.iter().any(|d| !d.starts_with('/')) {
            return bad("cuda.include_dirs must be absolute paths");
        }
        Ok(())
    }
}

/// Which set of default paths applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A user's daemon: socket under `$XDG_RUNTIME_DIR`, state under the XDG data dir.
    User,
    /// The machine's service: `/run/kiln/kiln.sock`, `/var/lib/kiln`, `/etc/kiln/kiln.toml`.
    System,
}

/// Default paths for a mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultPaths {
    /// API socket.
    pub socket: PathBuf,
    /// State directory (SQLite database, scratch).
    pub state_dir: PathBuf,
    /// Config file read when present.
    pub config: PathBuf,
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The user-mode runtime directory: `$XDG_RUNTIME_DIR`, else `/run/user/UID` when it
/// exists, else a private folder under the temp dir.
fn user_runtime_dir() -> PathBuf {
    if let Some(p) = env_path("XDG_RUNTIME_DIR") {
        return p;
    }
    let uid = nix::unistd::getuid().as_raw();
    let run_user = PathBuf::from(format!("/run/user/{uid}"));
    if run_user.is_dir() {
        return run_user;
    }
    std::env::temp_dir().join(format!("kiln-{uid}"))
}

impl DefaultPaths {
    /// The defaults for `mode`, resolved from the environment.
    pub fn for_mode(mode: Mode) -> Self {
        match mode {
            Mode::System => DefaultPaths {
                socket: PathBuf::from("/run/kiln/kiln.sock"),
                state_dir: PathBuf::from("/var/lib/kiln"),
                config: PathBuf::from("/etc/kiln/kiln.toml"),
            },
            Mode::User => {
                let home = env_path("HOME").unwrap_or_else(std::env::temp_dir);
                let data = env_path("XDG_DATA_HOME").unwrap_or_else(|| home.join(".local/share"));
                let conf = env_path("XDG_CONFIG_HOME").unwrap_or_else(|| home.join(".config"));
                DefaultPaths {
                    socket: user_runtime_dir().join("kiln/kiln.sock"),
                    state_dir: data.join("kiln"),
                    config: conf.join("kiln/kiln.toml"),
                }
            }
        }
    }
}

/// The socket a client should use: `explicit` (flag or `KILN_SOCKET`), else the user
/// socket if it exists, else the system socket if it exists, else the user default.
pub fn client_socket(explicit: Option<PathBuf>) -> PathBuf {
    if let Some(p) = explicit {
        return p;
    }
    let user = DefaultPaths::for_mode(Mode::User).socket;
    if user.exists() {
        return user;
    }
    let system = DefaultPaths::for_mode(Mode::System).socket;
    if system.exists() {
        return system;
    }
    user
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commented_default_parses_to_the_defaults() {
        let cfg = Config::from_toml(DEFAULT_CONFIG_TOML, Path::new("default"))
            .expect("default config parses");
        assert_eq!(cfg, Config::default());
    }

    #[test]
    fn unknown_key_is_named() {
        let err = Config::from_toml("[queue]\nmax_attempt = 3\n", Path::new("x.toml"))
            .expect_err("unknown key");
        assert!(err.to_string().contains("max_attempt"), "{err}");
    }

    #[test]
    fn out_of_range_is_refused() {
        let err = Config::from_toml("[queue]\nmax_attempts = 0\n", Path::new("x.toml"))
            .expect_err("zero attempts");
        assert!(err.to_string().contains("max_attempts"), "{err}");
        assert!(
            Config::from_toml("[gpu]\nclock_policy = \"fast\"\n", Path::new("x")).is_err(),
            "lock is not available yet"
        );
        let err = Config::from_toml("[gpu]\ncupti = \"lib\"\n", Path::new("x"))
            .expect_err("a relative cupti directory");
        assert!(err.to_string().contains("gpu.cupti"), "{err}");
        for ok in ["auto", "off", "/opt/cuda/extras/CUPTI/lib64"] {
            let c =
                Config::from_toml(&format!("[gpu]\ncupti = \"{ok}\"\n"), Path::new("x")).expect(ok);
            assert_eq!(c.gpu.cupti, ok);
        }
        let err = Config::from_toml("[evaluation.timing]\nfigure = \"wall\"\n", Path::new("x"))
            .expect_err("an unknown figure");
        assert!(
            err.to_string().contains("figure") || err.to_string().contains("wall"),
            "{err}"
        );
    }
}
