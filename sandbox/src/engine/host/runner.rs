//! The runner process (`kiln-worker runner`): the only place candidate code runs.
//!
//! Hostile from the moment the artifact is loaded. It owns no verdict and no clock: the
//! worker writes the inputs, takes the time and reads the outputs only after stopping
//! this process. Its fds, set up by the worker before exec:
//!
//! ```text
//! 0 /dev/null   1, 2 capture pipe (capped by the worker)
//! 3 go   (worker -> runner): one setup frame, then commands: G (run slot 0), T n (run
//!        slots 0..n in order, n one byte), E (empty), Q (quit)
//! 4 done (runner -> worker): one ready frame, then a D per command
//! 5 fault (runner -> worker): "sys N" from the SIGSYS handler
//! 6 memfd with all buffers (tensors and scratch), mapped shared
//! ```
//!
//! Order: read setup → rlimits → map buffers, guard pages → SIGSYS handler → loader
//! seccomp stage → dlopen → dlsym → strict seccomp stage → ready → command loop.

use std::ffi::CString;
use std::mem::ManuallyDrop;
use std::os::fd::FromRawFd;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::layout::{Call, CallArg, MAX_FLOAT_ARGS, MAX_INT_ARGS};
use crate::jail::seccomp::{self, Stage, runner_fds as fds};
use crate::jail::sys;
use crate::protocol;

/// Exit status of a runner stopped by a forbidden syscall.
pub const SIGSYS_EXIT: i32 = 159;

/// What the worker tells a runner before it loads the artifact.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Setup {
    /// Path of the shared object to load.
    pub artifact: PathBuf,
    /// Bytes of the memfd to map.
    pub map_len: u64,
    /// Byte ranges (page aligned) to make inaccessible.
    pub guards: Vec<(u64, u64)>,
    /// The calls of one run, in order, against slot 0.
    pub calls: Vec<Call>,
    /// Slots: copies of every buffer, slot `j` at `j × slot_bytes` (see `layout`).
    pub slots: u32,
    /// Bytes of one slot.
    pub slot_bytes: u64,
    /// RLIMIT_AS, bytes.
    pub as_bytes: u64,
    /// RLIMIT_CPU, seconds.
    pub cpu_s: u64,
}

/// The runner's answer once loaded (written by code the candidate may already control,
/// so the worker treats it as a claim: it only decides `invalid_launch` or a load error).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Ready {
    /// Symbols dlsym could not find.
    pub missing: Vec<String>,
    /// Why loading failed, if it did.
    pub error: Option<String>,
    /// Notes for people (a hosted runner: parameters matched by order where names differ).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

type Entry = unsafe extern "C" fn(
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    f64,
    f64,
    f64,
    f64,
    f64,
    f64,
    f64,
    f64,
);

struct Prepared {
    entry: Entry,
    ints: [u64; MAX_INT_ARGS],
    floats: [f64; MAX_FLOAT_ARGS],
}

/// Runs the runner; returns the exit status.
pub fn main() -> i32 {
    // SAFETY: fd 3 was placed there by the worker before exec; ManuallyDrop keeps it open.
    let mut go = ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fds::GO) });
    let setup: Setup = match protocol::read_message::<Setup>(&mut *go) {
        Ok((s, _)) => s,
        Err(e) => {
            return ready_and_exit(Ready {
                missing: vec![],
                error: Some(format!("setup: {e}")),
                notes: Vec::new(),
            });
        }
    };
    match load(&setup) {
        Ok((calls, ready)) => {
            if let Err(e) = write_ready(&ready) {
                tracing::error!("runner: cannot answer: {e}");
                return 1;
            }
            command_loop(&calls)
        }
        Err(e) => ready_and_exit(Ready {
            missing: vec![],
            error: Some(e),
            notes: Vec::new(),
        }),
    }
}

fn ready_and_exit(r: Ready) -> i32 {
    let _ = write_ready(&r);
    1
}

fn write_ready(r: &Ready) -> std::io::Result<()> {
    let mut buf = Vec::new();
    protocol::write_message(&mut buf, r, &[]).map_err(std::io::Error::other)?;
    sys::write_all(fds::DONE, &buf)
}

