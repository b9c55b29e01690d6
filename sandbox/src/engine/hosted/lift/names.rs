//! Kernel names from recorded symbols: a mangled symbol demangled (cpp_demangle) into the
//! C++ name expression kiln launches by (`void ns::k<256, float>(float const*, float*,
//! int)` → `ns::k<256, float>`) and its parameter types (`float const*`, `float*`, `int`),
//! which type the literal arguments.
//!
//! The name and the parameter list are not cut out of one demangled string (a template
//! argument may hold parentheses and spaces): the demangler is asked twice, once without
//! return type and parameters (the name itself) and once without the return type only,
//! and the parameter list is what the second adds after the first. The symbol is
//! untrusted, so its length and the demangled text's are bounded, and a panic inside the
//! demangler is caught and treated as a symbol that does not demangle.

use cpp_demangle::{DemangleOptions, Symbol};
use kiln_types::candidate::is_kernel_name;

/// Longest symbol demangled.
pub const MAX_SYMBOL_BYTES: usize = 4096;
/// Longest demangled text accepted (a crafted symbol can expand a lot).
const MAX_DEMANGLED_BYTES: usize = 16 << 10;

/// A launched kernel's name and what its symbol says of its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelName {
    /// The C++ name expression (`ns::k<256, float>`), or an `extern "C"` name as it is.
    pub expr: String,
    /// The parameter types from the demangled signature, in order; `None` for an
    /// `extern "C"` kernel (its symbol carries no signature).
    pub params: Option<Vec<String>>,
}

/// A `fmt::Write` that refuses to grow past [`MAX_DEMANGLED_BYTES`].
struct Capped(String);

impl std::fmt::Write for Capped {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if self.0.len() + s.len() > MAX_DEMANGLED_BYTES {
            return Err(std::fmt::Error);
        }
        self.0.push_str(s);
        Ok(())
    }
}

/// `symbol` demangled with `options`; `None` when it does not parse, grows too long or
/// the demangler panics.
fn demangle(symbol: &str, options: DemangleOptions) -> Option<String> {
    std::panic::catch_unwind(|| {
        let sym = Symbol::new(symbol.as_bytes()).ok()?;
        let mut out = Capped(String::new());
        sym.structured_demangle(&mut out, &options).ok()?;
        Some(out.0)
    })
    .ok()
    .flatten()
}

/// The kernel name and parameter types of a recorded symbol, or `None` when it is not a
/// name kiln can launch by: it does not demangle, it is in an anonymous namespace, a
/// lambda or an unnamed type is part of it, or the name fails
/// [`kiln_types::candidate::is_kernel_name`].
pub fn kernel_name(symbol: &str) -> Option<KernelName> {
    if symbol.is_empty() || symbol.len() > MAX_SYMBOL_BYTES {
        return None;
    }
    if !symbol.starts_with("_Z") {
        // An `extern "C"` kernel: its symbol is its name.
        return is_kernel_name(symbol).then(|| KernelName {
            expr: symbol.to_string(),
            params: None,
        });
    }
    let name = demangle(symbol, DemangleOptions::new().no_return_type().no_params())?;
    let full = demangle(symbol, DemangleOptions::new().no_return_type())?;
    let list = full
        .strip_prefix(name.as_str())?
        .strip_prefix('(')?
        .strip_suffix(')')?;
    let expr = name.trim();
    let unnamed = [
        "(anonymous namespace)",
        "{lambda",
        "{unnamed",
        "'lambda",
        "'unnamed",
    ];
    if unnamed.iter().any(|u| expr.contains(u)) || !is_kernel_name(expr) {
        return None;
    }
    Some(KernelName {
        expr: expr.to_string(),
        params: Some(split_params(list)),
    })
}

/// A demangled parameter list (without its parentheses) split at its top-level commas:
/// commas inside `<>`, `()` or `[]` belong to a type. `()` and `(void)` hold none.
pub fn split_params(list: &str) -> Vec<String> {
    let list = list.trim();
    if list.is_empty() || list == "void" {
        return Vec::new();
    }
    let mut out = Vec::new();
    let (mut angle, mut paren) = (0i32, 0i32);
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '(' | '[' => paren += 1,
            ')' | ']' => paren -= 1,
            // Inside parentheses `<` and `>` may be operators of an expression.
            '<' if paren == 0 => angle += 1,
            '>' if paren == 0 => angle -= 1,
            ',' if paren == 0 && angle == 0 => {
                out.push(list[start..i].trim().to_string());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(list[start..].trim().to_string());
    out
}

/// The base name of a kernel name expression: the qualified name before any `<`,
/// whitespace and a leading `::` removed (`ns::k<256, float>` → `ns::k`). Launched
/// kernels are matched to a device source's kernels by it.
pub fn base_name(expr: &str) -> String {
    let head = expr.split('<').next().unwrap_or_default();
    let name: String = head.chars().filter(|c| !c.is_whitespace()).collect();
    match name.strip_prefix("::") {
        Some(rest) => rest.to_string(),
        None => name,
    }
}

/// What a parameter type says a 4- or 8-byte literal is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalarKind {
    /// `float`.
    F32,
    /// `double`.
    F64,
    /// An unsigned integer type.
    Unsigned,
    /// A pointer (passed as a literal: null, or an address kiln cannot map).
    Pointer,
    /// Anything else (signed integers, enums, unknown).
    Signed,
}

