//! The helper side of the jail: `kiln-worker jail SPEC`, a fresh single-threaded process
//! that sets up the layers in order and execs the payload (docs/security.md, section 3).
//!
//! Steps, in code order (docs/security.md lists the same):
//!
//! 1. close every inherited fd above 2 (stdin/stdout are the protocol pipes, stderr the log);
//! 2. parse and validate the [`JailSpec`];
//! 3. join a cgroup v2 child with `memory.max`/`pids.max` (when configured);
//! 4. unshare the user namespace (uid 0 inside = the caller's uid outside, setgroups
//!    denied), then mount, network, IPC and PID namespaces, one at a time, each recorded;
//! 5. fork: this process stays as the monitor (it waits and passes on the exit status);
//!    the child is PID 1 of the new PID namespace, so when it dies every process in the
//!    jail dies with it;
//! 6. (child) parent-death signal SIGKILL, then check the parent is still there;
//! 7. (child) private root with read-only system dirs and a writable `/scratch`; hidden
//!    paths covered;
//! 8. (child) chdir into scratch;
//! 9. (child) rlimits: CPU, NOFILE, NPROC, FSIZE, CORE=0, AS (when given);
//! 10. (child) `no_new_privs`, then every capability dropped (ambient, bounding,
//!     effective, permitted, inheritable); for a spec that asks for it
//!     ([`JailSpec::disable_aslr`]), address-space randomization off for the payload;
//! 11. (child) seccomp filter of the role, the last step before exec;
//! 12. (child) write the [`JailReport`] as the first frame on stdout, then exec with only
//!     the spec's environment.
//!
//! Namespaces, the private root and the cgroup degrade (recorded as off, with the reason);
//! a failure of steps 1-2 or 6-12 aborts with a report naming the step.

use std::ffi::CString;
use std::path::Path;

use super::{JailError, JailReport, JailSpec, LayerStatus, cgroup, mounts, seccomp, sys};
use crate::protocol;

/// Exit status of the helper when it refused to start the payload.
pub const SETUP_FAILED: i32 = 125;

/// Runs the helper; returns the exit status for `main` (only on failure or in the monitor).
pub fn run(spec_json: &str) -> i32 {
    let mut layers = Vec::new();
    // Step 1: nothing the caller leaked (a database, a socket) may reach the payload.
    match sys::close_fds_from(3) {
        Ok(()) => layers.push(LayerStatus::on(
            "fds-closed",
            "every inherited fd above 2 closed",
        )),
        Err(e) => {
            return fail(
                layers,
                JailError::Setup(format!("close inherited fds: {e}")),
            );
        }
    }
    // Step 2.
    let spec: JailSpec = match serde_json::from_str(spec_json) {
        Ok(s) => s,
        Err(e) => {
            return fail(
                layers,
                JailError::Report(format!("spec does not parse: {e}")),
            );
        }
    };
    if let Err(e) = spec.validate() {
        return fail(layers, e.into());
    }
    // Step 3.
    layers.push(match &spec.cgroup {
        Some(cg) => cgroup::enter(cg),
        None => LayerStatus::off("cgroup", "no delegated cgroup v2 directory configured"),
    });
    // Step 4.
    let ns = enter_namespaces(&spec, &mut layers);
    // Step 5.
    let parent = std::process::id() as libc::pid_t;
    match sys::fork() {
        Err(e) => fail(layers, JailError::Fork(e)),
        Ok(sys::Forked::Parent(child)) => monitor(child),
        Ok(sys::Forked::Child) => {
            let err = child(&spec, ns, parent, layers.clone());
            fail(layers, err)
        }
    }
}

/// Which namespaces the payload is in.
#[derive(Debug, Clone, Copy, Default)]
struct Namespaces {
    mount: bool,
    pid: bool,
}

