//! A burst of tiny honest host kernels through a real kilnd, with a small sample budget
//! (issue 21: 3-105 of 1,000 such candidates got `ok` with a median of exactly 0). Every
//! one must get a time kiln can measure (several runs per sample, each on fresh inputs)
//! or `unmeasurable_time`, never `ok` with a zero or sub-overhead median. The full 1,000
//! runs as `kiln bench throughput --backend host --problem vecadd-4096 --count 1000`
//! (docs/benchmarks.md); CI runs this smaller burst.

mod common;

use std::time::{Duration, Instant};

use common::{Daemon, double_candidate, register, write_double_problem};
use serde_json::Value;

/// Distinct candidates in the burst.
const BURST: usize = 120;

const SMALL_BUDGET: &str = r#"
[evaluation]
trials = 1
run_timeout_ms = 2000
compile_timeout_secs = 20
[evaluation.timing]
warmup = 1
min_samples = 3
min_time_ms = 0.5
max_rse = 0.5
max_samples = 8
wall_cap_ms = 20.0
recheck_fraction = 0.2
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_tiny_kernels_never_gets_ok_without_a_time() {
    let d = Daemon::start_with_config(SMALL_BUDGET);
    let c = d.client();
    register(&c, &write_double_problem(d.dir.path(), "tiny")).await;
    let mut ids = Vec::new();
    for i in 0..BURST {
        // Distinct sources: the same kernel with its own comment.
        let cand = double_candidate(
            "tiny",
            &format!("/* burst {i} */ for (int i = 0; i < n; i++) y[i] = 2.0f * x[i];"),
        );
        let (_, r) = c.post("/v1/candidates", &cand).await.expect("submit");
        assert_eq!(r["duplicate"], false, "{r}");
        ids.push(r["id"].as_str().expect("id").to_string());
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    let (mut ok, mut unmeasurable, mut reps_seen) = (0, 0, 0u64);
    for id in &ids {
        let e: Value = loop {
            let r = c
                .get(&format!("/v1/candidates/{id}?wait=30"))
                .await
                .expect("candidate");
            if !r["evaluation"].is_null() {
                break r["evaluation"].clone();
            }
            assert!(r["job"]["state"] != "failed", "{r}");
            assert!(Instant::now() < deadline, "burst did not finish: {r}");
        };
        match e["verdict"].as_str() {
            Some("ok") => {
                ok += 1;
                let t = &e["timing"];
                let median = t["median_us"].as_f64().expect("median");
                let reps = t["reps"].as_u64().unwrap_or(1);
                let overhead = t["overhead_us"].as_f64().unwrap_or(0.0);
                assert!(median > 0.0, "ok with a zero median: {e}");
                assert!(
                    median * reps as f64 > overhead,
                    "ok with a sample at or below the timer's overhead: {e}"
                );
                reps_seen = reps_seen.max(reps);
            }
            Some("unmeasurable_time") => {
                unmeasurable += 1;
                assert!(
                    e["timing"].is_null(),
                    "an unmeasurable time has no figure: {e}"
                );
            }
            other => panic!("an honest kernel got {other:?}: {e}"),
        }
    }
    eprintln!(
        "{BURST} tiny kernels: {ok} ok (up to {reps_seen} runs per sample), {unmeasurable} unmeasurable"
    );
    assert!(reps_seen > 1, "tiny kernels were timed one run per sample");
}