/// The kind of a demangled parameter type.
pub fn scalar_kind(ty: &str) -> ScalarKind {
    let ty = ty.trim();
    if ty.contains('*') || ty.contains('&') {
        ScalarKind::Pointer
    } else if ty == "float" {
        ScalarKind::F32
    } else if ty == "double" {
        ScalarKind::F64
    } else if ty.split_whitespace().any(|w| w == "unsigned") {
        ScalarKind::Unsigned
    } else {
        ScalarKind::Signed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(symbol: &str) -> Option<(String, Option<Vec<String>>)> {
        kernel_name(symbol).map(|k| (k.expr, k.params))
    }

    fn types(list: &[&str]) -> Option<Vec<String>> {
        Some(list.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn lift_names_demangle_to_name_expressions_and_parameter_types() {
        assert_eq!(
            name("_Z11gelu_kernelPKfPfi"),
            Some((
                "gelu_kernel".into(),
                types(&["float const*", "float*", "int"])
            ))
        );
        assert_eq!(
            name("_Z11gelu_kernelIfEvPKT_PS0_i"),
            Some((
                "gelu_kernel<float>".into(),
                types(&["float const*", "float*", "int"])
            ))
        );
        assert_eq!(
            name("_ZN5fused8row_statEPKfPfS2_ii"),
            Some((
                "fused::row_stat".into(),
                types(&["float const*", "float*", "float*", "int", "int"])
            ))
        );
        assert_eq!(
            name("_Z14softmax_kernelILi256EfEvPT0_"),
            Some(("softmax_kernel<256, float>".into(), types(&["float*"])))
        );
        // Template arguments with parentheses, spaces and a nested template.
        assert_eq!(
            name("_Z1kILin1ELb1ELj4EEvPf"),
            Some(("k<-1, true, (unsigned int)4>".into(), types(&["float*"])))
        );
        assert_eq!(
            name("_Z1kIN2ns2OpIfEEEvPf"),
            Some(("k<ns::Op<float> >".into(), types(&["float*"])))
        );
        assert_eq!(name("_Z1kv"), Some(("k".into(), types(&[]))));
        // extern "C": the symbol is the name, no signature.
        assert_eq!(name("gelu_c"), Some(("gelu_c".into(), None)));
    }

    #[test]
    fn lift_names_refuse_what_kiln_cannot_launch_by_name() {
        for bad in [
            "_ZN12_GLOBAL__N_14geluEPf",  // (anonymous namespace)::gelu
            "_ZN2ns1kIXtl3FooLi1EEEEEvv", // ns::k<Foo{1}>
            "_Z",                         // truncated
            "_Z3fooPf junk",              // trailing text
            "_ZZ4mainENKUlvE_clEv",       // a lambda's operator()
            "not a name",                 // extern "C" names are identifiers
            "",
        ] {
            assert_eq!(kernel_name(bad), None, "{bad}");
        }
        let long = format!("_Z{}", "N".repeat(MAX_SYMBOL_BYTES));
        assert_eq!(kernel_name(&long), None);
        // A symbol whose substitutions expand a lot is cut off, not demangled in full.
        let mut deep = String::from("_Z1fI");
        for _ in 0..60 {
            deep.push_str("N1AIS_S_S_EE");
        }
        deep.push_str("EvS0_");
        assert_eq!(kernel_name(&deep), None);
    }

    #[test]
    fn lift_names_split_parameters_at_top_level_commas_and_keep_base_names() {
        assert_eq!(
            split_params("ns::Pair<int, float>, float (*)(int, int), int [4], k<(1 > 2)>"),
            vec![
                "ns::Pair<int, float>",
                "float (*)(int, int)",
                "int [4]",
                "k<(1 > 2)>"
            ]
        );
        assert!(split_params(" void ").is_empty());
        assert_eq!(base_name("ns::k<256, float>"), "ns::k");
        assert_eq!(base_name(" :: ns :: k "), "ns::k");
        assert_eq!(base_name("gelu"), "gelu");
        assert_eq!(scalar_kind("float"), ScalarKind::F32);
        assert_eq!(scalar_kind("double"), ScalarKind::F64);
        assert_eq!(scalar_kind("unsigned long"), ScalarKind::Unsigned);
        assert_eq!(scalar_kind("float const*"), ScalarKind::Pointer);
        assert_eq!(scalar_kind("long"), ScalarKind::Signed);
    }
}
