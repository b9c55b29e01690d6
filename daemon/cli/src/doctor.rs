//! `kiln doctor`: can this machine evaluate kernels? What kilnd has (backends, Triton, jail
//! layers, every GPU with its lane, driver, clock policy and whether clock locking would
//! be permitted, where CUPTI is for kernel timing, the CUDA toolkit headers cuda
//! candidates compile with next to NVRTC's version), then one known kernel run end to end
//! on each usable backend — on every lane of the cuda backend, so each GPU is tried —
//! with how the GPU worker timed it (CUPTI kernel records, or events and why). A clear
//! report, and a non-zero exit when something essential is missing or a known kernel
//! does not come out `ok`.

use anyhow::{Context, Result};
use kiln_daemon::client::Client;
use kiln_types::BackendKind;
use serde_json::{Value, json};

use crate::Output;
use crate::output::{print_json, text};

/// `kiln doctor [--no-run]`.
#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Skip the known-kernel run (report only what kilnd says about itself).
    #[arg(long)]
    no_run: bool,
    /// Seconds to wait for each known kernel's verdict.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
}

/// The known kernel per backend: a problem of the seed suite with a tiny seed kernel. The
/// Triton seed of the cuda problem runs too when kilnd found triton.
const KNOWN: &[(BackendKind, &str)] = &[
    (BackendKind::Host, "vecadd-4096"),
    (BackendKind::Cuda, "vecadd-cuda-1m"),
];

/// Submits the seed of `problem` for `backend` as a fresh candidate (a comment makes it
/// new, so it really compiles and runs), pinned to `lane` when given, and waits for its
/// verdict.
async fn known_kernel(
    client: &Client,
    backend: &str,
    problem: &str,
    lane: Option<u64>,
    timeout: u64,
) -> Value {
    let run = async {
        let mut body = crate::submit::seed_candidate(client, problem, Some(backend)).await?;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let source = body["source"].as_str().unwrap_or("").to_string();
        let comment = if body["language"] == "triton" {
            "#"
        } else {
            "//"
        };
        let on = lane.map_or(String::new(), |l| format!(" lane {l}"));
        body["source"] = Value::String(format!("{source}\n{comment} kiln doctor {stamp}{on}\n"));
        body["note"] = Value::String("kiln doctor: known kernel".into());
        let query = lane.map_or(String::new(), |l| format!("?lane={l}"));
        let (_, resp) = client
            .post(&format!("/v1/candidates{query}"), &body)
            .await?;
        let id = resp["id"]
            .as_str()
            .with_context(|| format!("kilnd's reply has no id: {resp}"))?
            .to_string();
        let t0 = std::time::Instant::now();
        let record = crate::show::wait_for(client, &id, timeout).await?;
        anyhow::Ok((id, record, t0.elapsed().as_secs_f64()))
    };
    match run.await {
        Ok((id, record, secs)) => {
            let e = &record["evaluation"];
            let verdict = e["verdict"].as_str().unwrap_or("failed").to_string();
            json!({
                "backend": backend, "problem": problem, "lane": lane, "candidate": id,
                "ok": verdict == "ok", "verdict": verdict,
                "message": if e.is_null() { record["job"]["error"].clone() } else { e["message"].clone() },
                "median_us": e["timing"]["median_us"], "wall_s": secs,
                "timer": e["timing"]["timer"],
            })
        }
        Err(e) => json!({
            "backend": backend, "problem": problem, "lane": lane, "ok": false,
            "verdict": "not run", "message": format!("{e:#}"),
        }),
    }
}

/// How a GPU evaluation's samples were timed, in one line (`None` for the host backend).
fn timer_line(t: &Value) -> Option<String> {
    if t.is_null() {
        return None;
    }
    let us = |k: &str| t[k]["median_us"].as_f64().map(|v| format!("{v:.2} us"));
    Some(match t["source"].as_str() {
        Some("cupti") => format!(
            "timed by {} from CUPTI kernel records ({}): kernel span {}, kernel sum {}, events {}",
            text(&t["figure"]),
            text(&t["library"]),
            us("kernel_span").unwrap_or_else(|| "-".into()),
            us("kernel_sum").unwrap_or_else(|| "-".into()),
            us("events").unwrap_or_else(|| "-".into()),
        ),
        _ => format!(
            "timed by EVENTS (asked: {}), because {}",
            text(&t["asked"]),
            text(&t["fallback"])
        ),
    })
}

