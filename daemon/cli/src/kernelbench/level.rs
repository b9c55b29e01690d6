//! A KernelBench level made into kiln problems once, and registered: the import (as `kiln
//! problems import kernelbench` does it) writes the problem folders and `import.json` into
//! a state folder; a later run whose level files are unchanged (names, sizes, modification
//! times) reads `import.json` instead of importing again. Registration goes problem by
//! problem: one kilnd refuses (too large for the GPU, a name taken by another spec) is
//! "not registered", with kilnd's reason, and stays out of the level's numbers.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use kiln_daemon::client::{Client, ClientError};
use kiln_types::{BackendKind, ProblemSpec, kernelbench};
use serde::{Deserialize, Serialize};

use super::answers::LevelProblem;

/// Where the import is recorded inside the state folder.
const MARKER: &str = "import.json";

/// One problem of the level after the import and the registration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    /// Its number in the level.
    pub id: u64,
    /// The level's file name (`19_ReLU.py`).
    pub file: String,
    /// kiln's name for it (`kb-l1-19-relu`), once imported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its problem folder, once imported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// Why it is not registered (the import refused it, kilnd refused it, or the backend
    /// this run uses cannot evaluate it); `None` when registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_registered: Option<String>,
}

/// What `import.json` holds: the level files it was made from and what became of each.
#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    level_dir: PathBuf,
    files: Vec<Stamp>,
    tolerance: kiln_types::Tolerance,
    problems: Vec<Problem>,
}

/// A level file as the marker remembers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    file: String,
    bytes: u64,
    modified_s: u64,
}

fn stamps(level: &[LevelProblem]) -> Result<Vec<Stamp>> {
    level
        .iter()
        .map(|p| {
            let meta = std::fs::metadata(&p.file)
                .with_context(|| format!("cannot read {}", p.file.display()))?;
            let modified_s = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            Ok(Stamp {
                file: file_name(&p.file),
                bytes: meta.len(),
                modified_s,
            })
        })
        .collect()
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// How to run the import.
pub struct Importer<'a> {
    /// The python with torch.
    pub python: &'a str,
    /// kiln's torch runner script (found beside kiln-worker when `None`).
    pub helper: Option<PathBuf>,
    /// Import again even when `import.json` matches.
    pub again: bool,
    /// The problems' tolerance.
    pub tolerance: kiln_types::Tolerance,
}

/// The level's problems imported into `state` (or read from an earlier import there), and
/// whether this call imported.
pub fn import(
    level_dir: &Path,
    level: &[LevelProblem],
    state: &Path,
    how: &Importer<'_>,
    say: impl Fn(&str),
) -> Result<(Vec<Problem>, bool)> {
    let level_dir = std::fs::canonicalize(level_dir)
        .with_context(|| format!("cannot read the level folder {}", level_dir.display()))?;
    let files = stamps(level)?;
    let marker_path = state.join(MARKER);
    if !how.again
        && let Ok(text) = std::fs::read_to_string(&marker_path)
        && let Ok(m) = serde_json::from_str::<Marker>(&text)
        && m.level_dir == level_dir
        && m.files == files
        && m.tolerance == how.tolerance
        && m.problems
            .iter()
            .all(|p| p.dir.as_ref().is_none_or(|d| d.is_dir()))
    {
        return Ok((m.problems, false));
    }
    std::fs::create_dir_all(state)
        .with_context(|| format!("cannot create the state folder {}", state.display()))?;
    let script = match &how.helper {
        Some(h) => h.clone(),
        None => kiln_torch_runner::TorchRunner::find(
            &kiln_sandbox::default_worker_exe(),
            how.python,
            std::time::Duration::from_secs(1),
        )
        .map(|h| h.script)
        .context("kiln_torch.py not found beside kiln-worker: pass --helper PATH")?,
    };
    let helper = kiln_torch_runner::TorchRunner {
        python: kiln_torch_runner::process::resolve(how.python),
        script,
        timeout: std::time::Duration::from_secs(3600),
    };
    say(&format!(
        "importing {} problem file(s) of {} with {} (once: kept in {})",
        level.len(),
        level_dir.display(),
        helper.python.display(),
        state.display()
    ));
    let paths: Vec<PathBuf> = level.iter().map(|p| p.file.clone()).collect();
    // The import's own limits (`kiln problems import kernelbench`'s defaults).
    let limits = (256 << 20, 4_000_000_000);
    let described = kiln_torch_runner::process::describe(&helper, &paths, limits, how.tolerance)
        .with_context(|| {
            format!(
                "importing the level failed: {} must be a python with torch (--python or \
             KILN_PYTHON)",
                helper.python.display()
            )
        })?;
    let mut problems = Vec::new();
    for (p, d) in level.iter().zip(&described) {
        let mut out = Problem {
            id: p.id,
            file: file_name(&p.file),
            name: None,
            dir: None,
            not_registered: None,
        };
        match &d.refused {
            Some(why) => out.not_registered = Some(format!("the import refused it: {why}")),
            None => match kernelbench::write(state, d, how.tolerance) {
                Ok(i) => {
                    out.name = Some(i.name);
                    out.dir = Some(i.dir);
                }
                Err(e) => out.not_registered = Some(format!("the import refused it: {e:#}")),
            },
        }
        problems.push(out);
    }
    let marker = Marker {
        level_dir,
        files,
        tolerance: how.tolerance,
        problems: problems.clone(),
    };
    std::fs::write(&marker_path, serde_json::to_string_pretty(&marker)?)
        .with_context(|| format!("cannot write {}", marker_path.display()))?;
    Ok((problems, true))
}

