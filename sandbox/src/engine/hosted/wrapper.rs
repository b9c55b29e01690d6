//! `kiln-worker hosted-runner --python=P --script=S --cpu-s=N [--processes]
//! [--script-arg=A ...] --tag=T`: the first moments of a hosted runner, in kiln's code. Started by the worker (fork + exec, fds already in
//! place: see `engine::host::runner_ctl`), it lowers its CPU limit, loads the hosted
//! filters ([`seccomp::Stage::HostedRunner`], or [`seccomp::Stage::HostedGpuRunner`] with
//! `--processes`, then [`seccomp::Stage::HostedFallback`]) and
//! execs `P -I -B S serve` (or `P -I -B S A...`: the compile step's `build`, see
//! `engine::hosted::build`) with its own environment. The filters outlive the exec, so the
//! candidate's python never runs without them.

use std::ffi::CString;

use crate::jail::{seccomp, sys};

/// Exit status when the wrapper itself fails (bad arguments, a filter that would not
/// load, an exec that failed): the worker reports it as a failed job, not a verdict.
pub const WRAPPER_FAILED: i32 = 126;

/// Runs the wrapper; returns only on failure.
pub fn main(args: &[String]) -> i32 {
    let arg = |name: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")).map(str::to_string))
    };
    let (Some(python), Some(script)) = (arg("python"), arg("script")) else {
        eprintln!("kiln hosted-runner: --python and --script are required");
        return WRAPPER_FAILED;
    };
    if let Some(cpu_s) = arg("cpu-s").and_then(|s| s.parse::<u64>().ok())
        && let Err(e) = sys::set_rlimit(libc::RLIMIT_CPU, cpu_s)
    {
        eprintln!("kiln hosted-runner: RLIMIT_CPU: {e}");
        return WRAPPER_FAILED;
    }
    // On the GPU the file's compilers need processes (see `seccomp::HOSTED_DENY`).
    let deny = if args.iter().any(|a| a == "--processes") {
        seccomp::Stage::HostedGpuRunner
    } else {
        seccomp::Stage::HostedRunner
    };
    for stage in [deny, seccomp::Stage::HostedFallback] {
        if let Err(e) = seccomp::apply(stage) {
            eprintln!("kiln hosted-runner: seccomp {stage:?}: {e}");
            return WRAPPER_FAILED;
        }
    }
    let cs = |s: &str| CString::new(s).map_err(|e| e.to_string());
    // The script's own arguments: `serve` (the evaluation), or the compile step's
    // `build SOURCE RECORD INIT` given one `--script-arg=` each.
    let mut script_args: Vec<String> = args
        .iter()
        .filter_map(|a| a.strip_prefix("--script-arg=").map(str::to_string))
        .collect();
    if script_args.is_empty() {
        script_args.push("serve".into());
    }
    let argv: Result<Vec<CString>, String> = [python.as_str(), "-I", "-B", &script]
        .into_iter()
        .chain(script_args.iter().map(String::as_str))
        .map(cs)
        .collect();
    let env: Result<Vec<CString>, String> = std::env::vars()
        .map(|(k, v)| cs(&format!("{k}={v}")))
        .collect();
    let (argv, env) = match (argv, env) {
        (Ok(a), Ok(e)) => (a, e),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("kiln hosted-runner: {e}");
            return WRAPPER_FAILED;
        }
    };
    let ptrs = |v: &[CString]| -> Vec<*const libc::c_char> {
        v.iter()
            .map(|c| c.as_ptr())
            .chain([std::ptr::null()])
            .collect()
    };
    let (argv_p, env_p) = (ptrs(&argv), ptrs(&env));
    let err = sys::execve(&argv[0], &argv_p, &env_p);
    eprintln!("kiln hosted-runner: exec {python}: {err:?}");
    WRAPPER_FAILED
}
