//! Candidates, content-addressed, and their submission as jobs.

use kiln_types::BackendKind;
use kiln_types::{Candidate, Evaluation, JobOptions};
use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use super::jobs::{JOB_COLUMNS, JobRecord, job_from_row, options_json};
use super::{Result, SqliteStore, StoreError, corrupt, now_ms};

/// What a submission did.
#[derive(Debug, Clone, Serialize)]
pub struct Submitted {
    /// The candidate's content hash.
    pub id: String,
    /// The job evaluating it.
    pub job_id: i64,
    /// True if the same candidate was already stored; nothing new was queued.
    pub duplicate: bool,
}

/// A stored candidate with its latest job and evaluation.
#[derive(Debug, Clone, Serialize)]
pub struct CandidateRecord {
    /// Content hash.
    pub id: String,
    /// The candidate as submitted.
    pub candidate: Candidate,
    /// Backend it runs on.
    pub backend: String,
    /// Submission time, ms since the epoch.
    pub created_at: i64,
    /// Latest job.
    pub job: Option<JobRecord>,
    /// Latest evaluation, once there is one.
    pub evaluation: Option<Evaluation>,
}

impl CandidateRecord {
    /// How it was run: its evaluation's mode once it has one, else the mode its job will
    /// give it (`kiln_types::TrustMode::of`).
    pub fn trust(&self) -> kiln_types::TrustMode {
        let options = self.job.as_ref().and_then(|j| j.options.as_ref());
        self.evaluation.as_ref().map_or_else(
            || kiln_types::TrustMode::of(self.candidate.language, options),
            |e| e.trust,
        )
    }

    /// The median of its latest evaluation when that was timed on the cuda backend (what
    /// speedups against this GPU's baselines are computed from).
    pub fn cuda_median_us(&self) -> Option<f64> {
        self.evaluation
            .as_ref()
            .filter(|e| e.backend == BackendKind::Cuda)
            .and_then(|e| e.timing.as_ref())
            .map(|t| t.median_us)
    }
}

impl SqliteStore {
    /// Stores a candidate and queues a job for it, in one transaction. A candidate already
    /// stored (same content hash) is not queued again. With `search`, the candidate is also
    /// added to that search's archive (duplicates included: the search sees their results).
    /// The job goes to the search's class.
    pub fn submit(&self, candidate: &Candidate, search: Option<&str>) -> Result<Submitted> {
        self.submit_with(candidate, search, None, "")
    }

    /// [`SqliteStore::submit`] with options for the job (stored with it; a duplicate
    /// queues nothing, so its options are not used) and the class it is routed to (`""`:
    /// any class of its backend; a search's job goes to the search's class).
    pub fn submit_with(
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
        let mut conn = self.lock();
        let tx = conn.transaction()?;
        let known: bool = tx
            .query_row(
                "SELECT 1 FROM problems WHERE name = ?1",
                [&candidate.problem],
                |_| Ok(()),
            )
            .optional()?
            .is_some();
        if !known {
            return Err(StoreError::NotFound(format!(
                "problem {:?}",
                candidate.problem
            )));
        }
        let existing: Option<i64> = tx
            .query_row(
                "SELECT j.id FROM candidates c JOIN jobs j ON j.candidate_id = c.id
                 WHERE c.id = ?1 ORDER BY j.id DESC LIMIT 1",
                [&id],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(job_id) = existing {
            if let Some(sid) = search {
                link_to_search(&tx, sid, &id)?;
                tx.commit()?;
            }
            return Ok(Submitted {
                id,
                job_id,
                duplicate: true,
            });
        }
        let now = now_ms();
        tx.execute(
            "INSERT INTO candidates (id, problem, backend, candidate_json, parent, note, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![id, candidate.problem, backend, json, candidate.parent, candidate.note, now],
        )?;
        let search_class: Option<String> = match search {
            Some(sid) => tx
                .query_row("SELECT gpu_class FROM searches WHERE id = ?1", [sid], |r| {
                    r.get(0)
                })
                .optional()?,
            None => None,
        };
        let class = search_class
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| gpu_class.to_string());
        tx.execute(
            "INSERT INTO jobs (candidate_id, backend, state, created_at, search_id, options_json,
                               gpu_class)
             VALUES (?1, ?2, 'queued', ?3, ?4, ?5, ?6)",
            params![id, backend, now, search, options, class],
        )?;
        let job_id = tx.last_insert_rowid();
        if let Some(sid) = search {
            link_to_search(&tx, sid, &id)?;
        }
        tx.commit()?;
        Ok(Submitted {
            id,
            job_id,
            duplicate: false,
        })
    }

    /// A candidate by id (content hash), with its latest job and evaluation.
    pub fn get_candidate(&self, id: &str) -> Result<Option<CandidateRecord>> {
        let conn = self.lock();
        let row: Option<(String, String, i64)> = conn
            .query_row(
                "SELECT candidate_json, backend, created_at FROM candidates WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let Some((json, backend, created_at)) = row else {
            return Ok(None);
        };
        let candidate: Candidate =
            serde_json::from_str(&json).map_err(|e| corrupt(format!("candidate {id}"), e))?;
        let job = conn
            .query_row(
                &format!(
                    "SELECT {JOB_COLUMNS} FROM jobs WHERE candidate_id = ?1 ORDER BY id DESC LIMIT 1"
                ),
                [id],
                job_from_row,
            )
            .optional()?;
        let evaluation = latest_evaluation(&conn, id)?;
        Ok(Some(CandidateRecord {
            id: id.to_string(),
            candidate,
            backend,
            created_at,
            job,
            evaluation,
        }))
    }

    /// Ids of the newest candidates, optionally for one problem.
    pub fn list_candidates(&self, problem: Option<&str>, limit: u32) -> Result<Vec<String>> {
        let conn = self.lock();
        let mut stmt = conn.prepare(
            "SELECT id FROM candidates WHERE (?1 IS NULL OR problem = ?1)
             ORDER BY created_at DESC, id LIMIT ?2",
        )?;
        let ids = stmt
            .query_map(params![problem, limit], |r| r.get::<_, String>(0))?
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(ids)
    }
}

fn link_to_search(tx: &rusqlite::Transaction<'_>, search: &str, candidate: &str) -> Result<()> {
    tx.execute(
        "INSERT OR IGNORE INTO search_candidates (search_id, candidate_id, seq, created_at)
         VALUES (?1, ?2, (SELECT count(*) + 1 FROM search_candidates WHERE search_id = ?1), ?3)",
        params![search, candidate, now_ms()],
    )?;
    Ok(())
}

pub(super) fn latest_evaluation(
    conn: &rusqlite::Connection,
    candidate_id: &str,
) -> Result<Option<Evaluation>> {
    let json: Option<String> = conn
        .query_row(
            "SELECT evaluation_json FROM evaluations WHERE candidate_id = ?1 ORDER BY id DESC LIMIT 1",
            [candidate_id],
            |r| r.get(0),
        )
        .optional()?;
    json.map(|j| {
        serde_json::from_str(&j).map_err(|e| corrupt(format!("evaluation of {candidate_id}"), e))
    })
    .transpose()
}
