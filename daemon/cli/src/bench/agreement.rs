//! `kiln bench agreement`: kiln's time of a kernel against an external profiler's.
//!
//! For each problem (default: the cuda seed suite's small and large kernels), the seed is
//! evaluated through kilnd as a fresh candidate (the full contract; its `timing.median_us`
//! is the figure that ranks, `timing.timer` has the others). Then, where the host has
//! Nsight Compute, the same seed runs on its own (`kiln-worker launch`) under
//! `ncu --clock-control none --cache-control all --metrics gpu__time_duration.sum`: clocks
//! left as kiln leaves them, caches flushed before every kernel as kiln flushes L2 before
//! every sample. ncu's per-kernel durations are summed per run of the launch list, and
//! their median over the runs is compared with kiln's median. One `PASS`/`FAIL` line per
//! problem: within `--max-rel` (2 %) of ncu, or for kernels under `--small-us` (50 µs)
//! within the larger of `--small-abs-us` (0.3 µs) and `--small-rel` (3 %).
//!
//! ncu's figure is first reduced by the **timer floor** ([`super::floor`]): an empty kernel
//! is timed under ncu and by kiln's own samples, and the difference (what ncu adds to any
//! kernel that CUPTI's records do not, about 0.8 µs on an H200) is taken off ncu's figure
//! once per launch. `--raw` compares with ncu's figure as it is.
//! docs/benchmarks.md describes the method.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use kiln_daemon::client::Client;
use kiln_types::BackendKind;
use kiln_types::JobOptions;
use serde_json::{Value, json};

use super::common::{self, Variants, Work};
use super::floor::{self, Floor};
use crate::Output;
use crate::output::{fmt_us, print_json, text};

/// The problems compared by default: the two small kernels the event time overstates
/// most, then the seed kernels of 0.5–6.5 ms (one of them three launches long).
pub const DEFAULT_PROBLEMS: &[&str] = &[
    "vecadd-cuda-1m",
    "rowsum-cuda-4096x1024",
    "softmax-4096x65536",
    "layernorm-16x64x256x256",
    "matmul-fp32-4096",
    "conv2d-3to96-k11s4p2",
];

/// Arguments of `kiln bench agreement`.
#[derive(Debug, Args)]
pub struct AgreementArgs {
    /// Problems to compare (comma-separated; default: the cuda seed suite's
    /// vecadd, rowsum, softmax, LayerNorm, matmul and conv).
    #[arg(long, value_delimiter = ',')]
    problems: Vec<String>,
    /// Evaluations through kilnd per problem (kiln's figure is the median of their medians).
    #[arg(long, default_value_t = 1)]
    evaluations: usize,
    /// Runs of the launch list under ncu (after one warm-up run).
    #[arg(long, default_value_t = 10)]
    runs: u32,
    /// The Nsight Compute CLI (default: `ncu` on PATH, else /usr/local/cuda/bin/ncu).
    #[arg(long)]
    ncu: Option<PathBuf>,
    /// The launcher ncu profiles (default: the kiln-worker beside this kiln).
    #[arg(long)]
    launcher: Option<PathBuf>,
    /// Largest relative difference from ncu that passes.
    #[arg(long, default_value_t = 0.02)]
    max_rel: f64,
    /// Kernels faster than this (by ncu) are judged by the small-kernel rule, µs.
    #[arg(long, default_value_t = 50.0)]
    small_us: f64,
    /// Small kernels: an absolute difference that always passes, µs.
    #[arg(long, default_value_t = 0.3)]
    small_abs_us: f64,
    /// Small kernels: a relative difference that always passes.
    #[arg(long, default_value_t = 0.03)]
    small_rel: f64,
    /// Give up on one evaluation after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Give up on one ncu run after this many seconds.
    #[arg(long, default_value_t = 600)]
    ncu_timeout: u64,
    /// Compare with ncu's figure as it is (no timer floor taken off).
    #[arg(long)]
    raw: bool,
    /// kiln's samples of the empty kernel for the timer floor.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    floor_samples: u32,
    /// Also write the JSON report to this file (the text table still goes to stdout).
    #[arg(long)]
    report: Option<PathBuf>,
}

