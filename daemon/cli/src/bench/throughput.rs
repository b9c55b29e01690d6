//! `kiln bench throughput`: a stream of distinct candidates through the daemon, end to
//! end: candidates per minute (per lane), each lane's busy fraction, per-stage latency
//! percentiles, with the lane count and the CPU count (compiles run on the CPUs: with too
//! few per lane they starve the lanes); once with every compile fresh, then again with the
//! same sources as new evaluations whose artifacts are cached.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use kiln_daemon::client::Client;
use kiln_types::{JobOptions, RaceAgainst};
use serde_json::{Value, json};

use super::common::{self, Finished, Variants, Work};
use crate::Output;
use crate::output::{print_json, text};

/// Arguments of `kiln bench throughput`.
#[derive(Debug, Args)]
pub struct ThroughputArgs {
    /// The problem (default: softmax-4096x65536 on cuda, softmax-256x4096 on host).
    #[arg(long)]
    problem: Option<String>,
    /// Backend: host or cuda (default: cuda when usable, else host).
    #[arg(long)]
    backend: Option<String>,
    /// Candidates in this language (c, cuda, triton): the problem's seed for it (triton
    /// runs on cuda; every Triton candidate compiles in the jail with Triton's compiler).
    #[arg(long, value_parser = ["c", "cuda", "triton"], conflicts_with = "candidate")]
    language: Option<String>,
    /// Derive the candidates from this candidate file (JSON, as for `kiln submit`) instead
    /// of the problem's seed: any registered problem works, an imported one without a
    /// seed included. Each candidate differs by its first knob and a comment tag.
    #[arg(long, value_name = "FILE")]
    candidate: Option<std::path::PathBuf>,
    /// Distinct candidates per pass (default 60; 4 with --smoke).
    #[arg(long)]
    count: Option<usize>,
    /// Candidates outstanding at once, as a search keeps its queue filled (default 8).
    #[arg(long, default_value_t = 8)]
    in_flight: usize,
    /// Race each candidate against the problem's best (as a search does with
    /// `search.race`); without it every candidate runs the full stop rule.
    #[arg(long)]
    race: bool,
    /// With --race: the margin (default: the daemon's `search.race_margin`).
    #[arg(long, requires = "race")]
    race_margin: Option<f64>,
    /// How candidates differ from the seed.
    #[arg(long, value_enum, default_value_t = Variants::Knob)]
    variants: Variants,
    /// Skip the second pass (the same sources again, compiles cached).
    #[arg(long)]
    no_cached: bool,
    /// Give up on one candidate after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// A short run that checks the benchmark works (CI), not how fast.
    #[arg(long)]
    smoke: bool,
}

