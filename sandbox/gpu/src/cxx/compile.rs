//! [`compile_candidate`]: a candidate's CUDA C++ to an artifact, the way nvcc users expect
//! it to compile.
//!
//! The recipe (measured with NVRTC 13.0 on published AI-generated kernels, docs/corpus.md):
//! 1. the source is screened ([`super::screen`]): host code and unsafe directives refused;
//! 2. options: the target architecture (kiln's, or its arch-specific variant when the
//!    candidate asks with `-arch=sm_90a`), `-default-device` (unannotated helpers are
//!    device code), `--pre-include=kiln_prelude.h`, `--diag-suppress=47` (libcu++ redefines
//!    `INFINITY`/`NAN` after the prelude), a `--pre-include` of each stand-in the source
//!    uses `std::` names of without including it ([`standins::implied`]), `-I` for each toolkit include folder and its
//!    `cccl/` sub-folder (CUDA 13 keeps CCCL there), then the candidate's checked flags;
//! 3. kiln's stand-in headers in memory ([`super::standins`]);
//! 4. the program is named [`SOURCE_NAME`], in a directory that does not exist: NVRTC
//!    searches the source's own directory for quoted includes, and that search must find
//!    nothing (`--no-source-include` would also stop the toolkit's headers from finding
//!    their quoted siblings, e.g. `mma.h` → `mma.hpp`);
//! 5. every kernel the launch list names is registered as a name expression, which also
//!    instantiates templates that only host code used to instantiate; its lowered name
//!    goes into the artifact's manifest. A name NVRTC cannot resolve, or one that is not a
//!    kernel, is a compile error naming the kernels the module does contain.
//! 6. given a precompiled header of the source's leading `#include`s
//!    ([`compile_candidate_with_pch`], see [`super::pch`]), `--use-pch` and
//!    `--pch-messages=true` join the options for NVRTC only (the module's recorded options
//!    are the plain ones); NVRTC's lines about the header leave the log, whose last line
//!    says whether it was used. The image holds the same code and the manifest is the
//!    same; the CUBIN's symbol table may list some local symbols in another order.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{names, pch, screen, standins};
use crate::artifact::{Artifact, KernelEntry};
use crate::nvrtc::{
    self, CompileError, CompiledModule, ImageKind, Program, check_flags, compile_program,
    is_valid_arch, target_arch,
};

/// The name NVRTC knows a candidate's source by. Its directory never exists, in the jail
/// or outside it.
pub const SOURCE_NAME: &str = "/kiln/no-such-dir/candidate.cu";

/// The name a candidate's source goes by in logs and messages.
const SHOWN_NAME: &str = "candidate.cu";

/// Options every candidate compile gets, after the architecture.
const CANDIDATE_OPTIONS: &[&str] = &["-default-device", "--diag-suppress=47"];

/// Most error lines quoted in a compile error's message (the whole log is kept beside it).
const MESSAGE_ERROR_LINES: usize = 6;

/// What [`compile_candidate`] compiles.
#[derive(Debug, Clone, Copy)]
pub struct CandidateSource<'a> {
    /// The candidate's source.
    pub source: &'a str,
    /// kiln's target architecture (`sm_90`).
    pub arch: &'a str,
    /// The candidate's flags (checked here).
    pub flags: &'a [String],
    /// The toolkit's include folders, as NVRTC sees them (inside the jail: fixed paths);
    /// empty when no toolkit headers were found.
    pub include_dirs: &'a [PathBuf],
    /// The kernel names the launch list uses (C++ name expressions), in any order.
    pub kernels: &'a [String],
}

/// A compiled candidate.
#[derive(Debug, Clone)]
pub struct CandidateModule {
    /// The module as compiled (log, options, duration).
    pub module: CompiledModule,
    /// What is stored and shipped: the image and the kernel manifest.
    pub artifact: Artifact,
}

/// The options of a candidate compile, and what was chosen for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandidateOptions {
    /// The architecture compiled for (kiln's, or its arch-specific variant).
    pub arch: String,
    /// The headers pre-included because the source uses their names without including
    /// them ([`standins::implied`]).
    pub implied: Vec<String>,
    /// Every option passed to NVRTC, in order (see the module docs).
    pub options: Vec<String>,
}

