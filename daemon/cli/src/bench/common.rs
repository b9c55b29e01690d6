//! What the three benchmarks share: finding the problem and backend, deriving distinct
//! candidates from the seed kernel, queueing jobs and waiting for them, per-stage
//! latencies of a finished job, percentiles, and the lanes' busy time from `/metrics`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures_util::StreamExt;
use kiln_daemon::client::Client;
use kiln_types::{BackendKind, Candidate, JobOptions, ProblemSpec, RaceAgainst};
use serde::Serialize;
use serde_json::{Value, json};

/// The problem and backend a benchmark runs on, with the seed kernel it derives from.
pub struct Setup {
    /// Problem name.
    pub problem: String,
    /// Backend name (`host`, `cuda`).
    pub backend: String,
    /// The problem's seed kernel for that backend.
    pub seed: Candidate,
    /// kilnd's `/v1/info`, for the report (version, GPUs).
    pub info: Value,
}

/// Picks the backend (the one asked for, else cuda when usable, else host), the problem
/// (the one asked for, else this benchmark's default for the backend) and its seed (the
/// backend's, or the seed in `language` — `triton` runs on cuda).
pub async fn setup(
    client: &Client,
    problem: Option<&str>,
    backend: Option<&str>,
    language: Option<&str>,
    default_problem: fn(&str) -> &'static str,
) -> Result<Setup> {
    setup_from(client, problem, backend, language, None, default_problem).await
}

/// [`setup`], deriving the candidates from `candidate` (a user's candidate file) instead
/// of a seed when given: any registered problem then works, an imported one with no seed
/// included. Its problem is `problem` when given, else the candidate's own; its backend
/// its language's.
pub async fn setup_from(
    client: &Client,
    problem: Option<&str>,
    backend: Option<&str>,
    language: Option<&str>,
    candidate: Option<Candidate>,
    default_problem: fn(&str) -> &'static str,
) -> Result<Setup> {
    let cand_backend = candidate.as_ref().map(|c| c.language.backend().to_string());
    let backend = backend.or(cand_backend.as_deref());
    let problem = problem.or(candidate.as_ref().map(|c| c.problem.as_str()));
    let info = client.get("/v1/info").await?;
    let usable: Vec<String> = info["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["usable"].as_bool() == Some(true))
        .filter_map(|b| b["name"].as_str().map(str::to_string))
        .collect();
    let backend = match (backend, language) {
        (Some(b), _) => b.to_string(),
        (None, Some(l)) => serde_json::from_value::<kiln_types::Language>(Value::from(l))
            .with_context(|| format!("unknown language {l:?}"))?
            .backend()
            .to_string(),
        (None, None) if usable.iter().any(|b| *b == BackendKind::Cuda) => {
            BackendKind::Cuda.to_string()
        }
        (None, None) => BackendKind::Host.to_string(),
    };
    if language == Some("triton") && info["triton"]["usable"].as_bool() != Some(true) {
        bail!(
            "this kilnd cannot compile triton candidates: {}",
            text_of(&info["triton"]["detail"])
        );
    }
    if !usable.contains(&backend) {
        bail!(
            "the {backend} backend is not usable on this kilnd (usable: {}); see `kiln doctor`",
            if usable.is_empty() {
                "none".to_string()
            } else {
                usable.join(", ")
            }
        );
    }
    let problem = problem
        .unwrap_or_else(|| default_problem(&backend))
        .to_string();
    let shown = client
        .get(&format!("/v1/problems/{problem}"))
        .await
        .with_context(|| {
            format!("problem {problem} (register it with `kiln problems add problems/{problem}`)")
        })?;
    let spec: ProblemSpec = serde_json::from_value(shown["spec"].clone())
        .context("kilnd sent a problem spec this kiln cannot read")?;
    let key = match language {
        Some("triton") => "triton",
        _ => backend.as_str(),
    };
    let seed = match (candidate, spec.seed_candidate(key)) {
        (Some(mut c), _) => {
            c.problem = problem.clone();
            c
        }
        (None, Some(seed)) => seed,
        // An imported (torch-reference) problem has no seed: its hand-written twin's.
        (None, None) => twin_seed(client, &spec, key).await?,
    };
    if seed.language.backend() != backend.as_str() {
        bail!(
            "{} candidates run on the {} backend, not {backend}",
            seed.language.as_str(),
            seed.language.backend()
        );
    }
    Ok(Setup {
        problem,
        backend,
        seed,
        info,
    })
}

/// A candidate file (JSON, as `kiln submit` takes it), parsed and validated.
pub fn read_candidate(file: &std::path::Path) -> Result<Candidate> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let c: Candidate = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a candidate (JSON, as `kiln submit` takes)",
            file.display()
        )
    })?;
    c.validate()
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    Ok(c)
}

