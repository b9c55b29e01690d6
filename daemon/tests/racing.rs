//! Racing and plain timing through the API on the host backend: a candidate clearly
//! slower than its incumbent stops timing early, stays `ok`, is marked raced out and
//! never becomes the best; plain timing takes exactly the samples asked for.

mod common;

use common::{Daemon, double_candidate, register, write_double_problem};
use kiln_daemon::client::{Client, ClientError};
use serde_json::{Value, json};

/// A stop rule that cannot converge quickly (min_time_ms is huge): without racing, a
/// candidate samples until max_samples or the wall cap.
const SLOW_TO_CONVERGE: &str = r#"
[evaluation]
trials = 1
run_timeout_ms = 5000
compile_timeout_secs = 30
[evaluation.timing]
warmup = 1
min_samples = 5
min_time_ms = 1000000.0
max_rse = 0.000001
max_samples = 150
wall_cap_ms = 20000.0
recheck_fraction = 0.1
"#;

/// Far slower than the seed: the whole output recomputed many times over.
const SLOW_BODY: &str = "for (int r = 0; r < 400; r++) for (int i = 0; i < n; i++) y[i] = 2.0f * x[i] + (float)(r - r);";

async fn wait_job(c: &Client, job: i64) -> Value {
    for _ in 0..20 {
        let r = c
            .get(&format!("/v1/jobs/{job}?wait=30"))
            .await
            .expect("job");
        if matches!(r["state"].as_str(), Some("done" | "failed")) {
            return r;
        }
    }
    panic!("job {job} did not finish");
}

async fn submit(c: &Client, query: &str, cand: &Value) -> (String, i64) {
    let (_, r) = c
        .post(&format!("/v1/candidates{query}"), cand)
        .await
        .expect("submit");
    assert_eq!(r["duplicate"], false, "{r}");
    (
        r["id"].as_str().expect("id").to_string(),
        r["job_id"].as_i64().expect("job"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clearly_slower_candidate_is_raced_out_and_never_best() {
    let d = Daemon::start_with_config(SLOW_TO_CONVERGE);
    let c = d.client();
    register(&c, &write_double_problem(d.dir.path(), "race")).await;

    // An explicit incumbent far below anything real: raced out once the minimum samples are in.
    let slow = double_candidate("race", SLOW_BODY);
    let (slow_id, job) = submit(&c, "?race=0.001", &slow).await;
    let r = wait_job(&c, job).await;
    assert_eq!(r["options"]["race"], "0.001", "{r}");
    let e = &r["evaluation"];
    assert_eq!(e["verdict"], "ok", "{}", d.log());
    let t = &e["timing"];
    assert_eq!(t["raced_out"], true, "{t}");
    assert_eq!(t["stop_reason"], "raced_out");
    assert!(t["n"].as_u64().expect("n") < 150, "stopped early: {t}");
    let lo = t["ci_low_us"].as_f64().expect("interval reached");
    assert!(
        lo > 0.001 * 1.05 && lo <= t["ci_high_us"].as_f64().expect("hi"),
        "{t}"
    );

    // Against the problem's best: the seed-like fast kernel first (full stop rule), then the
    // slow one queued again, racing it.
    let fast = double_candidate("race", "for (int i = 0; i < n; i++) y[i] = 2.0f * x[i];");
    let (_, job) = submit(&c, "", &fast).await;
    let r = wait_job(&c, job).await;
    let ft = &r["evaluation"]["timing"];
    assert_eq!(r["evaluation"]["verdict"], "ok");
    assert!(ft.get("raced_out").is_none(), "not raced: {ft}");
    assert_eq!(ft["stop_reason"], "max_samples");

    let (_, job) = c
        .post(
            &format!("/v1/candidates/{slow_id}/jobs"),
            &json!({"race": "best", "race_margin": 0.1}),
        )
        .await
        .map(|(s, r)| {
            assert_eq!(s, 202);
            (s, r["job_id"].as_i64().expect("job"))
        })
        .expect("queue again");
    let r = wait_job(&c, job).await;
    assert_eq!(r["evaluation"]["verdict"], "ok");
    assert_eq!(r["evaluation"]["timing"]["raced_out"], true, "{r}");

    // It raced the fast kernel's bound: the interval it reached lies wholly above it.
    let slow_lo = r["evaluation"]["timing"]["ci_low_us"].as_f64().expect("lo");
    assert!(slow_lo > ft["ci_high_us"].as_f64().expect("fast hi") * 1.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_timing_takes_the_samples_asked_for() {
    let d = Daemon::start("");
    let c = d.client();
    register(&c, &write_double_problem(d.dir.path(), "plain")).await;
    // Plain timing runs once per sample: a kernel well above the host timer's overhead (the
    // one-pass kernel would be `unmeasurable_time`).
    let cand = double_candidate("plain", SLOW_BODY);
    let (id, job) = submit(&c, "?plain=25", &cand).await;
    let r = wait_job(&c, job).await;
    let t = &r["evaluation"]["timing"];
    assert_eq!(r["evaluation"]["verdict"], "ok", "{r}");
    assert_eq!(
        (t["plain"].as_bool(), t["n"].as_u64()),
        (Some(true), Some(25)),
        "{t}"
    );
    assert_eq!(t["stop_reason"], "plain");
    assert_eq!(t["rechecks"], 1);

    // The same candidate again without options: the full stop rule, not plain.
    let (_, r) = c
        .post(&format!("/v1/candidates/{id}/jobs"), &json!({}))
        .await
        .expect("again");
    let r = wait_job(&c, r["job_id"].as_i64().expect("job")).await;
    let t = &r["evaluation"]["timing"];
    assert!(t.get("plain").is_none(), "{t}");
    assert_ne!(t["stop_reason"], "plain");
    assert!(r["options"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_options_are_clear_errors() {
    let d = Daemon::start("");
    let c = d.client();
    register(&c, &write_double_problem(d.dir.path(), "opts")).await;
    let cand = double_candidate("opts", "for (int i = 0; i < n; i++) y[i] = 2.0f * x[i];");
    for (query, field) in [
        ("?race=fastest", "race"),
        ("?plain=0", "plain"),
        ("?race=best&plain=10", "plain"),
        ("?race_margin=0.1", "race_margin"),
        ("?raec=best", "raec"),
    ] {
        let err = c
            .post(&format!("/v1/candidates{query}"), &cand)
            .await
            .expect_err(query);
        match err {
            ClientError::Api {
                status, message, ..
            } => {
                assert_eq!(status, 400, "{query}: {message}");
                assert!(message.contains(field), "{query}: {message}");
            }
            other => panic!("{query}: {other}"),
        }
    }
    let err = c
        .post("/v1/candidates/0123456789abcdef/jobs", &json!({}))
        .await
        .expect_err("unknown candidate");
    assert!(matches!(err, ClientError::Api { status: 404, .. }), "{err}");
    let err = c
        .post("/v1/candidates/x/jobs", &json!({"plain": "many"}))
        .await
        .expect_err("bad body");
    assert!(matches!(err, ClientError::Api { status: 400, .. }), "{err}");
    // A duplicate with options queues nothing and says so.
    let (_, job) = submit(&c, "", &cand).await;
    wait_job(&c, job).await;
    let (status, r) = c
        .post("/v1/candidates?plain=5", &cand)
        .await
        .expect("duplicate");
    assert_eq!((status, r["duplicate"].as_bool()), (200, Some(true)));
    assert!(r["warning"].as_str().unwrap_or("").contains("/jobs"), "{r}");
}
