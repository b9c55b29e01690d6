//! NVRTC compiles in the jailed worker's compile role (docs/api.md, "CUDA candidates": flags from the
//! allow-list, no `-rdc`, no includes outside the toolkit): `kiln_gpu::cxx` compiles the
//! candidate with the toolkit's include folders (bound into the jail), kiln's stand-in
//! headers and prelude, and its kernels resolved by C++ name; the artifact is the image
//! with its kernel manifest (`kiln_gpu::artifact`). A compile the caller gives a
//! precompiled header starts from it ([`super::pch`]).

use std::path::{Path, PathBuf};

use kiln_gpu::cxx::{self, CandidateSource, pch};
use kiln_gpu::nvrtc::CompileError;
use kiln_types::{Candidate, CompileInfo};

/// What the worker sends back for a cuda compile.
pub struct Compiled {
    /// The encoded artifact (image + manifest), when the compile succeeded.
    pub artifact: Option<Vec<u8>>,
    /// Duration and log.
    pub info: CompileInfo,
    /// Why it failed, for people and models (empty when ok).
    pub message: String,
    /// Whether NVRTC used the precompiled header given (`None`: none was).
    pub pch: Option<pch::Outcome>,
}

/// Compiles `candidate` for `arch` with the toolkit headers in `include_dirs` (as this
/// process sees them), starting from the precompiled header `pch` when one is given (see
/// [`super::pch`]). `Err` is an infrastructure failure (NVRTC missing or broken), never
/// the candidate's fault.
pub fn compile(
    candidate: &Candidate,
    arch: &str,
    include_dirs: &[PathBuf],
    pch_file: Option<&Path>,
) -> Result<Compiled, String> {
    let started = std::time::Instant::now();
    let kernels: Vec<String> = candidate
        .launches
        .iter()
        .map(|l| l.kernel.clone())
        .collect();
    let source = CandidateSource {
        source: &candidate.source,
        arch,
        flags: &candidate.flags,
        include_dirs,
        kernels: &kernels,
    };
    let (result, pch) = match pch_file {
        Some(p) => {
            let (r, o) = cxx::compile_candidate_with_pch(&source, p);
            (r, Some(o))
        }
        None => (cxx::compile_candidate(&source), None),
    };
    match result {
        Ok(m) => Ok(Compiled {
            artifact: Some(m.artifact.encode()),
            info: CompileInfo {
                duration_ms: m.module.duration_ms,
                log: m.module.log,
                cached: false,
                kernels: Vec::new(),
            },
            message: String::new(),
            pch,
        }),
        Err(e @ (CompileError::Unavailable(_) | CompileError::Panicked(_))) => Err(e.to_string()),
        Err(e) => {
            let log = match &e {
                CompileError::Failed { log }
                | CompileError::Nvrtc { log, .. }
                | CompileError::NoSuchKernel { log, .. } => log.clone(),
                _ => String::new(),
            };
            let message = match &e {
                CompileError::Failed { log } => format!(
                    "nvrtc: compilation failed:\n{}",
                    cxx::compile::error_summary(log)
                ),
                CompileError::Nvrtc { code, .. } if code.contains("OUT_OF_MEMORY") => {
                    format!("nvrtc: {code}: {}", crate::engine::limits::address_space())
                }
                other => other.to_string(),
            };
            Ok(Compiled {
                artifact: None,
                info: crate::engine::compile_info(started, log),
                message,
                pch,
            })
        }
    }
}
