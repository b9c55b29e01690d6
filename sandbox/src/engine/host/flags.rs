//! The compile-flag allow-list of the host backend.
//!
//! A flag is accepted only if it matches an entry below exactly, or is a `-DNAME` /
//! `-DNAME=VALUE` macro definition with an identifier name and a value of letters,
//! digits and `._+-` (so search knobs can be set from flags). Nothing that names a path
//! (`-I`, `-L`, `-B`, `-specs`, `@file`, `-fplugin=`), links something (`-l`, `-Wl,`),
//! changes the output (`-o`, `-x`, `-S`) or pulls in a runtime with threads (`-fopenmp`)
//! can pass.

/// Flags always used: C11, position-independent shared object.
pub const BASE_FLAGS: &[&str] = &["-O2", "-std=c11", "-shared", "-fPIC"];

/// Exactly-matching flags a candidate may add (later ones override `-O2`/`-std=c11`).
pub const ALLOWED: &[&str] = &[
    "-O0",
    "-O1",
    "-O2",
    "-O3",
    "-Os",
    "-Ofast",
    "-march=native",
    "-mtune=native",
    "-mavx",
    "-mavx2",
    "-mfma",
    "-mf16c",
    "-msse4.2",
    "-mavx512f",
    "-ffast-math",
    "-fno-math-errno",
    "-funsafe-math-optimizations",
    "-fno-trapping-math",
    "-ffinite-math-only",
    "-funroll-loops",
    "-funroll-all-loops",
    "-fomit-frame-pointer",
    "-ftree-vectorize",
    "-fno-tree-vectorize",
    "-fopenmp-simd",
    "-fstrict-aliasing",
    "-fno-strict-aliasing",
    "-fno-semantic-interposition",
    "-std=c99",
    "-std=c11",
    "-std=c17",
    "-std=gnu11",
    "-std=gnu17",
    "-w",
    "-Wall",
    "-Wextra",
];

/// Checks one flag; the error says why it was refused.
pub fn check(flag: &str) -> Result<(), String> {
    if ALLOWED.contains(&flag) {
        return Ok(());
    }
    if let Some(def) = flag.strip_prefix("-D") {
        let (name, value) = def.split_once('=').unwrap_or((def, ""));
        let value_ok = value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-'));
        if kiln_types::candidate::is_identifier(name) && value_ok && value.len() <= 64 {
            return Ok(());
        }
        return Err(format!(
            "flag {flag:?}: a -D definition needs an identifier and a value of letters, digits and ._+-"
        ));
    }
    Err(format!(
        "flag {flag:?} is not in the host backend's allow-list"
    ))
}

/// Checks every flag; the first refused one is the error.
pub fn check_all(flags: &[String]) -> Result<(), String> {
    flags.iter().try_for_each(|f| check(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_refuses_paths_and_runtimes() {
        for ok in [
            "-O3",
            "-march=native",
            "-ffast-math",
            "-DUNROLL=4",
            "-DACC_T=double",
            "-DX",
        ] {
            assert!(check(ok).is_ok(), "{ok}");
        }
        for bad in [
            "-fopenmp",
            "-I/etc",
            "-L.",
            "-lm",
            "-Wl,-rpath,/x",
            "-o/tmp/x",
            "@/etc/passwd",
            "-fplugin=/x.so",
            "-specs=/x",
            "-B/tmp",
            "-DX=/etc/passwd",
            "-D1X=2",
            "-include/etc/passwd",
            "",
        ] {
            assert!(check(bad).is_err(), "{bad}");
        }
    }
}
