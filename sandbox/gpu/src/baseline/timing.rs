//! What library calls need of the Gpu: its stream, a bound context, and an untimed run of a
//! closure's work. Their timed samples are [`Gpu::time_sample_with`], under the same protocol
//! as a launch list's.

use std::time::Duration;

use cudarc::driver::sys;

use crate::device::Gpu;
use crate::error::GpuError;

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
}
