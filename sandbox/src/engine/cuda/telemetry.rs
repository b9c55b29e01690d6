//! NVML telemetry around the timing window, as stored with the evaluation.
//!
//! A sample is flagged as throttled when an NVML reading within one sampling interval of
//! its wall window carried a throttling clocks-event reason
//! (`kiln_gpu::telemetry::THROTTLE_MASK`: SW/HW slowdown, thermal, power brake). The
//! count of flagged samples, the SM and memory clocks (min/median/max), the reasons seen,
//! power and temperature go into `Evaluation.telemetry.gpu` next to the time, never
//! hidden; the plan's throttle policy (`report`, `discard`, `retry`: see
//! `contract::timing`) decides whether flagged samples count. The worker never changes
//! clocks (kilnd's clock policy does, around the whole evaluation).
//!
//! The readings themselves go in as `series` (at most [`SERIES_POINTS`], evenly spaced
//! through the window: time, SM clock, power, temperature, throttled), so the candidate's
//! report can draw the clocks and power over the timing window.
//!
//! NVML missing or refusing inside the jail is not an error: the telemetry then says why
//! it is absent.

use std::sync::Arc;
use std::time::Instant;

use kiln_gpu::telemetry::{
    self as tel, DEFAULT_INTERVAL, NvmlSource, Sampler, THROTTLE_MASK, TelemetrySample,
};
use serde_json::{Value, json};

/// NVML for one GPU, sampled around timing windows.
pub struct Telemetry {
    nvml: Result<Arc<nvml_wrapper::Nvml>, String>,
    uuid: String,
    running: Option<(Sampler, Instant)>,
    error: Option<String>,
    flagged: Vec<usize>,
}

impl Telemetry {
    /// NVML for the GPU with this UUID (initialised once; failures are remembered).
    pub fn new(uuid: &str) -> Telemetry {
        Telemetry {
            nvml: tel::init_nvml().map_err(|e| e.to_string()),
            uuid: uuid.to_string(),
            running: None,
            error: None,
            flagged: Vec::new(),
        }
    }

    /// Starts sampling (no-op without NVML).
    pub fn start(&mut self) {
        let nvml = match &self.nvml {
            Ok(n) => Arc::clone(n),
            Err(e) => {
                self.error = Some(e.clone());
                return;
            }
        };
        match NvmlSource::for_uuid(nvml, &self.uuid) {
            Ok(src) => {
                let t0 = Instant::now();
                self.running = Some((Sampler::start(src, DEFAULT_INTERVAL), t0));
            }
            Err(e) => self.error = Some(e.to_string()),
        }
    }

    /// Stops sampling; the telemetry JSON for the window of `windows` (one per sample).
    pub fn finish(&mut self, windows: &[(Instant, Instant)]) -> Value {
        self.flagged.clear();
        let Some((sampler, t0)) = self.running.take() else {
            return json!({
                "available": false,
                "reason": self.error.clone().unwrap_or_else(|| "telemetry was not started".into()),
            });
        };
        let window = sampler.stop();
        self.flagged = throttled_indices(&window.samples, windows, t0);
        let flagged = self.flagged.len();
        json!({
            "available": true,
            "interval_ms": DEFAULT_INTERVAL.as_secs_f64() * 1e3,
            "summary": window.summary,
            "series": series(&window.samples, SERIES_POINTS),
            "timing_samples": windows.len(),
            "throttled_timing_samples": flagged,
        })
    }

    /// Indices of the samples of the last finished window that ran throttled.
    pub fn flagged(&self) -> &[usize] {
        &self.flagged
    }
}

/// Most readings kept in the telemetry's `series`.
pub const SERIES_POINTS: usize = 128;

/// The readings as columns (`t_ms`, `sm_mhz`, `power_w`, `temp_c`, `throttled`; `null`
/// where NVML did not answer), at most `max_points` of them, evenly spaced (first and last
/// included).
pub fn series(readings: &[TelemetrySample], max_points: usize) -> Value {
    let n = readings.len();
    let picked: Vec<&TelemetrySample> = if n <= max_points || max_points < 2 {
        readings.iter().take(max_points).collect()
    } else {
        (0..max_points)
            .map(|i| &readings[i * (n - 1) / (max_points - 1)])
            .collect()
    };
    let col = |f: &dyn Fn(&TelemetrySample) -> Value| -> Vec<Value> {
        picked.iter().map(|r| f(r)).collect()
    };
    json!({
        "t_ms": col(&|r| json!((r.t_ms * 10.0).round() / 10.0)),
        "sm_mhz": col(&|r| json!(r.sm_mhz)),
        "power_w": col(&|r| json!(r.power_mw.map(|p| f64::from(p) / 1000.0))),
        "temp_c": col(&|r| json!(r.temp_c)),
        "throttled": col(&|r| json!(r.reasons.map(|b| b & THROTTLE_MASK != 0))),
    })
}

/// Which sample windows overlap (within one interval) a throttled NVML reading.
pub fn throttled_indices(
    readings: &[TelemetrySample],
    windows: &[(Instant, Instant)],
    t0: Instant,
) -> Vec<usize> {
    let slack = DEFAULT_INTERVAL.as_secs_f64() * 1e3;
    let throttled: Vec<f64> = readings
        .iter()
        .filter(|r| r.reasons.is_some_and(|b| b & THROTTLE_MASK != 0))
        .map(|r| r.t_ms)
        .collect();
    if throttled.is_empty() {
        return Vec::new();
    }
    let ms = |t: Instant| t.saturating_duration_since(t0).as_secs_f64() * 1e3;
    windows
        .iter()
        .enumerate()
        .filter(|(_, (a, b))| {
            let (a, b) = (ms(*a) - slack, ms(*b) + slack);
            throttled.iter().any(|&t| t >= a && t <= b)
        })
        .map(|(i, _)| i)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn throttled_windows_are_counted() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let reading = |t_ms: f64, reasons: u64| TelemetrySample {
            t_ms,
            reasons: Some(reasons),
            ..TelemetrySample::default()
        };
        let readings = [reading(0.0, 0), reading(100.0, 0x20), reading(200.0, 0x1)];
        let windows = [(at(0), at(1)), (at(98), at(99)), (at(199), at(201))];
        assert_eq!(throttled_indices(&readings, &windows, t0), vec![1]);
    }

    #[test]
    fn series_keeps_columns_evenly_spaced() {
        let readings: Vec<TelemetrySample> = (0..300)
            .map(|i| TelemetrySample {
                t_ms: f64::from(i) * 5.0,
                sm_mhz: Some(1980 - i),
                power_mw: (i % 2 == 0).then_some(150_000),
                reasons: Some(if i == 299 { 0x20 } else { 0 }),
                ..TelemetrySample::default()
            })
            .collect();
        let s = series(&readings, 128);
        let t = s["t_ms"].as_array().expect("t_ms");
        assert_eq!(t.len(), 128);
        assert_eq!((t[0].as_f64(), t[127].as_f64()), (Some(0.0), Some(1495.0)));
        assert_eq!(s["sm_mhz"][0], 1980);
        assert_eq!(s["power_w"][0], 150.0);
        assert!(s["temp_c"][0].is_null(), "not read: null");
        assert_eq!(s["throttled"][127], true);
        assert_eq!(s["throttled"][0], false);
        let short = series(&readings[..3], 128);
        assert_eq!(short["t_ms"].as_array().map(Vec::len), Some(3));
        assert_eq!(series(&[], 128)["t_ms"].as_array().map(Vec::len), Some(0));
    }
}
