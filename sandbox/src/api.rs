//! The blocking library API kilnd calls (from `spawn_blocking`): compile, evaluate, probe
//! the jail's layers, report the backends.
//!
//! Every call gets a fresh job directory under `scratch_root` (`job-…/root`, the private
//! root's mount point, and `job-…/work`, the scratch), a fresh jailed `kiln-worker`, and
//! cleans both up before returning. What these calls share with the warm GPU worker
//! ([`crate::WarmWorker`]) is in [`crate::jailed_worker`].

use std::path::PathBuf;
use std::time::Duration;

use kiln_types::{Candidate, CompileInfo, EvalPlan, Evaluation, Language, ProblemSpec, Verdict};
use serde::{Deserialize, Serialize};

use crate::config::{SandboxConfig, which};
use crate::engine::cuda::pch;
use crate::engine::host::flags;
use crate::engine::triton::compile::TritonJob;
use crate::engine::triton::spec as triton_spec;
use crate::error::SandboxError;
use crate::jail::{self, LayerStatus, Limits, Role};
use crate::jailed_worker::{
    JobDir, budget_timeout, candidate_budget, evaluate_request, jail_spec, precheck,
    protocol_error, reply_answering_references, with_layers,
};
use crate::protocol::{self, PROTOCOL_VERSION, Request, Response};
use crate::warm_worker::WarmWorker;
use kiln_torch_runner::ReferenceRunner;

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
    /// The backend.
    pub name: kiln_types::BackendKind,
    /// True if and only if candidates for it can be compiled and run (kilnd also needs
    /// the jail to start `kiln-worker`, and for cuda a GPU it may use).
    pub usable: bool,
    /// Why not, or what it runs on.
    pub detail: String,
}

/// The backends and whether they are usable.
pub fn backend_status() -> Vec<BackendStatus> {
    let cc = which("cc");
    vec![
        BackendStatus {
            name: kiln_types::BackendKind::Host,
            usable: cc.is_some(),
            detail: match cc {
                Some(p) => format!("C compiler {}", p.display()),
                None => "no `cc` on PATH".into(),
            },
        },
        {
            let (usable, detail) = crate::engine::cuda::setup::status();
            BackendStatus {
                name: kiln_types::BackendKind::Cuda,
                usable,
                detail,
            }
        },
    ]
}

fn compile_failure(
    verdict: Verdict,
    backend: kiln_types::BackendKind,
    message: String,
    info: CompileInfo,
) -> Evaluation {
    let mut e = Evaluation::early(verdict, backend, message);
    e.compile = Some(info);
    e
}

/// What a cuda compile that ran out of time most likely was, for its message.
const RUNAWAY_HINT: &str = ": preprocessing or template instantiation that does not end \
                            (a macro or template bomb?)";

/// The compile step of a hosted `ModelNew` file that builds nothing ahead: the artifact
/// is the file itself (its Triton kernels, and `load_inline` calls its build ahead missed,
/// are built by its own runner when the file is imported for its evaluation, and that
/// time is reported with the evaluation). A file that names `load_inline` has its
/// libraries built ahead in a compile jail (`engine::hosted::build`). No python with torch
/// for hosted runners is an unusable backend, not the candidate's fault.
fn hosted_compile(
    cfg: &SandboxConfig,
    candidate: &Candidate,
) -> Result<CompileOutcome, SandboxError> {
    if let Err(why) = crate::engine::hosted::setup::usable(cfg.hosted.as_ref()) {
        return Err(SandboxError::BackendUnavailable(
            candidate.language.as_str().to_string(),
            why,
        ));
    }
    Ok(CompileOutcome {
        artifact: Some(candidate.source.as_bytes().to_vec()),
        info: CompileInfo {
            log: "hosted: the file is imported (and its load_inline or Triton kernels built) \
                  by its runner at evaluation"
                .into(),
            ..CompileInfo::default()
        },
        failure: None,
        layers: Vec::new(),
    })
}

