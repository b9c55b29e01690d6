//! The checks a candidate's source passes before NVRTC sees it (pure Rust).
//!
//! - [`host_code`] refuses a torch/host wrapper (`torch/extension.h`, `torch::Tensor`,
//!   `PYBIND11_MODULE`, `<<<…>>>` launches, `cudaMalloc` and other host runtime calls,
//!   `main`) with a message that says what kiln accepts instead, names the lines, and is
//!   short enough to hand back to a model.
//! - [`directives`] checks preprocessor directives: `#include` (and `#include_next`,
//!   `__has_include`, `__has_include_next`) must name a header literally (`<…>` or `"…"`,
//!   never a macro) by a relative name without `..`; `#embed`, `#import` and `__has_embed` are refused; and `#define`/`#undef` of names
//!   reserved to the implementation (`__x`, `_X`) are refused but for a few documented
//!   switches, because the toolkit builds some of its own `#include`s from such macros
//!   (Thrust's `__THRUST_*_HEADER`).
//!
//! These checks are defence in depth. What NVRTC can open is bounded by the compile jail
//! (only the toolkit's include folders are bound into it, at fixed paths) and by the
//! program's name, which lives in a directory that does not exist, so a quoted include
//! never searches the worker's working directory.

use super::lexer::{Line, logical_lines};

/// Macros reserved to the implementation that a candidate may still define or undefine:
/// the switches NVIDIA documents for `cuda_fp16.h`/`cuda_bf16.h`, and `_USE_MATH_DEFINES`.
const RESERVED_SWITCHES: &[&str] = &[
    "__CUDA_NO_HALF_OPERATORS__",
    "__CUDA_NO_HALF_CONVERSIONS__",
    "__CUDA_NO_HALF2_OPERATORS__",
    "__CUDA_NO_BFLOAT16_OPERATORS__",
    "__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "__CUDA_NO_BFLOAT162_OPERATORS__",
    "_USE_MATH_DEFINES",
];

/// Header folders that only host wrappers include.
const HOST_HEADER_PREFIXES: &[&str] = &[
    "torch/",
    "ATen/",
    "c10/",
    "pybind11/",
    "THC/",
    "caffe2/",
    "Python.h",
];

/// Namespaces of the torch/pybind11 host API.
const HOST_NAMESPACES: &[&str] = &["torch", "at", "c10", "pybind11", "py"];

/// Names (macros, namespaces) of the torch/pybind11 host API.
const HOST_NAMES: &[&str] = &[
    "pybind11",
    "PYBIND11_MODULE",
    "TORCH_LIBRARY",
    "TORCH_LIBRARY_IMPL",
    "TORCH_EXTENSION_NAME",
    "TORCH_CHECK",
    "C10_CUDA_CHECK",
    "C10_CUDA_KERNEL_LAUNCH_CHECK",
];

/// Host runtime and driver calls (by prefix) that only host code makes: memory, launches,
/// streams, events, graphs, device management.
const HOST_CALL_PREFIXES: &[&str] = &[
    "cudaMalloc",
    "cudaFree",
    "cudaMemcpy",
    "cudaMemset",
    "cudaLaunch",
    "cudaStream",
    "cudaEvent",
    "cudaGraph",
    "cudaDeviceSynchronize",
    "cudaDeviceReset",
    "cudaSetDevice",
    "cudaGetDeviceProperties",
    "cudaFuncSetAttribute",
    "cudaFuncGetAttributes",
    "cudaOccupancy",
    "cuLaunch",
    "cuMem",
    "cuModule",
    "cuCtx",
    "cuInit",
];

/// Where kiln found host code, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// 1-based line.
    pub line: usize,
    /// What was found (`torch::Tensor`, `<<<…>>>`, `cudaMalloc(`).
    pub what: String,
}

/// Host code in `source`, in line order (at most one finding per line).
pub fn find_host_code(source: &str) -> Vec<Finding> {
    let mut out = Vec::new();
    for line in logical_lines(source) {
        if let Some(what) = host_code_in(&line) {
            out.push(Finding {
                line: line.number,
                what,
            });
        }
    }
    out
}

