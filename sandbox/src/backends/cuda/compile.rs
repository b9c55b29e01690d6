//! NVRTC compiles in the jailed worker's compile role (design guide §3: flags from the
//! allow-list, no `-rdc`, no includes outside the toolkit; see `kiln_gpu::nvrtc`).

use kiln_gpu::nvrtc::{self, CompileError};
use kiln_types::{Candidate, CompileInfo};

/// What the worker sends back for a cuda compile.
pub struct Compiled {
    /// The CUBIN (or PTX) image, when the compile succeeded.
    pub artifact: Option<Vec<u8>>,
    /// Duration and log.
    pub info: CompileInfo,
    /// Why it failed, for people (empty when ok).
    pub message: String,
}

/// Compiles `candidate` for `arch`. `Err` is an infrastructure failure (NVRTC missing or
/// broken), never the candidate's fault.
pub fn compile(candidate: &Candidate, arch: &str) -> Result<Compiled, String> {
    let started = std::time::Instant::now();
    match nvrtc::compile(&candidate.source, arch, &candidate.flags) {
        Ok(m) => Ok(Compiled {
            artifact: Some(m.image),
            info: CompileInfo {
                duration_ms: m.duration_ms,
                log: m.log,
                cached: false,
                kernels: Vec::new(),
            },
            message: String::new(),
        }),
        Err(e @ (CompileError::Unavailable(_) | CompileError::Panicked(_))) => Err(e.to_string()),
        Err(e) => {
            let log = match &e {
                CompileError::Failed { log } | CompileError::Nvrtc { log, .. } => log.clone(),
                _ => String::new(),
            };
            let message = match &e {
                CompileError::Failed { .. } => "nvrtc: compilation failed (see the log)".into(),
                CompileError::Nvrtc { code, .. } if code.contains("OUT_OF_MEMORY") => {
                    format!(
                        "nvrtc: {code}: {}",
                        crate::backends::limits::address_space()
                    )
                }
                other => other.to_string(),
            };
            Ok(Compiled {
                artifact: None,
                info: crate::backends::compile_info(started, log),
                message,
            })
        }
    }
}

/// Rebuilds the module description the loader needs from an artifact: an ELF image is a
/// CUBIN, anything else PTX text.
pub fn module_from_artifact(bytes: &[u8], arch: &str) -> kiln_gpu::CompiledModule {
    let kind = if bytes.starts_with(b"\x7fELF") {
        kiln_gpu::ImageKind::Cubin
    } else {
        kiln_gpu::ImageKind::Ptx
    };
    let mut image = bytes.to_vec();
    if kind == kiln_gpu::ImageKind::Ptx && image.last() != Some(&0) {
        image.push(0);
    }
    kiln_gpu::CompiledModule {
        image,
        kind,
        arch: arch.to_string(),
        log: String::new(),
        options: Vec::new(),
        duration_ms: 0.0,
    }
}
