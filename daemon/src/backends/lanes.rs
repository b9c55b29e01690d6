//! The evaluation lanes as `GET /v1/info` lists them: for each usable backend, each lane
//! with the GPU it runs on (NVML's index and name, joined by UUID), its warm worker's
//! counters and its busy time so far. `kiln doctor`, `kiln bench` and
//! `scripts/gpu-check-multi.sh` read this list.

use std::sync::Arc;

use serde::Serialize;

use super::Backend;
use crate::gpu::GpuInventory;

/// One lane of a usable backend.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaneInfo {
    /// The backend (`cuda`, `host`).
    pub backend: String,
    /// The lane's index (what a job's `lane` option names).
    pub lane: usize,
    /// What it runs on: the GPU's UUID, or `cpu`.
    pub label: String,
    /// The GPU's NVML index (as `nvidia-smi` and `kiln devices` number GPUs), when NVML
    /// lists it.
    pub gpu: Option<u32>,
    /// The GPU's model, when NVML lists it.
    pub gpu_name: Option<String>,
    /// Warm workers started on this lane so far (one more after each fault or timeout on
    /// it, and every `gpu.worker_max_evals` evaluations).
    pub workers_started: Option<u64>,
    /// Evaluations the lane's warm workers answered so far.
    pub evaluations: Option<u64>,
    /// Seconds the lane spent evaluating (`kiln_lane_busy_seconds_total`).
    pub busy_s: f64,
}

/// The lanes of the usable backends, by backend name then lane.
pub fn lane_table(backends: &[Arc<dyn Backend>], inventory: &GpuInventory) -> Vec<LaneInfo> {
    let mut usable: Vec<&Arc<dyn Backend>> =
        backends.iter().filter(|b| b.status().usable).collect();
    usable.sort_by_key(|b| b.name());
    let mut out = Vec::new();
    for b in usable {
        for lane in 0..b.lanes() {
            let label = b.lane_label(lane);
            let gpu = inventory
                .gpus
                .iter()
                .find(|g| g.uuid.as_deref() == Some(label.as_str()));
            let worker = b.lane_worker(lane);
            out.push(LaneInfo {
                backend: b.name().to_string(),
                lane,
                gpu: gpu.map(|g| g.index),
                gpu_name: gpu.map(|g| g.name.clone()),
                label,
                workers_started: worker.map(|w| w.workers_started),
                evaluations: worker.map(|w| w.evaluations),
                busy_s: crate::metrics::lane_busy_seconds(b.name(), lane),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::fake::FakeLanes;
    use crate::gpu::fake_inventory;

    #[test]
    fn every_lane_with_its_gpu() {
        // Three GPUs, one of which has no lane (left out of `[gpu] devices`, say): the
        // fake's lanes are GPU-fake-0 and GPU-fake-1. (Its own backend name: the busy
        // counters are process-wide.)
        let inv = fake_inventory(&["NVIDIA H200", "NVIDIA H100", "NVIDIA H200"]);
        let cuda: Arc<dyn Backend> = FakeLanes::named("lanes-test", 2);
        crate::metrics::add_lane_busy("lanes-test", 1, 2.5);
        let table = lane_table(&[cuda], &inv);
        assert_eq!(table.len(), 2);
        assert_eq!(
            table[1],
            LaneInfo {
                backend: "lanes-test".into(),
                lane: 1,
                label: "GPU-fake-1".into(),
                gpu: Some(1),
                gpu_name: Some("NVIDIA H100".into()),
                workers_started: None,
                evaluations: None,
                busy_s: crate::metrics::lane_busy_seconds("lanes-test", 1),
            }
        );
        assert!(table[1].busy_s >= 2.5);
        assert_eq!((table[0].gpu, table[0].lane), (Some(0), 0));
        // A lane on a GPU NVML does not list keeps its label, without a GPU.
        let none = lane_table(
            &[FakeLanes::new(kiln_types::BackendKind::Cuda, 1) as Arc<dyn Backend>],
            &fake_inventory(&[]),
        );
        assert_eq!((none[0].label.as_str(), none[0].gpu), ("GPU-fake-0", None));
    }
}
