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
//! The target's telemetry (NVML on the GPU) covers exactly the sampling window.

use std::time::{Duration, Instant};

use kiln_types::{TimingStats, Verdict};

use super::{Outputs, Session, Step, Stop, Target};
use crate::host::data;

/// Runs the timing phase; an early verdict if a timed run misbehaves.
pub fn time<T: Target>(s: &mut Session<T>) -> Step<TimingStats> {
    let tp = s.plan.timing.clone();
    // 1. Overhead.
    let overhead_us = match s.target.overhead() {
        Ok(us) => us,
        Err(f) => return Err(s.failure_verdict(f, "timer overhead round").into()),
    };

    // 2. Discarded first launch and warm-up.
    let mut set = 0u64;
    let mut inputs = s.draw("timing", set, false)?;
    for w in 0..=tp.warmup {
        s.candidate_run(&inputs, &format!("warm-up run {w}"))?;
    }

    // 3-4. Samples.
    let mut rng = data::rng_for(s.plan.seed, "recheck", 0);
    let mut samples: Vec<f64> = Vec::new();
    let mut windows: Vec<(Instant, Instant)> = Vec::new();
    let mut fresh_inputs = 0u32;
    let mut rechecks = 0u32;
    let mut want: Option<Outputs> = None;
    s.target.timing_started();
    let started = Instant::now();
    let result = (|| -> Step<&'static str> {
        loop {
            let n = samples.len() as u32;
            if n > 0 && tp.fresh_inputs_every > 0 && n.is_multiple_of(tp.fresh_inputs_every) {
                set += 1;
                inputs = s.draw("timing", set, false)?;
                want = None;
                fresh_inputs += 1;
            }
            let label = format!("timed sample {}", n + 1);
            let t0 = Instant::now();
            let (out, us) = s.candidate_sample(&inputs, &label)?;
            windows.push((t0, Instant::now()));
            samples.push((us - overhead_us).max(0.0));
            let wall = started.elapsed();
            let stop = stop_rule(&samples, wall, &tp);
            if stop.is_some() || rng.next_f64() < tp.recheck_fraction {
                let got = match out {
                    Some(o) => o,
                    None => s.checked_outputs(&label)?,
                };
                recheck(s, &inputs, &mut want, &got, &label)?;
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
    Ok(stats)
}

/// Compares a timed run's outputs with a reference run on the same inputs.
fn recheck<T: Target>(
    s: &mut Session<T>,
    inputs: &T::Inputs,
    want: &mut Option<Outputs>,
    got: &Outputs,
    label: &str,
) -> Step<()> {
    if want.is_none() {
        *want = Some(s.reference_outputs(inputs)?);
    }
    let Some(w) = want.as_ref() else {
        return Ok(());
    };
    let metrics = s.metrics(got, w);
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
    TimingStats {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
