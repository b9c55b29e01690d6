//! NVRTC: compile CUDA C++ to a CUBIN for one real architecture (`sm_90`, `sm_90a`), or to
//! PTX for a virtual one (`compute_90`), keeping the compiler log.
//!
//! Compile flags pass through an allow-list ([`check_flags`], pure Rust): math and
//! optimisation switches, `-std`, `--expt-relaxed-constexpr`, `--extended-lambda`, and
//! `-D`/`-U` macros with a safe charset. Everything that names a path (`-I`,
//! `--pre-include`, `-include`), enables separate compilation (`-rdc`, so no device-side
//! launches), writes files (`--time`) or picks another architecture is refused; the one
//! architecture flag accepted is the arch-specific variant of kiln's target
//! (`-arch=sm_90a` where kiln compiles for `sm_90`, for wgmma and TMA code), see
//! [`target_arch`]. `-O3` is accepted and dropped: it is already NVRTC's (and ptxas's)
//! default level, and NVRTC has no `-O` option of its own.
//!
//! Two entry points:
//! - [`compile`]: kiln's own trusted kernels — no headers, no include path,
//!   `--no-source-include`, and the source's `#include`s screened;
//! - [`crate::cxx::compile_candidate`]: candidates as people write them — the toolkit's
//!   include folders, kiln's stand-in headers and prelude, and kernels named by C++ name
//!   expressions. Both end in [`compile_program`].
//!
//! [`compile`] is blocking and has no timeout of its own: kiln-worker runs it in the jailed
//! compile child, which the daemon kills on its deadline. It uses cudarc's raw `sys` layer
//! (not `compile_ptx_with_opts`, whose internal `unwrap`s can panic) and runs under
//! `catch_unwind` as a backstop.

use std::ffi::{CStr, CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use cudarc::nvrtc::sys::{self, nvrtcProgram, nvrtcResult};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Longest compiler log kept, in bytes (the rest is cut, with a marker).
pub const MAX_LOG_BYTES: usize = 64 * 1024;

/// Options kiln always passes, before the candidate's own.
pub const BASE_OPTIONS: &[&str] = &["--no-source-include"];

/// What the compile produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageKind {
    /// An ELF CUBIN for a real architecture: loaded as is.
    Cubin,
    /// NUL-terminated PTX text: JIT-compiled by the driver when loaded.
    Ptx,
}

/// A compiled module, ready for [`crate::Gpu::load_module`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledModule {
    /// CUBIN bytes, or PTX text with its trailing NUL.
    pub image: Vec<u8>,
    /// Which of the two `image` holds.
    pub kind: ImageKind,
    /// The architecture compiled for (`sm_90`, `sm_90a`, `compute_90`).
    pub arch: String,
    /// The compiler log (warnings), cut to [`MAX_LOG_BYTES`].
    pub log: String,
    /// Every option passed to NVRTC, in order.
    pub options: Vec<String>,
    /// Wall time of the compile, milliseconds.
    pub duration_ms: f64,
}

/// A compile flag that is not on the allow-list.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("compile flag {flag:?} refused: {reason}")]
pub struct FlagError {
    /// The flag as given.
    pub flag: String,
    /// Why it was refused.
    pub reason: String,
}

