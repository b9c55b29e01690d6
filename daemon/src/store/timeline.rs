//! What a search's report reads in one go: every candidate the search submitted, in order,
//! with when it was submitted, its job's end and its latest evaluation.

use kiln_types::Evaluation;
use serde::Serialize;

use super::{Result, Store, corrupt};

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

impl Store {
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

#[cfg(test)]
mod tests {
    use kiln_types::{Candidate, Evaluation, TimingStats, Verdict};

    use super::super::problems::sample_spec;

    fn cand(n: u32, parent: Option<&str>) -> Candidate {
        serde_json::from_value(serde_json::json!({
            "problem": "p", "language": "c", "source": format!("void f(){{ /* {n} */ }}"),
            "launches": [{"kernel": "f"}], "parent": parent, "note": format!("step {n}")
        }))
        .expect("candidate")
    }

    #[test]
    fn timeline_lists_submissions_in_order_with_their_evaluations() {
        let (_d, store) = super::super::open_temp();
        store.put_problem(&sample_spec("p")).expect("problem");
        let id = super::super::sample_search(&store, "p");
        let a = store.submit(&cand(0, None), Some(&id)).expect("a");
        let b = store.submit(&cand(1, Some(&a.id)), Some(&id)).expect("b");
        let job = store.claim_next(&["host"]).expect("claim").expect("job");
        assert_eq!(job.id, a.job_id);
        let mut e = Evaluation::early(Verdict::Ok, "host", "fine");
        e.timing = Some(TimingStats {
            median_us: 5.0,
            samples_us: vec![5.0, 5.5],
            ..TimingStats::default()
        });
        store.finish_job(a.job_id, &e, 1.0, 2.0).expect("finish");
        let t = store.search_timeline(&id).expect("timeline");
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].seq, t[1].seq), (1, 2));
        assert_eq!(t[0].candidate_id, a.id);
        assert_eq!(t[0].evaluation.as_ref(), Some(&e), "samples read back");
        assert!(t[0].evaluated_at.is_some_and(|at| at >= t[0].submitted_at));
        assert_eq!(t[0].job_state.as_deref(), Some("done"));
        assert_eq!(t[0].job_finished_at, t[0].evaluated_at);
        assert_eq!(t[1].candidate_id, b.id);
        assert_eq!(t[1].parent.as_deref(), Some(a.id.as_str()));
        assert_eq!(t[1].note.as_deref(), Some("step 1"));
        assert_eq!(
            (t[1].job_state.as_deref(), &t[1].evaluation),
            (Some("queued"), &None)
        );
        assert!(
            store
                .search_timeline("s-missing")
                .expect("empty")
                .is_empty()
        );
    }
}
