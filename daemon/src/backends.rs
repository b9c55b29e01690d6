//! Builds the evaluation backends this daemon can offer, and reports on each.
//!
//! Both backends are `kiln-sandbox`: C candidates (host) and CUDA candidates (cuda)
//! compiled and run in jailed `kiln-worker` children. The cuda backend is registered when
//! `kiln_cuda::available()` finds a GPU at start, with one lane per GPU (all found, or
//! those `[gpu] devices` names): each lane keeps a warm jailed worker
//! ([`kiln_sandbox::GpuLane`]) that sees only its GPU, and runs each evaluation inside the
//! clock policy's window ([`crate::gpu::clocks`]). The jail's layers are probed once at
//! start (this forks, so it runs before the async runtime) and shown by `/v1/info` and
//! `kiln doctor`.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln_sandbox::kiln_cuda::DeviceFacts;
use kiln_sandbox::kiln_cuda::telemetry::{ClockControl, NvmlClocks, init_nvml};
use kiln_sandbox::{GpuLane, SandboxConfig};
use kiln_types::{Candidate, EvalPlan, Evaluation, ProblemSpec};
use serde_json::{Value, json};

use crate::backend::{Backend, BackendError, BackendStatus, CompileOutcome};
use crate::config::Config;
use crate::gpu::clocks::{self, LaneClocks};
use crate::store::Store;

/// The backends built at start, their status and the jail's layers.
pub struct Built {
    /// Backends that take jobs (the scheduler asks each whether it is usable).
    pub backends: Vec<Arc<dyn Backend>>,
    /// Status of every backend kiln knows, usable or not.
    pub status: Vec<BackendStatus>,
    /// The jail's layers as probed at start.
    pub jail: Value,
}

/// Peak figures of an H200 for the cuda floor check: HBM3e bandwidth, and a dense
/// tensor-core rate (fp16/bf16 ~990 Tflop/s) so that TF32 and fp16 kernels are never
/// refused as impossible.
const CUDA_PEAKS: (f64, f64) = (4.3e12, 990e12);

/// The host backend through the sandbox (C on the CPU), one lane.
struct SandboxBackend {
    name: &'static str,
    cfg: SandboxConfig,
    status: BackendStatus,
    peaks: (f64, f64),
}

/// Clock control where NVML cannot be loaded: every change is refused (only reached
/// under the `lock` policy).
struct NoControl;

impl ClockControl for NoControl {
    fn lock_sm_clocks(
        &mut self,
        _: u32,
        _: u32,
    ) -> Result<(), kiln_sandbox::kiln_cuda::telemetry::ClockError> {
        Err(kiln_sandbox::kiln_cuda::telemetry::ClockError::Lock(
            "NVML is not available".into(),
        ))
    }

    fn lock_sm_clocks_to_base(
        &mut self,
    ) -> Result<(), kiln_sandbox::kiln_cuda::telemetry::ClockError> {
        self.lock_sm_clocks(0, 0)
    }

    fn reset_sm_clocks(&mut self) -> Result<(), kiln_sandbox::kiln_cuda::telemetry::ClockError> {
        Err(kiln_sandbox::kiln_cuda::telemetry::ClockError::Reset(
            "NVML is not available".into(),
        ))
    }
}

impl Backend for SandboxBackend {
    fn name(&self) -> &'static str {
        self.name
    }

    fn peaks(&self) -> (f64, f64) {
        self.peaks
    }

    fn status(&self) -> BackendStatus {
        self.status.clone()
    }

    fn compile(&self, candidate: &Candidate) -> Result<CompileOutcome, BackendError> {
        compile_in_jail(&self.cfg, candidate)
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

/// One GPU's lane: its warm worker and its clock window.
struct Lane {
    uuid: String,
    worker: Mutex<GpuLane>,
    clocks: LaneClocks,
}

/// The cuda backend: NVRTC compiles in the jail, evaluations on per-GPU lanes.
struct CudaBackend {
    /// Compile settings (any GPU's architecture: every lane's GPU is compiled for alike).
    cfg: SandboxConfig,
    lanes: Vec<Lane>,
    status: BackendStatus,
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

    fn compile(&self, candidate: &Candidate) -> Result<CompileOutcome, BackendError> {
        compile_in_jail(&self.cfg, candidate)
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
        let cfg = crate::sched::baseline::lane_config(&self.cfg, &l.uuid);
        l.clocks
            .around(|| kiln_sandbox::measure_baselines(&cfg, problem, reference, plan, &libraries))
            .map_err(|e| BackendError(format!("clock policy on {}: {e}", l.uuid)))?
            .map_err(|e| BackendError(e.to_string()))
    }
}

/// A compile in a jailed worker, as the scheduler sees it.
fn compile_in_jail(
    cfg: &SandboxConfig,
    candidate: &Candidate,
) -> Result<CompileOutcome, BackendError> {
    let out = kiln_sandbox::compile(cfg, candidate).map_err(|e| BackendError(e.to_string()))?;
    Ok(CompileOutcome {
        artifact: out.artifact,
        info: out.info,
        failure: out.failure,
    })
}

/// The GPUs the config selects among those found: by UUID or index; all when empty.
fn selected<'a>(devices: &'a [DeviceFacts], wanted: &[String]) -> Vec<&'a DeviceFacts> {
    devices
        .iter()
        .enumerate()
        .filter(|(i, d)| {
            wanted.is_empty()
                || wanted
                    .iter()
                    .any(|w| w == &d.uuid || w == &i.to_string() || w == &d.ordinal.to_string())
        })
        .map(|(_, d)| d)
        .collect()
}

