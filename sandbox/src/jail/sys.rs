//! Small, readable wrappers around the raw OS calls the jail and the worker make.
//!
//! Each function does one call, turns `-1`/errno into `io::Error`, and carries the
//! `// SAFETY:` reasoning for its `unsafe` block, so that the callers read as a list of
//! steps. Functions marked "fork-safe" allocate nothing and may run between `fork` and
//! `exec`.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

/// Turns a libc return value into `io::Result` (fork-safe).
fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A path as a C string; a path with a NUL byte is an `InvalidInput` error.
pub fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// Closes every fd from `first` up (fork-safe).
pub fn close_fds_from(first: RawFd) -> io::Result<()> {
    // SAFETY: close_range only closes descriptors; the caller owns none of them anymore
    // (this runs at the start of a fresh process, or in a child about to exec).
    let ret = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0) };
    if ret == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// unshare(2) with the given `CLONE_NEW*` flags.
pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare takes plain flags and affects only the calling (single-threaded) process.
    check(unsafe { libc::unshare(flags) }).map(drop)
}

/// Sets the signal sent to this process when its parent thread dies (fork-safe).
pub fn set_parent_death_signal(sig: libc::c_int) -> io::Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number; no memory is passed.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) }).map(drop)
}

/// Drops every capability (fork-safe): clears the ambient set, empties the bounding set
/// as far as this process may (dropping needs CAP_SETPCAP, which a process without
/// capabilities has nothing to drop anyway), then sets the effective, permitted and
/// inheritable sets to nothing. Returns how many bounding-set entries were dropped.
pub fn drop_capabilities() -> io::Result<u32> {
    // SAFETY: prctl with integer arguments only. EINVAL (no ambient support) is fine.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    let mut dropped = 0;
    for cap in 0..64 {
        // SAFETY: integer arguments only; EINVAL past the last capability ends the loop.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if r == 0 {
            dropped += 1;
        } else if io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
            break;
        }
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset(2) reads a v3 header and two data structs, both valid for the call.
    check(unsafe {
        libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) as libc::c_int
    })?;
    Ok(dropped)
}

/// Sets `no_new_privs` (fork-safe).
pub fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integers only.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }).map(drop)
}

/// Adds `ADDR_NO_RANDOMIZE` to this process's execution domain, keeping the rest: the
/// next `execve` lays the program out without address-space randomization.
pub fn disable_aslr() -> io::Result<()> {
    const QUERY: libc::c_ulong = 0xffff_ffff;
    // SAFETY: personality takes an integer; 0xffffffff only reads the current value.
    let current = check(unsafe { libc::personality(QUERY) })?;
    let wanted = (current as libc::c_ulong) | libc::ADDR_NO_RANDOMIZE as libc::c_ulong;
    // SAFETY: as above; this sets the domain read just now with one more flag.
    check(unsafe { libc::personality(wanted) })?;
    // The call returns the previous domain even when it ignored the new one: read back.
    // SAFETY: as above.
    let now = check(unsafe { libc::personality(QUERY) })?;
    if now as libc::c_ulong & libc::ADDR_NO_RANDOMIZE as libc::c_ulong == 0 {
        return Err(io::Error::other(
            "the kernel kept address-space randomization on",
        ));
    }
    Ok(())
}

/// Sets soft and hard limit of one resource to `value` (fork-safe).
pub fn set_rlimit(resource: libc::__rlimit_resource_t, value: u64) -> io::Result<()> {
    set_rlimits(resource, value, value)
}

/// Sets the soft limit of one resource to `soft` and its hard limit to `hard` (fork-safe).
pub fn set_rlimits(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: `lim` is a valid rlimit that lives across the call.
    check(unsafe { libc::setrlimit(resource, &lim) }).map(drop)
}

/// The resolution of `CLOCK_MONOTONIC` (the clock behind `std::time::Instant`).
pub fn monotonic_resolution() -> io::Result<std::time::Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec that lives across the call.
    check(unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC, &mut ts) })?;
    Ok(std::time::Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    ))
}

