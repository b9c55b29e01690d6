//! Seccomp allow-lists, one per role, kept as data with the reason for every syscall.
//!
//! Roles (docs/security.md, sections 2 and 3):
//! - [`Role::Compile`]: kiln-worker plus the system compiler driver and its helpers
//!   (`cc1`, `as`, `ld`), or python running Triton's compiler and `ptxas`. Needs files
//!   and processes, never the network (no `socket` at all).
//! - [`Role::Worker`]: kiln-worker evaluating. Spawns runners, maps the shared buffers,
//!   stops and resumes runners. The runners inherit this filter and add their own.
//! - [`Role::GpuWorker`]: kiln-worker evaluating on a GPU. The CUDA driver's needs are
//!   large and version-dependent, so this is a deny-list ([`GPU_DENY`]): ptrace, mount,
//!   namespaces, bpf, perf, keyrings, io_uring, userfaultfd, kexec, modules, clock
//!   setting and file handles are refused; the rest is allowed. Candidate code on the GPU
//!   cannot make syscalls; this guards against the trusted worker being subverted
//!   through the driver.
//! - [`Role::PluginHost`]: `kiln-plugin-host` running a proposer in wasmtime. An
//!   allow-list ([`PLUGIN_HOST`]) written from what the host does (strace of every
//!   proposer and abuse plugin): JIT mappings, threads (`clone` only with the thread
//!   flags, so no new processes), signals for traps, clocks, read-only `openat`, and
//!   Unix sockets only (`socket`/`socketpair` with `AF_UNIX`; every other family fails).
//!   The guest itself cannot make syscalls; this guards against a wasmtime escape.
//! - [`Role::Runner`]: candidate code. Two filters stacked by the runner itself:
//!   [`RUNNER_LOADER`] while `dlopen` maps the artifact (read-only `openat` allowed), then
//!   [`RUNNER`] once the symbols are resolved: no open, no fork/clone, no exec, no socket,
//!   no kill, no ptrace, no sigaction, no mprotect. Anything else traps (SIGSYS) and the
//!   runner's handler names the syscall.
//!
//! Compile, worker and plugin-host filters answer a forbidden call with `ENOSYS` rather
//! than killing: glibc then falls back from new calls (`clone3`, `faccessat2`) to older
//! allowed ones, and a compiler that probes for an optional feature carries on.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use super::Role;

/// The runner's fixed descriptors (see `engine::host::runner`).
pub mod runner_fds {
    /// Commands from the worker (`G`, `E`, `Q`) and the setup frame.
    pub const GO: i32 = 3;
    /// Answers to the worker (`D`) and the ready frame.
    pub const DONE: i32 = 4;
    /// Where the SIGSYS handler names a forbidden syscall.
    pub const FAULT: i32 = 5;
    /// The memfd holding tensors and scratch.
    pub const MEM: i32 = 6;
}

/// An argument condition on an allowed syscall.
#[derive(Debug, Clone, Copy)]
pub enum Cond {
    /// No condition.
    Any,
    /// Argument `.0` (a 64-bit value) has none of the bits in `.1` set.
    NoBits(u8, u64),
    /// Argument `.0` (a 64-bit value), masked with `.1`, equals `.2`: some bits set, others
    /// clear.
    Masked(u8, u64, u64),
    /// Argument `.0` (a 32-bit value) equals one of the values.
    OneOf(u8, &'static [u64]),
    /// Argument `.0` is this process's own pid.
    SelfPid(u8),
    /// Argument `.0` is not this process's own pid (a deny-list's "any other process").
    NotSelfPid(u8),
}

/// One allowed syscall and why.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// Syscall number (libc::SYS_*).
    pub nr: i64,
    /// Name, for reports.
    pub name: &'static str,
    /// Why it is allowed.
    pub why: &'static str,
    /// Argument condition.
    pub cond: Cond,
}

macro_rules! allow {
    ($sys:ident, $why:literal) => {
        allow!($sys, $why, Cond::Any)
    };
    ($sys:ident, $why:literal, $cond:expr) => {
        Rule {
            nr: libc::$sys as i64,
            name: stringify!($sys),
            why: $why,
            cond: $cond,
        }
    };
}

/// Each namespace flag alone (a deny-list needs one rule per flag: any one set is refused).
const NEWNS: u64 = libc::CLONE_NEWNS as u64;
const NEWUSER: u64 = libc::CLONE_NEWUSER as u64;
const NEWPID: u64 = libc::CLONE_NEWPID as u64;
const NEWNET: u64 = libc::CLONE_NEWNET as u64;
const NEWIPC: u64 = libc::CLONE_NEWIPC as u64;
const NEWUTS: u64 = libc::CLONE_NEWUTS as u64;
const NEWCGROUP: u64 = libc::CLONE_NEWCGROUP as u64;

/// Namespace-creating clone flags: never allowed to a jailed process.
const NS_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP) as u64;

/// open flags that write or create.
const WRITE_FLAGS: u64 =
    (libc::O_WRONLY | libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC | libc::O_APPEND) as u64;

/// Harmless ioctls used by compilers and stdio: terminal queries (isatty, window size),
/// bytes readable, and close-on-exec on one's own descriptor (python sets it with
/// `FIOCLEX` on every file it opens, and fails the open when that is refused).
const TTY_IOCTLS: &[u64] = &[
    libc::TCGETS,
    libc::TIOCGWINSZ,
    libc::FIONREAD,
    libc::FIOCLEX,
    libc::FIONCLEX,
];

/// prctl options a trusted kiln process uses on itself.
const PRCTL_OPTIONS: &[u64] = &[
    libc::PR_SET_DUMPABLE as u64,
    libc::PR_SET_PDEATHSIG as u64,
    libc::PR_SET_NO_NEW_PRIVS as u64,
    libc::PR_SET_NAME as u64,
    libc::PR_GET_NAME as u64,
    libc::PR_SET_SECCOMP as u64,
];

