//! The store's conformance suite: every case runs against both implementations of the
//! shared records ([`Records`]) — SQLite (one host) and PostgreSQL (a cluster's shared
//! store, on a scratch server started by the test) — and must give the same answers. A new
//! store is run the way `conformance_through_the_records_trait` runs one. The cases after them
//! are what only a shared store does (GPU-class routing, weighted fair queuing, leases
//! that run out, two nodes, schema refusal).
//!
//! Without PostgreSQL's server binaries the PostgreSQL half says so and passes, unless
//! `KILN_REQUIRE_POSTGRES=1` (CI sets it), which makes their absence a failure.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use kiln_daemon::cluster::scratch_db::ScratchDb;
use kiln_daemon::store::postgres::{PgSettings, PgStore};
use kiln_daemon::store::{
    JobState, LaneClass, NewSearch, PutProblem, Records, Recovery, SqliteStore, Store, StoreError,
};
use kiln_types::baseline::{BaselineStatus, precision};
use kiln_types::{
    BaselineResult, Candidate, Evaluation, JobOptions, ProblemSpec, TimingStats, Verdict,
};

type Case = for<'a> fn(&'a Store) -> Pin<Box<dyn Future<Output = ()> + 'a>>;

/// A store of either kind and what keeps it alive.
struct Fixture {
    _dir: tempfile::TempDir,
    store: Store,
}

fn sqlite(node: &str) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path(), node).expect("open sqlite");
    Fixture { _dir: dir, store }
}

async fn pg_store(url: &str, node: &str, lease_secs: f64) -> Result<PgStore, StoreError> {
    PgStore::connect(&PgSettings {
        url: url.to_string(),
        node: node.to_string(),
        lease_secs,
        pool_size: 4,
        max_attempts: 3,
        ca_file: String::new(),
    })
    .await
}

async fn postgres(url: &str, node: &str, lease_secs: f64) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let local = Arc::new(SqliteStore::open(dir.path(), node).expect("local sqlite"));
    let pg = pg_store(url, node, lease_secs)
        .await
        .expect("connect postgres");
    Fixture {
        _dir: dir,
        store: Store::with_shared(local, pg),
    }
}

/// A scratch PostgreSQL server, or `None` (with the reason printed) when the machine has
/// none and CI did not ask for one.
fn scratch_server() -> Option<ScratchDb> {
    match ScratchDb::start() {
        Ok(db) => Some(db),
        Err(e) if std::env::var("KILN_REQUIRE_POSTGRES").as_deref() == Ok("1") => {
            panic!("KILN_REQUIRE_POSTGRES=1 but no PostgreSQL server could be started: {e}")
        }
        Err(e) => {
            eprintln!("skipping the PostgreSQL half of the conformance suite: {e}");
            None
        }
    }
}

fn host() -> Vec<LaneClass> {
    vec![LaneClass {
        backend: "host".into(),
        class: "host/test-a".into(),
        lanes: 1,
    }]
}

fn spec(name: &str) -> ProblemSpec {
    ProblemSpec::from_toml(&format!(
        r#"
name = "{name}"
summary = "y = 2x"
[[tensor]]
name = "x"
dtype = "f32"
shape = [16]
role = "input"
[[tensor]]
name = "y"
dtype = "f32"
shape = [16]
role = "output"
[tolerance]
atol = 1e-6
rtol = 1e-6
[reference.host]
file = "reference.c"
source = "void ref(const float*x,float*y){{for(int i=0;i<16;i++)y[i]=2*x[i];}}"
launches = [{{ kernel = "ref", args = ["x", "y"] }}]
"#
    ))
    .expect("spec")
}

fn cand(problem: &str, src: &str) -> Candidate {
    serde_json::from_value(serde_json::json!({
        "problem": problem, "language": "c", "source": src, "launches": [{"kernel": "f"}]
    }))
    .expect("candidate")
}

