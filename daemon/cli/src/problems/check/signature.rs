//! C and CUDA kernels against their launches: the function a launch names is defined in
//! the source (for CUDA as a `__global__` kernel, found by its unqualified name), takes as
//! many parameters as the launch passes, a pointer where the launch passes a buffer and a
//! matching scalar type where it passes a scalar (any type for a template's own type
//! parameters). Comments and literals are set aside with kiln-gpu's C++ lexer.

use std::collections::HashMap;

use kiln_types::candidate::Scalar;
use kiln_types::{Arg, Launch};

use super::Issue;

/// A function definition found in the source.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Definition {
    /// Its parameter declarations, as written.
    params: Vec<String>,
    /// The names of its template's parameters, if it is a template.
    template_params: Vec<String>,
    /// Whether it is declared `__global__`.
    global: bool,
    /// The line it starts on.
    line: usize,
}

/// The source without comments and with literals blanked, and the line of each byte's
/// logical line.
struct Code {
    text: String,
    /// (byte offset in `text`, line) for the start of each logical line.
    starts: Vec<(usize, usize)>,
    /// The offset of the `)` closing each `(`, by the `(`'s offset.
    closing: HashMap<usize, usize>,
}

impl Code {
    fn new(source: &str) -> Code {
        let mut text = String::with_capacity(source.len());
        let mut starts = Vec::new();
        for line in kiln_gpu::cxx::lexer::logical_lines(source) {
            starts.push((text.len(), line.number));
            // Preprocessor lines take no part in declarations (a `#define` of `__global__`
            // must not make the next function a kernel).
            if !line.bare.trim_start().starts_with('#') {
                text.push_str(&line.bare);
            }
            text.push('\n');
        }
        let (mut closing, mut open) = (HashMap::new(), Vec::new());
        for (i, b) in text.bytes().enumerate() {
            match b {
                b'(' => open.push(i),
                b')' => {
                    if let Some(o) = open.pop() {
                        closing.insert(o, i);
                    }
                }
                _ => {}
            }
        }
        Code {
            text,
            starts,
            closing,
        }
    }

