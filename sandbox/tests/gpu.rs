//! GPU tests of the cuda backend, through the real jailed `kiln-worker` (run on a GPU host:
//! `scripts/gpu-check.sh`). Every test skips, with the reason printed, when
//! `kiln_gpu::available()` fails. Run with `--test-threads=1 --nocapture`.
//!
//! Red-team cases and the stability run go through one warm [`WarmWorker`] each, as kilnd's
//! lanes do: the honest candidate after a red-team kernel runs on the same worker.
//!
//! `KILN_WORKER` overrides the worker binary (the bundle's); scratch goes to a temp dir.
//!
//! `cxx_gpu_*`: kernels as people write them (issue #18) — every toolkit header of
//! `common::headers`, templated, namespaced and plain C++ kernels, a cooperative kernel
//! with `grid.sync()`, a 2-CTA cluster kernel with distributed shared memory — each checked
//! by the contract; a cooperative grid that cannot be resident is `invalid_launch`.
//!
//! Triton candidates' GPU tests are in `gpu/triton.rs` (module `triton`); the torch
//! reference on the GPU (imported KernelBench-format problems against their hand-written
//! twins) in `gpu/torch_twins.rs` (module `torch_twins`).

use std::path::PathBuf;
use std::time::Duration;

use kiln_sandbox::{SandboxConfig, WarmWorker};
use kiln_types::{
    Candidate, EvalPlan, Evaluation, PrecisionTier, ProblemSpec, TimingPlan, Verdict,
};

mod common;
#[path = "gpu/torch_twins.rs"]
mod torch_twins;
#[path = "gpu/triton.rs"]
mod triton;
#[path = "triton/plans.rs"]
mod triton_plans;

/// H200 peaks, as the daemon passes them (tensor-core flop rate, HBM3e bandwidth).
const PEAKS: (f64, f64) = (4.8e12, 990e12);

fn gpu() -> Option<(tempfile::TempDir, SandboxConfig)> {
    if let Err(e) = kiln_gpu::available() {
        println!("SKIP: cuda unavailable: {}", e.reason);
        return None;
    }
    let dir = tempfile::Builder::new()
        .prefix("kiln-gpu-test-")
        .tempdir()
        .expect("temp dir");
    let mut cfg = SandboxConfig::new(dir.path());
    cfg.worker_exe = std::env::var_os("KILN_WORKER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kiln-worker")));
    cfg.compile_timeout = Duration::from_secs(60);
    cfg.memory_limit_bytes = 4 << 30;
    assert!(
        cfg.use_first_gpu(),
        "available() found a GPU but use_first_gpu did not"
    );
    Some((dir, cfg))
}

fn problems_dir() -> PathBuf {
    std::env::var_os("KILN_PROBLEMS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../problems"))
}

fn problem(name: &str) -> ProblemSpec {
    ProblemSpec::load_dir(&problems_dir().join(name)).expect("problem loads")
}

fn plan(run_timeout_ms: u64) -> EvalPlan {
    EvalPlan {
        seed: rand_seed(),
        trials: 2,
        run_timeout_ms,
        timing: TimingPlan {
            warmup: 2,
            min_samples: 10,
            min_time_ms: 20.0,
            max_rse: 0.005,
            max_samples: 400,
            wall_cap_ms: 3000.0,
            recheck_fraction: 0.1,
            ..TimingPlan::default()
        },
        peak_bytes_per_s: PEAKS.0,
        peak_flops: PEAKS.1,
        plain: None,
        race: None,
        record_launches: false,
    }
}

fn rand_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(7);
    t ^ 0x9E37_79B9_7F4A_7C15
}

fn kernel_candidate(p: &ProblemSpec, which: &str) -> Candidate {
    let c = match which {
        "reference" => p.reference_candidate(kiln_types::BackendKind::Cuda),
        _ => p.seed_candidate("cuda"),
    };
    Candidate {
        note: None,
        ..c.unwrap_or_else(|| panic!("{} has no cuda {which}", p.name))
    }
}

fn compile_ok(cfg: &SandboxConfig, p: &ProblemSpec, c: &Candidate) -> Vec<u8> {
    let out = kiln_sandbox::compile(cfg, p, c).expect("compile runs");
    out.artifact
        .unwrap_or_else(|| panic!("{} failed to compile: {:#?}", c.problem, out.failure))
}

/// Like [`run`], on a warm worker.
fn run_on(
    worker: &mut WarmWorker,
    cfg: &SandboxConfig,
    p: &ProblemSpec,
    c: &Candidate,
    plan: &EvalPlan,
) -> Evaluation {
    let reference = compile_ok(cfg, p, &kernel_candidate(p, "reference"));
    let out = kiln_sandbox::compile(cfg, p, c).expect("compile runs");
    let Some(art) = out.artifact else {
        return out.failure.expect("failure");
    };
    let t0 = std::time::Instant::now();
    let e = worker
        .evaluate(p, &reference, c, &art, plan)
        .expect("evaluate runs");
    println!(
        "{} (worker: {:?}): {} in {:.3} s: {}",
        p.name,
        worker.stats(),
        e.verdict,
        t0.elapsed().as_secs_f64(),
        e.message
    );
    e
}

/// Compiles the reference and `c`, evaluates `c`; a compile failure is its evaluation.
fn run(cfg: &SandboxConfig, p: &ProblemSpec, c: &Candidate, plan: &EvalPlan) -> Evaluation {
    let reference = compile_ok(cfg, p, &kernel_candidate(p, "reference"));
    let out = kiln_sandbox::compile(cfg, p, c).expect("compile runs");
    let Some(art) = out.artifact else {
        return out.failure.expect("failure");
    };
    let t0 = std::time::Instant::now();
    let e = kiln_sandbox::evaluate(cfg, p, &reference, c, &art, plan).expect("evaluate runs");
    println!(
        "{}: {} in {:.1} s: {}",
        p.name,
        e.verdict,
        t0.elapsed().as_secs_f64(),
        e.message
    );
    e
}

fn sm_clock_median(e: &Evaluation) -> Option<f64> {
    e.telemetry.as_ref()?["gpu"]["summary"]["sm_mhz"]["median"].as_f64()
}

fn summary(name: &str, e: &Evaluation) -> String {
    let t = e.timing.clone().unwrap_or_default();
    let gpu = e
        .telemetry
        .as_ref()
        .map(|t| t["gpu"].clone())
        .unwrap_or_default();
    format!(
        "SUMMARY {name}: {} median {:.3} us n {} rse {:.3} % tier {:?} sm_mhz_median {} throttled_samples {} kernels {}",
        e.verdict,
        t.median_us,
        t.n,
        t.rse * 100.0,
        e.tier,
        sm_clock_median(e).map_or("-".into(), |v| format!("{v:.0}")),
        gpu["throttled_timing_samples"],
        e.telemetry
            .as_ref()
            .map(|t| t["kernels"].to_string())
            .unwrap_or_default()
    )
}

fn seed_ok(name: &str) {
    let Some((_dir, cfg)) = gpu() else { return };
    let p = problem(name);
    let e = run(&cfg, &p, &kernel_candidate(&p, "seed"), &plan(10_000));
    println!("{}", summary(name, &e));
    assert_eq!(e.verdict, Verdict::Ok, "{e:#?}");
    let t = e.timing.as_ref().expect("timing");
    assert!(t.n >= 10 && t.median_us > 0.0, "{t:?}");
    let tele = e.telemetry.as_ref().expect("telemetry");
    assert!(tele["gpu"].is_object(), "{tele}");
    assert!(tele["jail"].is_object(), "{tele}");
}