/// Syscalls every trusted kiln-worker process makes (Rust std, glibc start-up, pipes).
pub const BASE: &[Rule] = &[
    allow!(SYS_read, "protocol pipes, files"),
    allow!(SYS_write, "protocol pipes, logs, files in scratch"),
    allow!(SYS_readv, "glibc stdio"),
    allow!(SYS_writev, "glibc stdio"),
    allow!(SYS_pread64, "dynamic loader reads ELF headers"),
    allow!(SYS_pwrite64, "linker output"),
    allow!(SYS_lseek, "file offsets"),
    allow!(
        SYS_openat,
        "open files; the private root holds only /usr, /lib and scratch"
    ),
    allow!(SYS_close, "close descriptors"),
    allow!(SYS_close_range, "close inherited descriptors before exec"),
    allow!(SYS_fstat, "file metadata"),
    allow!(SYS_newfstatat, "file metadata (glibc fstat/stat)"),
    allow!(SYS_statx, "file metadata (Rust std)"),
    allow!(SYS_faccessat, "access(2) for tool lookup"),
    allow!(SYS_faccessat2, "access(2) for tool lookup"),
    allow!(SYS_readlinkat, "resolve tool paths"),
    allow!(SYS_getcwd, "current directory"),
    allow!(SYS_chdir, "enter scratch"),
    allow!(SYS_getdents64, "list directories"),
    allow!(SYS_mkdirat, "create directories in scratch"),
    allow!(SYS_unlinkat, "remove temporary files"),
    allow!(SYS_renameat, "move temporary files"),
    allow!(SYS_renameat2, "move temporary files"),
    allow!(SYS_ftruncate, "size files and memfds"),
    allow!(SYS_fchmod, "linker marks its output executable"),
    allow!(SYS_fchmodat, "linker marks its output executable"),
    allow!(SYS_umask, "compiler driver sets its umask"),
    allow!(SYS_fcntl, "descriptor flags"),
    allow!(SYS_dup, "descriptor plumbing"),
    allow!(SYS_dup2, "descriptor plumbing for children"),
    allow!(SYS_dup3, "descriptor plumbing for children"),
    allow!(SYS_pipe2, "pipes to children"),
    allow!(SYS_poll, "wait on pipes with a deadline"),
    allow!(SYS_ppoll, "wait on pipes with a deadline"),
    allow!(
        SYS_ioctl,
        "terminal queries only",
        Cond::OneOf(1, TTY_IOCTLS)
    ),
    allow!(SYS_brk, "heap"),
    allow!(SYS_mmap, "heap, loader, shared buffers"),
    allow!(SYS_munmap, "heap, loader, shared buffers"),
    allow!(SYS_mremap, "heap growth"),
    allow!(SYS_mprotect, "loader sets segment permissions; guard pages"),
    allow!(SYS_madvise, "allocator returns memory"),
    allow!(
        SYS_rt_sigaction,
        "signal handlers (Rust std, runner SIGSYS handler)"
    ),
    allow!(SYS_rt_sigprocmask, "signal masks around fork"),
    allow!(SYS_rt_sigreturn, "return from a signal handler"),
    allow!(SYS_sigaltstack, "Rust std stack-overflow guard"),
    allow!(SYS_exit, "thread exit"),
    allow!(SYS_exit_group, "process exit"),
    allow!(SYS_getpid, "own pid"),
    allow!(SYS_getppid, "parent pid (parent-death race check)"),
    allow!(SYS_gettid, "own tid"),
    allow!(SYS_getuid, "identity queries"),
    allow!(SYS_geteuid, "identity queries"),
    allow!(SYS_getgid, "identity queries"),
    allow!(SYS_getegid, "identity queries"),
    allow!(
        SYS_uname,
        "compiler driver and glibc query the kernel version"
    ),
    allow!(SYS_sysinfo, "compiler sizes its caches from memory"),
    allow!(SYS_getrusage, "compiler time reports"),
    allow!(SYS_getrlimit, "stack size queries"),
    allow!(
        SYS_prlimit64,
        "lower own limits (runner); raising above the hard limit is impossible"
    ),
    allow!(SYS_clock_gettime, "clocks (usually vDSO)"),
    allow!(SYS_clock_getres, "clocks"),
    allow!(SYS_gettimeofday, "clocks"),
    allow!(SYS_nanosleep, "sleep"),
    allow!(SYS_clock_nanosleep, "sleep"),
    allow!(SYS_futex, "locks"),
    allow!(SYS_set_robust_list, "glibc start-up"),
    allow!(SYS_set_tid_address, "glibc start-up"),
    allow!(SYS_rseq, "glibc start-up"),
    allow!(SYS_arch_prctl, "glibc start-up (TLS)"),
    allow!(SYS_getrandom, "hash seeds, malloc"),
    allow!(SYS_sched_getaffinity, "CPU count"),
    allow!(SYS_sched_yield, "spin loops"),
    allow!(
        SYS_prctl,
        "own parent-death signal, no_new_privs, name",
        Cond::OneOf(0, PRCTL_OPTIONS)
    ),
    allow!(
        SYS_seccomp,
        "runners stack stricter filters (a filter can only narrow)"
    ),
    allow!(
        SYS_clone,
        "spawn children; namespace flags refused",
        Cond::NoBits(0, NS_FLAGS)
    ),
    allow!(SYS_vfork, "posix_spawn fallback"),
    allow!(SYS_execve, "exec the compiler or a runner"),
    allow!(
        SYS_setpgid,
        "put the compiler in its own process group, to kill it as a whole"
    ),
    allow!(SYS_wait4, "reap children"),
    allow!(SYS_waitid, "reap children"),
];

