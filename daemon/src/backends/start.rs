//! Builds the evaluation backends this daemon can offer, and reports on each.
//!
//! Both backends are `kiln-sandbox`: C candidates ([`HostBackend`]) and CUDA candidates
//! ([`CudaBackend`]) compiled and run in jailed `kiln-worker` children. The cuda backend
//! is registered when `kiln_gpu::available()` finds a GPU at start, with one
//! [`GpuLane`] per GPU: all found, or those `[gpu] devices` names, in NVML's order
//! ([`crate::gpu::selection`]; a name that matches no GPU stops the start). Each lane
//! keeps a warm jailed worker ([`kiln_sandbox::WarmWorker`]) that sees only its GPU, and
//! runs each evaluation inside the clock policy's window ([`crate::gpu::clocks`]). The
//! jail's layers are probed once at start (this forks, so it runs before the async
//! runtime) and shown by `/v1/info` and `kiln doctor`; the GPU inventory is read after.
//! So is the python whose triton compiles Triton candidates (`[triton] python`, else
//! `[gpu] python`), asked once for its version; the cuda backend compiles Triton
//! candidates with it.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln_sandbox::engine::hosted::setup::HostedSetup;
use kiln_sandbox::engine::triton::setup::TritonSetup;
use kiln_sandbox::{BackendStatus, SandboxConfig, WarmWorker};
use kiln_types::BackendKind;
use serde_json::{Value, json};

use super::Backend;
use super::cuda::{CudaBackend, GpuLane, NoControl, nvml_control};
use super::host::HostBackend;
use crate::config::Config;
use crate::gpu::clocks::{self, LaneClocks};
use crate::gpu::selection::{self, SelectionError};
use crate::gpu::{self, GpuInventory, libs};
use crate::store::SqliteStore;

/// The backends built at start, their status, the jail's layers and the GPUs.
pub struct Built {
    /// Backends that take jobs (the scheduler asks each whether it is usable).
    pub backends: Vec<Arc<dyn Backend>>,
    /// Status of every backend kiln knows, usable or not.
    pub status: Vec<BackendStatus>,
    /// The jail's layers as probed at start.
    pub jail: Value,
    /// The GPUs as NVML lists them (read after the jail probe, which forks).
    pub gpu: GpuInventory,
    /// Whether Triton candidates can be compiled: `{usable, detail, version, python}`.
    pub triton: Value,
    /// The CUDA toolkit headers cuda compiles get, and NVRTC's version beside theirs.
    pub cuda_headers: Value,
}

/// What `/v1/info` and `kiln doctor` show about the toolkit headers: where kiln looked,
/// what it uses, the headers' CUDA version next to NVRTC's, and a warning when they differ
/// or the headers lack a part of the toolkit
/// ([`kiln_sandbox::engine::cuda::toolkit::ToolkitHeaders::gaps`]).
pub fn cuda_headers(cfg: &SandboxConfig) -> Value {
    let h = &cfg.cuda_headers;
    let nvrtc = kiln_sandbox::kiln_gpu::facts::nvrtc_version().map(|(a, b)| format!("{a}.{b}"));
    let mut warnings = match (&h.version, &nvrtc) {
        (Some(hv), Some(nv)) if hv != nv => vec![format!(
            "the headers are CUDA {hv} but NVRTC is {nv}: compiles may fail or differ; point \
             [cuda] include_dirs at the toolkit NVRTC comes from"
        )],
        _ => Vec::new(),
    };
    warnings.extend(h.gaps());
    let warning = (!warnings.is_empty()).then(|| warnings.join("; "));
    json!({
        "found": h.found(),
        "version": h.version,
        "nvrtc_version": nvrtc,
        "dirs": h.dirs,
        "searched": h.searched,
        "detail": h.describe(),
        "warning": warning,
    })
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
    // The toolkit headers: [cuda] include_dirs, or discovered (also beside the python
    // wheels now on the library path).
    let configured: Vec<std::path::PathBuf> =
        config.cuda.include_dirs.iter().map(Into::into).collect();
    cfg.find_cuda_headers(&configured);
    // [cuda] precompiled_headers = false: every CUDA compile parses its headers itself.
    if !config.cuda.precompiled_headers {
        cfg.pch_dir = None;
    }
    cfg
}

/// The torch runner `[gpu] python` runs, or why there is none.
pub fn torch_runner(config: &Config) -> Result<kiln_torch_runner::TorchRunner, String> {
    if config.gpu.python.is_empty() {
        return Err("[gpu] python is empty: the torch runner is off".into());
    }
    kiln_torch_runner::TorchRunner::find(
        &kiln_sandbox::default_worker_exe(),
        &config.gpu.python,
        Duration::from_secs(config.gpu.torch_timeout_secs.max(1)),
    )
    .ok_or_else(|| {
        format!(
            "{} not found beside kiln-worker (see daemon/packaging)",
            kiln_torch_runner::SCRIPT_NAME
        )
    })
}

