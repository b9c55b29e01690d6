//! One record per answer (what kilnd said of it, read from its candidate record), the
//! problem's torch baselines, and the two notions of correct the summary keeps apart:
//!
//! - **KernelBench-correct**: every normal correctness trial passed, i.e. correct on
//!   KernelBench's own input distribution. `ok`, `no_own_kernels` (KernelBench has no such
//!   check), `implausible_time` and `unmeasurable_time` (reached only after every trial),
//!   and a `wrong_answer` or `nondeterministic` decided by one of kiln's extra trials: the
//!   shifted trial, the range trial or the recheck of a timed run on fresh inputs
//!   (`evidence.deciding_trial`, named in `sandbox/src/engine/contract.rs` and
//!   `contract/timing.rs`), or a `wrong_answer` for a precision tier the problem requires
//!   (no deciding trial, every trial passed).
//! - **kiln-correct**: `ok` only.

use serde::Serialize;
use serde_json::Value;

/// The torch baselines of one problem, µs (`None`: not measured; `note` says why). The
/// answers of a run are hosted `ModelNew` files, so the figures a run's numbers are
/// computed against are the hosted ones — the problem's own module timed by the same
/// harness as the answers (`torch-eager-hosted`, `torch-compile-hosted`) — with the
/// in-process ones (the torch runner's own events) kept beside them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Baselines {
    /// torch eager through the hosted path (`torch-eager-hosted`).
    pub eager_us: Option<f64>,
    /// torch.compile through the hosted path (`torch-compile-hosted`).
    pub compile_us: Option<f64>,
    /// torch eager timed in process (the first measured `torch-eager-*`: fp32 first).
    pub eager_in_process_us: Option<f64>,
    /// torch.compile timed in process (the first measured `torch-compile-*`).
    pub compile_in_process_us: Option<f64>,
    /// Why one is missing, when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Baselines {
    /// From a baseline set (`GET/POST /v1/problems/{name}/baselines`).
    pub fn from_set(set: &Value) -> Baselines {
        let results = set["results"].as_array().cloned().unwrap_or_default();
        // A set from a kilnd before hosted baselines has no `harness`: all in process.
        let hosted = |r: &Value| r["harness"] == "hosted";
        let first = |kind: &str, want_hosted: bool| {
            results
                .iter()
                .filter(|r| hosted(r) == want_hosted)
                .filter(|r| r["name"].as_str().is_some_and(|n| n.starts_with(kind)))
                .filter(|r| r["status"] == "measured")
                .find_map(|r| r["timing"]["median_us"].as_f64())
        };
        let mut b = Baselines {
            eager_us: first("torch-eager-hosted", true),
            compile_us: first("torch-compile-hosted", true),
            eager_in_process_us: first("torch-eager", false),
            compile_in_process_us: first("torch-compile", false),
            note: None,
        };
        if !results.iter().any(hosted) {
            b.note = Some(
                "no hosted baseline in kilnd's set (a kilnd before them, or a set measured \
                 before: `kiln problems baseline NAME --remeasure`): no same-harness speedup"
                    .into(),
            );
            return b;
        }
        if b.eager_us.is_none() || b.compile_us.is_none() {
            let why: Vec<String> = results
                .iter()
                .filter(|r| {
                    r["name"].as_str().is_some_and(|n| n.starts_with("torch-"))
                        && r["status"] != "measured"
                })
                .map(|r| {
                    format!(
                        "{} {}: {}",
                        r["name"].as_str().unwrap_or("?"),
                        r["status"].as_str().unwrap_or("?"),
                        r["detail"].as_str().unwrap_or("")
                    )
                })
                .collect();
            b.note = Some(if why.is_empty() {
                "kilnd measured no torch baseline for it".into()
            } else {
                why.join("; ")
            });
        }
        b
    }

    /// None measured, for `why`.
    pub fn unavailable(why: impl Into<String>) -> Baselines {
        Baselines {
            note: Some(why.into()),
            ..Baselines::default()
        }
    }
}

/// What became of one answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Evaluated: it has a verdict.
    Evaluated,
    /// Refused before evaluation (no `class ModelNew`, an invalid candidate): the
    /// answer's fault, counted as incorrect.
    Refused,
    /// kiln failed to evaluate it (a failed job, no verdict in time): counted as
    /// incorrect, and said.
    Failed,
}

