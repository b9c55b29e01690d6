//! The plugin host's calls: `/v1/searches/{id}/…` with `Authorization: Bearer TOKEN`.
//!
//! The token is minted per search run; only its hash is stored. A request carrying it may
//! touch only its own search. Shapes are `kiln_types::plugin` (docs/plugins.md).

use std::time::Duration;

use axum::Json;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use base64::Engine;
use kiln_types::plugin::{
    ArchiveEntry, ArchiveReply, Budget, Checkpoint, Context, Device, Finish, Finished,
    MAX_CHECKPOINT_BYTES, MAX_LOG_BYTES, MAX_PROMPT_BYTES, Submitted, WaitReply, WaitRequest,
};
use kiln_types::{BackendKind, Candidate, ProblemSpec};
use serde_json::{Value, json};

use super::error::JsonBody;
use super::{ApiError, AppState};
use crate::events::Event;
use crate::llm::{ChatMessage, LlmError};
use crate::search::log_quota::Admit;
use crate::store::SearchRecord;

/// Longest `wait` accepted, ms.
const MAX_WAIT_MS: u64 = 600_000;

/// A request authenticated as the plugin host of one running search.
pub struct PluginAuth {
    search: SearchRecord,
}

impl FromRequestParts<AppState> for PluginAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Path(params) = Path::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::bad_request("invalid_path", e.body_text()))?;
        let id = params
            .iter()
            .find(|(k, _)| k == "id")
            .map(|(_, v)| v.clone())
            .ok_or_else(|| ApiError::bad_request("invalid_path", "no search id"))?;
        let token = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "this call needs the search's bearer token",
                )
            })?;
        let hash = crate::search::token_hash(token.trim());
        if !state.store.search_for_token(&id, &hash).await? {
            tracing::warn!(search = %id, "refused a plugin call with a wrong or stale token");
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "the token does not belong to this running search",
            ));
        }
        let search = state
            .store
            .get_search(&id)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("search {id:?} not found")))?;
        Ok(PluginAuth { search })
    }
}

/// Where a new search of `problem` evaluates: the cuda backend before the host backend,
/// each when the problem has a reference for it and this node's lanes take it (their
/// class) or, in a cluster, a live node's lanes do (the class with the most lanes).
pub async fn search_route(s: &AppState, problem: &ProblemSpec) -> Option<(BackendKind, String)> {
    let live = match s.store.cluster() {
        Some(pg) => pg.live_lanes().await.unwrap_or_default(),
        None => Vec::new(),
    };
    for b in BackendKind::ALL {
        if !problem.evaluable_on(b) {
            continue;
        }
        if let Some(class) = s.sched.class_of(b.as_str()) {
            return Some((b, class.to_string()));
        }
        if let Some(l) = live.iter().find(|l| l.backend == b) {
            return Some((b, l.class.clone()));
        }
    }
    None
}

/// The backend of a GPU class (`cuda/…` → `cuda`).
pub fn class_backend(class: &str) -> Option<BackendKind> {
    let prefix = class.split('/').next()?;
    prefix.parse::<BackendKind>().ok()
}

/// The device a search's proposer is told about: for cuda, lane 0's GPU (a GPU left out
/// of `[gpu] devices` runs nothing, so NVML's first GPU may be the wrong one).
fn device_for(s: &AppState, backend: BackendKind) -> Device {
    let lane0 = s
        .sched
        .backends
        .get(BackendKind::Cuda.as_str())
        .map(|b| b.lane_label(0));
    let gpu = s
        .facts
        .gpu
        .gpus
        .iter()
        .find(|g| g.uuid.is_some() && g.uuid == lane0)
        .or_else(|| s.facts.gpu.gpus.first());
    if backend == BackendKind::Cuda
        && let Some(g) = gpu
    {
        return Device {
            backend: backend.into(),
            name: g.name.clone(),
            compute_capability: g.compute_capability.clone(),
            units: None,
            memory_bytes: g.memory_total_bytes,
            extra: serde_json::to_value(g).unwrap_or_default(),
        };
    }
    Device {
        backend: backend.into(),
        name: "host CPU".into(),
        compute_capability: None,
        units: std::thread::available_parallelism()
            .ok()
            .and_then(|n| u32::try_from(n.get()).ok()),
        memory_bytes: None,
        extra: Value::Null,
    }
}

