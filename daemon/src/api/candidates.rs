//! `/v1/candidates` and `/v1/jobs`: submit a candidate (or a batch of them), read it back
//! with its job and evaluation (optionally waiting for the evaluation), list candidates,
//! queue another evaluation of a stored candidate, read a job (optionally waiting for its
//! end).

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use kiln_types::{BackendKind, Candidate, JobOptions, ProblemSpec};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::{JsonBody, QueryArgs};
use super::{ApiError, AppState};

/// Longest `?wait=` accepted, seconds.
const MAX_WAIT_SECS: u64 = 600;

/// Checked job options, or `400 invalid_field` naming the field. `lifted_from` is kilnd's
/// own mark on a candidate it lifted from a `ModelNew` file: never taken from a client.
fn checked(options: JobOptions) -> Result<Option<JobOptions>, ApiError> {
    options
        .validate()
        .map_err(|e| ApiError::bad_request("invalid_field", e))?;
    if options.lifted_from.is_some() {
        return Err(ApiError::bad_request(
            "invalid_field",
            "field `lifted_from`: set by kilnd on the candidates it lifts, never by a client",
        ));
    }
    Ok((!options.is_empty()).then_some(options))
}

/// `400 invalid_field` when the options pin the job to a lane the backend does not have
/// here (a backend that is not usable here is not judged: its job waits in the queue).
fn check_lane(s: &AppState, backend: &str, options: Option<&JobOptions>) -> Result<(), ApiError> {
    let Some(lane) = options.and_then(|o| o.lane) else {
        return Ok(());
    };
    let lanes = s
        .sched
        .backends
        .get(backend)
        .filter(|b| b.status().usable)
        .map(|b| b.lanes());
    match lanes {
        Some(n) if lane as usize >= n => Err(ApiError::bad_request(
            "invalid_field",
            format!(
                "field `lane`: the {backend} backend has {n} lane(s) here (0 to {}); `GET /v1/info` lists them",
                n - 1
            ),
        )),
        _ => Ok(()),
    }
}

/// Refuses a Triton candidate when no python with triton was found at start (it could
/// only fail at compile): `503 triton_unavailable` with the reason.
pub(super) fn language_available(s: &AppState, candidate: &Candidate) -> Result<(), ApiError> {
    if candidate.language != kiln_types::Language::Triton
        || s.facts.triton["usable"].as_bool() == Some(true)
    {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "triton_unavailable",
        format!(
            "this kilnd cannot compile triton candidates: {} (see `kiln doctor`)",
            s.facts.triton["detail"]
                .as_str()
                .unwrap_or("no python with triton")
        ),
    ))
}

/// Refuses a hosted candidate (a KernelBench `ModelNew` file) for a problem without a torch
/// reference: the hosted runner builds `ModelNew` with the reference's `get_init_inputs()`
/// and gives it the reference's parameters by name, so there is nothing to run it against
/// (`422 no_torch_reference`).
pub(super) fn hosted_reference(
    candidate: &Candidate,
    problem: &ProblemSpec,
) -> Result<(), ApiError> {
    if !candidate.language.is_hosted() || problem.reference.torch.is_some() {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "no_torch_reference",
        format!(
            "{} candidates need a problem with a torch reference (a KernelBench import or a \
             [reference.torch]); problem {:?} has none",
            candidate.language.as_str(),
            problem.name
        ),
    ))
}

/// A candidate record as the API answers it: the stored record with `trust` (how the
/// candidate is run: `contract`, `hosted`, or `lifted` for a candidate kilnd lifted from a
/// `ModelNew` file).
pub(super) fn record_json(record: &crate::store::CandidateRecord) -> Result<Value, ApiError> {
    let mut v = serde_json::to_value(record).map_err(ApiError::internal)?;
    if let Some(obj) = v.as_object_mut() {
        obj.insert("trust".into(), json!(record.trust()));
    }
    Ok(v)
}

