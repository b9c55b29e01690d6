//! [`WarmWorker`]: one GPU's warm, jailed `kiln-worker`, kept between evaluations.
//!
//! Starting a jail, a CUDA context and kiln's trusted kernels costs hundreds of
//! milliseconds; a warm worker pays it once per worker process, not once per candidate.
//! The worker process holds the context ([`crate::engine::cuda::context::GpuContext`])
//! and serves one evaluate request after another. [`WarmWorker`] replaces the process:
//! - after any fault or timeout (the worker answers `retire: true` and exits: a sticky
//!   CUDA error poisons the context for good);
//! - when the wall budget of one evaluation runs out (the jail is killed);
//! - after `max_evals` evaluations (a bound on anything a driver might accumulate);
//! - when it is found dead before a request (killed while idle): the request is then sent
//!   once more to a fresh worker, since the candidate never ran.
//!
//! The caller (the scheduler) gives each warm worker to one evaluation at a time, so
//! timings on one GPU never overlap.

use std::time::Duration;

use kiln_types::{Candidate, EvalPlan, Evaluation, ProblemSpec};

use crate::config::SandboxConfig;
use crate::error::SandboxError;
use crate::jail::{self, JailedChild, LayerStatus, Limits, Role};
use crate::jailed_worker::{
    JobDir, budget_timeout, candidate_budget, evaluate_request, jail_spec, precheck,
    protocol_error, reply_answering_references, with_layers,
};
use crate::protocol::{self, ProtocolError, Response};
use kiln_torch_runner::ReferenceRunner;

/// How long a warm worker may sit idle before its jail's watchdog ends it.
const IDLE: Duration = Duration::from_secs(3600);

/// A started worker and what it was started with.
struct Warm {
    child: JailedChild,
    /// Kept alive (removed on drop) for as long as the worker runs.
    _job: JobDir,
    layers: Vec<LayerStatus>,
    served: u32,
}

/// Counters of a warm worker, for telemetry and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WarmWorkerStats {
    /// Workers started so far.
    pub workers_started: u64,
    /// Evaluations answered so far.
    pub evaluations: u64,
}

/// One GPU's warm worker (see the module docs).
pub struct WarmWorker {
    cfg: SandboxConfig,
    max_evals: u32,
    worker: Option<Warm>,
    stats: WarmWorkerStats,
}

