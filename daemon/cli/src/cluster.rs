//! `kiln cluster status`: the cluster as the local kilnd sees it — nodes (alive, lanes and
//! classes, leases held, searches hosted, why one stopped claiming), the queue per GPU
//! class, classes with work and no live lane, and calibrations.

use anyhow::Result;
use clap::Subcommand;
use kiln_daemon::client::Client;
use serde_json::Value;

use crate::Output;
use crate::output::{print_json, text};

/// `kiln cluster …`
#[derive(Debug, Subcommand)]
pub enum ClusterCmd {
    /// Nodes, classes, lanes, leases, the queue per class, drifting nodes.
    Status,
}

/// Runs a `kiln cluster` subcommand.
pub async fn run(client: &Client, out: Output, cmd: ClusterCmd) -> Result<std::process::ExitCode> {
    match cmd {
        ClusterCmd::Status => status(client, out).await,
    }
}

fn lanes(node: &Value) -> String {
    let l: Vec<String> = node["lanes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| format!("{}×{}", text(&l["lanes"]), text(&l["class"])))
        .collect();
    if l.is_empty() {
        "no lanes".into()
    } else {
        l.join(", ")
    }
}

async fn status(client: &Client, out: Output) -> Result<std::process::ExitCode> {
    let s = client.get("/v1/cluster").await?;
    if out == Output::Json {
        print_json(&s);
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let this = &s["this_node"];
    if s["clustered"] != true {
        println!(
            "node {} — a single host, not in a cluster",
            text(&this["id"])
        );
        println!("  {}", text(&s["detail"]));
        return Ok(std::process::ExitCode::SUCCESS);
    }
    println!(
        "cluster seen from node {} (lease {} s)",
        text(&this["id"]),
        text(&s["lease_secs"])
    );
    if let Some(p) = this["paused"].as_str() {
        println!("  this node does not claim: {p}");
    }
    println!("nodes:");
    for n in s["nodes"].as_array().into_iter().flatten() {
        let state = if n["stopped"] == true {
            "stopped".to_string()
        } else if n["alive"] == true {
            "alive".to_string()
        } else {
            format!(
                "silent for {:.0} s",
                n["seen_secs_ago"].as_f64().unwrap_or(0.0)
            )
        };
        let role = match (n["evaluates"].as_bool(), n["runs_searches"].as_bool()) {
            (Some(false), _) => "gateway",
            (_, Some(false)) => "evaluates",
            _ => "evaluates, hosts searches",
        };
        println!(
            "  {:<16} {:<10} {role}; {}; holds {} jobs, hosts {} searches; kiln {}",
            text(&n["id"]),
            state,
            lanes(n),
            text(&n["held_jobs"]),
            text(&n["hosted_searches"]),
            text(&n["version"]),
        );
        if let Some(d) = n["drift"].as_str() {
            println!("  {:<16} stopped claiming: {d}", "");
        }
    }
    println!("queue per class:");
    let classes = s["classes"].as_array().cloned().unwrap_or_default();
    if classes.is_empty() {
        println!("  (nothing waiting or running)");
    }
    for c in &classes {
        let class = match c["class"].as_str() {
            Some("") | None => "(any class)",
            Some(c) => c,
        };
        println!(
            "  {class:<48} queued {:>5}  claimed {:>4}  running {:>4}  live lanes {}",
            text(&c["queued"]),
            text(&c["claimed"]),
            text(&c["running"]),
            text(&c["live_lanes"]),
        );
    }
    for c in s["queued_without_capacity"]
        .as_array()
        .into_iter()
        .flatten()
    {
        println!(
            "  warning: {} has queued jobs and no live lane to take them",
            text(c)
        );
    }
    let cal = s["calibrations"].as_array().cloned().unwrap_or_default();
    if !cal.is_empty() {
        println!("calibrations (median of the fixed kernel):");
        for c in &cal {
            println!(
                "  {:<16} {:<40} {:.1} us",
                text(&c["node"]),
                text(&c["class"]),
                c["median_us"].as_f64().unwrap_or(0.0)
            );
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}
