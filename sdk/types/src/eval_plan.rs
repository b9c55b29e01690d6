//! Evaluation plans: how many trials, the stop rule for timing, and the secret seed.
//!
//! kilnd builds a plan per evaluation from its config and the job's options ([`JobOptions`]:
//! plain KernelBench-style timing, racing an incumbent); the worker follows it. The seed is
//! drawn fresh for every evaluation and never shown to the candidate.

use serde::{Deserialize, Serialize};

/// The timing stop rule (docs/benchmarks.md, docs/architecture.md "Timing on the GPU").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimingPlan {
    /// Untimed warm-up runs after the first (discarded) launch.
    pub warmup: u32,
    /// Samples taken before the stop rule is consulted.
    pub min_samples: u32,
    /// Time spent sampling before the stop rule is consulted, milliseconds.
    pub min_time_ms: f64,
    /// Stop once the relative standard error of the mean is below this.
    pub max_rse: f64,
    /// Stop after this many samples regardless.
    pub max_samples: u32,
    /// Stop after this much wall time regardless, milliseconds.
    pub wall_cap_ms: f64,
    /// Fraction of timed runs whose outputs are re-checked against the reference.
    pub recheck_fraction: f64,
    /// What to do with timed samples taken while the GPU was throttled.
    pub throttle_policy: ThrottlePolicy,
    /// Which figure of each GPU sample the statistics, the stop rule and racing use (a
    /// problem's own `timing_figure` wins over this).
    pub figure: TimingFigure,
}

/// Which figure of a GPU sample is *the* time: what the statistics are of, what the stop
/// rule and racing judge, what ranks candidates. The others are kept beside it in the
/// evidence (`TimingStats::timer`). The host backend has one figure only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimingFigure {
    /// From the first kernel's start to the last kernel's end on the GPU (CUPTI records):
    /// the kernels and the gaps between them, without the event and submission overhead
    /// around them. The default (docs/benchmarks.md says why).
    #[default]
    KernelSpan,
    /// The sum of the kernels' durations on the GPU (CUPTI records), gaps left out: what a
    /// CUDA graph of the launches would come close to, and what Nsight Compute sums.
    KernelSum,
    /// Between the start and end events (KernelBench's and Triton's way).
    Events,
}

impl TimingFigure {
    /// The name as written in configuration and evidence.
    pub fn name(self) -> &'static str {
        match self {
            TimingFigure::KernelSpan => "kernel_span",
            TimingFigure::KernelSum => "kernel_sum",
            TimingFigure::Events => "events",
        }
    }

    /// True for the figures read from kernel records.
    pub fn needs_kernel_records(self) -> bool {
        self != TimingFigure::Events
    }
}

/// What to do with timed samples whose window overlaps a throttling NVML reading (power
/// or thermal clocks-event reasons; GPU only — the host backend flags none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThrottlePolicy {
    /// Keep them; their count is in the telemetry (`throttled_timing_samples`).
    #[default]
    Report,
    /// Drop them from the statistics (unless every sample was throttled).
    Discard,
    /// Drop them, and when more than a tenth were throttled, time the candidate once
    /// more from the warm-up, keeping the second attempt.
    Retry,
}

impl Default for TimingPlan {
    fn default() -> Self {
        TimingPlan {
            warmup: 3,
            min_samples: 10,
            min_time_ms: 50.0,
            max_rse: 0.005,
            max_samples: 2000,
            wall_cap_ms: 10_000.0,
            recheck_fraction: 0.1,
            throttle_policy: ThrottlePolicy::Report,
            figure: TimingFigure::KernelSpan,
        }
    }
}

/// Everything the worker needs to know about how to evaluate, beyond the problem and
/// the candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalPlan {
    /// Secret per-evaluation seed for input generation.
    pub seed: u64,
    /// Correctness trials on the problem's distributions (a shifted/scaled one is added).
    pub trials: u32,
    /// Wall-clock limit for one run of the launch list, milliseconds.
    pub run_timeout_ms: u64,
    /// Timing rules.
    pub timing: TimingPlan,
    /// Peak memory bandwidth in bytes/s and compute in flop/s for the floor check
    /// (0 disables that half of the check).
    pub peak_bytes_per_s: f64,
    /// Peak floating-point rate, flop/s (0 disables).
    pub peak_flops: f64,
    /// Plain timing instead of the stop rule: this many samples, each a launch between two
    /// events with no L2 flush and no blocking kernel (what KernelBench did), for comparison.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plain: Option<u32>,
    /// Racing: stop timing early once the candidate is clearly slower than this incumbent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub race: Option<RaceBound>,
    /// A hosted `ModelNew` file on the GPU: record the GPU work of two of its forwards
    /// (on two input draws) and try to lift them into a contract candidate (issue 29,
    /// docs/architecture.md "Lifting"). Off: hosted only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub record_launches: bool,
}

