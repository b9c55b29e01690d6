//! `kiln-plugin-host`: runs one proposer plugin for one search, bridged to kilnd.
//!
//! kilnd starts it jailed, one process per search:
//!
//! ```text
//! kiln-plugin-host --socket /run/kiln/kiln.sock --search S --token-fd 3 \
//!     --wasm plugin.wasm [--fuel N] [--memory-mb M] [--wall-secs S]
//! ```
//!
//! It reports how the plugin ended to kilnd (`POST /v1/searches/{id}/finish`), prints
//! the same report as its last stdout line, and exits with the outcome's code (0 ok,
//! 10 plugin error, 11 trap, 12 out of fuel, 13 wall clock, 14 memory cap, 15 refused,
//! 16 kilnd unreachable, 1 host fault, 2 usage). Logs go to stderr.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Parser;
use kiln_plugin_host::bridge::Bridge;
use kiln_plugin_host::bridge::kilnd::KilndBridge;
use kiln_plugin_host::component;
use kiln_plugin_host::limits::Limits;
use kiln_plugin_host::outcome::{Outcome, Report};

/// Grace after the wall-clock budget before the watchdog ends the process: the epoch
/// deadline and the host calls' own checks should have ended the run by then (the
/// budget itself starts after compilation, which this grace also covers).
const WATCHDOG_GRACE: Duration = Duration::from_secs(60);

/// Runs one kiln proposer plugin (a wasm32-wasip2 component) for one search.
#[derive(Debug, Parser)]
#[command(name = "kiln-plugin-host", version, args_override_self = true)]
struct Args {
    /// kilnd's Unix socket.
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// The search this host serves; every call goes to /v1/searches/ID/.
    #[arg(long, value_name = "ID")]
    search: String,
    /// Read the search's bearer token from this inherited file descriptor (then close it).
    #[arg(
        long,
        value_name = "N",
        conflicts_with = "token_file",
        required_unless_present = "token_file"
    )]
    token_fd: Option<i32>,
    /// Read the search's bearer token from this file.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// The plugin component.
    #[arg(long, value_name = "FILE")]
    wasm: PathBuf,
    /// Fuel for guest code (about one unit per wasm instruction); 0 for no fuel limit.
    #[arg(long, value_name = "N", default_value_t = 1_000_000_000_000)]
    fuel: u64,
    /// Cap on the plugin's linear memory, MiB.
    #[arg(long, value_name = "M", default_value_t = 256)]
    memory_mb: usize,
    /// Wall-clock budget, seconds, host calls included.
    #[arg(long, value_name = "S", default_value_t = 3600)]
    wall_secs: u64,
    /// How much of the plugin's stderr to keep and report, KiB.
    #[arg(long, value_name = "K", default_value_t = 64)]
    stderr_kb: usize,
    /// Largest checkpoint accepted from the plugin, MiB.
    #[arg(long, value_name = "M", default_value_t = 16)]
    checkpoint_mb: usize,
}

impl Args {
    fn limits(&self) -> Limits {
        Limits {
            fuel: (self.fuel > 0).then_some(self.fuel),
            memory_bytes: self.memory_mb.saturating_mul(1 << 20),
            wall: Duration::from_secs(self.wall_secs),
            stderr_bytes: self.stderr_kb.saturating_mul(1 << 10),
            checkpoint_bytes: self.checkpoint_mb.saturating_mul(1 << 20),
            ..Limits::default()
        }
    }

    fn token(&self) -> anyhow::Result<String> {
        let mut token = String::new();
        if let Some(fd) = self.token_fd {
            if fd < 3 {
                bail!("--token-fd {fd}: the token cannot come from stdin, stdout or stderr");
            }
            use std::os::fd::FromRawFd as _;
            // SAFETY: kilnd passes this descriptor to this process for the token alone;
            // it is taken over here (and closed on drop), and nothing else in the
            // process knows it.
            let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
            file.by_ref()
                .take(4096)
                .read_to_string(&mut token)
                .with_context(|| format!("reading the token from fd {fd}"))?;
        } else if let Some(path) = &self.token_file {
            token = std::fs::read_to_string(path)
                .with_context(|| format!("reading the token from {}", path.display()))?;
        }
        let token = token.trim().to_string();
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            bail!("the token is empty or not printable ASCII");
        }
        Ok(token)
    }
}

/// Reports `report` to kilnd and prints it as the last stdout line; returns the exit code.
fn finish(bridge: &mut KilndBridge, report: &Report) -> u8 {
    let body = report.finish();
    let reported = match bridge.finish(&body) {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(error = %e, "could not report the end of the plugin to kilnd");
            false
        }
    };
    let code = report.outcome.exit_code();
    let mut line = serde_json::to_value(&body).unwrap_or_default();
    if let Some(obj) = line.as_object_mut() {
        obj.insert("exit_code".into(), code.into());
        obj.insert("reported".into(), reported.into());
    }
    println!("{line}");
    code
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KILN_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let token = match args.token() {
        Ok(t) => t,
        Err(e) => {
            // Without a token nothing can be reported to kilnd: say it on stdout and exit.
            eprintln!("kiln-plugin-host: {e:#}");
            let report = Report::early(Outcome::Host(format!("{e:#}")));
            println!(
                "{}",
                serde_json::json!({"error": report.finish().error, "exit_code": 1, "reported": false})
            );
            return ExitCode::from(1);
        }
    };
    let mut bridge = KilndBridge::new(&args.socket, &args.search, token);
    let limits = args.limits();

    // Last resort: if the run has not ended shortly after its wall-clock budget (a host
    // call stuck in kilnd, say), report `wall_clock` and end the process.
    let mut watchdog_bridge = bridge.clone();
    let wall = limits.wall;
    std::thread::Builder::new()
        .name("kiln-watchdog".into())
        .spawn(move || {
            std::thread::sleep(wall + WATCHDOG_GRACE);
            tracing::error!("the run outlived its wall-clock budget; ending the process");
            let code = finish(&mut watchdog_bridge, &Report::early(Outcome::WallClock));
            std::process::exit(i32::from(code));
        })
        .ok();

    let report = match read_wasm(&args.wasm) {
        Ok(wasm) => component::run(&wasm, Box::new(bridge.clone()), &limits),
        Err(e) => Report::early(Outcome::Refused(format!("{e:#}"))),
    };
    tracing::info!(
        outcome = report.outcome.kind(),
        message = %report.outcome.message(),
        fuel_used = report.stats.fuel_used,
        wall_ms = report.stats.wall_ms,
        "plugin ended"
    );
    ExitCode::from(finish(&mut bridge, &report))
}

fn read_wasm(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    let limit = kiln_plugin_host::abi::MAX_PLUGIN_BYTES as u64;
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() as u64 > limit {
        bail!("{} is larger than {limit} bytes", path.display());
    }
    Ok(bytes)
}
