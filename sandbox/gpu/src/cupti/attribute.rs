//! Which kernel records of a sample belong to the timed work, and what they add up to.
//!
//! Pure: a list of kernel activity records in, a [`KernelTimes`] or a typed refusal out,
//! so the rules are tested without CUPTI. One sample's records are those delivered between
//! the flush before the sample and the flush after it (the window, see the tracer); they
//! hold kiln's own launches (the blocking kernel) and the work's. Two ways to tell them
//! apart, tried in this order:
//!
//! 1. **Correlation IDs.** Every launch API call gets a correlation ID, and the kernel it
//!    launches carries the same ID in its record (CUPTI activity API docs,
//!    `CUpti_ActivityKernel::correlationId`). The tracer captures the IDs of the work's
//!    launches as they are made; the work's records are exactly the ones with those IDs,
//!    one each. A missing or repeated one refuses the sample.
//! 2. **Stream order**, when no ID is known for the work (a library call such as cuBLAS
//!    launches through paths whose IDs kiln does not see) or when none of the known IDs
//!    matches a record: everything in the window except kiln's own launches, identified by
//!    their IDs, or else as the first `kiln_first` records by start time (kiln enqueues its
//!    blocking kernel before the work on the same in-order stream).
//!
//! When the launch count of the work is known (a launch list), the records must match it.
//! Times: `sum` adds each record's `end − start`; `span` runs from the earliest start to the
//! latest end, so it also holds the GPU's gaps between the launches.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One kernel's activity record, as far as timing needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelRecord {
    /// The correlation ID of the launch API call that launched it.
    pub correlation_id: u32,
    /// CUPTI's ID of the stream it ran on.
    pub stream_id: u32,
    /// Start on the GPU, ns (CUPTI's timestamp base).
    pub start_ns: u64,
    /// End on the GPU, ns.
    pub end_ns: u64,
}

/// What one sample's window holds and what is known about it.
#[derive(Debug, Clone, Copy)]
pub struct Window<'a> {
    /// Every kernel record delivered in the window.
    pub records: &'a [KernelRecord],
    /// When the window opened (CUPTI's clock, ns): a record that started earlier belongs
    /// to work from before the sample, delivered late, and is ignored.
    pub not_before_ns: u64,
    /// Correlation IDs of kiln's own launches in the window (the blocking kernel).
    pub kiln_ids: &'a [u32],
    /// How many of kiln's own launches come before the work on the stream.
    pub kiln_first: usize,
    /// Correlation IDs of the work's launches as they were made (may be empty).
    pub work_ids: &'a [u32],
    /// The work's launch count, when known (a launch list).
    pub launches: Option<usize>,
}

/// How the work's records were told apart from kiln's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// By the correlation IDs of the work's launches.
    Correlation,
    /// By stream order (and kiln's IDs where they matched).
    StreamOrder,
}

/// The work's kernel time in one sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct KernelTimes {
    /// Sum of the kernels' durations, ns.
    pub sum_ns: u64,
    /// First start to last end, ns (the durations plus the gaps between launches).
    pub span_ns: u64,
    /// Kernel records counted.
    pub kernels: usize,
    /// How they were found.
    pub method: Method,
}

impl KernelTimes {
    /// [`KernelTimes::sum_ns`] in µs.
    pub fn sum_us(&self) -> f64 {
        self.sum_ns as f64 / 1e3
    }

    /// [`KernelTimes::span_ns`] in µs.
    pub fn span_us(&self) -> f64 {
        self.span_ns as f64 / 1e3
    }
}

/// Why a sample's records give no kernel time.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AttributionError {
    /// Some of the work's launches have no record (dropped or not yet delivered).
    #[error("{missing} of the {expected} launches have no kernel record")]
    Missing {
        /// Launches without a record.
        missing: usize,
        /// Launches expected.
        expected: usize,
    },
    /// A launch's correlation ID appears on more than one record.
    #[error("correlation ID {0} appears on more than one kernel record")]
    Duplicate(u32),
    /// The window holds a different number of work records than the launch count.
    #[error("the window holds {found} kernel records of the work; the launch list has {expected}")]
    Count {
        /// Work records found.
        found: usize,
        /// Launches in the list.
        expected: usize,
    },
    /// No record of the work at all.
    #[error("no kernel record of the timed work")]
    Empty,
    /// A record without usable timestamps (zero, or ending before it starts).
    #[error("a kernel record has no usable timestamps (start {start}, end {end})")]
    Timestamps {
        /// Start, ns.
        start: u64,
        /// End, ns.
        end: u64,
    },
}