/// The incumbent a candidate races: timing stops (`raced_out`) once the lower bound of the
/// candidate's 95 % confidence interval exceeds `incumbent_upper_us * (1 + margin)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RaceBound {
    /// Upper bound of the incumbent's 95 % confidence interval, µs.
    pub incumbent_upper_us: f64,
    /// Relative margin above the incumbent's upper bound (0.05 = 5 %).
    pub margin: f64,
}

impl RaceBound {
    /// The time a candidate's lower bound must exceed to be raced out, µs.
    pub fn threshold_us(&self) -> f64 {
        self.incumbent_upper_us * (1.0 + self.margin)
    }
}

/// Most samples a plain-timing request may ask for.
pub const MAX_PLAIN_SAMPLES: u32 = 100_000;

/// Options of one evaluation job, given by whoever queued it (`POST /v1/candidates?…`,
/// `POST /v1/candidates/{id}/jobs`) and stored with the job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobOptions {
    /// Plain timing with this many samples (see [`EvalPlan::plain`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plain: Option<u32>,
    /// Race an incumbent: `"best"` (the problem's best `ok` evaluation on this backend
    /// when the job runs) or the incumbent's upper bound in µs (a number, or a string
    /// holding one, as a query string sends it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub race: Option<RaceAgainst>,
    /// Margin for racing (default: the daemon's `search.race_margin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub race_margin: Option<f64>,
    /// Evaluate on this lane of the backend only (its index as `GET /v1/info` lists the
    /// lanes: one per GPU for cuda); any free lane when absent. The daemon checks that the
    /// lane exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane: Option<u32>,
    /// A hosted `ModelNew` file: lift it into a contract candidate where its forward
    /// allows (the default on the cuda backend) or not (`false`: hosted only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lift: Option<bool>,
    /// Set by kilnd only, on the job of a candidate it lifted from a `ModelNew` file: that
    /// file's candidate id (its result is then `lifted`). Refused from clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifted_from: Option<String>,
}

/// What a job races, as written by a client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RaceAgainst {
    /// An explicit incumbent upper bound, µs.
    Upper(f64),
    /// `"best"`, or a number written as a string.
    Named(String),
}

/// What a job races, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RaceTarget {
    /// The problem's best `ok` evaluation on the job's backend when the job runs.
    ProblemBest,
    /// An explicit incumbent upper bound, µs.
    Upper(f64),
}

impl JobOptions {
    /// True when nothing is asked for.
    pub fn is_empty(&self) -> bool {
        self.plain.is_none()
            && self.race.is_none()
            && self.race_margin.is_none()
            && self.lane.is_none()
            && self.lift.is_none()
            && self.lifted_from.is_none()
    }

    /// Checks the options; the message names the field at fault.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(n) = self.plain
            && !(1..=MAX_PLAIN_SAMPLES).contains(&n)
        {
            return Err(format!(
                "field `plain`: {n} samples; give 1 to {MAX_PLAIN_SAMPLES}"
            ));
        }
        if let Some(m) = self.race_margin
            && !(m.is_finite() && (0.0..=10.0).contains(&m))
        {
            return Err(format!(
                "field `race_margin`: {m} is not a margin between 0 and 10"
            ));
        }
        if self.race_margin.is_some() && self.race.is_none() {
            return Err("field `race_margin` needs `race`".into());
        }
        self.race_target()?;
        if let Some(id) = &self.lifted_from
            && !(id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err("field `lifted_from`: not a candidate id".into());
        }
        if self.plain.is_some() && self.race.is_some() {
            return Err(
                "fields `plain` and `race` exclude each other: plain timing takes a fixed number of samples"
                    .into(),
            );
        }
        Ok(())
    }

    /// The checked race target, if racing was asked for.
    pub fn race_target(&self) -> Result<Option<RaceTarget>, String> {
        let upper = |v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(Some(RaceTarget::Upper(v)))
            } else {
                Err(format!(
                    "field `race`: {v} is not a positive incumbent bound in µs"
                ))
            }
        };
        match &self.race {
            None => Ok(None),
            Some(RaceAgainst::Upper(v)) => upper(*v),
            Some(RaceAgainst::Named(s)) if s == "best" => Ok(Some(RaceTarget::ProblemBest)),
            Some(RaceAgainst::Named(s)) => match s.parse::<f64>() {
                Ok(v) => upper(v),
                Err(_) => Err(format!(
                    "field `race`: {s:?} is neither \"best\" nor an incumbent bound in µs"
                )),
            },
        }
    }
}

