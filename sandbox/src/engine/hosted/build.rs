//! A hosted file's compile step: its `load_inline` libraries built ahead, off the lane.
//!
//! A `ModelNew` file that calls `torch.utils.cpp_extension.load_inline` builds torch's
//! extension headers with nvcc and the host compiler: tens of seconds, which would hold
//! the lane's GPU idle if the build ran when the file is imported for its evaluation. So
//! the compile step runs the file once, in a compile-role jail with no GPU, under the
//! hosted filters (`kiln-worker hosted-runner`, processes allowed for ninja and nvcc),
//! as `kiln_hosted.py build`: the file is imported and `ModelNew` built on the meta
//! device, and every `load_inline` call builds into `record/<key>/` (key: a hash of the
//! call's arguments) for the lane's architecture (`TORCH_CUDA_ARCH_LIST`). The libraries
//! built become the file's artifact ([`super::artifact`]), cached by kilnd under the whole
//! file, torch's version, the toolkit and the architecture; at the evaluation the runner
//! loads a call's library from there instead of building it.
//!
//! Nothing here is a verdict: an import that fails, a build that fails or runs out of
//! time leaves that library out, and the evaluation builds it again (and reports what went
//! wrong then). The libraries are the candidate's own work, loaded only into the runner of
//! the same file: a file cannot reach another file's artifact.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::artifact::{self, Lib};
use super::setup::{
    CANDIDATE_NAME, EXTRACT, EXTRACT_NAME, HostedSetup, SCRIPT, SCRIPT_NAME, runner_env,
};
use crate::engine::host::compile::run_captured;

/// The build log kept (the runner's `kiln build:` lines and the compilers' output).
const LOG_CAP: usize = 16 << 10;
/// The most bytes of one library, and of all of a file's libraries, kept.
pub const MAX_LIB_BYTES: u64 = 256 << 20;
/// The most libraries one file's compile keeps.
pub const MAX_LIBS: usize = 16;

/// What the compile request carries for a hosted file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostedBuild {
    /// The python with torch.
    pub setup: HostedSetup,
    /// The GPU architecture to build for (`sm_90`); `None` on the host backend (C++
    /// extensions only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    /// The problem's `get_init_inputs()`, JSON (ModelNew is built with them on the meta
    /// device, for files that call `load_inline` in `__init__`).
    pub init_inputs: String,
    /// The folder of torch's precompiled extension header, as the jail shows it
    /// ([`super::gch`]): the build's `CPATH`. `None`: built without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpath: Option<PathBuf>,
    /// Build that header instead of a file (`kiln_hosted.py gch` into
    /// `hosted-build/gch`; the request's source is not used).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub make_gch: bool,
}

/// Whether `source` can build anything at its compile step: it names `load_inline`.
pub fn wants_build(source: &str) -> bool {
    source.contains("load_inline")
}

/// Whether `source` has work for a compile step: `load_inline` libraries to build
/// ([`wants_build`]), or Triton kernels whose source lifting reads from the text there.
/// Other files (torch only) go to the lane as they are, with no compile jail.
pub fn wants_compile_step(source: &str) -> bool {
    wants_build(source) || source.contains("triton")
}

/// `sm_90` as torch's `TORCH_CUDA_ARCH_LIST` spells it (`9.0`; `sm_90a`: `9.0a`);
/// `None` when it is not an `sm_` architecture.
pub fn torch_arch_list(arch: &str) -> Option<String> {
    let rest = arch.strip_prefix("sm_")?;
    let (digits, suffix) = match rest.strip_suffix('a') {
        Some(d) => (d, "a"),
        None => (rest, ""),
    };
    if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (major, minor) = digits.split_at(digits.len() - 1);
    Some(format!("{major}.{minor}{suffix}"))
}

/// What the compile step made: the artifact (the file and its libraries) and its info.
pub struct Built {
    /// [`artifact::pack`] of the file and the libraries built.
    pub artifact: Vec<u8>,
    /// Wall time and the build log.
    pub info: kiln_types::CompileInfo,
}

