//! Small statistics helpers for comparing timings: median, mean, standard deviation,
//! confidence intervals of the mean, and whether two timings can be told apart.
//!
//! kiln already reports each correct candidate's timing statistics
//! ([`kiln_types::TimingStats`]); these helpers judge whether one candidate is really
//! faster than another, or whether the difference is within the noise.

use kiln_types::TimingStats;

/// The median of `xs` (the mean of the two middle values for an even count); `None` for
/// an empty slice or one containing NaN.
pub fn median(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() || xs.iter().any(|x| x.is_nan()) {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// The arithmetic mean; `None` for an empty slice.
pub fn mean(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    Some(xs.iter().sum::<f64>() / xs.len() as f64)
}

/// The sample standard deviation (n - 1 in the denominator); `None` below two samples.
pub fn stdev(xs: &[f64]) -> Option<f64> {
    if xs.len() < 2 {
        return None;
    }
    let m = mean(xs)?;
    let ss: f64 = xs.iter().map(|x| (x - m) * (x - m)).sum();
    Some((ss / (xs.len() - 1) as f64).sqrt())
}

/// A closed interval `[low, high]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    /// Lower end.
    pub low: f64,
    /// Upper end.
    pub high: f64,
}

impl Interval {
    /// True if and only if the two intervals share at least one point.
    pub fn overlaps(&self, other: &Interval) -> bool {
        self.low <= other.high && other.low <= self.high
    }

    /// True if and only if `x` lies in the interval.
    pub fn contains(&self, x: f64) -> bool {
        self.low <= x && x <= self.high
    }
}

/// Two-sided 95 % critical values of Student's t for 1..=30 degrees of freedom.
const T95: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
    2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
    2.052, 2.048, 2.045, 2.042,
];

/// The two-sided 95 % critical value of Student's t for `df` degrees of freedom (the
/// normal 1.96 from 120 on, interpolated in 1/df between 30 and 120).
pub fn t_critical_95(df: u32) -> f64 {
    match df {
        0 => f64::INFINITY,
        1..=30 => T95[df as usize - 1],
        31..=119 => {
            // Linear in 1/df between t(30) = 2.042 and t(120) = 1.980.
            let (a, b) = (1.0 / 30.0, 1.0 / 120.0);
            let x = 1.0 / f64::from(df);
            1.980 + (2.042 - 1.980) * (x - b) / (a - b)
        }
        _ => 1.960,
    }
}

/// The 95 % confidence interval of the mean from summary figures: `mean ± t · sd / √n`.
/// `None` below two samples.
pub fn mean_ci95_from(mean: f64, stdev: f64, n: u32) -> Option<Interval> {
    if n < 2 || !mean.is_finite() || !stdev.is_finite() {
        return None;
    }
    let half = t_critical_95(n - 1) * stdev / f64::from(n).sqrt();
    Some(Interval {
        low: mean - half,
        high: mean + half,
    })
}

/// The 95 % confidence interval of the mean of `xs`; `None` below two samples.
pub fn mean_ci95(xs: &[f64]) -> Option<Interval> {
    let n = u32::try_from(xs.len()).ok()?;
    mean_ci95_from(mean(xs)?, stdev(xs)?, n)
}

/// The 95 % confidence interval of the mean time of kiln's timing statistics.
pub fn timing_ci95(t: &TimingStats) -> Option<Interval> {
    mean_ci95_from(t.mean_us, t.stdev_us, t.n)
}

/// How two timings compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    /// The first is faster: its interval lies wholly below the second's.
    Faster,
    /// The first is slower: its interval lies wholly above the second's.
    Slower,
    /// The intervals overlap (or one is missing): the difference may be noise.
    Indistinguishable,
}

/// Compares two timings by their 95 % confidence intervals of the mean.
///
/// Non-overlapping intervals are a conservative test (it says "indistinguishable" more
/// often than a t-test would), which is what a search wants before it declares a winner.
pub fn compare(a: &TimingStats, b: &TimingStats) -> Comparison {
    match (timing_ci95(a), timing_ci95(b)) {
        (Some(x), Some(y)) if x.high < y.low => Comparison::Faster,
        (Some(x), Some(y)) if y.high < x.low => Comparison::Slower,
        _ => Comparison::Indistinguishable,
    }
}

