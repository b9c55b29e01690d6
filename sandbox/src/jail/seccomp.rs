//! Seccomp allow-lists, one per role, kept as data with the reason for every syscall.
//!
//! Roles (design guide §6, docs/security.md):
//! - [`Role::Compile`]: kiln-worker plus the system compiler driver and its helpers
//!   (`cc1`, `as`, `ld`). Needs files and processes, never the network.
//! - [`Role::Worker`]: kiln-worker evaluating. Spawns runners, maps the shared buffers,
//!   stops and resumes runners. The runners inherit this filter and add their own.
//! - [`Role::GpuWorker`]: kiln-worker evaluating on a GPU. The CUDA driver's needs are
//!   large and version-dependent, so this is a deny-list ([`GPU_DENY`]): ptrace, mount,
//!   namespaces, bpf, perf, keyrings, io_uring, userfaultfd, kexec, modules, clock
//!   setting and file handles are refused; the rest is allowed. Candidate code on the GPU
//!   cannot make syscalls; this guards against the trusted worker being subverted
//!   through the driver.
//! - [`Role::Runner`]: candidate code. Two filters stacked by the runner itself:
//!   [`RUNNER_LOADER`] while `dlopen` maps the artifact (read-only `openat` allowed), then
//!   [`RUNNER`] once the symbols are resolved: no open, no fork/clone, no exec, no socket,
//!   no kill, no ptrace, no sigaction, no mprotect. Anything else traps (SIGSYS) and the
//!   runner's handler names the syscall.
//!
//! Compile and worker filters answer a forbidden call with `ENOSYS` rather than killing:
//! glibc then falls back from new calls (`clone3`, `faccessat2`) to older allowed ones,
//! and a compiler that probes for an optional feature carries on.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use super::Role;

/// The runner's fixed descriptors (see `host::runner`).
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
    /// Argument `.0` (a 32-bit value) equals one of the values.
    OneOf(u8, &'static [u64]),
    /// Argument `.0` is this process's own pid.
    SelfPid(u8),
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

/// Harmless terminal ioctls (isatty, window size) used by compilers and stdio.
const TTY_IOCTLS: &[u64] = &[libc::TCGETS, libc::TIOCGWINSZ, libc::FIONREAD];

/// prctl options a trusted kiln process uses on itself.
const PRCTL_OPTIONS: &[u64] = &[
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

/// Extra syscalls of the system compiler (gcc driver, cc1, as, ld).
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

/// The rule list of a filter stage (for [`Stage::GpuWorker`], the denied calls).
pub fn rules(stage: Stage) -> Vec<Rule> {
    match stage {
        Stage::Compile => [BASE, COMPILE_EXTRA].concat(),
        Stage::Worker => [BASE, WORKER_EXTRA].concat(),
        Stage::GpuWorker => GPU_DENY.to_vec(),
        Stage::RunnerLoader => [RUNNER, RUNNER_LOADER].concat(),
        Stage::Runner => RUNNER.to_vec(),
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
    /// The runner while loading the artifact.
    RunnerLoader,
    /// The runner while candidate code runs.
    Runner,
}

impl From<Role> for Stage {
    fn from(r: Role) -> Stage {
        match r {
            Role::Compile => Stage::Compile,
            Role::Worker => Stage::Worker,
            Role::GpuWorker => Stage::GpuWorker,
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
        Stage::Compile | Stage::Worker => (
            SeccompAction::Errno(libc::ENOSYS as u32),
            SeccompAction::Allow,
        ),
        // A deny-list: the listed calls fail with EPERM, everything else is allowed.
        Stage::GpuWorker => (
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
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

    #[test]
    fn every_stage_builds_and_every_rule_says_why() {
        for stage in [
            Stage::Compile,
            Stage::Worker,
            Stage::GpuWorker,
            Stage::RunnerLoader,
            Stage::Runner,
        ] {
            let prog = build(stage).expect("filter builds");
            assert!(!prog.is_empty());
            for r in rules(stage) {
                assert!(!r.why.is_empty(), "{} has no reason", r.name);
            }
        }
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
}
