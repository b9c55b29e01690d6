//! Precompiled headers for cuda compiles, the sandbox's side: which compiles get one, the
//! folder they live in, who builds them, and what a compile's outcome says about them
//! (the NVRTC side is `kiln_gpu::cxx::pch`; docs/security.md, "Precompiled headers").
//!
//! - A cuda candidate whose leading `#include`s name at least one toolkit header (not only
//!   kiln's stand-ins) has a [`Plan`], when [`SandboxConfig::pch_dir`] is set and toolkit
//!   headers were found.
//! - Its key covers everything a PCH depends on: NVRTC's version, the worker executable
//!   (path, size, modification time), the library path, the headers' identity, the jail's
//!   layout (private root or not, the stack limit the jail inherits), the compile's full
//!   option list, kiln's in-memory headers and the prefix.
//! - The first compile that finds no file for its key and claims it (an `O_EXCL` lock file
//!   in the folder, so that two kilnd processes sharing it do not race) builds the PCH
//!   first: a compile-role jail of its own, the same executable started the same way
//!   (`serve --pch-heap`, address-space randomization off), given only the prefix's names,
//!   the candidate's allow-listed flags and the names of the headers kiln pre-includes —
//!   never the candidate's source. The file it writes in its scratch is checked (a plain
//!   file, one link, at most [`MAX_FILE_BYTES`]) and renamed into the folder, so a partial
//!   file is never visible there. A build that fails is logged and remembered for
//!   [`RETRY_AFTER`]; it is never a verdict. Compiles that find the lock taken compile
//!   without a PCH meanwhile.
//! - A compile jail of a planned candidate is started the same way and sees the folder
//!   read-only at [`INSIDE`]; when its key's file exists, the compile starts from it and its
//!   mtime is refreshed (least recently used files are evicted past [`MAX_FILES`] files or
//!   [`MAX_TOTAL_BYTES`]).
//! - A file NVRTC reports as invalid or made at another heap address is deleted (to be
//!   built again). A compile whose worker crashes while it uses a PCH is compiled again
//!   without one; when that one goes through, the file is deleted as suspect.
//!
//! Plain compiles (other languages, no toolkit header in the prefix) are untouched: no
//! bind, randomization on, no early heap mapping.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

pub use kiln_gpu::cxx::pch::Outcome;
use kiln_gpu::cxx::pch::{self, Prefix};
use kiln_gpu::cxx::{CandidateSource, candidate_options};
use kiln_types::Candidate;

use crate::config::SandboxConfig;
use crate::engine::build_claim::{Claim, HeldBack};
use crate::jail::{self, JailSpec, LayerStatus, Limits, Role};
use crate::jailed_worker::{JobDir, jail_spec};
use crate::protocol::{PROTOCOL_VERSION, Request, Response};

/// Where the PCH folder appears inside a compile jail (read-only).
pub const INSIDE: &str = "/kiln/pch";

/// The payload argument that makes `kiln-worker serve` map NVRTC's PCH heap first.
pub const HEAP_ARG: &str = "--pch-heap";

/// Most PCH files the folder keeps.
pub const MAX_FILES: usize = 16;

/// Most bytes the folder's PCH files take together.
pub const MAX_TOTAL_BYTES: u64 = 4 << 30;

/// Largest PCH file installed (NVRTC's default PCH heap is 256 MiB).
pub const MAX_FILE_BYTES: u64 = 512 << 20;

/// How long a key whose build failed (or whose file NVRTC rejected) is not built again.
pub const RETRY_AFTER: Duration = Duration::from_secs(3600);

/// Process-wide counts of compiles and builds (`kiln_cuda_pch_total` in kilnd's metrics).
static USED: AtomicU64 = AtomicU64::new(0);
static NOT_USED: AtomicU64 = AtomicU64::new(0);
static BUILT: AtomicU64 = AtomicU64::new(0);
static BUILD_FAILED: AtomicU64 = AtomicU64::new(0);

