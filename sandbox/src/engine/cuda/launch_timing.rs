//! `kiln-worker launch --time`: a problem's own kernel timed by kiln's own samples, outside
//! kilnd and outside any profiler.
//!
//! Each run is one timed sample taken exactly as the contract takes them
//! ([`kiln_gpu::Gpu::time_sample`] with [`SampleConfig::contract`]: L2 flush, blocking
//! kernel, events, and CUPTI's kernel records when the tracer runs). `kiln bench agreement`
//! uses it to time an empty kernel, the floor that every timer reads for a kernel that does
//! nothing, so that the floors of kiln's timer and of an external profiler can be told
//! apart from the kernels' own time (docs/benchmarks.md, "The timer floor").

use kiln_gpu::cupti::TimerStatus;
use kiln_gpu::timing::SampleTimes;
use serde::{Deserialize, Serialize};

use crate::engine::contract::timing::median;

/// The empty kernel of the timer floor.
pub const FLOOR_KERNEL: &str = "kiln_timer_floor";

/// The timer floor's problem, in the JSON form kilnd serves (sources inlined) and
/// `kiln-worker launch --spec` reads: the empty kernel (`kiln_timer_floor<<<1, 1>>>`, no
/// parameters, no memory touched) as seed and reference, and a one-element output that
/// nothing writes (a problem needs an output). Only `launch` runs it; it is never
/// registered with kilnd, where it would fail the unwritten-output check.
pub fn floor_spec() -> serde_json::Value {
    let source = format!(
        "/* kiln's timer floor: a kernel with no work of its own. */\n\
         extern \"C\" __global__ void {FLOOR_KERNEL}() {{}}\n"
    );
    let kernel = serde_json::json!({
        "file": "floor.cu",
        "source": source,
        "launches": [{ "kernel": FLOOR_KERNEL, "grid": [1, 1, 1], "block": [1, 1, 1], "args": [] }],
    });
    serde_json::json!({
        "name": "kiln-timer-floor",
        "summary": "an empty kernel: what a timer reads for no work (kiln bench agreement)",
        "tensor": [{ "name": "y", "dtype": "f32", "shape": [1], "role": "output" }],
        "tolerance": { "atol": 0.0, "rtol": 0.0 },
        "reference": { "cuda": kernel.clone() },
        "seed": { "cuda": kernel },
    })
}

/// What the timed runs measured (medians over the samples), in the `timing` field of the
/// JSON line `kiln-worker launch --time` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaunchTiming {
    /// `cupti` when kernel records were read, else `events`.
    pub source: String,
    /// Why not CUPTI, when the source is `events`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// Timed samples.
    pub samples: usize,
    /// Median time between the start and end events, µs.
    pub events_us: f64,
    /// Median sum of the work's kernel durations, µs (CUPTI only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_sum_us: Option<f64>,
    /// Median span from the first kernel's start to the last one's end, µs (CUPTI only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_span_us: Option<f64>,
    /// Samples whose kernel records could not all be found (they count by events only).
    pub records_missing: usize,
}

impl LaunchTiming {
    /// The median of `figure` (`kernel_span`, `kernel_sum`, `events`), if measured.
    pub fn figure_us(&self, figure: &str) -> Option<f64> {
        match figure {
            "kernel_span" => self.kernel_span_us,
            "kernel_sum" => self.kernel_sum_us,
            "events" => Some(self.events_us),
            _ => None,
        }
    }
}

