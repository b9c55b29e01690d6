//! `kiln`, the command-line client of kilnd: one file per subcommand.

mod baselines;
mod bench;
mod cluster;
#[cfg(test)]
mod docs_commands;
mod doctor;
mod kernelbench;
mod output;
mod problems;
mod report;
mod search;
mod show;
mod status;
mod submit;
mod telemetry;
mod watch;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};
use kiln_daemon::client::Client;

pub use output::Output;

/// kiln — trustworthy verdicts and times for machine-written kernels.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Args {
    /// kilnd's socket (default: the user socket if it exists, else /run/kiln/kiln.sock).
    #[arg(long, global = true, env = "KILN_SOCKET")]
    socket: Option<PathBuf>,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Text)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Is kilnd up? Version, backends, queue.
    Status,
    /// GPUs kilnd sees.
    Devices,
    /// Check that this machine can evaluate kernels: backends, jail layers, GPUs.
    Doctor(doctor::DoctorArgs),
    /// Register, list and show problems.
    #[command(subcommand)]
    Problems(problems::ProblemsCmd),
    /// Submit a candidate (JSON file, a KernelBench `ModelNew` .py file, `-` for stdin).
    Submit(submit::SubmitArgs),
    /// Show a candidate, its job and its evaluation.
    Show(show::ShowArgs),
    /// Start, follow and inspect searches.
    #[command(subcommand)]
    Search(search::SearchCmd),
    /// Follow job progress live.
    Watch(watch::WatchArgs),
    /// Benchmark kiln itself: throughput, latency, timing stability, a cluster.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    /// Nodes sharing this kilnd's database: `kiln cluster status`.
    #[command(subcommand)]
    Cluster(cluster::ClusterCmd),
    /// KernelBench answers by the level: `kiln kernelbench run --level N --answers DIR`.
    #[command(subcommand)]
    Kernelbench(kernelbench::KernelbenchCmd),
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let socket = kiln_daemon::config::client_socket(args.socket.clone());
    let client = Client::new(socket);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kiln: cannot start: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args, client)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kiln: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args, client: Client) -> Result<std::process::ExitCode> {
    let out = args.output;
    match args.command {
        Command::Status => status::status(&client, out).await,
        Command::Devices => status::devices(&client, out).await,
        Command::Doctor(a) => doctor::doctor(&client, out, a).await,
        Command::Problems(cmd) => problems::run(&client, out, cmd).await,
        Command::Submit(a) => submit::submit(&client, out, a).await,
        Command::Show(a) => show::show(&client, out, a).await,
        Command::Search(cmd) => search::run(&client, out, cmd).await,
        Command::Watch(a) => watch::watch(&client, out, a).await,
        Command::Bench(cmd) => bench::run(&client, out, cmd).await,
        Command::Cluster(cmd) => cluster::run(&client, out, cmd).await,
        Command::Kernelbench(cmd) => kernelbench::run(&client, out, cmd).await,
    }
}
