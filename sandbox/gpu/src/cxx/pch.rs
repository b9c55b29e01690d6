//! NVRTC precompiled headers (PCH) for a candidate's include prefix.
//!
//! Most of a cold compile of a candidate that includes toolkit headers (`cuda_fp16.h`,
//! `cub/block/…`, `cooperative_groups.h`) is NVRTC parsing those headers. NVRTC can save
//! the state after a source's *initial sequence of preprocessing directives* to a file
//! (`--create-pch`) and start another compile from it (`--use-pch`) when that compile's
//! own initial sequence begins with the same directives. This module holds the pieces of
//! that which are pure or NVRTC-only; the sandbox decides when a PCH is built and used
//! (`kiln_sandbox::engine::cuda::pch`).
//!
//! - [`prefix`]: a candidate's leading `#include` lines (blank lines and comments may come
//!   between), each naming a header the screen accepts; the first other line ends it.
//! - [`Prefix::build_source`]: the only text a PCH is ever built from: the prefix's include
//!   lines re-spelled by kiln from the parsed names, then a declaration that ends the
//!   directive sequence. Never a byte of the candidate's own text.
//! - [`key`]: what a PCH file is named by: a BLAKE3 hash over the NVRTC version, the
//!   caller's description of the compiling process (worker executable, jail layout), the
//!   compile's full option list, kiln's in-memory headers and the prefix.
//! - [`build`]: compiles the build text with the same options a candidate compile with
//!   that prefix gets, plus `--create-pch`; [`reserve_heap`]: the tiny PCH compile a
//!   process does first, so NVRTC's PCH heap lands at the same address in every process
//!   of the same layout (a PCH is only usable at the address it was made at).
//! - [`outcome`] and [`strip_log`]: whether NVRTC used the PCH, read from its log, and
//!   the log without NVRTC's PCH lines, so a candidate sees the log it would have seen
//!   without one.
//!
//! Whatever goes wrong, a PCH costs speed only: NVRTC checks that the candidate's
//! directives are compatible (else it warns and compiles from the headers), and kiln falls
//! back to a plain compile when the file cannot be opened.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::compile::{SOURCE_NAME, options_for};
use super::lexer::logical_lines;
use super::{screen, standins};
use crate::nvrtc::{CompileError, Program, compile_program};

/// How a PCH file's name starts.
pub const FILE_PREFIX: &str = "kiln-pch-";

/// How a PCH file's name ends.
pub const FILE_SUFFIX: &str = ".pch";

/// The declaration that ends a build text's directive sequence (NVRTC's "header stop
/// point" is the first token that is not a directive).
pub const STOP: &str = "typedef int kiln_pch_stop;";

/// Most `#include` lines a prefix keeps (the rest of the source compiles as usual).
pub const MAX_INCLUDES: usize = 32;

/// The file [`reserve_heap`] writes in its folder (and removes).
const HEAP_FILE: &str = "kiln-pch-heap.pch";

/// One `#include` of a prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Include {
    /// The header's name as written between the delimiters.
    pub name: String,
    /// `<name>` (true) or `"name"` (false).
    pub angled: bool,
}

impl Include {
    /// The directive, as kiln spells it.
    pub fn line(&self) -> String {
        if self.angled {
            format!("#include <{}>", self.name)
        } else {
            format!("#include \"{}\"", self.name)
        }
    }
}

/// A candidate's leading `#include`s, in order (see [`prefix`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Prefix {
    /// The includes, in source order; never empty.
    pub includes: Vec<Include>,
}

impl Prefix {
    /// The include lines, one per line.
    pub fn text(&self) -> String {
        self.includes
            .iter()
            .map(|i| i.line() + "\n")
            .collect::<String>()
    }

    /// The source a PCH of this prefix is built from: [`Prefix::text`], then [`STOP`].
    pub fn build_source(&self) -> String {
        format!("{}{STOP}\n", self.text())
    }

    /// Whether the prefix names a header that is not one of kiln's own in-memory headers:
    /// only those make parsing slow enough for a PCH to pay.
    pub fn has_toolkit_header(&self) -> bool {
        self.includes.iter().any(|i| !standins::is_standin(&i.name))
    }

