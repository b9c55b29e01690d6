//! The evaluation backends: the [`Backend`] trait the scheduler drives jobs through, and
//! the two backends kilnd offers, both compiling and evaluating candidates in jailed
//! `kiln-worker` children (the `kiln-sandbox` crate).
//!
//! - [`host`]: [`host::HostBackend`], C on the CPU, one lane;
//! - [`cuda`]: [`cuda::CudaBackend`], CUDA C on the GPUs, one lane per GPU
//!   ([`cuda::GpuLane`]: its warm worker and its clock window);
//! - [`start`]: builds them at daemon start, with the jail probe and each one's status;
//! - [`lanes`]: the lanes as `/v1/info` lists them (GPU, worker counters, busy time).
//!
//! Jobs go through [`Backend::compile`] and [`Backend::evaluate`]; every baseline kind
//! through [`Backend::baselines`] (`kiln_sandbox::measure_baselines`). [`compile_key`] is
//! the compile cache's key.

pub mod cuda;
#[cfg(test)]
pub(crate) mod fake;
pub mod host;
pub mod lanes;
pub mod start;

use kiln_sandbox::{BackendStatus, CompileOutcome};
use kiln_types::BackendKind;
use kiln_types::{Candidate, EvalPlan, Evaluation, Language, ProblemSpec};
use thiserror::Error;

/// An infrastructure failure: the backend could not produce a verdict at all.
#[derive(Debug, Error)]
#[error("{0}")]
pub struct BackendError(pub String);

/// An evaluation backend.
pub trait Backend: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// The backend's name as used in jobs, metrics and lane labels (`host`, `cuda`).
    fn name(&self) -> &'static str {
        self.kind().as_str()
    }
    /// Whether it can run here.
    fn status(&self) -> BackendStatus;
    /// Compiles a candidate (or a problem's reference) for `problem` in the jail. Blocking.
    fn compile(
        &self,
        problem: &ProblemSpec,
        candidate: &Candidate,
    ) -> Result<CompileOutcome, BackendError>;
    /// Evaluation lanes: one per GPU for cuda (each evaluates one candidate at a time);
    /// 1 for the host.
    fn lanes(&self) -> usize {
        1
    }
    /// What lane `lane` runs on, for people and metrics (`GPU-…` UUID, `cpu`).
    fn lane_label(&self, _lane: usize) -> String {
        "cpu".into()
    }
    /// The counters of lane `lane`'s warm worker (workers started, evaluations), where the
    /// backend keeps one per lane (cuda); read without waiting for a running evaluation.
    fn lane_worker(&self, _lane: usize) -> Option<kiln_sandbox::WarmWorkerStats> {
        None
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
    /// Times every baseline kind the problem asks for (its reference, `[baseline.*]`) on
    /// lane `lane`, which the caller holds alone. Blocking. Backends without baselines
    /// say so.
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
    /// What else decides this backend's artifacts of `language` besides the candidate: the
    /// compiler and toolkit identity and version, the target architecture (part of
    /// [`compile_key`]; Triton: its version and the target architecture).
    fn compile_identity(&self, _language: Language) -> String {
        String::new()
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

/// The key under which `backend`'s compile of `candidate` for `problem` is cached:
/// everything that determines the artifact (see [`cache_key`]).
pub fn compile_key(backend: &dyn Backend, problem: &ProblemSpec, candidate: &Candidate) -> String {
    cache_key(
        backend.name(),
        &backend.compile_identity(candidate.language),
        kiln_sandbox::COMPILE_BUILD,
        problem,
        candidate,
    )
}

/// The compile cache's key: the backend, its compile identity (compiler and toolkit
/// versions, header set, target architecture), kiln's build (a content hash of its compile
/// path), and of the candidate the language, source, flags and the kernel names its
/// launches resolve (they decide which templates are instantiated and the artifact's
/// manifest). A Triton compile also depends on the launches (constexprs, options, argument
/// types: the problem's and the scratch buffers' dtypes). Keys made any other way — by an
/// older kiln — never match, so old cache rows are ignored rather than served.
pub fn cache_key(
    backend: &str,
    identity: &str,
    build: &str,
    problem: &ProblemSpec,
    candidate: &Candidate,
) -> String {
    let mut kernels: Vec<&str> = candidate
        .launches
        .iter()
        .map(|l| l.kernel.as_str())
        .collect();
    kernels.sort_unstable();
    kernels.dedup();
    let mut doc = serde_json::json!({
        "key": 2,
        "backend": backend,
        "identity": identity,
        "build": build,
        "language": candidate.language,
        "source": candidate.source,
        "flags": candidate.flags,
        "kernels": kernels,
    });
    if candidate.language == Language::Triton {
        let dtypes: Vec<(&str, kiln_types::Dtype)> = problem
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t.dtype))
            .collect();
        doc["triton"] = serde_json::json!({
            "compiler": identity,
            "launches": candidate.launches,
            "scratch": candidate.scratch,
            "tensors": dtypes,
        });
    }
    blake3::hash(doc.to_string().as_bytes()).to_hex()[..32].to_string()
}

