//! The red-team suite: each hostile candidate of `sandbox/tests/redteam/cases.toml` is
//! submitted through a real kilnd; the test asserts its specific verdict and evidence,
//! that the daemon still serves afterwards, that no process of the job is left, and that
//! nothing was written outside the job's scratch. `cargo test redteam_` runs exactly these.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Daemon, register};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Debug, Deserialize)]
struct Suite {
    problem: String,
    #[serde(rename = "case")]
    cases: Vec<Case>,
    cache_case: Vec<CacheCase>,
}

/// A content-keyed cache, timed beside the honest kernel (see cases.toml).
#[derive(Debug, Deserialize)]
struct CacheCase {
    name: String,
    problem: String,
    file: String,
    kernel: String,
    args: Vec<Value>,
    cheat: u32,
    scratch_elems: u64,
}

#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    file: String,
    kernel: String,
    args: Vec<Value>,
    verdict: String,
    evidence: String,
    #[serde(default)]
    flags: Vec<String>,
    #[serde(default)]
    must_not_exist: Vec<String>,
    #[serde(default)]
    memory_limit_mib: Option<u64>,
    #[serde(default)]
    placeholder: Option<String>,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn suite() -> Suite {
    let dir = repo().join("sandbox/tests/redteam");
    let text = std::fs::read_to_string(dir.join("cases.toml")).expect("cases.toml");
    toml::from_str(&text).expect("cases.toml parses")
}

/// Pids of every process descending from `root`.
fn descendants(root: u32) -> Vec<u32> {
    let mut parent = std::collections::HashMap::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // The command name may hold spaces: the fields after the last ')' are fixed.
            let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
                continue;
            };
            if let Some(ppid) = rest
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse::<u32>().ok())
            {
                parent.insert(pid, ppid);
            }
        }
    }
    parent
        .keys()
        .copied()
        .filter(|&p| {
            let mut cur = p;
            for _ in 0..64 {
                match parent.get(&cur) {
                    Some(&pp) if pp == root => return true,
                    Some(&pp) if pp > 1 => cur = pp,
                    _ => return false,
                }
            }
            false
        })
        .collect()
}

async fn run_case(name: &str) {
    let suite = suite();
    let case = suite
        .cases
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no case {name} in cases.toml"));
    let mem = case.memory_limit_mib.unwrap_or(512);
    let d = Daemon::start_with_config(&format!(
        "[evaluation]\ntrials = 2\nrun_timeout_ms = 5000\ncompile_timeout_secs = 3\nmemory_limit_mb = {mem}\n\
         [evaluation.timing]\nwarmup = 1\nmin_samples = 5\nmin_time_ms = 5.0\nmax_rse = 0.05\nmax_samples = 100\nwall_cap_ms = 300.0\nrecheck_fraction = 0.2\n"
    ));
    let c = d.client();
    register(&c, &repo().join("problems").join(&suite.problem)).await;
    let mut source = std::fs::read_to_string(repo().join("sandbox/tests/redteam").join(&case.file))
        .expect("case source");
    if let Some(ph) = &case.placeholder {
        source = source.replace(ph, &d.state.join("kiln.db").display().to_string());
    }
    let candidate = json!({
        "problem": suite.problem,
        "language": "c",
        "source": source,
        "launches": [{"kernel": case.kernel, "args": case.args}],
        "flags": case.flags,
        "note": format!("red team: {}", case.name),
    });
    let (_, sub) = c.post("/v1/candidates", &candidate).await.expect("submit");
    let id = sub["id"].as_str().expect("id").to_string();
    let deadline = Instant::now() + Duration::from_secs(120);
    let record = loop {
        let r = c
            .get(&format!("/v1/candidates/{id}?wait=10"))
            .await
            .expect("candidate");
        if !r["evaluation"].is_null() || r["job"]["state"] == "failed" || Instant::now() > deadline
        {
            break r;
        }
    };
    let eval = &record["evaluation"];
    assert!(
        !eval.is_null(),
        "{name}: no evaluation: {record}\nlog:\n{}",
        d.log()
    );
    assert_eq!(eval["verdict"], case.verdict.as_str(), "{name}: {eval}");
    let text = eval.to_string();
    assert!(
        text.contains(&case.evidence),
        "{name}: evidence {:?} not in {text}",
        case.evidence
    );
    // The daemon still serves.
    assert_eq!(
        c.get("/v1/health").await.expect("health")["status"],
        "ok",
        "{name}"
    );
    // No process of the job is left behind.
    let pid = d.pid().expect("daemon pid");
    let wait_until = Instant::now() + Duration::from_secs(10);
    let mut left = descendants(pid);
    while !left.is_empty() && Instant::now() < wait_until {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = descendants(pid);
    }
    assert!(left.is_empty(), "{name}: processes left behind: {left:?}");
    // Nothing written outside scratch: the paths the case aimed at do not exist, and
    // the job's scratch folders are gone.
    for p in &case.must_not_exist {
        assert!(!Path::new(p).exists(), "{name}: {p} was created");
    }
    let scratch = d.state.join("scratch");
    let leftovers: Vec<_> = std::fs::read_dir(&scratch)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        leftovers.is_empty(),
        "{name}: scratch not cleaned: {leftovers:?}"
    );
}

