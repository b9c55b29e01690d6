//! A precompiled `torch/extension.h` for hosted `load_inline` builds (GCC's `.gch`).
//!
//! Every C++ file torch's `load_inline` writes begins with `#include <torch/extension.h>`,
//! and parsing that header is most of its compile (17 s of a trivial build on two cores;
//! 7 s with the header precompiled). So, when [`SandboxConfig::pch_dir`] is set (the
//! switch of NVRTC's precompiled headers too), the first hosted build to need it makes
//! one:
//!
//! - Its key ([`key`]) covers what the header depends on: [`HostedSetup::build_identity`]
//!   (torch's version, the python, the toolkit) and the host compiler the build jail runs
//!   (the `c++` its `PATH` resolves to: path, size, modification time). It lives in
//!   `pch_dir/torch-gch-<key>/torch/extension.h.gch`.
//! - The build that finds no folder for its key claims it (an `O_EXCL` lock file beside
//!   it, so two kilnd processes do not race) and runs `kiln_hosted.py gch` in a
//!   compile-role jail of its own, the way a hosted build runs (`kiln-worker
//!   hosted-runner`, the same filters, no GPU), with kiln's text only: a trivial
//!   `load_inline` gives torch's flags, and the header is compiled with them. That jail's
//!   file-size limit is [`MAX_GCH_BYTES`] (the file is about 800 MB). The file is checked
//!   (a plain file, one link, at most [`MAX_GCH_BYTES`]), made read-only and its folder
//!   renamed into place, so a partial header is never visible. A build that fails is
//!   logged and not tried again for [`RETRY_AFTER`]; it is never a verdict. Builds that
//!   find the lock taken build without the header meanwhile (no wait: the header takes
//!   about a minute).
//! - Later hosted build jails see the folder read-only at [`INSIDE`], with `CPATH`
//!   naming it: GCC looks for `torch/extension.h.gch` there before the header itself, and
//!   ignores one that does not fit (a mismatch costs time, never correctness). A stub
//!   `torch/extension.h` of kiln's ([`STUB`]) sits beside it: GCC opens the header in the
//!   `.gch`'s folder for a second `#include` of it (load_inline's file has its own first
//!   line, and most candidates repeat it), and that stub hands over to torch's. The `.cu`
//!   half of a CUDA `load_inline` goes through nvcc, which does not use it.
//! - At most [`MAX_FOLDERS`] such folders are kept (least recently used removed); NVRTC's
//!   eviction in [`crate::engine::cuda::pch`] only counts its own `.pch` files.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use kiln_types::{Candidate, Language};

use super::build::HostedBuild;
use super::setup::{HostedSetup, load_timeout, runner_env};
use crate::config::SandboxConfig;
use crate::engine::build_claim::{Claim, HeldBack};
use crate::jail::{self, Limits, Role};
use crate::jailed_worker::{JobDir, jail_spec};
use crate::protocol::{PROTOCOL_VERSION, Request, Response};

/// Where the header's folder appears inside a hosted build jail (read-only).
pub const INSIDE: &str = "/kiln/torch-gch";

/// The prefix of a header folder's name in `pch_dir`.
pub const FOLDER_PREFIX: &str = "torch-gch-";

/// The header's path under its folder (what `#include <torch/extension.h>` finds first).
pub const GCH_FILE: &str = "torch/extension.h.gch";

/// The header beside it, kiln's text: what GCC reads for an `#include <torch/extension.h>`
/// after the first (load_inline's `main.cpp` starts with one, and a file often has its own:
/// GCC then opens the header in the folder the `.gch` came from), or in place of a `.gch`
/// that does not fit. It hands over to torch's own header.
pub const STUB: &str = "#pragma once\n#include_next <torch/extension.h>\n";

/// Largest header installed, and the file-size limit of the jail that builds it.
pub const MAX_GCH_BYTES: u64 = 2 << 30;

/// Most header folders kept (one per torch version and compiler).
pub const MAX_FOLDERS: usize = 2;

/// How long a key whose build failed is not built again.
pub const RETRY_AFTER: Duration = Duration::from_secs(3600);

/// Where the build writes the header, under its scratch (the worker's `hosted-build`).
const OUT_IN_SCRATCH: &str = "hosted-build/gch";

/// Keys not to build again before [`RETRY_AFTER`] has passed.
static HELD_BACK: HeldBack = HeldBack::new();

/// The key of the header for `setup` built with `compiler` (its identity, [`compiler`]).
pub fn key(setup: &HostedSetup, compiler: &str) -> String {
    let mut h = blake3::Hasher::new();
    h.update(b"kiln torch gch 1\0");
    h.update(setup.build_identity().as_bytes());
    h.update(b"\0");
    h.update(compiler.as_bytes());
    h.finalize().to_hex()[..32].to_string()
}

