//! `kiln watch`: live job progress from the event stream.

use anyhow::Result;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use kiln_daemon::client::Client;

use crate::Output;
use crate::output::{fmt_us, text};

/// Arguments of `kiln watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Stop after this many finished jobs (0: run until interrupted).
    #[arg(long, default_value_t = 0)]
    count: u64,
}

/// Follows the event stream.
pub async fn watch(client: &Client, out: Output, a: WatchArgs) -> Result<std::process::ExitCode> {
    let mut events = client.events().await?;
    let bar = if out == Output::Text {
        let b = ProgressBar::new_spinner();
        b.set_style(
            ProgressStyle::with_template("{spinner} {pos} finished  {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        b.enable_steady_tick(std::time::Duration::from_millis(200));
        Some(b)
    } else {
        None
    };
    let mut finished = 0u64;
    while let Some((name, data)) = events.next().await {
        if out == Output::Json {
            println!("{}", serde_json::json!({"event": name, "data": data}));
        }
        if name != "job" {
            continue;
        }
        let state = data["state"].as_str().unwrap_or("");
        let done = matches!(state, "done" | "failed");
        if let Some(b) = &bar {
            let job = text(&data["job_id"]);
            if done {
                b.inc(1);
                let time = data["median_us"].as_f64().map(fmt_us).unwrap_or_default();
                let what = if state == "failed" {
                    format!("failed: {}", text(&data["error"]))
                } else {
                    format!("{} {time}", text(&data["verdict"]))
                };
                b.println(format!(
                    "job {job} {} {}: {what}",
                    text(&data["problem"]),
                    text(&data["candidate_id"])
                ));
            } else {
                let lane = data["lane"]
                    .as_u64()
                    .map(|l| format!(" on lane {l}"))
                    .unwrap_or_default();
                b.set_message(format!("job {job} {state}{lane}"));
            }
        }
        if done {
            finished += 1;
            if a.count > 0 && finished >= a.count {
                break;
            }
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(std::process::ExitCode::SUCCESS)
}
