//! A job's options applied to its evaluation plan ([`kiln_types::EvalPlan`]): plain
//! timing, the race bound, and whether a hosted file's launches are recorded for lifting.
//!
//! A job's options (stored with it) may ask for plain timing or to race an incumbent.
//! Jobs of a search race the search's best when `search.race` is on. The incumbent's
//! bound is read when the job reaches its lane, so it is the best known at that moment.

use kiln_types::{EvalPlan, RaceBound, RaceTarget};

use crate::config::Config;
use crate::store::{JobRecord, Store, StoreError};

/// `plan` with the job's plain timing and race bound filled in.
pub async fn apply_job_options(
    store: &Store,
    config: &Config,
    job: &JobRecord,
    problem: &str,
    mut plan: EvalPlan,
) -> Result<EvalPlan, StoreError> {
    let options = job.options.clone().unwrap_or_default();
    plan.plain = options.plain;
    // A hosted file's launches are recorded for lifting unless the job asks for hosted
    // only (the worker records only where it can: a `ModelNew` file on a GPU).
    plan.record_launches = options.lift.unwrap_or(true);
    let margin = options.race_margin.unwrap_or(config.search.race_margin);
    // Options were checked when the job was queued; a target that no longer parses
    // (a hand-edited database) runs without racing.
    let upper = match options.race_target().ok().flatten() {
        Some(RaceTarget::Upper(u)) => Some(u),
        Some(RaceTarget::ProblemBest) => {
            store
                .problem_incumbent_upper(problem, &job.backend, &job.gpu_class)
                .await?
        }
        None => match &job.search_id {
            Some(search) if config.search.race && plan.plain.is_none() => {
                store.search_incumbent_upper(search).await?
            }
            _ => None,
        },
    };
    plan.race = upper
        .filter(|u| u.is_finite() && *u > 0.0)
        .map(|incumbent_upper_us| RaceBound {
            incumbent_upper_us,
            margin,
        });
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{LaneClass, open_temp, sample_search, sample_spec};
    use kiln_types::{Candidate, Evaluation, JobOptions, TimingStats, Verdict};

    fn cand(src: &str) -> Candidate {
        serde_json::from_value(serde_json::json!({
            "problem": "p", "language": "c", "source": src, "launches": [{"kernel": "f"}]
        }))
        .expect("candidate")
    }

    fn ok(hi: f64) -> Evaluation {
        let mut e = Evaluation::early(Verdict::Ok, kiln_types::BackendKind::Host, "ok");
        e.timing = Some(TimingStats {
            median_us: hi - 1.0,
            mean_us: hi - 1.0,
            n: 10,
            ci_low_us: Some(hi - 2.0),
            ci_high_us: Some(hi),
            ..TimingStats::default()
        });
        e
    }

    #[tokio::test]
    async fn search_jobs_race_the_search_best_and_single_jobs_only_when_asked() {
        let host = [LaneClass {
            backend: "host".into(),
            class: "host/test".into(),
            lanes: 1,
        }];
        let (_d, store) = open_temp();
        store.put_problem(&sample_spec("p")).await.expect("problem");
        let search = sample_search(&store, "p").await;
        // The search's first candidate: nothing to race yet.
        let first = store
            .submit(&cand("void f(){}"), Some(&search))
            .await
            .expect("submit");
        let job = store.claim_next(&host).await.expect("claim").expect("job");
        let mut config = Config::default();
        let plan = apply_job_options(&store, &config, &job, "p", EvalPlan::default())
            .await
            .expect("plan");
        assert_eq!((plan.race, plan.plain), (None, None));
        store
            .finish_job(first.job_id, job.lease_token, &ok(11.0), 0.0, 0.0)
            .await
            .expect("finish");

        // The next one races the best's upper bound with the configured margin.
        store
            .submit(&cand("void f(){ }\n//2"), Some(&search))
            .await
            .expect("submit");
        let job = store.claim_next(&host).await.expect("claim").expect("job");
        assert_eq!(job.search_id.as_deref(), Some(search.as_str()));
        let plan = apply_job_options(&store, &config, &job, "p", EvalPlan::default())
            .await
            .expect("plan");
        assert_eq!(
            plan.race,
            Some(RaceBound {
                incumbent_upper_us: 11.0,
                margin: 0.05
            })
        );
        config.search.race = false;
        let plan = apply_job_options(&store, &config, &job, "p", EvalPlan::default())
            .await
            .expect("plan");
        assert_eq!(plan.race, None);

        // A single submission races only when asked: against the problem's best, or an
        // explicit bound; plain timing is passed on.
        store
            .submit(&cand("void f(){ }\n//3"), None)
            .await
            .expect("submit");
        let job = store.claim_next(&host).await.expect("claim").expect("job");
        config.search.race = true;
        let plan = apply_job_options(&store, &config, &job, "p", EvalPlan::default())
            .await
            .expect("plan");
        assert_eq!(plan.race, None);
        let with = async |json: &str| {
            let mut j = job.clone();
            j.options = Some(serde_json::from_str::<JobOptions>(json).expect("options"));
            apply_job_options(&store, &config, &j, "p", EvalPlan::default())
                .await
                .expect("plan")
        };
        assert_eq!(
            with(r#"{"race": "best"}"#)
                .await
                .race
                .map(|r| r.incumbent_upper_us),
            Some(11.0)
        );
        let explicit = with(r#"{"race": 3.5, "race_margin": 0.2}"#)
            .await
            .race
            .expect("bound");
        assert_eq!((explicit.incumbent_upper_us, explicit.margin), (3.5, 0.2));
        let plain = with(r#"{"plain": 100}"#).await;
        assert_eq!((plain.plain, plain.race), (Some(100), None));
    }
}
