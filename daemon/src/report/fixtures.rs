//! Synthetic store data for the report tests: timelines of any length with every kind of
//! verdict, baselines, floors and a MAP-Elites / idea-branch summary.

use kiln_types::BackendKind;
use kiln_types::summary::{Cell, Grid, Report, Round, Tried};
use kiln_types::{BaselineResult, BaselineStatus, Evaluation, PrecisionTier, TimingStats, Verdict};

use super::inputs::{FloorLine, SearchInputs, SummarySource};
use crate::store::{BaselineSet, SearchRecord, TimelineEntry};

/// One finished entry (`None`: the job failed), submitted at 1000 ms, ended at `at`.
pub fn entry(seq: u64, at: i64, verdict: Option<Verdict>, us: f64) -> TimelineEntry {
    let evaluation = verdict.map(|v| {
        let mut e = Evaluation::early(v, BackendKind::Host, "x");
        if v == Verdict::Ok {
            e.timing = Some(TimingStats {
                median_us: us,
                n: 20,
                samples_us: vec![us; 3],
                ..TimingStats::default()
            });
            e.tier = Some(PrecisionTier::Fp32Faithful);
        }
        e
    });
    TimelineEntry {
        seq,
        candidate_id: format!("c{seq}"),
        parent: None,
        note: None,
        submitted_at: 1000,
        job_state: Some(if verdict.is_some() { "done" } else { "failed" }.into()),
        job_error: verdict.is_none().then(|| "backend crashed twice".into()),
        job_finished_at: Some(at),
        evaluated_at: verdict.map(|_| at),
        evaluation,
    }
}

/// A search record in `state`, started at 1000 ms.
pub fn search(state: &str, evaluated: u64) -> SearchRecord {
    SearchRecord {
        id: "s-0000000000ab".into(),
        problem: "softmax-256x4096".into(),
        proposer: "map-elites".into(),
        plugin_hash: "h".into(),
        config: serde_json::Value::Null,
        seed: 7,
        budget_candidates: evaluated + 5,
        time_limit_ms: 600_000,
        llm_tokens: 0,
        state: state.into(),
        summary: None,
        error: None,
        elapsed_ms: 1000 * evaluated,
        tokens_used: 0,
        starts: 1,
        created_at: 1000,
        finished_at: (state != "running").then_some(1000 + 1000 * evaluated as i64),
        submitted: evaluated,
        evaluated,
        best: None,
        gpu_class: String::new(),
        weight: 1.0,
        host_node: None,
    }
}

/// A search of `n` evaluations: a seed at 100 µs getting faster, a mix of verdicts, raced
/// out and tiers; every one but the first has the one before it as parent.
pub fn timeline(n: u64) -> Vec<TimelineEntry> {
    let tiers = [
        PrecisionTier::Fp32Faithful,
        PrecisionTier::Tf32Like,
        PrecisionTier::Fp16Like,
        PrecisionTier::Bf16Like,
        PrecisionTier::Coarse,
    ];
    (1..=n)
        .map(|seq| {
            let verdict = match seq % 10 {
                3 => Some(Verdict::WrongAnswer),
                6 => Some(Verdict::CompileError),
                8 if seq % 20 == 8 => None,
                9 => Some(Verdict::RuntimeFault),
                _ => Some(Verdict::Ok),
            };
            let us = 100.0 / (1.0 + seq as f64 / 10.0) * (1.0 + (seq % 7) as f64 / 5.0);
            let mut e = entry(seq, 1000 + 1000 * seq as i64, verdict, us);
            e.parent = (seq > 1).then(|| format!("c{}", seq - 1));
            e.note = Some(format!("[memory] idea {seq}: vectorise <loads> & stores"));
            if let Some(ev) = e.evaluation.as_mut()
                && let Some(t) = ev.timing.as_mut()
            {
                t.raced_out = seq % 10 == 5;
                ev.tier = Some(tiers[(seq as usize / 4) % tiers.len()]);
            }
            e
        })
        .collect()
}