/// The options [`compile_candidate`] compiles `c` with (its flags checked, its
/// architecture resolved). Pure: NVRTC is not needed.
pub fn candidate_options(c: &CandidateSource) -> Result<CandidateOptions, CompileError> {
    let implied = standins::implied(c.source, !c.include_dirs.is_empty());
    options_for(c.arch, c.flags, &implied, c.include_dirs)
}

/// The options of a compile for `arch` with `flags` (checked here), the `implied`
/// pre-includes and the toolkit's `include_dirs`: shared by candidate compiles and the
/// PCH builds made for them ([`super::pch::build`]), so both get the same options.
pub(crate) fn options_for(
    arch: &str,
    flags: &[String],
    implied: &[&str],
    include_dirs: &[PathBuf],
) -> Result<CandidateOptions, CompileError> {
    let arch = target_arch(arch, flags)?;
    if !is_valid_arch(&arch) {
        return Err(CompileError::Arch(arch));
    }
    let flags = check_flags(flags)?;
    let options = options(&arch, implied, include_dirs, flags);
    Ok(CandidateOptions {
        arch,
        implied: implied.iter().map(|h| h.to_string()).collect(),
        options,
    })
}

/// Compiles a candidate (see the module docs). `Err(CompileError::Failed | Source | Flag |
/// NoSuchKernel)` is the candidate's `compile_error`; `Unavailable`/`Panicked`/`Nvrtc` are
/// kiln's.
pub fn compile_candidate(c: &CandidateSource) -> Result<CandidateModule, CompileError> {
    compile_inner(c, None).0
}

/// [`compile_candidate`] starting from the precompiled header at `pch` (see [`pch`]), and
/// whether NVRTC used it. The result is the one [`compile_candidate`] gives (same
/// artifact, same errors), but for the log, whose last line says whether the header was
/// used; NVRTC's own lines about it are left out. When the file cannot be opened, or the
/// compile from it ends in a catastrophic error, the candidate is compiled again without
/// it.
///
/// [`pch`]: super::pch
pub fn compile_candidate_with_pch(
    c: &CandidateSource,
    pch: &Path,
) -> (Result<CandidateModule, CompileError>, pch::Outcome) {
    let (result, outcome) = compile_inner(c, Some(pch));
    (result, outcome.unwrap_or(pch::Outcome::Unreported))
}

/// The log of a raw compile result, if it has one.
fn raw_log(r: &Result<nvrtc::Output, CompileError>) -> &str {
    match r {
        Ok(out) => &out.log,
        Err(CompileError::Failed { log } | CompileError::Nvrtc { log, .. }) => log,
        Err(_) => "",
    }
}

/// Whether a raw compile failed with a catastrophic error (one that ends the compile).
fn stopped_short(r: &Result<nvrtc::Output, CompileError>) -> bool {
    matches!(r, Err(CompileError::Failed { log }) if log.lines().any(|l| l.contains("catastrophic error")))
}

/// The raw compile result with NVRTC's PCH lines taken out of its log.
fn without_pch_lines(
    r: Result<nvrtc::Output, CompileError>,
) -> Result<nvrtc::Output, CompileError> {
    match r {
        Ok(out) => Ok(nvrtc::Output {
            log: pch::strip_log(&out.log),
            ..out
        }),
        Err(CompileError::Failed { log }) => Err(CompileError::Failed {
            log: pch::strip_log(&log),
        }),
        Err(CompileError::Nvrtc { call, code, log }) => Err(CompileError::Nvrtc {
            call,
            code,
            log: pch::strip_log(&log),
        }),
        Err(e) => Err(e),
    }
}

/// `log` with the PCH outcome's line at its end (when a PCH was given).
fn noted(mut log: String, outcome: Option<pch::Outcome>) -> String {
    if let Some(o) = outcome {
        if !log.is_empty() && !log.ends_with('\n') {
            log.push('\n');
        }
        log.push_str(&o.log_line());
    }
    log
}

