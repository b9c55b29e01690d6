//! Plain-text renderings of a problem and of an evaluation's evidence, for prompts, and
//! what the cuda backend accepts ([`CUDA_RULES`], part of [`problem`] for cuda).

use std::fmt::Write;

use kiln_types::{Candidate, ProblemSpec};

use crate::evaluator::Evaluation;

fn word(v: impl serde::Serialize) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

/// What a CUDA candidate may contain and how its launches are written (docs/api.md, "CUDA
/// candidates"), as a model needs to know it.
pub const CUDA_RULES: &str = "CUDA candidates: device code only - __global__ kernels and \
their __device__ helpers. No host code (no torch/pybind11 wrapper, no <<<...>>> launches, \
no cudaMalloc/cudaMemcpy): kiln allocates the tensors and launches the kernels from the \
launch plan. You may #include CUDA toolkit headers (cuda_fp16.h, cuda_bf16.h, cuda_fp8.h, \
mma.h, cooperative_groups.h, cub/block/*.cuh, cub/warp/*.cuh, cuda/pipeline, cuda/barrier, \
cuda/std/*) and <cstdint>, <cfloat>, <climits>, <cmath>, <cstdio>; INFINITY, NAN, FLT_MAX, \
M_PI, int64_t need no include. A launch's \"kernel\" may be a C++ name: a plain or \
namespaced kernel (ns::k) or a template instance (k<256, float>). Add \"cooperative\": true \
to a launch whose kernel calls cooperative_groups::this_grid().sync() (its whole grid must \
fit on the GPU at once: size it to blocks-per-SM x SMs and loop grid-stride), or \
\"cluster\": [2, 1, 1] for thread-block clusters (at most 8 blocks; the grid a multiple of \
it). \"-arch=sm_90a\" in flags enables wgmma and TMA instructions.";

/// The problem: name, summary, tensors (name, dtype, shape, role), tolerance, and for the
/// cuda backend [`CUDA_RULES`].
pub fn problem(spec: &ProblemSpec, backend: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "Problem {}: {}", spec.name, spec.summary);
    let _ = writeln!(s, "Backend: {backend}");
    let _ = writeln!(s, "Tensors:");
    for t in &spec.tensors {
        let _ = writeln!(
            s,
            "- {} {} {:?} ({})",
            t.name,
            word(t.dtype),
            t.shape,
            word(t.role)
        );
    }
    let _ = writeln!(
        s,
        "Tolerance: |got - want| <= {} + {} * |want| for every element",
        spec.tolerance.atol, spec.tolerance.rtol
    );
    if let Some(t) = spec.required_tier {
        let _ = writeln!(s, "Required precision tier: {}", word(t));
    }
    if backend == "cuda" {
        let _ = writeln!(s, "{CUDA_RULES}");
    }
    s
}

/// A candidate's launch plan as JSON (what the model may change).
pub fn launch_plan(c: &Candidate) -> String {
    serde_json::to_string_pretty(&serde_json::json!({
        "launches": c.launches,
        "flags": c.flags,
        "scratch": c.scratch,
    }))
    .unwrap_or_default()
}

/// The evidence of one evaluation: verdict and message, error metrics, timing,
/// resources and precision tier.
pub fn evaluation(e: &Evaluation) -> String {
    let mut s = String::new();
    let verdict = e.verdict.map_or("not-evaluated".to_string(), word);
    let _ = writeln!(s, "Verdict: {verdict} ({})", e.message);
    let full = e.full();
    if let Some(f) = &full {
        for m in &f.evidence.errors {
            let _ = writeln!(
                s,
                "Error on {}: max abs {:.3e}, max rel {:.3e}, {} mismatches",
                m.tensor, m.max_abs, m.max_rel, m.mismatches
            );
        }
        if let Some(fault) = &f.evidence.fault {
            let _ = writeln!(s, "Fault: {fault}");
        }
        if let Some(c) = &f.compile
            && !c.log.trim().is_empty()
        {
            let log: String = c.log.chars().take(1500).collect();
            let _ = writeln!(s, "Compiler output:\n{log}");
        }
        if let Some(t) = &f.timing {
            let _ = writeln!(
                s,
                "Timing: median {:.2} us, mean {:.2} us, stdev {:.2} us over {} samples",
                t.median_us, t.mean_us, t.stdev_us, t.n
            );
        }
    } else if let Some(m) = e.median_us {
        let _ = writeln!(s, "Timing: median {m:.2} us");
    }
    if e.resources.is_empty() {
        let _ = writeln!(s, "Resources: not reported by this backend");
    }
    for r in &e.resources {
        let occ = r
            .occupancy
            .map_or("-".to_string(), |o| format!("{:.0} %", o * 100.0));
        let _ = writeln!(
            s,
            "Resources of {}: {} registers/thread, {} B static shared, {} B local (spills), occupancy {occ}",
            r.name, r.registers, r.static_shared_bytes, r.local_bytes
        );
    }
    if let Some(t) = e.tier {
        let _ = writeln!(s, "Precision tier: {}", word(t));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_problems_carry_the_cuda_rules() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../problems/vecadd-cuda-1m");
        let spec = ProblemSpec::load_dir(&dir).expect("spec");
        let cuda = problem(&spec, "cuda");
        assert!(cuda.contains(CUDA_RULES), "{cuda}");
        assert!(!problem(&spec, "host").contains("cooperative"));
        for needle in [
            "No host code",
            "k<256, float>",
            "\"cooperative\": true",
            "\"cluster\"",
            "sm_90a",
        ] {
            assert!(CUDA_RULES.contains(needle), "{needle}");
        }
    }
}
