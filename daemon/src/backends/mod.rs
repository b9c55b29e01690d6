//! The evaluation backends: the [`Backend`] trait the scheduler drives jobs through, and
//! the two backends kilnd offers, both compiling and evaluating candidates in jailed
//! `kiln-worker` children (the `kiln-sandbox` crate).
//!
//! - [`host`]: [`host::HostBackend`], C on the CPU, one lane;
//! - [`cuda`]: [`cuda::CudaBackend`], CUDA C on the GPUs, one lane per GPU
//!   ([`cuda::GpuLane`]: its warm worker and its clock window);
//! - [`start`]: builds them at daemon start, with the jail probe and each one's status.
//!
//! Jobs go through [`Backend::compile`] and [`Backend::evaluate`]; baselines through
//! [`Backend::baselines`] (torch eager is measured beside it by the scheduler's baseline
//! code, `crate::sched::baseline`). [`compile_key`] is the compile cache's key.

pub mod cuda;
pub mod host;
pub mod start;

use kiln_sandbox::{BackendStatus, CompileOutcome};
use kiln_types::{Candidate, EvalPlan, Evaluation, Language, ProblemSpec};
use thiserror::Error;

/// An infrastructure failure: the backend could not produce a verdict at all.
#[derive(Debug, Error)]
#[error("{0}")]
pub struct BackendError(pub String);

/// An evaluation backend.
pub trait Backend: Send + Sync {
    /// The backend's name as used in jobs (`host`, `cuda`).
    fn name(&self) -> &'static str;
    /// Whether it can run here.
    fn status(&self) -> BackendStatus;
    /// Compiles a candidate (or a problem's reference) for `problem` in the jail. Blocking.
    fn compile(
        &self,
        problem: &ProblemSpec,
        candidate: &Candidate,
    ) -> Result<CompileOutcome, BackendError>;
    /// What identifies the compiler of `language` on this backend beyond kiln's own build,
    /// for the compile cache's key (Triton: its version and the target architecture).
    fn compiler_identity(&self, _language: Language) -> String {
        String::new()
    }
    /// Evaluation lanes: one per GPU for cuda (each evaluates one candidate at a time);
    /// 1 for the host.
    fn lanes(&self) -> usize {
        1
    }
    /// What lane `lane` runs on, for people and metrics (`GPU-…` UUID, `cpu`).
    fn lane_label(&self, _lane: usize) -> String {
        "cpu".into()
    }
    /// Checks and times a compiled candidate against the compiled reference on lane
    /// `lane` (< [`Backend::lanes`]), which the caller holds alone. Blocking.
    fn evaluate(
        &self,
        lane: usize,
        problem: &ProblemSpec,
        reference: &[u8],
        candidate: &Candidate,
        artifact: &[u8],
        plan: &EvalPlan,
    ) -> Result<Evaluation, BackendError>;
    /// Times the problem's baselines (its reference and the `[baseline.cublas]` /
    /// `[baseline.cudnn]` ops) on lane `lane`, which the caller holds alone. Blocking.
    /// Backends without baselines say so.
    fn baselines(
        &self,
        _lane: usize,
        _problem: &ProblemSpec,
        _reference: &[u8],
        _plan: &EvalPlan,
    ) -> Result<Vec<kiln_types::BaselineResult>, BackendError> {
        Err(BackendError(format!(
            "the {} backend has no library baselines",
            self.name()
        )))
    }
    /// Peak figures for the floor check: (bytes/s, flop/s); 0 disables each. The host's
    /// come from the config (`evaluation.host_peak_*`), the GPU's are fixed.
    fn peaks(&self) -> (f64, f64) {
        (0.0, 0.0)
    }
}

/// A compile in a jailed worker, as the scheduler sees it (both backends compile alike).
fn compile_in_jail(
    cfg: &kiln_sandbox::SandboxConfig,
    problem: &ProblemSpec,
    candidate: &Candidate,
) -> Result<CompileOutcome, BackendError> {
    kiln_sandbox::compile(cfg, problem, candidate).map_err(|e| BackendError(e.to_string()))
}