#[test]
fn gpu_seed_vecadd_cuda_1m() {
    seed_ok("vecadd-cuda-1m");
}
#[test]
fn gpu_seed_rowsum_cuda_4096x1024() {
    seed_ok("rowsum-cuda-4096x1024");
}
#[test]
fn gpu_seed_softmax_4096x65536() {
    seed_ok("softmax-4096x65536");
}
#[test]
fn gpu_seed_layernorm_16x64x256x256() {
    seed_ok("layernorm-16x64x256x256");
}
#[test]
fn gpu_seed_matmul_fp32_4096() {
    seed_ok("matmul-fp32-4096");
}
#[test]
fn gpu_seed_conv2d_3to96_k11s4p2() {
    seed_ok("conv2d-3to96-k11s4p2");
}
#[test]
fn gpu_seed_conv2d_relu_maxpool() {
    seed_ok("conv2d-relu-maxpool");
}
#[test]
fn gpu_seed_matmul_fp16_4096() {
    seed_ok("matmul-fp16-4096");
}
#[test]
fn gpu_seed_sdpa_fp16_b4h16s2048d64() {
    seed_ok("sdpa-fp16-b4h16s2048d64");
}
#[test]
fn gpu_seed_matmul_fp32_4096_strict() {
    seed_ok("matmul-fp32-4096-strict");
}

/// A vecadd-cuda-1m candidate with this kernel body (`a`, `b`, `y`, `n`; `i` the index).
fn vecadd(body: &str) -> Candidate {
    let source = format!(
        "extern \"C\" __global__ void k(const float* a, const float* b, float* y, int n) {{\n\
         long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n{body}\n}}\n"
    );
    serde_json::from_value(serde_json::json!({
        "problem": "vecadd-cuda-1m", "language": "cuda", "source": source,
        "launches": [{"kernel": "k", "grid": [4096, 1, 1], "block": [256, 1, 1],
                      "args": ["a", "b", "y", {"i32": 1048576}]}]
    }))
    .expect("candidate")
}

fn redteam(body: &str, run_timeout_ms: u64) -> Option<Evaluation> {
    let (_dir, cfg) = gpu()?;
    let p = problem("vecadd-cuda-1m");
    let mut worker = WarmWorker::new(cfg.clone(), 100);
    // A warm worker: an honest candidate first, then the red-team kernel, then another
    // honest one, which must evaluate normally on the same worker.
    let first = run_on(
        &mut worker,
        &cfg,
        &p,
        &kernel_candidate(&p, "seed"),
        &plan(5_000),
    );
    assert_eq!(first.verdict, Verdict::Ok, "{first:#?}");
    let e = run_on(&mut worker, &cfg, &p, &vecadd(body), &plan(run_timeout_ms));
    let before = worker.stats();
    let honest = run_on(
        &mut worker,
        &cfg,
        &p,
        &kernel_candidate(&p, "seed"),
        &plan(5_000),
    );
    assert_eq!(
        honest.verdict,
        Verdict::Ok,
        "after the red-team kernel: {honest:#?}"
    );
    let after = worker.stats();
    let fresh = after.workers_started > before.workers_started;
    println!(
        "worker after {}: {} (workers started {} -> {})",
        e.verdict,
        if fresh {
            "fresh worker"
        } else {
            "same warm worker"
        },
        before.workers_started,
        after.workers_started
    );
    // A CUDA fault or a timeout ends the context: the next candidate needs a fresh
    // worker; any other verdict (a printf flood included) leaves the warm worker serving.
    let ends_context = e.verdict == Verdict::Timeout
        || e.evidence
            .fault
            .as_deref()
            .is_some_and(|f| f.contains("CUDA_ERROR"));
    assert_eq!(fresh, ends_context, "{e:#?}");
    Some(e)
}

#[test]
fn redteam_gpu_out_of_bounds_write() {
    let Some(e) = redteam("if (i < n) y[i + (1LL << 36)] = a[i] + b[i];", 5_000) else {
        return;
    };
    assert_eq!(e.verdict, Verdict::RuntimeFault, "{e:#?}");
    let fault = e.evidence.fault.clone().unwrap_or_default();
    assert!(fault.contains("CUDA_ERROR"), "{fault}");
}

#[test]
fn redteam_gpu_store_just_past_the_end() {
    // 1 KiB past the end of y: inside the same allocation granule, where the GPU does not
    // fault; kiln's guard after the buffer sees it.
    let Some(e) = redteam(
        "if (i < n) y[i] = a[i] + b[i]; if (i < 256) y[n + i] = 1.0f;",
        5_000,
    ) else {
        return;
    };
    assert_eq!(e.verdict, Verdict::RuntimeFault, "{e:#?}");
    let fault = e.evidence.fault.clone().unwrap_or_default();
    assert!(
        fault.contains("out-of-bounds write") && fault.contains("tensor y"),
        "{fault}"
    );
}

#[test]
fn redteam_gpu_infinite_loop() {
    let Some(e) = redteam(
        // Reads an input through a volatile pointer, so the compiler cannot prove the loop
        // ends or drop it (a side-effect-free infinite loop may legally be removed in C++:
        // the first H200 run, 2026-11-30, showed a `volatile int` local loop optimised out).
        "while (*(volatile const float*)a == *(volatile const float*)a) { __nanosleep(1000); } if (i < n) y[i] = a[i] + b[i];",
        1_000,
    ) else {
        return;
    };
    assert_eq!(e.verdict, Verdict::Timeout, "{e:#?}");
}

#[test]
fn redteam_gpu_printf_flood() {
    let Some(e) = redteam(
        // One thread per block prints (every thread printing makes a launch so slow that
        // it ends as a timeout instead): 4096 blocks x 8 lines fill the 256 KiB printf
        // FIFO at each launch, so the 1 MiB output limit goes within a few runs.
        "if (i < n) y[i] = a[i] + b[i]; if (threadIdx.x == 0) for (int r = 0; r < 8; ++r) printf(\"flood %lld %d\\n\", i, r);",
        5_000,
    ) else {
        return;
    };
    assert_eq!(e.verdict, Verdict::RuntimeFault, "{e:#?}");
    assert!(e.message.contains("output flood"), "{}", e.message);
    let excerpt = e.evidence.output_excerpt.clone().unwrap_or_default();
    assert!(excerpt.contains("flood"), "excerpt: {excerpt:?}");
}

#[test]
fn redteam_gpu_unwritten_output() {
    let Some(e) = redteam("if (i < n / 2) y[i] = a[i] + b[i];", 5_000) else {
        return;
    };
    assert_eq!(e.verdict, Verdict::IncompleteOutput, "{e:#?}");
    assert_eq!(e.evidence.unwritten[0].1, 1048576 / 2, "{e:#?}");
}

#[test]
fn redteam_gpu_cached_results() {
    let src = "}\n__device__ float cache_y[1048576];\n__device__ unsigned char have[1048576];\n\
               extern \"C\" __global__ void k2(const float* a, const float* b, float* y, int n) {\n\
               long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n\
               if (i >= n) return;\n\
               if (have[i]) { y[i] = cache_y[i]; return; }\n\
               y[i] = a[i] + b[i]; cache_y[i] = y[i]; have[i] = 1;";
    let Some((_dir, cfg)) = gpu() else { return };
    let p = problem("vecadd-cuda-1m");
    let mut c = vecadd(src);
    c.launches[0].kernel = "k2".into();
    let e = run(&cfg, &p, &c, &plan(5_000));
    assert_eq!(e.verdict, Verdict::WrongAnswer, "{e:#?}");
}