    /// Checks a prefix that arrived from elsewhere (a build request) as [`prefix`] would
    /// have made it: 1 to [`MAX_INCLUDES`] names, each accepted by the include screen.
    pub fn validate(&self) -> Result<(), String> {
        if self.includes.is_empty() || self.includes.len() > MAX_INCLUDES {
            return Err(format!(
                "a prefix holds 1 to {MAX_INCLUDES} includes, not {}",
                self.includes.len()
            ));
        }
        for i in &self.includes {
            if let Some(why) = screen::bad_header_name(&i.name) {
                return Err(format!("include {:?} refused: {why}", i.name));
            }
        }
        Ok(())
    }
}

/// The leading `#include <…>` / `#include "…"` lines of `source`, skipping blank lines
/// and comments, up to the first other line (another directive, code, an include whose
/// name the screen refuses, or one with anything after its name); `None` when there are
/// none. At most [`MAX_INCLUDES`] are kept.
pub fn prefix(source: &str) -> Option<Prefix> {
    let mut includes = Vec::new();
    for line in logical_lines(source) {
        let code = line.code.trim();
        if code.is_empty() {
            continue;
        }
        let Some(include) = include_line(code) else {
            break;
        };
        includes.push(include);
        if includes.len() == MAX_INCLUDES {
            break;
        }
    }
    (!includes.is_empty()).then_some(Prefix { includes })
}

/// `code` (a trimmed logical line, comments blanked) as a plain `#include` of an accepted
/// name with nothing after it.
fn include_line(code: &str) -> Option<Include> {
    let rest = code.strip_prefix('#')?.trim_start();
    let target = rest.strip_prefix("include")?.trim_start();
    let (close, angled) = match target.chars().next()? {
        '<' => ('>', true),
        '"' => ('"', false),
        _ => return None,
    };
    let end = target[1..].find(close)? + 1;
    let name = &target[1..end];
    if !target[end + 1..].trim().is_empty() || screen::bad_header_name(name).is_some() {
        return None;
    }
    Some(Include {
        name: name.to_string(),
        angled,
    })
}

/// What a PCH's key is made from.
#[derive(Debug, Clone, Copy)]
pub struct KeyInputs<'a> {
    /// NVRTC's version (major, minor).
    pub nvrtc: (i32, i32),
    /// The caller's description of the process that builds and uses the PCH: the worker
    /// executable's identity, the library path, the jail's layout, the headers' identity.
    pub environment: &'a str,
    /// Every option of the compile, in order (without the PCH options).
    pub options: &'a [String],
    /// Whether toolkit headers are in use (which set of in-memory headers is given).
    pub toolkit: bool,
    /// The prefix.
    pub prefix: &'a Prefix,
}

/// The key a PCH is named by: 64 hex digits of BLAKE3 over every input, each
/// length-prefixed so that no two different inputs run together the same way.
pub fn key(k: &KeyInputs) -> String {
    let mut h = blake3::Hasher::new();
    let mut put = |bytes: &[u8]| {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    put(b"kiln pch 1");
    put(format!("nvrtc {}.{}", k.nvrtc.0, k.nvrtc.1).as_bytes());
    put(k.environment.as_bytes());
    put(&(k.options.len() as u64).to_le_bytes());
    for o in k.options {
        put(o.as_bytes());
    }
    let headers = standins::headers(k.toolkit);
    put(&(headers.len() as u64).to_le_bytes());
    for (name, text) in &headers {
        put(name.as_bytes());
        put(text.as_bytes());
    }
    put(k.prefix.text().as_bytes());
    h.finalize().to_hex().to_string()
}

/// The file name of the PCH of `key`.
pub fn file_name(key: &str) -> String {
    format!("{FILE_PREFIX}{key}{FILE_SUFFIX}")
}

/// The key in a PCH file name made by [`file_name`], if `name` is one.
pub fn key_of(name: &str) -> Option<&str> {
    let key = name.strip_prefix(FILE_PREFIX)?.strip_suffix(FILE_SUFFIX)?;
    (key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit())).then_some(key)
}

/// The options that make a compile use the PCH at `path` and say so in its log.
pub fn use_options(path: &Path) -> Vec<String> {
    vec![
        format!("--use-pch={}", path.display()),
        "--pch-messages=true".into(),
    ]
}

