//! The Triton candidates of the tests (kernels in this folder, written for kiln's tests):
//! shared by `tests/triton.rs` (they must compile, no GPU needed) and the GPU tests
//! (`tests/gpu/triton.rs`: they must pass the contract, or get their red-team verdict).
#![allow(dead_code)]

use kiln_types::Candidate;

/// LayerNorm in three launches (`layernorm.py`).
pub const LAYERNORM: &str = include_str!("layernorm.py");
/// A tiled matmul (`matmul.py`).
pub const MATMUL: &str = include_str!("matmul.py");
/// vecadd with a `MODE` per cheat (`redteam.py`).
pub const REDTEAM: &str = include_str!("redteam.py");

fn candidate(
    problem: &str,
    source: &str,
    launches: serde_json::Value,
    scratch: serde_json::Value,
) -> Candidate {
    serde_json::from_value(serde_json::json!({
        "problem": problem, "language": "triton", "source": source,
        "launches": launches, "scratch": scratch,
    }))
    .expect("triton candidate")
}

/// LayerNorm for layernorm-16x64x256x256: partials, finalize, apply.
pub fn layernorm() -> Candidate {
    candidate(
        "layernorm-16x64x256x256",
        LAYERNORM,
        serde_json::json!([
            {"kernel": "ln_partial", "grid": [256, 16, 1], "args": ["x", "part", {"i32": 4194304}],
             "constexprs": {"CHUNKS": 256, "BLOCK": 2048}, "num_warps": 8},
            {"kernel": "ln_finalize", "grid": [16, 1, 1],
             "args": ["part", "stats", {"i32": 4194304}, {"f64": 1e-5}],
             "constexprs": {"CHUNKS": 256}, "num_warps": 4},
            {"kernel": "ln_apply", "grid": [1024, 16, 1],
             "args": ["x", "w", "b", "stats", "y", {"i32": 4194304}],
             "constexprs": {"BLOCK": 4096}, "num_warps": 8},
        ]),
        serde_json::json!([
            {"name": "part", "dtype": "f64", "elems": 16 * 256 * 3},
            {"name": "stats", "dtype": "f64", "elems": 32},
        ]),
    )
}

/// A 4096² matmul for `problem` with `constexprs` (BM, BN, BK, GROUP; optionally
/// PRECISION, CAST_F16).
pub fn matmul(problem: &str, constexprs: serde_json::Value) -> Candidate {
    let bm = constexprs["BM"].as_u64().unwrap_or(128);
    let bn = constexprs["BN"].as_u64().unwrap_or(128);
    candidate(
        problem,
        MATMUL,
        serde_json::json!([{
            "kernel": "matmul", "grid": [(4096 / bm) * (4096 / bn), 1, 1],
            "args": ["A", "B", "C", {"i32": 4096}, {"i32": 4096}, {"i32": 4096}],
            "constexprs": constexprs, "num_warps": 8, "num_stages": 3,
        }]),
        serde_json::json!([]),
    )
}

/// The honest f32 matmul (3xTF32) and the f16-operand cheat, for matmul-fp32-4096.
pub fn matmul_f32(cast_f16: bool) -> Candidate {
    let mut c = serde_json::json!({"BM": 128, "BN": 128, "BK": 32, "GROUP": 8});
    if cast_f16 {
        c["CAST_F16"] = true.into();
    }
    matmul("matmul-fp32-4096", c)
}

/// The f16 matmul for matmul-fp16-4096.
pub fn matmul_f16() -> Candidate {
    matmul(
        "matmul-fp16-4096",
        serde_json::json!({"BM": 128, "BN": 256, "BK": 64, "GROUP": 8}),
    )
}

/// The vecadd red-team kernel in `mode` with `extra` programs past the data.
pub fn redteam(mode: u32, extra: u32) -> Candidate {
    candidate(
        "vecadd-cuda-1m",
        REDTEAM,
        serde_json::json!([{
            "kernel": "add", "grid": [1024 + extra, 1, 1],
            "args": ["a", "b", "y", "cache", "flag", {"i32": 1048576}],
            "constexprs": {"BLOCK": 1024, "MODE": mode},
        }]),
        serde_json::json!([
            {"name": "cache", "dtype": "f32", "elems": 1048576},
            {"name": "flag", "dtype": "i32", "elems": 1025},
        ]),
    )
}
