//! `kiln status` and `kiln devices`.

use anyhow::Result;
use kiln_daemon::client::Client;
use serde_json::json;

use crate::Output;
use crate::output::{print_json, text};

/// `kiln status`
pub async fn status(client: &Client, out: Output) -> Result<std::process::ExitCode> {
    let health = client.get("/v1/health").await?;
    let info = client.get("/v1/info").await?;
    if out == Output::Json {
        print_json(&json!({"health": health, "info": info}));
        return Ok(std::process::ExitCode::SUCCESS);
    }
    println!(
        "kilnd {} — {}",
        text(&health["version"]),
        text(&health["status"])
    );
    println!("  socket     {}", client.socket().display());
    println!("  state dir  {}", text(&info["state_dir"]));
    println!("  uptime     {} s", text(&health["uptime_s"]));
    println!(
        "  queued     {} (not yet on a lane: queued, compiling or waiting for a lane)",
        text(&health["queued"])
    );
    println!(
        "  running    {} (evaluating on a lane)",
        text(&health["running"])
    );
    for b in info["backends"].as_array().into_iter().flatten() {
        let mark = if b["usable"].as_bool() == Some(true) {
            "usable"
        } else {
            "unavailable"
        };
        println!(
            "  backend    {:<5} {mark}: {}",
            text(&b["name"]),
            text(&b["detail"])
        );
    }
    println!(
        "  gpus       {}",
        info["gpus"].as_array().map_or(0, Vec::len)
    );
    Ok(std::process::ExitCode::SUCCESS)
}

/// `kiln devices`
pub async fn devices(client: &Client, out: Output) -> Result<std::process::ExitCode> {
    let info = client.get("/v1/info").await?;
    if out == Output::Json {
        print_json(&json!({
            "gpus": info["gpus"], "gpu_error": info["gpu_error"], "lanes": info["lanes"],
            "driver_version": info["driver_version"], "cuda_driver_version": info["cuda_driver_version"],
        }));
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let gpus = info["gpus"].as_array().cloned().unwrap_or_default();
    if gpus.is_empty() {
        println!("no GPUs: {}", text(&info["gpu_error"]));
        return Ok(std::process::ExitCode::SUCCESS);
    }
    println!(
        "driver {}  cuda {}",
        text(&info["driver_version"]),
        text(&info["cuda_driver_version"])
    );
    for g in gpus {
        let mem_gib = g["memory_total_bytes"].as_f64().map_or("-".into(), |b| {
            format!("{:.0} GiB", b / (1u64 << 30) as f64)
        });
        let lane = g["lane"]
            .as_u64()
            .map_or_else(|| "no lane".to_string(), |l| format!("lane {l}"));
        println!(
            "  gpu{}  {}  {}  {lane}  sm {}  mem {}  sm clock {}/{} MHz  mem clock {}/{} MHz",
            text(&g["index"]),
            text(&g["name"]),
            text(&g["uuid"]),
            text(&g["compute_capability"]),
            mem_gib,
            text(&g["sm_clock_mhz"]),
            text(&g["sm_clock_max_mhz"]),
            text(&g["mem_clock_mhz"]),
            text(&g["mem_clock_max_mhz"]),
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}
