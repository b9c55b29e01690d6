//! The run's document: every answer's record, every problem of the level, the files
//! skipped, and the level's numbers under two views kept apart — KernelBench's (correct =
//! every normal trial passed) and kiln's (`ok` only) — each for the first sample of every
//! problem (what KernelBench's analysis reads) and, when some problem has several samples,
//! for the best of them. `-o json` prints it; the table and the HTML page render it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use super::level::Problem;
use super::records::{Answer, Baselines, Status};
use super::score::{self, Correctness, Outcome, Pick, Sample, Speed, THRESHOLDS};

/// Where the arithmetic comes from.
#[derive(Debug, Clone, Serialize)]
pub struct Provenance {
    /// KernelBench's repository.
    pub repository: &'static str,
    /// The commit whose arithmetic is followed.
    pub commit: &'static str,
    /// The files it is in.
    pub files: [&'static str; 2],
}

/// The provenance of [`score`].
pub const PROVENANCE: Provenance = Provenance {
    repository: "https://github.com/ScalingIntelligence/KernelBench",
    commit: score::KERNELBENCH_COMMIT,
    files: [
        "src/kernelbench/score.py",
        "scripts/benchmark_eval_analysis.py",
    ],
};

/// A file of the answers folder that answers nothing this run can evaluate.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    /// The file name.
    pub file: String,
    /// Why.
    pub reason: String,
}

/// One problem of the level in the document.
#[derive(Debug, Clone, Serialize)]
pub struct ProblemLine {
    /// The level's problem.
    #[serde(flatten)]
    pub problem: Problem,
    /// Answers evaluated, refused or failed for it.
    pub answers: usize,
    /// Of them, KernelBench-correct.
    pub kernelbench_correct: usize,
    /// Of them, `ok`.
    pub kiln_correct: usize,
    /// Its torch baselines (for answered problems).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baselines: Option<Baselines>,
}

/// The numbers of one view for one way of picking a problem's sample.
#[derive(Debug, Clone, Serialize)]
pub struct Numbers {
    /// Correct problems over the registered problems of the level.
    pub correctness: Correctness,
    /// `fast_p` and the geometric mean against torch eager, timed through the hosted path
    /// like the answers (the same harness).
    pub vs_eager: Speed,
    /// ... and against torch.compile, likewise.
    pub vs_compile: Speed,
    /// The same against torch eager timed in process (another harness: the answers' times
    /// hold the hosted path's cost and these baselines do not; beside, for comparison).
    pub vs_eager_in_process: Speed,
    /// ... and against torch.compile timed in process.
    pub vs_compile_in_process: Speed,
}

/// One view of correctness.
#[derive(Debug, Clone, Serialize)]
pub struct View {
    /// What counts as correct in it.
    pub correct_means: &'static str,
    /// The first sample of each problem (sample 0, as KernelBench's analysis reads).
    pub first_sample: Numbers,
    /// The best sample of each problem (any correct; the fastest correct time), when some
    /// problem has several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_of_samples: Option<Numbers>,
}

/// How many of what.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counts {
    /// Problem files of the level.
    pub level_problems: usize,
    /// Of them, registered (every rate's denominator).
    pub registered: usize,
    /// Registered problems with at least one answer.
    pub answered_problems: usize,
    /// Answer files mapped to a registered problem.
    pub answers: usize,
    /// Of them, with a verdict.
    pub evaluated: usize,
    /// Of them, refused before evaluation (counted incorrect).
    pub refused: usize,
    /// Of them, kiln failed on (counted incorrect).
    pub failed: usize,
    /// Answers kilnd answered from its store (submitted by an earlier run).
    pub from_store: usize,
    /// `.py` files skipped.
    pub skipped: usize,
}

/// The level's numbers.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// How many of what.
    pub counts: Counts,
    /// KernelBench's notion of correct.
    pub kernelbench: View,
    /// kiln's: `ok` only.
    pub kiln: View,
    /// What a reader must know to read the numbers.
    pub notes: Vec<String>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The KernelBench level.
    pub level: u32,
    /// The level's folder.
    pub problems_dir: PathBuf,
    /// The answers' folder.
    pub answers_dir: PathBuf,
    /// Where the imported problems are kept.
    pub state_dir: PathBuf,
    /// `modelnew` (the GPU) or `modelnew-cpu`.
    pub language: String,
    /// The problems' tolerance.
    pub tolerance: kiln_types::Tolerance,
    /// Where the arithmetic comes from.
    pub arithmetic: Provenance,
    /// One record per answer, by problem and file.
    pub answers: Vec<Answer>,
    /// Every problem of the level.
    pub problems: Vec<ProblemLine>,
    /// Files that answer nothing evaluable here.
    pub skipped: Vec<Skipped>,
    /// The level's numbers.
    pub summary: Summary,
    /// Seconds the run took.
    pub wall_s: f64,
}