/// For a hosted file whose evaluation tried to lift it: `lift` for its record (the
/// outcome; when lifted, the lifted candidate's id, job state, verdict and time beside
/// the file's hosted time) and whether the lifted candidate's job has ended (true when
/// there is nothing to wait for).
async fn lift_json(
    s: &AppState,
    record: &crate::store::CandidateRecord,
) -> Result<Option<(Value, bool)>, ApiError> {
    use kiln_types::lift::LiftOutcome;
    let Some(outcome) = record.evaluation.as_ref().and_then(|e| e.lift.clone()) else {
        return Ok(None);
    };
    let (candidate_id, notes) = match outcome {
        LiftOutcome::NotLifted { code, reason } => {
            return Ok(Some((
                json!({"outcome": "not_lifted", "code": code, "reason": reason}),
                true,
            )));
        }
        LiftOutcome::Lifted {
            candidate_id,
            notes,
            ..
        } => (candidate_id, notes),
    };
    let hosted_us = record
        .evaluation
        .as_ref()
        .and_then(|e| e.timing.as_ref().map(|t| t.median_us));
    let lifted = s.store.get_candidate(&candidate_id).await?;
    let done = lifted.as_ref().is_none_or(finished);
    let eval = lifted.as_ref().and_then(|r| r.evaluation.as_ref());
    let median = eval.and_then(|e| e.timing.as_ref().map(|t| t.median_us));
    let speedups = match eval.filter(|e| e.backend == BackendKind::Cuda && e.timing.is_some()) {
        Some(e) => {
            super::baselines::speedups(&s.store, &s.facts.gpu, &record.candidate.problem, e).await
        }
        None => Value::Null,
    };
    Ok(Some((
        json!({
            "outcome": "lifted",
            "candidate_id": candidate_id,
            "notes": notes,
            // Queued before the file's result was stored: a lifted candidate that is not
            // there was never queued (kilnd's log says why), and the hosted result stands.
            "state": match &lifted {
                Some(r) => json!(r.job.as_ref().map(|j| j.state)),
                None => json!("failed"),
            },
            "verdict": eval.map(|e| e.verdict),
            "message": match &lifted {
                Some(_) => json!(eval.map(|e| e.message.clone())),
                None => json!("kilnd could not queue the lifted candidate: the hosted result stands"),
            },
            "median_us": median,
            "hosted_median_us": hosted_us,
            "evaluation": eval,
            "speedups": speedups,
        }),
        done,
    )))
}

/// Jobs waiting now (queued, compiling or compiled).
async fn waiting_jobs(s: &AppState) -> Result<u64, ApiError> {
    let counts = s.store.job_counts().await?;
    let waiting: i64 = counts
        .iter()
        .filter(|(st, _)| st.is_waiting())
        .map(|(_, n)| n)
        .sum();
    Ok(u64::try_from(waiting).unwrap_or(0))
}

/// `429 queue_full`, with `waiting` jobs already waiting.
fn queue_full(s: &AppState, waiting: u64) -> ApiError {
    let cap = s.config.queue.max_waiting;
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "queue_full",
        format!("{waiting} jobs are waiting ([queue] max_waiting = {cap}); submit again later"),
    )
}

/// 429 `queue_full` when `[queue] max_waiting` jobs already wait (queued, compiling or
/// compiled): the client retries later (the Python client backs off by itself).
async fn queue_room(s: &AppState) -> Result<(), ApiError> {
    let waiting = waiting_jobs(s).await?;
    if waiting >= s.config.queue.max_waiting {
        return Err(queue_full(s, waiting));
    }
    Ok(())
}

/// Publishes `queued` for a new job, then wakes the scheduler (so events arrive in order).
fn announce_queued(s: &AppState, job_id: i64, candidate_id: &str, problem: &str) {
    s.events.publish(crate::events::Event::Job {
        job_id,
        candidate_id: candidate_id.to_string(),
        problem: problem.to_string(),
        state: "queued".into(),
        lane: None,
        node: None,
        verdict: None,
        median_us: None,
        error: None,
    });
    s.sched.wake();
}

