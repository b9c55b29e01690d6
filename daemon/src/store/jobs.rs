//! The durable job queue: queued → compiling → compiled → running → done | failed.
//!
//! A job is claimed for compiling by flipping it to `compiling` in one statement; once
//! compiled (its artifact is in the compile cache) it is `compiled`, waiting for a lane;
//! only when its evaluation starts on a lane is it `running`, and only then is the attempt
//! counted. Jobs found `compiling` or `compiled` when the daemon starts are queued again
//! as they are; jobs found `running` were cut short by a crash during their evaluation:
//! they are queued again, or failed once they have used up their attempts.

use kiln_types::{Evaluation, JobOptions};
use rusqlite::{OptionalExtension, Row, params};
use serde::Serialize;

use super::{Result, SqliteStore, StoreError, corrupt, now_ms};

/// Queue states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Waiting to be compiled.
    Queued,
    /// Claimed by a compile worker (no attempt counted).
    Compiling,
    /// Compiled, waiting for a lane (no attempt counted).
    Compiled,
    /// Being evaluated on a lane (the attempt is counted).
    Running,
    /// Finished with an evaluation (whatever its verdict).
    Done,
    /// Could not be evaluated (infrastructure failure or attempts used up).
    Failed,
}

impl JobState {
    /// The state of a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => JobState::Queued,
            "compiling" => JobState::Compiling,
            "compiled" => JobState::Compiled,
            "running" => JobState::Running,
            "done" => JobState::Done,
            "failed" => JobState::Failed,
            _ => return None,
        })
    }

    /// The name stored and sent on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Compiling => "compiling",
            JobState::Compiled => "compiled",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
        }
    }

    /// Not yet evaluating on a lane: what the queue depth counts.
    pub fn is_waiting(self) -> bool {
        matches!(
            self,
            JobState::Queued | JobState::Compiling | JobState::Compiled
        )
    }

    /// `done` or `failed`.
    pub fn is_finished(self) -> bool {
        matches!(self, JobState::Done | JobState::Failed)
    }

    /// Every state, for metrics.
    pub const ALL: [JobState; 6] = [
        JobState::Queued,
        JobState::Compiling,
        JobState::Compiled,
        JobState::Running,
        JobState::Done,
        JobState::Failed,
    ];
}

/// A job as stored.
#[derive(Debug, Clone, Serialize)]
pub struct JobRecord {
    /// Job id.
    pub id: i64,
    /// Candidate it evaluates.
    pub candidate_id: String,
    /// Backend it runs on.
    pub backend: String,
    /// Queue state.
    pub state: JobState,
    /// The lane of its (last) evaluation, once one started.
    pub lane: Option<u32>,
    /// Evaluations started (only a start on a lane counts, not a claim or a compile).
    pub attempts: u32,
    /// Why it failed, for `failed`.
    pub error: Option<String>,
    /// Queued at, ms since the epoch.
    pub created_at: i64,
    /// Last claimed for compiling at.
    pub started_at: Option<i64>,
    /// Finished at.
    pub finished_at: Option<i64>,
    /// Compile stage wall time, ms.
    pub compile_ms: Option<f64>,
    /// Evaluation stage wall time, ms.
    pub eval_ms: Option<f64>,
    /// The search that queued it, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub search_id: Option<String>,
    /// Options given when it was queued (plain timing, racing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options: Option<JobOptions>,
    /// The GPU class it is routed to (`""`: any class of its backend, fixed when claimed).
    pub gpu_class: String,
    /// The node that holds it (or last held it; evaluated it, once done).
    pub node: Option<String>,
    /// The lease token of the claim that holds it: writes with another are refused.
    #[serde(skip)]
    pub lease_token: i64,
}

/// A lane's claim key: its backend and its GPU class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LaneClass {
    /// Backend name (`host`, `cuda`).
    pub backend: String,
    /// GPU class (`cuda/NVIDIA H200/580.95.05/observe`, `host/…`).
    pub class: String,
    /// How many lanes of the backend this node has: in a cluster, a job pinned to a lane
    /// (its `lane` option) is claimed only by a node that has that lane.
    pub lanes: u32,
}

pub(super) const JOB_COLUMNS: &str = "id, candidate_id, backend, state, lane, attempts, error, \
     created_at, started_at, finished_at, compile_ms, eval_ms, search_id, options_json, \
     gpu_class, node, lease_token";

