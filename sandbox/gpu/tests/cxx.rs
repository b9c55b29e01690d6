//! `cxx::compile_candidate` with a real NVRTC (no GPU needed): kernels by C++ name, the
//! manifest, the kernels a module contains named in errors, quoted includes that never
//! reach the working directory, bounded logs. Each test skips, with the reason printed,
//! where NVRTC cannot be loaded; those needing the toolkit's headers skip without them
//! (found through `$CUDA_HOME/include` or `/usr/local/cuda/include`).

use std::path::PathBuf;

use kiln_gpu::cxx::{CandidateSource, compile_candidate};
use kiln_gpu::nvrtc::{CompileError, MAX_LOG_BYTES};

fn nvrtc() -> bool {
    if kiln_gpu::facts::nvrtc_version().is_none() {
        println!("SKIP: NVRTC is not loadable here");
        return false;
    }
    true
}

fn toolkit() -> Option<Vec<PathBuf>> {
    let dirs = [
        std::env::var_os("CUDA_HOME").map(|h| PathBuf::from(h).join("include")),
        Some(PathBuf::from("/usr/local/cuda/include")),
    ];
    let found = dirs
        .into_iter()
        .flatten()
        .find(|d| d.join("cuda_runtime.h").is_file());
    if found.is_none() {
        println!("SKIP: no CUDA toolkit headers ($CUDA_HOME/include, /usr/local/cuda/include)");
    }
    found.map(|d| vec![d])
}

fn compile(
    source: &str,
    kernels: &[&str],
    include_dirs: &[PathBuf],
) -> Result<kiln_gpu::cxx::CandidateModule, CompileError> {
    let kernels: Vec<String> = kernels.iter().map(|s| s.to_string()).collect();
    compile_candidate(&CandidateSource {
        source,
        arch: "sm_90",
        flags: &[],
        include_dirs,
        kernels: &kernels,
    })
}

const KERNELS: &str = r#"
template <int BLOCK, typename T>
__global__ void softmax_kernel(const T* x, T* y, int n) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) y[i] = x[i] > T(0) ? x[i] : T(0);
}
namespace kiln_test { namespace inner {
__global__ void scale(float* y, float s) { y[threadIdx.x] *= s; }
} }
__global__ void plain_cxx(float* y) { y[threadIdx.x] = INFINITY; }
extern "C" __global__ void plain_c(float* y) { y[threadIdx.x] = M_PI; }
"#;

#[test]
fn kernels_by_cxx_name_resolve_to_their_symbols() {
    if !nvrtc() {
        return;
    }
    let names = [
        "softmax_kernel<256, float>",
        "softmax_kernel<128, double>",
        "kiln_test::inner::scale",
        "plain_cxx",
        "plain_c",
    ];
    let m = compile(KERNELS, &names, &[]).expect("compiles");
    let k = &m.artifact.manifest.kernels;
    assert_eq!(k.len(), 5, "{k:?}");
    assert_eq!(
        k["softmax_kernel<256, float>"].symbol,
        "_Z14softmax_kernelILi256EfEvPKT0_PS0_i"
    );
    assert_eq!(
        k["kiln_test::inner::scale"].symbol,
        "_ZN9kiln_test5inner5scaleEPff"
    );
    assert_eq!(k["plain_cxx"].symbol, "_Z9plain_cxxPf");
    assert_eq!(k["plain_c"].symbol, "plain_c");
    // The artifact round-trips, and a template only the launch list instantiates is in
    // the image.
    let back = kiln_gpu::artifact::Artifact::decode(&m.artifact.encode()).expect("decodes");
    assert_eq!(back.manifest, m.artifact.manifest);
    let found = kiln_gpu::cxx::names::kernels_in(&back.image);
    assert!(
        found
            .iter()
            .any(|f| f.readable == "softmax_kernel<128, double>(double const*, double*, int)"),
        "{found:?}"
    );
    println!("compiled 5 named kernels in {:.1} ms", m.module.duration_ms);
}