/// One answer's line of the table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Answer {
    /// The answer's file name.
    pub file: String,
    /// The problem's number in the level.
    pub problem_id: u64,
    /// kiln's problem name.
    pub problem: String,
    /// `K` of `sample_K`, when the name has one.
    pub sample: Option<u64>,
    /// What became of it.
    pub status: Status,
    /// Why it was refused or failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The candidate's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// kilnd answered it from its store (submitted before: content-addressed ids).
    pub from_store: bool,
    /// The verdict.
    pub verdict: Option<String>,
    /// `hosted` or `contract`.
    pub trust: Option<String>,
    /// The verdict's message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The trial that decided a failing verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deciding_trial: Option<String>,
    /// Median time, µs.
    pub median_us: Option<f64>,
    /// Precision tier.
    pub tier: Option<String>,
    /// Library kernels' share of the recorded GPU time (hosted, on the GPU).
    pub library_fraction: Option<f64>,
    /// torch eager's time through the hosted path / this time (the same harness).
    pub speedup_eager: Option<f64>,
    /// torch.compile's time through the hosted path / this time.
    pub speedup_compile: Option<f64>,
    /// torch eager's in-process time / this time (another harness: beside, not ranked).
    pub speedup_eager_in_process: Option<f64>,
    /// torch.compile's in-process time / this time.
    pub speedup_compile_in_process: Option<f64>,
    /// A hosted file lifted into a contract candidate: that candidate's verdict and median
    /// (kiln launched it: trust `lifted`), or why it was not lifted (`no: CODE`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lift: Option<String>,
    /// The lifted candidate's median, µs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifted_median_us: Option<f64>,
    /// Correct on KernelBench's own input distribution (see the module's doc).
    pub kernelbench_correct: bool,
    /// `ok`.
    pub kiln_correct: bool,
}

/// Whether an evaluation is correct on KernelBench's own input distribution.
pub fn kernelbench_correct(evaluation: &Value) -> bool {
    let ev = &evaluation["evidence"];
    let decided_by_extra = ev["deciding_trial"].as_str().is_some_and(|t| {
        t.contains("(shifted") || t.starts_with("range trial") || t.starts_with("recheck of")
    });
    match evaluation["verdict"].as_str().unwrap_or("") {
        "ok" | "no_own_kernels" | "implausible_time" | "unmeasurable_time" => true,
        "nondeterministic" => decided_by_extra,
        "wrong_answer" => {
            let all_passed = ev["trials_run"].as_u64().is_some_and(|n| n > 0)
                && ev["trials_passed"] == ev["trials_run"];
            decided_by_extra || (ev["deciding_trial"].is_null() && all_passed)
        }
        _ => false,
    }
}

/// What is known of an answer before kilnd's record: its file, problem and sample.
#[derive(Debug, Clone)]
pub struct Identity {
    /// File name.
    pub file: String,
    /// Problem number.
    pub problem_id: u64,
    /// kiln's problem name.
    pub problem: String,
    /// Sample number.
    pub sample: Option<u64>,
}

impl Answer {
    fn blank(who: &Identity, status: Status) -> Answer {
        Answer {
            file: who.file.clone(),
            problem_id: who.problem_id,
            problem: who.problem.clone(),
            sample: who.sample,
            status,
            reason: None,
            id: None,
            from_store: false,
            verdict: None,
            trust: None,
            message: None,
            deciding_trial: None,
            median_us: None,
            tier: None,
            library_fraction: None,
            speedup_eager: None,
            speedup_compile: None,
            speedup_eager_in_process: None,
            speedup_compile_in_process: None,
            lift: None,
            lifted_median_us: None,
            kernelbench_correct: false,
            kiln_correct: false,
        }
    }

    /// An answer refused (`Status::Refused`) or one kiln failed on (`Status::Failed`).
    pub fn not_evaluated(who: &Identity, status: Status, reason: String) -> Answer {
        let mut a = Answer::blank(who, status);
        a.reason = Some(reason);
        a
    }