#[test]
fn redteam_gpu_inputs_overwritten() {
    let Some(e) = redteam(
        "if (i < n) { y[i] = a[i] + b[i]; ((float*)a)[i] = 0.0f; }",
        5_000,
    ) else {
        return;
    };
    assert_eq!(e.verdict, Verdict::InputTampered, "{e:#?}");
    assert_eq!(e.evidence.tampered_inputs, vec!["a".to_string()], "{e:#?}");
}

#[test]
fn redteam_gpu_race() {
    // Every block stores its id to one global, waits, and reads it back: which block wins
    // depends on scheduling, so which elements come out wrong changes from run to run.
    let src = "}\n__device__ volatile int last;\n\
               extern \"C\" __global__ void k2(const float* a, const float* b, float* y, int n) {\n\
               long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n\
               if (threadIdx.x == 0) last = blockIdx.x;\n\
               __nanosleep(2000);\n\
               float extra = (threadIdx.x == 0 && last != (int)blockIdx.x) ? 1.0f : 0.0f;\n\
               if (i < n) y[i] = a[i] + b[i] + extra;";
    let Some((_dir, cfg)) = gpu() else { return };
    let p = problem("vecadd-cuda-1m");
    let mut c = vecadd(src);
    c.launches[0].kernel = "k2".into();
    let e = run(&cfg, &p, &c, &plan(5_000));
    assert_eq!(e.verdict, Verdict::Nondeterministic, "{e:#?}");
}

/// The precision tier an evaluation reports, or for a failed one the tier its worst
/// relative L2 error reads as (fp32-faithful up to 1e-5, else coarse).
fn delivered_tier(e: &Evaluation) -> PrecisionTier {
    let worst = e
        .evidence
        .errors
        .iter()
        .map(|m| m.rel_l2)
        .fold(0.0, f64::max);
    e.tier.unwrap_or(if worst <= 1e-5 {
        PrecisionTier::Fp32Faithful
    } else {
        PrecisionTier::Coarse
    })
}

/// A 4096² matmul candidate: kernel `mm(A, B, C, M, N, K)`, 16 × 16 tiles.
fn matmul_candidate(problem: &str, source: &str) -> Candidate {
    serde_json::from_value(serde_json::json!({
        "problem": problem, "language": "cuda", "source": source,
        "launches": [{"kernel": "mm", "grid": [256, 256, 1], "block": [16, 16, 1],
                      "args": ["A", "B", "C", {"i32": 4096}, {"i32": 4096}, {"i32": 4096}]}]
    }))
    .expect("candidate")
}