/// The work's kernel times in `w` (see the module docs for the rules).
pub fn attribute(w: &Window) -> Result<KernelTimes, AttributionError> {
    let fresh: Vec<KernelRecord> = w
        .records
        .iter()
        .filter(|r| r.start_ns >= w.not_before_ns)
        .copied()
        .collect();
    let w = &Window {
        records: &fresh,
        ..*w
    };
    let usable_ids = !w.work_ids.is_empty() && w.work_ids.iter().all(|&id| id != 0);
    let any_match = usable_ids
        && w.records
            .iter()
            .any(|r| w.work_ids.contains(&r.correlation_id));
    let (work, method) = if any_match {
        (by_correlation(w)?, Method::Correlation)
    } else {
        (by_stream_order(w)?, Method::StreamOrder)
    };
    times(&work, method)
}

fn by_correlation(w: &Window) -> Result<Vec<KernelRecord>, AttributionError> {
    let mut work = Vec::with_capacity(w.work_ids.len());
    let mut missing = 0;
    for (i, &id) in w.work_ids.iter().enumerate() {
        if w.work_ids[..i].contains(&id) {
            return Err(AttributionError::Duplicate(id));
        }
        let mut hits = w.records.iter().filter(|r| r.correlation_id == id);
        match (hits.next(), hits.next()) {
            (Some(r), None) => work.push(*r),
            (Some(_), Some(_)) => return Err(AttributionError::Duplicate(id)),
            (None, _) => missing += 1,
        }
    }
    if missing > 0 {
        return Err(AttributionError::Missing {
            missing,
            expected: w.work_ids.len(),
        });
    }
    check_count(work.len(), w.launches)?;
    Ok(work)
}

fn by_stream_order(w: &Window) -> Result<Vec<KernelRecord>, AttributionError> {
    let mut rest: Vec<KernelRecord> = w.records.to_vec();
    rest.sort_by_key(|r| (r.start_ns, r.end_ns));
    let kiln_known = w.kiln_ids.iter().any(|&id| id != 0)
        && rest.iter().any(|r| w.kiln_ids.contains(&r.correlation_id));
    if kiln_known {
        rest.retain(|r| !w.kiln_ids.contains(&r.correlation_id));
    } else {
        let drop = w.kiln_first.min(rest.len());
        rest.drain(..drop);
    }
    if rest.is_empty() {
        return Err(match w.launches {
            Some(expected) if expected > 0 => AttributionError::Missing {
                missing: expected,
                expected,
            },
            _ => AttributionError::Empty,
        });
    }
    check_count(rest.len(), w.launches)?;
    Ok(rest)
}

fn check_count(found: usize, launches: Option<usize>) -> Result<(), AttributionError> {
    match launches {
        Some(expected) if found != expected => Err(AttributionError::Count { found, expected }),
        _ => Ok(()),
    }
}