/// `POST /v1/candidates[?plain=N&race=best|UPPER_US&race_margin=M&lane=L]`: stores the
/// candidate and queues it with the options. 202 with the id and job when new; 200 with
/// the stored record when the same candidate was submitted before (nothing is queued).
pub async fn submit(
    State(s): State<AppState>,
    QueryArgs(options): QueryArgs<JobOptions>,
    JsonBody(candidate): JsonBody<Candidate>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let options = checked(options)?;
    admissible(&s, &candidate, options.as_ref()).await?;
    queue_room(&s).await?;
    let (status, body) = store_one(&s, &candidate, options.as_ref()).await?;
    Ok((status, Json(body)))
}

/// Everything a candidate must pass before it is stored: its structure, its language here,
/// its problem (registered, with a reference for its backend, fitting this GPU), and the
/// lane its options pin it to. Each refusal is the error a single submission gets.
async fn admissible(
    s: &AppState,
    candidate: &Candidate,
    options: Option<&JobOptions>,
) -> Result<(), ApiError> {
    candidate
        .validate()
        .map_err(|e| ApiError::bad_request("invalid_candidate", e.to_string()))?;
    language_available(s, candidate)?;
    let backend = candidate.backend();
    let problem = s
        .store
        .get_problem(&candidate.problem)
        .await?
        .ok_or_else(|| {
            ApiError::not_found(format!("problem {:?} is not registered", candidate.problem))
        })?;
    hosted_reference(candidate, &problem)?;
    if problem.reference.has(backend) && !problem.evaluable_on(backend) {
        return Err(ApiError::bad_request(
            "invalid_candidate",
            format!(
                "problem {:?} takes inputs from its file's get_inputs(), which are made on the \
                 GPU: it runs on the cuda backend only",
                problem.name
            ),
        ));
    }
    if !problem.evaluable_on(backend) {
        return Err(ApiError::bad_request(
            "invalid_candidate",
            format!(
                "problem {:?} has no reference for the {backend} backend (it has: {})",
                problem.name,
                BackendKind::list(&problem.backends())
            ),
        ));
    }
    check_lane(s, backend.as_str(), options)?;
    if backend == BackendKind::Cuda {
        super::fit::check(s, &problem)?;
    }
    Ok(())
}

/// Stores an admissible candidate and queues its job (the body a single submission
/// answers, with its status: 202 new, 200 a duplicate with its stored record).
async fn store_one(
    s: &AppState,
    candidate: &Candidate,
    options: Option<&JobOptions>,
) -> Result<(StatusCode, Value), ApiError> {
    let backend = candidate.backend();
    let class = s.sched.class_of(backend.as_str()).unwrap_or_default();
    let submitted = s.store.submit_with(candidate, None, options, class).await?;
    if submitted.duplicate {
        let record = match s.store.get_candidate(&submitted.id).await? {
            Some(r) => record_json(&r)?,
            None => Value::Null,
        };
        let mut body = json!({"id": submitted.id, "job_id": submitted.job_id, "duplicate": true, "record": record});
        if options.is_some() {
            body["warning"] = json!(format!(
                "the candidate was already submitted, so nothing was queued and the options were not used; POST /v1/candidates/{}/jobs evaluates it again",
                submitted.id
            ));
        }
        return Ok((StatusCode::OK, body));
    }
    tracing::info!(candidate = %submitted.id, job = submitted.job_id, problem = %candidate.problem, "candidate queued");
    announce_queued(s, submitted.job_id, &submitted.id, &candidate.problem);
    let mut body = json!({"id": submitted.id, "job_id": submitted.job_id, "duplicate": false, "state": "queued"});
    if !s.sched.usable_backends().contains(&backend.as_str()) {
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
    Ok((StatusCode::ACCEPTED, body))
}

/// Most candidates one batch may hold.
pub const MAX_BATCH: usize = 1024;

/// Body of `POST /v1/candidates/batch`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchBody {
    /// The candidates, each as `POST /v1/candidates` takes one (read one by one, so a bad
    /// one is its own error and the rest go on).
    candidates: Vec<Value>,
}

