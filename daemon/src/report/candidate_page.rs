//! The candidate page (`kiln show ID --report`): its verdict and timing statistics, its
//! timing samples as a histogram, the GPU's SM clock and power over the timing window,
//! and its trials with their errors. While its job is queued or running the page reloads
//! itself every [`REFRESH_SECS`] seconds.

use kiln_types::{Evaluation, TimingStats};
use serde_json::Value;

use super::html::{self, esc, esc_cut, figure, id};
use super::inputs::CandidateInputs;
use super::plots;
use super::points::class_of;
use super::search_page::date;
use super::style::{fmt_us, fmt_x, tier_name, trust_text};
use crate::store::JobState;

/// Seconds between reloads while the candidate's job has not ended.
pub const REFRESH_SECS: u32 = 3;

fn timing_rows(e: &Evaluation, rows: &mut Vec<(&'static str, String)>) {
    let Some(t) = &e.timing else {
        return;
    };
    rows.push((
        "time",
        esc(&format!(
            "median {}  mean {}  min {}  max {}  stdev {}",
            fmt_us(t.median_us),
            fmt_us(t.mean_us),
            fmt_us(t.min_us),
            fmt_us(t.max_us),
            fmt_us(t.stdev_us)
        )),
    ));
    let (lo, hi) = t.interval95();
    rows.push((
        "samples",
        esc(&format!(
            "n {}, rse {:.3} %, stopped: {}, mean within {} … {} (95 %), {} fresh input sets, {} rechecks, timer overhead {} subtracted",
            t.n,
            t.rse * 100.0,
            t.stop_reason,
            fmt_us(lo),
            fmt_us(hi),
            t.fresh_inputs,
            t.rechecks,
            fmt_us(t.overhead_us)
        )),
    ));
    rows.push(("timer", esc(&timer_line(t))));
    if t.throttled_discarded > 0 || t.throttle_retried {
        rows.push((
            "throttling",
            esc(&format!(
                "{} throttled samples dropped{}",
                t.throttled_discarded,
                if t.throttle_retried {
                    "; timed a second time"
                } else {
                    ""
                }
            )),
        ));
    }
}

/// What the times are of: the runs per sample, and on the GPU the figure ranked (kernel
/// records or events), where it came from and why it is not the one asked for.
fn timer_line(t: &TimingStats) -> String {
    let runs = if t.plain {
        "plain timing".to_string()
    } else {
        format!(
            "{} run{} per sample (each sample is their mean)",
            t.reps,
            if t.reps == 1 { "" } else { "s" }
        )
    };
    let Some(ev) = &t.timer else {
        return runs;
    };
    let mut line = format!("{runs}; figure {} from {}", ev.figure.name(), ev.source);
    if ev.asked != ev.figure {
        line.push_str(&format!(" (asked for {})", ev.asked.name()));
    }
    if let Some(why) = &ev.fallback {
        line.push_str(&format!(": {}", cut(why, 300)));
    }
    if ev.launches > 0 {
        line.push_str(&format!(", {} launches per run", ev.launches));
    }
    if ev.records_missing > 0 {
        line.push_str(&format!(
            ", {} samples without kernel records (counted by events{})",
            ev.records_missing,
            ev.records_missing_reason
                .as_deref()
                .map(|r| format!(": {}", cut(r, 300)))
                .unwrap_or_default()
        ));
    }
    line
}

/// At most `max` characters of `s`.
fn cut(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

fn telemetry_section(e: &Evaluation) -> String {
    let mut out = String::from("<h2>GPU over the timing window</h2>");
    let gpu = e.telemetry.as_ref().and_then(|t| t.get("gpu"));
    let Some(gpu) = gpu else {
        out.push_str(&format!(
            "<p class=\"muted\">No GPU telemetry: the {} backend reports none{}.</p>",
            esc(&e.backend),
            if e.timing.is_none() {
                ", and this evaluation was not timed"
            } else {
                ""
            }
        ));
        return out;
    };
    if gpu.get("available") == Some(&Value::Bool(false)) {
        out.push_str(&format!(
            "<p class=\"muted\">NVML telemetry was not available: {}.</p>",
            esc_cut(
                gpu.get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("no reason given"),
                500
            )
        ));
        return out;
    }
    let sum = gpu.get("summary").cloned().unwrap_or(Value::Null);
    let mmm = |k: &str| {
        let v = &sum[k];
        match (v["min"].as_f64(), v["median"].as_f64(), v["max"].as_f64()) {
            (Some(a), Some(b), Some(c)) => format!("{a:.0} / {b:.0} / {c:.0} MHz"),
            _ => "-".into(),
        }
    };
    let num = |v: &Value, unit: &str| v.as_f64().map_or("-".into(), |x| format!("{x:.0} {unit}"));
    let reasons: Vec<String> = sum["reasons_seen"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .take(20)
        .map(esc)
        .collect();
    let rows = vec![
        ("SM clock min / median / max", mmm("sm_mhz")),
        ("memory clock min / median / max", mmm("mem_mhz")),
        (
            "power mean / peak",
            format!(
                "{} / {}",
                num(&sum["power_w_avg"], "W"),
                num(&sum["power_w_max"], "W")
            ),
        ),
        ("peak temperature", num(&sum["temp_c_max"], "°C")),
        (
            "clock-event reasons seen",
            if reasons.is_empty() {
                "none".into()
            } else {
                reasons.join(", ")
            },
        ),
        (
            "timed samples that ran throttled",
            format!(
                "{} of {}",
                gpu["throttled_timing_samples"].as_u64().unwrap_or(0),
                gpu["timing_samples"].as_u64().unwrap_or(0)
            ),
        ),
        (
            "policies",
            esc(&format!(
                "throttle {}, clocks {}",
                gpu["throttle_policy"].as_str().unwrap_or("-"),
                gpu["clock_policy"].as_str().unwrap_or("-")
            )),
        ),
    ];
    out.push_str(&html::facts(&rows));
    match plots::telemetry::series(e.telemetry.as_ref()) {
        Some(s) => out.push_str(&figure(
            "telemetry",
            plots::telemetry::plot(&s),
            &format!(
                "{} NVML readings over the timing window (red crosses: readings with a throttling reason).",
                s.t_ms.len()
            ),
        )),
        None => out.push_str(
            "<p class=\"muted\">No readings were kept with this evaluation (only their summary).</p>",
        ),
    }
    out
}

fn trials_section(e: &Evaluation) -> String {
    let ev = &e.evidence;
    let mut rows = vec![(
        "trials",
        format!("{} of {} passed", ev.trials_passed, ev.trials_run),
    )];
    if let Some(d) = &ev.deciding_trial {
        rows.push(("deciding trial", esc_cut(d, 300)));
    }
    if let Some(f) = &ev.fault {
        rows.push((
            "fault",
            format!("<span class=\"bad\">{}</span>", esc_cut(f, 500)),
        ));
    }
    if !ev.tampered_inputs.is_empty() {
        rows.push((
            "inputs changed",
            esc_cut(&ev.tampered_inputs.join(", "), 500),
        ));
    }
    for (tensor, n, first) in ev.unwritten.iter().take(20) {
        let first: Vec<String> = first.iter().take(8).map(u64::to_string).collect();
        rows.push((
            "unwritten",
            esc(&format!(
                "{n} elements of {tensor} (first {})",
                first.join(", ")
            )),
        ));
    }
    if ev.bitwise_diffs > 0 {
        rows.push(("run-to-run differences", ev.bitwise_diffs.to_string()));
    }
    for n in ev.notes.iter().take(20) {
        rows.push(("note", esc_cut(n, 500)));
    }
    if let Some(ms) = ev.correctness_ms {
        rows.push(("correctness stage", esc(&format!("{ms:.1} ms"))));
    }
    let mut out = format!("<h2>Trials and errors</h2>{}", html::facts(&rows));
    if !ev.errors.is_empty() {
        let rows: Vec<Vec<String>> = ev
            .errors
            .iter()
            .take(64)
            .map(|m| {
                let first: Vec<String> = m
                    .first_mismatches
                    .iter()
                    .take(5)
                    .map(|x| format!("[{}] {:.6e} vs {:.6e}", x.index, x.got, x.want))
                    .collect();
                vec![
                    esc(&m.tensor),
                    format!("{:.3e}", m.max_abs),
                    format!("{:.3e}", m.max_rel),
                    format!("{:.3e}", m.rel_l2),
                    format!(
                        "<span class=\"{}\">{}</span>",
                        if m.mismatches > 0 { "bad" } else { "good" },
                        m.mismatches
                    ),
                    m.nonfinite_mismatches.to_string(),
                    esc(&first.join("; ")),
                ]
            })
            .collect();
        out.push_str(&html::table(
            "errors",
            &[
                "output",
                "max abs",
                "max rel",
                "rel L2",
                "mismatches",
                "NaN/Inf mismatches",
                "first mismatches (got vs want)",
            ],
            &rows,
        ));
    }
    if let Some(o) = &ev.output_excerpt {
        out.push_str(&format!(
            "<p>What the candidate printed:</p><pre>{}</pre>",
            esc_cut(o, 4000)
        ));
    }
    if let Some(log) = e
        .compile
        .as_ref()
        .map(|c| c.log.trim())
        .filter(|l| !l.is_empty())
    {
        out.push_str(&format!(
            "<p>Compiler output:</p><pre>{}</pre>",
            esc_cut(log, 8000)
        ));
    }
    out
}

/// The page.
pub fn page(inp: &CandidateInputs) -> String {
    let r = &inp.record;
    let c = &r.candidate;
    let mut rows = vec![
        ("candidate", id(&r.id)),
        ("problem", esc(&c.problem)),
        ("backend", esc(&r.backend)),
        ("trust", esc(trust_text(r.trust()))),
        ("submitted", esc(&date(r.created_at))),
    ];
    if let Some(p) = &c.parent {
        rows.push(("parent", id(p)));
    }
    if let Some(n) = &c.note {
        rows.push(("note", esc_cut(n, 1000)));
    }
    let ended = r
        .job
        .as_ref()
        .is_none_or(|j| matches!(j.state, JobState::Done | JobState::Failed));
    if let Some(j) = &r.job {
        let mut job = format!("{} {} (attempts {})", j.id, j.state.as_str(), j.attempts);
        if let Some(e) = &j.error {
            job.push_str(&format!(": {e}"));
        }
        rows.push(("job", esc_cut(&job, 1000)));
    }
    let mut body = String::new();
    match &r.evaluation {
        Some(e) => {
            let class = class_of(e);
            rows.push((
                "verdict",
                format!(
                    "<b style=\"color:{}\">{}</b> — {}",
                    super::style::css(class.color()),
                    esc(&class.label()),
                    esc_cut(&e.message, 1000)
                ),
            ));
            if let Some(t) = e.tier {
                rows.push(("precision tier", esc(tier_name(t))));
            }
            timing_rows(e, &mut rows);
            for s in &inp.speedups {
                rows.push((
                    "speedup",
                    esc(&format!(
                        "{} vs {} ({}, {}){}",
                        fmt_x(s.speedup),
                        s.baseline,
                        s.precision,
                        fmt_us(s.baseline_us),
                        if s.same_harness {
                            ""
                        } else {
                            " — another harness: not comparable"
                        }
                    )),
                ));
            }
            body.push_str(&format!(
                "<h1>Candidate {}</h1>{}",
                esc(&r.id),
                html::facts(&rows)
            ));
            body.push_str("<h2>Timing samples</h2>");
            match &e.timing {
                Some(t) => body.push_str(&figure(
                    "samples",
                    plots::histogram::plot(&t.samples_us, t.median_us),
                    &format!(
                        "{} of the {} samples the statistics come from (at most {} are kept), by time; red: the median.",
                        t.samples_us.len(),
                        t.n,
                        kiln_types::MAX_KEPT_SAMPLES
                    ),
                )),
                None => body.push_str(
                    "<p class=\"muted\">Not timed: only correct candidates are.</p>",
                ),
            }
            body.push_str(&telemetry_section(e));
            body.push_str(&trials_section(e));
        }
        None => {
            rows.push(("verdict", "(not yet)".into()));
            body.push_str(&format!(
                "<h1>Candidate {}</h1>{}",
                esc(&r.id),
                html::facts(&rows)
            ));
        }
    }
    body.push_str(&format!(
        "<p class=\"muted\">Generated by kilnd {} at {}.</p>",
        env!("CARGO_PKG_VERSION"),
        esc(&date(inp.generated_at))
    ));
    html::page(
        &format!("kiln candidate {}", r.id),
        (!ended).then_some(REFRESH_SECS),
        &body,
    )
}

#[cfg(test)]
mod tests {
    use kiln_types::{Candidate, ErrorMetrics, Evaluation, TimingStats, Verdict};

    use super::*;
    use crate::report::fixtures::assert_self_contained;
    use crate::store::{CandidateRecord, JobRecord, Speedup};

    fn record(evaluation: Option<Evaluation>, state: JobState) -> CandidateRecord {
        let candidate: Candidate = serde_json::from_value(serde_json::json!({
            "problem": "softmax-4096x65536", "language": "cuda",
            "source": "__global__ void k() {}", "launches": [{"kernel": "k", "args": []}],
            "parent": "p0", "note": "vectorise <loads>"
        }))
        .expect("candidate");
        CandidateRecord {
            id: "c1".into(),
            candidate,
            backend: "cuda".into(),
            created_at: 0,
            job: Some(JobRecord {
                id: 7,
                candidate_id: "c1".into(),
                backend: "cuda".into(),
                state,
                lane: None,
                attempts: 1,
                error: None,
                created_at: 0,
                started_at: None,
                finished_at: None,
                compile_ms: None,
                eval_ms: None,
                search_id: None,
                options: None,
                gpu_class: String::new(),
                node: None,
                lease_token: 0,
            }),
            evaluation,
        }
    }

    fn timed() -> Evaluation {
        let mut e = Evaluation::early(
            Verdict::Ok,
            kiln_types::BackendKind::Cuda,
            "correct on 3 trials",
        );
        e.timing = Some(TimingStats {
            median_us: 10.0,
            mean_us: 10.1,
            n: 40,
            samples_us: (0..40).map(|i| 9.0 + f64::from(i % 5) * 0.5).collect(),
            reps: 4,
            timer: Some(kiln_types::TimerEvidence {
                figure: kiln_types::TimingFigure::Events,
                asked: kiln_types::TimingFigure::KernelSpan,
                source: "events".into(),
                fallback: Some("a profiler <is> attached".into()),
                library: None,
                launches: 2,
                events: kiln_types::FigureSummary::default(),
                kernel_sum: None,
                kernel_span: None,
                records_missing: 0,
                records_missing_reason: None,
            }),
            ..TimingStats::default()
        });
        e.tier = Some(kiln_types::PrecisionTier::Tf32Like);
        e.telemetry = Some(serde_json::json!({"gpu": {
            "available": true,
            "summary": {"sm_mhz": {"min": 1755, "median": 1980, "max": 1980},
                        "power_w_avg": 150.2, "power_w_max": 171.0, "temp_c_max": 41,
                        "reasons_seen": ["sw_power_cap"]},
            "series": {"t_ms": [0, 5, 10], "sm_mhz": [1980, 1980, 1755],
                       "power_w": [150.0, 160.0, 171.0], "throttled": [false, false, true]},
            "timing_samples": 40, "throttled_timing_samples": 1,
            "throttle_policy": "report", "clock_policy": "observe"
        }}));
        e.evidence.trials_run = 3;
        e.evidence.trials_passed = 3;
        e
    }

    #[test]
    fn histogram_telemetry_and_speedups_of_a_timed_gpu_candidate() {
        let html = page(&CandidateInputs {
            record: record(Some(timed()), JobState::Done),
            speedups: vec![Speedup {
                baseline: "torch-compile".into(),
                precision: "tf32".into(),
                baseline_us: 20.0,
                speedup: 2.0,
                harness: kiln_types::baseline::Harness::InProcess,
                same_harness: true,
            }],
            generated_at: 0,
        });
        assert_self_contained(&html);
        assert_eq!(html.matches("<svg").count(), 2, "samples and telemetry");
        assert!(html.contains("40 of the 40 samples"));
        assert!(html.contains("1755 / 1980 / 1980 MHz"));
        assert!(html.contains("150 W / 171 W"));
        assert!(html.contains("sw_power_cap"));
        assert!(html.contains("1 of 40"), "throttled timed samples");
        assert!(html.contains("2.00x vs torch-compile (tf32, 20.0 µs)"));
        assert!(html.contains("tf32-like"));
        assert!(html.contains("vectorise &lt;loads&gt;"));
        assert!(
            html.contains(
                "4 runs per sample (each sample is their mean); figure events from events \
                 (asked for kernel_span): a profiler &lt;is&gt; attached, 2 launches per run"
            ),
            "the timer evidence, escaped"
        );
        assert!(
            !html.contains("http-equiv"),
            "an evaluated candidate's page stays"
        );
    }

    #[test]
    fn the_trust_mode_is_shown_beside_the_backend() {
        let html = page(&CandidateInputs {
            record: record(None, JobState::Queued),
            speedups: Vec::new(),
            generated_at: 0,
        });
        assert!(html.contains("contract (kiln launched"), "{html}");
        let mut r = record(None, JobState::Queued);
        r.candidate.language = kiln_types::Language::ModelNew;
        r.candidate.source = "class ModelNew(nn.Module):\n    pass\n".into();
        r.candidate.launches.clear();
        let html = page(&CandidateInputs {
            record: r,
            speedups: Vec::new(),
            generated_at: 0,
        });
        assert!(
            html.contains("hosted (the candidate&#39;s own Python ran in a jailed runner"),
            "{html}"
        );
    }

    #[test]
    fn trial_errors_of_a_wrong_answer_and_a_waiting_candidate() {
        let mut e = Evaluation::early(
            Verdict::WrongAnswer,
            kiln_types::BackendKind::Cuda,
            "y differs",
        );
        e.evidence.trials_run = 2;
        e.evidence.trials_passed = 1;
        e.evidence.deciding_trial = Some("trial 2 (shifted)".into());
        e.evidence.errors = vec![ErrorMetrics {
            tensor: "y".into(),
            max_abs: 0.5,
            mismatches: 12,
            first_mismatches: vec![kiln_types::verdict::Mismatch {
                index: 3,
                got: f64::NAN,
                want: 1.0,
            }],
            ..ErrorMetrics::default()
        }];
        e.telemetry =
            Some(serde_json::json!({"gpu": {"available": false, "reason": "nvml refused"}}));
        let html = page(&CandidateInputs {
            record: record(Some(e), JobState::Done),
            speedups: Vec::new(),
            generated_at: 0,
        });
        assert_self_contained(&html);
        assert_eq!(html.matches("<svg").count(), 0);
        assert!(html.contains("1 of 2 passed"));
        assert!(html.contains("trial 2 (shifted)"));
        assert!(html.contains("<span class=\"bad\">12</span>"));
        assert!(html.contains("[3] NaN vs 1.000000e0"));
        assert!(html.contains("Not timed"));
        assert!(html.contains("NVML telemetry was not available: nvml refused"));
        let waiting = page(&CandidateInputs {
            record: record(None, JobState::Running),
            speedups: Vec::new(),
            generated_at: 0,
        });
        assert!(waiting.contains(&format!("content=\"{REFRESH_SECS}\"")));
        assert!(waiting.contains("(not yet)"));
    }
}
