//! kiln's own stand-ins for the host C and C++ headers NVRTC does not have (the approach
//! NVIDIA's jitify takes; these are written for kiln), and the prelude pre-included into
//! every candidate. They are handed to NVRTC as in-memory headers, which NVRTC looks up
//! before any include folder, by the name in the `#include` (also when a toolkit header
//! includes them: `cuda.h` includes `<stdlib.h>` and `<stdint.h>`).
//!
//! - C library headers (`<stdint.h>`/`<cstdint>`, `<float.h>`/`<cfloat>`, `<limits.h>`/
//!   `<climits>`, `<math.h>`/`<cmath>`, `<stdio.h>`/`<cstdio>`, `<assert.h>`/`<cassert>`,
//!   `<stddef.h>`, `<stdlib.h>`, `<string.h>` and their `c…` forms): what device code
//!   uses from them — types, limits, constants, `std::` names for NVRTC's built-in math,
//!   `printf` and `assert`.
//! - `<algorithm>` and `<utility>`: `std::min`, `std::max`, `std::swap` (NVRTC itself
//!   declares `std::move` and `std::forward`); `<limits>`: `std::numeric_limits` from libcu++; `<type_traits>`,
//!   `<tuple>`, `<array>`, `<functional>`: libcu++'s, visible as `std::` (these need the
//!   toolkit's headers).
//! - Host-only headers that generated kernels often include without using them in device
//!   code (`<vector>`, `<string>`, `<iostream>`, …, and the CUDA libraries' host APIs
//!   `cublas_v2.h`, `cudnn.h`, …): empty.
//! - When no toolkit headers were found: empty `cuda_runtime.h`, `cuda_runtime_api.h` and
//!   `device_launch_parameters.h` (NVRTC declares everything device code takes from them).
//!   When they were: `<cub/cub.cuh>`, CUB's umbrella without its device-wide (host-launched)
//!   algorithms, since the toolkit's own refuses NVRTC with `#error`.
//! - [`PRELUDE`]: `<stdint.h>`, `<stddef.h>`, `<limits.h>`, `<float.h>` and the math
//!   constants (`INFINITY`, `NAN`, `M_PI`, …) — macros and typedefs only.
//! - [`implied`]: the stand-ins a source needs without including them (it uses
//!   `std::numeric_limits` or `std::is_same` the way code that included `torch/extension.h`
//!   could), pre-included after the prelude only then; likewise the toolkit's
//!   `cuda_fp16.h`/`cuda_bf16.h`/`cuda_fp8.h` for a source that names `__half`,
//!   `__nv_bfloat16`, `__nv_fp8_e4m3`… without including them, and kiln's `kiln/pdl.h`
//!   for `cudaGridDependencySynchronize`/`cudaTriggerProgrammaticLaunchCompletion`, which
//!   nvcc declares for every source.

/// The prelude's header name, passed as `--pre-include`.
pub const PRELUDE: &str = "kiln_prelude.h";

/// kiln's stand-in headers: (name as included, contents).
pub const STANDINS: &[(&str, &str)] = &[
    ("algorithm", include_str!("standins/algorithm")),
    ("array", include_str!("standins/array")),
    ("assert.h", include_str!("standins/assert.h")),
    ("cassert", include_str!("standins/cassert")),
    ("cfloat", include_str!("standins/cfloat")),
    ("climits", include_str!("standins/climits")),
    ("cmath", include_str!("standins/cmath")),
    ("cstddef", include_str!("standins/cstddef")),
    ("cstdint", include_str!("standins/cstdint")),
    ("cstdio", include_str!("standins/cstdio")),
    ("cstdlib", include_str!("standins/cstdlib")),
    ("cstring", include_str!("standins/cstring")),
    ("float.h", include_str!("standins/float.h")),
    ("functional", include_str!("standins/functional")),
    (
        "kiln/math_constants.h",
        include_str!("standins/kiln/math_constants.h"),
    ),
    ("kiln/pdl.h", include_str!("standins/kiln/pdl.h")),
    ("kiln_prelude.h", include_str!("standins/kiln_prelude.h")),
    ("limits", include_str!("standins/limits")),
    ("limits.h", include_str!("standins/limits.h")),
    ("math.h", include_str!("standins/math.h")),
    ("stddef.h", include_str!("standins/stddef.h")),
    ("stdint.h", include_str!("standins/stdint.h")),
    ("stdio.h", include_str!("standins/stdio.h")),
    ("stdlib.h", include_str!("standins/stdlib.h")),
    ("string.h", include_str!("standins/string.h")),
    ("tuple", include_str!("standins/tuple")),
    ("type_traits", include_str!("standins/type_traits")),
    ("utility", include_str!("standins/utility")),
];