impl WarmWorker {
    /// A warm worker for the GPU `cfg` points at (see [`SandboxConfig::use_gpu`]); its
    /// process is replaced after `max_evals` evaluations (at least 1).
    pub fn new(cfg: SandboxConfig, max_evals: u32) -> WarmWorker {
        WarmWorker {
            cfg,
            max_evals: max_evals.max(1),
            worker: None,
            stats: WarmWorkerStats::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> WarmWorkerStats {
        self.stats
    }

    /// Ends the warm worker, if any (the next evaluation starts a fresh one).
    pub fn retire(&mut self) {
        if let Some(mut w) = self.worker.take() {
            w.child.finish();
        }
    }

    fn start(&mut self, budget: Duration) -> Result<&mut Warm, SandboxError> {
        if self.worker.is_none() {
            let job = JobDir::new(&self.cfg)?;
            // No RLIMIT_AS (the driver reserves ~2x device memory of address space); CPU
            // time for every evaluation the worker may serve.
            let limits = Limits {
                cpu_s: budget
                    .as_secs()
                    .saturating_add(1)
                    .saturating_mul(u64::from(self.max_evals)),
                nofile: 1024,
                nproc: 256,
                fsize_bytes: 1 << 30,
                as_bytes: None,
            };
            let mut spec = jail_spec(&self.cfg, Role::GpuWorker, true, &job, limits, "serve")?;
            // Hosted `ModelNew` files run in this jail too: their python, its packages and
            // the CUDA toolkit `load_inline` builds with are shown read-only.
            if let Some(h) = &self.cfg.hosted {
                spec.ro_paths.extend(h.ro_paths.iter().cloned());
            }
            let child = jail::spawn(&self.cfg.worker_exe, &spec, budget)?;
            let layers = child.report.layers.clone();
            self.stats.workers_started += 1;
            tracing::info!(
                gpu = ?self.cfg.gpu_uuid,
                pid = child.pid(),
                "GPU worker started"
            );
            self.worker = Some(Warm {
                child,
                _job: job,
                layers,
                served: 0,
            });
        }
        self.worker
            .as_mut()
            .ok_or_else(|| SandboxError::Worker("no worker".into()))
    }

    /// Evaluates a compiled candidate on this worker's GPU, in its warm process.
    pub fn evaluate(
        &mut self,
        problem: &ProblemSpec,
        reference: &[u8],
        candidate: &Candidate,
        artifact: &[u8],
        plan: &EvalPlan,
    ) -> Result<Evaluation, SandboxError> {
        self.evaluate_with(problem, reference, candidate, artifact, plan, None)
    }

    /// [`WarmWorker::evaluate`], with the lane's torch reference runner for a problem whose
    /// only reference is PyTorch: the worker asks for the reference's outputs between
    /// candidate runs (`Response::Reference`) and `runner` answers.
    pub fn evaluate_with(
        &mut self,
        problem: &ProblemSpec,
        reference: &[u8],
        candidate: &Candidate,
        artifact: &[u8],
        plan: &EvalPlan,
        mut runner: Option<&mut ReferenceRunner>,
    ) -> Result<Evaluation, SandboxError> {
        if let Some(e) = precheck(&self.cfg, problem, candidate)? {
            return Ok(e);
        }
        let budget = candidate_budget(&self.cfg, candidate, plan);
        let request = evaluate_request(&self.cfg, problem, candidate, plan, budget);
        let mut retried = false;
        loop {
            let w = self.start(budget)?;
            w.child.arm(budget);
            let sent = w
                .child
                .stdin
                .as_mut()
                .ok_or_else(|| ProtocolError::Io(std::io::ErrorKind::BrokenPipe.into()))
                .and_then(|s| protocol::write_message(s, &request, &[reference, artifact]));
            if let Err(e) = sent {
                // The worker died while idle: the candidate never reached it.
                let was_warm = w.served > 0;
                let mut dead = self
                    .worker
                    .take()
                    .ok_or_else(|| SandboxError::Worker("worker vanished".into()))?;
                if was_warm && !retried && !dead.child.timed_out() {
                    tracing::warn!("warm GPU worker found dead ({e}); starting a fresh one");
                    dead.child.finish();
                    retried = true;
                    continue;
                }
                return Err(protocol_error(e, &mut dead.child));
            }
            let reply = reply_answering_references(&mut w.child, problem, runner.as_deref_mut());
            if w.child.timed_out() {
                let layers = w.layers.clone();
                self.retire();
                self.stats.evaluations += 1;
                return Ok(budget_timeout(
                    kiln_types::BackendKind::Cuda,
                    budget,
                    &layers,
                ));
            }
            let (response, _) = match reply {
                Ok(r) => r,
                Err(e) => {
                    let mut dead = self
                        .worker
                        .take()
                        .ok_or_else(|| SandboxError::Worker("worker vanished".into()))?;
                    return Err(protocol_error(e, &mut dead.child));
                }
            };
            w.served += 1;
            let served = w.served;
            let layers = w.layers.clone();
            self.stats.evaluations += 1;
            let (result, retire) = match response {
                Response::Evaluated { evaluation, retire } => {
                    let mut e = with_layers(*evaluation, &layers);
                    if let Some(serde_json::Value::Object(m)) = e.telemetry.as_mut() {
                        m.insert(
                            "worker".into(),
                            serde_json::json!({
                                "evaluations_served": served,
                                "warm": served > 1,
                                "retired": retire || served >= self.max_evals,
                            }),
                        );
                    }
                    (Ok(e), retire)
                }
                Response::Failed { message } => (Err(SandboxError::Worker(message)), true),
                other => (
                    Err(SandboxError::Protocol {
                        message: format!("unexpected response to evaluate: {other:?}"),
                        source: None,
                    }),
                    true,
                ),
            };
            if retire || served >= self.max_evals {
                self.retire();
            } else if let Some(w) = self.worker.as_ref() {
                w.child.arm(IDLE);
            }
            return result;
        }
    }
}

impl Drop for WarmWorker {
    fn drop(&mut self) {
        self.retire();
    }
}
