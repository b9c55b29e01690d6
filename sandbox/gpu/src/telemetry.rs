//! NVML telemetry around a timing window, and the clock policy.
//!
//! **Telemetry** is read-only: a [`Sampler`] thread reads SM clock, memory clock,
//! clocks-event (throttle) reasons, power and temperature every few milliseconds between
//! [`Sampler::start`] and [`Sampler::stop`], and [`summarize`] turns the samples into a
//! [`TelemetrySummary`] (JSON-able) that is stored with the evaluation. The source is a
//! trait ([`TelemetrySource`]) so the summary math is tested without a GPU; [`NvmlSource`]
//! is the real one. NVML finds the device by UUID, because NVML's indices need not match
//! CUDA's ordinals.
//!
//! **Clock control** is the only place that changes GPU state, and it sits behind the
//! [`ClockControl`] trait: [`NvmlClocks`] is the real implementation, [`FakeNvml`] a
//! recording fake. [`ClockPolicy::enter`] is the only caller: with `lock`, it first records
//! the intent through the caller's journal callback (the daemon persists it, so a daemon
//! that crashes while clocks are locked resets them on its next start with
//! [`recover_after_crash`]), then locks; the returned [`ClockWindow`] resets the clocks when
//! released or dropped (a panic included), then journals the release. No test and no
//! script in this repository calls the real lock; on the lent GPU, `lock` must never be
//! enabled.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, ClockLimitId, TemperatureSensor};
use nvml_wrapper::enums::device::GpuLockedClocksSetting;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Default sampling interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(5);

/// Clocks-event reasons that mean the GPU is being held below its boost clock by power or
/// heat (SW power cap 0x4, HW slowdown 0x8, SW thermal 0x20, HW thermal 0x40, HW power
/// brake 0x80). Idle (0x1), application/locked clocks (0x2), sync boost (0x10) and display
/// (0x100) are reported but do not count as throttling.
pub const THROTTLE_MASK: u64 = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;

const REASON_NAMES: &[(u64, &str)] = &[
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

/// The names of the clocks-event reason bits set in `bits` (unknown bits as `0x...`).
pub fn reason_names(bits: u64) -> Vec<String> {
    let mut names = Vec::new();
    let mut known = 0u64;
    for &(bit, name) in REASON_NAMES {
        known |= bit;
        if bits & bit != 0 {
            names.push(name.to_string());
        }
    }
    let unknown = bits & !known;
    if unknown != 0 {
        names.push(format!("{unknown:#x}"));
    }
    names
}

/// One telemetry reading; a field the device could not report is `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TelemetrySample {
    /// Milliseconds since the sampler started.
    pub t_ms: f64,
    /// SM clock, MHz.
    pub sm_mhz: Option<u32>,
    /// Memory clock, MHz.
    pub mem_mhz: Option<u32>,
    /// Clocks-event (throttle) reason bits.
    pub reasons: Option<u64>,
    /// Board power, milliwatts.
    pub power_mw: Option<u32>,
    /// GPU temperature, °C.
    pub temp_c: Option<u32>,
}

/// Something that can be read for telemetry.
pub trait TelemetrySource: Send + 'static {
    /// One reading (`t_ms` is filled in by the sampler).
    fn read(&mut self) -> TelemetrySample;
}

/// Minimum, median and maximum of a series.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MinMedMax {
    /// Smallest value.
    pub min: f64,
    /// Median (mean of the two middle values for an even count).
    pub median: f64,
    /// Largest value.
    pub max: f64,
}

impl MinMedMax {
    /// `None` for an empty series.
    pub fn of(values: &[f64]) -> Option<MinMedMax> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(MinMedMax {
            min: v[0],
            median,
            max: v[n - 1],
        })
    }
}