/// Registers every imported problem with kilnd; one it refuses, or one `backend` cannot
/// evaluate, gets its reason in `not_registered`. Errors other than a refusal (no kilnd)
/// end the run.
pub async fn register(
    client: &Client,
    problems: &mut [Problem],
    backend: BackendKind,
) -> Result<()> {
    for p in problems.iter_mut().filter(|p| p.not_registered.is_none()) {
        let Some(dir) = &p.dir else { continue };
        let spec = ProblemSpec::load_dir(dir).with_context(|| format!("in {}", dir.display()))?;
        if !spec.evaluable_on(backend) {
            p.not_registered = Some(match backend {
                BackendKind::Host => "its inputs come from its own get_inputs() (made on the \
                                      GPU), so it runs on the cuda backend only: run without \
                                      --cpu"
                    .into(),
                _ => format!("the {backend} backend cannot evaluate it"),
            });
            continue;
        }
        match client
            .post("/v1/problems", &serde_json::to_value(&spec)?)
            .await
        {
            Ok(_) => {}
            Err(ClientError::Api { code, message, .. }) => {
                p.not_registered = Some(format!("kilnd refused it ({code}): {message}"));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A matching `import.json` is read back without running any python.
    #[test]
    fn an_unchanged_level_is_not_imported_again() {
        let level_dir = tempfile::tempdir().expect("tmp");
        let state = tempfile::tempdir().expect("tmp");
        let file = level_dir.path().join("1_A.py");
        std::fs::write(&file, "class Model: pass\n").expect("write");
        let level = vec![LevelProblem {
            id: 1,
            file: file.clone(),
            stem: "1_A".into(),
        }];
        let problems = vec![Problem {
            id: 1,
            file: "1_A.py".into(),
            name: None,
            dir: None,
            not_registered: Some("the import refused it: random ops".into()),
        }];
        let marker = Marker {
            level_dir: std::fs::canonicalize(level_dir.path()).expect("canon"),
            files: stamps(&level).expect("stamps"),
            tolerance: kernelbench::KERNELBENCH_TOLERANCE,
            problems: problems.clone(),
        };
        std::fs::write(
            state.path().join(MARKER),
            serde_json::to_string(&marker).expect("json"),
        )
        .expect("write");
        let how = Importer {
            python: "/nonexistent/python",
            helper: Some(PathBuf::from("/nonexistent/kiln_torch.py")),
            again: false,
            tolerance: kernelbench::KERNELBENCH_TOLERANCE,
        };
        let (got, imported) =
            import(level_dir.path(), &level, state.path(), &how, |_| {}).expect("from the marker");
        assert_eq!((got, imported), (problems, false));
        // Another tolerance is another import.
        let other = Importer {
            tolerance: kiln_types::Tolerance {
                atol: 1e-2,
                rtol: 1e-2,
            },
            helper: how.helper.clone(),
            ..how
        };
        assert!(import(level_dir.path(), &level, state.path(), &other, |_| {}).is_err());
        // A changed file is imported again (here: the python is missing, so it fails, and
        // says what the python must be).
        std::fs::write(&file, "class Model: pass  # changed\n").expect("write");
        let err = import(level_dir.path(), &level, state.path(), &how, |_| {})
            .expect_err("imports again");
        assert!(
            format!("{err:#}").contains("must be a python with torch"),
            "{err:#}"
        );
    }
}
