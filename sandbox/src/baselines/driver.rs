//! The one timing driver every baseline is measured by: the first run discarded, `warmup`
//! untimed runs, then timed samples with a fresh input set for every sample (as for a
//! candidate), until the contract's stop rule ([`crate::engine::contract::timing::stop_rule`]) ends
//! them; statistics by [`crate::engine::contract::timing::stats`].
//!
//! A baseline provides only the mechanics ([`Sampler`]): one untimed run, a fresh input
//! set, one timed sample. The GPU worker's samples go through `kiln_gpu`'s
//! `Gpu::time_sample_with` (L2 flush, blocking kernel, events); the torch runner's through
//! its `sample` command, with the flush size and blocker length kiln passes
//! ([`SampleSpec`]).

use std::time::Instant;

use kiln_types::{TimingPlan, TimingStats};

use crate::engine::contract::timing::{stats, stop_rule};

/// How the torch runner takes one sample, as kiln sets it: bytes of the L2 flush buffer
/// it writes with a new value before the sample, and nanoseconds of the blocking kernel
/// that holds the start event back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SampleSpec {
    /// Bytes of the flush buffer (`kiln_gpu::timing::l2_flush_bytes` of the GPU's L2).
    pub flush_bytes: u64,
    /// Length of the blocking kernel, nanoseconds.
    pub blocker_ns: u64,
}

/// The mechanics of one baseline the driver times.
pub trait Sampler {
    /// Why a step failed.
    type Error;
    /// One untimed run, waited for.
    fn run(&mut self) -> Result<(), Self::Error>;
    /// Makes input set `set` current (set 0 is current when timing starts).
    fn fresh_inputs(&mut self, set: u64) -> Result<(), Self::Error>;
    /// One timed, L2-cold sample, microseconds.
    fn sample(&mut self) -> Result<f64, Self::Error>;
}

/// Times `s` under `tp`: the discarded first run and the warm-up, then samples until the
/// stop rule; the statistics carry the stop reason, the wall time and the fresh sets.
pub fn measure<S: Sampler>(tp: &TimingPlan, s: &mut S) -> Result<TimingStats, S::Error> {
    s.fresh_inputs(0)?;
    for _ in 0..=tp.warmup {
        s.run()?;
    }
    let mut samples: Vec<f64> = Vec::new();
    let mut set = 0u64;
    let mut fresh = 0u32;
    let started = Instant::now();
    let reason = loop {
        set += 1;
        s.fresh_inputs(set)?;
        fresh += 1;
        samples.push(s.sample()?);
        if let Some(r) = stop_rule(&samples, started.elapsed(), tp) {
            break r;
        }
    };
    let mut out = stats(&samples);
    out.stop_reason = reason.to_string();
    out.wall_ms = started.elapsed().as_secs_f64() * 1e3;
    out.fresh_inputs = fresh;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts calls; samples cycle through `times`.
    struct Scripted {
        times: Vec<f64>,
        runs: u32,
        sets: Vec<u64>,
        taken: usize,
    }

    impl Sampler for Scripted {
        type Error = String;
        fn run(&mut self) -> Result<(), String> {
            self.runs += 1;
            Ok(())
        }
        fn fresh_inputs(&mut self, set: u64) -> Result<(), String> {
            self.sets.push(set);
            Ok(())
        }
        fn sample(&mut self) -> Result<f64, String> {
            let t = self.times[self.taken % self.times.len()];
            self.taken += 1;
            if t < 0.0 {
                return Err("fault".into());
            }
            Ok(t)
        }
    }

    #[test]
    fn warmup_fresh_sets_and_the_stop_rule() {
        let tp = TimingPlan {
            warmup: 2,
            min_samples: 10,
            min_time_ms: 0.0,
            max_rse: 1e-9,
            max_samples: 20,
            ..TimingPlan::default()
        };
        let mut s = Scripted {
            times: vec![10.0, 12.0],
            runs: 0,
            sets: Vec::new(),
            taken: 0,
        };
        let st = measure(&tp, &mut s).expect("measured");
        assert_eq!(s.runs, 3, "the discarded first run and two warm-up runs");
        assert_eq!(st.n, 20);
        assert_eq!(st.stop_reason, "max_samples");
        assert_eq!(
            s.sets,
            (0..=20).collect::<Vec<u64>>(),
            "set 0 for the warm-up, then a fresh set before every sample"
        );
        assert_eq!(st.fresh_inputs, 20);
        assert_eq!(st.median_us, 11.0);

        let steady = TimingPlan {
            max_rse: 0.5,
            ..tp.clone()
        };
        let st = measure(
            &steady,
            &mut Scripted {
                times: vec![10.0],
                runs: 0,
                sets: Vec::new(),
                taken: 0,
            },
        )
        .expect("measured");
        assert_eq!((st.n, st.stop_reason.as_str()), (10, "converged"));
    }

    #[test]
    fn a_failed_sample_ends_the_measurement() {
        let mut s = Scripted {
            times: vec![5.0, -1.0],
            runs: 0,
            sets: Vec::new(),
            taken: 0,
        };
        assert_eq!(
            measure(&TimingPlan::default(), &mut s),
            Err("fault".to_string())
        );
    }
}
