//! Helpers shared by the sandbox's integration tests: a test config with short limits,
//! problem loading, cached reference artifacts, and the stray-process check.
#![allow(dead_code)]

pub mod headers;
pub mod hosted;
pub mod kernelbench;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use kiln_sandbox::SandboxConfig;
use kiln_types::{Candidate, EvalPlan, Evaluation, ProblemSpec, TimingPlan};

/// A per-test scratch root (removed by the TempDir guard) and a config with short limits.
pub fn setup() -> (tempfile::TempDir, SandboxConfig) {
    let dir = tempfile::Builder::new()
        .prefix("kiln-sandbox-test-")
        .tempdir()
        .expect("temp dir");
    let mut cfg = SandboxConfig::new(dir.path());
    // KILN_WORKER: the bundled worker on a GPU host (scripts/gpu-check.sh).
    cfg.worker_exe = std::env::var_os("KILN_WORKER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kiln-worker")));
    cfg.compile_timeout = Duration::from_secs(8);
    cfg.memory_limit_bytes = 256 << 20;
    cfg.output_limit_bytes = 64 << 10;
    (dir, cfg)
}

/// The repository's problems folder (`KILN_PROBLEMS` overrides it, as on a GPU host).
pub fn problems_dir() -> PathBuf {
    std::env::var_os("KILN_PROBLEMS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../problems"))
}

/// A problem from the suite.
pub fn problem(name: &str) -> ProblemSpec {
    ProblemSpec::load_dir(&problems_dir().join(name)).expect("problem loads")
}

/// A quick plan: two trials (plus the shifted one), a short timing phase.
pub fn plan() -> EvalPlan {
    EvalPlan {
        seed: 0x5eed_1234,
        trials: 2,
        run_timeout_ms: 1500,
        timing: TimingPlan {
            warmup: 1,
            min_samples: 5,
            min_time_ms: 5.0,
            max_rse: 0.05,
            max_samples: 40,
            wall_cap_ms: 300.0,
            recheck_fraction: 0.25,
            ..kiln_types::TimingPlan::default()
        },
        peak_bytes_per_s: 0.0,
        peak_flops: 0.0,
        plain: None,
        race: None,
        record_launches: false,
    }
}

/// The problem's host reference as a candidate (as kilnd builds it).
pub fn reference_candidate(p: &ProblemSpec) -> Candidate {
    p.reference_candidate(kiln_types::BackendKind::Host)
        .expect("a host reference")
}

/// The compiled reference of a problem, compiled once per test binary.
pub fn reference_artifact(cfg: &SandboxConfig, p: &ProblemSpec) -> Vec<u8> {
    static CACHE: OnceLock<Mutex<HashMap<String, Vec<u8>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(a) = cache.lock().expect("lock").get(&p.name) {
        return a.clone();
    }
    let out = kiln_sandbox::compile(cfg, p, &reference_candidate(p)).expect("reference compiles");
    let art = out
        .artifact
        .unwrap_or_else(|| panic!("reference of {} failed: {:?}", p.name, out.failure));
    cache
        .lock()
        .expect("lock")
        .insert(p.name.clone(), art.clone());
    art
}

/// Compiles and evaluates `candidate`; a compile failure is returned as its evaluation.
pub fn run(
    cfg: &SandboxConfig,
    p: &ProblemSpec,
    candidate: &Candidate,
    plan: &EvalPlan,
) -> Evaluation {
    let reference = reference_artifact(cfg, p);
    let t0 = std::time::Instant::now();
    let out = kiln_sandbox::compile(cfg, p, candidate).expect("compile runs");
    let t1 = std::time::Instant::now();
    let e = match out.artifact {
        Some(art) => kiln_sandbox::evaluate(cfg, p, &reference, candidate, &art, plan)
            .expect("evaluate runs"),
        None => out.failure.expect("a failed compile has a failure"),
    };
    eprintln!(
        "{}: compile {:?}, evaluate {:?}: {} ({})",
        p.name,
        t1 - t0,
        t1.elapsed(),
        e.verdict,
        e.message
    );
    e
}

/// Processes whose command line mentions `needle` (a test's scratch root).
pub fn processes_mentioning(needle: &Path) -> Vec<String> {
    let needle = needle.to_string_lossy().into_owned();
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(&needle) {
                found.push(format!("{name}: {cmd}"));
            }
        }
    }
    found
}

/// Asserts that no process of this test is left and its scratch root is empty.
pub fn assert_clean(root: &Path) {
    let strays = processes_mentioning(root);
    assert!(strays.is_empty(), "stray processes: {strays:?}");
    let left: Vec<_> = std::fs::read_dir(root)
        .expect("scratch root")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "job directories left behind: {left:?}");
}
