//! The timing phase of the contract (`crate::engine::contract`), for every backend.
//!
//! 1. the timer's own overhead (host: the fastest of the empty round trips, those before the
//!    samples and one after each sample; GPU: none, events time the GPU), subtracted from
//!    every sample;
//! 2. the first launch is discarded, then `warmup` untimed runs, all on one input set that
//!    no timed run ever sees again;
//! 3. repetitions: a backend that can run several input sets in one timed sample
//!    ([`Target::reps_max`] > 1, the host) gets as many as bring one sample well above the
//!    timer's overhead and resolution ([`reps_for`]), judged from the warm-up runs;
//! 4. samples: each one through [`Target::sample`] on **fresh input sets drawn for it
//!    alone** (one per run, from the secret seed, outside the timed window), so no timed
//!    run ever sees inputs the candidate has seen before; outputs poisoned and scratch
//!    zeroed before every run (on the GPU also the L2 flush, the blocking kernel, events
//!    and a context sync); inputs checked after every run; a random subset of samples,
//!    chosen from the secret seed after each sample ran, plus always the last, re-checked:
//!    every run of the sample against a reference run on that run's inputs;
//! 5. stop rule: at least `min_samples` and `min_time_ms`, then relative standard error
//!    below `max_rse` (`converged`), or `max_samples` (`max_samples`) or `wall_cap_ms`
//!    (`wall_cap`).
//!
//! A median whose sample is at or below the timer's resolution or overhead is not a time
//! ([`unmeasurable`]; the contract then says `unmeasurable_time`). Where runs can be
//! repeated within a sample (the host), that verdict comes only after a second attempt:
//! on a loaded machine the overhead measured before the samples (the fastest empty round
//! trip) can come out above what the samples themselves then take, so the second attempt
//! measures it afresh and takes at least [`UNMEASURABLE_RETRY_REPS`] times the runs per
//! sample, on input sets of its own.
//!
//! The target's telemetry (NVML on the GPU) covers exactly the sampling window. The samples
//! the statistics come from are kept with them (`TimingStats::samples_us`, at most
//! `kiln_types::MAX_KEPT_SAMPLES`), for the histogram of `kiln show ID --report`.
//!
//! Two variants, asked for by the plan: racing ([`race`]: with an incumbent's bound, a
//! candidate clearly slower than it stops early, `raced_out`), and plain timing
//! ([`plain`]: KernelBench's way, for comparison, instead of steps 3-5).

use std::time::{Duration, Instant};

use kiln_types::{ThrottlePolicy, TimingStats, Verdict};

use super::{InputVariant, Session, Step, Stop, Target, rep_label};
use crate::engine::contract::data;

pub mod plain;
pub mod race;

/// Purpose of the warm-up input set (see [`data::rng_for`]); `index` is the attempt.
const WARMUP_PURPOSE: &str = "timing warm-up";
/// Purpose of the timed runs' input sets; `index` counts every set drawn for timing, over
/// every attempt, so no two timed runs share one.
const TIMED_PURPOSE: &str = "timed run";

/// A sample should take at least this many times the larger of the timer's overhead and
/// resolution, when the backend can repeat runs within a sample ([`reps_for`]).
pub const REPS_TARGET_FACTOR: f64 = 10.0;
/// ... and at least this many µs.
pub const REPS_TARGET_MIN_US: f64 = 50.0;
/// Untimed runs after the warm-up that judge the runs per sample.
const CALIBRATION_RUNS: u32 = 3;
/// The second attempt after an unmeasurable first one takes at least this many times the
/// first attempt's runs per sample (within [`Target::reps_max`]).
pub const UNMEASURABLE_RETRY_REPS: usize = 4;
/// Attempt number of that second attempt (the throttle retry is attempt 1): its warm-up
/// set and its choice of re-checked samples are its own.
const UNMEASURABLE_RETRY_ATTEMPT: u64 = 2;
/// Timing attempts one evaluation can take at most: the first, the second after an
/// unmeasurable first ([`UNMEASURABLE_RETRY_ATTEMPT`]) and the throttle retry. Each has
/// its own warm-up and may run to `wall_cap_ms`; the worker's wall budget counts them all.
pub const MAX_ATTEMPTS: u32 = 3;

/// Runs the timing phase; an early verdict if a timed run misbehaves. Then applies the
/// plan's throttle policy: `discard` drops throttled samples from the statistics,
/// `retry` also times once more when over a tenth of them were throttled (on input sets
/// of its own: the first attempt's are never reused). The target's timer evidence (GPU:
/// which figure the samples are, and the others) covers the samples the statistics kept.
pub fn time<T: Target>(s: &mut Session<T>) -> Step<TimingStats> {
    let mut sets = 0u64;
    let (mut first, mut samples) = time_once(s, 0, &mut sets, 1)?;
    if !first.plain
        && s.target.reps_max() > 1
        && let Some(why) = unmeasurable(&first, s.target.resolution_us())
    {
        tracing::info!(
            %why,
            "timing again: the overhead measured afresh, more runs per sample"
        );
        let min_reps = (first.reps.max(1) as usize).saturating_mul(UNMEASURABLE_RETRY_REPS);
        (first, samples) = time_once(s, UNMEASURABLE_RETRY_ATTEMPT, &mut sets, min_reps)?;
    }
    let policy = s.plan.timing.throttle_policy;
    if policy == ThrottlePolicy::Report || first.plain {
        return Ok(with_timer(s, first, &samples, &[]));
    }
    let flagged = s.target.throttled_samples();
    if policy == ThrottlePolicy::Retry && flagged.len() * 10 > samples.len() {
        tracing::info!(
            throttled = flagged.len(),
            samples = samples.len(),
            "too many throttled samples; timing again"
        );
        let (again, samples) = time_once(s, 1, &mut sets, 1)?;
        let flagged = s.target.throttled_samples();
        let mut stats = discard_throttled(again, &samples, &flagged);
        stats.throttle_retried = true;
        return Ok(with_timer(s, stats, &samples, &flagged));
    }
    let stats = discard_throttled(first, &samples, &flagged);
    Ok(with_timer(s, stats, &samples, &flagged))
}

