//! The python that runs hosted candidates, and the runner script it runs.
//!
//! kilnd asks `[gpu] python` (the torch runner's, trusted installed software) once at start
//! for torch (and, optionally, triton): [`HostedSetup::find`]. Its directories become
//! read-only binds of the evaluating worker's jail, so the runner can start and import
//! torch there. The script is part of `kiln-worker` ([`SCRIPT`]): the worker writes it into
//! the job's scratch directory, so what runs is always the version built with it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::engine::triton::setup::probe;

/// The hosted runner script (`sandbox/hosted/kiln_hosted.py`).
pub const SCRIPT: &str = include_str!("../../../hosted/kiln_hosted.py");
/// The script's file name in the job's scratch directory.
pub const SCRIPT_NAME: &str = "kiln_hosted.py";
/// The device-source extractor the script's `device-source` imports
/// (`sandbox/hosted/kiln_extract.py`), written beside it at the compile step.
pub const EXTRACT: &str = include_str!("../../../hosted/kiln_extract.py");
/// The extractor's file name beside the script.
pub const EXTRACT_NAME: &str = "kiln_extract.py";
/// The recorder the script's `R` imports (`sandbox/hosted/kiln_record.py`), written beside
/// it at the evaluation ([`super::write_files`]).
pub const RECORD: &str = include_str!("../../../hosted/kiln_record.py");
/// The recorder's file name beside the script.
pub const RECORD_NAME: &str = "kiln_record.py";
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
    /// The CUDA toolkit `load_inline` compiles with (`nvcc` in its `bin`), when there is one:
    /// `CUDA_HOME`, else the `nvcc` on kilnd's PATH, else `/usr/local/cuda`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolkit: Option<PathBuf>,
    /// The folder of the `ninja` torch's `load_inline` runs, when it is not beside the
    /// python: the first on kilnd's PATH.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ninja_dir: Option<PathBuf>,
}

/// The folder of the first `ninja` on kilnd's PATH, unless the python has its own.
fn find_ninja(python: &Path) -> Option<PathBuf> {
    if python.parent().is_some_and(|d| d.join("ninja").is_file()) {
        return None;
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .find(|d| d.join("ninja").is_file())
        .and_then(|d| std::fs::canonicalize(d).ok())
}

/// The CUDA toolkit to show hosted runners, as [`HostedSetup::toolkit`] says.
fn find_toolkit() -> Option<PathBuf> {
    let has_nvcc = |root: &Path| root.join("bin/nvcc").is_file();
    let from_env = ["CUDA_HOME", "CUDA_PATH"]
        .into_iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from);
    let from_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("nvcc"))
        .filter(|n| n.is_file())
        .filter_map(|n| std::fs::canonicalize(n).ok())
        .filter_map(|n| n.parent().and_then(Path::parent).map(Path::to_path_buf));
    from_env
        .chain(from_path)
        .chain([PathBuf::from("/usr/local/cuda")])
        .filter_map(|p| std::fs::canonicalize(&p).ok())
        .find(|p| has_nvcc(p))
}

/// The environment of a hosted runner working in `dir` (the job's scratch, which is also
/// its home and temporary folder, where torch and Triton keep their build caches): on
/// the GPU, what `load_inline` needs to find ninja, nvcc and the host compiler, and the
/// worker's own GPU selection and library path.
pub fn runner_env(dir: &Path, setup: &HostedSetup, cuda: bool) -> Vec<(String, String)> {
    let home = dir.display().to_string();
    let mut path: Vec<String> = Vec::new();
    if let Some(bin) = setup.python.parent() {
        path.push(bin.display().to_string()); // a venv's ninja
    }
    if let Some(d) = &setup.ninja_dir {
        path.push(d.display().to_string());
    }
    if let Some(t) = setup.toolkit.as_ref().filter(|_| cuda) {
        path.push(t.join("bin").display().to_string());
    }
    path.extend(["/usr/bin".to_string(), "/bin".to_string()]);
    let threads = if cuda { "4" } else { "1" };
    let mut env = vec![
        ("PATH".to_string(), path.join(":")),
        ("HOME".into(), home.clone()),
        // The jail has no passwd entry for its uid: getpass.getuser() (torch's profiler,
        // Triton's and inductor's cache folders) reads these first.
        ("USER".into(), "kiln".into()),
        ("LOGNAME".into(), "kiln".into()),
        ("TMPDIR".into(), home.clone()),
        ("OMP_NUM_THREADS".into(), threads.into()),
        ("MKL_NUM_THREADS".into(), threads.into()),
        ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
        ("PYTHONHASHSEED".into(), "0".into()),
        (
            "TORCH_EXTENSIONS_DIR".into(),
            dir.join("torch_extensions").display().to_string(),
        ),
        (
            "TRITON_CACHE_DIR".into(),
            dir.join("triton").display().to_string(),
        ),
    ];
    if cuda {
        if let Some(t) = &setup.toolkit {
            env.push(("CUDA_HOME".into(), t.display().to_string()));
        }
        for k in ["CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"] {
            if let Ok(v) = std::env::var(k) {
                env.push((k.into(), v));
            }
        }
    }
    env
}

impl HostedSetup {
    /// Asks `python` for torch; `Err` says why hosted candidates cannot run here.
    pub fn find(python: &str, timeout: Duration) -> Result<HostedSetup, String> {
        let p = probe(python, "torch", timeout)?;
        let toolkit = find_toolkit();
        let ninja_dir = find_ninja(&p.python);
        let mut ro_paths = p.ro_paths;
        ro_paths.extend(toolkit.iter().cloned());
        ro_paths.extend(ninja_dir.iter().cloned());
        Ok(HostedSetup {
            python: p.python,
            torch_version: p.version,
            ro_paths,
            toolkit,
            ninja_dir,
        })
    }

    /// What besides the file decides the libraries a hosted file's compile step builds
    /// (part of kilnd's compile cache key): torch's version, the python and the toolkit.
    pub fn build_identity(&self) -> String {
        format!(
            "torch {} in {}, toolkit {}",
            self.torch_version,
            self.python.display(),
            self.toolkit
                .as_ref()
                .map_or_else(|| "none".into(), |t| t.display().to_string())
        )
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