/// What the GPU did during a timing window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TelemetrySummary {
    /// Readings taken.
    pub samples: u32,
    /// Window length, milliseconds (first to last reading).
    pub window_ms: f64,
    /// SM clock, MHz.
    pub sm_mhz: Option<MinMedMax>,
    /// Memory clock, MHz.
    pub mem_mhz: Option<MinMedMax>,
    /// Every clocks-event reason seen at least once, by name.
    pub reasons_seen: Vec<String>,
    /// Readings with a throttling reason ([`THROTTLE_MASK`]) set.
    pub throttled_samples: u32,
    /// Mean board power, watts.
    pub power_w_avg: Option<f64>,
    /// Peak board power, watts.
    pub power_w_max: Option<f64>,
    /// Peak temperature, °C.
    pub temp_c_max: Option<u32>,
}

impl TelemetrySummary {
    /// True if and only if any reading showed a throttling reason.
    pub fn throttled(&self) -> bool {
        self.throttled_samples > 0
    }
}

/// Summarises readings (pure; unit-tested).
pub fn summarize(samples: &[TelemetrySample]) -> TelemetrySummary {
    let series = |f: fn(&TelemetrySample) -> Option<u32>| -> Vec<f64> {
        samples.iter().filter_map(f).map(f64::from).collect()
    };
    let power = series(|s| s.power_mw);
    let mut reasons = 0u64;
    let mut throttled = 0u32;
    for s in samples {
        if let Some(r) = s.reasons {
            reasons |= r;
            if r & THROTTLE_MASK != 0 {
                throttled += 1;
            }
        }
    }
    let window_ms = match (samples.first(), samples.last()) {
        (Some(a), Some(b)) => (b.t_ms - a.t_ms).max(0.0),
        _ => 0.0,
    };
    TelemetrySummary {
        samples: u32::try_from(samples.len()).unwrap_or(u32::MAX),
        window_ms,
        sm_mhz: MinMedMax::of(&series(|s| s.sm_mhz)),
        mem_mhz: MinMedMax::of(&series(|s| s.mem_mhz)),
        reasons_seen: reason_names(reasons),
        throttled_samples: throttled,
        power_w_avg: (!power.is_empty())
            .then(|| power.iter().sum::<f64>() / power.len() as f64 / 1000.0),
        power_w_max: power.iter().copied().reduce(f64::max).map(|p| p / 1000.0),
        temp_c_max: samples.iter().filter_map(|s| s.temp_c).max(),
    }
}

/// A background thread reading a [`TelemetrySource`] at a fixed interval.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Vec<TelemetrySample>>>,
}

/// The readings of one window and their summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TelemetryWindow {
    /// Every reading.
    pub samples: Vec<TelemetrySample>,
    /// Their summary.
    pub summary: TelemetrySummary,
}