/// The default problem of the benchmarks that time a kernel of some size: the softmax
/// seed problem of the backend.
pub fn softmax_problem(backend: &str) -> &'static str {
    if backend == BackendKind::Cuda {
        "softmax-4096x65536"
    } else {
        "softmax-256x4096"
    }
}

/// The seed of `spec`'s hand-written twin (the registered problem named as `spec` without
/// its `kb-` prefix: `kiln problems import kernelbench` names the seed's problems so),
/// written against `spec`'s tensor names. Only for a problem with a torch reference and
/// no seed of its own.
async fn twin_seed(client: &Client, spec: &ProblemSpec, key: &str) -> Result<Candidate> {
    let problem = &spec.name;
    let twin = spec
        .name
        .strip_prefix("kb-")
        .filter(|_| spec.reference.torch.is_some())
        .with_context(|| format!("problem {problem} has no seed kernel for {key}"))?;
    let shown = client
        .get(&format!("/v1/problems/{twin}"))
        .await
        .with_context(|| {
            format!(
                "problem {problem} has no seed kernel for {key}; its hand-written twin {twin} \
                 lends one once registered (`kiln problems add problems/{twin}`)"
            )
        })?;
    let twin_spec: ProblemSpec = serde_json::from_value(shown["spec"].clone())
        .context("kilnd sent a problem spec this kiln cannot read")?;
    let seed = twin_spec
        .seed_candidate(key)
        .with_context(|| format!("neither {problem} nor its twin {twin} has a {key} seed"))?;
    renamed_for(&twin_spec, spec, seed).map_err(anyhow::Error::msg)
}

/// `c`, a candidate of `from`, written against `to`'s tensor names: the tensors pair up
/// in order and must agree in shape, dtype and role (an imported problem lists forward
/// arguments, parameters, then outputs, as its twin does).
fn renamed_for(
    from: &ProblemSpec,
    to: &ProblemSpec,
    mut c: Candidate,
) -> Result<Candidate, String> {
    let sig = |p: &ProblemSpec| -> Vec<_> {
        p.tensors
            .iter()
            .map(|t| (t.shape.clone(), t.dtype, t.role))
            .collect()
    };
    if sig(from) != sig(to) {
        return Err(format!(
            "{} and {} do not pair up tensor by tensor (shape, dtype, role): {:?} vs {:?}",
            from.name,
            to.name,
            sig(from),
            sig(to)
        ));
    }
    let names: BTreeMap<&str, &str> = from
        .tensors
        .iter()
        .zip(&to.tensors)
        .map(|(a, b)| (a.name.as_str(), b.name.as_str()))
        .collect();
    for l in &mut c.launches {
        for a in &mut l.args {
            if let kiln_types::Arg::Buffer(n) = a
                && let Some(m) = names.get(n.as_str())
            {
                *n = (*m).to_string();
            }
        }
    }
    c.problem = to.name.clone();
    c.note = Some(format!("{}'s seed kernel", from.name));
    Ok(c)
}

/// A short random tag, so candidates of one run never collide with an earlier run's.
pub fn run_tag() -> String {
    format!("{:08x}", rand::random::<u32>())
}

/// How distinct candidates are derived from the seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Variants {
    /// A unique comment, and the seed's first knob cycled through its values (the suite's
    /// first knob never changes the launch list), so speeds differ as in a search.
    Knob,
    /// Only a unique comment: every candidate is the seed's code.
    Comment,
    /// As `knob`, with the CUDA toolkit headers generated kernels include on top
    /// (`cuda_runtime.h`, `cuda_fp16.h`, `cooperative_groups.h`, cub's block reduce,
    /// `<cstdint>`, `<cfloat>`): measures compiles that parse the toolkit's headers.
    Headers,
}

/// What [`Variants::Headers`] puts before each candidate's source.
pub const HEADER_PREFIX: &str = "#include <cuda_runtime.h>\n#include <cuda_fp16.h>\n\
#include <cooperative_groups.h>\n#include <cub/block/block_reduce.cuh>\n#include <cstdint>\n\
#include <cfloat>\n";

