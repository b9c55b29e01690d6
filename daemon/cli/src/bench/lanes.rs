//! `kiln bench lanes`: the same kernel timed on every lane of a backend (one per GPU for
//! cuda), side by side: each lane's median of medians, their spread, and each GPU's
//! factor relative to lane 0 (reported only; nothing is calibrated with it). With
//! `--isolation` (cuda): the kernel timed on lane 0 again while every other lane runs
//! red-team kernels (an out-of-bounds write, an endless loop) of the `vecadd-cuda-1m`
//! problem, then one honest evaluation on each of those lanes; the report says whether
//! lane 0's medians stayed within the noise and which lanes' workers were replaced
//! (`/v1/info` `lanes[].workers_started`, before and after). With one lane, the red-team
//! kernels queue on lane 0 between the kernel's evaluations (`single_lane`: recovery
//! after a fault, not isolation between lanes).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Args;
use kiln_daemon::client::Client;
use kiln_types::{BackendKind, Candidate, JobOptions};
use serde_json::{Value, json};

use super::common::{self, Finished, Work};
use crate::Output;
use crate::output::{fmt_us, print_json, text};

/// Arguments of `kiln bench lanes`.
#[derive(Debug, Args)]
pub struct LanesArgs {
    /// The problem (default: softmax-4096x65536 on cuda, softmax-256x4096 on host).
    #[arg(long)]
    problem: Option<String>,
    /// Backend: host or cuda (default: cuda when usable, else host).
    #[arg(long)]
    backend: Option<String>,
    /// Evaluations of the kernel on each lane (default 8; 2 with --smoke).
    #[arg(long)]
    rounds: Option<usize>,
    /// Then time the kernel on lane 0 while red-team kernels fault and time out on every
    /// other lane (cuda; with one lane, between the kernel's evaluations on lane 0).
    #[arg(long)]
    isolation: bool,
    /// The problem the red-team kernels are written for (they take a, b, y, n).
    #[arg(long, default_value = "vecadd-cuda-1m")]
    redteam_problem: String,
    /// Give up on one evaluation after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// A short run that checks the benchmark works (CI), not how fast.
    #[arg(long)]
    smoke: bool,
}

/// Lanes whose medians are within this fraction of each other time alike (1 %).
const SAME_WITHIN: f64 = 0.01;

/// The smallest difference the noise rule allows, as a fraction of the mean.
const NOISE_FLOOR: f64 = 0.005;

fn pinned(lane: u64) -> JobOptions {
    JobOptions {
        lane: u32::try_from(lane).ok(),
        ..JobOptions::default()
    }
}

/// The lanes' comparison: the spread of their medians (max − min over min), each lane's
/// factor (its median over lane 0's) and whether all are within [`SAME_WITHIN`].
fn compare(medians: &[(u64, f64)]) -> Value {
    let base = medians.first().map_or(0.0, |(_, m)| *m);
    let lo = medians
        .iter()
        .map(|(_, m)| *m)
        .fold(f64::INFINITY, f64::min);
    let hi = medians
        .iter()
        .map(|(_, m)| *m)
        .fold(f64::NEG_INFINITY, f64::max);
    let spread = if lo.is_finite() && lo > 0.0 {
        (hi - lo) / lo
    } else {
        0.0
    };
    let factors: BTreeMap<String, f64> = medians
        .iter()
        .map(|(l, m)| (l.to_string(), if base > 0.0 { m / base } else { 0.0 }))
        .collect();
    json!({
        "spread": spread,
        "within_1pct": medians.len() > 1 && spread <= SAME_WITHIN,
        "factor_vs_lane0": factors,
    })
}

