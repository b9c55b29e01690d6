//! The evaluation backends: the [`Backend`] trait the scheduler drives jobs through, and
//! the two backends kilnd offers, both compiling and evaluating candidates in jailed
//! `kiln-worker` children (the `kiln-sandbox` crate).
//!
//! - [`host`]: [`host::HostBackend`], C on the CPU, one lane;
//! - [`cuda`]: [`cuda::CudaBackend`], CUDA C on the GPUs, one lane per GPU
//!   ([`cuda::GpuLane`]: its warm worker and its clock window);
//! - [`start`]: builds them at daemon start, with the jail probe and each one's status;
//! - [`lanes`]: the lanes as `/v1/info` lists them (GPU, worker counters, busy time).
//!
//! Jobs go through [`Backend::compile`] and [`Backend::evaluate`]; baselines through
//! [`Backend::baselines`] (torch eager is measured beside it by the scheduler's baseline
//! code, `crate::sched::baseline`). [`compile_key`] is the compile cache's key.

pub mod cuda;
#[cfg(test)]
pub(crate) mod fake;
pub mod host;
pub mod lanes;
pub mod start;

use kiln_sandbox::{BackendStatus, CompileOutcome};
use kiln_types::{Candidate, EvalPlan, Evaluation, ProblemSpec};
use thiserror::Error;

/// An infrastructure failure: the backend could not produce a verdict at all.
#[derive(Debug, Error)]
#[error("{0}")]
pub struct BackendError(pub String);

/// An evaluation backend.
pub trait Backend: Send + Sync {
    /// The backend's name as used in jobs (`host`, `cuda`).
    fn name(&self) -> &'static str;
    /// Whether it can run here.
    fn status(&self) -> BackendStatus;
    /// Compiles a candidate (or a problem's reference) in the jail. Blocking.
    fn compile(&self, candidate: &Candidate) -> Result<CompileOutcome, BackendError>;
    /// Evaluation lanes: one per GPU for cuda (each evaluates one candidate at a time);
    /// 1 for the host.
    fn lanes(&self) -> usize {
        1
    }
    /// What lane `lane` runs on, for people and metrics (`GPU-…` UUID, `cpu`).
    fn lane_label(&self, _lane: usize) -> String {
        "cpu".into()
    }
    /// The counters of lane `lane`'s warm worker (workers started, evaluations), where the
    /// backend keeps one per lane (cuda); read without waiting for a running evaluation.
    fn lane_worker(&self, _lane: usize) -> Option<kiln_sandbox::WarmWorkerStats> {
        None
    }
    /// Checks and times a compiled candidate against the compiled reference on lane
    /// `lane` (< [`Backend::lanes`]), which the caller holds alone. Blocking.
    fn evaluate(
        &self,
        lane: usize,
        problem: &ProblemSpec,
        reference: &[u8],
        candidate: &Candidate,
        artifact: &[u8],
        plan: &EvalPlan,
    ) -> Result<Evaluation, BackendError>;
    /// Times the problem's baselines (its reference and the `[baseline.cublas]` /
    /// `[baseline.cudnn]` ops) on lane `lane`, which the caller holds alone. Blocking.
    /// Backends without baselines say so.
    fn baselines(
        &self,
        _lane: usize,
        _problem: &ProblemSpec,
        _reference: &[u8],
        _plan: &EvalPlan,
    ) -> Result<Vec<kiln_types::BaselineResult>, BackendError> {
        Err(BackendError(format!(
            "the {} backend has no library baselines",
            self.name()
        )))
    }
    /// Peak figures for the floor check: (bytes/s, flop/s); 0 disables each. The host's
    /// come from the config (`evaluation.host_peak_*`), the GPU's are fixed.
    fn peaks(&self) -> (f64, f64) {
        (0.0, 0.0)
    }
}

/// A compile in a jailed worker, as the scheduler sees it (both backends compile alike).
fn compile_in_jail(
    cfg: &kiln_sandbox::SandboxConfig,
    candidate: &Candidate,
) -> Result<CompileOutcome, BackendError> {
    kiln_sandbox::compile(cfg, candidate).map_err(|e| BackendError(e.to_string()))
}

/// The key under which a compile result is cached: everything that determines it.
pub fn compile_key(backend: &str, candidate: &Candidate) -> String {
    let doc = serde_json::json!({
        "backend": backend,
        "language": candidate.language,
        "source": candidate.source,
        "flags": candidate.flags,
        "kiln": env!("CARGO_PKG_VERSION"),
    });
    blake3::hash(doc.to_string().as_bytes()).to_hex()[..32].to_string()
}