/// Compiles a candidate for `problem` inside a jailed worker (compile role): `cc` for C,
/// NVRTC for CUDA (for [`SandboxConfig::cuda_arch`]), Triton's compiler in
/// [`SandboxConfig::triton`]'s python for Triton (the problem gives the types of the
/// buffers its launches pass).
///
/// A cuda compile on a machine without NVRTC, or a Triton compile without a python that
/// has triton, is [`SandboxError::BackendUnavailable`], not a `compile_error`: it is not
/// the candidate's fault, and a `compile_error` would be cached against the candidate's
/// source.
pub fn compile(
    cfg: &SandboxConfig,
    problem: &ProblemSpec,
    candidate: &Candidate,
) -> Result<CompileOutcome, SandboxError> {
    let language = candidate.language;
    let backend = language.backend();
    let refused = |verdict: Verdict, message: String| CompileOutcome {
        artifact: None,
        info: CompileInfo::default(),
        failure: Some(compile_failure(
            verdict,
            backend,
            message,
            CompileInfo::default(),
        )),
        layers: Vec::new(),
    };
    if let Err(e) = candidate.validate() {
        return Ok(refused(Verdict::CompileError, e.to_string()));
    }
    if language.is_hosted() {
        let as_written = hosted_compile(cfg, candidate)?;
        let Some(setup) = cfg
            .hosted
            .as_ref()
            .filter(|_| crate::engine::hosted::build::wants_compile_step(&candidate.source))
        else {
            return Ok(as_written);
        };
        let job = crate::engine::hosted::build::HostedBuild {
            setup: setup.clone(),
            arch: (language == Language::ModelNew).then(|| cfg.cuda_arch.clone()),
            init_inputs: problem
                .reference
                .torch
                .as_ref()
                .map_or_else(|| "[]".to_string(), |t| t.init_inputs.clone()),
            // torch's precompiled extension header (built first by the first build to need
            // it; a Triton-only file builds nothing and needs none): the host folder here,
            // the jail's path once the jail is up.
            cpath: crate::engine::hosted::build::wants_build(&candidate.source)
                .then(|| crate::engine::hosted::gch::ensure(cfg, setup))
                .flatten(),
            make_gch: false,
        };
        // Nothing the build does is a verdict: whatever fails, the file goes on as written
        // and its evaluation builds what is missing.
        return Ok(match compile_in_jail(cfg, candidate, None, Some(job)) {
            Ok(built) if built.failure.is_none() && built.artifact.is_some() => built,
            Ok(failed) => {
                let why = failed.failure.map(|f| f.message).unwrap_or_default();
                tracing::warn!(problem = %candidate.problem, "hosted build: {why}");
                with_log(as_written, &format!("the build ahead failed ({why})"))
            }
            Err(e) => {
                tracing::warn!(problem = %candidate.problem, "hosted build: {e}");
                with_log(as_written, &format!("the build ahead could not run ({e})"))
            }
        });
    }
    let mut triton = None;
    match language {
        Language::Cuda => {
            let flags = kiln_gpu::nvrtc::check_flags(&candidate.flags)
                .and_then(|_| kiln_gpu::nvrtc::target_arch(&cfg.cuda_arch, &candidate.flags));
            if let Err(e) = flags {
                return Ok(refused(Verdict::CompileError, e.to_string()));
            }
            // Host code and unsafe directives are refused before any jail starts.
            let screened = kiln_gpu::cxx::screen::host_code(&candidate.source)
                .map_or_else(|| kiln_gpu::cxx::screen::directives(&candidate.source), Err);
            if let Err(message) = screened {
                return Ok(refused(Verdict::CompileError, message));
            }
            if kiln_gpu::facts::nvrtc_version().is_none() {
                return Err(SandboxError::BackendUnavailable(
                    kiln_types::BackendKind::Cuda.to_string(),
                    "libnvrtc.so not found: the CUDA 13 runtime compiler (NVRTC) is not \
                     installed or not on LD_LIBRARY_PATH"
                        .into(),
                ));
            }
        }
        Language::C => {
            if let Err(e) = flags::check_all(&candidate.flags) {
                return Ok(refused(Verdict::CompileError, e));
            }
        }
        Language::ModelNew | Language::ModelNewCpu => unreachable!("returned above"),
        Language::Triton => {
            let setup = cfg.triton.as_ref().ok_or_else(|| {
                SandboxError::BackendUnavailable(
                    "triton".into(),
                    "no python with triton was found: set [triton] python (or [gpu] python) \
                     to one that can `import triton`"
                        .into(),
                )
            })?;
            let plan = match triton_spec::plan(problem, candidate) {
                Ok(p) => p,
                Err(e) => return Ok(refused(Verdict::InvalidLaunch, e)),
            };
            triton = Some((setup, plan));
        }
    }
    compile_in_jail(cfg, candidate, triton, None)
}