impl Sampler {
    /// Starts reading `source` every `interval` (one reading at once).
    pub fn start<S: TelemetrySource>(mut source: S, interval: Duration) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("kiln-telemetry".into())
            .spawn(move || {
                let t0 = Instant::now();
                let mut out = Vec::new();
                loop {
                    let mut s = source.read();
                    s.t_ms = t0.elapsed().as_secs_f64() * 1e3;
                    out.push(s);
                    if flag.load(Ordering::Acquire) || out.len() >= 1_000_000 {
                        return out;
                    }
                    std::thread::sleep(interval);
                }
            })
            .ok();
        Sampler { stop, handle }
    }

    /// Stops the thread (after one last reading) and returns what it read.
    pub fn stop(mut self) -> TelemetryWindow {
        self.stop.store(true, Ordering::Release);
        let samples = self
            .handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        let summary = summarize(&samples);
        TelemetryWindow { samples, summary }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Telemetry errors.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TelemetryError {
    /// NVML could not be loaded or initialised.
    #[error("nvml unavailable: {0}")]
    Unavailable(String),
    /// No NVML device has this UUID.
    #[error("nvml has no device {uuid}: {error}")]
    NoDevice {
        /// The UUID looked up.
        uuid: String,
        /// NVML's error.
        error: String,
    },
}

/// Initialises NVML (`libnvidia-ml.so.1`); a clean error when it is missing.
pub fn init_nvml() -> Result<Arc<Nvml>, TelemetryError> {
    Nvml::init()
        .map(Arc::new)
        .map_err(|e| TelemetryError::Unavailable(e.to_string()))
}

/// Reads one device through NVML (read-only queries only).
pub struct NvmlSource {
    nvml: Arc<Nvml>,
    index: u32,
}

impl NvmlSource {
    /// The NVML device with this UUID (`GPU-...`, as in [`crate::DeviceFacts::uuid`]).
    pub fn for_uuid(nvml: Arc<Nvml>, uuid: &str) -> Result<NvmlSource, TelemetryError> {
        let index = nvml
            .device_by_uuid(uuid)
            .and_then(|d| d.index())
            .map_err(|e| TelemetryError::NoDevice {
                uuid: uuid.to_string(),
                error: e.to_string(),
            })?;
        Ok(NvmlSource { nvml, index })
    }
}

impl TelemetrySource for NvmlSource {
    fn read(&mut self) -> TelemetrySample {
        let Ok(dev) = self.nvml.device_by_index(self.index) else {
            return TelemetrySample::default();
        };
        TelemetrySample {
            t_ms: 0.0,
            sm_mhz: dev.clock_info(Clock::SM).ok(),
            mem_mhz: dev.clock_info(Clock::Memory).ok(),
            reasons: dev.current_throttle_reasons().ok().map(|r| r.bits()),
            power_mw: dev.power_usage().ok(),
            temp_c: dev.temperature(TemperatureSensor::Gpu).ok(),
        }
    }
}

/// Errors of clock control and of the clock policy.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ClockError {
    /// The journal could not record the intent, so nothing was changed.
    #[error("could not record the clock-lock intent, clocks left alone: {0}")]
    Journal(String),
    /// Locking failed (no permission, not supported, ...).
    #[error("locking clocks failed: {0}")]
    Lock(String),
    /// Resetting failed; the clocks may still be locked.
    #[error("resetting clocks failed: {0}")]
    Reset(String),
}

/// The operations that change a GPU's clocks. Implemented by [`NvmlClocks`] (real) and
/// [`FakeNvml`] (tests).
pub trait ClockControl {
    /// Locks the SM clock to `[min_mhz, max_mhz]`.
    fn lock_sm_clocks(&mut self, min_mhz: u32, max_mhz: u32) -> Result<(), ClockError>;
    /// Locks the SM clock to the base (TDP) clock.
    fn lock_sm_clocks_to_base(&mut self) -> Result<(), ClockError>;
    /// Returns the SM clock to its default behaviour.
    fn reset_sm_clocks(&mut self) -> Result<(), ClockError>;
}

/// Real clock control through NVML (`nvmlDeviceSetGpuLockedClocks`, root only). Never
/// exercised by this repository's tests or scripts.
pub struct NvmlClocks {
    nvml: Arc<Nvml>,
    uuid: String,
}

impl NvmlClocks {
    /// Clock control for the device with this UUID.
    pub fn new(nvml: Arc<Nvml>, uuid: &str) -> NvmlClocks {
        NvmlClocks {
            nvml,
            uuid: uuid.to_string(),
        }
    }

    fn with_device(
        &self,
        f: impl FnOnce(&mut nvml_wrapper::Device<'_>) -> Result<(), nvml_wrapper::error::NvmlError>,
    ) -> Result<(), String> {
        let mut dev = self
            .nvml
            .device_by_uuid(self.uuid.as_str())
            .map_err(|e| e.to_string())?;
        f(&mut dev).map_err(|e| e.to_string())
    }
}

impl ClockControl for NvmlClocks {
    fn lock_sm_clocks(&mut self, min_mhz: u32, max_mhz: u32) -> Result<(), ClockError> {
        self.with_device(|d| {
            d.set_gpu_locked_clocks(GpuLockedClocksSetting::Numeric {
                min_clock_mhz: min_mhz,
                max_clock_mhz: max_mhz,
            })
        })
        .map_err(ClockError::Lock)
    }

    fn lock_sm_clocks_to_base(&mut self) -> Result<(), ClockError> {
        self.with_device(|d| {
            d.set_gpu_locked_clocks(GpuLockedClocksSetting::Symbolic {
                lower_bound: ClockLimitId::Tdp,
                upper_bound: ClockLimitId::Tdp,
            })
        })
        .map_err(ClockError::Lock)
    }

