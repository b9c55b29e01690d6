//! The shared job queue on PostgreSQL.
//!
//! - **Enqueue** (in the submit transaction): the job gets a start-time fair queuing tag
//!   `vt = max(flow's finish tag, the class's virtual time)`, and the flow's finish tag
//!   becomes `vt + 1 / weight`, where a flow is a search (or the pool of single
//!   submissions) on one GPU class and the virtual time is the smallest tag still queued
//!   in the class (the newest one when none is). A search arriving late starts at the
//!   current virtual time; a weight-2 search gets twice the share.
//! - **Claim**: `ORDER BY vt, id LIMIT 1 FOR UPDATE SKIP LOCKED` among the jobs of the
//!   node's classes (or routed to any class of its backends), under a lease with a fresh
//!   token from a sequence. No attempt is counted.
//! - **Fencing**: every later write (compiled, evaluation start, done, failed, requeue)
//!   names the token; a write with a stale token changes nothing (`Fenced`).
//! - **Done / failed** take a number from the `finish_seq` sequence and `NOTIFY` listeners,
//!   which read what finished since the last number they saw.

use kiln_types::{Candidate, Evaluation, JobOptions};
use tokio_postgres::Row;

use super::{FINISHED_CHANNEL, PgStore, QUEUED_CHANNEL, col, pg_err, to_u64};
use crate::store::jobs::options_json;
use crate::store::{
    JobRecord, JobState, LaneClass, Recovery, Result, StoreError, Submitted, corrupt, now_ms,
};

pub(super) const JOB_COLUMNS: &str = "id, candidate_id, backend, state, lane, attempts, error, \
     created_at, started_at, finished_at, compile_ms, eval_ms, search_id, options_json, \
     gpu_class, node, lease_token";

pub(super) fn job_from_row(r: &Row) -> Result<JobRecord> {
    let state: String = col(r, "state")?;
    let options: Option<String> = col(r, "options_json")?;
    Ok(JobRecord {
        id: col(r, "id")?,
        candidate_id: col(r, "candidate_id")?,
        backend: col(r, "backend")?,
        state: JobState::parse(&state).unwrap_or(JobState::Failed),
        lane: col::<Option<i32>>(r, "lane")?.and_then(|l| u32::try_from(l).ok()),
        attempts: u32::try_from(col::<i32>(r, "attempts")?).unwrap_or(0),
        error: col(r, "error")?,
        created_at: col(r, "created_at")?,
        started_at: col(r, "started_at")?,
        finished_at: col(r, "finished_at")?,
        compile_ms: col(r, "compile_ms")?,
        eval_ms: col(r, "eval_ms")?,
        search_id: col(r, "search_id")?,
        options: options
            .map(|j| serde_json::from_str(&j))
            .transpose()
            .map_err(|e| corrupt("job options", e))?,
        gpu_class: col(r, "gpu_class")?,
        node: col(r, "node")?,
        lease_token: col::<Option<i64>>(r, "lease_token")?.unwrap_or(0),
    })
}

/// A job that finished (done or failed), as listeners read it.
#[derive(Debug, Clone)]
pub struct Finished {
    /// Its number in finishing order.
    pub seq: i64,
    /// The job.
    pub job_id: i64,
    /// Its candidate.
    pub candidate_id: String,
    /// The candidate's problem.
    pub problem: String,
    /// The search that queued it.
    pub search_id: Option<String>,
    /// `done` or `failed`.
    pub state: JobState,
    /// The lane of its evaluation.
    pub lane: Option<u32>,
    /// The node that held it.
    pub node: Option<String>,
    /// The verdict, when done.
    pub verdict: Option<String>,
    /// The median, µs, when timed.
    pub median_us: Option<f64>,
    /// Why it failed.
    pub error: Option<String>,
}

