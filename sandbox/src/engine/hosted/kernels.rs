//! What a hosted file's forward launched: the runner's kernel list (torch's profiler in the
//! candidate's own process, so a claim) sorted by kiln into the file's own kernels and
//! library ones (cuBLAS, cuDNN, ATen, Triton's runtime of torch.compile, copies).
//!
//! A kernel is the file's own when its recorded name holds, as a whole identifier, the
//! name of a `__global__` function in the file's text (its `load_inline` sources) or of a
//! function under `@triton.jit` (or `@jit`). A correct forward whose kernels are all
//! library ones is the reference renamed, KernelBench's most common hack: the contract
//! turns it into `no_own_kernels` (`engine::contract::Session`, from the target's
//! `claimed_kernels`).

use serde::{Deserialize, Serialize};

/// One recorded kernel (by name), as the runner claims it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelRecord {
    /// The name torch's profiler gave (demangled, with its arguments for CUDA C++).
    pub name: String,
    /// Launches in the profiled run.
    pub calls: u64,
    /// Their GPU time, microseconds.
    pub us: f64,
}

/// The runner's answer to `K`.
#[derive(Debug, Clone, Deserialize)]
pub struct KernelAnswer {
    /// The kernels, or `None` when it could not record them.
    pub kernels: Option<Vec<KernelRecord>>,
    /// The forward's span on the GPU: its first kernel's start to its last kernel's end,
    /// on any stream, µs.
    #[serde(default)]
    pub span_us: Option<f64>,
    /// Why not, when it could not.
    #[serde(default)]
    pub error: Option<String>,
}

/// The kernels of one forward, sorted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Breakdown {
    /// Every kernel with whether it is the file's own.
    pub kernels: Vec<(KernelRecord, bool)>,
    /// GPU time of the file's own kernels, µs.
    pub own_us: f64,
    /// GPU time of library kernels, µs.
    pub library_us: f64,
    /// The forward's span on the GPU (first kernel start to last kernel end, every
    /// stream), µs, when the runner said.
    pub span_us: Option<f64>,
}

impl Breakdown {
    /// True when some recorded kernel is the file's own.
    pub fn has_own(&self) -> bool {
        self.kernels.iter().any(|(_, own)| *own)
    }

    /// Library kernels' share of the recorded GPU time (0 when nothing was recorded).
    pub fn library_fraction(&self) -> f64 {
        let total = self.own_us + self.library_us;
        if total > 0.0 {
            self.library_us / total
        } else {
            0.0
        }
    }

    /// The JSON kept with the evaluation's telemetry.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "recorded_by": "the hosted runner (torch's profiler in the candidate's process: a claim)",
            "own_us": self.own_us,
            "library_us": self.library_us,
            "library_fraction": self.library_fraction(),
            "span_us": self.span_us,
            "kernels": self.kernels.iter().map(|(k, own)| serde_json::json!({
                "name": k.name, "calls": k.calls, "us": k.us,
                "origin": if *own { "own" } else { "library" },
            })).collect::<Vec<_>>(),
        })
    }
}

/// Sorts `records` by the kernels `source` defines.
pub fn classify(source: &str, records: Vec<KernelRecord>) -> Breakdown {
    let own = own_names(source);
    let mut b = Breakdown {
        kernels: Vec::new(),
        own_us: 0.0,
        library_us: 0.0,
        span_us: None,
    };
    for k in records {
        let is_own = identifiers(&k.name).any(|id| own.iter().any(|o| o == id));
        let us = if k.us.is_finite() && k.us > 0.0 {
            k.us
        } else {
            0.0
        };
        if is_own {
            b.own_us += us;
        } else {
            b.library_us += us;
        }
        b.kernels.push((k, is_own));
    }
    b
}

/// The identifiers in `text`, in order.
fn identifiers(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|t| {
            t.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        })
}

/// Names of the kernels `source` defines: `__global__` functions (CUDA C++ in its
/// strings) and `@triton.jit` / `@jit` functions.
pub fn own_names(source: &str) -> Vec<String> {
    let mut names = Vec::new();
    // CUDA: the identifier before the first `(` after `__global__` (past any
    // `__launch_bounds__(...)`).
    for (at, _) in source.match_indices("__global__") {
        let mut rest = &source[at + "__global__".len()..];
        for _ in 0..4 {
            let Some(open) = rest.find('(') else { break };
            let before = rest[..open].trim_end();
            let name: String = before
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            if name == "__launch_bounds__" || name == "__maxnreg__" {
                match rest[open..].find(')') {
                    Some(close) => rest = &rest[open + close + 1..],
                    None => break,
                }
                continue;
            }
            if !name.is_empty() && !names.contains(&name) {
                names.push(name);
            }
            break;
        }
    }
    // Triton: the `def` after a `jit` decorator.
    let lines: Vec<&str> = source.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        if !(t.starts_with("@triton.jit") || t.starts_with("@jit") || t.starts_with("@tl.jit")) {
            continue;
        }
        if let Some(def) = lines[i + 1..]
            .iter()
            .map(|l| l.trim_start())
            .find(|l| l.starts_with("def "))
        {
            let name: String = def[4..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, us: f64) -> KernelRecord {
        KernelRecord {
            name: name.into(),
            calls: 1,
            us,
        }
    }

    #[test]
    fn own_kernels_are_found_in_cuda_and_triton_sources() {
        let src = r#"
cuda_src = """
template <int B>
__global__ void __launch_bounds__(256) fused_gelu_kernel(const float* x, float* y) {}
__global__ void rowsum(float* y) {}
"""
@triton.autotune(configs=[], key=["n"])
@triton.jit
def add_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pass
"#;
        assert_eq!(
            own_names(src),
            ["fused_gelu_kernel", "rowsum", "add_kernel"]
        );
    }

    #[test]
    fn the_reference_renamed_has_no_own_kernel_and_a_fused_file_has() {
        let torch_only = "import torch\nclass ModelNew(torch.nn.Module):\n    pass\n";
        let b = classify(
            torch_only,
            vec![rec(
                "void at::native::vectorized_elementwise_kernel<4>(int)",
                10.0,
            )],
        );
        assert!(!b.has_own());
        assert_eq!(b.library_fraction(), 1.0);
        let fused = "__global__ void fused_gelu_kernel(float* y) {}";
        let b = classify(
            fused,
            vec![
                rec("fused_gelu_kernel(float*)", 30.0),
                rec(
                    "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32",
                    10.0,
                ),
            ],
        );
        assert!(b.has_own());
        assert!((b.library_fraction() - 0.25).abs() < 1e-12);
        // A name that only contains an own name inside a longer identifier is not it.
        let b = classify(fused, vec![rec("fused_gelu_kernel_v2(float*)", 5.0)]);
        assert!(!b.has_own());
    }
}