/// Builds the backends. Runs before the async runtime starts (the jail probe forks).
/// Under the `lock` clock policy, first resets clocks a crashed daemon left locked. Fails
/// only when `[gpu] devices` names a GPU this host does not have (or names one twice).
pub fn build(
    config: &Config,
    state_dir: &Path,
    store: &Arc<SqliteStore>,
) -> Result<Built, SelectionError> {
    let mut cfg = sandbox_config(config, state_dir);
    let triton = find_triton(config);
    cfg.triton = triton.as_ref().ok().cloned();
    cfg.hosted = find_hosted(config);
    let layers = kiln_sandbox::probe_layers(&cfg);
    for l in &layers {
        if l.active {
            tracing::info!(layer = %l.name, detail = %l.detail, "jail layer active");
        } else {
            tracing::warn!(layer = %l.name, detail = %l.detail, "jail layer not active");
        }
    }
    let payload_ok = layers.iter().any(|l| l.name == "payload" && l.active);
    let gpu = gpu::inventory();
    let mut status: Vec<BackendStatus> = kiln_sandbox::backend_status();
    let mut backends: Vec<Arc<dyn Backend>> = Vec::new();
    if let Some(host) = status.iter_mut().find(|b| b.name == BackendKind::Host) {
        if host.usable && !payload_ok {
            host.usable = false;
            host.detail = format!(
                "the jail cannot start kiln-worker ({}): see the jail layers",
                cfg.worker_exe.display()
            );
        }
        backends.push(Arc::new(HostBackend {
            identity: super::compile_identity(&cfg, false),
            cfg: cfg.clone(),
            status: host.clone(),
            peaks: (
                config.evaluation.host_peak_bytes_per_s,
                config.evaluation.host_peak_flops,
            ),
            torch: torch_runner(config)
                .map(|h| Mutex::new(kiln_torch_runner::ReferenceRunner::cpu(h))),
        }));
    }
    if let Some(cuda) = status.iter_mut().find(|b| b.name == BackendKind::Cuda)
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
        let chosen = selection::select(&found, &gpu, &config.gpu.devices)?;
        let mut compile_cfg = cfg.clone();
        let mut lanes = Vec::new();
        let torch = torch_runner(config);
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
            let worker = WarmWorker::new(gpu_cfg, config.gpu.worker_max_evals);
            tracing::info!(lane = lanes.len(), gpu = %d.uuid, name = %d.name, arch = %d.arch, "cuda lane");
            // The lane's torch reference runner sees only the lane's GPU.
            let runner = torch.clone().map(|h| {
                let uuid = (d.uuid.starts_with("GPU-") || d.uuid.starts_with("MIG-"))
                    .then_some(d.uuid.as_str());
                Mutex::new(kiln_torch_runner::ReferenceRunner::gpu(h, uuid))
            });
            lanes.push(GpuLane::new(
                &d.uuid,
                Box::new(worker),
                LaneClocks::new(policy, &d.uuid, ctl, store.clone()),
                runner,
            ));
        }
        if lanes.is_empty() {
            cuda.usable = false;
            cuda.detail = "no GPU facts could be read".into();
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
        let identity = super::compile_identity(&compile_cfg, true);
        backends.push(Arc::new(CudaBackend::new(
            compile_cfg,
            lanes,
            cuda.clone(),
            torch,
            identity,
        )));
    }
    Ok(Built {
        backends,
        status,
        jail: json!({"layers": layers}),
        gpu,
        cuda_headers: cuda_headers(&cfg),
        triton: triton_status(&triton),
    })
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

/// The python with torch of `[gpu] python` that runs hosted `ModelNew` candidates in
/// their jail, asked once; `None` (logged) refuses them as an unusable backend.
fn find_hosted(config: &Config) -> Option<HostedSetup> {
    if config.gpu.python.is_empty() {
        tracing::info!("[gpu] python is empty: hosted ModelNew candidates are refused");
        return None;
    }
    match HostedSetup::find(&config.gpu.python, Duration::from_secs(60)) {
        Ok(h) => {
            tracing::info!(python = %h.describe(), "hosted ModelNew candidates");
            Some(h)
        }
        Err(e) => {
            tracing::info!(reason = %e, "no torch: hosted ModelNew candidates are refused");
            None
        }
    }
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
