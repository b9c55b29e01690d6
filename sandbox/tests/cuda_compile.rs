//! CUDA compiles through the jailed `kiln-worker`, no GPU needed: host code and unsafe
//! includes refused with a `compile_error` before any jail starts (always run); with NVRTC
//! here, the headers nvcc users take for granted compile inside the jail (the toolkit's
//! include folders bound at fixed paths), kernels resolve by C++ name, and without toolkit
//! headers the message says which are unavailable. Tests needing NVRTC (or the toolkit's
//! headers) skip with the reason printed. Compile times are printed (`--nocapture`).

mod common;

use kiln_sandbox::SandboxConfig;
use kiln_types::{Candidate, Verdict};

fn candidate(source: &str, kernels: &[&str]) -> Candidate {
    let launches: Vec<serde_json::Value> = kernels
        .iter()
        .map(|k| serde_json::json!({"kernel": k, "grid": [1, 1, 1], "block": [32, 1, 1]}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "problem": "vecadd-cuda-1m", "language": "cuda", "source": source,
        "launches": launches,
    }))
    .expect("candidate")
}

/// The problem every candidate here is compiled for.
fn vecadd() -> kiln_types::ProblemSpec {
    common::problem("vecadd-cuda-1m")
}

fn nvrtc() -> bool {
    if kiln_gpu::facts::nvrtc_version().is_none() {
        println!("SKIP: NVRTC is not loadable here");
        return false;
    }
    true
}

/// The sandbox config with the toolkit headers discovered as kilnd would.
fn with_headers() -> Option<(tempfile::TempDir, SandboxConfig)> {
    let (dir, mut cfg) = common::setup();
    cfg.find_cuda_headers(&[]);
    if !cfg.cuda_headers.found() {
        println!(
            "SKIP: no CUDA toolkit headers: {}",
            cfg.cuda_headers.describe()
        );
        return None;
    }
    println!("headers: {}", cfg.cuda_headers.describe());
    Some((dir, cfg))
}

/// The `compile_error` message of a refused candidate.
fn refusal(cfg: &SandboxConfig, c: &Candidate) -> String {
    let out = kiln_sandbox::compile(cfg, &vecadd(), c).expect("compile runs");
    let f = out
        .failure
        .unwrap_or_else(|| panic!("{} compiled", c.source));
    assert_eq!(f.verdict, Verdict::CompileError, "{f:#?}");
    f.message
}

#[test]
fn a_torch_host_wrapper_gets_a_compile_error_naming_its_lines() {
    let (_dir, cfg) = common::setup();
    let src = "#include <torch/extension.h>\n\
               __global__ void relu(const float* x, float* y, int n) {\n\
                 int i = blockIdx.x * blockDim.x + threadIdx.x;\n\
                 if (i < n) y[i] = fmaxf(x[i], 0.0f);\n}\n\
               torch::Tensor forward(torch::Tensor x) {\n\
                 auto y = torch::empty_like(x);\n\
                 relu<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());\n\
                 return y;\n}\n";
    let msg = refusal(&cfg, &candidate(src, &["relu"]));
    assert!(msg.starts_with("host code is not accepted"), "{msg}");
    assert!(
        msg.contains("line 1: #include <torch/extension.h>"),
        "{msg}"
    );
    assert!(msg.contains("line 6: torch::Tensor"), "{msg}");
    assert!(
        msg.contains("\"launches\" list"),
        "says what kiln accepts: {msg}"
    );
    assert!(
        msg.len() < 700,
        "short enough for a model: {} bytes",
        msg.len()
    );
    let msg = refusal(
        &cfg,
        &candidate(
            "__global__ void k(float* y) {}\nvoid host() { float* d; cudaMalloc(&d, 4); }",
            &["k"],
        ),
    );
    assert!(msg.contains("line 2: cudaMalloc(…)"), "{msg}");
}