    fn reset_sm_clocks(&mut self) -> Result<(), ClockError> {
        self.with_device(|d| d.reset_gpu_locked_clocks())
            .map_err(ClockError::Reset)
    }
}

/// A recording fake of [`ClockControl`] for tests: every call is appended to a shared log
/// (`"nvml:lock 1500-1500"`, `"nvml:lock base"`, `"nvml:reset"`), and failures can be
/// injected.
#[derive(Debug, Clone, Default)]
pub struct FakeNvml {
    /// The shared call log (tests can put journal entries in the same log to check order).
    pub log: Arc<Mutex<Vec<String>>>,
    /// Make the next lock fail.
    pub fail_lock: bool,
    /// Make resets fail.
    pub fail_reset: bool,
    /// The clocks as the fake believes them to be: `Some((min, max))` while locked
    /// (`(0, 0)` for base).
    pub locked: Option<(u32, u32)>,
}

impl FakeNvml {
    fn push(&self, s: String) {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(s);
    }
}

impl ClockControl for FakeNvml {
    fn lock_sm_clocks(&mut self, min_mhz: u32, max_mhz: u32) -> Result<(), ClockError> {
        self.push(format!("nvml:lock {min_mhz}-{max_mhz}"));
        if self.fail_lock {
            return Err(ClockError::Lock("injected failure".into()));
        }
        self.locked = Some((min_mhz, max_mhz));
        Ok(())
    }

    fn lock_sm_clocks_to_base(&mut self) -> Result<(), ClockError> {
        self.push("nvml:lock base".into());
        if self.fail_lock {
            return Err(ClockError::Lock("injected failure".into()));
        }
        self.locked = Some((0, 0));
        Ok(())
    }

    fn reset_sm_clocks(&mut self) -> Result<(), ClockError> {
        self.push("nvml:reset".into());
        if self.fail_reset {
            return Err(ClockError::Reset("injected failure".into()));
        }
        self.locked = None;
        Ok(())
    }
}

/// Whether timing windows run on the GPU's own clocks or locked ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "lowercase", deny_unknown_fields)]
pub enum ClockPolicy {
    /// Leave the clocks alone and record them (the default).
    #[default]
    Observe,
    /// Lock the SM clock for each timing window: to `mhz`, or to the base clock when absent.
    Lock {
        /// Target SM clock in MHz; `None` means the base (TDP) clock.
        #[serde(default)]
        mhz: Option<u32>,
    },
}

/// What a lock sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LockSetting {
    /// The base (TDP) clock.
    Base,
    /// A fixed SM clock in MHz.
    Mhz(u32),
}

/// What the clock policy journals, for the daemon to persist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ClockEvent {
    /// About to lock `gpu`'s clocks (recorded before the lock is applied).
    LockIntent {
        /// The GPU's UUID.
        gpu: String,
        /// What will be set.
        setting: LockSetting,
    },
    /// `gpu`'s clocks were reset (recorded after the reset succeeded).
    Released {
        /// The GPU's UUID.
        gpu: String,
    },
}

/// The journal callback: persist the event, or return why it could not be.
pub type Journal<'a> = dyn FnMut(&ClockEvent) -> Result<(), String> + 'a;

