//! The private root: a read-only tmpfs holding only the system directories the payload
//! needs, the scratch directory (the only writable place), and the payload's own binary.
//!
//! Runs inside the jail's own mount namespace, so nothing here is visible on the host.
//! Layout inside:
//!
//! ```text
//! /            tmpfs, remounted read-only after setup
//! /usr /lib …  read-only binds of the spec's `ro_paths` (symlinks recreated as symlinks)
//! /kiln/include/N   read-only binds of the spec's `ro_binds` at their fixed paths (a cuda
//!              compile's toolkit headers)
//! /dev/null, /dev/zero, /dev/urandom   binds of the host nodes
//! /kiln/<exe>  read-only bind of the payload binary
//! /scratch     read-write bind of the job's scratch directory
//! ```
//!
//! Hidden paths get an empty read-only tmpfs (directories) or `/dev/null` (files) on top,
//! wherever they are still visible.

use std::ffi::CStr;
use std::fs;
use std::path::{Path, PathBuf};

use super::sys;

/// Where things live inside the private root.
pub struct Inside {
    /// The payload binary.
    pub program: PathBuf,
    /// The scratch directory.
    pub scratch: PathBuf,
    /// Best-effort binds that were left out, and why.
    pub skipped: Vec<String>,
}

/// Extra binds: device nodes (writable) and read-only paths, both best effort, and
/// read-only binds at fixed paths (required).
pub struct Extra<'a> {
    /// Device nodes.
    pub devices: &'a [PathBuf],
    /// Read-only paths.
    pub ro: &'a [PathBuf],
    /// Read-only binds at another path: (host path, path inside).
    pub binds: &'a [(PathBuf, PathBuf)],
}

const TMPFS: &CStr = c"tmpfs";

fn step(what: &str, p: &Path, e: impl std::fmt::Display) -> String {
    format!("{what} {}: {e}", p.display())
}

/// Makes every mount private, so nothing below propagates to the host.
pub fn make_private() -> Result<(), String> {
    sys::mount(
        Path::new("none"),
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )
    .map_err(|e| step("make rprivate", Path::new("/"), e))
}

/// Bind-mounts `src` on `dst` and makes it read-only (keeping the flags the kernel locks).
fn bind(src: &Path, dst: &Path, read_only: bool) -> Result<(), String> {
    sys::mount(src, dst, None, libc::MS_BIND | libc::MS_REC, None)
        .map_err(|e| step("bind", src, e))?;
    let locked = sys::locked_mount_flags(src).map_err(|e| step("statvfs", src, e))?;
    let ro = if read_only { libc::MS_RDONLY } else { 0 };
    sys::mount(
        Path::new("none"),
        dst,
        None,
        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID | locked | ro,
        None,
    )
    .map_err(|e| step("remount", dst, e))
}

/// Creates what a bind of `src` needs at `dst`: a directory, an empty file, or (for a
/// symlink) the same symlink. Returns true if a bind is still needed.
fn prepare_target(src: &Path, dst: &Path) -> Result<bool, String> {
    let meta = fs::symlink_metadata(src).map_err(|e| step("stat", src, e))?;
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent).map_err(|e| step("mkdir", parent, e))?;
    }
    if meta.file_type().is_symlink() {
        let target = fs::read_link(src).map_err(|e| step("readlink", src, e))?;
        std::os::unix::fs::symlink(&target, dst).map_err(|e| step("symlink", dst, e))?;
        return Ok(false);
    }
    if meta.is_dir() {
        fs::create_dir_all(dst).map_err(|e| step("mkdir", dst, e))?;
    } else {
        fs::File::create(dst).map_err(|e| step("create", dst, e))?;
    }
    Ok(true)
}

/// `root` joined with an absolute `p`.
fn under(root: &Path, p: &Path) -> PathBuf {
    root.join(p.strip_prefix("/").unwrap_or(p))
}