/// KernelBench's notion of correct, in words.
pub const KERNELBENCH_CORRECT: &str = "every normal correctness trial passed (correct on \
    KernelBench's own input distribution): ok, no_own_kernels, implausible_time, \
    unmeasurable_time, and a wrong_answer or nondeterministic decided by kiln's shifted \
    trial, range trial or recheck of a timed run";

/// kiln's notion of correct, in words.
pub const KILN_CORRECT: &str = "ok only: every trial of kiln's contract passed, the time is \
    plausible, and (hosted on the GPU) the answer ran kernels of its own";

/// The level's numbers from its problems, the answers and each answered problem's
/// baselines (by kiln problem name).
pub fn summarize(
    problems: &[Problem],
    answers: &[Answer],
    baselines: &BTreeMap<String, Baselines>,
    skipped: usize,
) -> Summary {
    let registered: Vec<&Problem> = problems
        .iter()
        .filter(|p| p.not_registered.is_none())
        .collect();
    let several = registered
        .iter()
        .any(|p| answers.iter().filter(|a| a.problem_id == p.id).count() > 1);
    let view = |correct: fn(&Answer) -> bool, correct_means| {
        let numbers = |how: Pick| {
            let mut eager = Vec::new();
            let mut compile = Vec::new();
            let mut eager_ip = Vec::new();
            let mut compile_ip = Vec::new();
            for p in &registered {
                let samples: Vec<Sample> = answers
                    .iter()
                    .filter(|a| a.problem_id == p.id)
                    .map(|a| Sample {
                        sample: a.sample,
                        file: a.file.clone(),
                        correct: correct(a),
                        time_us: a.median_us,
                    })
                    .collect();
                let b = p
                    .name
                    .as_ref()
                    .and_then(|n| baselines.get(n))
                    .cloned()
                    .unwrap_or_default();
                let picked = score::pick(&samples, how);
                let o = |baseline_us| match picked {
                    None => Outcome::unanswered(),
                    Some((correct, time_us)) => Outcome {
                        answered: true,
                        correct,
                        time_us,
                        baseline_us,
                    },
                };
                eager.push(o(b.eager_us));
                compile.push(o(b.compile_us));
                eager_ip.push(o(b.eager_in_process_us));
                compile_ip.push(o(b.compile_in_process_us));
            }
            Numbers {
                correctness: score::correctness(&eager),
                vs_eager: score::speed(&eager, &THRESHOLDS),
                vs_compile: score::speed(&compile, &THRESHOLDS),
                vs_eager_in_process: score::speed(&eager_ip, &THRESHOLDS),
                vs_compile_in_process: score::speed(&compile_ip, &THRESHOLDS),
            }
        };
        View {
            correct_means,
            first_sample: numbers(Pick::First),
            best_of_samples: several.then(|| numbers(Pick::Best)),
        }
    };
    let count = |s: Status| answers.iter().filter(|a| a.status == s).count();
    let counts = Counts {
        level_problems: problems.len(),
        registered: registered.len(),
        answered_problems: registered
            .iter()
            .filter(|p| answers.iter().any(|a| a.problem_id == p.id))
            .count(),
        answers: answers.len(),
        evaluated: count(Status::Evaluated),
        refused: count(Status::Refused),
        failed: count(Status::Failed),
        from_store: answers.iter().filter(|a| a.from_store).count(),
        skipped,
    };
    let mut notes = vec![
        format!(
            "arithmetic as KernelBench's {} and {} at commit {}: every rate is over the {} \
             registered problems of the level (an unanswered one counts as incorrect); fast_p \
             counts correct problems with a speedup strictly above p, over the problems with \
             a baseline time; the geometric mean is over the correct ones; speedup = baseline \
             median / answer median",
            PROVENANCE.files[0],
            PROVENANCE.files[1],
            &score::KERNELBENCH_COMMIT[..7],
            registered.len()
        ),
        "no_own_kernels (correct, but only library kernels ran: the reference renamed) counts \
         as correct in KernelBench's numbers, as KernelBench would count it, and not in kiln's"
            .into(),
    ];
    if several {
        notes.push(
            "several samples per problem: \"sample 0\" takes each problem's lowest sample \
             (KernelBench's analysis reads sample 0); \"best of samples\" counts a problem \
             correct when any of its samples is, at its fastest correct time"
                .into(),
        );
    }
    let untimed = answers
        .iter()
        .filter(|a| a.kernelbench_correct && a.median_us.is_none())
        .count();
    if untimed > 0 {
        notes.push(format!(
            "{untimed} KernelBench-correct answer(s) have no time (stopped by one of kiln's \
             extra trials before timing, or unmeasurable_time): in the correctness rate, in no \
             fast_p numerator and not in the geometric mean"
        ));
    }
    if counts.failed > 0 {
        notes.push(format!(
            "{} answer(s) got no verdict for kiln's own reasons (listed below); they count as \
             incorrect here, so the rates may understate",
            counts.failed
        ));
    }
    let not_registered = problems.len() - registered.len();
    if not_registered > 0 {
        notes.push(format!(
            "{not_registered} problem(s) of the level are not registered (listed below): they \
             are outside every rate, not failures of their answers"
        ));
    }
    Summary {
        counts,
        kernelbench: view(|a| a.kernelbench_correct, KERNELBENCH_CORRECT),
        kiln: view(|a| a.kiln_correct, KILN_CORRECT),
        notes,
    }
}

