//! `/v1/searches` for people and tools: start, list, show, log, archive, cancel.
//!
//! The plugin host's own calls (context, submit, wait, llm, checkpoint…) are in
//! `plugin.rs`; they need the search's token.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use base64::Engine;
use kiln_types::BackendKind;
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::{JsonBody, QueryArgs};
use super::{ApiError, AppState};
use crate::store::NewSearch;

/// Body of `POST /v1/searches`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartSearch {
    problem: String,
    /// An installed proposer's name; or the name to give an uploaded one.
    #[serde(default)]
    proposer: Option<String>,
    /// A proposer component uploaded with the request (base64 of the .wasm).
    #[serde(default)]
    wasm_base64: Option<String>,
    /// Passed to the plugin's `run` (a JSON string is passed as its text).
    #[serde(default)]
    config: Option<Value>,
    #[serde(default)]
    budget: Option<u64>,
    #[serde(default)]
    time_limit_secs: Option<u64>,
    #[serde(default)]
    llm_tokens: Option<u64>,
    #[serde(default)]
    seed: Option<u64>,
    /// The GPU class to evaluate on (default: this node's, else the cluster's class with
    /// the most lanes).
    #[serde(default)]
    gpu_class: Option<String>,
    /// Share of the lanes against other searches (fair queuing weight; default 1).
    #[serde(default)]
    weight: Option<f64>,
}

/// `POST /v1/searches`: stores the plugin and starts the search.
pub async fn start(
    State(s): State<AppState>,
    JsonBody(req): JsonBody<StartSearch>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    // In a cluster another node may host the search; on one host this one must.
    let (ok, why) = s.supervisor.status();
    if !ok && s.store.cluster().is_none() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "searches_unavailable",
            why,
        ));
    }
    let problem = s.store.get_problem(&req.problem).await?.ok_or_else(|| {
        ApiError::not_found(format!("problem {:?} is not registered", req.problem))
    })?;
    let gpu_class = match req.gpu_class.as_deref().filter(|c| !c.is_empty()) {
        Some(class) => {
            let backend = super::plugin::class_backend(class).ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_field",
                    format!("field `gpu_class`: {class:?} does not start with cuda/ or host/"),
                )
            })?;
            if !problem.evaluable_on(backend) {
                return Err(ApiError::bad_request(
                    "no_backend",
                    format!(
                        "problem {:?} has no {backend} reference (it has: {})",
                        problem.name,
                        BackendKind::list(&problem.backends())
                    ),
                ));
            }
            class.to_string()
        }
        None => match super::plugin::search_route(&s, &problem).await {
            Some((_, class)) => class,
            None => {
                return Err(ApiError::bad_request(
                    "no_backend",
                    format!(
                        "no usable backend here or in the cluster for problem {:?} (it has references for: {})",
                        problem.name,
                        BackendKind::list(&problem.backends())
                    ),
                ));
            }
        },
    };
    let weight = req.weight.unwrap_or(1.0);
    if !(weight.is_finite() && weight > 0.0 && weight <= 1000.0) {
        return Err(ApiError::bad_request(
            "invalid_field",
            "field `weight`: must be within (0, 1000]",
        ));
    }
    let (name, wasm) = match (&req.proposer, &req.wasm_base64) {
        (_, Some(b64)) => {
            if let Some(name) = &req.proposer {
                kiln_types::names::check(kiln_types::names::NameKind::Proposer, name).map_err(
                    |e| ApiError::bad_request("invalid_field", format!("field `proposer`: {e}")),
                )?;
            }
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|e| {
                    ApiError::bad_request("invalid_field", format!("field `wasm_base64`: {e}"))
                })?;
            (
                req.proposer.clone().unwrap_or_else(|| "uploaded".into()),
                bytes,
            )
        }
        (Some(name), None) => {
            let path = crate::search::find_proposer(&s.config.search, name)
                .map_err(|e| ApiError::bad_request("unknown_proposer", e))?;
            let bytes = std::fs::read(&path).map_err(ApiError::internal)?;
            (name.clone(), bytes)
        }
        (None, None) => {
            return Err(ApiError::bad_request(
                "invalid_field",
                "give `proposer` (an installed proposer's name) or `wasm_base64`",
            ));
        }
    };
    if !wasm.starts_with(b"\0asm") {
        return Err(ApiError::bad_request(
            "invalid_plugin",
            "the proposer is not a WebAssembly file",
        ));
    }
    let hash = s.store.put_plugin(&name, &wasm).await?;
    let cfg = &s.config.search;
    let new = NewSearch {
        problem: problem.name.clone(),
        proposer: name,
        plugin_hash: hash,
        config: req.config.unwrap_or(Value::Null),
        seed: req.seed.unwrap_or_else(rand::random),
        budget_candidates: req.budget.unwrap_or(cfg.default_budget),
        time_limit_ms: req
            .time_limit_secs
            .unwrap_or(cfg.default_time_limit_secs)
            .saturating_mul(1000),
        llm_tokens: req.llm_tokens.unwrap_or(cfg.default_llm_tokens),
        gpu_class,
        weight,
    };
    if new.budget_candidates == 0 || new.time_limit_ms == 0 {
        return Err(ApiError::bad_request(
            "invalid_field",
            "budget and time_limit_secs must be positive",
        ));
    }
    let id = s.store.create_search(&new).await?;
    tracing::info!(search = %id, problem = %new.problem, proposer = %new.proposer, "search started");
    s.supervisor.start(&id);
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": id, "state": "running"})),
    ))
}

/// Query of `GET /v1/searches`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    state: Option<String>,
}

/// `GET /v1/searches[?state=running]`
pub async fn list(
    State(s): State<AppState>,
    QueryArgs(q): QueryArgs<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        json!({"searches": s.store.list_searches(q.state.as_deref()).await?}),
    ))
}

/// `GET /v1/searches/{id}`: the search with its progress and its best candidate.
pub async fn show(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let rec = s
        .store
        .get_search(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("search {id:?} not found")))?;
    Ok(Json(serde_json::to_value(rec).map_err(ApiError::internal)?))
}

/// Query of `GET /v1/searches/{id}/log`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    #[serde(default)]
    after: i64,
    #[serde(default = "default_limit")]
    limit: u32,
}

fn default_limit() -> u32 {
    500
}

/// `GET /v1/searches/{id}/log[?after=ID&limit=N]`
pub async fn log(
    State(s): State<AppState>,
    Path(id): Path<String>,
    QueryArgs(q): QueryArgs<LogQuery>,
) -> Result<Json<Value>, ApiError> {
    if s.store.get_search(&id).await?.is_none() {
        return Err(ApiError::not_found(format!("search {id:?} not found")));
    }
    let lines = s
        .store
        .get_search_log(&id, q.after, q.limit.clamp(1, 5000))
        .await?;
    Ok(Json(json!({"lines": lines})))
}

/// `GET /v1/searches/{id}/llm-calls`: every LLM call the search made.
pub async fn llm_calls(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if s.store.get_search(&id).await?.is_none() {
        return Err(ApiError::not_found(format!("search {id:?} not found")));
    }
    Ok(Json(json!({"calls": s.store.llm_calls(&id).await?})))
}

/// `POST /v1/searches/{id}/cancel`
pub async fn cancel(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let rec = s
        .store
        .get_search(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("search {id:?} not found")))?;
    if rec.state != "running" {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!("search {id} is {}, not running", rec.state),
        ));
    }
    s.supervisor.cancel(&id).await;
    Ok(Json(json!({"id": id, "state": "cancelled"})))
}
