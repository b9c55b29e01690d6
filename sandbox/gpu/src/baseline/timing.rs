//! One timed sample of an arbitrary closure of work on the Gpu's stream (library calls),
//! under the same protocol as [`Gpu::time_sample`]: L2 flush, blocking kernel, start event,
//! the work, end event, wait with a deadline, context synchronize, elapsed time.

use std::time::Duration;

use cudarc::driver::result as dr;
use cudarc::driver::sys;

use crate::device::Gpu;
use crate::error::GpuError;
use crate::timing::SampleConfig;

impl Gpu {
    /// The Gpu's stream, for libraries that take a `cudaStream_t` (trusted callers only).
    pub(crate) fn raw_stream(&self) -> sys::CUstream {
        self.shared.stream
    }

    /// Makes the context current on this thread (library calls need it) and refuses a
    /// poisoned context.
    pub fn bind(&self) -> Result<(), GpuError> {
        self.shared.enter()
    }

    /// Runs `enqueue` once, untimed, and waits for its work (warm-up, correctness).
    pub fn run_with(
        &self,
        timeout: Duration,
        enqueue: &mut dyn FnMut() -> Result<(), GpuError>,
    ) -> Result<(), GpuError> {
        self.shared.enter()?;
        enqueue()?;
        self.sync_with_deadline(timeout)
    }

    /// One timed sample of the work `enqueue` puts on the Gpu's stream; GPU milliseconds.
    pub fn time_sample_with(
        &self,
        cfg: &SampleConfig,
        enqueue: &mut dyn FnMut() -> Result<(), GpuError>,
    ) -> Result<f64, GpuError> {
        self.shared.enter()?;
        if cfg.flush_l2 {
            self.l2_flush()?;
        }
        if let Some(ns) = cfg.blocker_ns {
            self.spin(ns)?;
        }
        self.record_on_stream(self.ev_start)?;
        enqueue()?;
        self.record_on_stream(self.ev_end)?;
        self.sync_with_deadline(cfg.timeout)?;
        // SAFETY: both events were created in this context with timing enabled, were
        // recorded on our stream above, and have completed (the stream is idle).
        let ms = unsafe { dr::event::elapsed(self.ev_start, self.ev_end) }
            .map_err(|e| self.shared.fail("cuEventElapsedTime", e, true))?;
        Ok(f64::from(ms))
    }

    fn record_on_stream(&self, ev: sys::CUevent) -> Result<(), GpuError> {
        // SAFETY: `ev` is one of the Gpu's live events; the stream is ours, same context.
        unsafe { dr::event::record(ev, self.shared.stream) }
            .map_err(|e| self.shared.fail("cuEventRecord", e, false))
    }
}