    fn line_of(&self, offset: usize) -> usize {
        let i = self.starts.partition_point(|(o, _)| *o <= offset);
        self.starts.get(i.saturating_sub(1)).map_or(1, |(_, l)| *l)
    }
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Splits at top-level commas (outside `()`, `<>`, `[]`), trimmed; `void` alone is none.
fn split_params(text: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let (mut depth, mut cur) = (0i32, String::new());
    for c in text.chars() {
        match c {
            '(' | '<' | '[' => depth += 1,
            ')' | '>' | ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    let last = cur.trim();
    if !last.is_empty() && last != "void" {
        parts.push(last.to_string());
    }
    parts
}

/// The names a `template <...>` in `head` declares (`template <int B, typename T>`: B, T).
fn template_params(head: &str) -> Vec<String> {
    let Some(at) = head.find("template") else {
        return Vec::new();
    };
    let rest = &head[at + "template".len()..];
    let Some(open) = rest.find('<') else {
        return Vec::new();
    };
    let mut depth = 0i32;
    let mut end = rest.len();
    for (i, c) in rest[open..].char_indices() {
        match c {
            '<' => depth += 1,
            '>' => {
                depth -= 1;
                if depth == 0 {
                    end = open + i;
                    break;
                }
            }
            _ => {}
        }
    }
    split_params(&rest[open + 1..end])
        .iter()
        .filter_map(|p| {
            let decl = p.split('=').next().unwrap_or_default();
            decl.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .rfind(|w| !w.is_empty())
                .map(str::to_string)
        })
        .collect()
}

/// The definitions (with a body) of functions called `name`, in source order.
fn definitions(code: &Code, name: &str) -> Vec<Definition> {
    let text = code.text.as_str();
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find(name) {
        let at = from + found;
        from = at + name.len();
        let before_ok = at == 0 || !is_word_byte(bytes[at - 1]);
        let after = text[from..].trim_start();
        if !before_ok || !after.starts_with('(') {
            continue;
        }
        let open = text.len() - after.len();
        let Some(&close) = code.closing.get(&open) else {
            break;
        };
        if !text[close + 1..].trim_start().starts_with('{') {
            continue;
        }
        let head_start = text[..at].rfind([';', '{', '}']).map_or(0, |i| i + 1);
        let head = &text[head_start..at];
        let global = head
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .any(|w| w == "__global__");
        out.push(Definition {
            params: split_params(&text[open + 1..close]),
            template_params: template_params(head),
            global,
            line: code.line_of(at),
        });
    }
    out
}

/// `ns::k<256, float>` → `k`: the name the function is defined under.
fn base_name(kernel: &str) -> &str {
    let head = kernel.split('<').next().unwrap_or(kernel).trim();
    head.rsplit("::").next().unwrap_or(head)
}

/// What one parameter declaration is: a pointer, or a scalar of a (normalised) type.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ParamKind {
    Pointer,
    Scalar(String),
}

fn param_kind(param: &str) -> ParamKind {
    const QUALIFIERS: &[&str] = &[
        "__restrict__",
        "__restrict",
        "restrict",
        "const",
        "volatile",
        "__grid_constant__",
    ];
    if param.contains('*') || param.contains('[') {
        return ParamKind::Pointer;
    }
    let mut words: Vec<&str> = param
        .split_whitespace()
        .filter(|w| !QUALIFIERS.contains(w))
        .collect();
    if words.len() >= 2 && kiln_types::candidate::is_identifier(words[words.len() - 1]) {
        words.pop();
    }
    ParamKind::Scalar(words.join(" "))
}

/// The C types a scalar literal of each kind may be passed to.
fn c_types(s: &Scalar) -> (&'static str, &'static [&'static str]) {
    match s {
        Scalar::I32(_) => ("i32", &["int", "signed", "signed int", "int32_t"]),
        Scalar::U32(_) => ("u32", &["unsigned", "unsigned int", "uint32_t"]),
        Scalar::I64(_) => (
            "i64",
            &[
                "long long",
                "long long int",
                "signed long long",
                "int64_t",
                "long",
                "long int",
            ],
        ),
        Scalar::U64(_) => (
            "u64",
            &[
                "unsigned long long",
                "unsigned long long int",
                "uint64_t",
                "size_t",
                "unsigned long",
            ],
        ),
        Scalar::F32(_) => ("f32", &["float"]),
        Scalar::F64(_) => ("f64", &["double"]),
    }
}

/// Checks each launch against the function it names in `source` (see the module docs):
/// (launch index, what is wrong, at the definition's line where there is one).
pub fn check(source: &str, launches: &[Launch], cuda: bool) -> Vec<(usize, Issue)> {
    let code = Code::new(source);
    let mut out = Vec::new();
    for (i, l) in launches.iter().enumerate() {
        let name = base_name(&l.kernel);
        let defs = definitions(&code, name);
        let def = if cuda {
            defs.iter().find(|d| d.global)
        } else {
            defs.first()
        };
        let Some(def) = def else {
            let why = if defs.is_empty() {
                format!("{} is not defined in the source", l.kernel)
            } else {
                format!("{} is defined, but not as a __global__ kernel", l.kernel)
            };
            out.push((i, Issue::new(why)));
            continue;
        };
        let mut bad = |m: String| out.push((i, Issue::at(def.line, m)));
        if def.params.len() != l.args.len() {
            bad(format!(
                "{} takes {} parameters, the launch passes {}",
                l.kernel,
                def.params.len(),
                l.args.len()
            ));
            continue;
        }
        for (j, (param, arg)) in def.params.iter().zip(&l.args).enumerate() {
            match (arg, param_kind(param)) {
                (Arg::Buffer(b), ParamKind::Scalar(_)) => bad(format!(
                    "args[{j}] is buffer {b:?} but parameter `{param}` is not a pointer"
                )),
                (Arg::Scalar(s), ParamKind::Pointer) => bad(format!(
                    "args[{j}] is an {} scalar but parameter `{param}` is a pointer",
                    c_types(s).0
                )),
                (Arg::Scalar(s), ParamKind::Scalar(ty)) => {
                    let (kind, types) = c_types(s);
                    if !types.contains(&ty.as_str()) && !def.template_params.contains(&ty) {
                        bad(format!(
                            "args[{j}] is {kind} but parameter `{param}` has type `{ty}`"
                        ));
                    }
                }
                (Arg::Buffer(_), ParamKind::Pointer) => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(kernel: &str, args: &str) -> Launch {
        serde_json::from_str(&format!(r#"{{"kernel":"{kernel}","args":{args}}}"#)).expect("launch")
    }

    const CUDA: &str = r#"
#include <cstdint>
#define KERNEL __global__
// k(float* y) in a comment is not a definition
__device__ float helper(float x) { return x; }
extern "C" __global__ void __launch_bounds__(256)
scale(const float* __restrict__ x, float* y,
      int n, float s) {
    const char* t = "scale(int) {";
    if (n) { y[0] = helper(x[0]) * s; }
}
template <int BLOCK, typename T>
__global__ void rows(const T* x, T* y, T eps, unsigned n) {}
namespace ns { __global__ void inner(double* p, int64_t n) {} }
"#;

    #[test]
    fn matching_launches_pass() {
        let ok = [
            launch("scale", r#"["x", "y", {"i32": 4}, {"f32": 0.5}]"#),
            launch(
                "rows<256, float>",
                r#"["x", "y", {"f32": 1e-5}, {"u32": 8}]"#,
            ),
            launch("ns::inner", r#"["p", {"i64": 8}]"#),
        ];
        assert_eq!(check(CUDA, &ok, true), Vec::new());
    }

    #[test]
    fn mismatches_are_named_with_the_definition_line() {
        let cases = [
            (
                launch("scale", r#"["x", "y", {"i32": 4}]"#),
                "takes 4 parameters, the launch passes 3",
            ),
            (
                launch("scale", r#"["x", "y", "n", {"f32": 0.5}]"#),
                "args[2] is buffer \"n\" but parameter `int n` is not a pointer",
            ),
            (
                launch("scale", r#"[{"i32": 1}, "y", {"i32": 4}, {"f32": 0.5}]"#),
                "args[0] is an i32 scalar but parameter `const float* __restrict__ x` is a pointer",
            ),
            (
                launch("scale", r#"["x", "y", {"i64": 4}, {"f32": 0.5}]"#),
                "args[2] is i64 but parameter `int n` has type `int`",
            ),
            (
                launch(
                    "rows<256, float>",
                    r#"["x", "y", {"f32": 1e-5}, {"i32": 8}]"#,
                ),
                "args[3] is i32 but parameter `unsigned n` has type `unsigned`",
            ),
        ];
        for (l, needle) in cases {
            let got = check(CUDA, std::slice::from_ref(&l), true);
            assert_eq!(got.len(), 1, "{needle}: {got:?}");
            assert!(got[0].1.message.contains(needle), "{needle}: {got:?}");
            let want_line = if l.kernel == "scale" { 7 } else { 13 };
            assert_eq!(got[0].1.line, Some(want_line), "{got:?}");
        }
        let got = check(CUDA, &[launch("helper", r#"[{"f32": 1}]"#)], true);
        assert!(
            got[0].1.message.contains("not as a __global__ kernel"),
            "{got:?}"
        );
        let got = check(CUDA, &[launch("k", r#"["y"]"#)], true);
        assert!(got[0].1.message.contains("k is not defined"), "{got:?}");
        // C: any function with a body; `void` is no parameter.
        let c =
            "#include <math.h>\nstatic double sq(double x) { return x * x; }\nvoid f(void) {}\n";
        assert_eq!(
            check(
                c,
                &[launch("sq", r#"[{"f64": 2}]"#), launch("f", "[]")],
                false
            ),
            Vec::new()
        );
    }

    #[test]
    fn parameters_are_classified() {
        assert_eq!(
            param_kind("const float* __restrict__ x"),
            ParamKind::Pointer
        );
        assert_eq!(param_kind("float x[]"), ParamKind::Pointer);
        assert_eq!(
            param_kind("const unsigned long long n"),
            ParamKind::Scalar("unsigned long long".into())
        );
        assert_eq!(param_kind("int"), ParamKind::Scalar("int".into()));
        assert_eq!(split_params(" void "), Vec::<String>::new());
        assert_eq!(
            split_params("A<int, 2> a, float (*f)(int, int)"),
            ["A<int, 2> a", "float (*f)(int, int)"]
        );
        assert_eq!(
            template_params("template <int B = 4, typename T> __global__ void"),
            ["B", "T"]
        );
        assert_eq!(base_name("ns::k<256, float>"), "k");
    }
}
