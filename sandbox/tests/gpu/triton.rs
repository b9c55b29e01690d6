//! GPU tests of Triton candidates (part of the `gpu` test binary): the softmax seed and
//! the LayerNorm and matmul kernels written for these tests (`tests/triton/`) pass the
//! contract and are timed; the red-team kernels get their verdicts. Each test skips,
//! saying why, without a GPU or without a python that has triton (`KILN_TRITON_PYTHON`,
//! else `/opt/torch/.venv/bin/python3`, else `python3`).
//!
//! Every line starting `SUMMARY` is a result for docs/gpu-results.md (verdict, median,
//! tier, and the cold compile time of the candidate in the jail).

use super::triton_plans as plans;
use super::*;
use kiln_sandbox::engine::triton::setup::TritonSetup;

/// A GPU config with Triton, or `None` (printed).
fn triton_gpu() -> Option<(tempfile::TempDir, SandboxConfig)> {
    let (dir, mut cfg) = gpu()?;
    let pythons = [
        std::env::var("KILN_TRITON_PYTHON").ok(),
        Some("/opt/torch/.venv/bin/python3".to_string()),
        Some("python3".to_string()),
    ];
    let mut why = Vec::new();
    for p in pythons.into_iter().flatten() {
        match TritonSetup::find(&p, Duration::from_secs(60)) {
            Ok(t) => {
                println!("using {}", t.describe());
                cfg.triton = Some(t);
                return Some((dir, cfg));
            }
            Err(e) => why.push(e),
        }
    }
    println!("SKIP: no python with triton: {}", why.join("; "));
    None
}

/// Compiles (timed: a fresh jail each time, so cold) and evaluates `c`.
fn triton_run(cfg: &SandboxConfig, p: &ProblemSpec, c: &Candidate, plan: &EvalPlan) -> Evaluation {
    let t0 = std::time::Instant::now();
    let out = kiln_sandbox::compile(cfg, p, c).expect("compile runs");
    println!(
        "SUMMARY triton compile {}: {:.2} s cold in the jail ({})",
        p.name,
        t0.elapsed().as_secs_f64(),
        out.info.log.lines().next().unwrap_or("")
    );
    let Some(art) = out.artifact else {
        return out.failure.expect("failure");
    };
    let reference = compile_ok(cfg, p, &kernel_candidate(p, "reference"));
    let e = kiln_sandbox::evaluate(cfg, p, &reference, c, &art, plan).expect("evaluate runs");
    println!("{}", summary(&format!("triton {}", p.name), &e));
    e
}

fn assert_timed_ok(e: &Evaluation) {
    assert_eq!(e.verdict, Verdict::Ok, "{e:#?}");
    let t = e.timing.as_ref().expect("timing");
    assert!(t.n >= 10 && t.median_us > 0.0, "{t:?}");
    let kernels = &e.telemetry.as_ref().expect("telemetry")["kernels"];
    assert!(
        kernels.as_array().is_some_and(|k| !k.is_empty()),
        "{kernels}"
    );
}

fn timed_ok(problem_name: &str, c: &Candidate) {
    let Some((_dir, cfg)) = triton_gpu() else {
        return;
    };
    let e = triton_run(&cfg, &problem(problem_name), c, &plan(10_000));
    assert_timed_ok(&e);
}

#[test]
fn gpu_triton_softmax_seed() {
    let p = problem("softmax-4096x65536");
    timed_ok(&p.name, &p.seed_candidate("triton").expect("triton seed"));
}

#[test]
fn gpu_triton_layernorm() {
    timed_ok("layernorm-16x64x256x256", &plans::layernorm());
}

#[test]
fn gpu_triton_matmul_fp32_tf32x3() {
    timed_ok("matmul-fp32-4096", &plans::matmul_f32(false));
}

#[test]
fn gpu_triton_matmul_fp16() {
    timed_ok("matmul-fp16-4096", &plans::matmul_f16());
}

