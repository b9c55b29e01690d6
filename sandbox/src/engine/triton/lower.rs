//! A compiled Triton candidate as the cuda backend runs it: its launches rewritten as
//! plain CUDA launches of the artifact's kernels, so the same launch check, the same
//! launch path and the same contract apply.
//!
//! For launch `i` using kernel `k` of the manifest:
//! - `kernel`: `k`'s name in the plan — the jit function's, or `function#k` when one
//!   function is compiled more than once (different constexprs or options);
//! - `grid`: the launch's own; `block`: `[32 × k.num_warps, 1, 1]`; `shared_bytes`: what
//!   Triton's compile says the kernel needs (the launch check raises the opt-in limit
//!   above 48 KiB, and refuses more than the device allows);
//! - `args`: the launch's, then Triton's trailing pointers: the global scratch (a buffer
//!   of `grid` × the per-program size, zeroed before every run like all scratch, or null
//!   when the kernel needs none), then the profile scratch (always null).

use std::collections::BTreeMap;

use kiln_gpu::{CompiledModule, ImageKind};
use kiln_types::candidate::Scalar;
use kiln_types::{Arg, Candidate, Dtype, Language, Launch, ScratchBuffer};

use super::artifact::Artifact;

/// A Triton candidate ready for the cuda backend.
pub struct Lowered {
    /// The candidate with CUDA launches (language `cuda`) and Triton's scratch added.
    pub candidate: Candidate,
    /// Each image with the kernels taken from it: (name in the plan, symbol).
    pub parts: Vec<(CompiledModule, Vec<(String, String)>)>,
}

/// The name of the global scratch buffer of launch `i`: not an identifier, so it cannot
/// collide with a tensor or a scratch buffer of the candidate's.
fn scratch_name(i: usize) -> String {
    format!("triton-global-scratch-{i}")
}

