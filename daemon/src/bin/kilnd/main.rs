//! `kilnd`, the kiln service: owns the machine's evaluation backends, keeps the durable
//! store, and serves the API on a Unix socket.
//!
//! Start-up order matters: everything that forks (probing the jail's layers) happens
//! before the tokio runtime starts, while the process is still single-threaded.

mod server;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use kiln_daemon::config::{Config, DEFAULT_CONFIG_TOML, DefaultPaths, Mode};

/// kilnd — the kiln evaluation service.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Args {
    /// Unix socket to serve the API on (default: the mode's; see --system).
    #[arg(long, env = "KILND_SOCKET")]
    socket: Option<PathBuf>,
    /// State directory: database, compile cache, scratch (default: the mode's).
    #[arg(long, env = "KILND_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Config file (default: /etc/kiln/kiln.toml with --system, else
    /// $XDG_CONFIG_HOME/kiln/kiln.toml, each read only when present).
    #[arg(long, env = "KILND_CONFIG")]
    config: Option<PathBuf>,
    /// System mode: /run/kiln/kiln.sock, /var/lib/kiln, /etc/kiln/kiln.toml.
    #[arg(long)]
    system: bool,
    /// Print the whole commented default configuration and exit.
    #[arg(long)]
    print_default_config: bool,
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "kilnd stopped with an error");
            eprintln!("kilnd: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args = Args::parse();
    if args.print_default_config {
        print!("{DEFAULT_CONFIG_TOML}");
        return Ok(());
    }
    let mode = if args.system {
        Mode::System
    } else {
        Mode::User
    };
    let defaults = DefaultPaths::for_mode(mode);
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None if defaults.config.exists() => Config::load(&defaults.config)?,
        None => Config::default(),
    };
    // The database URL may carry a password: it can come from the environment instead.
    if let Some(url) = std::env::var("KILN_DATABASE_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
    {
        config.cluster.database_url = url;
    }
    // A node id from the environment (Kubernetes: the node's name via the downward API).
    if let Some(id) = std::env::var("KILN_NODE_ID")
        .ok()
        .filter(|u| !u.trim().is_empty())
    {
        config.cluster.node_id = id.trim().to_string();
    }
    kiln_daemon::logging::init(&config.log.level, config.log.format == "json");
    let socket = args
        .socket
        .or_else(|| non_empty(&config.server.socket))
        .unwrap_or(defaults.socket);
    let state_dir = args
        .state_dir
        .or_else(|| non_empty(&config.server.state_dir))
        .unwrap_or(defaults.state_dir);
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        socket = %socket.display(),
        state_dir = %state_dir.display(),
        ?mode,
        "kilnd starting"
    );
    let prepared = server::prepare(socket, state_dir, config).context("cannot start kilnd")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("kilnd")
        .build()
        .context("cannot start the async runtime")?;
    let served = runtime.block_on(server::serve(prepared));
    // An evaluation still on a blocking thread (its job was queued again by the drain)
    // does not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    served
}

fn non_empty(s: &str) -> Option<PathBuf> {
    (!s.is_empty()).then(|| PathBuf::from(s))
}
