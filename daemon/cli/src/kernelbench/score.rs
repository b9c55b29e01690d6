//! A level's numbers as KernelBench computes them: correctness rate, `fast_p` and the
//! geometric-mean speedup, over one outcome per problem (pure; `kiln kernelbench run`
//! feeds it, once with KernelBench's notion of correct and once with kiln's).
//!
//! The arithmetic follows ScalingIntelligence/KernelBench at commit [`KERNELBENCH_COMMIT`]:
//! `src/kernelbench/score.py` (`fastp`, `geometric_mean_speed_ratio_correct_only`) and
//! `scripts/benchmark_eval_analysis.py` (which problems enter them). In words (written from
//! reading those files; none of their code is copied):
//!
//! - **correctness rate**: correct problems over every problem of the level; a problem
//!   without an answer counts as incorrect (the analysis' `patch`);
//! - a problem **enters** `fast_p` and the geometric mean only when the baseline has a
//!   time for it (the analysis skips one without, with a warning); an unanswered problem
//!   enters as incorrect (KernelBench's baseline file covers the whole level);
//! - **speedup** = baseline time / answer time;
//! - **`fast_p`** = correct problems whose speedup is strictly above `p`, over the
//!   problems that entered (a speedup of exactly `p` does not count);
//! - **geometric-mean speedup** over the correct problems that entered.
//!
//! Where KernelBench writes 0 for an empty set (nothing entered, nothing correct) this
//! module answers `None`, shown as `-`. A correct problem without a time (kiln's
//! `unmeasurable_time`) is in no `fast_p` numerator and not in the mean; it is counted in
//! [`Speed::correct_without_time`].
//!
//! Several samples per problem: KernelBench's analysis reads sample 0 only ([`Pick::First`]);
//! [`Pick::Best`] is "any sample correct" (pass@k with k = every sample) and the fastest
//! correct sample's time.

use serde::Serialize;

/// The KernelBench commit whose arithmetic this module follows.
pub const KERNELBENCH_COMMIT: &str = "423217d9fda91e0c2d67e4a43bf62f96f6d104f1";

/// The `fast_p` thresholds reported (KernelBench's analysis also prints 0.5 and 0.8).
pub const THRESHOLDS: [f64; 4] = [0.0, 1.0, 1.5, 2.0];

/// One problem of the level, as the arithmetic sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// Some answer to it was evaluated.
    pub answered: bool,
    /// Correct (under the view being computed).
    pub correct: bool,
    /// The answer's time, µs (absent when it was not timed).
    pub time_us: Option<f64>,
    /// The baseline's time for the problem, µs (absent when not measured).
    pub baseline_us: Option<f64>,
}

impl Outcome {
    /// A problem nobody answered: incorrect, and entered as KernelBench enters it.
    pub fn unanswered() -> Self {
        Outcome {
            answered: false,
            correct: false,
            time_us: None,
            baseline_us: None,
        }
    }

    /// Baseline time / answer time, when both are positive and finite.
    pub fn speedup(&self) -> Option<f64> {
        let ok = |x: f64| x.is_finite() && x > 0.0;
        match (self.baseline_us, self.time_us) {
            (Some(b), Some(t)) if ok(b) && ok(t) => Some(b / t),
            _ => None,
        }
    }

    /// Whether it enters `fast_p` and the mean: a baseline time, or no answer.
    fn entered(&self) -> bool {
        !self.answered || self.baseline_us.is_some()
    }
}

/// The correctness rate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Correctness {
    /// Problems of the level (the denominator).
    pub problems: usize,
    /// Correct problems.
    pub correct: usize,
    /// correct / problems (`None` for an empty level).
    pub rate: Option<f64>,
}

/// Correct problems over every problem given.
pub fn correctness(outcomes: &[Outcome]) -> Correctness {
    let correct = outcomes.iter().filter(|o| o.correct).count();
    Correctness {
        problems: outcomes.len(),
        correct,
        rate: ratio(correct, outcomes.len()),
    }
}

