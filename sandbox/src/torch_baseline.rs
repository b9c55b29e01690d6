//! [`torch_baseline`]: torch eager timed by kiln's trusted helper script
//! (`kiln_torch_baseline.py`), as a trusted subprocess with a timeout.
//!
//! The helper is kiln's own code; the problem (untrusted) reaches it only as JSON on stdin,
//! and the helper maps `[baseline.torch]` onto a fixed registry of ops (no code is taken
//! from the problem). It runs outside the jail — python and torch need their whole prefix,
//! which the GPU jail does not show — with a cleared environment (PATH, HOME, and
//! `CUDA_VISIBLE_DEVICES` set to the sandbox's GPU), its own process group, and a wall-clock
//! limit after which it is killed. docs/security.md says why that is acceptable.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kiln_types::baseline::{BaselineResult, BaselineStatus};
use kiln_types::{EvalPlan, ProblemSpec};

/// File name of the helper, installed next to `kiln-worker`.
pub const HELPER_NAME: &str = "kiln_torch_baseline.py";

/// Where the helper and python are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TorchHelper {
    /// The python interpreter (`python3`, or a venv's).
    pub python: PathBuf,
    /// The helper script.
    pub script: PathBuf,
    /// Wall-clock limit.
    pub timeout: Duration,
}

impl TorchHelper {
    /// The helper next to `worker_exe`, in `../share/kiln/` beside it (installed
    /// layouts), or in `scripts/` above it (a build tree's `target/{debug,release}`);
    /// `None` when none exists.
    pub fn find(worker_exe: &Path, python: &str, timeout: Duration) -> Option<TorchHelper> {
        let dir = worker_exe.parent()?;
        let script = std::iter::successors(Some(dir), |d| d.parent())
            .take(4)
            .flat_map(|d| {
                [
                    d.join(HELPER_NAME),
                    d.join("share/kiln").join(HELPER_NAME),
                    d.join("scripts").join(HELPER_NAME),
                ]
            })
            .find(|p| p.is_file())?;
        Some(TorchHelper {
            python: resolve(python),
            script,
            timeout,
        })
    }
}

/// A bare interpreter name resolved on the caller's own PATH (the helper runs with a
/// short fixed PATH, which may not lead to the python that has torch).
fn resolve(python: &str) -> PathBuf {
    if python.contains('/') {
        return PathBuf::from(python);
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(python))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| PathBuf::from(python))
}

fn unavailable(detail: String) -> Vec<BaselineResult> {
    vec![BaselineResult::not_measured(
        "torch-eager",
        "torch",
        "",
        BaselineStatus::Unavailable,
        detail,
    )]
}

fn failed(detail: String) -> Vec<BaselineResult> {
    vec![BaselineResult::not_measured(
        "torch-eager",
        "torch",
        "",
        BaselineStatus::Failed,
        detail,
    )]
}

/// Times the problem's `[baseline.torch]` op with the helper; one result per precision
/// variant. Never an error: a missing python/torch is `unavailable`, anything else that
/// goes wrong is `failed`, each with the reason.
pub fn torch_baseline(
    gpu_uuid: Option<&str>,
    helper: &TorchHelper,
    problem: &ProblemSpec,
    plan: &EvalPlan,
) -> Vec<BaselineResult> {
    if !problem.baseline.contains_key("torch") {
        return Vec::new();
    }
    let timing = serde_json::to_string(&plan.timing).unwrap_or_default();
    let mut cmd = Command::new(&helper.python);
    cmd.arg(&helper.script)
        .arg(format!("--seed={}", plan.seed & (i64::MAX as u64)))
        .arg(format!("--timing={timing}"))
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("CUDA_VISIBLE_DEVICES", gpu_uuid.unwrap_or("0"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if let Some(home) = std::env::var_os("HOME") {
        cmd.env("HOME", home);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return unavailable(format!(
                "cannot start {} ({e}): no python3 here, or [gpu] python names the wrong one",
                helper.python.display()
            ));
        }
    };
    let json = serde_json::to_vec(problem).unwrap_or_default();
    let writer = child.stdin.take().map(|mut w| {
        std::thread::spawn(move || {
            let _ = w.write_all(&json);
        })
    });
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        if let Some(s) = stdout.as_mut() {
            let _ = s.take(16 << 20).read_to_string(&mut out);
        }
        out
    });
    let err_reader = std::thread::spawn(move || {
        let mut err = String::new();
        if let Some(s) = stderr.as_mut() {
            let _ = s.take(1 << 20).read_to_string(&mut err);
        }
        err
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if started.elapsed() >= helper.timeout => {
                // The helper leads its own process group: stop all of it.
                let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
                let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(_) => break None,
        }
    };
    if let Some(w) = writer {
        let _ = w.join();
    }
    let out = reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    let Some(status) = status else {
        return failed(format!(
            "the torch helper did not finish within {:.0} s and was killed",
            helper.timeout.as_secs_f64()
        ));
    };
    parse_output(&out, &err, status.code())
}