pub(super) fn job_from_row(r: &Row<'_>) -> rusqlite::Result<JobRecord> {
    let state: String = r.get(3)?;
    Ok(JobRecord {
        id: r.get(0)?,
        candidate_id: r.get(1)?,
        backend: r.get(2)?,
        state: JobState::parse(&state).unwrap_or(JobState::Failed),
        lane: r.get(4)?,
        attempts: r.get(5)?,
        error: r.get(6)?,
        created_at: r.get(7)?,
        started_at: r.get(8)?,
        finished_at: r.get(9)?,
        compile_ms: r.get(10)?,
        eval_ms: r.get(11)?,
        search_id: r.get(12)?,
        options: r
            .get::<_, Option<String>>(13)?
            .map(|j| serde_json::from_str(&j))
            .transpose()
            .map_err(|e| {
                rusqlite::Error::FromSqlConversionFailure(
                    13,
                    rusqlite::types::Type::Text,
                    Box::new(e),
                )
            })?,
        gpu_class: r.get(14)?,
        node: r.get(15)?,
        lease_token: r.get::<_, Option<i64>>(16)?.unwrap_or(0),
    })
}

/// A fresh lease token: random, so a stale holder's token never matches a later claim.
pub(super) fn new_token() -> i64 {
    i64::try_from(rand::random::<u64>() >> 1)
        .unwrap_or(1)
        .max(1)
}

/// The options as stored: `NULL` when there are none.
pub(super) fn options_json(options: Option<&JobOptions>) -> Result<Option<String>> {
    options
        .filter(|o| !o.is_empty())
        .map(|o| serde_json::to_string(o).map_err(|e| corrupt("job options", e)))
        .transpose()
}

/// What start-up recovery did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Recovery {
    /// Jobs that were compiling or waiting for a lane, queued again (nothing counted).
    pub waiting: usize,
    /// Jobs whose evaluation was cut short, queued again.
    pub requeued: usize,
    /// Jobs failed for having used up their attempts.
    pub failed: usize,
}

impl SqliteStore {
    /// A job by id.
    pub fn get_job(&self, id: i64) -> Result<Option<JobRecord>> {
        let conn = self.lock();
        Ok(conn
            .query_row(
                &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"),
                [id],
                job_from_row,
            )
            .optional()?)
    }

    /// Claims the next queued job for one of `lanes`' backends for compiling: marks it
    /// `compiling` under a fresh lease token, held by this node (no attempt is counted; a
    /// job routed to any class takes the lane's). Searches are served round-robin: the
    /// job comes from the search (or the pool of single submissions) that was served least
    /// recently, oldest job first within it, so one busy search cannot starve the others.
    /// One host has one class per backend, so the class is not matched here. A job pinned
    /// to a lane the backend does not have is claimed too (the API refuses such pins
    /// while the backend is usable): the scheduler fails it, saying why, since no other
    /// node could ever take it.
    pub fn claim_next(&self, lanes: &[LaneClass]) -> Result<Option<JobRecord>> {
        if lanes.is_empty() {
            return Ok(None);
        }
        let list = lanes
            .iter()
            .map(|l| format!("'{}'", l.backend.replace('\'', "")))
            .collect::<Vec<_>>()
            .join(",");
        let class_of = lanes
            .iter()
            .map(|l| {
                format!(
                    "WHEN '{}' THEN '{}'",
                    l.backend.replace('\'', ""),
                    l.class.replace('\'', "")
                )
            })
            .collect::<Vec<_>>()
            .join(" ");
        let conn = self.lock();
        Ok(conn
            .query_row(
                &format!(
                    "UPDATE jobs SET state = 'compiling', started_at = ?1, node = ?2,
                            lease_token = ?3,
                            gpu_class = CASE WHEN gpu_class = '' THEN CASE backend {class_of} ELSE '' END
                                             ELSE gpu_class END
                     WHERE id = (SELECT j.id FROM jobs j
                                 WHERE j.state = 'queued' AND j.backend IN ({list})
                                 ORDER BY (SELECT max(r.started_at) FROM jobs r
                                           WHERE r.search_id IS j.search_id
                                             AND r.started_at IS NOT NULL) NULLS FIRST,
                                          j.id
                                 LIMIT 1)
                     RETURNING {JOB_COLUMNS}"
                ),
                params![now_ms(), self.node, new_token()],
                job_from_row,
            )
            .optional()?)
    }

