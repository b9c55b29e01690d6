//! `kiln submit --problem NAME FILE.json [--wait]`.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use kiln_daemon::client::Client;
use serde_json::Value;

use crate::Output;
use crate::output::{print_json, text};

/// Arguments of `kiln submit`.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The problem (overrides the file's `problem` field).
    #[arg(long)]
    problem: Option<String>,
    /// Candidate JSON file, or `-` for stdin.
    #[arg(required_unless_present = "seed")]
    file: Option<PathBuf>,
    /// Submit the problem's own seed kernel instead of a file (needs --problem).
    #[arg(long, requires = "problem", conflicts_with = "file")]
    seed: bool,
    /// With --seed: the backend (host, cuda) or language (triton) whose seed to submit
    /// (default: the first usable backend with one).
    #[arg(long, requires = "seed")]
    backend: Option<String>,
    /// Wait for the evaluation and print it.
    #[arg(long)]
    wait: bool,
    /// With --wait: give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Plain timing (events around one launch, N samples, no L2 flush), for comparison.
    #[arg(long, value_name = "N", conflicts_with = "race")]
    plain: Option<u32>,
    /// Race an incumbent: `best` (the problem's best) or its upper bound in µs; timing
    /// stops early once the candidate is clearly slower.
    #[arg(long, value_name = "best|UPPER_US")]
    race: Option<String>,
    /// With --race: the margin (default: the daemon's search.race_margin).
    #[arg(long, requires = "race")]
    race_margin: Option<f64>,
    /// Evaluate on this lane only (one per GPU for cuda, as `kiln doctor` lists them).
    #[arg(long)]
    lane: Option<u32>,
}

/// The job options as a query string (`?plain=…&race=…`), empty when none.
fn options_query(a: &SubmitArgs) -> String {
    let mut q = Vec::new();
    if let Some(n) = a.plain {
        q.push(format!("plain={n}"));
    }
    if let Some(r) = &a.race {
        q.push(format!("race={}", r.trim()));
    }
    if let Some(m) = a.race_margin {
        q.push(format!("race_margin={m}"));
    }
    if let Some(l) = a.lane {
        q.push(format!("lane={l}"));
    }
    if q.is_empty() {
        String::new()
    } else {
        format!("?{}", q.join("&"))
    }
}

/// Submits a candidate.
pub async fn submit(client: &Client, out: Output, a: SubmitArgs) -> Result<std::process::ExitCode> {
    let body = match (&a.file, a.seed) {
        (_, true) => {
            let problem = a.problem.as_deref().context("--seed needs --problem")?;
            seed_candidate(client, problem, a.backend.as_deref()).await?
        }
        (Some(file), false) => read_candidate(file, a.problem.as_deref())?,
        (None, false) => anyhow::bail!("give a candidate file, or --seed"),
    };
    let (_, resp) = client
        .post(&format!("/v1/candidates{}", options_query(&a)), &body)
        .await?;
    let id = resp["id"]
        .as_str()
        .context("kilnd's reply has no id")?
        .to_string();
    if let Some(w) = resp["warning"].as_str() {
        eprintln!("warning: {w}");
    }
    if !a.wait {
        if out == Output::Json {
            print_json(&resp);
        } else if resp["duplicate"].as_bool() == Some(true) {
            println!("{id} (already submitted; job {})", text(&resp["job_id"]));
        } else {
            println!("{id} (queued as job {})", text(&resp["job_id"]));
        }
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let record = crate::show::wait_for(client, &id, a.timeout).await?;
    if out == Output::Json {
        print_json(&record);
    } else {
        crate::show::print_record(&record);
    }
    Ok(crate::show::exit_code(&record))
}

fn read_candidate(file: &std::path::Path, problem: Option<&str>) -> Result<Value> {
    let text = if file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("cannot read stdin")?;
        s
    } else {
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?
    };
    let mut body: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?;
    if let Some(p) = problem {
        match body.as_object_mut() {
            Some(obj) => {
                obj.insert("problem".into(), Value::String(p.to_string()));
            }
            None => anyhow::bail!("{} must hold a JSON object", file.display()),
        }
    }
    Ok(body)
}

/// The problem's seed kernel for `backend`, or for the first usable backend it has one for.
pub(crate) async fn seed_candidate(
    client: &Client,
    problem: &str,
    backend: Option<&str>,
) -> Result<Value> {
    let shown = client.get(&format!("/v1/problems/{problem}")).await?;
    let spec: kiln_types::ProblemSpec = serde_json::from_value(shown["spec"].clone())
        .context("kilnd sent a problem spec this kiln cannot read")?;
    let backend = match backend {
        Some(b) => b.to_string(),
        None => {
            let info = client.get("/v1/info").await?;
            let usable: Vec<String> = info["backends"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|b| b["usable"].as_bool() == Some(true))
                .filter_map(|b| b["name"].as_str().map(str::to_string))
                .collect();
            usable
                .into_iter()
                .find(|b| spec.seed.contains_key(b))
                .or_else(|| spec.seed.keys().next().cloned())
                .with_context(|| format!("problem {problem} has no seed kernel"))?
        }
    };
    let cand = spec.seed_candidate(&backend).with_context(|| {
        format!("problem {problem} has no seed kernel for the {backend} backend")
    })?;
    Ok(serde_json::to_value(cand)?)
}
