//! Racing the incumbent: a candidate whose samples already show it clearly slower than
//! the incumbent stops timing early (`raced_out`).
//!
//! The rule: once at least [`min_samples`] samples are in, stop when the lower end of the
//! 95 % confidence interval of the candidate's mean (Student's t) is above the incumbent's
//! upper bound times `1 + margin`. A candidate that may be the new best never meets it,
//! so it runs the full stop rule.

use kiln_types::{RaceBound, TimingPlan, TimingStats, t95};

/// Samples needed before the race is judged: the stop rule's `min_samples`, kept within
/// 3..=10 (fewer than 3 gives no usable spread; more than 10 wastes the point of racing).
pub fn min_samples(tp: &TimingPlan) -> u32 {
    tp.min_samples.clamp(3, 10)
}

/// The 95 % confidence interval of the mean of `stats`' samples, µs.
pub fn interval(stats: &TimingStats) -> (f64, f64) {
    let half = if stats.n > 1 {
        t95(stats.n - 1) * stats.stdev_us / f64::from(stats.n).sqrt()
    } else {
        f64::INFINITY
    };
    (stats.mean_us - half, stats.mean_us + half)
}

/// True when the candidate with these samples is raced out by `bound`.
pub fn raced_out(stats: &TimingStats, bound: Option<&RaceBound>, tp: &TimingPlan) -> bool {
    let Some(b) = bound else {
        return false;
    };
    if stats.n < min_samples(tp) {
        return false;
    }
    let (low, _) = interval(stats);
    low.is_finite() && low > b.threshold_us()
}

#[cfg(test)]
mod tests {
    use super::super::stats;
    use super::*;

    fn bound(upper: f64) -> RaceBound {
        RaceBound {
            incumbent_upper_us: upper,
            margin: 0.05,
        }
    }

    fn tp() -> TimingPlan {
        TimingPlan {
            min_samples: 5,
            ..TimingPlan::default()
        }
    }

    #[test]
    fn clearly_slower_is_raced_out() {
        // Mean 200, tight: far above 100 * 1.05.
        let s = stats(&[199.0, 200.0, 201.0, 200.0, 200.5]);
        assert!(raced_out(&s, Some(&bound(100.0)), &tp()));
    }

    #[test]
    fn nothing_to_race_or_too_few_samples() {
        let s = stats(&[200.0, 200.0, 200.0, 200.0, 200.0]);
        assert!(!raced_out(&s, None, &tp()));
        let few = stats(&[200.0, 200.0, 200.0, 200.0]);
        assert!(!raced_out(&few, Some(&bound(100.0)), &tp()));
    }

    #[test]
    fn a_possible_new_best_is_never_raced_out() {
        // As fast as the incumbent, or faster: never.
        let s = stats(&[99.0, 100.0, 101.0, 100.0, 100.0, 99.5]);
        assert!(!raced_out(&s, Some(&bound(101.0)), &tp()));
        let faster = stats(&[50.0, 51.0, 49.0, 50.0, 50.0]);
        assert!(!raced_out(&faster, Some(&bound(101.0)), &tp()));
    }

    #[test]
    fn the_margin_and_the_spread_protect_a_close_candidate() {
        // 4 % slower than the incumbent's bound: inside the 5 % margin.
        let s = stats(&[104.0, 104.0, 104.0, 104.0, 104.0]);
        assert!(!raced_out(&s, Some(&bound(100.0)), &tp()));
        // Mean 130 but so noisy that the interval reaches below 105: keep timing.
        let noisy = stats(&[60.0, 200.0, 70.0, 190.0, 130.0]);
        assert!(noisy.mean_us > 105.0);
        assert!(!raced_out(&noisy, Some(&bound(100.0)), &tp()));
        // The same spread with many more samples narrows the interval: raced out.
        let many: Vec<f64> = [60.0, 200.0, 70.0, 190.0, 130.0].repeat(40);
        assert!(raced_out(&stats(&many), Some(&bound(100.0)), &tp()));
    }

    #[test]
    fn interval_uses_students_t() {
        let s = stats(&[1.0, 2.0, 3.0]);
        let (lo, hi) = interval(&s);
        // mean 2, sd 1, n 3: half-width 4.303 / sqrt(3).
        assert!((hi - lo - 2.0 * 4.303 / 3f64.sqrt()).abs() < 1e-9);
        assert_eq!(min_samples(&TimingPlan::default()), 10);
        let one = stats(&[5.0]);
        assert!(interval(&one).0.is_infinite());
    }
}