/// Whether NVRTC used the PCH it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The compile started from the PCH.
    Used,
    /// The source's leading directives differ from the PCH's (NVRTC warning 630).
    Incompatible,
    /// NVRTC's PCH heap is at another address in this process than where the PCH was
    /// made (warning 20282): the process layouts differ.
    HeapAddress,
    /// The file is not a PCH of this NVRTC (warning 626), or NVRTC warned about it
    /// otherwise.
    Invalid,
    /// The file was made with other compile options (warning 629).
    OtherOptions,
    /// The file could not be opened; the candidate was compiled again without it.
    Unreadable,
    /// The compile from it ended in a catastrophic error, and so did the plain compile the
    /// candidate then got (the source's own).
    Abandoned,
    /// The compile from it ended in a catastrophic error and the plain compile the
    /// candidate then got did not: the file is suspect (a damaged file, or a limit only a
    /// compile from a PCH meets: NVRTC keeps its parse state in a temporary file).
    Damaged,
    /// NVRTC's log says nothing about the PCH (the compile failed before it got there).
    Unreported,
}

impl Outcome {
    /// The line a compile log ends with: `precompiled header: used` or `… not used (why)`.
    pub fn log_line(self) -> String {
        let why = match self {
            Outcome::Used => return "precompiled header: used".into(),
            Outcome::Incompatible => "the source's leading directives differ from the header's",
            Outcome::HeapAddress => "made in a process of another memory layout",
            Outcome::Invalid => "the file is not one this NVRTC made",
            Outcome::OtherOptions => "made with other compile options",
            Outcome::Unreadable => "the file could not be opened",
            Outcome::Abandoned => "the compile from it stopped short, and so did one without it",
            Outcome::Damaged => "the compile from it stopped short; compiled again without it",
            Outcome::Unreported => "the compiler did not say",
        };
        format!("precompiled header: not used ({why})")
    }

    /// True when the file itself is at fault (it should be made again), not the source.
    pub fn file_is_bad(self) -> bool {
        matches!(
            self,
            Outcome::HeapAddress | Outcome::Invalid | Outcome::OtherOptions | Outcome::Damaged
        )
    }
}

/// The kinds of NVRTC log line about a PCH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PchLine {
    /// `"name": using precompiled header file "…"`.
    Using,
    /// `"name": creating precompiled header file "…"`.
    Creating,
    /// A warning about the PCH, and what it says.
    Warning(Outcome),
    /// `… error: cannot open precompiled header file "…"`.
    CannotOpen,
    /// A PCH creation that ran out of heap (warning 639).
    HeapTooSmall,
}

/// What `line` says about a PCH, if it is one of NVRTC's PCH lines. Only lines NVRTC
/// writes itself count: they start with the program's quoted name or a bare `Warning` /
/// `Catastrophic error`, which no diagnostic about the source does (those start with
/// the file name and line).
fn pch_line(line: &str) -> Option<PchLine> {
    if line.starts_with('"') {
        if line.contains("\": using precompiled header file \"") {
            return Some(PchLine::Using);
        }
        if line.contains("\": creating precompiled header file \"") {
            return Some(PchLine::Creating);
        }
        return None;
    }
    if let Some(rest) = line.strip_prefix("Warning #") {
        let number = rest.split_once("-D:").map(|(n, _)| n);
        return match number {
            Some("630") => Some(PchLine::Warning(Outcome::Incompatible)),
            Some("629") => Some(PchLine::Warning(Outcome::OtherOptions)),
            // The heap at another address, or its memory in use otherwise (634).
            Some("20282" | "634") => Some(PchLine::Warning(Outcome::HeapAddress)),
            // 626 (not a PCH of this NVRTC), and any other warning about the file.
            Some(_) if rest.contains("precompiled header") => {
                Some(PchLine::Warning(Outcome::Invalid))
            }
            _ => None,
        };
    }
    if line.starts_with("Catastrophic error: cannot open precompiled header file") {
        return Some(PchLine::CannotOpen);
    }
    if line.contains(
        "warning #639-D: insufficient preallocated memory for generation of precompiled header",
    ) {
        return Some(PchLine::HeapTooSmall);
    }
    None
}