/// NVML clock control for a GPU (never called under `observe`).
fn nvml_control(uuid: &str) -> Option<Box<dyn ClockControl + Send>> {
    let nvml = init_nvml().ok()?;
    Some(Box::new(NvmlClocks::new(nvml, uuid)))
}

/// The sandbox settings derived from the config: scratch under the state directory, the
/// rest of the state directory hidden from jailed children.
pub fn sandbox_config(config: &Config, state_dir: &Path) -> SandboxConfig {
    let mut cfg = SandboxConfig::new(state_dir.join("scratch"));
    cfg.hidden_paths = vec![state_dir.to_path_buf()];
    cfg.compile_timeout = Duration::from_secs(config.evaluation.compile_timeout_secs);
    cfg.memory_limit_bytes = config.evaluation.memory_limit_mb.saturating_mul(1 << 20);
    cfg.disable_namespaces = config.jail.disable_namespaces;
    cfg.cgroup_parent =
        (!config.jail.cgroup_parent.is_empty()).then(|| config.jail.cgroup_parent.clone().into());
    // [gpu] library_dirs (cuBLAS, cuDNN) join the GPU workers' library path.
    cfg.library_path = crate::sched::baseline::library_path(
        cfg.library_path.as_deref(),
        &crate::sched::baseline::library_dirs(config),
    );
    cfg
}

/// Builds the backends. Runs before the async runtime starts (the jail probe forks).
/// Under the `lock` clock policy, first resets clocks a crashed daemon left locked.
pub fn build(config: &Config, state_dir: &Path, store: &Arc<Store>) -> Built {
    let cfg = sandbox_config(config, state_dir);
    let layers = kiln_sandbox::probe_layers(&cfg);
    for l in &layers {
        if l.active {
            tracing::info!(layer = %l.name, detail = %l.detail, "jail layer active");
        } else {
            tracing::warn!(layer = %l.name, detail = %l.detail, "jail layer not active");
        }
    }
    let payload_ok = layers.iter().any(|l| l.name == "payload" && l.active);
    let mut status: Vec<BackendStatus> = kiln_sandbox::backend_status()
        .into_iter()
        .map(|b| BackendStatus {
            name: b.name,
            usable: b.usable,
            detail: b.reason,
        })
        .collect();
    let mut backends: Vec<Arc<dyn Backend>> = Vec::new();
    if let Some(host) = status.iter_mut().find(|b| b.name == "host") {
        if host.usable && !payload_ok {
            host.usable = false;
            host.detail = format!(
                "the jail cannot start kiln-worker ({}): see the jail layers",
                cfg.worker_exe.display()
            );
        }
        backends.push(Arc::new(SandboxBackend {
            name: "host",
            cfg: cfg.clone(),
            status: host.clone(),
            peaks: (0.0, 0.0),
        }));
    }
    if let Some(cuda) = status.iter_mut().find(|b| b.name == "cuda")
        && cuda.usable
    {
        let policy = clocks::policy(&config.gpu.clock_policy, config.gpu.lock_mhz);
        if config.gpu.clock_policy == "lock" {
            let reset = clocks::recover(store, nvml_control);
            if !reset.is_empty() {
                tracing::warn!(gpus = ?reset, "reset clocks a previous daemon left locked");
            }
        }
        let found = kiln_sandbox::kiln_cuda::available()
            .map(|f| f.devices)
            .unwrap_or_default();
        let chosen = selected(&found, &config.gpu.devices);
        let mut compile_cfg = cfg.clone();
        let mut lanes = Vec::new();
        for d in &chosen {
            let mut gpu_cfg = cfg.clone();
            gpu_cfg.use_gpu(d);
            compile_cfg.cuda_arch = d.arch.clone();
            let control = if config.gpu.clock_policy == "lock" {
                nvml_control(&d.uuid)
            } else {
                None
            };
            let ctl: clocks::SharedControl =
                Arc::new(Mutex::new(control.unwrap_or_else(|| Box::new(NoControl))));
            lanes.push(Lane {
                uuid: d.uuid.clone(),
                worker: Mutex::new(GpuLane::new(gpu_cfg, config.gpu.worker_max_evals)),
                clocks: LaneClocks::new(policy, &d.uuid, ctl, store.clone()),
            });
            tracing::info!(gpu = %d.uuid, name = %d.name, arch = %d.arch, "cuda lane");
        }
        if lanes.is_empty() {
            cuda.usable = false;
            cuda.detail = if found.is_empty() {
                "no GPU facts could be read".into()
            } else {
                format!(
                    "[gpu] devices = {:?} matches none of the GPUs found ({})",
                    config.gpu.devices,
                    found
                        .iter()
                        .map(|d| d.uuid.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
        } else {
            cuda.detail = format!("{} ({} lane(s), warm workers)", cuda.detail, lanes.len());
        }
        if !payload_ok {
            cuda.usable = false;
            cuda.detail = format!(
                "the jail cannot start kiln-worker ({}): see the jail layers",
                cfg.worker_exe.display()
            );
        }
        backends.push(Arc::new(CudaBackend {
            cfg: compile_cfg,
            lanes,
            status: cuda.clone(),
        }));
    }
    Built {
        backends,
        status,
        jail: json!({"layers": layers}),
    }
}
