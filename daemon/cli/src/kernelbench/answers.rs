//! A KernelBench level folder and a folder of answers: the level's problem files
//! (`M_Name.py`, numbered as KernelBench numbers them) and which problem each answer file
//! answers. An answer is named as KernelBench names its runs
//! (`level_N_problem_M_sample_K_kernel.py`, `scripts/generate_samples.py`) or after its
//! problem's file (`19_ReLU.py`, or that name with a suffix: `19_ReLU_v2.py`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// One problem file of the level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LevelProblem {
    /// Its number, `M` of `M_Name.py`.
    pub id: u64,
    /// The file.
    pub file: PathBuf,
    /// Its stem, `M_Name`.
    pub stem: String,
}

/// The problem files of a level folder (`M_Name.py`), by number. Two files of one number
/// are refused: an answer could not say which it answers.
pub fn level_problems(dir: &Path) -> Result<Vec<LevelProblem>> {
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read the level folder {}", dir.display()))?;
    let mut out: Vec<LevelProblem> = Vec::new();
    for e in entries {
        let path = e
            .with_context(|| format!("cannot read {}", dir.display()))?
            .path();
        if !path.is_file() || path.extension().is_none_or(|x| x != "py") {
            continue;
        }
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let Some(id) = leading_number(stem) else {
            continue;
        };
        if let Some(other) = out.iter().find(|p| p.id == id) {
            anyhow::bail!(
                "{} and {} are both problem {id} of {}: a level numbers its problems once",
                other.file.display(),
                path.display(),
                dir.display()
            );
        }
        out.push(LevelProblem {
            id,
            stem: stem.to_string(),
            file: path,
        });
    }
    out.sort_by_key(|p| p.id);
    anyhow::ensure!(
        !out.is_empty(),
        "{} holds no KernelBench problem files (M_Name.py, as in KernelBench's levelN folders)",
        dir.display()
    );
    Ok(out)
}