/// Builds the private root on `root_dir` and pivots into it. After an `Err` before the
/// pivot the process still sees the host filesystem (the caller reports the layer off);
/// an `Err` after the pivot is fatal (see `helper`), flagged by `.1`.
pub fn enter_private_root(
    root_dir: &Path,
    scratch: &Path,
    program: &Path,
    ro_paths: &[PathBuf],
    extra: Extra,
) -> Result<Inside, (String, bool)> {
    let pre = |e: String| (e, false);
    sys::mount(
        Path::new("tmpfs"),
        root_dir,
        Some(TMPFS),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(c"size=16m,mode=0755"),
    )
    .map_err(|e| pre(step("mount tmpfs on", root_dir, e)))?;

    for p in ro_paths {
        if fs::symlink_metadata(p).is_err() {
            continue; // not on this system (e.g. /lib64 on some distributions)
        }
        let dst = under(root_dir, p);
        if prepare_target(p, &dst).map_err(pre)? {
            bind(p, &dst, true).map_err(pre)?;
        }
    }
    for (src, inside) in extra.binds {
        let dst = under(root_dir, inside);
        if prepare_target(src, &dst).map_err(pre)? {
            bind(src, &dst, true).map_err(pre)?;
        }
    }
    for node in ["/dev/null", "/dev/zero", "/dev/urandom"] {
        let src = Path::new(node);
        let dst = under(root_dir, src);
        if prepare_target(src, &dst).map_err(pre)? {
            bind(src, &dst, node != "/dev/null").map_err(pre)?;
        }
    }
    let mut skipped = Vec::new();
    let optional = extra
        .devices
        .iter()
        .map(|p| (p, false))
        .chain(extra.ro.iter().map(|p| (p, true)));
    for (p, read_only) in optional {
        if fs::symlink_metadata(p).is_err() {
            continue;
        }
        let dst = under(root_dir, p);
        let done = prepare_target(p, &dst).and_then(|need| {
            if need {
                bind(p, &dst, read_only)
            } else {
                Ok(())
            }
        });
        if let Err(e) = done {
            skipped.push(e);
        }
    }
    if !extra.devices.is_empty() {
        // A device worker (the CUDA driver) reads /proc/self/* and /proc/driver/nvidia and
        // may use POSIX shared memory: give it a fresh procfs of its own PID namespace
        // (no host processes in it) and a small private /dev/shm.
        let proc_in = root_dir.join("proc");
        fs::create_dir_all(&proc_in).map_err(|e| pre(step("mkdir", &proc_in, e)))?;
        if let Err(e) = sys::mount(
            Path::new("proc"),
            &proc_in,
            Some(c"proc"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            None,
        ) {
            skipped.push(step("mount proc on", &proc_in, e));
        }
        let shm_in = root_dir.join("dev/shm");
        fs::create_dir_all(&shm_in).map_err(|e| pre(step("mkdir", &shm_in, e)))?;
        if let Err(e) = sys::mount(
            Path::new("tmpfs"),
            &shm_in,
            Some(TMPFS),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            Some(c"size=64m,mode=1777"),
        ) {
            skipped.push(step("mount tmpfs on", &shm_in, e));
        }
    }
    let scratch_in = root_dir.join("scratch");
    fs::create_dir_all(&scratch_in).map_err(|e| pre(step("mkdir", &scratch_in, e)))?;
    bind(scratch, &scratch_in, false).map_err(pre)?;

    let name = program
        .file_name()
        .ok_or_else(|| pre(format!("program {} has no file name", program.display())))?;
    let program_in = root_dir.join("kiln").join(name);
    prepare_target(program, &program_in).map_err(pre)?;
    bind(program, &program_in, true).map_err(pre)?;

    let old = root_dir.join(".old");
    fs::create_dir_all(&old).map_err(|e| pre(step("mkdir", &old, e)))?;
    sys::pivot_root(root_dir, &old).map_err(|e| pre(step("pivot_root to", root_dir, e)))?;

    // From here on a failure would leave the host root reachable under /.old: fatal.
    let post = |e: String| (e, true);
    std::env::set_current_dir("/").map_err(|e| post(step("chdir", Path::new("/"), e)))?;
    sys::umount_detach(Path::new("/.old"))
        .map_err(|e| post(step("umount", Path::new("/.old"), e)))?;
    fs::remove_dir("/.old").map_err(|e| post(step("rmdir", Path::new("/.old"), e)))?;
    sys::mount(
        Path::new("none"),
        Path::new("/"),
        None,
        libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
        None,
    )
    .map_err(|e| post(step("remount read-only", Path::new("/"), e)))?;
    Ok(Inside {
        program: PathBuf::from("/kiln").join(name),
        scratch: PathBuf::from("/scratch"),
        skipped,
    })
}

/// Covers every hidden path that is visible: directories with an empty read-only tmpfs,
/// other files with `/dev/null`. Returns (covered, not visible).
pub fn hide(paths: &[PathBuf]) -> Result<(usize, usize), String> {
    let (mut covered, mut absent) = (0, 0);
    for p in paths {
        let Ok(meta) = fs::metadata(p) else {
            absent += 1;
            continue;
        };
        if meta.is_dir() {
            sys::mount(
                Path::new("tmpfs"),
                p,
                Some(TMPFS),
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                Some(c"size=4k,mode=0000"),
            )
            .map_err(|e| step("hide (tmpfs over)", p, e))?;
        } else {
            sys::mount(Path::new("/dev/null"), p, None, libc::MS_BIND, None)
                .map_err(|e| step("hide (/dev/null over)", p, e))?;
        }
        covered += 1;
    }
    Ok((covered, absent))
}