/// The lanes of `backend` kilnd lists (`/v1/info` `lanes`).
fn lanes_of<'a>(info: &'a Value, backend: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    info["lanes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(move |l| l["backend"].as_str() == Some(backend))
}

/// One line per GPU NVML lists, with its lane (or why it has none), then the lanes on no
/// GPU NVML lists; a last line when a GPU is missing a lane though `[gpu] devices` is
/// empty.
pub fn gpu_lines(info: &Value) -> Vec<String> {
    let gpus = info["gpus"].as_array().cloned().unwrap_or_default();
    if gpus.is_empty() {
        return vec![format!("gpus: none ({})", text(&info["gpu_error"]))];
    }
    let selected = info["gpu_devices"]
        .as_array()
        .is_some_and(|d| !d.is_empty());
    let cuda_usable =
        info["backends"].as_array().into_iter().flatten().any(|b| {
            b["name"] == BackendKind::Cuda.as_str() && b["usable"].as_bool() == Some(true)
        });
    let mut lines = vec![format!(
        "gpus: {} ({} with a lane)",
        gpus.len(),
        gpus.iter().filter(|g| g["lane"].is_u64()).count()
    )];
    let mut unexplained = 0;
    for g in &gpus {
        let lane = match g["lane"].as_u64() {
            Some(l) => {
                let worker = lanes_of(info, BackendKind::Cuda.as_str())
                    .find(|x| x["lane"].as_u64() == Some(l))
                    .map_or(String::new(), |x| {
                        format!(
                            " (workers started {}, {} evaluations, busy {:.1} s)",
                            text(&x["workers_started"]),
                            text(&x["evaluations"]),
                            x["busy_s"].as_f64().unwrap_or(0.0)
                        )
                    });
                format!("lane {l}{worker}")
            }
            None if !cuda_usable => "no lane (the cuda backend is not usable)".into(),
            None if selected => "no lane (not in [gpu] devices)".into(),
            None => {
                unexplained += 1;
                "no lane (CUDA does not list it)".into()
            }
        };
        lines.push(format!(
            "  gpu{}  {}  {}  {lane}",
            text(&g["index"]),
            text(&g["name"]),
            text(&g["uuid"]),
        ));
    }
    for l in lanes_of(info, BackendKind::Cuda.as_str()).filter(|l| l["gpu"].is_null()) {
        lines.push(format!(
            "  lane {} on {} (a GPU NVML does not list)",
            text(&l["lane"]),
            text(&l["label"])
        ));
    }
    if unexplained > 0 {
        lines.push(format!(
            "  note: {unexplained} GPU(s) NVML lists have no lane although [gpu] devices is \
             empty: is CUDA_VISIBLE_DEVICES set in kilnd's environment?"
        ));
    }
    lines
}

/// The toolkit headers: what cuda compiles use, NVRTC's version beside theirs, and where
/// kiln looked (`[cuda] include_dirs` or the default search).
fn print_cuda_headers(h: &Value) {
    if h.is_null() {
        return;
    }
    let nvrtc = h["nvrtc_version"]
        .as_str()
        .map_or_else(|| "not found".to_string(), str::to_string);
    let mark = if h["found"].as_bool() == Some(true) {
        "ok"
    } else {
        "--"
    };
    println!("cuda headers ([cuda] include_dirs):");
    println!("  [{mark}] {}; NVRTC {nvrtc}", text(&h["detail"]));
    if let Some(w) = h["warning"].as_str() {
        println!("  WARNING: {w}");
    }
    for s in h["searched"].as_array().into_iter().flatten() {
        let used = if s["used"].as_bool() == Some(true) {
            "used"
        } else {
            "    "
        };
        println!("    {used} {} ({})", text(&s["path"]), text(&s["note"]));
    }
}

