//! `kiln bench throughput|latency|stability` in smoke mode against a real kilnd on the
//! host backend, and `kiln bench cluster` with its own nodes and scratch database: each
//! runs through the CLI binary and prints a sane JSON report. These check that the
//! benchmarks work, never how fast anything is.

mod common;

use std::path::Path;
use std::process::Command;

use common::{Daemon, write_double_problem};
use serde_json::Value;

fn kiln(d: &Daemon, args: &[&str]) -> Value {
    let out = Command::new(common::kiln_cli())
        .env("KILN_SOCKET", &d.socket)
        .args(args)
        .output()
        .expect("run kiln");
    assert!(
        out.status.success(),
        "kiln {args:?} failed: {}\nkilnd log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// A daemon with the tiny host problem registered.
fn daemon_with_problem(name: &str) -> Daemon {
    let d = Daemon::start("");
    let dir = write_double_problem(d.dir.path(), name);
    kiln(&d, &["problems", "add", dir.to_str().expect("utf8")]);
    d
}

/// Percentiles are ordered and finite, and there is one value per job.
fn check_summary(s: &Value, n: u64, what: &str) {
    assert_eq!(s["n"], n, "{what}: {s}");
    let g = |k: &str| s[k].as_f64().unwrap_or(f64::NAN);
    for k in ["mean", "p50", "p90", "p99", "max"] {
        assert!(g(k).is_finite() && g(k) >= 0.0, "{what}.{k}: {s}");
    }
    assert!(
        g("p50") <= g("p90") && g("p90") <= g("p99") && g("p99") <= g("max"),
        "{what}: percentiles out of order: {s}"
    );
}

#[test]
fn throughput_smoke_reports_both_passes() {
    let d = daemon_with_problem("bench-tp");
    let r = kiln(
        &d,
        &[
            "bench",
            "throughput",
            "--problem",
            "bench-tp",
            "--backend",
            "host",
            "--smoke",
            "-o",
            "json",
        ],
    );
    assert_eq!(r["benchmark"], "throughput");
    assert_eq!(
        (r["problem"].as_str(), r["backend"].as_str()),
        (Some("bench-tp"), Some("host"))
    );
    assert_eq!(r["smoke"], true);
    let count = r["settings"]["count"].as_u64().expect("count");
    assert!(count >= 2);
    // The host backend has one lane; the CPUs that compile are counted beside it.
    assert_eq!(r["lanes"], 1, "{r}");
    let cpus = r["cpus"].as_u64().expect("cpus");
    assert!(cpus >= 1);
    assert_eq!(r["cpus_per_lane"].as_f64(), Some(cpus as f64));
    let passes = r["passes"].as_array().expect("passes");
    assert_eq!(passes.len(), 2);
    assert_eq!(
        (passes[0]["name"].as_str(), passes[1]["name"].as_str()),
        (Some("uncached"), Some("cached"))
    );
    for p in passes {
        assert_eq!(p["candidates"], count, "{p}");
        assert_eq!(
            p["verdicts"]["ok"], count,
            "the seed's variants are all correct: {p}"
        );
        assert_eq!(
            p["ok_without_a_time"], 0,
            "tiny kernels still get times: {p}"
        );
        let per_min = p["per_minute"].as_f64().expect("per_minute");
        assert!(per_min.is_finite() && per_min > 0.0, "{p}");
        assert!(p["lanes"].as_u64().expect("lanes") >= 1);
        // The lane ran every evaluation, so its counter moved; a fraction is within 0..=1.
        let busy = p["busy_fraction"]
            .as_f64()
            .expect("busy fraction from /metrics");
        assert!(busy > 0.0 && busy <= 1.0, "{p}");
        assert_eq!(
            p["lane_busy_fraction"]["0"].as_f64(),
            Some(busy),
            "one lane: its fraction is the mean: {p}"
        );
        for stage in [
            "queue",
            "compile",
            "lane_wait",
            "correctness",
            "timing",
            "end_to_end",
        ] {
            check_summary(&p["latency_ms"][stage], count, stage);
        }
    }
    // The first pass compiled every candidate; the second found every artifact cached.
    assert_eq!(passes[0]["compile_cached"], 0);
    assert_eq!(passes[1]["compile_cached"], count);
}

#[test]
fn latency_smoke_measures_cached_resubmissions() {
    let d = daemon_with_problem("bench-lat");
    let r = kiln(
        &d,
        &[
            "bench",
            "latency",
            "--problem",
            "bench-lat",
            "--backend",
            "host",
            "--smoke",
            "-o",
            "json",
        ],
    );
    assert_eq!(r["benchmark"], "latency");
    let count = r["settings"]["count"].as_u64().expect("count");
    assert_eq!(r["verdicts"]["ok"], count);
    assert_eq!(r["compile_cached"], count);
    check_summary(&r["latency_ms"]["end_to_end"], count, "end_to_end");
    check_summary(&r["latency_ms"]["timing"], count, "timing");
    // Server-side stages fit inside the client's view of the whole request.
    let e2e = r["latency_ms"]["end_to_end"]["max"].as_f64().expect("e2e");
    let timing = r["latency_ms"]["timing"]["p50"].as_f64().expect("timing");
    assert!(timing <= e2e + 1.0, "{r}");
}

#[test]
fn stability_smoke_reports_cv_of_contract_and_plain() {
    // Plain timing runs once per sample, so it needs a kernel longer than the host
    // timer's overhead (the tiny problem's would be `unmeasurable_time`): LayerNorm.
    let d = Daemon::start("");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../problems/layernorm-128x4096");
    kiln(&d, &["problems", "add", dir.to_str().expect("utf8")]);
    let r = kiln(
        &d,
        &[
            "bench",
            "stability",
            "--problem",
            "layernorm-128x4096",
            "--backend",
            "host",
            "--smoke",
            "--plain-reps",
            "20",
            "-o",
            "json",
        ],
    );
    assert_eq!(r["benchmark"], "stability");
    let rounds = r["settings"]["rounds"].as_u64().expect("rounds");
    assert!(r["other_candidates"].as_u64().expect("others") >= rounds);
    for key in ["contract", "plain"] {
        let s = &r[key];
        assert_eq!(s["n"], rounds, "{key}: {s}");
        assert_eq!(
            s["medians_us"].as_array().map(Vec::len),
            Some(rounds as usize)
        );
        assert_eq!(s["verdicts"]["ok"], rounds, "{key}: {s}");
        let cv = s["cv"].as_f64().expect("cv");
        assert!(cv.is_finite() && cv >= 0.0, "{key}: {s}");
        let (lo, mean, hi) = (
            s["min_us"].as_f64().expect("min"),
            s["mean_us"].as_f64().expect("mean"),
            s["max_us"].as_f64().expect("max"),
        );
        assert!(lo <= mean && mean <= hi, "{key}: {s}");
    }
    let ratio = r["plain_over_contract"].as_f64().expect("ratio");
    assert!(ratio.is_finite() && ratio >= 0.0, "{r}");
}

#[test]
fn bench_text_output_is_a_table() {
    let d = daemon_with_problem("bench-text");
    let out = Command::new(common::kiln_cli())
        .env("KILN_SOCKET", &d.socket)
        .args([
            "bench",
            "latency",
            "--problem",
            "bench-text",
            "--backend",
            "host",
            "--count",
            "2",
        ])
        .output()
        .expect("run kiln");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("submit → verdict") && text.contains("end_to_end"),
        "{text}"
    );
}

#[test]
fn bench_on_an_unknown_problem_says_how_to_register_it() {
    let d = Daemon::start("");
    let out = Command::new(common::kiln_cli())
        .env("KILN_SOCKET", &d.socket)
        .args([
            "bench",
            "throughput",
            "--problem",
            "nope",
            "--backend",
            "host",
            "--smoke",
        ])
        .output()
        .expect("run kiln");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("kiln problems add"), "{err}");
}