/// The noise rule: the mean of `during`'s medians within max(2 × the larger CV, 0.5 %)
/// of `alone`'s.
fn within_noise(alone: &Value, during: &Value) -> Value {
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let (a, d) = (f(alone, "mean_us"), f(during, "mean_us"));
    let delta = if a > 0.0 {
        (d - a).abs() / a
    } else {
        f64::INFINITY
    };
    let allowed = (2.0 * f(alone, "cv").max(f(during, "cv"))).max(NOISE_FLOOR);
    json!({
        "alone_mean_us": a,
        "during_mean_us": d,
        "delta": delta,
        "allowed": allowed,
        "within": delta <= allowed,
    })
}

/// A red-team kernel for `problem` (tensors a, b, y and the element count n): `fault`
/// writes far out of bounds (a CUDA fault), otherwise it loops until the run timeout.
fn redteam(problem: &str, tag: &str, i: usize, fault: bool) -> Result<Candidate> {
    let body = if fault {
        "if (i < n) y[i + (1LL << 36)] = a[i] + b[i];"
    } else {
        // A volatile read the compiler cannot prove constant, so the loop stays.
        "while (*(volatile const float*)a == *(volatile const float*)a) { __nanosleep(1000); } \
         if (i < n) y[i] = a[i] + b[i];"
    };
    let source = format!(
        "/* kiln bench {tag} red-team #{i} */\n\
         extern \"C\" __global__ void k(const float* a, const float* b, float* y, int n) {{\n\
         long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n{body}\n}}\n"
    );
    serde_json::from_value(json!({
        "problem": problem, "language": "cuda", "source": source,
        "launches": [{"kernel": "k", "grid": [4096, 1, 1], "block": [256, 1, 1],
                      "args": ["a", "b", "y", {"i32": 1_048_576}]}],
        "note": format!("kiln bench {tag} red-team #{i}"),
    }))
    .map_err(|e| anyhow::anyhow!("red-team candidate: {e}"))
}

/// Workers started on each lane of `backend`, by lane, as kilnd says now.
async fn workers(client: &Client, backend: &str) -> Result<BTreeMap<u64, u64>> {
    let info = client.get("/v1/info").await?;
    Ok(common::lanes(&info, backend)
        .iter()
        .filter_map(|l| Some((l["lane"].as_u64()?, l["workers_started"].as_u64()?)))
        .collect())
}

