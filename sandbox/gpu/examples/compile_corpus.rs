//! compile_corpus: compiles a corpus of extracted CUDA candidates through kiln's own
//! candidate compile path ([`kiln_gpu::cxx::compile_candidate`]: the same screen, options,
//! prelude, stand-in headers and toolkit include folders a real candidate gets, kernels by
//! C++ name expression). No GPU is needed; NVRTC is.
//!
//! Input: JSON-lines files written by `scripts/corpus/extract.py`, one object a line:
//! `{"id", "source", "kernels": [name expressions], "flags": [...]}`, or `{"id",
//! "extract_error"}` for a published file that could not be turned into a candidate.
//!
//! Output (stdout): one JSON line per entry — `{"id", "status": "ok" | "failed" |
//! "not_extracted", "ms", "kernels", "flags_dropped", "cause", "error"}` — then one
//! `{"summary": …}` line with the counts by status and by failure cause; the same summary
//! in words on stderr.
//!
//! Options: `--include DIR` (repeatable; default `$CUDA_HOME/include`, else
//! `/usr/local/cuda/include`, when it holds `cuda_runtime.h`), `--arch sm_90` (kiln's target
//! on the H200). Flags the candidate's author gave that kiln's allow-list refuses are
//! dropped one by one and listed in `flags_dropped`, as a user would drop them.
//!
//! Run: `cargo run -p kiln-gpu --example compile_corpus -- out/*.jsonl` with libnvrtc on
//! the library path (see docs/corpus.md).

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use kiln_gpu::cxx::{CandidateSource, compile, compile_candidate};
use kiln_gpu::nvrtc::{CompileError, check_flags, target_arch};
use serde::Deserialize;
use serde_json::json;

/// One extracted candidate.
#[derive(Debug, Deserialize)]
struct Entry {
    id: String,
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    kernels: Vec<String>,
    #[serde(default)]
    flags: Vec<String>,
    #[serde(default)]
    extract_error: Option<String>,
}

struct Args {
    inputs: Vec<PathBuf>,
    include_dirs: Vec<PathBuf>,
    arch: String,
}

fn parse_args() -> Result<Args, String> {
    let mut inputs = Vec::new();
    let mut include_dirs = Vec::new();
    let mut arch = "sm_90".to_string();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--include" => {
                include_dirs.push(PathBuf::from(it.next().ok_or("--include needs a folder")?))
            }
            "--arch" => arch = it.next().ok_or("--arch needs a value")?,
            "-h" | "--help" => {
                return Err(
                    "usage: compile_corpus [--include DIR]... [--arch sm_90] FILE.jsonl...".into(),
                );
            }
            _ => inputs.push(PathBuf::from(a)),
        }
    }
    if inputs.is_empty() {
        return Err("no input files (JSON lines from scripts/corpus/extract.py)".into());
    }
    if include_dirs.is_empty() {
        let home = std::env::var_os("CUDA_HOME").map(|h| PathBuf::from(h).join("include"));
        include_dirs.extend(
            [home, Some(PathBuf::from("/usr/local/cuda/include"))]
                .into_iter()
                .flatten()
                .find(|d| d.join("cuda_runtime.h").is_file()),
        );
    }
    Ok(Args {
        inputs,
        include_dirs,
        arch,
    })
}

/// The flags kiln accepts, one by one, and those it refuses.
fn split_flags(arch: &str, flags: &[String]) -> (Vec<String>, Vec<String>) {
    let (mut kept, mut dropped) = (Vec::new(), Vec::new());
    for f in flags {
        let one = std::slice::from_ref(f);
        if check_flags(one).is_ok() && target_arch(arch, one).is_ok() {
            kept.push(f.clone());
        } else {
            dropped.push(f.clone());
        }
    }
    (kept, dropped)
}