/// A tiled fp32 matmul whose operands are rounded to fp16's 10-bit mantissa.
fn fp16_matmul(problem: &str) -> Candidate {
    let source = r#"
__device__ __forceinline__ float to_half_precision(float x) {
    unsigned int u = __float_as_uint(x);
    u = (u + 0x1000u) & 0xFFFFE000u;   // keep 10 mantissa bits, round half up
    return __uint_as_float(u);
}
extern "C" __global__ void mm(const float* A, const float* B, float* C, int M, int N, int K) {
    __shared__ float As[16][16];
    __shared__ float Bs[16][16];
    int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < K; t += 16) {
        As[threadIdx.y][threadIdx.x] = to_half_precision(A[row * K + t + threadIdx.x]);
        Bs[threadIdx.y][threadIdx.x] = to_half_precision(B[(t + threadIdx.y) * N + col]);
        __syncthreads();
        for (int k = 0; k < 16; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    C[row * N + col] = acc;
}
"#;
    matmul_candidate(problem, source)
}

#[test]
fn redteam_gpu_fp16_in_fp32_problem() {
    let Some((_dir, cfg)) = gpu() else { return };
    let p = problem("matmul-fp32-4096");
    let e = run(&cfg, &p, &fp16_matmul(&p.name), &plan(10_000));
    println!("{}", summary("fp16-in-matmul-fp32-4096", &e));
    assert!(delivered_tier(&e) > PrecisionTier::Fp32Faithful, "{e:#?}");
    let strict = problem("matmul-fp32-4096-strict");
    let e = run(&cfg, &strict, &fp16_matmul(&strict.name), &plan(10_000));
    assert_eq!(e.verdict, Verdict::WrongAnswer, "{e:#?}");
    println!("strict verdict says: {}", e.message);
}

#[test]
fn gpu_stability_twenty_medians() {
    let Some((_dir, cfg)) = gpu() else { return };
    let main = problem("layernorm-16x64x256x256");
    let others = [problem("vecadd-cuda-1m"), problem("rowsum-cuda-4096x1024")];
    let main_c = kernel_candidate(&main, "seed");
    let main_ref = compile_ok(&cfg, &main, &kernel_candidate(&main, "reference"));
    let main_art = compile_ok(&cfg, &main, &main_c);
    let other_arts: Vec<(Vec<u8>, Candidate, Vec<u8>)> = others
        .iter()
        .map(|p| {
            let c = kernel_candidate(p, "seed");
            (
                compile_ok(&cfg, p, &kernel_candidate(p, "reference")),
                c.clone(),
                compile_ok(&cfg, p, &c),
            )
        })
        .collect();
    let mut worker = WarmWorker::new(cfg.clone(), 1000);
    let mut medians = Vec::new();
    for i in 0..20 {
        let e = worker
            .evaluate(&main, &main_ref, &main_c, &main_art, &plan(10_000))
            .expect("evaluate runs");
        assert_eq!(e.verdict, Verdict::Ok, "{e:#?}");
        let t = e.timing.clone().unwrap_or_default();
        println!(
            "run {i:2}: median {:.3} us n {} rse {:.3} %",
            t.median_us,
            t.n,
            t.rse * 100.0
        );
        medians.push(t.median_us);
        let (r, c, a) = &other_arts[i % other_arts.len()];
        let o = worker
            .evaluate(&others[i % others.len()], r, c, a, &plan(10_000))
            .expect("evaluate runs");
        assert_eq!(o.verdict, Verdict::Ok, "{o:#?}");
    }
    let n = medians.len() as f64;
    let mean = medians.iter().sum::<f64>() / n;
    let sd = (medians.iter().map(|m| (m - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    let cv = sd / mean;
    println!(
        "STABILITY layernorm-16x64x256x256 seed: 20 medians, mean {mean:.3} us, CV {:.3} % (target <= 0.5 %: {}); worker {:?}",
        cv * 100.0,
        if cv <= 0.005 { "met" } else { "MISSED" },
        worker.stats()
    );
    assert_eq!(
        worker.stats().workers_started,
        1,
        "one warm worker served all 40"
    );
}

/// The timer evidence of a GPU evaluation, printed with every figure.
fn timer_of(name: &str, e: &Evaluation) -> kiln_types::TimerEvidence {
    assert_eq!(e.verdict, Verdict::Ok, "{e:#?}");
    let t = e.timing.clone().expect("timing");
    let tm = t
        .timer
        .clone()
        .expect("a GPU timing carries its timer evidence");
    let med = |f: Option<kiln_types::FigureSummary>| {
        f.map_or("-".to_string(), |f| format!("{:.3} us", f.median_us))
    };
    println!(
        "TIMER {name}: median {:.3} us by {} (asked {}) from {}{}; events {} kernel_sum {} kernel_span {}; launches {} records_missing {} {:?}",
        t.median_us,
        tm.figure.name(),
        tm.asked.name(),
        tm.source,
        tm.fallback
            .as_ref()
            .map_or(String::new(), |f| format!(" (fallback: {f})")),
        med(Some(tm.events)),
        med(tm.kernel_sum),
        med(tm.kernel_span),
        tm.launches,
        tm.records_missing,
        tm.records_missing_reason
    );
    tm
}

#[test]
fn cupti_gpu_vecadd_kernel_time_is_below_the_event_time() {
    let Some((_dir, cfg)) = gpu() else { return };
    let p = problem("vecadd-cuda-1m");
    let e = run(&cfg, &p, &kernel_candidate(&p, "seed"), &plan(10_000));
    let tm = timer_of("vecadd-cuda-1m", &e);
    assert_eq!(tm.source, "cupti", "CUPTI did not run: {:?}", tm.fallback);
    assert_eq!(tm.figure, kiln_types::TimingFigure::KernelSpan);
    assert_eq!((tm.launches, tm.records_missing), (1, 0));
    let (sum, span) = (
        tm.kernel_sum.expect("sum").median_us,
        tm.kernel_span.expect("span").median_us,
    );
    // One launch: the span is the kernel's duration; events add the overhead around it.
    assert!((span - sum).abs() < 1e-6, "sum {sum} span {span}");
    assert!(span < tm.events.median_us, "{tm:?}");
    let t = e.timing.expect("timing");
    assert!(
        (t.median_us - span).abs() < 1e-9,
        "the statistics are of the span"
    );
}

#[test]
fn cupti_gpu_layernorm_sums_its_three_launches_and_the_problem_picks_the_figure() {
    let Some((_dir, cfg)) = gpu() else { return };
    let mut p = problem("layernorm-16x64x256x256");
    p.timing_figure = Some(kiln_types::TimingFigure::KernelSum);
    let c = kernel_candidate(&p, "seed");
    let launches = c.launches.len() as u32;
    let e = run(&cfg, &p, &c, &plan(10_000));
    let tm = timer_of("layernorm-16x64x256x256", &e);
    assert_eq!(tm.source, "cupti", "CUPTI did not run: {:?}", tm.fallback);
    assert_eq!(
        (tm.figure, tm.launches),
        (kiln_types::TimingFigure::KernelSum, launches)
    );
    assert_eq!(tm.records_missing, 0);
    let sum = tm.kernel_sum.expect("sum");
    let span = tm.kernel_span.expect("span");
    assert!(
        sum.median_us <= span.median_us && span.median_us <= tm.events.median_us,
        "{tm:?}"
    );
    // The gaps between dependent launches on one stream are microseconds, not more.
    assert!(
        span.median_us - sum.median_us < 10.0 * f64::from(launches),
        "{tm:?}"
    );
    let t = e.timing.expect("timing");
    assert!(
        (t.median_us - sum.median_us).abs() < 1e-9,
        "the statistics are of the sum"
    );
}

#[test]
fn cupti_gpu_launch_time_reads_the_empty_kernel_below_its_events() {
    // `kiln-worker launch --time` on the timer floor's empty kernel (kiln bench agreement's
    // calibration): kiln's own samples, CUPTI records found for every one.
    let Some((dir, cfg)) = gpu() else { return };
    use kiln_sandbox::engine::cuda::launch_timing::floor_spec;
    use kiln_sandbox::engine::cuda::launcher::Launched;
    let spec = dir.path().join("floor.json");
    std::fs::write(&spec, serde_json::to_vec(&floor_spec()).expect("json")).expect("write");
    let out = std::process::Command::new(&cfg.worker_exe)
        .arg("launch")
        .arg("--spec")
        .arg(&spec)
        .args(["--runs", "30", "--time"])
        .output()
        .expect("kiln-worker runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout.lines().last().expect("a JSON line");
    let launched: Launched = serde_json::from_str(line).expect("the launcher's JSON");
    let t = launched.timing.expect("--time gives a timing");
    assert_eq!(t.source, "cupti", "CUPTI did not run: {:?}", t.fallback);
    assert_eq!((t.samples, t.records_missing), (30, 0));
    let span = t.kernel_span_us.expect("a span");
    assert_eq!(
        t.kernel_sum_us,
        Some(span),
        "one launch: sum and span agree"
    );
    // No work: a fraction of a microsecond by its record (0.64 µs on an H200), well below
    // what events read around it and below the smallest seed kernels.
    assert!(span > 0.0 && span < t.events_us && span < 3.0, "{t:?}");
    println!(
        "FLOOR {}: kernel span {span:.3} us, events {:.3} us ({} samples)",
        launched.problem, t.events_us, t.samples
    );
}

#[test]
fn cupti_gpu_turned_off_falls_back_to_events_and_says_so() {
    let Some((_dir, mut cfg)) = gpu() else { return };
    cfg.cupti = kiln_gpu::cupti::CuptiSetting::Off;
    let p = problem("vecadd-cuda-1m");
    let e = run(&cfg, &p, &kernel_candidate(&p, "seed"), &plan(10_000));
    let tm = timer_of("vecadd-cuda-1m (cupti off)", &e);
    assert_eq!(tm.source, "events");
    assert_eq!(
        (tm.figure, tm.asked),
        (
            kiln_types::TimingFigure::Events,
            kiln_types::TimingFigure::KernelSpan
        )
    );
    assert!(
        tm.fallback.as_deref().is_some_and(|f| f.contains("off")),
        "{tm:?}"
    );
    assert!(tm.kernel_sum.is_none() && tm.kernel_span.is_none());
    let t = e.timing.expect("timing");
    assert!((t.median_us - tm.events.median_us).abs() < 1e-9);
}

/// A matmul computing in fp16 arithmetic the way the seed's kernel did: each f32 operand
/// split into an fp16 high part and an fp16 low part (`x ≈ hi + lo`), three products
/// accumulated in f32. Fine at normal magnitudes; at small ones fp16's range
/// (subnormal below 6.1e-5) eats the mantissa.
fn fp16_hilo_matmul(problem: &str) -> Candidate {
    let source = r#"
__device__ __forceinline__ float via_half(float x) {
    unsigned short h;
    float y;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    asm("cvt.f32.f16 %0, %1;" : "=f"(y) : "h"(h));
    return y;
}
extern "C" __global__ void mm(const float* A, const float* B, float* C, int M, int N, int K) {
    __shared__ float Ah[16][16], Al[16][16], Bh[16][16], Bl[16][16];
    int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < K; t += 16) {
        float a = A[row * K + t + threadIdx.x], b = B[(t + threadIdx.y) * N + col];
        float ah = via_half(a), bh = via_half(b);
        Ah[threadIdx.y][threadIdx.x] = ah; Al[threadIdx.y][threadIdx.x] = via_half(a - ah);
        Bh[threadIdx.y][threadIdx.x] = bh; Bl[threadIdx.y][threadIdx.x] = via_half(b - bh);
        __syncthreads();
        for (int k = 0; k < 16; ++k) {
            acc += Ah[threadIdx.y][k] * Bh[k][threadIdx.x];
            acc += Ah[threadIdx.y][k] * Bl[k][threadIdx.x];
            acc += Al[threadIdx.y][k] * Bh[k][threadIdx.x];
        }
        __syncthreads();
    }
    C[row * N + col] = acc;
}
"#;
    matmul_candidate(problem, source)
}

#[test]
fn gpu_fp16_matmul_is_ok_at_1e_2_and_reads_fp16_like() {
    let Some((_dir, cfg)) = gpu() else { return };
    let mut worker = WarmWorker::new(cfg.clone(), 100);
    let p = problem("matmul-fp32-4096");
    let e = run_on(
        &mut worker,
        &cfg,
        &p,
        &fp16_hilo_matmul(&p.name),
        &plan(10_000),
    );
    println!("{}", summary("fp16-hilo-matmul-fp32-4096", &e));
    println!("notes: {:?}", e.evidence.notes);
    assert_eq!(e.verdict, Verdict::Ok, "{e:#?}");
    assert_eq!(e.tier, Some(PrecisionTier::Fp16Like), "{e:#?}");
    let strict = problem("matmul-fp32-4096-strict");
    let e = run_on(
        &mut worker,
        &cfg,
        &strict,
        &fp16_hilo_matmul(&strict.name),
        &plan(10_000),
    );
    println!("strict: {} — {}", e.verdict, e.message);
    assert_eq!(e.verdict, Verdict::WrongAnswer, "{e:#?}");
    assert!(e.message.contains("Fp16Like"), "{}", e.message);
}

#[test]
fn gpu_compare_kernel_matches_the_host_rules() {
    use kiln_gpu::compare::Against;
    use kiln_sandbox::engine::contract::compare;
    use kiln_types::{Dtype, Tolerance};
    if let Err(e) = kiln_gpu::available() {
        println!("SKIP: cuda unavailable: {}", e.reason);
        return;
    }
    let gpu = kiln_gpu::Gpu::open(0).expect("gpu opens");
    let n = 1usize << 20;
    let mut want = vec![0f32; n];
    let mut got = vec![0f32; n];
    let mut other = vec![0f32; n];
    let mut x = 0x1234_5678u32;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        (x as f32 / u32::MAX as f32) * 2.0 - 1.0
    };
    for i in 0..n {
        want[i] = rnd() * 100.0;
        got[i] = want[i] + rnd() * 1e-3;
        other[i] = got[i];
    }
    for i in (0..n).step_by(9973) {
        got[i] += 5.0; // mismatches
    }
    got[17] = f32::NAN;
    want[18] = f32::NAN;
    got[18] = f32::NAN; // NaN meets NaN: close
    got[19] = f32::INFINITY;
    got[20] = f32::from_bits(0x7FC1_7E55); // the poison pattern
    other[21] += 1e-6;
    other[22] += 3.0;
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|f| f.to_le_bytes()).collect() };
    let up = |v: &[f32]| {
        let b = gpu.alloc(n * 4).expect("alloc");
        gpu.upload(&b, 0, v).expect("upload");
        b
    };
    let (g, w, o) = (up(&got), up(&want), up(&other));
    let tol = Tolerance {
        atol: 1e-2,
        rtol: 1e-2,
    };
    let c = gpu
        .compare(
            &g,
            Dtype::F32,
            n as u64,
            Against {
                want: Some(&w),
                other: Some(&o),
                atol: tol.atol,
                rtol: tol.rtol,
            },
        )
        .expect("compare");
    let m = compare::metrics("y", &bytes(&got), &bytes(&want), Dtype::F32, tol);
    println!("gpu {c:?}\nhost {m:?}");
    assert_eq!(c.mismatches, m.mismatches);
    assert_eq!(c.nonfinite_mismatches, m.nonfinite_mismatches);
    assert_eq!(
        c.first_mismatch,
        Some(0),
        "index 0 is a mismatch (step 9973)"
    );
    assert_eq!(c.max_abs, m.max_abs);
    assert_eq!(c.max_rel, m.max_rel);
    assert!(
        (c.rel_l2() - m.rel_l2).abs() <= 1e-9 * m.rel_l2.max(1.0),
        "{} vs {}",
        c.rel_l2(),
        m.rel_l2
    );
    assert_eq!(c.unwritten, 1);
    assert_eq!(c.first_unwritten, Some(20));
    assert_eq!(
        c.bitwise_diffs,
        compare::bitwise_diffs(&bytes(&got), &bytes(&other), Dtype::F32)
    );
    let disagree = (0..n)
        .filter(|&i| {
            got[i].to_bits() != other[i].to_bits()
                && !tol.accepts(f64::from(got[i]), f64::from(other[i]))
        })
        .count() as u64;
    assert_eq!(c.disagreements, disagree);
}

// ---- Baselines (issue 5) ------------------------------------------------------------
//
// `cargo test --release -p kiln-sandbox --test gpu -- baseline --nocapture --test-threads=1`
//
// `KILN_LIBRARY_DIRS=/a:/b` adds directories for cuBLAS/cuDNN (e.g. torch's
// site-packages/nvidia/cudnn/lib); `KILN_PYTHON` picks the python for torch eager
// (default python3). Each test prints `BASELINE` lines; `baseline_table_seed_problems`
// prints the markdown rows for docs/gpu-results.md.

use kiln_types::baseline::{BaselineResult, BaselineStatus};

fn baseline_gpu() -> Option<(tempfile::TempDir, SandboxConfig)> {
    let (dir, mut cfg) = gpu()?;
    if let Ok(extra) = std::env::var("KILN_LIBRARY_DIRS") {
        let joined = [cfg.library_path.clone().unwrap_or_default(), extra]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(":");
        cfg.library_path = Some(joined);
    }
    Some((dir, cfg))
}

fn baseline_plan() -> EvalPlan {
    let mut p = plan(10_000);
    p.timing.wall_cap_ms = 5000.0;
    p
}

fn measure(cfg: &SandboxConfig, p: &ProblemSpec) -> Vec<BaselineResult> {
    let reference = compile_ok(cfg, p, &kernel_candidate(p, "reference"));
    let t0 = std::time::Instant::now();
    let r = kiln_sandbox::measure_baselines(
        cfg,
        p,
        &reference,
        &baseline_plan(),
        kiln_sandbox::TorchSource::Off("not asked for here".into()),
    )
    .expect("baselines run");
    println!(
        "{}: baselines in {:.1} s",
        p.name,
        t0.elapsed().as_secs_f64()
    );
    for b in &r {
        println!(
            "BASELINE {} {} [{}] {:?} median {:?} us n {:?} rse {:?} rel_l2 {:?} mismatches {:?}: {}",
            p.name,
            b.name,
            b.precision,
            b.status,
            b.timing.as_ref().map(|t| t.median_us),
            b.timing.as_ref().map(|t| t.n),
            b.timing.as_ref().map(|t| t.rse),
            b.rel_l2,
            b.mismatches,
            b.detail
        );
    }
    r
}

fn find<'a>(r: &'a [BaselineResult], name: &str) -> &'a BaselineResult {
    r.iter()
        .find(|b| b.name == name)
        .unwrap_or_else(|| panic!("no baseline {name} in {r:#?}"))
}

