//! The blocking library API kilnd calls (from `spawn_blocking`): compile, evaluate, probe
//! the jail's layers, report the backends.
//!
//! Every call gets a fresh job directory under `scratch_root` (`job-…/root`, the private
//! root's mount point, and `job-…/work`, the scratch), a fresh jailed `kiln-worker`, and
//! cleans both up before returning.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kiln_types::{Candidate, CompileInfo, EvalPlan, Evaluation, Language, ProblemSpec, Verdict};
use serde::{Deserialize, Serialize};

use crate::error::SandboxError;
use crate::host::flags;
use crate::jail::{self, CgroupSpec, JailSpec, LayerStatus, Limits, Role};
use crate::protocol::{self, PROTOCOL_VERSION, Request, Response, RunLimits};

/// How the sandbox runs jobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxConfig {
    /// The `kiln-worker` executable (see [`default_worker_exe`]).
    pub worker_exe: PathBuf,
    /// Directory under which each job gets its own scratch directory.
    pub scratch_root: PathBuf,
    /// Paths hidden from jailed processes (the daemon's state dir, for instance).
    pub hidden_paths: Vec<PathBuf>,
    /// Wall-clock limit of the compiler.
    pub compile_timeout: Duration,
    /// Address-space limit of the compiler and of each runner, bytes (also the cgroup
    /// `memory.max` basis).
    pub memory_limit_bytes: u64,
    /// Delegated cgroup v2 directory for `memory.max`/`pids.max`, if any.
    pub cgroup_parent: Option<PathBuf>,
    /// The C compiler.
    pub cc: PathBuf,
    /// Skip the namespaces (for kernels that refuse them, or to test the fallback).
    pub disable_namespaces: bool,
    /// Bytes a candidate may print in one evaluation before it is stopped.
    pub output_limit_bytes: u64,
}

impl SandboxConfig {
    /// Defaults: worker next to the current executable, `cc` from PATH, 30 s compile
    /// timeout, 2 GiB memory, 1 MiB of candidate output, namespaces on, no cgroup.
    pub fn new(scratch_root: impl Into<PathBuf>) -> Self {
        SandboxConfig {
            worker_exe: default_worker_exe(),
            scratch_root: scratch_root.into(),
            hidden_paths: Vec::new(),
            compile_timeout: Duration::from_secs(30),
            memory_limit_bytes: 2 << 30,
            cgroup_parent: None,
            cc: PathBuf::from("cc"),
            disable_namespaces: false,
            output_limit_bytes: 1 << 20,
        }
    }
}

/// `kiln-worker` next to the current executable, else the first one on PATH, else the
/// bare name (which then fails to start with a clear error).
pub fn default_worker_exe() -> PathBuf {
    const NAME: &str = "kiln-worker";
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
    {
        let p = dir.join(NAME);
        if p.is_file() {
            return p;
        }
    }
    which(NAME).unwrap_or_else(|| PathBuf::from(NAME))
}

fn which(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// The result of [`compile`].
#[derive(Debug, Clone)]
pub struct CompileOutcome {
    /// The artifact (a shared object for the host backend), when the compile succeeded.
    pub artifact: Option<Vec<u8>>,
    /// Duration and compiler log.
    pub info: CompileInfo,
    /// The `compile_error` evaluation, when it failed.
    pub failure: Option<Evaluation>,
    /// The jail layers the compile ran under (empty if refused before the jail started).
    pub layers: Vec<LayerStatus>,
}

/// Whether a backend can run here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendStatus {
    /// `host` or `cuda`.
    pub name: String,
    /// True if and only if candidates for it can be compiled and run.
    pub usable: bool,
    /// Why (not).
    pub reason: String,
}