fn enter_namespaces(spec: &JailSpec, layers: &mut Vec<LayerStatus>) -> Namespaces {
    const ALL: [&str; 5] = [
        "user-namespace",
        "mount-namespace",
        "network-namespace",
        "ipc-namespace",
        "pid-namespace",
    ];
    if !spec.namespaces {
        for name in ALL {
            layers.push(LayerStatus::off(name, "disabled by configuration"));
        }
        return Namespaces::default();
    }
    // SAFETY: geteuid/getegid cannot fail and take no arguments.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    layers.push(match sys::unshare(libc::CLONE_NEWUSER) {
        Err(e) => LayerStatus::off(ALL[0], format!("unshare refused: {e}")),
        Ok(()) => match write_id_maps(uid, gid) {
            Ok(()) => LayerStatus::on(
                ALL[0],
                format!("uid 0 inside is uid {uid} outside; setgroups denied"),
            ),
            Err(e) => LayerStatus::on(
                ALL[0],
                format!("entered, but the id map failed ({e}): runs as the overflow uid"),
            ),
        },
    });
    let mut ns = Namespaces::default();
    for (name, flag, what) in [
        (ALL[1], libc::CLONE_NEWNS, "private mounts"),
        (
            ALL[2],
            libc::CLONE_NEWNET,
            "no network interfaces (loopback down)",
        ),
        (
            ALL[3],
            libc::CLONE_NEWIPC,
            "private System V IPC and POSIX queues",
        ),
        (
            ALL[4],
            libc::CLONE_NEWPID,
            "payload is PID 1; its death kills the whole jail",
        ),
    ] {
        match sys::unshare(flag) {
            Ok(()) => {
                layers.push(LayerStatus::on(name, what));
                if flag == libc::CLONE_NEWNS {
                    ns.mount = true;
                }
                if flag == libc::CLONE_NEWPID {
                    ns.pid = true;
                }
            }
            Err(e) => layers.push(LayerStatus::off(name, format!("unshare refused: {e}"))),
        }
    }
    ns
}

fn write_id_maps(uid: libc::uid_t, gid: libc::gid_t) -> std::io::Result<()> {
    std::fs::write("/proc/self/setgroups", "deny")?;
    std::fs::write("/proc/self/uid_map", format!("0 {uid} 1"))?;
    std::fs::write("/proc/self/gid_map", format!("0 {gid} 1"))
}

/// The monitor: waits for the payload and exits with its status (128+signal if killed).
fn monitor(child: libc::pid_t) -> i32 {
    // The monitor holds no protocol pipe: the caller sees EOF when the payload is gone.
    // SAFETY: closing our own copies of stdin/stdout; nothing in this process uses them.
    unsafe {
        libc::close(0);
        libc::close(1);
    }
    match sys::waitpid(child, 0) {
        Ok((_, status)) if libc::WIFEXITED(status) => libc::WEXITSTATUS(status),
        Ok((_, status)) if libc::WIFSIGNALED(status) => 128 + libc::WTERMSIG(status),
        _ => SETUP_FAILED,
    }
}