/// How many compiles used a PCH, and how many builds there were, since this process began.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Compiles that started from a PCH.
    pub used: u64,
    /// Compiles that were given a PCH and did not use it.
    pub not_used: u64,
    /// PCHs built and installed.
    pub built: u64,
    /// Builds that failed.
    pub build_failed: u64,
}

/// The counts so far.
pub fn counts() -> Counts {
    Counts {
        used: USED.load(Ordering::Relaxed),
        not_used: NOT_USED.load(Ordering::Relaxed),
        built: BUILT.load(Ordering::Relaxed),
        build_failed: BUILD_FAILED.load(Ordering::Relaxed),
    }
}

/// Keys not to build again before [`RETRY_AFTER`] has passed.
static HELD_BACK: HeldBack = HeldBack::new();

/// The private-root state the last PCH jail had (0 unknown, 1 without, 2 with): the guess
/// for the key a build looks up before it starts a jail.
static LAST_PRIVATE_ROOT: AtomicU8 = AtomicU8::new(0);

/// What a compile jail's layers say about PCHs: `Some(private_root)` when address-space
/// randomization was turned off (a PCH can be built or used), `None` otherwise.
pub fn layout(layers: &[LayerStatus]) -> Option<bool> {
    let aslr_off = layers.iter().any(|l| l.name == "aslr" && !l.active);
    let private_root = layers.iter().any(|l| l.name == "private-root" && l.active);
    if aslr_off {
        LAST_PRIVATE_ROOT.store(1 + u8::from(private_root), Ordering::Relaxed);
    }
    aslr_off.then_some(private_root)
}

/// A cuda candidate's PCH: its prefix and the folder.
#[derive(Debug, Clone)]
pub struct Plan {
    prefix: Prefix,
    dir: PathBuf,
}

/// A PCH a compile starts from.
#[derive(Debug, Clone)]
pub struct Chosen {
    /// Its key.
    pub key: String,
    /// The file, as this process sees it.
    pub file: PathBuf,
    /// The file, as the compile jail sees it.
    pub inside: PathBuf,
}

