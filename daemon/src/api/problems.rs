//! `/v1/problems`: register a problem (its spec with sources inlined), list, show.
//!
//! The CLI reads a problem folder on the caller's side and sends the spec, so the
//! daemon never reads paths chosen by a caller.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use kiln_types::{ProblemSpec, Role};
use serde_json::{Value, json};

use super::error::JsonBody;
use super::{ApiError, AppState};
use crate::store::PutProblem;

/// `POST /v1/problems`: registers a problem; 201 when new, 200 when already registered
/// with the same spec, 409 when the name is taken by a different spec, 422
/// (`problem_too_large`) when one evaluation cannot fit the GPU of this machine's cuda
/// lanes (the estimate by part is in the message).
pub async fn register(
    State(s): State<AppState>,
    JsonBody(spec): JsonBody<ProblemSpec>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    spec.validate()
        .map_err(|e| ApiError::bad_request("invalid_problem", e.to_string()))?;
    if let Some(t) = &spec.reference.torch
        && t.source.trim().is_empty()
    {
        return Err(ApiError::bad_request(
            "invalid_problem",
            format!(
                "reference.torch.source is empty: inline the source of {}",
                t.file
            ),
        ));
    }
    for (backend, ks) in spec.reference.kernels() {
        if ks.source.trim().is_empty() {
            return Err(ApiError::bad_request(
                "invalid_problem",
                format!(
                    "reference.{backend}.source is empty: inline the source of {}",
                    ks.file
                ),
            ));
        }
    }
    super::fit::check(&s, &spec)?;
    let outcome = s.store.put_problem(&spec).await?;
    let status = match outcome {
        PutProblem::Created => {
            tracing::info!(problem = %spec.name, "registered problem");
            StatusCode::CREATED
        }
        PutProblem::Unchanged => StatusCode::OK,
    };
    Ok((
        status,
        Json(json!({"name": spec.name, "created": outcome == PutProblem::Created})),
    ))
}

/// `GET /v1/problems`
pub async fn list(State(s): State<AppState>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({"problems": s.store.list_problems().await?})))
}

/// `GET /v1/problems/{name}`: the spec plus derived figures (bytes, flops).
pub async fn show(
    State(s): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let spec = s
        .store
        .get_problem(&name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("problem {name:?} not found")))?;
    let input_bytes: u64 = spec
        .tensors
        .iter()
        .filter(|t| t.role == Role::Input)
        .map(|t| t.bytes())
        .sum();
    let output_bytes: u64 = spec
        .tensors
        .iter()
        .filter(|t| t.role == Role::Output)
        .map(|t| t.bytes())
        .sum();
    Ok(Json(json!({
        "spec": spec,
        "derived": {
            "input_bytes": input_bytes,
            "output_bytes": output_bytes,
            "min_bytes": spec.roofline.min_bytes,
            "flops": spec.roofline.flops,
            "backends": spec.backends(),
            "floor": super::baselines::floor(&s, &spec),
        },
        "baselines": super::baselines::cached(&s, &name).await,
    })))
}
