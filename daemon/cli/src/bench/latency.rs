//! `kiln bench latency`: submit → verdict for a tiny kernel whose compile is cached.
//!
//! The seed kernel is submitted (or found) and evaluated once so that its artifact and
//! the reference's are in the compile cache; then it is queued again `count` times, one at
//! a time on an otherwise idle daemon, and each request is timed from the POST to the
//! verdict in hand.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::Args;
use kiln_daemon::client::Client;
use kiln_types::BackendKind;
use kiln_types::JobOptions;
use serde_json::{Value, json};

use super::common::{self, Work};
use crate::Output;
use crate::output::{print_json, text};

/// Arguments of `kiln bench latency`.
#[derive(Debug, Args)]
pub struct LatencyArgs {
    /// The problem (default: vecadd-cuda-1m on cuda, vecadd-4096 on host).
    #[arg(long)]
    problem: Option<String>,
    /// Backend: host or cuda (default: cuda when usable, else host).
    #[arg(long)]
    backend: Option<String>,
    /// Measured requests (default 20; 3 with --smoke).
    #[arg(long)]
    count: Option<usize>,
    /// Give up on one request after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// A short run that checks the benchmark works (CI), not how fast.
    #[arg(long)]
    smoke: bool,
}

fn default_problem(backend: &str) -> &'static str {
    if backend == BackendKind::Cuda {
        "vecadd-cuda-1m"
    } else {
        "vecadd-4096"
    }
}

/// Runs the benchmark and prints its report.
pub async fn run(client: &Client, out: Output, a: LatencyArgs) -> Result<std::process::ExitCode> {
    let setup = common::setup(
        client,
        a.problem.as_deref(),
        a.backend.as_deref(),
        None,
        default_problem,
    )
    .await?;
    let count = a.count.unwrap_or(if a.smoke { 3 } else { 20 }).max(1);
    let timeout = Duration::from_secs(a.timeout);

    // Warm the compile cache: the seed as it is (a duplicate is fine), evaluated once.
    let (_, resp) = client.post("/v1/candidates", &json!(setup.seed)).await?;
    let id = resp["id"].as_str().unwrap_or_default().to_string();
    let warm_job = resp["job_id"].as_i64().unwrap_or_default();
    let warm = common::wait_job(client, warm_job, timeout).await?;
    if warm["evaluation"]["verdict"] == "compile_error" || warm["state"] == "failed" {
        bail!(
            "the seed of {} does not evaluate on {}: {}",
            setup.problem,
            setup.backend,
            warm["evaluation"]["message"]
                .as_str()
                .or(warm["error"].as_str())
                .unwrap_or("no detail")
        );
    }

    let mut done = Vec::with_capacity(count);
    for _ in 0..count {
        let t0 = Instant::now();
        let (cid, job) =
            common::queue(client, &Work::Again(id.clone(), JobOptions::default())).await?;
        let r = common::wait_job(client, job, timeout).await?;
        done.push(common::finished(&cid, &r, t0.elapsed().as_secs_f64() * 1e3));
    }
    let mut report = common::header("latency", &setup, a.smoke);
    report["settings"] = json!({"count": count, "timeout_s": a.timeout});
    report["candidate"] = json!(id);
    report["verdicts"] = json!(common::verdict_counts(&done));
    report["compile_cached"] = json!(
        done.iter()
            .filter(|d| d.compile_cached == Some(true))
            .count()
    );
    report["latency_ms"] = json!(common::stage_summaries(&done));
    if out == Output::Json {
        print_json(&report);
    } else {
        print_table(&report);
    }
    Ok(std::process::ExitCode::SUCCESS)
}

fn print_table(r: &Value) {
    let e2e = &r["latency_ms"]["end_to_end"];
    println!(
        "latency  {} on {}  ({} requests, compile cached)",
        text(&r["problem"]),
        text(&r["backend"]),
        text(&r["settings"]["count"])
    );
    println!(
        "submit → verdict: p50 {} ms  p90 {} ms  max {} ms",
        common::ms(e2e["p50"].as_f64().unwrap_or(0.0)),
        common::ms(e2e["p90"].as_f64().unwrap_or(0.0)),
        common::ms(e2e["max"].as_f64().unwrap_or(0.0))
    );
    println!();
    let mut set = r.clone();
    set["name"] = json!("latency");
    common::print_stage_table(&[set]);
}