/// Whether NVRTC used the PCH, from the log of a compile given [`use_options`].
pub fn outcome(log: &str) -> Outcome {
    let mut found = Outcome::Unreported;
    for line in log.lines() {
        match pch_line(line) {
            Some(PchLine::Using) => return Outcome::Used,
            Some(PchLine::Warning(o)) => found = o,
            Some(PchLine::CannotOpen) => found = Outcome::Unreadable,
            _ => {}
        }
    }
    found
}

/// `log` without NVRTC's PCH lines: the using/creating messages and the PCH warnings,
/// each with the blank lines and the suppression remark NVRTC puts after a warning.
pub fn strip_log(log: &str) -> String {
    if !log.lines().any(|l| pch_line(l).is_some()) {
        return log.to_string();
    }
    let mut out = String::with_capacity(log.len());
    // After a stripped warning: drop blank lines and the one remark that follows it.
    let mut after_warning = false;
    let mut after_message = false;
    for line in log.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        if let Some(kind) = pch_line(bare) {
            after_warning = !matches!(kind, PchLine::Using | PchLine::Creating);
            after_message = !after_warning;
            continue;
        }
        if (after_warning || after_message) && bare.trim().is_empty() {
            continue;
        }
        if after_warning && bare.starts_with("Remark: The warnings can be suppressed") {
            after_warning = false;
            after_message = true;
            continue;
        }
        after_warning = false;
        after_message = false;
        out.push_str(line);
    }
    out
}

/// What [`build`] compiles: a prefix, with what fixes a candidate compile's options.
#[derive(Debug, Clone, Copy)]
pub struct Build<'a> {
    /// The prefix.
    pub prefix: &'a Prefix,
    /// kiln's target architecture (`sm_90`).
    pub arch: &'a str,
    /// The candidate's flags (checked here, as for the candidate).
    pub flags: &'a [String],
    /// The toolkit's include folders, as this process sees them.
    pub include_dirs: &'a [PathBuf],
    /// The headers pre-included for the candidate because it uses their names
    /// (`CandidateOptions::implied`); each must be one kiln may imply.
    pub implied: &'a [String],
    /// Where to write the PCH.
    pub out: &'a Path,
}

/// A PCH [`build`] made.
#[derive(Debug, Clone, PartialEq)]
pub struct Built {
    /// Its size, bytes.
    pub bytes: u64,
    /// Wall time of the build, milliseconds.
    pub duration_ms: f64,
}

/// Builds the PCH of `b.prefix` at `b.out` from [`Prefix::build_source`], compiled under
/// the candidate's own program name, headers and options, plus `--create-pch`. An `Err`
/// is never the candidate's fault: the candidate then compiles without a PCH.
///
/// Blocking; bound its run time by running it in a child process, like any compile.
pub fn build(b: &Build) -> Result<Built, CompileError> {
    let started = Instant::now();
    b.prefix.validate().map_err(CompileError::Source)?;
    if let Some(bad) = b.implied.iter().find(|h| !standins::may_imply(h)) {
        return Err(CompileError::Source(format!(
            "{bad:?} is not a header kiln pre-includes"
        )));
    }
    let implied: Vec<&str> = b.implied.iter().map(String::as_str).collect();
    let opts = options_for(b.arch, b.flags, &implied, b.include_dirs)?;
    let _ = std::fs::remove_file(b.out);
    let mut options = opts.options;
    options.push(format!("--create-pch={}", b.out.display()));
    options.push("--pch-messages=true".into());
    let headers = standins::headers(!b.include_dirs.is_empty());
    let source = b.prefix.build_source();
    let out = compile_program(&Program {
        source: &source,
        name: SOURCE_NAME,
        options: &options,
        headers: &headers,
        names: &[],
        real_arch: opts.arch.starts_with("sm_"),
    })?;
    let created = out
        .log
        .lines()
        .any(|l| pch_line(l) == Some(PchLine::Creating));
    let bytes = std::fs::metadata(b.out).map(|m| m.len()).unwrap_or(0);
    if !created || bytes == 0 {
        let _ = std::fs::remove_file(b.out);
        let why = if out
            .log
            .lines()
            .any(|l| pch_line(l) == Some(PchLine::HeapTooSmall))
        {
            "the header state is larger than NVRTC's PCH heap".to_string()
        } else {
            format!("no file was written; log: {}", out.log.trim())
        };
        return Err(CompileError::Nvrtc {
            call: "nvrtcCompileProgram (--create-pch)",
            code: "no precompiled header".into(),
            log: why,
        });
    }
    Ok(Built {
        bytes,
        duration_ms: started.elapsed().as_secs_f64() * 1e3,
    })
}