/// Why a compile did not produce a module.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CompileError {
    /// NVRTC is not installed or not loadable.
    #[error("nvrtc unavailable: {0}")]
    Unavailable(String),
    /// A compile flag was refused (before NVRTC ran).
    #[error(transparent)]
    Flag(#[from] FlagError),
    /// The architecture string is not `sm_NN`, `sm_NNa`, `compute_NN` or `compute_NNa`.
    #[error("architecture {0:?} is not sm_NN[a] or compute_NN[a]")]
    Arch(String),
    /// The source was refused before NVRTC ran (NUL byte, forbidden `#include`).
    #[error("source refused: {0}")]
    Source(String),
    /// The code did not compile: the candidate's fault (`compile_error` verdict).
    #[error("compilation failed:\n{log}")]
    Failed {
        /// The compiler log.
        log: String,
    },
    /// The launch list names kernels the source does not define or instantiate, or names
    /// that are not kernels: the candidate's fault (`compile_error` verdict).
    #[error("the launch list names {} the module does not contain as kernels: {}; kernels in the module: {found}", if names.len() == 1 { "a kernel" } else { "kernels" }, names.join(", "))]
    NoSuchKernel {
        /// The launch names that did not resolve to a kernel.
        names: Vec<String>,
        /// The kernels the module does contain, readable (`k<256, float>(float*)`).
        found: String,
        /// The compiler log.
        log: String,
    },
    /// NVRTC failed for another reason (an option it rejects, out of memory, ...).
    #[error("{call} failed: {code}{}", if log.is_empty() { String::new() } else { format!("\n{log}") })]
    Nvrtc {
        /// The NVRTC call.
        call: &'static str,
        /// The `nvrtcResult` name.
        code: String,
        /// The compiler log, if any.
        log: String,
    },
    /// The NVRTC bindings panicked (e.g. a symbol missing from an old libnvrtc).
    #[error("nvrtc panicked: {0}")]
    Panicked(String),
}

/// Checks every flag against the allow-list and returns the options to pass to NVRTC
/// (normalised spellings; `-O3` dropped).
///
/// Allowed: `--use_fast_math`, `-O3`, `--maxrregcount=N` (16..=255),
/// `--extra-device-vectorization`, `-lineinfo`, `--ftz=`, `--prec-div=`, `--prec-sqrt=`,
/// `--fmad=` (each `true|false`), `-std=c++14|c++17|c++20`, `--restrict`, `-w`,
/// `--expt-relaxed-constexpr`, `--extended-lambda` (also `--expt-extended-lambda`),
/// `-DNAME` / `-DNAME=VALUE` (NAME an identifier of at most 64 characters not starting
/// with `__`; VALUE at most 64 characters of `A-Za-z0-9_.+-`), `-UNAME` (any identifier),
/// and an architecture flag naming an arch-specific target (`-arch=sm_90a`), which
/// [`target_arch`] resolves and this function drops. Single- and double-dash spellings are
/// both accepted.
pub fn check_flags(flags: &[String]) -> Result<Vec<String>, FlagError> {
    let mut out = Vec::new();
    for flag in flags {
        if let Some(a) = arch_flag(flag) {
            if !(a.starts_with("sm_") && is_valid_arch(a)) {
                return Err(refuse(
                    flag,
                    "the architecture is chosen by kiln from the GPU; only its arch-specific \
                     variant (e.g. -arch=sm_90a) may be asked for",
                ));
            }
            continue;
        }
        if let Some(opt) = check_flag(flag)? {
            out.push(opt);
        }
    }
    Ok(out)
}

/// The architecture an `-arch=`/`--gpu-architecture=` flag names, if `flag` is one.
fn arch_flag(flag: &str) -> Option<&str> {
    let body = flag.trim_start_matches('-');
    ["arch=", "gpu-architecture=", "arch", "gpu-architecture"]
        .iter()
        .find_map(|p| body.strip_prefix(p))
        .map(|v| v.trim_start_matches('='))
        .filter(|_| flag.starts_with('-'))
}

/// The architecture to compile for: kiln's `arch`, or its arch-specific variant when a
/// flag asks for it (`-arch=sm_90a` with `arch = "sm_90"`). Any other architecture flag is
/// refused: kiln compiles for the GPU it runs on.
pub fn target_arch(arch: &str, flags: &[String]) -> Result<String, FlagError> {
    let mut chosen = arch.to_string();
    for flag in flags {
        let Some(wanted) = arch_flag(flag) else {
            continue;
        };
        let specific = if arch.ends_with('a') {
            arch.to_string()
        } else {
            format!("{arch}a")
        };
        if wanted == arch || wanted == specific {
            chosen = wanted.to_string();
        } else {
            return Err(refuse(
                flag,
                format!(
                    "the architecture is chosen by kiln from the GPU ({arch}); only its \
                     arch-specific variant -arch={specific} may be asked for"
                ),
            ));
        }
    }
    Ok(chosen)
}

fn refuse(flag: &str, reason: impl Into<String>) -> FlagError {
    FlagError {
        flag: flag.to_string(),
        reason: reason.into(),
    }
}

