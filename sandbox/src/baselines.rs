//! Baselines: [`measure_baselines`], the one path every baseline kind is measured
//! through (the kinds are registered once, in [`kiln_types::baseline::BaselineKind`]).
//!
//! - [`worker`]: the GPU worker's kinds (the reference, cuBLAS, cuDNN) in a fresh jailed
//!   `kiln-worker` on the lane's GPU;
//! - [`torch`]: the torch runner's kinds (torch eager, `torch.compile`);
//! - [`driver`]: the one timing driver (warm-up, fresh inputs, the stop rule, statistics)
//!   both use.
//!
//! Blocking: call it from `spawn_blocking`, on the GPU's lane, so no candidate is timed
//! meanwhile.

pub mod driver;
pub mod torch;
pub mod worker;

use kiln_types::baseline::{BaselineKind, BaselineRunner, BaselineStatus};
use kiln_types::{BaselineResult, EvalPlan, ProblemSpec};

use crate::config::SandboxConfig;
use crate::error::SandboxError;
use kiln_torch_runner::process::TorchRunner;

/// Where the torch runner's kinds come from: the helper, or why there is none.
#[derive(Debug, Clone)]
pub enum TorchSource<'a> {
    /// Run them with this helper.
    Helper(&'a TorchRunner),
    /// They are not measured here, for this reason (reported as `unavailable`).
    Off(String),
}

/// Every baseline the problem asks for ([`BaselineKind::asked_by`]) on the sandbox's GPU
/// (`cfg.gpu_uuid`), under `plan`'s seed and stop rule: the GPU worker's kinds with the
/// compiled cuda `reference` (when the problem has a cuda kernel), then the torch
/// helper's. `Err` is kiln's failure (no GPU,
/// the jail, the worker); a kind that could not run is a result saying why.
pub fn measure_baselines(
    cfg: &SandboxConfig,
    problem: &ProblemSpec,
    reference: &[u8],
    plan: &EvalPlan,
    torch: TorchSource,
) -> Result<Vec<BaselineResult>, SandboxError> {
    // A problem whose reference is PyTorch only has no kernel for the worker to time.
    let mut results = if problem
        .reference
        .kernel(kiln_types::BackendKind::Cuda)
        .is_some()
    {
        worker::measure(cfg, problem, reference, plan)?
    } else {
        Vec::new()
    };
    let kinds: Vec<BaselineKind> = BaselineKind::asked_by(problem)
        .into_iter()
        .filter(|k| k.runner() == BaselineRunner::TorchRunner)
        .collect();
    results.extend(match torch {
        TorchSource::Helper(h) => torch::measure(cfg.gpu_uuid.as_deref(), h, problem, plan, &kinds),
        TorchSource::Off(why) => kinds
            .iter()
            .map(|k| k.not_measured("", BaselineStatus::Unavailable, why.clone()))
            .collect(),
    });
    Ok(results)
}
