//! Plain-text renderings of a problem and of an evaluation's evidence, for prompts, and
//! what each language's candidates may contain ([`language`]; for CUDA C [`CUDA_RULES`]).

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

/// The problem: name, summary, tensors (name, dtype, shape, role), tolerance, and the
/// PyTorch module when the reference is one (what the kernel must compute and beat).
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
    if let Some(t) = &spec.reference.torch {
        s.push_str(&torch_reference(t));
    }
    s
}

/// The torch reference as the model sees it: the module's code and how the problem's
/// tensors map onto it.
pub fn torch_reference(t: &kiln_types::TorchReference) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "The reference is this PyTorch module (KernelBench's format). Your kernel must compute \
         what Model(*{init}).forward({args}) returns, into {outs}, and is compared with torch \
         eager and torch.compile of it. get_inputs() is not used: kiln draws every input tensor.",
        init = t.init_inputs,
        args = t
            .forward
            .iter()
            .map(|n| match t.constants.get(n) {
                Some(c) => format!("{n}={c}"),
                None => n.clone(),
            })
            .collect::<Vec<_>>()
            .join(", "),
        outs = t.outputs.join(", "),
    );
    if !t.state.is_empty() {
        let _ = writeln!(
            s,
            "The module's parameters and buffers are input tensors of the problem, drawn fresh \
             each trial: {}",
            t.state
                .iter()
                .map(|(p, n)| format!("{p} = {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if !t.bool_tensors.is_empty() {
        let _ = writeln!(
            s,
            "Held as u8 (0 or 1), taken by the module as bool: {}",
            t.bool_tensors.join(", ")
        );
    }
    let _ = writeln!(s, "```python\n{}\n```", t.source.trim_end());
    s
}

/// What a model must know to write a candidate in `c`'s language, for the user message:
/// the fence to answer in and what kiln accepts and how its launches read (for CUDA C
/// [`CUDA_RULES`]).
pub fn language(c: &Candidate) -> String {
    match c.language {
        kiln_types::Language::C => {
            "Language: C (host backend). Answer with the source in a ```c block.\n".into()
        }
        kiln_types::Language::Cuda => format!(
            "Language: CUDA C (cuda backend, compiled by NVRTC). {CUDA_RULES} Answer with the \
             source in a ```cuda block.\n"
        ),
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
        kiln_types::Language::ModelNew | kiln_types::Language::ModelNewCpu => format!(
            "Language: a KernelBench ModelNew file (Python defining `class ModelNew(nn.Module)`, \
             which may build CUDA with torch.utils.cpp_extension.load_inline, use Triton kernels \
             and torch layers), run as written by kiln's hosted runner on the {}. kiln builds \
             ModelNew with the problem's get_init_inputs(), sets its parameters and buffers by \
             name to the reference's values (so keep the reference's parameter names and \
             shapes), calls forward on its own inputs and compares the output. No launch plan: \
             forward is the plan. Answer with the whole file in a ```python block.\n",
            if c.language == kiln_types::Language::ModelNew {
                "GPU"
            } else {
                "CPU"
            }
        ),
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
    fn a_torch_reference_puts_the_module_in_the_prompt() {
        let mut spec = ProblemSpec::from_toml(
            r#"
name = "kb-linear"
[[tensor]]
name = "x"
dtype = "f32"
shape = [4, 16]
role = "input"
[[tensor]]
name = "linear_weight"
dtype = "f32"
shape = [8, 16]
role = "input"
[[tensor]]
name = "out"
dtype = "f32"
shape = [4, 8]
role = "output"
[tolerance]
atol = 1e-4
rtol = 1e-4
[reference.torch]
file = "reference.py"
init_inputs = "[16, 8]"
forward = ["x"]
outputs = ["out"]
[reference.torch.state]
"linear.weight" = "linear_weight"
"#,
        )
        .expect("spec");
        if let Some(t) = spec.reference.torch.as_mut() {
            t.source = "class Model(nn.Module):\n    def forward(self, x): ...\n".into();
        }
        let text = problem(&spec, "cuda");
        assert!(
            text.contains("```python\nclass Model(nn.Module):"),
            "{text}"
        );
        assert!(text.contains("Model(*[16, 8]).forward(x)"), "{text}");
        assert!(text.contains("linear.weight = linear_weight"), "{text}");
        assert!(text.contains("torch.compile"), "{text}");
        spec.reference.torch = None;
        assert!(!problem(&spec, "cuda").contains("```python"));
    }

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
        let mut hosted = c.clone();
        hosted.language = kiln_types::Language::ModelNewCpu;
        let g = language(&hosted);
        assert!(
            g.contains("```python") && g.contains("ModelNew") && g.contains("CPU"),
            "{g}"
        );
    }

    #[test]
    fn cuda_candidates_carry_the_cuda_rules() {
        let c: Candidate = serde_json::from_str(
            r#"{"problem":"p","language":"cuda","source":"x","launches":[{"kernel":"k"}]}"#,
        )
        .expect("candidate");
        assert!(language(&c).contains(CUDA_RULES));
        let mut triton = c.clone();
        triton.language = kiln_types::Language::Triton;
        assert!(!language(&triton).contains("cooperative"));
        let mut host = c.clone();
        host.language = kiln_types::Language::C;
        assert!(!language(&host).contains("cooperative"));
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../problems/vecadd-cuda-1m");
        let spec = ProblemSpec::load_dir(&dir).expect("spec");
        assert!(!problem(&spec, "cuda").contains("cooperative"));
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