/// `fast_p` at one threshold.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FastP {
    /// The threshold.
    pub p: f64,
    /// Correct problems with a speedup strictly above `p`.
    pub count: usize,
    /// count / entered (`None` when no answered problem has a baseline time).
    pub value: Option<f64>,
}

/// Speed against one baseline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Speed {
    /// Problems that entered (a baseline time, or no answer): the denominator.
    pub entered: usize,
    /// Answered problems left out for want of a baseline time.
    pub missing_baseline: usize,
    /// `fast_p` at each threshold asked for.
    pub fast_p: Vec<FastP>,
    /// Geometric mean of the speedups of the correct problems that entered (`None` when
    /// there is none, or no baseline at all).
    pub geomean_speedup: Option<f64>,
    /// How many speedups the mean is over.
    pub geomean_of: usize,
    /// Correct problems that entered without a time (in no numerator, not in the mean).
    pub correct_without_time: usize,
}

/// `fast_p` at each of `thresholds` and the geometric-mean speedup.
pub fn speed(outcomes: &[Outcome], thresholds: &[f64]) -> Speed {
    let entered: Vec<&Outcome> = outcomes.iter().filter(|o| o.entered()).collect();
    let missing_baseline = outcomes.len() - entered.len();
    // Nothing to compare with: no answered problem has a baseline time.
    let any_baseline = entered.iter().any(|o| o.answered);
    let speedups: Vec<f64> = entered
        .iter()
        .filter(|o| o.correct)
        .filter_map(|o| o.speedup())
        .collect();
    let correct_without_time = entered
        .iter()
        .filter(|o| o.correct && o.speedup().is_none())
        .count();
    let fast_p = thresholds
        .iter()
        .map(|&p| {
            let count = speedups.iter().filter(|&&s| s > p).count();
            FastP {
                p,
                count,
                value: if any_baseline {
                    ratio(count, entered.len())
                } else {
                    None
                },
            }
        })
        .collect();
    let geomean_speedup = (any_baseline && !speedups.is_empty()).then(|| {
        let mean_log = speedups.iter().map(|s| s.ln()).sum::<f64>() / speedups.len() as f64;
        mean_log.exp()
    });
    Speed {
        entered: entered.len(),
        missing_baseline,
        fast_p,
        geomean_speedup,
        geomean_of: speedups.len(),
        correct_without_time,
    }
}

/// `a / b`, `None` when `b` is 0.
fn ratio(a: usize, b: usize) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

/// One evaluated answer (sample) of a problem.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Its sample number (`level_N_problem_M_sample_K`), `None` for a file named after the
    /// problem (read as sample 0).
    pub sample: Option<u64>,
    /// Its file name (orders samples of the same number).
    pub file: String,
    /// Correct (under the view being computed).
    pub correct: bool,
    /// Its time, µs.
    pub time_us: Option<f64>,
}

/// Which sample of a problem stands for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pick {
    /// The lowest sample number (sample 0, as KernelBench's analysis reads), then the
    /// first file name.
    First,
    /// Correct when any sample is; the time of the fastest correct sample.
    Best,
}

