//! `/v1/candidates` and `/v1/jobs`: submit a candidate, read it back with its job and
//! evaluation (optionally waiting for the evaluation), list candidates, read a job.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use kiln_types::Candidate;
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::{JsonBody, QueryArgs};
use super::{ApiError, AppState};
use crate::store::JobState;

/// Longest `?wait=` accepted, seconds.
const MAX_WAIT_SECS: u64 = 600;

/// `POST /v1/candidates`: stores the candidate and queues it. 202 with the id and job
/// when new; 200 with the stored record when the same candidate was submitted before.
pub async fn submit(
    State(s): State<AppState>,
    JsonBody(candidate): JsonBody<Candidate>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    candidate
        .validate()
        .map_err(|e| ApiError::bad_request("invalid_candidate", e.to_string()))?;
    let backend = candidate.language.backend();
    let problem = s.store.get_problem(&candidate.problem)?.ok_or_else(|| {
        ApiError::not_found(format!("problem {:?} is not registered", candidate.problem))
    })?;
    if !problem.reference.contains_key(backend) {
        return Err(ApiError::bad_request(
            "invalid_candidate",
            format!(
                "problem {:?} has no reference for the {backend} backend (it has: {})",
                problem.name,
                problem.backends().join(", ")
            ),
        ));
    }
    let submitted = s.store.submit(&candidate, None)?;
    if submitted.duplicate {
        let record = s.store.get_candidate(&submitted.id)?;
        return Ok((
            StatusCode::OK,
            Json(
                json!({"id": submitted.id, "job_id": submitted.job_id, "duplicate": true, "record": record}),
            ),
        ));
    }
    tracing::info!(candidate = %submitted.id, job = submitted.job_id, problem = %candidate.problem, "candidate queued");
    s.events.publish(crate::events::Event::Job {
        job_id: submitted.job_id,
        candidate_id: submitted.id.clone(),
        problem: candidate.problem.clone(),
        state: "queued".into(),
        stage: None,
        verdict: None,
        median_us: None,
        error: None,
    });
    // Wake the scheduler only after `queued` is published, so events arrive in order.
    s.sched.wake();
    let mut body = json!({"id": submitted.id, "job_id": submitted.job_id, "duplicate": false, "state": "queued"});
    if !s.sched.usable_backends().contains(&backend) {
        let why = s
            .facts
            .backends
            .iter()
            .find(|b| b.name == backend)
            .map_or_else(|| "it is not built in".to_string(), |b| b.detail.clone());
        body["warning"] = json!(format!(
            "the {backend} backend is not usable here ({why}); the job waits in the queue"
        ));
    }
    Ok((StatusCode::ACCEPTED, Json(body)))
}

/// Query of `GET /v1/candidates/{id}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShowQuery {
    /// Wait up to this many seconds for the evaluation (or the job's failure).
    #[serde(default)]
    wait: Option<u64>,
}

fn finished(record: &crate::store::CandidateRecord) -> bool {
    record.evaluation.is_some()
        || record
            .job
            .as_ref()
            .is_some_and(|j| matches!(j.state, JobState::Done | JobState::Failed))
}

/// `GET /v1/candidates/{id}[?wait=SECONDS]`
pub async fn show(
    State(s): State<AppState>,
    Path(id): Path<String>,
    QueryArgs(q): QueryArgs<ShowQuery>,
) -> Result<Json<Value>, ApiError> {
    let wait = q.wait.unwrap_or(0);
    if wait > MAX_WAIT_SECS {
        return Err(ApiError::bad_request(
            "invalid_field",
            format!("wait must be at most {MAX_WAIT_SECS} seconds"),
        ));
    }
    let mut rx = s.events.subscribe();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(wait);
    loop {
        let record = s
            .store
            .get_candidate(&id)?
            .ok_or_else(|| ApiError::not_found(format!("candidate {id:?} not found")))?;
        if wait == 0 || finished(&record) {
            return Ok(Json(
                serde_json::to_value(record).map_err(ApiError::internal)?,
            ));
        }
        // Wake on any event (or every second, in case one was missed), then look again.
        let tick = tokio::time::sleep(Duration::from_secs(1));
        tokio::select! {
            _ = rx.recv() => {}
            _ = tick => {}
            _ = tokio::time::sleep_until(deadline) => {
                let record = s.store.get_candidate(&id)?;
                return Ok(Json(serde_json::to_value(record).map_err(ApiError::internal)?));
            }
        }
    }
}

/// Query of `GET /v1/candidates`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    problem: Option<String>,
    #[serde(default = "default_limit")]
    limit: u32,
}

fn default_limit() -> u32 {
    50
}

/// `GET /v1/candidates[?problem=NAME&limit=N]`: newest first, with their latest verdicts.
pub async fn list(
    State(s): State<AppState>,
    QueryArgs(q): QueryArgs<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.clamp(1, 1000);
    let ids = s.store.list_candidates(q.problem.as_deref(), limit)?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(r) = s.store.get_candidate(&id)? {
            out.push(json!({
                "id": r.id,
                "problem": r.candidate.problem,
                "backend": r.backend,
                "note": r.candidate.note,
                "created_at": r.created_at,
                "state": r.job.as_ref().map(|j| j.state),
                "verdict": r.evaluation.as_ref().map(|e| e.verdict),
                "median_us": r.evaluation.as_ref().and_then(|e| e.timing.as_ref().map(|t| t.median_us)),
            }));
        }
    }
    Ok(Json(json!({"candidates": out})))
}

/// `GET /v1/jobs/{id}`
pub async fn job(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id: i64 = id.parse().map_err(|_| {
        ApiError::bad_request("invalid_field", format!("job id {id:?} is not a number"))
    })?;
    let job = s
        .store
        .get_job(id)?
        .ok_or_else(|| ApiError::not_found(format!("job {id} not found")))?;
    Ok(Json(serde_json::to_value(job).map_err(ApiError::internal)?))
}