/// The compile identity of a backend built from `cfg`: for cuda the target architecture,
/// NVRTC's version and the toolkit headers' identity; for the host the C compiler (its
/// resolved path, size and modification time).
pub fn compile_identity(cfg: &kiln_sandbox::SandboxConfig, cuda: bool) -> String {
    if cuda {
        let nvrtc = kiln_sandbox::kiln_gpu::facts::nvrtc_version()
            .map_or_else(|| "none".to_string(), |(a, b)| format!("{a}.{b}"));
        return format!(
            "arch={}; nvrtc={nvrtc}; headers={}",
            cfg.cuda_arch,
            cfg.cuda_headers.identity()
        );
    }
    let cc = kiln_sandbox::which_cc(&cfg.cc);
    let meta = std::fs::metadata(&cc).ok();
    let mtime = meta
        .as_ref()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    format!(
        "cc={}; size={}; mtime={mtime}",
        cc.display(),
        meta.map_or(0, |m| m.len())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend that only names itself and its compiler.
    struct Named(&'static str);

    impl Backend for Named {
        fn kind(&self) -> BackendKind {
            BackendKind::Cuda
        }
        fn status(&self) -> BackendStatus {
            BackendStatus {
                name: BackendKind::Cuda,
                usable: false,
                detail: String::new(),
            }
        }
        fn compile(&self, _: &ProblemSpec, _: &Candidate) -> Result<CompileOutcome, BackendError> {
            Err(BackendError("not here".into()))
        }
        fn compile_identity(&self, language: Language) -> String {
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

    fn cuda_candidate(kernel: &str) -> Candidate {
        serde_json::from_value(serde_json::json!({
            "problem": "p", "language": "cuda", "source": "__global__ void k() {}",
            "launches": [{"kernel": kernel}],
        }))
        .expect("candidate")
    }

    #[test]
    fn the_key_changes_with_everything_that_changes_the_artifact() {
        let p = problem("f32");
        let c = cuda_candidate("k");
        let base = cache_key("cuda", "arch=sm_90; nvrtc=13.0", "build-a", &p, &c);
        assert_eq!(
            base,
            cache_key("cuda", "arch=sm_90; nvrtc=13.0", "build-a", &p, &c)
        );
        let mut other = c.clone();
        other.flags = vec!["--use_fast_math".into()];
        let mut source = c.clone();
        source.source.push(' ');
        for changed in [
            cache_key("cuda", "arch=sm_80; nvrtc=13.0", "build-a", &p, &c),
            cache_key("cuda", "arch=sm_90; nvrtc=13.1", "build-a", &p, &c),
            cache_key("cuda", "arch=sm_90; nvrtc=13.0", "build-b", &p, &c),
            cache_key("host", "arch=sm_90; nvrtc=13.0", "build-a", &p, &c),
            cache_key("cuda", "arch=sm_90; nvrtc=13.0", "build-a", &p, &other),
            cache_key("cuda", "arch=sm_90; nvrtc=13.0", "build-a", &p, &source),
            cache_key(
                "cuda",
                "arch=sm_90; nvrtc=13.0",
                "build-a",
                &p,
                &cuda_candidate("k<1>"),
            ),
        ] {
            assert_ne!(changed, base);
        }
        // Grid, block and args do not change the artifact.
        let mut shape = c.clone();
        shape.launches[0].grid = [64, 1, 1];
        assert_eq!(
            cache_key("cuda", "arch=sm_90; nvrtc=13.0", "build-a", &p, &shape),
            base
        );
    }

    #[test]
    fn a_cached_artifact_is_not_served_across_architectures_or_builds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = crate::store::SqliteStore::open(dir.path(), "test-node").expect("store");
        let p = problem("f32");
        let c = cuda_candidate("k");
        let art = crate::store::Artifact {
            bytes: b"\x7fELF sm_90 cubin".to_vec(),
            info: kiln_types::CompileInfo::default(),
        };
        let key = cache_key("cuda", "arch=sm_90; nvrtc=13.0", "build-a", &p, &c);
        store.put_artifact(&key, "cuda", &art).expect("put");
        let get = |identity: &str, build: &str| {
            store
                .get_artifact(&cache_key("cuda", identity, build, &p, &c))
                .expect("get")
        };
        assert_eq!(
            get("arch=sm_90; nvrtc=13.0", "build-a").map(|a| a.bytes),
            Some(art.bytes)
        );
        assert!(
            get("arch=sm_100; nvrtc=13.0", "build-a").is_none(),
            "another architecture"
        );
        assert!(
            get("arch=sm_90; nvrtc=13.0", "build-b").is_none(),
            "another kiln build"
        );
        // The key kiln used before this one (no architecture, no build) is not looked up.
        let old = serde_json::json!({
            "backend": "cuda", "language": c.language, "source": c.source,
            "flags": c.flags, "kiln": env!("CARGO_PKG_VERSION"),
        });
        let old_key = blake3::hash(old.to_string().as_bytes()).to_hex()[..32].to_string();
        assert_ne!(old_key, key);
    }

    #[test]
    fn identities_name_the_compiler() {
        let mut cfg = kiln_sandbox::SandboxConfig::new("/nonexistent");
        cfg.cuda_arch = "sm_90".into();
        let id = compile_identity(&cfg, true);
        assert!(id.starts_with("arch=sm_90; nvrtc="), "{id}");
        assert!(id.contains("headers="), "{id}");
        cfg.cuda_arch = "sm_100".into();
        assert_ne!(compile_identity(&cfg, true), id);
        assert!(compile_identity(&cfg, false).starts_with("cc="));
    }
}