/// A measured baseline: positive times, the stop rule's reason.
fn assert_measured(b: &BaselineResult) {
    assert_eq!(b.status, BaselineStatus::Measured, "{b:#?}");
    let t = b.timing.as_ref().expect("timing");
    assert!(t.median_us > 0.0 && t.min_us > 0.0 && t.n >= 2, "{t:#?}");
    assert!(!t.stop_reason.is_empty());
}

/// `Some(())` when the library is usable; prints SKIP otherwise.
fn library_measured(b: &BaselineResult) -> Option<()> {
    if b.status == BaselineStatus::Unavailable {
        println!("SKIP: {} unavailable: {}", b.name, b.detail);
        return None;
    }
    Some(())
}

#[test]
fn baseline_reference_only_for_a_torch_only_problem() {
    let Some((_d, cfg)) = baseline_gpu() else {
        return;
    };
    let p = problem("softmax-4096x65536");
    let r = measure(&cfg, &p);
    assert_eq!(
        r.len(),
        3,
        "softmax names only torch: the worker times the reference, torch is off: {r:#?}"
    );
    assert_measured(find(&r, "reference"));
    assert_eq!(find(&r, "torch-eager").status, BaselineStatus::Unavailable);
}

#[test]
fn baseline_cublas_matmul_strict_matches_the_reference_and_tf32_is_labelled() {
    let Some((_d, cfg)) = baseline_gpu() else {
        return;
    };
    let r = measure(&cfg, &problem("matmul-fp32-4096"));
    assert_measured(find(&r, "reference"));
    let strict = find(&r, "cublas-fp32");
    let Some(()) = library_measured(strict) else {
        return;
    };
    assert_measured(strict);
    assert_eq!(strict.precision, "fp32");
    assert_eq!(
        strict.mismatches,
        Some(0),
        "strict cuBLAS within 1e-2: {strict:#?}"
    );
    assert!(
        strict.rel_l2.is_some_and(|e| e < 1e-5),
        "fp32-faithful: {strict:#?}"
    );
    let tf32 = find(&r, "cublas-tf32");
    assert_measured(tf32);
    assert_eq!(tf32.precision, "tf32");
    assert!(
        tf32.rel_l2 > strict.rel_l2,
        "TF32 is coarser than strict fp32: {tf32:#?}"
    );
}