fn host_code_in(line: &Line) -> Option<String> {
    if let Some((_, name, _)) = include_target(&line.code)
        && HOST_HEADER_PREFIXES.iter().any(|p| name.starts_with(p))
    {
        return Some(format!("#include <{name}>"));
    }
    if line.bare.trim_start().starts_with('#') {
        return None; // other directives are the include/macro screen's business
    }
    if line.bare.contains("<<<") {
        return Some("<<<…>>> kernel launch".into());
    }
    let tokens = tokens(&line.bare);
    for (i, t) in tokens.iter().enumerate() {
        let next = tokens.get(i + 1).map(String::as_str);
        if let Some((ns, _)) = t.split_once("::")
            && HOST_NAMESPACES.contains(&ns.trim_start_matches(':'))
            && !ns.is_empty()
        {
            return Some(t.clone());
        }
        if HOST_NAMES.contains(&t.as_str()) || t.starts_with("AT_DISPATCH_") {
            return Some(t.clone());
        }
        if next == Some("(") && HOST_CALL_PREFIXES.iter().any(|p| t.starts_with(p)) {
            return Some(format!("{t}(…)"));
        }
        if t == "main" && next == Some("(") && i > 0 && tokens[i - 1] == "int" {
            return Some("int main(…)".into());
        }
        if t == "namespace"
            && i > 0
            && tokens[i - 1] == "using"
            && next.is_some_and(|n| HOST_NAMESPACES.contains(&n))
        {
            return Some(format!("using namespace {}", next.unwrap_or_default()));
        }
    }
    None
}

/// Identifiers (with `::` qualification joined in) and single punctuation characters.
fn tokens(bare: &str) -> Vec<String> {
    let chars: Vec<char> = bare.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_alphabetic() || c == '_' || (c == ':' && chars.get(i + 1) == Some(&':')) {
            let mut t = String::new();
            while i < chars.len() {
                let c = chars[i];
                if c.is_ascii_alphanumeric() || c == '_' {
                    t.push(c);
                    i += 1;
                } else if c == ':' && chars.get(i + 1) == Some(&':') {
                    t.push_str("::");
                    i += 2;
                } else {
                    break;
                }
            }
            out.push(t);
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            out.push("0".into());
        } else {
            if !c.is_whitespace() {
                out.push(c.to_string());
            }
            i += 1;
        }
    }
    out
}

/// The `compile_error` message for host code found in a candidate (`None` if there is none).
pub fn host_code(source: &str) -> Option<String> {
    let found = find_host_code(source);
    if found.is_empty() {
        return None;
    }
    let listed: Vec<String> = found
        .iter()
        .take(3)
        .map(|f| format!("line {}: {}", f.line, f.what))
        .collect();
    let more = if found.len() > 3 {
        format!(" (and {} more)", found.len() - 3)
    } else {
        String::new()
    };
    Some(format!(
        "host code is not accepted ({}{more}). kiln compiles device code only: __global__ \
         kernels and the __device__ code they call. It allocates the problem's tensors and \
         launches the kernels itself from the candidate's \"launches\" list (kernel, grid, \
         block, shared_bytes, args naming tensors or scratch buffers). Remove the host \
         wrapper (torch/pybind11 code, <<<…>>> launches, cudaMalloc/cudaMemcpy) and describe \
         each launch there instead.",
        listed.join("; ")
    ))
}

/// `(directive, name, angled)` if `code` is an include-like directive with a literal target.
/// `Some((directive, "", _))` for one whose target is not literal.
fn include_target(code: &str) -> Option<(&'static str, String, bool)> {
    let rest = directive_body(code)?;
    let directive = ["include_next", "include", "import", "embed"]
        .into_iter()
        .find(|d| rest.starts_with(d))?;
    let target = rest[directive.len()..].trim_start();
    Some(match literal_name(target) {
        Some((name, angled)) => (directive, name, angled),
        None => (directive, String::new(), false),
    })
}

/// The text after `#` (or the digraph `%:`) of a directive line, trimmed.
fn directive_body(code: &str) -> Option<&str> {
    let line = code.trim_start();
    let rest = line.strip_prefix('#').or_else(|| line.strip_prefix("%:"))?;
    Some(rest.trim_start())
}