/// Lowers `candidate` with its decoded artifact. `Err` is a mismatch between the two
/// (kiln's fault, never the candidate's: the artifact was built for this candidate).
pub fn lower(candidate: &Candidate, artifact: &Artifact) -> Result<Lowered, String> {
    let m = &artifact.manifest;
    if m.launches.len() != candidate.launches.len() {
        return Err(format!(
            "the triton artifact describes {} launches; the candidate has {}",
            m.launches.len(),
            candidate.launches.len()
        ));
    }
    let mut uses: BTreeMap<&str, usize> = BTreeMap::new();
    for k in &m.kernels {
        *uses.entry(k.function.as_str()).or_default() += 1;
    }
    let plan_name = |i: usize| {
        let k = &m.kernels[i];
        if uses.get(k.function.as_str()).copied().unwrap_or(0) > 1 {
            format!("{}#{i}", k.function)
        } else {
            k.function.clone()
        }
    };
    let mut lowered = candidate.clone();
    lowered.language = Language::Cuda;
    lowered.launches.clear();
    for (i, (l, &ki)) in candidate.launches.iter().zip(&m.launches).enumerate() {
        let k = &m.kernels[ki];
        if l.args.len() != k.user_params as usize {
            return Err(format!(
                "launches[{i}]: {} arguments for a kernel of {} parameters",
                l.args.len(),
                k.user_params
            ));
        }
        let mut args = l.args.clone();
        if k.trailing_params >= 1 {
            if k.global_scratch_bytes > 0 {
                let programs: u64 = l.grid.iter().map(|&d| u64::from(d)).product();
                let bytes = programs
                    .checked_mul(k.global_scratch_bytes)
                    .filter(|&b| b <= kiln_types::candidate::MAX_SCRATCH_ELEMS)
                    .ok_or_else(|| {
                        format!(
                            "launches[{i}]: {programs} programs x {} bytes of Triton global \
                             scratch is more than kiln allocates",
                            k.global_scratch_bytes
                        )
                    })?;
                lowered.scratch.push(ScratchBuffer {
                    name: scratch_name(i),
                    dtype: Dtype::U8,
                    elems: bytes,
                });
                args.push(Arg::Buffer(scratch_name(i)));
            } else {
                args.push(Arg::Scalar(Scalar::U64(0)));
            }
        }
        for _ in 1..k.trailing_params {
            args.push(Arg::Scalar(Scalar::U64(0)));
        }
        lowered.launches.push(Launch {
            kernel: plan_name(ki),
            grid: l.grid,
            block: [32 * k.num_warps, 1, 1],
            shared_bytes: k.shared_bytes,
            args,
            ..Launch::default()
        });
    }
    let mut parts: Vec<(CompiledModule, Vec<(String, String)>)> = artifact
        .images
        .iter()
        .map(|image| {
            let module = CompiledModule {
                image: image.clone(),
                kind: ImageKind::Cubin,
                arch: m.arch.clone(),
                log: String::new(),
                options: Vec::new(),
                duration_ms: 0.0,
            };
            (module, Vec::new())
        })
        .collect();
    for (i, k) in m.kernels.iter().enumerate() {
        parts[k.image].1.push((plan_name(i), k.symbol.clone()));
    }
    Ok(Lowered {
        candidate: lowered,
        parts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::triton::artifact::{KernelEntry, Manifest};

    fn entry(image: usize, num_warps: u32, scratch: u64) -> KernelEntry {
        KernelEntry {
            function: "k".into(),
            symbol: "k".into(),
            image,
            num_warps,
            shared_bytes: 64,
            user_params: 2,
            trailing_params: 2,
            global_scratch_bytes: scratch,
            global_scratch_align: 1,
        }
    }

    fn artifact() -> Artifact {
        Artifact {
            manifest: Manifest {
                triton_version: "3.6.0".into(),
                arch: "sm_90".into(),
                images: vec![5, 5],
                kernels: vec![entry(0, 4, 0), entry(1, 8, 32)],
                launches: vec![0, 1],
            },
            images: vec![b"\x7fELFa".to_vec(), b"\x7fELFb".to_vec()],
        }
    }

    fn candidate() -> Candidate {
        serde_json::from_str(
            r#"{"problem":"p","language":"triton","source":"x","launches":[
                {"kernel":"k","grid":[8,1,1],"args":["x",{"i32":4}],"constexprs":{"B":1}},
                {"kernel":"k","grid":[2,3,1],"args":["x",{"i32":4}],"num_warps":8}]}"#,
        )
        .expect("candidate")
    }

    #[test]
    fn launches_become_cuda_launches_with_triton_params() {
        let l = lower(&candidate(), &artifact()).expect("lowers");
        let c = &l.candidate;
        assert_eq!(c.language, Language::Cuda);
        assert_eq!(c.launches[0].kernel, "k#0");
        assert_eq!(c.launches[0].block, [128, 1, 1]);
        assert_eq!(c.launches[0].shared_bytes, 64);
        assert_eq!(
            c.launches[0].args[2..],
            [Arg::Scalar(Scalar::U64(0)), Arg::Scalar(Scalar::U64(0))]
        );
        assert!(!c.launches[0].has_triton_fields());
        assert_eq!(c.launches[1].block, [256, 1, 1]);
        assert_eq!(
            c.launches[1].args[2],
            Arg::Buffer("triton-global-scratch-1".into())
        );
        assert_eq!(c.scratch.len(), 1);
        assert_eq!(c.scratch[0].elems, 6 * 32);
        assert_eq!(l.parts.len(), 2);
        assert_eq!(l.parts[1].1, vec![("k#1".to_string(), "k".to_string())]);
    }

    #[test]
    fn a_function_compiled_once_keeps_its_name() {
        let mut a = artifact();
        a.manifest.kernels[1].function = "other".into();
        let l = lower(&candidate(), &a).expect("lowers");
        assert_eq!(l.candidate.launches[0].kernel, "k");
        assert_eq!(l.candidate.launches[1].kernel, "other");
    }

    #[test]
    fn mismatches_with_the_candidate_are_errors() {
        let mut c = candidate();
        c.launches.pop();
        assert!(lower(&c, &artifact()).is_err());
        let mut c = candidate();
        c.launches[0].args.pop();
        assert!(lower(&c, &artifact()).is_err());
    }
}
