//! Incumbents for racing: the smallest upper bound of a time's 95 % interval among the
//! `ok` evaluations that may rank as a best (not raced out, not plain), within a search or
//! for a problem on one backend.

use rusqlite::params;

use super::{Result, SqliteStore};

impl SqliteStore {
    /// The incumbent's upper bound (µs) within a search, if it has an `ok` evaluation.
    pub fn search_incumbent_upper(&self, search_id: &str) -> Result<Option<f64>> {
        Ok(self.lock().query_row(
            "SELECT min(e.upper_us) FROM evaluations e
             JOIN search_candidates sc ON sc.candidate_id = e.candidate_id
             WHERE sc.search_id = ?1 AND e.verdict = 'ok' AND e.raced_out = 0 AND e.plain = 0",
            [search_id],
            |r| r.get(0),
        )?)
    }

    /// The incumbent's upper bound (µs) among every evaluation of a problem on a backend
    /// (one host has one class per backend, so `_gpu_class` does not narrow it here).
    pub fn problem_incumbent_upper(
        &self,
        problem: &str,
        backend: &str,
        _gpu_class: &str,
    ) -> Result<Option<f64>> {
        Ok(self.lock().query_row(
            "SELECT min(e.upper_us) FROM evaluations e
             JOIN candidates c ON c.id = e.candidate_id
             WHERE c.problem = ?1 AND c.backend = ?2 AND e.verdict = 'ok'
               AND e.raced_out = 0 AND e.plain = 0",
            params![problem, backend],
            |r| r.get(0),
        )?)
    }
}