#[test]
fn include_red_team_is_refused_before_any_jail() {
    let (_dir, cfg) = common::setup();
    for (src, needle) in [
        ("#include \"/dev/zero\"\n", "absolute"),
        ("#include </etc/passwd>\n", "absolute"),
        ("#include \"../x.h\"\n", "climbs"),
        ("#define P </etc/passwd>\n#include P\n", "literally"),
        ("#if __has_include(</etc/shadow>)\n#endif\n", "absolute"),
        (
            "#define __THRUST_HOST_SYSTEM_ROOT /etc\n",
            "belong to the CUDA toolkit",
        ),
    ] {
        let out = kiln_sandbox::compile(
            &cfg,
            &vecadd(),
            &candidate(&format!("{src}__global__ void k(){{}}"), &["k"]),
        )
        .expect("refused cleanly");
        assert!(out.layers.is_empty(), "refused before the jail: {src:?}");
        let f = out.failure.expect("compile_error");
        assert!(f.message.contains(needle), "{src:?}: {}", f.message);
    }
}

#[test]
fn only_the_arch_specific_variant_of_the_target_may_be_asked_for() {
    let (_dir, mut cfg) = common::setup();
    cfg.cuda_arch = "sm_90".into();
    let mut c = candidate("__global__ void k() {}", &["k"]);
    c.flags = vec!["-arch=sm_80".into()];
    let out = kiln_sandbox::compile(&cfg, &vecadd(), &c).expect("refused cleanly");
    assert!(out.layers.is_empty(), "refused before the jail");
    let f = out.failure.expect("compile_error");
    assert!(f.message.contains("-arch=sm_90a"), "{}", f.message);
}

#[test]
fn every_header_nvcc_users_take_for_granted_compiles_in_the_jail() {
    if !nvrtc() {
        return;
    }
    let Some((_dir, cfg)) = with_headers() else {
        return;
    };
    let mut failed = Vec::new();
    for (header, body) in common::headers::HEADER_USES {
        let src = format!(
            "#include <{header}>\n__global__ void k(float* y) {{ {body} y[0] = extra; }}\n"
        );
        let t0 = std::time::Instant::now();
        let out =
            kiln_sandbox::compile(&cfg, &vecadd(), &candidate(&src, &["k"])).expect("compile runs");
        let wall = t0.elapsed().as_secs_f64() * 1e3;
        match (&out.artifact, &out.failure) {
            (Some(_), _) => println!(
                "  {header:<30} nvrtc {:>7.1} ms, jailed compile {wall:>7.1} ms",
                out.info.duration_ms
            ),
            (None, f) => {
                let why = f.as_ref().map_or(String::new(), |f| f.message.clone());
                println!("  {header:<30} FAILED: {why}");
                failed.push(*header);
            }
        }
    }
    assert!(
        failed.is_empty(),
        "headers that did not compile: {failed:?}"
    );
}

#[test]
fn every_suite_kernel_still_compiles_with_the_headers_and_prelude() {
    if !nvrtc() {
        return;
    }
    let (_dir, cfg) = common::setup();
    let mut seen = 0;
    for entry in std::fs::read_dir(common::problems_dir()).expect("problems/") {
        let dir = entry.expect("entry").path();
        if !dir.join("problem.toml").is_file() {
            continue;
        }
        let p = kiln_types::ProblemSpec::load_dir(&dir).expect("problem loads");
        for (what, c) in [
            (
                "reference",
                p.reference_candidate(kiln_types::BackendKind::Cuda),
            ),
            ("seed", p.seed_candidate("cuda")),
        ] {
            let Some(c) = c else { continue };
            let out = kiln_sandbox::compile(&cfg, &vecadd(), &c).expect("compile runs");
            assert!(
                out.artifact.is_some(),
                "{} {what}: {:#?}",
                p.name,
                out.failure
            );
            seen += 1;
        }
    }
    println!("{seen} suite kernels compiled");
    assert!(seen >= 10, "only {seen} cuda kernels in the suite");
}