/// The cheat's median under the contract must be at least this fraction of the honest
/// kernel's (or its verdict a failing one); under plain timing, below it. A cache hit is
/// 80 to 500 times faster than computing, so the median falls below a quarter only when
/// most timed samples hit; load on a shared machine moves honest medians by up to 2×.
const HONEST_FRACTION: f64 = 0.25;

/// Waits for job `job` to end; its evaluation.
async fn job_evaluation(c: &kiln_daemon::client::Client, job: i64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let r = c
            .get(&format!("/v1/jobs/{job}?wait=30"))
            .await
            .expect("job");
        if matches!(r["state"].as_str(), Some("done" | "failed")) || Instant::now() > deadline {
            assert_eq!(r["state"], "done", "job {job}: {r}");
            return r["evaluation"].clone();
        }
    }
}

/// Queues a job for candidate `id` with `options`; its evaluation.
async fn evaluate_again(c: &kiln_daemon::client::Client, id: &str, options: Value) -> Value {
    let (_, r) = c
        .post(&format!("/v1/candidates/{id}/jobs"), &options)
        .await
        .expect("queue again");
    job_evaluation(c, r["job_id"].as_i64().expect("job id")).await
}

fn median_of(e: &Value) -> f64 {
    e["timing"]["median_us"].as_f64().unwrap_or(f64::NAN)
}

async fn run_cache_case(name: &str) {
    let suite = suite();
    let case = suite
        .cache_case
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no cache case {name} in cases.toml"));
    let d = Daemon::start("");
    let c = d.client();
    register(&c, &repo().join("problems").join(&case.problem)).await;
    let source = std::fs::read_to_string(repo().join("sandbox/tests/redteam").join(&case.file))
        .expect("case source");
    let candidate = |flags: Vec<String>| {
        json!({
            "problem": case.problem,
            "language": "c",
            "source": source,
            "launches": [{"kernel": case.kernel, "args": case.args}],
            "scratch": [{"name": "cache", "dtype": "f32", "elems": case.scratch_elems}],
            "flags": flags,
            "note": format!("red team: {}", case.name),
        })
    };
    let submit = |cand: Value| {
        let c = &c;
        async move {
            let (_, r) = c.post("/v1/candidates", &cand).await.expect("submit");
            let id = r["id"].as_str().expect("id").to_string();
            let e = job_evaluation(c, r["job_id"].as_i64().expect("job id")).await;
            (id, e)
        }
    };
    let (honest_id, honest) = submit(candidate(Vec::new())).await;
    let (cheat_id, cheat) = submit(candidate(vec![format!("-DKILN_CHEAT={}", case.cheat)])).await;
    let plain = evaluate_again(&c, &cheat_id, json!({"plain": 20})).await;
    // The honest kernel twice, the cheat between: other tests share the machine.
    let again = evaluate_again(&c, &honest_id, json!({})).await;
    assert_eq!(honest["verdict"], "ok", "{name}: honest: {honest}");
    assert_eq!(again["verdict"], "ok", "{name}: honest again: {again}");
    let honest_us = median_of(&honest).min(median_of(&again));
    eprintln!(
        "{name}: honest {honest_us:.1} us, cheat {} {:.1} us, cheat with plain timing {} {:.1} us",
        cheat["verdict"],
        median_of(&cheat),
        plain["verdict"],
        median_of(&plain)
    );
    // The cache works where inputs repeat (a hit can be too quick to time at all, or
    // faster than the problem's roofline floor allows)...
    let fast = match plain["verdict"].as_str() {
        Some("ok") => median_of(&plain) < HONEST_FRACTION * honest_us,
        Some("unmeasurable_time" | "implausible_time") => true,
        _ => panic!("{name}: plain: {plain}"),
    };
    assert!(
        fast,
        "{name}: the cheat is no faster even on repeated inputs"
    );
    // ...and never wins through kilnd.
    assert!(
        cheat["verdict"] != "ok" || median_of(&cheat) >= HONEST_FRACTION * honest_us,
        "{name}: the cache won the timing: {cheat}"
    );
    // Nothing of the cheat outlives its jobs.
    let scratch = d.state.join("scratch");
    let leftovers: Vec<_> = std::fs::read_dir(&scratch)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        leftovers.is_empty(),
        "{name}: scratch not cleaned: {leftovers:?}"
    );
}

