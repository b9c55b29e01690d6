//! A reference's or seed's launch plan, checked as a candidate's would be:
//! `Candidate::validate` (kernel names, counts, dimensions, launch kinds, Triton options,
//! scratch, flags), float literals finite, and for CUDA kernels the launch limits of an
//! sm_90 device through kiln-gpu's launch validator (threads per block, block and grid
//! dimensions, shared memory, clusters), as every GPU kiln runs on has at least these.

use std::collections::BTreeMap;

use kiln_gpu::launch::{BufferArg, KernelLimits};
use kiln_gpu::{DeviceLimits, check_launches};
use kiln_types::candidate::Scalar;
use kiln_types::{Arg, Candidate, Language, ProblemSpec};

/// Everything wrong with `candidate`'s plan (a kernel source of `spec` as a candidate).
pub fn check(spec: &ProblemSpec, candidate: &Candidate) -> Vec<String> {
    let mut out = Vec::new();
    let valid = candidate
        .validate()
        .map_err(|e| out.push(e.to_string()))
        .is_ok();
    for (i, l) in candidate.launches.iter().enumerate() {
        for (j, a) in l.args.iter().enumerate() {
            let (kind, finite, value) = match a {
                Arg::Scalar(Scalar::F32(v)) => ("f32", v.is_finite(), v.to_string()),
                Arg::Scalar(Scalar::F64(v)) => ("f64", v.is_finite(), v.to_string()),
                _ => continue,
            };
            if !finite {
                out.push(format!(
                    "launches[{i}].args[{j}]: {kind} value {value} is not a finite number (or \
                     beyond {kind}'s range)"
                ));
            }
        }
    }
    // The device's limits only for a plan that is valid as a candidate's (which covers
    // zero dimensions and launch kinds already).
    if valid
        && candidate.language == Language::Cuda
        && let Err(e) = device_limits(spec, candidate)
    {
        out.push(e.to_string());
    }
    out
}

/// kiln-gpu's launch validator on an sm_90 device, every kernel allowed a full block and
/// the default dynamic shared memory.
fn device_limits(spec: &ProblemSpec, candidate: &Candidate) -> Result<(), kiln_gpu::InvalidLaunch> {
    let device = DeviceLimits::sm90_example();
    let kernels: BTreeMap<String, KernelLimits> = candidate
        .launches
        .iter()
        .map(|l| {
            let limits = KernelLimits {
                max_threads_per_block: device.max_threads_per_block,
                static_shared_bytes: 0,
                max_dynamic_shared_bytes: device.max_shared_per_block,
                param_sizes: None,
                trailing_null_params: 0,
            };
            (l.kernel.clone(), limits)
        })
        .collect();
    let tensors = spec.tensors.iter().map(|t| (&t.name, t.dtype, t.elems()));
    let scratch = candidate
        .scratch
        .iter()
        .map(|s| (&s.name, s.dtype, s.elems));
    let buffers: BTreeMap<String, BufferArg> = tensors
        .chain(scratch)
        .map(|(name, dtype, elems)| {
            let buffer = BufferArg {
                ptr: 0,
                dtype,
                elems,
            };
            (name.clone(), buffer)
        })
        .collect();
    check_launches(&candidate.launches, &device, &kernels, &buffers).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = r#"
name = "t"
[[tensor]]
name = "y"
dtype = "f32"
shape = [64]
role = "output"
[tolerance]
atol = 0.0
rtol = 0.0
[reference.cuda]
file = "reference.cu"
launches = [{ kernel = "k", grid = [1, 1, 1], block = [64, 1, 1], args = ["y", { f32 = 1.0 }] }]
"#;

    fn problems(launch: &str) -> Vec<String> {
        let text = SPEC.replace(
            r#"{ kernel = "k", grid = [1, 1, 1], block = [64, 1, 1], args = ["y", { f32 = 1.0 }] }"#,
            launch,
        );
        let mut spec = ProblemSpec::from_toml(&text).expect("parses");
        if let Some(k) = spec.reference.cuda.as_mut() {
            k.source = "__global__ void k(float* y, float s) {}".into();
        }
        let c = spec
            .reference_candidate(kiln_types::BackendKind::Cuda)
            .expect("candidate");
        check(&spec, &c)
    }

    #[test]
    fn plans_are_checked_as_candidates_and_against_the_device() {
        assert_eq!(
            problems(r#"{ kernel = "k", block = [64, 1, 1], args = ["y", { f32 = 1.0 }] }"#),
            Vec::<String>::new()
        );
        for (launch, needle) in [
            (
                r#"{ kernel = "k", block = [2048, 1, 1], args = ["y"] }"#,
                "block.x = 2048 exceeds",
            ),
            (
                r#"{ kernel = "k", block = [32, 32, 2], args = ["y"] }"#,
                "2048 threads exceeds",
            ),
            (
                r#"{ kernel = "k", grid = [1, 70000, 1], args = ["y"] }"#,
                "grid.y = 70000 exceeds",
            ),
            (
                r#"{ kernel = "k", shared_bytes = 300000, args = ["y"] }"#,
                "shared memory exceed",
            ),
            (
                r#"{ kernel = "k", grid = [3, 1, 1], cluster = [2, 1, 1], args = ["y"] }"#,
                "not a multiple of cluster.x",
            ),
            (r#"{ kernel = "k<", args = ["y"] }"#, "is not a kernel name"),
            (
                r#"{ kernel = "k", num_warps = 4, args = ["y"] }"#,
                "triton launches only",
            ),
            (
                r#"{ kernel = "k", args = ["y", { f32 = inf }] }"#,
                "args[1]: f32 value inf is not a finite number",
            ),
            (
                r#"{ kernel = "k", args = ["y", { f32 = 1e39 }] }"#,
                "beyond f32's range",
            ),
        ] {
            let got = problems(launch);
            assert!(got.iter().any(|m| m.contains(needle)), "{launch}: {got:?}");
        }
    }
}
