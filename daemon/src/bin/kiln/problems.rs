//! `kiln problems add DIR | list | show NAME | baseline NAME [--remeasure] [--gpu GPU]`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Subcommand;
use kiln_daemon::client::Client;
use kiln_types::ProblemSpec;

use crate::Output;
use crate::output::{print_json, text};

/// Problem subcommands.
#[derive(Debug, Subcommand)]
pub enum ProblemsCmd {
    /// Register the problem in DIR (problem.toml and the sources it names).
    /// A folder holding several problem folders registers each of them.
    Add {
        /// The problem folder.
        dir: PathBuf,
    },
    /// List registered problems.
    List,
    /// Show one problem: tensors, sizes, roofline figures and floor on this GPU, and the
    /// baselines measured here.
    Show {
        /// Problem name.
        name: String,
    },
    /// Time the problem's baselines on this machine's GPU (the reference, cuBLAS/cuDNN,
    /// torch eager), or show the cached times. The first measurement takes minutes.
    Baseline {
        /// Problem name.
        name: String,
        /// Measure again even when cached.
        #[arg(long)]
        remeasure: bool,
        /// On a host with GPUs of different models: the GPU whose model to time them on,
        /// by index or UUID as `kiln devices` lists them (default: lane 0's GPU).
        #[arg(long)]
        gpu: Option<String>,
    },
}

fn problem_dirs(dir: &std::path::Path) -> Result<Vec<PathBuf>> {
    if dir.join("problem.toml").is_file() {
        return Ok(vec![dir.to_path_buf()]);
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("problem.toml").is_file())
        .collect();
    dirs.sort();
    anyhow::ensure!(
        !dirs.is_empty(),
        "{} holds no problem.toml (nor folders with one)",
        dir.display()
    );
    Ok(dirs)
}

/// Runs a problems subcommand.
pub async fn run(client: &Client, out: Output, cmd: ProblemsCmd) -> Result<std::process::ExitCode> {
    match cmd {
        ProblemsCmd::Add { dir } => {
            let mut results = Vec::new();
            for d in problem_dirs(&dir)? {
                let spec =
                    ProblemSpec::load_dir(&d).with_context(|| format!("in {}", d.display()))?;
                let (status, v) = client
                    .post("/v1/problems", &serde_json::to_value(&spec)?)
                    .await?;
                if out == Output::Text {
                    let what = if status == 201 {
                        "registered"
                    } else {
                        "already registered"
                    };
                    println!("{what}: {}", spec.name);
                }
                results.push(v);
            }
            if out == Output::Json {
                print_json(&serde_json::Value::Array(results));
            }
        }
        ProblemsCmd::List => {
            let v = client.get("/v1/problems").await?;
            if out == Output::Json {
                print_json(&v);
            } else {
                let list = v["problems"].as_array().cloned().unwrap_or_default();
                if list.is_empty() {
                    println!("no problems registered; add one with `kiln problems add DIR`");
                }
                for p in list {
                    let backends: Vec<String> = p["backends"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(text)
                        .collect();
                    println!(
                        "{:<28} [{}]  {}",
                        text(&p["name"]),
                        backends.join(","),
                        text(&p["summary"])
                    );
                }
            }
        }
        ProblemsCmd::Show { name } => {
            let v = client.get(&format!("/v1/problems/{name}")).await?;
            if out == Output::Json {
                print_json(&v);
            } else {
                let spec = &v["spec"];
                println!("{} — {}", text(&spec["name"]), text(&spec["summary"]));
                for t in spec["tensor"].as_array().into_iter().flatten() {
                    println!(
                        "  {:<7} {:<10} {:<5} {}",
                        text(&t["role"]),
                        text(&t["name"]),
                        text(&t["dtype"]),
                        t["shape"]
                    );
                }
                println!(
                    "  tolerance  atol {}  rtol {}",
                    text(&spec["tolerance"]["atol"]),
                    text(&spec["tolerance"]["rtol"])
                );
                if let Some(tier) = spec.get("required_tier") {
                    println!("  requires   {}", text(tier));
                }
                let d = &v["derived"];
                println!(
                    "  bytes      in {}  out {}  roofline min {}",
                    text(&d["input_bytes"]),
                    text(&d["output_bytes"]),
                    text(&d["min_bytes"])
                );
                println!("  flops      {}", text(&d["flops"]));
                let backends: Vec<String> = d["backends"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(text)
                    .collect();
                println!("  backends   {}", backends.join(", "));
                let f = &d["floor"];
                if let Some(floor) = f["floor_us"].as_f64() {
                    println!(
                        "  floor      {floor:.1} us on this GPU (memory {:.1} us; strict fp32 {:.1} us)",
                        f["memory_us"].as_f64().unwrap_or(0.0),
                        f["floor_fp32_us"].as_f64().unwrap_or(0.0)
                    );
                }
                let sets = v["baselines"].as_array().cloned().unwrap_or_default();
                if sets.is_empty() {
                    println!("  baselines  none measured yet: `kiln problems baseline {name}`");
                }
                for set in &sets {
                    println!("  baselines");
                    for line in crate::baselines::set_lines(set) {
                        println!("  {line}");
                    }
                }
            }
        }
        ProblemsCmd::Baseline {
            name,
            remeasure,
            gpu,
        } => {
            if out == Output::Text {
                eprintln!("timing the baselines of {name} on the GPU (minutes the first time)...");
            }
            let (status, v) = client
                .post(
                    &format!("/v1/problems/{name}/baselines"),
                    &serde_json::json!({ "remeasure": remeasure, "gpu": gpu }),
                )
                .await?;
            if out == Output::Json {
                print_json(&v);
            } else if status >= 400 {
                anyhow::bail!("{}", text(&v["error"]["message"]));
            } else {
                println!("{name}");
                for line in crate::baselines::set_lines(&v) {
                    println!("{line}");
                }
            }
            if status >= 400 {
                return Ok(std::process::ExitCode::from(1));
            }
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}