fn ok(median: f64, hi: f64, raced_out: bool, plain: bool) -> Evaluation {
    let mut e = Evaluation::early(Verdict::Ok, kiln_types::BackendKind::Host, "ok");
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

fn new_search(hash: &str, class: &str, weight: f64) -> NewSearch {
    NewSearch {
        problem: "p".into(),
        proposer: "hill".into(),
        plugin_hash: hash.to_string(),
        config: serde_json::json!({"k": 1}),
        seed: 7,
        budget_candidates: 10,
        time_limit_ms: 1000,
        llm_tokens: 0,
        gpu_class: class.to_string(),
        weight,
    }
}

/// Submits a candidate of problem `p` with `src`, claims its job and starts its
/// evaluation on lane 0: the job id and the claim.
async fn running_job(store: &Store, src: &str) -> (i64, kiln_daemon::store::JobRecord) {
    let id = store
        .submit(&cand("p", src), None)
        .await
        .expect("submit")
        .job_id;
    (id, claim_and_start(store, id).await)
}

/// Claims the next job, which must be `id`, and starts its evaluation on lane 0.
async fn claim_and_start(store: &Store, id: i64) -> kiln_daemon::store::JobRecord {
    let held = store
        .claim_next(&host())
        .await
        .expect("claim")
        .expect("a job to claim");
    assert_eq!(held.id, id, "the job expected is the one claimed");
    assert!(
        store
            .start_evaluation(id, held.lease_token, 0)
            .await
            .expect("start")
    );
    held
}

/// Claims the next job and finishes it with `e`.
async fn claim_and_finish(store: &Store, e: &Evaluation) -> i64 {
    let job = store
        .claim_next(&host())
        .await
        .expect("claim")
        .expect("job");
    store
        .finish_job(job.id, job.lease_token, e, 0.0, 0.0)
        .await
        .expect("finish");
    job.id
}

// ---- the cases every store passes ----

async fn problems_register_idempotently_and_conflict_on_change(store: &Store) {
    let s = spec("double");
    assert_eq!(
        store.put_problem(&s).await.expect("put"),
        PutProblem::Created
    );
    assert_eq!(
        store.put_problem(&s).await.expect("put"),
        PutProblem::Unchanged
    );
    let mut changed = s.clone();
    changed.summary = "different".into();
    assert!(matches!(
        store.put_problem(&changed).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(store.get_problem("double").await.expect("get"), Some(s));
    assert_eq!(store.list_problems().await.expect("list").len(), 1);
    assert_eq!(store.get_problem("nope").await.expect("get"), None);
}

async fn a_duplicate_returns_the_existing_job(store: &Store) {
    store.put_problem(&spec("p")).await.expect("problem");
    let c = cand("p", "void f(){}");
    let a = store.submit(&c, None).await.expect("submit");
    assert!(!a.duplicate);
    let b = store.submit(&c, None).await.expect("submit again");
    assert!(b.duplicate);
    assert_eq!((a.id.clone(), a.job_id), (b.id, b.job_id));
    let rec = store
        .get_candidate(&a.id)
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(rec.job.map(|j| j.id), Some(a.job_id));
    assert!(rec.evaluation.is_none());
    assert_eq!(
        store.list_candidates(Some("p"), 10).await.expect("list"),
        vec![a.id]
    );
    assert!(matches!(
        store.submit(&cand("missing", "void f(){}"), None).await,
        Err(StoreError::NotFound(_))
    ));
}

/// In a cluster, a job pinned to a lane waits for a node that has that lane (one host
/// claims it and fails it instead: `sched::tests`).
async fn a_job_pinned_to_a_lane_is_claimed_only_where_that_lane_exists(store: &Store) {
    store.put_problem(&spec("p")).await.expect("problem");
    let pinned = JobOptions {
        lane: Some(2),
        ..JobOptions::default()
    };
    let id = store
        .submit_with(
            &cand("p", "void f(){ /*lane 2*/ }"),
            None,
            Some(&pinned),
            "",
        )
        .await
        .expect("submit")
        .job_id;
    let lanes = |n| {
        [LaneClass {
            backend: "host".into(),
            class: "host/test-a".into(),
            lanes: n,
        }]
    };
    for n in [1, 2] {
        assert!(
            store.claim_next(&lanes(n)).await.expect("claim").is_none(),
            "a node with {n} lane(s) claims a job pinned to lane 2"
        );
    }
    let job = store
        .claim_next(&lanes(3))
        .await
        .expect("claim")
        .expect("a node with lane 2 claims it");
    assert_eq!(job.id, id);
    assert_eq!(job.options.and_then(|o| o.lane), Some(2));
}

async fn a_claim_compiles_without_counting_and_only_the_lane_counts(store: &Store) {
    store.put_problem(&spec("p")).await.expect("problem");
    let id = store
        .submit(&cand("p", "void f(){}"), None)
        .await
        .expect("submit")
        .job_id;
    let cuda = [LaneClass {
        backend: "cuda".into(),
        class: "cuda/x".into(),
        lanes: 1,
    }];
    assert!(store.claim_next(&cuda).await.expect("claim").is_none());
    let job = store
        .claim_next(&host())
        .await
        .expect("claim")
        .expect("job");
    assert_eq!(
        (job.id, job.state, job.attempts),
        (id, JobState::Compiling, 0)
    );
    assert_eq!(job.node.as_deref(), Some(store.node()));
    assert_eq!(
        job.gpu_class, "host/test-a",
        "a job for any class takes the lane's"
    );
    assert!(store.claim_next(&host()).await.expect("claim").is_none());
    store
        .mark_compiled(id, job.lease_token)
        .await
        .expect("compiled");
    let j = store.get_job(id).await.expect("get").expect("job");
    assert_eq!((j.state, j.attempts), (JobState::Compiled, 0));
    assert!(
        store
            .start_evaluation(id, job.lease_token, 0)
            .await
            .expect("start")
    );
    assert!(
        !store
            .start_evaluation(id, job.lease_token, 0)
            .await
            .expect("start twice"),
        "a running job does not start again"
    );
    let j = store.get_job(id).await.expect("get").expect("job");
    assert_eq!(
        (j.state, j.attempts, j.lane),
        (JobState::Running, 1, Some(0))
    );
    let eval = Evaluation::early(Verdict::CompileError, kiln_types::BackendKind::Host, "bad");
    store
        .finish_job(id, job.lease_token, &eval, 1.0, 0.0)
        .await
        .expect("finish");
    assert_eq!(
        store.get_job(id).await.expect("get").expect("job").state,
        JobState::Done
    );
    store
        .finish_job(id, job.lease_token, &eval, 1.0, 0.0)
        .await
        .expect("a repeated finish of the same claim is recognised, not recorded twice");
    assert_eq!(
        store.verdict_counts().await.expect("counts"),
        vec![("compile_error".into(), 1)]
    );
    let counts = store.job_counts().await.expect("counts");
    assert_eq!(counts.len(), JobState::ALL.len());
    assert!(counts.contains(&(JobState::Done, 1)));
    assert_eq!(
        store
            .job_evaluation(id)
            .await
            .expect("eval")
            .map(|e| e.verdict),
        Some(Verdict::CompileError)
    );
}

async fn recovery_queues_waiting_jobs_uncounted_and_gives_up_on_crashed_evaluations(store: &Store) {
    store.put_problem(&spec("p")).await.expect("problem");
    let id = store
        .submit(&cand("p", "void f(){}"), None)
        .await
        .expect("submit")
        .job_id;
    for _ in 0..5 {
        let job = store
            .claim_next(&host())
            .await
            .expect("claim")
            .expect("job");
        store
            .mark_compiled(job.id, job.lease_token)
            .await
            .expect("compiled");
        let r = store.recover_interrupted(3).await.expect("recover");
        assert_eq!(
            r,
            Recovery {
                waiting: 1,
                requeued: 0,
                failed: 0
            }
        );
    }
    assert_eq!(
        store.get_job(id).await.expect("get").expect("job").attempts,
        0
    );
    for round in 1..=3 {
        let job = store
            .claim_next(&host())
            .await
            .expect("claim")
            .expect("job");
        assert!(
            store
                .start_evaluation(job.id, job.lease_token, 0)
                .await
                .expect("start")
        );
        let r = store.recover_interrupted(3).await.expect("recover");
        let expected = if round < 3 {
            Recovery {
                waiting: 0,
                requeued: 1,
                failed: 0,
            }
        } else {
            Recovery {
                waiting: 0,
                requeued: 0,
                failed: 1,
            }
        };
        assert_eq!(r, expected, "round {round}");
    }
    let job = store.get_job(id).await.expect("get").expect("job");
    assert_eq!(job.state, JobState::Failed);
    assert!(
        job.error.unwrap_or_default().contains("evaluation 3 times"),
        "the reason counts evaluations"
    );
}

async fn a_clean_requeue_counts_nothing(store: &Store) {
    store.put_problem(&spec("p")).await.expect("problem");
    let id = store
        .submit(&cand("p", "void f(){}"), None)
        .await
        .expect("submit")
        .job_id;
    let job = store
        .claim_next(&host())
        .await
        .expect("claim")
        .expect("job");
    store
        .requeue_job(id, job.lease_token)
        .await
        .expect("requeue compiling");
    let j = store.get_job(id).await.expect("get").expect("job");
    assert_eq!((j.state, j.attempts), (JobState::Queued, 0));
    let job = store
        .claim_next(&host())
        .await
        .expect("claim")
        .expect("job");
    assert!(
        store
            .start_evaluation(id, job.lease_token, 0)
            .await
            .expect("start")
    );
    store
        .requeue_job(id, job.lease_token)
        .await
        .expect("requeue running");
    let j = store.get_job(id).await.expect("get").expect("job");
    assert_eq!((j.state, j.attempts), (JobState::Queued, 0));
}

async fn a_stale_lease_token_records_nothing(store: &Store) {
    store.put_problem(&spec("p")).await.expect("problem");
    let id = store
        .submit(&cand("p", "void f(){}"), None)
        .await
        .expect("submit")
        .job_id;
    let first = store
        .claim_next(&host())
        .await
        .expect("claim")
        .expect("job");
    // The first claim is lost (its holder stopped), the job is claimed again.
    store.recover_interrupted(3).await.expect("recover");
    let second = store
        .claim_next(&host())
        .await
        .expect("claim")
        .expect("job");
    assert_ne!(first.lease_token, second.lease_token);
    let e = ok(10.0, 11.0, false, false);
    assert!(
        !store
            .start_evaluation(id, first.lease_token, 0)
            .await
            .expect("start"),
        "a stale claim cannot start the evaluation"
    );
    assert!(matches!(
        store.finish_job(id, first.lease_token, &e, 0.0, 0.0).await,
        Err(StoreError::Fenced(_))
    ));
    assert!(matches!(
        store.fail_job(id, first.lease_token, "late").await,
        Err(StoreError::Fenced(_))
    ));
    store
        .requeue_job(id, first.lease_token)
        .await
        .expect("a stale requeue changes nothing");
    assert_eq!(
        store.get_job(id).await.expect("get").expect("job").state,
        JobState::Compiling
    );
    store
        .finish_job(id, second.lease_token, &e, 0.0, 0.0)
        .await
        .expect("the holder records");
    assert_eq!(
        store.verdict_counts().await.expect("counts"),
        vec![("ok".into(), 1)],
        "exactly one evaluation"
    );
}

async fn searches_live_archive_and_share_the_lanes(store: &Store) {
    store.put_problem(&spec("p")).await.expect("problem");
    let hash = store
        .put_plugin("hill", b"\0asm fake")
        .await
        .expect("plugin");
    assert_eq!(
        store
            .put_plugin("hill", b"\0asm fake")
            .await
            .expect("again"),
        hash
    );
    assert_eq!(
        store.get_plugin(&hash).await.expect("plugin").as_deref(),
        Some(&b"\0asm fake"[..])
    );
    let a = store
        .create_search(&new_search(&hash, "", 1.0))
        .await
        .expect("search a");
    let b = store
        .create_search(&new_search(&hash, "", 1.0))
        .await
        .expect("search b");
    // Search a queues three jobs, then search b one: b must not wait behind all of a's.
    for n in 0..3 {
        store
            .submit(&cand("p", &format!("void f(){{ /* {n} */ }}")), Some(&a))
            .await
            .expect("submit a");
    }
    let sb = store
        .submit(&cand("p", "void f(){ /* b */ }"), Some(&b))
        .await
        .expect("submit b");
    assert_eq!(store.search_queued(&a).await.expect("queued"), 3);
    let first = store
        .claim_next(&host())
        .await
        .expect("claim")
        .expect("job");
    let second = store
        .claim_next(&host())
        .await
        .expect("claim")
        .expect("job");
    let claimed = [first.id, second.id];
    assert!(
        claimed.contains(&sb.job_id),
        "search b served within the first two claims: {claimed:?}"
    );
    // A duplicate joins the other search's archive without a new job.
    let dup = store
        .submit(&cand("p", "void f(){ /* 0 */ }"), Some(&b))
        .await
        .expect("dup");
    assert!(dup.duplicate);
    let rec = store.get_search(&b).await.expect("get").expect("search");
    assert_eq!(rec.submitted, 2);
    let archive = store.search_archive(&b).await.expect("archive");
    assert_eq!(archive.len(), 2);
    assert_eq!(archive[0].seq, 1);
    // Token, checkpoint, log, elapsed, tokens, finish.
    assert!(store.start_search(&a, "h1").await.expect("start"));
    assert!(store.search_for_token(&a, "h1").await.expect("token"));
    assert!(!store.search_for_token(&b, "h1").await.expect("token"));
    store
        .save_checkpoint(&a, b"state")
        .await
        .expect("checkpoint");
    assert_eq!(
        store.load_checkpoint(&a).await.expect("load"),
        Some(b"state".to_vec())
    );
    store.search_log(&a, "info", "hello").await.expect("log");
    let log = store.get_search_log(&a, 0, 10).await.expect("log");
    assert_eq!(log[0].message, "hello");
    assert!(
        store
            .get_search_log(&a, log[0].id, 10)
            .await
            .expect("log")
            .is_empty()
    );
    store.add_search_elapsed(&a, 250).await.expect("elapsed");
    store.add_search_tokens(&a, 40).await.expect("tokens");
    assert!(
        store
            .finish_search(&a, "done", Some(&serde_json::json!({"best": 1})), None)
            .await
            .expect("finish")
    );
    assert!(
        !store
            .finish_search(&a, "failed", None, Some("late"))
            .await
            .expect("finish twice")
    );
    assert!(
        !store
            .search_for_token(&a, "h1")
            .await
            .expect("token cleared")
    );
    assert!(
        !store.start_search(&a, "h2").await.expect("start"),
        "a finished search does not start"
    );
    let rec = store.get_search(&a).await.expect("get").expect("search");
    assert_eq!(
        (
            rec.state.as_str(),
            rec.starts,
            rec.elapsed_ms,
            rec.tokens_used
        ),
        ("done", 1, 250, 40)
    );
    assert_eq!(rec.summary, Some(serde_json::json!({"best": 1})));
    assert_eq!(
        store
            .list_searches(Some("running"))
            .await
            .expect("list")
            .len(),
        1
    );
    assert_eq!(store.list_searches(None).await.expect("list").len(), 2);
}

async fn raced_out_and_plain_never_rank_or_race(store: &Store) {
    store.put_problem(&spec("p")).await.expect("problem");
    let hash = store.put_plugin("t", b"wasm").await.expect("plugin");
    let search = store
        .create_search(&new_search(&hash, "", 1.0))
        .await
        .expect("search");
    assert_eq!(
        store.search_incumbent_upper(&search).await.expect("q"),
        None
    );
    // A real best at 10 µs (upper 11), a raced-out one and a plain one with smaller
    // figures that must not count.
    let evals = [
        ("void f(){}", ok(10.0, 11.0, false, false)),
        ("void f(){ }\n//a", ok(5.0, 6.0, true, false)),
        ("void f(){ }\n//b", ok(4.0, 4.5, false, true)),
    ];
    for (src, e) in &evals {
        store
            .submit(&cand("p", src), Some(&search))
            .await
            .expect("submit");
        claim_and_finish(store, e).await;
    }
    assert_eq!(
        store.search_incumbent_upper(&search).await.expect("q"),
        Some(11.0)
    );
    assert_eq!(
        store
            .problem_incumbent_upper("p", "host", "")
            .await
            .expect("q"),
        Some(11.0)
    );
    assert_eq!(
        store
            .problem_incumbent_upper("p", "cuda", "")
            .await
            .expect("q"),
        None
    );
    let rec = store
        .get_search(&search)
        .await
        .expect("get")
        .expect("search");
    let best = rec.best.expect("a best");
    assert_eq!(best.1, 10.0);
    assert_eq!(best.0, cand("p", "void f(){}").content_hash());
    assert_eq!(rec.evaluated, 3);
}

async fn another_job_for_a_stored_candidate(store: &Store) {
    store.put_problem(&spec("p")).await.expect("problem");
    let sub = store
        .submit(&cand("p", "void f(){}"), None)
        .await
        .expect("submit");
    claim_and_finish(store, &ok(10.0, 11.0, false, false)).await;
    let opts: JobOptions = serde_json::from_str(r#"{"plain": 50}"#).expect("options");
    let again = store
        .queue_job(&sub.id, Some(&opts), "")
        .await
        .expect("queue another");
    assert_ne!(again, sub.job_id);
    let job = store
        .claim_next(&host())
        .await
        .expect("claim")
        .expect("job");
    assert_eq!(job.id, again);
    assert_eq!(job.options, Some(opts));
    assert!(store.job_evaluation(again).await.expect("q").is_none());
    store
        .finish_job(again, job.lease_token, &ok(8.0, 9.0, false, true), 0.0, 0.0)
        .await
        .expect("finish");
    let e = store
        .job_evaluation(again)
        .await
        .expect("q")
        .expect("evaluation");
    assert!(e.timing.expect("timing").plain);
    assert!(store.queue_job("nope", None, "").await.is_err());
}

fn baseline(us: f64) -> BaselineResult {
    let mut r = BaselineResult::not_measured(
        "reference",
        "kiln",
        precision::REFERENCE,
        BaselineStatus::Measured,
        "",
    );
    r.timing = Some(TimingStats {
        median_us: us,
        ..TimingStats::default()
    });
    r
}

async fn baselines_are_cached_per_gpu_and_driver(store: &Store) {
    let h200 = kiln_daemon::store::GpuKey {
        model: "NVIDIA H200".into(),
        driver: "580.159.04".into(),
    };
    store.put_problem(&spec("double")).await.expect("put");
    assert_eq!(
        store.get_baselines(&h200, "double").await.expect("get"),
        None
    );
    store
        .put_baselines(&h200, "double", &[baseline(10.0)])
        .await
        .expect("put baselines");
    let got = store.get_baselines(&h200, "double").await.expect("get");
    assert_eq!(got.map(|s| s.results[0].median_us()), Some(Some(10.0)));
    let other = kiln_daemon::store::GpuKey {
        driver: "590.1".into(),
        ..h200.clone()
    };
    assert_eq!(
        store.get_baselines(&other, "double").await.expect("get"),
        None
    );
    store
        .put_baselines(&h200, "double", &[baseline(12.0)])
        .await
        .expect("remeasure");
    let sets = store.list_baselines("double").await.expect("list");
    assert_eq!(sets.len(), 1, "a re-measure replaces the set");
    assert_eq!(sets[0].results[0].median_us(), Some(12.0));
    let err = store
        .put_baselines(&h200, "nope", &[baseline(1.0)])
        .await
        .expect_err("no such problem");
    assert!(matches!(err, StoreError::NotFound(_)), "{err}");
}

async fn llm_calls_are_recorded_per_search(store: &Store) {
    store.put_problem(&spec("p")).await.expect("problem");
    let hash = store.put_plugin("t", b"wasm").await.expect("plugin");
    let s = store
        .create_search(&new_search(&hash, "", 1.0))
        .await
        .expect("search");
    store
        .record_llm_call(&kiln_daemon::store::LlmCallRecord {
            search_id: Some(s.clone()),
            provider: "replay".into(),
            request: serde_json::json!({"m": 1}),
            prompt_tokens: 3,
            completion_tokens: 4,
            attempts: 2,
            ..Default::default()
        })
        .await
        .expect("record");
    let calls = store.llm_calls(&s).await.expect("calls");
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (
            calls[0]["attempts"].as_i64(),
            calls[0]["request"]["m"].as_i64()
        ),
        (Some(2), Some(1))
    );
}

async fn a_searchs_timeline_lists_submissions_in_order(store: &Store) {
    store.put_problem(&spec("p")).await.expect("problem");
    let hash = store.put_plugin("t", b"wasm").await.expect("plugin");
    let id = store
        .create_search(&new_search(&hash, "", 1.0))
        .await
        .expect("search");
    let a = store
        .submit(&cand("p", "void f(){ /* 0 */ }"), Some(&id))
        .await
        .expect("a");
    let mut child = cand("p", "void f(){ /* 1 */ }");
    child.parent = Some(a.id.clone());
    child.note = Some("step 1".into());
    let b = store.submit(&child, Some(&id)).await.expect("b");
    let mut e = ok(5.0, 5.5, false, false);
    e.timing.as_mut().expect("timing").samples_us = vec![5.0, 5.5];
    assert_eq!(claim_and_finish(store, &e).await, a.job_id);
    let t = store.search_timeline(&id).await.expect("timeline");
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
            .await
            .expect("empty")
            .is_empty()
    );
}

async fn log_usage_counts_a_searchs_lines_and_bytes(store: &Store) {
    store.put_problem(&spec("p")).await.expect("problem");
    let hash = store.put_plugin("t", b"wasm").await.expect("plugin");
    let s = store
        .create_search(&new_search(&hash, "", 1.0))
        .await
        .expect("search");
    let other = store
        .create_search(&new_search(&hash, "", 1.0))
        .await
        .expect("search");
    assert_eq!(store.search_log_usage(&s).await.expect("usage"), (0, 0));
    store.search_log(&s, "info", "abc").await.expect("log");
    // Bytes, not characters: "é" is two bytes in UTF-8.
    store.search_log(&s, "warn", "é").await.expect("log");
    store
        .search_log(&other, "info", "0123456789")
        .await
        .expect("log");
    assert_eq!(store.search_log_usage(&s).await.expect("usage"), (2, 5));
    assert_eq!(
        store.search_log_usage(&other).await.expect("usage"),
        (1, 10)
    );
}

/// A write that ends a job, repeated under the same claim (its first answer was lost with
/// the connection, and the scheduler wrote it again), is recognised: `Ok`, and still
/// exactly one evaluation. Ending it the other way, or under another claim, is refused.
async fn a_repeated_end_of_a_job_is_recorded_once(store: &Store) {
    store.put_problem(&spec("p")).await.expect("problem");
    let e = ok(10.0, 11.0, false, false);
    let (id, held) = running_job(store, "void f(){ /*done*/ }").await;
    store
        .finish_job(id, held.lease_token, &e, 1.0, 2.0)
        .await
        .expect("finish");
    store
        .finish_job(id, held.lease_token, &e, 1.0, 2.0)
        .await
        .expect("the same end again is recognised");
    assert!(matches!(
        store.fail_job(id, held.lease_token, "late").await,
        Err(StoreError::Fenced(_))
    ));
    assert!(matches!(
        store
            .finish_job(id, held.lease_token + 1, &e, 1.0, 2.0)
            .await,
        Err(StoreError::Fenced(_))
    ));
    assert_eq!(
        store.verdict_counts().await.expect("counts"),
        vec![("ok".into(), 1)],
        "exactly one evaluation"
    );
    let j = store.get_job(id).await.expect("get").expect("job");
    assert_eq!((j.state, j.attempts), (JobState::Done, 1));

    let id = store
        .submit(&cand("p", "void f(){ /*failed*/ }"), None)
        .await
        .expect("submit")
        .job_id;
    let held = store
        .claim_next(&host())
        .await
        .expect("claim")
        .expect("job");
    store
        .fail_job(id, held.lease_token, "backend broke")
        .await
        .expect("fail");
    store
        .fail_job(id, held.lease_token, "backend broke")
        .await
        .expect("the same end again is recognised");
    assert!(matches!(
        store.finish_job(id, held.lease_token, &e, 1.0, 2.0).await,
        Err(StoreError::Fenced(_))
    ));
    let j = store.get_job(id).await.expect("get").expect("job");
    assert_eq!(j.state, JobState::Failed);
    assert_eq!(
        store.verdict_counts().await.expect("counts"),
        vec![("ok".into(), 1)]
    );
}

const CASES: &[(&str, Case)] = &[
    ("problems", |s| {
        Box::pin(problems_register_idempotently_and_conflict_on_change(s))
    }),
    ("duplicates", |s| {
        Box::pin(a_duplicate_returns_the_existing_job(s))
    }),
    ("claims", |s| {
        Box::pin(a_claim_compiles_without_counting_and_only_the_lane_counts(
            s,
        ))
    }),
    ("recovery", |s| {
        Box::pin(recovery_queues_waiting_jobs_uncounted_and_gives_up_on_crashed_evaluations(s))
    }),
    ("requeue", |s| Box::pin(a_clean_requeue_counts_nothing(s))),
    ("fencing", |s| {
        Box::pin(a_stale_lease_token_records_nothing(s))
    }),
    ("repeated end", |s| {
        Box::pin(a_repeated_end_of_a_job_is_recorded_once(s))
    }),
    ("searches", |s| {
        Box::pin(searches_live_archive_and_share_the_lanes(s))
    }),
    ("incumbents", |s| {
        Box::pin(raced_out_and_plain_never_rank_or_race(s))
    }),
    ("requeued jobs", |s| {
        Box::pin(another_job_for_a_stored_candidate(s))
    }),
    ("baselines", |s| {
        Box::pin(baselines_are_cached_per_gpu_and_driver(s))
    }),
    ("llm calls", |s| {
        Box::pin(llm_calls_are_recorded_per_search(s))
    }),
    ("log usage", |s| {
        Box::pin(log_usage_counts_a_searchs_lines_and_bytes(s))
    }),
    ("timeline", |s| {
        Box::pin(a_searchs_timeline_lists_submissions_in_order(s))
    }),
];

#[tokio::test]
async fn conformance_on_sqlite() {
    for (name, case) in CASES {
        eprintln!("case {name} on SQLite");
        let f = sqlite("node-1");
        case(&f.store).await;
    }
}

/// The suite as a new store would run it: the shared records through
/// [`Store::with_records`] and the [`Records`] trait, in a database of their own beside
/// the node's (here another SQLite file; a new store passes its own implementation).
#[tokio::test]
async fn conformance_through_the_records_trait() {
    for (name, case) in CASES {
        eprintln!("case {name} through Records");
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("local")).expect("local dir");
        std::fs::create_dir(dir.path().join("records")).expect("records dir");
        let local =
            Arc::new(SqliteStore::open(&dir.path().join("local"), "node-1").expect("local"));
        let records: Arc<dyn Records> =
            Arc::new(SqliteStore::open(&dir.path().join("records"), "node-1").expect("records"));
        let store = Store::with_records(local, records);
        case(&store).await;
    }
}

#[tokio::test]
async fn conformance_on_postgres() {
    let Some(db) = scratch_server() else { return };
    for (i, (name, case)) in CASES.iter().enumerate() {
        eprintln!("case {name} on PostgreSQL");
        let dbname = format!("case{i}");
        db.create_database(&dbname).expect("database");
        let f = postgres(&db.url(&dbname), "node-1", 30.0).await;
        case(&f.store).await;
    }
}

// ---- what only the shared store does ----

/// Runs `pg`'s reaper until a pass does what `want` says (bounded: leases are a second
/// long here).
async fn reap_until(pg: &PgStore, want: impl Fn(&Recovery) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let r = pg.reap_expired(3).await.expect("reap");
        if want(&r) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the reaper never did what was expected; last pass: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `target_session_attrs=read-write` (a primary with standbys in one URL) skips a server
/// that allows no writes, as libpq does, and says so.
#[tokio::test]
async fn a_read_write_session_refuses_a_read_only_server() {
    let Some(db) = scratch_server() else { return };
    db.create_database("rw").expect("database");
    db.create_database("ro").expect("database");
    db.psql(
        "ro",
        "ALTER DATABASE ro SET default_transaction_read_only = on",
    )
    .expect("read-only");
    let rw = format!("{}&target_session_attrs=read-write", db.url("rw"));
    pg_store(&rw, "node-a", 30.0)
        .await
        .expect("a server that allows writes is taken");
    let ro = format!("{}&target_session_attrs=read-write", db.url("ro"));
    let err = pg_store(&ro, "node-a", 30.0).await.err().expect("refused");
    assert!(
        matches!(&err, StoreError::Unavailable(m) if m.contains("allows no writes")),
        "{err}"
    );
}

/// A restarted database gives every node one lease to renew before its jobs are taken:
/// a lease that ran out while the database was down is not reaped at once.
#[tokio::test]
async fn a_restarted_database_gives_every_lease_one_more_lease() {
    let Some(mut db) = scratch_server() else {
        return;
    };
    db.create_database("grace").expect("database");
    let url = db.url("grace");
    let a = postgres(&url, "node-a", 30.0).await;
    a.store.put_problem(&spec("p")).await.expect("problem");
    a.store
        .submit(&cand("p", "void f(){}"), None)
        .await
        .expect("submit");
    a.store
        .claim_next(&host())
        .await
        .expect("claim")
        .expect("job");
    db.restart().expect("restart");
    // As if the restart had taken longer than the lease.
    db.psql(
        "grace",
        "UPDATE jobs SET lease_until = now() - interval '1 second'",
    )
    .expect("lease ran out");
    let patient = pg_store(&url, "node-b", 30.0).await.expect("connect");
    assert_eq!(
        patient.reap_expired(3).await.expect("reap"),
        Recovery::default(),
        "nothing is reaped within a lease of the database's start"
    );
    // With a one-second lease, a second after the start, it is.
    let quick = pg_store(&url, "node-c", 1.0).await.expect("connect");
    reap_until(&quick, |r| r.waiting == 1).await;
}

#[tokio::test]
async fn postgres_cluster_semantics() {
    let Some(db) = scratch_server() else { return };
    let fresh = |name: &str| {
        db.create_database(name).expect("database");
        db.url(name)
    };

    let url = fresh("pinned");
    let pinned = postgres(&url, "node-a", 30.0).await;
    a_job_pinned_to_a_lane_is_claimed_only_where_that_lane_exists(&pinned.store).await;

    // Jobs go to their class; a job for any class goes to the first lane that claims it.
    let url = fresh("routing");
    let a = postgres(&url, "node-a", 30.0).await;
    let b = postgres(&url, "node-b", 30.0).await;
    a.store.put_problem(&spec("p")).await.expect("problem");
    let for_b = a
        .store
        .submit_with(&cand("p", "void f(){ /*b*/ }"), None, None, "host/test-b")
        .await
        .expect("submit");
    let lanes_b = [LaneClass {
        backend: "host".into(),
        class: "host/test-b".into(),
        lanes: 1,
    }];
    assert!(
        a.store.claim_next(&host()).await.expect("claim").is_none(),
        "class test-a does not take test-b's job"
    );
    let got = b
        .store
        .claim_next(&lanes_b)
        .await
        .expect("claim")
        .expect("job");
    assert_eq!(
        (got.id, got.node.as_deref()),
        (for_b.job_id, Some("node-b"))
    );
    b.store
        .finish_job(
            got.id,
            got.lease_token,
            &ok(5.0, 6.0, false, false),
            0.0,
            0.0,
        )
        .await
        .expect("finish");
    let finished = b
        .store
        .cluster()
        .expect("pg")
        .finished_since(0, 10)
        .await
        .expect("finished");
    assert_eq!(finished.len(), 1);
    assert_eq!(
        (
            finished[0].job_id,
            finished[0].node.as_deref(),
            finished[0].verdict.as_deref()
        ),
        (got.id, Some("node-b"), Some("ok"))
    );
    // Incumbents compare only evaluations of the class.
    assert_eq!(
        a.store
            .problem_incumbent_upper("p", "host", "host/test-b")
            .await
            .expect("q"),
        Some(6.0)
    );
    assert_eq!(
        a.store
            .problem_incumbent_upper("p", "host", "host/test-a")
            .await
            .expect("q"),
        None
    );

    // Concurrent claims from two nodes never hand one job out twice.
    for n in 0..40 {
        a.store
            .submit(&cand("p", &format!("void f(){{ /* c{n} */ }}")), None)
            .await
            .expect("submit");
    }
    let (sa, sb) = (&a.store, &b.store);
    let claim_all = async |store: &Store| {
        let mut ids = Vec::new();
        while let Some(j) = store.claim_next(&host()).await.expect("claim") {
            ids.push(j.id);
        }
        ids
    };
    let (ia, ib) = tokio::join!(claim_all(sa), claim_all(sb));
    let mut all: Vec<i64> = ia.iter().chain(ib.iter()).copied().collect();
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!((n, all.len()), (40, 40), "each job claimed exactly once");

    // Weighted fair queuing: with search 1 far ahead, searches 2 (weight 1) and 3
    // (weight 2) join at the current virtual time and share 1:2.
    let url = fresh("fairness");
    let f = postgres(&url, "node-a", 30.0).await;
    let s = &f.store;
    s.put_problem(&spec("p")).await.expect("problem");
    let hash = s.put_plugin("t", b"wasm").await.expect("plugin");
    let s1 = s
        .create_search(&new_search(&hash, "host/test-a", 1.0))
        .await
        .expect("s1");
    let s2 = s
        .create_search(&new_search(&hash, "host/test-a", 1.0))
        .await
        .expect("s2");
    let s3 = s
        .create_search(&new_search(&hash, "host/test-a", 2.0))
        .await
        .expect("s3");
    for n in 0..60 {
        s.submit(&cand("p", &format!("void f(){{ /* 1-{n} */ }}")), Some(&s1))
            .await
            .expect("s1");
    }
    // Serve some of search 1 alone, so the virtual time moves on.
    for _ in 0..20 {
        let j = s.claim_next(&host()).await.expect("claim").expect("job");
        s.finish_job(j.id, j.lease_token, &ok(1.0, 2.0, false, false), 0.0, 0.0)
            .await
            .expect("finish");
    }
    for n in 0..30 {
        s.submit(&cand("p", &format!("void f(){{ /* 2-{n} */ }}")), Some(&s2))
            .await
            .expect("s2");
        s.submit(&cand("p", &format!("void f(){{ /* 3-{n} */ }}")), Some(&s3))
            .await
            .expect("s3");
    }
    let mut served = std::collections::HashMap::<String, u32>::new();
    for _ in 0..40 {
        let j = s.claim_next(&host()).await.expect("claim").expect("job");
        *served
            .entry(j.search_id.clone().unwrap_or_default())
            .or_default() += 1;
    }
    let (n1, n2, n3) = (served[&s1], served[&s2], served[&s3]);
    assert!(
        n3 >= 2 * n2 - 2 && n3 <= 2 * n2 + 2,
        "weight 2 gets twice weight 1's share: {n1} {n2} {n3}"
    );
    assert!(
        n2 >= 8 && n1 >= 8,
        "a late search neither starves nor is starved: {n1} {n2} {n3}"
    );

    // Leases run out: the reaper of any node queues the job again, the late holder's
    // result is fenced out, the new holder's is recorded once.
    let url = fresh("leases");
    let a = postgres(&url, "node-a", 1.0).await;
    let b = postgres(&url, "node-b", 1.0).await;
    a.store.put_problem(&spec("p")).await.expect("problem");
    let (id, held) = running_job(&a.store, "void f(){}").await;
    let pb = b.store.cluster().expect("pg");
    assert_eq!(
        pb.reap_expired(3).await.expect("reap"),
        Recovery::default(),
        "a live lease is not reaped"
    );
    // Node a stalls past its lease (no heartbeat): node b's reaper takes the job back.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        pb.reap_expired(3).await.expect("reap"),
        Recovery {
            waiting: 0,
            requeued: 1,
            failed: 0
        }
    );
    let again = b
        .store
        .claim_next(&host())
        .await
        .expect("claim")
        .expect("job");
    assert_eq!(again.id, id);
    assert!(matches!(
        a.store
            .finish_job(id, held.lease_token, &ok(1.0, 2.0, false, false), 0.0, 0.0)
            .await,
        Err(StoreError::Fenced(_))
    ));
    b.store
        .finish_job(id, again.lease_token, &ok(1.0, 2.0, false, false), 0.0, 0.0)
        .await
        .expect("finish");
    assert_eq!(
        b.store.verdict_counts().await.expect("v"),
        vec![("ok".into(), 1)]
    );
    // A heartbeat keeps a lease alive past its length.
    let id2 = a
        .store
        .submit(&cand("p", "void f(){ }"), None)
        .await
        .expect("submit")
        .job_id;
    let pa = a.store.cluster().expect("pg");
    pa.register_node(&[], true, true).await.expect("register");
    let held = a
        .store
        .claim_next(&host())
        .await
        .expect("claim")
        .expect("job");
    assert_eq!(held.id, id2);
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        pa.heartbeat().await.expect("heartbeat");
    }
    assert_eq!(pb.reap_expired(3).await.expect("reap"), Recovery::default());

    // One live process per node id; search leases move only when they run out.
    let again_a = postgres(&url, "node-a", 1.0).await;
    let err = again_a
        .store
        .cluster()
        .expect("pg")
        .register_node(&[], true, true)
        .await
        .expect_err("node id in use");
    assert!(err.to_string().contains("node id"), "{err}");
    let hash = a.store.put_plugin("t", b"wasm").await.expect("plugin");
    let s = a
        .store
        .create_search(&new_search(&hash, "host/test-a", 1.0))
        .await
        .expect("search");
    assert!(a.store.start_search(&s, "ha").await.expect("a hosts"));
    assert!(!b.store.start_search(&s, "hb").await.expect("b waits"));
    assert_eq!(
        pb.searches_to_host().await.expect("to host"),
        Vec::<String>::new()
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        pb.searches_to_host().await.expect("to host"),
        vec![s.clone()]
    );
    assert!(b.store.start_search(&s, "hb").await.expect("b takes over"));
    assert!(
        !a.store.search_for_token(&s, "ha").await.expect("token"),
        "the old host is fenced out"
    );
    assert!(
        !pa.renew_search_leases().await.expect("renew").contains(&s),
        "the old host no longer holds it"
    );
    let status = pb.cluster_status().await.expect("status");
    assert!(status.nodes.iter().any(|n| n.id == "node-a"), "{status:?}");

    // A node late with its heartbeat (slow, not dead) loses the lease of a running job:
    // the job runs again elsewhere, the late result is fenced out, and when the late
    // node's heartbeat comes back the attempt is given back. One evaluation, one attempt.
    let lapses = fresh("lapses");
    let slow = postgres(&lapses, "node-slow", 1.0).await;
    let other = postgres(&lapses, "node-other", 1.0).await;
    let (ps, po) = (
        slow.store.cluster().expect("pg"),
        other.store.cluster().expect("pg"),
    );
    ps.register_node(&[], true, true).await.expect("register");
    po.register_node(&[], true, true).await.expect("register");
    slow.store.put_problem(&spec("p")).await.expect("problem");
    let (id, late) = running_job(&slow.store, "void f(){ /*lapse*/ }").await;
    reap_until(po, |r| r.requeued == 1).await;
    let j = other.store.get_job(id).await.expect("get").expect("job");
    assert_eq!(
        (j.state, j.attempts),
        (JobState::Queued, 1),
        "counted until the node shows it lives"
    );
    assert!(matches!(
        slow.store
            .finish_job(id, late.lease_token, &ok(1.0, 2.0, false, false), 0.0, 0.0)
            .await,
        Err(StoreError::Fenced(_))
    ));
    ps.heartbeat()
        .await
        .expect("the slow node's heartbeat comes back");
    let j = other.store.get_job(id).await.expect("get").expect("job");
    assert_eq!(j.attempts, 0, "a lapse of a live node is not an attempt");
    let again = claim_and_start(&other.store, id).await;
    other
        .store
        .finish_job(id, again.lease_token, &ok(1.0, 2.0, false, false), 0.0, 0.0)
        .await
        .expect("finish");
    let j = other.store.get_job(id).await.expect("get").expect("job");
    assert_eq!((j.state, j.attempts), (JobState::Done, 1));
    assert_eq!(
        other.store.verdict_counts().await.expect("v"),
        vec![("ok".into(), 1)],
        "exactly one evaluation"
    );

    // Processes that die during a job's evaluation (they never beat again) each cost it
    // an attempt; after `max_attempts` it is claimed no more and fails one lease after
    // its last lapse, with the reason.
    let deaths = fresh("deaths");
    let survivor = postgres(&deaths, "node-survivor", 1.0).await;
    let psur = survivor.store.cluster().expect("pg");
    survivor
        .store
        .put_problem(&spec("p"))
        .await
        .expect("problem");
    let id = survivor
        .store
        .submit(&cand("p", "void f(){ /*poison*/ }"), None)
        .await
        .expect("submit")
        .job_id;
    for k in 0..3 {
        let dying = postgres(&deaths, &format!("node-dies-{k}"), 1.0).await;
        let pd = dying.store.cluster().expect("pg");
        pd.register_node(&[], true, true).await.expect("register");
        // Claimed while it has attempts left.
        claim_and_start(&dying.store, id).await;
        drop(dying);
        reap_until(psur, |r| r.requeued == 1).await;
    }
    let j = survivor.store.get_job(id).await.expect("get").expect("job");
    assert_eq!((j.state, j.attempts), (JobState::Queued, 3));
    assert!(
        survivor
            .store
            .claim_next(&host())
            .await
            .expect("claim")
            .is_none(),
        "a job out of attempts waits for a refund or its failure, unclaimed"
    );
    reap_until(psur, |r| r.failed == 1).await;
    let j = survivor.store.get_job(id).await.expect("get").expect("job");
    assert_eq!(j.state, JobState::Failed);
    assert!(
        j.error.as_deref().is_some_and(|e| e.contains("3 times")),
        "{:?}",
        j.error
    );

    // A database newer than this kilnd is refused.
    let url = fresh("newer");
    drop(postgres(&url, "node-a", 30.0).await);
    db.psql("newer", "INSERT INTO kiln_schema (version) VALUES (100000)")
        .expect("bump");
    let err = pg_store(&url, "node-a", 30.0).await.err().expect("refused");
    assert!(
        matches!(&err, StoreError::Schema(m) if m.contains("newer")),
        "{err}"
    );
}