    /// A claimed job is compiled and waits for a lane (`compiling` → `compiled`).
    pub fn mark_compiled(&self, id: i64, token: i64) -> Result<()> {
        self.lock().execute(
            "UPDATE jobs SET state = 'compiled'
             WHERE id = ?1 AND lease_token = ?2 AND state = 'compiling'",
            params![id, token],
        )?;
        Ok(())
    }

    /// The job's evaluation starts on `lane`: `running`, and the attempt is counted. False
    /// when the lease is not this one's or the job was not waiting for a lane.
    pub fn start_evaluation(&self, id: i64, token: i64, lane: u32) -> Result<bool> {
        let n = self.lock().execute(
            "UPDATE jobs SET state = 'running', lane = ?3, attempts = attempts + 1
             WHERE id = ?1 AND lease_token = ?2 AND state IN ('compiling', 'compiled')",
            params![id, token, lane],
        )?;
        Ok(n == 1)
    }

    /// Stores the evaluation and marks the job done, in one transaction, with the node
    /// and class that hold it. Refused (`Fenced`) when `token` is not the job's lease.
    pub fn finish_job(
        &self,
        id: i64,
        token: i64,
        evaluation: &Evaluation,
        compile_ms: f64,
        eval_ms: f64,
    ) -> Result<()> {
        let json = serde_json::to_string(evaluation).map_err(|e| corrupt("evaluation", e))?;
        let mut conn = self.lock();
        let tx = conn.transaction()?;
        let now = now_ms();
        let n = tx.execute(
            "UPDATE jobs SET state = 'done', finished_at = ?3, compile_ms = ?4,
                    eval_ms = ?5, error = NULL
             WHERE id = ?1 AND lease_token = ?2 AND state IN ('compiling', 'compiled', 'running')",
            params![id, token, now, compile_ms, eval_ms],
        )?;
        if n == 0 {
            return fenced(&tx, id, token, JobState::Done);
        }
        let timing = evaluation.timing.as_ref();
        tx.execute(
            "INSERT INTO evaluations (candidate_id, job_id, verdict, median_us, evaluation_json,
                                      created_at, raced_out, plain, upper_us, node, gpu_class)
             SELECT candidate_id, id, ?2, ?3, ?4, ?5, ?6, ?7, ?8, node, gpu_class
             FROM jobs WHERE id = ?1",
            params![
                id,
                evaluation.verdict.as_str(),
                timing.map(|t| t.median_us),
                json,
                now,
                timing.is_some_and(|t| t.raced_out),
                timing.is_some_and(|t| t.plain),
                timing.map(|t| t.interval95().1).filter(|u| u.is_finite()),
            ],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Queues another evaluation of a stored candidate (a new job; the candidate and its
    /// earlier evaluations stay as they are). Returns the job id.
    pub fn queue_job(
        &self,
        candidate_id: &str,
        options: Option<&JobOptions>,
        gpu_class: &str,
    ) -> Result<i64> {
        let options = options_json(options)?;
        let mut conn = self.lock();
        let tx = conn.transaction()?;
        let backend: String = tx
            .query_row(
                "SELECT backend FROM candidates WHERE id = ?1",
                [candidate_id],
                |r| r.get(0),
            )
            .optional()?
            .ok_or_else(|| StoreError::NotFound(format!("candidate {candidate_id:?}")))?;
        tx.execute(
            "INSERT INTO jobs (candidate_id, backend, state, created_at, options_json, gpu_class)
             VALUES (?1, ?2, 'queued', ?3, ?4, ?5)",
            params![candidate_id, backend, now_ms(), options, gpu_class],
        )?;
        let id = tx.last_insert_rowid();
        tx.commit()?;
        Ok(id)
    }

    /// The evaluation a job produced, once it is done.
    pub fn job_evaluation(&self, job_id: i64) -> Result<Option<Evaluation>> {
        let json: Option<String> = self
            .lock()
            .query_row(
                "SELECT evaluation_json FROM evaluations WHERE job_id = ?1 ORDER BY id DESC LIMIT 1",
                [job_id],
                |r| r.get(0),
            )
            .optional()?;
        json.map(|j| {
            serde_json::from_str(&j).map_err(|e| corrupt(format!("evaluation of job {job_id}"), e))
        })
        .transpose()
    }

    /// Marks a job failed with a reason (infrastructure failure, not a verdict); refused
    /// (`Fenced`) when `token` is not the job's lease.
    pub fn fail_job(&self, id: i64, token: i64, error: &str) -> Result<()> {
        let conn = self.lock();
        let n = conn.execute(
            "UPDATE jobs SET state = 'failed', error = ?3, finished_at = ?4
             WHERE id = ?1 AND lease_token = ?2 AND state NOT IN ('done', 'failed')",
            params![id, token, error, now_ms()],
        )?;
        if n == 0 {
            return fenced(&conn, id, token, JobState::Failed);
        }
        Ok(())
    }

    /// Puts a claimed job back in the queue without counting anything (a clean stop that
    /// could not wait for it): one waiting for a compile or a lane as it is, one whose
    /// evaluation had started with that attempt taken back. Only the lease holder can.
    pub fn requeue_job(&self, id: i64, token: i64) -> Result<()> {
        self.lock().execute(
            "UPDATE jobs SET state = 'queued', lease_token = NULL,
                    attempts = CASE WHEN state = 'running' THEN max(attempts - 1, 0)
                                    ELSE attempts END
             WHERE id = ?1 AND lease_token = ?2 AND state IN ('compiling', 'compiled', 'running')",
            params![id, token],
        )?;
        Ok(())
    }

    /// At start: jobs left compiling or waiting for a lane are queued again as they are;
    /// jobs left `running` (a crash during their evaluation) are queued again, or failed
    /// once their evaluation has been started `max_attempts` times.
    pub fn recover_interrupted(&self, max_attempts: u32) -> Result<Recovery> {
        let mut conn = self.lock();
        let tx = conn.transaction()?;
        let waiting = tx.execute(
            "UPDATE jobs SET state = 'queued', lease_token = NULL
             WHERE state IN ('compiling', 'compiled')",
            [],
        )?;
        let failed = tx.execute(
            "UPDATE jobs SET state = 'failed', finished_at = ?2, lease_token = NULL,
                    error = 'kiln stopped during this job''s evaluation ' || attempts || ' times; giving up'
             WHERE state = 'running' AND attempts >= ?1",
            params![max_attempts, now_ms()],
        )?;
        let requeued = tx.execute(
            "UPDATE jobs SET state = 'queued', lease_token = NULL WHERE state = 'running'",
            [],
        )?;
        tx.commit()?;
        Ok(Recovery {
            waiting,
            requeued,
            failed,
        })
    }

    /// Number of jobs in each state (every state listed, zeros included).
    pub fn job_counts(&self) -> Result<Vec<(JobState, i64)>> {
        let conn = self.lock();
        let mut stmt = conn.prepare("SELECT state, count(*) FROM jobs GROUP BY state")?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(JobState::ALL
            .iter()
            .map(|s| {
                let n = rows
                    .iter()
                    .find(|(name, _)| name == s.as_str())
                    .map_or(0, |(_, n)| *n);
                (*s, n)
            })
            .collect())
    }

    /// Number of evaluations per verdict.
    pub fn verdict_counts(&self) -> Result<Vec<(String, i64)>> {
        let conn = self.lock();
        let mut stmt = conn.prepare(
            "SELECT verdict, count(*) FROM evaluations GROUP BY verdict ORDER BY verdict",
        )?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(rows)
    }
}

/// A write that would end job `id` found it no longer held by claim `token`: `Ok` when
/// the job already ended as `ending` under that same claim (the write is a repeat of one
/// that was recorded), else why the write was refused (`Fenced`).
fn fenced(conn: &rusqlite::Connection, id: i64, token: i64, ending: JobState) -> Result<()> {
    let row: Option<(String, Option<i64>)> = conn
        .query_row(
            "SELECT state, lease_token FROM jobs WHERE id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    match row {
        None => Err(StoreError::NotFound(format!("job {id}"))),
        Some((state, held)) if state == ending.as_str() && held == Some(token) => Ok(()),
        Some((state, _)) => Err(StoreError::Fenced(format!(
            "job {id} is {state} and no longer held by this claim"
        ))),
    }
}
