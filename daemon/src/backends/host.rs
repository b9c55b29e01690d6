//! The host backend: C candidates compiled by the system compiler and run on the CPU, each
//! evaluation in a fresh jailed `kiln-worker` (`kiln_sandbox::evaluate`). One lane.

use kiln_sandbox::{BackendStatus, CompileOutcome, SandboxConfig};
use kiln_types::{Candidate, EvalPlan, Evaluation, ProblemSpec};

use super::{Backend, BackendError, compile_in_jail};

/// The host backend through the sandbox (C on the CPU), one lane.
pub struct HostBackend {
    pub(super) cfg: SandboxConfig,
    pub(super) status: BackendStatus,
    /// `evaluation.host_peak_bytes_per_s` and `evaluation.host_peak_flops`.
    pub(super) peaks: (f64, f64),
}

impl Backend for HostBackend {
    fn name(&self) -> &'static str {
        "host"
    }

    fn peaks(&self) -> (f64, f64) {
        self.peaks
    }

    fn status(&self) -> BackendStatus {
        self.status.clone()
    }

    fn compile(
        &self,
        problem: &ProblemSpec,
        candidate: &Candidate,
    ) -> Result<CompileOutcome, BackendError> {
        compile_in_jail(&self.cfg, problem, candidate)
    }

    fn evaluate(
        &self,
        _lane: usize,
        problem: &ProblemSpec,
        reference: &[u8],
        candidate: &Candidate,
        artifact: &[u8],
        plan: &EvalPlan,
    ) -> Result<Evaluation, BackendError> {
        kiln_sandbox::evaluate(&self.cfg, problem, reference, candidate, artifact, plan)
            .map_err(|e| BackendError(e.to_string()))
    }
}