impl Default for EvalPlan {
    fn default() -> Self {
        EvalPlan {
            seed: 0,
            trials: 3,
            run_timeout_ms: 5_000,
            timing: TimingPlan::default(),
            peak_bytes_per_s: 0.0,
            peak_flops: 0.0,
            plain: None,
            race: None,
            record_launches: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(json: &str) -> JobOptions {
        serde_json::from_str(json).expect("parses")
    }

    #[test]
    fn job_options_are_checked() {
        assert_eq!(opts("{}").validate(), Ok(()));
        assert!(opts("{}").is_empty());
        assert_eq!(opts(r#"{"plain": 100}"#).validate(), Ok(()));
        let pinned = opts(r#"{"lane": 3}"#);
        assert_eq!((pinned.validate(), pinned.lane), (Ok(()), Some(3)));
        assert!(!pinned.is_empty());
        assert!(opts(r#"{"plain": 0}"#).validate().is_err());
        assert_eq!(
            opts(r#"{"race": "best"}"#).race_target(),
            Ok(Some(RaceTarget::ProblemBest))
        );
        assert_eq!(
            opts(r#"{"race": 12.5, "race_margin": 0.1}"#).race_target(),
            Ok(Some(RaceTarget::Upper(12.5)))
        );
        assert_eq!(
            opts(r#"{"race": "12.5"}"#).race_target(),
            Ok(Some(RaceTarget::Upper(12.5)))
        );
        for bad in [
            r#"{"race": "fastest"}"#,
            r#"{"race": -1}"#,
            r#"{"race": "best", "race_margin": -0.1}"#,
            r#"{"race_margin": 0.1}"#,
            r#"{"race": "best", "plain": 100}"#,
        ] {
            let e = opts(bad).validate().expect_err(bad);
            assert!(e.starts_with("field"), "{bad}: {e}");
        }
        assert!(serde_json::from_str::<JobOptions>(r#"{"raec": 1}"#).is_err());
    }

    #[test]
    fn lifting_is_an_option_and_lifted_from_must_be_an_id() {
        let o = opts(r#"{"lift": false}"#);
        assert_eq!(o.lift, Some(false));
        assert!(!o.is_empty());
        assert!(o.validate().is_ok());
        let o = opts(r#"{"lifted_from": "0123456789abcdef0123456789abcdef"}"#);
        assert!(o.validate().is_ok());
        let o = opts(r#"{"lifted_from": "../etc"}"#);
        assert!(o.validate().unwrap_err().contains("lifted_from"));
        // Off by default in a plan: kilnd turns it on per job.
        assert!(!EvalPlan::default().record_launches);
        let plan: EvalPlan =
            serde_json::from_value(serde_json::to_value(EvalPlan::default()).expect("json"))
                .expect("reads back");
        assert!(!plan.record_launches);
    }

    #[test]
    fn the_figure_defaults_to_the_kernel_span_and_reads_by_name() {
        assert_eq!(TimingPlan::default().figure, TimingFigure::KernelSpan);
        // Plans written before the field read with the default.
        let tp: TimingPlan = serde_json::from_str(r#"{"warmup": 1}"#).expect("old plan");
        assert_eq!(tp.figure, TimingFigure::KernelSpan);
        for f in [
            TimingFigure::KernelSpan,
            TimingFigure::KernelSum,
            TimingFigure::Events,
        ] {
            let json = serde_json::to_string(&f).expect("serializes");
            assert_eq!(json, format!("\"{}\"", f.name()));
            assert_eq!(f.needs_kernel_records(), f != TimingFigure::Events);
        }
        assert!(serde_json::from_str::<TimingFigure>(r#""wall""#).is_err());
    }

    #[test]
    fn race_threshold_adds_the_margin() {
        let b = RaceBound {
            incumbent_upper_us: 100.0,
            margin: 0.05,
        };
        assert!((b.threshold_us() - 105.0).abs() < 1e-9);
    }
}
