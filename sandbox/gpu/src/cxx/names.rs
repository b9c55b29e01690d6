//! Kernel names: which kernels a CUBIN holds (its ELF symbol table: functions marked as
//! CUDA entry points), their C++ names (demangled), and which of a launch list's name
//! expressions NVRTC could not resolve (read from its log).

use object::read::elf::{ElfFile64, Sym};
use object::{Endianness, Object, ObjectSymbol};

/// `st_other` bit NVIDIA's toolchain sets on a kernel's (entry function's) symbol.
const STO_CUDA_ENTRY: u8 = 0x10;

/// One kernel of a CUBIN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSymbol {
    /// The symbol (a lowered name, or an `extern "C"` kernel's own).
    pub symbol: String,
    /// The C++ name, demangled without the return type (`softmax<256, float>(float*)`);
    /// the symbol itself when it is not mangled.
    pub readable: String,
}

/// The kernels in `cubin`, in symbol-table order; empty for anything that is not an ELF
/// CUBIN (PTX, a malformed image).
pub fn kernels_in(cubin: &[u8]) -> Vec<KernelSymbol> {
    let Ok(file) = ElfFile64::<Endianness>::parse(cubin) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for sym in file.symbols() {
        let elf = sym.elf_symbol();
        let is_func = elf.st_type() == object::elf::STT_FUNC;
        if !is_func || elf.st_other() & STO_CUDA_ENTRY == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        if name.is_empty() || out.iter().any(|k: &KernelSymbol| k.symbol == name) {
            continue;
        }
        out.push(KernelSymbol {
            symbol: name.to_string(),
            readable: demangle(name),
        });
    }
    out
}

/// `symbol` demangled (without the return type), or itself when it is not a C++ name.
pub fn demangle(symbol: &str) -> String {
    let Ok(sym) = cpp_demangle::Symbol::new(symbol) else {
        return symbol.to_string();
    };
    let options = cpp_demangle::DemangleOptions::new().no_return_type();
    sym.demangle_with_options(&options)
        .unwrap_or_else(|_| symbol.to_string())
}

/// The name expressions NVRTC reported it could not parse or resolve, from its log
/// (`Input name expression was: " <expr>"`), trimmed.
pub fn unresolved_in_log(log: &str) -> Vec<String> {
    const MARK: &str = "Input name expression was:";
    let mut out: Vec<String> = Vec::new();
    for line in log.lines() {
        let Some(at) = line.find(MARK) else { continue };
        let rest = line[at + MARK.len()..].trim();
        let expr = rest
            .strip_prefix('"')
            .and_then(|r| r.strip_suffix('"'))
            .unwrap_or(rest)
            .trim()
            .to_string();
        if !expr.is_empty() && !out.contains(&expr) {
            out.push(expr);
        }
    }
    out
}

/// "a, b, c" of the kernels' readable names, or "none".
pub fn listing(kernels: &[KernelSymbol]) -> String {
    if kernels.is_empty() {
        return "none".into();
    }
    let names: Vec<&str> = kernels.iter().map(|k| k.readable.as_str()).collect();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_kernels_without_return_type() {
        assert_eq!(
            demangle("_Z14softmax_kernelILi256EfEvPT0_"),
            "softmax_kernel<256, float>(float*)"
        );
        assert_eq!(demangle("_ZN2ns2k2EPf"), "ns::k2(float*)");
        assert_eq!(demangle("ec"), "ec");
    }

    #[test]
    fn unresolved_names_are_read_from_the_log() {
        let log = "__nv_name_map(3): error: identifier \"nonexist\" is undefined\n\
                   __nv_name_map(3): error: Error in parsing name expression for lowered name \
                   lookup. Input name expression was: \" nonexist\"\n\
                   __nv_name_map(4): error: ... Input name expression was: \" k<7>\"\n";
        assert_eq!(unresolved_in_log(log), vec!["nonexist", "k<7>"]);
        assert!(unresolved_in_log("kiln_candidate.cu(1): error: x").is_empty());
    }

    #[test]
    fn kernels_of_a_real_cubin_are_listed_and_demangled() {
        let cubin = include_bytes!("../../tests/data/names_sm90.cubin");
        let found = kernels_in(cubin);
        let readable: Vec<&str> = found.iter().map(|k| k.readable.as_str()).collect();
        assert_eq!(
            readable,
            vec![
                "softmax_kernel<256, float>(float*)",
                "ns::k2(float*)",
                "ec",
                "plain(float*)"
            ]
        );
        assert!(found.iter().any(|k| k.symbol == "_Z5plainPf"));
        // The device function h (inlined into k2's section) is not a kernel.
        assert!(!found.iter().any(|k| k.readable.contains("h(")));
    }

    #[test]
    fn non_elf_images_hold_no_listable_kernels() {
        assert!(kernels_in(b".version 8.0\n.entry k()").is_empty());
        assert!(kernels_in(b"\x7fELF short").is_empty());
        assert_eq!(listing(&[]), "none");
    }
}
