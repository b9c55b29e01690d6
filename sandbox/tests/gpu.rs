//! GPU tests of the cuda backend, through the real jailed `kiln-worker` (run on a GPU host:
//! `scripts/gpu-check.sh`). Every test skips, with the reason printed, when
//! `kiln_cuda::available()` fails. Run with `--test-threads=1 --nocapture`.
//!
//! `KILN_WORKER` overrides the worker binary (the bundle's); scratch goes to a temp dir.

use std::path::PathBuf;
use std::time::Duration;

use kiln_sandbox::SandboxConfig;
use kiln_types::{
    Candidate, EvalPlan, Evaluation, Language, PrecisionTier, ProblemSpec, TimingPlan, Verdict,
};

/// H200 peaks, as the daemon passes them (tensor-core flop rate, HBM3e bandwidth).
const PEAKS: (f64, f64) = (4.3e12, 990e12);

fn gpu() -> Option<(tempfile::TempDir, SandboxConfig)> {
    if let Err(e) = kiln_cuda::available() {
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
            fresh_inputs_every: 8,
            recheck_fraction: 0.1,
        },
        peak_bytes_per_s: PEAKS.0,
        peak_flops: PEAKS.1,
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
    let ks = match which {
        "reference" => &p.reference["cuda"],
        _ => &p.seed["cuda"],
    };
    Candidate {
        problem: p.name.clone(),
        language: Language::Cuda,
        source: ks.source.clone(),
        launches: ks.launches.clone(),
        scratch: ks.scratch.clone(),
        flags: ks.flags.clone(),
        parent: None,
        note: None,
    }
}

fn compile_ok(cfg: &SandboxConfig, c: &Candidate) -> Vec<u8> {
    let out = kiln_sandbox::compile(cfg, c).expect("compile runs");
    out.artifact
        .unwrap_or_else(|| panic!("{} failed to compile: {:#?}", c.problem, out.failure))
}

/// Compiles the reference and `c`, evaluates `c`; a compile failure is its evaluation.
fn run(cfg: &SandboxConfig, p: &ProblemSpec, c: &Candidate, plan: &EvalPlan) -> Evaluation {
    let reference = compile_ok(cfg, &kernel_candidate(p, "reference"));
    let out = kiln_sandbox::compile(cfg, c).expect("compile runs");
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
    let e = run(&cfg, &p, &vecadd(body), &plan(run_timeout_ms));
    // The lane serves the next candidate: an honest one evaluates normally afterwards.
    let honest = run(&cfg, &p, &kernel_candidate(&p, "seed"), &plan(5_000));
    assert_eq!(
        honest.verdict,
        Verdict::Ok,
        "after the red-team kernel: {honest:#?}"
    );
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
    serde_json::from_value(serde_json::json!({
        "problem": problem, "language": "cuda", "source": source,
        "launches": [{"kernel": "mm", "grid": [256, 256, 1], "block": [16, 16, 1],
                      "args": ["A", "B", "C", {"i32": 4096}, {"i32": 4096}, {"i32": 4096}]}]
    }))
    .expect("candidate")
}

#[test]
fn redteam_gpu_fp16_in_fp32_problem() {
    let Some((_dir, cfg)) = gpu() else { return };
    let p = problem("matmul-fp32-4096");
    let e = run(&cfg, &p, &fp16_matmul(&p.name), &plan(10_000));
    println!("{}", summary("fp16-in-matmul-fp32-4096", &e));
    let worst = e
        .evidence
        .errors
        .iter()
        .map(|m| m.rel_l2)
        .fold(0.0, f64::max);
    let tier = e.tier.unwrap_or(if worst <= 1e-5 {
        PrecisionTier::Fp32Faithful
    } else {
        PrecisionTier::Coarse
    });
    assert!(tier > PrecisionTier::Fp32Faithful, "{e:#?}");
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
    let main_ref = compile_ok(&cfg, &kernel_candidate(&main, "reference"));
    let main_art = compile_ok(&cfg, &main_c);
    let other_arts: Vec<(Vec<u8>, Candidate, Vec<u8>)> = others
        .iter()
        .map(|p| {
            let c = kernel_candidate(p, "seed");
            (
                compile_ok(&cfg, &kernel_candidate(p, "reference")),
                c.clone(),
                compile_ok(&cfg, &c),
            )
        })
        .collect();
    let mut medians = Vec::new();
    for i in 0..20 {
        let e = kiln_sandbox::evaluate(&cfg, &main, &main_ref, &main_c, &main_art, &plan(10_000))
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
        let o = kiln_sandbox::evaluate(&cfg, &others[i % others.len()], r, c, a, &plan(10_000))
            .expect("evaluate runs");
        assert_eq!(o.verdict, Verdict::Ok, "{o:#?}");
    }
    let n = medians.len() as f64;
    let mean = medians.iter().sum::<f64>() / n;
    let sd = (medians.iter().map(|m| (m - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    let cv = sd / mean;
    println!(
        "STABILITY layernorm-16x64x256x256 seed: 20 medians, mean {mean:.3} us, CV {:.3} % (target <= 0.5 %: {})",
        cv * 100.0,
        if cv <= 0.005 { "met" } else { "MISSED" }
    );
}
