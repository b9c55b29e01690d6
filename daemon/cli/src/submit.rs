//! `kiln submit --problem NAME FILE.json [--wait]`, and `kiln submit --problem NAME
//! FILE.py [--cpu]` for a KernelBench `ModelNew` file (a hosted candidate).

use std::io::Read;
use std::path::{Path, PathBuf};

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
    /// Candidate JSON file, a KernelBench `ModelNew` Python file (`.py`, or with
    /// --modelnew), or `-` for stdin.
    #[arg(required_unless_present = "seed")]
    file: Option<PathBuf>,
    /// FILE is a KernelBench `ModelNew` Python file (`class ModelNew(nn.Module)`), run as
    /// written in kiln's hosted runner on a GPU (language `modelnew`). Implied by a `.py`
    /// name; needed for `-` (stdin) or another name. Needs --problem, one with a torch
    /// reference.
    #[arg(long, requires = "problem", conflicts_with = "seed")]
    modelnew: bool,
    /// With a `ModelNew` file: run it on the CPU instead (language `modelnew-cpu`, the
    /// host backend).
    #[arg(long, conflicts_with = "seed")]
    cpu: bool,
    /// The candidate's note (what it tries); replaces the file's.
    #[arg(long)]
    note: Option<String>,
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
    /// A `ModelNew` file: run it hosted only, without lifting its kernels into a contract
    /// candidate (lifting is the default on a GPU where its forward allows).
    #[arg(long)]
    hosted_only: bool,
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
    if a.hosted_only {
        q.push("lift=false".into());
    }
    if q.is_empty() {
        String::new()
    } else {
        format!("?{}", q.join("&"))
    }
}

/// Submits a candidate.
pub async fn submit(client: &Client, out: Output, a: SubmitArgs) -> Result<std::process::ExitCode> {
    let mut body = match (&a.file, a.seed) {
        (_, true) => {
            let problem = a.problem.as_deref().context("--seed needs --problem")?;
            seed_candidate(client, problem, a.backend.as_deref()).await?
        }
        (Some(file), false) => file_candidate(&a, file)?,
        (None, false) => anyhow::bail!("give a candidate file, or --seed"),
    };
    if let (Some(note), Some(obj)) = (&a.note, body.as_object_mut()) {
        obj.insert("note".into(), Value::String(note.clone()));
    }
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

/// True when `file` is to be read as a KernelBench `ModelNew` file: `--modelnew`, or a
/// `.py` name.
fn is_modelnew(a: &SubmitArgs, file: &Path) -> bool {
    a.modelnew || file.extension().is_some_and(|e| e == "py")
}

/// The candidate of `kiln submit FILE`: a `ModelNew` file made into a hosted candidate, or
/// candidate JSON.
fn file_candidate(a: &SubmitArgs, file: &Path) -> Result<Value> {
    if is_modelnew(a, file) {
        return modelnew_candidate(file, a.problem.as_deref(), a.cpu);
    }
    if a.cpu {
        anyhow::bail!(
            "--cpu is for a KernelBench ModelNew file (a .py file, or --modelnew); {} is read as \
             candidate JSON, whose `language` picks the backend",
            file.display()
        );
    }
    read_candidate(file, a.problem.as_deref())
}

/// The text of `file`, or of stdin for `-`.
fn read_text(file: &Path) -> Result<String> {
    if file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("cannot read stdin")?;
        Ok(s)
    } else {
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))
    }
}

/// A hosted candidate (language `modelnew`, or `modelnew-cpu` with `cpu`) whose source is
/// the KernelBench `ModelNew` file as written; checked here (a top-level `class
/// ModelNew`, the size limits) so that a wrong file is refused before any request.
pub(crate) fn modelnew_candidate(file: &Path, problem: Option<&str>, cpu: bool) -> Result<Value> {
    let problem = problem.with_context(|| {
        format!(
            "{} is a ModelNew file: say which problem it solves with --problem NAME",
            file.display()
        )
    })?;
    let candidate = kiln_types::Candidate {
        problem: problem.to_string(),
        language: if cpu {
            kiln_types::Language::ModelNewCpu
        } else {
            kiln_types::Language::ModelNew
        },
        source: read_text(file)?,
        launches: Vec::new(),
        scratch: Vec::new(),
        flags: Vec::new(),
        parent: None,
        note: None,
    };
    match candidate.validate() {
        Ok(()) => Ok(serde_json::to_value(candidate)?),
        Err(kiln_types::CandidateError::NoModelNew) => anyhow::bail!(
            "{} defines no top-level `class ModelNew(nn.Module)`: kiln submits a .py file as a \
             KernelBench ModelNew file, run as written (a candidate in another language is a \
             JSON file)",
            file.display()
        ),
        Err(e) => anyhow::bail!("{}: {e}", file.display()),
    }
}