/// The backends and whether they are usable.
pub fn backend_status() -> Vec<BackendStatus> {
    let cc = which("cc");
    vec![
        BackendStatus {
            name: "host".into(),
            usable: cc.is_some(),
            reason: match cc {
                Some(p) => format!("C compiler {}", p.display()),
                None => "no `cc` on PATH".into(),
            },
        },
        BackendStatus {
            name: "cuda".into(),
            usable: false,
            reason: "not built yet".into(),
        },
    ]
}

/// A job's directory, removed on drop.
struct JobDir {
    base: PathBuf,
    name: String,
}

impl JobDir {
    fn new(cfg: &SandboxConfig) -> Result<JobDir, SandboxError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "job-{}-{}-{:08x}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            rand::random::<u32>()
        );
        let base = cfg.scratch_root.join(&name);
        let mk = |p: &Path| {
            std::fs::create_dir_all(p).map_err(|source| SandboxError::Scratch {
                path: p.to_path_buf(),
                source,
            })
        };
        mk(&base.join("root"))?;
        mk(&base.join("work"))?;
        Ok(JobDir { base, name })
    }
}

impl Drop for JobDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.base) {
            tracing::warn!(dir = %self.base.display(), "cannot remove job directory: {e}");
        }
    }
}

/// Host paths the private root shows read-only: the toolchain and shared libraries.
const RO_PATHS: &[&str] = &[
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/libx32",
    "/bin",
    "/sbin",
    "/etc/ld.so.cache",
    "/etc/alternatives",
];

fn jail_spec(
    cfg: &SandboxConfig,
    role: Role,
    job: &JobDir,
    limits: Limits,
    payload: &str,
) -> Result<JailSpec, SandboxError> {
    let abs = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let program = abs(&cfg.worker_exe);
    let mut env = vec![("PATH".to_string(), "/usr/bin:/bin".to_string())];
    if let Ok(level) = std::env::var("KILN_WORKER_LOG") {
        env.push(("KILN_LOG".into(), level));
    }
    Ok(JailSpec {
        role,
        program,
        args: vec![payload.to_string(), format!("--tag={}", job.base.display())],
        env,
        scratch: abs(&job.base.join("work")),
        root_dir: abs(&job.base.join("root")),
        ro_paths: RO_PATHS.iter().map(PathBuf::from).collect(),
        hidden_paths: cfg.hidden_paths.iter().map(|p| abs(p)).collect(),
        namespaces: !cfg.disable_namespaces,
        limits,
        cgroup: cfg.cgroup_parent.as_ref().map(|parent| CgroupSpec {
            parent: parent.clone(),
            name: job.name.clone(),
            memory_max: cfg.memory_limit_bytes.saturating_mul(3),
            pids_max: 128,
        }),
    })
}

fn protocol_error(e: protocol::ProtocolError, child: &mut jail::JailedChild) -> SandboxError {
    let ended = child.finish();
    SandboxError::Protocol {
        message: format!(
            "{e}; worker {}; log: {}",
            ended
                .status
                .map_or("status unknown".into(), |s| s.to_string()),
            ended.stderr_tail.trim()
        ),
        source: Some(e),
    }
}

fn compile_failure(message: String, info: CompileInfo) -> Evaluation {
    let mut e = Evaluation::early(Verdict::CompileError, "host", message);
    e.compile = Some(info);
    e
}