/// The `i`-th distinct candidate of run `tag`. The leading comment makes its source,
/// hence its content hash and its compile-cache key, unique.
pub fn variant(seed: &Candidate, tag: &str, i: usize, how: Variants) -> Candidate {
    let mut c = seed.clone();
    let body = match how {
        Variants::Knob => with_first_knob(&seed.source, i),
        Variants::Comment => seed.source.clone(),
        Variants::Headers => format!("{HEADER_PREFIX}{}", with_first_knob(&seed.source, i)),
    };
    c.source = match seed.language {
        kiln_types::Language::Triton
        | kiln_types::Language::ModelNew
        | kiln_types::Language::ModelNewCpu => format!("# kiln bench {tag} #{i}\n{body}"),
        kiln_types::Language::Cuda | kiln_types::Language::C => {
            format!("/* kiln bench {tag} #{i} */\n{body}")
        }
    };
    c.note = Some(format!("kiln bench {tag} #{i}"));
    c.parent = None;
    c
}

/// `"x"` for a JSON string, else its text.
fn text_of(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

/// The source with its first knob (`// @knob NAME V1|V2|…` + `#define NAME V`, or in
/// Python `# @knob …` + `NAME = tl.constexpr(V)`) set to value `i mod count`; unchanged
/// when it has none.
fn with_first_knob(source: &str, i: usize) -> String {
    let lines: Vec<&str> = source.lines().collect();
    for (at, line) in lines.iter().enumerate() {
        let t = line.trim();
        let Some(rest) = t
            .strip_prefix("// @knob ")
            .or_else(|| t.strip_prefix("# @knob "))
        else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(values)) = (parts.next(), parts.next()) else {
            continue;
        };
        let values: Vec<&str> = values.split('|').filter(|v| !v.is_empty()).collect();
        let Some(next) = lines.get(at + 1) else {
            continue;
        };
        if values.is_empty() {
            continue;
        }
        let value = values[i % values.len()];
        let replaced = if next.trim().starts_with(&format!("#define {name} ")) {
            format!("#define {name} {value}")
        } else if let Some(callee) = next
            .trim()
            .strip_prefix(&format!("{name} = "))
            .and_then(|r| r.split_once('('))
            .map(|(c, _)| c.trim())
            .filter(|c| c.ends_with("constexpr"))
        {
            format!("{name} = {callee}({value})")
        } else {
            continue;
        };
        let mut out: Vec<String> = lines.iter().map(|l| (*l).to_string()).collect();
        out[at + 1] = replaced;
        return out.join("\n") + "\n";
    }
    source.to_string()
}

/// `?plain=…&race=…&race_margin=…&lane=…` for `POST /v1/candidates`.
fn query(options: &JobOptions) -> String {
    let mut q = Vec::new();
    if let Some(n) = options.plain {
        q.push(format!("plain={n}"));
    }
    match &options.race {
        Some(RaceAgainst::Upper(u)) => q.push(format!("race={u}")),
        Some(RaceAgainst::Named(n)) => q.push(format!("race={n}")),
        None => {}
    }
    if let Some(m) = options.race_margin {
        q.push(format!("race_margin={m}"));
    }
    if let Some(l) = options.lane {
        q.push(format!("lane={l}"));
    }
    if q.is_empty() {
        String::new()
    } else {
        format!("?{}", q.join("&"))
    }
}

/// One unit of work for a stream: submit a new candidate, or queue another evaluation
/// of a stored one.
#[derive(Debug, Clone)]
pub enum Work {
    /// `POST /v1/candidates` with these options; must not be a duplicate.
    Submit(Box<Candidate>, JobOptions),
    /// `POST /v1/candidates/{id}/jobs` with these options.
    Again(String, JobOptions),
}

/// Queues one unit of work; returns (candidate id, job id).
pub async fn queue(client: &Client, work: &Work) -> Result<(String, i64)> {
    let resp = match work {
        Work::Submit(c, options) => {
            let (_, resp) = client
                .post(&format!("/v1/candidates{}", query(options)), &json!(c))
                .await?;
            if resp["duplicate"].as_bool() == Some(true) {
                bail!(
                    "candidate {} was already stored; a benchmark needs fresh candidates",
                    resp["id"]
                );
            }
            resp
        }
        Work::Again(id, options) => {
            client
                .post(&format!("/v1/candidates/{id}/jobs"), &json!(options))
                .await?
                .1
        }
    };
    let id = resp["id"].as_str().context("kilnd's reply has no id")?;
    let job = resp["job_id"]
        .as_i64()
        .context("kilnd's reply has no job id")?;
    Ok((id.to_string(), job))
}

