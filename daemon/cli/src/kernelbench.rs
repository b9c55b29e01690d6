//! `kiln kernelbench run --level N --answers DIR [--problems LEVEL_DIR] [--cpu]
//! [--in-flight K] [--html FILE]`: a folder of KernelBench answers (`ModelNew` files)
//! evaluated by kilnd against their level, and the level's numbers the way KernelBench
//! computes them, beside kiln's stricter view (docs/kernelbench.md).
//!
//! The steps: the level is imported once into a state folder and registered
//! ([`level`]); each answer file is mapped to its problem ([`answers`]) and submitted as
//! a hosted candidate, at most K in flight, followed with a progress bar; the torch
//! baselines of every answered problem are measured once; the records ([`records`]) and
//! the arithmetic ([`score`]) make the document ([`summary`]), printed as a table
//! ([`table`]), as JSON, or written as a page ([`html`]). A second run submits the same
//! candidates, which kilnd answers from its store (content-addressed ids).

mod answers;
mod html;
mod level;
mod records;
mod score;
mod summary;
mod table;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use futures_util::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use kiln_daemon::client::{Client, ClientError};
use kiln_types::BackendKind;
use serde_json::Value;

use crate::Output;
use crate::output::print_json;
use answers::Mapping;
use records::{Answer, Baselines, Identity, Status};
use summary::{Report, Skipped};

/// `kiln kernelbench` subcommands.
#[derive(Debug, Subcommand)]
pub enum KernelbenchCmd {
    /// Evaluate a folder of KernelBench answers (`ModelNew` files) against their level:
    /// import and register the level once, submit every answer, measure the torch
    /// baselines, and print one table with the level's correctness rate, fast_p and
    /// geometric-mean speedup as KernelBench computes them, beside kiln's stricter view.
    Run(RunArgs),
}

/// Arguments of `kiln kernelbench run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The KernelBench level the answers are for (1, 2, 3, ...).
    #[arg(long)]
    level: u32,
    /// The folder of answers: `ModelNew` files named as KernelBench names its runs
    /// (`level_N_problem_M_sample_K_kernel.py`) or after their problem's file
    /// (`19_ReLU.py`, `19_ReLU_v2.py`). Several samples per problem are allowed.
    #[arg(long, value_name = "DIR")]
    answers: PathBuf,
    /// The level's folder of KernelBench problem files (`M_Name.py`); default
    /// `$KERNELBENCH/levelN` (KERNELBENCH: a KernelBench checkout or its `KernelBench`
    /// folder).
    #[arg(long, value_name = "LEVEL_DIR")]
    problems: Option<PathBuf>,
    /// Run the answers with torch on the CPU (language `modelnew-cpu`, the host backend)
    /// instead of on a GPU.
    #[arg(long)]
    cpu: bool,
    /// Answers submitted and not yet finished at any time.
    #[arg(long, value_name = "K", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=256))]
    in_flight: u32,
    /// Also write the table and the numbers as a self-contained HTML page.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Where the imported level is kept (default: `ANSWERS/.kiln-kernelbench/levelN`).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Import the level again even when its files have not changed.
    #[arg(long)]
    reimport: bool,
    /// The problems' absolute tolerance (default: KernelBench's fp32 1e-4, as at the
    /// commit the arithmetic follows; KernelBench v0 and v0.1 used 1e-2). A level already
    /// registered with another tolerance is refused by kilnd (its names are taken).
    #[arg(long, default_value_t = kiln_types::kernelbench::KERNELBENCH_FP32_TOL)]
    atol: f64,
    /// The problems' relative tolerance (default: KernelBench's fp32 1e-4).
    #[arg(long, default_value_t = kiln_types::kernelbench::KERNELBENCH_FP32_TOL)]
    rtol: f64,
    /// The python with torch that imports the level.
    #[arg(long, env = "KILN_PYTHON", default_value = "python3")]
    python: String,
    /// kiln's torch runner (default: kiln_torch.py beside kiln-worker).
    #[arg(long)]
    helper: Option<PathBuf>,
    /// Give up waiting for one answer's verdict after this many seconds (it is then
    /// reported as failed; a later run picks it up from kilnd's store).
    #[arg(long, value_name = "SECONDS", default_value_t = 1800)]
    timeout: u64,
}

/// Runs a `kiln kernelbench` subcommand.
pub async fn run(
    client: &Client,
    out: Output,
    cmd: KernelbenchCmd,
) -> Result<std::process::ExitCode> {
    match cmd {
        KernelbenchCmd::Run(a) => run_level(client, out, a).await,
    }
}