/// Extra syscalls of the compilers: the system compiler (gcc driver, cc1, as, ld), and
/// python running Triton's compiler (which runs `ptxas`).
pub const COMPILE_EXTRA: &[Rule] = &[
    allow!(SYS_fork, "compiler driver"),
    allow!(SYS_access, "compiler driver tool lookup"),
    allow!(SYS_readlink, "compiler driver resolves its prefix"),
    allow!(SYS_stat, "legacy stat in binutils"),
    allow!(SYS_lstat, "legacy lstat in binutils"),
    allow!(SYS_open, "legacy open in binutils"),
    allow!(SYS_unlink, "remove temporary files"),
    allow!(SYS_rename, "move temporary files"),
    allow!(SYS_mkdir, "create temporary directories"),
    allow!(SYS_chmod, "linker marks its output executable"),
    allow!(SYS_fadvise64, "linker read-ahead hints"),
    allow!(SYS_fallocate, "linker preallocates output"),
    allow!(SYS_utimensat, "touch outputs"),
    allow!(SYS_kill, "compiler driver stops its helpers on error"),
    allow!(SYS_tgkill, "abort()"),
    allow!(
        SYS_rmdir,
        "remove temporary directories (python's tempfile)"
    ),
    allow!(
        SYS_epoll_create1,
        "python's selectors (Triton waiting on ptxas)"
    ),
    allow!(SYS_epoll_ctl, "python's selectors"),
    allow!(SYS_epoll_wait, "python's selectors"),
    allow!(SYS_epoll_pwait, "python's selectors"),
    allow!(
        SYS_sched_get_priority_max,
        "thread pools query the priority range"
    ),
    allow!(
        SYS_sched_get_priority_min,
        "thread pools query the priority range"
    ),
];

/// Extra syscalls of the evaluating worker.
pub const WORKER_EXTRA: &[Rule] = &[
    allow!(SYS_memfd_create, "shared tensor buffers"),
    allow!(SYS_kill, "stop, resume and kill its own runners"),
    allow!(SYS_tgkill, "abort()"),
    allow!(SYS_setrlimit, "runner lowers its own limits"),
];

/// The runner after `dlopen`: candidate code runs under this.
pub const RUNNER: &[Rule] = &[
    allow!(
        SYS_read,
        "commands from the worker, go pipe only",
        Cond::OneOf(0, &[runner_fds::GO as u64])
    ),
    allow!(
        SYS_write,
        "answers (done, fault) and stdout/stderr, which the worker caps",
        Cond::OneOf(
            0,
            &[1, 2, runner_fds::DONE as u64, runner_fds::FAULT as u64]
        )
    ),
    allow!(SYS_exit, "exit"),
    allow!(SYS_exit_group, "exit"),
    allow!(SYS_rt_sigreturn, "return from the SIGSYS handler path"),
    allow!(
        SYS_rt_sigprocmask,
        "abort() masks signals before raising SIGABRT"
    ),
    allow!(
        SYS_tgkill,
        "raise() on itself only (abort)",
        Cond::SelfPid(0)
    ),
    allow!(SYS_getpid, "raise() looks up its pid"),
    allow!(SYS_gettid, "raise() looks up its tid"),
    allow!(SYS_brk, "malloc"),
    allow!(SYS_mmap, "malloc of large blocks"),
    allow!(SYS_munmap, "free of large blocks"),
    allow!(SYS_mremap, "realloc of large blocks"),
    allow!(SYS_madvise, "free returns memory"),
    allow!(SYS_fstat, "stdio sizes its buffer"),
    allow!(SYS_newfstatat, "stdio sizes its buffer (glibc fstat)"),
    allow!(SYS_lseek, "stdio flush"),
    allow!(SYS_futex, "stdio locks (uncontended: one thread)"),
    allow!(SYS_clock_gettime, "clocks (usually vDSO)"),
    allow!(SYS_gettimeofday, "clocks (usually vDSO)"),
    allow!(SYS_nanosleep, "sleep: bounded by the run timeout"),
    allow!(SYS_clock_nanosleep, "sleep: bounded by the run timeout"),
    allow!(SYS_sched_yield, "spin loops"),
];

/// `clone` flags of a new thread (glibc's `pthread_create`): same memory, same signal
/// handlers, same thread group.
const THREAD_FLAGS: u64 = (libc::CLONE_VM | libc::CLONE_SIGHAND | libc::CLONE_THREAD) as u64;

/// prctl options of the plugin host: thread names only.
const PLUGIN_HOST_PRCTL: &[u64] = &[libc::PR_SET_NAME as u64, libc::PR_GET_NAME as u64];

/// Socket families the plugin host may open: Unix only (kilnd's socket, and the
/// `socketpair` tokio uses as a wake-up channel).
const UNIX_ONLY: &[u64] = &[libc::AF_UNIX as u64];