#[tokio::test]
async fn redteam_cache_static_softmax() {
    run_cache_case("cache_static_softmax").await;
}

#[tokio::test]
async fn redteam_cache_scratch_softmax() {
    run_cache_case("cache_scratch_softmax").await;
}

#[tokio::test]
async fn redteam_cache_high_bits_softmax() {
    run_cache_case("cache_high_bits_softmax").await;
}

#[tokio::test]
async fn redteam_cache_static_matmul() {
    run_cache_case("cache_static_matmul").await;
}

#[tokio::test]
async fn redteam_cache_scratch_matmul() {
    run_cache_case("cache_scratch_matmul").await;
}

#[tokio::test]
async fn redteam_cache_high_bits_matmul() {
    run_cache_case("cache_high_bits_matmul").await;
}

#[test]
fn redteam_every_cache_case_has_a_test() {
    let named = [
        "cache_static_softmax",
        "cache_scratch_softmax",
        "cache_high_bits_softmax",
        "cache_static_matmul",
        "cache_scratch_matmul",
        "cache_high_bits_matmul",
    ];
    for c in suite().cache_case {
        assert!(
            named.contains(&c.name.as_str()),
            "{} has no redteam_ test",
            c.name
        );
    }
}

macro_rules! redteam {
    ($($name:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                run_case(stringify!($name).trim_start_matches("redteam_")).await;
            }
        )*

        #[test]
        fn redteam_every_case_has_a_test() {
            let named: Vec<&str> = vec![$(stringify!($name).trim_start_matches("redteam_")),*];
            for c in suite().cases {
                assert!(named.contains(&c.name.as_str()), "case {} has no redteam_ test", c.name);
            }
        }
    };
}

redteam!(
    redteam_infinite_loop,
    redteam_fork_bomb,
    redteam_thread_spawn,
    redteam_memory_hog,
    redteam_output_flood,
    redteam_write_outside_scratch,
    redteam_network_socket,
    redteam_read_hidden_path,
    redteam_kill_parent,
    redteam_ptrace_parent,
    redteam_exec_shell,
    redteam_partial_output,
    redteam_stale_cache,
    redteam_modify_inputs,
    redteam_nondeterministic,
    redteam_stack_overflow,
    redteam_abort_call,
    redteam_segfault,
    redteam_write_past_buffer,
    redteam_exit_early,
    redteam_fake_done_early,
    redteam_constructor_writes_file,
    redteam_override_sigsys,
    redteam_unknown_function,
    redteam_unknown_buffer,
    redteam_disallowed_flag,
    redteam_include_dev_zero,
    redteam_object_bomb,
    redteam_macro_bomb,
    redteam_compile_timeout,
);

