//! `kiln show ID`: a candidate, its job and its evaluation.

use anyhow::{Result, bail};
use clap::Args;
use kiln_daemon::client::Client;
use serde_json::Value;

use crate::Output;
use crate::output::{fmt_us, print_json, text};

/// Arguments of `kiln show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Candidate id (as printed by `kiln submit`).
    id: String,
    /// Wait up to this many seconds for the evaluation.
    #[arg(long, default_value_t = 0)]
    wait: u64,
    /// Write the candidate's report instead: an HTML page with its timing samples as a
    /// histogram, the GPU's clock and power over the timing window, and its trials.
    #[arg(long)]
    report: bool,
    /// With `--report`: write the page to this file instead of stdout.
    #[arg(short = 'O', long = "out", value_name = "FILE", requires = "report")]
    out: Option<std::path::PathBuf>,
}

/// Shows a candidate.
pub async fn show(client: &Client, out: Output, a: ShowArgs) -> Result<std::process::ExitCode> {
    if a.report {
        if a.wait > 0 {
            wait_for(client, &a.id, a.wait).await?;
        }
        crate::report::fetch(
            client,
            &format!("/v1/candidates/{}/report", a.id),
            a.out.as_deref(),
        )
        .await?;
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let record = if a.wait > 0 {
        wait_for(client, &a.id, a.wait).await?
    } else {
        client.get(&format!("/v1/candidates/{}", a.id)).await?
    };
    if out == Output::Json {
        print_json(&record);
    } else {
        print_record(&record);
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Long-polls until the candidate's evaluation exists or its job failed.
pub async fn wait_for(client: &Client, id: &str, timeout_s: u64) -> Result<Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(timeout_s);
    loop {
        let left = deadline
            .saturating_duration_since(std::time::Instant::now())
            .as_secs();
        let chunk = left.clamp(1, 60);
        let r = client
            .get(&format!("/v1/candidates/{id}?wait={chunk}"))
            .await?;
        let state = r["job"]["state"].as_str().unwrap_or("");
        if !r["evaluation"].is_null() || state == "failed" {
            return Ok(r);
        }
        if left == 0 {
            bail!(
                "no verdict for {id} within {timeout_s} s (job state: {state}); `kiln show {id}` looks again later"
            );
        }
    }
}

/// Exit status for a finished record: 0 for `ok`, 2 for another verdict, 1 for a failed job.
pub fn exit_code(record: &Value) -> std::process::ExitCode {
    match record["evaluation"]["verdict"].as_str() {
        Some("ok") => std::process::ExitCode::SUCCESS,
        Some(_) => std::process::ExitCode::from(2),
        None => std::process::ExitCode::FAILURE,
    }
}

/// Prints a candidate record for people.
pub fn print_record(r: &Value) {
    let c = &r["candidate"];
    println!(
        "candidate {}  problem {}  backend {}",
        text(&r["id"]),
        text(&c["problem"]),
        text(&r["backend"])
    );
    if !c["note"].is_null() {
        println!("  note      {}", text(&c["note"]));
    }
    let job = &r["job"];
    let state = match job["state"].as_str() {
        Some("compiled") => "compiled, waiting for a lane".to_string(),
        Some("running") => format!("running on lane {}", text(&job["lane"])),
        _ => text(&job["state"]),
    };
    println!(
        "  job       {} {state} (evaluations started {})",
        text(&job["id"]),
        text(&job["attempts"])
    );
    if !job["error"].is_null() {
        println!("  error     {}", text(&job["error"]));
    }
    let e = &r["evaluation"];
    if e.is_null() {
        println!("  verdict   (not yet)");
        return;
    }
    let raced_out = e["timing"]["raced_out"].as_bool() == Some(true);
    println!(
        "  verdict   {}{} — {}",
        text(&e["verdict"]),
        if raced_out { " (raced out)" } else { "" },
        text(&e["message"])
    );
    if !e["tier"].is_null() {
        println!("  tier      {}", text(&e["tier"]));
    }
    if e["verdict"] == "unmeasurable_time" {
        println!("  time      unmeasurable: too short for the timer (never ranked)");
    }
    if let Some(t) = e["timing"].as_object() {
        let f = |k: &str| t.get(k).and_then(Value::as_f64).map_or("-".into(), fmt_us);
        println!(
            "  time      median {}  mean {}  min {}  max {}  stdev {}",
            f("median_us"),
            f("mean_us"),
            f("min_us"),
            f("max_us"),
            f("stdev_us")
        );
        println!(
            "            n {}  rse {:.3} %  stop {}  fresh inputs {}  rechecks {}",
            text(&t["n"]),
            t.get("rse").and_then(Value::as_f64).unwrap_or(0.0) * 100.0,
            text(&t["stop_reason"]),
            text(&t["fresh_inputs"]),
            text(&t["rechecks"])
        );
        if let Some(reps) = t.get("reps").and_then(Value::as_u64).filter(|&r| r > 1) {
            println!(
                "            {reps} runs per sample, each on fresh inputs (times are per run)"
            );
        }
        if let (Some(lo), Some(hi)) = (
            t.get("ci_low_us").and_then(Value::as_f64),
            t.get("ci_high_us").and_then(Value::as_f64),
        ) {
            println!(
                "            mean within {} … {} (95 %)",
                fmt_us(lo),
                fmt_us(hi)
            );
        }
        if let Some(tm) = t.get("timer").filter(|v| v.is_object()) {
            let med = |k: &str| tm[k]["median_us"].as_f64().map_or("-".into(), fmt_us);
            let how = match tm["source"].as_str() {
                Some("cupti") => "CUPTI kernel records".to_string(),
                _ => format!("events only: {}", text(&tm["fallback"])),
            };
            println!(
                "            timed by {} ({how}); kernel span {}  kernel sum {}  events {}",
                text(&tm["figure"]),
                med("kernel_span"),
                med("kernel_sum"),
                med("events")
            );
        }
        if raced_out {
            println!(
                "            raced out: clearly slower than the incumbent, timing stopped early (never ranked as a best)"
            );
        }
        if t.get("plain").and_then(Value::as_bool) == Some(true) {
            println!(
                "            plain timing (events around one launch, fixed samples, no L2 flush): for comparison, never ranked"
            );
        }
    }
    for line in crate::baselines::speedup_lines(&r["speedups"]) {
        println!("{line}");
    }
    let ev = &e["evidence"];
    if !ev.is_null() {
        println!(
            "  trials    {}/{} passed",
            text(&ev["trials_passed"]),
            text(&ev["trials_run"])
        );
        if let Some(f) = ev["fault"].as_str() {
            println!("  fault     {f}");
        }
        for m in ev["errors"].as_array().into_iter().flatten() {
            println!(
                "  error     {}: max abs {}  max rel {}  rel L2 {}  mismatches {}",
                text(&m["tensor"]),
                text(&m["max_abs"]),
                text(&m["max_rel"]),
                text(&m["rel_l2"]),
                text(&m["mismatches"])
            );
        }
        for t in ev["tampered_inputs"].as_array().into_iter().flatten() {
            println!("  tampered  {}", text(t));
        }
        for u in ev["unwritten"].as_array().into_iter().flatten() {
            println!(
                "  unwritten {} elements of {} (first {})",
                text(&u[1]),
                text(&u[0]),
                u[2]
            );
        }
        if let Some(o) = ev["output_excerpt"].as_str() {
            println!("  output    {}", o.lines().next().unwrap_or(""));
        }
        for n in ev["notes"].as_array().into_iter().flatten() {
            println!("  note      {}", text(n));
        }
    }
    if let Some(log) = e["compile"]["log"]
        .as_str()
        .filter(|l| !l.trim().is_empty())
    {
        println!("  compiler:");
        for line in log.lines().take(20) {
            println!("    {line}");
        }
    }
    for (label, text) in crate::telemetry::lines(&e["telemetry"]) {
        println!("  {label:<9} {text}");
    }
}