fn check_flag(flag: &str) -> Result<Option<String>, FlagError> {
    if flag.is_empty() || flag.len() > 160 {
        return Err(refuse(flag, "empty or longer than 160 characters"));
    }
    if !flag.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(refuse(
            flag,
            "only printable ASCII without spaces is allowed",
        ));
    }
    if !flag.starts_with('-') {
        return Err(refuse(flag, "not an option (options start with '-')"));
    }
    if let Some(name) = flag
        .strip_prefix("-U")
        .or_else(|| flag.strip_prefix("--undefine-macro="))
    {
        let ident = !name.is_empty()
            && name.len() <= 64
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ident {
            return Err(refuse(
                flag,
                "macro name must be an identifier of at most 64 characters",
            ));
        }
        return Ok(Some(format!("-U{name}")));
    }
    // `-D` macros first: their value may legitimately contain '-' and '.'.
    if let Some(def) = flag
        .strip_prefix("-D")
        .or_else(|| flag.strip_prefix("--define-macro="))
    {
        return check_define(flag, def).map(Some);
    }
    if flag.contains('/') || flag.contains('\\') || flag.contains('~') {
        return Err(refuse(flag, "flags that name a path are not allowed"));
    }
    // One leading dash or two: NVRTC accepts both for its long options.
    let body = flag.trim_start_matches('-');
    let (name, value) = match body.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (body, None),
    };
    let bool_value = |v: Option<&str>| -> Result<&'static str, FlagError> {
        match v {
            Some("true") => Ok("true"),
            Some("false") => Ok("false"),
            _ => Err(refuse(flag, "value must be true or false")),
        }
    };
    match name {
        "use_fast_math" if value.is_none() => Ok(Some("--use_fast_math".into())),
        "O3" if value.is_none() => Ok(None),
        "O0" | "O1" | "O2" => Err(refuse(
            flag,
            "only -O3 (NVRTC's default) is accepted; lower levels are not timed",
        )),
        "maxrregcount" => {
            let n: u32 = value
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| refuse(flag, "expected --maxrregcount=N"))?;
            if !(16..=255).contains(&n) {
                return Err(refuse(flag, "N must be between 16 and 255"));
            }
            Ok(Some(format!("--maxrregcount={n}")))
        }
        "extra-device-vectorization" if value.is_none() => {
            Ok(Some("--extra-device-vectorization".into()))
        }
        "lineinfo" | "generate-line-info" if value.is_none() => {
            Ok(Some("--generate-line-info".into()))
        }
        "ftz" | "prec-div" | "prec-sqrt" | "fmad" => {
            Ok(Some(format!("--{name}={}", bool_value(value)?)))
        }
        "std" => match value {
            Some(v @ ("c++14" | "c++17" | "c++20")) => Ok(Some(format!("--std={v}"))),
            _ => Err(refuse(flag, "expected -std=c++14, c++17 or c++20")),
        },
        "restrict" if value.is_none() => Ok(Some("--restrict".into())),
        "expt-relaxed-constexpr" if value.is_none() => Ok(Some("--expt-relaxed-constexpr".into())),
        "extended-lambda" | "expt-extended-lambda" if value.is_none() => {
            Ok(Some("--extended-lambda".into()))
        }
        "w" | "disable-warnings" if value.is_none() => Ok(Some("--disable-warnings".into())),
        "rdc"
        | "relocatable-device-code"
        | "dc"
        | "dlink-time-opt"
        | "dlto"
        | "gen-opt-lto"
        | "extensible-whole-program"
        | "ewp" => Err(refuse(
            flag,
            "relocatable device code / link-time options are not allowed (no device-side launches)",
        )),
        "I" | "include-path" | "pre-include" | "include" | "isystem" => {
            Err(refuse(flag, "include paths are not allowed"))
        }
        "arch" | "gpu-architecture" | "gencode" | "code" => Err(refuse(
            flag,
            "the architecture is chosen by kiln from the GPU",
        )),
        "l" | "L" | "lcuda" | "lcublas" | "link" => {
            Err(refuse(flag, "kiln links nothing into a candidate"))
        }
        "G" | "device-debug" | "dopt" => Err(refuse(flag, "debug builds are not evaluated")),
        "Xptxas" | "ptxas-options" => Err(refuse(flag, "ptxas options are not allowed")),
        "time" | "fdevice-time-trace" | "split-compile" | "create-pch" | "use-pch" | "pch"
        | "pch-dir" => Err(refuse(
            flag,
            "options that write files or spawn threads are not allowed",
        )),
        _ if name.starts_with('I') || name.starts_with("include") => {
            Err(refuse(flag, "include paths are not allowed"))
        }
        _ => Err(refuse(flag, "not on the allow-list")),
    }
}

