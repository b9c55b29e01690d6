//! Baselines on the GPU lane: [`Scheduler::baselines`] answers from the store's cache for
//! this GPU model and driver, or measures — the reference compiled (cached like any
//! compile), a GPU lane held exactly as a job holds it (so no candidate is timed at the
//! same time), the reference, cuBLAS and cuDNN timed in a jailed worker, torch eager in
//! the trusted helper — and stores the result.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use kiln_sandbox::TorchHelper;
use kiln_types::baseline::{BaselineResult, BaselineStatus};
use kiln_types::{Candidate, ProblemSpec};
use thiserror::Error;

use super::Scheduler;
use crate::backends::compile_key;
use crate::gpu::GpuInventory;
use crate::store::{Artifact, BaselineSet, GpuKey};

/// Why baselines could not be given.
#[derive(Debug, Error)]
pub enum BaselineError {
    /// No such problem.
    #[error("{0}")]
    NotFound(String),
    /// Nothing to measure them with here (no usable cuda backend, no GPU facts).
    #[error("{0}")]
    Unavailable(String),
    /// Measuring failed (the backend, the store).
    #[error("{0}")]
    Failed(String),
}

/// The GPU key of the GPU with this UUID (or the first GPU), from NVML's inventory.
pub fn gpu_key(inv: &GpuInventory, uuid: Option<&str>) -> Option<GpuKey> {
    let gpu = inv
        .gpus
        .iter()
        .find(|g| uuid.is_some() && g.uuid.as_deref() == uuid)
        .or_else(|| inv.gpus.first())?;
    Some(GpuKey {
        model: gpu.name.clone(),
        driver: inv.driver_version.clone()?,
    })
}

/// One measurement at a time (two requests for the same problem measure once).
fn measuring() -> &'static tokio::sync::Mutex<()> {
    static M: OnceLock<tokio::sync::Mutex<()>> = OnceLock::new();
    M.get_or_init(|| tokio::sync::Mutex::new(()))
}

impl Scheduler {
    /// The compiled reference, from the compile cache or compiled now (and cached).
    async fn reference_artifact(
        &self,
        backend: &Arc<dyn crate::backends::Backend>,
        problem: &ProblemSpec,
        reference: &Candidate,
    ) -> Result<Artifact, BaselineError> {
        let failed = |e: &dyn std::fmt::Display| BaselineError::Failed(e.to_string());
        let key = compile_key(backend.as_ref(), problem, reference);
        if let Some(a) = self.store.get_artifact(&key).map_err(|e| failed(&e))? {
            return Ok(a);
        }
        let (be, p, c) = (backend.clone(), problem.clone(), reference.clone());
        let outcome = tokio::task::spawn_blocking(move || be.compile(&p, &c))
            .await
            .map_err(|e| failed(&e))?
            .map_err(|e| failed(&e))?;
        match (outcome.artifact, outcome.failure) {
            (Some(bytes), None) => {
                let art = Artifact {
                    bytes,
                    info: outcome.info,
                };
                self.store
                    .put_artifact(&key, backend.name(), &art)
                    .map_err(|e| failed(&e))?;
                Ok(art)
            }
            (_, failure) => Err(BaselineError::Failed(format!(
                "the problem's reference does not compile: {}",
                failure.map_or_else(|| "no artifact".to_string(), |f| f.message)
            ))),
        }
    }