/// The problem's (correct, time) under `pick`; `None` when it has no sample.
pub fn pick(samples: &[Sample], pick: Pick) -> Option<(bool, Option<f64>)> {
    match pick {
        Pick::First => samples
            .iter()
            .min_by(|a, b| (a.sample.unwrap_or(0), &a.file).cmp(&(b.sample.unwrap_or(0), &b.file)))
            .map(|s| (s.correct, s.time_us)),
        Pick::Best => {
            if samples.is_empty() {
                return None;
            }
            let correct: Vec<&Sample> = samples.iter().filter(|s| s.correct).collect();
            let fastest = correct
                .iter()
                .filter_map(|s| s.time_us)
                .filter(|t| t.is_finite() && *t > 0.0)
                .min_by(f64::total_cmp);
            Some((!correct.is_empty(), fastest))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    fn answered(correct: bool, time_us: f64, baseline_us: Option<f64>) -> Outcome {
        Outcome {
            answered: true,
            correct,
            time_us: Some(time_us),
            baseline_us,
        }
    }

    fn values(s: &Speed) -> Vec<Option<f64>> {
        s.fast_p.iter().map(|f| f.value).collect()
    }

    /// Four problems by hand: speedups 4, 1.25 and 0.5 for the correct ones, one wrong
    /// (fast, but wrong counts nowhere), one unanswered.
    #[test]
    fn a_hand_computed_level() {
        let level = [
            answered(true, 25.0, Some(100.0)),  // 4x
            answered(true, 80.0, Some(100.0)),  // 1.25x
            answered(true, 200.0, Some(100.0)), // 0.5x
            answered(false, 10.0, Some(100.0)), // 10x, but wrong
            Outcome::unanswered(),
        ];
        let c = correctness(&level);
        assert_eq!((c.problems, c.correct), (5, 3));
        assert!(close(c.rate, 0.6));
        let s = speed(&level, &THRESHOLDS);
        assert_eq!((s.entered, s.missing_baseline), (5, 0));
        // fast_0 = 3/5, fast_1 = 2/5 (4 and 1.25), fast_1.5 = 1/5, fast_2 = 1/5.
        let v = values(&s);
        assert!(close(v[0], 0.6) && close(v[1], 0.4), "{v:?}");
        assert!(close(v[2], 0.2) && close(v[3], 0.2), "{v:?}");
        // (4 * 1.25 * 0.5)^(1/3) = 2.5^(1/3).
        assert!(close(s.geomean_speedup, 2.5f64.powf(1.0 / 3.0)), "{s:?}");
        assert_eq!(s.geomean_of, 3);
    }

    #[test]
    fn no_correct_answer_gives_zero_rates_and_no_mean() {
        let level = [
            answered(false, 1.0, Some(10.0)),
            answered(false, 1.0, Some(10.0)),
        ];
        let c = correctness(&level);
        assert_eq!(c.correct, 0);
        assert!(close(c.rate, 0.0));
        let s = speed(&level, &THRESHOLDS);
        assert!(values(&s).iter().all(|v| close(*v, 0.0)), "{s:?}");
        assert_eq!((s.geomean_speedup, s.geomean_of), (None, 0));
        // An empty level has no rate at all.
        assert_eq!(correctness(&[]).rate, None);
    }

    /// An answered problem without a baseline time leaves fast_p's denominator and the
    /// mean (KernelBench skips it); the correctness rate still counts it.
    #[test]
    fn a_missing_baseline_leaves_the_denominator() {
        let level = [
            answered(true, 50.0, Some(100.0)), // 2x
            answered(true, 10.0, None),        // no baseline
            answered(false, 10.0, Some(100.0)),
        ];
        assert!(close(correctness(&level).rate, 2.0 / 3.0));
        let s = speed(&level, &THRESHOLDS);
        assert_eq!((s.entered, s.missing_baseline), (2, 1));
        let v = values(&s);
        assert!(close(v[0], 0.5) && close(v[1], 0.5), "{v:?}");
        assert!(close(s.geomean_speedup, 2.0));
        // No baseline at all (the host backend): nothing to say, rather than 0.
        let none = [answered(true, 5.0, None), Outcome::unanswered()];
        let s = speed(&none, &THRESHOLDS);
        assert!(values(&s).iter().all(Option::is_none), "{s:?}");
        assert_eq!((s.entered, s.missing_baseline), (1, 1));
        assert_eq!(s.geomean_speedup, None);
    }

    /// fast_p counts speedups strictly above p: exactly 1x is not fast_1, exactly 2x not
    /// fast_2 (and exactly 0 cannot happen: a time is positive).
    #[test]
    fn a_tie_at_exactly_p_does_not_count() {
        let level = [
            answered(true, 100.0, Some(100.0)), // exactly 1x
            answered(true, 50.0, Some(100.0)),  // exactly 2x
            answered(true, 40.0, Some(60.0)),   // exactly 1.5x
        ];
        let s = speed(&level, &THRESHOLDS);
        let counts: Vec<usize> = s.fast_p.iter().map(|f| f.count).collect();
        assert_eq!(counts, [3, 2, 1, 0], "{s:?}");
        assert!(close(s.geomean_speedup, 3.0f64.powf(1.0 / 3.0)));
    }

    /// A correct answer without a time (unmeasurable) is correct, in no fast_p numerator
    /// and not in the mean.
    #[test]
    fn a_correct_answer_without_a_time() {
        let level = [
            Outcome {
                answered: true,
                correct: true,
                time_us: None,
                baseline_us: Some(10.0),
            },
            answered(true, 5.0, Some(10.0)),
        ];
        assert_eq!(correctness(&level).correct, 2);
        let s = speed(&level, &THRESHOLDS);
        assert_eq!((s.correct_without_time, s.geomean_of), (1, 1));
        assert!(close(s.fast_p[0].value, 0.5));
        assert!(close(s.geomean_speedup, 2.0));
    }

    fn sample(k: Option<u64>, file: &str, correct: bool, t: Option<f64>) -> Sample {
        Sample {
            sample: k,
            file: file.into(),
            correct,
            time_us: t,
        }
    }

    /// Three samples of one problem: the first (sample 0) is wrong, samples 1 and 2 are
    /// correct at 40 and 20 µs.
    #[test]
    fn several_samples_per_problem() {
        let s = [
            sample(
                Some(2),
                "level_1_problem_3_sample_2_kernel.py",
                true,
                Some(20.0),
            ),
            sample(
                Some(0),
                "level_1_problem_3_sample_0_kernel.py",
                false,
                Some(5.0),
            ),
            sample(
                Some(1),
                "level_1_problem_3_sample_1_kernel.py",
                true,
                Some(40.0),
            ),
        ];
        assert_eq!(pick(&s, Pick::First), Some((false, Some(5.0))));
        assert_eq!(pick(&s, Pick::Best), Some((true, Some(20.0))));
        assert_eq!(pick(&[], Pick::Best), None);
        assert_eq!(pick(&[], Pick::First), None);
        // A file named after the problem is sample 0; ties go by file name.
        let plain = [
            sample(None, "3_B.py", true, Some(9.0)),
            sample(Some(0), "level_1_problem_3_sample_0_kernel.py", false, None),
        ];
        assert_eq!(pick(&plain, Pick::First), Some((true, Some(9.0))));
        // Nothing correct: incorrect, no time, whatever the wrong samples' times.
        let wrong = [sample(Some(0), "a", false, Some(1.0))];
        assert_eq!(pick(&wrong, Pick::Best), Some((false, None)));

        // Into the level: with a baseline of 100 µs, the first sample gives nothing and the
        // best gives 5x.
        let level = |p: Pick| {
            let (correct, time_us) = pick(&s, p).expect("samples");
            [Outcome {
                answered: true,
                correct,
                time_us,
                baseline_us: Some(100.0),
            }]
        };
        let first = speed(&level(Pick::First), &THRESHOLDS);
        assert_eq!(first.fast_p[0].count, 0);
        let best = speed(&level(Pick::Best), &THRESHOLDS);
        assert!(close(best.fast_p[3].value, 1.0));
        assert!(close(best.geomean_speedup, 5.0));
    }

    /// The cases of KernelBench's own unit test of score.py (at the same commit:
    /// `src/kernelbench/unit_tests/test_score.py`): is_correct [1,0,1,1,0], baseline
    /// [0.1, 0.15, 0.2, 0.05, 0.3], actual [0.2, 0.15, 0.3, 0.01, 0.2] give a geometric
    /// mean of 1.185631101 and fast_1 of 0.2.
    #[test]
    fn agrees_with_kernelbenchs_own_test_values() {
        let correct = [true, false, true, true, false];
        let baseline = [0.1, 0.15, 0.2, 0.05, 0.3];
        let actual = [0.2, 0.15, 0.3, 0.01, 0.2];
        let level: Vec<Outcome> = (0..5)
            .map(|i| answered(correct[i], actual[i], Some(baseline[i])))
            .collect();
        let s = speed(&level, &[1.0]);
        assert!(
            (s.geomean_speedup.expect("mean") - 1.185631101).abs() < 1e-7,
            "{s:?}"
        );
        assert!(close(s.fast_p[0].value, 0.2));
    }
}