/// Everything up to the strict seccomp stage.
fn load(setup: &Setup) -> Result<(Vec<Vec<Prepared>>, Ready), String> {
    for (res, name, v) in [
        (libc::RLIMIT_AS, "RLIMIT_AS", setup.as_bytes),
        (libc::RLIMIT_CPU, "RLIMIT_CPU", setup.cpu_s),
        (libc::RLIMIT_NOFILE, "RLIMIT_NOFILE", 16),
        (libc::RLIMIT_FSIZE, "RLIMIT_FSIZE", 0),
        (libc::RLIMIT_CORE, "RLIMIT_CORE", 0),
    ] {
        sys::set_rlimit(res, v).map_err(|e| format!("{name}: {e}"))?;
    }
    sys::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
    // The mapping lives for the rest of the process: leak it on purpose.
    let mut map = sys::SharedMap::new(fds::MEM, setup.map_len as usize)
        .map_err(|e| format!("map buffers: {e}"))?;
    for &(a, b) in &setup.guards {
        map.protect_none(a as usize..b as usize)
            .map_err(|e| format!("guard page: {e}"))?;
    }
    let base = map.as_ptr() as u64;
    std::mem::forget(map);
    install_sigsys_handler().map_err(|e| format!("SIGSYS handler: {e}"))?;
    seccomp::apply(Stage::RunnerLoader).map_err(|e| format!("loader seccomp: {e}"))?;

    // No artifact: an echo runner, which loads nothing and answers every command at once.
    // Its round trips are the timer's overhead where the runner that holds the candidate
    // cannot be asked for it (a hosted file's python answers `E` itself).
    if setup.artifact.as_os_str().is_empty() {
        if !setup.calls.is_empty() {
            return Err("an echo runner has no calls".into());
        }
        seccomp::apply(Stage::Runner).map_err(|e| format!("runner seccomp: {e}"))?;
        return Ok((vec![Vec::new()], Ready::default()));
    }
    let path = sys::cstr(&setup.artifact).map_err(|e| e.to_string())?;
    // SAFETY: dlopen with a NUL-terminated path. From here on candidate code (its
    // constructors) runs in this process; the loader filter is already in force.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(format!("dlopen: {}", dlerror()));
    }
    let mut ready = Ready::default();
    let mut calls = Vec::new();
    for call in &setup.calls {
        let sym = CString::new(call.symbol.as_str()).map_err(|e| e.to_string())?;
        // SAFETY: `handle` is a live dlopen handle and `sym` is NUL-terminated.
        let ptr = unsafe { libc::dlsym(handle, sym.as_ptr()) };
        if ptr.is_null() {
            if !ready.missing.contains(&call.symbol) {
                ready.missing.push(call.symbol.clone());
            }
            continue;
        }
        // SAFETY: the symbol is a function in the artifact; calling it through this
        // signature is the documented host calling convention (layout.rs): extra integer
        // and float arguments are ignored by the callee under the C ABI.
        let entry: Entry = unsafe { std::mem::transmute::<*mut libc::c_void, Entry>(ptr) };
        let mut p = Prepared {
            entry,
            ints: [0; MAX_INT_ARGS],
            floats: [0.0; MAX_FLOAT_ARGS],
        };
        let (mut ni, mut nf) = (0, 0);
        for a in &call.args {
            match *a {
                CallArg::Ptr(off) => {
                    *p.ints.get_mut(ni).ok_or("too many integer arguments")? = base + off;
                    ni += 1;
                }
                CallArg::Int(v) => {
                    *p.ints.get_mut(ni).ok_or("too many integer arguments")? = v;
                    ni += 1;
                }
                CallArg::Float(bits) => {
                    *p.floats.get_mut(nf).ok_or("too many float arguments")? = f64::from_bits(bits);
                    nf += 1;
                }
            }
        }
        calls.push(p);
    }
    // The same calls for every slot, their pointers moved into the slot (a runner with
    // missing symbols is never asked to run).
    let n = if ready.missing.is_empty() {
        setup.slots.max(1)
    } else {
        1
    };
    let mut slots = Vec::with_capacity(n as usize);
    for slot in 0..u64::from(n) {
        let shift = slot * setup.slot_bytes;
        let rebased: Vec<Prepared> = calls
            .iter()
            .zip(&setup.calls)
            .map(|(p, call)| {
                let mut q = Prepared {
                    entry: p.entry,
                    ints: p.ints,
                    floats: p.floats,
                };
                let mut ni = 0;
                for a in &call.args {
                    match a {
                        CallArg::Ptr(_) => {
                            q.ints[ni] = q.ints[ni].wrapping_add(shift);
                            ni += 1;
                        }
                        CallArg::Int(_) => ni += 1,
                        CallArg::Float(_) => {}
                    }
                }
                q
            })
            .collect();
        slots.push(rebased);
    }
    seccomp::apply(Stage::Runner).map_err(|e| format!("runner seccomp: {e}"))?;
    Ok((slots, ready))
}