/// Steps 6-12 in the child; returns only on failure.
fn child(
    spec: &JailSpec,
    ns: Namespaces,
    parent: libc::pid_t,
    mut layers: Vec<LayerStatus>,
) -> JailError {
    // Step 6. In a new PID namespace the parent is outside it, so getppid() reads 0.
    if let Err(e) = sys::set_parent_death_signal(libc::SIGKILL) {
        return JailError::ParentDeathSignal(e);
    }
    // SAFETY: getppid cannot fail.
    let ppid = unsafe { libc::getppid() };
    if ppid != if ns.pid { 0 } else { parent } {
        return JailError::ParentDeathSignal(std::io::Error::other(
            "the monitor exited before setup",
        ));
    }
    layers.push(LayerStatus::on(
        "parent-death-signal",
        "SIGKILL when the monitor dies",
    ));

    // Step 7.
    let (mut program, mut scratch) = (spec.program.clone(), spec.scratch.clone());
    if ns.mount {
        if let Err(e) = mounts::make_private() {
            return JailError::Setup(e);
        }
        match mounts::enter_private_root(
            &spec.root_dir,
            &spec.scratch,
            &spec.program,
            &spec.ro_paths,
            mounts::Extra {
                devices: &spec.devices,
                ro: &spec.optional_ro_paths,
                binds: &spec.ro_binds,
            },
        ) {
            Ok(inside) => {
                let extra = spec.devices.len() + spec.optional_ro_paths.len();
                layers.push(LayerStatus::on(
                    "private-root",
                    format!(
                        "read-only root with {} system paths{}{}; writable /scratch only{}",
                        spec.ro_paths.len(),
                        if spec.ro_binds.is_empty() {
                            String::new()
                        } else {
                            format!(", {} header folders", spec.ro_binds.len())
                        },
                        if extra > 0 {
                            format!(
                                ", {} device nodes and driver paths",
                                extra - inside.skipped.len()
                            )
                        } else {
                            String::new()
                        },
                        if inside.skipped.is_empty() {
                            String::new()
                        } else {
                            format!(" (left out: {})", inside.skipped.join("; "))
                        }
                    ),
                ));
                program = inside.program;
                scratch = inside.scratch;
            }
            Err((e, true)) => return JailError::Setup(e),
            Err((e, false)) => layers.push(LayerStatus::off("private-root", e)),
        }
        layers.push(match mounts::hide(&spec.hidden_paths) {
            Ok((covered, absent)) => LayerStatus::on(
                "hidden-paths",
                format!("{covered} covered, {absent} not visible"),
            ),
            Err(e) => return JailError::Setup(e),
        });
    } else {
        layers.push(LayerStatus::off("private-root", "no mount namespace"));
        layers.push(LayerStatus::off(
            "hidden-paths",
            "no mount namespace: hidden paths stay visible",
        ));
    }
    // Step 8.
    if let Err(source) = std::env::set_current_dir(&scratch) {
        return JailError::EnterScratch {
            path: scratch,
            source,
        };
    }
    // Step 9.
    if let Err(e) = apply_limits(spec) {
        return e;
    }
    layers.push(LayerStatus::on("rlimits", describe_limits(spec)));
    // Step 10.
    if let Err(e) = sys::set_no_new_privs() {
        return JailError::NoNewPrivs(e);
    }
    layers.push(LayerStatus::on("no-new-privs", "set"));
    // Step 10b: no capabilities, whatever the caller held (kilnd may hold CAP_SYS_ADMIN,
    // ambient, for clock locking; ambient capabilities survive exec).
    match sys::drop_capabilities() {
        Ok(n) => layers.push(LayerStatus::on(
            "capabilities",
            format!("all dropped (ambient cleared, {n} removed from the bounding set)"),
        )),
        Err(e) => return JailError::Setup(format!("dropping capabilities: {e}")),
    }
    // Step 10c (compile jails with a precompiled header only): no address-space
    // randomization for the payload. A failure is recorded, never fatal: the compile then
    // runs without the header.
    if spec.wants_no_aslr() {
        layers.push(match sys::disable_aslr() {
            Ok(()) => LayerStatus::off(
                "aslr",
                "address-space randomization off for this compile (it builds or uses a \
                 precompiled header; see docs/security.md)",
            ),
            Err(e) => LayerStatus::on(
                "aslr",
                format!("could not be turned off ({e}): no precompiled header for this compile"),
            ),
        });
    }
    // Everything the exec needs is built before the filter is loaded.
    let env = spec.payload_env();
    let exec = match ExecVectors::new(&program, &spec.args, &env) {
        Ok(x) => x,
        Err(e) => {
            return JailError::Exec {
                path: program,
                source: e,
            };
        }
    };
    layers.push(LayerStatus::on(
        "env-cleared",
        format!("{} variables passed", env.len()),
    ));
    // Step 11.
    match seccomp::apply(spec.role.into()) {
        Ok(n) => layers.push(LayerStatus::on(
            "seccomp",
            format!("{:?} allow-list, {n} BPF instructions", spec.role),
        )),
        Err(e) => return JailError::LoadSeccomp(e),
    }
    // Step 12.
    let report = JailReport {
        layers,
        error: None,
    };
    if let Err(e) = write_report(&report) {
        return JailError::WriteReport(e);
    }
    let source = exec.exec();
    JailError::Exec {
        path: program,
        source,
    }
}