/// `<name>` or `"name"` at the start of `s`: the name and whether it was angled.
fn literal_name(s: &str) -> Option<(String, bool)> {
    let (close, angled) = match s.chars().next()? {
        '<' => ('>', true),
        '"' => ('"', false),
        _ => return None,
    };
    let end = s[1..].find(close)?;
    Some((s[1..1 + end].to_string(), angled))
}

/// Why a header name cannot be included, if it cannot.
pub(crate) fn bad_header_name(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("an empty name");
    }
    if name.starts_with('/') {
        return Some("an absolute path");
    }
    if name.split('/').any(|part| part == "..") {
        return Some("a path that climbs with ..");
    }
    if name.contains('\\') || name.contains(':') {
        return Some("a drive or backslash path");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-' | '+'))
    {
        return Some("characters other than letters, digits, _ . / - +");
    }
    None
}

/// True for identifiers reserved to the implementation: `__x` and `_X`.
fn reserved(name: &str) -> bool {
    let mut c = name.chars();
    match (c.next(), c.next()) {
        (Some('_'), Some('_')) => true,
        (Some('_'), Some(n)) => n.is_ascii_uppercase(),
        _ => false,
    }
}

/// The checks on preprocessor directives (see the module docs); `Err` names the line.
pub fn directives(source: &str) -> Result<(), String> {
    for line in logical_lines(source) {
        let n = line.number;
        if let Some((directive, name, _)) = include_target(&line.code) {
            if directive == "embed" || directive == "import" {
                return Err(format!("line {n}: #{directive} is not supported"));
            }
            if name.is_empty() {
                return Err(format!(
                    "line {n}: #{directive} must name a header literally (<...> or \"...\"), \
                     not through a macro"
                ));
            }
            if let Some(why) = bad_header_name(&name) {
                return Err(format!(
                    "line {n}: #{directive} {name:?} is not allowed ({why}); include headers \
                     by their relative name, e.g. <cuda_fp16.h>"
                ));
            }
            continue;
        }
        check_has_include(&line.code, n)?;
        if let Some(rest) = directive_body(&line.code) {
            for d in ["define", "undef"] {
                if let Some(after) = rest.strip_prefix(d)
                    && after.starts_with(|c: char| c.is_whitespace())
                {
                    let name: String = after
                        .trim_start()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if reserved(&name) && !RESERVED_SWITCHES.contains(&name.as_str()) {
                        return Err(format!(
                            "line {n}: #{d} {name} is not allowed: names starting with __ or \
                             with _ and a capital letter belong to the CUDA toolkit"
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// `__has_include(...)`, `__has_include_next(...)` and `__has_embed(...)` anywhere on a line.
fn check_has_include(code: &str, n: usize) -> Result<(), String> {
    let mut rest = code;
    while let Some(at) = rest.find("__has_") {
        let after = &rest[at + "__has_".len()..];
        let word: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &after[word.len()..];
        match word.as_str() {
            "embed" => return Err(format!("line {n}: __has_embed is not supported")),
            "include" | "include_next" => {
                let arg = rest.trim_start().strip_prefix('(').map(str::trim_start);
                let Some((name, _)) = arg.and_then(literal_name) else {
                    return Err(format!(
                        "line {n}: __has_{word} must name a header literally (<...> or \"...\")"
                    ));
                };
                if let Some(why) = bad_header_name(&name) {
                    return Err(format!(
                        "line {n}: __has_{word}({name:?}) is not allowed ({why})"
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Every literal `#include` target in `source`: (line, name).
pub fn included_headers(source: &str) -> Vec<(usize, String)> {
    logical_lines(source)
        .into_iter()
        .filter_map(|l| {
            let (d, name, _) = include_target(&l.code)?;
            (d.starts_with("include") && !name.is_empty()).then_some((l.number, name))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_code_passes_both_screens() {
        let src = "#include <cuda_fp16.h>\n#include \"cuda/std/cstdint\"\n#include <cooperative_groups/reduce.h>\n\
                   #define BLOCK 256\n#define __CUDA_NO_HALF_OPERATORS__\n#if __has_include(<cuda_bf16.h>)\n#endif\n\
                   // launched as k<<<grid, block>>> by the old host code\n\
                   __global__ void k(float* x) { printf(\"<<<%d>>> torch::Tensor\\n\", 1); \
                   x[threadIdx.x] = at_x(1); }\nnamespace at_home { int cudaMallocLike; }\n";
        assert_eq!(find_host_code(src), Vec::new());
        assert_eq!(directives(src), Ok(()));
        assert_eq!(
            included_headers(src),
            vec![
                (1, "cuda_fp16.h".to_string()),
                (2, "cuda/std/cstdint".to_string()),
                (3, "cooperative_groups/reduce.h".to_string())
            ]
        );
    }

    #[test]
    fn host_wrappers_are_found_by_line() {
        let src = "#include <torch/extension.h>\n__global__ void k(float* x) {}\n\
                   torch::Tensor forward(torch::Tensor x) {\n  auto y = torch::empty_like(x);\n\
                   float* d; cudaMalloc(&d, 4);\n  k<<<1, 256>>>(d);\n  return y;\n}\n\
                   PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"forward\", &forward); }\n\
                   int main() { return 0; }\n";
        let found = find_host_code(src);
        let lines: Vec<usize> = found.iter().map(|f| f.line).collect();
        assert_eq!(lines, vec![1, 3, 4, 5, 6, 9, 10], "{found:?}");
        assert_eq!(found[0].what, "#include <torch/extension.h>");
        assert_eq!(found[1].what, "torch::Tensor");
        assert_eq!(found[3].what, "cudaMalloc(…)");
        assert!(found[4].what.contains("<<<"));
        let msg = host_code(src).expect("refused");
        assert!(
            msg.contains("line 1: #include <torch/extension.h>"),
            "{msg}"
        );
        assert!(msg.contains("and 4 more"), "{msg}");
        assert!(msg.contains("\"launches\" list"), "{msg}");
        assert!(
            msg.len() < 700,
            "{} bytes: short enough for a model",
            msg.len()
        );
        assert!(host_code("__global__ void k() {}").is_none());
        for src in [
            "at::Tensor f();",
            "AT_DISPATCH_FLOATING_TYPES(x.type(), \"k\", ([&] {}));",
            "void f() { cudaMemcpyAsync(a, b, 4, k, s); }",
            "void f() { cudaLaunchCooperativeKernel((void*)k, g, b, args); }",
            "namespace py = pybind11;",
            "using namespace at;",
        ] {
            assert!(host_code(src).is_some(), "{src}");
        }
    }

    #[test]
    fn include_red_team_is_refused() {
        for (src, needle) in [
            ("#include \"/dev/zero\"", "absolute"),
            ("#include </etc/passwd>", "absolute"),
            ("#include \"../x.h\"", "climbs"),
            ("#include <cuda/../../../etc/passwd>", "climbs"),
            ("#define P </etc/passwd>\n#include P", "literally"),
            ("#define P(x) #x\n#include P(/etc/passwd)", "literally"),
            ("#inc\\\nlude \"/etc/hosts\"", "absolute"),
            ("%:include </etc/hosts>", "absolute"),
            ("# /* c */ include_next </x>", "absolute"),
            ("#embed \"/dev/urandom\"", "not supported"),
            ("#import <x.h>", "not supported"),
            ("#include \"C:\\\\x.h\"", "drive"),
            ("#include <a b.h>", "characters"),
            ("#if __has_include(</etc/shadow>)\n#endif", "absolute"),
            (
                "#define H </etc/shadow>\n#if __has_include(H)\n#endif",
                "literally",
            ),
            ("#if __has_include_next(\"../y\")\n#endif", "climbs"),
            ("#if __has_embed(\"/dev/zero\")\n#endif", "not supported"),
            (
                "#define __THRUST_DEVICE_SYSTEM_ROOT /etc",
                "belong to the CUDA toolkit",
            ),
            ("#undef _CCCL_VERSION", "belong to the CUDA toolkit"),
        ] {
            let err = directives(src).expect_err(src);
            assert!(err.contains(needle), "{src:?}: {err}");
            assert!(err.starts_with("line "), "{err}");
        }
        let err = directives("int x;\n\n#include </etc/passwd>\n").expect_err("refused");
        assert!(err.starts_with("line 3:"), "{err}");
        // A header bomb by name only: refused before NVRTC could read it.
        assert!(directives("#include \"/dev/urandom\"").is_err());
    }
}
