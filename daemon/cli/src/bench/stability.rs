//! `kiln bench stability`: one kernel evaluated N times, interleaved with other
//! candidates; the coefficient of variation of its medians, judged against `--max-cv`
//! (a `PASS`/`FAIL` line; exit status 1 on `FAIL`, except with `--smoke`). In the same run
//! the same kernel is also timed by a plain loop (events around one launch, a fixed number
//! of samples, no L2 flush — what KernelBench did), for comparison.

use std::time::Duration;

use anyhow::Result;
use clap::Args;
use kiln_daemon::client::Client;
use kiln_types::JobOptions;
use serde_json::{Value, json};

use super::common::{self, Finished, Variants, Work};
use crate::Output;
use crate::output::{fmt_us, print_json, text};

/// Arguments of `kiln bench stability`.
#[derive(Debug, Args)]
pub struct StabilityArgs {
    /// The problem (default: softmax-4096x65536 on cuda, softmax-256x4096 on host).
    #[arg(long)]
    problem: Option<String>,
    /// Backend: host or cuda (default: cuda when usable, else host).
    #[arg(long)]
    backend: Option<String>,
    /// Evaluations of the kernel (default 10; 3 with --smoke).
    #[arg(long)]
    rounds: Option<usize>,
    /// Other candidates queued around each evaluation of the kernel (default 2; 1 with --smoke).
    #[arg(long)]
    interleave: Option<usize>,
    /// Samples of each plain-loop timing.
    #[arg(long, default_value_t = 100)]
    plain_reps: u32,
    /// Skip the plain loop.
    #[arg(long)]
    no_plain: bool,
    /// How the other candidates differ from the seed.
    #[arg(long, value_enum, default_value_t = Variants::Knob)]
    variants: Variants,
    /// Give up on one evaluation after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// The CV of the medians that passes (0.005 = 0.5 %).
    #[arg(long, default_value_t = 0.005)]
    max_cv: f64,
    /// A short run that checks the benchmark works (CI), not how fast.
    #[arg(long)]
    smoke: bool,
}

/// Runs the benchmark and prints its report.
pub async fn run(client: &Client, out: Output, a: StabilityArgs) -> Result<std::process::ExitCode> {
    let setup = common::setup(
        client,
        a.problem.as_deref(),
        a.backend.as_deref(),
        None,
        common::softmax_problem,
    )
    .await?;
    let rounds = a.rounds.unwrap_or(if a.smoke { 3 } else { 10 }).max(2);
    let interleave = a.interleave.unwrap_or(if a.smoke { 1 } else { 2 });
    let timeout = Duration::from_secs(a.timeout);
    let tag = common::run_tag();
    let plain = JobOptions {
        plain: Some(a.plain_reps),
        ..JobOptions::default()
    };
    plain.validate().map_err(anyhow::Error::msg)?;

    // The kernel: the seed with this run's tag, evaluated once first (compile, warm-up).
    let mut kernel = setup.seed.clone();
    kernel.source = format!("/* kiln bench {tag} stability kernel */\n{}", kernel.source);
    kernel.note = Some(format!("kiln bench {tag} stability kernel"));
    let first = common::first_ok(
        client,
        &setup,
        Work::Submit(Box::new(kernel), JobOptions::default()),
        timeout,
    )
    .await?;
    let id = first.candidate.clone();

    // Each round: other candidates and the kernel (stop rule, then plain) in one batch,
    // so their jobs interleave in the queue and on the lane.
    let mut work = Vec::new();
    let mut other = 0usize;
    for _ in 0..rounds {
        for k in 0..=interleave {
            if k == interleave / 2 {
                work.push(Work::Again(id.clone(), JobOptions::default()));
                if !a.no_plain {
                    work.push(Work::Again(id.clone(), plain.clone()));
                }
            }
            if k < interleave {
                work.push(Work::Submit(
                    Box::new(common::variant(&setup.seed, &tag, other, a.variants)),
                    JobOptions::default(),
                ));
                other += 1;
            }
        }
    }
    let in_flight = interleave + 2;
    let done = common::stream(client, work, in_flight, timeout).await?;
    let mine: Vec<&Finished> = done.iter().filter(|d| d.candidate == id).collect();
    let (plain_done, contract_done): (Vec<&Finished>, Vec<&Finished>) =
        mine.iter().partition(|d| d.plain);

    let mut report = common::header("stability", &setup, a.smoke);
    report["settings"] = json!({
        "rounds": rounds, "interleave": interleave, "plain_reps": a.plain_reps,
        "plain": !a.no_plain, "variants": a.variants, "tag": tag,
    });
    report["candidate"] = json!(id);
    report["other_candidates"] = json!(other);
    report["contract"] = common::spread(&contract_done);
    report["figure"] = first.timer["figure"].clone();
    report["timer_source"] = first.timer["source"].clone();
    let cv = report["contract"]["cv"].as_f64().unwrap_or(f64::INFINITY);
    let pass = contract_done.len() >= 2 && cv <= a.max_cv;
    report["max_cv"] = json!(a.max_cv);
    report["pass"] = json!(pass);
    if !a.no_plain {
        report["plain"] = common::spread(&plain_done);
        let c = report["contract"]["mean_us"].as_f64().unwrap_or(0.0);
        let p = report["plain"]["mean_us"].as_f64().unwrap_or(0.0);
        report["plain_over_contract"] = json!(if c > 0.0 { p / c } else { 0.0 });
    }
    if out == Output::Json {
        print_json(&report);
    } else {
        print_table(&report);
    }
    Ok(if pass || a.smoke {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

fn print_table(r: &Value) {
    println!(
        "stability  {} on {}  (kernel {}, {} rounds, {} other candidates around each)",
        text(&r["problem"]),
        text(&r["backend"]),
        text(&r["candidate"]),
        text(&r["settings"]["rounds"]),
        text(&r["settings"]["interleave"])
    );
    println!(
        "{:<10} {:>4} {:>12} {:>12} {:>12} {:>9}",
        "timing", "n", "mean median", "min", "max", "CV"
    );
    for key in ["contract", "plain"] {
        let s = &r[key];
        if s.is_null() {
            continue;
        }
        let us = |k: &str| fmt_us(s[k].as_f64().unwrap_or(0.0));
        println!(
            "{:<10} {:>4} {:>12} {:>12} {:>12} {:>8.3}%",
            key,
            text(&s["n"]),
            us("mean_us"),
            us("min_us"),
            us("max_us"),
            s["cv"].as_f64().unwrap_or(0.0) * 100.0
        );
    }
    if let Some(ratio) = r["plain_over_contract"].as_f64() {
        println!("plain / contract mean median: {ratio:.3}");
    }
    println!(
        "{} stability {}: CV of {} medians {:.3}% (limit {:.3}%; timed by {} from {})",
        if r["pass"].as_bool() == Some(true) {
            "PASS"
        } else {
            "FAIL"
        },
        text(&r["problem"]),
        text(&r["contract"]["n"]),
        r["contract"]["cv"].as_f64().unwrap_or(f64::NAN) * 100.0,
        r["max_cv"].as_f64().unwrap_or(0.0) * 100.0,
        text(&r["figure"]),
        text(&r["timer_source"])
    );
    if r["contract"]["mean_us"].as_f64().unwrap_or(0.0) < 100.0 {
        println!(
            "note: the kernel runs under 100 µs; the CV target is stated for ≥ 100 µs kernels"
        );
    }
}