/// The pass rule for one comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    /// Relative limit for kernels of `small_us` and more.
    pub max_rel: f64,
    /// Below this (ncu's time, µs), the small-kernel limits apply.
    pub small_us: f64,
    /// Small kernels: absolute limit, µs.
    pub small_abs_us: f64,
    /// Small kernels: relative limit.
    pub small_rel: f64,
}

impl Rule {
    /// Whether kiln's `kiln_us` agrees with ncu's `ncu_us`, and the limit applied, µs.
    pub fn judge(&self, kiln_us: f64, ncu_us: f64) -> (bool, f64) {
        let limit = if ncu_us < self.small_us {
            self.small_abs_us.max(self.small_rel * ncu_us)
        } else {
            self.max_rel * ncu_us
        };
        let ok = kiln_us.is_finite() && ncu_us > 0.0 && (kiln_us - ncu_us).abs() <= limit;
        (ok, limit)
    }
}

/// One row of ncu's CSV: the kernel's name and its `gpu__time_duration`, ns.
#[derive(Debug, Clone, PartialEq)]
pub struct NcuRow {
    /// ncu's ID of the profiled launch.
    pub id: u64,
    /// Kernel name.
    pub kernel: String,
    /// Duration, ns.
    pub ns: f64,
}

/// The `gpu__time_duration` rows of an ncu `--csv` log (tool lines before the header are
/// skipped; values may carry thousands separators; units are converted to ns).
pub fn parse_ncu_csv(log: &str) -> Result<Vec<NcuRow>> {
    let Some(at) = log
        .lines()
        .position(|l| l.contains("\"Kernel Name\"") && l.contains("\"Metric Value\""))
    else {
        bail!("no CSV table in ncu's output (was anything profiled?)");
    };
    let table: String = log.lines().skip(at).collect::<Vec<_>>().join("\n");
    let mut rd = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(table.as_bytes());
    let headers = rd.headers().context("ncu's CSV header")?.clone();
    let col = |name: &str| {
        headers
            .iter()
            .position(|h| h == name)
            .with_context(|| format!("ncu's CSV has no {name:?} column"))
    };
    let (id_c, kernel_c, metric_c, unit_c, value_c) = (
        col("ID")?,
        col("Kernel Name")?,
        col("Metric Name")?,
        col("Metric Unit")?,
        col("Metric Value")?,
    );
    let mut rows = Vec::new();
    for rec in rd.records() {
        let rec = rec.context("a row of ncu's CSV")?;
        let get = |c: usize| rec.get(c).unwrap_or("").trim();
        if !get(metric_c).starts_with("gpu__time_duration") {
            continue;
        }
        let value: f64 = get(value_c)
            .replace(',', "")
            .parse()
            .with_context(|| format!("ncu value {:?}", get(value_c)))?;
        let scale = match get(unit_c) {
            "nsecond" | "ns" => 1.0,
            "usecond" | "us" => 1e3,
            "msecond" | "ms" => 1e6,
            "second" | "s" => 1e9,
            other => bail!("ncu reports gpu__time_duration in {other:?}, not a time unit"),
        };
        rows.push(NcuRow {
            id: get(id_c).parse().unwrap_or(rows.len() as u64),
            kernel: get(kernel_c).to_string(),
            ns: value * scale,
        });
    }
    rows.sort_by_key(|r| r.id);
    Ok(rows)
}

/// Sums ncu's rows per run of the launch list `kernels` (in launch order), after `warmup`
/// runs: one duration per run, µs.
pub fn per_run_us(rows: &[NcuRow], kernels: &[String], warmup: u32, runs: u32) -> Result<Vec<f64>> {
    let k = kernels.len();
    let want = k * (warmup + runs) as usize;
    if k == 0 || rows.len() != want {
        bail!(
            "ncu profiled {} launches; {} runs of {k} launches were made ({want})",
            rows.len(),
            warmup + runs
        );
    }
    for (i, r) in rows.iter().enumerate() {
        if r.kernel != kernels[i % k] {
            bail!(
                "ncu's launch {i} is {:?}; the launch list has {:?} there",
                r.kernel,
                kernels[i % k]
            );
        }
    }
    Ok(rows
        .chunks(k)
        .skip(warmup as usize)
        .map(|run| run.iter().map(|r| r.ns).sum::<f64>() / 1e3)
        .collect())
}