/// `GET /v1/searches/{id}/context`
pub async fn context(
    State(s): State<AppState>,
    auth: PluginAuth,
) -> Result<Json<Context>, ApiError> {
    let search = auth.search;
    let problem = s
        .store
        .get_problem(&search.problem)
        .await?
        .ok_or_else(|| ApiError::not_found("the search's problem is gone"))?;
    let backend = match class_backend(&search.gpu_class) {
        Some(b) => b,
        None => search_route(&s, &problem)
            .await
            .map(|(b, _)| b)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "no_backend",
                    "no usable backend for this problem",
                )
            })?,
    };
    let seed = problem
        .seed_candidate(backend.as_str())
        .map(|c| serde_json::to_value(c).unwrap_or_default());
    let config = match &search.config {
        Value::Null => String::new(),
        Value::String(t) => t.clone(),
        other => other.to_string(),
    };
    Ok(Json(Context {
        search_id: search.id.clone(),
        problem: serde_json::to_value(&problem).map_err(ApiError::internal)?,
        backend: backend.into(),
        seed,
        baselines: Vec::new(),
        device: device_for(&s, backend),
        config,
        random_seed: search.seed,
    }))
}

/// `POST /v1/searches/{id}/candidates`
pub async fn submit(
    State(s): State<AppState>,
    auth: PluginAuth,
    JsonBody(candidate): JsonBody<Candidate>,
) -> Result<(StatusCode, Json<Submitted>), ApiError> {
    let search = auth.search;
    if candidate.problem != search.problem {
        return Err(ApiError::bad_request(
            "invalid_candidate",
            format!(
                "this search is for problem {:?}, not {:?}",
                search.problem, candidate.problem
            ),
        ));
    }
    candidate
        .validate()
        .map_err(|e| ApiError::bad_request("invalid_candidate", e.to_string()))?;
    let problem = s
        .store
        .get_problem(&search.problem)
        .await?
        .ok_or_else(|| ApiError::not_found("the search's problem is gone"))?;
    super::candidates::hosted_reference(&candidate, &problem)?;
    let backend = candidate.backend();
    if !problem.evaluable_on(backend) {
        return Err(ApiError::bad_request(
            "invalid_candidate",
            format!(
                "problem {:?} has no reference for the {backend} backend",
                problem.name
            ),
        ));
    }
    super::candidates::language_available(&s, &candidate)?;
    if backend == kiln_types::BackendKind::Cuda {
        super::fit::check(&s, &problem)?;
    }
    let id = candidate.content_hash();
    let archive = s.store.search_archive(&search.id).await?;
    let known = archive.iter().any(|e| e.candidate_id == id);
    if !known && search.submitted >= search.budget_candidates {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "budget_exhausted",
            format!(
                "the search's budget of {} candidates is spent",
                search.budget_candidates
            ),
        ));
    }
    if !known && s.store.search_queued(&search.id).await? >= s.config.search.queue_cap {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "queue_full",
            format!(
                "{} of this search's candidates are waiting; wait for some first",
                s.config.search.queue_cap
            ),
        ));
    }
    let sub = s.store.submit(&candidate, Some(&search.id)).await?;
    if !sub.duplicate {
        s.sched.wake();
    }
    s.supervisor.publish(&search.id).await;
    let status = if sub.duplicate {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((
        status,
        Json(Submitted {
            id: sub.id,
            job_id: Some(sub.job_id),
            duplicate: sub.duplicate,
        }),
    ))
}

async fn finished_of(s: &AppState, id: &str) -> Result<Option<Finished>, ApiError> {
    let Some(rec) = s.store.get_candidate(id).await? else {
        return Ok(None);
    };
    if let Some(e) = rec.evaluation {
        return Ok(Some(Finished {
            candidate_id: id.into(),
            evaluation: Some(serde_json::to_value(e).map_err(ApiError::internal)?),
            error: None,
        }));
    }
    if let Some(j) = rec.job
        && j.state == crate::store::JobState::Failed
    {
        return Ok(Some(Finished {
            candidate_id: id.into(),
            evaluation: None,
            error: Some(j.error.unwrap_or_else(|| "the job failed".into())),
        }));
    }
    Ok(None)
}

