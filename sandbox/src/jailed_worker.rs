//! What the calls into a jailed `kiln-worker` share (the one-shot [`crate::compile`] and
//! [`crate::evaluate`], the warm [`crate::WarmWorker`], [`crate::measure_baselines`]): the
//! job's directory, the worker's jail spec, the refusals made before any worker starts,
//! the evaluate request and its wall budget, and the evaluations made from a worker's end
//! (its jail's layers, a wall budget run out).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kiln_types::{Candidate, EvalPlan, Evaluation, ProblemSpec, Verdict};

use crate::config::SandboxConfig;
use crate::engine::contract::timing;
use crate::error::SandboxError;
use crate::jail::{self, CgroupSpec, JailSpec, JailedChild, LayerStatus, Limits, Role};
use crate::protocol::{self, PROTOCOL_VERSION, ProtocolError, Request, Response, RunLimits};
use kiln_torch_runner::ReferenceRunner;

/// Sends one request (no blobs) to a jailed worker and reads its answer and blobs.
pub(crate) fn ask(
    child: &mut JailedChild,
    request: &Request,
) -> Result<(Response, Vec<Vec<u8>>), ProtocolError> {
    child
        .stdin
        .as_mut()
        .ok_or_else(|| ProtocolError::Io(std::io::ErrorKind::BrokenPipe.into()))
        .and_then(|w| protocol::write_message(w, request, &[]))
        .and_then(|()| protocol::read_message::<Response>(&mut child.stdout))
}

