//! Where Triton is: the python that has it, its version, and the directories a compile
//! jail must show read-only for that python to start and import triton.
//!
//! [`TritonSetup::find`] asks the python once (outside the jail: it is trusted, installed
//! software, like the torch runner's python) for `triton.__version__`, its prefixes and
//! `sys.path`. The directories that are not already among the system paths every jail
//! shows (`/usr`, `/lib`…) become [`TritonSetup::ro_paths`]: typically the virtual
//! environment (`/opt/torch/.venv`) and, for a python built outside `/usr` (pyenv, uv),
//! its base prefix. The interpreter is run by its own path (a venv's `bin/python`), never
//! its resolved target, so it finds its `pyvenv.cfg`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::engine::host::compile::run_captured;

/// Triton versions kiln has compiled and launched kernels of (see docs/api.md); others
/// are used with a warning.
pub const TESTED_VERSIONS: &[&str] = &["3.6.0"];

/// Paths every jail already shows (see `jailed_worker`): a python under them needs no bind.
const SYSTEM_PATHS: &[&str] = &[
    "/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin",
];

/// A python with triton, as found at start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TritonSetup {
    /// The interpreter, by the path it was found at (absolute).
    pub python: PathBuf,
    /// `triton.__version__`.
    pub version: String,
    /// Directories the compile jail shows read-only besides the system paths.
    pub ro_paths: Vec<PathBuf>,
}

/// What the probe prints.
#[derive(Debug, Deserialize)]
struct Probe {
    version: String,
    executable: String,
    prefixes: Vec<String>,
    path: Vec<String>,
}

/// What [`probe`] asks a python: `module`'s version, its prefixes and `sys.path`.
fn probe_script(module: &str) -> String {
    format!(
        "import json, sys\n\
         import {module}\n\
         print(json.dumps({{'version': {module}.__version__, 'executable': sys.executable, \
         'prefixes': [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix], \
         'path': [p for p in sys.path if p]}}))\n"
    )
}

/// A python that can import a module, as [`probe`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probed {
    /// The interpreter, by the path it was found at (absolute).
    pub python: PathBuf,
    /// `module.__version__`.
    pub version: String,
    /// Directories a jail shows read-only for it, besides the system paths.
    pub ro_paths: Vec<PathBuf>,
}

/// Asks `python` (a path, or a name looked up on the caller's PATH) for `module`: its
/// version and the directories a jail must show for that python to start and import it.
/// `Err` says why not: no such python, no such module in it, an odd answer.
pub fn probe(python: &str, module: &str, timeout: Duration) -> Result<Probed, String> {
    let exe =
        resolve(python).ok_or_else(|| format!("no python {python:?} (on PATH or as a path)"))?;
    let mut cmd = Command::new(&exe);
    cmd.args(["-I", "-B", "-c", &probe_script(module)])
        .env_clear();
    if let Ok(path) = std::env::var("PATH") {
        cmd.env("PATH", path);
    }
    let run = run_captured(&mut cmd, timeout, 64 << 10)
        .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    if run.timed_out {
        return Err(format!(
            "{} did not answer within {:.0} s",
            exe.display(),
            timeout.as_secs_f64()
        ));
    }
    let answer = run.output.lines().rev().find(|l| l.starts_with('{'));
    let probe: Probe = match (run.status, answer) {
        (Some(0), Some(line)) => serde_json::from_str(line)
            .map_err(|e| format!("{} gave an odd answer: {e}", exe.display()))?,
        _ => {
            let why = run
                .output
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no output");
            return Err(format!(
                "{} cannot import {module}: {}",
                exe.display(),
                why.trim()
            ));
        }
    };
    if probe.version.is_empty() || probe.version.len() > 64 {
        return Err(format!("{} reports no {module} version", exe.display()));
    }
    let mut dirs: Vec<PathBuf> = probe.prefixes.iter().map(PathBuf::from).collect();
    dirs.extend(probe.path.iter().map(PathBuf::from));
    for p in [&exe, Path::new(&probe.executable)] {
        if let Some(d) = p.parent() {
            dirs.push(d.to_path_buf());
        }
        if let Some(d) = std::fs::canonicalize(p)
            .ok()
            .and_then(|r| r.parent().map(Path::to_path_buf))
        {
            dirs.push(d);
        }
    }
    Ok(Probed {
        python: exe,
        version: probe.version,
        ro_paths: covering(dirs),
    })
}