    /// An answer from its candidate record (`GET /v1/candidates/{id}`).
    pub fn from_record(who: &Identity, record: &Value, from_store: bool) -> Answer {
        let e = &record["evaluation"];
        let s = |v: &Value| v.as_str().map(str::to_string);
        let mut a = Answer::blank(who, Status::Evaluated);
        a.id = s(&record["id"]);
        a.from_store = from_store;
        if e.is_null() {
            a.status = Status::Failed;
            a.reason = Some(match record["job"]["error"].as_str() {
                Some(err) => format!("kiln's failure, not the answer's: {err}"),
                None => format!(
                    "no verdict (job {})",
                    record["job"]["state"].as_str().unwrap_or("?")
                ),
            });
            return a;
        }
        a.verdict = s(&e["verdict"]);
        a.trust = s(&e["trust"]).or_else(|| s(&record["trust"]));
        a.message = s(&e["message"]);
        a.deciding_trial = s(&e["evidence"]["deciding_trial"]);
        a.median_us = e["timing"]["median_us"].as_f64();
        a.tier = s(&e["tier"]);
        a.library_fraction = e["telemetry"]["hosted"]["library_fraction"].as_f64();
        a.kernelbench_correct = kernelbench_correct(e);
        a.kiln_correct = a.verdict.as_deref() == Some("ok");
        let lift = &record["lift"];
        match lift["outcome"].as_str() {
            Some("lifted") => {
                a.lift =
                    Some(s(&lift["verdict"]).unwrap_or_else(|| {
                        format!("job {}", lift["state"].as_str().unwrap_or("?"))
                    }));
                a.lifted_median_us = lift["median_us"].as_f64();
            }
            Some("not_lifted") => {
                a.lift = Some(format!("no: {}", lift["code"].as_str().unwrap_or("?")));
            }
            _ => {}
        }
        a
    }