impl Plan {
    /// The plan for `candidate`, or `None` when it gets no PCH: PCHs off, no toolkit
    /// headers, no include prefix or one of kiln's stand-ins only, or a folder that cannot
    /// be made.
    pub fn for_candidate(cfg: &SandboxConfig, candidate: &Candidate) -> Option<Plan> {
        let dir = cfg.pch_dir.as_ref()?;
        if !cfg.cuda_headers.found() {
            return None;
        }
        let prefix = pch::prefix(&candidate.source).filter(Prefix::has_toolkit_header)?;
        if let Err(e) = fs::create_dir_all(dir) {
            tracing::warn!(dir = %dir.display(), "precompiled headers off: {e}");
            return None;
        }
        let dir = fs::canonicalize(dir).unwrap_or_else(|_| dir.clone());
        Some(Plan { prefix, dir })
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Starts a compile-role jail for this plan: randomization off, the heap mapped first,
    /// the folder shown read-only at [`INSIDE`].
    pub fn prepare(&self, spec: &mut JailSpec) {
        prepare_spec(spec);
        spec.ro_binds
            .push((self.dir.clone(), PathBuf::from(INSIDE)));
    }

    /// The key of `candidate`'s PCH in a jail with or without a private root (`None`
    /// when its options do not come out, or NVRTC is not here).
    pub fn key(
        &self,
        cfg: &SandboxConfig,
        candidate: &Candidate,
        private_root: bool,
    ) -> Option<String> {
        let include_dirs = include_dirs(cfg, private_root);
        let opts = options(cfg, candidate, &include_dirs).ok()?;
        let nvrtc = kiln_gpu::facts::nvrtc_version()?;
        let environment = environment(cfg, private_root);
        Some(pch::key(&pch::KeyInputs {
            nvrtc,
            environment: &environment,
            options: &opts.options,
            toolkit: !include_dirs.is_empty(),
            prefix: &self.prefix,
        }))
    }

    /// The PCH a compile jail with `layers` starts from: the file of its key, when it
    /// exists (its mtime refreshed: it was used last).
    pub fn choose(
        &self,
        cfg: &SandboxConfig,
        candidate: &Candidate,
        layers: &[LayerStatus],
    ) -> Option<Chosen> {
        let private_root = layout(layers)?;
        let key = self.key(cfg, candidate, private_root)?;
        let name = pch::file_name(&key);
        let file = self.dir.join(&name);
        let meta = fs::symlink_metadata(&file).ok()?;
        if !meta.is_file() {
            return None;
        }
        touch(&file);
        let inside = if private_root {
            Path::new(INSIDE).join(&name)
        } else {
            file.clone()
        };
        Some(Chosen { key, file, inside })
    }

    /// Builds the PCH of `candidate`'s prefix when there is none for its key yet, nobody
    /// else is building it, and no recent build of it failed. Returns whether a PCH was
    /// built. Never fails: a failed build is logged.
    pub fn ensure_built(&self, cfg: &SandboxConfig, candidate: &Candidate) -> bool {
        let guess = match LAST_PRIVATE_ROOT.load(Ordering::Relaxed) {
            1 => false,
            2 => true,
            _ => !cfg.disable_namespaces,
        };
        let Some(key) = self.key(cfg, candidate, guess) else {
            return false;
        };
        if self.dir.join(pch::file_name(&key)).exists() || HELD_BACK.held(&key) {
            return false;
        }
        let lock = self.dir.join(format!(".{}.lock", pch::file_name(&key)));
        let Some(_claim) = Claim::take(lock, stale_after(cfg), "a precompiled header build") else {
            // Another compile is building it (about a second): waiting for it costs less
            // than a cold compile, and spares the CPUs the build needs.
            let file = self.dir.join(pch::file_name(&key));
            let waited = wait_for(&file, WAIT_FOR_BUILD);
            tracing::debug!(key, waited, "precompiled header being built elsewhere");
            return false;
        };
        let started = Instant::now();
        match self.build(cfg, candidate, &key) {
            Ok(bytes) => {
                BUILT.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    key,
                    bytes,
                    ms = started.elapsed().as_millis() as u64,
                    includes = %self.prefix.text().trim_end().replace('\n', " "),
                    "precompiled header built"
                );
                evict(
                    &self.dir,
                    MAX_FILES,
                    MAX_TOTAL_BYTES,
                    &self.dir.join(pch::file_name(&key)),
                );
                true
            }
            Err(why) => {
                BUILD_FAILED.fetch_add(1, Ordering::Relaxed);
                HELD_BACK.hold(&key, RETRY_AFTER);
                tracing::warn!(key, "precompiled header not built: {why}");
                false
            }
        }
    }

    /// The build proper, in a compile jail of its own (see the module docs); the file's
    /// size.
    fn build(&self, cfg: &SandboxConfig, candidate: &Candidate, key: &str) -> Result<u64, String> {
        let job = JobDir::new(cfg).map_err(|e| e.to_string())?;
        let limits = compile_limits(cfg);
        let mut spec = jail_spec(cfg, Role::Compile, true, &job, limits, "serve")
            .map_err(|e| e.to_string())?;
        prepare_spec(&mut spec);
        let scratch = spec.scratch.clone();
        let deadline = cfg.compile_timeout + Duration::from_secs(10);
        let mut child = jail::spawn(&cfg.worker_exe, &spec, deadline).map_err(|e| e.to_string())?;
        let Some(private_root) = layout(&child.report.layers) else {
            child.finish();
            return Err("address-space randomization could not be turned off".into());
        };
        let actual = self.key(cfg, candidate, private_root);
        if actual.as_deref() != Some(key) {
            child.finish();
            return Err("the jail's layout differs from the one expected; built next time".into());
        }
        let name = pch::file_name(key);
        let out = if private_root {
            Path::new("/scratch").join(&name)
        } else {
            scratch.join(&name)
        };
        let include_dirs = include_dirs(cfg, private_root);
        let implied = options(cfg, candidate, &include_dirs)
            .map_err(|e| e.to_string())?
            .implied;
        let request = Request::BuildPch {
            version: PROTOCOL_VERSION,
            prefix: self.prefix.clone(),
            arch: cfg.cuda_arch.clone(),
            flags: candidate.flags.clone(),
            include_dirs,
            implied,
            out,
        };
        let reply = crate::jailed_worker::ask(&mut child, &request);
        let timed_out = child.timed_out();
        let ended = child.finish();
        if timed_out {
            return Err(format!("timed out after {:.0} s", deadline.as_secs_f64()));
        }
        match reply {
            Ok((Response::PchBuilt { ok: true, .. }, _)) => {
                install(&scratch.join(&name), &self.dir, &name)
            }
            Ok((Response::PchBuilt { message, .. }, _)) => Err(message),
            Ok((other, _)) => Err(format!("unexpected answer {other:?}")),
            Err(e) => Err(crate::jailed_worker::no_answer(&e, &ended)),
        }
    }
}

