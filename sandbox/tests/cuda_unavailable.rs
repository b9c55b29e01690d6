//! The cuda backend on a machine without a GPU (CI): it reports itself unavailable with
//! the reason, and cuda requests are refused cleanly, never with a panic or a verdict
//! blamed on the candidate. Each test skips where CUDA is present.

mod common;

use kiln_sandbox::SandboxError;
use kiln_types::{Candidate, Verdict};

fn cuda_candidate(flags: &[&str]) -> Candidate {
    serde_json::from_value(serde_json::json!({
        "problem": "vecadd-cuda-1m", "language": "cuda",
        "source": "extern \"C\" __global__ void k(const float* a, const float* b, float* y, int n) { }",
        "launches": [{"kernel": "k", "grid": [4096, 1, 1], "block": [256, 1, 1],
                      "args": ["a", "b", "y", {"i32": 1048576}]}],
        "flags": flags,
    }))
    .expect("candidate")
}

#[test]
fn cuda_status_reports_unavailable_with_reason() {
    if kiln_gpu::available().is_ok() {
        println!("SKIP: CUDA is available here");
        return;
    }
    let s = kiln_sandbox::backend_status();
    let cuda = s.iter().find(|b| b.name == "cuda").expect("cuda listed");
    assert!(!cuda.usable, "{cuda:?}");
    assert!(
        cuda.detail.contains("not found")
            || cuda.detail.contains("cuInit")
            || cuda.detail.contains("no CUDA"),
        "{cuda:?}"
    );
}

#[test]
fn cuda_compile_without_nvrtc_is_backend_unavailable() {
    if kiln_gpu::facts::nvrtc_version().is_some() {
        println!("SKIP: NVRTC is available here");
        return;
    }
    let (_dir, cfg) = common::setup();
    match kiln_sandbox::compile(
        &cfg,
        &common::problem("vecadd-cuda-1m"),
        &cuda_candidate(&[]),
    ) {
        Err(SandboxError::BackendUnavailable(name, why)) => {
            assert_eq!(name, "cuda");
            assert!(why.contains("libnvrtc"), "{why}");
        }
        other => panic!("expected BackendUnavailable, got {other:?}"),
    }
}

#[test]
fn cuda_compile_refuses_a_forbidden_flag_as_compile_error() {
    let (_dir, cfg) = common::setup();
    let out = kiln_sandbox::compile(
        &cfg,
        &common::problem("vecadd-cuda-1m"),
        &cuda_candidate(&["-rdc=true"]),
    )
    .expect("refused cleanly");
    let f = out.failure.expect("a compile_error");
    assert_eq!(f.verdict, Verdict::CompileError, "{f:#?}");
    assert_eq!(f.backend, "cuda");
    assert!(f.message.contains("-rdc"), "{}", f.message);
}

#[test]
fn cuda_evaluate_without_gpu_is_backend_unavailable() {
    if kiln_gpu::available().is_ok() {
        println!("SKIP: CUDA is available here");
        return;
    }
    let (_dir, cfg) = common::setup();
    let p = common::problem("vecadd-cuda-1m");
    let r = kiln_sandbox::evaluate(&cfg, &p, b"x", &cuda_candidate(&[]), b"y", &common::plan());
    assert!(
        matches!(r, Err(SandboxError::BackendUnavailable(ref n, _)) if n == "cuda"),
        "{r:?}"
    );
}
