//! The host backend: C candidates compiled by the system compiler and run on the CPU, each
//! evaluation in a fresh jailed `kiln-worker` (`kiln_sandbox::evaluate_with`). One lane,
//! with its warm torch reference runner (CPU) for problems whose reference is PyTorch.

use std::sync::Mutex;

use kiln_sandbox::{BackendStatus, CompileOutcome, SandboxConfig};
use kiln_torch_runner::ReferenceRunner;
use kiln_types::{BackendKind, Candidate, EvalPlan, Evaluation, ProblemSpec};

use super::{Backend, BackendError, compile_in_jail};

/// The host backend through the sandbox (C on the CPU), one lane.
pub struct HostBackend {
    pub(super) cfg: SandboxConfig,
    pub(super) status: BackendStatus,
    /// `evaluation.host_peak_bytes_per_s` and `evaluation.host_peak_flops`.
    pub(super) peaks: (f64, f64),
    /// The lane's torch reference runner, or why there is none.
    pub(super) torch: Result<Mutex<ReferenceRunner>, String>,
    /// The C compiler's identity (see [`super::compile_identity`]).
    pub(super) identity: String,
}

impl Backend for HostBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Host
    }

    fn peaks(&self) -> (f64, f64) {
        self.peaks
    }

    fn status(&self) -> BackendStatus {
        self.status.clone()
    }

    fn compile_identity(&self, language: kiln_types::Language) -> String {
        match (&self.cfg.hosted, language.is_hosted()) {
            (Some(h), true) => format!("{}; hosted {}", self.identity, h.build_identity()),
            _ => self.identity.clone(),
        }
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
        if problem.reference.kernel(BackendKind::Host).is_some() {
            return kiln_sandbox::evaluate(
                &self.cfg, problem, reference, candidate, artifact, plan,
            )
            .map_err(|e| BackendError(e.to_string()));
        }
        let runner = self.torch.as_ref().map_err(|why| {
            BackendError(format!(
                "problem {} has a torch reference and this lane has no runner: {why}",
                problem.name
            ))
        })?;
        let mut runner = runner.lock().unwrap_or_else(|p| p.into_inner());
        kiln_sandbox::evaluate_with(
            &self.cfg,
            problem,
            reference,
            candidate,
            artifact,
            plan,
            Some(&mut runner),
        )
        .map_err(|e| BackendError(e.to_string()))
    }
}