fn compile_inner(
    c: &CandidateSource,
    pch_file: Option<&Path>,
) -> (Result<CandidateModule, CompileError>, Option<pch::Outcome>) {
    let started = Instant::now();
    let opts = match candidate_options(c) {
        Ok(o) => o,
        Err(e) => return (Err(e), None),
    };
    if let Some(message) = screen::host_code(c.source) {
        return (Err(CompileError::Source(message)), None);
    }
    if let Err(message) = screen::directives(c.source) {
        return (Err(CompileError::Source(message)), None);
    }
    let toolkit = !c.include_dirs.is_empty();
    let headers = standins::headers(toolkit);
    let mut kernels: Vec<String> = Vec::new();
    for k in c.kernels {
        if !kernels.contains(k) {
            kernels.push(k.clone());
        }
    }
    let with_pch: Vec<String> = match pch_file {
        Some(p) => opts
            .options
            .iter()
            .cloned()
            .chain(pch::use_options(p))
            .collect(),
        None => Vec::new(),
    };
    let plain = Program {
        source: c.source,
        name: SOURCE_NAME,
        options: &opts.options,
        headers: &headers,
        names: &kernels,
        real_arch: opts.arch.starts_with("sm_"),
    };
    let (program, raw, outcome) = match pch_file {
        None => (plain, compile_program(&plain), None),
        Some(_) => {
            let program = Program {
                options: &with_pch,
                ..plain
            };
            let raw = compile_program(&program);
            match pch::outcome(raw_log(&raw)) {
                // The file went away (or never was): compile as if none had been given.
                pch::Outcome::Unreadable => (
                    plain,
                    compile_program(&plain),
                    Some(pch::Outcome::Unreadable),
                ),
                // A compile given a PCH keeps its parse state in a temporary file; should
                // it stop short, the candidate gets the plain compile's result.
                _ if stopped_short(&raw) => {
                    let again = compile_program(&plain);
                    let o = if stopped_short(&again) {
                        pch::Outcome::Abandoned
                    } else {
                        pch::Outcome::Damaged
                    };
                    (plain, again, Some(o))
                }
                o => (program, without_pch_lines(raw), Some(o)),
            }
        }
    };
    let result = finish(c, &opts, &program, &kernels, raw, outcome, started);
    (result, outcome)
}

/// A compile's raw result made into the candidate's module or error.
fn finish(
    c: &CandidateSource,
    opts: &CandidateOptions,
    program: &Program,
    kernels: &[String],
    raw: Result<nvrtc::Output, CompileError>,
    outcome: Option<pch::Outcome>,
    started: Instant,
) -> Result<CandidateModule, CompileError> {
    let mut out = match raw {
        Ok(out) => out,
        Err(CompileError::Failed { log }) => {
            let log = shown(log);
            let unresolved = names::unresolved_in_log(&log);
            if !unresolved.is_empty() {
                return Err(no_such_kernel(program, &unresolved, noted(log, outcome)));
            }
            return Err(CompileError::Failed {
                log: noted(with_hints(log, c.include_dirs.is_empty()), outcome),
            });
        }
        Err(CompileError::Nvrtc { call, code, log }) => {
            return Err(CompileError::Nvrtc {
                call,
                code,
                log: noted(shown(log), outcome),
            });
        }
        Err(e) => return Err(e),
    };
    let in_image = names::kernels_in(&out.image);
    let mut entries = BTreeMap::new();
    let mut missing = Vec::new();
    for (name, lowered) in kernels.iter().zip(&out.lowered) {
        match lowered {
            Some(symbol)
                if out.kind != ImageKind::Cubin
                    || in_image.is_empty()
                    || in_image.iter().any(|k| &k.symbol == symbol) =>
            {
                entries.insert(
                    name.clone(),
                    KernelEntry {
                        symbol: symbol.clone(),
                        ..KernelEntry::default()
                    },
                );
            }
            _ => missing.push(name.clone()),
        }
    }
    if !missing.is_empty() {
        return Err(CompileError::NoSuchKernel {
            names: missing,
            found: names::listing(&in_image),
            log: noted(shown(out.log), outcome),
        });
    }
    let log = noted(shown(std::mem::take(&mut out.log)), outcome);
    let module =
        nvrtc::Output { log, ..out }.into_module(&opts.arch, opts.options.clone(), started);
    let artifact = Artifact::new(&module, entries);
    Ok(CandidateModule { module, artifact })
}