/// Long-polls a job until it is done or failed; the job with its evaluation.
pub async fn wait_job(client: &Client, job: i64, timeout: Duration) -> Result<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).as_secs();
        let r = client
            .get(&format!("/v1/jobs/{job}?wait={}", left.clamp(1, 60)))
            .await?;
        if matches!(r["state"].as_str(), Some("done" | "failed")) {
            return Ok(r);
        }
        if left == 0 {
            bail!(
                "job {job} did not finish within {} s (state {})",
                timeout.as_secs(),
                r["state"]
            );
        }
    }
}

/// A finished job as a benchmark sees it.
#[derive(Debug, Clone, Serialize)]
pub struct Finished {
    /// Candidate id.
    pub candidate: String,
    /// Job id.
    pub job: i64,
    /// `done` or `failed`.
    pub state: String,
    /// The verdict, when there is one.
    pub verdict: Option<String>,
    /// Median time, µs.
    pub median_us: Option<f64>,
    /// Whether timing stopped by racing.
    pub raced_out: bool,
    /// Whether it was a plain timing.
    pub plain: bool,
    /// An `ok` verdict whose time is no time: a median of 0, or a sample (all its runs)
    /// at or below the timer overhead kiln subtracted. kiln never reports one; a
    /// benchmark counts them to show it.
    pub ok_without_a_time: bool,
    /// Whether the compile came from the cache.
    pub compile_cached: Option<bool>,
    /// The UUID of the GPU that evaluated it (`telemetry.device.uuid`; cuda only).
    pub device: Option<String>,
    /// Per-stage latencies, ms (absent where the job never reached the stage).
    pub stages: BTreeMap<&'static str, f64>,
    /// GPU: how the samples were timed and every figure of them (`timing.timer`).
    #[serde(skip_serializing_if = "Value::is_null")]
    pub timer: Value,
}

/// Reads a finished job (as `GET /v1/jobs/{id}` sends it), with the client-side time
/// from queueing it to having its verdict.
///
/// Stages: `queue` (accepted → claimed), `compile` (reference and candidate, cache
/// lookups included), `lane_wait` (compiled → lane free: what is left of the job's wall
/// time), `correctness` (the correctness trials as the worker measured them,
/// `evidence.correctness_ms`; for older records the evaluation minus its timing phase),
/// `timing` (overhead, warm-up and samples), `end_to_end`.
pub fn finished(candidate: &str, job: &Value, end_to_end_ms: f64) -> Finished {
    let f = |v: &Value| v.as_f64();
    let e = &job["evaluation"];
    let t = &e["timing"];
    let mut stages = BTreeMap::new();
    stages.insert("end_to_end", end_to_end_ms);
    let (created, started, done) = (
        f(&job["created_at"]),
        f(&job["started_at"]),
        f(&job["finished_at"]),
    );
    if let (Some(c), Some(s)) = (created, started) {
        stages.insert("queue", (s - c).max(0.0));
    }
    let compile = f(&job["compile_ms"]);
    let eval = f(&job["eval_ms"]);
    if let Some(c) = compile {
        stages.insert("compile", c);
    }
    if let (Some(s), Some(d), Some(c), Some(ev)) = (started, done, compile, eval) {
        stages.insert("lane_wait", (d - s - c - ev).max(0.0));
    }
    if let (Some(ev), Some(wall)) = (eval, f(&t["wall_ms"])) {
        let timing = wall + f(&t["warmup_ms"]).unwrap_or(0.0);
        stages.insert("timing", timing);
        let measured = f(&e["evidence"]["correctness_ms"]);
        stages.insert("correctness", measured.unwrap_or((ev - timing).max(0.0)));
    } else if let Some(ev) = eval.filter(|ev| *ev > 0.0) {
        // No timing phase (the verdict came before it): all of it was correctness.
        stages.insert("correctness", ev);
    }
    Finished {
        candidate: candidate.to_string(),
        job: job["id"].as_i64().unwrap_or(0),
        state: job["state"].as_str().unwrap_or("").to_string(),
        verdict: e["verdict"].as_str().map(str::to_string),
        median_us: f(&t["median_us"]),
        raced_out: t["raced_out"].as_bool() == Some(true),
        plain: t["plain"].as_bool() == Some(true),
        ok_without_a_time: e["verdict"] == "ok" && {
            let median = f(&t["median_us"]).unwrap_or(0.0);
            let reps = f(&t["reps"]).unwrap_or(1.0);
            median <= 0.0 || median * reps <= f(&t["overhead_us"]).unwrap_or(0.0)
        },
        compile_cached: e["compile"]["cached"].as_bool(),
        device: e["telemetry"]["device"]["uuid"]
            .as_str()
            .map(str::to_string),
        stages,
        timer: t["timer"].clone(),
    }
}