/// mount(2). `fstype` and `data` are optional.
pub fn mount(
    source: &Path,
    target: &Path,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    let src = cstr(source)?;
    let dst = cstr(target)?;
    // SAFETY: every pointer is either null or a NUL-terminated string that outlives the call.
    check(unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            fstype.map_or(std::ptr::null(), CStr::as_ptr),
            flags,
            data.map_or(std::ptr::null(), |d| d.as_ptr().cast()),
        )
    })
    .map(drop)
}

/// The mount flags of the filesystem holding `path`, as `MS_*` bits that must be kept when
/// remounting a bind of it inside a user namespace (the kernel locks them).
pub fn locked_mount_flags(path: &Path) -> io::Result<libc::c_ulong> {
    let p = cstr(path)?;
    // SAFETY: statvfs is plain old data; zeroed is a valid initial value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `p` is NUL-terminated and `st` is a valid out-pointer.
    check(unsafe { libc::statvfs(p.as_ptr(), &mut st) })?;
    let pairs = [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
        (libc::ST_RDONLY, libc::MS_RDONLY),
    ];
    Ok(pairs
        .iter()
        .filter(|(st_bit, _)| st.f_flag & st_bit != 0)
        .fold(0, |acc, (_, ms)| acc | ms))
}

/// pivot_root(2).
pub fn pivot_root(new_root: &Path, put_old: &Path) -> io::Result<()> {
    let a = cstr(new_root)?;
    let b = cstr(put_old)?;
    // SAFETY: both pointers are NUL-terminated strings that outlive the call.
    let ret = unsafe { libc::syscall(libc::SYS_pivot_root, a.as_ptr(), b.as_ptr()) };
    if ret == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// umount2(2) with `MNT_DETACH`.
pub fn umount_detach(target: &Path) -> io::Result<()> {
    let t = cstr(target)?;
    // SAFETY: `t` is a NUL-terminated string that outlives the call.
    check(unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) }).map(drop)
}

/// What fork returned.
pub enum Forked {
    /// In the parent, with the child's pid.
    Parent(libc::pid_t),
    /// In the child.
    Child,
}

/// fork(2). Only call from a single-threaded process (the jail helper and kiln-worker are).
pub fn fork() -> io::Result<Forked> {
    // SAFETY: the callers are single-threaded processes (the jail helper, kiln-worker), so
    // the child inherits no lock held by another thread.
    let pid = check(unsafe { libc::fork() })?;
    Ok(if pid == 0 {
        Forked::Child
    } else {
        Forked::Parent(pid)
    })
}

/// execve(2); returns only on failure (fork-safe: the vectors are built beforehand).
pub fn execve(
    path: &CStr,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
) -> io::Error {
    debug_assert!(argv.last().is_some_and(|p| p.is_null()));
    debug_assert!(envp.last().is_some_and(|p| p.is_null()));
    // SAFETY: `path` is NUL-terminated, `argv` and `envp` are NULL-terminated arrays of
    // pointers to NUL-terminated strings that the caller keeps alive across the call.
    unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    io::Error::last_os_error()
}

/// Sends `sig` to a process (fork-safe).
pub fn kill(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: kill takes integers only.
    check(unsafe { libc::kill(pid, sig) }).map(drop)
}

/// Sends `sig` to a process group.
pub fn killpg(pgid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: killpg takes integers only.
    check(unsafe { libc::killpg(pgid, sig) }).map(drop)
}

/// waitpid(2), retrying on EINTR. Returns the raw status.
pub fn waitpid(pid: libc::pid_t, flags: libc::c_int) -> io::Result<(libc::pid_t, libc::c_int)> {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer.
        let ret = unsafe { libc::waitpid(pid, &mut status, flags) };
        if ret == -1 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok((ret, status));
    }
}

/// True if and only if `pid` has exited (without reaping it).
pub fn has_exited(pid: libc::pid_t) -> bool {
    // SAFETY: siginfo_t is plain old data; zeroed is valid.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid out-pointer; WNOWAIT leaves the child reapable.
    let ret = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: reading si_pid of a siginfo filled by waitid (0 when nothing is ready).
    ret == 0 && unsafe { info.si_pid() } != 0
}

/// A pipe with both ends close-on-exec: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 returned two fresh descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// dup2(2) (fork-safe). The new fd has close-on-exec cleared.
pub fn dup2(old: RawFd, new: RawFd) -> io::Result<()> {
    // SAFETY: dup2 takes integers only.
    check(unsafe { libc::dup2(old, new) }).map(drop)
}