impl TritonSetup {
    /// Asks `python` (a path, or a name looked up on the caller's PATH) for triton.
    /// `Err` says why there is no Triton: no such python, no triton in it, an odd answer.
    pub fn find(python: &str, timeout: Duration) -> Result<TritonSetup, String> {
        let p = probe(python, "triton", timeout)?;
        Ok(TritonSetup {
            python: p.python,
            version: p.version,
            ro_paths: p.ro_paths,
        })
    }

    /// True if and only if kiln has been tested with this Triton version.
    pub fn tested(&self) -> bool {
        TESTED_VERSIONS.contains(&self.version.as_str())
    }

    /// One line for logs and `kiln doctor`.
    pub fn describe(&self) -> String {
        format!(
            "triton {} in {}{}",
            self.version,
            self.python.display(),
            if self.tested() {
                String::new()
            } else {
                format!(
                    " (untested version; tested: {})",
                    TESTED_VERSIONS.join(", ")
                )
            }
        )
    }
}

/// `python` as an absolute path: itself when it has a `/` (made absolute), else the first
/// match on PATH.
fn resolve(python: &str) -> Option<PathBuf> {
    if python.is_empty() {
        return None;
    }
    if python.contains('/') {
        let p = PathBuf::from(python);
        let p = if p.is_absolute() {
            p
        } else {
            std::env::current_dir().ok()?.join(p)
        };
        return p.is_file().then_some(p);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(python))
            .find(|p| p.is_file() && p.is_absolute())
    })
}

/// The existing, absolute directories among `dirs` (each also by its resolved path when
/// that differs), without those under the system paths or under another one, and never
/// `/` itself.
fn covering(dirs: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut all: Vec<PathBuf> = Vec::new();
    for d in dirs {
        if !d.is_absolute() || !d.exists() {
            continue;
        }
        let real = std::fs::canonicalize(&d).unwrap_or_else(|_| d.clone());
        for p in [d, real] {
            let system = SYSTEM_PATHS.iter().any(|s| p.starts_with(s));
            if !system && p != Path::new("/") && !all.contains(&p) {
                all.push(p);
            }
        }
    }
    all.sort();
    let mut out: Vec<PathBuf> = Vec::new();
    for p in all {
        if !out.iter().any(|o| p.starts_with(o)) {
            out.push(p);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covering_keeps_outermost_non_system_dirs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let venv = dir.path().join("venv");
        let site = venv.join("lib/python3.12/site-packages");
        std::fs::create_dir_all(&site).expect("mkdir");
        let out = covering(vec![
            site.clone(),
            venv.clone(),
            PathBuf::from("/usr/lib/python3.12"),
            PathBuf::from("relative"),
            PathBuf::from("/"),
            dir.path().join("missing"),
        ]);
        let venv = std::fs::canonicalize(&venv).expect("canonical");
        assert!(out.contains(&venv), "{out:?}");
        assert!(out.iter().all(|p| !p.starts_with("/usr")), "{out:?}");
        assert!(
            !out.contains(&site) && !out.contains(&PathBuf::from("/")),
            "{out:?}"
        );
    }

    #[test]
    fn a_missing_python_or_triton_is_a_reason_not_a_panic() {
        let e = TritonSetup::find("/nonexistent/python3", Duration::from_secs(5))
            .expect_err("no such python");
        assert!(e.contains("no python"), "{e}");
        // Every machine that runs the tests has /bin/sh; it is not a python with triton.
        let e = TritonSetup::find("/bin/sh", Duration::from_secs(5)).expect_err("not python");
        assert!(e.contains("cannot import triton"), "{e}");
    }
}
