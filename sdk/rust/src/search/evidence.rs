//! Plain-text renderings of a problem and of an evaluation's evidence, for prompts.

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

/// The problem: name, summary, tensors (name, dtype, shape, role), tolerance.
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
    s
}

/// What a model must know to write a candidate in `c`'s language, for the user message:
/// the fence to answer in and, for Triton, what kiln accepts and how its launches read.
pub fn language(c: &Candidate) -> String {
    match c.language {
        kiln_types::Language::C => {
            "Language: C (host backend). Answer with the source in a ```c block.\n".into()
        }
        kiln_types::Language::Cuda => {
            "Language: CUDA C (cuda backend, compiled by NVRTC). Answer with the source in a \
             ```cuda block.\n"
                .into()
        }
        kiln_types::Language::Triton => "Language: Triton (Python with @triton.jit functions, \
             compiled ahead of time by Triton for the GPU). At module level only imports of \
             triton, triton.language and its submodules (libdevice), @triton.jit functions and \
             NAME = tl.constexpr(<literal>) constants are accepted: kiln launches the kernels \
             itself, so no host code, no torch, no @triton.autotune or @triton.heuristics (the \
             launch plan is the config). Inside kernels use triton.language (tl.*), the \
             parameters, locals, other jit functions and constexpr constants. Each launch gives \
             `kernel` (a jit function), `grid`, `args` (its non-constexpr parameters in order: \
             tensor names or typed scalars like {\"i32\": 4096}), `constexprs` (by name), \
             `num_warps` and `num_stages`; no `block` or `shared_bytes` (they come from Triton's \
             compile). Answer with the source in a ```python block.\n"
            .into(),
    }
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
    fn the_language_guide_names_the_fence() {
        let c: Candidate = serde_json::from_str(
            r#"{"problem":"p","language":"triton","source":"x","launches":[{"kernel":"k"}]}"#,
        )
        .expect("candidate");
        let g = language(&c);
        assert!(g.contains("```python") && g.contains("num_warps"), "{g}");
        let mut cuda = c.clone();
        cuda.language = kiln_types::Language::Cuda;
        assert!(language(&cuda).contains("```cuda"));
    }
}