#[test]
fn redteam_triton_fp16_in_fp32_problem() {
    let Some((_dir, cfg)) = triton_gpu() else {
        return;
    };
    let p = problem("matmul-fp32-4096");
    let e = triton_run(&cfg, &p, &plans::matmul_f32(true), &plan(10_000));
    assert!(delivered_tier(&e) > PrecisionTier::Fp32Faithful, "{e:#?}");
    let strict = problem("matmul-fp32-4096-strict");
    let mut cheat = plans::matmul_f32(true);
    cheat.problem = strict.name.clone();
    let e = triton_run(&cfg, &strict, &cheat, &plan(10_000));
    assert_eq!(e.verdict, Verdict::WrongAnswer, "{e:#?}");
}

/// The red-team kernel in `mode` (see tests/triton/redteam.py) with `extra` programs past
/// the data, on vecadd-cuda-1m, between two honest Triton runs on the same warm worker;
/// the honest run after it must pass.
fn triton_redteam(mode: u32, extra: u32) -> Option<Evaluation> {
    let (_dir, cfg) = triton_gpu()?;
    let p = problem("vecadd-cuda-1m");
    let mut worker = WarmWorker::new(cfg.clone(), 100);
    let honest = run_on(&mut worker, &cfg, &p, &plans::redteam(0, 0), &plan(5_000));
    assert_eq!(
        honest.verdict,
        Verdict::Ok,
        "the honest kernel: {honest:#?}"
    );
    let e = run_on(
        &mut worker,
        &cfg,
        &p,
        &plans::redteam(mode, extra),
        &plan(5_000),
    );
    println!("{}", summary(&format!("triton red-team mode {mode}"), &e));
    let after = run_on(&mut worker, &cfg, &p, &plans::redteam(0, 0), &plan(5_000));
    assert_eq!(
        after.verdict,
        Verdict::Ok,
        "after the red-team kernel: {after:#?}"
    );
    Some(e)
}

#[test]
fn redteam_triton_far_out_of_bounds_store() {
    let Some(e) = triton_redteam(1, 0) else {
        return;
    };
    assert_eq!(e.verdict, Verdict::RuntimeFault, "{e:#?}");
    let fault = e.evidence.fault.clone().unwrap_or_default();
    assert!(fault.contains("CUDA_ERROR"), "{fault}");
}

#[test]
fn redteam_triton_unmasked_store_past_the_end() {
    // One program more than the data: its unmasked store writes 4 KiB past the end of y.
    // Where that lands depends on the allocator; it must never pass as ok.
    let Some(e) = triton_redteam(2, 1) else {
        return;
    };
    println!("unmasked store past the end: {} ({})", e.verdict, e.message);
    assert_eq!(e.verdict, Verdict::RuntimeFault, "{e:#?}");
    let fault = e.evidence.fault.clone().unwrap_or_default();
    assert!(fault.contains("out-of-bounds write"), "{fault}");
}

#[test]
fn redteam_triton_stores_nothing() {
    let Some(e) = triton_redteam(3, 0) else {
        return;
    };
    assert_eq!(e.verdict, Verdict::IncompleteOutput, "{e:#?}");
    assert_eq!(e.evidence.unwritten[0].1, 1048576, "{e:#?}");
}

#[test]
fn redteam_triton_writes_an_input() {
    let Some(e) = triton_redteam(4, 0) else {
        return;
    };
    assert_eq!(e.verdict, Verdict::InputTampered, "{e:#?}");
    assert_eq!(e.evidence.tampered_inputs, vec!["a".to_string()], "{e:#?}");
}

#[test]
fn redteam_triton_cache_in_scratch_never_survives() {
    // A Triton kernel has no memory of its own (no __device__ globals): the only place it
    // could keep results across calls is scratch, which kiln zeroes before every run. A
    // cache hit would serve the previous inputs' sums (wrong on fresh inputs); the
    // verdict is ok because no hit ever happens.
    let Some(e) = triton_redteam(5, 0) else {
        return;
    };
    assert_eq!(e.verdict, Verdict::Ok, "{e:#?}");
}
