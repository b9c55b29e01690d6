//! Timed samples, untimed runs, and waiting with a deadline.
//!
//! One **timed sample** ([`Gpu::time_sample`] for a launch list, [`Gpu::time_sample_with`]
//! for any work a closure enqueues), all on the Gpu's own stream:
//! 1. optional L2 flush: persisting lines reset, then a 2 × L2 buffer written with a new
//!    byte value and read back once, so that no dirty line is left for the work to write
//!    back (see [`Gpu::l2_flush`]);
//! 2. when the kernel tracer runs ([`crate::cupti`]): the stream is drained (the flush
//!    included) and a window of kernel records opened;
//! 3. optional blocking kernel: one thread spinning on `%globaltimer` for a few tens of
//!    microseconds, so that the start event and the launch list's launches are all queued before
//!    the GPU reaches the start event (nvbench's blocking kernel spins on a host flag
//!    instead; a timed spin needs no host-mapped memory and cannot deadlock);
//! 4. start event; the work; end event;
//! 5. wait with a deadline (polling `cuStreamQuery`), then a full context synchronize;
//! 6. `cuEventElapsedTime` between the two events, and, with the tracer, the window closed
//!    (records flushed) and the work's kernel records picked out of it
//!    ([`crate::cupti::attribute`]): the sum of their durations and their span. The flush
//!    and the blocking kernel are never part of either: the flush ends before the window
//!    opens, and the blocker's record is told apart by its correlation ID.
//!
//! **Plain mode** ([`Gpu::time_plain`]) is the KernelBench `cuda_event` way — events around
//! one run of the launch list, no flush, no blocker, then synchronize — kept for comparisons.
//!
//! **Faults.** Any error while waiting is a sticky fault: the context is poisoned and the
//! caller must replace the worker. An infinite loop never finishes:
//! [`Gpu::sync_with_deadline`] returns [`GpuError::Timeout`] (and poisons the context) so
//! the worker can report `timeout` itself before the daemon's watchdog kills it.

use std::time::{Duration, Instant};

use cudarc::driver::result as dr;
use cudarc::driver::sys::{self, CUresult};
use serde::{Deserialize, Serialize};

use crate::cupti::tracer::{self, Phase};
use crate::cupti::{KernelTimes, attribute};
use crate::device::{Gpu, Module};
use crate::error::GpuError;
use crate::launch::CheckedLaunches;

/// How one timed sample is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleConfig {
    /// Flush L2 before the sample.
    pub flush_l2: bool,
    /// Spin this many nanoseconds in the blocking kernel before the start event
    /// (`None`: no blocking kernel).
    pub blocker_ns: Option<u64>,
    /// Give up (and poison the context) after this long.
    pub timeout: Duration,
}

impl SampleConfig {
    /// The contract's configuration: L2 flush, blocking kernel sized for the launch list by
    /// [`default_blocker_ns`], and `timeout`.
    pub fn contract(plan: &CheckedLaunches, timeout: Duration) -> SampleConfig {
        SampleConfig {
            flush_l2: true,
            blocker_ns: Some(default_blocker_ns(plan.launches.len())),
            timeout,
        }
    }
}

/// Bytes of the L2 flush buffer for a GPU with `l2_bytes` of L2: twice the L2, at least
/// 16 MiB. Every L2 flush kiln takes (its own, and the torch runner's) is this size.
pub fn l2_flush_bytes(l2_bytes: u64) -> u64 {
    l2_bytes.saturating_mul(2).max(16 << 20)
}

/// Spin long enough for the host to queue the start event, `launches` launches and the end
/// event behind the blocking kernel: 30 µs plus 6 µs per launch (a launch costs the host
/// about 4 µs on an H200, see the timing probe), capped at 1 ms.
pub fn default_blocker_ns(launches: usize) -> u64 {
    (30_000 + 6_000 * launches as u64).min(1_000_000)
}

