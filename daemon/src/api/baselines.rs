//! `/v1/problems/{name}/baselines[?gpu=INDEX|UUID]`: the problem's baselines on a GPU
//! of this machine (the reference, cuBLAS, cuDNN, torch eager; lane 0's GPU unless one is
//! named), measured on first request and cached per GPU model, driver and problem; `POST`
//! re-measures. Also the speedups shown with a candidate (against the baselines of the
//! model of the GPU it was timed on), and the roofline floor shown with a problem.

use axum::Json;
use axum::extract::{Path, State};
use kiln_types::BackendKind;
use kiln_types::{Evaluation, ProblemSpec};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::{JsonBody, QueryArgs};
use super::{ApiError, AppState};
use crate::gpu::GpuInventory;
use crate::sched::baseline::{BaselineError, gpu_key};
use crate::store::{BaselineSet, Store};

/// fp32 FMA rate (no tensor cores) of an H100/H200 SXM, flop/s (NVIDIA's datasheet), for the
/// strict-fp32 floor.
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

/// Query of `GET /v1/problems/{name}/baselines`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuQuery {
    /// The GPU whose model to answer for: NVML index or UUID (default: lane 0's GPU).
    #[serde(default)]
    pub gpu: Option<String>,
}

/// `GET /v1/problems/{name}/baselines[?gpu=…]`: cached, or measured now (minutes on
/// first use).
pub async fn get(
    State(s): State<AppState>,
    Path(name): Path<String>,
    QueryArgs(q): QueryArgs<GpuQuery>,
) -> Result<Json<Value>, ApiError> {
    let set = s
        .sched
        .baselines(&name, &s.facts.gpu, false, q.gpu.as_deref())
        .await?;
    Ok(Json(set_json(&set)))
}

/// Body of `POST /v1/problems/{name}/baselines`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasureBody {
    /// Measure again even when cached.
    #[serde(default)]
    pub remeasure: bool,
    /// The GPU whose model to measure on: NVML index or UUID (default: lane 0's GPU).
    #[serde(default)]
    pub gpu: Option<String>,
}

/// `POST /v1/problems/{name}/baselines` `{"remeasure": true, "gpu": "1"}`: measures
/// (again).
pub async fn measure(
    State(s): State<AppState>,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<MeasureBody>,
) -> Result<Json<Value>, ApiError> {
    let set = s
        .sched
        .baselines(&name, &s.facts.gpu, body.remeasure, body.gpu.as_deref())
        .await?;
    Ok(Json(set_json(&set)))
}

/// The baselines of `problem` cached for this GPU, if measured (never measures).
pub async fn cached_here(s: &AppState, problem: &str) -> Result<Option<BaselineSet>, ApiError> {
    let Some(key) = gpu_key(&s.facts.gpu, None) else {
        return Ok(None);
    };
    Ok(s.store.get_baselines(&key, problem).await?)
}

/// Speedups of `evaluation` (of a candidate of `problem`, timed on the cuda backend)
/// against the baselines cached for the model of the GPU that timed it, each saying
/// whether the baseline was timed by the evaluation's own harness (`same_harness`) (its telemetry's
/// `device.uuid`; an evaluation without one only where every GPU is of one model). None
/// measured: an empty list; never measures.
pub async fn speedups(
    store: &Store,
    inventory: &GpuInventory,
    problem: &str,
    evaluation: &Evaluation,
) -> Value {
    let Some(median_us) = evaluation.timing.as_ref().map(|t| t.median_us) else {
        return json!([]);
    };
    let uuid = evaluation
        .telemetry
        .as_ref()
        .and_then(|t| t["device"]["uuid"].as_str());
    let Some(key) = gpu_key(inventory, uuid) else {
        return json!([]);
    };
    match store.get_baselines(&key, problem).await {
        Ok(Some(set)) => serde_json::to_value(set.speedups(
            median_us,
            kiln_types::baseline::Harness::of(evaluation.trust),
        ))
        .unwrap_or_default(),
        _ => json!([]),
    }
}

/// The roofline floor on this GPU: the memory floor, and the compute floor at the cuda
/// backend's peak (tensor cores) and at the fp32 FMA rate; µs. `None` without peaks.
pub fn floor(s: &AppState, spec: &ProblemSpec) -> Value {
    let Some(cuda) = s.sched.backends.get(BackendKind::Cuda.as_str()) else {
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

#[cfg(test)]
mod tests {
    use kiln_types::{TimingStats, Verdict};

    use super::*;
    use crate::gpu::fake_inventory;
    use crate::store::{GpuKey, measured_reference, open_temp, sample_spec};

    fn timed_on(uuid: Option<&str>, median_us: f64) -> Evaluation {
        let mut e = Evaluation::early(Verdict::Ok, BackendKind::Cuda, "ok");
        e.timing = Some(TimingStats {
            median_us,
            ..TimingStats::default()
        });
        e.telemetry = uuid.map(|u| json!({"device": {"name": "?", "uuid": u}}));
        e
    }

    fn speedup_of(v: &Value) -> Vec<f64> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["speedup"].as_f64())
            .collect()
    }

    #[tokio::test]
    async fn speedups_use_the_baselines_of_the_gpu_model_that_timed_the_candidate() {
        let (_d, store) = open_temp();
        store.put_problem(&sample_spec("p")).await.expect("problem");
        let inv = fake_inventory(&["NVIDIA H100", "NVIDIA H200"]);
        let key = |model: &str| GpuKey {
            model: model.into(),
            driver: "580.159.04".into(),
        };
        // The reference takes 30 µs on the H100 (GPU 0) and 20 µs on the H200 (GPU 1).
        store
            .put_baselines(&key("NVIDIA H100"), "p", &[measured_reference(30.0)])
            .await
            .expect("h100");
        store
            .put_baselines(&key("NVIDIA H200"), "p", &[measured_reference(20.0)])
            .await
            .expect("h200");
        let on = async |uuid| speedup_of(&speedups(&store, &inv, "p", &timed_on(uuid, 10.0)).await);
        assert_eq!(
            on(Some("GPU-fake-1")).await,
            [2.0],
            "the H200's set, not the first GPU's"
        );
        assert_eq!(on(Some("GPU-fake-0")).await, [3.0]);
        // No GPU recorded on a host with mixed models, or a GPU not here: no speedup
        // rather than a guess.
        assert!(on(None).await.is_empty());
        assert!(on(Some("GPU-gone")).await.is_empty());
        // One model: an evaluation without a device record uses it.
        let same = fake_inventory(&["NVIDIA H200", "NVIDIA H200"]);
        let e = timed_on(None, 10.0);
        assert_eq!(speedup_of(&speedups(&store, &same, "p", &e).await), [2.0]);
    }
}
