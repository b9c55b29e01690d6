//! `kiln show ID`: a candidate, its job and its evaluation.

use anyhow::{Result, bail};
use clap::Args;
use kiln_daemon::client::Client;
use serde_json::Value;

use crate::Output;
use crate::output::{fmt_us, human, print_json, text};

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
        if (!r["evaluation"].is_null() && !lift_pending(&r["lift"])) || state == "failed" {
            return Ok(r);
        }
        if left == 0 {
            bail!(
                "no verdict for {id} within {timeout_s} s (job state: {state}); `kiln show {id}` looks again later"
            );
        }
    }
}

/// True while a hosted file's lifted candidate (kilnd queued it after the file's own
/// evaluation) has no verdict and its job has not failed.
pub fn lift_pending(lift: &Value) -> bool {
    lift["outcome"] == "lifted" && lift["verdict"].is_null() && lift["state"] != "failed"
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
    for line in record_lines(r) {
        println!("{line}");
    }
}

/// How the record's candidate is run (`contract`, `hosted`, `lifted`): kilnd's `trust`
/// (kilnd decides it, `kiln_types::TrustMode::of`), else its evaluation's; a kilnd from
/// before the record carried it: its language's mode (`kiln_types::Language::trust`).
fn trust(r: &Value) -> String {
    if let Some(t) = r["trust"]
        .as_str()
        .or_else(|| r["evaluation"]["trust"].as_str())
    {
        return t.to_string();
    }
    serde_json::from_value::<kiln_types::Language>(r["candidate"]["language"].clone())
        .map_or(kiln_types::TrustMode::Contract, kiln_types::Language::trust)
        .to_string()
}

/// A hosted file's `lift` (kilnd's record of lifting it into a contract candidate) as
/// lines: the lifted candidate with its result beside the file's hosted time, or why it
/// stayed hosted.
fn lift_lines(l: &Value) -> Vec<String> {
    match l["outcome"].as_str() {
        Some("lifted") => {
            let us = |k: &str| l[k].as_f64().map_or("-".into(), fmt_us);
            let mut out = vec![format!(
                "  lifted    {}  {}  median {}  (hosted median {}){}",
                text(&l["candidate_id"]),
                if l["verdict"].is_null() {
                    format!("job {}", text(&l["state"]))
                } else {
                    text(&l["verdict"])
                },
                us("median_us"),
                us("hosted_median_us"),
                if l["verdict"].is_null() {
                    ""
                } else {
                    "  — kiln launched it: trust lifted"
                }
            )];
            for n in l["notes"].as_array().into_iter().flatten() {
                out.push(format!("            {}", text(n)));
            }
            out
        }
        Some("not_lifted") => vec![format!(
            "  lifted    no ({}): {}",
            text(&l["code"]),
            text(&l["reason"])
        )],
        _ => Vec::new(),
    }
}