/// A failure's cause, short enough to group by: the first error of the log without its
/// file and line (a missing header and an undefined identifier keep their names).
fn cause(err: &CompileError) -> (String, String) {
    match err {
        CompileError::Failed { log } => {
            let summary = compile::error_summary(log);
            let first = summary
                .lines()
                .find(|l| l.contains("error"))
                .unwrap_or_default();
            let msg = first.split_once("error: ").map_or(first, |(_, m)| m).trim();
            let c = if let Some(h) = msg
                .split_once("open source file \"")
                .and_then(|(_, r)| r.split('"').next())
            {
                format!("header <{h}> not found")
            } else {
                let mut m = msg.to_string();
                if m.len() > 100 {
                    let mut cut = 100;
                    while !m.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    m.truncate(cut);
                }
                m
            };
            (c, summary)
        }
        CompileError::Source(m) => {
            let first = m.lines().next().unwrap_or_default();
            let c = if first.contains("host code") {
                "refused: host code".to_string()
            } else {
                format!("refused: {}", first.chars().take(100).collect::<String>())
            };
            (c, m.clone())
        }
        CompileError::NoSuchKernel { .. } => ("no such kernel".into(), err.to_string()),
        other => (
            format!("{other}").chars().take(100).collect(),
            other.to_string(),
        ),
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("compile_corpus: {e}");
            return ExitCode::from(2);
        }
    };
    let Some((major, minor)) = kiln_gpu::facts::nvrtc_version() else {
        eprintln!("compile_corpus: NVRTC is not loadable (put libnvrtc.so on LD_LIBRARY_PATH)");
        return ExitCode::from(2);
    };
    eprintln!(
        "compile_corpus: NVRTC {major}.{minor}, arch {}, include {:?}",
        args.arch, args.include_dirs
    );
    let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_cause: BTreeMap<String, usize> = BTreeMap::new();
    let mut total_ms = 0.0;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for input in &args.inputs {
        let file = match std::fs::File::open(input) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("compile_corpus: {}: {e}", input.display());
                return ExitCode::from(2);
            }
        };
        for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
            let line = match line {
                Ok(l) if l.trim().is_empty() => continue,
                Ok(l) => l,
                Err(e) => {
                    eprintln!("compile_corpus: {}: {e}", input.display());
                    return ExitCode::from(2);
                }
            };
            let entry: Entry = match serde_json::from_str(&line) {
                Ok(e) => e,
                Err(e) => {
                    eprintln!("compile_corpus: {}:{}: {e}", input.display(), n + 1);
                    return ExitCode::from(2);
                }
            };
            let record = match (&entry.source, &entry.extract_error) {
                (Some(source), None) => {
                    let (flags, dropped) = split_flags(&args.arch, &entry.flags);
                    let started = Instant::now();
                    let r = compile_candidate(&CandidateSource {
                        source,
                        arch: &args.arch,
                        flags: &flags,
                        include_dirs: &args.include_dirs,
                        kernels: &entry.kernels,
                    });
                    let ms = started.elapsed().as_secs_f64() * 1e3;
                    total_ms += ms;
                    match r {
                        Ok(m) => json!({
                            "id": entry.id, "status": "ok", "ms": ms.round(),
                            "kernels": m.artifact.manifest.kernels.keys().collect::<Vec<_>>(),
                            "flags_dropped": dropped,
                        }),
                        Err(e) => {
                            let (c, error) = cause(&e);
                            *by_cause.entry(c.clone()).or_default() += 1;
                            let error: String =
                                error.lines().take(6).collect::<Vec<_>>().join("\n");
                            json!({
                                "id": entry.id, "status": "failed", "ms": ms.round(),
                                "kernels": entry.kernels, "flags_dropped": dropped,
                                "cause": c, "error": error,
                            })
                        }
                    }
                }
                (_, why) => {
                    let c = format!("not extracted: {}", why.as_deref().unwrap_or("no source"));
                    *by_cause.entry(c.clone()).or_default() += 1;
                    json!({"id": entry.id, "status": "not_extracted", "cause": c})
                }
            };
            let status = record["status"].as_str().unwrap_or_default().to_string();
            *by_status.entry(status).or_default() += 1;
            if writeln!(out, "{record}").is_err() {
                return ExitCode::from(2);
            }
        }
    }
    let summary = json!({"summary": {
        "nvrtc": format!("{major}.{minor}"), "arch": args.arch,
        "status": by_status, "causes": by_cause, "compile_ms_total": total_ms.round(),
    }});
    if writeln!(out, "{summary}").is_err() {
        return ExitCode::from(2);
    }
    eprintln!("compile_corpus: {by_status:?}");
    let mut causes: Vec<_> = by_cause.iter().collect();
    causes.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (c, n) in causes {
        eprintln!("  {n:4}  {c}");
    }
    ExitCode::SUCCESS
}