/// Sets the jail's rlimits. RLIMIT_CPU's hard limit is one second above its soft one: at
/// the soft limit the kernel sends SIGXCPU, so a process ended by it dies of SIGXCPU and
/// says which limit it hit (with equal limits the kernel's SIGKILL comes first, which
/// reads like an out-of-memory kill); the hard limit kills one that ignores SIGXCPU.
fn apply_limits(spec: &JailSpec) -> Result<(), JailError> {
    let l = &spec.limits;
    sys::set_rlimits(libc::RLIMIT_CPU, l.cpu_s, l.cpu_s.saturating_add(1)).map_err(|source| {
        JailError::SetRlimit {
            resource: "RLIMIT_CPU",
            source,
        }
    })?;
    let mut list: Vec<(libc::__rlimit_resource_t, &'static str, u64)> = vec![
        (libc::RLIMIT_NOFILE, "RLIMIT_NOFILE", l.nofile),
        (libc::RLIMIT_NPROC, "RLIMIT_NPROC", l.nproc),
        (libc::RLIMIT_FSIZE, "RLIMIT_FSIZE", l.fsize_bytes),
        (libc::RLIMIT_CORE, "RLIMIT_CORE", 0),
    ];
    if let Some(a) = l.as_bytes {
        list.push((libc::RLIMIT_AS, "RLIMIT_AS", a));
    }
    for (res, resource, value) in list {
        sys::set_rlimit(res, value).map_err(|source| JailError::SetRlimit { resource, source })?;
    }
    Ok(())
}

fn describe_limits(spec: &JailSpec) -> String {
    let l = &spec.limits;
    let mut s = format!(
        "cpu {} s, nofile {}, nproc {}, fsize {} MiB, core 0",
        l.cpu_s,
        l.nofile,
        l.nproc,
        l.fsize_bytes >> 20
    );
    if let Some(a) = l.as_bytes {
        s.push_str(&format!(", as {} MiB", a >> 20));
    }
    s
}

/// argv and envp for execve, built before the seccomp filter is loaded.
struct ExecVectors {
    path: CString,
    _strings: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

impl ExecVectors {
    fn new(program: &Path, args: &[String], env: &[(String, String)]) -> std::io::Result<Self> {
        let path = sys::cstr(program)?;
        let bad = |_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL byte");
        let argv_s: Vec<CString> = std::iter::once(Ok(path.clone()))
            .chain(args.iter().map(|a| CString::new(a.as_str()).map_err(bad)))
            .collect::<Result<_, _>>()?;
        let env_s: Vec<CString> = env
            .iter()
            .map(|(k, v)| CString::new(format!("{k}={v}")).map_err(bad))
            .collect::<Result<_, _>>()?;
        let argv = argv_s
            .iter()
            .map(|c| c.as_ptr())
            .chain([std::ptr::null()])
            .collect();
        let envp = env_s
            .iter()
            .map(|c| c.as_ptr())
            .chain([std::ptr::null()])
            .collect();
        Ok(ExecVectors {
            path,
            _strings: argv_s.into_iter().chain(env_s).collect(),
            argv,
            envp,
        })
    }

    fn exec(&self) -> std::io::Error {
        sys::execve(&self.path, &self.argv, &self.envp)
    }
}

fn write_report(report: &JailReport) -> std::io::Result<()> {
    let mut buf = Vec::new();
    protocol::write_message(&mut buf, report, &[]).map_err(std::io::Error::other)?;
    sys::write_all(1, &buf)
}

/// Reports a failed step on stdout (best effort) and returns [`SETUP_FAILED`].
fn fail(layers: Vec<LayerStatus>, err: JailError) -> i32 {
    tracing::error!("jail: {err}");
    let _ = write_report(&JailReport {
        layers,
        error: Some(err.to_string()),
    });
    SETUP_FAILED
}
