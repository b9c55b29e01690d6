//! Errors of the GPU mechanics, and how a CUDA driver error is classified.
//!
//! The one distinction the worker must never get wrong: a *sticky* error (illegal address,
//! misaligned access, `__trap()`, a launch failure, a hardware exception) leaves the CUDA
//! context unusable for the rest of the process — "any further CUDA work will return the
//! same error; the process must be terminated and relaunched" (CUDA error docs). Such an
//! error becomes [`GpuError::Fault`], the [`crate::Gpu`] is marked poisoned, and every later
//! call returns [`GpuError::Poisoned`] without touching the driver. The caller replaces the
//! worker process.

use std::time::Duration;

use cudarc::driver::result::DriverError;
use cudarc::driver::sys::CUresult;
use thiserror::Error;

use crate::launch::InvalidLaunch;
use crate::nvrtc::CompileError;

/// Why the cuda backend cannot be used on this machine.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{reason}")]
pub struct Unavailable {
    /// A sentence a person can act on ("libcuda.so not found: ...", "no CUDA device").
    pub reason: String,
}

impl Unavailable {
    pub(crate) fn new(reason: impl Into<String>) -> Self {
        Unavailable {
            reason: reason.into(),
        }
    }
}

/// A sticky fault raised by code running on the GPU (or the driver failing under it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// The CUDA error name, e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`.
    pub name: String,
    /// The numeric `CUresult`.
    pub code: u32,
    /// The driver call that reported it (`cuStreamQuery`, `cuLaunchKernel`, ...).
    pub during: &'static str,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (reported by {})", self.name, self.during)
    }
}

/// Everything that can go wrong in this crate.
#[derive(Debug, Error)]
pub enum GpuError {
    /// CUDA cannot be used here at all.
    #[error("cuda unavailable: {0}")]
    Unavailable(#[from] Unavailable),
    /// A non-sticky driver error (bad argument, out of memory, ...); the context is intact.
    #[error("{call} failed: {name}")]
    Driver {
        /// The driver call.
        call: &'static str,
        /// The CUDA error name.
        name: String,
    },
    /// A sticky fault: the context is poisoned and the worker must be replaced.
    #[error("gpu fault {0}; the context is poisoned and the worker must be replaced")]
    Fault(Fault),
    /// The work did not finish before the deadline; the kernel may still be running, so the
    /// context is poisoned and the worker must be replaced.
    #[error("timed out after {0:?} with work still running; the worker must be replaced")]
    Timeout(Duration),
    /// An earlier fault or timeout poisoned this context; nothing was sent to the driver.
    #[error("the context is poisoned by an earlier {0}; the worker must be replaced")]
    Poisoned(String),
    /// The launch list cannot run; nothing was launched.
    #[error("invalid launch: {0}")]
    InvalidLaunch(#[from] InvalidLaunch),
    /// Compiling (trusted or candidate code) failed.
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// The caller asked for something inconsistent (sizes, offsets); nothing was sent to the
    /// driver.
    #[error("{0}")]
    Usage(String),
}

impl GpuError {
    /// True if and only if this error means the process's CUDA context is unusable.
    pub fn is_poisoning(&self) -> bool {
        matches!(
            self,
            GpuError::Fault(_) | GpuError::Timeout(_) | GpuError::Poisoned(_)
        )
    }

    /// The fault name for verdict evidence (`CUDA_ERROR_ILLEGAL_ADDRESS`, `timeout`), if this
    /// error is a fault or timeout.
    pub fn fault_name(&self) -> Option<String> {
        match self {
            GpuError::Fault(f) => Some(f.name.clone()),
            GpuError::Timeout(_) => Some("timeout".to_string()),
            GpuError::Poisoned(p) => Some(p.clone()),
            _ => None,
        }
    }
}

/// The `CUresult`'s name, e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`, without calling into the driver.
pub fn error_name(err: DriverError) -> String {
    format!("{:?}", err.0)
}

/// True if and only if `code` leaves the context unusable (CUDA error docs: "the process
/// must be terminated and relaunched").
///
/// Listed: ILLEGAL_ADDRESS (700), LAUNCH_TIMEOUT (702), ASSERT (710), HARDWARE_STACK_ERROR
/// (714), ILLEGAL_INSTRUCTION (715), MISALIGNED_ADDRESS (716), INVALID_ADDRESS_SPACE (717),
/// INVALID_PC (718), LAUNCH_FAILED (719), ECC_UNCORRECTABLE (214), plus the context-level
/// errors CONTEXT_IS_DESTROYED (709) and UNKNOWN (999), which we treat as fatal too.
pub fn is_sticky(code: CUresult) -> bool {
    use CUresult::*;
    matches!(
        code,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_TIMEOUT
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_ECC_UNCORRECTABLE
            | CUDA_ERROR_CONTEXT_IS_DESTROYED
            | CUDA_ERROR_UNKNOWN
    )
}

/// Builds the error for a driver call that failed: a [`Fault`] when the code is sticky (or
/// when `after_work` says the call reports on submitted work, where any error means the
/// context's state is unknown), a plain [`GpuError::Driver`] otherwise.
pub(crate) fn classify(call: &'static str, err: DriverError, after_work: bool) -> GpuError {
    if after_work || is_sticky(err.0) {
        GpuError::Fault(Fault {
            name: error_name(err),
            code: err.0 as u32,
            during: call,
        })
    } else {
        GpuError::Driver {
            call,
            name: error_name(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sticky_codes_become_faults_and_others_do_not() {
        let e = classify(
            "cuLaunchKernel",
            DriverError(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS),
            false,
        );
        assert!(e.is_poisoning());
        assert_eq!(
            e.fault_name().as_deref(),
            Some("CUDA_ERROR_ILLEGAL_ADDRESS")
        );
        let e = classify(
            "cuMemAlloc",
            DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY),
            false,
        );
        assert!(!e.is_poisoning(), "{e}");
        assert!(e.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY"), "{e}");
        // Any error reported while waiting on submitted work is treated as a fault.
        let e = classify(
            "cuStreamQuery",
            DriverError(CUresult::CUDA_ERROR_INVALID_VALUE),
            true,
        );
        assert!(e.is_poisoning());
    }
}