impl ClockPolicy {
    /// Enters a timing window on `gpu` under this policy. With `Observe`, nothing is
    /// recorded or changed. With `Lock`, the intent is journalled first (if that fails,
    /// nothing is changed), then the clocks are locked; a failed lock is followed by a
    /// reset and a `Released` entry.
    pub fn enter<'a, C: ClockControl + ?Sized>(
        &self,
        gpu: &str,
        ctl: &'a mut C,
        journal: &'a mut Journal<'a>,
    ) -> Result<ClockWindow<'a, C>, ClockError> {
        let mut window = ClockWindow {
            ctl,
            journal,
            gpu: gpu.to_string(),
            locked: false,
        };
        let ClockPolicy::Lock { mhz } = *self else {
            return Ok(window);
        };
        let setting = mhz.map_or(LockSetting::Base, LockSetting::Mhz);
        (window.journal)(&ClockEvent::LockIntent {
            gpu: gpu.to_string(),
            setting,
        })
        .map_err(ClockError::Journal)?;
        // From here on the clocks may change: the window owns the reset.
        window.locked = true;
        let applied = match setting {
            LockSetting::Base => window.ctl.lock_sm_clocks_to_base(),
            LockSetting::Mhz(m) => window.ctl.lock_sm_clocks(m, m),
        };
        if let Err(e) = applied {
            // Dropping the window resets and journals the release.
            drop(window);
            return Err(e);
        }
        tracing::info!(gpu, ?setting, "sm clocks locked for the timing window");
        Ok(window)
    }
}

/// An open timing window; resets locked clocks when released or dropped.
pub struct ClockWindow<'a, C: ClockControl + ?Sized> {
    ctl: &'a mut C,
    journal: &'a mut Journal<'a>,
    gpu: String,
    locked: bool,
}

impl<C: ClockControl + ?Sized> ClockWindow<'_, C> {
    /// True if and only if this window locked the clocks.
    pub fn is_locked(&self) -> bool {
        self.locked
    }

    /// Ends the window: resets the clocks (if locked) and journals the release.
    pub fn release(mut self) -> Result<(), ClockError> {
        self.reset()
    }

    fn reset(&mut self) -> Result<(), ClockError> {
        if !self.locked {
            return Ok(());
        }
        self.locked = false;
        self.ctl.reset_sm_clocks()?;
        let released = ClockEvent::Released {
            gpu: self.gpu.clone(),
        };
        if let Err(e) = (self.journal)(&released) {
            tracing::warn!(error = %e, "clocks reset, but the release could not be journalled");
        }
        Ok(())
    }
}

impl<C: ClockControl + ?Sized> Drop for ClockWindow<'_, C> {
    fn drop(&mut self) {
        if let Err(e) = self.reset() {
            tracing::error!(gpu = %self.gpu, error = %e, "could not reset locked clocks");
        }
    }
}