/// `POST /v1/searches/{id}/wait`
pub async fn wait(
    State(s): State<AppState>,
    auth: PluginAuth,
    JsonBody(req): JsonBody<WaitRequest>,
) -> Result<Json<WaitReply>, ApiError> {
    let search = auth.search;
    let archive = s.store.search_archive(&search.id).await?;
    for id in &req.ids {
        if !archive.iter().any(|e| &e.candidate_id == id) {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_candidate",
                format!("candidate {id:?} was not submitted by this search"),
            ));
        }
    }
    let mut rx = s.events.subscribe();
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(req.timeout_ms.min(MAX_WAIT_MS));
    loop {
        let mut finished = Vec::new();
        for id in &req.ids {
            if let Some(f) = finished_of(&s, id).await? {
                finished.push(f);
            }
        }
        if finished.len() == req.ids.len() || tokio::time::Instant::now() >= deadline {
            return Ok(Json(WaitReply { finished }));
        }
        tokio::select! {
            _ = crate::events::wait_for(&mut rx, |e| req.ids.iter().any(|id| crate::events::is_candidates(e, id))) => {}
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// `GET /v1/searches/{id}/archive` (plugin host; people use the same route without a token)
pub async fn archive(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<ArchiveReply>, ApiError> {
    if s.store.get_search(&id).await?.is_none() {
        return Err(ApiError::not_found(format!("search {id:?} not found")));
    }
    let mut entries = Vec::new();
    for e in s.store.search_archive(&id).await? {
        let candidate = s
            .store
            .get_candidate(&e.candidate_id)
            .await?
            .map(|r| serde_json::to_value(r.candidate).unwrap_or_default())
            .unwrap_or_default();
        let error = if e.evaluation.is_none() && e.state.as_deref() == Some("failed") {
            s.store
                .get_candidate(&e.candidate_id)
                .await?
                .and_then(|r| r.job.and_then(|j| j.error))
        } else {
            None
        };
        entries.push(ArchiveEntry {
            id: e.candidate_id,
            candidate,
            evaluation: e.evaluation,
            error,
        });
    }
    Ok(Json(ArchiveReply { entries }))
}

/// Body of `POST /v1/searches/{id}/llm` (the protocol's chat request).
pub async fn llm(
    State(s): State<AppState>,
    auth: PluginAuth,
    JsonBody(req): JsonBody<kiln_types::plugin::ChatRequest>,
) -> Result<Json<kiln_types::plugin::ChatReply>, ApiError> {
    let search = auth.search;
    // Checked first, so an oversized prompt fails this call whatever the gateway is.
    let prompt: usize = req.messages.iter().map(|m| m.content.len()).sum();
    if prompt > MAX_PROMPT_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            kiln_types::plugin::codes::LLM_FAILED,
            format!("the prompt is {prompt} bytes, over the limit of {MAX_PROMPT_BYTES} bytes"),
        ));
    }
    let chat = crate::llm::ChatRequest {
        messages: req
            .messages
            .into_iter()
            .map(|m| ChatMessage {
                role: m.role,
                content: m.content,
            })
            .collect(),
        max_tokens: req.max_tokens,
        temperature: req.temperature,
    };
    match s
        .llm
        .chat(
            &s.store,
            &search.id,
            search.tokens_used,
            search.llm_tokens,
            chat,
        )
        .await
    {
        Ok(r) => Ok(Json(kiln_types::plugin::ChatReply {
            content: r.content,
            model: r.model,
            prompt_tokens: u32::try_from(r.prompt_tokens).unwrap_or(u32::MAX),
            completion_tokens: u32::try_from(r.completion_tokens).unwrap_or(u32::MAX),
            finish_reason: "stop".into(),
        })),
        Err(LlmError::Unavailable(m)) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "llm_unavailable",
            m,
        )),
        Err(LlmError::BudgetExceeded(m)) => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "llm_budget_exceeded",
            m,
        )),
        Err(LlmError::Failed(m)) => Err(ApiError::new(StatusCode::BAD_GATEWAY, "llm_failed", m)),
    }
}

/// `PUT /v1/searches/{id}/checkpoint`
pub async fn put_checkpoint(
    State(s): State<AppState>,
    auth: PluginAuth,
    JsonBody(cp): JsonBody<Checkpoint>,
) -> Result<Json<Value>, ApiError> {
    let bytes = match cp.data {
        Some(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| ApiError::bad_request("invalid_field", format!("field `data`: {e}")))?,
        None => Vec::new(),
    };
    if bytes.len() > MAX_CHECKPOINT_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "checkpoint_too_large",
            format!("checkpoints are limited to {MAX_CHECKPOINT_BYTES} bytes"),
        ));
    }
    s.store.save_checkpoint(&auth.search.id, &bytes).await?;
    Ok(Json(json!({"stored": bytes.len()})))
}