/// Runs the benchmark and prints its report.
pub async fn run(client: &Client, out: Output, a: LanesArgs) -> Result<std::process::ExitCode> {
    let setup = common::setup(
        client,
        a.problem.as_deref(),
        a.backend.as_deref(),
        None,
        common::softmax_problem,
    )
    .await?;
    let lanes = common::lanes(&setup.info, &setup.backend);
    let ids: Vec<u64> = lanes.iter().filter_map(|l| l["lane"].as_u64()).collect();
    if ids.is_empty() {
        bail!(
            "kilnd lists no lane of the {} backend (`kiln doctor` shows its lanes)",
            setup.backend
        );
    }
    let rounds = a.rounds.unwrap_or(if a.smoke { 2 } else { 8 }).max(1);
    let timeout = Duration::from_secs(a.timeout);
    let tag = common::run_tag();
    if out == Output::Text {
        eprintln!(
            "lanes: {} on {} lane(s) of {}, {rounds} evaluations each",
            setup.problem,
            ids.len(),
            setup.backend
        );
    }

    // The kernel: the seed with this run's tag, evaluated once first on lane 0.
    let mut kernel = setup.seed.clone();
    kernel.source = format!("/* kiln bench {tag} lanes kernel */\n{}", kernel.source);
    kernel.note = Some(format!("kiln bench {tag} lanes kernel"));
    let first = common::first_ok(
        client,
        &setup,
        Work::Submit(Box::new(kernel), pinned(ids[0])),
        timeout,
    )
    .await?;
    let id = first.candidate.clone();

    // Every lane at once, each evaluating the kernel `rounds` times.
    let order: Vec<u64> = (0..rounds).flat_map(|_| ids.iter().copied()).collect();
    let work: Vec<Work> = order
        .iter()
        .map(|l| Work::Again(id.clone(), pinned(*l)))
        .collect();
    let done = common::stream(client, work, ids.len(), timeout).await?;
    let mut by_lane: BTreeMap<u64, Vec<&Finished>> = BTreeMap::new();
    for (lane, d) in order.iter().zip(&done) {
        by_lane.entry(*lane).or_default().push(d);
    }
    let mut per_lane = Vec::new();
    let mut medians = Vec::new();
    for l in &lanes {
        let Some(lane) = l["lane"].as_u64() else {
            continue;
        };
        let ran = by_lane.get(&lane).map_or(&[][..], Vec::as_slice);
        let mut s = common::spread(ran);
        if let Some(m) = s["median_us"].as_f64() {
            medians.push((lane, m));
        }
        for k in ["lane", "label", "gpu", "gpu_name"] {
            s[k] = l[k].clone();
        }
        // The GPUs its evaluations say they ran on: its own alone (cuda; none for the host).
        let mut devices: Vec<&str> = ran.iter().filter_map(|d| d.device.as_deref()).collect();
        devices.sort_unstable();
        devices.dedup();
        s["devices_seen"] = json!(devices);
        per_lane.push(s);
    }
    let models: Vec<&Value> = lanes.iter().map(|l| &l["gpu_name"]).collect();
    let mut report = common::header("lanes", &setup, a.smoke);
    report["settings"] = json!({
        "rounds": rounds, "isolation": a.isolation, "redteam_problem": a.redteam_problem,
        "tag": tag, "same_within": SAME_WITHIN, "noise_floor": NOISE_FLOOR,
    });
    report["candidate"] = json!(id);
    report["lanes"] = json!(ids.len());
    report["same_model"] = json!(models.windows(2).all(|w| w[0] == w[1]));
    report["per_lane"] = Value::Array(per_lane.clone());
    report["comparison"] = compare(&medians);

    if a.isolation {
        let kernel = Kernel {
            id: &id,
            tag: &tag,
            backend: &setup.backend,
            lanes: &ids,
        };
        report["isolation"] = isolation(client, &a, &kernel, &per_lane, timeout).await?;
    }
    if out == Output::Json {
        print_json(&report);
    } else {
        print_table(&report);
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// The kernel of a run: the stored candidate, the run's tag, the backend and its lanes.
struct Kernel<'a> {
    id: &'a str,
    tag: &'a str,
    backend: &'a str,
    lanes: &'a [u64],
}

/// The isolation phase (see the module docs), given each lane's medians from the first
/// phase; why it was skipped otherwise. With one lane (a host with one GPU) the red-team
/// kernels run on lane 0 itself, queued between the kernel's evaluations: that checks
/// that a fault replaces the lane's worker once and leaves the next timings alone, not
/// that lanes are isolated from each other (`single_lane` in the report).
async fn isolation(
    client: &Client,
    a: &LanesArgs,
    kernel: &Kernel<'_>,
    per_lane: &[Value],
    timeout: Duration,
) -> Result<Value> {
    let (backend, id, ids) = (kernel.backend, kernel.id, kernel.lanes);
    if backend != BackendKind::Cuda || ids.is_empty() {
        return Ok(json!({"skipped": format!(
            "needs the cuda backend (this is {backend} with {} lane(s))",
            ids.len()
        )}));
    }
    if client
        .get(&format!("/v1/problems/{}", a.redteam_problem))
        .await
        .is_err()
    {
        return Ok(json!({"skipped": format!(
            "the red-team problem {0} is not registered (kiln problems add problems/{0})",
            a.redteam_problem
        )}));
    }
    let rounds = a.rounds.unwrap_or(if a.smoke { 2 } else { 8 }).max(1);
    let single = ids.len() == 1;
    let timed = ids[0];
    let others: &[u64] = if single { ids } else { &ids[1..] };
    let before = workers(client, backend).await?;
    // All at once: the kernel's evaluations queue on lane 0, the red-team kernels on each
    // other lane (a fault and a timeout in turn), so they run at the same moments; with
    // one lane they queue between the kernel's evaluations.
    let mut work = Vec::new();
    let mut runs_on = Vec::new();
    let mut k = 0;
    for r in 0..rounds {
        work.push(Work::Again(id.to_string(), pinned(timed)));
        runs_on.push(Run::Kernel(timed));
        for l in others {
            let c = redteam(&a.redteam_problem, kernel.tag, k, r % 2 == 0)?;
            work.push(Work::Submit(Box::new(c), pinned(*l)));
            runs_on.push(Run::RedTeam(*l));
            k += 1;
        }
    }
    // One lane: one at a time, so each kernel evaluation follows a red-team kernel.
    let in_flight = if single { 1 } else { work.len() };
    let done = common::stream(client, work, in_flight, timeout).await?;
    // Then one honest evaluation on each lane that ran red-team kernels.
    let again: Vec<Work> = others
        .iter()
        .map(|l| Work::Again(id.to_string(), pinned(*l)))
        .collect();
    let recovered = common::stream(client, again, others.len(), timeout).await?;
    let recovered: BTreeMap<u64, Option<String>> = others
        .iter()
        .zip(&recovered)
        .map(|(l, d)| (*l, d.verdict.clone()))
        .collect();
    let after = workers(client, backend).await?;

    let runs: Vec<(Run, &Finished)> = runs_on.iter().copied().zip(&done).collect();
    let kernel: Vec<&Finished> = runs
        .iter()
        .filter(|(r, _)| matches!(r, Run::Kernel(_)))
        .map(|(_, d)| *d)
        .collect();
    let during = common::spread(&kernel);
    let alone = per_lane.first().cloned().unwrap_or(Value::Null);
    Ok(json!({
        "timed_lane": timed,
        "single_lane": single,
        "during": during,
        "noise": within_noise(&alone, &during),
        "lanes": lane_outcomes(ids, &runs, &before, &after, &recovered),
    }))
}

/// What one evaluation of the isolation phase was: the kernel, or a red-team kernel, on
/// that lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    Kernel(u64),
    RedTeam(u64),
}