/// Host-only headers that are given as empty files: C++ library headers, and the host
/// APIs of the CUDA libraries (device code cannot call cuBLAS or cuDNN).
pub const EMPTY_HOST_HEADERS: &[&str] = &[
    "cublas.h",
    "cublasLt.h",
    "cublas_v2.h",
    "cudnn.h",
    "cufft.h",
    "curand.h",
    "cusparse.h",
    "chrono",
    "iomanip",
    "iostream",
    "map",
    "memory",
    "mutex",
    "numeric",
    "random",
    "set",
    "sstream",
    "stdexcept",
    "string",
    "thread",
    "unordered_map",
    "unordered_set",
    "vector",
];

/// Stand-ins for toolkit headers that refuse NVRTC as a whole although device code uses
/// most of what they include; given only when the toolkit's headers were found (they
/// include its other headers).
pub const TOOLKIT_STANDINS: &[(&str, &str)] =
    &[("cub/cub.cuh", include_str!("standins/cub/cub.cuh"))];

/// Toolkit headers given as empty files when no toolkit was found: NVRTC itself declares
/// what device code uses from them.
pub const EMPTY_WITHOUT_TOOLKIT: &[&str] = &[
    "cuda_runtime.h",
    "cuda_runtime_api.h",
    "device_launch_parameters.h",
];

/// The in-memory headers for one compile: the stand-ins, the empty host headers, and,
/// when `toolkit` is true, [`TOOLKIT_STANDINS`], else the empty toolkit headers.
pub fn headers(toolkit: bool) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = STANDINS
        .iter()
        .map(|(n, c)| (n.to_string(), c.to_string()))
        .collect();
    let empty = |n: &str, why: &str| {
        (
            n.to_string(),
            format!("// kiln: <{n}> {why}\n#pragma once\n"),
        )
    };
    for n in EMPTY_HOST_HEADERS {
        out.push(empty(n, "is host code; empty for device code"));
    }
    if toolkit {
        out.extend(
            TOOLKIT_STANDINS
                .iter()
                .map(|(n, c)| (n.to_string(), c.to_string())),
        );
    } else {
        for n in EMPTY_WITHOUT_TOOLKIT {
            out.push(empty(n, "stands in for the toolkit's (not found here)"));
        }
    }
    out
}

/// The stand-ins that declare `std::` names, in the order a name is looked up, and whether
/// each needs the toolkit's headers (libcu++).
const STD_PROVIDERS: &[(&str, bool)] = &[
    ("algorithm", false),
    ("cmath", false),
    ("limits", true),
    ("type_traits", true),
    ("tuple", true),
    ("array", true),
    ("functional", true),
];

/// The `std::` names a stand-in declares: those it brings in with `using` (`using
/// cuda::std::is_same;`, `using ::sqrt;`) and the function templates it defines.
fn std_names(contents: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for stmt in contents.split(';') {
        let stmt = stmt.trim_start_matches(|c: char| c.is_whitespace() || c == '{' || c == '}');
        let name = if let Some(rest) = stmt.split("using ").nth(1) {
            rest.rsplit("::").next().unwrap_or_default().trim()
        } else if let Some(rest) = stmt.split("constexpr ").nth(1) {
            // `constexpr const T& min(const T& a, ...` (kiln's <algorithm>)
            rest.split('(')
                .next()
                .unwrap_or_default()
                .rsplit(' ')
                .next()
                .unwrap_or_default()
        } else {
            continue;
        };
        if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.push(name);
        }
    }
    out
}