/// The options a compile of `candidate` gets with `include_dirs` (kiln's recipe, as the
/// worker will build them).
fn options(
    cfg: &SandboxConfig,
    candidate: &Candidate,
    include_dirs: &[PathBuf],
) -> Result<kiln_gpu::cxx::compile::CandidateOptions, kiln_gpu::nvrtc::CompileError> {
    candidate_options(&CandidateSource {
        source: &candidate.source,
        arch: &cfg.cuda_arch,
        flags: &candidate.flags,
        include_dirs,
        kernels: &[],
    })
}

/// Records what a compile given `chosen` says about it: counted; a file NVRTC rejected
/// is deleted (and not built again for a while).
pub fn record(chosen: &Chosen, outcome: Option<Outcome>) {
    let outcome = outcome.unwrap_or(Outcome::Unreported);
    if outcome == Outcome::Used {
        USED.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(key = %chosen.key, "compile used a precompiled header");
        return;
    }
    NOT_USED.fetch_add(1, Ordering::Relaxed);
    if outcome.file_is_bad() {
        tracing::warn!(
            key = %chosen.key,
            "{}: deleting the file",
            outcome.log_line()
        );
        discard(chosen);
    } else {
        tracing::debug!(key = %chosen.key, "{}", outcome.log_line());
    }
}

/// Deletes a PCH file found wanting (and holds its key back from being built again soon).
pub fn discard(chosen: &Chosen) {
    HELD_BACK.hold(&chosen.key, RETRY_AFTER);
    if let Err(e) = fs::remove_file(&chosen.file)
        && e.kind() != ErrorKind::NotFound
    {
        tracing::warn!(file = %chosen.file.display(), "cannot delete a precompiled header: {e}");
    }
}

/// A compile-role jail spec made for PCHs: randomization off, the heap mapped first.
fn prepare_spec(spec: &mut JailSpec) {
    spec.disable_aslr();
    if !spec.args.iter().any(|a| a == HEAP_ARG) {
        spec.args
            .insert(1.min(spec.args.len()), HEAP_ARG.to_string());
    }
}

/// The rlimits of a PCH build: a cuda compile's (`api::compile`'s for a compile given a
/// PCH), whose file-size limit is its address-space limit (NVRTC keeps the parse state in
/// a temporary file in the scratch while it makes a PCH, besides the PCH itself).
fn compile_limits(cfg: &SandboxConfig) -> Limits {
    let as_bytes = cfg.memory_limit_bytes.max(8 << 30);
    Limits {
        cpu_s: cfg.compile_timeout.as_secs() + 2,
        nofile: 256,
        nproc: 64,
        fsize_bytes: as_bytes.max(MAX_FILE_BYTES + (64 << 20)),
        as_bytes: Some(as_bytes),
    }
}

/// The include folders as a compile jail sees them.
fn include_dirs(cfg: &SandboxConfig, private_root: bool) -> Vec<PathBuf> {
    if private_root {
        cfg.cuda_headers.inside_paths()
    } else {
        cfg.cuda_headers.dirs.clone()
    }
}