/// Maps NVRTC's PCH heap at a fixed point of this process's life: a PCH compile of
/// [`STOP`] alone, written to `dir` and removed. Done first thing in a process (before
/// any allocation whose size depends on its input), with address-space randomization
/// off, it puts the heap at the same address in every process of the same executable and
/// libraries, which a PCH needs to be usable across processes.
pub fn reserve_heap(dir: &Path) -> Result<(), CompileError> {
    let path = dir.join(HEAP_FILE);
    let options = vec![
        format!("--create-pch={}", path.display()),
        "--pch-messages=false".to_string(),
    ];
    let source = format!("{STOP}\n");
    let result = compile_program(&Program {
        source: &source,
        name: "kiln_pch_heap.cu",
        options: &options,
        headers: &[],
        names: &[],
        real_arch: false,
    });
    let _ = std::fs::remove_file(&path);
    result.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(p: &Option<Prefix>) -> Vec<(&str, bool)> {
        p.as_ref().map_or_else(Vec::new, |p| {
            p.includes
                .iter()
                .map(|i| (i.name.as_str(), i.angled))
                .collect()
        })
    }

    #[test]
    fn the_prefix_is_the_leading_includes_past_comments_and_blank_lines() {
        let src = "// a kernel\n\n/* several\n   lines */\n#include <cuda_fp16.h>\n  #  include \"cub/block/block_reduce.cuh\" // why\n\n#include <cstdint>\n__global__ void k() {}\n#include <mma.h>\n";
        let p = prefix(src);
        assert_eq!(
            names(&p),
            vec![
                ("cuda_fp16.h", true),
                ("cub/block/block_reduce.cuh", false),
                ("cstdint", true)
            ]
        );
        let p = p.expect("prefix");
        assert_eq!(
            p.build_source(),
            "#include <cuda_fp16.h>\n#include \"cub/block/block_reduce.cuh\"\n#include <cstdint>\ntypedef int kiln_pch_stop;\n"
        );
        assert!(p.has_toolkit_header());
        assert_eq!(p.validate(), Ok(()));
    }

    #[test]
    fn the_prefix_stops_at_any_other_line() {
        for (src, want) in [
            ("#define X 1\n#include <cuda_fp16.h>\n", vec![]),
            (
                "#include <cuda_fp16.h>\n#define X 1\n#include <mma.h>\n",
                vec!["cuda_fp16.h"],
            ),
            (
                "#include <cuda_fp16.h>\n#pragma once\n#include <mma.h>\n",
                vec!["cuda_fp16.h"],
            ),
            (
                "#include <cuda_fp16.h>\nint x;\n#include <mma.h>\n",
                vec!["cuda_fp16.h"],
            ),
            ("#if 1\n#include <cuda_fp16.h>\n#endif\n", vec![]),
            ("#include_next <cuda_fp16.h>\n", vec![]),
            ("#include <cuda_fp16.h> junk\n#include <mma.h>\n", vec![]),
            ("#include MACRO\n", vec![]),
            ("__global__ void k() {}\n", vec![]),
            ("", vec![]),
        ] {
            let p = prefix(src);
            let got: Vec<&str> = names(&p).into_iter().map(|(n, _)| n).collect();
            assert_eq!(got, want, "{src:?}");
        }
    }

    #[test]
    fn the_prefix_refuses_paths() {
        for src in [
            "#include </etc/passwd>\n",
            "#include \"../x.h\"\n",
            "#include <cuda/../../x>\n",
            "#include \"C:\\\\x.h\"\n",
            "#include <a b.h>\n",
        ] {
            assert_eq!(prefix(src), None, "{src:?}");
        }
        // A refused name ends the prefix; what came before stays.
        assert_eq!(
            names(&prefix("#include <cuda_fp16.h>\n#include </etc/passwd>\n")),
            vec![("cuda_fp16.h", true)]
        );
        let bad = Prefix {
            includes: vec![Include {
                name: "/etc/passwd".into(),
                angled: true,
            }],
        };
        assert!(bad.validate().is_err());
        assert!(Prefix { includes: vec![] }.validate().is_err());
    }

    #[test]
    fn stand_ins_alone_are_not_worth_a_pch() {
        let p = prefix("#include <cstdint>\n#include <cmath>\n#include <vector>\n").expect("p");
        assert!(!p.has_toolkit_header());
        let many = "#include <cuda_fp16.h>\n".repeat(MAX_INCLUDES + 5);
        assert_eq!(prefix(&many).expect("p").includes.len(), MAX_INCLUDES);
    }

    #[test]
    fn the_key_changes_with_each_input() {
        let p = prefix("#include <cuda_fp16.h>\n").expect("p");
        let q = prefix("#include <cuda_fp16.h>\n#include <mma.h>\n").expect("q");
        let options = vec!["--gpu-architecture=sm_90".to_string()];
        let other = vec!["--gpu-architecture=sm_90a".to_string()];
        let base = KeyInputs {
            nvrtc: (13, 0),
            environment: "worker /kiln/kiln-worker 1 2",
            options: &options,
            toolkit: true,
            prefix: &p,
        };
        let k = key(&base);
        assert_eq!(k.len(), 64);
        assert_eq!(k, key(&base), "deterministic");
        let variants = [
            KeyInputs {
                nvrtc: (13, 1),
                ..base
            },
            KeyInputs {
                environment: "worker /kiln/kiln-worker 1 3",
                ..base
            },
            KeyInputs {
                options: &other,
                ..base
            },
            KeyInputs {
                toolkit: false,
                ..base
            },
            KeyInputs { prefix: &q, ..base },
        ];
        for v in &variants {
            assert_ne!(key(v), k, "{v:?}");
        }
        // Comments and spacing in the source do not change the prefix, so not the key.
        let spaced = prefix("// x\n#  include <cuda_fp16.h>  \n").expect("spaced");
        assert_eq!(
            key(&KeyInputs {
                prefix: &spaced,
                ..base
            }),
            k
        );
        assert_eq!(key_of(&file_name(&k)), Some(k.as_str()));
        assert_eq!(key_of("kiln-pch-xyz.pch"), None);
        assert_eq!(key_of(&format!("kiln-pch-{k}.pch.tmp")), None);
    }

    const USING: &str = "\"/kiln/no-such-dir/candidate.cu\": using precompiled header file \"/kiln/pch/kiln-pch-1.pch\"\n";
    const REMARK: &str =
        "Remark: The warnings can be suppressed with \"-diag-suppress <warning-number>\"\n";

    #[test]
    fn the_log_says_whether_the_pch_was_used() {
        assert_eq!(outcome(USING), Outcome::Used);
        let own = "/kiln/no-such-dir/candidate.cu(2): warning #177-D: variable \"x\" was declared but never referenced\n";
        assert_eq!(outcome(own), Outcome::Unreported);
        for (warning, want) in [
            (
                "Warning #630-D: the initial sequence of preprocessing directives is not compatible with those of precompiled header file \"p\"",
                Outcome::Incompatible,
            ),
            (
                "Warning #20282-D: incompatible precompiled header (PCH) heap allocation address from PCH file \"p\".  This usually occurs if …",
                Outcome::HeapAddress,
            ),
            (
                "Warning #626-D: precompiled header file \"p\" is either invalid or not generated by this version of the compiler",
                Outcome::Invalid,
            ),
            (
                "Warning #629-D: the command line options do not match those used when precompiled header file \"p\" was created",
                Outcome::OtherOptions,
            ),
            (
                "Warning #634-D: memory usage conflict with precompiled header file \"p\"",
                Outcome::HeapAddress,
            ),
            (
                "Catastrophic error: cannot open precompiled header file \"p\"",
                Outcome::Unreadable,
            ),
        ] {
            let log = format!("{warning}\n\n{REMARK}\n{own}");
            assert_eq!(outcome(&log), want, "{warning}");
            assert_eq!(strip_log(&log), own, "{warning}");
        }
        // The candidate's own lines never count, even when they quote NVRTC's words.
        let forged = "/kiln/no-such-dir/candidate.cu(1): warning #1105-D: #warning directive: \"x\": using precompiled header file \"y\"\n";
        assert_eq!(outcome(forged), Outcome::Unreported);
        assert_eq!(strip_log(forged), forged);
    }

    #[test]
    fn stripping_keeps_everything_else() {
        let own = "/kiln/no-such-dir/candidate.cu(2): warning #177-D: variable \"x\" was declared but never referenced\n  int x;\n      ^\n\n";
        let log = format!("{USING}{own}{REMARK}\n");
        assert_eq!(strip_log(&log), format!("{own}{REMARK}\n"));
        assert_eq!(strip_log(USING), "");
        let plain = format!("{own}{REMARK}");
        assert_eq!(strip_log(&plain), plain);
        let error = format!("{USING}/kiln/no-such-dir/candidate.cu(2): error: expected a \";\"\n");
        assert_eq!(
            strip_log(&error),
            "/kiln/no-such-dir/candidate.cu(2): error: expected a \";\"\n"
        );
    }

    #[test]
    fn the_log_line_names_the_outcome() {
        assert_eq!(Outcome::Used.log_line(), "precompiled header: used");
        for o in [
            Outcome::Incompatible,
            Outcome::HeapAddress,
            Outcome::Invalid,
            Outcome::OtherOptions,
            Outcome::Unreadable,
            Outcome::Abandoned,
            Outcome::Damaged,
            Outcome::Unreported,
        ] {
            let line = o.log_line();
            assert!(line.starts_with("precompiled header: not used ("), "{line}");
            // Never read as an error line by the error summary.
            assert!(!line.contains("error"), "{line}");
        }
    }
    /// The two artifacts hold the same manifest and the same CUBIN but for the order of
    /// the ELF symbol table (a compile from a PCH lists some local symbols of variable
    /// template instantiations in another order): every other section is byte-equal, and
    /// the symbols are the same set.
    fn assert_same_code(a: &crate::artifact::Artifact, b: &crate::artifact::Artifact) {
        use object::{Object, ObjectSection, ObjectSymbol};
        assert_eq!(a.manifest, b.manifest);
        if a.image == b.image {
            return;
        }
        let (ea, eb) = (
            object::File::parse(&*a.image).expect("elf"),
            object::File::parse(&*b.image).expect("elf"),
        );
        let sections = |e: &object::File| -> Vec<(String, Vec<u8>)> {
            e.sections()
                .filter(|s| !matches!(s.name(), Ok(".symtab" | ".strtab")))
                .map(|s| {
                    let name = s.name().unwrap_or_default().to_string();
                    (name, s.data().unwrap_or_default().to_vec())
                })
                .collect()
        };
        assert!(
            sections(&ea) == sections(&eb),
            "a section other than the symbol table differs"
        );
        let symbols = |e: &object::File| -> Vec<String> {
            let mut v: Vec<String> = e
                .symbols()
                .map(|s| format!("{} {:?}", s.name().unwrap_or_default(), s.kind()))
                .collect();
            v.sort();
            v
        };
        assert!(symbols(&ea) == symbols(&eb), "the symbols differ");
    }

    /// The toolkit's include folder: `$CUDA_HOME/include`, `/usr/local/cuda/include`, or
    /// the `include` beside a library folder on `LD_LIBRARY_PATH` (python's CUDA wheels).
    fn toolkit() -> Option<Vec<PathBuf>> {
        let mut dirs: Vec<PathBuf> = vec![PathBuf::from("/usr/local/cuda/include")];
        if let Some(h) = std::env::var_os("CUDA_HOME") {
            dirs.insert(0, PathBuf::from(h).join("include"));
        }
        if let Some(lp) = std::env::var_os("LD_LIBRARY_PATH") {
            dirs.extend(std::env::split_paths(&lp).map(|d| d.join("../include")));
        }
        dirs.into_iter()
            .find(|d| d.join("cuda_fp16.h").is_file())
            .map(|d| vec![d])
    }

    /// Build, use, and each way of not using a PCH, in one process (where the heap's
    /// address always matches): the artifact is the one a plain compile makes, NVRTC's
    /// PCH lines never reach the log, and a missing file falls back to a plain compile.
    #[test]
    fn a_pch_built_here_gives_the_plain_compiles_artifact() {
        if crate::facts::nvrtc_version().is_none() {
            println!("SKIP: NVRTC is not loadable here");
            return;
        }
        let Some(include_dirs) = toolkit() else {
            println!("SKIP: no CUDA toolkit headers found");
            return;
        };
        /// Removes the test's folder (a PCH is ~150 MB), also when the test fails.
        struct Gone(PathBuf);
        impl Drop for Gone {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let dir = std::env::temp_dir().join(format!("kiln-pch-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let _gone = Gone(dir.clone());
        let source = "// reduce\n#include <cuda_fp16.h>\n#include <cub/block/block_reduce.cuh>\n\
                      __global__ void k(const float* x, float* y) {\n\
                        typedef cub::BlockReduce<float, 128> R; __shared__ typename R::TempStorage t;\n\
                        float v = R(t).Sum(x[threadIdx.x]);\n\
                        if (threadIdx.x == 0) y[0] = v + __half2float(__float2half(1.0f)); }\n";
        let kernels = vec!["k".to_string()];
        let c = crate::cxx::CandidateSource {
            source,
            arch: "sm_90",
            flags: &[],
            include_dirs: &include_dirs,
            kernels: &kernels,
        };
        let opts = crate::cxx::candidate_options(&c).expect("options");
        let p = prefix(source).expect("prefix");
        let out = dir.join(file_name(&"0".repeat(64)));
        let built = build(&Build {
            prefix: &p,
            arch: "sm_90",
            flags: &[],
            include_dirs: &include_dirs,
            implied: &opts.implied,
            out: &out,
        })
        .expect("built");
        assert!(built.bytes > 0);
        let plain = crate::cxx::compile_candidate(&c).expect("plain");
        let (with, o) = crate::cxx::compile_candidate_with_pch(&c, &out);
        let with = with.expect("with the pch");
        assert_eq!(o, Outcome::Used);
        assert_same_code(&with.artifact, &plain.artifact);
        assert_eq!(with.module.options, plain.module.options);
        assert_eq!(with.module.log.trim(), "precompiled header: used");
        println!(
            "pch {} MB built in {:.0} ms; plain compile {:.0} ms, with the pch {:.0} ms",
            built.bytes >> 20,
            built.duration_ms,
            plain.module.duration_ms,
            with.module.duration_ms
        );
        // A #define first: not compatible, compiled from the headers, no NVRTC warning.
        let defined = format!("#define KILN_X 1\n{source}");
        let c2 = crate::cxx::CandidateSource {
            source: &defined,
            ..c
        };
        let (r, o) = crate::cxx::compile_candidate_with_pch(&c2, &out);
        let m = r.expect("compiles");
        assert_eq!(o, Outcome::Incompatible);
        assert!(!m.module.log.contains("630"), "{}", m.module.log);
        // The candidate's errors are the same with and without.
        let broken = source.replace("float v =", "float v = undefined_thing +");
        let c3 = crate::cxx::CandidateSource {
            source: &broken,
            ..c
        };
        let e_plain = crate::cxx::compile_candidate(&c3).expect_err("broken");
        let (e_with, o) = crate::cxx::compile_candidate_with_pch(&c3, &out);
        assert_eq!(o, Outcome::Used);
        match (e_plain, e_with.expect_err("broken")) {
            (CompileError::Failed { log: a }, CompileError::Failed { log: b }) => {
                let line = Outcome::Used.log_line();
                assert_eq!(b.strip_suffix(line.as_str()), Some(a.as_str()));
            }
            other => panic!("{other:?}"),
        }
        // A file that is not a PCH, and one that is not there.
        let junk = dir.join("junk.pch");
        std::fs::write(&junk, vec![0x5a; 4096]).expect("junk");
        let (r, o) = crate::cxx::compile_candidate_with_pch(&c, &junk);
        assert_eq!(r.expect("compiles").artifact, plain.artifact);
        assert_eq!(o, Outcome::Invalid);
        let (r, o) = crate::cxx::compile_candidate_with_pch(&c, &dir.join("gone.pch"));
        let m = r.expect("compiles without it");
        assert_eq!(o, Outcome::Unreadable);
        assert_eq!(m.artifact, plain.artifact);
        assert!(!m.module.log.contains("cannot open"), "{}", m.module.log);
    }
}