fn check_define(flag: &str, def: &str) -> Result<String, FlagError> {
    let (name, value) = match def.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (def, None),
    };
    let ident = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ident {
        return Err(refuse(
            flag,
            "macro name must be an identifier of at most 64 characters",
        ));
    }
    if name.starts_with("__") {
        return Err(refuse(flag, "macro names starting with __ are reserved"));
    }
    match value {
        None => Ok(format!("-D{name}")),
        Some(v) => {
            let ok = !v.is_empty()
                && v.len() <= 64
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '+' | '-'));
            if !ok {
                return Err(refuse(
                    flag,
                    "macro value must be 1-64 characters of A-Z a-z 0-9 _ . + -",
                ));
            }
            Ok(format!("-D{name}={v}"))
        }
    }
}

/// Refuses `#include`-like directives whose target is absolute, climbs with `..`, or is not
/// a literal name, and the other directives [`crate::cxx::screen::directives`] refuses.
pub fn check_includes(source: &str) -> Result<(), String> {
    crate::cxx::screen::directives(source)
}

/// True if and only if `arch` is `sm_NN`, `sm_NNa`, `compute_NN` or `compute_NNa` (2 or 3
/// digits).
pub fn is_valid_arch(arch: &str) -> bool {
    let rest = arch
        .strip_prefix("sm_")
        .or_else(|| arch.strip_prefix("compute_"));
    let Some(rest) = rest else { return false };
    let digits = rest.strip_suffix('a').unwrap_or(rest);
    (2..=3).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Compiles kiln's own trusted `source` for `arch` with `flags` (checked here), returning
/// the CUBIN (PTX for a virtual architecture, or if NVRTC produced no CUBIN) and the log.
/// No include path and no headers; `--no-source-include`.
///
/// Blocking; bound its run time by running it in a child process (see the module docs).
pub fn compile(source: &str, arch: &str, flags: &[String]) -> Result<CompiledModule, CompileError> {
    let started = Instant::now();
    if !is_valid_arch(arch) {
        return Err(CompileError::Arch(arch.to_string()));
    }
    let mut options: Vec<String> = BASE_OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    options.extend(check_flags(flags)?);
    check_includes(source).map_err(CompileError::Source)?;
    let program = Program {
        source,
        name: "kiln_trusted.cu",
        options: &options,
        headers: &[],
        names: &[],
        real_arch: arch.starts_with("sm_"),
    };
    let out = match compile_program(&program) {
        // Defensive: should this NVRTC not know one of kiln's base options, compile without
        // them rather than fail every compile (the jail still confines includes).
        Err(CompileError::Nvrtc { code, .. }) if code == "NVRTC_ERROR_INVALID_OPTION" => {
            let reduced: Vec<String> = options
                .iter()
                .filter(|o| !BASE_OPTIONS.contains(&o.as_str()))
                .cloned()
                .collect();
            let out = compile_program(&Program {
                options: &reduced,
                ..program
            })?;
            tracing::warn!(
                ?BASE_OPTIONS,
                "nvrtc rejected kiln's base options; compiled without them"
            );
            options = reduced;
            out
        }
        other => other?,
    };
    Ok(out.into_module(arch, options, started))
}

/// One NVRTC program: what [`compile_program`] compiles.
#[derive(Clone, Copy)]
pub(crate) struct Program<'a> {
    /// The source.
    pub source: &'a str,
    /// The program's name: NVRTC searches its directory for quoted includes (unless
    /// `--no-source-include`) and names it in the log.
    pub name: &'a str,
    /// Every option, in order.
    pub options: &'a [String],
    /// In-memory headers: (name as included, contents).
    pub headers: &'a [(String, String)],
    /// Name expressions to resolve to lowered (mangled) names.
    pub names: &'a [String],
    /// Whether to fetch a CUBIN (real architecture) or PTX.
    pub real_arch: bool,
}