/// Baselines named as the problem's results name them.
pub fn baselines(names: &[(&str, f64)]) -> BaselineSet {
    BaselineSet {
        gpu_model: "NVIDIA H200".into(),
        driver: "580.159.04".into(),
        problem: "softmax-256x4096".into(),
        problem_hash: "x".into(),
        measured_at: 0,
        results: names
            .iter()
            .map(|(name, us)| {
                let mut r = BaselineResult::not_measured(
                    name,
                    "torch",
                    "fp32",
                    BaselineStatus::Measured,
                    "",
                );
                r.timing = Some(TimingStats {
                    median_us: *us,
                    ..TimingStats::default()
                });
                r
            })
            .collect(),
    }
}

/// A MAP-Elites summary with two islands over two knob axes, and idea-branch-like rounds.
pub fn summary(rounds: u32) -> Report {
    let mut cells = Vec::new();
    for island in 0..2u32 {
        for (i, a) in ["16", "32", "64"].iter().enumerate() {
            for (j, b) in ["1", "2"].iter().enumerate() {
                if (i + j + island as usize) % 4 == 3 {
                    continue;
                }
                cells.push(Cell {
                    island,
                    bins: vec![(*a).into(), (*b).into()],
                    id: format!("c{}", 1 + i + 3 * j),
                    median_us: 10.0 + (i * 7 + j * 3 + island as usize) as f64,
                });
            }
        }
    }
    Report {
        strategy: "map-elites".into(),
        mode: "offline".into(),
        text: "map-elites (offline): 3 generations".into(),
        seed: Some("c1".into()),
        seed_us: Some(100.0),
        best: None,
        best_us: None,
        rounds: (1..=rounds)
            .map(|r| Round {
                round: r,
                note: format!("parent c{r}"),
                evaluated: 2,
                best: Some(format!("c{r}")),
                best_us: Some(50.0 / f64::from(r)),
                improved: r % 2 == 0,
                tried: vec![
                    Tried {
                        family: Some("memory".into()),
                        idea: "vec4: load float4".into(),
                        candidates: 1,
                        best: Some(format!("c{r}")),
                        best_us: Some(40.0),
                        outcome: "improved".into(),
                    },
                    Tried {
                        family: Some("control-flow".into()),
                        idea: "unroll by 8".into(),
                        candidates: 1,
                        best: None,
                        best_us: None,
                        outcome: "failed (wrong_answer)".into(),
                    },
                ],
            })
            .collect(),
        grid: Some(Grid {
            descriptors: vec!["BLOCK".into(), "UNROLL".into()],
            source: "knobs".into(),
            cells,
        }),
    }
}

/// A finished search of `n` evaluations on the cuda backend, with two baselines, a floor
/// and the summary.
pub fn inputs(n: u64) -> SearchInputs {
    let mut s = search("done", n);
    let timeline = timeline(n);
    s.best = timeline
        .iter()
        .filter_map(|e| {
            let ev = e.evaluation.as_ref()?;
            let t = ev.timing.as_ref()?;
            (ev.verdict == Verdict::Ok && !t.raced_out)
                .then(|| (e.candidate_id.clone(), t.median_us))
        })
        .min_by(|a, b| a.1.total_cmp(&b.1));
    SearchInputs {
        search: s,
        timeline,
        seed_id: Some("c1".into()),
        backend: Some("cuda".into()),
        baselines: Some(baselines(&[("torch-eager", 30.0), ("torch-compile", 20.0)])),
        floors: vec![FloorLine {
            label: "roofline floor".into(),
            us: 2.0,
        }],
        summary: Some((summary(3), SummarySource::Final)),
        generated_at: 1_700_000_000_000,
    }
}

/// Asserts that `page` loads nothing from anywhere.
pub fn assert_self_contained(page: &str) {
    let found = super::html::outside_references(page);
    assert!(
        found.is_empty(),
        "the page refers outside itself: {found:?}"
    );
}