/// A hosted file's compile outcome with `note` added to its log.
fn with_log(mut out: CompileOutcome, note: &str) -> CompileOutcome {
    out.info.log.push_str("; ");
    out.info.log.push_str(note);
    out
}

/// The compile proper, in a compile-role jail: the compiler for C and CUDA, Triton's for
/// `triton` (its setup and launch plan), the hosted build for `hosted`. A cuda candidate
/// whose include prefix has a precompiled header ([`pch::Plan`]) starts from it, after
/// building it first when it is the first compile to need it; a compile whose worker
/// crashed while it used one is compiled again without it (and the file deleted when that
/// one goes through).
fn compile_in_jail(
    cfg: &SandboxConfig,
    candidate: &Candidate,
    triton: Option<(
        &crate::engine::triton::setup::TritonSetup,
        triton_spec::Plan,
    )>,
    hosted: Option<crate::engine::hosted::build::HostedBuild>,
) -> Result<CompileOutcome, SandboxError> {
    let plan = (candidate.language == Language::Cuda)
        .then(|| pch::Plan::for_candidate(cfg, candidate))
        .flatten();
    if let Some(p) = &plan {
        p.ensure_built(cfg, candidate);
    }
    match compile_once(cfg, candidate, triton, hosted, plan.as_ref())? {
        Attempt::Done(out) => Ok(*out),
        Attempt::CrashedWithPch(chosen, why) => {
            tracing::warn!(
                key = %chosen.key,
                "the compile crashed while it used a precompiled header ({why}); compiling \
                 again without it"
            );
            match compile_once(cfg, candidate, None, None, None)? {
                Attempt::Done(out) => {
                    let mut out = *out;
                    pch::record(&chosen, Some(pch::Outcome::Damaged));
                    let log = &mut out.info.log;
                    if !log.is_empty() && !log.ends_with('\n') {
                        log.push('\n');
                    }
                    log.push_str(&pch::Outcome::Damaged.log_line());
                    Ok(out)
                }
                Attempt::CrashedWithPch(..) => {
                    Err(SandboxError::Worker("the compile crashed twice".into()))
                }
            }
        }
    }
}

/// The largest file a compile given a precompiled header may write (NVRTC's temporary
/// parse state).
const PCH_TEMP_FILE_BYTES: u64 = 1 << 30;

/// How one compile in a jail ended.
enum Attempt {
    /// With an outcome (compiled, or the candidate's compile error).
    Done(Box<CompileOutcome>),
    /// The worker died of a signal (not a limit) while it used this precompiled header.
    CrashedWithPch(pch::Chosen, String),
}