/// `stats` with the target's timer evidence over the samples `discard_throttled` kept.
fn with_timer<T: Target>(
    s: &Session<T>,
    mut stats: TimingStats,
    samples: &[f64],
    flagged: &[usize],
) -> TimingStats {
    let dropped = !flagged.is_empty() && flagged.len() < samples.len();
    stats.timer = s.target.timer_evidence(if dropped { flagged } else { &[] });
    stats
}

/// The median per run before the timer's overhead was subtracted, where it has one: each
/// sample is (round trip − overhead) / reps, so the raw median is the net one plus
/// overhead / reps.
fn raw_median(stats: &TimingStats) -> Option<f64> {
    (stats.overhead_us > 0.0)
        .then(|| stats.median_us + stats.overhead_us / f64::from(stats.reps.max(1)))
}

/// The statistics without the flagged samples (unchanged when every sample is flagged:
/// the telemetry then says the whole window ran throttled).
pub fn discard_throttled(stats: TimingStats, samples: &[f64], flagged: &[usize]) -> TimingStats {
    if flagged.is_empty() || flagged.len() >= samples.len() {
        return stats;
    }
    let kept: Vec<f64> = samples
        .iter()
        .enumerate()
        .filter(|(i, _)| !flagged.contains(i))
        .map(|(_, v)| *v)
        .collect();
    let mut out = self::stats(&kept);
    out.stop_reason = stats.stop_reason;
    out.wall_ms = stats.wall_ms;
    out.fresh_inputs = stats.fresh_inputs;
    out.reps = stats.reps;
    out.rechecks = stats.rechecks;
    out.overhead_us = stats.overhead_us;
    out.raw_median_us = raw_median(&out);
    out.warmup_ms = stats.warmup_ms;
    out.raced_out = stats.raced_out;
    out.throttled_discarded = (samples.len() - kept.len()) as u32;
    out.samples_us = kiln_types::kept_samples(&kept);
    out
}

/// Runs per timed sample: enough that one sample takes [`REPS_TARGET_FACTOR`] times the
/// larger of the timer's overhead and resolution (and [`REPS_TARGET_MIN_US`]), judged from
/// the fastest warm-up run's time after the overhead, within `1..=reps_max`. A backend
/// that reports no run time (0) gets one run per sample unless it can repeat, in which
/// case it gets all it can.
pub fn reps_for(
    fastest_run_us: f64,
    overhead_us: f64,
    resolution_us: f64,
    reps_max: usize,
) -> usize {
    if reps_max <= 1 {
        return 1;
    }
    let target = (REPS_TARGET_FACTOR * overhead_us.max(resolution_us)).max(REPS_TARGET_MIN_US);
    if fastest_run_us.is_nan() || fastest_run_us <= 0.0 {
        return reps_max;
    }
    let want = (target / fastest_run_us).ceil();
    if want >= reps_max as f64 {
        reps_max
    } else {
        (want as usize).max(1)
    }
}

/// Why `stats` is not a time, if it is not: its median sample (all its runs together) at
/// or below the timer's resolution or the overhead subtracted from each sample.
pub fn unmeasurable(stats: &TimingStats, resolution_us: f64) -> Option<String> {
    let per_sample = stats.median_us * f64::from(stats.reps.max(1));
    let limit = resolution_us.max(stats.overhead_us);
    if per_sample > limit {
        return None;
    }
    let runs = if stats.reps > 1 {
        format!(" with {} runs per sample", stats.reps)
    } else {
        String::new()
    };
    Some(format!(
        "median sample {per_sample:.3} us{runs} is at or below what the timer can measure \
         (resolution {resolution_us:.3} us, overhead {:.3} us subtracted per sample): no time \
         is reported",
        stats.overhead_us
    ))
}

