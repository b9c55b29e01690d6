//! What to compile for a Triton candidate, worked out by trusted code from the candidate
//! and its problem before any jail starts: one [`KernelSpec`] per distinct specialisation
//! (jit function, argument types, divisibility hints, constexprs, options), and for each
//! launch the spec it uses.
//!
//! Argument types come from what kiln passes: a problem tensor or scratch buffer is a
//! pointer to its dtype (`*fp32`), a scalar its literal's type (`i32`, `fp64`…).
//! Divisibility hints are those Triton's own JIT would derive from the same values: every
//! buffer kiln allocates is 256-byte aligned, so each pointer is divisible by 16, and so is
//! an integer scalar whose value is. They are true for every run, since kiln launches with
//! exactly these buffers and literals.

use std::collections::BTreeMap;

use kiln_types::candidate::{Constexpr, Scalar};
use kiln_types::{Arg, Candidate, Dtype, ProblemSpec};
use serde::{Deserialize, Serialize};

/// Triton's defaults for options a launch leaves out.
const DEFAULT_NUM_WARPS: u32 = 4;
const DEFAULT_NUM_STAGES: u32 = 3;

/// One kernel to compile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelSpec {
    /// The `@triton.jit` function.
    pub function: String,
    /// Triton types of its non-constexpr parameters, in order (`*fp32`, `i32`).
    pub arg_types: Vec<String>,
    /// Indices into `arg_types` of the arguments known to be divisible by 16.
    pub divisible: Vec<usize>,
    /// Constexpr values by parameter name.
    pub constexprs: BTreeMap<String, Constexpr>,
    /// Warps per program.
    pub num_warps: u32,
    /// Pipeline stages.
    pub num_stages: u32,
    /// CTAs per program.
    pub num_ctas: u32,
}

/// The compile plan of one candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Distinct kernels, in order of first use.
    pub kernels: Vec<KernelSpec>,
    /// For each launch, the index of its kernel.
    pub launches: Vec<usize>,
}

/// Triton's name for a pointer to `dtype`'s elements.
pub fn pointer_type(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::F32 => "*fp32",
        Dtype::F64 => "*fp64",
        Dtype::F16 => "*fp16",
        Dtype::Bf16 => "*bf16",
        Dtype::I32 => "*i32",
        Dtype::I64 => "*i64",
        Dtype::U8 => "*u8",
    }
}

/// Triton's name for a scalar literal's type, and whether it is an integer divisible by 16.
fn scalar_type(s: Scalar) -> (&'static str, bool) {
    match s {
        Scalar::I32(v) => ("i32", v % 16 == 0),
        Scalar::I64(v) => ("i64", v % 16 == 0),
        Scalar::U32(v) => ("u32", v % 16 == 0),
        Scalar::U64(v) => ("u64", v % 16 == 0),
        Scalar::F32(_) => ("fp32", false),
        Scalar::F64(_) => ("fp64", false),
    }
}

/// The compile plan of a (validated) Triton candidate for `problem`; `Err` names the launch
/// argument that names no tensor or scratch buffer (an invalid launch).
pub fn plan(problem: &ProblemSpec, candidate: &Candidate) -> Result<Plan, String> {
    let dtype_of = |name: &str| {
        problem.tensor(name).map(|t| t.dtype).or_else(|| {
            candidate
                .scratch
                .iter()
                .find(|s| s.name == name)
                .map(|s| s.dtype)
        })
    };
    let mut out = Plan {
        kernels: Vec::new(),
        launches: Vec::new(),
    };
    for (i, l) in candidate.launches.iter().enumerate() {
        let mut arg_types = Vec::with_capacity(l.args.len());
        let mut divisible = Vec::new();
        for (j, a) in l.args.iter().enumerate() {
            let (ty, div) = match a {
                Arg::Buffer(name) => {
                    let dtype = dtype_of(name).ok_or_else(|| {
                        let mut known: Vec<&str> =
                            problem.tensors.iter().map(|t| t.name.as_str()).collect();
                        known.extend(candidate.scratch.iter().map(|s| s.name.as_str()));
                        format!(
                            "launches[{i}] (kernel {:?}): args[{j}] names unknown buffer {name:?} \
                             (known: {})",
                            l.kernel,
                            known.join(", ")
                        )
                    })?;
                    (pointer_type(dtype), true)
                }
                Arg::Scalar(s) => scalar_type(*s),
            };
            arg_types.push(ty.to_string());
            if div {
                divisible.push(j);
            }
        }
        let spec = KernelSpec {
            function: l.kernel.clone(),
            arg_types,
            divisible,
            constexprs: l.constexprs.clone(),
            num_warps: l.num_warps.unwrap_or(DEFAULT_NUM_WARPS),
            num_stages: l.num_stages.unwrap_or(DEFAULT_NUM_STAGES),
            num_ctas: l.num_ctas.unwrap_or(1),
        };
        let index = match out.kernels.iter().position(|k| k == &spec) {
            Some(k) => k,
            None => {
                out.kernels.push(spec);
                out.kernels.len() - 1
            }
        };
        out.launches.push(index);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem() -> ProblemSpec {
        ProblemSpec::from_toml(
            r#"name = "p"
[[tensor]]
name = "x"
dtype = "f32"
shape = [4, 8]
role = "input"
[[tensor]]
name = "y"
dtype = "f16"
shape = [4, 8]
role = "output"
[tolerance]
atol = 0.0
rtol = 0.0
[reference.cuda]
file = "r.cu"
launches = [{ kernel = "r", args = ["x", "y"] }]
"#,
        )
        .expect("problem")
    }

    fn candidate(launches: &str) -> Candidate {
        serde_json::from_str(&format!(
            r#"{{"problem":"p","language":"triton","source":"x",
                "scratch":[{{"name":"tmp","dtype":"f64","elems":4}}],"launches":{launches}}}"#
        ))
        .expect("candidate")
    }

    #[test]
    fn types_and_hints_come_from_the_buffers_and_literals() {
        let c = candidate(
            r#"[{"kernel":"k","grid":[4,1,1],"args":["x","y","tmp",{"i32":32},{"i32":7},{"f32":1.5}],
                 "constexprs":{"BLOCK":8},"num_warps":2},
                {"kernel":"k","grid":[4,1,1],"args":["x","y","tmp",{"i32":32},{"i32":7},{"f32":1.5}],
                 "constexprs":{"BLOCK":8},"num_warps":2},
                {"kernel":"k","grid":[2,1,1],"args":["x","y","tmp",{"i32":32},{"i32":7},{"f32":1.5}],
                 "constexprs":{"BLOCK":16},"num_warps":2}]"#,
        );
        let p = plan(&problem(), &c).expect("plan");
        assert_eq!(p.kernels.len(), 2, "{p:?}");
        assert_eq!(p.launches, vec![0, 0, 1]);
        let k = &p.kernels[0];
        assert_eq!(
            k.arg_types,
            ["*fp32", "*fp16", "*fp64", "i32", "i32", "fp32"]
        );
        assert_eq!(k.divisible, vec![0, 1, 2, 3]);
        assert_eq!((k.num_warps, k.num_stages, k.num_ctas), (2, 3, 1));
        assert_eq!(p.kernels[1].constexprs["BLOCK"], Constexpr::Int(16));
    }

    #[test]
    fn an_unknown_buffer_is_named() {
        let e = plan(
            &problem(),
            &candidate(r#"[{"kernel":"k","args":["x","z"]}]"#),
        )
        .expect_err("unknown");
        assert!(
            e.contains("args[1] names unknown buffer \"z\"") && e.contains("x, y, tmp"),
            "{e}"
        );
    }
}