/// The identity of the `c++` a hosted build jail runs for `setup` (the first on the
/// `PATH` [`runner_env`] gives it, links followed): path, size, modification time.
/// `None` when there is none.
pub fn compiler(setup: &HostedSetup) -> Option<String> {
    let env = runner_env(Path::new("/"), setup, false);
    let path = env.iter().find(|(k, _)| k == "PATH")?.1.clone();
    let cxx = std::env::split_paths(&path)
        .map(|d| d.join("c++"))
        .find(|p| p.is_file())?;
    let real = fs::canonicalize(&cxx).ok()?;
    let meta = fs::metadata(&real).ok()?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    Some(format!("{} {} {mtime}", real.display(), meta.len()))
}

/// The folder to put on a hosted build's `CPATH` (as this process sees it), building the
/// header first when this is the first build to need it (see the module docs). `None`:
/// headers off, no compiler, being built elsewhere, or a build that failed (logged).
pub fn ensure(cfg: &SandboxConfig, setup: &HostedSetup) -> Option<PathBuf> {
    let dir = cfg.pch_dir.as_ref()?;
    let compiler = compiler(setup)?;
    let key = key(setup, &compiler);
    if let Err(e) = fs::create_dir_all(dir) {
        tracing::warn!(dir = %dir.display(), "torch's precompiled header off: {e}");
        return None;
    }
    let dir = fs::canonicalize(dir).unwrap_or_else(|_| dir.clone());
    let folder = dir.join(format!("{FOLDER_PREFIX}{key}"));
    if installed(&folder) {
        touch(&folder);
        return Some(folder);
    }
    if HELD_BACK.held(&key) {
        return None;
    }
    let _claim = Claim::take(
        dir.join(format!(".{FOLDER_PREFIX}{key}.lock")),
        load_timeout(cfg.compile_timeout) * 2,
        "a torch header build",
    )?;
    if installed(&folder) {
        return Some(folder);
    }
    let started = Instant::now();
    match build(cfg, setup, &dir, &folder) {
        Ok(bytes) => {
            tracing::info!(
                key,
                bytes,
                ms = started.elapsed().as_millis() as u64,
                "torch's extension header precompiled"
            );
            evict(&dir, MAX_FOLDERS, &folder);
            Some(folder)
        }
        Err(why) => {
            HELD_BACK.hold(&key, RETRY_AFTER);
            tracing::warn!(key, "torch's extension header not precompiled: {why}");
            None
        }
    }
}

/// Whether `folder` holds a header and its stub (plain files).
fn installed(folder: &Path) -> bool {
    [GCH_FILE, "torch/extension.h"]
        .iter()
        .all(|f| fs::symlink_metadata(folder.join(f)).is_ok_and(|m| m.is_file()))
}

/// The build in a compile jail of its own; the header's size once installed in `folder`.
fn build(
    cfg: &SandboxConfig,
    setup: &HostedSetup,
    dir: &Path,
    folder: &Path,
) -> Result<u64, String> {
    let timeout = load_timeout(cfg.compile_timeout);
    let job = JobDir::new(cfg).map_err(|e| e.to_string())?;
    let limits = Limits {
        cpu_s: timeout.as_secs() + 2,
        nofile: 1024,
        nproc: 256,
        fsize_bytes: MAX_GCH_BYTES,
        as_bytes: Some(cfg.memory_limit_bytes.max(16 << 30)),
    };
    let mut spec =
        jail_spec(cfg, Role::Compile, false, &job, limits, "serve").map_err(|e| e.to_string())?;
    spec.ro_paths.extend(setup.ro_paths.iter().cloned());
    let scratch = spec.scratch.clone();
    let deadline = timeout + Duration::from_secs(10);
    let mut child = jail::spawn(&cfg.worker_exe, &spec, deadline).map_err(|e| e.to_string())?;
    // The worker's hosted build, in its header mode: no candidate's text reaches it.
    let request = Request::Compile {
        version: PROTOCOL_VERSION,
        candidate: Candidate {
            problem: "kiln-torch-gch".into(),
            language: Language::ModelNewCpu,
            source: String::new(),
            launches: Vec::new(),
            scratch: Vec::new(),
            flags: Vec::new(),
            parent: None,
            note: None,
        },
        cc: PathBuf::from("cc"),
        timeout_ms: timeout.as_millis() as u64,
        arch: None,
        include_dirs: Vec::new(),
        triton: None,
        hosted: Some(HostedBuild {
            setup: setup.clone(),
            arch: None,
            init_inputs: "[]".into(),
            cpath: None,
            make_gch: true,
        }),
        pch: None,
    };
    let reply = crate::jailed_worker::ask(&mut child, &request);
    let timed_out = child.timed_out();
    let ended = child.finish();
    if timed_out {
        return Err(format!("timed out after {:.0} s", deadline.as_secs_f64()));
    }
    let log = match reply {
        Ok((Response::Compiled { info, .. }, _)) => info.log,
        Ok((other, _)) => return Err(format!("unexpected answer {other:?}")),
        Err(e) => {
            return Err(crate::jailed_worker::no_answer(&e, &ended));
        }
    };
    let built = scratch.join(OUT_IN_SCRATCH);
    install(&built, dir, folder).map_err(|e| format!("{e}; build log: {}", tail(&log, 2000)))
}