/// `kiln-plugin-host`: wasmtime compiling and running one proposer, talking HTTP to kilnd
/// over its Unix socket. Written from `strace -f` of the host running every bundled
/// proposer and every abuse mode (loop, memory bomb, trap, host calls, refused imports),
/// so an allow-list is practical here, unlike the CUDA driver's [`GPU_DENY`].
/// Deliberately absent: process creation (`fork`, `vfork`, `clone` without the thread
/// flags, `clone3`, which glibc falls back from), `kill`, `ptrace`, writing `openat`,
/// `bind`/`listen`/`accept`, `mount` and namespaces, `bpf`, io_uring, keyrings.
pub const PLUGIN_HOST: &[Rule] = &[
    allow!(
        SYS_read,
        "the token, the plugin, ELF headers, kilnd's answers"
    ),
    allow!(
        SYS_write,
        "the report on stdout, logs on stderr, requests, memory images"
    ),
    allow!(SYS_readv, "glibc stdio"),
    allow!(SYS_writev, "glibc stdio"),
    allow!(SYS_pread64, "dynamic loader reads ELF headers"),
    allow!(SYS_lseek, "file offsets"),
    allow!(
        SYS_openat,
        "the dynamic loader's libraries, the token and the plugin, read-only",
        Cond::NoBits(2, WRITE_FLAGS)
    ),
    allow!(SYS_close, "close descriptors"),
    allow!(SYS_fstat, "file metadata"),
    allow!(SYS_newfstatat, "file metadata (glibc fstat/stat)"),
    allow!(SYS_statx, "file metadata (Rust std)"),
    allow!(SYS_access, "the dynamic loader checks /etc/ld.so.preload"),
    allow!(SYS_faccessat, "access(2)"),
    allow!(SYS_faccessat2, "access(2)"),
    allow!(SYS_readlinkat, "resolve paths"),
    allow!(SYS_getcwd, "current directory"),
    allow!(SYS_fcntl, "descriptor flags, sealing memory images"),
    allow!(SYS_dup, "descriptor plumbing"),
    allow!(SYS_dup3, "descriptor plumbing"),
    allow!(SYS_poll, "Rust std checks fds 0-2 at start"),
    allow!(SYS_ppoll, "waits with a deadline"),
    allow!(
        SYS_ioctl,
        "terminal queries only",
        Cond::OneOf(1, TTY_IOCTLS)
    ),
    allow!(SYS_brk, "heap"),
    allow!(
        SYS_mmap,
        "heap, linear memories and their guard regions, compiled code"
    ),
    allow!(SYS_munmap, "free mappings"),
    allow!(SYS_mremap, "heap growth"),
    allow!(
        SYS_mprotect,
        "JIT: compiled code made executable, linear memory grown, guard pages"
    ),
    allow!(SYS_madvise, "linear memories reset and returned"),
    allow!(
        SYS_memfd_create,
        "copy-on-write images of the plugin's initial memory"
    ),
    allow!(SYS_ftruncate, "size memory images"),
    allow!(
        SYS_membarrier,
        "instruction-cache coherence after JIT (some architectures)"
    ),
    allow!(
        SYS_rt_sigaction,
        "wasmtime's trap handlers (SIGSEGV, SIGILL, SIGFPE, SIGBUS)"
    ),
    allow!(SYS_rt_sigprocmask, "signal masks of threads"),
    allow!(SYS_rt_sigreturn, "return from a trap handler"),
    allow!(SYS_sigaltstack, "trap handlers run on an alternate stack"),
    allow!(SYS_tgkill, "abort() on itself only", Cond::SelfPid(0)),
    allow!(SYS_exit, "thread exit"),
    allow!(SYS_exit_group, "process exit"),
    allow!(SYS_getpid, "own pid"),
    allow!(SYS_gettid, "own tid"),
    allow!(SYS_getuid, "identity queries"),
    allow!(SYS_geteuid, "identity queries"),
    allow!(SYS_getgid, "identity queries"),
    allow!(SYS_getegid, "identity queries"),
    allow!(SYS_uname, "glibc queries the kernel version"),
    allow!(SYS_getrlimit, "stack size queries"),
    allow!(
        SYS_prlimit64,
        "own stack limit (Rust std); the jail sets soft = hard, so nothing can be raised",
        Cond::OneOf(0, &[0])
    ),
    allow!(SYS_clock_gettime, "clocks (usually vDSO)"),
    allow!(SYS_clock_getres, "clocks"),
    allow!(SYS_gettimeofday, "clocks"),
    allow!(SYS_nanosleep, "the epoch ticker and the watchdog sleep"),
    allow!(
        SYS_clock_nanosleep,
        "the epoch ticker and the watchdog sleep"
    ),
    allow!(SYS_futex, "locks, thread joins"),
    allow!(SYS_set_robust_list, "glibc thread start-up"),
    allow!(SYS_set_tid_address, "glibc start-up"),
    allow!(SYS_rseq, "glibc thread start-up"),
    allow!(SYS_arch_prctl, "glibc start-up (TLS)"),
    allow!(SYS_getrandom, "hash seeds"),
    allow!(SYS_sched_getaffinity, "CPU count (tokio's worker threads)"),
    allow!(SYS_sched_yield, "spin loops"),
    allow!(SYS_prctl, "thread names", Cond::OneOf(0, PLUGIN_HOST_PRCTL)),
    allow!(
        SYS_clone,
        "threads only (epoch ticker, watchdog, tokio): no new process, no namespace",
        Cond::Masked(0, THREAD_FLAGS | NS_FLAGS, THREAD_FLAGS)
    ),
    allow!(
        SYS_execve,
        "the jail's last step execs the host (no fork: it can only replace itself)"
    ),
    allow!(
        SYS_socket,
        "a Unix socket to kilnd; any other family fails",
        Cond::OneOf(0, UNIX_ONLY)
    ),
    allow!(
        SYS_socketpair,
        "tokio's wake-up channel (Unix only)",
        Cond::OneOf(0, UNIX_ONLY)
    ),
    allow!(SYS_connect, "connect to kilnd's socket"),
    allow!(SYS_sendto, "requests to kilnd"),
    allow!(SYS_recvfrom, "answers from kilnd"),
    allow!(SYS_sendmsg, "requests to kilnd"),
    allow!(SYS_recvmsg, "answers from kilnd"),
    allow!(SYS_setsockopt, "socket timeouts"),
    allow!(SYS_getsockopt, "socket errors"),
    allow!(SYS_shutdown, "end a request"),
    allow!(SYS_epoll_create1, "tokio's I/O driver (wasmtime-wasi)"),
    allow!(SYS_epoll_ctl, "tokio's I/O driver"),
    allow!(SYS_epoll_wait, "tokio's I/O driver"),
    allow!(SYS_epoll_pwait, "tokio's I/O driver"),
    allow!(SYS_eventfd2, "tokio's waker"),
];

/// Added to [`RUNNER`] while the dynamic loader maps the artifact and its libraries.
pub const RUNNER_LOADER: &[Rule] = &[
    allow!(
        SYS_openat,
        "loader opens the artifact and libm, read-only",
        Cond::NoBits(2, WRITE_FLAGS)
    ),
    allow!(SYS_read, "loader reads ELF headers"),
    allow!(SYS_pread64, "loader reads ELF headers"),
    allow!(SYS_close, "loader closes what it opened"),
    allow!(SYS_mprotect, "loader sets segment permissions"),
    allow!(SYS_getrandom, "malloc start-up"),
    allow!(
        SYS_prctl,
        "no_new_privs before the strict stage is loaded",
        Cond::OneOf(0, &[libc::PR_SET_NO_NEW_PRIVS as u64])
    ),
    allow!(
        SYS_seccomp,
        "load the strict stage (a filter can only narrow)"
    ),
];