/// Summarizes timed samples under the tracer's `status`.
pub fn summarize(samples: &[SampleTimes], status: &TimerStatus) -> LaunchTiming {
    let mut events: Vec<f64> = samples.iter().map(|s| s.event_ms * 1e3).collect();
    let kernels: Vec<_> = samples
        .iter()
        .filter_map(|s| s.kernels.as_ref()?.as_ref().ok())
        .collect();
    let records_missing = samples
        .iter()
        .filter(|s| matches!(s.kernels, Some(Err(_))))
        .count();
    let of = |f: &dyn Fn(&kiln_gpu::cupti::KernelTimes) -> f64| {
        let mut v: Vec<f64> = kernels.iter().map(|k| f(k)).collect();
        (!v.is_empty()).then(|| median(&mut v))
    };
    let kernel_sum_us = of(&|k| k.sum_us());
    let kernel_span_us = of(&|k| k.span_ns as f64 / 1e3);
    let fallback = match status {
        TimerStatus::Cupti { .. } if kernels.is_empty() && !samples.is_empty() => {
            Some("CUPTI ran, but no sample's kernel records were found".to_string())
        }
        TimerStatus::Cupti { .. } => None,
        TimerStatus::Events { reason } => Some(reason.clone()),
    };
    LaunchTiming {
        source: if kernels.is_empty() {
            "events"
        } else {
            "cupti"
        }
        .to_string(),
        fallback,
        samples: samples.len(),
        events_us: median(&mut events),
        kernel_sum_us,
        kernel_span_us,
        records_missing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_gpu::cupti::{KernelTimes, Method};

    fn sample(event_us: f64, kernels: Option<Result<(u64, u64), &str>>) -> SampleTimes {
        SampleTimes {
            event_ms: event_us / 1e3,
            kernels: kernels.map(|k| {
                k.map(|(sum_ns, span_ns)| KernelTimes {
                    sum_ns,
                    span_ns,
                    kernels: 2,
                    method: Method::Correlation,
                })
                .map_err(str::to_string)
            }),
        }
    }

    #[test]
    fn the_floor_spec_is_a_valid_problem_whose_seed_is_the_empty_kernel() {
        let spec: kiln_types::ProblemSpec =
            serde_json::from_value(floor_spec()).expect("a problem spec");
        spec.validate().expect("valid");
        let seed = spec.seed_candidate("cuda").expect("a cuda seed");
        assert_eq!(seed.launches.len(), 1);
        assert_eq!(seed.launches[0].kernel, FLOOR_KERNEL);
        assert!(seed.launches[0].args.is_empty());
        assert!(seed.source.contains(&format!("void {FLOOR_KERNEL}() {{}}")));
    }

    #[test]
    fn medians_of_each_figure_and_missing_records_are_counted() {
        let cupti = TimerStatus::Cupti {
            library: "libcupti.so.13".into(),
            version: 130001,
        };
        let samples = [
            sample(3.0, Some(Ok((600, 700)))),
            sample(3.2, Some(Ok((640, 900)))),
            sample(2.8, Some(Err("a record was missing"))),
            sample(3.1, Some(Ok((620, 800)))),
        ];
        let t = summarize(&samples, &cupti);
        assert_eq!(t.source, "cupti");
        assert_eq!(t.fallback, None);
        assert_eq!((t.samples, t.records_missing), (4, 1));
        assert!((t.events_us - 3.05).abs() < 1e-9, "{}", t.events_us);
        assert_eq!(t.kernel_sum_us, Some(0.62));
        assert_eq!(t.kernel_span_us, Some(0.8));
        assert_eq!(t.figure_us("kernel_span"), Some(0.8));
        assert_eq!(t.figure_us("kernel_sum"), Some(0.62));
        assert!((t.figure_us("events").expect("events") - 3.05).abs() < 1e-9);
        assert_eq!(t.figure_us("ncu"), None);
    }

    #[test]
    fn without_kernel_records_the_figures_are_events_and_say_why() {
        let off = TimerStatus::Events {
            reason: "turned off by configuration".into(),
        };
        let t = summarize(&[sample(8.0, None), sample(8.4, None)], &off);
        assert_eq!(t.source, "events");
        assert_eq!(t.fallback.as_deref(), Some("turned off by configuration"));
        assert_eq!((t.kernel_sum_us, t.kernel_span_us), (None, None));
        assert_eq!(t.figure_us("kernel_span"), None);
        assert!((t.events_us - 8.2).abs() < 1e-9);
        let cupti = TimerStatus::Cupti {
            library: "libcupti.so.13".into(),
            version: 130001,
        };
        let t = summarize(&[sample(8.0, Some(Err("none")))], &cupti);
        assert_eq!((t.source.as_str(), t.records_missing), ("events", 1));
        assert!(t.fallback.expect("a reason").contains("no sample"));
    }
}