#[test]
fn the_documented_examples_validate_and_compile() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/cxx");
    let (_dir, cfg) = common::setup();
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("docs/examples/cxx") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read");
        let c: Candidate =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        c.validate()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        n += 1;
        if kiln_gpu::facts::nvrtc_version().is_none() {
            continue;
        }
        let out = kiln_sandbox::compile(&cfg, &vecadd(), &c).expect("compile runs");
        if out.artifact.is_none() && !cfg.cuda_headers.found() {
            println!("SKIP compiling {}: no toolkit headers", path.display());
            continue;
        }
        assert!(
            out.artifact.is_some(),
            "{}: {:#?}",
            path.display(),
            out.failure
        );
    }
    assert!(n >= 5, "{n} examples");
}

#[test]
fn templated_and_namespaced_kernels_compile_in_the_jail_with_a_manifest() {
    if !nvrtc() {
        return;
    }
    let (_dir, cfg) = common::setup();
    let src = "template <int B, typename T> __global__ void k(T* y) { y[threadIdx.x] = T(B); }\n\
               namespace ns { __global__ void inner(float* y) { y[0] = 1.0f; } }\n";
    let out = kiln_sandbox::compile(
        &cfg,
        &vecadd(),
        &candidate(src, &["k<64, float>", "ns::inner"]),
    )
    .expect("compile runs");
    let art = out
        .artifact
        .unwrap_or_else(|| panic!("did not compile: {:#?}", out.failure));
    let a = kiln_gpu::artifact::Artifact::decode(&art).expect("artifact");
    assert_eq!(
        a.manifest.kernels["k<64, float>"].symbol,
        "_Z1kILi64EfEvPT0_"
    );
    assert_eq!(a.manifest.kernels["ns::inner"].symbol, "_ZN2ns5innerEPf");
    let msg = refusal(&cfg, &candidate(src, &["k<64, float>", "missing"]));
    assert!(
        msg.contains("missing") && msg.contains("ns::inner(float*)"),
        "{msg}"
    );
}

/// The fill kernels lifting appends for torch's fills (`torch::zeros` in a wrapper)
/// compile in the jail after a file's own device code, every width at once.
#[test]
fn the_lifts_fill_kernels_compile_after_a_files_device_code() {
    if !nvrtc() {
        return;
    }
    let (_dir, cfg) = common::setup();
    let own = "__global__ void relu(const float* x, float* y, int n) { int i = threadIdx.x; if (i < n) y[i] = x[i] > 0 ? x[i] : 0; }\n";
    let src = format!(
        "{own}{}",
        kiln_sandbox::engine::hosted::lift::fill::source(&[1, 2, 4, 8])
    );
    let names = [
        "relu",
        "kiln_lift_fill_u8",
        "kiln_lift_fill_u16",
        "kiln_lift_fill_u32",
        "kiln_lift_fill_u64",
    ];
    let out =
        kiln_sandbox::compile(&cfg, &vecadd(), &candidate(&src, &names)).expect("compile runs");
    let art = out
        .artifact
        .unwrap_or_else(|| panic!("did not compile: {:#?}\n{src}", out.failure));
    let a = kiln_gpu::artifact::Artifact::decode(&art).expect("artifact");
    for n in &names[1..] {
        assert_eq!(a.manifest.kernels[*n].symbol, *n, "extern \"C\": {src}");
    }
}

#[test]
fn without_toolkit_headers_the_error_says_which_are_unavailable() {
    if !nvrtc() {
        return;
    }
    let (_dir, mut cfg) = common::setup();
    cfg.cuda_headers = Default::default();
    // kiln's stand-ins still serve the C/C++ headers and cuda_runtime.h.
    let ok = kiln_sandbox::compile(
        &cfg,
        &vecadd(),
        &candidate(
            "#include <cuda_runtime.h>\n#include <cstdint>\n#include <cfloat>\n__global__ void k(float* y) { y[0] = FLT_MAX; }",
            &["k"],
        ),
    )
    .expect("compile runs");
    assert!(ok.artifact.is_some(), "{:#?}", ok.failure);
    let msg = refusal(
        &cfg,
        &candidate(
            "#include <cuda_fp16.h>\n__global__ void k(float* y) {}",
            &["k"],
        ),
    );
    assert!(
        msg.contains("<cuda_fp16.h> is unavailable: no CUDA toolkit headers were found"),
        "{msg}"
    );
}