impl Run {
    fn lane(self) -> u64 {
        match self {
            Run::Kernel(l) | Run::RedTeam(l) => l,
        }
    }
}

/// Each lane's part of the isolation phase: its verdicts, its faults and timeouts, the
/// workers it started meanwhile (`before`/`after`: `workers_started` per lane), whether
/// that is exactly one per fault (`only_its_own`), and the verdict of its honest
/// evaluation after (`recovered`, for the lanes that ran red-team kernels).
fn lane_outcomes(
    ids: &[u64],
    runs: &[(Run, &Finished)],
    before: &BTreeMap<u64, u64>,
    after: &BTreeMap<u64, u64>,
    recovered: &BTreeMap<u64, Option<String>>,
) -> Vec<Value> {
    ids.iter()
        .map(|l| {
            let ran: Vec<Finished> = runs
                .iter()
                .filter(|(r, _)| r.lane() == *l)
                .map(|(_, d)| (*d).clone())
                .collect();
            let faults = ran
                .iter()
                .filter(|d| matches!(d.verdict.as_deref(), Some("runtime_fault" | "timeout")))
                .count();
            let restarts = match (before.get(l), after.get(l)) {
                (Some(b), Some(a)) => Some(a.saturating_sub(*b)),
                _ => None,
            };
            json!({
                "lane": l,
                "verdicts": common::verdict_counts(&ran),
                "faults_and_timeouts": faults,
                "workers_replaced": restarts,
                "only_its_own": restarts.map(|r| r as usize == faults),
                "recovered": recovered.get(l).map_or(Value::Null, |v| json!(v)),
            })
        })
        .collect()
}