/// Compiles a candidate inside a jailed worker (compile role).
pub fn compile(cfg: &SandboxConfig, candidate: &Candidate) -> Result<CompileOutcome, SandboxError> {
    if candidate.language != Language::C {
        return Err(SandboxError::BackendUnavailable(
            "cuda".into(),
            "not built yet".into(),
        ));
    }
    let refused = |message: String| CompileOutcome {
        artifact: None,
        info: CompileInfo::default(),
        failure: Some(compile_failure(message, CompileInfo::default())),
        layers: Vec::new(),
    };
    if let Err(e) = candidate.validate() {
        return Ok(refused(e.to_string()));
    }
    if let Err(e) = flags::check_all(&candidate.flags) {
        return Ok(refused(e));
    }
    let job = JobDir::new(cfg)?;
    let limits = Limits {
        cpu_s: cfg.compile_timeout.as_secs() + 2,
        nofile: 256,
        nproc: 64,
        fsize_bytes: 64 << 20,
        as_bytes: Some(cfg.memory_limit_bytes),
    };
    let spec = jail_spec(cfg, Role::Compile, &job, limits, "serve")?;
    let cc = which(&cfg.cc.to_string_lossy()).unwrap_or_else(|| cfg.cc.clone());
    let cc = std::fs::canonicalize(&cc).unwrap_or(cc);
    let deadline = cfg.compile_timeout + Duration::from_secs(10);
    let mut child = jail::spawn(&cfg.worker_exe, &spec, deadline)?;
    let layers = child.report.layers.clone();
    let request = Request::Compile {
        version: PROTOCOL_VERSION,
        candidate: candidate.clone(),
        cc,
        timeout_ms: cfg.compile_timeout.as_millis() as u64,
    };
    let reply = child
        .stdin
        .as_mut()
        .ok_or_else(|| protocol::ProtocolError::Io(std::io::ErrorKind::BrokenPipe.into()))
        .and_then(|w| protocol::write_message(w, &request, &[]))
        .and_then(|()| protocol::read_message::<Response>(&mut child.stdout));
    if child.timed_out() {
        child.finish();
        let msg = format!("compile timed out after {:.1} s", deadline.as_secs_f64());
        return Ok(CompileOutcome {
            artifact: None,
            info: CompileInfo::default(),
            failure: Some(compile_failure(msg, CompileInfo::default())),
            layers,
        });
    }
    let (response, mut blobs) = reply.map_err(|e| protocol_error(e, &mut child))?;
    child.finish();
    match response {
        Response::Compiled { ok: true, info, .. } if blobs.len() == 1 => Ok(CompileOutcome {
            artifact: blobs.pop(),
            info,
            failure: None,
            layers,
        }),
        Response::Compiled {
            ok: false,
            info,
            message,
        } => Ok(CompileOutcome {
            artifact: None,
            failure: Some(compile_failure(message, info.clone())),
            info,
            layers,
        }),
        Response::Failed { message } => Err(SandboxError::Worker(message)),
        other => Err(SandboxError::Protocol {
            message: format!("unexpected response to compile: {other:?}"),
            source: None,
        }),
    }
}

/// Wall budget for a whole evaluation: a backstop above the worker's own per-run limits.
fn evaluation_budget(plan: &EvalPlan) -> Duration {
    let runs = 3 * (u64::from(plan.trials) + 2) + u64::from(plan.timing.warmup) + 20;
    Duration::from_secs(15)
        + Duration::from_millis(plan.run_timeout_ms.saturating_mul(runs))
        + Duration::from_secs_f64(plan.timing.wall_cap_ms.max(0.0) / 1e3)
}

