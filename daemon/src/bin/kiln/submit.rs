//! `kiln submit --problem NAME FILE.json [--wait]`.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use kiln_daemon::client::Client;
use serde_json::Value;

use crate::Output;
use crate::output::print_json;

/// Arguments of `kiln submit`.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The problem (overrides the file's `problem` field).
    #[arg(long)]
    problem: Option<String>,
    /// Candidate JSON file, or `-` for stdin.
    file: PathBuf,
    /// Wait for the evaluation and print it.
    #[arg(long)]
    wait: bool,
    /// With --wait: give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
}

/// Submits a candidate.
pub async fn submit(client: &Client, out: Output, a: SubmitArgs) -> Result<std::process::ExitCode> {
    let text = if a.file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).context("cannot read stdin")?;
        s
    } else {
        std::fs::read_to_string(&a.file).with_context(|| format!("cannot read {}", a.file.display()))?
    };
    let mut body: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", a.file.display()))?;
    if let Some(p) = a.problem {
        match body.as_object_mut() {
            Some(obj) => {
                obj.insert("problem".into(), Value::String(p));
            }
            None => anyhow::bail!("{} must hold a JSON object", a.file.display()),
        }
    }
    let (_, resp) = client.post("/v1/candidates", &body).await?;
    let id = resp["id"].as_str().context("kilnd's reply has no id")?.to_string();
    if let Some(w) = resp["warning"].as_str() {
        eprintln!("warning: {w}");
    }
    if !a.wait {
        if out == Output::Json {
            print_json(&resp);
        } else if resp["duplicate"].as_bool() == Some(true) {
            println!("{id} (already submitted; job {})", resp["job_id"]);
        } else {
            println!("{id} (queued as job {})", resp["job_id"]);
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
