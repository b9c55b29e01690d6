//! Timing a correct candidate (design guide §5, host flavour).
//!
//! 1. the timer's own overhead: the median of empty round trips (`E`), subtracted later;
//! 2. the first launch is discarded, then `warmup` untimed runs;
//! 3. samples: outputs poisoned and scratch zeroed before every run (so nothing can be
//!    skipped because last run's result is still there), a fresh input set every
//!    `fresh_inputs_every` samples, inputs checked after every run, and a random subset of
//!    runs (plus always the last) re-checked against a reference run on the same inputs;
//! 4. stop rule: at least `min_samples` and `min_time_ms`, then relative standard error
//!    below `max_rse` (`converged`), or `max_samples` (`max_samples`) or `wall_cap_ms`
//!    (`wall_cap`).
//!
//! A CPU has no L2 flush step here: inputs are rewritten only with fresh sets, and the
//! poisoning of outputs touches them before each run.

use std::time::{Duration, Instant};

use kiln_types::{TimingStats, Verdict};

use super::data;
use super::evaluate::{Inputs, Outputs, Session, Step};
use super::runner_ctl::RunEnd;

/// Empty round trips used to measure the timer's overhead.
const OVERHEAD_ROUNDS: usize = 16;

/// Runs the timing phase; an early verdict if a timed run misbehaves.
pub fn time(s: &mut Session) -> Step<TimingStats> {
    let tp = s.plan.timing.clone();
    // 1. Overhead.
    let mut empty = Vec::with_capacity(OVERHEAD_ROUNDS);
    for _ in 0..OVERHEAD_ROUNDS {
        match s.candidate.run(b'E', s.run_timeout) {
            RunEnd::Done(d) => empty.push(d.as_secs_f64() * 1e6),
            end => return Err(s.run_end_verdict(end, "timer overhead round").into()),
        }
    }
    let overhead_us = median(&mut empty);

    // 2. Discarded first launch and warm-up.
    let mut set = 0u64;
    let mut inputs = s.draw("timing", set, false);
    for w in 0..=tp.warmup {
        s.candidate_run(&inputs, &format!("warm-up run {w}"))?;
    }

    // 3-4. Samples.
    let mut rng = data::rng_for(s.plan.seed, "recheck", 0);
    let mut samples: Vec<f64> = Vec::new();
    let mut fresh_inputs = 0u32;
    let mut rechecks = 0u32;
    let mut want: Option<Outputs> = None;
    let started = Instant::now();
    let stop_reason = loop {
        let n = samples.len() as u32;
        if n > 0 && tp.fresh_inputs_every > 0 && n.is_multiple_of(tp.fresh_inputs_every) {
            set += 1;
            inputs = s.draw("timing", set, false);
            want = None;
            fresh_inputs += 1;
        }
        let label = format!("timed sample {}", n + 1);
        let (out, elapsed) = s.candidate_run(&inputs, &label)?;
        samples.push((elapsed.as_secs_f64() * 1e6 - overhead_us).max(0.0));
        let wall = started.elapsed();
        let stop = stop_rule(&samples, wall, &tp);
        if stop.is_some() || rng.next_f64() < tp.recheck_fraction {
            recheck(s, &inputs, &mut want, &out, &label)?;
            rechecks += 1;
        }
        if let Some(reason) = stop {
            break reason;
        }
    };
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut stats = stats(&samples);
    stats.stop_reason = stop_reason.to_string();
    stats.wall_ms = wall_ms;
    stats.fresh_inputs = fresh_inputs;
    stats.rechecks = rechecks;
    stats.overhead_us = overhead_us;
    Ok(stats)
}

/// Compares a timed run's outputs with a reference run on the same inputs.
fn recheck(
    s: &mut Session,
    inputs: &Inputs,
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

fn median(v: &mut [f64]) -> f64 {
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