/// For a daemon starting up: if the journal's last entry for a GPU is a lock intent (the
/// daemon died inside a window), resets that GPU's clocks. Returns whether a reset was done.
pub fn recover_after_crash<C: ClockControl + ?Sized>(
    ctl: &mut C,
    last_event: Option<&ClockEvent>,
) -> Result<bool, ClockError> {
    match last_event {
        Some(ClockEvent::LockIntent { gpu, .. }) => {
            tracing::warn!(
                gpu,
                "clocks were locked when the daemon stopped; resetting them"
            );
            ctl.reset_sm_clocks()?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(sm: u32, reasons: u64, power_mw: u32, temp: u32, t: f64) -> TelemetrySample {
        TelemetrySample {
            t_ms: t,
            sm_mhz: Some(sm),
            mem_mhz: Some(3201),
            reasons: Some(reasons),
            power_mw: Some(power_mw),
            temp_c: Some(temp),
        }
    }

    #[test]
    fn summary_math() {
        let s = summarize(&[
            sample(1980, 0x0, 300_000, 40, 0.0),
            sample(1755, 0x4, 700_000, 55, 5.0),
            sample(1980, 0x1, 200_000, 42, 10.0),
            sample(1500, 0x4 | 0x20, 690_000, 58, 15.0),
        ]);
        assert_eq!(s.samples, 4);
        assert_eq!(s.window_ms, 15.0);
        let sm = s.sm_mhz.expect("sm clocks");
        assert_eq!((sm.min, sm.median, sm.max), (1500.0, 1867.5, 1980.0));
        assert_eq!(s.mem_mhz.map(|m| m.median), Some(3201.0));
        assert_eq!(
            s.reasons_seen,
            vec!["gpu_idle", "sw_power_cap", "sw_thermal_slowdown"]
        );
        assert_eq!(s.throttled_samples, 2);
        assert!(s.throttled());
        assert_eq!(s.power_w_avg, Some(472.5));
        assert_eq!(s.power_w_max, Some(700.0));
        assert_eq!(s.temp_c_max, Some(58));
        let json = serde_json::to_string(&s).expect("serialises");
        assert!(json.contains("\"sw_power_cap\""), "{json}");
    }

    #[test]
    fn summary_of_missing_fields_and_odd_counts() {
        let s = summarize(&[]);
        assert_eq!(s.samples, 0);
        assert!(s.sm_mhz.is_none() && s.power_w_avg.is_none() && s.temp_c_max.is_none());
        let mut a = sample(1000, 0, 1, 1, 0.0);
        a.power_mw = None;
        let s = summarize(&[
            a,
            sample(3000, 0, 2000, 1, 1.0),
            sample(2000, 0x200, 4000, 1, 2.0),
        ]);
        assert_eq!(s.sm_mhz.map(|m| m.median), Some(2000.0));
        assert_eq!(s.power_w_avg, Some(3.0));
        assert_eq!(s.reasons_seen, vec!["0x200"]);
        assert_eq!(s.throttled_samples, 0);
    }

    struct Counter(u32);
    impl TelemetrySource for Counter {
        fn read(&mut self) -> TelemetrySample {
            self.0 += 1;
            TelemetrySample {
                sm_mhz: Some(1000 + self.0),
                ..Default::default()
            }
        }
    }

    #[test]
    fn sampler_reads_until_stopped() {
        let s = Sampler::start(Counter(0), Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(30));
        let w = s.stop();
        assert!(w.samples.len() >= 3, "{}", w.samples.len());
        assert!(w.samples.windows(2).all(|p| p[0].t_ms <= p[1].t_ms));
        assert_eq!(w.summary.samples as usize, w.samples.len());
    }

    fn journal_into(
        log: &Arc<Mutex<Vec<String>>>,
    ) -> impl FnMut(&ClockEvent) -> Result<(), String> {
        let log = Arc::clone(log);
        move |e: &ClockEvent| {
            let s = match e {
                ClockEvent::LockIntent { setting, .. } => format!("journal:intent {setting:?}"),
                ClockEvent::Released { .. } => "journal:released".to_string(),
            };
            log.lock().unwrap().push(s);
            Ok(())
        }
    }

    #[test]
    fn lock_records_intent_before_applying_and_resets_after() {
        let mut fake = FakeNvml::default();
        let log = Arc::clone(&fake.log);
        let mut journal = journal_into(&log);
        {
            let w = ClockPolicy::Lock { mhz: Some(1500) }
                .enter("GPU-1", &mut fake, &mut journal)
                .expect("locks");
            assert!(w.is_locked());
            w.release().expect("resets");
        }
        assert_eq!(
            *log.lock().unwrap(),
            vec![
                "journal:intent Mhz(1500)",
                "nvml:lock 1500-1500",
                "nvml:reset",
                "journal:released"
            ]
        );
        assert_eq!(fake.locked, None);
    }

    #[test]
    fn lock_to_base_when_no_mhz_is_given() {
        let mut fake = FakeNvml::default();
        let log = Arc::clone(&fake.log);
        let mut journal = journal_into(&log);
        let w = ClockPolicy::Lock { mhz: None }
            .enter("GPU-1", &mut fake, &mut journal)
            .expect("locks");
        drop(w);
        assert_eq!(
            *log.lock().unwrap(),
            vec![
                "journal:intent Base",
                "nvml:lock base",
                "nvml:reset",
                "journal:released"
            ]
        );
    }

    #[test]
    fn observe_touches_nothing() {
        let mut fake = FakeNvml::default();
        let log = Arc::clone(&fake.log);
        let mut journal = journal_into(&log);
        let w = ClockPolicy::Observe
            .enter("GPU-1", &mut fake, &mut journal)
            .expect("observe");
        assert!(!w.is_locked());
        w.release().expect("nothing to release");
        assert!(log.lock().unwrap().is_empty());
        assert_eq!(ClockPolicy::default(), ClockPolicy::Observe);
    }

    #[test]
    fn a_journal_failure_leaves_clocks_alone() {
        let mut fake = FakeNvml::default();
        let log = Arc::clone(&fake.log);
        let mut journal = |_: &ClockEvent| -> Result<(), String> { Err("disk full".into()) };
        let err = ClockPolicy::Lock { mhz: Some(1500) }
            .enter("GPU-1", &mut fake, &mut journal)
            .err()
            .expect("refused");
        assert!(matches!(err, ClockError::Journal(_)), "{err}");
        assert!(log.lock().unwrap().is_empty(), "nvml must not be called");
        assert_eq!(fake.locked, None);
    }

    #[test]
    fn a_failed_lock_is_reset_and_released() {
        let mut fake = FakeNvml {
            fail_lock: true,
            ..Default::default()
        };
        let log = Arc::clone(&fake.log);
        let mut journal = journal_into(&log);
        let err = ClockPolicy::Lock { mhz: Some(1500) }
            .enter("GPU-1", &mut fake, &mut journal)
            .err()
            .expect("lock fails");
        assert!(matches!(err, ClockError::Lock(_)), "{err}");
        assert_eq!(
            *log.lock().unwrap(),
            vec![
                "journal:intent Mhz(1500)",
                "nvml:lock 1500-1500",
                "nvml:reset",
                "journal:released"
            ]
        );
    }

    #[test]
    fn a_panic_inside_the_window_still_resets() {
        let mut fake = FakeNvml::default();
        let log = Arc::clone(&fake.log);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut journal = journal_into(&log);
            let _w = ClockPolicy::Lock { mhz: Some(1400) }
                .enter("GPU-1", &mut fake, &mut journal)
                .expect("locks");
            panic!("timing loop crashed");
        }));
        assert!(result.is_err());
        assert_eq!(
            *log.lock().unwrap(),
            vec![
                "journal:intent Mhz(1400)",
                "nvml:lock 1400-1400",
                "nvml:reset",
                "journal:released"
            ]
        );
    }

    #[test]
    fn a_failed_reset_keeps_the_intent_open() {
        let mut fake = FakeNvml {
            fail_reset: true,
            ..Default::default()
        };
        let log = Arc::clone(&fake.log);
        let mut journal = journal_into(&log);
        let w = ClockPolicy::Lock { mhz: Some(1500) }
            .enter("GPU-1", &mut fake, &mut journal)
            .expect("locks");
        assert!(matches!(w.release(), Err(ClockError::Reset(_))));
        // No "released" entry: the daemon's next start will retry the reset.
        assert_eq!(
            *log.lock().unwrap(),
            vec![
                "journal:intent Mhz(1500)",
                "nvml:lock 1500-1500",
                "nvml:reset"
            ]
        );
    }

    #[test]
    fn recovery_after_a_crash_resets_only_when_an_intent_is_open() {
        let mut fake = FakeNvml::default();
        let intent = ClockEvent::LockIntent {
            gpu: "GPU-1".into(),
            setting: LockSetting::Mhz(1500),
        };
        assert!(recover_after_crash(&mut fake, Some(&intent)).expect("resets"));
        assert_eq!(*fake.log.lock().unwrap(), vec!["nvml:reset"]);
        let released = ClockEvent::Released {
            gpu: "GPU-1".into(),
        };
        assert!(!recover_after_crash(&mut fake, Some(&released)).expect("nothing"));
        assert!(!recover_after_crash(&mut fake, None).expect("nothing"));
        assert_eq!(fake.log.lock().unwrap().len(), 1);
    }

    #[test]
    fn policy_serde_shape() {
        let p: ClockPolicy = serde_json::from_str(r#"{"mode":"lock","mhz":1500}"#).expect("lock");
        assert_eq!(p, ClockPolicy::Lock { mhz: Some(1500) });
        let p: ClockPolicy = serde_json::from_str(r#"{"mode":"lock"}"#).expect("base");
        assert_eq!(p, ClockPolicy::Lock { mhz: None });
        let p: ClockPolicy = serde_json::from_str(r#"{"mode":"observe"}"#).expect("observe");
        assert_eq!(p, ClockPolicy::Observe);
    }
}