/// One line per problem: its answers and what is correct among them.
pub fn problem_lines(
    problems: &[Problem],
    answers: &[Answer],
    baselines: &BTreeMap<String, Baselines>,
) -> Vec<ProblemLine> {
    problems
        .iter()
        .map(|p| {
            let mine: Vec<&Answer> = answers.iter().filter(|a| a.problem_id == p.id).collect();
            ProblemLine {
                problem: p.clone(),
                answers: mine.len(),
                kernelbench_correct: mine.iter().filter(|a| a.kernelbench_correct).count(),
                kiln_correct: mine.iter().filter(|a| a.kiln_correct).count(),
                baselines: p.name.as_ref().and_then(|n| baselines.get(n)).cloned(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernelbench::records::Identity;

    fn problem(id: u64, name: &str) -> Problem {
        Problem {
            id,
            file: format!("{id}_P.py"),
            name: Some(name.into()),
            dir: None,
            not_registered: None,
        }
    }

    fn answer(id: u64, sample: u64, verdict: &str, kb: bool, t: f64) -> Answer {
        let who = Identity {
            file: format!("level_1_problem_{id}_sample_{sample}_kernel.py"),
            problem_id: id,
            problem: format!("p{id}"),
            sample: Some(sample),
        };
        let record = serde_json::json!({"id": "x", "evaluation": {
            "verdict": verdict, "trust": "hosted", "timing": {"median_us": t},
            "evidence": {"trials_run": 2, "trials_passed": if kb { 2 } else { 0 }}}});
        let a = Answer::from_record(&who, &record, false);
        assert_eq!(a.kernelbench_correct, kb, "{verdict}");
        a
    }

    /// Three registered problems and one not registered; problem 1 has two samples (the
    /// first wrong), problem 2 a no_own_kernels answer, problem 3 none.
    #[test]
    fn the_two_views_and_the_two_picks() {
        let mut gone = problem(4, "p4");
        gone.not_registered = Some("kilnd refused it (too_large): …".into());
        let problems = [problem(1, "p1"), problem(2, "p2"), problem(3, "p3"), gone];
        let answers = [
            answer(1, 0, "wrong_answer", false, 1.0),
            answer(1, 1, "ok", true, 50.0),
            answer(2, 0, "no_own_kernels", true, 100.0),
        ];
        let mut baselines = BTreeMap::new();
        for n in ["p1", "p2"] {
            baselines.insert(
                n.to_string(),
                Baselines {
                    eager_us: Some(100.0),
                    compile_us: None,
                    eager_in_process_us: Some(50.0),
                    compile_in_process_us: None,
                    note: Some("torch-compile-fp32 failed".into()),
                },
            );
        }
        let s = summarize(&problems, &answers, &baselines, 2);
        assert_eq!(
            (
                s.counts.registered,
                s.counts.answered_problems,
                s.counts.answers
            ),
            (3, 2, 3)
        );
        // KernelBench, sample 0: only problem 2 (no_own_kernels, 1x) of 3.
        let kb = &s.kernelbench.first_sample;
        assert_eq!(kb.correctness.correct, 1);
        assert_eq!(kb.vs_eager.fast_p[0].count, 1);
        assert_eq!(kb.vs_eager.fast_p[1].count, 0, "exactly 1x is not fast_1");
        assert_eq!(kb.vs_eager.entered, 3);
        // No torch.compile time anywhere: nothing to say.
        assert!(kb.vs_compile.fast_p.iter().all(|f| f.value.is_none()));
        // Best of samples: problem 1's sample 1 (2x) joins.
        let best = s.kernelbench.best_of_samples.as_ref().expect("several");
        assert_eq!(best.correctness.correct, 2);
        assert_eq!(best.vs_eager.fast_p[1].count, 1);
        // kiln: no_own_kernels is not correct; sample 0 of problem 1 is wrong.
        assert_eq!(s.kiln.first_sample.correctness.correct, 0);
        let kiln_best = s.kiln.best_of_samples.as_ref().expect("several");
        assert_eq!(kiln_best.correctness.correct, 1);
        assert!(s.notes.iter().any(|n| n.contains("not registered")));
        assert!(s.notes.iter().any(|n| n.contains("no_own_kernels")));
        let lines = problem_lines(&problems, &answers, &baselines);
        assert_eq!(
            (
                lines[0].answers,
                lines[0].kernelbench_correct,
                lines[0].kiln_correct
            ),
            (2, 1, 1)
        );
        let json = serde_json::to_value(&lines[3]).expect("json");
        assert_eq!(json["id"], 4, "{json}");
        assert!(json["not_registered"].is_string(), "{json}");
    }
}