/// Writes the device-source extractor into `dir`, beside the runner script, with kiln's
/// Triton rules beside it ([`kiln_types::triton::RULES_FILE`], which the extractor loads
/// from its own folder).
fn write_extractor(dir: &Path) -> Result<(), String> {
    std::fs::write(dir.join(EXTRACT_NAME), EXTRACT)
        .map_err(|e| format!("write {EXTRACT_NAME}: {e}"))?;
    let rules = kiln_types::triton::RULES_FILE;
    std::fs::write(dir.join(rules), kiln_types::triton::RULES_JSON)
        .map_err(|e| format!("write {rules}: {e}"))
}

/// Runs the build of `source` in the current directory (the compile jail's scratch),
/// for at most `timeout`. `Err` only when kiln's own part fails (scratch unwritable, the
/// wrapper cannot start): the caller then sends the file on as it is.
pub fn build(source: &str, job: &HostedBuild, timeout: Duration) -> Result<Built, String> {
    let started = Instant::now();
    let dir = std::env::current_dir()
        .map_err(|e| format!("no working directory: {e}"))?
        .join("hosted-build");
    let record = dir.join("record");
    std::fs::create_dir_all(&record).map_err(|e| format!("scratch: {e}"))?;
    let script = dir.join(SCRIPT_NAME);
    let candidate = dir.join(CANDIDATE_NAME);
    std::fs::write(&script, SCRIPT).map_err(|e| format!("write {SCRIPT_NAME}: {e}"))?;
    write_extractor(&dir)?;
    std::fs::write(&candidate, source).map_err(|e| format!("write {CANDIDATE_NAME}: {e}"))?;
    // As the evaluation starts its runners: the path the jail started this worker by
    // (a private root has no /proc/self/exe).
    let exe = std::env::args_os()
        .next()
        .ok_or("kiln-worker's own path: no argv[0]")?;
    let cuda = job.arch.is_some();
    // The file's device code, read from its text before any of it runs (for lifting; the
    // host backend keeps it too: reading is cheap, and it is what CI can check).
    let (device, device_log) = if !job.make_gch {
        device_sources(&exe, &dir, job, &script, &candidate)
    } else {
        (String::new(), String::new())
    };
    if !job.make_gch && !wants_build(source) {
        // Triton only: nothing to build ahead (Triton compiles at evaluation, on the GPU);
        // the device sources are this step's work.
        let mut log = String::from(
            "hosted: no load_inline library to build ahead (Triton kernels compile at \
             evaluation); the file's device sources read for lifting",
        );
        log.push_str(&device_log);
        return Ok(Built {
            artifact: artifact::pack(source, &[], &device),
            info: crate::engine::compile_info(started, log),
        });
    }
    let script_args: Vec<String> = if job.make_gch {
        vec!["gch".into(), dir.join("gch").display().to_string()]
    } else {
        vec![
            "build".into(),
            candidate.display().to_string(),
            record.display().to_string(),
            job.init_inputs.clone(),
        ]
    };
    let mut cmd = Command::new(exe);
    cmd.arg("hosted-runner")
        .arg(format!("--python={}", job.setup.python.display()))
        .arg(format!("--script={}", script.display()))
        .arg("--processes")
        .args(script_args.iter().map(|a| format!("--script-arg={a}")))
        .env_clear()
        .envs(runner_env(&dir, &job.setup, cuda))
        // No GPU here: torch builds for the lane's architecture, as it is told.
        .env("CUDA_VISIBLE_DEVICES", "")
        .env("MAX_JOBS", "2")
        .current_dir(&dir);
    if let Some(list) = job.arch.as_deref().and_then(torch_arch_list) {
        cmd.env("TORCH_CUDA_ARCH_LIST", list);
    }
    // torch's precompiled extension header, found before the header itself.
    if let Some(folder) = &job.cpath {
        cmd.env("CPATH", folder);
    }
    let run = run_captured(&mut cmd, timeout, LOG_CAP)
        .map_err(|e| format!("cannot start the hosted build: {e}"))?;
    let mut log = run.output;
    if job.make_gch {
        // The caller checks the header it finds in the scratch; the log says why not.
        if run.timed_out {
            log.push_str("\nkiln: the header build ran out of time");
        }
        return Ok(Built {
            artifact: Vec::new(),
            info: crate::engine::compile_info(started, log),
        });
    }
    if run.timed_out {
        log.push_str(&format!(
            "\nkiln: the build ran out of its {:.0} s; the evaluation builds what is missing",
            timeout.as_secs_f64()
        ));
    }
    log.push_str(&device_log);
    let libs = collect(&record, &mut log);
    let mut info = crate::engine::compile_info(started, log);
    info.log.insert_str(
        0,
        &format!(
            "hosted: {} load_inline librar{} built ahead for the evaluation\n",
            libs.len(),
            if libs.len() == 1 { "y" } else { "ies" }
        ),
    );
    Ok(Built {
        artifact: artifact::pack(source, &libs, &device),
        info,
    })
}

