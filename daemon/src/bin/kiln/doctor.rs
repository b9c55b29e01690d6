//! `kiln doctor`: can this machine evaluate kernels? A clear report and a non-zero exit
//! when something essential is missing.

use anyhow::Result;
use kiln_daemon::client::Client;
use serde_json::json;

use crate::Output;
use crate::output::{print_json, text};

/// Asks kilnd what it has and judges it.
pub async fn doctor(client: &Client, out: Output) -> Result<std::process::ExitCode> {
    let info = client.get("/v1/info").await?;
    let backends = info["backends"].as_array().cloned().unwrap_or_default();
    let usable: Vec<String> = backends
        .iter()
        .filter(|b| b["usable"].as_bool() == Some(true))
        .map(|b| text(&b["name"]))
        .collect();
    let layers = info["jail"]["layers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let essential_ok = !usable.is_empty();
    if out == Output::Json {
        print_json(&json!({
            "ok": essential_ok,
            "usable_backends": usable,
            "backends": backends,
            "jail": info["jail"],
            "gpus": info["gpus"],
            "gpu_error": info["gpu_error"],
            "driver_version": info["driver_version"],
            "cuda_driver_version": info["cuda_driver_version"],
            "clock_policy": info["clock_policy"],
        }));
    } else {
        println!(
            "kilnd {} at {}",
            text(&info["version"]),
            client.socket().display()
        );
        println!("backends:");
        for b in &backends {
            let mark = if b["usable"].as_bool() == Some(true) {
                "ok  "
            } else {
                "MISS"
            };
            println!("  [{mark}] {:<5} {}", text(&b["name"]), text(&b["detail"]));
        }
        println!("jail layers:");
        if layers.is_empty() {
            println!("  (none reported)");
        }
        for l in &layers {
            let mark = if l["active"].as_bool() == Some(true) {
                "on  "
            } else {
                "off "
            };
            println!("  [{mark}] {:<12} {}", text(&l["name"]), text(&l["detail"]));
        }
        let gpus = info["gpus"].as_array().cloned().unwrap_or_default();
        println!(
            "gpus: {}",
            if gpus.is_empty() {
                format!("none ({})", text(&info["gpu_error"]))
            } else {
                gpus.iter()
                    .map(|g| text(&g["name"]))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
        println!(
            "driver: {}  cuda: {}  clock policy: {}",
            text(&info["driver_version"]),
            text(&info["cuda_driver_version"]),
            text(&info["clock_policy"])
        );
        if essential_ok {
            println!(
                "ready: candidates for {} will be evaluated",
                usable.join(", ")
            );
        } else {
            println!("NOT READY: no usable backend; jobs will wait in the queue");
        }
    }
    Ok(if essential_ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}
