//! `kiln search start|list|show|log|cancel`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use base64::Engine;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use kiln_daemon::client::Client;
use serde_json::{Value, json};

use crate::Output;
use crate::output::{fmt_us, print_json, text};

/// Search subcommands.
#[derive(Debug, Subcommand)]
pub enum SearchCmd {
    /// Start a search with a proposer plugin.
    Start(StartArgs),
    /// List searches.
    List {
        /// Only searches in this state (running, done, failed, cancelled).
        #[arg(long)]
        state: Option<String>,
    },
    /// Show a search: progress, best candidate and its lineage, the archive.
    Show {
        /// Search id.
        id: String,
        /// Print every candidate of the archive.
        #[arg(long)]
        archive: bool,
    },
    /// Write a search's report: an HTML page with its plots (best over time, every
    /// evaluation, the MAP-Elites grid, the lineage, the rounds). Open it in a browser; a
    /// running search's page reloads itself.
    Report {
        /// Search id.
        id: String,
        /// Write the page to this file instead of stdout (`-o` is the output format).
        #[arg(short = 'O', long = "out", value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Print a search's log.
    Log {
        /// Search id.
        id: String,
        /// Keep following new lines until the search ends.
        #[arg(short, long)]
        follow: bool,
    },
    /// Cancel a running search.
    Cancel {
        /// Search id.
        id: String,
    },
}

/// Arguments of `kiln search start`.
#[derive(Debug, Args)]
pub struct StartArgs {
    /// The problem to search on.
    #[arg(long)]
    problem: String,
    /// An installed proposer's name (hill-climb, idea-branch, map-elites) or a .wasm file.
    #[arg(long)]
    proposer: String,
    /// Configuration passed to the proposer (JSON).
    #[arg(long)]
    config: Option<String>,
    /// Most distinct candidates to evaluate.
    #[arg(long)]
    budget: Option<u64>,
    /// Wall-clock limit, e.g. `90s`, `10m`, `1h`.
    #[arg(long, value_parser = parse_duration)]
    time_limit: Option<u64>,
    /// LLM tokens the search may spend.
    #[arg(long)]
    llm_tokens: Option<u64>,
    /// Seed for the proposer's randomness (default: random).
    #[arg(long)]
    seed: Option<u64>,
    /// Follow progress and print the result at the end.
    #[arg(long)]
    wait: bool,
}

/// Parses `90`, `90s`, `10m`, `1h` into seconds.
fn parse_duration(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('s') => (&s[..s.len() - 1], 1),
        Some('m') => (&s[..s.len() - 1], 60),
        Some('h') => (&s[..s.len() - 1], 3600),
        _ => (s, 1),
    };
    num.trim()
        .parse::<u64>()
        .map(|n| n * mult)
        .map_err(|_| format!("{s:?} is not a duration like 90s, 10m or 1h"))
}

