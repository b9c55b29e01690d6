//! `GET /v1/health`, `GET /v1/info` and `GET /metrics`.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use kiln_types::BackendKind;
use serde::Serialize;
use serde_json::{Value, json};

use super::{ApiError, AppState};
use crate::backends::lanes::LaneInfo;
use crate::gpu::GpuInventory;
use kiln_sandbox::BackendStatus;

/// Facts gathered once at start: they do not change while the daemon runs.
#[derive(Debug, Clone, Serialize)]
pub struct Facts {
    /// Backends compiled in and whether each is usable here.
    pub backends: Vec<BackendStatus>,
    /// GPUs via NVML.
    pub gpu: GpuInventory,
    /// Jail layers and whether each is active here.
    pub jail: Value,
    /// The CUDA toolkit headers cuda compiles get (`backends::start::cuda_headers`).
    pub cuda_headers: Value,
    /// Whether Triton candidates can be compiled here (`backends::start::triton_status`).
    pub triton: Value,
    /// The socket served.
    pub socket: String,
    /// The state directory.
    pub state_dir: String,
}

/// `GET /v1/health`: the daemon is up and its store answers. `queued` counts every job
/// not yet evaluating (queued, compiling or compiled and waiting for a lane), `running`
/// those evaluating on a lane.
pub async fn health(State(s): State<AppState>) -> Result<Json<Value>, ApiError> {
    let counts = s.store.job_counts().await?;
    let sum = |f: fn(crate::store::JobState) -> bool| -> i64 {
        counts.iter().filter(|(st, _)| f(*st)).map(|(_, n)| n).sum()
    };
    Ok(Json(json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": s.started.elapsed().as_secs(),
        "queued": sum(crate::store::JobState::is_waiting),
        "running": sum(|st| st == crate::store::JobState::Running),
    })))
}

/// `GET /v1/info`: version, backends, GPUs (each with its lane), the lanes (with their
/// workers' counters and busy time), jail layers, CPU and memory.
pub async fn info(State(s): State<AppState>) -> Result<Json<Value>, ApiError> {
    let host = tokio::task::spawn_blocking(host_facts)
        .await
        .map_err(ApiError::internal)?;
    let (permitted, detail) = crate::gpu::clocks::lock_permitted();
    let clock_lock = json!({
        "policy": s.config.gpu.clock_policy,
        "permitted": permitted,
        "detail": detail,
    });
    let backends: Vec<_> = s.sched.backends.values().cloned().collect();
    let lanes = crate::backends::lanes::lane_table(&backends, &s.facts.gpu);
    let mut info = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "api": "v1",
        "backends": s.facts.backends,
        "gpus": gpus_with_lanes(&s.facts.gpu, &lanes),
        "gpu_devices": s.config.gpu.devices,
        "lanes": lanes,
        "gpu_error": s.facts.gpu.error,
        "driver_version": s.facts.gpu.driver_version,
        "cuda_driver_version": s.facts.gpu.cuda_driver_version,
        "clock_policy": s.config.gpu.clock_policy,
        "clock_lock": clock_lock,
        "jail": s.facts.jail,
        "cuda_headers": s.facts.cuda_headers,
        "triton": s.facts.triton,
        "searches": {"usable": s.supervisor.status().0, "detail": s.supervisor.status().1},
        "llm": {"provider": s.llm.provider_name(), "usable": s.llm.status().0, "detail": s.llm.status().1},
        "host": host,
        "socket": s.facts.socket,
        "state_dir": s.facts.state_dir,
        "uptime_s": s.started.elapsed().as_secs(),
    });
    info["baseline_libraries"] = baseline_libraries(&s.config);
    info["kernel_timer"] = kernel_timer(&s.config);
    Ok(Json(info))
}

/// NVML's GPUs, each with the index of its cuda lane (`null`: kiln does not use it).
fn gpus_with_lanes(inventory: &GpuInventory, lanes: &[LaneInfo]) -> Value {
    let lane_of = |g: &crate::gpu::GpuInfo| {
        lanes
            .iter()
            .find(|l| l.backend == BackendKind::Cuda && Some(l.label.as_str()) == g.uuid.as_deref())
            .map(|l| l.lane)
    };
    Value::Array(
        inventory
            .gpus
            .iter()
            .map(|g| {
                let mut v = serde_json::to_value(g).unwrap_or_default();
                v["lane"] = json!(lane_of(g));
                v
            })
            .collect(),
    )
}

