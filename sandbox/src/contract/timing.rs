//! The timing phase of the contract (design guide §5), for every backend.
//!
//! 1. the timer's own overhead (host: the fastest of the empty round trips; GPU: none, events
//!    time the GPU), subtracted from every sample;
//! 2. the first launch is discarded, then `warmup` untimed runs;
//! 3. samples: each one through [`Target::sample`] (outputs poisoned and scratch zeroed
//!    before every run; on the GPU also the L2 flush, the blocking kernel, events and a
//!    context sync), inputs checked after every run, a fresh input set every
//!    `fresh_inputs_every` samples, and a random subset of runs (plus always the last)
//!    re-checked against a reference run on the same inputs;
//! 4. stop rule: at least `min_samples` and `min_time_ms`, then relative standard error
//!    below `max_rse` (`converged`), or `max_samples` (`max_samples`) or `wall_cap_ms`
//!    (`wall_cap`).
//!
//! The target's telemetry (NVML on the GPU) covers exactly the sampling window. The samples
//! the statistics come from are kept with them (`TimingStats::samples_us`, at most
//! `kiln_types::MAX_KEPT_SAMPLES`), for the histogram of `kiln show ID --report`.
//!
//! Two variants, asked for by the plan: racing ([`race`]: with an incumbent's bound, a
//! candidate clearly slower than it stops early, `raced_out`), and plain timing
//! ([`plain`]: KernelBench's way, for comparison, instead of steps 3-4).

use std::time::{Duration, Instant};

use kiln_types::{ThrottlePolicy, TimingStats, Verdict};

use super::{Session, Step, Stop, Target};
use crate::contract::data;

pub mod plain;
pub mod race;

/// Runs the timing phase; an early verdict if a timed run misbehaves. Then applies the
/// plan's throttle policy: `discard` drops throttled samples from the statistics,
/// `retry` also times once more when over a tenth of them were throttled. The target's
/// timer evidence (GPU: which figure the samples are, and the others) covers the samples
/// the statistics kept.
pub fn time<T: Target>(s: &mut Session<T>) -> Step<TimingStats> {
    let (first, samples) = time_once(s)?;
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
        let (again, samples) = time_once(s)?;
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
    out.rechecks = stats.rechecks;
    out.overhead_us = stats.overhead_us;
    out.warmup_ms = stats.warmup_ms;
    out.raced_out = stats.raced_out;
    out.throttled_discarded = (samples.len() - kept.len()) as u32;
    out.samples_us = kiln_types::kept_samples(&kept);
    out
}

