//! Which resource limit ended a compile: the jail's rlimits on the compiling process
//! (address space, CPU time, file size: read back here with `getrlimit`, since the jail
//! set them on this very process) or a SIGKILL, which in a jail with a delegated cgroup is
//! its `memory.max`. A compiler dying of one says only "exited with status 1" or "killed";
//! these messages say which limit, and its value.

/// The limit that ended a compiler, from its wait status (`None` when unknown) and its
/// log (cc's driver reports a child's death as "… signal terminated program cc1", cc1 its
/// own allocation failure as "virtual memory exhausted" or "out of memory").
pub fn compiler_limit(status: Option<libc::c_int>, log: &str) -> Option<String> {
    let signal = status
        .filter(|&s| libc::WIFSIGNALED(s))
        .map(|s| libc::WTERMSIG(s));
    let lower = log.to_ascii_lowercase();
    if lower.contains("virtual memory exhausted")
        || lower.contains("out of memory")
        || lower.contains("cannot allocate memory")
    {
        return Some(address_space());
    }
    if signal == Some(libc::SIGXCPU) || lower.contains("cpu time limit exceeded") {
        return Some(cpu_time());
    }
    if signal == Some(libc::SIGXFSZ) || lower.contains("file size limit exceeded") {
        return Some(file_size());
    }
    if signal == Some(libc::SIGKILL) || lower.contains("killed signal terminated program") {
        return Some(killed());
    }
    None
}

/// The limit that ended a compiling process by `signal` (the jailed worker itself, when
/// the compiler runs in it: NVRTC), if it is one of them.
pub fn signal_limit(signal: libc::c_int) -> Option<String> {
    match signal {
        libc::SIGXCPU => Some(cpu_time()),
        libc::SIGXFSZ => Some(file_size()),
        libc::SIGKILL => Some(killed()),
        _ => None,
    }
}

/// The address-space limit, as a reason.
pub fn address_space() -> String {
    format!(
        "the compiler ran out of memory: the address-space limit (RLIMIT_AS){} \
         (evaluation.memory_limit_mb)",
        of(current(libc::RLIMIT_AS).map(|b| format!("{} MiB", b >> 20)))
    )
}

fn cpu_time() -> String {
    format!(
        "the compiler used up the CPU-time limit (RLIMIT_CPU){}",
        of(current(libc::RLIMIT_CPU).map(|s| format!("{s} s")))
    )
}

fn file_size() -> String {
    format!(
        "the compiler wrote past the file-size limit (RLIMIT_FSIZE){}",
        of(current(libc::RLIMIT_FSIZE).map(|b| format!("{} MiB", b >> 20)))
    )
}

/// " of VALUE", or nothing when the value is unknown.
fn of(value: Option<String>) -> String {
    value.map_or(String::new(), |v| format!(" of {v}"))
}

fn killed() -> String {
    "the compiler was killed (SIGKILL): out of memory under the jail's cgroup limit \
     (memory.max), or the kernel's OOM killer"
        .into()
}

/// This process's soft limit of `resource`, `None` when unlimited or unreadable.
fn current(resource: libc::__rlimit_resource_t) -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit that lives across the call.
    let ok = unsafe { libc::getrlimit(resource, &mut lim) } == 0;
    (ok && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait status for death by `sig` (as `waitpid` reports it).
    fn signaled(sig: libc::c_int) -> Option<libc::c_int> {
        Some(sig)
    }

    #[test]
    fn each_limit_is_named() {
        let exited_1 = Some(1 << 8);
        let m = compiler_limit(exited_1, "cc1: out of memory allocating 65536 bytes").expect("as");
        assert!(m.contains("RLIMIT_AS"), "{m}");
        let m = compiler_limit(exited_1, "virtual memory exhausted: Cannot allocate memory")
            .expect("as");
        assert!(m.contains("address-space limit"), "{m}");
        let m = compiler_limit(
            exited_1,
            "cc: fatal error: CPU time limit exceeded signal terminated program cc1",
        )
        .expect("cpu");
        assert!(m.contains("RLIMIT_CPU"), "{m}");
        let m = compiler_limit(
            exited_1,
            "cc: fatal error: File size limit exceeded signal terminated program as",
        )
        .expect("fsize");
        assert!(m.contains("RLIMIT_FSIZE"), "{m}");
        let m = compiler_limit(
            exited_1,
            "cc: fatal error: Killed signal terminated program cc1",
        )
        .expect("kill");
        assert!(m.contains("memory.max"), "{m}");
        assert!(
            compiler_limit(signaled(libc::SIGXCPU), "")
                .expect("sig")
                .contains("CPU")
        );
        assert!(
            compiler_limit(signaled(libc::SIGXFSZ), "")
                .expect("sig")
                .contains("FSIZE")
        );
        assert!(
            compiler_limit(signaled(libc::SIGKILL), "")
                .expect("sig")
                .contains("SIGKILL")
        );
        // An ordinary error is no limit.
        assert_eq!(
            compiler_limit(exited_1, "candidate.c:1:1: error: expected ';'"),
            None
        );
        assert_eq!(signal_limit(libc::SIGSEGV), None);
    }
}