/// What the GPU worker may NOT do. The CUDA driver's syscall needs are large, vary by
/// driver version and fail opaquely (`CUDA_ERROR_OPERATING_SYSTEM` from the first context
/// on the H200 under an allow-list, 2026-11-30), so the GPU worker's filter
/// is a deny-list: everything that would let a subverted worker reach past its jail is
/// refused; the rest is allowed. Candidate code never runs on the worker's CPU: it runs
/// on the GPU, launched by the worker.
pub const GPU_DENY: &[Rule] = &[
    allow!(SYS_ptrace, "tracing other processes"),
    allow!(SYS_process_vm_readv, "reading other processes' memory"),
    allow!(SYS_process_vm_writev, "writing other processes' memory"),
    allow!(SYS_kexec_load, "replacing the kernel"),
    allow!(SYS_kexec_file_load, "replacing the kernel"),
    allow!(SYS_init_module, "loading kernel modules"),
    allow!(SYS_finit_module, "loading kernel modules"),
    allow!(SYS_delete_module, "unloading kernel modules"),
    allow!(SYS_mount, "changing the jail's file system view"),
    allow!(SYS_umount2, "changing the jail's file system view"),
    allow!(SYS_pivot_root, "changing the jail's file system view"),
    allow!(SYS_chroot, "changing the jail's file system view"),
    allow!(SYS_unshare, "new namespaces"),
    allow!(SYS_setns, "entering other namespaces"),
    allow!(SYS_bpf, "loading BPF programs"),
    allow!(SYS_perf_event_open, "performance counters (side channels)"),
    allow!(SYS_keyctl, "kernel keyrings"),
    allow!(SYS_add_key, "kernel keyrings"),
    allow!(SYS_request_key, "kernel keyrings"),
    allow!(SYS_userfaultfd, "userfaultfd (kernel exploit primitive)"),
    allow!(
        SYS_io_uring_setup,
        "io_uring (bypasses seccomp for its operations)"
    ),
    allow!(SYS_io_uring_enter, "io_uring"),
    allow!(SYS_io_uring_register, "io_uring"),
    allow!(SYS_reboot, "rebooting"),
    allow!(SYS_swapon, "swap"),
    allow!(SYS_swapoff, "swap"),
    allow!(SYS_acct, "process accounting"),
    allow!(SYS_settimeofday, "the system clock"),
    allow!(SYS_clock_settime, "the system clock"),
    allow!(SYS_adjtimex, "the system clock"),
    allow!(SYS_clock_adjtime, "the system clock"),
    allow!(
        SYS_open_by_handle_at,
        "opening files by handle (escapes bind mounts)"
    ),
    allow!(SYS_name_to_handle_at, "file handles"),
    allow!(SYS_fanotify_init, "watching the file system"),
    allow!(SYS_quotactl, "quotas"),
    allow!(SYS_syslog, "the kernel log"),
    allow!(SYS_vhangup, "terminals"),
    allow!(SYS_lookup_dcookie, "profiling"),
    allow!(SYS_move_mount, "changing the jail's file system view"),
    allow!(SYS_open_tree, "changing the jail's file system view"),
    allow!(SYS_fsopen, "changing the jail's file system view"),
    allow!(SYS_fsmount, "changing the jail's file system view"),
    allow!(SYS_fsconfig, "changing the jail's file system view"),
    allow!(SYS_fspick, "changing the jail's file system view"),
    allow!(SYS_mount_setattr, "changing the jail's file system view"),
];

/// The hosted runner on the CPU may not start processes: a child would keep the shared
/// memfd, and could write kiln's buffers after the runner answered. `clone` only with
/// `CLONE_THREAD`; `fork`, `vfork` refused; `clone3` answers `ENOSYS` from
/// [`HOSTED_FALLBACK`], so glibc falls back to `clone`.
pub const HOSTED_NO_PROCESSES: &[Rule] = &[
    allow!(SYS_fork, "new processes"),
    allow!(SYS_vfork, "new processes"),
    allow!(
        SYS_clone,
        "new processes (threads, with CLONE_THREAD, stay allowed)",
        Cond::NoBits(0, libc::CLONE_THREAD as u64)
    ),
    allow!(SYS_setpgid, "leaving the runner's process group"),
];

/// What the hosted runner (a KernelBench `ModelNew` file's python, hostile from its first
/// import) may NOT do, beyond [`GPU_DENY`]: python, torch and the CUDA driver need too much
/// for an allow-list, so this too is a deny-list. No signals to any other process, no
/// leaving the worker's session, no network sockets, no namespaces, no tracing. On the GPU
/// it may start processes (`load_inline` runs ninja, nvcc and the host compiler, Triton
/// runs ptxas), and ninja puts its commands in process groups of their own: the shared
/// allocations' descriptors are closed before the file is imported, so a child cannot map
/// kiln's memory, and after the evaluation the worker, PID 1 of its jail, kills every
/// other process in it (`engine::hosted::gpu::kill_leftovers`).
pub const HOSTED_DENY: &[Rule] = &[
    allow!(
        SYS_clone,
        "a new mount namespace",
        Cond::Masked(0, NEWNS, NEWNS)
    ),
    allow!(
        SYS_clone,
        "a new user namespace",
        Cond::Masked(0, NEWUSER, NEWUSER)
    ),
    allow!(
        SYS_clone,
        "a new PID namespace",
        Cond::Masked(0, NEWPID, NEWPID)
    ),
    allow!(
        SYS_clone,
        "a new network namespace",
        Cond::Masked(0, NEWNET, NEWNET)
    ),
    allow!(
        SYS_clone,
        "a new IPC namespace",
        Cond::Masked(0, NEWIPC, NEWIPC)
    ),
    allow!(
        SYS_clone,
        "a new UTS namespace",
        Cond::Masked(0, NEWUTS, NEWUTS)
    ),
    allow!(
        SYS_clone,
        "a new cgroup namespace",
        Cond::Masked(0, NEWCGROUP, NEWCGROUP)
    ),
    allow!(SYS_kill, "signals to other processes", Cond::NotSelfPid(0)),
    allow!(
        SYS_tgkill,
        "signals to other processes",
        Cond::NotSelfPid(0)
    ),
    allow!(SYS_tkill, "signals by thread id (glibc uses tgkill)"),
    allow!(
        SYS_rt_sigqueueinfo,
        "signals to other processes",
        Cond::NotSelfPid(0)
    ),
    allow!(
        SYS_rt_tgsigqueueinfo,
        "signals to other processes",
        Cond::NotSelfPid(0)
    ),
    allow!(SYS_pidfd_open, "handles on other processes"),
    allow!(SYS_pidfd_send_signal, "signals to other processes"),
    allow!(SYS_pidfd_getfd, "taking other processes' descriptors"),
    allow!(SYS_kcmp, "comparing other processes' resources"),
    allow!(
        SYS_socket,
        "network sockets (Unix sockets stay allowed)",
        Cond::OneOf(
            0,
            &[
                libc::AF_INET as u64,
                libc::AF_INET6 as u64,
                libc::AF_NETLINK as u64,
                libc::AF_PACKET as u64,
                libc::AF_VSOCK as u64,
            ]
        )
    ),
    allow!(SYS_setsid, "leaving the worker's session"),
];