/// Runs `work` with at most `in_flight` jobs outstanding, each queued then waited for;
/// results in the order given.
pub async fn stream(
    client: &Client,
    work: Vec<Work>,
    in_flight: usize,
    timeout: Duration,
) -> Result<Vec<Finished>> {
    // Unordered, so one slow job does not hold back the next submissions.
    let mut results: Vec<(usize, Result<Finished>)> = futures_util::stream::iter(work)
        .enumerate()
        .map(|(i, w)| async move {
            let t0 = Instant::now();
            let r = async {
                let (id, job) = queue(client, &w).await?;
                let r = wait_job(client, job, timeout).await?;
                Ok(finished(&id, &r, t0.elapsed().as_secs_f64() * 1e3))
            }
            .await;
            (i, r)
        })
        .buffer_unordered(in_flight.max(1))
        .collect()
        .await;
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// Nearest-rank percentiles and the mean of a set of values.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Summary {
    /// How many values.
    pub n: usize,
    /// Mean.
    pub mean: f64,
    /// Median (nearest rank).
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// The summary of `values` (all zero for none; NaN values are left out).
pub fn summary(values: &[f64]) -> Summary {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return Summary::default();
    }
    v.sort_by(f64::total_cmp);
    let rank = |p: f64| {
        let r = (p * v.len() as f64).ceil() as usize;
        v[r.clamp(1, v.len()) - 1]
    };
    Summary {
        n: v.len(),
        mean: v.iter().sum::<f64>() / v.len() as f64,
        p50: rank(0.50),
        p90: rank(0.90),
        p99: rank(0.99),
        max: v[v.len() - 1],
    }
}

/// Summaries of each stage over a set of finished jobs.
pub fn stage_summaries(done: &[Finished]) -> BTreeMap<&'static str, Summary> {
    let mut by: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    for d in done {
        for (k, v) in &d.stages {
            by.entry(*k).or_default().push(*v);
        }
    }
    by.into_iter().map(|(k, v)| (k, summary(&v))).collect()
}

/// Stage names in the order a job goes through them.
pub const STAGES: [&str; 6] = [
    "queue",
    "compile",
    "lane_wait",
    "correctness",
    "timing",
    "end_to_end",
];

/// Prints per-stage latency percentiles of each named set (`name`, `latency_ms`).
pub fn print_stage_table(sets: &[Value]) {
    println!(
        "{:<9} {:<12} {:>5} {:>9} {:>9} {:>9} {:>9}",
        "", "stage (ms)", "n", "p50", "p90", "p99", "max"
    );
    for set in sets {
        let name = set["name"].as_str().unwrap_or("");
        for stage in STAGES {
            let s = &set["latency_ms"][stage];
            if s.is_null() {
                continue;
            }
            let g = |k: &str| ms(s[k].as_f64().unwrap_or(0.0));
            println!(
                "{:<9} {:<12} {:>5} {:>9} {:>9} {:>9} {:>9}",
                name,
                stage,
                s["n"].to_string(),
                g("p50"),
                g("p90"),
                g("p99"),
                g("max")
            );
        }
    }
}

/// Seconds each lane of `backend` has been busy (`kiln_lane_busy_seconds_total`), by lane.
pub async fn lane_busy(client: &Client, backend: &str) -> Result<BTreeMap<String, f64>> {
    let text = client.get_text("/metrics").await?;
    Ok(parse_lane_busy(&text, backend))
}