/// Issue 21, item 2: a slow candidate holds the one host lane with 20 jobs queued behind
/// it, and kilnd is killed (`kill -9`) three times while it evaluates. Jobs that were only
/// claimed, compiling or waiting for the lane are never `running` and count no attempt, so
/// none of them is failed; each of the 21 is evaluated exactly once in the record, and the
/// slow one shows the three evaluations cut short plus the one that finished.
#[tokio::test]
async fn redteam_slow_lane_with_restarts_evaluates_every_job_once() {
    const FAST: usize = 20;
    let mut d = Daemon::start("[queue]\nmax_attempts = 4\n");
    let problems = d.dir.path().join("problems");
    let c = d.client();
    register(&c, &common::write_double_problem(&problems, "double")).await;
    // About 250 ms per run: the evaluation (trials, warm-up, at least five samples) takes
    // seconds, far longer than noticing it started.
    let slow = json!({
        "problem": "double",
        "language": "c",
        "source": "#include <time.h>\nvoid k(const float *x, float *y, int n) { struct timespec t = {0, 250000000}; nanosleep(&t, 0); for (int i = 0; i < n; i++) y[i] = 2.0f * x[i]; }\n",
        "launches": [{"kernel": "k", "args": ["x", "y", {"i32": 1024}]}],
    });
    let (_, sub) = c.post("/v1/candidates", &slow).await.expect("submit slow");
    let slow_job = sub["job_id"].as_i64().expect("job id");
    let mut fast_jobs = Vec::new();
    for n in 0..FAST {
        let body = format!("/* {n} */ for (int i = 0; i < n; i++) y[i] = 2.0f * x[i];");
        let (_, sub) = c
            .post("/v1/candidates", &common::double_candidate("double", &body))
            .await
            .expect("submit");
        fast_jobs.push(sub["job_id"].as_i64().expect("job id"));
    }
    let job = |c: kiln_daemon::client::Client, id: i64| async move {
        c.get(&format!("/v1/jobs/{id}")).await.expect("job")
    };
    for round in 0..3 {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let j = job(d.client(), slow_job).await;
            if j["state"] == "running" {
                break;
            }
            assert!(
                j["state"] != "done" && j["state"] != "failed",
                "round {round}: the slow job ended before it could be interrupted: {j}"
            );
            assert!(
                Instant::now() < deadline,
                "round {round}: the slow job never started: {j}\n{}",
                d.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The lane is the slow job's: every fast job that is not done is waiting, counts
        // no attempt, and is in the queue depth.
        let c = d.client();
        let health = c.get("/v1/health").await.expect("health");
        let mut waiting = 0;
        for &id in &fast_jobs {
            let j = job(d.client(), id).await;
            let state = j["state"].as_str().unwrap_or("").to_string();
            if state == "done" {
                continue;
            }
            assert!(
                matches!(state.as_str(), "queued" | "compiling" | "compiled"),
                "round {round}: job {id} is {state} while the only lane evaluates another: {j}"
            );
            assert_eq!(j["attempts"], 0, "round {round}: job {id}: {j}");
            waiting += 1;
        }
        assert!(waiting > 0, "round {round}: nothing was waiting");
        assert_eq!(health["running"], 1, "round {round}: {health}");
        assert_eq!(health["queued"], waiting, "round {round}: {health}");
        d.kill9();
        d.spawn();
    }
    let c = d.client();
    for &id in fast_jobs.iter().chain([&slow_job]) {
        let deadline = Instant::now() + Duration::from_secs(180);
        let j = loop {
            let j = c.get(&format!("/v1/jobs/{id}?wait=10")).await.expect("job");
            if j["state"] == "done" || j["state"] == "failed" || Instant::now() > deadline {
                break j;
            }
        };
        assert_eq!(j["state"], "done", "job {id}: {j}\n{}", d.log());
        let expected = if id == slow_job { 4 } else { 1 };
        assert_eq!(j["attempts"], expected, "job {id}: {j}");
    }
    assert!(d.terminate(), "kilnd stops cleanly");
    let db = rusqlite::Connection::open(d.state.join("kiln.db")).expect("open the store");
    let mut stmt = db
        .prepare("SELECT job_id, count(*) FROM evaluations GROUP BY job_id")
        .expect("query");
    let per_job: Vec<(i64, i64)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(per_job.len(), FAST + 1, "{per_job:?}");
    assert!(per_job.iter().all(|(_, n)| *n == 1), "{per_job:?}");
}