/// Runs the benchmark and prints its report.
pub async fn run(
    client: &Client,
    out: Output,
    a: ThroughputArgs,
) -> Result<std::process::ExitCode> {
    let candidate = match &a.candidate {
        Some(file) => Some(common::read_candidate(file)?),
        None => None,
    };
    let setup = common::setup_from(
        client,
        a.problem.as_deref(),
        a.backend.as_deref(),
        a.language.as_deref(),
        candidate,
        common::softmax_problem,
    )
    .await?;
    let count = a.count.unwrap_or(if a.smoke { 4 } else { 60 }).max(1);
    let in_flight = if a.smoke {
        a.in_flight.min(2)
    } else {
        a.in_flight
    };
    let timeout = Duration::from_secs(a.timeout);
    let options = JobOptions {
        race: a.race.then(|| RaceAgainst::Named("best".into())),
        race_margin: a.race_margin,
        ..JobOptions::default()
    };
    options.validate().map_err(anyhow::Error::msg)?;
    let tag = common::run_tag();
    let mut report = common::header("throughput", &setup, a.smoke);
    let lanes = common::lanes(&setup.info, &setup.backend).len().max(1);
    let cpus = setup.info["host"]["cpus"].as_u64();
    report["lanes"] = json!(lanes);
    report["cpus"] = json!(cpus);
    report["cpus_per_lane"] = json!(cpus.map(|c| c as f64 / lanes as f64));
    report["settings"] = json!({
        "count": count, "in_flight": in_flight, "race": a.race, "race_margin": a.race_margin,
        "variants": a.variants, "timeout_s": a.timeout, "tag": tag,
        "language": setup.seed.language,
    });
    if out == Output::Text {
        eprintln!(
            "throughput: {} ({}) on {}, {count} candidates per pass, {in_flight} in flight, racing {}",
            setup.problem,
            setup.seed.language.as_str(),
            setup.backend,
            if a.race { "on" } else { "off" }
        );
    }

    let fresh: Vec<Work> = (0..count)
        .map(|i| {
            Work::Submit(
                Box::new(common::variant(&setup.seed, &tag, i, a.variants)),
                options.clone(),
            )
        })
        .collect();
    let (first, done) = pass(
        client,
        &setup.backend,
        "uncached",
        fresh,
        in_flight,
        timeout,
    )
    .await?;
    let mut passes = vec![first];
    if !a.no_cached {
        let again: Vec<Work> = done
            .iter()
            .map(|d| Work::Again(d.candidate.clone(), options.clone()))
            .collect();
        passes.push(
            pass(client, &setup.backend, "cached", again, in_flight, timeout)
                .await?
                .0,
        );
    }
    let untimed: u64 = passes
        .iter()
        .filter_map(|p| p["ok_without_a_time"].as_u64())
        .sum();
    report["passes"] = Value::Array(passes);
    if out == Output::Json {
        print_json(&report);
    } else {
        print_table(&report);
    }
    if untimed > 0 {
        eprintln!(
            "FAIL: {untimed} `ok` verdicts carry a median of 0 or a sample at or below the \
             timer's overhead: kiln must never rank such a time"
        );
        return Ok(std::process::ExitCode::from(2));
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// One pass: the work through the daemon, with the lanes' busy time read around it.
async fn pass(
    client: &Client,
    backend: &str,
    name: &str,
    work: Vec<Work>,
    in_flight: usize,
    timeout: Duration,
) -> Result<(Value, Vec<Finished>)> {
    let before = common::lane_busy(client, backend).await?;
    let t0 = Instant::now();
    let done = common::stream(client, work, in_flight, timeout).await?;
    let wall_s = t0.elapsed().as_secs_f64();
    let after = common::lane_busy(client, backend).await?;
    let busy = common::busy_fractions(&before, &after, wall_s);
    // Lanes of this backend the daemon reports; one when it reports none yet.
    let lanes = after.len().max(1);
    let per_minute = done.len() as f64 / wall_s.max(1e-9) * 60.0;
    let busy_mean = (!busy.is_empty()).then(|| busy.values().sum::<f64>() / busy.len() as f64);
    let cached = done
        .iter()
        .filter(|d| d.compile_cached == Some(true))
        .count();
    let v = json!({
        "name": name,
        "candidates": done.len(),
        "wall_s": wall_s,
        "per_minute": per_minute,
        "lanes": lanes,
        "per_minute_per_lane": per_minute / lanes as f64,
        "lane_busy_fraction": busy,
        "busy_fraction": busy_mean,
        "verdicts": common::verdict_counts(&done),
        "raced_out": done.iter().filter(|d| d.raced_out).count(),
        "ok_without_a_time": done.iter().filter(|d| d.ok_without_a_time).count(),
        "compile_cached": cached,
        "latency_ms": common::stage_summaries(&done),
    });
    Ok((v, done))
}

fn print_table(r: &Value) {
    let s = &r["settings"];
    println!(
        "throughput  {} on {}  ({} candidates a pass, {} in flight, racing {})",
        text(&r["problem"]),
        text(&r["backend"]),
        text(&s["count"]),
        text(&s["in_flight"]),
        if s["race"].as_bool() == Some(true) {
            "on"
        } else {
            "off"
        }
    );
    println!(
        "{} lane(s), {} CPUs ({} per lane)",
        text(&r["lanes"]),
        text(&r["cpus"]),
        r["cpus_per_lane"]
            .as_f64()
            .map_or("-".into(), |c| format!("{c:.1}"))
    );
    println!(
        "{:<9} {:>6} {:>8} {:>8} {:>9} {:>6} {:>5} {:>6} {:>7}",
        "pass", "cands", "wall s", "per min", "min/lane", "busy", "ok", "raced", "other"
    );
    let passes = r["passes"].as_array().cloned().unwrap_or_default();
    for p in &passes {
        let verdicts: BTreeMap<String, u64> =
            serde_json::from_value(p["verdicts"].clone()).unwrap_or_default();
        let ok = verdicts.get("ok").copied().unwrap_or(0);
        let other: u64 = verdicts.values().sum::<u64>() - ok;
        println!(
            "{:<9} {:>6} {:>8.1} {:>8.1} {:>9.1} {:>6} {:>5} {:>6} {:>7}",
            text(&p["name"]),
            text(&p["candidates"]),
            p["wall_s"].as_f64().unwrap_or(0.0),
            p["per_minute"].as_f64().unwrap_or(0.0),
            p["per_minute_per_lane"].as_f64().unwrap_or(0.0),
            p["busy_fraction"]
                .as_f64()
                .map_or("-".into(), |b| format!("{:.1}%", b * 100.0)),
            ok,
            text(&p["raced_out"]),
            other
        );
    }
    println!();
    println!("lane busy fraction, per pass:");
    for p in &passes {
        let per_lane: Vec<String> = p["lane_busy_fraction"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(lane, b)| format!("lane {lane} {:.1}%", b.as_f64().unwrap_or(0.0) * 100.0))
            .collect();
        println!("  {:<9} {}", text(&p["name"]), per_lane.join(", "));
    }
    println!();
    common::print_stage_table(&passes);
}
