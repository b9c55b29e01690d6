//! GPU tests of the torch reference on the cuda backend (part of the `gpu` test binary):
//! the seed's problems imported from KernelBench format (`problems/kb-*`, written by
//! scripts/gpu-check.sh's import step) evaluated with the hand-written seed kernels of
//! their twins (`problems/<name>`), the kernels' buffers renamed to the imported tensor
//! names. Each must get the same verdict and precision tier as on its twin. Skips, saying
//! why, without a GPU, without `KILN_PYTHON` (a python with torch for CUDA), or without the
//! imported folders. Every `SUMMARY` line is a result for docs/gpu-results.md.

use std::collections::BTreeMap;

use kiln_sandbox::{ReferenceRunner, TorchHelper};
use kiln_types::{Arg, Role};

use super::*;

/// The lane's torch reference runner on the test GPU, or `None` (printed).
fn runner(cfg: &SandboxConfig) -> Option<ReferenceRunner> {
    let Ok(python) = std::env::var("KILN_PYTHON") else {
        println!("SKIP: KILN_PYTHON (a python with torch) is not set");
        return None;
    };
    let Some(helper) = TorchHelper::find(&cfg.worker_exe, &python, Duration::from_secs(900)) else {
        println!("SKIP: kiln_torch.py is not beside kiln-worker or in scripts/");
        return None;
    };
    Some(ReferenceRunner::gpu(helper, cfg.gpu_uuid.as_deref()))
}

/// The imported problem `kb-NAME`, or `None` (printed) when the import step did not run.
fn imported(name: &str) -> Option<ProblemSpec> {
    let dir = problems_dir().join(format!("kb-{name}"));
    if !dir.join("problem.toml").is_file() {
        println!(
            "SKIP: {} not found: run `kiln problems import kernelbench problems/kernelbench-format/seed --out problems`",
            dir.display()
        );
        return None;
    }
    Some(ProblemSpec::load_dir(&dir).expect("imported problem loads"))
}

/// `hand`'s seed kernel written against `kb`'s tensor names (the tensors pair up in order:
/// forward arguments, parameters, outputs, as the import writes them).
fn twin_seed(hand: &ProblemSpec, kb: &ProblemSpec) -> Candidate {
    let shapes = |p: &ProblemSpec| -> Vec<(Vec<u64>, Role)> {
        p.tensors
            .iter()
            .map(|t| (t.shape.clone(), t.role))
            .collect()
    };
    assert_eq!(
        shapes(hand),
        shapes(kb),
        "{} and {} pair up",
        hand.name,
        kb.name
    );
    let names: BTreeMap<&str, &str> = hand
        .tensors
        .iter()
        .zip(&kb.tensors)
        .map(|(a, b)| (a.name.as_str(), b.name.as_str()))
        .collect();
    let mut c = kernel_candidate(hand, "seed");
    c.problem = kb.name.clone();
    for l in &mut c.launches {
        for a in &mut l.args {
            if let Arg::Buffer(n) = a
                && let Some(m) = names.get(n.as_str())
            {
                *n = (*m).to_string();
            }
        }
    }
    c
}

fn twins(name: &str) {
    let Some((_d, cfg)) = gpu() else { return };
    let Some(mut runner) = runner(&cfg) else {
        return;
    };
    let Some(kb) = imported(name) else { return };
    let hand = problem(name);
    let mut worker = WarmWorker::new(cfg.clone(), 50);
    let on_hand = run_on(
        &mut worker,
        &cfg,
        &hand,
        &kernel_candidate(&hand, "seed"),
        &plan(10_000),
    );
    let c = twin_seed(&hand, &kb);
    let art = compile_ok(&cfg, &kb, &c);
    let t0 = std::time::Instant::now();
    let on_kb = worker
        .evaluate_with(&kb, &[], &c, &art, &plan(10_000), Some(&mut runner))
        .expect("evaluate runs");
    println!(
        "{}: {} in {:.1} s (runner started {} time(s)): {}",
        kb.name,
        on_kb.verdict,
        t0.elapsed().as_secs_f64(),
        runner.starts(),
        on_kb.message
    );
    println!("{}", summary(&hand.name, &on_hand));
    println!("{}", summary(&kb.name, &on_kb));
    assert_eq!(on_kb.verdict, on_hand.verdict, "{on_kb:#?}");
    assert_eq!(
        delivered_tier(&on_kb),
        delivered_tier(&on_hand),
        "{on_kb:#?}"
    );
    assert!(
        on_kb
            .evidence
            .notes
            .iter()
            .any(|n| n.starts_with("reference: the problem's PyTorch module")),
        "{:?}",
        on_kb.evidence.notes
    );
    assert_eq!(runner.starts(), 1, "the runner stays warm");
}

#[test]
fn torch_gpu_twin_matmul_fp32_4096() {
    twins("matmul-fp32-4096");
}

#[test]
fn torch_gpu_twin_layernorm_16x64x256x256() {
    twins("layernorm-16x64x256x256");
}

#[test]
fn torch_gpu_twin_conv2d_3to96_k11s4p2() {
    twins("conv2d-3to96-k11s4p2");
}

#[test]
fn torch_gpu_twin_conv2d_relu_maxpool() {
    twins("conv2d-relu-maxpool");
}

/// kb-softmax-4096x65536's tensors are 1 GiB each: more than the worker's pipe carries in
/// one frame, so the cuda backend refuses it with that reason (kiln's failure, not a
/// verdict) until exported memory handles replace the round trip.
#[test]
fn torch_gpu_softmax_4096x65536_is_refused_with_the_frame_limit() {
    let Some((_d, cfg)) = gpu() else { return };
    let Some(mut runner) = runner(&cfg) else {
        return;
    };
    let Some(kb) = imported("softmax-4096x65536") else {
        return;
    };
    let c = twin_seed(&problem("softmax-4096x65536"), &kb);
    let art = compile_ok(&cfg, &kb, &c);
    let mut worker = WarmWorker::new(cfg.clone(), 50);
    let err = worker
        .evaluate_with(&kb, &[], &c, &art, &plan(10_000), Some(&mut runner))
        .expect_err("refused");
    assert!(err.to_string().contains("exported memory handles"), "{err}");
}
