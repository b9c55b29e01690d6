//! Kernel durations as the GPU ran them, from CUPTI's activity records.
//!
//! CUDA events around a launch list also time the GPU's work of reaching the first kernel
//! and of recording the end event: for a kernel of a few microseconds that is a third or
//! more of what events read (vecadd-cuda-1m: 8.1 µs by events, 6.05 µs by Nsight Compute's
//! `gpu__time_duration`). CUPTI's kernel records carry each kernel's start and end on the
//! GPU; summed over a candidate's launches they give its kernel time.
//!
//! - [`start`] sets CUPTI up once per process, before the CUDA context is created, and
//!   says why not when it cannot ([`TimerStatus::Events`]: library missing, a profiler
//!   already attached, turned off); timing then falls back to events;
//! - [`attribute`]: which records of a sample are the work's (correlation IDs, else stream
//!   order), summed and spanned — pure, tested without CUPTI;
//! - [`tracer`]: the FFI — library loading, callbacks, one sample's window of records.
//!
//! [`crate::Gpu::time_sample`] opens a window around each timed sample when the tracer
//! runs and reports the kernel times beside the event time ([`crate::timing::SampleTimes`]).

pub mod attribute;
pub mod tracer;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use attribute::{AttributionError, KernelRecord, KernelTimes, Method, Window, attribute};
pub use tracer::{DEFAULT_DIRS, active, find_library, start, status};

/// The environment variable that carries the setting into a GPU worker.
pub const SETTING_ENV: &str = "KILN_CUPTI";

/// Where CUPTI comes from (`[gpu] cupti` in kilnd's configuration).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CuptiSetting {
    /// The loader's search path, then [`DEFAULT_DIRS`].
    #[default]
    Auto,
    /// Never: time with events.
    Off,
    /// This directory, when the loader finds no libcupti itself.
    Dir(PathBuf),
}

impl CuptiSetting {
    /// `auto` (or empty), `off`, or an absolute directory.
    pub fn parse(s: &str) -> Result<CuptiSetting, String> {
        match s.trim() {
            "" | "auto" => Ok(CuptiSetting::Auto),
            "off" => Ok(CuptiSetting::Off),
            d if d.starts_with('/') => Ok(CuptiSetting::Dir(PathBuf::from(d))),
            other => Err(format!(
                "cupti = {other:?}: give \"auto\", \"off\" or an absolute directory"
            )),
        }
    }

    /// The setting in [`SETTING_ENV`] (`auto` when unset or unreadable).
    pub fn from_env() -> CuptiSetting {
        std::env::var(SETTING_ENV)
            .ok()
            .and_then(|v| CuptiSetting::parse(&v).ok())
            .unwrap_or_default()
    }

    /// The text form [`CuptiSetting::parse`] reads back.
    pub fn as_text(&self) -> String {
        match self {
            CuptiSetting::Auto => "auto".into(),
            CuptiSetting::Off => "off".into(),
            CuptiSetting::Dir(d) => d.display().to_string(),
        }
    }
}

/// Whether kernel times come from CUPTI in this process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum TimerStatus {
    /// CUPTI runs: kernel records are read for every timed sample.
    Cupti {
        /// The libcupti file in use.
        library: String,
        /// `cuptiGetVersion`.
        version: u32,
    },
    /// Events only.
    Events {
        /// Why not CUPTI, in words a person can act on.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_print_back() {
        for (text, want) in [
            ("", CuptiSetting::Auto),
            ("auto", CuptiSetting::Auto),
            (" off ", CuptiSetting::Off),
            ("/opt/cupti", CuptiSetting::Dir("/opt/cupti".into())),
        ] {
            let got = CuptiSetting::parse(text).expect(text);
            assert_eq!(got, want);
            assert_eq!(CuptiSetting::parse(&got.as_text()), Ok(got));
        }
        let e = CuptiSetting::parse("lib/cupti").expect_err("relative");
        assert!(e.contains("absolute"), "{e}");
    }

    #[test]
    fn turned_off_means_events_with_the_reason() {
        // The process-wide tracer is started once; in this test binary nothing else starts
        // it, and "off" never touches the library.
        let first = start(&CuptiSetting::Off);
        match first {
            TimerStatus::Events { reason } => assert!(reason.contains("off"), "{reason}"),
            other => panic!("expected events, got {other:?}"),
        }
        assert!(!active());
        assert_eq!(status(), Some(first));
        // Decided once per process: a later call returns the first outcome.
        assert_eq!(start(&CuptiSetting::Auto), first);
    }
}