/// Sets or clears O_NONBLOCK.
pub fn set_nonblocking(fd: &impl AsRawFd, on: bool) -> io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: F_GETFL takes no pointer.
    let flags = check(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    let flags = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    // SAFETY: F_SETFL takes an int.
    check(unsafe { libc::fcntl(fd, libc::F_SETFL, flags) }).map(drop)
}

/// poll(2) on `fds` (fd, events) for up to `timeout_ms`; returns the revents per fd.
pub fn poll(fds: &[(RawFd, libc::c_short)], timeout_ms: i32) -> io::Result<Vec<libc::c_short>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&(fd, events)| libc::pollfd {
            fd,
            events,
            revents: 0,
        })
        .collect();
    // SAFETY: `pfds` is a valid array of `pfds.len()` pollfd structs.
    let ret = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
    if ret == -1 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![0; fds.len()]);
        }
        return Err(e);
    }
    Ok(pfds.iter().map(|p| p.revents).collect())
}

/// read(2) into `buf`; `Ok(0)` is end of file; `WouldBlock` passes through.
pub fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for `buf.len()` bytes of writes.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// write(2) of all of `buf` (fork-safe, retries on EINTR and short writes).
pub fn write_all(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is valid for `buf.len()` bytes of reads.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// An anonymous memory file of `len` bytes (close-on-exec).
pub fn memfd(name: &CStr, len: u64) -> io::Result<OwnedFd> {
    // SAFETY: `name` is NUL-terminated; the flags are plain bits.
    let fd = check(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) })?;
    // SAFETY: memfd_create returned a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate takes an fd we own and a length.
    check(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) })?;
    Ok(fd)
}

/// A shared read-write mapping of a file descriptor, unmapped on drop.
pub struct SharedMap {
    ptr: *mut u8,
    len: usize,
}

impl SharedMap {
    /// Maps `len` bytes of `fd` shared and read-write.
    pub fn new(fd: RawFd, len: usize) -> io::Result<SharedMap> {
        // SAFETY: a fresh mapping at an address the kernel picks; `fd` is a valid descriptor
        // of at least `len` bytes (the caller sized it).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedMap {
            ptr: ptr.cast(),
            len,
        })
    }

    /// Base address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The bytes of `range`; panics if out of bounds, like slice indexing.
    ///
    /// The other process may be writing concurrently only while it runs; kiln reads and
    /// writes these bytes only while the runner is stopped (SIGSTOP) or before it starts.
    pub fn bytes(&self, range: std::ops::Range<usize>) -> &[u8] {
        assert!(range.start <= range.end && range.end <= self.len);
        // SAFETY: the range is inside the mapping (checked above); the mapping lives as
        // long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.add(range.start), range.len()) }
    }

    /// Mutable bytes of `range`; see [`SharedMap::bytes`].
    pub fn bytes_mut(&mut self, range: std::ops::Range<usize>) -> &mut [u8] {
        assert!(range.start <= range.end && range.end <= self.len);
        // SAFETY: the range is inside the mapping, and `&mut self` makes this the only
        // Rust reference to it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.len()) }
    }

    /// Makes `range` (page aligned) inaccessible, for guard pages.
    pub fn protect_none(&mut self, range: std::ops::Range<usize>) -> io::Result<()> {
        assert!(range.start <= range.end && range.end <= self.len);
        // SAFETY: the range lies inside our own mapping.
        check(unsafe {
            libc::mprotect(
                self.ptr.add(range.start).cast(),
                range.len(),
                libc::PROT_NONE,
            )
        })
        .map(drop)
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe a mapping created by `new` and not unmapped since.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The name of a signal (`SIGSEGV`), or `signal N`.
pub fn signal_name(sig: libc::c_int) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

/// Describes a raw wait status: `exited with status 3`, `killed by SIGSEGV`.
pub fn describe_status(status: libc::c_int) -> String {
    if libc::WIFEXITED(status) {
        format!("exited with status {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!("killed by {}", signal_name(libc::WTERMSIG(status)))
    } else {
        format!("wait status {status:#x}")
    }
}