/// `POST /v1/candidates/batch[?options]`: many candidates in one call (an RL step's
/// rollouts), each admitted, stored and queued exactly as `POST /v1/candidates` would, in
/// order, with the same options. One result per candidate, by `index`: its `status` and the
/// body a single submission would answer, or its `error`. Backpressure is per candidate:
/// once `[queue] max_waiting` jobs wait, a candidate that would queue one is
/// `429 queue_full` (a duplicate, which queues nothing, is still answered), and `queue`
/// says how many wait and how many more fit, so the client resends the refused ones later.
/// The results stream back through the event stream and `GET /v1/candidates/{id}`.
pub async fn submit_batch(
    State(s): State<AppState>,
    QueryArgs(options): QueryArgs<JobOptions>,
    JsonBody(batch): JsonBody<BatchBody>,
) -> Result<Json<Value>, ApiError> {
    let options = checked(options)?;
    if batch.candidates.is_empty() || batch.candidates.len() > MAX_BATCH {
        return Err(ApiError::bad_request(
            "invalid_field",
            format!(
                "field `candidates`: {} given; a batch holds 1 to {MAX_BATCH}",
                batch.candidates.len()
            ),
        ));
    }
    let cap = s.config.queue.max_waiting;
    let mut waiting = waiting_jobs(&s).await?;
    let mut results = Vec::with_capacity(batch.candidates.len());
    let (mut accepted, mut duplicates, mut refused) = (0u64, 0u64, 0u64);
    for (index, item) in batch.candidates.into_iter().enumerate() {
        let outcome = async {
            let candidate: Candidate = super::error::parse_value(item)?;
            admissible(&s, &candidate, options.as_ref()).await?;
            // A candidate stored before queues nothing: answered whatever the room.
            let stored = s.store.get_candidate(&candidate.content_hash()).await?;
            if stored.is_none() && waiting >= cap {
                return Err(queue_full(&s, waiting));
            }
            store_one(&s, &candidate, options.as_ref()).await
        }
        .await;
        results.push(match outcome {
            Ok((status, mut body)) => {
                if status == StatusCode::ACCEPTED {
                    accepted += 1;
                    waiting += 1;
                } else {
                    duplicates += 1;
                }
                body["index"] = json!(index);
                body["status"] = json!(status.as_u16());
                body
            }
            Err(e) => {
                refused += 1;
                json!({
                    "index": index,
                    "status": e.status.as_u16(),
                    "error": {"code": e.code, "message": e.message},
                })
            }
        });
    }
    tracing::info!(accepted, duplicates, refused, "batch submitted");
    Ok(Json(json!({
        "accepted": accepted,
        "duplicates": duplicates,
        "refused": refused,
        "queue": {"waiting": waiting, "max_waiting": cap, "room": cap.saturating_sub(waiting)},
        "results": results,
    })))
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
    record.evaluation.is_some() || record.job.as_ref().is_some_and(|j| j.state.is_finished())
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
            .get_candidate(&id)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("candidate {id:?} not found")))?;
        // A lifted file is finished once its lifted candidate's job has ended too.
        let lift = lift_json(&s, &record).await?;
        if wait == 0 || (finished(&record) && lift.as_ref().is_none_or(|(_, done)| *done)) {
            let mut v = with_speedups(&s, &record).await?;
            if let (Some((l, _)), Some(obj)) = (lift, v.as_object_mut()) {
                obj.insert("lift".into(), l);
            }
            return Ok(Json(v));
        }
        // Wake on this candidate's events (or every second, in case one was missed), then
        // look again.
        let tick = tokio::time::sleep(Duration::from_secs(1));
        tokio::select! {
            _ = crate::events::wait_for(&mut rx, |e| crate::events::is_candidates(e, &id)) => {}
            _ = tick => {}
            _ = tokio::time::sleep_until(deadline) => {
                return match s.store.get_candidate(&id).await? {
                    Some(record) => {
                        let mut v = record_json(&record)?;
                        if let (Some((l, _)), Some(obj)) =
                            (lift_json(&s, &record).await?, v.as_object_mut())
                        {
                            obj.insert("lift".into(), l);
                        }
                        Ok(Json(v))
                    }
                    None => Ok(Json(Value::Null)),
                };
            }
        }
    }
}

