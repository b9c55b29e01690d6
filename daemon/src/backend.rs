//! The seam between the scheduler and the evaluation backends.
//!
//! A backend compiles and evaluates candidates in jailed children (see the `kiln-sandbox`
//! crate). The scheduler sees only this trait, so tests can drive it with a fake and the
//! cuda backend can join later without touching the queue.

use kiln_types::{Candidate, CompileInfo, EvalPlan, Evaluation, ProblemSpec};
use serde::Serialize;
use thiserror::Error;

/// An infrastructure failure: the backend could not produce a verdict at all.
#[derive(Debug, Error)]
#[error("{0}")]
pub struct BackendError(pub String);

/// Whether a backend can run here.
#[derive(Debug, Clone, Serialize)]
pub struct BackendStatus {
    /// `host`, `cuda`.
    pub name: String,
    /// True if and only if jobs for this backend will run.
    pub usable: bool,
    /// Why not, or what it runs on.
    pub detail: String,
}

/// What a compile produced.
#[derive(Debug, Clone)]
pub struct CompileOutcome {
    /// The artifact, when the compile succeeded.
    pub artifact: Option<Vec<u8>>,
    /// Log and timing.
    pub info: CompileInfo,
    /// The `compile_error` evaluation, when it failed.
    pub failure: Option<Evaluation>,
}

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
    /// Peak figures for the floor check: (bytes/s, flop/s); 0 disables each.
    fn peaks(&self) -> (f64, f64) {
        (0.0, 0.0)
    }
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