/// The hosted runner's second filter (stacked on [`HOSTED_DENY`]): `clone3` answers
/// `ENOSYS`, so glibc's `pthread_create` falls back to `clone`, whose flags the first
/// filter can read (`clone3` passes them in memory, out of a filter's reach).
pub const HOSTED_FALLBACK: &[Rule] = &[allow!(
    SYS_clone3,
    "flags out of a filter's reach: glibc falls back to clone"
)];

/// The rule list of a filter stage (for [`Stage::GpuWorker`], the denied calls).
pub fn rules(stage: Stage) -> Vec<Rule> {
    match stage {
        Stage::Compile => [BASE, COMPILE_EXTRA].concat(),
        Stage::Worker => [BASE, WORKER_EXTRA].concat(),
        Stage::GpuWorker => GPU_DENY.to_vec(),
        Stage::PluginHost => PLUGIN_HOST.to_vec(),
        Stage::RunnerLoader => [RUNNER, RUNNER_LOADER].concat(),
        Stage::Runner => RUNNER.to_vec(),
        Stage::HostedRunner => [GPU_DENY, HOSTED_NO_PROCESSES, HOSTED_DENY].concat(),
        Stage::HostedGpuRunner => [GPU_DENY, HOSTED_DENY].concat(),
        Stage::HostedFallback => HOSTED_FALLBACK.to_vec(),
    }
}

/// A filter to build: the jail's roles, plus the runner's two stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// [`Role::Compile`].
    Compile,
    /// [`Role::Worker`].
    Worker,
    /// [`Role::GpuWorker`].
    GpuWorker,
    /// [`Role::PluginHost`].
    PluginHost,
    /// The runner while loading the artifact.
    RunnerLoader,
    /// The runner while candidate code runs.
    Runner,
    /// The hosted runner (a `ModelNew` file's python) on the CPU: the denied calls.
    HostedRunner,
    /// The hosted runner on the GPU: the denied calls (processes allowed, see
    /// [`HOSTED_DENY`]).
    HostedGpuRunner,
    /// The hosted runner's second filter: `clone3` answers `ENOSYS`.
    HostedFallback,
}

impl From<Role> for Stage {
    fn from(r: Role) -> Stage {
        match r {
            Role::Compile => Stage::Compile,
            Role::Worker => Stage::Worker,
            Role::GpuWorker => Stage::GpuWorker,
            Role::PluginHost => Stage::PluginHost,
            Role::Runner => Stage::Runner,
        }
    }
}

/// Builds the BPF program of a stage.
pub fn build(stage: Stage) -> Result<BpfProgram, String> {
    let self_pid = std::process::id() as u64;
    let mut map: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let cond = |arg: u8, len: SeccompCmpArgLen, op: SeccompCmpOp, v: u64| {
        SeccompCondition::new(arg, len, op, v).map_err(|e| e.to_string())
    };
    for r in rules(stage) {
        let new_rules: Vec<SeccompRule> = match r.cond {
            Cond::Any => Vec::new(),
            Cond::NoBits(arg, mask) => vec![
                SeccompRule::new(vec![cond(
                    arg,
                    SeccompCmpArgLen::Qword,
                    SeccompCmpOp::MaskedEq(mask),
                    0,
                )?])
                .map_err(|e| e.to_string())?,
            ],
            Cond::Masked(arg, mask, value) => vec![
                SeccompRule::new(vec![cond(
                    arg,
                    SeccompCmpArgLen::Qword,
                    SeccompCmpOp::MaskedEq(mask),
                    value,
                )?])
                .map_err(|e| e.to_string())?,
            ],
            Cond::OneOf(arg, values) => values
                .iter()
                .map(|&v| {
                    SeccompRule::new(vec![cond(
                        arg,
                        SeccompCmpArgLen::Dword,
                        SeccompCmpOp::Eq,
                        v,
                    )?])
                    .map_err(|e| e.to_string())
                })
                .collect::<Result<_, _>>()?,
            Cond::SelfPid(arg) => vec![
                SeccompRule::new(vec![cond(
                    arg,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Eq,
                    self_pid,
                )?])
                .map_err(|e| e.to_string())?,
            ],
            Cond::NotSelfPid(arg) => vec![
                SeccompRule::new(vec![cond(
                    arg,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Ne,
                    self_pid,
                )?])
                .map_err(|e| e.to_string())?,
            ],
        };
        // An unconditional rule wins over conditional ones for the same syscall (the
        // loader stage re-allows `read` on any fd); seccompiler models "unconditional" as
        // an empty rule list.
        match map.get_mut(&r.nr) {
            Some(existing) if existing.is_empty() => {}
            Some(existing) if new_rules.is_empty() => existing.clear(),
            Some(existing) => existing.extend(new_rules),
            None => {
                map.insert(r.nr, new_rules);
            }
        }
    }
    let (mismatch, matched) = match stage {
        Stage::Compile | Stage::Worker | Stage::PluginHost => (
            SeccompAction::Errno(libc::ENOSYS as u32),
            SeccompAction::Allow,
        ),
        // A deny-list: the listed calls fail with EPERM, everything else is allowed.
        Stage::GpuWorker | Stage::HostedRunner | Stage::HostedGpuRunner => (
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
        ),
        Stage::HostedFallback => (
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
        ),
        Stage::RunnerLoader | Stage::Runner => (SeccompAction::Trap, SeccompAction::Allow),
    };
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
    let filter = SeccompFilter::new(map, mismatch, matched, arch).map_err(|e| e.to_string())?;
    BpfProgram::try_from(filter).map_err(|e| e.to_string())
}

