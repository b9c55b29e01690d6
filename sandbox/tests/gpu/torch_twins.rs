//! GPU tests of the torch reference on the cuda backend (part of the `gpu` test binary):
//! the seed's problems imported from KernelBench format (`problems/kb-*`, written by
//! scripts/gpu-check.sh's import step) evaluated with the hand-written seed kernels of
//! their twins (`problems/<name>`), the kernels' buffers renamed to the imported tensor
//! names. Each must get the same verdict and precision tier as on its twin; on the softmax
//! (1 GiB tensors, carried to the runner in several frames each) so must a kernel that
//! skips the max subtraction (fails the shifted trial) and one that caches its outputs
//! (fails the fresh-input trial). The red-team scan (`torch_gpu_scan_finds_no_reference_results`)
//! looks for the torch reference's results in the memory a candidate can read. Skips,
//! saying why, without a GPU, without `KILN_PYTHON` (a python with torch for CUDA), or
//! without the imported folders. Every `SUMMARY` line is a result for docs/gpu-results.md.

use std::collections::BTreeMap;

use kiln_torch_runner::{ReferenceRunner, TorchRunner};
use kiln_types::{Arg, Role};

use super::*;

/// The lane's torch reference runner on the test GPU, or `None` (printed).
fn runner(cfg: &SandboxConfig) -> Option<ReferenceRunner> {
    let Ok(python) = std::env::var("KILN_PYTHON") else {
        println!("SKIP: KILN_PYTHON (a python with torch) is not set");
        return None;
    };
    let Some(helper) = TorchRunner::find(&cfg.worker_exe, &python, Duration::from_secs(900)) else {
        println!("SKIP: kiln_torch.py is not beside kiln-worker or in daemon/torch-runner/");
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

/// The red-team scan of issue #17: before the honest seed kernel writes `y`, a scan kernel
/// looks for anything that could be the torch reference's results — a finite value in
/// (0, 1], as every softmax output is — in every byte of device memory the candidate can
/// address: the output tensor `y` as handed to the run, a 1 GiB scratch buffer, and a
/// fresh 1 MiB block of the device heap (`malloc` in the kernel: never written by kiln).
/// It prints what it counted (device printf: the evaluation's output excerpt) on each of
/// its first runs (the correctness trials, each after the previous trial's reference).
///
/// It finds nothing, by construction of the evaluation: the torch reference runs in
/// another process with a CUDA context of its own, so no pointer in the candidate's
/// context reaches the runner's tensors or torch's caching allocator (whose blocks the
/// runner zeroes and frees after every call, `scrub_cuda`); the reference's answer
/// enters the candidate's context only as the contents of the output tensors, while no
/// candidate code runs, and those are zeroed after the comparison and poisoned (NaN)
/// before the next candidate run; scratch is zeroed before every run, and memory the
/// driver hands out (the heap) never holds another context's data. The scan counts the
/// plausible words of its input `x` too (about a third of N(0, 1) draws): proof that the
/// classifier finds such words where they are.
#[test]
fn torch_gpu_scan_finds_no_reference_results() {
    let Some((_d, cfg)) = gpu() else { return };
    let Some(mut runner) = runner(&cfg) else {
        return;
    };
    let Some(kb) = imported("softmax-4096x65536") else {
        return;
    };
    let hand = problem("softmax-4096x65536");
    let seed = kernel_candidate(&hand, "seed");
    let mut launches = vec![serde_json::json!({"kernel": "scan", "grid": [1024, 1, 1],
        "block": [256, 1, 1], "args": ["x", "y", "probe"]})];
    launches.extend(
        seed.launches
            .iter()
            .map(|l| serde_json::to_value(l).expect("launch")),
    );
    launches.push(serde_json::json!({"kernel": "report", "grid": [1, 1, 1],
        "block": [1, 1, 1], "args": []}));
    let mut c: Candidate = serde_json::from_value(serde_json::json!({
        "problem": hand.name, "language": "cuda",
        "source": format!("{}\n{SCAN}", seed.source), "launches": launches,
        "scratch": [{"name": "probe", "dtype": "f32", "elems": SCAN_PROBE_ELEMS}],
    }))
    .expect("candidate");
    c = renamed(&hand, &kb, c);
    let mut worker = WarmWorker::new(cfg.clone(), 50);
    let e = run_kb(&mut worker, &cfg, &mut runner, &kb, &c);
    let printed = e.evidence.output_excerpt.clone().unwrap_or_default();
    println!("{printed}");
    assert_eq!(
        e.verdict,
        Verdict::Ok,
        "the scanner is the honest seed: {e:#?}"
    );
    let scans: Vec<Vec<u64>> = printed
        .lines()
        .filter_map(|l| l.strip_prefix("SCAN "))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.split_once('='))
                .filter(|(k, _)| *k != "run")
                .filter_map(|(_, v)| v.parse().ok())
                .collect()
        })
        .collect();
    assert!(
        scans.len() == 6,
        "a scan in both runs of each of the three trials: {printed}"
    );
    // Runs 5 and 6 are the shifted trial (mean 1000): its inputs are not the plausible
    // values the classifier looks for, so only the first two trials prove it can find any.
    for (run, s) in scans.iter().enumerate() {
        let [
            y_not_poison,
            y_plausible,
            probe_nonzero,
            heap_plausible,
            x_plausible,
        ] = s[..]
        else {
            panic!("five counts: {s:?} in {printed}");
        };
        assert_eq!(
            (y_not_poison, y_plausible, probe_nonzero, heap_plausible),
            (0, 0, 0, 0),
            "{printed}"
        );
        assert!(
            run >= 4 || x_plausible > 4096 * 65536 / 5,
            "the classifier finds the input's words: {printed}"
        );
    }
}