    /// Sets the speedups against the problem's baselines.
    pub fn with_baselines(mut self, b: &Baselines) -> Answer {
        let over = |base: Option<f64>| match (base, self.median_us) {
            (Some(b), Some(t)) if b > 0.0 && t > 0.0 => Some(b / t),
            _ => None,
        };
        self.speedup_eager = over(b.eager_us);
        self.speedup_compile = over(b.compile_us);
        self.speedup_eager_in_process = over(b.eager_in_process_us);
        self.speedup_compile_in_process = over(b.compile_in_process_us);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn eval(verdict: &str, deciding: Option<&str>, passed: u64, run: u64) -> Value {
        let mut e =
            json!({"verdict": verdict, "evidence": {"trials_run": run, "trials_passed": passed}});
        if let Some(d) = deciding {
            e["evidence"]["deciding_trial"] = json!(d);
        }
        e
    }

    #[test]
    fn kernelbench_correct_means_every_normal_trial_passed() {
        for v in [
            "ok",
            "no_own_kernels",
            "implausible_time",
            "unmeasurable_time",
        ] {
            assert!(kernelbench_correct(&eval(v, None, 3, 3)), "{v}");
        }
        // kiln's extra trials, as contract.rs and timing.rs name them.
        for d in [
            "trial 4 (shifted: mean 1000, std 0.1)",
            "range trial (float inputs scaled by 2^-20)",
            "recheck of timed sample 17",
        ] {
            assert!(
                kernelbench_correct(&eval("wrong_answer", Some(d), 3, 4)),
                "{d}"
            );
        }
        assert!(kernelbench_correct(&eval(
            "nondeterministic",
            Some("trial 4 (shifted: mean 1000, std 0.1)"),
            3,
            4
        )));
        // A tier the problem requires: every trial passed, no deciding trial.
        assert!(kernelbench_correct(&eval("wrong_answer", None, 4, 4)));
        // A normal trial decided it, or nothing ran.
        assert!(!kernelbench_correct(&eval(
            "wrong_answer",
            Some("trial 2"),
            1,
            2
        )));
        assert!(!kernelbench_correct(&eval(
            "nondeterministic",
            Some("trial 1"),
            0,
            1
        )));
        assert!(!kernelbench_correct(&eval("wrong_answer", None, 0, 0)));
        for v in [
            "compile_error",
            "runtime_fault",
            "timeout",
            "input_tampered",
            "incomplete_output",
            "invalid_launch",
        ] {
            assert!(!kernelbench_correct(&eval(v, Some("trial 1"), 0, 1)), "{v}");
        }
    }

    #[test]
    fn a_lifted_or_refused_lift_is_carried_beside_the_hosted_result() {
        let who = Identity {
            file: "level_1_problem_88_sample_0.py".into(),
            problem_id: 88,
            problem: "kb-l1-88-mingptnewgelu".into(),
            sample: Some(0),
        };
        let hosted = json!({"verdict": "ok", "trust": "hosted", "timing": {"median_us": 641.9},
                            "evidence": {"trials_run": 4, "trials_passed": 4}});
        let lifted = json!({"id": "f", "evaluation": hosted, "lift": {
            "outcome": "lifted", "candidate_id": "0f96", "state": "done", "verdict": "ok",
            "median_us": 313.2}});
        let a = Answer::from_record(&who, &lifted, false);
        assert_eq!(
            (a.median_us, a.lifted_median_us),
            (Some(641.9), Some(313.2))
        );
        assert_eq!(a.lift.as_deref(), Some("ok"));
        assert_eq!(
            super::super::table::answer_cells(&a)[5],
            crate::output::fmt_us(313.2)
        );
        let pending = json!({"id": "f", "evaluation": hosted, "lift": {
            "outcome": "lifted", "candidate_id": "0f96", "state": "running", "verdict": null}});
        let a = Answer::from_record(&who, &pending, false);
        assert_eq!(a.lift.as_deref(), Some("job running"));
        let refused = json!({"id": "f", "evaluation": hosted, "lift": {
            "outcome": "not_lifted", "code": "memset", "reason": "cudaMemsetAsync"}});
        let a = Answer::from_record(&who, &refused, false);
        assert_eq!(
            (a.lift.as_deref(), a.lifted_median_us),
            (Some("no: memset"), None)
        );
        assert_eq!(super::super::table::answer_cells(&a)[5], "no: memset");
        let none = json!({"id": "f", "evaluation": hosted});
        assert_eq!(Answer::from_record(&who, &none, false).lift, None);
    }

    #[test]
    fn a_record_becomes_a_line_with_its_speedups() {
        let who = Identity {
            file: "level_1_problem_1_sample_0_kernel.py".into(),
            problem_id: 1,
            problem: "kb-l1-1-softmax".into(),
            sample: Some(0),
        };
        let record = json!({"id": "abc", "trust": "hosted", "evaluation": {
            "verdict": "no_own_kernels", "trust": "hosted", "tier": "fp32-faithful",
            "message": "correct; but forward launched no kernel of its own",
            "evidence": {"trials_run": 3, "trials_passed": 3},
            "timing": {"median_us": 20.0},
            "telemetry": {"hosted": {"library_fraction": 1.0}}}});
        let set = json!({"results": [
            {"name": "reference", "status": "measured", "timing": {"median_us": 1.0}},
            {"name": "torch-eager-fp32", "status": "measured", "timing": {"median_us": 10.0}},
            {"name": "torch-compile-fp32", "status": "failed", "detail": "inductor broke"},
            {"name": "torch-eager-hosted", "harness": "hosted", "status": "measured",
             "timing": {"median_us": 40.0}},
            {"name": "torch-compile-hosted", "harness": "hosted", "status": "failed",
             "detail": "inductor broke"}]});
        let b = Baselines::from_set(&set);
        // The same harness as the answers (hosted) first; in process beside.
        assert_eq!((b.eager_us, b.compile_us), (Some(40.0), None));
        assert_eq!(
            (b.eager_in_process_us, b.compile_in_process_us),
            (Some(10.0), None)
        );
        assert!(
            b.note
                .as_deref()
                .is_some_and(|n| n.contains("torch-compile-hosted failed: inductor broke")),
            "{b:?}"
        );
        let a = Answer::from_record(&who, &record, true).with_baselines(&b);
        assert_eq!(a.status, Status::Evaluated);
        assert!(a.from_store && a.kernelbench_correct && !a.kiln_correct);
        assert_eq!(a.speedup_eager, Some(2.0));
        assert_eq!(a.speedup_compile, None);
        assert_eq!(a.speedup_eager_in_process, Some(0.5));
        // A set from before hosted baselines: no same-harness figure, and it says why.
        let old = json!({"results": [
            {"name": "torch-eager-fp32", "status": "measured", "timing": {"median_us": 40.0}}]});
        let b = Baselines::from_set(&old);
        assert_eq!((b.eager_us, b.eager_in_process_us), (None, Some(40.0)));
        assert!(
            b.note
                .as_deref()
                .is_some_and(|n| n.contains("no hosted baseline"))
        );
        assert_eq!(a.library_fraction, Some(1.0));
        assert_eq!(a.trust.as_deref(), Some("hosted"));
        // A failed job: kiln's failure, said as such.
        let failed = json!({"id": "x", "job": {"state": "failed", "error": "worker died"},
                            "evaluation": null});
        let a = Answer::from_record(&who, &failed, false);
        assert_eq!(a.status, Status::Failed);
        assert!(
            a.reason
                .as_deref()
                .is_some_and(|r| r.contains("kiln's failure") && r.contains("worker died"))
        );
    }
}