/// Asks kilnd what it has, runs the known kernels, and judges it.
pub async fn doctor(
    client: &Client,
    out: Output,
    args: DoctorArgs,
) -> Result<std::process::ExitCode> {
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
    let mut runs: Vec<Value> = Vec::new();
    let mut known: Vec<&str> = usable.iter().map(String::as_str).collect();
    if usable.iter().any(|b| *b == BackendKind::Cuda)
        && info["triton"]["usable"].as_bool() == Some(true)
    {
        known.push("triton");
    }
    if !args.no_run {
        for b in known {
            let key = if b == "triton" {
                BackendKind::Cuda.as_str()
            } else {
                b
            };
            let Some((_, problem)) = KNOWN.iter().find(|(k, _)| *k == key) else {
                continue;
            };
            if client
                .get(&format!("/v1/problems/{problem}"))
                .await
                .is_err()
            {
                runs.push(json!({
                    "backend": b, "problem": problem, "ok": null, "verdict": "skipped",
                    "message": format!("problem {problem} is not registered (kiln problems add problems/{problem})"),
                }));
                continue;
            }
            // cuda: one run per lane, all at once (each GPU is tried); host: one run.
            let lanes: Vec<Option<u64>> = if b == BackendKind::Cuda {
                lanes_of(&info, b).map(|l| l["lane"].as_u64()).collect()
            } else {
                vec![None]
            };
            let lanes = if lanes.is_empty() { vec![None] } else { lanes };
            let each = lanes
                .into_iter()
                .map(|lane| known_kernel(client, b, problem, lane, args.timeout));
            runs.extend(futures_util::future::join_all(each).await);
        }
    }
    let runs_ok = runs.iter().all(|r| r["ok"].as_bool() != Some(false));
    // In a cluster: whether this node claims work, and why not (a drifted calibration).
    let cluster = client.get("/v1/cluster").await.unwrap_or(Value::Null);
    let paused = cluster["this_node"]["paused"].as_str().map(str::to_string);
    let essential_ok = !usable.is_empty() && runs_ok && paused.is_none();
    if out == Output::Json {
        print_json(&json!({
            "ok": essential_ok,
            "usable_backends": usable,
            "backends": backends,
            "jail": info["jail"],
            "gpus": info["gpus"],
            "gpu_devices": info["gpu_devices"],
            "lanes": info["lanes"],
            "gpu_error": info["gpu_error"],
            "driver_version": info["driver_version"],
            "cuda_driver_version": info["cuda_driver_version"],
            "clock_policy": info["clock_policy"],
            "clock_lock": info["clock_lock"],
            "baseline_libraries": info["baseline_libraries"],
            "kernel_timer": info["kernel_timer"],
            "cuda_headers": info["cuda_headers"],
            "triton": info["triton"],
            "known_kernels": runs,
            "cluster": cluster,
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
        let triton = &info["triton"];
        println!(
            "  [{}] triton {}",
            if triton["usable"].as_bool() == Some(true) {
                "ok  "
            } else {
                "--  "
            },
            if triton.is_null() {
                "not reported by this kilnd".to_string()
            } else {
                text(&triton["detail"])
            }
        );
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
        for line in gpu_lines(&info) {
            println!("{line}");
        }
        println!(
            "driver: {}  cuda: {}  clock policy: {}",
            text(&info["driver_version"]),
            text(&info["cuda_driver_version"]),
            text(&info["clock_policy"])
        );
        let lock = &info["clock_lock"];
        println!(
            "clock locking: {} ({})",
            if lock["permitted"].as_bool() == Some(true) {
                "would be permitted"
            } else {
                "not permitted"
            },
            text(&lock["detail"])
        );
        print_cuda_headers(&info["cuda_headers"]);
        let bl = &info["baseline_libraries"];
        println!("baseline libraries (for GPU workers, [gpu] library_dirs):");
        for l in bl["libraries"].as_array().into_iter().flatten() {
            let mark = if l["found"].as_bool() == Some(true) {
                "ok"
            } else {
                "--"
            };
            println!("  [{mark}] {:<6} {}", text(&l["name"]), text(&l["detail"]));
        }
        if !bl["torch_python"].is_null() {
            println!("  torch  {}", text(&bl["torch_python"]));
        }
        let kt = &info["kernel_timer"];
        if !kt.is_null() {
            let mark = if kt["found"].as_bool() == Some(true) {
                "ok"
            } else {
                "--"
            };
            println!(
                "kernel timer (CUPTI, [gpu] cupti = {}):\n  [{mark}] {} {}",
                text(&kt["setting"]),
                kt["library"].as_str().unwrap_or("not found:"),
                text(&kt["detail"])
            );
        }
        if !runs.is_empty() {
            println!("known kernels, end to end:");
        }
        for r in &runs {
            let mark = match r["ok"].as_bool() {
                Some(true) => "ok  ",
                Some(false) => "FAIL",
                None => "skip",
            };
            let time = r["median_us"]
                .as_f64()
                .map_or(String::new(), |us| format!(" median {us:.2} us,"));
            let wall = r["wall_s"]
                .as_f64()
                .map_or(String::new(), |s| format!(" {s:.1} s end to end;"));
            let on = r["lane"]
                .as_u64()
                .map_or(String::new(), |l| format!(" on lane {l}"));
            println!(
                "  [{mark}] {:<5} {}{on}: {}{time}{wall} {}",
                text(&r["backend"]),
                text(&r["problem"]),
                text(&r["verdict"]),
                text(&r["message"])
            );
            if let Some(line) = timer_line(&r["timer"]) {
                println!("         {line}");
            }
        }
        if cluster["clustered"] == true {
            let nodes = cluster["nodes"].as_array().cloned().unwrap_or_default();
            let alive = nodes.iter().filter(|n| n["alive"] == true).count();
            let classes: Vec<String> = cluster["this_node"]["classes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| text(&c["class"]))
                .collect();
            println!(
                "cluster: node {}, {alive} of {} nodes alive; lanes claim for {}",
                text(&cluster["this_node"]["id"]),
                nodes.len(),
                if classes.is_empty() {
                    "nothing (a gateway)".to_string()
                } else {
                    classes.join(", ")
                }
            );
            if let Some(p) = &paused {
                println!("  [FAIL] this node does not claim: {p}");
            }
            for c in cluster["queued_without_capacity"]
                .as_array()
                .into_iter()
                .flatten()
            {
                println!("  [warn] {} has queued jobs and no live lane", text(c));
            }
        }
        if let Some(p) = &paused {
            println!("NOT READY: this node stopped claiming: {p}");
        } else if essential_ok {
            println!(
                "ready: candidates for {} will be evaluated",
                usable.join(", ")
            );
        } else if usable.is_empty() {
            println!("NOT READY: no usable backend; jobs will wait in the queue");
        } else {
            println!("NOT READY: a known kernel did not come out ok (see above)");
        }
    }
    Ok(if essential_ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/v1/info` of a host with four GPUs, of which `lanes` (NVML indices) have lanes.
    fn info(lanes: &[u64], devices: &[&str]) -> Value {
        let gpus: Vec<Value> = (0..4u64)
            .map(|i| {
                let lane = lanes.iter().position(|l| *l == i);
                json!({"index": i, "name": "NVIDIA H200", "uuid": format!("GPU-{i}"), "lane": lane})
            })
            .collect();
        let lane_list: Vec<Value> = lanes
            .iter()
            .enumerate()
            .map(|(lane, gpu)| {
                json!({"backend": "cuda", "lane": lane, "label": format!("GPU-{gpu}"),
                       "gpu": gpu, "workers_started": 1, "evaluations": 3, "busy_s": 1.5})
            })
            .collect();
        json!({
            "backends": [{"name": "cuda", "usable": true, "detail": ""}],
            "gpus": gpus, "lanes": lane_list, "gpu_devices": devices,
        })
    }

    #[test]
    fn every_gpu_is_listed_with_its_lane_or_why_it_has_none() {
        let lines = gpu_lines(&info(&[0, 1, 3], &["0", "1", "GPU-3"]));
        assert_eq!(lines[0], "gpus: 4 (3 with a lane)");
        assert_eq!(lines.len(), 5, "{lines:#?}");
        assert!(
            lines[1].contains("gpu0")
                && lines[1].contains("GPU-0")
                && lines[1].contains("lane 0 ("),
            "{}",
            lines[1]
        );
        assert!(
            lines[1].contains("workers started 1, 3 evaluations"),
            "{}",
            lines[1]
        );
        assert!(lines[3].contains("GPU-2") && lines[3].ends_with("no lane (not in [gpu] devices)"));
        assert!(
            lines[4].contains("GPU-3") && lines[4].contains("lane 2 ("),
            "{}",
            lines[4]
        );
    }

    #[test]
    fn a_gpu_without_a_lane_though_all_were_asked_for_is_pointed_out() {
        let lines = gpu_lines(&info(&[0, 1, 2], &[]));
        assert!(
            lines[4].ends_with("no lane (CUDA does not list it)"),
            "{lines:#?}"
        );
        assert!(lines[5].contains("CUDA_VISIBLE_DEVICES"), "{lines:#?}");
        let mut unusable = info(&[], &[]);
        unusable["backends"][0]["usable"] = json!(false);
        let lines = gpu_lines(&unusable);
        assert!(lines[1].ends_with("no lane (the cuda backend is not usable)"));
        assert_eq!(lines.len(), 5);
        let none = gpu_lines(&json!({"gpus": [], "gpu_error": "NVML is not available"}));
        assert_eq!(none, ["gpus: none (NVML is not available)"]);
    }
}
