//! Plain timing, for comparison with the contract's: what KernelBench did — events around
//! one launch of the plan, a fixed number of samples, no L2 flush, no blocking kernel, no
//! fresh inputs. Taken through [`Target::plain_sample`] after the usual warm-up; the last
//! run's outputs are re-checked against the reference. The result is marked `plain` and
//! never ranks as a best.

use std::time::Instant;

use kiln_types::TimingStats;

use super::super::{RunFailure, Session, Step, Stop, Target};

/// What a [`Target`] without plain timing answers.
pub const UNSUPPORTED: &str = "plain timing is not supported by this backend";

/// `reps` plain samples of the candidate on `inputs` (already current after warm-up),
/// stopping early only at the plan's wall cap.
pub fn time<T: Target>(
    s: &mut Session<T>,
    inputs: &T::Inputs,
    reps: u32,
    overhead_us: f64,
) -> Step<TimingStats> {
    let wall_cap_ms = s.plan.timing.wall_cap_ms;
    let mut samples = Vec::with_capacity(reps as usize);
    let mut windows: Vec<(Instant, Instant)> = Vec::with_capacity(reps as usize);
    s.target.timing_started();
    let started = Instant::now();
    let result = (|| -> Step<&'static str> {
        let mut label = String::from("plain sample 1");
        for i in 0..reps.max(1) {
            label = format!("plain sample {}", i + 1);
            let t0 = Instant::now();
            let us = match s.target.plain_sample(inputs) {
                Ok(us) => us,
                Err(RunFailure::Fault(f)) if f == UNSUPPORTED => {
                    return Err(Stop::Infra(format!(
                        "{UNSUPPORTED} ({})",
                        s.target.backend()
                    )));
                }
                Err(f) => return Err(s.failure_verdict(f, &label)),
            };
            windows.push((t0, Instant::now()));
            samples.push((us - overhead_us).max(0.0));
            if started.elapsed().as_secs_f64() * 1e3 >= wall_cap_ms {
                let got = s.kept_outputs(&label, 0)?;
                super::recheck(s, inputs, &got, &label)?;
                return Ok("wall_cap");
            }
        }
        let got = s.kept_outputs(&label, 0)?;
        super::recheck(s, inputs, &got, &label)?;
        Ok("plain")
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
    let mut stats = super::stats(&samples);
    stats.stop_reason = stop_reason.to_string();
    stats.wall_ms = wall_ms;
    stats.rechecks = 1;
    stats.overhead_us = overhead_us;
    stats.plain = true;
    stats.samples_us = kiln_types::kept_samples(&samples);
    Ok(stats)
}
