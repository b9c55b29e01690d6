//! The cuda backend: CUDA C candidates compiled by NVRTC in the jail and evaluated on
//! per-GPU lanes. A [`GpuLane`] is one GPU: its warm jailed worker
//! ([`kiln_sandbox::WarmWorker`], which sees only that GPU) and its clock window
//! ([`crate::gpu::clocks::LaneClocks`]), around which each evaluation and baseline
//! measurement runs. The scheduler hands each lane to one job at a time.

use std::sync::Mutex;

use kiln_sandbox::kiln_gpu::telemetry::{ClockControl, ClockError, NvmlClocks, init_nvml};
use kiln_sandbox::{BackendStatus, CompileOutcome, SandboxConfig, WarmWorker};
use kiln_types::{Candidate, EvalPlan, Evaluation, ProblemSpec};
use serde_json::json;

use super::{Backend, BackendError, compile_in_jail};
use crate::gpu::clocks::LaneClocks;

/// Peak figures of an H200 for the cuda floor check: HBM3e bandwidth, and a dense
/// tensor-core rate (fp16/bf16 ~990 Tflop/s) so that TF32 and fp16 kernels are never
/// refused as impossible.
const CUDA_PEAKS: (f64, f64) = (4.3e12, 990e12);

/// Clock control where NVML cannot be loaded: every change is refused (only reached
/// under the `lock` policy).
pub(super) struct NoControl;

impl ClockControl for NoControl {
    fn lock_sm_clocks(&mut self, _: u32, _: u32) -> Result<(), ClockError> {
        Err(ClockError::Lock("NVML is not available".into()))
    }

    fn lock_sm_clocks_to_base(&mut self) -> Result<(), ClockError> {
        self.lock_sm_clocks(0, 0)
    }

    fn reset_sm_clocks(&mut self) -> Result<(), ClockError> {
        Err(ClockError::Reset("NVML is not available".into()))
    }
}

/// NVML clock control for a GPU (never called under `observe`).
pub(super) fn nvml_control(uuid: &str) -> Option<Box<dyn ClockControl + Send>> {
    let nvml = init_nvml().ok()?;
    Some(Box::new(NvmlClocks::new(nvml, uuid)))
}

/// One GPU's lane: its warm worker and its clock window.
pub struct GpuLane {
    pub(super) uuid: String,
    pub(super) worker: Mutex<WarmWorker>,
    pub(super) clocks: LaneClocks,
}

/// The cuda backend: NVRTC compiles in the jail, evaluations on per-GPU lanes.
pub struct CudaBackend {
    /// Compile settings (any GPU's architecture: every lane's GPU is compiled for alike).
    pub(super) cfg: SandboxConfig,
    pub(super) lanes: Vec<GpuLane>,
    pub(super) status: BackendStatus,
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn peaks(&self) -> (f64, f64) {
        CUDA_PEAKS
    }

    fn status(&self) -> BackendStatus {
        self.status.clone()
    }

    fn lanes(&self) -> usize {
        self.lanes.len().max(1)
    }

    fn lane_label(&self, lane: usize) -> String {
        self.lanes
            .get(lane)
            .map_or_else(|| format!("gpu{lane}"), |l| l.uuid.clone())
    }

    fn compile(
        &self,
        problem: &ProblemSpec,
        candidate: &Candidate,
    ) -> Result<CompileOutcome, BackendError> {
        compile_in_jail(&self.cfg, problem, candidate)
    }

    fn compiler_identity(&self, language: kiln_types::Language) -> String {
        match (language, &self.cfg.triton) {
            (kiln_types::Language::Triton, Some(t)) => {
                format!("triton {} for {}", t.version, self.cfg.cuda_arch)
            }
            _ => String::new(),
        }
    }

    fn evaluate(
        &self,
        lane: usize,
        problem: &ProblemSpec,
        reference: &[u8],
        candidate: &Candidate,
        artifact: &[u8],
        plan: &EvalPlan,
    ) -> Result<Evaluation, BackendError> {
        let l = self
            .lanes
            .get(lane)
            .ok_or_else(|| BackendError(format!("no GPU lane {lane}")))?;
        let mut worker = l.worker.lock().unwrap_or_else(|p| p.into_inner());
        let mut e = l
            .clocks
            .around(|| worker.evaluate(problem, reference, candidate, artifact, plan))
            .map_err(|e| BackendError(format!("clock policy on {}: {e}", l.uuid)))?
            .map_err(|e| BackendError(e.to_string()))?;
        if let Some(gpu) = e
            .telemetry
            .as_mut()
            .and_then(|t| t.get_mut("gpu"))
            .and_then(|g| g.as_object_mut())
        {
            gpu.insert("clock_policy".into(), json!(l.clocks.describe()));
        }
        Ok(e)
    }

    fn baselines(
        &self,
        lane: usize,
        problem: &ProblemSpec,
        reference: &[u8],
        plan: &EvalPlan,
    ) -> Result<Vec<kiln_types::BaselineResult>, BackendError> {
        let l = self
            .lanes
            .get(lane)
            .ok_or_else(|| BackendError(format!("no GPU lane {lane}")))?;
        let libraries: Vec<String> = problem.baseline.keys().cloned().collect();
        let cfg = lane_config(&self.cfg, &l.uuid);
        l.clocks
            .around(|| kiln_sandbox::measure_baselines(&cfg, problem, reference, plan, &libraries))
            .map_err(|e| BackendError(format!("clock policy on {}: {e}", l.uuid)))?
            .map_err(|e| BackendError(e.to_string()))
    }
}

/// A lane's sandbox settings: `cfg` pointed at the GPU with `uuid`.
fn lane_config(cfg: &SandboxConfig, uuid: &str) -> SandboxConfig {
    let mut c = cfg.clone();
    if uuid.starts_with("GPU-") || uuid.starts_with("MIG-") {
        c.gpu_uuid = Some(uuid.to_string());
        c.gpu_minor = kiln_sandbox::backends::cuda::setup::minor_number(uuid);
    }
    c
}