/// Builds and loads the filter of a stage on the calling thread (sets `no_new_privs`).
pub fn apply(stage: Stage) -> Result<usize, String> {
    let prog = build(stage)?;
    seccompiler::apply_filter(&prog).map_err(|e| e.to_string())?;
    Ok(prog.len())
}

/// The name of a syscall number, for evidence (`socket`), or `syscall N`.
pub fn syscall_name(nr: i64) -> String {
    const KNOWN: &[(i64, &str)] = &[
        (libc::SYS_socket, "socket"),
        (libc::SYS_connect, "connect"),
        (libc::SYS_socketpair, "socketpair"),
        (libc::SYS_bind, "bind"),
        (libc::SYS_sendto, "sendto"),
        (libc::SYS_clone, "clone"),
        (libc::SYS_clone3, "clone3"),
        (libc::SYS_fork, "fork"),
        (libc::SYS_vfork, "vfork"),
        (libc::SYS_execve, "execve"),
        (libc::SYS_execveat, "execveat"),
        (libc::SYS_kill, "kill"),
        (libc::SYS_tkill, "tkill"),
        (libc::SYS_tgkill, "tgkill"),
        (libc::SYS_ptrace, "ptrace"),
        (libc::SYS_process_vm_readv, "process_vm_readv"),
        (libc::SYS_process_vm_writev, "process_vm_writev"),
        (libc::SYS_open, "open"),
        (libc::SYS_openat, "openat"),
        (libc::SYS_openat2, "openat2"),
        (libc::SYS_creat, "creat"),
        (libc::SYS_unlink, "unlink"),
        (libc::SYS_unlinkat, "unlinkat"),
        (libc::SYS_mkdir, "mkdir"),
        (libc::SYS_mkdirat, "mkdirat"),
        (libc::SYS_rt_sigaction, "rt_sigaction"),
        (libc::SYS_mprotect, "mprotect"),
        (libc::SYS_setsid, "setsid"),
        (libc::SYS_setpgid, "setpgid"),
        (libc::SYS_unshare, "unshare"),
        (libc::SYS_mount, "mount"),
        (libc::SYS_ioctl, "ioctl"),
        (libc::SYS_getrandom, "getrandom"),
        (libc::SYS_prctl, "prctl"),
        (libc::SYS_read, "read"),
        (libc::SYS_write, "write"),
        (libc::SYS_close, "close"),
        (libc::SYS_pipe2, "pipe2"),
        (libc::SYS_dup2, "dup2"),
        (libc::SYS_getppid, "getppid"),
    ];
    KNOWN
        .iter()
        .find(|(n, _)| *n == nr)
        .map(|(_, name)| (*name).to_string())
        .or_else(|| {
            rules(Stage::Compile)
                .into_iter()
                .chain(rules(Stage::Worker))
                .find(|r| r.nr == nr)
                .map(|r| r.name.trim_start_matches("SYS_").to_string())
        })
        .unwrap_or_else(|| format!("syscall {nr}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jail::sys;

    #[test]
    fn every_stage_builds_and_every_rule_says_why() {
        for stage in [
            Stage::Compile,
            Stage::Worker,
            Stage::GpuWorker,
            Stage::PluginHost,
            Stage::RunnerLoader,
            Stage::Runner,
            Stage::HostedRunner,
            Stage::HostedGpuRunner,
            Stage::HostedFallback,
        ] {
            let prog = build(stage).expect("filter builds");
            assert!(!prog.is_empty());
            for r in rules(stage) {
                assert!(!r.why.is_empty(), "{} has no reason", r.name);
            }
        }
    }

    #[test]
    fn the_hosted_deny_lists_name_what_a_hostile_python_must_not_do() {
        let denied = |stage: Stage| -> Vec<i64> { rules(stage).iter().map(|r| r.nr).collect() };
        let gpu = denied(Stage::HostedGpuRunner);
        for nr in [
            libc::SYS_ptrace,
            libc::SYS_process_vm_readv,
            libc::SYS_process_vm_writev,
            libc::SYS_kill,
            libc::SYS_tgkill,
            libc::SYS_socket,
            libc::SYS_setsid,
            libc::SYS_unshare,
            libc::SYS_setns,
            libc::SYS_pidfd_getfd,
        ] {
            assert!(
                gpu.contains(&nr),
                "syscall {nr} is not denied to a hosted runner"
            );
        }
        // Every namespace flag on its own is a denied clone.
        let ns_rules = rules(Stage::HostedGpuRunner)
            .into_iter()
            .filter(|r| r.nr == libc::SYS_clone)
            .filter_map(|r| match r.cond {
                Cond::Masked(0, mask, value) if mask == value => Some(mask),
                _ => None,
            })
            .fold(0u64, |acc, m| acc | m);
        assert_eq!(ns_rules, NS_FLAGS);
        // On the CPU no process either; on the GPU processes (the compilers) stay allowed.
        let cpu = denied(Stage::HostedRunner);
        for nr in [libc::SYS_fork, libc::SYS_vfork, libc::SYS_setpgid] {
            assert!(cpu.contains(&nr) && !gpu.contains(&nr), "syscall {nr}");
        }
        assert_eq!(denied(Stage::HostedFallback), [libc::SYS_clone3]);
    }

    #[test]
    fn runner_allows_nothing_dangerous() {
        let forbidden = [
            libc::SYS_socket,
            libc::SYS_clone,
            libc::SYS_clone3,
            libc::SYS_fork,
            libc::SYS_vfork,
            libc::SYS_execve,
            libc::SYS_kill,
            libc::SYS_ptrace,
            libc::SYS_openat,
            libc::SYS_open,
            libc::SYS_rt_sigaction,
            libc::SYS_mprotect,
        ];
        for nr in forbidden {
            assert!(
                RUNNER.iter().all(|r| r.nr != nr),
                "{} is in the runner allow-list",
                syscall_name(nr)
            );
        }
        assert_eq!(syscall_name(libc::SYS_socket), "socket");
    }

    #[test]
    fn compile_table_has_no_network() {
        // The compile role runs compilers on candidate code (cc, and Triton's python):
        // no socket of any family, so no network and no way to reach kilnd's socket.
        let rules = rules(Stage::Compile);
        for nr in [
            libc::SYS_socket,
            libc::SYS_socketpair,
            libc::SYS_connect,
            libc::SYS_bind,
            libc::SYS_sendto,
            libc::SYS_sendmsg,
            libc::SYS_ptrace,
            libc::SYS_mount,
            libc::SYS_unshare,
            libc::SYS_io_uring_setup,
        ] {
            assert!(
                rules.iter().all(|r| r.nr != nr),
                "{} is in the compile allow-list",
                syscall_name(nr)
            );
        }
    }

    #[test]
    fn plugin_host_table_leaves_out_processes_servers_and_writes() {
        let rules = rules(Stage::PluginHost);
        let absent = [
            libc::SYS_fork,
            libc::SYS_vfork,
            libc::SYS_clone3,
            libc::SYS_execveat,
            libc::SYS_kill,
            libc::SYS_tkill,
            libc::SYS_ptrace,
            libc::SYS_process_vm_readv,
            libc::SYS_process_vm_writev,
            libc::SYS_mount,
            libc::SYS_unshare,
            libc::SYS_setns,
            libc::SYS_bind,
            libc::SYS_listen,
            libc::SYS_accept,
            libc::SYS_accept4,
            libc::SYS_bpf,
            libc::SYS_perf_event_open,
            libc::SYS_io_uring_setup,
            libc::SYS_userfaultfd,
            libc::SYS_keyctl,
            libc::SYS_open,
            libc::SYS_creat,
            libc::SYS_unlinkat,
            libc::SYS_mkdirat,
            libc::SYS_renameat2,
            libc::SYS_setsid,
            libc::SYS_setpgid,
            libc::SYS_seccomp,
        ];
        for nr in absent {
            assert!(
                rules.iter().all(|r| r.nr != nr),
                "{} is in the plugin host allow-list",
                syscall_name(nr)
            );
        }
        let cond = |nr| rules.iter().find(|r| r.nr == nr).map(|r| r.cond);
        assert!(
            matches!(cond(libc::SYS_socket), Some(Cond::OneOf(0, f)) if f == [libc::AF_UNIX as u64])
        );
        assert!(matches!(cond(libc::SYS_clone), Some(Cond::Masked(0, _, v)) if v == THREAD_FLAGS));
        assert!(matches!(
            cond(libc::SYS_openat),
            Some(Cond::NoBits(2, WRITE_FLAGS))
        ));
    }

    /// What a thread under the plugin host's filter could and could not do.
    #[derive(Debug)]
    struct Tried {
        unix_socket: Result<(), i32>,
        inet_socket: Result<(), i32>,
        inet6_socket: Result<(), i32>,
        netlink_socket: Result<(), i32>,
        fork: Result<(), i32>,
        thread: bool,
        read_open: Result<(), i32>,
        write_open: Result<(), i32>,
        exec_mapping: Result<(), i32>,
    }

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    fn socket_of(family: libc::c_int) -> Result<(), i32> {
        // SAFETY: socket takes integers; the descriptor is closed at once.
        let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(errno());
        }
        // SAFETY: closing the descriptor just opened.
        unsafe { libc::close(fd) };
        Ok(())
    }

    fn open_with(path: &std::ffi::CStr, flags: libc::c_int) -> Result<(), i32> {
        // SAFETY: `path` is NUL-terminated; the descriptor is closed at once.
        let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, 0o600) };
        if fd < 0 {
            return Err(errno());
        }
        // SAFETY: closing the descriptor just opened.
        unsafe { libc::close(fd) };
        Ok(())
    }

    fn exec_mapping() -> Result<(), i32> {
        // SAFETY: a fresh private anonymous page, unmapped before returning.
        unsafe {
            let len = 4096;
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                return Err(errno());
            }
            let r = libc::mprotect(p, len, libc::PROT_READ | libc::PROT_EXEC);
            let out = if r == 0 { Ok(()) } else { Err(errno()) };
            libc::munmap(p, len);
            out
        }
    }

    fn fork_once() -> Result<(), i32> {
        // SAFETY: the child (if the filter wrongly let it exist) exits at once without
        // touching anything; the parent reaps it.
        unsafe {
            match libc::fork() {
                -1 => Err(errno()),
                0 => libc::_exit(0),
                pid => {
                    libc::waitpid(pid, std::ptr::null_mut(), 0);
                    Ok(())
                }
            }
        }
    }

    #[test]
    fn plugin_host_filter_allows_unix_sockets_threads_and_jit_but_not_the_rest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let written = dir.path().join("written");
        let written_c = sys::cstr(&written).expect("path");
        let readable = dir.path().join("readable");
        std::fs::write(&readable, "x").expect("write");
        let readable_c = sys::cstr(&readable).expect("path");
        // A seccomp filter binds the thread that loads it (and threads it starts), not
        // the rest of the test process.
        let tried = std::thread::spawn(move || {
            apply(Stage::PluginHost).expect("the filter loads");
            Tried {
                unix_socket: socket_of(libc::AF_UNIX),
                inet_socket: socket_of(libc::AF_INET),
                inet6_socket: socket_of(libc::AF_INET6),
                netlink_socket: socket_of(libc::AF_NETLINK),
                fork: fork_once(),
                thread: std::thread::spawn(|| 7).join().ok() == Some(7),
                read_open: open_with(&readable_c, libc::O_RDONLY),
                write_open: open_with(&written_c, libc::O_WRONLY | libc::O_CREAT),
                exec_mapping: exec_mapping(),
            }
        })
        .join()
        .expect("the filtered thread ends normally");
        let refused = Err(libc::ENOSYS);
        assert_eq!(tried.unix_socket, Ok(()), "{tried:?}");
        assert_eq!(tried.inet_socket, refused, "{tried:?}");
        assert_eq!(tried.inet6_socket, refused, "{tried:?}");
        assert_eq!(tried.netlink_socket, refused, "{tried:?}");
        assert_eq!(tried.fork, refused, "{tried:?}");
        assert!(tried.thread, "{tried:?}");
        assert_eq!(tried.read_open, Ok(()), "{tried:?}");
        assert_eq!(tried.write_open, refused, "{tried:?}");
        assert!(!written.exists());
        assert_eq!(tried.exec_mapping, Ok(()), "{tried:?}");
    }
}
