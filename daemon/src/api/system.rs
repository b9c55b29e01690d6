//! `GET /v1/health`, `GET /v1/info` and `GET /metrics`.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde::Serialize;
use serde_json::{Value, json};

use super::{ApiError, AppState};
use crate::backend::BackendStatus;
use crate::gpu::GpuInventory;

/// Facts gathered once at start: they do not change while the daemon runs.
#[derive(Debug, Clone, Serialize)]
pub struct Facts {
    /// Backends compiled in and whether each is usable here.
    pub backends: Vec<BackendStatus>,
    /// GPUs via NVML.
    pub gpu: GpuInventory,
    /// Jail layers and whether each is active here.
    pub jail: Value,
    /// The socket served.
    pub socket: String,
    /// The state directory.
    pub state_dir: String,
}

/// `GET /v1/health`: the daemon is up and its store answers.
pub async fn health(State(s): State<AppState>) -> Result<Json<Value>, ApiError> {
    let counts = s.store.job_counts()?;
    let queued = counts
        .iter()
        .find(|(st, _)| *st == crate::store::JobState::Queued)
        .map_or(0, |(_, n)| *n);
    Ok(Json(json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": s.started.elapsed().as_secs(),
        "queued": queued,
    })))
}

/// `GET /v1/info`: version, backends, GPUs, jail layers, CPU and memory.
pub async fn info(State(s): State<AppState>) -> Result<Json<Value>, ApiError> {
    let host = tokio::task::spawn_blocking(host_facts)
        .await
        .map_err(ApiError::internal)?;
    Ok(Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "api": "v1",
        "backends": s.facts.backends,
        "gpus": s.facts.gpu.gpus,
        "gpu_error": s.facts.gpu.error,
        "driver_version": s.facts.gpu.driver_version,
        "cuda_driver_version": s.facts.gpu.cuda_driver_version,
        "clock_policy": s.config.gpu.clock_policy,
        "jail": s.facts.jail,
        "searches": {"usable": s.supervisor.status().0, "detail": s.supervisor.status().1},
        "llm": {"provider": s.llm.provider_name(), "usable": s.llm.status().0, "detail": s.llm.status().1},
        "host": host,
        "socket": s.facts.socket,
        "state_dir": s.facts.state_dir,
        "uptime_s": s.started.elapsed().as_secs(),
    })))
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
    let body = s.metrics.render(&s.store);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
}
