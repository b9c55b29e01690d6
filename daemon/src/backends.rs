//! Builds the evaluation backends this daemon can offer, and reports on each.
//!
//! Both backends are `kiln-sandbox`: C candidates (host) and CUDA candidates (cuda)
//! compiled and run in jailed `kiln-worker` children. The cuda backend is registered when
//! `kiln_cuda::available()` finds a GPU at start; its workers use the first GPU. The jail's layers are probed once at start (this forks, so it
//! runs before the async runtime) and shown by `/v1/info` and `kiln doctor`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kiln_sandbox::SandboxConfig;
use kiln_types::{Candidate, EvalPlan, Evaluation, ProblemSpec};
use serde_json::{Value, json};

use crate::backend::{Backend, BackendError, BackendStatus, CompileOutcome};
use crate::config::Config;

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

/// A backend through the sandbox: host (C on the CPU) or cuda (CUDA on a GPU).
struct SandboxBackend {
    name: &'static str,
    cfg: SandboxConfig,
    status: BackendStatus,
    peaks: (f64, f64),
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
        let out =
            kiln_sandbox::compile(&self.cfg, candidate).map_err(|e| BackendError(e.to_string()))?;
        Ok(CompileOutcome {
            artifact: out.artifact,
            info: out.info,
            failure: out.failure,
        })
    }

    fn evaluate(
        &self,
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
    cfg
}

/// Builds the backends. Runs before the async runtime starts (the jail probe forks).
pub fn build(config: &Config, state_dir: &Path) -> Built {
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
        let mut gpu_cfg = cfg.clone();
        if !gpu_cfg.use_first_gpu() {
            tracing::warn!(
                "cuda: no GPU facts; workers use ordinal 0 and arch {}",
                gpu_cfg.cuda_arch
            );
        }
        if !payload_ok {
            cuda.usable = false;
            cuda.detail = format!(
                "the jail cannot start kiln-worker ({}): see the jail layers",
                cfg.worker_exe.display()
            );
        }
        tracing::info!(arch = %gpu_cfg.cuda_arch, gpu = ?gpu_cfg.gpu_uuid, "cuda backend");
        backends.push(Arc::new(SandboxBackend {
            name: "cuda",
            cfg: gpu_cfg,
            status: cuda.clone(),
            peaks: CUDA_PEAKS,
        }));
    }
    Built {
        backends,
        status,
        jail: json!({"layers": layers}),
    }
}