/// A macro whose expansion doubles 40 times (2^40 tokens): the preprocessor never
/// finishes on its own.
fn macro_bomb() -> String {
    let mut src = String::from("#define B0 x +\n");
    for i in 1..=40 {
        src.push_str(&format!("#define B{i} B{} B{}\n", i - 1, i - 1));
    }
    src.push_str("__global__ void k(int* y) { int x = 1; y[0] = B40 0; }\n");
    src
}

/// 2^40 distinct class instantiations, each only 40 deep (under the compiler's depth
/// limit): memory grows by hundreds of MiB a second.
const TEMPLATE_BOMB: &str = "template <int N, unsigned long long M> struct F {\n\
      static constexpr unsigned long long v = F<N - 1, 2 * M>::v + F<N - 1, 2 * M + 1>::v;\n\
    };\n\
    template <unsigned long long M> struct F<0, M> { static constexpr unsigned long long v = M; };\n\
    __global__ void k(unsigned long long* y) { y[0] = F<40, 1>::v; }\n";

#[test]
fn a_macro_or_template_bomb_ends_as_a_compile_error_within_the_limits() {
    if !nvrtc() {
        return;
    }
    let (_dir, mut cfg) = common::setup();
    cfg.compile_timeout = std::time::Duration::from_secs(3);
    // The wall-clock deadline the sandbox enforces (compile_timeout + 10 s), plus the
    // jail's start and teardown.
    let bound = cfg.compile_timeout + std::time::Duration::from_secs(20);
    for (what, src) in [
        ("macro bomb", macro_bomb()),
        ("template bomb", TEMPLATE_BOMB.to_string()),
    ] {
        let t0 = std::time::Instant::now();
        let msg = refusal(&cfg, &candidate(&src, &["k"]));
        let took = t0.elapsed();
        println!("{what}: {:.1} s: {msg}", took.as_secs_f64());
        assert!(took < bound, "{what} took {took:?}");
        // Which limit ends it depends on the machine's load (CPU time, wall clock) or
        // speed (the compiler's own out-of-memory error); each is named, never blamed on
        // a kill of unknown cause.
        assert!(
            msg.contains("CPU-time limit of 5 s")
                || msg.contains("timed out after 13.0 s")
                || msg.contains("catastrophic error: out of memory"),
            "{what}: the message names the limit: {msg}"
        );
        assert!(!msg.contains("SIGKILL"), "{what}: {msg}");
        assert!(msg.len() < 1000, "{what}: short: {msg}");
    }
    // The next compile through the same config works: nothing was left hanging.
    let out = kiln_sandbox::compile(
        &cfg,
        &vecadd(),
        &candidate("__global__ void k(float* y) { y[0] = 1.0f; }", &["k"]),
    )
    .expect("compile runs");
    assert!(out.artifact.is_some(), "{:#?}", out.failure);
}

#[test]
fn the_timer_floors_empty_kernel_compiles_in_the_jail_under_its_own_name() {
    // `kiln bench agreement`'s calibration kernel, compiled as `kiln-worker launch
    // --compile-to` compiles it before ncu starts.
    if !nvrtc() {
        return;
    }
    use kiln_sandbox::engine::cuda::launch_timing::{FLOOR_KERNEL, floor_spec};
    let (_dir, cfg) = common::setup();
    let spec: kiln_types::ProblemSpec = serde_json::from_value(floor_spec()).expect("spec");
    let seed = spec.seed_candidate("cuda").expect("a cuda seed");
    let out = kiln_sandbox::compile(&cfg, &spec, &seed).expect("compile runs");
    let art = out
        .artifact
        .unwrap_or_else(|| panic!("did not compile: {:#?}", out.failure));
    let a = kiln_gpu::artifact::Artifact::decode(&art).expect("artifact");
    let k = a.kernel(FLOOR_KERNEL);
    assert_eq!(
        (k.symbol.as_str(), k.trailing_null_params),
        (FLOOR_KERNEL, 0)
    );
}