/// The GPU workers' directories for libraries: `[gpu] library_dirs` (with python's wheels),
/// then the daemon's own `LD_LIBRARY_PATH`.
fn worker_library_dirs(config: &crate::config::Config) -> Vec<std::path::PathBuf> {
    crate::gpu::libs::library_dirs(config)
        .into_iter()
        .chain(
            std::env::var("LD_LIBRARY_PATH")
                .unwrap_or_default()
                .split(':')
                .filter(|d| !d.is_empty())
                .map(str::to_string),
        )
        .map(std::path::PathBuf::from)
        .collect()
}

/// Where the GPU workers would find CUPTI for kernel timing (files only; nothing loaded).
/// The worker's own answer is in each GPU evaluation's `timing.timer`.
fn kernel_timer(config: &crate::config::Config) -> Value {
    use kiln_sandbox::kiln_gpu::cupti::{self, CuptiSetting};
    let setting = CuptiSetting::parse(&config.gpu.cupti).unwrap_or_default();
    let mut dirs: Vec<std::path::PathBuf> = Vec::new();
    match &setting {
        CuptiSetting::Off => {
            return json!({
                "setting": "off", "found": false, "library": null,
                "detail": "turned off ([gpu] cupti = \"off\"): GPU samples are timed with CUDA events",
            });
        }
        CuptiSetting::Dir(d) => dirs.push(d.clone()),
        CuptiSetting::Auto => {}
    }
    dirs.extend(worker_library_dirs(config));
    dirs.extend(cupti::DEFAULT_DIRS.iter().map(std::path::PathBuf::from));
    match dirs.iter().find_map(|d| cupti::find_library(d)) {
        Some(p) => json!({
            "setting": setting.as_text(), "found": true, "library": p.display().to_string(),
            "detail": "kernel times from CUPTI activity records (each evaluation's timing.timer says what its worker used)",
        }),
        None => json!({
            "setting": setting.as_text(), "found": false, "library": null,
            "detail": format!(
                "libcupti.so.13 not found in {} directories; the GPU workers' loader may still find one \
                 (/etc/ld.so.cache); else samples are timed with CUDA events ([gpu] cupti names the directory)",
                dirs.len()
            ),
        }),
    }
}

/// Where cuBLAS and cuDNN were found for the GPU workers (files only; nothing loaded),
/// and the torch runner's python.
fn baseline_libraries(config: &crate::config::Config) -> Value {
    let dirs = worker_library_dirs(config);
    let libs = kiln_sandbox::kiln_gpu::baseline::library_report(&dirs);
    let python = if config.gpu.python.is_empty() {
        "off ([gpu] python is empty)".to_string()
    } else {
        format!(
            "{} (torch is checked when a baseline is measured)",
            config.gpu.python
        )
    };
    json!({"libraries": libs, "torch_python": python})
}

fn host_facts() -> Value {
    let mut sys = match sysinfo::System::new() {
        Ok(s) => s,
        Err(e) => return json!({"error": format!("cannot read system information: {e}")}),
    };
    sys.refresh_memory();
    sys.refresh_cpu_list(sysinfo::CpuRefreshKind::nothing());
    json!({
        "os": sysinfo::System::long_os_version().ok(),
        "kernel": sysinfo::System::kernel_version().ok(),
        "hostname": sysinfo::System::host_name().ok(),
        "cpus": sys.cpus().len(),
        "cpu_brand": sys.cpus().first().map(|c| c.brand().to_string()),
        "memory_total_bytes": sys.total_memory(),
        "memory_available_bytes": sys.available_memory(),
    })
}

/// `GET /metrics`: Prometheus text format.
pub async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    let node = crate::metrics::NodeView {
        id: s.store.node(),
        classes: s.sched.classes(),
        paused: s.sched.paused(),
        clustered: s.store.cluster().is_some(),
    };
    let body = s.metrics.render(&s.store, &node).await;
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
}