/// Runs a search subcommand.
pub async fn run(client: &Client, out: Output, cmd: SearchCmd) -> Result<std::process::ExitCode> {
    match cmd {
        SearchCmd::Start(a) => start(client, out, a).await,
        SearchCmd::List { state } => {
            let path = match state {
                Some(s) => format!("/v1/searches?state={s}"),
                None => "/v1/searches".into(),
            };
            let v = client.get(&path).await?;
            if out == Output::Json {
                print_json(&v);
            } else {
                let list = v["searches"].as_array().cloned().unwrap_or_default();
                if list.is_empty() {
                    println!("no searches");
                }
                for s in list {
                    println!(
                        "{}  {:<9} {:<24} {:<12} {}/{}  best {}",
                        text(&s["id"]),
                        text(&s["state"]),
                        text(&s["problem"]),
                        text(&s["proposer"]),
                        text(&s["evaluated"]),
                        text(&s["budget_candidates"]),
                        s["best"][1].as_f64().map_or("-".into(), fmt_us)
                    );
                }
            }
            Ok(std::process::ExitCode::SUCCESS)
        }
        SearchCmd::Show { id, archive } => {
            let (search, entries) = fetch(client, &id).await?;
            let speedups = best_speedups(client, &search).await;
            if out == Output::Json {
                print_json(
                    &json!({"search": search, "archive": entries, "best_speedups": speedups}),
                );
            } else {
                print_search(&search, &entries, archive);
                print_speedups(&search, &speedups);
            }
            Ok(std::process::ExitCode::SUCCESS)
        }
        SearchCmd::Report { id, out: file } => {
            crate::report::fetch(
                client,
                &format!("/v1/searches/{id}/report"),
                file.as_deref(),
            )
            .await?;
            Ok(std::process::ExitCode::SUCCESS)
        }
        SearchCmd::Log { id, follow } => {
            let mut after = 0i64;
            loop {
                let v = client
                    .get(&format!("/v1/searches/{id}/log?after={after}"))
                    .await?;
                for l in v["lines"].as_array().into_iter().flatten() {
                    after = l["id"].as_i64().unwrap_or(after);
                    if out == Output::Json {
                        println!("{l}");
                    } else {
                        println!("{:<5} {}", text(&l["level"]), text(&l["message"]));
                    }
                }
                if !follow {
                    break;
                }
                let s = client.get(&format!("/v1/searches/{id}")).await?;
                if s["state"] != "running" {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Ok(std::process::ExitCode::SUCCESS)
        }
        SearchCmd::Cancel { id } => {
            let (_, v) = client
                .post(&format!("/v1/searches/{id}/cancel"), &json!({}))
                .await?;
            if out == Output::Json {
                print_json(&v);
            } else {
                println!("{id} cancelled");
            }
            Ok(std::process::ExitCode::SUCCESS)
        }
    }
}

async fn start(client: &Client, out: Output, a: StartArgs) -> Result<std::process::ExitCode> {
    let mut body = json!({"problem": a.problem});
    let looks_like_file = a.proposer.ends_with(".wasm") || a.proposer.contains('/');
    if looks_like_file {
        let path = PathBuf::from(&a.proposer);
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        body["wasm_base64"] = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
        if let Some(stem) = path.file_stem().and_then(|s| s.to_str()) {
            body["proposer"] = json!(stem);
        }
    } else {
        body["proposer"] = json!(a.proposer);
    }
    if let Some(c) = &a.config {
        let v: Value = serde_json::from_str(c).context("--config is not JSON")?;
        body["config"] = v;
    }
    for (k, v) in [
        ("budget", a.budget),
        ("time_limit_secs", a.time_limit),
        ("llm_tokens", a.llm_tokens),
        ("seed", a.seed),
    ] {
        if let Some(v) = v {
            body[k] = json!(v);
        }
    }
    let (_, v) = client.post("/v1/searches", &body).await?;
    let id = v["id"]
        .as_str()
        .context("kilnd's reply has no search id")?
        .to_string();
    if !a.wait {
        if out == Output::Json {
            print_json(&v);
        } else {
            println!("{id}");
        }
        return Ok(std::process::ExitCode::SUCCESS);
    }
    follow(client, &id, out == Output::Text).await?;
    let (search, entries) = fetch(client, &id).await?;
    let speedups = best_speedups(client, &search).await;
    if out == Output::Json {
        print_json(&json!({"search": search, "archive": entries, "best_speedups": speedups}));
    } else {
        print_search(&search, &entries, false);
        print_speedups(&search, &speedups);
    }
    Ok(if search["state"] == "done" {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

/// Follows a search's events until it ends, with a progress bar.
async fn follow(client: &Client, id: &str, show: bool) -> Result<()> {
    let mut events = client.events().await?;
    let first = client.get(&format!("/v1/searches/{id}")).await?;
    let bar = show.then(|| {
        let b = ProgressBar::new(first["budget_candidates"].as_u64().unwrap_or(0));
        b.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} evaluated  {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b.enable_steady_tick(Duration::from_millis(200));
        b
    });
    if first["state"] != "running" {
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        return Ok(());
    }
    loop {
        let next = tokio::time::timeout(Duration::from_secs(2), events.next()).await;
        let ev = match next {
            Ok(Some(ev)) => Some(ev),
            Ok(None) => None,
            Err(_) => {
                // No event for a while: look at the search directly (covers missed events).
                let s = client.get(&format!("/v1/searches/{id}")).await?;
                if s["state"] != "running" {
                    if let Some(b) = &bar {
                        b.finish_and_clear();
                    }
                    return Ok(());
                }
                continue;
            }
        };
        let Some((name, data)) = ev else {
            break;
        };
        match name.as_str() {
            "search" if data["search_id"] == id => {
                if let Some(b) = &bar {
                    b.set_position(data["evaluated"].as_u64().unwrap_or(0));
                    let best = data["best_median_us"].as_f64().map_or("-".into(), fmt_us);
                    b.set_message(format!("best {best}"));
                }
                if data["state"] != "running" {
                    if let Some(b) = &bar {
                        b.finish_and_clear();
                    }
                    return Ok(());
                }
            }
            "search_log" if data["search_id"] == id => {
                if let Some(b) = &bar {
                    b.println(format!("  {}", text(&data["message"])));
                }
            }
            _ => {}
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(())
}

async fn fetch(client: &Client, id: &str) -> Result<(Value, Vec<Value>)> {
    let search = client.get(&format!("/v1/searches/{id}")).await?;
    let archive = client.get(&format!("/v1/searches/{id}/archive")).await?;
    let entries = archive["entries"].as_array().cloned().unwrap_or_default();
    Ok((search, entries))
}

/// The id of a search's best: the proposer's own (judged by its statistics) when it named
/// one, else kilnd's fastest median.
fn best_id(s: &Value) -> Option<&str> {
    s["summary"]["best"].as_str().or(s["best"][0].as_str())
}

/// The best's speedups against this GPU's cached baselines (the reference, the libraries,
/// torch eager and torch.compile of the problem's module), as `kiln show` has them; null
/// when there is no best or it was not timed on a GPU.
async fn best_speedups(client: &Client, s: &Value) -> Value {
    let Some(id) = best_id(s) else {
        return Value::Null;
    };
    match client.get(&format!("/v1/candidates/{id}")).await {
        Ok(r) => r["speedups"].clone(),
        Err(_) => Value::Null,
    }
}

/// The best's speedups: one line for PyTorch (eager and torch.compile, the fastest
/// measured variant of each, as KernelBench reports them), then every baseline.
fn print_speedups(s: &Value, speedups: &Value) {
    let Some(list) = speedups.as_array() else {
        return;
    };
    if list.is_empty() {
        println!(
            "  speedups  none: no baselines measured on this GPU (`kiln problems baseline {}`)",
            text(&s["problem"])
        );
        return;
    }
    println!("  speedups of the best against this GPU's baselines:");
    println!("  {}", torch_headline(speedups));
    for line in crate::baselines::speedup_lines(speedups) {
        println!("  {line}");
    }
}

/// `vs PyTorch: eager 1.23x (torch-eager-fp32, 1.05 ms), torch.compile 0.81x (...)`: the
/// speedup against the fastest measured variant of each torch baseline, or what is not
/// measured.
fn torch_headline(speedups: &Value) -> String {
    let fastest = |prefix: &str| {
        speedups
            .as_array()
            .into_iter()
            .flatten()
            .filter(|x| {
                x["baseline"]
                    .as_str()
                    .is_some_and(|b| b == prefix || b.starts_with(&format!("{prefix}-")))
            })
            .filter(|x| x["baseline_us"].as_f64().is_some_and(|v| v > 0.0))
            .min_by(|a, b| {
                let us = |x: &Value| x["baseline_us"].as_f64().unwrap_or(f64::INFINITY);
                us(a).total_cmp(&us(b))
            })
            .map(|x| {
                format!(
                    "{:.2}x ({}, {})",
                    x["speedup"].as_f64().unwrap_or(0.0),
                    text(&x["baseline"]),
                    fmt_us(x["baseline_us"].as_f64().unwrap_or(0.0))
                )
            })
            .unwrap_or_else(|| "not measured".into())
    };
    format!(
        "vs PyTorch: eager {}, torch.compile {}",
        fastest("torch-eager"),
        fastest("torch-compile")
    )
}

fn median(e: &Value) -> Option<f64> {
    (e["evaluation"]["verdict"] == "ok")
        .then(|| e["evaluation"]["timing"]["median_us"].as_f64())
        .flatten()
}

/// True when the entry's timing stopped early by racing the search's best.
fn raced_out(e: &Value) -> bool {
    e["evaluation"]["timing"]["raced_out"].as_bool() == Some(true)
}

/// The median of an entry that may rank as a best (`ok`, not raced out, not plain).
fn ranked_median(e: &Value) -> Option<f64> {
    let plain = e["evaluation"]["timing"]["plain"].as_bool() == Some(true);
    median(e).filter(|_| !raced_out(e) && !plain)
}

/// The verdict as shown in tables: `ok (raced out)` for a raced-out `ok`.
fn verdict_text(e: &Value) -> String {
    let v = text(&e["evaluation"]["verdict"]);
    if raced_out(e) {
        format!("{v} (raced out)")
    } else {
        v
    }
}

/// Prints a search for people: state, progress, best over time, lineage, archive.
fn print_search(s: &Value, entries: &[Value], all: bool) {
    println!(
        "search {}  {}  problem {}  proposer {}",
        text(&s["id"]),
        text(&s["state"]),
        text(&s["problem"]),
        text(&s["proposer"])
    );
    println!(
        "  evaluated {}/{} submitted, budget {}, {:.1} s used",
        text(&s["evaluated"]),
        text(&s["submitted"]),
        text(&s["budget_candidates"]),
        s["elapsed_ms"].as_f64().unwrap_or(0.0) / 1e3
    );
    let raced = entries.iter().filter(|e| raced_out(e)).count();
    if raced > 0 {
        println!("  raced out {raced} (clearly slower than the best; timing stopped early)");
    }
    if let Some(e) = s["error"].as_str() {
        println!("  error     {e}");
    }
    // The bundled proposers put a JSON report in the summary's message.
    let report: Option<Value> = s["summary"]["message"]
        .as_str()
        .and_then(|m| serde_json::from_str::<Value>(m).ok())
        .filter(|r| r["rounds"].is_array());
    if !s["summary"].is_null() {
        match &report {
            Some(r) => println!("  summary   {}", text(&r["text"])),
            None => println!("  summary   {}", text(&s["summary"]["message"])),
        }
    }
    let first = entries.first().and_then(median);
    // Best over time: each entry that improved on every one before it.
    let mut best: Option<f64> = None;
    println!("  best over time:");
    for (i, e) in entries.iter().enumerate() {
        if let Some(m) = ranked_median(e)
            && best.is_none_or(|b| m < b)
        {
            best = Some(m);
            let speed = first.map_or(String::new(), |f| format!("  {:.2}x vs first", f / m));
            println!(
                "    #{:<4} {:>12}{speed}  {}",
                i + 1,
                fmt_us(m),
                text(&e["candidate"]["note"])
            );
        }
    }
    // Lineage of the best: follow parents back through the archive.
    // The proposer's own best (judged by its statistics) when it named one, else
    // kilnd's fastest median.
    if let Some(bid) = best_id(s) {
        println!("  lineage of the best ({bid}):");
        let mut chain = Vec::new();
        let mut cur = Some(bid.to_string());
        while let Some(id) = cur {
            if chain.len() > 64 {
                break;
            }
            let Some(e) = entries.iter().find(|e| e["id"] == id.as_str()) else {
                chain.push((id, None, "(outside this search)".to_string()));
                break;
            };
            chain.push((id, median(e), text(&e["candidate"]["note"])));
            cur = e["candidate"]["parent"].as_str().map(str::to_string);
        }
        for (id, m, note) in chain.iter().rev() {
            let speed = match (first, m) {
                (Some(f), Some(m)) => format!("{:.2}x", f / m),
                _ => "-".into(),
            };
            println!(
                "    {id}  {:>12}  {speed:>6}  {note}",
                m.map_or("-".into(), fmt_us)
            );
        }
    }
    if let Some(r) = &report {
        print_rounds(r);
        if all {
            print_grid(r);
        }
    }
    if all {
        println!("  archive:");
        for e in entries {
            println!(
                "    {}  {:<18} {:>12}  {}",
                text(&e["id"]),
                verdict_text(e),
                median(e).map_or("-".into(), fmt_us),
                text(&e["candidate"]["note"])
            );
        }
    }
}

/// Per-round summaries of a bundled proposer's report: each round's best, and each
/// idea or move with its outcome.
fn print_rounds(r: &Value) {
    let rounds = r["rounds"].as_array().cloned().unwrap_or_default();
    if rounds.is_empty() {
        return;
    }
    println!(
        "  rounds ({}, {} mode):",
        text(&r["strategy"]),
        text(&r["mode"])
    );
    for round in &rounds {
        println!(
            "    {:>3}. {:>3} evaluated  best {:>12}{}  {}",
            text(&round["round"]),
            text(&round["evaluated"]),
            round["best_us"].as_f64().map_or("-".into(), fmt_us),
            if round["improved"] == true {
                " *"
            } else {
                "  "
            },
            text(&round["note"])
        );
        for t in round["tried"].as_array().into_iter().flatten() {
            let family = t["family"]
                .as_str()
                .map_or(String::new(), |f| format!("[{f}] "));
            let best = t["best_us"]
                .as_f64()
                .map_or(String::new(), |m| format!(" ({})", fmt_us(m)));
            println!(
                "           {family}{} → {}{best}",
                text(&t["idea"]),
                text(&t["outcome"])
            );
        }
    }
}

/// The MAP-Elites grid of a report: the elite of every occupied cell, per island.
fn print_grid(r: &Value) {
    let Some(grid) = r.get("grid").filter(|g| g.is_object()) else {
        return;
    };
    let axes: Vec<String> = grid["descriptors"]
        .as_array()
        .into_iter()
        .flatten()
        .map(text)
        .collect();
    println!(
        "  map-elites grid (descriptors from {}: {}):",
        text(&grid["source"]),
        axes.join(" × ")
    );
    let mut cells = grid["cells"].as_array().cloned().unwrap_or_default();
    cells.sort_by(|a, b| {
        a["island"].as_u64().cmp(&b["island"].as_u64()).then(
            a["median_us"]
                .as_f64()
                .unwrap_or(f64::MAX)
                .total_cmp(&b["median_us"].as_f64().unwrap_or(f64::MAX)),
        )
    });
    for c in &cells {
        let bins: Vec<String> = c["bins"]
            .as_array()
            .into_iter()
            .flatten()
            .zip(&axes)
            .map(|(b, a)| format!("{a}={}", text(b)))
            .collect();
        println!(
            "    island {}  {:<40} {:>12}  {}",
            text(&c["island"]),
            bins.join(" "),
            c["median_us"].as_f64().map_or("-".into(), fmt_us),
            text(&c["id"])
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The PyTorch line takes the fastest measured variant of each torch baseline and
    /// says which is missing.
    #[test]
    fn torch_headline_picks_the_fastest_variant_of_each() {
        let sp = json!([
            {"baseline": "reference", "precision": "reference-f64acc", "baseline_us": 2029.0, "speedup": 1.95},
            {"baseline": "torch-eager-fp32", "precision": "fp32", "baseline_us": 1053.6, "speedup": 1.01},
            {"baseline": "torch-eager-tf32", "precision": "tf32", "baseline_us": 900.0, "speedup": 0.86},
            {"baseline": "torch-compile-fp32", "precision": "fp32", "baseline_us": 779.0, "speedup": 0.75}
        ]);
        let h = torch_headline(&sp);
        assert!(
            h.starts_with("vs PyTorch: eager 0.86x (torch-eager-tf32, "),
            "{h}"
        );
        assert!(
            h.contains("torch.compile 0.75x (torch-compile-fp32, "),
            "{h}"
        );
        let only_ref = json!([{"baseline": "reference", "precision": "r", "baseline_us": 1.0, "speedup": 2.0}]);
        assert_eq!(
            torch_headline(&only_ref),
            "vs PyTorch: eager not measured, torch.compile not measured"
        );
    }
}