/// What the compiling process is, for the key: the worker executable, the library path,
/// the headers, the jail's layout.
fn environment(cfg: &SandboxConfig, private_root: bool) -> String {
    let exe = fs::canonicalize(&cfg.worker_exe).unwrap_or_else(|_| cfg.worker_exe.clone());
    let (size, mtime) = fs::metadata(&exe).map_or((0, 0), |m| (m.len(), mtime_ns(&m)));
    let mut stack = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `stack` is a valid, writable rlimit.
    let _ = unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut stack) };
    format!(
        "worker {} {size} {mtime}; library path {}; headers {}; private root {private_root}; \
         stack {}; arch {}",
        exe.display(),
        cfg.library_path.as_deref().unwrap_or(""),
        cfg.cuda_headers.identity(),
        stack.rlim_cur,
        cfg.cuda_arch,
    )
}

fn mtime_ns(m: &fs::Metadata) -> u128 {
    m.modified()
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos())
}

/// Sets a file's mtime to now (best effort).
fn touch(file: &Path) {
    let done = fs::File::open(file).and_then(|f| f.set_modified(SystemTime::now()));
    if let Err(e) = done {
        tracing::debug!(file = %file.display(), "cannot refresh a precompiled header's mtime: {e}");
    }
}

/// How long a compile waits for a build of its key that another compile is doing (a build
/// took 1.1 s here and 2.2 s on a busy 16-CPU host) before it compiles without.
pub const WAIT_FOR_BUILD: Duration = Duration::from_secs(5);