/// The statement that gives a new job its fair queuing tag (its start tag: the later of
/// its flow's last finish tag and the class's virtual time) and moves the flow's finish
/// tag on by `1 / weight`.
const ENQUEUE_TAG: &str = "
    WITH cur AS (
        SELECT coalesce(
            (SELECT min(vt) FROM jobs WHERE state = 'queued' AND gpu_class = $2),
            (SELECT max(vt) FROM jobs WHERE gpu_class = $2),
            0) AS v)
    INSERT INTO queue_flows (flow, gpu_class, last_vt)
    SELECT $1, $2, cur.v + 1.0 / $3::float8 FROM cur
    ON CONFLICT (flow, gpu_class) DO UPDATE
        SET last_vt = greatest(queue_flows.last_vt, (SELECT v FROM cur)) + 1.0 / $3::float8
    RETURNING last_vt - 1.0 / $3::float8 AS start_tag";

impl PgStore {
    /// Stores a candidate and queues a job for it (see [`PgStore::submit_with`]).
    pub async fn submit(&self, candidate: &Candidate, search: Option<&str>) -> Result<Submitted> {
        self.submit_with(candidate, search, None, "").await
    }

    /// Stores a candidate and queues a job for it, in one transaction: a stored
    /// candidate is not queued again (a search still gets it in its archive). A search's
    /// job goes to the search's class with the search's weight; others to `gpu_class`.
    pub async fn submit_with(
        &self,
        candidate: &Candidate,
        search: Option<&str>,
        options: Option<&JobOptions>,
        gpu_class: &str,
    ) -> Result<Submitted> {
        let options = options_json(options)?;
        let id = candidate.content_hash();
        let backend = candidate.language.backend().as_str();
        let json = serde_json::to_string(candidate).map_err(|e| corrupt("candidate", e))?;
        let mut c = self.conn().await?;
        let tx = c.transaction().await.map_err(pg_err)?;
        let known = tx
            .query_opt(
                "SELECT 1 FROM problems WHERE name = $1",
                &[&candidate.problem],
            )
            .await
            .map_err(pg_err)?
            .is_some();
        if !known {
            return Err(StoreError::NotFound(format!(
                "problem {:?}",
                candidate.problem
            )));
        }
        // A search's submissions are serialised on its row (archive order, flow tag).
        let search_row = match search {
            Some(sid) => Some(
                tx.query_opt(
                    "SELECT gpu_class, weight FROM searches WHERE id = $1 FOR UPDATE",
                    &[&sid],
                )
                .await
                .map_err(pg_err)?
                .ok_or_else(|| StoreError::NotFound(format!("search {sid:?}")))?,
            ),
            None => None,
        };
        let existing = tx
            .query_opt(
                "SELECT id FROM jobs WHERE candidate_id = $1 ORDER BY id DESC LIMIT 1",
                &[&id],
            )
            .await
            .map_err(pg_err)?;
        if let Some(row) = existing {
            let job_id: i64 = col(&row, "id")?;
            if let Some(sid) = search {
                link_to_search(&tx, sid, &id).await?;
            }
            tx.commit().await.map_err(pg_err)?;
            return Ok(Submitted {
                id,
                job_id,
                duplicate: true,
            });
        }
        let (class, weight) = match &search_row {
            Some(r) => {
                let c: String = col(r, "gpu_class")?;
                let w: f64 = col(r, "weight")?;
                (
                    if c.is_empty() {
                        gpu_class.to_string()
                    } else {
                        c
                    },
                    w,
                )
            }
            None => (gpu_class.to_string(), 1.0),
        };
        let now = now_ms();
        tx.execute(
            "INSERT INTO candidates (id, problem, backend, candidate_json, parent, note, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[
                &id,
                &candidate.problem,
                &backend,
                &json,
                &candidate.parent,
                &candidate.note,
                &now,
            ],
        )
        .await
        .map_err(pg_err)?;
        let job_id = insert_job(
            &tx,
            &id,
            backend,
            search,
            options.as_deref(),
            &class,
            weight,
        )
        .await?;
        if let Some(sid) = search {
            link_to_search(&tx, sid, &id).await?;
        }
        tx.commit().await.map_err(pg_err)?;
        Ok(Submitted {
            id,
            job_id,
            duplicate: false,
        })
    }

    /// Queues another evaluation of a stored candidate; returns the job id.
    pub async fn queue_job(
        &self,
        candidate_id: &str,
        options: Option<&JobOptions>,
        gpu_class: &str,
    ) -> Result<i64> {
        let options = options_json(options)?;
        let mut c = self.conn().await?;
        let tx = c.transaction().await.map_err(pg_err)?;
        let backend: String = tx
            .query_opt(
                "SELECT backend FROM candidates WHERE id = $1",
                &[&candidate_id],
            )
            .await
            .map_err(pg_err)?
            .map(|r| col(&r, "backend"))
            .transpose()?
            .ok_or_else(|| StoreError::NotFound(format!("candidate {candidate_id:?}")))?;
        let id = insert_job(
            &tx,
            candidate_id,
            &backend,
            None,
            options.as_deref(),
            gpu_class,
            1.0,
        )
        .await?;
        tx.commit().await.map_err(pg_err)?;
        Ok(id)
    }

    /// A job by id.
    pub async fn get_job(&self, id: i64) -> Result<Option<JobRecord>> {
        self.row(
            &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1"),
            &[&id],
        )
        .await?
        .map(|r| job_from_row(&r))
        .transpose()
    }

    /// Claims the next job for one of `lanes`' classes (or routed to any class of their
    /// backends), fairest tag first, skipping rows other nodes are claiming and jobs
    /// pinned to a lane this node does not have: `compiling` under a fresh lease held by
    /// this node. No attempt is counted. A job whose evaluations were cut short
    /// `max_attempts` times is not claimed: it waits for an attempt to be given back (its
    /// node was slow, not dead) or for the reaper to fail it.
    pub async fn claim_next(&self, lanes: &[LaneClass]) -> Result<Option<JobRecord>> {
        if lanes.is_empty() {
            return Ok(None);
        }
        let backends: Vec<&str> = lanes.iter().map(|l| l.backend.as_str()).collect();
        let classes: Vec<&str> = lanes.iter().map(|l| l.class.as_str()).collect();
        let counts: Vec<i64> = lanes.iter().map(|l| i64::from(l.lanes)).collect();
        let row = self
            .row(
                &format!(
                    "WITH pick AS (
                         SELECT id FROM jobs
                         WHERE state = 'queued' AND backend = ANY($1)
                           AND attempts < $7
                           AND (gpu_class = ANY($2) OR gpu_class = '')
                           AND (options_json IS NULL
                                OR (options_json::jsonb ->> 'lane') IS NULL
                                OR (options_json::jsonb ->> 'lane')::bigint
                                   < coalesce((SELECT m.n FROM unnest($1::text[], $6::bigint[]) AS m(b, n)
                                               WHERE m.b = jobs.backend LIMIT 1), 0))
                         ORDER BY vt, id LIMIT 1
                         FOR UPDATE SKIP LOCKED)
                     UPDATE jobs SET state = 'compiling', started_at = $3, node = $4,
                            lease_token = nextval('lease_tokens'),
                            lease_until = now() + make_interval(secs => $5),
                            gpu_class = CASE WHEN jobs.gpu_class <> '' THEN jobs.gpu_class
                                ELSE coalesce((SELECT m.c FROM unnest($1::text[], $2::text[]) AS m(b, c)
                                               WHERE m.b = jobs.backend LIMIT 1), '') END
                     FROM pick WHERE jobs.id = pick.id
                     RETURNING {}",
                    JOB_COLUMNS
                        .split(", ")
                        .map(|c| format!("jobs.{c}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                &[
                    &backends,
                    &classes,
                    &now_ms(),
                    &self.node,
                    &self.lease(),
                    &counts,
                    &self.max_attempts,
                ],
            )
            .await?;
        row.map(|r| job_from_row(&r)).transpose()
    }

    /// A claimed job is compiled and waits for a lane.
    pub async fn mark_compiled(&self, id: i64, token: i64) -> Result<()> {
        self.exec(
            "UPDATE jobs SET state = 'compiled'
             WHERE id = $1 AND lease_token = $2 AND state = 'compiling'",
            &[&id, &token],
        )
        .await?;
        Ok(())
    }

    /// The job's evaluation starts on `lane`; the attempt counts. False when the lease is
    /// no longer this claim's.
    pub async fn start_evaluation(&self, id: i64, token: i64, lane: u32) -> Result<bool> {
        let lane = i32::try_from(lane).unwrap_or(i32::MAX);
        let n = self
            .exec(
                "UPDATE jobs SET state = 'running', lane = $3, attempts = attempts + 1
                 WHERE id = $1 AND lease_token = $2 AND state IN ('compiling', 'compiled')",
                &[&id, &token, &lane],
            )
            .await?;
        Ok(n == 1)
    }

    /// Stores the evaluation and marks the job done in one transaction, fenced by the
    /// token; the evaluation records the node and class that held the job.
    pub async fn finish_job(
        &self,
        id: i64,
        token: i64,
        evaluation: &Evaluation,
        compile_ms: f64,
        eval_ms: f64,
    ) -> Result<()> {
        let json = serde_json::to_string(evaluation).map_err(|e| corrupt("evaluation", e))?;
        let timing = evaluation.timing.as_ref();
        let mut c = self.conn().await?;
        let tx = c.transaction().await.map_err(pg_err)?;
        let now = now_ms();
        let held = tx
            .query_opt(
                "UPDATE jobs SET state = 'done', finished_at = $3, compile_ms = $4, eval_ms = $5,
                        error = NULL, lease_until = NULL, finish_seq = nextval('finish_seq'),
                        lapsed = '{}'
                 WHERE id = $1 AND lease_token = $2
                   AND state IN ('compiling', 'compiled', 'running')
                 RETURNING candidate_id, node, gpu_class",
                &[&id, &token, &now, &compile_ms, &eval_ms],
            )
            .await
            .map_err(pg_err)?;
        let Some(held) = held else {
            drop(tx);
            return self.fenced(id, token, JobState::Done).await;
        };
        let candidate_id: String = col(&held, "candidate_id")?;
        let node: Option<String> = col(&held, "node")?;
        let class: String = col(&held, "gpu_class")?;
        tx.execute(
            "INSERT INTO evaluations (candidate_id, job_id, verdict, median_us, evaluation_json,
                                      created_at, raced_out, plain, upper_us, node, gpu_class)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            &[
                &candidate_id,
                &id,
                &evaluation.verdict.as_str(),
                &timing.map(|t| t.median_us),
                &json,
                &now,
                &timing.is_some_and(|t| t.raced_out),
                &timing.is_some_and(|t| t.plain),
                &timing.map(|t| t.interval95().1).filter(|u| u.is_finite()),
                &node,
                &class,
            ],
        )
        .await
        .map_err(pg_err)?;
        tx.execute("SELECT pg_notify($1, '')", &[&FINISHED_CHANNEL])
            .await
            .map_err(pg_err)?;
        tx.commit().await.map_err(pg_err)?;
        Ok(())
    }

    /// A write that would end job `id` found it no longer held by claim `token`: `Ok`
    /// when the job already ended as `ending` under that same claim (this write is a
    /// retry of one that committed but whose answer was lost with the connection), else
    /// why the write was refused (`Fenced`).
    async fn fenced(&self, id: i64, token: i64, ending: JobState) -> Result<()> {
        match self
            .row(
                "SELECT state, node, lease_token FROM jobs WHERE id = $1",
                &[&id],
            )
            .await
        {
            Ok(Some(r)) => {
                let state: String = col(&r, "state").unwrap_or_default();
                let node: Option<String> = col(&r, "node").unwrap_or_default();
                let held: Option<i64> = col(&r, "lease_token").unwrap_or_default();
                if state == ending.as_str() && held == Some(token) {
                    tracing::info!(
                        job = id,
                        state,
                        "the job's end was already recorded by this claim (a retried write)"
                    );
                    return Ok(());
                }
                Err(StoreError::Fenced(format!(
                    "job {id} is {state}{} and no longer held by this claim",
                    node.map(|n| format!(" (node {n})")).unwrap_or_default()
                )))
            }
            Ok(None) => Err(StoreError::NotFound(format!("job {id}"))),
            Err(e) => Err(e),
        }
    }

    /// The evaluation a job produced, once it is done.
    pub async fn job_evaluation(&self, job_id: i64) -> Result<Option<Evaluation>> {
        let row = self
            .row(
                "SELECT evaluation_json FROM evaluations WHERE job_id = $1",
                &[&job_id],
            )
            .await?;
        row.map(|r| {
            let json: String = col(&r, "evaluation_json")?;
            serde_json::from_str(&json)
                .map_err(|e| corrupt(format!("evaluation of job {job_id}"), e))
        })
        .transpose()
    }

    /// Marks a job failed (kiln's failure), fenced by the token.
    pub async fn fail_job(&self, id: i64, token: i64, error: &str) -> Result<()> {
        let mut c = self.conn().await?;
        let tx = c.transaction().await.map_err(pg_err)?;
        let n = tx
            .execute(
                "UPDATE jobs SET state = 'failed', error = $3, finished_at = $4,
                        lease_until = NULL, finish_seq = nextval('finish_seq'), lapsed = '{}'
                 WHERE id = $1 AND lease_token = $2 AND state NOT IN ('done', 'failed')",
                &[&id, &token, &error, &now_ms()],
            )
            .await
            .map_err(pg_err)?;
        if n == 0 {
            drop(tx);
            return self.fenced(id, token, JobState::Failed).await;
        }
        tx.execute("SELECT pg_notify($1, '')", &[&FINISHED_CHANNEL])
            .await
            .map_err(pg_err)?;
        tx.commit().await.map_err(pg_err)?;
        Ok(())
    }

    /// Puts a claimed job back in the queue without counting anything (a running one gets
    /// its attempt back), if the lease is still this claim's.
    pub async fn requeue_job(&self, id: i64, token: i64) -> Result<()> {
        self.exec(
            "UPDATE jobs SET state = 'queued', lease_token = NULL, lease_until = NULL,
                    attempts = CASE WHEN state = 'running' THEN greatest(attempts - 1, 0)
                                    ELSE attempts END
             WHERE id = $1 AND lease_token = $2 AND state IN ('compiling', 'compiled', 'running')",
            &[&id, &token],
        )
        .await?;
        Ok(())
    }

    /// At this node's start: the jobs it held when it stopped are queued again (waiting
    /// ones as they are; ones cut short in their evaluation counted, and failed once their
    /// evaluation has been started `max_attempts` times). The process that held them is
    /// gone for sure, so nothing is given back.
    pub async fn recover_interrupted(&self, max_attempts: u32) -> Result<Recovery> {
        let max = i32::try_from(max_attempts).unwrap_or(i32::MAX);
        let rows = self
            .rows(
                "WITH old AS (
                     SELECT id, state FROM jobs
                     WHERE state IN ('compiling', 'compiled', 'running') AND node = $1
                     FOR UPDATE SKIP LOCKED)
                 UPDATE jobs SET
                     state = CASE WHEN jobs.state = 'running' AND jobs.attempts >= $2 THEN 'failed'
                                  ELSE 'queued' END,
                     error = CASE WHEN jobs.state = 'running' AND jobs.attempts >= $2
                                  THEN 'kiln stopped during this job''s evaluation ' || jobs.attempts
                                       || ' times (last on node ' || coalesce(jobs.node, '?')
                                       || '); giving up'
                                  ELSE jobs.error END,
                     finished_at = CASE WHEN jobs.state = 'running' AND jobs.attempts >= $2 THEN $3
                                        ELSE jobs.finished_at END,
                     finish_seq = CASE WHEN jobs.state = 'running' AND jobs.attempts >= $2
                                       THEN nextval('finish_seq') ELSE jobs.finish_seq END,
                     lease_token = NULL, lease_until = NULL
                 FROM old WHERE jobs.id = old.id
                 RETURNING old.state AS was, jobs.state AS now",
                &[&self.node, &max, &now_ms()],
            )
            .await?;
        let r = tally(&rows)?;
        if r.failed > 0 {
            self.exec("SELECT pg_notify($1, '')", &[&FINISHED_CHANNEL])
                .await?;
        }
        Ok(r)
    }

    /// Every node's reaper: jobs whose lease ran out (their node died, stalled or lost the
    /// database) are queued again. A running one keeps its attempt for now and records
    /// the process that held it: when that process's heartbeat comes back, it was slow,
    /// not dead, and the attempt is given back ([`PgStore::heartbeat`]). A job whose
    /// evaluation was cut short `max_attempts` times waits unclaimed for one lease after
    /// its last lapse, then fails. A database that restarted gives every node one lease
    /// to renew before anything is reaped.
    pub async fn reap_expired(&self, max_attempts: u32) -> Result<Recovery> {
        let max = i32::try_from(max_attempts).unwrap_or(i32::MAX);
        let rows = self
            .rows(
                &format!(
                    "WITH old AS (
                         SELECT id, state FROM jobs
                         WHERE state IN ('compiling', 'compiled', 'running')
                           AND {}
                         FOR UPDATE SKIP LOCKED)
                     UPDATE jobs SET
                         state = 'queued',
                         lapsed = CASE WHEN jobs.state = 'running'
                                       THEN jobs.lapsed || coalesce(
                                           (SELECT n.instance FROM nodes n WHERE n.id = jobs.node), '?')
                                       ELSE jobs.lapsed END,
                         lapsed_at = CASE WHEN jobs.state = 'running' THEN now()
                                          ELSE jobs.lapsed_at END,
                         lease_token = NULL, lease_until = NULL
                     FROM old WHERE jobs.id = old.id
                     RETURNING old.state AS was, jobs.state AS now",
                    super::lease_ran_out("lease_until", "$1")
                ),
                &[&self.lease()],
            )
            .await?;
        let mut r = tally(&rows)?;
        let failed = self
            .exec(
                "UPDATE jobs SET state = 'failed',
                        error = 'kiln stopped during this job''s evaluation ' || attempts
                                || ' times (last on node ' || coalesce(node, '?') || '); giving up',
                        finished_at = $3, finish_seq = nextval('finish_seq'), lapsed = '{}'
                 WHERE state = 'queued' AND attempts >= $1
                   AND (lapsed_at IS NULL OR lapsed_at < now() - make_interval(secs => $2))",
                &[&max, &self.lease(), &now_ms()],
            )
            .await?;
        r.failed = usize::try_from(failed).unwrap_or(usize::MAX);
        if r.failed > 0 {
            self.exec("SELECT pg_notify($1, '')", &[&FINISHED_CHANNEL])
                .await?;
        }
        Ok(r)
    }

    /// Number of jobs in each state (every state listed).
    pub async fn job_counts(&self) -> Result<Vec<(JobState, i64)>> {
        let rows = self
            .rows("SELECT state, count(*) AS n FROM jobs GROUP BY state", &[])
            .await?;
        let mut counts: Vec<(String, i64)> = Vec::new();
        for r in &rows {
            counts.push((col(r, "state")?, col(r, "n")?));
        }
        Ok(JobState::ALL
            .iter()
            .map(|s| {
                let n = counts
                    .iter()
                    .find(|(name, _)| name == s.as_str())
                    .map_or(0, |(_, n)| *n);
                (*s, n)
            })
            .collect())
    }

    /// Unfinished jobs of a search (its backpressure cap counts them).
    pub async fn search_queued(&self, id: &str) -> Result<u64> {
        let row = self
            .row(
                "SELECT count(*) AS n FROM jobs WHERE search_id = $1 AND state NOT IN ('done', 'failed')",
                &[&id],
            )
            .await?;
        Ok(to_u64(row.map(|r| col(&r, "n")).transpose()?.unwrap_or(0)))
    }

    /// Jobs that finished after number `after`, in order, at most `limit`.
    pub async fn finished_since(&self, after: i64, limit: i64) -> Result<Vec<Finished>> {
        let rows = self
            .rows(
                "SELECT j.finish_seq, j.id, j.candidate_id, c.problem, j.search_id, j.state, j.lane,
                        j.node, j.error, e.verdict, e.median_us
                 FROM jobs j JOIN candidates c ON c.id = j.candidate_id
                 LEFT JOIN evaluations e ON e.job_id = j.id
                 WHERE j.finish_seq > $1 ORDER BY j.finish_seq LIMIT $2",
                &[&after, &limit],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let state: String = col(r, "state")?;
                Ok(Finished {
                    seq: col(r, "finish_seq")?,
                    job_id: col(r, "id")?,
                    candidate_id: col(r, "candidate_id")?,
                    problem: col(r, "problem")?,
                    search_id: col(r, "search_id")?,
                    state: JobState::parse(&state).unwrap_or(JobState::Failed),
                    lane: col::<Option<i32>>(r, "lane")?.and_then(|l| u32::try_from(l).ok()),
                    node: col(r, "node")?,
                    verdict: col(r, "verdict")?,
                    median_us: col(r, "median_us")?,
                    error: col(r, "error")?,
                })
            })
            .collect()
    }

    /// The newest finish number (listeners start from it).
    pub async fn last_finish_seq(&self) -> Result<i64> {
        let row = self
            .row(
                "SELECT coalesce(max(finish_seq), 0)::bigint AS s FROM jobs",
                &[],
            )
            .await?;
        Ok(row.map(|r| col(&r, "s")).transpose()?.unwrap_or(0))
    }
}