/// One compile in a jail (see [`compile_in_jail`]); `plan`: the cuda candidate's
/// precompiled header, if it has one.
fn compile_once(
    cfg: &SandboxConfig,
    candidate: &Candidate,
    triton: Option<(
        &crate::engine::triton::setup::TritonSetup,
        triton_spec::Plan,
    )>,
    hosted: Option<crate::engine::hosted::build::HostedBuild>,
    plan: Option<&pch::Plan>,
) -> Result<Attempt, SandboxError> {
    let language = candidate.language;
    let cuda = language == Language::Cuda;
    let backend = language.backend();
    let build_timeout = if hosted.is_some() {
        crate::engine::hosted::setup::load_timeout(cfg.compile_timeout)
    } else {
        cfg.compile_timeout
    };
    let job = JobDir::new(cfg)?;
    // Python, LLVM's threads and ptxas (Triton), torch with ninja, nvcc and the host
    // compiler (a hosted build) need more than a C compiler.
    let python = triton.is_some() || hosted.is_some();
    let limits = Limits {
        cpu_s: build_timeout.as_secs() + 2,
        nofile: if python { 1024 } else { 256 },
        nproc: if python { 256 } else { 64 },
        fsize_bytes: 64 << 20,
        // NVRTC maps large libraries; it never loads the driver, so a limit is fine. So
        // do Triton's python and LLVM.
        as_bytes: Some(match language {
            Language::C => cfg.memory_limit_bytes,
            Language::Cuda => cfg.memory_limit_bytes.max(8 << 30),
            Language::Triton | Language::ModelNew | Language::ModelNewCpu => {
                cfg.memory_limit_bytes.max(16 << 30)
            }
        }),
    };
    let cpu_s = limits.cpu_s;
    // NVRTC keeps the parse state of a compile given a precompiled header in a temporary
    // file (in the scratch), about the size of its PCH heap (256 MiB): 1 GiB at most.
    let limits = match plan {
        Some(_) => Limits {
            fsize_bytes: limits
                .as_bytes
                .unwrap_or(limits.fsize_bytes)
                .min(PCH_TEMP_FILE_BYTES),
            ..limits
        },
        None => limits,
    };
    let mut spec = jail_spec(cfg, Role::Compile, cuda, &job, limits, "serve")?;
    if let Some((setup, _)) = &triton {
        spec.ro_paths.extend(setup.ro_paths.iter().cloned());
    }
    if let Some(h) = &hosted {
        spec.ro_paths.extend(h.setup.ro_paths.iter().cloned());
        if let Some(folder) = &h.cpath {
            spec.ro_binds.push((
                folder.clone(),
                PathBuf::from(crate::engine::hosted::gch::INSIDE),
            ));
        }
    }
    if let Some(p) = plan {
        p.prepare(&mut spec);
    }
    let cc = crate::config::which_cc(&cfg.cc);
    let deadline = build_timeout + Duration::from_secs(10);
    let mut child = jail::spawn(&cfg.worker_exe, &spec, deadline)?;
    let layers = child.report.layers.clone();
    let chosen = plan.and_then(|p| p.choose(cfg, candidate, &layers));
    // The header folders are at their fixed paths when the private root came up, and at
    // their host paths when it did not (the jail's layers say which).
    let private_root = layers.iter().any(|l| l.name == "private-root" && l.active);
    // So is torch's precompiled header folder of a hosted build.
    let mut hosted = hosted;
    if let Some(h) = hosted
        .as_mut()
        .filter(|h| h.cpath.is_some() && private_root)
    {
        h.cpath = Some(PathBuf::from(crate::engine::hosted::gch::INSIDE));
    }
    let include_dirs = match (cuda, private_root) {
        (false, _) => Vec::new(),
        (true, true) => cfg.cuda_headers.inside_paths(),
        (true, false) => cfg.cuda_headers.dirs.clone(),
    };
    let request = Request::Compile {
        version: PROTOCOL_VERSION,
        candidate: candidate.clone(),
        cc,
        timeout_ms: build_timeout.as_millis() as u64,
        arch: (language != Language::C).then(|| cfg.cuda_arch.clone()),
        include_dirs,
        triton: triton.map(|(setup, plan)| TritonJob {
            python: setup.python.clone(),
            version: setup.version.clone(),
            arch: cfg.cuda_arch.clone(),
            plan,
        }),
        hosted,
        pch: chosen.as_ref().map(|c| c.inside.clone()),
    };
    let reply = crate::jailed_worker::ask(&mut child, &request);
    if child.timed_out() {
        child.finish();
        let mut msg = format!(
            "compile timed out after {:.1} s (compile timeout {:.0} s)",
            deadline.as_secs_f64(),
            cfg.compile_timeout.as_secs_f64()
        );
        if cuda {
            msg.push_str(RUNAWAY_HINT);
        }
        return Ok(Attempt::Done(Box::new(CompileOutcome {
            artifact: None,
            info: CompileInfo::default(),
            failure: Some(compile_failure(
                Verdict::CompileError,
                backend,
                msg,
                CompileInfo::default(),
            )),
            layers,
        })));
    }
    let (response, mut blobs) = match reply {
        Ok(r) => r,
        Err(e) => {
            // NVRTC compiles inside the worker: a limit that kills the compiler kills it.
            let ended = child.finish();
            let signal = ended
                .status
                .and_then(|s| s.code())
                .filter(|&c| c > 128)
                .map(|c| c - 128);
            let limit = signal.and_then(crate::engine::limits::signal_limit);
            if let (Some(chosen), Some(sig), None) = (chosen, signal, &limit) {
                return Ok(Attempt::CrashedWithPch(
                    chosen,
                    crate::jail::sys::signal_name(sig),
                ));
            }
            if let Some(limit) = limit {
                let msg = if limit.contains("RLIMIT_CPU") {
                    format!(
                        "the compile used up its CPU-time limit of {cpu_s} s (compile timeout \
                         {:.0} s){}",
                        cfg.compile_timeout.as_secs_f64(),
                        if cuda { RUNAWAY_HINT } else { "" }
                    )
                } else {
                    format!("the compiling worker died: {limit}")
                };
                return Ok(Attempt::Done(Box::new(CompileOutcome {
                    artifact: None,
                    info: CompileInfo::default(),
                    failure: Some(compile_failure(
                        Verdict::CompileError,
                        backend,
                        msg,
                        CompileInfo::default(),
                    )),
                    layers,
                })));
            }
            return Err(crate::jailed_worker::protocol_error_after(e, &ended));
        }
    };
    child.finish();
    if let (Some(c), Response::Compiled { pch: outcome, .. }) = (&chosen, &response) {
        pch::record(c, *outcome);
    }
    match response {
        Response::Compiled { ok: true, info, .. } if blobs.len() == 1 => {
            Ok(Attempt::Done(Box::new(CompileOutcome {
                artifact: blobs.pop(),
                info,
                failure: None,
                layers,
            })))
        }
        Response::Compiled {
            ok: false,
            info,
            message,
            verdict,
            ..
        } => Ok(Attempt::Done(Box::new(CompileOutcome {
            artifact: None,
            failure: Some(compile_failure(
                verdict.unwrap_or(Verdict::CompileError),
                backend,
                message,
                info.clone(),
            )),
            info,
            layers,
        }))),
        Response::Failed { message } => Err(SandboxError::Worker(message)),
        other => Err(SandboxError::Protocol {
            message: format!("unexpected response to compile: {other:?}"),
            source: None,
        }),
    }
}