/// One timing attempt: the statistics and the raw samples (empty for plain timing).
fn time_once<T: Target>(s: &mut Session<T>) -> Step<(TimingStats, Vec<f64>)> {
    let tp = s.plan.timing.clone();
    let setup = Instant::now();
    // 1. Overhead.
    let overhead_us = match s.target.overhead() {
        Ok(us) => us,
        Err(f) => return Err(s.failure_verdict(f, "timer overhead round").into()),
    };

    // 2. Discarded first launch and warm-up.
    let mut set = 0u64;
    let mut inputs = s.draw("timing", set, false)?;
    for w in 0..=tp.warmup {
        s.warmup_run(&inputs, &format!("warm-up run {w}"))?;
    }

    let warmup_ms = setup.elapsed().as_secs_f64() * 1e3;
    if let Some(reps) = s.plan.plain {
        let mut stats = plain::time(s, &inputs, reps, overhead_us)?;
        stats.warmup_ms = warmup_ms;
        return Ok((stats, Vec::new()));
    }

    // 3-4. Samples.
    let mut rng = data::rng_for(s.plan.seed, "recheck", 0);
    let mut samples: Vec<f64> = Vec::new();
    let mut windows: Vec<(Instant, Instant)> = Vec::new();
    let mut fresh_inputs = 0u32;
    let mut rechecks = 0u32;
    s.target.timing_started();
    let started = Instant::now();
    let result = (|| -> Step<&'static str> {
        loop {
            let n = samples.len() as u32;
            if n > 0 && tp.fresh_inputs_every > 0 && n.is_multiple_of(tp.fresh_inputs_every) {
                set += 1;
                inputs = s.draw("timing", set, false)?;
                fresh_inputs += 1;
            }
            let label = format!("timed sample {}", n + 1);
            let t0 = Instant::now();
            let (out, us) = s.candidate_sample(&inputs, &label)?;
            windows.push((t0, Instant::now()));
            samples.push((us - overhead_us).max(0.0));
            let wall = started.elapsed();
            let stop = stop_or_race(&samples, wall, &tp, s.plan.race.as_ref());
            if stop.is_some() || rng.next_f64() < tp.recheck_fraction {
                let got = match out {
                    Some(k) => k,
                    None => s.kept_outputs(&label, 0)?,
                };
                recheck(s, &inputs, &got, &label)?;
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
    stats.rechecks = rechecks;
    stats.overhead_us = overhead_us;
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
    use crate::contract::{CheckError, InputVariant, RunFailure, Unwritten};
    use kiln_types::{EvalPlan, ProblemSpec, TimingPlan};

    /// A backend whose samples and throttling flags are scripted.
    struct Scripted {
        samples: Vec<f64>,
        next: usize,
        /// Flagged sample indices per timing attempt.
        flags: Vec<Vec<usize>>,
        attempts: usize,
    }

    impl Target for Scripted {
        type Inputs = ();
        type Kept = ();
        fn backend(&self) -> &'static str {
            "scripted"
        }
        fn draw(&mut self, _: u64, _: &str, _: u64, _: InputVariant) -> Result<(), String> {
            Ok(())
        }
        fn run(&mut self, _: &()) -> Result<f64, RunFailure> {
            Ok(0.0)
        }
        fn sample(&mut self, _: &()) -> Result<f64, RunFailure> {
            let v = self.samples[self.next % self.samples.len()];
            self.next += 1;
            Ok(v)
        }
        fn tampered(&mut self, _: &()) -> Result<Vec<String>, RunFailure> {
            Ok(Vec::new())
        }
        fn keep(&mut self, _: usize) -> Result<((), Vec<Unwritten>), RunFailure> {
            Ok(((), Vec::new()))
        }
        fn check(
            &mut self,
            _: &(),
            kept: &[&()],
            _: kiln_types::Tolerance,
        ) -> Result<Vec<Vec<kiln_types::ErrorMetrics>>, CheckError> {
            Ok(kept.iter().map(|_| Vec::new()).collect())
        }
        fn diff(
            &mut self,
            _: &(),
            _: &(),
            _: kiln_types::Tolerance,
        ) -> Result<(u64, bool), RunFailure> {
            Ok((0, true))
        }
        fn overhead(&mut self) -> Result<f64, RunFailure> {
            Ok(0.0)
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

    fn timed(policy: ThrottlePolicy) -> TimingStats {
        let problem: ProblemSpec = serde_json::from_value(serde_json::json!({
            "name": "scripted",
            "tensor": [
                {"name": "x", "dtype": "i32", "shape": [4], "role": "input"},
                {"name": "y", "dtype": "i32", "shape": [4], "role": "output"}
            ],
            "tolerance": {"atol": 0.0, "rtol": 0.0},
            "roofline": {"min_bytes": 0, "flops": 0},
            "reference": {}
        }))
        .expect("problem");
        let plan = EvalPlan {
            seed: 1,
            trials: 1,
            run_timeout_ms: 1000,
            timing: TimingPlan {
                warmup: 0,
                min_samples: 10,
                min_time_ms: 0.0,
                max_rse: 1.0,
                max_samples: 10,
                wall_cap_ms: 60_000.0,
                fresh_inputs_every: 0,
                recheck_fraction: 0.0,
                throttle_policy: policy,
                figure: kiln_types::TimingFigure::default(),
            },
            peak_bytes_per_s: 0.0,
            peak_flops: 0.0,
            plain: None,
            race: None,
        };
        // First attempt: samples 3 and 7 ran throttled (and slow); a second attempt is clean.
        let mut samples = vec![100.0; 20];
        samples[3] = 500.0;
        samples[7] = 500.0;
        let target = Scripted {
            samples,
            next: 0,
            flags: vec![vec![3, 7], vec![]],
            attempts: 0,
        };
        let mut s = Session::new(&problem, &plan, target);
        match time(&mut s) {
            Ok(t) => t,
            Err(_) => panic!("timing stopped early"),
        }
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