/// `GET /v1/searches/{id}/checkpoint`
pub async fn get_checkpoint(
    State(s): State<AppState>,
    auth: PluginAuth,
) -> Result<Json<Checkpoint>, ApiError> {
    let data = s
        .store
        .load_checkpoint(&auth.search.id)
        .await?
        .filter(|b| !b.is_empty())
        .map(|b| base64::engine::general_purpose::STANDARD.encode(b));
    Ok(Json(Checkpoint { data }))
}

/// `POST /v1/searches/{id}/log`
pub async fn post_log(
    State(s): State<AppState>,
    auth: PluginAuth,
    JsonBody(line): JsonBody<kiln_types::plugin::LogLine>,
) -> Result<Json<Value>, ApiError> {
    let level = match line.level.as_str() {
        "trace" | "debug" | "info" | "warn" | "error" => line.level.clone(),
        other => {
            return Err(ApiError::bad_request(
                "invalid_field",
                format!("field `level`: unknown level {other:?}"),
            ));
        }
    };
    let mut message = line.message;
    if message.len() > MAX_LOG_BYTES {
        let mut cut = MAX_LOG_BYTES;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
    let (level, message) = match s
        .supervisor
        .log_quota
        .admit(&s.store, &auth.search.id, message.len())
        .await?
    {
        Admit::Store => (level, message),
        Admit::Notice(notice) => ("warn".to_string(), notice),
        Admit::Drop => return Ok(Json(json!({"dropped": true}))),
    };
    s.store
        .search_log(&auth.search.id, &level, &message)
        .await?;
    tracing::debug!(search = %auth.search.id, level = %level, message = %message, "plugin log");
    s.events.publish(Event::SearchLog {
        search_id: auth.search.id,
        level,
        message,
    });
    Ok(Json(json!({})))
}

/// `GET /v1/searches/{id}/budget`
pub async fn budget(State(s): State<AppState>, auth: PluginAuth) -> Result<Json<Budget>, ApiError> {
    let sr = auth.search;
    Ok(Json(Budget {
        candidates_left: Some(sr.budget_candidates.saturating_sub(sr.submitted)),
        ms_left: s.supervisor.ms_left(&sr.id).await,
        tokens_left: Some(sr.llm_tokens.saturating_sub(sr.tokens_used)),
    }))
}

/// `POST /v1/searches/{id}/finish`: how the plugin ended.
pub async fn finish(
    State(s): State<AppState>,
    auth: PluginAuth,
    JsonBody(f): JsonBody<Finish>,
) -> Result<Json<Value>, ApiError> {
    let id = auth.search.id;
    let (state, summary, error) = match (&f.ok, &f.error) {
        (Some(ok), None) => (
            "done",
            Some(serde_json::to_value(ok).map_err(ApiError::internal)?),
            None,
        ),
        (None, Some(err)) => (
            "failed",
            None,
            Some(format!("{}: {}", err.kind, err.message)),
        ),
        _ => {
            return Err(ApiError::bad_request(
                "invalid_field",
                "give exactly one of `ok` and `error`",
            ));
        }
    };
    let summary = summary.map(|mut v| {
        v["stats"] = serde_json::to_value(f.stats).unwrap_or_default();
        v
    });
    s.store.add_search_elapsed(&id, f.stats.wall_ms).await?;
    s.store
        .finish_search(&id, state, summary.as_ref(), error.as_deref())
        .await?;
    let line = match &error {
        Some(e) => format!("plugin ended: {e}"),
        None => "plugin finished".to_string(),
    };
    s.store
        .search_log(&id, if error.is_some() { "error" } else { "info" }, &line)
        .await?;
    if !f.stderr.trim().is_empty() {
        s.store
            .search_log(&id, "debug", &format!("plugin stderr: {}", f.stderr.trim()))
            .await?;
    }
    tracing::info!(search = %id, state, "search finished");
    s.supervisor.publish(&id).await;
    Ok(Json(json!({"state": state})))
}