/// One timing attempt (`attempt` 0, 1 for the throttle retry, 2 after an unmeasurable
/// first attempt): the statistics and the raw per-run samples (empty for plain timing).
/// `sets` counts the timed input sets drawn so far, over attempts; the runs per sample are
/// at least `min_reps` where the backend can repeat that many.
fn time_once<T: Target>(
    s: &mut Session<T>,
    attempt: u64,
    sets: &mut u64,
    min_reps: usize,
) -> Step<(TimingStats, Vec<f64>)> {
    let tp = s.plan.timing.clone();
    let setup = Instant::now();
    // 1. Overhead.
    let mut overhead_us = match s.target.overhead() {
        Ok(us) => us,
        Err(f) => return Err(s.failure_verdict(f, "timer overhead round")),
    };

    // 2. Discarded first launch and warm-up, on a set of their own.
    let warm = s.draw_variant(WARMUP_PURPOSE, attempt, InputVariant::Normal)?;
    let mut fastest = f64::INFINITY;
    for w in 0..=tp.warmup {
        let us = s.warmup_run(&warm, &format!("warm-up run {w}"))?;
        if w > 0 || tp.warmup == 0 {
            fastest = fastest.min(us - overhead_us);
        }
    }

    let warmup_ms = setup.elapsed().as_secs_f64() * 1e3;
    if let Some(reps) = s.plan.plain {
        let mut stats = plain::time(s, &warm, reps, overhead_us)?;
        stats.warmup_ms = warmup_ms;
        return Ok((stats, Vec::new()));
    }

    // 3. Runs per sample, judged from the fastest of a few more untimed runs (the first
    // launch, cold, says little) where the backend can repeat runs at all.
    if s.target.reps_max() > 1 {
        for c in 0..CALIBRATION_RUNS {
            let us = s.warmup_run(&warm, &format!("calibration run {}", c + 1))?;
            fastest = fastest.min(us - overhead_us);
        }
    }
    let reps = reps_for(
        fastest,
        overhead_us,
        s.target.resolution_us(),
        s.target.reps_max(),
    )
    .max(min_reps.min(s.target.reps_max()));

    // 4-5. Samples.
    let mut rng = data::rng_for(s.plan.seed, "recheck", attempt);
    let mut samples: Vec<f64> = Vec::new();
    // What each sample's round trip took, before the overhead is subtracted: the overhead
    // can still fall (a faster empty round trip between samples), and then every sample is
    // worked out again from these.
    let mut raw: Vec<f64> = Vec::new();
    let mut windows: Vec<(Instant, Instant)> = Vec::new();
    let mut fresh_inputs = 0u32;
    let mut rechecks = 0u32;
    s.target.timing_started();
    let started = Instant::now();
    let result = (|| -> Step<&'static str> {
        loop {
            let n = samples.len() as u32;
            // Fresh sets for this sample alone, drawn before its timer starts.
            let mut drawn = Vec::with_capacity(reps);
            for _ in 0..reps {
                drawn.push(s.draw_variant(TIMED_PURPOSE, *sets, InputVariant::Normal)?);
                *sets += 1;
                fresh_inputs += 1;
            }
            let label = format!("timed sample {}", n + 1);
            let t0 = Instant::now();
            let (kept, us) = s.candidate_sample(&drawn, &label)?;
            windows.push((t0, Instant::now()));
            raw.push(us);
            let probe = match s.target.overhead_probe() {
                Ok(p) => p,
                Err(f) => return Err(s.failure_verdict(f, "timer overhead round")),
            };
            let per_run = |us: f64, overhead: f64| ((us - overhead) / reps as f64).max(0.0);
            match probe {
                Some(p) if p < overhead_us => {
                    overhead_us = p;
                    samples = raw.iter().map(|&us| per_run(us, overhead_us)).collect();
                }
                _ => samples.push(per_run(us, overhead_us)),
            }
            let wall = started.elapsed();
            let stop = stop_or_race(&samples, wall, &tp, s.plan.race.as_ref());
            // Decided after the sample ran: the candidate cannot know which are checked.
            if stop.is_some() || rng.next_f64() < tp.recheck_fraction {
                for (rep, (inputs, out)) in drawn.iter().zip(kept).enumerate() {
                    let label = rep_label(&label, rep, reps);
                    s.target.select_rep(rep);
                    let got = match out {
                        Some(k) => k,
                        None => s.kept_outputs(&label, 0)?,
                    };
                    recheck(s, inputs, &got, &label)?;
                }
                s.target.select_rep(0);
                rechecks += 1;
            }
            if let Some(reason) = stop {
                return Ok(reason);
            }
        }
    })();
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    s.telemetry = s.target.timing_finished(&windows);
    let stop_reason = match result {
        Ok(r) => r,
        Err(Stop::Verdict(mut e)) => {
            e.telemetry = s.telemetry.clone();
            return Err(Stop::Verdict(e));
        }
        Err(e) => return Err(e),
    };
    let mut stats = stats(&samples);
    stats.stop_reason = stop_reason.to_string();
    stats.wall_ms = wall_ms;
    stats.fresh_inputs = fresh_inputs;
    stats.reps = reps as u32;
    stats.rechecks = rechecks;
    stats.overhead_us = overhead_us;
    stats.raw_median_us = raw_median(&stats);
    stats.warmup_ms = warmup_ms;
    stats.raced_out = stop_reason == "raced_out";
    stats.samples_us = kiln_types::kept_samples(&samples);
    Ok((stats, samples))
}

/// Compares a timed run's outputs with a reference run on the same inputs.
fn recheck<T: Target>(
    s: &mut Session<T>,
    inputs: &T::Inputs,
    got: &T::Kept,
    label: &str,
) -> Step<()> {
    let metrics = s
        .check(inputs, &[got], &format!("recheck of {label}"))?
        .into_iter()
        .next()
        .unwrap_or_default();
    if metrics.iter().any(|m| m.mismatches > 0) {
        let m = metrics
            .iter()
            .max_by_key(|m| m.mismatches)
            .cloned()
            .unwrap_or_default();
        s.evidence.deciding_trial = Some(format!("recheck of {label}"));
        s.evidence.errors = metrics;
        return Err(Box::new(s.verdict(
            Verdict::WrongAnswer,
            format!(
                "recheck of {label}: {} has {} elements outside tolerance (max abs {:.3e}); \
                 correct in the trials but not while timed",
                m.tensor, m.mismatches, m.max_abs
            ),
        ))
        .into());
    }
    Ok(())
}