fn dlerror() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string owned by libc.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-null, NUL-terminated (see above); copied out immediately.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// Runs one slot's calls, in order.
fn run_calls(calls: &[Prepared]) {
    for c in calls {
        let (i, f) = (&c.ints, &c.floats);
        // SAFETY: this is where candidate code runs; see `load` for the calling
        // convention. Whatever it does is contained by seccomp, rlimits and the
        // worker's checks; memory safety of this process is not relied on.
        unsafe {
            (c.entry)(
                i[0], i[1], i[2], i[3], i[4], i[5], i[6], i[7], i[8], i[9], i[10], i[11], i[12],
                i[13], i[14], i[15], f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7],
            )
        };
    }
}

fn command_loop(slots: &[Vec<Prepared>]) -> i32 {
    let mut cmd = [0u8; 1];
    loop {
        match sys::read(fds::GO, &mut cmd) {
            Ok(1) => {}
            _ => return 0,
        }
        match cmd[0] {
            b'G' => run_calls(&slots[0]),
            b'T' => {
                let mut n = [0u8; 1];
                match sys::read(fds::GO, &mut n) {
                    Ok(1) => {}
                    _ => return 0,
                }
                for calls in slots.iter().take(usize::from(n[0])) {
                    run_calls(calls);
                }
            }
            b'E' => {}
            _ => return 0,
        }
        if sys::write_all(fds::DONE, b"D").is_err() {
            return 0;
        }
    }
}

/// SIGSYS handler: names the syscall on the fault pipe and exits. Only `write` and
/// `exit_group`, both allowed by every stage.
extern "C" fn on_sigsys(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: for a seccomp SIGSYS the kernel fills `struct __sigsys { void *_call_addr;
    // int _syscall; unsigned _arch; }` in the union that starts 16 bytes into siginfo_t
    // on 64-bit Linux, so `_syscall` sits at byte 24.
    let nr = unsafe { *(info.cast::<u8>().add(24).cast::<i32>()) };
    let mut buf = [0u8; 24];
    buf[..4].copy_from_slice(b"sys ");
    let mut digits = [0u8; 12];
    let (mut n, mut len) = (nr.unsigned_abs(), 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for k in 0..len {
        buf[4 + k] = digits[len - 1 - k];
    }
    buf[4 + len] = b'\n';
    let _ = sys::write_all(fds::FAULT, &buf[..5 + len]);
    // SAFETY: _exit is async-signal-safe and never returns.
    unsafe { libc::_exit(SIGSYS_EXIT) };
}

/// Restores the default action for the fault signals (Rust's runtime installs a SIGSEGV
/// handler for stack-overflow reports, which would call `sigaction` again under the strict
/// filter) and installs the SIGSYS handler.
fn install_sigsys_handler() -> std::io::Result<()> {
    for sig in [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGFPE,
        libc::SIGILL,
        libc::SIGABRT,
    ] {
        // SAFETY: SIG_DFL is always a valid disposition.
        if unsafe { libc::signal(sig, libc::SIG_DFL) } == libc::SIG_ERR {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: sigaction is plain old data; zeroed is a valid start.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_sigsys as *const () as usize;
    sa.sa_flags = libc::SA_SIGINFO;
    // SAFETY: `sa` is a valid sigaction whose handler only makes async-signal-safe calls.
    let ret = unsafe { libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()) };
    if ret == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Reads the fault pipe's "sys N" message, if any.
pub fn parse_fault(msg: &str) -> Option<i64> {
    msg.lines()
        .find_map(|l| l.strip_prefix("sys ")?.trim().parse().ok())
}