/// What [`compile_program`] produced.
pub(crate) struct Output {
    pub image: Vec<u8>,
    pub kind: ImageKind,
    pub log: String,
    /// Each name expression's lowered name, in the order given (`None`: NVRTC has none).
    pub lowered: Vec<Option<String>>,
}

impl Output {
    pub(crate) fn into_module(
        self,
        arch: &str,
        options: Vec<String>,
        started: Instant,
    ) -> CompiledModule {
        let duration_ms = started.elapsed().as_secs_f64() * 1e3;
        tracing::debug!(
            arch,
            bytes = self.image.len(),
            kind = ?self.kind,
            duration_ms,
            "nvrtc compile finished"
        );
        CompiledModule {
            image: self.image,
            kind: self.kind,
            arch: arch.to_string(),
            log: self.log,
            options,
            duration_ms,
        }
    }
}

/// Compiles one program, checking for NVRTC first and catching panics in the bindings.
pub(crate) fn compile_program(p: &Program) -> Result<Output, CompileError> {
    let c = |s: &str, what: &str| {
        CString::new(s).map_err(|_| CompileError::Source(format!("{what} contains a NUL byte")))
    };
    let source = c(p.source, "source")?;
    let name = c(p.name, "the program name")?;
    let options = p
        .options
        .iter()
        .map(|o| c(o, "an option"))
        .collect::<Result<Vec<_>, _>>()?;
    let header_names = p
        .headers
        .iter()
        .map(|(n, _)| c(n, "a header name"))
        .collect::<Result<Vec<_>, _>>()?;
    let header_texts = p
        .headers
        .iter()
        .map(|(_, t)| c(t, "a header"))
        .collect::<Result<Vec<_>, _>>()?;
    let names = p
        .names
        .iter()
        .map(|n| c(n, "a kernel name"))
        .collect::<Result<Vec<_>, _>>()?;
    // SAFETY: `is_culib_present` only tries to dlopen libnvrtc (see facts.rs).
    if !unsafe { sys::is_culib_present() } {
        return Err(CompileError::Unavailable(
            "libnvrtc.so not found (install the CUDA toolkit's NVRTC or add it to LD_LIBRARY_PATH)"
                .into(),
        ));
    }
    let raw = Raw {
        source: &source,
        name: &name,
        options: &options,
        header_names: &header_names,
        header_texts: &header_texts,
        names: &names,
        real_arch: p.real_arch,
    };
    catch_unwind(AssertUnwindSafe(|| compile_raw(&raw)))
        .map_err(|e| CompileError::Panicked(crate::facts::panic_message(&e)))?
}

/// Destroys the NVRTC program when dropped, on every path out of `compile_raw`.
struct ProgramHandle(nvrtcProgram);