/// Names nvcc users get without an include, the header that declares each, and whether
/// it is the toolkit's: the half-precision, bfloat16 and fp8 types (`torch/extension.h`
/// includes them through c10's `Half.h`/`BFloat16.h`; only these type names count, the
/// short `half` is too often a variable's name), and programmatic dependent launch's device
/// calls (nvcc declares them for every source; kiln's `kiln/pdl.h`).
const IMPLIED_BY_NAME: &[(&str, &str)] = &[
    ("cudaGridDependencySynchronize", "kiln/pdl.h"),
    ("cudaTriggerProgrammaticLaunchCompletion", "kiln/pdl.h"),
    ("__half", "cuda_fp16.h"),
    ("__half2", "cuda_fp16.h"),
    ("__nv_bfloat16", "cuda_bf16.h"),
    ("__nv_bfloat162", "cuda_bf16.h"),
    ("nv_bfloat16", "cuda_bf16.h"),
    ("nv_bfloat162", "cuda_bf16.h"),
    ("__nv_fp8_e4m3", "cuda_fp8.h"),
    ("__nv_fp8_e5m2", "cuda_fp8.h"),
    ("__nv_fp8x2_e4m3", "cuda_fp8.h"),
    ("__nv_fp8x4_e4m3", "cuda_fp8.h"),
    ("__nv_fp8_storage_t", "cuda_fp8.h"),
];

/// The headers a source needs but does not include: nvcc users get `std::numeric_limits`,
/// `std::is_same`, `std::min`, `std::sqrt`, … from the host headers `torch/extension.h`
/// pulls in, so generated kernels use them without an `#include`. For each `std::` name
/// the code (comments and literals aside) uses, the first stand-in of [`STD_PROVIDERS`]
/// that declares it is returned, to be pre-included after the prelude; those built on
/// libcu++ only when `toolkit` is true; also the header of each name of
/// [`IMPLIED_BY_NAME`] the code uses (`__nv_bfloat16` → `cuda_bf16.h`, with the toolkit;
/// `cudaGridDependencySynchronize` → `kiln/pdl.h`, unless the source includes the toolkit's
/// `cuda_device_runtime_api.h` itself). A source
/// that includes the header itself gets it twice, harmlessly (include guards). Sources that
/// use no such name pay nothing.
pub fn implied(source: &str, toolkit: bool) -> Vec<&'static str> {
    let mut used: Vec<String> = Vec::new();
    let mut out = Vec::new();
    // Headers of IMPLIED_BY_NAME a name is used from, and those the source declares a
    // name of itself (`typedef unsigned short __half;`, its own
    // `__device__ void cudaGridDependencySynchronize()`): those are not pre-included.
    let (mut wanted, mut own): (Vec<&str>, Vec<&str>) = (Vec::new(), Vec::new());
    for line in super::lexer::logical_lines(source) {
        let bare = line.bare.as_str();
        if bare.trim_start().starts_with('#') {
            continue;
        }
        let words: Vec<&str> = bare
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .collect();
        for (i, word) in words.iter().enumerate() {
            let Some((_, h)) = IMPLIED_BY_NAME.iter().find(|(w, _)| w == word) else {
                continue;
            };
            let declares = (i > 0
                && ["struct", "class", "union", "using", "void", "enum"].contains(&words[i - 1]))
                || (words.first() == Some(&"typedef") && words.last() == Some(word));
            if declares && !own.contains(h) {
                own.push(h);
            }
            if (toolkit || h.starts_with("kiln/")) && !wanted.contains(h) {
                wanted.push(h);
            }
        }
        let mut rest = bare;
        while let Some(at) = rest.find("std::") {
            let before = rest[..at].chars().next_back();
            let after = &rest[at + 5..];
            let name: String = after
                .trim_start()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let qualified =
                before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
            if !qualified && !name.is_empty() && !used.contains(&name) {
                used.push(name);
            }
            rest = after;
        }
    }
    let pdl_included = source.contains("cuda_device_runtime_api.h");
    let skipped = |h: &&str| own.contains(h) || (*h == "kiln/pdl.h" && pdl_included);
    out.extend(wanted.into_iter().filter(|h| !skipped(h)));
    for name in &used {
        let provider = STD_PROVIDERS.iter().find(|(h, _)| {
            STANDINS
                .iter()
                .find(|(n, _)| n == h)
                .is_some_and(|(_, c)| std_names(c).contains(&name.as_str()))
        });
        if let Some((h, needs_toolkit)) = provider
            && (toolkit || !needs_toolkit)
            && !out.contains(h)
        {
            out.push(*h);
        }
    }
    out
}