/// Elements of the scan's scratch buffer (1 GiB).
const SCAN_PROBE_ELEMS: u64 = 1 << 28;

/// The scan and report kernels of [`torch_gpu_scan_finds_no_reference_results`].
const SCAN: &str = r#"
#define SCAN_RUNS 6
#define SCAN_N (4096ull * 65536ull)
#define SCAN_PROBE (1ull << 28)
#define SCAN_HEAP_FLOATS (1u << 18)
__device__ unsigned long long scan_counts[5];
__device__ unsigned scan_runs;
/* A finite float in (0, 1]: sign clear, not zero, at most 1.0f's bits. */
__device__ __forceinline__ bool plausible(unsigned bits) {
    return bits != 0u && bits <= 0x3F800000u;
}
extern "C" __global__ void scan(const float* x, const float* y, const float* probe) {
    if (scan_runs >= SCAN_RUNS) return;
    unsigned long long c[5] = {0, 0, 0, 0, 0};
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (unsigned long long i = first; i < SCAN_N; i += stride) {
        const unsigned yb = __float_as_uint(y[i]);
        c[0] += yb != 0x7FC17E55u;
        c[1] += plausible(yb);
        c[4] += plausible(__float_as_uint(x[i]));
    }
    for (unsigned long long i = first; i < SCAN_PROBE; i += stride) {
        c[2] += __float_as_uint(probe[i]) != 0u;
    }
    __shared__ unsigned* heap;
    if (blockIdx.x == 0) {
        if (threadIdx.x == 0) heap = (unsigned*)malloc(SCAN_HEAP_FLOATS * 4u);
        __syncthreads();
        if (heap) {
            for (unsigned i = threadIdx.x; i < SCAN_HEAP_FLOATS; i += blockDim.x) c[3] += plausible(heap[i]);
        } else if (threadIdx.x == 0) {
            c[3] += 1000000000ull;  /* no heap block: counted as a failure of the scan */
        }
        __syncthreads();
        if (threadIdx.x == 0 && heap) free(heap);
    }
    for (int k = 0; k < 5; ++k) if (c[k]) atomicAdd(&scan_counts[k], c[k]);
}
extern "C" __global__ void report() {
    if (scan_runs < SCAN_RUNS) {
        printf("SCAN run=%u y_not_poison=%llu y_plausible=%llu probe_nonzero=%llu heap_plausible=%llu x_plausible=%llu\n",
               scan_runs, scan_counts[0], scan_counts[1], scan_counts[2], scan_counts[3], scan_counts[4]);
        for (int k = 0; k < 5; ++k) scan_counts[k] = 0;
    }
    scan_runs += 1;
}
"#;

/// The runner on the GPU dies mid-trial (its module exits the process while it holds the
/// worker's shared tensors): the evaluation is kiln's failure naming the runner, never a
/// verdict; the same warm worker then evaluates the honest seed with a fresh runner.
#[test]
fn torch_gpu_runner_crash_mid_trial_is_kilns_failure() {
    let Some((_d, cfg)) = gpu() else { return };
    let Some(mut runner) = runner(&cfg) else {
        return;
    };
    let Some(kb) = imported("softmax-4096x65536") else {
        return;
    };
    let hand = problem("softmax-4096x65536");
    let seed = renamed(&hand, &kb, kernel_candidate(&hand, "seed"));
    let mut crashing = kb.clone();
    crashing.name = format!("{}-crashing", kb.name);
    let torch = crashing
        .reference
        .torch
        .as_mut()
        .expect("a torch reference");
    torch.source = torch.source.replace(
        "def forward(self",
        "def forward(self, *a, **k):\n        import os\n        os._exit(3)\n\n    def original_forward(self",
    );
    let mut c = seed.clone();
    c.problem = crashing.name.clone();
    let art = compile_ok(&cfg, &crashing, &c);
    let mut worker = WarmWorker::new(cfg.clone(), 50);
    let got = worker.evaluate_with(&crashing, &[], &c, &art, &plan(10_000), Some(&mut runner));
    let err = got.expect_err("a crashed runner is an error, not an evaluation");
    println!("crashed runner: {err}");
    assert!(err.to_string().contains("torch runner"), "{err}");
    let e = run_kb(&mut worker, &cfg, &mut runner, &kb, &seed);
    assert_eq!(e.verdict, Verdict::Ok, "{e:#?}");
    assert_eq!(runner.starts(), 2, "a fresh runner after the crash");
}