fn times(work: &[KernelRecord], method: Method) -> Result<KernelTimes, AttributionError> {
    if work.is_empty() {
        return Err(AttributionError::Empty);
    }
    let mut sum = 0u64;
    for r in work {
        if r.start_ns == 0 || r.end_ns < r.start_ns {
            return Err(AttributionError::Timestamps {
                start: r.start_ns,
                end: r.end_ns,
            });
        }
        sum = sum.saturating_add(r.end_ns - r.start_ns);
    }
    let first = work.iter().map(|r| r.start_ns).min().unwrap_or(0);
    let last = work.iter().map(|r| r.end_ns).max().unwrap_or(0);
    Ok(KernelTimes {
        sum_ns: sum,
        span_ns: last - first,
        kernels: work.len(),
        method,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: u32, start: u64, end: u64) -> KernelRecord {
        KernelRecord {
            correlation_id: id,
            stream_id: 13,
            start_ns: start,
            end_ns: end,
        }
    }

    /// kiln's blocker (id 10, 40 µs), then three launches of the work with gaps.
    fn sample() -> Vec<KernelRecord> {
        vec![
            rec(12, 1_000_000 + 41_000, 1_000_000 + 47_000),
            rec(10, 1_000_000, 1_000_000 + 40_000),
            rec(11, 1_000_000 + 40_800, 1_000_000 + 40_900),
            rec(13, 1_000_000 + 48_000, 1_000_000 + 49_500),
        ]
    }

    fn window<'a>(records: &'a [KernelRecord], work: &'a [u32]) -> Window<'a> {
        Window {
            records,
            not_before_ns: 1_000_000,
            kiln_ids: &[10],
            kiln_first: 1,
            work_ids: work,
            launches: Some(3),
        }
    }

    #[test]
    fn a_multi_launch_candidate_sums_its_kernels_and_spans_its_gaps() {
        let recs = sample();
        let t = attribute(&window(&recs, &[11, 12, 13])).expect("attributed");
        assert_eq!(t.method, Method::Correlation);
        assert_eq!(t.kernels, 3);
        // 100 ns + 6000 ns + 1500 ns.
        assert_eq!(t.sum_ns, 7_600);
        // 40 800 → 49 500 ns: the durations plus the gaps between them; the blocker before
        // them is not part of it.
        assert_eq!(t.span_ns, 8_700);
        assert!((t.sum_us() - 7.6).abs() < 1e-12 && (t.span_us() - 8.7).abs() < 1e-12);
    }

    #[test]
    fn the_blocker_and_foreign_records_are_left_out() {
        let mut recs = sample();
        // A record of a kernel that ran before the window opened, delivered late: not
        // counted, whichever rule applies.
        recs.push(rec(7, 900_000, 990_000));
        let t = attribute(&window(&recs, &[11, 12, 13])).expect("attributed");
        assert_eq!((t.sum_ns, t.kernels), (7_600, 3));
        let t = attribute(&window(&recs, &[])).expect("by order");
        assert_eq!(
            (t.sum_ns, t.kernels, t.method),
            (7_600, 3, Method::StreamOrder)
        );
        let w = Window {
            kiln_ids: &[],
            ..window(&recs, &[])
        };
        let t = attribute(&w).expect("by order, blocker first");
        assert_eq!((t.sum_ns, t.kernels), (7_600, 3));
        // Work IDs of zero (a CUPTI that reports none) are not trusted: stream order.
        let t = attribute(&window(&recs, &[0, 0, 0])).expect("by order");
        assert_eq!(t.method, Method::StreamOrder);
    }

    #[test]
    fn a_missing_or_repeated_record_refuses_the_sample() {
        let recs: Vec<KernelRecord> = sample()
            .into_iter()
            .filter(|r| r.correlation_id != 12)
            .collect();
        assert_eq!(
            attribute(&window(&recs, &[11, 12, 13])),
            Err(AttributionError::Missing {
                missing: 1,
                expected: 3
            })
        );
        let mut recs = sample();
        recs.push(rec(13, 2_000_000, 2_000_100));
        assert_eq!(
            attribute(&window(&recs, &[11, 12, 13])),
            Err(AttributionError::Duplicate(13))
        );
        let recs = sample();
        assert_eq!(
            attribute(&window(&recs, &[11, 11, 13])),
            Err(AttributionError::Duplicate(11))
        );
    }

    #[test]
    fn the_launch_count_must_match() {
        let recs = sample();
        let mut w = window(&recs, &[11, 12]);
        assert_eq!(
            attribute(&w),
            Err(AttributionError::Count {
                found: 2,
                expected: 3
            })
        );
        w.launches = None;
        assert_eq!(attribute(&w).map(|t| t.kernels), Ok(2));
    }

    #[test]
    fn without_work_ids_stream_order_drops_kilns_own_launches() {
        let recs = sample();
        // kiln's ID known: removed by ID.
        let t = attribute(&window(&recs, &[])).expect("by order");
        assert_eq!(t.method, Method::StreamOrder);
        assert_eq!((t.sum_ns, t.span_ns, t.kernels), (7_600, 8_700, 3));
        // No ID known at all (IDs that match nothing count as unknown): the first record
        // by start time is kiln's blocker.
        let w = Window {
            records: &recs,
            not_before_ns: 0,
            kiln_ids: &[99],
            kiln_first: 1,
            work_ids: &[55, 56, 57],
            launches: Some(3),
        };
        let t = attribute(&w).expect("by order");
        assert_eq!(t.method, Method::StreamOrder);
        assert_eq!(t.sum_ns, 7_600);
        // A library call of unknown launch count: whatever follows the blocker.
        let w = Window {
            launches: None,
            work_ids: &[],
            ..w
        };
        assert_eq!(attribute(&w).map(|t| t.kernels), Ok(3));
    }

    #[test]
    fn an_empty_window_or_bad_timestamps_give_no_time() {
        let only_blocker = [rec(10, 5, 10)];
        assert_eq!(
            attribute(&Window {
                not_before_ns: 0,
                ..window(&only_blocker, &[])
            }),
            Err(AttributionError::Missing {
                missing: 3,
                expected: 3
            })
        );
        let w = Window {
            launches: None,
            not_before_ns: 0,
            ..window(&only_blocker, &[])
        };
        assert_eq!(attribute(&w), Err(AttributionError::Empty));
        let backwards = [rec(10, 5, 10), rec(11, 500, 400)];
        let w = Window {
            launches: Some(1),
            not_before_ns: 0,
            ..window(&backwards, &[11])
        };
        assert!(matches!(
            attribute(&w),
            Err(AttributionError::Timestamps {
                start: 500,
                end: 400
            })
        ));
        let zero = [rec(11, 0, 0)];
        let w = Window {
            launches: Some(1),
            not_before_ns: 0,
            ..window(&zero, &[11])
        };
        assert!(matches!(
            attribute(&w),
            Err(AttributionError::Timestamps { .. })
        ));
    }
}
