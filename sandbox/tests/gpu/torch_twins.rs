//! GPU tests of the torch reference on the cuda backend (part of the `gpu` test binary):
//! the seed's problems imported from KernelBench format (`problems/kb-*`, written by
//! scripts/gpu-check.sh's import step) evaluated with the hand-written seed kernels of
//! their twins (`problems/<name>`), the kernels' buffers renamed to the imported tensor
//! names. Each must get the same verdict and precision tier as on its twin; on the softmax
//! (1 GiB tensors, carried to the runner in several frames each) so must a kernel that
//! skips the max subtraction (fails the shifted trial) and one that caches its outputs
//! (fails the fresh-input trial). Skips,
//! saying why, without a GPU, without `KILN_PYTHON` (a python with torch for CUDA), or
//! without the imported folders. Every `SUMMARY` line is a result for docs/gpu-results.md.

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

/// `c`, written against `hand`'s tensor names, written against `kb`'s (the tensors pair up
/// in order: forward arguments, parameters, outputs, as the import writes them).
fn renamed(hand: &ProblemSpec, kb: &ProblemSpec, mut c: Candidate) -> Candidate {
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

/// The evaluation of `c` on `kb` (its torch reference, through `runner`), printed.
fn run_kb(
    worker: &mut WarmWorker,
    cfg: &SandboxConfig,
    runner: &mut ReferenceRunner,
    kb: &ProblemSpec,
    c: &Candidate,
) -> Evaluation {
    let art = compile_ok(cfg, kb, c);
    let t0 = std::time::Instant::now();
    let e = worker
        .evaluate_with(kb, &[], c, &art, &plan(10_000), Some(runner))
        .expect("evaluate runs");
    println!(
        "{}: {} in {:.1} s (runner started {} time(s)): {}",
        kb.name,
        e.verdict,
        t0.elapsed().as_secs_f64(),
        runner.starts(),
        e.message
    );
    e
}

/// `make(hand)` evaluated on the hand-written problem `name` (its CUDA reference) and,
/// renamed, on `kb-NAME` (the torch reference on the GPU), on one warm worker: (on the
/// hand-written problem, on the imported one, the runner). `None` when a case skips.
fn on_twins(
    name: &str,
    make: impl Fn(&ProblemSpec) -> Candidate,
) -> Option<(Evaluation, Evaluation, ReferenceRunner)> {
    let (_d, cfg) = gpu()?;
    let mut runner = runner(&cfg)?;
    let kb = imported(name)?;
    let hand = problem(name);
    let mut worker = WarmWorker::new(cfg.clone(), 50);
    let c = make(&hand);
    let on_hand = run_on(&mut worker, &cfg, &hand, &c, &plan(10_000));
    let on_kb = run_kb(&mut worker, &cfg, &mut runner, &kb, &renamed(&hand, &kb, c));
    println!("{}", summary(&hand.name, &on_hand));
    println!("{}", summary(&kb.name, &on_kb));
    Some((on_hand, on_kb, runner))
}

fn twins(name: &str) {
    let Some((on_hand, on_kb, runner)) = on_twins(name, |hand| kernel_candidate(hand, "seed"))
    else {
        return;
    };
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

/// kb-softmax-4096x65536's tensors are 1 GiB each, twice a protocol frame: each travels
/// between the worker, the caller and the runner as several frames.
#[test]
fn torch_gpu_twin_softmax_4096x65536() {
    twins("softmax-4096x65536");
}

/// A row softmax that does not subtract the row maximum: right on N(0, 1) rows, but
/// exp(x) overflows on the shifted trial (mean 1000).
const SOFTMAX_NO_MAX: &str = r#"
extern "C" __global__ void softmax_no_max(const float* x, float* y, int rows, int cols) {
    __shared__ float red[256];
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + (long long)r * cols;
        float* yr = y + (long long)r * cols;
        float s = 0.0f;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c]);
        red[threadIdx.x] = s;
        __syncthreads();
        for (int w = blockDim.x / 2; w > 0; w >>= 1) {
            if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
            __syncthreads();
        }
        const float inv = 1.0f / red[0];
        __syncthreads();
        for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = expf(xr[c]) * inv;
    }
}
"#;

/// Appended to the seed: after the seed's kernel, row 0 of the first run's output is
/// kept in the module's own memory and served again on every later run.
const ROW0_CACHE: &str = r#"
__device__ float kiln_test_row0[65536];
__device__ int kiln_test_have_row0;
extern "C" __global__ void row0_cache(float* y, int cols) {
    const int have = kiln_test_have_row0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        if (have) y[c] = kiln_test_row0[c]; else kiln_test_row0[c] = y[c];
    }
    __syncthreads();
    if (threadIdx.x == 0) kiln_test_have_row0 = 1;
}
"#;

/// A candidate of the hand-written softmax from `source` and `launches` (JSON).
fn softmax_candidate(hand: &ProblemSpec, source: &str, launches: serde_json::Value) -> Candidate {
    serde_json::from_value(serde_json::json!({
        "problem": hand.name, "language": "cuda", "source": source, "launches": launches,
    }))
    .expect("candidate")
}

#[test]
fn torch_gpu_softmax_without_the_max_fails_the_shifted_trial() {
    let Some((on_hand, on_kb, _)) = on_twins("softmax-4096x65536", |hand| {
        softmax_candidate(
            hand,
            SOFTMAX_NO_MAX,
            serde_json::json!([{"kernel": "softmax_no_max", "grid": [4096, 1, 1],
                "block": [256, 1, 1], "args": ["x", "y", {"i32": 4096}, {"i32": 65536}]}]),
        )
    }) else {
        return;
    };
    for e in [&on_hand, &on_kb] {
        assert_eq!(e.verdict, Verdict::WrongAnswer, "{e:#?}");
        let trial = e.evidence.deciding_trial.as_deref().unwrap_or("");
        assert!(trial.contains("shifted"), "{trial}: {e:#?}");
    }
    assert_eq!(
        on_kb.evidence.deciding_trial,
        on_hand.evidence.deciding_trial
    );
}

#[test]
fn torch_gpu_softmax_caching_its_outputs_fails_the_fresh_input_trial() {
    let Some((on_hand, on_kb, _)) = on_twins("softmax-4096x65536", |hand| {
        let seed = kernel_candidate(hand, "seed");
        let mut launches = serde_json::to_value(&seed.launches).expect("launches");
        launches.as_array_mut().expect("a list").push(
            serde_json::json!({"kernel": "row0_cache", "grid": [1, 1, 1],
                "block": [256, 1, 1], "args": ["y", {"i32": 65536}]}),
        );
        softmax_candidate(hand, &format!("{}\n{ROW0_CACHE}", seed.source), launches)
    }) else {
        return;
    };
    for e in [&on_hand, &on_kb] {
        assert_eq!(e.verdict, Verdict::WrongAnswer, "{e:#?}");
        let trial = e.evidence.deciding_trial.as_deref().unwrap_or("");
        assert!(
            trial.starts_with("trial") && !trial.contains("shifted"),
            "the first fresh input set after the cached one decides: {trial}: {e:#?}"
        );
    }
    assert_eq!(
        on_kb.evidence.deciding_trial,
        on_hand.evidence.deciding_trial
    );
}