/// What one timed sample measured.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleTimes {
    /// Between the start and end events, ms.
    pub event_ms: f64,
    /// The work's kernel records: `None` when the tracer does not run, `Some(Err(why))`
    /// when this sample's records could not be attributed (the sample then has only its
    /// event time).
    pub kernels: Option<Result<KernelTimes, String>>,
}

/// Closes a sample's window on every path that does not read it (an error, a fault).
struct WindowGuard(bool);

impl Drop for WindowGuard {
    fn drop(&mut self) {
        if self.0 {
            tracer::abandon_window();
        }
    }
}

/// Summary statistics of a series of sample times (milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SampleStats {
    /// Samples.
    pub n: usize,
    /// Median.
    pub median: f64,
    /// Mean.
    pub mean: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// Sample standard deviation (n − 1).
    pub std: f64,
    /// Coefficient of variation, `std / mean`.
    pub cv: f64,
}

/// Statistics of `samples` (`None` if empty or any sample is not finite).
pub fn stats(samples: &[f64]) -> Option<SampleStats> {
    if samples.is_empty() || samples.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    let mean = v.iter().sum::<f64>() / n as f64;
    let std = if n > 1 {
        (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    } else {
        0.0
    };
    Some(SampleStats {
        n,
        median,
        mean,
        min: v[0],
        max: v[n - 1],
        std,
        cv: if mean > 0.0 { std / mean } else { 0.0 },
    })
}

impl Gpu {
    /// Waits until everything queued on the stream has finished, or `timeout` has passed.
    ///
    /// Polls `cuStreamQuery` (spinning briefly, then sleeping with a growing interval up to
    /// 1 ms, so a long kernel does not burn a core); on success, synchronises the whole
    /// context. On timeout the context is poisoned — the kernel is still running — and
    /// [`GpuError::Timeout`] is returned; any driver error is a [`GpuError::Fault`].
    pub fn sync_with_deadline(&self, timeout: Duration) -> Result<(), GpuError> {
        self.shared.enter()?;
        let start = Instant::now();
        let mut nap = Duration::from_micros(10);
        loop {
            // SAFETY: the stream is live and belongs to the current context.
            match unsafe { sys::cuStreamQuery(self.shared.stream) } {
                CUresult::CUDA_SUCCESS => break,
                CUresult::CUDA_ERROR_NOT_READY => {}
                other => {
                    return Err(self
                        .shared
                        .fail("cuStreamQuery", dr::DriverError(other), true));
                }
            }
            let waited = start.elapsed();
            if waited >= timeout {
                self.shared.set_poison("timeout".to_string());
                return Err(GpuError::Timeout(waited));
            }
            if waited < Duration::from_micros(200) {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(nap.min(timeout.saturating_sub(waited)));
                nap = (nap * 2).min(Duration::from_millis(1));
            }
        }
        dr::ctx::synchronize().map_err(|e| self.shared.fail("cuCtxSynchronize", e, true))
    }

    /// Runs the launch list once, untimed, and waits for it (correctness trials, warm-up).
    pub fn run_launches(
        &self,
        module: &Module,
        plan: &CheckedLaunches,
        timeout: Duration,
    ) -> Result<(), GpuError> {
        self.enqueue_launches(module, plan)?;
        self.sync_with_deadline(timeout)
    }

    /// One timed sample of the launch list (see the module docs).
    pub fn time_sample(
        &self,
        module: &Module,
        plan: &CheckedLaunches,
        cfg: &SampleConfig,
    ) -> Result<SampleTimes, GpuError> {
        self.sample(cfg, Some(plan.launches.len()), &mut || {
            self.enqueue_launches(module, plan)
        })
    }

    /// One timed sample of the work `enqueue` puts on the Gpu's stream (library calls), under
    /// the same protocol as [`Gpu::time_sample`]. `launches` is the work's launch count when
    /// known; when not (a library call), its kernel records are whatever follows kiln's own
    /// in the window.
    pub fn time_sample_with(
        &self,
        cfg: &SampleConfig,
        launches: Option<usize>,
        enqueue: &mut dyn FnMut() -> Result<(), GpuError>,
    ) -> Result<SampleTimes, GpuError> {
        self.sample(cfg, launches, enqueue)
    }

    fn sample(
        &self,
        cfg: &SampleConfig,
        launches: Option<usize>,
        enqueue: &mut dyn FnMut() -> Result<(), GpuError>,
    ) -> Result<SampleTimes, GpuError> {
        self.shared.enter()?;
        let mut window_error = None;
        let mut guard = WindowGuard(false);
        // The flush comes first, outside the tracer's window (its read pass is a kernel).
        if cfg.flush_l2 {
            self.l2_flush()?;
        }
        if tracer::active() {
            // Earlier work must be finished, so that no record of it lands in the window.
            self.shared.sync_stream()?;
            match tracer::open_window() {
                Ok(()) => guard.0 = true,
                Err(e) => window_error = Some(e),
            }
        }
        if let Some(ns) = cfg.blocker_ns {
            tracer::phase(Phase::Kiln);
            self.spin(ns)?;
        }
        self.record(self.ev_start)?;
        tracer::phase(Phase::Work);
        enqueue()?;
        tracer::phase(Phase::Idle);
        self.record(self.ev_end)?;
        self.sync_with_deadline(cfg.timeout)?;
        // SAFETY: both events were created in this context with timing enabled, were
        // recorded on our stream above, and have completed (the stream is idle).
        let ms = unsafe { dr::event::elapsed(self.ev_start, self.ev_end) }
            .map_err(|e| self.shared.fail("cuEventElapsedTime", e, true))?;
        let kiln_first = usize::from(cfg.blocker_ns.is_some());
        let kernels = if guard.0 {
            guard.0 = false;
            Some(tracer::close_window(kiln_first, launches).and_then(|c| {
                attribute(&c.window(kiln_first, launches)).map_err(|e| e.to_string())
            }))
        } else {
            window_error.map(Err)
        };
        if let Some(Err(why)) = &kernels {
            tracing::warn!(%why, "no kernel time for this sample; it has its event time only");
        }
        Ok(SampleTimes {
            event_ms: f64::from(ms),
            kernels,
        })
    }

    /// One KernelBench-style sample: events around the launch list, no flush, no blocker.
    pub fn time_plain(
        &self,
        module: &Module,
        plan: &CheckedLaunches,
        timeout: Duration,
    ) -> Result<f64, GpuError> {
        self.shared.enter()?;
        self.record(self.ev_start)?;
        self.enqueue_launches(module, plan)?;
        self.record(self.ev_end)?;
        self.sync_with_deadline(timeout)?;
        // SAFETY: as in `sample`.
        let ms = unsafe { dr::event::elapsed(self.ev_start, self.ev_end) }
            .map_err(|e| self.shared.fail("cuEventElapsedTime", e, true))?;
        Ok(f64::from(ms))
    }

    fn record(&self, ev: sys::CUevent) -> Result<(), GpuError> {
        // SAFETY: `ev` is one of the Gpu's live events; the stream is ours, same context.
        unsafe { dr::event::record(ev, self.shared.stream) }
            .map_err(|e| self.shared.fail("cuEventRecord", e, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_a_series() {
        let s = stats(&[1.0, 2.0, 3.0, 4.0]).expect("stats");
        assert_eq!(s.n, 4);
        assert_eq!(s.median, 2.5);
        assert_eq!(s.mean, 2.5);
        assert_eq!((s.min, s.max), (1.0, 4.0));
        assert!((s.std - 1.2909944487358056).abs() < 1e-12);
        assert!((s.cv - s.std / 2.5).abs() < 1e-15);
        assert!(stats(&[]).is_none());
        assert!(stats(&[1.0, f64::NAN]).is_none());
        assert_eq!(stats(&[0.25]).map(|s| (s.median, s.std)), Some((0.25, 0.0)));
    }

    #[test]
    fn blocker_grows_with_the_plan_and_is_capped() {
        assert_eq!(default_blocker_ns(1), 36_000);
        assert_eq!(default_blocker_ns(64), 414_000);
        assert_eq!(default_blocker_ns(10_000), 1_000_000);
    }
}