/// Evaluates a compiled candidate against the problem's reference inside a jailed worker.
pub fn evaluate(
    cfg: &SandboxConfig,
    problem: &ProblemSpec,
    reference: &[u8],
    candidate: &Candidate,
    artifact: &[u8],
    plan: &EvalPlan,
) -> Result<Evaluation, SandboxError> {
    if candidate.language != Language::C {
        return Err(SandboxError::BackendUnavailable(
            "cuda".into(),
            "not built yet".into(),
        ));
    }
    if !problem.reference.contains_key("host") {
        return Err(SandboxError::Problem(
            problem.name.clone(),
            "no host reference".into(),
        ));
    }
    if let Err(e) = candidate.validate() {
        return Ok(Evaluation::early(
            Verdict::InvalidLaunch,
            "host",
            e.to_string(),
        ));
    }
    let budget = evaluation_budget(plan);
    let job = JobDir::new(cfg)?;
    let limits = Limits {
        cpu_s: budget.as_secs() + 1,
        nofile: 128,
        nproc: 32,
        fsize_bytes: 1 << 30,
        as_bytes: None,
    };
    let spec = jail_spec(cfg, Role::Worker, &job, limits, "serve")?;
    let mut child = jail::spawn(&cfg.worker_exe, &spec, budget)?;
    let layers = child.report.layers.clone();
    let request = Request::Evaluate {
        version: PROTOCOL_VERSION,
        problem: Box::new(problem.clone()),
        candidate: candidate.clone(),
        plan: plan.clone(),
        limits: RunLimits {
            memory_limit_bytes: cfg.memory_limit_bytes,
            output_limit_bytes: cfg.output_limit_bytes,
            cpu_limit_s: budget.as_secs() + 1,
        },
    };
    let reply = child
        .stdin
        .as_mut()
        .ok_or_else(|| protocol::ProtocolError::Io(std::io::ErrorKind::BrokenPipe.into()))
        .and_then(|w| protocol::write_message(w, &request, &[reference, artifact]))
        .and_then(|()| protocol::read_message::<Response>(&mut child.stdout));
    if child.timed_out() {
        child.finish();
        let mut e = Evaluation::early(
            Verdict::Timeout,
            "host",
            format!(
                "evaluation exceeded its wall budget of {:.0} s; the jail was killed",
                budget.as_secs_f64()
            ),
        );
        e.telemetry = Some(layers_json(&layers));
        return Ok(e);
    }
    let (response, _) = reply.map_err(|e| protocol_error(e, &mut child))?;
    child.finish();
    match response {
        Response::Evaluated { evaluation } => {
            let mut e = *evaluation;
            e.telemetry = Some(layers_json(&layers));
            Ok(e)
        }
        Response::Failed { message } => Err(SandboxError::Worker(message)),
        other => Err(SandboxError::Protocol {
            message: format!("unexpected response to evaluate: {other:?}"),
            source: None,
        }),
    }
}

/// The jail layers as telemetry: `{"jail": {"active": [...], "inactive": {name: why}}}`.
fn layers_json(layers: &[LayerStatus]) -> serde_json::Value {
    let active: Vec<&str> = layers
        .iter()
        .filter(|l| l.active)
        .map(|l| l.name.as_str())
        .collect();
    let inactive: serde_json::Map<String, serde_json::Value> = layers
        .iter()
        .filter(|l| !l.active)
        .map(|l| (l.name.clone(), serde_json::Value::String(l.detail.clone())))
        .collect();
    serde_json::json!({ "jail": { "active": active, "inactive": inactive } })
}

/// Starts a throwaway jail (worker role) whose payload exits at once, and reports which
/// layers took effect on this machine.
pub fn probe_layers(cfg: &SandboxConfig) -> Vec<LayerStatus> {
    let job = match JobDir::new(cfg) {
        Ok(j) => j,
        Err(e) => return vec![LayerStatus::off("jail", e.to_string())],
    };
    let limits = Limits {
        cpu_s: 5,
        nofile: 64,
        nproc: 16,
        fsize_bytes: 1 << 20,
        as_bytes: None,
    };
    let spec = match jail_spec(cfg, Role::Worker, &job, limits, "probe") {
        Ok(s) => s,
        Err(e) => return vec![LayerStatus::off("jail", e.to_string())],
    };
    match jail::spawn(&cfg.worker_exe, &spec, Duration::from_secs(10)) {
        Ok(mut child) => {
            let mut layers = child.report.layers.clone();
            let ended = child.finish();
            let ok = ended.status.is_some_and(|s| s.success());
            layers.push(if ok {
                LayerStatus::on("payload", "started and exited cleanly under every layer")
            } else {
                LayerStatus::off(
                    "payload",
                    format!("probe payload ended with {:?}", ended.status),
                )
            });
            layers
        }
        Err(e) => vec![LayerStatus::off("jail", e.to_string())],
    }
}