/// The helper's stdout (`{"results": [...]}`) as results; its exit code and stderr when
/// there is none.
pub fn parse_output(stdout: &str, stderr: &str, code: Option<i32>) -> Vec<BaselineResult> {
    #[derive(serde::Deserialize)]
    struct Out {
        results: Vec<BaselineResult>,
    }
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'));
    match line.map(serde_json::from_str::<Out>) {
        Some(Ok(o)) if !o.results.is_empty() => o.results,
        Some(Err(e)) => failed(format!("the torch helper's output did not parse: {e}")),
        _ => {
            let tail: String = stderr.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
            failed(format!(
                "the torch helper exited with {code:?} and no results; stderr: {tail}"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_parsed_or_explained() {
        let ok = r#"{"results": [{"name": "torch-eager-fp32", "library": "torch", "precision": "fp32", "status": "unavailable", "detail": "python cannot import torch"}]}"#;
        let r = parse_output(&format!("noise\n{ok}\n"), "", Some(0));
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].status, BaselineStatus::Unavailable);
        let r = parse_output("", "Traceback\nImportError: x", Some(1));
        assert_eq!(r[0].status, BaselineStatus::Failed);
        assert!(r[0].detail.contains("ImportError"), "{}", r[0].detail);
        let r = parse_output("{not json", "", Some(0));
        assert!(r[0].detail.contains("did not parse"), "{}", r[0].detail);
    }

    #[test]
    fn missing_python_is_unavailable_not_a_panic() {
        let problem: ProblemSpec = ProblemSpec::from_toml(
            r#"
name = "p"
[[tensor]]
name = "x"
dtype = "f32"
shape = [4]
role = "input"
[[tensor]]
name = "y"
dtype = "f32"
shape = [4]
role = "output"
[tolerance]
atol = 0.0
rtol = 0.0
[reference.cuda]
file = "r.cu"
launches = [{ kernel = "k", args = ["x", "y"] }]
[baseline.torch]
op = "softmax"
x = "x"
y = "y"
"#,
        )
        .expect("spec");
        let helper = TorchHelper {
            python: PathBuf::from("/nonexistent/python3"),
            script: PathBuf::from("/nonexistent/helper.py"),
            timeout: Duration::from_secs(5),
        };
        let r = torch_baseline(None, &helper, &problem, &EvalPlan::default());
        assert_eq!(r[0].status, BaselineStatus::Unavailable, "{r:?}");
    }

    #[test]
    fn the_real_helper_reports_a_missing_torch() {
        // With python3 but no torch (CI), the helper answers `unavailable`; with torch but no
        // GPU, also `unavailable`. Skipped where python3 is absent.
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../scripts")
            .join(HELPER_NAME);
        if Command::new("python3").arg("--version").output().is_err() {
            eprintln!("skipped: no python3");
            return;
        }
        let helper = TorchHelper {
            python: PathBuf::from("python3"),
            script,
            timeout: Duration::from_secs(60),
        };
        let problem = ProblemSpec::load_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../problems/softmax-4096x65536"),
        )
        .expect("problem");
        let r = torch_baseline(None, &helper, &problem, &EvalPlan::default());
        assert!(!r.is_empty());
        if r[0].status != BaselineStatus::Measured {
            assert_eq!(r[0].status, BaselineStatus::Unavailable, "{r:?}");
        }
    }
}