fn parse_lane_busy(text: &str, backend: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("kiln_lane_busy_seconds_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once('}') else {
            continue;
        };
        let label = |name: &str| {
            labels.split(',').find_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                (k.trim() == name).then(|| v.trim().trim_matches('"').to_string())
            })
        };
        if label("backend").as_deref() != Some(backend) {
            continue;
        }
        if let (Some(lane), Ok(v)) = (label("lane"), value.trim().parse::<f64>()) {
            out.insert(lane, v);
        }
    }
    out
}

/// The lanes of `backend` that kilnd lists (`/v1/info` `lanes`), in lane order.
pub fn lanes(info: &Value, backend: &str) -> Vec<Value> {
    info["lanes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|l| l["backend"].as_str() == Some(backend))
        .cloned()
        .collect()
}

/// Busy fraction of each lane over `wall_s`, from two readings of the counter.
pub fn busy_fractions(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    wall_s: f64,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(lane, a)| {
            let b = before.get(lane).copied().unwrap_or(0.0);
            (lane.clone(), ((a - b) / wall_s.max(1e-9)).clamp(0.0, 1.0))
        })
        .collect()
}

/// Spread of a set of evaluations' medians: n, the medians, their mean, median, standard
/// deviation, CV (stdev / mean), min and max, and the verdicts.
pub fn spread(done: &[&Finished]) -> Value {
    let medians: Vec<f64> = done.iter().filter_map(|d| d.median_us).collect();
    let n = medians.len();
    let mean = if n > 0 {
        medians.iter().sum::<f64>() / n as f64
    } else {
        0.0
    };
    let stdev = if n > 1 {
        (medians.iter().map(|m| (m - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    } else {
        0.0
    };
    let min = medians.iter().copied().fold(f64::INFINITY, f64::min);
    let max = medians.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    json!({
        "n": n,
        "medians_us": medians,
        "mean_us": mean,
        "median_us": summary(&medians).p50,
        "stdev_us": stdev,
        "cv": if mean > 0.0 { stdev / mean } else { 0.0 },
        "min_us": if n > 0 { min } else { 0.0 },
        "max_us": if n > 0 { max } else { 0.0 },
        "verdicts": verdict_counts(&done.iter().map(|d| (*d).clone()).collect::<Vec<_>>()),
    })
}

/// The evaluation of `work` (queued and waited for), which must be `ok`: a benchmark's
/// kernel evaluated once first (compile, warm-up), and proven correct.
pub async fn first_ok(
    client: &Client,
    setup: &Setup,
    work: Work,
    timeout: Duration,
) -> Result<Finished> {
    let Some(first) = stream(client, vec![work], 1, timeout)
        .await?
        .into_iter()
        .next()
    else {
        bail!("the kernel's first evaluation returned nothing");
    };
    if first.verdict.as_deref() != Some("ok") {
        bail!(
            "the kernel ({} seed) is not `ok` on {}: {}",
            setup.problem,
            setup.backend,
            first.verdict.as_deref().unwrap_or("its job failed")
        );
    }
    Ok(first)
}

/// Counts of each verdict (`failed` for jobs without one).
pub fn verdict_counts(done: &[Finished]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for d in done {
        let k = d.verdict.clone().unwrap_or_else(|| "failed".into());
        *m.entry(k).or_default() += 1;
    }
    m
}

/// Milliseconds for a table cell.
pub fn ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// The report's header: what ran where, when, and how it was asked for.
pub fn header(bench: &str, s: &Setup, smoke: bool) -> Value {
    let gpus: Vec<Value> = s.info["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| g["name"].clone())
        .collect();
    json!({
        "benchmark": bench,
        "problem": s.problem,
        "backend": s.backend,
        "smoke": smoke,
        "started_at_ms": now_ms() as u64,
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "kiln_version": env!("CARGO_PKG_VERSION"),
        "kilnd_version": s.info["version"],
        "gpus": gpus,
        "host": s.info["host"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A twin's seed, written against an imported problem's names: every buffer argument
    /// renamed, scalars kept; a problem whose tensors do not pair up is refused.
    #[test]
    fn twin_seed_is_renamed_to_the_imported_tensors() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../problems/softmax-4096x65536"
        );
        let hand = ProblemSpec::load_dir(std::path::Path::new(dir)).expect("problem");
        let mut kb = hand.clone();
        kb.name = "kb-softmax-4096x65536".into();
        kb.tensors[0].name = "input0".into();
        kb.tensors[1].name = "output0".into();
        let seed = hand.seed_candidate("cuda").expect("seed");
        let c = renamed_for(&hand, &kb, seed.clone()).expect("pairs up");
        assert_eq!(c.problem, "kb-softmax-4096x65536");
        let args = serde_json::to_value(&c.launches[0].args).expect("json");
        assert_eq!(
            args,
            json!(["input0", "output0", {"i32": 4096}, {"i32": 65536}])
        );
        assert_eq!(c.source, seed.source);
        kb.tensors[1].shape = vec![4096, 65535];
        let err = renamed_for(&hand, &kb, seed).expect_err("shapes differ");
        assert!(err.contains("do not pair up"), "{err}");
    }

    #[test]
    fn percentiles_are_nearest_rank_and_ordered() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = summary(&v);
        assert_eq!(
            (s.n, s.p50, s.p90, s.p99, s.max),
            (100, 50.0, 90.0, 99.0, 100.0)
        );
        assert_eq!(summary(&[]).n, 0);
        let one = summary(&[3.0]);
        assert_eq!((one.p50, one.p99, one.max), (3.0, 3.0, 3.0));
    }

    #[test]
    fn first_knob_cycles_and_comment_makes_it_unique() {
        let src = "// @knob A 1|2|4\n#define A 1\n// @knob B x|y\n#define B x\nint f;\n";
        let seed: Candidate = serde_json::from_value(json!({
            "problem": "p", "language": "c", "source": src, "launches": [{"kernel": "f"}]
        }))
        .expect("candidate");
        let a = variant(&seed, "t", 1, Variants::Knob);
        assert!(a.source.contains("#define A 2\n") && a.source.contains("#define B x"));
        assert!(
            variant(&seed, "t", 2, Variants::Knob)
                .source
                .contains("#define A 4\n")
        );
        let c = variant(&seed, "t", 1, Variants::Comment);
        assert!(c.source.ends_with(src));
        let h = variant(&seed, "t", 1, Variants::Headers);
        assert!(h.source.contains(HEADER_PREFIX) && h.source.contains("#define A 2\n"));
        assert_ne!(
            variant(&seed, "t", 0, Variants::Comment).content_hash(),
            variant(&seed, "t", 3, Variants::Comment).content_hash()
        );
    }

    #[test]
    fn triton_variants_stay_python() {
        let src = "import triton\n# @knob BLOCK 1024|2048\nBLOCK = tl.constexpr(1024)\n";
        let seed: Candidate = serde_json::from_value(json!({
            "problem": "p", "language": "triton", "source": src, "launches": [{"kernel": "f"}]
        }))
        .expect("candidate");
        let v = variant(&seed, "t", 1, Variants::Knob);
        assert!(v.source.starts_with("# kiln bench t #1\n"), "{}", v.source);
        assert!(
            v.source.contains("BLOCK = tl.constexpr(2048)\n"),
            "{}",
            v.source
        );
    }

    #[test]
    fn lane_busy_is_read_per_backend() {
        let text = "# TYPE kiln_lane_busy_seconds_total counter\n\
            kiln_lane_busy_seconds_total{backend=\"host\",lane=\"0\"} 1.5\n\
            kiln_lane_busy_seconds_total{backend=\"cuda\",lane=\"1\"} 7\n";
        let m = parse_lane_busy(text, "host");
        assert_eq!(m.get("0"), Some(&1.5));
        assert_eq!(m.len(), 1);
        let f = busy_fractions(&BTreeMap::new(), &m, 3.0);
        assert_eq!(f.get("0"), Some(&0.5));
    }

    #[test]
    fn stages_of_a_finished_job() {
        let job = json!({"id": 4, "state": "done", "created_at": 1000, "started_at": 1010,
            "finished_at": 1200, "compile_ms": 50.0, "eval_ms": 120.0,
            "evaluation": {"verdict": "ok", "compile": {"cached": true},
                "timing": {"median_us": 3.0, "wall_ms": 60.0, "warmup_ms": 10.0, "raced_out": true}}});
        let f = finished("c", &job, 250.0);
        assert_eq!(f.stages["queue"], 10.0);
        assert_eq!(f.stages["lane_wait"], 20.0);
        assert_eq!(f.stages["timing"], 70.0);
        assert_eq!(f.stages["correctness"], 50.0);
        assert!(f.raced_out && f.compile_cached == Some(true));
    }
}
