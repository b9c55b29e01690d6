//! [`TimerLog`]: which figure of each GPU sample is *the* time, and what the evidence says
//! about all of them.
//!
//! Every timed sample has its event time and, when the kernel tracer runs
//! (`kiln_gpu::cupti`), the sum and the span of the work's kernel records. The figure asked
//! for (the problem's `timing_figure`, else the plan's) is used when it can be:
//! - the tracer is off (library missing, a profiler attached, turned off): every sample is
//!   its event time, and the evidence says why (`fallback`);
//! - one sample's records could not be attributed: that sample counts with its event time,
//!   which is never shorter than its kernel time, so a candidate cannot gain by it; the
//!   evidence counts such samples (`records_missing`) and keeps the first reason.
//!
//! Pure bookkeeping over `kiln_gpu::SampleTimes`, so the fallback rules are tested without
//! a GPU.

use kiln_gpu::SampleTimes;
use kiln_gpu::cupti::TimerStatus;
use kiln_types::{FigureSummary, TimerEvidence, TimingFigure};

/// One sample's figures, µs.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Figures {
    event_us: f64,
    /// (sum, span) of the work's kernel records, when attributed.
    kernels: Option<(f64, f64)>,
}

/// The figures of one timing's samples and the rules that pick *the* time.
#[derive(Debug, Clone)]
pub struct TimerLog {
    asked: TimingFigure,
    status: TimerStatus,
    launches: u32,
    samples: Vec<Figures>,
    missing: u32,
    missing_reason: Option<String>,
}

impl TimerLog {
    /// A log for work of `launches` launches per sample (0 when unknown), timed with the
    /// tracer in `status` (`None`: never started).
    pub fn new(asked: TimingFigure, status: Option<&TimerStatus>, launches: usize) -> TimerLog {
        TimerLog {
            asked,
            status: status.cloned().unwrap_or(TimerStatus::Events {
                reason: "the kernel tracer was not started in this worker".into(),
            }),
            launches: u32::try_from(launches).unwrap_or(u32::MAX),
            samples: Vec::new(),
            missing: 0,
            missing_reason: None,
        }
    }

    /// The figure the samples are judged by: the one asked for, or events when no kernel
    /// records are read.
    pub fn figure(&self) -> TimingFigure {
        match self.status {
            TimerStatus::Cupti { .. } => self.asked,
            TimerStatus::Events { .. } => TimingFigure::Events,
        }
    }

    /// Forgets the samples (a new timing attempt starts).
    pub fn reset(&mut self) {
        self.samples.clear();
        self.missing = 0;
        self.missing_reason = None;
    }

    /// Records one sample; returns its time in µs by [`TimerLog::figure`].
    pub fn record(&mut self, t: &SampleTimes) -> f64 {
        let event_us = t.event_ms * 1e3;
        let kernels = match &t.kernels {
            Some(Ok(k)) => Some((k.sum_us(), k.span_us())),
            Some(Err(why)) => {
                self.note_missing(why);
                None
            }
            None if matches!(self.status, TimerStatus::Cupti { .. }) => {
                self.note_missing("no window of kernel records was opened");
                None
            }
            None => None,
        };
        self.samples.push(Figures { event_us, kernels });
        match (self.figure(), kernels) {
            (TimingFigure::KernelSpan, Some((_, span))) => span,
            (TimingFigure::KernelSum, Some((sum, _))) => sum,
            _ => event_us,
        }
    }

    fn note_missing(&mut self, why: &str) {
        self.missing += 1;
        if self.missing_reason.is_none() {
            self.missing_reason = Some(why.to_string());
        }
    }

