//! `kiln bench throughput|latency|stability|agreement|lanes`: kiln's own benchmarks, run
//! against a live kilnd on any backend (agreement: cuda, with Nsight Compute on the host);
//! `kiln bench cluster` starts a cluster of its own on this machine. docs/benchmarks.md
//! describes the method and each number.

mod agreement;
mod cluster;
mod common;
mod floor;
mod lanes;
mod latency;
mod stability;
mod throughput;

use anyhow::Result;
use clap::Subcommand;
use kiln_daemon::client::Client;

use crate::Output;

/// Benchmark subcommands.
#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// Distinct candidates end to end: candidates per minute, lane busy fraction, stage latencies.
    Throughput(throughput::ThroughputArgs),
    /// Submit → verdict for a tiny kernel whose compile is cached.
    Latency(latency::LatencyArgs),
    /// One kernel evaluated N times among other candidates: CV of its medians, and a plain loop.
    Stability(stability::StabilityArgs),
    /// kiln's median of each seed kernel against Nsight Compute's gpu__time_duration.
    Agreement(agreement::AgreementArgs),
    /// Many kilnd nodes on this machine sharing one PostgreSQL: evaluations per minute,
    /// claim latency and the database's cost against the number of nodes.
    Cluster(cluster::ClusterArgs),
    /// The same kernel on every lane (GPU): medians, their spread, each GPU's factor vs
    /// lane 0; with --isolation, faults on the other lanes while lane 0 times it.
    Lanes(lanes::LanesArgs),
}

/// Runs a benchmark.
pub async fn run(client: &Client, out: Output, cmd: BenchCmd) -> Result<std::process::ExitCode> {
    match cmd {
        BenchCmd::Throughput(a) => throughput::run(client, out, a).await,
        BenchCmd::Latency(a) => latency::run(client, out, a).await,
        BenchCmd::Stability(a) => stability::run(client, out, a).await,
        BenchCmd::Agreement(a) => agreement::run(client, out, a).await,
        BenchCmd::Cluster(a) => cluster::run(out, a).await,
        BenchCmd::Lanes(a) => lanes::run(client, out, a).await,
    }
}
