//! What a search's report reads in one go: every candidate the search submitted, in order,
//! with when it was submitted, its job's end and its latest evaluation (SQLite; the
//! PostgreSQL twin is in `postgres/searches.rs`).

use kiln_types::Evaluation;
use serde::Serialize;

use super::{Result, SqliteStore, corrupt};

/// One candidate of a search, with times.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimelineEntry {
    /// Order of submission within the search (1-based).
    pub seq: u64,
    /// Candidate id.
    pub candidate_id: String,
    /// Parent candidate, if any.
    pub parent: Option<String>,
    /// The proposer's note.
    pub note: Option<String>,
    /// When the search submitted it, ms since the epoch.
    pub submitted_at: i64,
    /// Its latest job's state.
    pub job_state: Option<String>,
    /// Why that job failed, for `failed`.
    pub job_error: Option<String>,
    /// When that job ended (done or failed), ms since the epoch.
    pub job_finished_at: Option<i64>,
    /// When its latest evaluation was stored, ms since the epoch (before `submitted_at`
    /// for a duplicate evaluated earlier, outside this search).
    pub evaluated_at: Option<i64>,
    /// That evaluation.
    pub evaluation: Option<Evaluation>,
}

type Row = (
    i64,
    String,
    Option<String>,
    Option<String>,
    i64,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<String>,
);

impl SqliteStore {
    /// Every candidate search `id` submitted, in submission order, with its times and its
    /// latest evaluation. Empty for an unknown search.
    pub fn search_timeline(&self, id: &str) -> Result<Vec<TimelineEntry>> {
        let conn = self.lock();
        let mut stmt = conn.prepare(
            "SELECT sc.seq, sc.candidate_id, c.parent, c.note, sc.created_at, j.state, j.error,
                    j.finished_at, e.created_at, e.evaluation_json
             FROM search_candidates sc
             JOIN candidates c ON c.id = sc.candidate_id
             LEFT JOIN jobs j ON j.id =
                 (SELECT max(j2.id) FROM jobs j2 WHERE j2.candidate_id = sc.candidate_id)
             LEFT JOIN evaluations e ON e.id =
                 (SELECT max(e2.id) FROM evaluations e2 WHERE e2.candidate_id = sc.candidate_id)
             WHERE sc.search_id = ?1 ORDER BY sc.seq",
        )?;
        let rows: Vec<Row> = stmt
            .query_map([id], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                    r.get(7)?,
                    r.get(8)?,
                    r.get(9)?,
                ))
            })?
            .collect::<std::result::Result<_, _>>()?;
        rows.into_iter()
            .map(
                |(seq, candidate_id, parent, note, submitted_at, state, error, ended, at, json)| {
                    let evaluation = json
                        .map(|j| {
                            serde_json::from_str(&j)
                                .map_err(|e| corrupt(format!("evaluation of {candidate_id}"), e))
                        })
                        .transpose()?;
                    Ok(TimelineEntry {
                        seq: u64::try_from(seq).unwrap_or(0),
                        candidate_id,
                        parent,
                        note,
                        submitted_at,
                        job_state: state,
                        job_error: error,
                        job_finished_at: ended,
                        evaluated_at: at,
                        evaluation,
                    })
                },
            )
            .collect()
    }
}