/// The level folder: `--problems`, else `$KERNELBENCH/levelN` (or
/// `$KERNELBENCH/KernelBench/levelN`, a checkout's layout).
fn level_dir(a: &RunArgs) -> Result<PathBuf> {
    if let Some(p) = &a.problems {
        anyhow::ensure!(
            p.is_dir(),
            "--problems {}: no such folder (the KernelBench level{} folder of problem files)",
            p.display(),
            a.level
        );
        return Ok(p.clone());
    }
    let root = std::env::var_os("KERNELBENCH").with_context(|| {
        format!(
            "say where level {} is: --problems KernelBench/level{} (a KernelBench checkout's \
             folder of problem files), or set KERNELBENCH to the checkout",
            a.level, a.level
        )
    })?;
    let root = PathBuf::from(root);
    let level = format!("level{}", a.level);
    [root.join(&level), root.join("KernelBench").join(&level)]
        .into_iter()
        .find(|d| d.is_dir())
        .with_context(|| {
            format!(
                "KERNELBENCH={} holds no {level} folder (nor KernelBench/{level}): pass \
                 --problems",
                root.display()
            )
        })
}

/// Fails early, with the reason, when the backend the answers need is not usable.
async fn check_backend(client: &Client, backend: BackendKind) -> Result<()> {
    let info = client.get("/v1/info").await?;
    let entry = info["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|b| b["name"] == backend.to_string());
    if let Some(b) = entry
        && b["usable"] == false
    {
        let hint = match backend {
            BackendKind::Host => "",
            _ => "; --cpu runs the answers with torch on the CPU (the host backend)",
        };
        anyhow::bail!(
            "kilnd's {backend} backend is not usable here ({}){hint}",
            b["detail"].as_str().unwrap_or("no detail")
        );
    }
    Ok(())
}

/// One answer to submit.
struct Work {
    who: Identity,
    path: PathBuf,
}

async fn run_level(client: &Client, out: Output, a: RunArgs) -> Result<std::process::ExitCode> {
    let started = Instant::now();
    let text = out == Output::Text;
    let say = |m: &str| {
        if text {
            eprintln!("{m}");
        }
    };
    let level_dir = level_dir(&a)?;
    anyhow::ensure!(
        a.answers.is_dir(),
        "--answers {}: no such folder",
        a.answers.display()
    );
    let backend = if a.cpu {
        BackendKind::Host
    } else {
        BackendKind::Cuda
    };
    // Before anything slow: is kilnd there, and can it run these answers?
    check_backend(client, backend).await?;

    let level = answers::level_problems(&level_dir)?;
    let files = answers::answer_files(&a.answers)?;
    let state = a.out.clone().unwrap_or_else(|| {
        a.answers
            .join(".kiln-kernelbench")
            .join(format!("level{}", a.level))
    });
    let tolerance = kiln_types::Tolerance {
        atol: a.atol,
        rtol: a.rtol,
    };
    kiln_types::kernelbench::check_tolerance(tolerance).context("--atol/--rtol")?;
    let importer = level::Importer {
        python: &a.python,
        helper: a.helper.clone(),
        again: a.reimport,
        tolerance,
    };
    let (mut problems, imported) = level::import(&level_dir, &level, &state, &importer, say)?;
    if !imported {
        say(&format!(
            "level {} already imported in {} (--reimport to import again)",
            a.level,
            state.display()
        ));
    }
    level::register(client, &mut problems, backend).await?;

    // Map every answer file to a registered problem.
    let mut skipped = Vec::new();
    let mut work = Vec::new();
    for path in files {
        let file = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (id, sample) = match answers::map_answer(&file, a.level, &level) {
            Mapping::Skipped(reason) => {
                skipped.push(Skipped { file, reason });
                continue;
            }
            Mapping::Problem { id, sample } => (id, sample),
        };
        let Some(p) = problems.iter().find(|p| p.id == id) else {
            continue;
        };
        match (&p.name, &p.not_registered) {
            (Some(name), None) => work.push(Work {
                who: Identity {
                    file,
                    problem_id: id,
                    problem: name.clone(),
                    sample,
                },
                path,
            }),
            (_, why) => skipped.push(Skipped {
                file,
                reason: format!(
                    "its problem {} is not registered: {}",
                    p.file,
                    why.as_deref().unwrap_or("not imported")
                ),
            }),
        }
    }

    let answers = submit_all(client, &work, &a, text).await?;

    // The torch baselines of every answered problem, once.
    let answered: Vec<String> = {
        let mut v: Vec<String> = answers.iter().map(|x| x.problem.clone()).collect();
        v.sort();
        v.dedup();
        v
    };
    let baselines = measure_baselines(client, &answered, say, text).await?;
    let mut answers: Vec<Answer> = answers
        .into_iter()
        .map(|x| {
            let b = baselines.get(&x.problem).cloned().unwrap_or_default();
            x.with_baselines(&b)
        })
        .collect();
    answers.sort_by(|x, y| (x.problem_id, &x.file).cmp(&(y.problem_id, &y.file)));

    let summary = summary::summarize(&problems, &answers, &baselines, skipped.len());
    let report = Report {
        level: a.level,
        problems_dir: level_dir,
        answers_dir: a.answers.clone(),
        state_dir: state,
        language: if a.cpu { "modelnew-cpu" } else { "modelnew" }.into(),
        tolerance,
        arithmetic: summary::PROVENANCE,
        problems: summary::problem_lines(&problems, &answers, &baselines),
        answers,
        skipped,
        summary,
        wall_s: started.elapsed().as_secs_f64(),
    };
    if let Some(file) = &a.html {
        std::fs::write(file, html::page(&report))
            .with_context(|| format!("cannot write {}", file.display()))?;
        say(&format!("wrote {}; open it in a browser", file.display()));
    }
    if out == Output::Json {
        print_json(&serde_json::to_value(&report)?);
    } else {
        println!("{}", table::render(&report));
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// A progress bar over `len` things, shown only for text output on a terminal.
fn progress(len: usize, what: &str, text: bool) -> ProgressBar {
    if !text || !std::io::stderr().is_terminal() || len == 0 {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(len as u64);
    let template =
        format!("{{spinner}} [{{elapsed_precise}}] {{bar:30}} {{pos}}/{{len}} {what}  {{msg}}");
    b.set_style(
        ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    b.enable_steady_tick(Duration::from_millis(200));
    b
}

/// Submits every answer, at most `--in-flight` unfinished at once, and waits for each
/// verdict; a progress bar follows them (text output on a terminal only).
async fn submit_all(
    client: &Client,
    work: &[Work],
    a: &RunArgs,
    text: bool,
) -> Result<Vec<Answer>> {
    let bar = progress(work.len(), "answers", text);
    let mut stream = futures_util::stream::iter(work)
        .map(|w| submit_one(client, w, a.cpu, a.timeout))
        .buffer_unordered(a.in_flight as usize);
    let mut done = Vec::with_capacity(work.len());
    let (mut ok, mut stored) = (0, 0);
    while let Some(answer) = stream.next().await {
        let answer = match answer {
            Ok(x) => x,
            Err(e) => {
                bar.abandon();
                return Err(e);
            }
        };
        ok += usize::from(answer.kiln_correct);
        stored += usize::from(answer.from_store);
        bar.set_message(format!("{ok} ok, {stored} from kilnd's store"));
        bar.inc(1);
        done.push(answer);
    }
    bar.finish_and_clear();
    Ok(done)
}

/// One answer: submitted as a hosted candidate, then its record once it has a verdict.
/// A refusal or a missing verdict is the answer's record; losing kilnd is an error.
async fn submit_one(client: &Client, w: &Work, cpu: bool, timeout_s: u64) -> Result<Answer> {
    let body = match crate::submit::modelnew_candidate(&w.path, Some(&w.who.problem), cpu) {
        Ok(b) => b,
        Err(e) => {
            return Ok(Answer::not_evaluated(
                &w.who,
                Status::Refused,
                format!("{e:#}"),
            ));
        }
    };
    let resp = match client.post("/v1/candidates", &body).await {
        Ok((_, v)) => v,
        Err(ClientError::Api {
            status, message, ..
        }) => {
            // 400: the candidate itself (the answer's fault); other refusals are kiln's.
            let s = if status == 400 {
                Status::Refused
            } else {
                Status::Failed
            };
            return Ok(Answer::not_evaluated(&w.who, s, message));
        }
        Err(e) => return Err(e.into()),
    };
    let from_store = resp["duplicate"] == true;
    let id = resp["id"]
        .as_str()
        .context("kilnd's reply has no id")?
        .to_string();
    if from_store && !resp["record"]["evaluation"].is_null() {
        return Ok(Answer::from_record(&w.who, &resp["record"], true));
    }
    match wait(client, &id, timeout_s).await? {
        Some(record) => Ok(Answer::from_record(&w.who, &record, from_store)),
        None => {
            let mut x = Answer::not_evaluated(
                &w.who,
                Status::Failed,
                format!(
                    "no verdict within {timeout_s} s (--timeout); it stays queued, and a \
                     later run picks its verdict up from kilnd's store"
                ),
            );
            x.id = Some(id);
            x.from_store = from_store;
            Ok(x)
        }
    }
}

/// The candidate's record once it has an evaluation (and, for a file kilnd lifted, its
/// lifted candidate's job has ended) or its job failed; `None` after `timeout_s`, or the
/// record as it is then when only the lifted result is missing.
async fn wait(client: &Client, id: &str, timeout_s: u64) -> Result<Option<Value>> {
    let deadline = Instant::now() + Duration::from_secs(timeout_s);
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).as_secs();
        let r = client
            .get(&format!("/v1/candidates/{id}?wait={}", left.clamp(1, 60)))
            .await?;
        let evaluated = !r["evaluation"].is_null();
        if (evaluated && !crate::show::lift_pending(&r["lift"])) || r["job"]["state"] == "failed" {
            return Ok(Some(r));
        }
        if left == 0 {
            return Ok(evaluated.then_some(r));
        }
    }
}

/// The torch baselines of each problem (measured once, then cached by kilnd). Where
/// kilnd has none to give (no usable GPU: `409 baselines_unavailable`), every problem gets
/// that reason and no more are asked for.
async fn measure_baselines(
    client: &Client,
    problems: &[String],
    say: impl Fn(&str),
    text: bool,
) -> Result<BTreeMap<String, Baselines>> {
    let mut out = BTreeMap::new();
    if problems.is_empty() {
        return Ok(out);
    }
    say(&format!(
        "timing the torch baselines of {} problem(s) (cached by kilnd; minutes the first time)...",
        problems.len()
    ));
    let body = serde_json::json!({"remeasure": false});
    let mut unavailable: Option<String> = None;
    let bar = progress(problems.len(), "problems' baselines", text);
    for name in problems {
        bar.set_message(name.clone());
        if let Some(why) = &unavailable {
            out.insert(name.clone(), Baselines::unavailable(why.clone()));
            continue;
        }
        let b = match client
            .post(&format!("/v1/problems/{name}/baselines"), &body)
            .await
        {
            Ok((_, set)) => Baselines::from_set(&set),
            Err(ClientError::Api {
                status: 409,
                message,
                ..
            }) => {
                let why = format!("unavailable: {message}");
                unavailable = Some(why.clone());
                Baselines::unavailable(why)
            }
            Err(ClientError::Api { code, message, .. }) => {
                Baselines::unavailable(format!("not measured ({code}): {message}"))
            }
            Err(e) => {
                bar.abandon();
                return Err(e.into());
            }
        };
        out.insert(name.clone(), b);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn parse(words: &[&str]) -> Result<RunArgs, clap::Error> {
        let argv = std::iter::once("kiln").chain(words.iter().copied());
        match crate::Args::try_parse_from(argv)?.command {
            crate::Command::Kernelbench(KernelbenchCmd::Run(a)) => Ok(a),
            other => panic!("not a kernelbench run: {other:?}"),
        }
    }

    #[test]
    fn the_command_parses_in_its_forms() {
        let a = parse(&["kernelbench", "run", "--level", "1", "--answers", "runs/x"])
            .expect("the short form");
        assert_eq!((a.level, a.in_flight, a.cpu), (1, 8, false));
        let a = parse(&[
            "kernelbench",
            "run",
            "--level",
            "2",
            "--answers",
            "a",
            "--problems",
            "KernelBench/level2",
            "--cpu",
            "--in-flight",
            "3",
            "-o",
            "json",
            "--html",
            "level2.html",
        ])
        .expect("every option");
        assert!(a.cpu && a.in_flight == 3 && a.html.is_some());
        assert!(parse(&["kernelbench", "run", "--answers", "a"]).is_err());
        assert!(
            parse(&[
                "kernelbench",
                "run",
                "--level",
                "1",
                "--answers",
                "a",
                "--in-flight",
                "0"
            ])
            .is_err()
        );
    }

    #[test]
    fn missing_folders_are_said_clearly() {
        let a = parse(&[
            "kernelbench",
            "run",
            "--level",
            "1",
            "--answers",
            "a",
            "--problems",
            "/nonexistent/level1",
        ])
        .expect("parses");
        let err = level_dir(&a).expect_err("no folder").to_string();
        assert!(err.contains("no such folder"), "{err}");
    }
}