/// The last `n` bytes of `s` (at a character boundary).
fn tail(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].trim()
}

/// Moves the header built under `from` (`from/torch/extension.h.gch`, checked: a plain
/// file with one link and 1 to [`MAX_GCH_BYTES`] bytes) into a new folder `folder` of
/// `dir`, read-only. The folder appears whole or not at all (a rename of a staged one).
/// The header's size.
fn install(from: &Path, dir: &Path, folder: &Path) -> Result<u64, String> {
    let file = from.join(GCH_FILE);
    let meta = fs::symlink_metadata(&file).map_err(|e| format!("no header from the build: {e}"))?;
    if !meta.is_file() || meta.nlink() != 1 {
        return Err("the build's header is not a plain file".into());
    }
    let bytes = meta.len();
    if bytes == 0 || bytes > MAX_GCH_BYTES {
        return Err(format!(
            "the build's header has {bytes} bytes (at most {MAX_GCH_BYTES})"
        ));
    }
    let name = folder
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stage = dir.join(format!(".{name}.{}.part", std::process::id()));
    let _ = fs::remove_dir_all(&stage);
    let staged = fs::create_dir_all(stage.join("torch"))
        .and_then(|()| move_file(&file, &stage.join(GCH_FILE)))
        .and_then(|()| fs::write(stage.join("torch/extension.h"), STUB))
        .and_then(|()| {
            fs::set_permissions(
                stage.join("torch/extension.h"),
                fs::Permissions::from_mode(0o444),
            )
        })
        .and_then(|()| fs::set_permissions(stage.join(GCH_FILE), fs::Permissions::from_mode(0o444)))
        .and_then(|()| fs::set_permissions(stage.join("torch"), fs::Permissions::from_mode(0o555)))
        .and_then(|()| fs::set_permissions(&stage, fs::Permissions::from_mode(0o555)))
        .and_then(|()| fs::rename(&stage, folder));
    if let Err(e) = staged {
        remove_folder(&stage);
        return Err(format!("install into {}: {e}", dir.display()));
    }
    Ok(bytes)
}

/// A rename, or a copy where `from` is on another filesystem.
fn move_file(from: &Path, to: &Path) -> std::io::Result<()> {
    match fs::rename(from, to) {
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => fs::copy(from, to).map(|_| ()),
        other => other,
    }
}

/// Removes a header folder (read-only inside: made writable first), best effort.
fn remove_folder(folder: &Path) {
    for d in [folder.to_path_buf(), folder.join("torch")] {
        let _ = fs::set_permissions(&d, fs::Permissions::from_mode(0o755));
    }
    if let Err(e) = fs::remove_dir_all(folder)
        && e.kind() != ErrorKind::NotFound
    {
        tracing::warn!(folder = %folder.display(), "cannot remove a precompiled header: {e}");
    }
}