fn print_table(r: &Value) {
    println!(
        "lanes  {} on {}  ({} lane(s), kernel {}, {} evaluations each)",
        text(&r["problem"]),
        text(&r["backend"]),
        text(&r["lanes"]),
        text(&r["candidate"]),
        text(&r["settings"]["rounds"])
    );
    println!(
        "{:<5} {:<16} {:<42} {:>4} {:>12} {:>8} {:>8}",
        "lane", "gpu", "uuid", "n", "median", "CV", "factor"
    );
    let c = &r["comparison"];
    for l in r["per_lane"].as_array().into_iter().flatten() {
        let lane = text(&l["lane"]);
        println!(
            "{:<5} {:<16} {:<42} {:>4} {:>12} {:>7.3}% {:>8.4}",
            lane,
            format!("{} {}", text(&l["gpu"]), text(&l["gpu_name"])),
            text(&l["label"]),
            text(&l["n"]),
            fmt_us(l["median_us"].as_f64().unwrap_or(0.0)),
            l["cv"].as_f64().unwrap_or(0.0) * 100.0,
            c["factor_vs_lane0"][&lane].as_f64().unwrap_or(0.0)
        );
    }
    println!(
        "spread of the lanes' medians: {:.3}% ({}){}",
        c["spread"].as_f64().unwrap_or(0.0) * 100.0,
        if c["within_1pct"].as_bool() == Some(true) {
            "within 1 %"
        } else {
            "over 1 %: the factors above are each GPU's calibration against lane 0"
        },
        if r["same_model"].as_bool() == Some(true) {
            ""
        } else {
            "; the lanes' GPUs are of different models"
        }
    );
    let iso = &r["isolation"];
    if let Some(why) = iso["skipped"].as_str() {
        println!("isolation: skipped: {why}");
    } else if !iso.is_null() {
        let n = &iso["noise"];
        println!(
            "isolation: lane {} while {} fault: mean median {} alone, {} during \
             (Δ {:.3}%, allowed {:.3}%): {}",
            text(&iso["timed_lane"]),
            if iso["single_lane"].as_bool() == Some(true) {
                "red-team kernels queued between its evaluations (one lane: not a test \
                 of isolation between lanes)"
            } else {
                "the other lanes"
            },
            fmt_us(n["alone_mean_us"].as_f64().unwrap_or(0.0)),
            fmt_us(n["during_mean_us"].as_f64().unwrap_or(0.0)),
            n["delta"].as_f64().unwrap_or(0.0) * 100.0,
            n["allowed"].as_f64().unwrap_or(0.0) * 100.0,
            if n["within"].as_bool() == Some(true) {
                "within the noise"
            } else {
                "OUTSIDE the noise"
            }
        );
        for l in iso["lanes"].as_array().into_iter().flatten() {
            println!(
                "  lane {}: {} faults/timeouts, {} worker(s) replaced{}",
                text(&l["lane"]),
                text(&l["faults_and_timeouts"]),
                text(&l["workers_replaced"]),
                if l["recovered"].is_null() {
                    String::new()
                } else {
                    format!(", then {}", text(&l["recovered"]))
                }
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_are_compared_against_lane_zero() {
        let c = compare(&[(0, 100.0), (1, 100.5), (2, 99.8)]);
        assert!((c["spread"].as_f64().expect("spread") - 0.7 / 99.8).abs() < 1e-12);
        assert_eq!(c["within_1pct"], true);
        assert_eq!(c["factor_vs_lane0"]["0"], 1.0);
        assert!((c["factor_vs_lane0"]["1"].as_f64().expect("f") - 1.005).abs() < 1e-12);
        let slow = compare(&[(0, 100.0), (1, 103.0)]);
        assert_eq!(slow["within_1pct"], false);
        assert_eq!(
            compare(&[(0, 5.0)])["within_1pct"],
            false,
            "one lane: nothing to compare"
        );
    }

    #[test]
    fn the_noise_rule_widens_with_the_spread_of_the_medians() {
        let set = |mean: f64, cv: f64| json!({"mean_us": mean, "cv": cv});
        // Quiet medians (CV 0.1 %): the 0.5 % floor applies.
        assert_eq!(
            within_noise(&set(100.0, 0.001), &set(100.4, 0.001))["within"],
            true
        );
        assert_eq!(
            within_noise(&set(100.0, 0.001), &set(100.6, 0.001))["within"],
            false
        );
        // Noisier (CV 1 %): 2 %.
        let n = within_noise(&set(100.0, 0.01), &set(101.5, 0.002));
        assert_eq!(n["within"], true);
        assert!((n["allowed"].as_f64().expect("allowed") - 0.02).abs() < 1e-12);
        assert_eq!(within_noise(&Value::Null, &set(1.0, 0.0))["within"], false);
    }

    fn ran(verdict: &str) -> Finished {
        let job = json!({"id": 1, "state": "done", "evaluation": {"verdict": verdict}});
        common::finished("c", &job, 1.0)
    }

    #[test]
    fn one_lane_counts_its_own_faults_and_replacements() {
        let (ok, fault, slow) = (ran("ok"), ran("runtime_fault"), ran("timeout"));
        let runs = [
            (Run::Kernel(0), &ok),
            (Run::RedTeam(0), &fault),
            (Run::Kernel(0), &ok),
            (Run::RedTeam(0), &slow),
        ];
        let recovered = BTreeMap::from([(0, Some("ok".to_string()))]);
        let one = |after: u64| {
            let before = BTreeMap::from([(0, 1)]);
            lane_outcomes(
                &[0],
                &runs,
                &before,
                &BTreeMap::from([(0, after)]),
                &recovered,
            )
        };
        let l = &one(3)[0];
        assert_eq!(l["faults_and_timeouts"], 2);
        assert_eq!(l["workers_replaced"], 2);
        assert_eq!(l["only_its_own"], true);
        assert_eq!(l["recovered"], "ok");
        assert_eq!(l["verdicts"]["ok"], 2);
        assert_eq!(
            one(4)[0]["only_its_own"],
            false,
            "a replacement without a fault is not its own"
        );
    }

    #[test]
    fn several_lanes_keep_their_faults_apart() {
        let (ok, fault) = (ran("ok"), ran("runtime_fault"));
        let runs = [
            (Run::Kernel(0), &ok),
            (Run::RedTeam(1), &fault),
            (Run::RedTeam(2), &ok),
        ];
        let before = BTreeMap::from([(0, 1), (1, 1), (2, 1)]);
        let after = BTreeMap::from([(0, 1), (1, 2), (2, 2)]);
        let recovered = BTreeMap::from([(1, Some("ok".to_string())), (2, None)]);
        let out = lane_outcomes(&[0, 1, 2], &runs, &before, &after, &recovered);
        assert_eq!(out[0]["faults_and_timeouts"], 0);
        assert_eq!(out[0]["only_its_own"], true);
        assert!(
            out[0]["recovered"].is_null(),
            "lane 0 ran no red-team kernel"
        );
        assert_eq!(out[1]["faults_and_timeouts"], 1);
        assert_eq!(out[1]["only_its_own"], true);
        assert_eq!(out[1]["recovered"], "ok");
        assert_eq!(out[2]["only_its_own"], false, "replaced without a fault");
        assert!(
            out[2]["recovered"].is_null(),
            "its honest run gave no verdict"
        );
        let unknown = lane_outcomes(&[3], &runs, &before, &after, &recovered);
        assert!(unknown[0]["workers_replaced"].is_null());
    }

    #[test]
    fn red_team_kernels_are_distinct_and_valid() {
        let f = redteam("vecadd-cuda-1m", "t", 0, true).expect("fault");
        let t = redteam("vecadd-cuda-1m", "t", 1, false).expect("timeout");
        assert!(f.source.contains("1LL << 36") && t.source.contains("volatile"));
        let other = redteam("vecadd-cuda-1m", "t", 2, true).expect("fault");
        assert_ne!(f.content_hash(), other.content_hash());
        f.validate().expect("valid");
        assert_eq!(t.launches.len(), 1);
    }
}
