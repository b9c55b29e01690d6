//! The python that runs hosted candidates, and the runner script it runs.
//!
//! kilnd asks `[gpu] python` (the torch runner's, trusted installed software) once at start
//! for torch (and, optionally, triton): [`HostedSetup::find`]. Its directories become
//! read-only binds of the evaluating worker's jail, so the runner can start and import
//! torch there. The script is part of `kiln-worker` ([`SCRIPT`]): the worker writes it into
//! the job's scratch directory, so what runs is always the version built with it.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::engine::triton::setup::probe;

/// The hosted runner script (`sandbox/hosted/kiln_hosted.py`).
pub const SCRIPT: &str = include_str!("../../../hosted/kiln_hosted.py");
/// The script's file name in the job's scratch directory.
pub const SCRIPT_NAME: &str = "kiln_hosted.py";
/// The candidate file's name in the job's scratch directory.
pub const CANDIDATE_NAME: &str = "candidate.py";

/// A python with torch, as found at start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostedSetup {
    /// The interpreter, by the path it was found at (absolute).
    pub python: PathBuf,
    /// `torch.__version__`.
    pub torch_version: String,
    /// Directories the evaluating worker's jail shows read-only besides the system paths.
    pub ro_paths: Vec<PathBuf>,
}

impl HostedSetup {
    /// Asks `python` for torch; `Err` says why hosted candidates cannot run here.
    pub fn find(python: &str, timeout: Duration) -> Result<HostedSetup, String> {
        let p = probe(python, "torch", timeout)?;
        Ok(HostedSetup {
            python: p.python,
            torch_version: p.version,
            ro_paths: p.ro_paths,
        })
    }

    /// One line for logs and `/v1/info`.
    pub fn describe(&self) -> String {
        format!("torch {} in {}", self.torch_version, self.python.display())
    }
}

/// What the evaluate request carries for a hosted candidate: the python, and how long
/// importing the file and building `ModelNew` may take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostedJob {
    /// The python with torch.
    pub setup: HostedSetup,
    /// The import and build limit, milliseconds.
    pub load_timeout_ms: u64,
}

/// The import and build limit of a hosted runner: torch's import (seconds), and a
/// `load_inline` build of torch's extension headers (tens of seconds cold), within the
/// compile limit and never under two minutes.
pub fn load_timeout(compile_timeout: Duration) -> Duration {
    compile_timeout.max(Duration::from_secs(120))
}

/// `Ok` when hosted candidates can run with `setup`; else why not, for people.
pub fn usable(setup: Option<&HostedSetup>) -> Result<(), String> {
    match setup {
        Some(_) => Ok(()),
        None => Err(
            "no python with torch for hosted ModelNew candidates: set [gpu] python \
                     to one that can `import torch`"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_is_carried_and_speaks_the_runner_protocol() {
        assert!(
            SCRIPT.contains("def main"),
            "the hosted runner script is embedded"
        );
        assert!(SCRIPT.contains("ModelNew"));
    }

    #[test]
    fn no_python_is_a_reason_not_a_panic() {
        let e = HostedSetup::find("/nonexistent/python3", Duration::from_secs(5))
            .expect_err("no python");
        assert!(e.contains("no python"), "{e}");
        assert!(usable(None).unwrap_err().contains("[gpu] python"));
    }
}