/// Why a one-shot build's worker gave no answer, for a log: the protocol error, how the
/// worker ended and the end of its stderr.
pub(crate) fn no_answer(e: &ProtocolError, ended: &jail::Ended) -> String {
    format!(
        "{e}; worker {}; log: {}",
        ended
            .status
            .map_or("status unknown".into(), |s| s.to_string()),
        ended.stderr_tail.trim()
    )
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
        use crate::engine::cuda::setup;
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
            env.push((kiln_gpu::cupti::SETTING_ENV.into(), cfg.cupti.as_text()));
            if let kiln_gpu::cupti::CuptiSetting::Dir(d) = &cfg.cupti
                && d.is_dir()
            {
                ro_paths.push(abs(d));
            }
            devices = setup::device_nodes(cfg.gpu_minor);
            optional_ro_paths = setup::OPTIONAL_RO.iter().map(PathBuf::from).collect();
        }
    }
    // A cuda compile sees the toolkit's include folders at fixed paths (toolkit.rs).
    let ro_binds = if cuda && role == Role::Compile {
        cfg.cuda_headers.binds()
    } else {
        Vec::new()
    };
    Ok(JailSpec {
        role,
        program,
        args: vec![payload.to_string(), format!("--tag={}", job.base.display())],
        env,
        scratch: abs(&job.base.join("work")),
        root_dir: abs(&job.base.join("root")),
        ro_paths,
        ro_binds,
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
    protocol_error_after(e, &child.finish())
}

/// [`protocol_error`] for a child already finished.
pub(crate) fn protocol_error_after(
    e: protocol::ProtocolError,
    ended: &jail::spawn::Ended,
) -> SandboxError {
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

/// Wall budget for a whole evaluation: a backstop above the worker's own per-run limits.
/// Every timing attempt the contract may take ([`timing::MAX_ATTEMPTS`]) counts with its
/// warm-up and its wall cap.
pub(crate) fn evaluation_budget(plan: &EvalPlan) -> Duration {
    let attempts = u64::from(timing::MAX_ATTEMPTS);
    let runs = 3 * (u64::from(plan.trials) + 2)
        + attempts.saturating_mul(u64::from(plan.timing.warmup))
        + 20;
    let wall_cap_s = plan.timing.wall_cap_ms.max(0.0) / 1e3 * attempts as f64;
    Duration::from_secs(15)
        .saturating_add(Duration::from_millis(
            plan.run_timeout_ms.saturating_mul(runs),
        ))
        .saturating_add(Duration::try_from_secs_f64(wall_cap_s).unwrap_or(Duration::MAX))
}

/// Refusals before any worker starts: the cuda backend missing here (an error), no
/// reference for the backend (an error), an invalid candidate (`Some` verdict).
pub(crate) fn precheck(
    cfg: &SandboxConfig,
    problem: &ProblemSpec,
    candidate: &Candidate,
) -> Result<Option<Evaluation>, SandboxError> {
    let backend = candidate.language.backend();
    let cuda = backend == kiln_types::BackendKind::Cuda;
    if candidate.language.is_hosted()
        && let Err(why) = crate::engine::hosted::setup::usable(cfg.hosted.as_ref())
    {
        return Err(SandboxError::BackendUnavailable(
            candidate.language.as_str().to_string(),
            why,
        ));
    }
    // Only the libraries (cheap): the GPU itself was found when kilnd chose it at start, and
    // the worker reports it if it is gone.
    if cuda && let Err(e) = kiln_gpu::facts::libraries_present() {
        return Err(SandboxError::BackendUnavailable(
            kiln_types::BackendKind::Cuda.to_string(),
            e.reason,
        ));
    }
    if candidate.language.is_hosted() && problem.reference.torch.is_none() {
        return Err(SandboxError::Problem(
            problem.name.clone(),
            "a hosted ModelNew candidate needs a problem with a torch reference (its \
             forward arguments, outputs and parameters name kiln's tensors)"
                .into(),
        ));
    }
    if !problem.evaluable_on(backend) {
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
        hosted: hosted_job(cfg, candidate),
    }
}

/// A hosted candidate's python and import limit; `None` for every other candidate (and
/// where no python with torch was found: [`precheck`] refuses those first).
pub(crate) fn hosted_job(
    cfg: &SandboxConfig,
    candidate: &Candidate,
) -> Option<crate::engine::hosted::setup::HostedJob> {
    use crate::engine::hosted::setup;
    if !candidate.language.is_hosted() {
        return None;
    }
    cfg.hosted.as_ref().map(|s| setup::HostedJob {
        setup: s.clone(),
        load_timeout_ms: setup::load_timeout(cfg.compile_timeout).as_millis() as u64,
    })
}

/// [`evaluation_budget`] for `candidate`: a hosted one also gets its import limit.
pub(crate) fn candidate_budget(
    cfg: &SandboxConfig,
    candidate: &Candidate,
    plan: &EvalPlan,
) -> Duration {
    let load = if candidate.language.is_hosted() {
        crate::engine::hosted::setup::load_timeout(cfg.compile_timeout)
    } else {
        Duration::ZERO
    };
    evaluation_budget(plan).saturating_add(load)
}

/// The evaluation a worker killed at its wall budget gets.
pub(crate) fn budget_timeout(
    backend: kiln_types::BackendKind,
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

/// Reads a worker's messages after an evaluate request until its reply, answering each
/// torch-reference request on the way with the lane's torch reference runner (the worker
/// asks only between candidate runs): `Response::Reference` with the outputs' bytes,
/// `Response::ReferenceShared` by letting the runner compute in the shared tensors (their
/// descriptors follow the message on the worker's socket). The one loop both the one-shot
/// worker ([`crate::api::evaluate_with`]) and the warm GPU worker run.
pub(crate) fn reply_answering_references(
    child: &mut JailedChild,
    problem: &ProblemSpec,
    mut runner: Option<&mut ReferenceRunner>,
) -> Result<(Response, Vec<Vec<u8>>), ProtocolError> {
    loop {
        let (response, blobs) = protocol::read_message_within::<Response>(
            &mut child.stdout,
            protocol::reference_bound(problem, kiln_types::Role::Input),
        )?;
        let (answer, outputs) = match response {
            Response::Reference => reference_answer(problem, runner.as_deref_mut(), &blobs),
            Response::ReferenceShared {
                tensors,
                inputs_seed,
            } => {
                let fds = kiln_protocol::fds::recv_fds(&child.stdout, tensors.len())?;
                let answer =
                    shared_answer(problem, runner.as_deref_mut(), &tensors, inputs_seed, fds);
                (answer, Vec::new())
            }
            other => return Ok((other, blobs)),
        };
        let outputs: Vec<&[u8]> = outputs.iter().map(Vec::as_slice).collect();
        let stdin = child
            .stdin
            .as_mut()
            .ok_or_else(|| ProtocolError::Io(std::io::ErrorKind::BrokenPipe.into()))?;
        protocol::write_message(stdin, &answer, &outputs)?;
    }
}

/// The answer to a worker's `Response::ReferenceShared`: the runner computed the
/// reference or made the problem's own inputs in place (and unmapped the tensors), or why
/// not. The descriptors are the runner's to close.
fn shared_answer(
    problem: &ProblemSpec,
    runner: Option<&mut ReferenceRunner>,
    tensors: &[protocol::SharedTensor],
    inputs_seed: Option<u64>,
    fds: Vec<std::os::fd::OwnedFd>,
) -> Request {
    let listed: Vec<(String, u64)> = tensors.iter().map(|t| (t.name.clone(), t.mapped)).collect();
    let result = match runner {
        Some(r) => match inputs_seed {
            None => r.run_shared(problem, &listed, fds),
            Some(seed) => r
                .inputs_shared(problem, &listed, seed, fds)
                .map(|()| String::new()),
        },
        None => Err("this lane has no torch reference runner ([gpu] python, kiln_torch.py)".into()),
    };
    match result {
        Ok(precision) => Request::ReferenceOutputs {
            version: PROTOCOL_VERSION,
            precision,
            error: None,
        },
        Err(e) => Request::ReferenceOutputs {
            version: PROTOCOL_VERSION,
            precision: String::new(),
            error: Some(e),
        },
    }
}

/// The answer to a worker's `Response::Reference`: the runner's outputs, or why not.
fn reference_answer(
    problem: &ProblemSpec,
    runner: Option<&mut ReferenceRunner>,
    inputs: &[Vec<u8>],
) -> (Request, Vec<Vec<u8>>) {
    let result = match runner {
        Some(r) => r.run(problem, inputs),
        None => Err("this lane has no torch reference runner ([gpu] python, kiln_torch.py)".into()),
    };
    match result {
        Ok(o) => (
            Request::ReferenceOutputs {
                version: PROTOCOL_VERSION,
                precision: o.precision,
                error: None,
            },
            o.outputs,
        ),
        Err(e) => (
            Request::ReferenceOutputs {
                version: PROTOCOL_VERSION,
                precision: String::new(),
                error: Some(e),
            },
            Vec::new(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            cpu_s: 10,
            nofile: 64,
            nproc: 64,
            fsize_bytes: 1 << 20,
            as_bytes: None,
        }
    }

    #[test]
    fn the_wall_budget_covers_every_timing_attempt() {
        let mut plan = EvalPlan::default();
        plan.timing.wall_cap_ms = 0.0;
        let without = evaluation_budget(&plan);
        plan.timing.wall_cap_ms = 100_000.0;
        let with = evaluation_budget(&plan);
        assert!(
            with - without >= Duration::from_secs(100) * timing::MAX_ATTEMPTS,
            "{without:?} -> {with:?}"
        );
        plan.timing.wall_cap_ms = f64::INFINITY;
        assert!(
            evaluation_budget(&plan) > with,
            "an unbounded cap saturates"
        );
    }

    #[test]
    fn a_gpu_worker_is_told_where_cupti_is_and_may_read_it() {
        let root = tempfile::tempdir().expect("tempdir");
        let cupti_dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = SandboxConfig::new(root.path());
        cfg.cupti = kiln_gpu::cupti::CuptiSetting::Dir(cupti_dir.path().to_path_buf());
        let job = JobDir::new(&cfg).expect("job dir");
        let spec = jail_spec(&cfg, Role::GpuWorker, true, &job, limits(), "serve").expect("spec");
        let env: Vec<&(String, String)> = spec
            .env
            .iter()
            .filter(|(k, _)| k == kiln_gpu::cupti::SETTING_ENV)
            .collect();
        assert_eq!(env.len(), 1);
        assert_eq!(env[0].1, cupti_dir.path().display().to_string());
        let shown = std::fs::canonicalize(cupti_dir.path()).expect("canonical");
        assert!(spec.ro_paths.contains(&shown), "{:?}", spec.ro_paths);
        // The default reaches the worker as "auto"; a compile job is told nothing.
        cfg.cupti = kiln_gpu::cupti::CuptiSetting::Auto;
        let spec = jail_spec(&cfg, Role::GpuWorker, true, &job, limits(), "serve").expect("spec");
        assert!(
            spec.env
                .iter()
                .any(|(k, v)| k == kiln_gpu::cupti::SETTING_ENV && v == "auto")
        );
        let spec = jail_spec(&cfg, Role::Compile, true, &job, limits(), "serve").expect("spec");
        assert!(
            !spec
                .env
                .iter()
                .any(|(k, _)| k == kiln_gpu::cupti::SETTING_ENV)
        );
    }
}