impl Drop for ProgramHandle {
    fn drop(&mut self) {
        // SAFETY: `self.0` was created by `nvrtcCreateProgram`, is destroyed only here, and
        // `nvrtcDestroyProgram` takes a pointer to the handle, which is valid and writable.
        let _ = unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

fn code_name(rc: nvrtcResult) -> String {
    format!("{rc:?}")
}

/// [`Program`] with every string NUL-terminated.
struct Raw<'a> {
    source: &'a CString,
    name: &'a CString,
    options: &'a [CString],
    header_names: &'a [CString],
    header_texts: &'a [CString],
    names: &'a [CString],
    real_arch: bool,
}

fn compile_raw(p: &Raw) -> Result<Output, CompileError> {
    let mut prog: nvrtcProgram = std::ptr::null_mut();
    let hn: Vec<*const c_char> = p.header_names.iter().map(|h| h.as_ptr()).collect();
    let ht: Vec<*const c_char> = p.header_texts.iter().map(|h| h.as_ptr()).collect();
    let n_headers = i32::try_from(hn.len()).unwrap_or(i32::MAX);
    let (hn_ptr, ht_ptr) = if hn.is_empty() {
        (std::ptr::null(), std::ptr::null())
    } else {
        (hn.as_ptr(), ht.as_ptr())
    };
    // SAFETY: `prog` is a valid out-pointer; the source, the name and every header name and
    // text are NUL-terminated and outlive the program (NVRTC may keep pointers to them until
    // it is destroyed, which `ProgramHandle`'s drop does before this function returns); the
    // two header arrays hold `n_headers` pointers each (or are null when there are none).
    let rc = unsafe {
        sys::nvrtcCreateProgram(
            &mut prog,
            p.source.as_ptr(),
            p.name.as_ptr(),
            n_headers,
            ht_ptr,
            hn_ptr,
        )
    };
    if rc != nvrtcResult::NVRTC_SUCCESS {
        return Err(CompileError::Nvrtc {
            call: "nvrtcCreateProgram",
            code: code_name(rc),
            log: String::new(),
        });
    }
    let prog = ProgramHandle(prog);
    for n in p.names {
        // SAFETY: `prog.0` is a live program; `n` is NUL-terminated and outlives the call.
        let rc = unsafe { sys::nvrtcAddNameExpression(prog.0, n.as_ptr()) };
        if rc != nvrtcResult::NVRTC_SUCCESS {
            return Err(CompileError::Nvrtc {
                call: "nvrtcAddNameExpression",
                code: code_name(rc),
                log: String::new(),
            });
        }
    }
    let ptrs: Vec<*const c_char> = p.options.iter().map(|o| o.as_ptr()).collect();
    let n = i32::try_from(ptrs.len()).unwrap_or(i32::MAX);
    // SAFETY: `prog.0` is a live program; `ptrs` holds `n` pointers to NUL-terminated
    // strings owned by `p.options`, which outlives the call.
    let rc = unsafe { sys::nvrtcCompileProgram(prog.0, n, ptrs.as_ptr()) };
    let log = program_log(&prog);
    match rc {
        nvrtcResult::NVRTC_SUCCESS => {}
        nvrtcResult::NVRTC_ERROR_COMPILATION => return Err(CompileError::Failed { log }),
        other => {
            return Err(CompileError::Nvrtc {
                call: "nvrtcCompileProgram",
                code: code_name(other),
                log,
            });
        }
    }
    let mut lowered = Vec::with_capacity(p.names.len());
    for n in p.names {
        let mut out: *const c_char = std::ptr::null();
        // SAFETY: `prog.0` is a compiled program and `n` the identical string given to
        // nvrtcAddNameExpression; `out` is a valid out-pointer.
        let rc = unsafe { sys::nvrtcGetLoweredName(prog.0, n.as_ptr(), &mut out) };
        lowered.push(if rc == nvrtcResult::NVRTC_SUCCESS && !out.is_null() {
            // SAFETY: NVRTC returns a NUL-terminated string it owns until the program is
            // destroyed; it is copied at once.
            Some(
                unsafe { CStr::from_ptr(out) }
                    .to_string_lossy()
                    .into_owned(),
            )
        } else {
            None
        });
    }
    let (image, kind) = image(&prog, p.real_arch, &log)?;
    Ok(Output {
        image,
        kind,
        log,
        lowered,
    })
}

/// The compiled program's CUBIN (for a real architecture) or PTX.
fn image(
    prog: &ProgramHandle,
    real_arch: bool,
    log: &str,
) -> Result<(Vec<u8>, ImageKind), CompileError> {
    let failed = |call: &'static str, rc: nvrtcResult| CompileError::Nvrtc {
        call,
        code: code_name(rc),
        log: log.to_string(),
    };
    if real_arch {
        let mut size = 0usize;
        // SAFETY: `prog.0` is a compiled program; `size` is a valid out-pointer.
        let rc = unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) };
        if rc == nvrtcResult::NVRTC_SUCCESS && size > 0 {
            let mut cubin = vec![0u8; size];
            // SAFETY: `cubin` has exactly the `size` bytes NVRTC reported for this program.
            let rc = unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast::<c_char>()) };
            if rc != nvrtcResult::NVRTC_SUCCESS {
                return Err(failed("nvrtcGetCUBIN", rc));
            }
            return Ok((cubin, ImageKind::Cubin));
        }
        tracing::warn!("nvrtc produced no CUBIN for a real architecture; falling back to PTX");
    }
    let mut size = 0usize;
    // SAFETY: `prog.0` is a compiled program; `size` is a valid out-pointer.
    let rc = unsafe { sys::nvrtcGetPTXSize(prog.0, &mut size) };
    if rc != nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return Err(failed("nvrtcGetPTXSize", rc));
    }
    let mut ptx = vec![0u8; size];
    // SAFETY: `ptx` has exactly the `size` bytes (including the trailing NUL) NVRTC reported.
    let rc = unsafe { sys::nvrtcGetPTX(prog.0, ptx.as_mut_ptr().cast::<c_char>()) };
    if rc != nvrtcResult::NVRTC_SUCCESS {
        return Err(failed("nvrtcGetPTX", rc));
    }
    if ptx.last() != Some(&0) {
        ptx.push(0);
    }
    Ok((ptx, ImageKind::Ptx))
}