/// True if `name` is served by kiln itself (a stand-in or an empty host header).
pub fn is_standin(name: &str) -> bool {
    STANDINS.iter().any(|(n, _)| *n == name) || EMPTY_HOST_HEADERS.contains(&name)
}

/// True if [`implied`] can name `name`: a header kiln pre-includes for a source that uses
/// its names without including it.
pub fn may_imply(name: &str) -> bool {
    IMPLIED_BY_NAME.iter().any(|(_, h)| *h == name) || STD_PROVIDERS.iter().any(|(h, _)| *h == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prelude_and_every_header_of_item_2_are_served() {
        let all = headers(false);
        for name in [
            PRELUDE,
            "stdint.h",
            "cstdint",
            "float.h",
            "cfloat",
            "math.h",
            "cmath",
            "climits",
            "cstdio",
            "cassert",
            "stdlib.h",
            "cuda_runtime.h",
            "vector",
        ] {
            assert!(all.iter().any(|(n, _)| n == name), "{name} missing");
        }
        assert!(!headers(true).iter().any(|(n, _)| n == "cuda_runtime.h"));
        assert!(headers(true).iter().any(|(n, _)| n == "cub/cub.cuh"));
        assert!(!all.iter().any(|(n, _)| n == "cub/cub.cuh"));
        // Names are unique, so NVRTC never sees two headers of one name.
        let mut names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len());
        assert!(is_standin("cmath") && is_standin("vector") && !is_standin("cuda_fp16.h"));
    }

    #[test]
    fn std_names_used_without_their_include_are_implied() {
        let src = "// std::tuple in a comment does not count\n\
                   #include <cuda_fp16.h>\n\
                   __device__ float f(float x) { return std::max(std::sqrt(x), \
                   std::numeric_limits<float>::lowest()); }\n\
                   template <class T> __device__ bool g() { return std::is_same_v<T, float>; }\n\
                   __device__ const char* s = \"std::array\"; __device__ int my::std::x;";
        assert_eq!(
            implied(src, true),
            vec!["algorithm", "cmath", "limits", "type_traits"]
        );
        // Without the toolkit, only the stand-ins that need no libcu++.
        assert_eq!(implied(src, false), vec!["algorithm", "cmath"]);
        let typed = "__global__ void k(__nv_bfloat16* y, const __half* x) { int half = 2; }";
        assert_eq!(implied(typed, true), vec!["cuda_bf16.h", "cuda_fp16.h"]);
        assert!(implied(typed, false).is_empty());
        assert!(implied("__global__ void k(float* y) { int half = 2; }", true).is_empty());
        let pdl = "__global__ void k() { cudaGridDependencySynchronize(); }";
        assert_eq!(implied(pdl, false), vec!["kiln/pdl.h"]);
        let own = "#include <cuda_device_runtime_api.h>\n__global__ void k() { cudaGridDependencySynchronize(); }";
        assert!(implied(own, true).is_empty());
        // A source that declares such a name itself keeps its own.
        let mine = "typedef unsigned short __half;\n__global__ void k(__half* y) {}";
        assert!(implied(mine, true).is_empty());
        let mine = "__device__ void cudaGridDependencySynchronize() {}\n\
                    __global__ void k() { cudaGridDependencySynchronize(); }";
        assert!(implied(mine, true).is_empty());
        assert!(implied("__global__ void k(float* y) { y[0] = sqrtf(2.f); }", true).is_empty());
        assert!(implied("__device__ void h() { std::vector<int> v; }", true).is_empty());
    }
}