/// The most bytes of a file's device sources kept.
const MAX_DEVICE_BYTES: u64 = 4 << 20;
/// The time `kiln_hosted.py device-source` may take.
const DEVICE_SOURCE_TIMEOUT: Duration = Duration::from_secs(30);

/// `kiln_hosted.py device-source`: the `load_inline` device sources of the file at
/// `candidate`, read from its text (never imported: none of the file's code runs), as the
/// JSON the script writes, in the same hosted jail as the build; and a log line when it
/// could not. An empty string is "none" (lifting then says so).
fn device_sources(
    exe: &std::ffi::OsStr,
    dir: &Path,
    job: &HostedBuild,
    script: &Path,
    candidate: &Path,
) -> (String, String) {
    let out = dir.join("device-sources.json");
    let mut cmd = Command::new(exe);
    cmd.arg("hosted-runner")
        .arg(format!("--python={}", job.setup.python.display()))
        .arg(format!("--script={}", script.display()))
        .arg("--script-arg=device-source")
        .arg(format!("--script-arg={}", candidate.display()))
        .arg(format!("--script-arg={}", out.display()))
        .env_clear()
        .envs(runner_env(dir, &job.setup, true))
        .env("CUDA_VISIBLE_DEVICES", "")
        .current_dir(dir);
    let why = match run_captured(&mut cmd, DEVICE_SOURCE_TIMEOUT, LOG_CAP) {
        Err(e) => format!("cannot start: {e}"),
        Ok(run) if run.timed_out => format!("ran out of its {} s", DEVICE_SOURCE_TIMEOUT.as_secs()),
        Ok(run) => match std::fs::metadata(&out) {
            Ok(m) if m.len() > MAX_DEVICE_BYTES => {
                format!("{} bytes, over the {MAX_DEVICE_BYTES} kept", m.len())
            }
            Ok(_) => match std::fs::read_to_string(&out) {
                Ok(text) => return (text, String::new()),
                Err(e) => format!("unreadable: {e}"),
            },
            Err(_) => format!("wrote nothing: {}", run.output.trim()),
        },
    };
    (
        String::new(),
        format!("\nkiln: the file's device sources were not read ({why}): it cannot be lifted"),
    )
}