fn program_log(prog: &ProgramHandle) -> String {
    let mut size = 0usize;
    // SAFETY: `prog.0` is a live program; `size` is a valid out-pointer.
    let rc = unsafe { sys::nvrtcGetProgramLogSize(prog.0, &mut size) };
    if rc != nvrtcResult::NVRTC_SUCCESS || size <= 1 {
        return String::new();
    }
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` has exactly the `size` bytes NVRTC reported for the log.
    let rc = unsafe { sys::nvrtcGetProgramLog(prog.0, buf.as_mut_ptr().cast::<c_char>()) };
    if rc != nvrtcResult::NVRTC_SUCCESS {
        return String::new();
    }
    while buf.last() == Some(&0) {
        buf.pop();
    }
    truncate_log(String::from_utf8_lossy(&buf).into_owned())
}

pub(crate) fn truncate_log(mut log: String) -> String {
    if log.len() > MAX_LOG_BYTES {
        let mut cut = MAX_LOG_BYTES;
        while !log.is_char_boundary(cut) {
            cut -= 1;
        }
        log.truncate(cut);
        log.push_str("\n[log truncated]");
    }
    log
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn allowed_flags_are_normalised() {
        let got = check_flags(&flags(&[
            "--use_fast_math",
            "-use_fast_math",
            "-O3",
            "--maxrregcount=64",
            "-maxrregcount=255",
            "--extra-device-vectorization",
            "-lineinfo",
            "--ftz=true",
            "-prec-div=false",
            "--prec-sqrt=true",
            "--fmad=false",
            "-std=c++17",
            "--std=c++20",
            "-DBLOCK=256",
            "-DVEC",
            "-DSCALE=1.5e-3",
            "-DNEG=-2",
            "--restrict",
            "-w",
            "--expt-relaxed-constexpr",
            "--expt-extended-lambda",
            "-U__CUDA_NO_HALF_OPERATORS__",
            "-arch=sm_90a",
        ]))
        .expect("all allowed");
        assert_eq!(
            got,
            flags(&[
                "--use_fast_math",
                "--use_fast_math",
                "--maxrregcount=64",
                "--maxrregcount=255",
                "--extra-device-vectorization",
                "--generate-line-info",
                "--ftz=true",
                "--prec-div=false",
                "--prec-sqrt=true",
                "--fmad=false",
                "--std=c++17",
                "--std=c++20",
                "-DBLOCK=256",
                "-DVEC",
                "-DSCALE=1.5e-3",
                "-DNEG=-2",
                "--restrict",
                "--disable-warnings",
                "--expt-relaxed-constexpr",
                "--extended-lambda",
                "-U__CUDA_NO_HALF_OPERATORS__",
            ])
        );
    }

    #[test]
    fn the_arch_flag_selects_only_the_arch_specific_target() {
        assert_eq!(target_arch("sm_90", &[]).expect("none"), "sm_90");
        assert_eq!(
            target_arch("sm_90", &flags(&["-O3", "-arch=sm_90a"])).expect("specific"),
            "sm_90a"
        );
        assert_eq!(
            target_arch("sm_90", &flags(&["--gpu-architecture=sm_90"])).expect("same"),
            "sm_90"
        );
        for other in ["-arch=sm_80", "-arch=sm_100a", "--gpu-architecture=sm_89"] {
            let err = target_arch("sm_90", &flags(&[other])).expect_err(other);
            assert!(
                err.reason.contains("-arch=sm_90a"),
                "{other}: {}",
                err.reason
            );
        }
    }

    #[test]
    fn dangerous_flags_are_refused_with_a_reason() {
        for (flag, needle) in [
            ("-rdc=true", "relocatable"),
            ("--relocatable-device-code=true", "relocatable"),
            ("-dc", "relocatable"),
            ("-I/usr/include", "path"),
            ("-Ifoo", "include"),
            ("--include-path=inc", "include"),
            ("--pre-include=evil.h", "include"),
            ("-include", "include"),
            ("--gpu-architecture=compute_80", "architecture"),
            ("-arch=native", "architecture"),
            ("-gencode=arch=compute_90,code=sm_90", "architecture"),
            ("-lcuda", "links nothing"),
            ("-U1X", "identifier"),
            ("-G", "debug"),
            ("-Xptxas=-v", "ptxas"),
            ("--time=out.csv", "write files"),
            ("--maxrregcount=8", "between"),
            ("--maxrregcount=lots", "expected"),
            ("--ftz=yes", "true or false"),
            ("-std=c++03", "expected"),
            ("-O2", "-O3"),
            ("-DX=$(rm)", "macro value"),
            ("-DX=a b", "printable"),
            ("-D__CUDA_ARCH__=900", "reserved"),
            ("-D1X=2", "identifier"),
            ("--bogus", "allow-list"),
            ("use_fast_math", "not an option"),
            ("", "empty"),
        ] {
            let err = check_flags(&flags(&[flag])).expect_err(flag);
            assert!(
                err.reason.contains(needle),
                "{flag}: reason {:?} lacks {needle:?}",
                err.reason
            );
        }
    }

    #[test]
    fn include_scan_allows_toolkit_headers_and_refuses_paths() {
        assert!(check_includes("#include <cuda_fp16.h>\n#include \"cuda/std/cstdint\"\n").is_ok());
        assert!(check_includes("  #  include <cuda_bf16.h>\n__global__ void k(){}").is_ok());
        assert!(check_includes("#include </etc/passwd>").is_err());
    }

    #[test]
    fn arch_strings() {
        for ok in ["sm_90", "sm_90a", "compute_90", "sm_100", "compute_100a"] {
            assert!(is_valid_arch(ok), "{ok}");
        }
        for bad in [
            "sm90",
            "sm_9",
            "sm_90b",
            "compute_",
            "sm_1000",
            "-arch=sm_90",
        ] {
            assert!(!is_valid_arch(bad), "{bad}");
        }
    }

    #[test]
    fn compile_without_nvrtc_is_an_error_not_a_panic() {
        // On machines without NVRTC this must fail cleanly; with it, the kernel compiles.
        match compile(
            "extern \"C\" __global__ void k(float* x) { x[0] = 1.0f; }",
            "sm_90",
            &[],
        ) {
            Ok(m) => assert!(!m.image.is_empty()),
            Err(CompileError::Unavailable(reason)) => assert!(reason.contains("libnvrtc")),
            Err(other) => panic!("unexpected error: {other}"),
        }
        // Flag problems are reported before NVRTC is needed.
        let err = compile("x", "sm_90", &flags(&["-rdc=true"])).expect_err("refused");
        assert!(matches!(err, CompileError::Flag(_)), "{err}");
        let err = compile("x", "sm90", &[]).expect_err("refused");
        assert!(matches!(err, CompileError::Arch(_)), "{err}");
    }

    #[test]
    fn long_logs_are_cut_on_a_char_boundary() {
        let log = "é".repeat(MAX_LOG_BYTES);
        let cut = truncate_log(log);
        assert!(cut.len() <= MAX_LOG_BYTES + 20);
        assert!(cut.ends_with("[log truncated]"));
    }
}