/// The options of a candidate compile, in order (see the module docs).
fn options(
    arch: &str,
    implied: &[&str],
    include_dirs: &[PathBuf],
    flags: Vec<String>,
) -> Vec<String> {
    let mut options = vec![format!("--gpu-architecture={arch}")];
    options.extend(CANDIDATE_OPTIONS.iter().map(|s| s.to_string()));
    options.push(format!("--pre-include={}", standins::PRELUDE));
    options.extend(implied.iter().map(|h| format!("--pre-include={h}")));
    for d in include_dirs {
        options.push(format!("-I{}", d.display()));
        let cccl = d.join("cccl");
        if cccl.is_dir() {
            options.push(format!("-I{}", cccl.display()));
        }
    }
    options.extend(flags);
    options
}

/// The log as people see it: the source's name shortened, the length bounded.
fn shown(log: String) -> String {
    nvrtc::truncate_log(log.replace(SOURCE_NAME, SHOWN_NAME))
}

/// `s` without whitespace: NVRTC's log respells a name expression (`k < 4, float >`
/// for `k<4, float>`), so names are compared this way.
fn squashed(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

/// The compile error for launch names NVRTC could not resolve: it names them as the
/// launch list spells them, and the kernels the source does define (from a second compile
/// without those names).
fn no_such_kernel(program: &Program, unresolved: &[String], log: String) -> CompileError {
    let unresolved: Vec<String> = unresolved
        .iter()
        .map(|u| {
            program
                .names
                .iter()
                .find(|n| squashed(n) == squashed(u))
                .unwrap_or(u)
                .clone()
        })
        .collect();
    let rest: Vec<String> = program
        .names
        .iter()
        .filter(|n| !unresolved.iter().any(|u| squashed(u) == squashed(n)))
        .cloned()
        .collect();
    let found = match compile_program(&Program {
        names: &rest,
        ..*program
    }) {
        Ok(out) => names::listing(&names::kernels_in(&out.image)),
        Err(_) => "unknown (the source does not compile without those names either)".into(),
    };
    CompileError::NoSuchKernel {
        names: unresolved,
        found,
        log,
    }
}

/// `log` with a line of advice for each header NVRTC could not open, for CUB's
/// device-wide algorithms and Thrust (host-launched), and for an annotated lambda (NVRTC
/// has no `--extended-lambda`).
fn with_hints(mut log: String, no_toolkit: bool) -> String {
    let mut hints = Vec::new();
    for line in log.lines() {
        if is_host_launched_library_error(line) {
            let hint = "cub's device-wide algorithms (cub::Device*) and Thrust are launched from \
                        host code, which a candidate has none of; device code can use cub's \
                        block-, warp- and thread-level primitives (<cub/cub.cuh>, \
                        <cub/block/...>, <cub/warp/...>)"
                .to_string();
            if !hints.contains(&hint) {
                hints.push(hint);
            }
            continue;
        }
        if line.contains("requires --extended-lambda") {
            let hint = "NVRTC has no --extended-lambda (kiln drops the flag): inside device \
                        code a lambda needs no __device__ or __host__ annotation; remove it"
                .to_string();
            if !hints.contains(&hint) {
                hints.push(hint);
            }
            continue;
        }
        // "cannot open source file" with an include path, "could not open" without.
        const MARK: &str = "open source file \"";
        let Some(at) = line.find(MARK) else {
            continue;
        };
        let rest = &line[at + MARK.len()..];
        let Some(name) = rest.split('"').next() else {
            continue;
        };
        let hint = header_hint(name, no_toolkit);
        if !hints.contains(&hint) {
            hints.push(hint);
        }
    }
    if !hints.is_empty() {
        log.push_str("\nkiln: ");
        log.push_str(&hints.join("\nkiln: "));
    }
    log
}

/// Whether a log line is an error from CUB's device-wide algorithms or Thrust, which are
/// launched from host code. Their headers either refuse NVRTC with an `#error` (the CCCL of
/// CUDA 13.2) or fail inside (that of CUDA 13.0, seen on the H200: "A function explicitly
/// marked as a __host__ function is not allowed in JIT mode" in `cub/device/…`,
/// `cub/detail/launcher/…` and `thrust/…` files).
fn is_host_launched_library_error(line: &str) -> bool {
    if line.contains("#error directive: \"Including <cub/device/")
        || line.contains("#error directive: \"Including <thrust/")
    {
        return true;
    }
    let Some((place, _)) = line.split_once(": error") else {
        return false;
    };
    ["/cub/device/", "/cub/detail/launcher/", "/thrust/"]
        .iter()
        .any(|dir| place.contains(dir))
}

/// Why `name` cannot be included here, in a sentence.
pub fn header_hint(name: &str, no_toolkit: bool) -> String {
    if name.starts_with("cutlass/") || name.starts_with("cute/") {
        return format!("<{name}>: CUTLASS/CuTe headers are not available to candidates");
    }
    if no_toolkit {
        return format!(
            "<{name}> is unavailable: no CUDA toolkit headers were found on this machine \
             (`kiln doctor` shows where kiln looked; set [cuda] include_dirs); without them \
             only kiln's stand-ins for the C/C++ headers are available"
        );
    }
    if name.starts_with("crt/") {
        return format!(
            "<{name}> belongs to the CUDA toolkit but is missing from the headers found here: \
             they lack crt/ (CUDA 13's pip wheels ship it separately, in nvidia-cuda-crt); \
             `kiln doctor` shows which headers kiln uses"
        );
    }
    format!(
        "<{name}> is neither a CUDA toolkit header nor one of kiln's stand-ins for the host \
         C/C++ headers (host-only headers are not available to device code)"
    )
}

/// The first error lines of a failed compile's log, for its message, then kiln's advice
/// (its `kiln: ` lines, which `with_hints` puts at the end of the log). The advice is
/// always kept: a log of many errors gives fewer error lines, and the 2 KiB cut falls on
/// them.
pub fn error_summary(log: &str) -> String {
    const MAX_BYTES: usize = 2048;
    let hints: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("kiln: "))
        .take(MESSAGE_ERROR_LINES)
        .collect();
    let room = MESSAGE_ERROR_LINES.saturating_sub(hints.len()).max(1);
    let mut errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("error") && !l.starts_with("kiln: "))
        .take(room)
        .collect();
    if errors.is_empty() && hints.is_empty() {
        errors = log.lines().take(MESSAGE_ERROR_LINES).collect();
    }
    let advice = hints.join("\n");
    let budget = MAX_BYTES
        .saturating_sub(advice.len() + 1)
        .max(MAX_BYTES / 4);
    let mut s = errors.join("\n");
    if s.len() > budget {
        let mut cut = budget;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    if !advice.is_empty() {
        if !s.is_empty() {
            s.push('\n');
        }
        s.push_str(&advice);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_put_the_toolkit_and_its_cccl_folder_on_the_path() {
        let dir = tempdir();
        std::fs::create_dir_all(dir.join("cccl")).expect("cccl");
        let opts = options(
            "sm_90a",
            &["limits"],
            &[dir.clone(), PathBuf::from("/nowhere")],
            vec!["-DX".into()],
        );
        assert_eq!(
            opts,
            vec![
                "--gpu-architecture=sm_90a".to_string(),
                "-default-device".into(),
                "--diag-suppress=47".into(),
                "--pre-include=kiln_prelude.h".into(),
                "--pre-include=limits".into(),
                format!("-I{}", dir.display()),
                format!("-I{}/cccl", dir.display()),
                "-I/nowhere".into(),
                "-DX".into(),
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "kiln-cxx-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&d).expect("tempdir");
        d
    }

    #[test]
    fn refusals_come_before_nvrtc_is_needed() {
        let kernels = vec!["k".to_string()];
        let src = |s: &'static str| CandidateSource {
            source: s,
            arch: "sm_90",
            flags: &[],
            include_dirs: &[],
            kernels: &kernels,
        };
        let err = compile_candidate(&src("#include <torch/extension.h>\n__global__ void k(){}"))
            .expect_err("host code");
        assert!(
            err.to_string().contains("host code is not accepted"),
            "{err}"
        );
        let err = compile_candidate(&src("#include \"/dev/zero\"\n")).expect_err("include");
        assert!(err.to_string().contains("absolute"), "{err}");
        let flags = vec!["-arch=sm_80".to_string()];
        let err = compile_candidate(&CandidateSource {
            flags: &flags,
            ..src("__global__ void k(){}")
        })
        .expect_err("arch");
        assert!(matches!(err, CompileError::Flag(_)), "{err}");
    }

    #[test]
    fn hints_and_summaries_are_short_and_say_why() {
        let log = "candidate.cu(1): catastrophic error: could not open source file \"cuda_fp16.h\" \
                   (no directories in search list)\n1 catastrophic error detected";
        let with = with_hints(log.to_string(), true);
        assert!(with.contains("kiln: <cuda_fp16.h> is unavailable: no CUDA toolkit headers"));
        let with = with_hints(log.to_string(), false);
        assert!(with.contains("neither a CUDA toolkit header"));
        assert!(header_hint("cutlass/gemm.h", false).contains("CUTLASS"));
        assert!(header_hint("crt/mma.h", false).contains("nvidia-cuda-crt"));
        let summary = error_summary(&with);
        assert!(summary.starts_with("candidate.cu(1): catastrophic error"));
        assert!(summary.contains("kiln: <cuda_fp16.h>"));
        // CUB's device-wide headers: refused by #error (CCCL of CUDA 13.2), or failing inside
        // (CCCL of CUDA 13.0); both get the same advice, other errors in cub do not.
        let advice = "kiln: cub's device-wide algorithms";
        for log in [
            "/inc/cub/device/device_reduce.cuh(20): error: #error directive: \"Including              <cub/device/device_reduce.cuh> is not supported with NVRTC\"",
            "/usr/local/cuda/include/cccl/cub/device/dispatch/dispatch_scan.cuh(409): error: A              function explicitly marked as a __host__ function is not allowed in JIT mode",
            "/usr/local/cuda/include/cccl/thrust/system/cuda/detail/core/triple_chevron_launch.h             (61): error: A function explicitly marked as a __host__ function is not allowed in              JIT mode",
        ] {
            assert!(with_hints(log.to_string(), false).contains(advice), "{log}");
        }
        let own = "candidate.cu(3): error: identifier \"cub_device_thing\" is undefined
                   /inc/cub/block/block_reduce.cuh(9): error: expected a \";\"";
        assert!(!with_hints(own.to_string(), false).contains(advice));
        let long = "error: x\n".repeat(1000);
        assert!(error_summary(&long).lines().count() <= MESSAGE_ERROR_LINES);
        // Many errors, then advice: the advice stays in the message.
        let flood = with_hints(
            "/inc/cub/device/dispatch/d.cuh(1): error: A function explicitly marked as a \
             __host__ function is not allowed in JIT mode\n"
                .repeat(200),
            false,
        );
        let summary = error_summary(&flood);
        assert!(summary.lines().count() <= MESSAGE_ERROR_LINES, "{summary}");
        assert!(summary.starts_with("/inc/cub/device/"), "{summary}");
        assert!(summary.contains(advice), "{summary}");
        let wide = format!("e.cu(1): error: {}\nkiln: advice", "x".repeat(5000));
        let summary = error_summary(&wide);
        assert!(
            summary.len() <= 2048 + 4 && summary.ends_with("\nkiln: advice"),
            "{summary}"
        );
    }
}
