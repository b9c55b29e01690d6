//! `kiln problems check [DIR...]`: the problem suite's static checks, without a daemon, a
//! compiler or a GPU. Each DIR is a problem folder (it has a problem.toml) or a folder of
//! them (not searched deeper; folders without a problem.toml are skipped with a note).
//! Prints a line per problem (`ok`, or each finding with the problem and the file) and
//! `N passed, M failed`; exits 1 when any problem fails or none is found, 2 when a DIR
//! cannot be read.
//!
//! [`problem::check`] runs the checks; the rules are kiln's own wherever kiln has them
//! (`ProblemSpec::load_dir`, `Candidate::validate`, the SDK's knob grammar, kiln-gpu's
//! source screens and launch validator), and otherwise in the modules here.

mod cuda_source;
mod knobs;
mod launches;
mod problem;
mod python;
mod signature;
mod triton;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use serde_json::json;

use crate::Output;
use crate::output::print_json;

/// Something wrong at a line (if known) of a file the caller names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    /// 1-based line.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl Issue {
    /// An issue of the whole file.
    pub fn new(message: String) -> Issue {
        Issue {
            line: None,
            message,
        }
    }

    /// An issue at `line`.
    pub fn at(line: usize, message: String) -> Issue {
        Issue {
            line: Some(line),
            message,
        }
    }

    /// From a message that starts `line N: ` (kiln-gpu's screens, the SDK's knob parser).
    pub fn from_prefixed(message: &str) -> Issue {
        let parsed = message.strip_prefix("line ").and_then(|rest| {
            let (n, text) = rest.split_once(": ")?;
            Some(Issue::at(n.parse().ok()?, text.to_string()))
        });
        parsed.unwrap_or_else(|| Issue::new(message.to_string()))
    }
}

/// The problem folders named by the roots, in order, and the folders skipped.
#[derive(Debug, Default)]
struct Found {
    problems: Vec<PathBuf>,
    skipped: Vec<PathBuf>,
}

fn has_problem_toml(dir: &Path) -> bool {
    // Any entry of that name: a problem.toml that is not a regular file is load_dir's to
    // refuse, by name.
    std::fs::symlink_metadata(dir.join("problem.toml")).is_ok()
}

/// The problem folders of each root; `Err` for a root that is not a readable folder.
fn discover(roots: &[PathBuf]) -> Result<Found, String> {
    let mut found = Found::default();
    for root in roots {
        if has_problem_toml(root) {
            found.problems.push(root.clone());
            continue;
        }
        let shown = root.display();
        match std::fs::metadata(root) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(format!("{shown} does not exist"));
            }
            Err(e) => return Err(format!("cannot read {shown}: {e}")),
            Ok(m) if !m.is_dir() => return Err(format!("{shown} is not a folder")),
            Ok(_) => {}
        }
        let entries = std::fs::read_dir(root).map_err(|e| format!("cannot read {shown}: {e}"))?;
        let mut dirs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir())
            .collect();
        dirs.sort();
        for d in dirs {
            let hidden = d
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'));
            if has_problem_toml(&d) {
                found.problems.push(d);
            } else if !hidden {
                found.skipped.push(d);
            }
        }
    }
    Ok(found)
}

/// The name a problem is listed under: its folder's.
fn listed_name(dir: &Path) -> String {
    problem::folder_name(dir).unwrap_or_else(|| dir.display().to_string())
}

/// Runs `kiln problems check`.
pub fn run(out: Output, dirs: &[PathBuf]) -> Result<ExitCode> {
    let roots = if dirs.is_empty() {
        vec![PathBuf::from("problems")]
    } else {
        dirs.to_vec()
    };
    let found = match discover(&roots) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("kiln: problems check: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    if out == Output::Text {
        for d in &found.skipped {
            println!("note: {} has no problem.toml (skipped)", d.display());
        }
    }
    let (mut passed, mut failed, mut results) = (0usize, 0usize, Vec::new());
    for dir in &found.problems {
        let name = listed_name(dir);
        let findings = problem::check(dir);
        if findings.is_empty() {
            passed += 1;
        } else {
            failed += 1;
        }
        if out == Output::Text {
            if findings.is_empty() {
                println!("ok   {name}");
            }
            for f in &findings {
                println!("FAIL {name}: {f}");
            }
        }
        results.push(json!({
            "name": name,
            "dir": dir.display().to_string(),
            "ok": findings.is_empty(),
            "errors": findings,
        }));
    }
    match out {
        Output::Text => println!("{passed} passed, {failed} failed"),
        Output::Json => print_json(&json!({
            "problems": results,
            "skipped": found.skipped.iter().map(|d| d.display().to_string()).collect::<Vec<_>>(),
            "passed": passed,
            "failed": failed,
        })),
    }
    if found.problems.is_empty() {
        eprintln!(
            "kiln: problems check: no problem folders (with a problem.toml) in {}",
            roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixed_messages_give_their_line() {
        assert_eq!(
            Issue::from_prefixed("line 12: knob X is declared twice"),
            Issue::at(12, "knob X is declared twice".into())
        );
        assert_eq!(
            Issue::from_prefixed("no knob X in the source"),
            Issue::new("no knob X in the source".into())
        );
    }

    #[test]
    fn folders_of_problems_are_read_one_level_deep() {
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path();
        for d in ["b", "a", "nested/inner", ".hidden"] {
            std::fs::create_dir_all(root.join(d)).expect("mkdir");
        }
        for d in ["a", "b", "nested/inner", ".hidden"] {
            std::fs::write(root.join(d).join("problem.toml"), "").expect("write");
        }
        std::fs::create_dir(root.join("notes")).expect("mkdir");
        std::fs::create_dir(root.join(".git")).expect("mkdir");
        std::fs::write(root.join("README.md"), "").expect("write");
        let found = discover(&[root.to_path_buf(), root.join("nested/inner")]).expect("found");
        let names: Vec<String> = found.problems.iter().map(|p| listed_name(p)).collect();
        // A hidden folder with a problem.toml is still a problem (as in the Python script).
        assert_eq!(names, [".hidden", "a", "b", "inner"]);
        assert_eq!(found.skipped, [root.join("nested"), root.join("notes")]);
        let err = discover(&[root.join("missing")]).expect_err("missing");
        assert!(err.ends_with("missing does not exist"), "{err}");
        let err = discover(&[root.join("README.md")]).expect_err("a file");
        assert!(err.ends_with("is not a folder"), "{err}");
    }
}
