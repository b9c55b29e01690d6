//! Incumbents for racing: the smallest upper bound of a time's 95 % interval among the
//! `ok` evaluations that may rank as a best (not raced out, not plain), within a search or
//! for a problem on one backend.

use rusqlite::params;

use super::{Result, Store};

impl Store {
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

    /// The incumbent's upper bound (µs) among every evaluation of a problem on a backend.
    pub fn problem_incumbent_upper(&self, problem: &str, backend: &str) -> Result<Option<f64>> {
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

#[cfg(test)]
mod tests {
    use super::super::problems::sample_spec;
    use super::super::{Store, sample_search};
    use kiln_types::{Candidate, Evaluation, TimingStats, Verdict};

    fn cand(src: &str) -> Candidate {
        serde_json::from_value(serde_json::json!({
            "problem": "p", "language": "c", "source": src,
            "launches": [{"kernel": "f"}]
        }))
        .expect("candidate")
    }

    fn ok(median: f64, hi: f64, raced_out: bool, plain: bool) -> Evaluation {
        let mut e = Evaluation::early(Verdict::Ok, "host", "ok");
        e.timing = Some(TimingStats {
            median_us: median,
            mean_us: median,
            n: 10,
            ci_low_us: Some(median - 1.0),
            ci_high_us: Some(hi),
            raced_out,
            plain,
            ..TimingStats::default()
        });
        e
    }

    fn finish(store: &Store, job: i64, e: &Evaluation) {
        store.claim_next(&["host"]).expect("claim").expect("job");
        store.finish_job(job, e, 0.0, 0.0).expect("finish");
    }

    #[test]
    fn raced_out_and_plain_never_rank_or_race() {
        let (_d, store) = super::super::open_temp();
        store.put_problem(&sample_spec("p")).expect("problem");
        let search = sample_search(&store, "p");
        assert_eq!(store.search_incumbent_upper(&search).expect("q"), None);
        // A real best at 10 µs (upper 11), a raced-out one and a plain one with smaller
        // figures that must not count.
        let evals = [
            ("void f(){}", ok(10.0, 11.0, false, false)),
            ("void f(){ }\n//a", ok(5.0, 6.0, true, false)),
            ("void f(){ }\n//b", ok(4.0, 4.5, false, true)),
        ];
        for (src, e) in &evals {
            let sub = store.submit(&cand(src), Some(&search)).expect("submit");
            finish(&store, sub.job_id, e);
        }
        assert_eq!(
            store.search_incumbent_upper(&search).expect("q"),
            Some(11.0)
        );
        assert_eq!(
            store.problem_incumbent_upper("p", "host").expect("q"),
            Some(11.0)
        );
        assert_eq!(store.problem_incumbent_upper("p", "cuda").expect("q"), None);
        let rec = store.get_search(&search).expect("get").expect("search");
        let best = rec.best.expect("a best");
        assert_eq!(best.1, 10.0);
        assert_eq!(best.0, cand("void f(){}").content_hash());
    }

    #[test]
    fn another_job_for_a_stored_candidate() {
        let (_d, store) = super::super::open_temp();
        store.put_problem(&sample_spec("p")).expect("problem");
        let sub = store.submit(&cand("void f(){}"), None).expect("submit");
        finish(&store, sub.job_id, &ok(10.0, 11.0, false, false));
        let opts: kiln_types::JobOptions =
            serde_json::from_str(r#"{"plain": 50}"#).expect("options");
        let again = store
            .queue_job(&sub.id, Some(&opts))
            .expect("queue another");
        assert_ne!(again, sub.job_id);
        let job = store.claim_next(&["host"]).expect("claim").expect("job");
        assert_eq!(job.id, again);
        assert_eq!(job.options, Some(opts));
        assert!(store.job_evaluation(again).expect("q").is_none());
        store
            .finish_job(again, &ok(8.0, 9.0, false, true), 0.0, 0.0)
            .expect("finish");
        let e = store.job_evaluation(again).expect("q").expect("evaluation");
        assert!(e.timing.expect("timing").plain);
        assert!(store.queue_job("nope", None).is_err());
    }
}
