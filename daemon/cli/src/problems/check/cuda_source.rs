//! The source rules of a problem's own CUDA kernels: kiln-gpu's screens (preprocessor
//! directives, host code such as `<<<…>>>` launches or `cudaMalloc`), `#include`s only of
//! kiln's stand-in headers that need nothing from the CUDA toolkit (a problem must compile
//! on a machine without it), no `printf` and no `__host__` code.

use kiln_gpu::cxx::{lexer, screen, standins};

use super::Issue;

/// The headers a problem's CUDA source may include: kiln's stand-ins, except those built
/// on the toolkit's libcu++ (they include `<cuda/...>`).
pub fn allowed_headers() -> Vec<&'static str> {
    standins::STANDINS
        .iter()
        .filter(|(_, contents)| !contents.contains("#include <cuda/"))
        .map(|(name, _)| *name)
        .collect()
}

/// True if `word` occurs in `text` as a whole identifier, followed (after blanks) by
/// `then` when given.
fn has_word(text: &str, word: &str, then: Option<char>) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = &text[at + word.len()..];
        !before.is_some_and(ident)
            && !after.chars().next().is_some_and(ident)
            && then.is_none_or(|c| after.trim_start().starts_with(c))
    })
}

/// Everything wrong with `source` by these rules, in line order per rule.
pub fn check(source: &str) -> Vec<Issue> {
    let mut out = Vec::new();
    if let Err(e) = screen::directives(source) {
        out.push(Issue::from_prefixed(&e));
    }
    for f in screen::find_host_code(source) {
        out.push(Issue::at(
            f.line,
            format!(
                "host code ({}): a problem's kernels are device code only; kiln launches them \
                 from the launch plan",
                f.what
            ),
        ));
    }
    let allowed = allowed_headers();
    for (line, name) in screen::included_headers(source) {
        if !allowed.contains(&name.as_str()) {
            out.push(Issue::at(
                line,
                format!(
                    "#include <{name}>: not one of kiln's stand-in headers ({}); a problem's \
                     kernels must compile where the CUDA toolkit's headers are missing",
                    allowed.join(", ")
                ),
            ));
        }
    }
    for line in lexer::logical_lines(source) {
        if has_word(&line.bare, "printf", Some('(')) {
            out.push(Issue::at(line.number, "calls printf".into()));
        }
        if has_word(&line.bare, "__host__", None) {
            out.push(Issue::at(
                line.number,
                "contains host code (__host__)".into(),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stand_ins_without_the_toolkit_are_allowed() {
        let allowed = allowed_headers();
        for h in [
            "cstdint",
            "cfloat",
            "climits",
            "cmath",
            "math.h",
            "algorithm",
            "utility",
        ] {
            assert!(allowed.contains(&h), "{h}");
        }
        for h in ["limits", "type_traits", "cuda_fp16.h", "cub/cub.cuh"] {
            assert!(!allowed.contains(&h), "{h}");
        }
        let src = "// printf(\"x\") and __host__ in a comment\n#include <cstdint>\n#include \"cmath\"\n\
                   __global__ void k(float* y) { const char* s = \"printf(__host__)\"; int my_printf = 0; }\n";
        assert_eq!(check(src), Vec::new());
    }

    #[test]
    fn each_rule_names_its_line() {
        let src = "#include <cuda_fp16.h>\n#include <limits>\n__global__ void k(float* y) {\n  printf(\"%f\", y[0]);\n}\n\
                   __host__ __device__ float f(float x) { return x; }\nvoid g() { k<<<1, 1>>>(0); }\n#include </etc/passwd>\n";
        let got = check(src);
        let found = |line: usize, needle: &str| {
            got.iter()
                .any(|i| i.line == Some(line) && i.message.contains(needle))
        };
        assert!(found(8, "absolute path"), "{got:?}");
        assert!(found(7, "host code (<<<"), "{got:?}");
        assert!(
            found(
                1,
                "#include <cuda_fp16.h>: not one of kiln's stand-in headers"
            ),
            "{got:?}"
        );
        assert!(found(2, "#include <limits>"), "{got:?}");
        assert!(found(4, "calls printf"), "{got:?}");
        assert!(found(6, "__host__"), "{got:?}");
    }
}