/// Whether `file` exists within `limit` (checked every 20 ms).
fn wait_for(file: &Path, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    loop {
        if file.exists() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How long a build lock lives before it is taken for a crashed builder's.
fn stale_after(cfg: &SandboxConfig) -> Duration {
    cfg.compile_timeout * 2 + Duration::from_secs(60)
}

/// Moves the built file `from` (in a finished build's scratch) into `dir` as `name`,
/// read-only, after checking it: a plain file with one link and 1 to [`MAX_FILE_BYTES`]
/// bytes. The file appears in `dir` whole or not at all (a rename). Its size.
fn install(from: &Path, dir: &Path, name: &str) -> Result<u64, String> {
    let meta = fs::symlink_metadata(from).map_err(|e| format!("no file from the build: {e}"))?;
    if !meta.is_file() || meta.nlink() != 1 {
        return Err("the build's output is not a plain file".into());
    }
    let bytes = meta.len();
    if bytes == 0 || bytes > MAX_FILE_BYTES {
        return Err(format!(
            "the build's output has {bytes} bytes (at most {MAX_FILE_BYTES})"
        ));
    }
    let dest = dir.join(name);
    let read_only = fs::Permissions::from_mode(0o444);
    fs::set_permissions(from, read_only.clone()).map_err(|e| format!("chmod: {e}"))?;
    match fs::rename(from, &dest) {
        Ok(()) => Ok(bytes),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            // Another filesystem: copy beside the destination, then rename.
            let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
            let copied = fs::copy(from, &tmp)
                .and_then(|_| fs::set_permissions(&tmp, read_only))
                .and_then(|()| fs::rename(&tmp, &dest));
            if let Err(e) = copied {
                let _ = fs::remove_file(&tmp);
                return Err(format!("copy into {}: {e}", dir.display()));
            }
            Ok(bytes)
        }
        Err(e) => Err(format!("rename into {}: {e}", dir.display())),
    }
}

/// Deletes the least recently used PCH files of `dir` (by mtime) until at most
/// `max_files` remain and they take at most `max_bytes`, never `keep`; also removes copy
/// leftovers older than an hour.
pub fn evict(dir: &Path, max_files: usize, max_bytes: u64, keep: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let Ok(meta) = e.metadata() else { continue };
        let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        if pch::key_of(&name).is_some() && meta.is_file() {
            files.push((mtime, meta.len(), e.path()));
        } else if name.starts_with('.')
            && name.ends_with(".tmp")
            && mtime.elapsed().is_ok_and(|a| a > Duration::from_secs(3600))
        {
            let _ = fs::remove_file(e.path());
        }
    }
    files.sort();
    let mut count = files.len();
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    for (_, bytes, path) in &files {
        if count <= max_files && total <= max_bytes {
            break;
        }
        if path == keep {
            continue;
        }
        match fs::remove_file(path) {
            Ok(()) => tracing::debug!(file = %path.display(), "evicted a precompiled header"),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(file = %path.display(), "cannot evict a precompiled header: {e}");
                continue;
            }
        }
        count -= 1;
        total = total.saturating_sub(*bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(dir: &Path, i: u8, bytes: usize, age_s: u64) -> PathBuf {
        let p = dir.join(pch::file_name(&format!("{i:02x}").repeat(32)));
        fs::write(&p, vec![0u8; bytes]).expect("write");
        let f = fs::File::options().write(true).open(&p).expect("open");
        f.set_modified(SystemTime::now() - Duration::from_secs(age_s))
            .expect("mtime");
        p
    }

    #[test]
    fn eviction_keeps_the_newest_within_both_bounds() {
        let dir = tempfile::tempdir().expect("dir");
        let files: Vec<PathBuf> = (0..6)
            .map(|i| fake(dir.path(), i, 100, 600 - u64::from(i) * 60))
            .collect();
        fs::write(dir.path().join("unrelated.txt"), "x").expect("other");
        // By count: the two oldest go.
        evict(dir.path(), 4, u64::MAX, &files[5]);
        let left: Vec<bool> = files.iter().map(|f| f.exists()).collect();
        assert_eq!(left, [false, false, true, true, true, true]);
        // By bytes: 250 bytes leave room for two files of 100.
        evict(dir.path(), 16, 250, &files[5]);
        let left: Vec<bool> = files.iter().map(|f| f.exists()).collect();
        assert_eq!(left, [false, false, false, false, true, true]);
        // The one kept is kept even when it is the oldest.
        evict(dir.path(), 0, 0, &files[4]);
        assert!(files[4].exists() && !files[5].exists());
        assert!(dir.path().join("unrelated.txt").exists());
    }

    /// A compile that finds another building its header waits for the file: it sees one
    /// that appears (here, written by another thread) and gives up on one that never does.
    #[test]
    fn a_build_in_progress_is_waited_for_within_a_bound() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join(pch::file_name(&"ab".repeat(32)));
        let writer = {
            let file = file.clone();
            std::thread::spawn(move || fs::write(file, b"pch").expect("write"))
        };
        assert!(wait_for(&file, Duration::from_secs(60)));
        writer.join().expect("writer");
        let never = dir.path().join(pch::file_name(&"cd".repeat(32)));
        assert!(!wait_for(&never, Duration::from_millis(30)));
    }

    #[test]
    fn only_a_plain_bounded_file_is_installed() {
        let dir = tempfile::tempdir().expect("dir");
        let (from, into) = (dir.path().join("from"), dir.path().join("into"));
        fs::create_dir_all(&from).expect("from");
        fs::create_dir_all(&into).expect("into");
        let name = pch::file_name(&"cd".repeat(32));
        let built = from.join(&name);
        fs::write(&built, b"pch").expect("write");
        assert_eq!(install(&built, &into, &name), Ok(3));
        let meta = fs::metadata(into.join(&name)).expect("installed");
        assert_eq!(meta.permissions().mode() & 0o777, 0o444);
        assert!(!built.exists());
        // Empty, linked twice, a symlink: refused.
        fs::write(&built, b"").expect("empty");
        assert!(install(&built, &into, &name).is_err());
        fs::write(&built, b"x").expect("x");
        fs::hard_link(&built, from.join("other")).expect("link");
        assert!(install(&built, &into, &name).is_err());
        fs::remove_file(&built).expect("rm");
        std::os::unix::fs::symlink("/etc/passwd", &built).expect("symlink");
        assert!(install(&built, &into, &name).is_err());
    }

    #[test]
    fn the_layout_needs_randomization_off() {
        let on = |n: &str| LayerStatus::on(n, "");
        let off = |n: &str| LayerStatus::off(n, "");
        assert_eq!(layout(&[on("private-root")]), None);
        assert_eq!(layout(&[on("private-root"), on("aslr")]), None);
        assert_eq!(layout(&[on("private-root"), off("aslr")]), Some(true));
        assert_eq!(layout(&[off("private-root"), off("aslr")]), Some(false));
    }
}