/// A candidate record as labelled lines for people (no JSON: the document itself is what
/// `-o json` prints).
pub fn record_lines(r: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let c = &r["candidate"];
    out.push(format!(
        "candidate {}  problem {}  backend {}  trust {}",
        text(&r["id"]),
        text(&c["problem"]),
        text(&r["backend"]),
        trust(r)
    ));
    if !c["note"].is_null() {
        out.push(format!("  note      {}", text(&c["note"])));
    }
    out.extend(lift_lines(&r["lift"]));
    let job = &r["job"];
    let state = match job["state"].as_str() {
        Some("compiled") => "compiled, waiting for a lane".to_string(),
        Some("running") => format!("running on lane {}", text(&job["lane"])),
        _ => text(&job["state"]),
    };
    out.push(format!(
        "  job       {} {state} (evaluations started {})",
        text(&job["id"]),
        text(&job["attempts"])
    ));
    if !job["error"].is_null() {
        out.push(format!("  error     {}", text(&job["error"])));
    }
    let e = &r["evaluation"];
    if e.is_null() {
        out.push("  verdict   (not yet)".to_string());
        return out;
    }
    let raced_out = e["timing"]["raced_out"].as_bool() == Some(true);
    out.push(format!(
        "  verdict   {}{} — {}",
        text(&e["verdict"]),
        if raced_out { " (raced out)" } else { "" },
        text(&e["message"])
    ));
    if !e["tier"].is_null() {
        out.push(format!("  tier      {}", text(&e["tier"])));
    }
    if e["verdict"] == "unmeasurable_time" {
        out.push("  time      unmeasurable: too short for the timer (never ranked)".to_string());
    }
    if let Some(t) = e["timing"].as_object() {
        let f = |k: &str| t.get(k).and_then(Value::as_f64).map_or("-".into(), fmt_us);
        out.push(format!(
            "  time      median {}  mean {}  min {}  max {}  stdev {}",
            f("median_us"),
            f("mean_us"),
            f("min_us"),
            f("max_us"),
            f("stdev_us")
        ));
        out.push(format!(
            "            n {}  rse {:.3} %  stop {}  fresh inputs {}  rechecks {}",
            // Through the Value: a field an older (or newer) kilnd left out reads as
            // nothing, never a panic of the map's index.
            text(&e["timing"]["n"]),
            t.get("rse").and_then(Value::as_f64).unwrap_or(0.0) * 100.0,
            text(&e["timing"]["stop_reason"]),
            text(&e["timing"]["fresh_inputs"]),
            text(&e["timing"]["rechecks"])
        ));
        if let Some(raw) = t.get("raw_median_us").and_then(Value::as_f64) {
            out.push(format!(
                "            net of the timer's overhead ({} per sample, kiln's empty round trip): \
                 raw median {}",
                f("overhead_us"),
                fmt_us(raw)
            ));
        }
        if let Some(reps) = t.get("reps").and_then(Value::as_u64).filter(|&r| r > 1) {
            out.push(format!(
                "            {reps} runs per sample, each on fresh inputs (times are per run)"
            ));
        }
        if let (Some(lo), Some(hi)) = (
            t.get("ci_low_us").and_then(Value::as_f64),
            t.get("ci_high_us").and_then(Value::as_f64),
        ) {
            out.push(format!(
                "            mean within {} … {} (95 %)",
                fmt_us(lo),
                fmt_us(hi)
            ));
        }
        if let Some(tm) = t.get("timer").filter(|v| v.is_object()) {
            let med = |k: &str| tm[k]["median_us"].as_f64().map_or("-".into(), fmt_us);
            let how = match tm["source"].as_str() {
                Some("cupti") => "CUPTI kernel records".to_string(),
                _ => format!("events only: {}", text(&tm["fallback"])),
            };
            out.push(format!(
                "            timed by {} ({how}); kernel span {}  kernel sum {}  events {}",
                text(&tm["figure"]),
                med("kernel_span"),
                med("kernel_sum"),
                med("events")
            ));
        }
        if raced_out {
            out.push(

                "            raced out: clearly slower than the incumbent, timing stopped early (never ranked as a best)"
                .to_string(),
            );
        }
        if t.get("plain").and_then(Value::as_bool) == Some(true) {
            out.push(

                "            plain timing (events around one launch, fixed samples, no L2 flush): for comparison, never ranked"
                .to_string(),
            );
        }
    }
    out.extend(crate::baselines::speedup_lines(&r["speedups"]));
    let ev = &e["evidence"];
    if !ev.is_null() {
        out.push(format!(
            "  trials    {}/{} passed",
            text(&ev["trials_passed"]),
            text(&ev["trials_run"])
        ));
        if let Some(f) = ev["fault"].as_str() {
            out.push(format!("  fault     {f}"));
        }
        for m in ev["errors"].as_array().into_iter().flatten() {
            out.push(format!(
                "  error     {}: max abs {}  max rel {}  rel L2 {}  mismatches {}",
                text(&m["tensor"]),
                text(&m["max_abs"]),
                text(&m["max_rel"]),
                text(&m["rel_l2"]),
                text(&m["mismatches"])
            ));
        }
        for t in ev["tampered_inputs"].as_array().into_iter().flatten() {
            out.push(format!("  tampered  {}", text(t)));
        }
        for u in ev["unwritten"].as_array().into_iter().flatten() {
            out.push(format!(
                "  unwritten {} elements of {} (first {})",
                text(&u[1]),
                text(&u[0]),
                human(&u[2])
            ));
        }
        if let Some(o) = ev["output_excerpt"].as_str() {
            out.push(format!("  output    {}", o.lines().next().unwrap_or("")));
        }
        for n in ev["notes"].as_array().into_iter().flatten() {
            out.push(format!("  note      {}", text(n)));
        }
    }
    if let Some(log) = e["compile"]["log"]
        .as_str()
        .filter(|l| !l.trim().is_empty())
    {
        out.push("  compiler:".to_string());
        for line in log.lines().take(20) {
            out.push(format!("    {line}"));
        }
    }
    for (label, text) in crate::telemetry::lines(&e["telemetry"]) {
        out.push(format!("  {label:<9} {text}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A finished cuda evaluation with everything `kiln show` prints: timing with its timer,
    /// speedups, evidence with unwritten elements, a compile log and the telemetry of a
    /// warm GPU lane (jail, device, clocks, lane, worker).
    fn cuda_record() -> Value {
        json!({
            "id": "3f9c", "backend": "cuda", "created_at": 1,
            "candidate": {"problem": "softmax-4096x65536", "language": "cuda", "note": "seed kernel"},
            "job": {"id": 7, "state": "done", "attempts": 1, "lane": 0, "error": null},
            "speedups": [{"baseline": "torch-eager", "precision": "fp32", "speedup": 1.25,
                          "baseline_us": 1054.0}],
            "evaluation": {
                "verdict": "ok", "message": "correct on 3 trials", "backend": "cuda",
                "tier": "fp32-faithful",
                "compile": {"duration_ms": 120.0, "cached": false, "log": "warning: unused x",
                            "kernels": [{"name": "softmax", "registers": 32}]},
                "evidence": {"trials_passed": 3, "trials_run": 3, "bitwise_diffs": 0,
                             "errors": [{"tensor": "y", "max_abs": 0.0, "max_rel": 0.0,
                                         "rel_l2": 0.0, "mismatches": 0,
                                         "first_mismatches": [{"index": 1, "got": 1.0, "want": 2.0}]}],
                             "unwritten": [["y", 12, [0, 1, 2]]],
                             "notes": ["reference: the problem's PyTorch module"]},
                "timing": {"median_us": 843.2, "mean_us": 844.0, "min_us": 840.0,
                           "max_us": 850.0, "stdev_us": 2.0, "n": 40, "rse": 0.001,
                           "stop_reason": "rse", "wall_ms": 50.0, "fresh_inputs": 40,
                           "rechecks": 4, "samples_us": [843.2, 844.0],
                           "timer": {"source": "cupti", "figure": "kernel_span",
                                     "kernel_span": {"median_us": 843.2},
                                     "kernel_sum": {"median_us": 842.9},
                                     "events": {"median_us": 846.1}}},
                "telemetry": {
                    "jail": {"active": ["user-namespace", "pid-namespace", "rlimits", "seccomp"],
                             "inactive": {"cgroup": "no delegated cgroup v2 directory configured"}},
                    "device": {"name": "NVIDIA H200", "arch": "sm_90", "uuid": "GPU-58ca"},
                    "kernels": [{"name": "softmax"}],
                    "gpu": {"available": true,
                            "summary": {"sm_mhz": {"min": 1980, "median": 1980, "max": 1980},
                                        "power_w_avg": 121.4, "power_w_max": 124.0,
                                        "temp_c_max": 37, "reasons_seen": []},
                            "series": {"t_ms": [0.0]},
                            "timing_samples": 40, "throttled_timing_samples": 0,
                            "throttle_policy": "report", "clock_policy": "observe"},
                    "lane": 0,
                    "worker": {"evaluations_served": 3, "retired": false, "warm": true}
                }
            }
        })
    }

    #[test]
    fn a_record_reads_as_labelled_lines_and_no_json() {
        let lines = record_lines(&cuda_record());
        let all = lines.join("\n");
        for want in [
            "candidate 3f9c  problem softmax-4096x65536  backend cuda  trust contract",
            "  verdict   ok — correct on 3 trials",
            "  unwritten 12 elements of y (first 0, 1, 2)",
            "  jail      namespaces user, pid; seccomp on; cgroup off (no delegated cgroup v2 \
             directory configured)",
            "            also on: rlimits",
            "  device    NVIDIA H200  sm_90  GPU-58ca",
            "  lane      0",
            "  worker    warm: evaluation 3 on this worker",
        ] {
            assert!(
                lines.iter().any(|l| l == want),
                "no line {want:?} in\n{all}"
            );
        }
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("  gpu       SM 1980 MHz; power 121 W avg")),
            "{all}"
        );
        for json_syntax in ["{\"", "\":", "[0", "[{"] {
            assert!(!all.contains(json_syntax), "{json_syntax:?} in\n{all}");
        }
    }

    #[test]
    fn the_trust_mode_is_printed_beside_the_backend() {
        let mut r = json!({"id": "a", "backend": "cuda", "trust": "hosted",
                           "candidate": {"problem": "p", "language": "modelnew"},
                           "job": {"id": 1, "state": "queued", "attempts": 0, "error": null},
                           "evaluation": null});
        let first = |r: &Value| record_lines(r)[0].clone();
        assert_eq!(
            first(&r),
            "candidate a  problem p  backend cuda  trust hosted"
        );
        // From an older kilnd: the language says it.
        r.as_object_mut().map(|o| o.remove("trust"));
        assert!(first(&r).ends_with("trust hosted"), "{}", first(&r));
        r["candidate"]["language"] = json!("c");
        assert!(first(&r).ends_with("trust contract"), "{}", first(&r));
    }

    /// A hosted record: the net median with the raw one and the overhead beside it, and
    /// each speedup with its harness (the in-process one marked not comparable).
    #[test]
    fn a_hosted_time_shows_its_raw_median_and_speedups_their_harness() {
        let r = json!({"id": "h", "backend": "cuda", "trust": "hosted",
            "candidate": {"problem": "p", "language": "modelnew"},
            "job": {"id": 1, "state": "done", "attempts": 1, "error": null},
            "evaluation": {"verdict": "ok", "message": "m", "backend": "cuda", "trust": "hosted",
                "timing": {"median_us": 40.0, "n": 10, "overhead_us": 200.0,
                           "raw_median_us": 240.0}},
            "speedups": [
                {"baseline": "torch-eager-hosted", "precision": "", "speedup": 1.0,
                 "baseline_us": 40.0, "harness": "hosted", "same_harness": true},
                {"baseline": "torch-eager-fp32", "precision": "fp32", "speedup": 0.25,
                 "baseline_us": 10.0, "harness": "in_process", "same_harness": false}]});
        let text = record_lines(&r).join("\n");
        assert!(text.contains("raw median 240.0"), "{text}");
        assert!(text.contains("vs torch-eager-hosted (hosted,"), "{text}");
        assert!(
            text.contains("vs torch-eager-fp32 (fp32, in process,")
                && text.contains("another harness than this candidate's: not comparable"),
            "{text}"
        );
    }

    #[test]
    fn a_record_without_an_evaluation_says_so() {
        let r = json!({"id": "a", "backend": "host", "candidate": {"problem": "p"},
                       "job": {"id": 1, "state": "queued", "attempts": 0, "error": null},
                       "evaluation": null});
        let lines = record_lines(&r);
        assert_eq!(
            lines.last().map(String::as_str),
            Some("  verdict   (not yet)")
        );
    }
}
