//! How much device memory one evaluation of a problem needs on a GPU lane, by part, known
//! when the problem is registered: a problem that cannot fit the lane's GPU is refused
//! then, with these numbers, never accepted and failed later.
//!
//! The parts follow what the cuda engine allocates (`sandbox/src/engine/cuda/target.rs`)
//! and what a torch reference runner holds while it computes:
//! - every tensor once, with the guard after it, rounded to the 2 MiB granularity of
//!   shareable memory;
//! - two kept copies of the outputs (the contract compares two runs);
//! - the reference's scratch (a cuda reference);
//! - the L2 flush buffer (twice the L2);
//! - the torch reference's working set: its inputs and outputs in float64 (its default
//!   precision), twice over for the outputs (intermediates of at least that size), and
//!   the outputs once more in their declared dtypes;
//! - two CUDA contexts (the worker's and the runner's) with their libraries.
//!
//! It is an estimate of the peak, not a measurement: a module whose intermediates are
//! larger than its outputs can still run out of memory, and that is then a failed job
//! (kiln's limit), never the candidate's verdict.

use serde::Serialize;

use crate::problem::{ProblemSpec, Role};

/// Bytes after every tensor the candidate can reach (the cuda engine's guard).
pub const GUARD_BYTES: u64 = 64 << 10;

/// Allocation granularity of shareable device memory (what the driver recommends on
/// current GPUs).
pub const GRANULARITY: u64 = 2 << 20;

/// What the CUDA contexts of one lane (the worker's and a torch runner's, with cuBLAS,
/// cuDNN and torch's kernels loaded) take.
pub const CONTEXTS_BYTES: u64 = 3 << 30;

/// Fraction of a GPU's memory an evaluation may plan to use (the rest: fragmentation, the
/// driver, other work on a shared GPU).
pub const USABLE_FRACTION: f64 = 0.9;

/// One evaluation's device memory on a GPU lane, by part (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DeviceMemory {
    /// The problem's tensors with their guards.
    pub tensors: u64,
    /// The two kept copies of the outputs.
    pub kept: u64,
    /// The reference's scratch buffers.
    pub scratch: u64,
    /// The L2 flush buffer.
    pub flush: u64,
    /// The torch reference's working set (0 for a cuda reference).
    pub reference: u64,
    /// The lane's CUDA contexts.
    pub contexts: u64,
}

impl DeviceMemory {
    /// The whole estimate.
    pub fn total(&self) -> u64 {
        self.tensors
            .saturating_add(self.kept)
            .saturating_add(self.scratch)
            .saturating_add(self.flush)
            .saturating_add(self.reference)
            .saturating_add(self.contexts)
    }

    /// Whether it fits a GPU of `gpu_bytes` (within [`USABLE_FRACTION`]).
    pub fn fits(&self, gpu_bytes: u64) -> bool {
        (self.total() as f64) <= gpu_bytes as f64 * USABLE_FRACTION
    }

    /// The estimate in words, for a refusal: the total and its parts in GiB.
    pub fn describe(&self) -> String {
        format!(
            "{} (tensors {}, kept copies of the outputs {}, reference scratch {}, L2 flush {}, \
             torch reference {}, CUDA contexts {})",
            gib(self.total()),
            gib(self.tensors),
            gib(self.kept),
            gib(self.scratch),
            gib(self.flush),
            gib(self.reference),
            gib(self.contexts)
        )
    }
}

/// `bytes` in GiB with one decimal.
pub fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn round_up(bytes: u64) -> u64 {
    bytes.div_ceil(GRANULARITY).saturating_mul(GRANULARITY)
}

