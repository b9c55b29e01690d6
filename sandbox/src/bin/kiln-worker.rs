//! `kiln-worker`: the jail helper, the trusted worker and the candidate runner, in one
//! binary so that one path is all kilnd needs (docs/security.md, section 3).
//!
//! - `kiln-worker jail SPEC-JSON`: set up the jail's layers and exec the payload
//!   (single-threaded on purpose: nothing here starts a thread);
//! - `kiln-worker serve [--pch-heap] --tag=T`: answer one request on stdin/stdout (inside
//!   the jail); `--pch-heap` first maps NVRTC's precompiled-header heap (a cuda compile
//!   that builds or uses a precompiled header);
//! - `kiln-worker runner --tag=T`: hold candidate code (started by `serve`);
//! - `kiln-worker hosted-runner --python=P --script=S --tag=T`: load the hosted filter and
//!   exec the python that holds a hosted `ModelNew` file (started by `serve`);
//! - `kiln-worker probe --tag=T`: exit at once (for `probe_layers`);
//! - `kiln-worker launch --spec PROBLEM.json ...`: run a problem's own seed or reference
//!   kernel on the GPU for an external profiler (`kiln bench agreement`; not jailed, and
//!   never a candidate's code).
//!
//! Logs go to stderr; the level comes from `KILN_LOG` (default `warn`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    // A subscriber that writes to stderr; it starts no thread, so `jail` stays
    // single-threaded.
    let filter = tracing_subscriber::EnvFilter::try_from_env("KILN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let tag = args
        .iter()
        .find_map(|a| a.strip_prefix("--tag="))
        .unwrap_or("");
    let code = match args.get(1).map(String::as_str) {
        Some("jail") => match args.get(2) {
            Some(spec) => kiln_sandbox::jail::helper::run(spec),
            None => usage(),
        },
        Some("serve") => kiln_sandbox::worker::serve(tag, args.iter().any(|a| a == "--pch-heap")),
        Some("runner") => kiln_sandbox::engine::host::runner::main(),
        Some("hosted-runner") => kiln_sandbox::engine::hosted::wrapper::main(&args[2..]),
        Some("probe") => 0,
        Some("launch") => kiln_sandbox::engine::cuda::launcher::main(&args[2..]),
        _ => usage(),
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn usage() -> i32 {
    eprintln!(
        "usage: kiln-worker jail SPEC-JSON | serve [--pch-heap] --tag=T | runner --tag=T | probe --tag=T"
    );
    eprintln!("       {}", kiln_sandbox::engine::cuda::launcher::USAGE);
    eprintln!(
        "kiln-worker is started by kilnd (launch: by kiln bench agreement); it is not meant to be run by hand."
    );
    2
}
