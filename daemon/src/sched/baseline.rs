//! Baselines on a GPU lane: [`Scheduler::baselines`] answers from the store's cache for
//! a GPU model and driver (the model of the GPU asked for, else of lane 0's GPU), or
//! measures — the reference compiled (cached like any compile), a lane of a GPU of that
//! model held exactly as a job holds it (so no candidate is timed on it at the same
//! time), every kind the problem asks for timed by the backend on that lane
//! ([`crate::backends::Backend::baselines`]), the hosted ones on the same lane
//! ([`super::hosted_baseline`]) — and stores the result under that model.

use std::sync::{Arc, OnceLock};

use kiln_types::{BackendKind, Candidate, ProblemSpec};
use thiserror::Error;

use super::{Lanes, Scheduler};
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

/// The GPU key of the GPU with this UUID. Without a UUID, the key every GPU of the
/// inventory shares; none when they are of different models (which one would be a guess).
pub fn gpu_key(inv: &GpuInventory, uuid: Option<&str>) -> Option<GpuKey> {
    let driver = inv.driver_version.clone()?;
    let model = match uuid {
        Some(u) => inv
            .gpus
            .iter()
            .find(|g| g.uuid.as_deref() == Some(u))?
            .name
            .clone(),
        None => {
            let first = inv.gpus.first()?;
            if inv.gpus.iter().any(|g| g.name != first.name) {
                return None;
            }
            first.name.clone()
        }
    };
    Some(GpuKey { model, driver })
}

/// Whether a cached `set` has every harness `spec` asks for: a set measured before the
/// hosted baselines existed is measured again (once), so a hosted candidate's speedup is
/// never missing its same-harness figure for want of a re-measure.
fn complete(spec: &ProblemSpec, set: &BaselineSet) -> bool {
    use kiln_types::baseline::{BaselineKind, Harness};
    let wants_hosted = BaselineKind::asked_by(spec)
        .iter()
        .any(|k| k.harness() == Harness::Hosted);
    !wants_hosted || set.results.iter().any(|r| r.harness == Harness::Hosted)
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

    /// The baselines of `problem` on the model of GPU `gpu` (an NVML index or UUID; lane
    /// 0's GPU when `None`): from the cache unless `remeasure`, else measured on a lane of
    /// that model and stored.
    pub async fn baselines(
        self: &Arc<Self>,
        problem: &str,
        inventory: &GpuInventory,
        remeasure: bool,
        gpu: Option<&str>,
    ) -> Result<BaselineSet, BaselineError> {
        let failed = |e: &dyn std::fmt::Display| BaselineError::Failed(e.to_string());
        let spec = self
            .store
            .get_problem(problem)
            .await
            .map_err(|e| failed(&e))?
            .ok_or_else(|| BaselineError::NotFound(format!("problem {problem:?} not found")))?;
        let backend = self
            .backends
            .get(BackendKind::Cuda.as_str())
            .filter(|b| b.status().usable)
            .cloned();
        let uuid = match gpu {
            Some(name) => Some(
                inventory
                    .find(name)
                    .and_then(|g| g.uuid.clone())
                    .ok_or_else(|| {
                        BaselineError::NotFound(format!(
                            "no GPU {name:?} here (GPUs by index and UUID: {})",
                            inventory.describe()
                        ))
                    })?,
            ),
            None => backend.as_ref().map(|b| b.lane_label(0)),
        };
        let key = gpu_key(inventory, uuid.as_deref()).ok_or_else(|| {
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
            && complete(&spec, &set)
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
            && complete(&spec, &set)
        {
            return Ok(set);
        }
        let backend = backend.ok_or_else(|| {
            BaselineError::Unavailable("the cuda backend is not usable here".into())
        })?;
        // The lanes whose GPU is of this model (on a host with mixed GPUs, not all).
        let lanes: Vec<usize> = (0..backend.lanes())
            .filter(|l| gpu_key(inventory, Some(&backend.lane_label(*l))).as_ref() == Some(&key))
            .collect();
        if lanes.is_empty() {
            return Err(BaselineError::Unavailable(format!(
                "no lane of the cuda backend runs on a {} (see `[gpu] devices`)",
                key.model
            )));
        }
        if !spec.evaluable_on(BackendKind::Cuda) {
            return Err(BaselineError::Unavailable(format!(
                "problem {problem:?} has no cuda or torch reference"
            )));
        }
        // A torch-only reference has no kernel to compile: its baselines are torch's.
        let art = match spec.reference_candidate(BackendKind::Cuda) {
            Some(c) => self.reference_artifact(&backend, &spec, &c).await?.bytes,
            None => Vec::new(),
        };
        let slots = self
            .lane_slots
            .get(BackendKind::Cuda.as_str())
            .cloned()
            .ok_or_else(|| BaselineError::Unavailable("no cuda lane".into()))?;
        // A lane, held as a job holds it: no candidate is timed on it while baselines are.
        let lane = slots
            .acquire(Lanes::Only(lanes))
            .await
            .ok_or_else(|| BaselineError::Failed("the cuda lanes are gone".into()))?;
        let lane_index = lane.index;
        let uuid = backend.lane_label(lane_index);
        let plan = self.plan_for(backend.as_ref());
        tracing::info!(problem, gpu = %uuid, remeasure, "measuring baselines");
        let results = tokio::task::spawn_blocking(move || {
            let mut results = backend
                .baselines(lane_index, &spec, &art, &plan)
                .map_err(|e| e.to_string())?;
            // On the same lane, held: the same harness a hosted candidate is timed by.
            results.extend(super::hosted_baseline::measure(
                backend.as_ref(),
                lane_index,
                &spec,
                &art,
                &plan,
            ));
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
    use crate::gpu::fake_inventory;

    #[test]
    fn gpu_key_is_the_lane_gpus_model_and_never_a_guess() {
        let mut inv = fake_inventory(&["NVIDIA H100", "NVIDIA H200"]);
        assert_eq!(
            gpu_key(&inv, Some("GPU-fake-1")).map(|k| k.model),
            Some("NVIDIA H200".into())
        );
        assert_eq!(
            gpu_key(&inv, Some("GPU-fake-0")).map(|k| k.model),
            Some("NVIDIA H100".into())
        );
        assert_eq!(gpu_key(&inv, Some("GPU-elsewhere")), None);
        // Mixed models and no GPU named: no key (the first GPU's would be a guess).
        assert_eq!(gpu_key(&inv, None), None);
        let same = fake_inventory(&["NVIDIA H200", "NVIDIA H200"]);
        assert_eq!(
            gpu_key(&same, None),
            Some(GpuKey {
                model: "NVIDIA H200".into(),
                driver: "580.159.04".into()
            })
        );
        inv.driver_version = None;
        assert_eq!(gpu_key(&inv, Some("GPU-fake-1")), None);
        assert_eq!(gpu_key(&fake_inventory(&[]), None), None);
    }
}