impl ProblemSpec {
    /// One evaluation's device memory on a GPU lane whose L2 holds `l2_bytes` (see the
    /// module doc for the parts).
    pub fn device_memory(&self, l2_bytes: u64) -> DeviceMemory {
        let sum = |f: &dyn Fn(&crate::problem::TensorSpec) -> u64| -> u64 {
            self.tensors.iter().map(f).fold(0u64, u64::saturating_add)
        };
        let tensors = sum(&|t| round_up(t.bytes().next_multiple_of(256) + GUARD_BYTES));
        let outputs = sum(&|t| if t.role == Role::Output { t.bytes() } else { 0 });
        let scratch = self
            .reference
            .kernel(crate::BackendKind::Cuda)
            .map(|k| {
                k.scratch
                    .iter()
                    .map(|s| round_up(s.elems.saturating_mul(s.dtype.size()) + GUARD_BYTES))
                    .fold(0u64, u64::saturating_add)
            })
            .unwrap_or(0);
        let f64_bytes = |t: &crate::problem::TensorSpec| -> u64 {
            if t.dtype.is_float() {
                t.elems().saturating_mul(8)
            } else {
                t.bytes()
            }
        };
        let torch_only = self.reference.torch.is_some()
            && self.reference.kernel(crate::BackendKind::Cuda).is_none();
        let reference = if torch_only {
            let inputs = sum(&|t| {
                if t.role == Role::Input {
                    f64_bytes(t)
                } else {
                    0
                }
            });
            let outs64 = sum(&|t| {
                if t.role == Role::Output {
                    f64_bytes(t)
                } else {
                    0
                }
            });
            inputs
                .saturating_add(outs64.saturating_mul(2))
                .saturating_add(outputs)
        } else {
            0
        };
        DeviceMemory {
            tensors,
            kept: outputs.saturating_mul(2),
            scratch,
            flush: l2_bytes.saturating_mul(2),
            reference,
            contexts: CONTEXTS_BYTES,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{Dtype, TensorSpec};

    fn spec(toml: &str) -> ProblemSpec {
        toml::from_str(toml).expect("spec")
    }

    const TORCH_RELU: &str = r#"
name = "relu"
[tolerance]
atol = 1e-4
rtol = 1e-4
[[tensor]]
name = "x"
dtype = "f32"
shape = [4096, 393216]
role = "input"
[[tensor]]
name = "out"
dtype = "f32"
shape = [4096, 393216]
role = "output"
[reference.torch]
file = "reference.py"
source = "class Model: ..."
forward = ["x"]
outputs = ["out"]
"#;

    /// KernelBench's level-1 ReLU (6 GiB in, 6 GiB out) with its torch reference: every
    /// part as the module doc says, and it fits an H200 but not a 40 GiB GPU.
    #[test]
    fn a_large_torch_problem_is_counted_part_by_part() {
        let p = spec(TORCH_RELU);
        let six = 4096u64 * 393216 * 4;
        let m = p.device_memory(60 << 20);
        assert_eq!(m.tensors, 2 * round_up(six + GUARD_BYTES));
        assert_eq!(m.kept, 2 * six);
        assert_eq!(m.flush, 120 << 20);
        assert_eq!(m.scratch, 0);
        // f64 input (12 GiB) + 2 x f64 output (24 GiB) + the output in f32 (6 GiB).
        assert_eq!(m.reference, 2 * six + 4 * six + six);
        assert_eq!(m.contexts, CONTEXTS_BYTES);
        assert!(m.fits(141 << 30), "{}", m.describe());
        assert!(!m.fits(40 << 30), "{}", m.describe());
        assert!(
            m.describe().contains("torch reference 42.0 GiB"),
            "{}",
            m.describe()
        );
    }

    /// A cuda reference has no torch working set; integer tensors are not widened.
    #[test]
    fn a_cuda_reference_has_no_torch_working_set() {
        let mut p = spec(TORCH_RELU);
        p.reference.torch = None;
        assert_eq!(p.device_memory(0).reference, 0);
        let mut q = spec(TORCH_RELU);
        q.tensors[0] = TensorSpec {
            dtype: Dtype::I32,
            ..q.tensors[0].clone()
        };
        let six = 4096u64 * 393216 * 4;
        assert_eq!(q.device_memory(0).reference, six + 4 * six + six);
    }
}