/// The key under which a compile result is cached: everything that determines it. A
/// Triton compile also depends on the launches (constexprs, options, argument types: the
/// problem's and the scratch buffers' dtypes) and on the compiler's identity.
pub fn compile_key(backend: &dyn Backend, problem: &ProblemSpec, candidate: &Candidate) -> String {
    let mut doc = serde_json::json!({
        "backend": backend.name(),
        "language": candidate.language,
        "source": candidate.source,
        "flags": candidate.flags,
        "kiln": env!("CARGO_PKG_VERSION"),
    });
    if candidate.language == Language::Triton {
        let dtypes: Vec<(&str, kiln_types::Dtype)> = problem
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t.dtype))
            .collect();
        doc["triton"] = serde_json::json!({
            "compiler": backend.compiler_identity(candidate.language),
            "launches": candidate.launches,
            "scratch": candidate.scratch,
            "tensors": dtypes,
        });
    }
    blake3::hash(doc.to_string().as_bytes()).to_hex()[..32].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend that only names itself and its compiler.
    struct Named(&'static str);

    impl Backend for Named {
        fn name(&self) -> &'static str {
            "cuda"
        }
        fn status(&self) -> BackendStatus {
            BackendStatus {
                name: "cuda".into(),
                usable: false,
                detail: String::new(),
            }
        }
        fn compile(&self, _: &ProblemSpec, _: &Candidate) -> Result<CompileOutcome, BackendError> {
            Err(BackendError("not here".into()))
        }
        fn compiler_identity(&self, language: Language) -> String {
            if language == Language::Triton {
                self.0.to_string()
            } else {
                String::new()
            }
        }
        fn evaluate(
            &self,
            _: usize,
            _: &ProblemSpec,
            _: &[u8],
            _: &Candidate,
            _: &[u8],
            _: &EvalPlan,
        ) -> Result<Evaluation, BackendError> {
            Err(BackendError("not here".into()))
        }
    }

    fn problem(dtype: &str) -> ProblemSpec {
        ProblemSpec::from_toml(&format!(
            "name = \"p\"\n[[tensor]]\nname = \"x\"\ndtype = \"{dtype}\"\nshape = [4]\nrole = \"input\"\n\
             [[tensor]]\nname = \"y\"\ndtype = \"{dtype}\"\nshape = [4]\nrole = \"output\"\n\
             [tolerance]\natol = 0.0\nrtol = 0.0\n\
             [reference.cuda]\nfile = \"r.cu\"\nlaunches = [{{ kernel = \"r\", args = [\"x\", \"y\"] }}]\n"
        ))
        .expect("problem")
    }

    fn candidate(language: &str, block: u32) -> Candidate {
        let extra = if language == "triton" {
            format!(r#""constexprs":{{"BLOCK":{block}}}"#)
        } else {
            format!(r#""block":[{block},1,1]"#)
        };
        serde_json::from_str(&format!(
            r#"{{"problem":"p","language":"{language}","source":"x",
                "launches":[{{"kernel":"k","args":["x","y"],{extra}}}]}}"#
        ))
        .expect("candidate")
    }

    #[test]
    fn a_triton_key_covers_its_compiler_launches_and_dtypes() {
        let (p32, p16) = (problem("f32"), problem("f16"));
        let key = |b: &Named, p: &ProblemSpec, c: &Candidate| compile_key(b, p, c);
        let a = key(
            &Named("triton 3.6.0 for sm_90"),
            &p32,
            &candidate("triton", 64),
        );
        assert_eq!(
            a,
            key(
                &Named("triton 3.6.0 for sm_90"),
                &p32,
                &candidate("triton", 64)
            )
        );
        for other in [
            key(
                &Named("triton 3.5.1 for sm_90"),
                &p32,
                &candidate("triton", 64),
            ),
            key(
                &Named("triton 3.6.0 for sm_100"),
                &p32,
                &candidate("triton", 64),
            ),
            key(
                &Named("triton 3.6.0 for sm_90"),
                &p16,
                &candidate("triton", 64),
            ),
            key(
                &Named("triton 3.6.0 for sm_90"),
                &p32,
                &candidate("triton", 128),
            ),
        ] {
            assert_ne!(a, other);
        }
        // A CUDA compile does not depend on its launches or the problem's dtypes.
        let b = Named("triton 3.6.0 for sm_90");
        assert_eq!(
            key(&b, &p32, &candidate("cuda", 64)),
            key(&b, &p16, &candidate("cuda", 128))
        );
    }
}
