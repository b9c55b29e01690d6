//! Evaluation plans: how many trials, the stop rule for timing, and the secret seed.
//!
//! kilnd builds a plan per evaluation from its config; the worker follows it. The seed is
//! drawn fresh for every evaluation and never shown to the candidate.

use serde::{Deserialize, Serialize};

/// The timing stop rule (design guide §5).
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
    /// Draw a fresh input set every this many samples.
    pub fresh_inputs_every: u32,
    /// Fraction of timed runs whose outputs are re-checked against the reference.
    pub recheck_fraction: f64,
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
            fresh_inputs_every: 8,
            recheck_fraction: 0.1,
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
    /// Wall-clock limit for one run of the launch plan, milliseconds.
    pub run_timeout_ms: u64,
    /// Timing rules.
    pub timing: TimingPlan,
    /// Peak memory bandwidth in bytes/s and compute in flop/s for the floor check
    /// (0 disables that half of the check).
    pub peak_bytes_per_s: f64,
    /// Peak floating-point rate, flop/s (0 disables).
    pub peak_flops: f64,
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
        }
    }
}