/// Evaluates a compiled candidate against the problem's reference inside a jailed worker
/// started for this evaluation alone (cuda: a [`WarmWorker`] used once; keep a
/// `WarmWorker` to reuse a warm worker).
pub fn evaluate(
    cfg: &SandboxConfig,
    problem: &ProblemSpec,
    reference: &[u8],
    candidate: &Candidate,
    artifact: &[u8],
    plan: &EvalPlan,
) -> Result<Evaluation, SandboxError> {
    evaluate_with(cfg, problem, reference, candidate, artifact, plan, None)
}

/// [`evaluate`], with the lane's warm torch reference runner for a problem whose
/// reference is PyTorch (host: a CPU runner; cuda: a runner on the lane's GPU): the worker asks for the reference's outputs
/// between candidate runs, and `runner` answers.
pub fn evaluate_with(
    cfg: &SandboxConfig,
    problem: &ProblemSpec,
    reference: &[u8],
    candidate: &Candidate,
    artifact: &[u8],
    plan: &EvalPlan,
    runner: Option<&mut ReferenceRunner>,
) -> Result<Evaluation, SandboxError> {
    if candidate.language.backend() == kiln_types::BackendKind::Cuda {
        let mut worker = WarmWorker::new(cfg.clone(), 1);
        return worker.evaluate_with(problem, reference, candidate, artifact, plan, runner);
    }
    if let Some(e) = precheck(cfg, problem, candidate)? {
        return Ok(e);
    }
    let budget = candidate_budget(cfg, candidate, plan);
    let job = JobDir::new(cfg)?;
    let hosted = candidate.language.is_hosted();
    // A hosted runner is python with torch: many shared libraries, a few threads.
    let limits = Limits {
        cpu_s: budget.as_secs() + 1,
        nofile: if hosted { 1024 } else { 128 },
        nproc: if hosted { 256 } else { 32 },
        fsize_bytes: 1 << 30,
        as_bytes: None,
    };
    let mut spec = jail_spec(cfg, Role::Worker, false, &job, limits, "serve")?;
    if let Some(setup) = cfg.hosted.as_ref().filter(|_| hosted) {
        spec.ro_paths.extend(setup.ro_paths.iter().cloned());
    }
    let mut child = jail::spawn(&cfg.worker_exe, &spec, budget)?;
    let layers = child.report.layers.clone();
    let request = evaluate_request(cfg, problem, candidate, plan, budget);
    let reply = child
        .stdin
        .as_mut()
        .ok_or_else(|| protocol::ProtocolError::Io(std::io::ErrorKind::BrokenPipe.into()))
        .and_then(|w| protocol::write_message(w, &request, &[reference, artifact]))
        .and_then(|()| reply_answering_references(&mut child, problem, runner));
    if child.timed_out() {
        child.finish();
        return Ok(budget_timeout(
            kiln_types::BackendKind::Host,
            budget,
            &layers,
        ));
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