#[test]
fn baseline_cublas_fp16_matmul() {
    let Some((_d, cfg)) = baseline_gpu() else {
        return;
    };
    let r = measure(&cfg, &problem("matmul-fp16-4096"));
    let h = find(&r, "cublas-fp16");
    let Some(()) = library_measured(h) else {
        return;
    };
    assert_measured(h);
    assert_eq!(h.mismatches, Some(0), "{h:#?}");
}

#[test]
fn baseline_cudnn_conv_tries_every_algorithm() {
    let Some((_d, cfg)) = baseline_gpu() else {
        return;
    };
    for name in ["conv2d-3to96-k11s4p2", "conv2d-relu-maxpool"] {
        let r = measure(&cfg, &problem(name));
        assert_measured(find(&r, "reference"));
        let strict = find(&r, "cudnn-fp32");
        let Some(()) = library_measured(strict) else {
            return;
        };
        assert_measured(strict);
        assert_eq!(strict.mismatches, Some(0), "{strict:#?}");
        assert!(
            strict.detail.contains("implicit_gemm"),
            "every algorithm listed: {}",
            strict.detail
        );
        assert_measured(find(&r, "cudnn-tf32"));
    }
}

#[test]
fn baseline_torch_eager_when_torch_is_here() {
    let Some((_d, cfg)) = baseline_gpu() else {
        return;
    };
    let python = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    let helper =
        kiln_torch_runner::TorchRunner::find(&cfg.worker_exe, &python, Duration::from_secs(600))
            .expect("kiln_torch.py beside kiln-worker or in daemon/torch-runner/");
    let p = problem("softmax-4096x65536");
    let r = torch_kinds(&cfg, &helper, &p);
    println!("BASELINE torch {r:#?}");
    for name in ["torch-eager-fp32", "torch-compile-fp32"] {
        let b = find(&r, name);
        let Some(()) = library_measured(b) else {
            return;
        };
        assert_measured(b);
        assert_eq!(b.mismatches, Some(0), "{b:#?}");
    }
}

/// torch eager and torch.compile of the imported seed problems' own modules
/// (`[baseline.torch] op = "module"`), beside the hand-written problems' registry ops:
/// prints BASELINE lines with each median; fp32 variants must match torch's f64 run.
#[test]
fn baseline_torch_module_of_imported_seed_problems() {
    let Some((_d, cfg)) = baseline_gpu() else {
        return;
    };
    let python = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    let helper =
        kiln_torch_runner::TorchRunner::find(&cfg.worker_exe, &python, Duration::from_secs(900))
            .expect("kiln_torch.py beside kiln-worker or in daemon/torch-runner/");
    for name in ["kb-softmax-4096x65536", "kb-layernorm-16x64x256x256"] {
        let p = problem(name);
        let r = torch_kinds(&cfg, &helper, &p);
        for b in &r {
            println!(
                "BASELINE {} {} [{}] {:?} median {:?} us rel_l2 {:?} mismatches {:?}: {}",
                p.name,
                b.name,
                b.precision,
                b.status,
                b.median_us(),
                b.rel_l2,
                b.mismatches,
                b.detail
            );
        }
        for kind in ["torch-eager-fp32", "torch-compile-fp32"] {
            let b = find(&r, kind);
            let Some(()) = library_measured(b) else {
                return;
            };
            assert_measured(b);
            assert_eq!(b.mismatches, Some(0), "{b:#?}");
        }
    }
}

/// The torch runner's kinds (torch eager, torch.compile) of `p` on the test GPU.
fn torch_kinds(
    cfg: &SandboxConfig,
    helper: &kiln_torch_runner::TorchRunner,
    p: &ProblemSpec,
) -> Vec<BaselineResult> {
    use kiln_types::baseline::BaselineKind;
    let kinds = [BaselineKind::TorchEager, BaselineKind::TorchCompile];
    let t0 = std::time::Instant::now();
    let r = kiln_sandbox::baselines::torch::measure(
        cfg.gpu_uuid.as_deref(),
        helper,
        p,
        &baseline_plan(),
        &kinds,
    );
    println!(
        "{}: torch baselines in {:.1} s",
        p.name,
        t0.elapsed().as_secs_f64()
    );
    r
}