/// The `.py` files directly in `dir`, by name.
pub fn answer_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read the answers folder {}", dir.display()))?;
    let mut out = Vec::new();
    for e in entries {
        let path = e
            .with_context(|| format!("cannot read {}", dir.display()))?
            .path();
        if path.is_file() && path.extension().is_some_and(|x| x == "py") {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// What an answer file answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapping {
    /// Problem `id` of the level; `sample` from a KernelBench run name.
    Problem {
        /// The problem's number.
        id: u64,
        /// `K` of `sample_K`; `None` for a file named after the problem.
        sample: Option<u64>,
    },
    /// Nothing: why.
    Skipped(String),
}

/// Which problem of `problems` (level `level`) the answer file `name` answers.
pub fn map_answer(name: &str, level: u32, problems: &[LevelProblem]) -> Mapping {
    let stem = name.strip_suffix(".py").unwrap_or(name);
    let missing = |id: u64| Mapping::Skipped(format!("level {level} has no problem {id}"));
    if let Some(run) = stem.strip_prefix("level_") {
        let Some((n, m, k)) = run_name(run) else {
            return Mapping::Skipped(
                "starts like a KernelBench run name but is not level_N_problem_M_sample_K…".into(),
            );
        };
        if n != u64::from(level) {
            return Mapping::Skipped(format!("answers level {n}, and this run is level {level}"));
        }
        return match problems.iter().any(|p| p.id == m) {
            true => Mapping::Problem {
                id: m,
                sample: Some(k),
            },
            false => missing(m),
        };
    }
    let Some(id) = leading_number(stem) else {
        return Mapping::Skipped(
            "named neither as KernelBench names its runs (level_N_problem_M_sample_K…) nor \
             after a problem file (M_Name.py)"
                .into(),
        );
    };
    let Some(p) = problems.iter().find(|p| p.id == id) else {
        return missing(id);
    };
    let (lower, want) = (stem.to_lowercase(), p.stem.to_lowercase());
    let named_after = lower.strip_prefix(&want).is_some_and(|rest| {
        rest.is_empty() || want.ends_with(separator) || rest.starts_with(separator)
    });
    if named_after {
        Mapping::Problem { id, sample: None }
    } else {
        Mapping::Skipped(format!(
            "starts with {id}_ but is not named after the level's problem {id}, {}.py",
            p.stem
        ))
    }
}

fn separator(c: char) -> bool {
    matches!(c, '_' | '-' | '.' | ' ')
}

/// `M` of a stem `M_…`.
fn leading_number(stem: &str) -> Option<u64> {
    let (n, rest) = stem.split_once('_')?;
    if rest.is_empty() || n.is_empty() || !n.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

/// (N, M, K) of `N_problem_M_sample_K` followed by nothing or `_…`.
fn run_name(run: &str) -> Option<(u64, u64, u64)> {
    let number = |s: &str| -> Option<(u64, String)> {
        let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
        let n = digits.parse().ok()?;
        Some((n, s[digits.len()..].to_string()))
    };
    let (n, rest) = number(run)?;
    let (m, rest) = number(rest.strip_prefix("_problem_")?)?;
    let (k, rest) = number(rest.strip_prefix("_sample_")?)?;
    (rest.is_empty() || rest.starts_with('_')).then_some((n, m, k))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level() -> Vec<LevelProblem> {
        [
            (1, "1_Square_matrix_multiplication_"),
            (19, "19_ReLU"),
            (23, "23_Softmax"),
        ]
        .into_iter()
        .map(|(id, stem)| LevelProblem {
            id,
            file: PathBuf::from(format!("{stem}.py")),
            stem: stem.into(),
        })
        .collect()
    }

    fn problem(id: u64, sample: Option<u64>) -> Mapping {
        Mapping::Problem { id, sample }
    }

    #[test]
    fn kernelbench_run_names_map_to_their_problem_and_sample() {
        let l = level();
        let m = |n: &str| map_answer(n, 1, &l);
        assert_eq!(
            m("level_1_problem_19_sample_0_kernel.py"),
            problem(19, Some(0))
        );
        assert_eq!(m("level_1_problem_23_sample_3.py"), problem(23, Some(3)));
        let skipped = |n: &str| match m(n) {
            Mapping::Skipped(why) => why,
            other => panic!("{n}: {other:?}"),
        };
        assert!(skipped("level_2_problem_19_sample_0_kernel.py").contains("answers level 2"));
        assert!(skipped("level_1_problem_99_sample_0_kernel.py").contains("no problem 99"));
        assert!(skipped("level_1_problem_19_kernel.py").contains("level_N_problem_M_sample_K"));
        assert!(skipped("level_1_problem_19_sample_0x.py").contains("level_N_problem_M"));
    }

    #[test]
    fn problem_file_names_map_with_or_without_a_suffix() {
        let l = level();
        let m = |n: &str| map_answer(n, 1, &l);
        assert_eq!(m("19_ReLU.py"), problem(19, None));
        assert_eq!(m("19_relu_v2.py"), problem(19, None));
        assert_eq!(m("19_ReLU.fused.py"), problem(19, None));
        // A stem that ends in `_` takes a suffix straight after it.
        assert_eq!(m("1_Square_matrix_multiplication_v2.py"), problem(1, None));
        for (name, why) in [
            (
                "19_ReLUx.py",
                "not named after the level's problem 19, 19_ReLU.py",
            ),
            ("19_GELU.py", "not named after"),
            ("7_Conv.py", "no problem 7"),
            ("model_new.py", "named neither"),
            ("19.py", "named neither"),
        ] {
            match m(name) {
                Mapping::Skipped(s) => assert!(s.contains(why), "{name}: {s}"),
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_level_folder_lists_its_numbered_files() {
        let dir = tempfile::tempdir().expect("tmp");
        for f in ["10_B.py", "2_A.py", "notes.py", "README.md"] {
            std::fs::write(dir.path().join(f), "").expect("write");
        }
        let got = level_problems(dir.path()).expect("level");
        let ids: Vec<(u64, &str)> = got.iter().map(|p| (p.id, p.stem.as_str())).collect();
        assert_eq!(ids, [(2, "2_A"), (10, "10_B")]);
        std::fs::write(dir.path().join("2_Again.py"), "").expect("write");
        let err = level_problems(dir.path()).expect_err("two 2s").to_string();
        assert!(err.contains("both problem 2"), "{err}");
        let empty = tempfile::tempdir().expect("tmp");
        let err = level_problems(empty.path()).expect_err("empty").to_string();
        assert!(err.contains("no KernelBench problem files"), "{err}");
        let err = level_problems(&empty.path().join("nope"))
            .expect_err("missing")
            .to_string();
        assert!(err.contains("cannot read the level folder"), "{err}");
    }
}