/// Counts what a release did, from its `was`/`now` rows.
fn tally(rows: &[Row]) -> Result<Recovery> {
    let mut r = Recovery::default();
    for row in rows {
        let was: String = col(row, "was")?;
        let now: String = col(row, "now")?;
        match (was.as_str(), now.as_str()) {
            (_, "failed") => r.failed += 1,
            ("running", _) => r.requeued += 1,
            _ => r.waiting += 1,
        }
    }
    Ok(r)
}

/// Inserts a queued job with its fair queuing tag; returns its id.
async fn insert_job(
    tx: &deadpool_postgres::Transaction<'_>,
    candidate_id: &str,
    backend: &str,
    search: Option<&str>,
    options: Option<&str>,
    class: &str,
    weight: f64,
) -> Result<i64> {
    let flow = search.unwrap_or("");
    let weight = if weight.is_finite() && weight > 0.0 {
        weight
    } else {
        1.0
    };
    let vt: f64 = tx
        .query_one(ENQUEUE_TAG, &[&flow, &class, &weight])
        .await
        .map_err(pg_err)?
        .get(0);
    let row = tx
        .query_one(
            "INSERT INTO jobs (candidate_id, backend, state, created_at, search_id, options_json,
                               gpu_class, vt)
             VALUES ($1, $2, 'queued', $3, $4, $5, $6, $7) RETURNING id",
            &[
                &candidate_id,
                &backend,
                &now_ms(),
                &search,
                &options,
                &class,
                &vt,
            ],
        )
        .await
        .map_err(pg_err)?;
    tx.execute("SELECT pg_notify($1, $2)", &[&QUEUED_CHANNEL, &class])
        .await
        .map_err(pg_err)?;
    col(&row, "id")
}

/// Adds a candidate to a search's archive (once).
async fn link_to_search(
    tx: &deadpool_postgres::Transaction<'_>,
    search: &str,
    candidate: &str,
) -> Result<()> {
    tx.execute(
        "INSERT INTO search_candidates (search_id, candidate_id, seq, created_at)
         VALUES ($1, $2, (SELECT count(*) + 1 FROM search_candidates WHERE search_id = $1), $3)
         ON CONFLICT (search_id, candidate_id) DO NOTHING",
        &[&search, &candidate, &now_ms()],
    )
    .await
    .map_err(pg_err)?;
    Ok(())
}
