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
    /// GPU architecture cuda candidates are compiled for (`sm_90`; from the GPU's facts
    /// at daemon start, see [`SandboxConfig::use_gpu`]).
    #[serde(default = "default_arch")]
    pub cuda_arch: String,
    /// UUID of the GPU this sandbox's GPU workers use (`CUDA_VISIBLE_DEVICES`); `None`:
    /// CUDA ordinal 0.
    #[serde(default)]
    pub gpu_uuid: Option<String>,
    /// Minor number of that GPU's `/dev/nvidiaN` node; `None`: every GPU node is shown.
    #[serde(default)]
    pub gpu_minor: Option<u32>,
    /// `LD_LIBRARY_PATH` passed to cuda compiles and GPU workers (its directories are
    /// shown read-only in their jails); defaults to the caller's own.
    #[serde(default)]
    pub library_path: Option<String>,
}

fn default_arch() -> String {
    crate::cuda::setup::DEFAULT_ARCH.to_string()
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
            cuda_arch: default_arch(),
            gpu_uuid: None,
            gpu_minor: None,
            library_path: std::env::var("LD_LIBRARY_PATH")
                .ok()
                .filter(|v| !v.is_empty()),
        }
    }

    /// Points GPU workers at the first GPU `kiln_cuda::available()` finds; false if none.
    pub fn use_first_gpu(&mut self) -> bool {
        match kiln_cuda::available() {
            Ok(f) if !f.devices.is_empty() => {
                self.use_gpu(&f.devices[0]);
                true
            }
            _ => false,
        }
    }

    /// Points GPU workers at `device` (architecture, UUID, device node).
    pub fn use_gpu(&mut self, device: &kiln_cuda::DeviceFacts) {
        self.cuda_arch = device.arch.clone();
        self.gpu_uuid = Some(device.uuid.clone());
        self.gpu_minor = crate::cuda::setup::minor_number(&device.uuid);
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
        {
            let (usable, reason) = crate::cuda::setup::status();
            BackendStatus {
                name: "cuda".into(),
                usable,
                reason,
            }
        },
    ]
}

/// A job's directory, removed on drop.
pub(crate) struct JobDir {
    base: PathBuf,
    name: String,
}