/// The table of docs/gpu-results.md: for each seed problem, the seed kernel's median and
/// tier, every baseline, the floor, and the seed's speedup against each baseline.
#[test]
fn baseline_table_seed_problems() {
    let Some((_d, cfg)) = baseline_gpu() else {
        return;
    };
    let python = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    let helper =
        kiln_torch_runner::TorchRunner::find(&cfg.worker_exe, &python, Duration::from_secs(900));
    let mut worker = WarmWorker::new(cfg.clone(), 50);
    let mut rows = Vec::new();
    for name in [
        "matmul-fp32-4096",
        "conv2d-3to96-k11s4p2",
        "softmax-4096x65536",
        "layernorm-16x64x256x256",
        "conv2d-relu-maxpool",
        "matmul-fp16-4096",
        "sdpa-fp16-b4h16s2048d64",
    ] {
        let p = problem(name);
        let mut r = measure(&cfg, &p);
        if let Some(h) = &helper {
            r.retain(|b| b.library != "torch");
            r.extend(torch_kinds(&cfg, h, &p));
        }
        let seed = run_on(
            &mut worker,
            &cfg,
            &p,
            &kernel_candidate(&p, "seed"),
            &baseline_plan(),
        );
        let seed_us = seed.timing.as_ref().map(|t| t.median_us).unwrap_or(0.0);
        let floor_us =
            (p.roofline.min_bytes as f64 / PEAKS.0).max(p.roofline.flops as f64 / PEAKS.1) * 1e6;
        let cells: Vec<String> = r
            .iter()
            .map(|b| match b.median_us() {
                Some(m) => format!(
                    "{} [{}] {:.1} us (seed {:.2}x)",
                    b.name,
                    b.precision,
                    m,
                    m / seed_us.max(1e-9)
                ),
                None => format!("{} {:?}", b.name, b.status),
            })
            .collect();
        rows.push(format!(
            "| {name} | {} {:.1} us | {:?} | {:.1} us | {} |",
            seed.verdict,
            seed_us,
            seed.tier,
            floor_us,
            cells.join("; ")
        ));
    }
    println!(
        "| problem | seed (verdict, median) | seed tier | floor | baselines (speedup of the seed) |"
    );
    println!("|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
}

// ---- C++ kernels, toolkit headers and launch kinds (issue #18) ----

/// A vecadd-cuda-1m candidate with these launches (JSON) and flags.
fn cxx_candidate(source: &str, launches: serde_json::Value, flags: &[&str]) -> Candidate {
    serde_json::from_value(serde_json::json!({
        "problem": "vecadd-cuda-1m", "language": "cuda", "source": source,
        "launches": launches, "flags": flags,
    }))
    .expect("candidate")
}

/// The plan of the cxx tests: the full contract, short timing.
fn quick_plan() -> EvalPlan {
    let mut p = plan(5_000);
    p.trials = 1;
    p.timing.min_samples = 5;
    p.timing.min_time_ms = 2.0;
    p.timing.wall_cap_ms = 500.0;
    p
}

/// The standard vecadd launch with `kernel`.
fn vecadd_launch(kernel: &str) -> serde_json::Value {
    serde_json::json!([{"kernel": kernel, "grid": [4096, 1, 1], "block": [256, 1, 1],
                        "args": ["a", "b", "y", {"i32": 1048576}]}])
}

/// Evaluates each (label, candidate) on one warm worker; returns the evaluations.
fn cxx_run(cases: Vec<(String, Candidate)>) -> Option<Vec<(String, Evaluation)>> {
    let (_dir, mut cfg) = gpu()?;
    cfg.find_cuda_headers(&[]);
    println!("headers: {}", cfg.cuda_headers.describe());
    let p = problem("vecadd-cuda-1m");
    let mut worker = WarmWorker::new(cfg.clone(), 200);
    let mut out = Vec::new();
    for (label, c) in cases {
        let t0 = std::time::Instant::now();
        let compiled = kiln_sandbox::compile(&cfg, &p, &c).expect("compile runs");
        let wall = t0.elapsed().as_secs_f64() * 1e3;
        println!(
            "  {label:<34} compile: nvrtc {:>7.1} ms, jailed {wall:>7.1} ms",
            compiled.info.duration_ms
        );
        let e = run_on(&mut worker, &cfg, &p, &c, &quick_plan());
        out.push((label, e));
    }
    Some(out)
}

fn assert_all_ok(results: &[(String, Evaluation)]) {
    let bad: Vec<String> = results
        .iter()
        .filter(|(_, e)| e.verdict != Verdict::Ok)
        .map(|(l, e)| format!("{l}: {} {}", e.verdict, e.message))
        .collect();
    assert!(bad.is_empty(), "not ok: {bad:#?}");
}

#[test]
fn cxx_gpu_each_toolkit_header_gives_ok() {
    let cases = common::headers::HEADER_USES
        .iter()
        .map(|(header, snippet)| {
            let src = format!(
                "#include <{header}>\n\
                 __global__ void add_with_header(const float* a, const float* b, float* y, int n) {{\n\
                   int i = blockIdx.x * blockDim.x + threadIdx.x;\n  {snippet}\n\
                   if (i < n) y[i] = a[i] + b[i] + extra;\n}}\n"
            );
            (header.to_string(), cxx_candidate(&src, vecadd_launch("add_with_header"), &[]))
        })
        .collect();
    let Some(results) = cxx_run(cases) else {
        return;
    };
    assert_all_ok(&results);
}

/// The example candidates of docs/examples/cxx (what docs/api.md shows), by file name.
fn example(name: &str) -> Candidate {
    let text = match name {
        "template" => include_str!("../../docs/examples/cxx/template.json"),
        "namespaced" => include_str!("../../docs/examples/cxx/namespaced.json"),
        "cooperative" => include_str!("../../docs/examples/cxx/cooperative.json"),
        "cluster" => include_str!("../../docs/examples/cxx/cluster.json"),
        "headers" => include_str!("../../docs/examples/cxx/headers.json"),
        other => panic!("no example {other}"),
    };
    serde_json::from_str(text).expect("example parses")
}

#[test]
fn cxx_gpu_templated_namespaced_and_plain_cxx_kernels_pass_the_contract() {
    let mut plain = example("namespaced");
    plain.launches[0].kernel = "add_plain_cxx".into();
    let mut arch_specific = example("template");
    arch_specific.flags = vec!["-arch=sm_90a".into()];
    let cases = vec![
        (
            "template add_t<256, float>".to_string(),
            example("template"),
        ),
        (
            "namespace kiln_example::ew::add".to_string(),
            example("namespaced"),
        ),
        ("plain C++ add_plain_cxx".to_string(), plain),
        ("template with -arch=sm_90a".to_string(), arch_specific),
        (
            "headers as nvcc users write them".to_string(),
            example("headers"),
        ),
    ];
    let Some(results) = cxx_run(cases) else {
        return;
    };
    assert_all_ok(&results);
}

#[test]
fn cxx_gpu_cooperative_grid_sync_kernel_passes_the_contract() {
    let Some(results) = cxx_run(vec![(
        "cooperative two_phase".into(),
        example("cooperative"),
    )]) else {
        return;
    };
    assert_all_ok(&results);
}

#[test]
fn cxx_gpu_cooperative_grid_that_cannot_be_resident_is_invalid_launch() {
    let mut c = example("cooperative");
    c.launches[0].grid = [65536, 1, 1];
    c.launches[0].block = [1024, 1, 1];
    let Some(results) = cxx_run(vec![("cooperative, 65536 blocks".into(), c)]) else {
        return;
    };
    let (_, e) = &results[0];
    assert_eq!(e.verdict, Verdict::InvalidLaunch, "{e:#?}");
    assert!(e.message.contains("resident at once"), "{}", e.message);
}

#[test]
fn cxx_gpu_two_cta_cluster_kernel_passes_the_contract() {
    let Some(results) = cxx_run(vec![(
        "cluster [2,1,1] pair_add".into(),
        example("cluster"),
    )]) else {
        return;
    };
    assert_all_ok(&results);
}

/// Input generation (`Gpu::fill`), the cost every timed sample now pays once per input
/// tensor: its speed on a 1 GiB tensor per dtype and distribution (printed, `FILL` lines;
/// the f64 Box–Muller generator it replaced ran at ~455 GB/s on the H200), the keyed hash
/// beside it (`HASH`), and the host mirror, bit for bit, on the head and tail of each.
#[test]
fn gpu_fill_throughput_and_bit_exact_host_mirror() {
    use kiln_gpu::inputs::host_value;
    use kiln_types::{Dtype, Init};
    if let Err(e) = kiln_gpu::available() {
        println!("SKIP: cuda unavailable: {}", e.reason);
        return;
    }
    let gpu = kiln_gpu::Gpu::open(0).expect("gpu opens");
    let bytes = 1usize << 30;
    let buf = gpu.alloc(bytes).expect("1 GiB");
    let normal = Init::Normal {
        mean: 0.0,
        std: 1.0,
    };
    let uniform = Init::Uniform {
        low: -1.0,
        high: 1.0,
    };
    let shifted = Init::Normal {
        mean: 1000.0,
        std: 0.1,
    };
    let randint = Init::Randint { low: -7, high: 9 };
    let cases = [
        (Dtype::F32, normal, "f32 normal"),
        (Dtype::F32, uniform, "f32 uniform"),
        (Dtype::F32, shifted, "f32 normal(1000, 0.1)"),
        (Dtype::F16, normal, "f16 normal"),
        (Dtype::Bf16, normal, "bf16 normal"),
        (Dtype::F64, normal, "f64 normal"),
        (Dtype::I32, randint, "i32 randint"),
    ];
    for (k, (dtype, init, what)) in cases.iter().enumerate() {
        let elems = (bytes as u64) / dtype.size();
        let seed = 0x5eed_0000 + k as u64;
        gpu.fill(&buf, *dtype, 1024, init, seed)
            .expect("warm-up fill");
        gpu.synchronize().expect("sync");
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            gpu.fill(&buf, *dtype, elems, init, seed).expect("fill");
            gpu.synchronize().expect("sync");
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "FILL {what}: 1 GiB in {:.3} ms = {:.0} GB/s",
            best * 1e3,
            bytes as f64 / best / 1e9
        );
        // The host mirror, bit for bit (f16/bf16: the value their `cvt` rounds).
        let head = 1usize << 20;
        let tail_at = elems as usize - 4096;
        let size = dtype.size() as usize;
        let mut got = vec![0u8; head * size];
        gpu.download(&buf, 0, &mut got).expect("head");
        let mut tail = vec![0u8; 4096 * size];
        gpu.download(&buf, tail_at * size, &mut tail).expect("tail");
        let mut differ = 0usize;
        let mut first = None;
        let elements = (0..head)
            .map(|i| (i, &got[i * size..(i + 1) * size]))
            .chain((0..4096).map(|j| (tail_at + j, &tail[j * size..(j + 1) * size])));
        for (i, b) in elements {
            let want = host_value(init, *dtype, seed, i as u64).expect("valid init");
            let same = match dtype {
                Dtype::F32 => {
                    f32::from_le_bytes([b[0], b[1], b[2], b[3]]).to_bits()
                        == (want as f32).to_bits()
                }
                Dtype::F64 => {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(b);
                    f64::from_le_bytes(w).to_bits() == want.to_bits()
                }
                Dtype::I32 => f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])) == want,
                // bf16: round to nearest even of the f32 bits.
                Dtype::Bf16 => {
                    let bits = (want as f32).to_bits();
                    let rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16;
                    u16::from_le_bytes([b[0], b[1]]) == rounded as u16
                }
                // f16: within half an f16 ulp of the f32 value (cvt.rn rounds it).
                _ => {
                    let h = kiln_sandbox::engine::contract::data::f16_to_f64(u16::from_le_bytes([
                        b[0], b[1],
                    ]));
                    // Below 2^-14 (f16's smallest normal) the spacing is that of the subnormals, 2^-24.
                    let ulp = 2f64.powi(want.abs().max(2f64.powi(-14)).log2().floor() as i32 - 10);
                    (h - want).abs() <= ulp / 2.0
                }
            };
            if !same {
                differ += 1;
                first.get_or_insert(i);
            }
        }
        assert_eq!(
            differ, 0,
            "{what}: {differ} elements differ from the host mirror (first at {first:?})"
        );
    }
    gpu.hash(&buf, 1).expect("warm-up hash");
    let t = std::time::Instant::now();
    gpu.hash(&buf, 2).expect("hash");
    let s = t.elapsed().as_secs_f64();
    println!(
        "HASH 1 GiB in {:.3} ms = {:.0} GB/s",
        s * 1e3,
        bytes as f64 / s / 1e9
    );
}