/// True if and only if the two timings' 95 % intervals overlap (or one cannot be
/// computed): the difference between them may be noise.
pub fn overlap(a: &TimingStats, b: &TimingStats) -> bool {
    compare(a, b) == Comparison::Indistinguishable
}

/// Speedup of `candidate_us` over `baseline_us` (`baseline / candidate`); `None` when
/// either is not positive and finite.
pub fn speedup(baseline_us: f64, candidate_us: f64) -> Option<f64> {
    let ok = |x: f64| x.is_finite() && x > 0.0;
    (ok(baseline_us) && ok(candidate_us)).then(|| baseline_us / candidate_us)
}

/// The geometric mean of positive values (speedups over several shapes); `None` when
/// empty or when a value is not positive and finite.
pub fn geomean(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() || xs.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
        return None;
    }
    Some((xs.iter().map(|x| x.ln()).sum::<f64>() / xs.len() as f64).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    fn timing(mean_us: f64, stdev_us: f64, n: u32) -> TimingStats {
        TimingStats {
            mean_us,
            median_us: mean_us,
            stdev_us,
            n,
            ..TimingStats::default()
        }
    }

    #[test]
    fn median_mean_stdev() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, f64::NAN]), None);
        assert_eq!(mean(&[1.0, 2.0, 3.0, 4.0]), Some(2.5));
        assert_eq!(mean(&[]), None);
        assert!(close(
            stdev(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]).unwrap_or(0.0),
            2.138089935299395
        ));
        assert_eq!(stdev(&[1.0]), None);
    }

    #[test]
    fn confidence_interval_uses_student_t() {
        // n = 4, mean 2.5, sd 1.2909944, t(3) = 3.182 → half-width 2.0540
        let ci = mean_ci95(&[1.0, 2.0, 3.0, 4.0]).expect("ci");
        assert!(close(ci.low + ci.high, 5.0));
        assert!((ci.high - 2.5 - 3.182 * 1.2909944487358056 / 2.0).abs() < 1e-9);
        assert_eq!(mean_ci95(&[1.0]), None);
        assert_eq!(t_critical_95(1), 12.706);
        assert_eq!(t_critical_95(1000), 1.96);
        let mid = t_critical_95(60);
        assert!(mid < 2.042 && mid > 1.980, "{mid}");
    }

    #[test]
    fn compare_needs_separated_intervals() {
        let fast = timing(100.0, 1.0, 30);
        let slow = timing(110.0, 1.0, 30);
        let noisy = timing(105.0, 20.0, 30);
        assert_eq!(compare(&fast, &slow), Comparison::Faster);
        assert_eq!(compare(&slow, &fast), Comparison::Slower);
        assert_eq!(compare(&fast, &noisy), Comparison::Indistinguishable);
        assert!(overlap(&fast, &noisy));
        assert!(!overlap(&fast, &slow));
        assert!(
            overlap(&fast, &timing(90.0, 0.0, 1)),
            "one sample is never conclusive"
        );
        let a = Interval {
            low: 0.0,
            high: 1.0,
        };
        assert!(a.overlaps(&Interval {
            low: 1.0,
            high: 2.0
        }));
        assert!(!a.overlaps(&Interval {
            low: 1.5,
            high: 2.0
        }));
        assert!(a.contains(0.5));
    }

    #[test]
    fn speedup_and_geomean() {
        assert_eq!(speedup(200.0, 100.0), Some(2.0));
        assert_eq!(speedup(200.0, 0.0), None);
        assert!(close(geomean(&[2.0, 8.0]).unwrap_or(0.0), 4.0));
        assert_eq!(geomean(&[1.0, -1.0]), None);
        assert_eq!(geomean(&[]), None);
    }
}