impl JobDir {
    pub(crate) fn new(cfg: &SandboxConfig) -> Result<JobDir, SandboxError> {
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

pub(crate) fn jail_spec(
    cfg: &SandboxConfig,
    role: Role,
    cuda: bool,
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
    let mut ro_paths: Vec<PathBuf> = RO_PATHS.iter().map(PathBuf::from).collect();
    let (mut devices, mut optional_ro_paths) = (Vec::new(), Vec::new());
    if cuda {
        use crate::cuda::setup;
        if let Some(lp) = &cfg.library_path {
            env.push(("LD_LIBRARY_PATH".into(), lp.clone()));
            ro_paths.extend(setup::library_dirs(Some(lp)));
        }
        // Driver caches would be written under $HOME, which a jail does not have.
        env.push(("CUDA_CACHE_DISABLE".into(), "1".into()));
        if role == Role::GpuWorker {
            let visible = cfg.gpu_uuid.clone().unwrap_or_else(|| "0".into());
            env.push(("CUDA_VISIBLE_DEVICES".into(), visible));
            env.push((crate::worker::CAPTURE_ENV.into(), "1".into()));
            devices = setup::device_nodes(cfg.gpu_minor);
            optional_ro_paths = setup::OPTIONAL_RO.iter().map(PathBuf::from).collect();
        }
    }
    Ok(JailSpec {
        role,
        program,
        args: vec![payload.to_string(), format!("--tag={}", job.base.display())],
        env,
        scratch: abs(&job.base.join("work")),
        root_dir: abs(&job.base.join("root")),
        ro_paths,
        hidden_paths: cfg.hidden_paths.iter().map(|p| abs(p)).collect(),
        devices,
        optional_ro_paths,
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

pub(crate) fn protocol_error(
    e: protocol::ProtocolError,
    child: &mut jail::JailedChild,
) -> SandboxError {
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

fn compile_failure(backend: &str, message: String, info: CompileInfo) -> Evaluation {
    let mut e = Evaluation::early(Verdict::CompileError, backend, message);
    e.compile = Some(info);
    e
}

/// Compiles a candidate inside a jailed worker (compile role): `cc` for C, NVRTC for
/// CUDA (for [`SandboxConfig::cuda_arch`]).
///
/// A cuda compile on a machine without NVRTC is [`SandboxError::BackendUnavailable`], not
/// a `compile_error`: it is not the candidate's fault, and a `compile_error` would be
/// cached against the candidate's source.
pub fn compile(cfg: &SandboxConfig, candidate: &Candidate) -> Result<CompileOutcome, SandboxError> {
    let cuda = candidate.language == Language::Cuda;
    let backend = if cuda { "cuda" } else { "host" };
    let refused = |message: String| CompileOutcome {
        artifact: None,
        info: CompileInfo::default(),
        failure: Some(compile_failure(backend, message, CompileInfo::default())),
        layers: Vec::new(),
    };
    if let Err(e) = candidate.validate() {
        return Ok(refused(e.to_string()));
    }
    if cuda {
        if let Err(e) = kiln_cuda::nvrtc::check_flags(&candidate.flags) {
            return Ok(refused(e.to_string()));
        }
        if kiln_cuda::facts::nvrtc_version().is_none() {
            return Err(SandboxError::BackendUnavailable(
                "cuda".into(),
                "libnvrtc.so not found: the CUDA 13 runtime compiler (NVRTC) is not installed \
                 or not on LD_LIBRARY_PATH"
                    .into(),
            ));
        }
    } else if let Err(e) = flags::check_all(&candidate.flags) {
        return Ok(refused(e));
    }
    let job = JobDir::new(cfg)?;
    let limits = Limits {
        cpu_s: cfg.compile_timeout.as_secs() + 2,
        nofile: 256,
        nproc: 64,
        fsize_bytes: 64 << 20,
        // NVRTC maps large libraries; it never loads the driver, so a limit is fine.
        as_bytes: Some(if cuda {
            cfg.memory_limit_bytes.max(8 << 30)
        } else {
            cfg.memory_limit_bytes
        }),
    };
    let spec = jail_spec(cfg, Role::Compile, cuda, &job, limits, "serve")?;
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
        arch: cuda.then(|| cfg.cuda_arch.clone()),
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
            failure: Some(compile_failure(backend, msg, CompileInfo::default())),
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
            failure: Some(compile_failure(backend, message, info.clone())),
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
pub(crate) fn evaluation_budget(plan: &EvalPlan) -> Duration {
    let runs = 3 * (u64::from(plan.trials) + 2) + u64::from(plan.timing.warmup) + 20;
    Duration::from_secs(15)
        + Duration::from_millis(plan.run_timeout_ms.saturating_mul(runs))
        + Duration::from_secs_f64(plan.timing.wall_cap_ms.max(0.0) / 1e3)
}

/// Refusals before any worker starts: the cuda backend missing here (an error), no
/// reference for the backend (an error), an invalid candidate (`Some` verdict).
pub(crate) fn precheck(
    problem: &ProblemSpec,
    candidate: &Candidate,
) -> Result<Option<Evaluation>, SandboxError> {
    let cuda = candidate.language == Language::Cuda;
    let backend = if cuda { "cuda" } else { "host" };
    // Only the libraries (cheap): the GPU itself was found when the lane was made, and
    // the worker reports it if it is gone.
    if cuda && let Err(e) = kiln_cuda::facts::libraries_present() {
        return Err(SandboxError::BackendUnavailable("cuda".into(), e.reason));
    }
    if !problem.reference.contains_key(backend) {
        return Err(SandboxError::Problem(
            problem.name.clone(),
            format!("no {backend} reference"),
        ));
    }
    if let Err(e) = candidate.validate() {
        return Ok(Some(Evaluation::early(
            Verdict::InvalidLaunch,
            backend,
            e.to_string(),
        )));
    }
    Ok(None)
}

/// The evaluate request for a worker.
pub(crate) fn evaluate_request(
    cfg: &SandboxConfig,
    problem: &ProblemSpec,
    candidate: &Candidate,
    plan: &EvalPlan,
    budget: Duration,
) -> Request {
    Request::Evaluate {
        version: PROTOCOL_VERSION,
        problem: Box::new(problem.clone()),
        candidate: candidate.clone(),
        plan: plan.clone(),
        limits: RunLimits {
            memory_limit_bytes: cfg.memory_limit_bytes,
            output_limit_bytes: cfg.output_limit_bytes,
            cpu_limit_s: budget.as_secs() + 1,
        },
    }
}

/// The evaluation a worker killed at its wall budget gets.
pub(crate) fn budget_timeout(
    backend: &str,
    budget: Duration,
    layers: &[LayerStatus],
) -> Evaluation {
    let mut e = Evaluation::early(
        Verdict::Timeout,
        backend,
        format!(
            "evaluation exceeded its wall budget of {:.0} s; the jail was killed",
            budget.as_secs_f64()
        ),
    );
    e.telemetry = Some(layers_json(layers));
    e
}

/// Adds the jail's layers to an evaluation's telemetry.
pub(crate) fn with_layers(mut e: Evaluation, layers: &[LayerStatus]) -> Evaluation {
    e.telemetry = Some(match e.telemetry.take() {
        Some(serde_json::Value::Object(mut m)) => {
            if let serde_json::Value::Object(jail) = layers_json(layers) {
                m.extend(jail);
            }
            serde_json::Value::Object(m)
        }
        _ => layers_json(layers),
    });
    e
}

/// Evaluates a compiled candidate against the problem's reference inside a jailed worker
/// started for this evaluation alone (cuda: a [`crate::GpuLane`] used once; keep a
/// `GpuLane` to reuse a warm worker).
pub fn evaluate(
    cfg: &SandboxConfig,
    problem: &ProblemSpec,
    reference: &[u8],
    candidate: &Candidate,
    artifact: &[u8],
    plan: &EvalPlan,
) -> Result<Evaluation, SandboxError> {
    if candidate.language == Language::Cuda {
        let mut lane = crate::lane::GpuLane::new(cfg.clone(), 1);
        return lane.evaluate(problem, reference, candidate, artifact, plan);
    }
    if let Some(e) = precheck(problem, candidate)? {
        return Ok(e);
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
    let spec = jail_spec(cfg, Role::Worker, false, &job, limits, "serve")?;
    let mut child = jail::spawn(&cfg.worker_exe, &spec, budget)?;
    let layers = child.report.layers.clone();
    let request = evaluate_request(cfg, problem, candidate, plan, budget);
    let reply = child
        .stdin
        .as_mut()
        .ok_or_else(|| protocol::ProtocolError::Io(std::io::ErrorKind::BrokenPipe.into()))
        .and_then(|w| protocol::write_message(w, &request, &[reference, artifact]))
        .and_then(|()| protocol::read_message::<Response>(&mut child.stdout));
    if child.timed_out() {
        child.finish();
        return Ok(budget_timeout("host", budget, &layers));
    }
    let (response, _) = reply.map_err(|e| protocol_error(e, &mut child))?;
    child.finish();
    match response {
        Response::Evaluated { evaluation, .. } => Ok(with_layers(*evaluation, &layers)),
        Response::Failed { message } => Err(SandboxError::Worker(message)),
        other => Err(SandboxError::Protocol {
            message: format!("unexpected response to evaluate: {other:?}"),
            source: None,
        }),
    }
}

/// The jail layers as telemetry: `{"jail": {"active": [...], "inactive": {name: why}}}`.
pub(crate) fn layers_json(layers: &[LayerStatus]) -> serde_json::Value {
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
    let spec = match jail_spec(cfg, Role::Worker, false, &job, limits, "probe") {
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