/// The libraries under `record/<key>/<name>.so`, within the limits; what is left out is
/// said in `log`.
fn collect(record: &Path, log: &mut String) -> Vec<Lib> {
    let mut libs = Vec::new();
    let mut total = 0u64;
    let Ok(keys) = std::fs::read_dir(record) else {
        return libs;
    };
    let mut keys: Vec<_> = keys.flatten().map(|e| e.path()).collect();
    keys.sort();
    for key_dir in keys {
        let Some(key) = key_dir.file_name().and_then(|k| k.to_str()) else {
            continue;
        };
        if !artifact::valid_key(key) {
            continue;
        }
        let Ok(files) = std::fs::read_dir(&key_dir) else {
            continue;
        };
        for f in files.flatten() {
            let path = f.path();
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".so"))
            else {
                continue;
            };
            // Only a plain file (never a link out of the scratch).
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if !artifact::valid_name(name) || !meta.is_file() {
                continue;
            }
            if libs.len() >= MAX_LIBS || total + meta.len() > MAX_LIB_BYTES {
                log.push_str(&format!(
                    "\nkiln: {name}.so left out (more than {MAX_LIBS} libraries or {} MiB)",
                    MAX_LIB_BYTES >> 20
                ));
                continue;
            }
            match std::fs::read(&path) {
                Ok(bytes) => {
                    total += bytes.len() as u64;
                    libs.push(Lib {
                        key: key.to_string(),
                        name: name.to_string(),
                        bytes,
                    });
                }
                Err(e) => log.push_str(&format!("\nkiln: {name}.so unreadable: {e}")),
            }
        }
    }
    libs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_extractor_is_written_with_the_one_triton_rules_file_beside_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_extractor(dir.path()).expect("write");
        let rules = std::fs::read_to_string(dir.path().join(kiln_types::triton::RULES_FILE))
            .expect("rules beside the extractor");
        assert_eq!(rules, kiln_types::triton::RULES_JSON);
        assert!(EXTRACT.contains(&format!(
            "TRITON_RULES_FILE = \"{}\"",
            kiln_types::triton::RULES_FILE
        )));
        for name in &kiln_types::triton::TritonRules::get().config_decorators {
            assert!(!EXTRACT.contains(&format!("\"{name}\"")), "{name}");
        }
    }

    #[test]
    fn architectures_as_torch_spells_them() {
        assert_eq!(torch_arch_list("sm_90").as_deref(), Some("9.0"));
        assert_eq!(torch_arch_list("sm_90a").as_deref(), Some("9.0a"));
        assert_eq!(torch_arch_list("sm_100").as_deref(), Some("10.0"));
        assert_eq!(torch_arch_list("sm_8"), None);
        assert_eq!(torch_arch_list("compute_90"), None);
        assert_eq!(torch_arch_list("sm_9x"), None);
    }

    #[test]
    fn only_files_that_name_load_inline_are_built_ahead() {
        assert!(wants_build(
            "from torch.utils.cpp_extension import load_inline"
        ));
        assert!(!wants_build("import triton\nclass ModelNew: pass"));
        assert!(wants_compile_step("import triton\nclass ModelNew: pass"));
        assert!(!wants_compile_step("import torch\nclass ModelNew: pass"));
    }

    #[test]
    fn only_plain_libraries_under_valid_keys_are_collected() {
        let d = tempfile::tempdir().expect("tmp");
        let key = "0123456789abcdef0123456789abcdef";
        std::fs::create_dir_all(d.path().join(key)).expect("mkdir");
        std::fs::write(d.path().join(key).join("ops.so"), b"lib").expect("write");
        std::fs::write(d.path().join(key).join("ops.o"), b"object").expect("write");
        std::fs::write(d.path().join(key).join(".hidden.so"), b"x").expect("write");
        std::os::unix::fs::symlink("/etc/passwd", d.path().join(key).join("link.so"))
            .expect("link");
        std::fs::create_dir_all(d.path().join("not-a-key")).expect("mkdir");
        std::fs::write(d.path().join("not-a-key").join("x.so"), b"x").expect("write");
        let mut log = String::new();
        let libs = collect(d.path(), &mut log);
        assert_eq!(libs.len(), 1, "{log}");
        assert_eq!((libs[0].key.as_str(), libs[0].name.as_str()), (key, "ops"));
        assert_eq!(libs[0].bytes, b"lib");
    }
}
