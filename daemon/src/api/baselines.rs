//! `/v1/problems/{name}/baselines`: the problem's baselines on this machine's GPU (the
//! reference, cuBLAS, cuDNN, torch eager), measured on first request and cached per GPU
//! model, driver and problem; `POST` re-measures. Also the speedups shown with a
//! candidate, and the roofline floor shown with a problem.

use axum::Json;
use axum::extract::{Path, State};
use kiln_types::ProblemSpec;
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::JsonBody;
use super::{ApiError, AppState};
use crate::sched::baseline::{BaselineError, gpu_key};
use crate::store::BaselineSet;

/// fp32 FMA rate (no tensor cores) of an H100/H200 SXM, flop/s (datasheet; see
/// ../shared/baselines-h200.md), for the strict-fp32 floor.
pub const FP32_PEAK_FLOPS: f64 = 67e12;

impl From<BaselineError> for ApiError {
    fn from(e: BaselineError) -> Self {
        match e {
            BaselineError::NotFound(m) => ApiError::not_found(m),
            BaselineError::Unavailable(m) => {
                ApiError::new(axum::http::StatusCode::CONFLICT, "baselines_unavailable", m)
            }
            BaselineError::Failed(m) => ApiError::internal(m),
        }
    }
}

fn set_json(set: &BaselineSet) -> Value {
    serde_json::to_value(set).unwrap_or_default()
}

/// `GET /v1/problems/{name}/baselines`: cached, or measured now (minutes on first use).
pub async fn get(
    State(s): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let set = s.sched.baselines(&name, &s.facts.gpu, false).await?;
    Ok(Json(set_json(&set)))
}

/// Body of `POST /v1/problems/{name}/baselines`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasureBody {
    /// Measure again even when cached.
    #[serde(default)]
    pub remeasure: bool,
}

/// `POST /v1/problems/{name}/baselines` `{"remeasure": true}`: measures (again).
pub async fn measure(
    State(s): State<AppState>,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<MeasureBody>,
) -> Result<Json<Value>, ApiError> {
    let set = s
        .sched
        .baselines(&name, &s.facts.gpu, body.remeasure)
        .await?;
    Ok(Json(set_json(&set)))
}

/// Speedups of a candidate of `problem` with median `median_us` against the baselines
/// cached for this GPU (none measured: an empty list; never measures).
pub async fn speedups(s: &AppState, problem: &str, median_us: f64) -> Value {
    let Some(key) = gpu_key(&s.facts.gpu, None) else {
        return json!([]);
    };
    match s.store.get_baselines(&key, problem).await {
        Ok(Some(set)) => serde_json::to_value(set.speedups(median_us)).unwrap_or_default(),
        _ => json!([]),
    }
}

/// The roofline floor on this GPU: the memory floor, and the compute floor at the cuda
/// backend's peak (tensor cores) and at the fp32 FMA rate; µs. `None` without peaks.
pub fn floor(s: &AppState, spec: &ProblemSpec) -> Value {
    let Some(cuda) = s.sched.backends.get("cuda") else {
        return Value::Null;
    };
    let (bytes_per_s, flops) = cuda.peaks();
    let us = |num: u64, rate: f64| (rate > 0.0).then(|| num as f64 / rate * 1e6);
    let mem = us(spec.roofline.min_bytes, bytes_per_s);
    let tc = us(spec.roofline.flops, flops);
    let fp32 = us(spec.roofline.flops, FP32_PEAK_FLOPS);
    let max = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    };
    json!({
        "peak_bytes_per_s": bytes_per_s,
        "peak_flops": flops,
        "fp32_peak_flops": FP32_PEAK_FLOPS,
        "memory_us": mem,
        "floor_us": max(mem, tc),
        "floor_fp32_us": max(mem, fp32),
    })
}

/// Cached baselines of `problem` on every GPU seen (for `GET /v1/problems/{name}`).
pub async fn cached(s: &AppState, problem: &str) -> Value {
    s.store
        .list_baselines(problem)
        .await
        .map(|v| serde_json::to_value(v).unwrap_or_default())
        .unwrap_or(Value::Null)
}