/// The stop rule; `Some(reason)` when sampling should end.
pub fn stop_rule(
    samples: &[f64],
    wall: Duration,
    tp: &kiln_types::TimingPlan,
) -> Option<&'static str> {
    let n = samples.len() as u32;
    let wall_ms = wall.as_secs_f64() * 1e3;
    if n >= tp.max_samples.max(1) {
        return Some("max_samples");
    }
    if wall_ms >= tp.wall_cap_ms {
        return Some("wall_cap");
    }
    if n >= tp.min_samples.max(2) && wall_ms >= tp.min_time_ms && stats(samples).rse < tp.max_rse {
        return Some("converged");
    }
    None
}

/// The stop rule, then the race: `raced_out` only for a candidate the stop rule would
/// keep sampling (a converged candidate is never marked raced out).
pub fn stop_or_race(
    samples: &[f64],
    wall: Duration,
    tp: &kiln_types::TimingPlan,
    race: Option<&kiln_types::RaceBound>,
) -> Option<&'static str> {
    stop_rule(samples, wall, tp)
        .or_else(|| race::raced_out(&stats(samples), race, tp).then_some("raced_out"))
}

/// The median (sorts `v`; 0 for an empty slice).
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Median, mean, sample stdev, min, max, n and relative standard error of the mean.
pub fn stats(samples: &[f64]) -> TimingStats {
    let n = samples.len();
    if n == 0 {
        return TimingStats::default();
    }
    let mean = samples.iter().sum::<f64>() / n as f64;
    let var = if n > 1 {
        samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64
    } else {
        0.0
    };
    let stdev = var.sqrt();
    let mut sorted = samples.to_vec();
    let mut out = TimingStats {
        median_us: median(&mut sorted),
        mean_us: mean,
        stdev_us: stdev,
        min_us: sorted.first().copied().unwrap_or(0.0),
        max_us: sorted.last().copied().unwrap_or(0.0),
        n: n as u32,
        rse: if mean > 0.0 {
            stdev / (n as f64).sqrt() / mean
        } else {
            f64::INFINITY.min(1.0)
        },
        ..TimingStats::default()
    };
    if n > 1 {
        let (lo, hi) = race::interval(&out);
        out.ci_low_us = Some(lo);
        out.ci_high_us = Some(hi);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::contract::{CheckError, InputVariant, RunFailure, Unwritten};
    use kiln_types::{EvalPlan, ProblemSpec, TimingPlan};

    /// An input set of the scripted backend: the (purpose, index) it was drawn for.
    type Set = (String, u64);

    /// A backend whose samples and throttling flags are scripted, and which records the
    /// input sets it was handed.
    struct Scripted {
        samples: Vec<f64>,
        next: usize,
        /// Flagged sample indices per timing attempt.
        flags: Vec<Vec<usize>>,
        attempts: usize,
        /// Runs one sample can repeat.
        reps_max: usize,
        /// What an untimed run reports, µs.
        run_us: f64,
        overhead_us: f64,
        /// What `overhead` reports from its second call on (`None`: `overhead_us`).
        later_overhead_us: Option<f64>,
        /// What each `overhead_probe` between samples reports, in order (then `None`).
        probes: Vec<f64>,
        /// Sets of each timed sample; sets of every untimed run; sets checked.
        sampled: Vec<Vec<Set>>,
        ran: Vec<Set>,
        checked: Vec<Set>,
        selected: usize,
        /// What the candidate's process claims it launched (a hosted runner's list).
        claim: Option<Result<crate::engine::hosted::kernels::Breakdown, String>>,
    }

    impl Scripted {
        fn new(samples: Vec<f64>) -> Scripted {
            Scripted {
                samples,
                next: 0,
                flags: Vec::new(),
                attempts: 0,
                reps_max: 1,
                run_us: 0.0,
                overhead_us: 0.0,
                later_overhead_us: None,
                probes: Vec::new(),
                sampled: Vec::new(),
                ran: Vec::new(),
                checked: Vec::new(),
                selected: 0,
                claim: None,
            }
        }
    }

    impl Target for Scripted {
        type Inputs = Set;
        type Kept = Set;
        fn backend(&self) -> kiln_types::BackendKind {
            kiln_types::BackendKind::Host
        }
        fn draw(&mut self, _: u64, purpose: &str, i: u64, _: InputVariant) -> Result<Set, String> {
            Ok((purpose.to_string(), i))
        }
        fn run(&mut self, set: &Set) -> Result<f64, RunFailure> {
            self.ran.push(set.clone());
            self.selected = 0;
            Ok(self.run_us)
        }
        fn sample(&mut self, sets: &[Set]) -> Result<f64, RunFailure> {
            assert!(!sets.is_empty() && sets.len() <= self.reps_max);
            self.sampled.push(sets.to_vec());
            self.selected = 0;
            let v = self.samples[self.next % self.samples.len()];
            self.next += 1;
            Ok(v)
        }
        fn reps_max(&self) -> usize {
            self.reps_max
        }
        fn select_rep(&mut self, rep: usize) {
            self.selected = rep;
        }
        fn resolution_us(&self) -> f64 {
            0.5
        }
        fn tampered(&mut self, _: &Set) -> Result<Vec<String>, RunFailure> {
            Ok(Vec::new())
        }
        fn keep(&mut self, _: usize) -> Result<(Set, Vec<Unwritten>), RunFailure> {
            let last = match self.sampled.last() {
                Some(sets) => sets[self.selected].clone(),
                None => self.ran.last().cloned().unwrap_or_default(),
            };
            Ok((last, Vec::new()))
        }
        fn check(
            &mut self,
            set: &Set,
            kept: &[&Set],
            _: kiln_types::Tolerance,
        ) -> Result<Vec<Vec<kiln_types::ErrorMetrics>>, CheckError> {
            // A kept run compared with a reference on other inputs would be a bug.
            for k in kept {
                assert_eq!(*k, set, "outputs checked against another set's reference");
            }
            self.checked.push(set.clone());
            Ok(kept.iter().map(|_| Vec::new()).collect())
        }
        fn diff(
            &mut self,
            _: &Set,
            _: &Set,
            _: kiln_types::Tolerance,
        ) -> Result<(u64, bool), RunFailure> {
            Ok((0, true))
        }
        fn overhead(&mut self) -> Result<f64, RunFailure> {
            let now = self.overhead_us;
            if let Some(later) = self.later_overhead_us.take() {
                self.overhead_us = later;
            }
            Ok(now)
        }
        fn overhead_probe(&mut self) -> Result<Option<f64>, RunFailure> {
            Ok((!self.probes.is_empty()).then(|| self.probes.remove(0)))
        }
        fn claimed_kernels(
            &mut self,
        ) -> Option<Result<crate::engine::hosted::kernels::Breakdown, String>> {
            self.claim.clone()
        }
        fn outputs_every_sample(&self) -> bool {
            false
        }
        fn timing_finished(&mut self, _: &[(Instant, Instant)]) -> Option<serde_json::Value> {
            self.attempts += 1;
            None
        }
        fn throttled_samples(&self) -> Vec<usize> {
            self.flags
                .get(self.attempts.saturating_sub(1))
                .cloned()
                .unwrap_or_default()
        }
        /// Evidence whose event summary counts the samples it was asked to keep.
        fn timer_evidence(&self, excluded: &[usize]) -> Option<kiln_types::TimerEvidence> {
            let kept = 10 - excluded.len();
            Some(kiln_types::TimerEvidence {
                figure: kiln_types::TimingFigure::Events,
                asked: kiln_types::TimingFigure::KernelSpan,
                source: "events".into(),
                fallback: Some("scripted".into()),
                library: None,
                launches: 1,
                events: kiln_types::FigureSummary {
                    n: kept as u32,
                    ..Default::default()
                },
                kernel_sum: None,
                kernel_span: None,
                records_missing: 0,
                records_missing_reason: None,
            })
        }
    }

    fn problem() -> ProblemSpec {
        serde_json::from_value(serde_json::json!({
            "name": "scripted",
            "tensor": [
                {"name": "x", "dtype": "i32", "shape": [4], "role": "input"},
                {"name": "y", "dtype": "i32", "shape": [4], "role": "output"}
            ],
            "tolerance": {"atol": 0.0, "rtol": 0.0},
            "roofline": {"min_bytes": 0, "flops": 0},
            "reference": {}
        }))
        .expect("problem")
    }

    fn plan(policy: ThrottlePolicy, samples: u32, recheck_fraction: f64) -> EvalPlan {
        EvalPlan {
            seed: 1,
            trials: 1,
            run_timeout_ms: 1000,
            timing: TimingPlan {
                warmup: 2,
                min_samples: samples,
                min_time_ms: 0.0,
                max_rse: 1.0,
                max_samples: samples,
                wall_cap_ms: 60_000.0,
                recheck_fraction,
                throttle_policy: policy,
                figure: kiln_types::TimingFigure::default(),
            },
            peak_bytes_per_s: 0.0,
            peak_flops: 0.0,
            plain: None,
            race: None,
            record_launches: false,
        }
    }

    fn timed(policy: ThrottlePolicy) -> TimingStats {
        let problem = problem();
        let plan = plan(policy, 10, 0.0);
        // First attempt: samples 3 and 7 ran throttled (and slow); a second attempt is clean.
        let mut samples = vec![100.0; 20];
        samples[3] = 500.0;
        samples[7] = 500.0;
        let mut target = Scripted::new(samples);
        target.flags = vec![vec![3, 7], vec![]];
        let mut s = Session::new(&problem, &plan, target);
        match time(&mut s) {
            Ok(t) => t,
            Err(_) => panic!("timing stopped early"),
        }
    }

    /// The contract decides `no_own_kernels` from the kernels a candidate's process claims
    /// (a hosted runner's), and flags a claimed span that disagrees with kiln's time; a
    /// target with nothing to claim, or a claim it could not make, leaves the verdict.
    #[test]
    fn a_claim_of_library_kernels_only_is_no_own_kernels_and_a_span_is_evidence() {
        use crate::engine::hosted::kernels::{KernelRecord, classify};
        let problem = problem();
        let plan = plan(ThrottlePolicy::Report, 4, 0.0);
        let run = |claim| {
            let mut target = Scripted::new(vec![100.0]);
            target.claim = claim;
            let mut s = Session::new(&problem, &plan, target);
            let e = s.run().expect("evaluated");
            (e, s.claimed_kernels)
        };
        let record = |name: &str, us: f64| KernelRecord {
            name: name.into(),
            calls: 1,
            us,
        };
        let (plain, json) = run(None);
        assert_eq!(plain.verdict, Verdict::Ok);
        assert!(json.is_none());
        let library = classify(
            "no kernels here",
            vec![record("at::vectorized_elementwise", 90.0)],
        );
        let (e, json) = run(Some(Ok(library)));
        assert_eq!(e.verdict, Verdict::NoOwnKernels, "{}", e.message);
        assert!(e.timing.is_some(), "its time is kept");
        assert_eq!(json.expect("telemetry")["library_fraction"], 1.0);
        let mut own = classify(
            "__global__ void gelu(float* x) {}",
            vec![record("gelu(float*)", 10.0), record("other", 10.0)],
        );
        own.span_us = Some(400.0);
        let (e, _) = run(Some(Ok(own)));
        assert_eq!(e.verdict, Verdict::Ok);
        let notes = e.evidence.notes.join("\n");
        assert!(notes.contains("span on the GPU"), "{notes}");
        assert!(notes.contains("flagged: kiln's time"), "{notes}");
        let mut overlapped = classify(
            "__global__ void gelu(float* x) {}",
            vec![record("gelu(float*)", 90.0), record("gelu(float*) 2", 90.0)],
        );
        overlapped.span_us = Some(95.0);
        let (e, _) = run(Some(Ok(overlapped)));
        assert!(e.evidence.notes.join("\n").contains("several streams"));
        let (e, _) = run(Some(Err("no profiler".into())));
        assert_eq!(e.verdict, Verdict::Ok);
        assert!(
            e.evidence
                .notes
                .iter()
                .any(|n| n.contains("not recorded (no profiler)"))
        );
    }

    /// The raw median beside the net one: the net median plus the overhead per run; none
    /// where the timer has no overhead (the GPU's own clocks); throttled samples dropped
    /// keep it consistent with the net median left.
    #[test]
    fn the_raw_median_is_the_net_one_plus_the_overhead_per_run() {
        let mut t = stats(&[10.0, 12.0, 14.0]);
        t.reps = 2;
        t.overhead_us = 200.0;
        assert_eq!(raw_median(&t), Some(112.0));
        t.overhead_us = 0.0;
        assert_eq!(raw_median(&t), None);
        t.overhead_us = 50.0;
        t.reps = 1;
        let kept = discard_throttled(t, &[10.0, 12.0, 14.0], &[2]);
        assert_eq!(kept.median_us, 11.0);
        assert_eq!(kept.raw_median_us, Some(61.0));
    }

    #[test]
    fn every_timed_run_gets_a_set_no_run_saw_before() {
        let problem = problem();
        // Retry with throttled samples: two attempts, so two warm-ups and two sample series.
        let plan = plan(ThrottlePolicy::Retry, 12, 0.5);
        let mut target = Scripted::new(vec![100.0; 24]);
        target.flags = vec![vec![0, 1, 2], vec![]];
        target.reps_max = 4;
        target.run_us = 30.0; // tiny: repeated 4 times per sample (the most it can)
        target.overhead_us = 10.0;
        let mut s = Session::new(&problem, &plan, target);
        let e = s.run().expect("runs");
        assert_eq!(e.verdict, Verdict::Ok, "{e:?}");
        let t = e.timing.expect("timed");
        assert!(t.throttle_retried);
        assert_eq!(t.reps, 4);
        let target = &s.target;
        assert_eq!(target.sampled.len(), 24, "two attempts of 12 samples");
        let mut seen: std::collections::HashSet<Set> = target.ran.iter().cloned().collect();
        for sets in &target.sampled {
            assert_eq!(sets.len(), 4);
            for set in sets {
                assert!(seen.insert(set.clone()), "{set:?} was run on before");
            }
        }
        assert_eq!(t.fresh_inputs, 12 * 4, "the kept attempt's sets");
        // Every check of a timed run compared it on its own set (asserted in `check`), and
        // each re-checked sample had all of its runs checked.
        let timed_checks: Vec<&Set> = target
            .checked
            .iter()
            .filter(|c| c.0 == TIMED_PURPOSE)
            .collect();
        assert!(!timed_checks.is_empty());
        for sets in &target.sampled {
            let n = sets.iter().filter(|x| timed_checks.contains(x)).count();
            assert!(
                n == 0 || n == sets.len(),
                "a sample half re-checked: {sets:?}"
            );
        }
        // The last sample of each attempt is always re-checked.
        assert!(timed_checks.contains(&&target.sampled[11][3]));
        assert!(timed_checks.contains(&&target.sampled[23][3]));
    }

    #[test]
    fn repetitions_bring_a_sample_above_the_timer() {
        // No repetition possible: one run.
        assert_eq!(reps_for(0.1, 10.0, 0.001, 1), 1);
        // 100 µs target (10 × 10 µs overhead), 2 µs runs: 50 of them.
        assert_eq!(reps_for(2.0, 10.0, 0.001, 64), 50);
        // Capped; unknown run time gets all it can; long runs get one.
        assert_eq!(reps_for(0.5, 10.0, 0.001, 64), 64);
        assert_eq!(reps_for(0.0, 10.0, 0.001, 64), 64);
        assert_eq!(reps_for(-3.0, 10.0, 0.001, 64), 64);
        assert_eq!(reps_for(5000.0, 10.0, 0.001, 64), 1);
        // The floor of 50 µs applies with no overhead.
        assert_eq!(reps_for(10.0, 0.0, 0.001, 64), 5);
    }

    #[test]
    fn a_sample_at_or_below_the_timer_is_not_a_time() {
        let t = |median_us: f64, reps: u32, overhead_us: f64| TimingStats {
            median_us,
            reps,
            overhead_us,
            ..TimingStats::default()
        };
        // The 0 µs medians of issue 21: never a time.
        let why = unmeasurable(&t(0.0, 1, 12.0), 0.001).expect("zero");
        assert!(why.contains("no time"), "{why}");
        // At the overhead, or at the resolution: not a time either.
        assert!(unmeasurable(&t(12.0, 1, 12.0), 0.001).is_some());
        assert!(unmeasurable(&t(0.5, 1, 0.0), 0.5).is_some());
        // Per-run medians are judged per sample: 64 runs of 0.25 µs are 16 µs.
        assert!(unmeasurable(&t(0.25, 64, 12.0), 0.001).is_none());
        assert!(unmeasurable(&t(0.15, 64, 12.0), 0.001).is_some());
        assert!(unmeasurable(&t(3.0, 1, 0.0), 0.5).is_none());
    }

    #[test]
    fn tiny_samples_get_unmeasurable_time_and_no_figure() {
        let problem = problem();
        let plan = plan(ThrottlePolicy::Report, 10, 0.0);
        let mut target = Scripted::new(vec![10.2, 10.0, 10.1]);
        target.overhead_us = 10.0; // every sample is the overhead plus noise
        let mut s = Session::new(&problem, &plan, target);
        let e = s.run().expect("runs");
        assert_eq!(e.verdict, Verdict::UnmeasurableTime, "{e:?}");
        assert!(e.timing.is_none(), "no figure for an unmeasurable time");
        assert!(e.tier.is_some());
    }

    #[test]
    fn an_overhead_inflated_by_load_gets_a_second_attempt_before_unmeasurable() {
        // Seen on a loaded 2-core CI machine: the fastest empty round trip before the
        // samples read 17.5 µs, the warm-up runs ~105 µs (so 2 runs per sample), and then
        // the samples of 2 runs took 11.6 µs in all: below the overhead, so no time.
        let mut target = repeatable(11.6, 17.5);
        target.run_us = 105.0;
        target.later_overhead_us = Some(1.0);
        let (e, target) = run_ten_samples(target);
        assert_eq!(e.verdict, Verdict::Ok, "{e:?}");
        let t = e.timing.expect("a time");
        // Measured afresh (1 µs), and 4 × 2 runs per sample: (11.6 - 1) / 8 µs a run.
        assert_eq!((t.reps, t.overhead_us), (8, 1.0));
        assert!((t.median_us - 10.6 / 8.0).abs() < 1e-9, "{t:?}");
        assert_eq!(target.sampled.len(), 20, "two attempts of 10 samples");
        assert_eq!(t.fresh_inputs, 10 * 8, "the kept attempt's sets");
        let mut seen = std::collections::HashSet::new();
        for set in target.sampled.iter().flatten() {
            assert!(seen.insert(set.clone()), "{set:?} timed twice");
        }
    }

    #[test]
    fn a_faster_round_trip_between_samples_lowers_the_overhead_of_every_sample() {
        // CI, loaded: every empty round trip before the samples read 37 µs, the samples
        // themselves less. A round trip between samples 3 and 4 reads 1 µs: the overhead
        // is that, for the samples before it too, and no second attempt is needed.
        let mut target = repeatable(11.6, 17.5);
        target.run_us = 105.0;
        target.probes = vec![20.0, 30.0, 1.0, 5.0];
        let (e, target) = run_ten_samples(target);
        assert_eq!(e.verdict, Verdict::Ok, "{e:?}");
        let t = e.timing.expect("a time");
        assert_eq!((t.reps, t.overhead_us), (2, 1.0));
        assert!((t.median_us - 10.6 / 2.0).abs() < 1e-9, "{t:?}");
        assert!(
            t.samples_us.iter().all(|&us| (us - 5.3).abs() < 1e-9),
            "{t:?}"
        );
        assert_eq!(target.sampled.len(), 10, "one attempt");
    }

    #[test]
    fn a_time_still_below_the_timer_after_the_second_attempt_is_unmeasurable() {
        // Every sample of 64 runs is the overhead and 0.1 µs.
        let (e, target) = run_ten_samples(repeatable(10.1, 10.0));
        assert_eq!(e.verdict, Verdict::UnmeasurableTime, "{e:?}");
        assert!(e.timing.is_none());
        assert_eq!(target.sampled.len(), 20, "timed twice before giving up");
        // A backend that cannot repeat runs (the GPU) is not timed again.
        let mut once = repeatable(10.1, 10.0);
        once.reps_max = 1;
        let (e, target) = run_ten_samples(once);
        assert_eq!(e.verdict, Verdict::UnmeasurableTime, "{e:?}");
        assert_eq!(target.sampled.len(), 10);
    }

    /// A target that can repeat up to 64 runs a sample, every sample reading `sample_us`,
    /// with an empty round trip of `overhead_us`.
    fn repeatable(sample_us: f64, overhead_us: f64) -> Scripted {
        let mut target = Scripted::new(vec![sample_us]);
        target.reps_max = 64;
        target.overhead_us = overhead_us;
        target
    }

    /// `target` through a whole session of 10 samples (throttling only reported): the
    /// evaluation, and the target with what it saw.
    fn run_ten_samples(target: Scripted) -> (kiln_types::Evaluation, Scripted) {
        let problem = problem();
        let plan = plan(ThrottlePolicy::Report, 10, 0.0);
        let mut s = Session::new(&problem, &plan, target);
        let e = s.run().expect("runs");
        (e, s.target)
    }

    #[test]
    fn throttle_policy_report_discard_retry() {
        let report = timed(ThrottlePolicy::Report);
        assert_eq!((report.n, report.throttled_discarded), (10, 0));
        assert_eq!(report.samples_us.len(), 10, "every sample kept");
        assert_eq!(report.samples_us[3], 500.0);
        assert!((report.mean_us - 180.0).abs() < 1e-9, "{report:?}");
        // The target's timer evidence covers the samples the statistics kept.
        let n_timer = |t: &TimingStats| t.timer.as_ref().map(|e| e.events.n);
        assert_eq!(n_timer(&report), Some(10));
        let discard = timed(ThrottlePolicy::Discard);
        assert_eq!((discard.n, discard.throttled_discarded), (8, 2));
        assert_eq!(n_timer(&discard), Some(8));
        assert_eq!(discard.samples_us, vec![100.0; 8], "the kept ones only");
        assert!((discard.mean_us - 100.0).abs() < 1e-9, "{discard:?}");
        assert!(!discard.throttle_retried);
        // 2 of 10 flagged is over a tenth: timed again; the clean second attempt is kept.
        let retry = timed(ThrottlePolicy::Retry);
        assert!(retry.throttle_retried, "{retry:?}");
        assert_eq!((retry.n, retry.throttled_discarded), (10, 0));
        assert!((retry.mean_us - 100.0).abs() < 1e-9, "{retry:?}");
    }

    #[test]
    fn throttled_samples_are_dropped_unless_all_are() {
        let samples = [10.0, 50.0, 10.0, 10.0, 60.0];
        let base = stats(&samples);
        let kept = discard_throttled(base.clone(), &samples, &[1, 4]);
        assert_eq!(kept.n, 3);
        assert_eq!(kept.median_us, 10.0);
        assert_eq!(kept.throttled_discarded, 2);
        // Every sample throttled: nothing left to keep, the statistics stand as they are.
        let all = discard_throttled(base.clone(), &samples, &[0, 1, 2, 3, 4]);
        assert_eq!(all.n, 5);
        assert_eq!(all.throttled_discarded, 0);
        assert_eq!(discard_throttled(base.clone(), &samples, &[]), base);
    }

    #[test]
    fn stats_and_stop_rule() {
        let s = stats(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(s.median_us, 2.5);
        assert_eq!(s.mean_us, 2.5);
        assert_eq!(s.n, 4);
        assert!((s.stdev_us - 1.290_994).abs() < 1e-5);
        let tp = kiln_types::TimingPlan {
            min_samples: 3,
            min_time_ms: 0.0,
            max_rse: 0.01,
            max_samples: 10,
            wall_cap_ms: 1000.0,
            ..Default::default()
        };
        assert_eq!(
            stop_rule(&[5.0, 5.0, 5.0], Duration::ZERO, &tp),
            Some("converged")
        );
        assert_eq!(stop_rule(&[1.0, 9.0, 1.0], Duration::ZERO, &tp), None);
        assert_eq!(
            stop_rule(&[1.0; 10], Duration::ZERO, &tp),
            Some("max_samples")
        );
        assert_eq!(
            stop_rule(&[1.0, 9.0], Duration::from_secs(2), &tp),
            Some("wall_cap")
        );
    }

    #[test]
    fn racing_stops_a_clearly_slower_candidate_after_the_stop_rule() {
        let tp = kiln_types::TimingPlan {
            min_samples: 3,
            min_time_ms: 1e9,
            max_rse: 1e-9,
            max_samples: 100,
            wall_cap_ms: 1e9,
            ..Default::default()
        };
        let bound = kiln_types::RaceBound {
            incumbent_upper_us: 10.0,
            margin: 0.05,
        };
        let slow = [20.0, 20.5, 19.5];
        // Without a bound the stop rule keeps sampling; with one, the race ends it.
        assert_eq!(stop_or_race(&slow, Duration::ZERO, &tp, None), None);
        assert_eq!(
            stop_or_race(&slow, Duration::ZERO, &tp, Some(&bound)),
            Some("raced_out")
        );
        // Too few samples, or not clearly slower: keep sampling.
        assert_eq!(
            stop_or_race(&slow[..2], Duration::ZERO, &tp, Some(&bound)),
            None
        );
        assert_eq!(
            stop_or_race(&[10.2, 10.4, 10.3], Duration::ZERO, &tp, Some(&bound)),
            None
        );
        // When the stop rule ends sampling anyway, its reason wins.
        assert_eq!(
            stop_or_race(&slow, Duration::from_secs(1_000_000), &tp, Some(&bound)),
            Some("wall_cap")
        );
        // The interval reached is reported with the stats.
        let st = stats(&slow);
        let (lo, hi) = (st.ci_low_us.expect("lo"), st.ci_high_us.expect("hi"));
        assert!(lo < st.mean_us && st.mean_us < hi && lo > bound.threshold_us());
    }
}