    /// The baselines of `problem` on this machine's GPU: from the cache unless
    /// `remeasure`, else measured on a GPU lane and stored.
    pub async fn baselines(
        self: &Arc<Self>,
        problem: &str,
        inventory: &GpuInventory,
        remeasure: bool,
    ) -> Result<BaselineSet, BaselineError> {
        let failed = |e: &dyn std::fmt::Display| BaselineError::Failed(e.to_string());
        let spec = self
            .store
            .get_problem(problem)
            .await
            .map_err(|e| failed(&e))?
            .ok_or_else(|| BaselineError::NotFound(format!("problem {problem:?} not found")))?;
        let key = gpu_key(inventory, None).ok_or_else(|| {
            BaselineError::Unavailable(format!(
                "no GPU facts from NVML ({}): baselines are per GPU model and driver",
                inventory.error.as_deref().unwrap_or("no GPU found")
            ))
        })?;
        if !remeasure
            && let Some(set) = self
                .store
                .get_baselines(&key, problem)
                .await
                .map_err(|e| failed(&e))?
        {
            return Ok(set);
        }
        // One measurement at a time; a request that waited finds the other's result.
        let _one = measuring().lock().await;
        if !remeasure
            && let Some(set) = self
                .store
                .get_baselines(&key, problem)
                .await
                .map_err(|e| failed(&e))?
        {
            return Ok(set);
        }
        let backend = self
            .backends
            .get("cuda")
            .filter(|b| b.status().usable)
            .cloned()
            .ok_or_else(|| {
                BaselineError::Unavailable("the cuda backend is not usable here".into())
            })?;
        let ref_candidate = spec.reference_candidate("cuda").ok_or_else(|| {
            BaselineError::Unavailable(format!("problem {problem:?} has no cuda reference"))
        })?;
        let art = self
            .reference_artifact(&backend, &spec, &ref_candidate)
            .await?;
        let slots = self
            .lane_slots
            .get("cuda")
            .cloned()
            .ok_or_else(|| BaselineError::Unavailable("no cuda lane".into()))?;
        // The lane, held as a job holds it: no candidate is timed while baselines are.
        let lane = slots
            .acquire()
            .await
            .ok_or_else(|| BaselineError::Failed("the cuda lane is closed".into()))?;
        let lane_index = lane.index;
        let uuid = backend.lane_label(lane_index);
        let key = gpu_key(inventory, Some(&uuid)).unwrap_or(key);
        let plan = self.plan_for(backend.as_ref());
        let torch = (!self.config.gpu.python.is_empty())
            .then(|| {
                TorchHelper::find(
                    &kiln_sandbox::default_worker_exe(),
                    &self.config.gpu.python,
                    Duration::from_secs(self.config.gpu.torch_timeout_secs.max(1)),
                )
            })
            .flatten();
        let python_set = !self.config.gpu.python.is_empty();
        tracing::info!(problem, gpu = %uuid, remeasure, "measuring baselines");
        let results = tokio::task::spawn_blocking(move || {
            let mut results = backend
                .baselines(lane_index, &spec, &art.bytes, &plan)
                .map_err(|e| e.to_string())?;
            if spec.baseline.contains_key("torch") {
                results.extend(match &torch {
                    Some(helper) => kiln_sandbox::torch_baseline(Some(&uuid), helper, &spec, &plan),
                    None => vec![BaselineResult::not_measured(
                        "torch-eager",
                        "torch",
                        "",
                        BaselineStatus::Unavailable,
                        if python_set {
                            format!(
                                "{} not found beside kiln-worker (see daemon/packaging)",
                                kiln_sandbox::torch_baseline::HELPER_NAME
                            )
                        } else {
                            "[gpu] python is empty: the torch baseline is off".into()
                        },
                    )],
                });
            }
            Ok::<_, String>(results)
        })
        .await
        .map_err(|e| failed(&e))?
        .map_err(BaselineError::Failed)?;
        drop(lane);
        self.store
            .put_baselines(&key, problem, &results)
            .await
            .map_err(|e| failed(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_key_needs_a_driver_and_prefers_the_lane_gpu() {
        let mut inv = GpuInventory {
            gpus: Vec::new(),
            driver_version: Some("580.159.04".into()),
            cuda_driver_version: None,
            error: None,
        };
        assert_eq!(gpu_key(&inv, None), None);
        let gpu = |name: &str, uuid: &str| crate::gpu::GpuInfo {
            index: 0,
            name: name.into(),
            uuid: Some(uuid.into()),
            pci_bus_id: None,
            memory_total_bytes: None,
            compute_capability: None,
            sm_clock_mhz: None,
            sm_clock_max_mhz: None,
            mem_clock_mhz: None,
            mem_clock_max_mhz: None,
        };
        inv.gpus = vec![gpu("NVIDIA H100", "GPU-a"), gpu("NVIDIA H200", "GPU-b")];
        assert_eq!(
            gpu_key(&inv, Some("GPU-b")).map(|k| k.model),
            Some("NVIDIA H200".into())
        );
        assert_eq!(
            gpu_key(&inv, None).map(|k| k.model),
            Some("NVIDIA H100".into())
        );
        inv.driver_version = None;
        assert_eq!(gpu_key(&inv, Some("GPU-b")), None);
    }
}