#[test]
fn cluster_smoke_reports_each_node_count() {
    if kiln_daemon::cluster::scratch_db::find_binaries().is_none() {
        assert!(
            std::env::var("KILN_REQUIRE_POSTGRES").as_deref() != Ok("1"),
            "KILN_REQUIRE_POSTGRES=1 but PostgreSQL's server binaries are not installed"
        );
        eprintln!("skipping kiln bench cluster: PostgreSQL's server binaries are not installed");
        return;
    }
    let out = Command::new(common::kiln_cli())
        .args(["bench", "cluster", "--smoke", "-o", "json"])
        .arg("--kilnd")
        .arg(env!("CARGO_BIN_EXE_kilnd"))
        .output()
        .expect("run kiln");
    assert!(
        out.status.success(),
        "kiln bench cluster failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("json report");
    assert_eq!(
        (r["bench"].as_str(), r["smoke"].as_bool()),
        (Some("cluster"), Some(true))
    );
    let runs = r["runs"].as_array().expect("runs");
    assert_eq!(
        runs.iter().map(|r| r["nodes"].as_u64()).collect::<Vec<_>>(),
        vec![Some(1), Some(2)]
    );
    for run in runs {
        assert_eq!(run["failed"], 0, "{run}");
        let per_node: u64 = run["evaluations_per_node"]
            .as_array()
            .expect("per node")
            .iter()
            .filter_map(|n| n["evaluations"].as_u64())
            .sum();
        assert_eq!(
            per_node,
            run["candidates"].as_u64().expect("count"),
            "{run}"
        );
        assert!(
            run["evaluations_per_minute"]
                .as_f64()
                .is_some_and(|v| v > 0.0),
            "{run}"
        );
        assert!(
            run["claim_statement_ms_mean"]
                .as_f64()
                .is_some_and(|v| v > 0.0),
            "{run}"
        );
        assert!(
            run["db_commits_per_evaluation"]
                .as_f64()
                .is_some_and(|v| v > 0.0),
            "{run}"
        );
        check_summary(
            &run["queue_wait_ms"],
            run["candidates"].as_u64().expect("n"),
            "queue wait",
        );
    }
}

#[test]
fn lanes_smoke_times_the_kernel_on_every_lane() {
    let d = daemon_with_problem("bench-lanes");
    let r = kiln(
        &d,
        &[
            "bench",
            "lanes",
            "--problem",
            "bench-lanes",
            "--backend",
            "host",
            "--smoke",
            "--isolation",
            "-o",
            "json",
        ],
    );
    assert_eq!(r["benchmark"], "lanes");
    assert_eq!(r["lanes"], 1, "the host has one lane: {r}");
    let rounds = r["settings"]["rounds"].as_u64().expect("rounds");
    let lane = &r["per_lane"][0];
    assert_eq!(
        (lane["lane"].as_u64(), lane["label"].as_str()),
        (Some(0), Some("cpu"))
    );
    assert_eq!(lane["n"], rounds, "{lane}");
    assert_eq!(lane["verdicts"]["ok"], rounds, "{lane}");
    assert_eq!(
        lane["devices_seen"],
        serde_json::json!([]),
        "no GPU on the host: {lane}"
    );
    let m = lane["median_us"].as_f64().expect("median");
    assert!(
        m > 0.0 && m >= lane["min_us"].as_f64().unwrap_or(f64::NAN),
        "{lane}"
    );
    assert_eq!(r["comparison"]["factor_vs_lane0"]["0"], 1.0);
    assert_eq!(
        r["comparison"]["within_1pct"], false,
        "one lane: nothing compared"
    );
    // Isolation needs the cuda backend (its red-team kernels are CUDA): skipped, and it
    // says why.
    let why = r["isolation"]["skipped"].as_str().expect("skipped");
    assert!(
        why.contains("needs the cuda backend") && why.contains("host"),
        "{why}"
    );
}