fn read_candidate(file: &Path, problem: Option<&str>) -> Result<Value> {
    let text = read_text(file)?;
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn parse(words: &[&str]) -> Result<SubmitArgs, clap::Error> {
        let argv = std::iter::once("kiln").chain(words.iter().copied());
        match crate::Args::try_parse_from(argv)?.command {
            crate::Command::Submit(a) => Ok(a),
            other => panic!("not a submit: {other:?}"),
        }
    }

    const MODEL_NEW: &str = "import torch\nimport torch.nn as nn\n\n\
        class ModelNew(nn.Module):\n    def forward(self, x):\n        return x * 2\n";

    #[test]
    fn a_modelnew_file_parses_in_every_form() {
        let a = parse(&["submit", "--problem", "p", "model_new.py"]).expect("a .py file");
        assert!(!a.modelnew && !a.cpu);
        assert!(is_modelnew(&a, a.file.as_deref().expect("file")));
        let a = parse(&[
            "submit",
            "--problem",
            "p",
            "--modelnew",
            "answer.txt",
            "--cpu",
        ])
        .expect("--modelnew with --cpu");
        assert!(a.modelnew && a.cpu);
        let a = parse(&[
            "submit",
            "--problem",
            "p",
            "--modelnew",
            "-",
            "--note",
            "fused",
            "--wait",
        ])
        .expect("stdin");
        assert_eq!(a.note.as_deref(), Some("fused"));
        let a = parse(&["submit", "cand.json"]).expect("json");
        assert!(!is_modelnew(&a, a.file.as_deref().expect("file")));
        // --modelnew needs the problem; neither it nor --cpu goes with --seed.
        assert!(parse(&["submit", "--modelnew", "m.py"]).is_err());
        assert!(parse(&["submit", "--problem", "p", "--seed", "--cpu"]).is_err());
        assert!(parse(&["submit", "--problem", "p", "--seed", "--modelnew"]).is_err());
    }

    #[test]
    fn a_modelnew_file_becomes_a_hosted_candidate() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("model_new.py");
        std::fs::write(&file, MODEL_NEW).expect("write");
        let body = modelnew_candidate(&file, Some("p"), false).expect("candidate");
        assert_eq!(body["language"], "modelnew");
        assert_eq!(body["problem"], "p");
        assert_eq!(body["source"], MODEL_NEW);
        assert_eq!(body["launches"], serde_json::json!([]));
        let body = modelnew_candidate(&file, Some("p"), true).expect("cpu");
        assert_eq!(body["language"], "modelnew-cpu");
        let back: kiln_types::Candidate = serde_json::from_value(body).expect("a candidate");
        assert_eq!(back.trust(), kiln_types::TrustMode::Hosted);
        assert_eq!(back.backend(), kiln_types::BackendKind::Host);
    }

    #[test]
    fn a_wrong_file_is_refused_before_any_request() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("kernel.py");
        std::fs::write(&file, "import triton\n@triton.jit\ndef k(x):\n    pass\n").expect("write");
        let err = modelnew_candidate(&file, Some("p"), false)
            .expect_err("no ModelNew")
            .to_string();
        assert!(
            err.contains("no top-level `class ModelNew(nn.Module)`"),
            "{err}"
        );
        std::fs::write(&file, MODEL_NEW).expect("write");
        let err = modelnew_candidate(&file, None, false)
            .expect_err("no problem")
            .to_string();
        assert!(err.contains("--problem NAME"), "{err}");
        // --cpu on candidate JSON says what it is for.
        let json = dir.path().join("cand.json");
        std::fs::write(&json, "{}").expect("write");
        let a = parse(&["submit", "--cpu", json.to_str().expect("utf-8")]).expect("parses");
        let err = file_candidate(&a, &json)
            .expect_err("--cpu on JSON")
            .to_string();
        assert!(
            err.contains("--cpu is for a KernelBench ModelNew file"),
            "{err}"
        );
    }
}