/// The median (0 for none).
fn median(v: &[f64]) -> f64 {
    kiln_sandbox::engine::contract::timing::median(&mut v.to_vec())
}

/// `ncu` as asked, else on PATH, else the CUDA toolkit's.
fn find_ncu(asked: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = asked {
        return Some(p.to_path_buf());
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("ncu"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let p = PathBuf::from("/usr/local/cuda/bin/ncu");
        p.is_file().then_some(p)
    })
}

/// A kernel name as an ncu regex alternative (names are C identifiers; anything else is
/// escaped).
fn regex_escape(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c.to_string()
            } else {
                format!("\\{c}")
            }
        })
        .collect()
}

/// Runs `launcher` (a kiln-worker) with `args`, on the GPU `gpu_uuid` names, within
/// `timeout`: its output when it exits 0, else an error quoting its stderr. `what` names
/// the step in the errors.
pub(super) async fn run_launcher(
    launcher: &Path,
    args: &[&std::ffi::OsStr],
    gpu_uuid: Option<&str>,
    timeout: Duration,
    what: &str,
) -> Result<std::process::Output> {
    let mut cmd = tokio::process::Command::new(launcher);
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    if let Some(u) = gpu_uuid {
        cmd.env("CUDA_VISIBLE_DEVICES", u);
    }
    let out = tokio::time::timeout(timeout, cmd.output())
        .await
        .with_context(|| format!("{what} did not finish within {} s", timeout.as_secs()))?
        .with_context(|| format!("cannot run {}", launcher.display()))?;
    if !out.status.success() {
        bail!(
            "{what} ({} {}) failed with {}: {}",
            launcher.display(),
            args.iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// ncu's per-run durations of `problem`'s seed, µs, and the command line used.
async fn ncu_runs(
    a: &AgreementArgs,
    ncu: &Path,
    launcher: &Path,
    spec: &Value,
    kernels: &[String],
    gpu_uuid: Option<&str>,
) -> Result<(Vec<f64>, String)> {
    let dir = tempfile::tempdir().context("a temporary directory for ncu")?;
    let spec_path = dir.path().join("problem.json");
    std::fs::write(&spec_path, serde_json::to_vec(spec)?).context("writing the problem")?;
    let log = dir.path().join("ncu.log");
    // The kernel is compiled (jailed) before ncu starts: under the profiler the jail's
    // helper would carry the profiler's injected threads and could not enter its
    // namespaces.
    let artifact = dir.path().join("kernel.bin");
    run_launcher(
        launcher,
        &[
            "launch".as_ref(),
            "--spec".as_ref(),
            spec_path.as_os_str(),
            "--compile-to".as_ref(),
            artifact.as_os_str(),
        ],
        gpu_uuid,
        Duration::from_secs(a.ncu_timeout),
        "compiling the kernel",
    )
    .await?;
    let mut names: Vec<String> = kernels.iter().map(|k| regex_escape(k)).collect();
    names.sort();
    names.dedup();
    let warmup = 1u32;
    let args: Vec<String> = vec![
        "--clock-control".into(),
        "none".into(),
        "--cache-control".into(),
        "all".into(),
        "--metrics".into(),
        "gpu__time_duration.sum".into(),
        "--csv".into(),
        "--print-units".into(),
        "base".into(),
        "--print-kernel-base".into(),
        "function".into(),
        "--kernel-name-base".into(),
        "function".into(),
        "--kernel-name".into(),
        format!("regex:^({})$", names.join("|")),
        "--launch-count".into(),
        (kernels.len() as u32 * (warmup + a.runs)).to_string(),
        "--log-file".into(),
        log.display().to_string(),
        launcher.display().to_string(),
        "launch".into(),
        "--spec".into(),
        spec_path.display().to_string(),
        "--runs".into(),
        a.runs.to_string(),
        "--warmup".into(),
        warmup.to_string(),
        "--artifact".into(),
        artifact.display().to_string(),
    ];
    let shown = format!("{} {}", ncu.display(), args.join(" "));
    let mut cmd = tokio::process::Command::new(ncu);
    cmd.args(&args)
        .env(kiln_sandbox::kiln_gpu::cupti::SETTING_ENV, "off")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    if let Some(u) = gpu_uuid {
        cmd.env("CUDA_VISIBLE_DEVICES", u);
    }
    let out = tokio::time::timeout(Duration::from_secs(a.ncu_timeout), cmd.output())
        .await
        .with_context(|| format!("ncu did not finish within {} s", a.ncu_timeout))?
        .with_context(|| format!("cannot run {}", ncu.display()))?;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    if !out.status.success() {
        let tail = |b: &[u8]| {
            let s = String::from_utf8_lossy(b);
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(8)..].join("\n")
        };
        bail!(
            "ncu exited with {}: {}\n{}\n{}",
            out.status,
            tail(&out.stderr),
            tail(&out.stdout),
            tail(text.as_bytes())
        );
    }
    // The table goes to the log file; some ncu versions print it on stdout instead.
    let rows =
        parse_ncu_csv(&text).or_else(|_| parse_ncu_csv(&String::from_utf8_lossy(&out.stdout)))?;
    Ok((per_run_us(&rows, kernels, warmup, a.runs)?, shown))
}

/// The timer floor: the empty kernel under ncu (as the problems are profiled) and by kiln's
/// own samples; with the ncu command line used.
async fn measure_floor(
    a: &AgreementArgs,
    ncu: &Path,
    launcher: &Path,
    gpu_uuid: Option<&str>,
    timeout: Duration,
) -> Result<(Floor, String), String> {
    let spec = floor::spec();
    let kernels = vec![floor::KERNEL.to_string()];
    let (runs, command) = ncu_runs(a, ncu, launcher, &spec, &kernels, gpu_uuid)
        .await
        .map_err(|e| format!("ncu: {e:#}"))?;
    let kiln = floor::kiln_samples(launcher, &spec, a.floor_samples, gpu_uuid, timeout)
        .await
        .map_err(|e| format!("kiln: {e:#}"))?;
    Ok((
        Floor {
            ncu_us: median(&runs),
            ncu_runs_us: runs,
            kiln,
        },
        command,
    ))
}

/// Runs the benchmark and prints its report; exit status 1 when a comparison fails.
pub async fn run(client: &Client, out: Output, a: AgreementArgs) -> Result<std::process::ExitCode> {
    let problems: Vec<String> = if a.problems.is_empty() {
        DEFAULT_PROBLEMS.iter().map(|s| s.to_string()).collect()
    } else {
        a.problems.clone()
    };
    let rule = Rule {
        max_rel: a.max_rel,
        small_us: a.small_us,
        small_abs_us: a.small_abs_us,
        small_rel: a.small_rel,
    };
    let ncu = find_ncu(a.ncu.as_deref());
    let launcher = a
        .launcher
        .clone()
        .unwrap_or_else(kiln_sandbox::default_worker_exe);
    let tag = common::run_tag();
    let timeout = Duration::from_secs(a.timeout);
    let mut rows = Vec::new();
    let mut info = Value::Null;
    let mut all_ok = true;
    // The timer floor, measured once (on the first problem's GPU) when ncu is there.
    let mut floor_measured: Option<Result<(Floor, String), String>> = None;
    for problem in &problems {
        let setup = common::setup(
            client,
            Some(problem),
            Some(BackendKind::Cuda.as_str()),
            None,
            |_| "",
        )
        .await?;
        info = setup.info.clone();
        let shown = client.get(&format!("/v1/problems/{problem}")).await?;
        let spec = shown["spec"].clone();
        let kernels: Vec<String> = setup
            .seed
            .launches
            .iter()
            .map(|l| l.kernel.clone())
            .collect();
        // kiln: the seed as a fresh candidate, evaluated `evaluations` times, on lane 0 (the
        // GPU ncu profiles below: on a host with several GPUs, the same one).
        let lane0 = JobOptions {
            lane: Some(0),
            ..JobOptions::default()
        };
        let first = common::stream(
            client,
            vec![Work::Submit(
                Box::new(common::variant(&setup.seed, &tag, 0, Variants::Comment)),
                lane0.clone(),
            )],
            1,
            timeout,
        )
        .await?;
        let Some(first) = first.into_iter().next() else {
            bail!("{problem}: the seed's evaluation returned nothing");
        };
        if first.verdict.as_deref() != Some("ok") {
            bail!(
                "{problem}: the seed is not `ok`: {}",
                first.verdict.as_deref().unwrap_or("its job failed")
            );
        }
        let mut done = vec![first.clone()];
        if a.evaluations > 1 {
            let again: Vec<Work> = (1..a.evaluations)
                .map(|_| Work::Again(first.candidate.clone(), lane0.clone()))
                .collect();
            done.extend(common::stream(client, again, 1, timeout).await?);
        }
        let medians: Vec<f64> = done.iter().filter_map(|d| d.median_us).collect();
        let figure_of = |key: &str| -> Option<f64> {
            let v: Vec<f64> = done
                .iter()
                .filter_map(|d| d.timer[key]["median_us"].as_f64())
                .collect();
            (!v.is_empty()).then(|| median(&v))
        };
        let kiln_us = median(&medians);
        let timer = &first.timer;
        let mut row = json!({
            "problem": problem,
            "kernels": kernels,
            "candidate": first.candidate,
            "evaluations": medians.len(),
            "kiln_median_us": kiln_us,
            "figure": timer["figure"],
            "source": timer["source"],
            "fallback": timer["fallback"],
            "kernel_sum_us": figure_of("kernel_sum"),
            "kernel_span_us": figure_of("kernel_span"),
            "events_us": figure_of("events"),
        });
        match &ncu {
            None => {
                row["status"] = json!("skip");
                row["detail"] =
                    json!("ncu not found (give --ncu PATH): kiln's figures only, nothing compared");
            }
            Some(ncu) => {
                // Lane 0's GPU (kilnd's lanes; NVML's first GPU from an older kilnd).
                let lanes = common::lanes(&info, BackendKind::Cuda.as_str());
                let gpu_uuid = lanes
                    .first()
                    .and_then(|l| l["label"].as_str())
                    .or_else(|| info["gpus"][0]["uuid"].as_str());
                if !a.raw && floor_measured.is_none() {
                    floor_measured =
                        Some(measure_floor(&a, ncu, &launcher, gpu_uuid, timeout).await);
                }
                match ncu_runs(&a, ncu, &launcher, &spec, &kernels, gpu_uuid).await {
                    Ok((runs, command)) => {
                        let ncu_us = median(&runs);
                        let per_launch = match &floor_measured {
                            None => Err("--raw: ncu's figure as it is".to_string()),
                            Some(Err(e)) => Err(format!("the timer floor was not measured: {e}")),
                            Some(Ok((f, _))) => f.per_launch_us(
                                timer["figure"].as_str().unwrap_or("events"),
                                timer["source"].as_str().unwrap_or("events"),
                            ),
                        };
                        let compared = match &per_launch {
                            Ok(d) => floor::net_ncu_us(ncu_us, kernels.len(), *d),
                            Err(_) => ncu_us,
                        };
                        let (ok, limit) = rule.judge(kiln_us, compared);
                        all_ok &= ok;
                        row["status"] = json!(if ok { "pass" } else { "fail" });
                        row["ncu_us"] = json!(ncu_us);
                        row["ncu_runs_us"] = json!(runs);
                        row["ratio"] = json!(kiln_us / ncu_us);
                        match per_launch {
                            Ok(d) => {
                                row["floor_per_launch_us"] = json!(d);
                                row["ncu_net_us"] = json!(compared);
                                row["ratio_net"] = json!(kiln_us / compared);
                            }
                            Err(why) => row["floor_detail"] = json!(why),
                        }
                        row["compared_us"] = json!(compared);
                        row["limit_us"] = json!(limit);
                        row["ncu_command"] = json!(command);
                    }
                    Err(e) => {
                        all_ok = false;
                        row["status"] = json!("fail");
                        row["detail"] = json!(format!("ncu: {e:#}"));
                    }
                }
            }
        }
        rows.push(row);
    }
    let report = json!({
        "benchmark": "agreement",
        "backend": "cuda",
        "started_at_ms": common::now_ms() as u64,
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "kiln_version": env!("CARGO_PKG_VERSION"),
        "kilnd_version": info["version"],
        "gpus": info["gpus"].as_array().into_iter().flatten().map(|g| g["name"].clone()).collect::<Vec<_>>(),
        "host": info["host"],
        "settings": {
            "problems": problems, "evaluations": a.evaluations, "runs": a.runs,
            "ncu": ncu.as_ref().map(|p| p.display().to_string()),
            "launcher": launcher.display().to_string(),
            "max_rel": a.max_rel, "small_us": a.small_us, "raw": a.raw,
            "floor_samples": a.floor_samples,
            "small_abs_us": a.small_abs_us, "small_rel": a.small_rel,
        },
        "floor": match &floor_measured {
            None => Value::Null,
            Some(Ok((f, command))) => json!({
                "kernel": floor::KERNEL,
                "ncu_us": f.ncu_us,
                "ncu_runs_us": f.ncu_runs_us,
                "kiln": f.kiln,
                "ncu_command": command,
            }),
            Some(Err(e)) => json!({ "kernel": floor::KERNEL, "error": e }),
        },
        "comparisons": rows,
        "ok": all_ok,
    });
    if let Some(path) = &a.report {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if out == Output::Json {
        print_json(&report);
    } else {
        print_table(&report);
    }
    Ok(if all_ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

fn print_table(r: &Value) {
    let us = |v: &Value| v.as_f64().map_or("-".to_string(), fmt_us);
    println!(
        "agreement  kiln (through kilnd) vs ncu --clock-control none --cache-control all gpu__time_duration"
    );
    let f = &r["floor"];
    if let Some(e) = f["error"].as_str() {
        println!("timer floor: not measured ({e}); ncu's figures are compared as they are");
    } else if !f.is_null() {
        println!(
            "timer floor: the empty kernel {} reads {} by ncu, {} by kiln ({} span, {} events); \
             ncu's figures less the difference per launch are compared (--raw: as they are)",
            text(&f["kernel"]),
            us(&f["ncu_us"]),
            us(&f["kiln"]["kernel_span_us"]),
            text(&f["kiln"]["source"]),
            us(&f["kiln"]["events_us"]),
        );
    }
    println!(
        "{:<26} {:<12} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>7}",
        "problem", "figure", "kiln", "kernel sum", "span", "events", "ncu", "ncu-floor", "ratio"
    );
    let rows = r["comparisons"].as_array().cloned().unwrap_or_default();
    for c in &rows {
        println!(
            "{:<26} {:<12} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>7}",
            text(&c["problem"]),
            text(&c["figure"]),
            us(&c["kiln_median_us"]),
            us(&c["kernel_sum_us"]),
            us(&c["kernel_span_us"]),
            us(&c["events_us"]),
            us(&c["ncu_us"]),
            us(&c["ncu_net_us"]),
            c["ratio_net"]
                .as_f64()
                .or(c["ratio"].as_f64())
                .map_or("-".to_string(), |x| format!("{x:.3}"))
        );
    }
    for c in &rows {
        let status = text(&c["status"]).to_uppercase();
        let detail = if c["detail"].is_null() {
            let against = match c["floor_per_launch_us"].as_f64() {
                Some(d) => format!(
                    "ncu {} less the timer floor {} per launch = {}",
                    us(&c["ncu_us"]),
                    fmt_us(d),
                    us(&c["ncu_net_us"])
                ),
                None => format!(
                    "ncu {} ({})",
                    us(&c["ncu_us"]),
                    c["floor_detail"].as_str().unwrap_or("no timer floor")
                ),
            };
            format!(
                "kiln {} vs {against} (ratio {:.3}, {:.3} to ncu as it is; limit ±{})",
                us(&c["kiln_median_us"]),
                c["ratio_net"]
                    .as_f64()
                    .or(c["ratio"].as_f64())
                    .unwrap_or(f64::NAN),
                c["ratio"].as_f64().unwrap_or(f64::NAN),
                us(&c["limit_us"])
            )
        } else {
            text(&c["detail"])
        };
        println!("{status} agreement {} {detail}", text(&c["problem"]));
        if c["source"].as_str() == Some("events") {
            println!(
                "     kiln timed {} with events only: {}",
                text(&c["problem"]),
                text(&c["fallback"])
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = r#"==PROF== Connected to process 4242 (/opt/kiln/kiln-worker)
==PROF== Profiling "ln_stats" - 0: 0%....50%....100% - 1 pass
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"1","4242","kiln-worker","127.0.0.1","ln_apply","1","13","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","2,000"
"0","4242","kiln-worker","127.0.0.1","ln_stats","1","13","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","1,000"
"2","4242","kiln-worker","127.0.0.1","ln_stats","1","13","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","1.5"
"3","4242","kiln-worker","127.0.0.1","ln_apply","1","13","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","2500"
==PROF== Disconnected from process 4242
"#;

    #[test]
    fn ncu_rows_are_read_in_launch_order_in_ns() {
        let rows = parse_ncu_csv(LOG).expect("parses");
        let got: Vec<(u64, &str, f64)> = rows
            .iter()
            .map(|r| (r.id, r.kernel.as_str(), r.ns))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, "ln_stats", 1000.0),
                (1, "ln_apply", 2000.0),
                (2, "ln_stats", 1500.0),
                (3, "ln_apply", 2500.0)
            ]
        );
        assert!(parse_ncu_csv("==PROF== nothing profiled\n").is_err());
        // The launcher's own JSON line after the table (ncu printing to stdout) is skipped.
        let with_app = format!("{LOG}{{\"problem\":\"x\",\"kernels\":[\"ln_stats\"]}}\n");
        assert_eq!(parse_ncu_csv(&with_app).expect("parses").len(), 4);
        let cycles = LOG.replace("\"nsecond\",\"2500\"", "\"cycle\",\"2500\"");
        assert!(parse_ncu_csv(&cycles).is_err());
    }

    #[test]
    fn a_multi_launch_run_is_the_sum_of_its_kernels_after_the_warmup() {
        let rows = parse_ncu_csv(LOG).expect("parses");
        let kernels = vec!["ln_stats".to_string(), "ln_apply".to_string()];
        assert_eq!(
            per_run_us(&rows, &kernels, 1, 1).expect("grouped"),
            vec![4.0]
        );
        assert_eq!(
            per_run_us(&rows, &kernels, 0, 2).expect("grouped"),
            vec![3.0, 4.0]
        );
        // Counts or order that do not match the launch list are refused.
        assert!(per_run_us(&rows, &kernels, 1, 2).is_err());
        let swapped = vec!["ln_apply".to_string(), "ln_stats".to_string()];
        assert!(per_run_us(&rows, &swapped, 0, 2).is_err());
    }

    #[test]
    fn small_kernels_get_the_absolute_or_wider_relative_limit() {
        let rule = Rule {
            max_rel: 0.02,
            small_us: 50.0,
            small_abs_us: 0.3,
            small_rel: 0.03,
        };
        // vecadd: ncu 6.05 µs. Events' 8.1 µs fails; 6.30 passes (|Δ| 0.25 ≤ 0.3).
        assert!(!rule.judge(8.1, 6.05).0);
        let (ok, limit) = rule.judge(6.30, 6.05);
        assert!(ok && (limit - 0.3).abs() < 1e-12);
        assert!(!rule.judge(6.40, 6.05).0);
        // 40 µs: 3 % (1.2 µs) is larger than 0.3 µs.
        assert!(rule.judge(41.1, 40.0).0);
        // Large kernels: 2 %.
        assert!(rule.judge(1019.0, 1000.0).0);
        assert!(!rule.judge(1021.0, 1000.0).0);
        assert!(!rule.judge(f64::NAN, 1000.0).0);
        assert!(!rule.judge(5.0, 0.0).0);
    }

    #[test]
    fn kernel_names_become_an_anchored_alternative() {
        assert_eq!(regex_escape("ln_stats2"), "ln_stats2");
        assert_eq!(regex_escape("a.b"), "a\\.b");
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[]), 0.0);
    }
}
