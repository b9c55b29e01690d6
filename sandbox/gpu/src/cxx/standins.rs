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
//! - [`PRELUDE`]: `<stdint.h>`, `<stddef.h>`, `<limits.h>`, `<float.h>` and the math
//!   constants (`INFINITY`, `NAN`, `M_PI`, …) — macros and typedefs only.

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

/// Toolkit headers given as empty files when no toolkit was found: NVRTC itself declares
/// what device code uses from them.
pub const EMPTY_WITHOUT_TOOLKIT: &[&str] = &[
    "cuda_runtime.h",
    "cuda_runtime_api.h",
    "device_launch_parameters.h",
];

/// The in-memory headers for one compile: the stand-ins, the empty host headers, and,
/// when `toolkit` is false, the empty toolkit headers.
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
    if !toolkit {
        for n in EMPTY_WITHOUT_TOOLKIT {
            out.push(empty(n, "stands in for the toolkit's (not found here)"));
        }
    }
    out
}

/// True if `name` is served by kiln itself (a stand-in or an empty host header).
pub fn is_standin(name: &str) -> bool {
    STANDINS.iter().any(|(n, _)| *n == name) || EMPTY_HOST_HEADERS.contains(&name)
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
        // Names are unique, so NVRTC never sees two headers of one name.
        let mut names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len());
        assert!(is_standin("cmath") && is_standin("vector") && !is_standin("cuda_fp16.h"));
    }
}