/// The GPU timing cases of issue 21: caches keyed on input content (`tests/redteam/gpu/`).
const CACHE_SOFTMAX: &str = include_str!("redteam/gpu/cache_softmax.cu");
const CACHE_MATMUL: &str = include_str!("redteam/gpu/cache_matmul.cu");

/// The case's candidate: the honest build (`cheat` = None) or `-DKILN_CHEAT=cheat`.
fn cache_candidate(p: &ProblemSpec, cheat: Option<u32>) -> Candidate {
    let softmax = p.name.starts_with("softmax");
    let (source, launches, elems) = if softmax {
        (
            CACHE_SOFTMAX,
            serde_json::json!([
                {"kernel": "cache_key", "grid": [1, 1, 1], "block": [32, 1, 1], "args": ["x", "cache"]},
                {"kernel": "softmax_cached", "grid": [4096, 1, 1], "block": [256, 1, 1],
                 "args": ["x", "y", "cache"]},
                {"kernel": "cache_commit", "grid": [1, 1, 1], "block": [32, 1, 1], "args": ["cache"]}
            ]),
            4096u64 * 65536 + 16,
        )
    } else {
        (
            CACHE_MATMUL,
            serde_json::json!([
                {"kernel": "cache_key", "grid": [1, 1, 1], "block": [32, 1, 1],
                 "args": ["A", "B", "cache"]},
                {"kernel": "mm_cached", "grid": [256, 256, 1], "block": [16, 16, 1],
                 "args": ["A", "B", "C", "cache"]},
                {"kernel": "cache_commit", "grid": [1, 1, 1], "block": [32, 1, 1], "args": ["cache"]}
            ]),
            4096u64 * 4096 + 16,
        )
    };
    serde_json::from_value(serde_json::json!({
        "problem": p.name, "language": "cuda", "source": source, "launches": launches,
        "scratch": [{"name": "cache", "dtype": "f32", "elems": elems}],
        "flags": cheat.map(|c| vec![format!("-DKILN_CHEAT={c}")]).unwrap_or_default(),
    }))
    .expect("candidate")
}

/// One GPU cache case on one warm worker: the honest build, the cheat under the contract,
/// the cheat with plain timing (inputs reused: the cache must win there, or the case
/// tests nothing), the honest build again. The cheat under the contract must fail or be
/// no faster than the honest kernel (GPU medians repeat within a fraction of a percent).
fn gpu_cache_case(problem_name: &str, cheat: u32, what: &str) {
    let Some((_dir, cfg)) = gpu() else { return };
    let p = problem(problem_name);
    let mut worker = WarmWorker::new(cfg.clone(), 100);
    let plan = plan(60_000);
    let honest = run_on(&mut worker, &cfg, &p, &cache_candidate(&p, None), &plan);
    let cheated = run_on(
        &mut worker,
        &cfg,
        &p,
        &cache_candidate(&p, Some(cheat)),
        &plan,
    );
    let mut plain_plan = plan.clone();
    plain_plan.plain = Some(20);
    let plain = run_on(
        &mut worker,
        &cfg,
        &p,
        &cache_candidate(&p, Some(cheat)),
        &plain_plan,
    );
    let again = run_on(&mut worker, &cfg, &p, &cache_candidate(&p, None), &plan);
    let median = |e: &Evaluation| e.timing.as_ref().map_or(f64::NAN, |t| t.median_us);
    assert_eq!(honest.verdict, Verdict::Ok, "{honest:#?}");
    assert_eq!(again.verdict, Verdict::Ok, "{again:#?}");
    let honest_us = median(&honest).min(median(&again));
    println!(
        "CACHE {what} on {problem_name}: honest {honest_us:.1} us; cheat {} {:.1} us; \
         cheat with plain timing {} {:.1} us ({})",
        cheated.verdict,
        median(&cheated),
        plain.verdict,
        median(&plain),
        plain.message
    );
    let cache_wins = match plain.verdict {
        Verdict::Ok => median(&plain) < 0.8 * honest_us,
        Verdict::ImplausibleTime | Verdict::UnmeasurableTime => true,
        _ => false,
    };
    assert!(
        cache_wins,
        "the cheat is not faster even on repeated inputs: the case tests nothing: {plain:#?}"
    );
    assert!(
        cheated.verdict != Verdict::Ok || median(&cheated) >= 0.95 * honest_us,
        "the cache won the timing: {cheated:#?}"
    );
}

#[test]
fn redteam_gpu_cache_device_memory_softmax() {
    gpu_cache_case("softmax-4096x65536", 1, "__device__ cache");
}

#[test]
fn redteam_gpu_cache_scratch_softmax() {
    gpu_cache_case("softmax-4096x65536", 2, "scratch cache");
}

#[test]
fn redteam_gpu_cache_high_bits_softmax() {
    gpu_cache_case("softmax-4096x65536", 3, "high-bits cache");
}

#[test]
fn redteam_gpu_cache_device_memory_matmul() {
    gpu_cache_case("matmul-fp32-4096", 1, "__device__ cache");
}

#[test]
fn redteam_gpu_cache_scratch_matmul() {
    gpu_cache_case("matmul-fp32-4096", 2, "scratch cache");
}

#[test]
fn redteam_gpu_cache_high_bits_matmul() {
    gpu_cache_case("matmul-fp32-4096", 3, "high-bits cache");
}