/// The record as JSON (with `trust`), with `speedups` against the cached baselines of the
/// GPU model it was timed on, when it was timed on the cuda backend.
async fn with_speedups(
    s: &AppState,
    record: &crate::store::CandidateRecord,
) -> Result<serde_json::Value, ApiError> {
    let mut v = record_json(record)?;
    let timed = record
        .evaluation
        .as_ref()
        .filter(|e| e.backend == BackendKind::Cuda && e.timing.is_some());
    if let (Some(e), Some(obj)) = (timed, v.as_object_mut()) {
        obj.insert(
            "speedups".into(),
            super::baselines::speedups(&s.store, &s.facts.gpu, &record.candidate.problem, e).await,
        );
    }
    Ok(v)
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
    let ids = s.store.list_candidates(q.problem.as_deref(), limit).await?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(r) = s.store.get_candidate(&id).await? {
            out.push(json!({
                "id": r.id,
                "problem": r.candidate.problem,
                "backend": r.backend,
                "language": r.candidate.language,
                "trust": r.trust(),
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

/// `POST /v1/candidates/{id}/jobs`: queues another evaluation of a stored candidate
/// (its compile is cached), with options from the body (`{}` for none).
pub async fn requeue(
    State(s): State<AppState>,
    Path(id): Path<String>,
    JsonBody(options): JsonBody<JobOptions>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let options = checked(options)?;
    let rec = s
        .store
        .get_candidate(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("candidate {id:?} not found")))?;
    check_lane(&s, rec.candidate.backend().as_str(), options.as_ref())?;
    let class = s.sched.class_of(&rec.backend).unwrap_or_default();
    let job_id = s.store.queue_job(&id, options.as_ref(), class).await?;
    tracing::info!(candidate = %id, job = job_id, "candidate queued again");
    announce_queued(&s, job_id, &id, &rec.candidate.problem);
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"id": id, "job_id": job_id, "state": "queued"})),
    ))
}

/// `GET /v1/jobs/{id}[?wait=SECONDS]`: the job with the evaluation it produced; with
/// `wait`, held until the job is done or failed (at most `wait` seconds).
pub async fn job(
    State(s): State<AppState>,
    Path(id): Path<String>,
    QueryArgs(q): QueryArgs<ShowQuery>,
) -> Result<Json<Value>, ApiError> {
    let id: i64 = id.parse().map_err(|_| {
        ApiError::bad_request("invalid_field", format!("job id {id:?} is not a number"))
    })?;
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
        let job = s
            .store
            .get_job(id)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("job {id} not found")))?;
        let ended = job.state.is_finished();
        if wait == 0 || ended || tokio::time::Instant::now() >= deadline {
            let evaluation = if ended {
                s.store.job_evaluation(id).await?
            } else {
                None
            };
            let mut body = serde_json::to_value(job).map_err(ApiError::internal)?;
            body["evaluation"] = serde_json::to_value(evaluation).map_err(ApiError::internal)?;
            return Ok(Json(body));
        }
        tokio::select! {
            _ = crate::events::wait_for(&mut rx, |e| matches!(e, crate::events::Event::Job { job_id, .. } if *job_id == id)) => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
}