    /// The evidence over the recorded samples except those at `excluded` (dropped as
    /// throttled); `None` when nothing was recorded (plain timing, no timing at all).
    pub fn evidence(&self, excluded: &[usize]) -> Option<TimerEvidence> {
        if self.samples.is_empty() {
            return None;
        }
        let kept: Vec<Figures> = self
            .samples
            .iter()
            .enumerate()
            .filter(|(i, _)| !excluded.contains(i))
            .map(|(_, f)| *f)
            .collect();
        let events: Vec<f64> = kept.iter().map(|f| f.event_us).collect();
        let sums: Vec<f64> = kept.iter().filter_map(|f| f.kernels.map(|k| k.0)).collect();
        let spans: Vec<f64> = kept.iter().filter_map(|f| f.kernels.map(|k| k.1)).collect();
        let summary = |v: &[f64]| {
            kiln_gpu::timing::stats(v).map(|s| FigureSummary {
                n: u32::try_from(s.n).unwrap_or(u32::MAX),
                median_us: s.median,
                mean_us: s.mean,
                min_us: s.min,
                cv: s.cv,
            })
        };
        let (source, fallback, library) = match &self.status {
            TimerStatus::Cupti { library, version } => (
                "cupti",
                None,
                Some(format!("{library} (CUPTI API {version})")),
            ),
            TimerStatus::Events { reason } => ("events", Some(reason.clone()), None),
        };
        Some(TimerEvidence {
            figure: self.figure(),
            asked: self.asked,
            source: source.into(),
            fallback,
            library,
            launches: self.launches,
            events: summary(&events).unwrap_or_default(),
            kernel_sum: summary(&sums),
            kernel_span: summary(&spans),
            records_missing: self.missing,
            records_missing_reason: self.missing_reason.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_gpu::cupti::{KernelTimes, Method};

    fn cupti() -> TimerStatus {
        TimerStatus::Cupti {
            library: "/usr/local/cuda/lib64/libcupti.so.13".into(),
            version: 130001,
        }
    }

    /// A sample of a three-launch candidate: 8.1 µs by events, kernels 1.5 + 3 + 1.55 µs
    /// spanning 8 µs.
    fn three_launches() -> SampleTimes {
        SampleTimes {
            event_ms: 0.0081,
            kernels: Some(Ok(KernelTimes {
                sum_ns: 6_050,
                span_ns: 8_000,
                kernels: 3,
                method: Method::Correlation,
            })),
        }
    }

    #[test]
    fn the_asked_figure_is_used_when_records_are_read() {
        for (asked, want) in [
            (TimingFigure::KernelSpan, 8.0),
            (TimingFigure::KernelSum, 6.05),
            (TimingFigure::Events, 8.1),
        ] {
            let mut log = TimerLog::new(asked, Some(&cupti()), 3);
            let us = log.record(&three_launches());
            assert!((us - want).abs() < 1e-9, "{asked:?}: {us}");
            let e = log.evidence(&[]).expect("evidence");
            assert_eq!(
                (e.figure, e.asked, e.source.as_str()),
                (asked, asked, "cupti")
            );
            assert_eq!(e.launches, 3);
            assert!((e.kernel_sum.expect("sum").median_us - 6.05).abs() < 1e-9);
            assert!((e.kernel_span.expect("span").median_us - 8.0).abs() < 1e-9);
            assert!((e.events.median_us - 8.1).abs() < 1e-9);
            assert!(e.fallback.is_none() && e.library.is_some_and(|l| l.contains("130001")));
        }
    }

    #[test]
    fn without_cupti_every_sample_is_its_event_time_and_the_reason_is_kept() {
        let off = TimerStatus::Events {
            reason: "libcupti.so not found".into(),
        };
        let mut log = TimerLog::new(TimingFigure::KernelSpan, Some(&off), 1);
        let us = log.record(&SampleTimes {
            event_ms: 0.0081,
            kernels: None,
        });
        assert!((us - 8.1).abs() < 1e-9);
        assert_eq!(log.figure(), TimingFigure::Events);
        let e = log.evidence(&[]).expect("evidence");
        assert_eq!(
            (e.figure, e.asked),
            (TimingFigure::Events, TimingFigure::KernelSpan)
        );
        assert_eq!(e.source, "events");
        assert_eq!(e.fallback.as_deref(), Some("libcupti.so not found"));
        assert!(e.kernel_sum.is_none() && e.kernel_span.is_none());
        assert_eq!(e.records_missing, 0);
        // A tracer never started reads the same way, with its own reason.
        let log = TimerLog::new(TimingFigure::KernelSum, None, 1);
        assert_eq!(log.figure(), TimingFigure::Events);
    }

    #[test]
    fn a_sample_without_records_counts_with_its_event_time() {
        let mut log = TimerLog::new(TimingFigure::KernelSpan, Some(&cupti()), 3);
        log.record(&three_launches());
        let us = log.record(&SampleTimes {
            event_ms: 0.0083,
            kernels: Some(Err("1 of the 3 launches have no kernel record".into())),
        });
        assert!((us - 8.3).abs() < 1e-9);
        log.record(&SampleTimes {
            event_ms: 0.0082,
            kernels: None,
        });
        let e = log.evidence(&[]).expect("evidence");
        assert_eq!(e.records_missing, 2);
        assert!(
            e.records_missing_reason
                .is_some_and(|r| r.contains("no kernel record"))
        );
        assert_eq!(e.kernel_span.expect("span").n, 1);
        assert_eq!(e.events.n, 3);
    }

    #[test]
    fn excluded_samples_and_resets() {
        let mut log = TimerLog::new(TimingFigure::Events, Some(&cupti()), 1);
        for ms in [0.010, 0.050, 0.011] {
            log.record(&SampleTimes {
                event_ms: ms,
                kernels: None,
            });
        }
        let e = log.evidence(&[1]).expect("evidence");
        assert_eq!(e.events.n, 2);
        assert!((e.events.median_us - 10.5).abs() < 1e-9);
        log.reset();
        assert!(log.evidence(&[]).is_none());
    }
}
