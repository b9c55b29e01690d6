//! Builds the evaluation backends this daemon can offer, and reports on each.
//!
//! Both backends are `kiln-sandbox`: C candidates ([`HostBackend`]) and CUDA candidates
//! ([`CudaBackend`]) compiled and run in jailed `kiln-worker` children. The cuda backend
//! is registered when `kiln_gpu::available()` finds a GPU at start, with one
//! [`GpuLane`] per GPU (all found, or those `[gpu] devices` names): each lane keeps a warm
//! jailed worker ([`kiln_sandbox::WarmWorker`]) that sees only its GPU, and runs each
//! evaluation inside the clock policy's window ([`crate::gpu::clocks`]). The jail's layers
//! are probed once at start (this forks, so it runs before the async runtime) and shown by
//! `/v1/info` and `kiln doctor`. So is the python whose triton compiles Triton candidates
//! (`[triton] python`, else `[gpu] python`), asked once for its version; the cuda backend
//! compiles Triton candidates with it.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln_sandbox::backends::triton::setup::TritonSetup;
use kiln_sandbox::kiln_gpu::DeviceFacts;
use kiln_sandbox::{BackendStatus, SandboxConfig, WarmWorker};
use serde_json::{Value, json};

use super::Backend;
use super::cuda::{CudaBackend, GpuLane, NoControl, nvml_control};
use super::host::HostBackend;
use crate::config::Config;
use crate::gpu::clocks::{self, LaneClocks};
use crate::gpu::libs;
use crate::store::SqliteStore;

/// The backends built at start, their status and the jail's layers.
pub struct Built {
    /// Backends that take jobs (the scheduler asks each whether it is usable).
    pub backends: Vec<Arc<dyn Backend>>,
    /// Status of every backend kiln knows, usable or not.
    pub status: Vec<BackendStatus>,
    /// The jail's layers as probed at start.
    pub jail: Value,
    /// Whether Triton candidates can be compiled: `{usable, detail, version, python}`.
    pub triton: Value,
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
    cfg.library_path = libs::library_path(cfg.library_path.as_deref(), &libs::library_dirs(config));
    // Checked by Config::validate; an unreadable value means the default.
    cfg.cupti =
        kiln_sandbox::kiln_gpu::cupti::CuptiSetting::parse(&config.gpu.cupti).unwrap_or_default();
    cfg
}

/// Builds the backends. Runs before the async runtime starts (the jail probe forks).
/// Under the `lock` clock policy, first resets clocks a crashed daemon left locked.
pub fn build(config: &Config, state_dir: &Path, store: &Arc<SqliteStore>) -> Built {
    let mut cfg = sandbox_config(config, state_dir);
    let triton = find_triton(config);
    cfg.triton = triton.as_ref().ok().cloned();
    let layers = kiln_sandbox::probe_layers(&cfg);
    for l in &layers {
        if l.active {
            tracing::info!(layer = %l.name, detail = %l.detail, "jail layer active");
        } else {
            tracing::warn!(layer = %l.name, detail = %l.detail, "jail layer not active");
        }
    }
    let payload_ok = layers.iter().any(|l| l.name == "payload" && l.active);
    let mut status: Vec<BackendStatus> = kiln_sandbox::backend_status();
    let mut backends: Vec<Arc<dyn Backend>> = Vec::new();
    if let Some(host) = status.iter_mut().find(|b| b.name == "host") {
        if host.usable && !payload_ok {
            host.usable = false;
            host.detail = format!(
                "the jail cannot start kiln-worker ({}): see the jail layers",
                cfg.worker_exe.display()
            );
        }
        backends.push(Arc::new(HostBackend {
            cfg: cfg.clone(),
            status: host.clone(),
            peaks: (
                config.evaluation.host_peak_bytes_per_s,
                config.evaluation.host_peak_flops,
            ),
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
        let found = kiln_sandbox::kiln_gpu::available()
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
            lanes.push(GpuLane {
                uuid: d.uuid.clone(),
                worker: Mutex::new(WarmWorker::new(gpu_cfg, config.gpu.worker_max_evals)),
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
        triton: triton_status(&triton),
    }
}

/// The python with triton of `[triton] python` (else `[gpu] python`), asked once.
fn find_triton(config: &Config) -> Result<TritonSetup, String> {
    let python = config.triton_python();
    if python.is_empty() {
        return Err("[triton] python and [gpu] python are both empty".into());
    }
    let found = TritonSetup::find(python, Duration::from_secs(60));
    match &found {
        Ok(t) if t.tested() => tracing::info!(triton = %t.describe(), "triton candidates"),
        Ok(t) => tracing::warn!(triton = %t.describe(), "triton candidates"),
        Err(e) => tracing::info!(reason = %e, "no triton: triton candidates are refused"),
    }
    found
}

/// `/v1/info`'s `triton`.
pub fn triton_status(found: &Result<TritonSetup, String>) -> Value {
    match found {
        Ok(t) => json!({
            "usable": true,
            "detail": t.describe(),
            "version": t.version,
            "python": t.python,
            "tested": t.tested(),
            "ro_paths": t.ro_paths,
        }),
        Err(e) => json!({"usable": false, "detail": e}),
    }
}