/// Sets a folder's mtime to now (best effort): the least recently used go first.
fn touch(folder: &Path) {
    if let Ok(f) = fs::File::open(folder) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// Removes the least recently used header folders of `dir` (by mtime) until at most
/// `max` remain, never `keep`; also staged folders left over for more than an hour.
pub fn evict(dir: &Path, max: usize, keep: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut folders: Vec<(SystemTime, PathBuf)> = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let Ok(meta) = fs::symlink_metadata(e.path()) else {
            continue;
        };
        let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        if !meta.is_dir() {
            continue;
        }
        if name.starts_with(FOLDER_PREFIX) {
            folders.push((mtime, e.path()));
        } else if name.starts_with(&format!(".{FOLDER_PREFIX}"))
            && name.ends_with(".part")
            && mtime.elapsed().is_ok_and(|a| a > Duration::from_secs(3600))
        {
            remove_folder(&e.path());
        }
    }
    folders.sort();
    let mut count = folders.len();
    for (_, path) in &folders {
        if count <= max {
            break;
        }
        if path == keep {
            continue;
        }
        remove_folder(path);
        tracing::debug!(folder = %path.display(), "evicted a precompiled torch header");
        count -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(torch: &str, toolkit: Option<&str>) -> HostedSetup {
        HostedSetup {
            python: PathBuf::from("/opt/py/bin/python3"),
            torch_version: torch.into(),
            ro_paths: Vec::new(),
            toolkit: toolkit.map(PathBuf::from),
            ninja_dir: None,
        }
    }

    #[test]
    fn the_key_covers_torch_the_toolkit_and_the_compiler() {
        let base = key(&setup("2.5.0", None), "/usr/bin/g++-12 100 1");
        assert_eq!(base.len(), 32);
        assert!(base.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(base, key(&setup("2.5.0", None), "/usr/bin/g++-12 100 1"));
        for other in [
            key(&setup("2.6.0", None), "/usr/bin/g++-12 100 1"),
            key(
                &setup("2.5.0", Some("/usr/local/cuda")),
                "/usr/bin/g++-12 100 1",
            ),
            key(&setup("2.5.0", None), "/usr/bin/g++-12 100 2"),
            key(&setup("2.5.0", None), "/usr/bin/g++-13 100 1"),
        ] {
            assert_ne!(base, other);
        }
    }

    fn fake_folder(dir: &Path, i: u8, age_s: u64) -> PathBuf {
        let folder = dir.join(format!("{FOLDER_PREFIX}{}", format!("{i:02x}").repeat(16)));
        fs::create_dir_all(folder.join("torch")).expect("mkdir");
        fs::write(folder.join(GCH_FILE), b"gch").expect("write");
        fs::write(folder.join("torch/extension.h"), STUB).expect("write");
        fs::set_permissions(folder.join("torch"), fs::Permissions::from_mode(0o555))
            .expect("chmod");
        fs::File::open(&folder)
            .and_then(|f| f.set_modified(SystemTime::now() - Duration::from_secs(age_s)))
            .expect("mtime");
        folder
    }

    #[test]
    fn at_most_two_folders_are_kept_the_newest_and_nvrtcs_eviction_leaves_them() {
        let dir = tempfile::tempdir().expect("dir");
        let folders: Vec<PathBuf> = (0..4)
            .map(|i| fake_folder(dir.path(), i, 600 - u64::from(i) * 60))
            .collect();
        fs::write(dir.path().join("unrelated.txt"), "x").expect("other");
        // NVRTC's bound (no room at all) counts and deletes only its own files.
        crate::engine::cuda::pch::evict(dir.path(), 0, 0, Path::new("/none"));
        assert!(folders.iter().all(|f| installed(f)));
        // Ours: two remain, the newest and the one just built (even when it is the oldest).
        evict(dir.path(), MAX_FOLDERS, &folders[0]);
        let left: Vec<bool> = folders.iter().map(|f| f.exists()).collect();
        assert_eq!(left, [true, false, false, true]);
        assert!(dir.path().join("unrelated.txt").exists());
    }

    #[test]
    fn only_a_plain_bounded_header_is_installed_whole_and_read_only() {
        let dir = tempfile::tempdir().expect("dir");
        let from = dir.path().join("scratch");
        fs::create_dir_all(from.join("torch")).expect("mkdir");
        let folder = dir
            .path()
            .join(format!("{FOLDER_PREFIX}{}", "ab".repeat(16)));
        // No file, an empty one, a link: refused, and no folder appears.
        assert!(install(&from, dir.path(), &folder).is_err());
        fs::write(from.join(GCH_FILE), b"").expect("empty");
        assert!(install(&from, dir.path(), &folder).is_err());
        fs::remove_file(from.join(GCH_FILE)).expect("rm");
        std::os::unix::fs::symlink("/etc/passwd", from.join(GCH_FILE)).expect("link");
        assert!(install(&from, dir.path(), &folder).is_err());
        assert!(!folder.exists());
        fs::remove_file(from.join(GCH_FILE)).expect("rm");
        fs::write(from.join(GCH_FILE), b"gch").expect("write");
        assert_eq!(install(&from, dir.path(), &folder), Ok(3));
        assert!(installed(&folder));
        let mode = fs::metadata(folder.join(GCH_FILE))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o444);
        let stub = fs::read_to_string(folder.join("torch/extension.h")).expect("stub");
        assert_eq!(stub, STUB);
        // No staged folder is left behind.
        let names: Vec<String> = fs::read_dir(dir.path())
            .expect("list")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|n| n.ends_with(".part")), "{names:?}");
        remove_folder(&folder);
        assert!(!folder.exists());
    }
}