#[test]
fn unknown_names_are_errors_that_list_the_module_kernels() {
    if !nvrtc() {
        return;
    }
    let err = compile(KERNELS, &["plain_cxx", "no_such_kernel"], &[]).expect_err("unknown");
    let CompileError::NoSuchKernel { names, found, .. } = &err else {
        panic!("expected NoSuchKernel, got {err}");
    };
    assert_eq!(names, &vec!["no_such_kernel".to_string()]);
    assert!(
        found.contains("plain_cxx(float*)")
            && found.contains("kiln_test::inner::scale(float*, float)")
            && found.contains("plain_c"),
        "{found}"
    );
    let text = err.to_string();
    assert!(
        text.contains("no_such_kernel") && text.contains("kernels in the module"),
        "{text}"
    );
    // A name expression that is a __device__ variable, not a kernel.
    let err = compile(
        "__device__ float table[4];\n__global__ void k(float* y) { y[0] = table[0]; }",
        &["table"],
        &[],
    )
    .expect_err("not a kernel");
    assert!(matches!(err, CompileError::NoSuchKernel { .. }), "{err}");
}

#[test]
fn quoted_includes_never_search_the_working_directory() {
    if !nvrtc() {
        return;
    }
    let name = format!("kiln_cwd_probe_{}.h", std::process::id());
    let cwd_file = std::env::current_dir().expect("cwd").join(&name);
    std::fs::write(&cwd_file, "#define KILN_SECRET_FROM_CWD 1\n").expect("write probe");
    let src = format!(
        "#include \"{name}\"\n__global__ void k(int* y) {{ y[0] = KILN_SECRET_FROM_CWD; }}"
    );
    let r = compile(&src, &["k"], &[]);
    let _ = std::fs::remove_file(&cwd_file);
    let err = r.expect_err("the working directory is not searched");
    let CompileError::Failed { log } = &err else {
        panic!("expected a compile failure, got {err}");
    };
    assert!(log.contains("cannot open source file"), "{log}");
    assert!(
        log.contains("candidate.cu(1)"),
        "the source is named briefly: {log}"
    );
    assert!(!log.contains("/kiln/no-such-dir"), "{log}");
}

#[test]
fn an_error_flood_is_bounded() {
    if !nvrtc() {
        return;
    }
    let mut src = String::from("__global__ void k(float* y) {\n");
    for i in 0..20_000 {
        src.push_str(&format!("  undefined_identifier_{i} = 1;\n"));
    }
    src.push_str("}\n");
    let err = compile(&src, &["k"], &[]).expect_err("fails");
    let CompileError::Failed { log } = &err else {
        panic!("expected a compile failure, got {err}");
    };
    assert!(log.len() <= MAX_LOG_BYTES + 32, "{} bytes", log.len());
    let summary = kiln_gpu::cxx::compile::error_summary(log);
    assert!(
        summary.len() <= 2100 && summary.lines().count() <= 6,
        "{summary}"
    );
}

#[test]
fn math_constants_and_fixed_width_types_need_no_include() {
    if !nvrtc() {
        return;
    }
    let src = "__global__ void k(float* y, int64_t* z, uint8_t* b) {\n\
               constexpr float neg_inf = -INFINITY;\n\
               y[0] = neg_inf + NAN + FLT_MAX + FLT_EPSILON + M_PI + HUGE_VALF;\n\
               z[0] = INT64_MAX; b[0] = UINT8_MAX; z[1] = INT_MAX + LLONG_MIN; }";
    compile(src, &["k"], &[]).expect("compiles without any include");
}

#[test]
fn the_toolkit_headers_work_with_the_stand_ins() {
    if !nvrtc() {
        return;
    }
    let Some(dirs) = toolkit() else { return };
    let src = "#include <cuda_runtime.h>\n#include <cuda.h>\n#include <cuda_fp16.h>\n\
               #include <mma.h>\n#include <cooperative_groups.h>\n#include <cstdint>\n\
               #include <cmath>\n#include <cuda/std/cmath>\n\
               namespace cg = cooperative_groups;\n\
               __global__ void k(float* y) { cg::grid_group g = cg::this_grid(); \
               y[0] = std::sqrt(__half2float(__float2half(2.0f))) + INFINITY; g.sync(); }";
    let m = compile(src, &["k"], &dirs).expect("compiles");
    assert!(
        !m.module.log.contains("warning"),
        "no warnings from kiln's own headers: {}",
        m.module.log
    );
    println!(
        "toolkit headers + stand-ins: {:.0} ms",
        m.module.duration_ms
    );
}
