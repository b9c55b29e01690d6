//! Searches through a real kilnd on the host backend: the bundled proposers
//! (hill-climb, idea-branch, map-elites) find a faster correct softmax kernel offline,
//! idea-branch runs on recorded model replies and recovers from an unusable one, a
//! search survives `kill -9` of kilnd without re-evaluating anything, and misbehaving
//! plugins are stopped while another search carries on. Every plugin host runs in the
//! jail: its layers are in the search's log, it sees none of the host's files but
//! kilnd's socket, and cancelling the search kills it.
//!
//! The proposers are built once per test binary with `scripts/build-plugins.sh` (which
//! installs them as `target/debug/proposers/NAME.wasm`), and `kiln-plugin-host` with
//! cargo. The tests run one at a time (timing on a small machine is noisy enough).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use common::{Daemon, register};
use kiln_daemon::client::Client;
use serde_json::{Value, json};

fn repo() -> PathBuf {
    common::repo_root()
}

/// Builds the proposers, the abuse plugins, the plugin host and the jail helper
/// (kiln-worker), once.
fn build() {
    common::build_search_tools(&[
        "kiln-hill-climb",
        "kiln-idea-branch",
        "kiln-map-elites",
        "kiln-test-plugin-abuse",
        "kiln-test-plugin-snoop-fs",
    ]);
}

/// One test at a time: each starts its own kilnd, and parallel timing would be noise.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Timing with enough samples for the interval test, and the installed proposers.
fn config(extra: &str) -> String {
    common::search_config(extra)
}

async fn start_search(c: &Client, body: Value) -> String {
    let (status, v) = c.post("/v1/searches", &body).await.expect("start search");
    assert_eq!(status, 201, "{v}");
    v["id"].as_str().expect("id").to_string()
}

async fn wait_end(c: &Client, id: &str, limit: Duration) -> Value {
    let t0 = Instant::now();
    loop {
        let s = c.get(&format!("/v1/searches/{id}")).await.expect("search");
        if s["state"] != "running" {
            return s;
        }
        assert!(t0.elapsed() < limit, "search {id} still running: {s}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn archive(c: &Client, id: &str) -> Vec<Value> {
    let a = c
        .get(&format!("/v1/searches/{id}/archive"))
        .await
        .expect("archive");
    a["entries"].as_array().cloned().unwrap_or_default()
}

/// Two-sided 95 % Student t.
fn t95(df: u64) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => T[df as usize - 1],
        _ => 2.0,
    }
}

/// The 95 % confidence interval of the mean time of an `ok` evaluation.
fn ci(eval: &Value) -> (f64, f64) {
    assert_eq!(eval["verdict"], "ok", "{eval}");
    let t = &eval["timing"];
    let (m, sd, n) = (
        t["mean_us"].as_f64().expect("mean"),
        t["stdev_us"].as_f64().expect("stdev"),
        t["n"].as_u64().expect("n"),
    );
    let half = t95(n.saturating_sub(1)) * sd / (n as f64).sqrt();
    (m - half, m + half)
}

/// The summary document the bundled proposers put in `summary.message`.
fn report(search: &Value) -> Value {
    let msg = search["summary"]["message"]
        .as_str()
        .expect("summary message");
    serde_json::from_str(msg).unwrap_or_else(|e| panic!("summary is not JSON ({e}): {msg}"))
}

/// Asserts the search ended `done` with a best that is correct and faster than the
/// seed by non-overlapping 95 % intervals and a lower median.
async fn assert_faster_than_seed(c: &Client, search: &Value) -> (String, Vec<Value>) {
    let id = search["id"].as_str().expect("id");
    assert_eq!(search["state"], "done", "{search}");
    let rep = report(search);
    let seed = rep["seed"].as_str().expect("seed id").to_string();
    let best = search["summary"]["best"]
        .as_str()
        .expect("a best candidate")
        .to_string();
    let entries = archive(c, id).await;
    let eval_of = |cid: &str| {
        entries
            .iter()
            .find(|e| e["id"] == cid)
            .map(|e| e["evaluation"].clone())
            .unwrap_or_else(|| panic!("{cid} is not in the archive"))
    };
    let (se, be) = (eval_of(&seed), eval_of(&best));
    let (s_ci, b_ci) = (ci(&se), ci(&be));
    let (sm, bm) = (
        se["timing"]["median_us"].as_f64().expect("median"),
        be["timing"]["median_us"].as_f64().expect("median"),
    );
    eprintln!(
        "{}: seed {sm:.1} µs {s_ci:.1?}, best {bm:.1} µs {b_ci:.1?} ({:.2}x): {}",
        search["proposer"],
        sm / bm,
        rep["text"]
    );
    assert!(bm < sm, "best median {bm} is not below the seed's {sm}");
    assert!(
        b_ci.1 < s_ci.0,
        "intervals overlap: best {b_ci:?}, seed {s_ci:?}"
    );
    (best, entries)
}

async fn offline_search(proposer: &str, cfg: Value, budget: u64) {
    let d = Daemon::start_with_config(&config(""));
    let c = d.client();
    register(&c, &repo().join("problems/softmax-256x4096")).await;
    let id = start_search(
        &c,
        json!({"problem": "softmax-256x4096", "proposer": proposer, "config": cfg,
               "budget": budget, "seed": 7, "time_limit_secs": 600}),
    )
    .await;
    let s = wait_end(&c, &id, Duration::from_secs(420)).await;
    let (_, entries) = assert_faster_than_seed(&c, &s).await;
    let rep = report(&s);
    assert_eq!(rep["mode"], "offline");
    assert!(!rep["rounds"].as_array().expect("rounds").is_empty());
    // Lineage: everything but the seed names a parent from this search, and a note.
    for e in entries.iter().skip(1) {
        let parent = e["candidate"]["parent"].as_str().expect("parent");
        assert!(entries.iter().any(|x| x["id"] == parent), "{e}");
        assert!(
            e["candidate"]["note"]
                .as_str()
                .is_some_and(|n| !n.is_empty())
        );
    }
    let log = c
        .get(&format!("/v1/searches/{id}/log"))
        .await
        .expect("log")
        .to_string();
    if proposer == "map-elites" {
        assert!(log.contains("fall back to the knob values"), "{log}");
        assert!(!rep["grid"]["cells"].as_array().expect("grid").is_empty());
    }
    if proposer == "idea-branch" {
        let ideas: Vec<&Value> = rep["rounds"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|r| r["tried"].as_array().into_iter().flatten())
            .collect();
        assert!(
            ideas
                .iter()
                .all(|i| i["family"].is_string() && i["outcome"].is_string())
        );
        let first_round: Vec<&Value> = rep["rounds"][0]["tried"]
            .as_array()
            .expect("tried")
            .iter()
            .map(|t| &t["family"])
            .collect();
        let mut fams = first_round.clone();
        fams.dedup();
        assert_eq!(
            fams.len(),
            first_round.len(),
            "one idea per family: {first_round:?}"
        );
        assert!(log.contains("idea ["), "{log}");
    }
}

#[test]
fn hill_climb_offline_beats_the_seed() {
    build();
    let _g = serial();
    runtime().block_on(offline_search(
        "hill-climb",
        // Every one-knob neighbour of the seed is tried before any restart, so the large
        // moves (float accumulation, expf) are always among the first candidates.
        json!({"mode": "offline", "neighbours": 4, "restart_after": 4}),
        16,
    ));
}

#[test]
fn idea_branch_offline_beats_the_seed() {
    build();
    let _g = serial();
    runtime().block_on(offline_search(
        "idea-branch",
        json!({"mode": "offline", "ideas": 3, "impls": 1}),
        8,
    ));
}

#[test]
fn map_elites_offline_beats_the_seed() {
    build();
    let _g = serial();
    runtime().block_on(offline_search(
        "map-elites",
        json!({"mode": "offline", "islands": 2, "batch": 2, "migrate_every": 1}),
        11,
    ));
}

/// The softmax seed with some knobs set.
fn softmax_variant(sets: &[(&str, &str)]) -> String {
    let mut src =
        std::fs::read_to_string(repo().join("problems/softmax-256x4096/seed.c")).expect("seed.c");
    for (k, v) in sets {
        let line = src
            .lines()
            .find(|l| l.starts_with(&format!("#define {k} ")))
            .expect("knob")
            .to_string();
        src = src.replace(&line, &format!("#define {k} {v}"));
    }
    src
}

fn code_reply(note: &str, sets: &[(&str, &str)]) -> Value {
    json!({"content": format!("IDEA: {note}\n\n```c\n{}```\n", softmax_variant(sets))})
}

#[test]
fn idea_branch_llm_replay_recovers_from_a_bad_reply() {
    build();
    let _g = serial();
    runtime().block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let replay = dir.path().join("replies.jsonl");
        let ideas1 = json!([
            {"family": "precision", "name": "float_math", "idea": "accumulate in float and use expf"},
            {"family": "compute", "name": "cheap_exp", "idea": "call expf instead of exp"}
        ]);
        let ideas2 = json!([
            {"family": "control-flow", "name": "unroll", "idea": "unroll the reductions by 8"},
            {"family": "asynchrony", "name": "online", "idea": "one pass for max and sum"}
        ]);
        let lines = [
            json!({"content": format!("```json\n{ideas1}\n```")}),
            json!({"content": "I would accumulate in float; that should be faster."}),
            code_reply("float accumulators and expf", &[("ACC_T", "float"), ("EXP", "expf")]),
            code_reply("expf", &[("EXP", "expf")]),
            json!({"content": format!("```json\n{ideas2}\n```")}),
            code_reply("unroll by 8", &[("ACC_T", "float"), ("EXP", "expf"), ("UNROLL", "8")]),
            code_reply("online", &[("ACC_T", "float"), ("EXP", "expf"), ("ONLINE", "1")]),
        ];
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(&replay, text).expect("replay file");
        let d = Daemon::start_with_config(&config(&format!(
            "[llm]\nprovider = \"replay\"\nreplay_file = \"{}\"\n",
            replay.display()
        )));
        let c = d.client();
        register(&c, &repo().join("problems/softmax-256x4096")).await;
        let id = start_search(
            &c,
            json!({"problem": "softmax-256x4096", "proposer": "idea-branch",
                   "config": {"mode": "llm", "ideas": 2, "impls": 1, "rounds": 2},
                   "budget": 10, "seed": 3, "time_limit_secs": 600}),
        )
        .await;
        let s = wait_end(&c, &id, Duration::from_secs(300)).await;
        assert_eq!(s["state"], "done", "{s}");
        let rep = report(&s);
        assert_eq!(rep["mode"], "llm", "{rep}");
        assert_eq!(rep["rounds"].as_array().map(Vec::len), Some(2), "{rep}");
        let best = s["summary"]["best"].as_str().expect("best");
        let entries = archive(&c, &id).await;
        let be = entries
            .iter()
            .find(|e| e["id"] == best)
            .expect("best in archive");
        assert_eq!(be["evaluation"]["verdict"], "ok");
        assert_ne!(Some(best), rep["seed"].as_str(), "a model's kernel won");
        let calls = c
            .get(&format!("/v1/searches/{id}/llm-calls"))
            .await
            .expect("llm calls");
        let calls = calls["calls"].as_array().cloned().unwrap_or_default();
        assert_eq!(calls.len(), 7, "{calls:#?}");
        // The request after the unusable reply carries it and the parse error.
        let retry = calls[2]["request"].to_string();
        assert!(retry.contains("could not be used"), "{retry}");
        assert!(retry.contains("fenced"), "{retry}");
        assert!(retry.contains("I would accumulate in float"), "{retry}");
        let first = calls[0]["request"].to_string();
        assert!(first.contains("softmax-256x4096") && first.contains("Tolerance"));
        assert!(calls[1]["request"].to_string().contains("Verdict: ok"));
    });
}

#[test]
fn search_resumes_after_kill9_without_reevaluating() {
    build();
    let _g = serial();
    runtime().block_on(async {
        let mut d = Daemon::start_with_config(&config(""));
        let c = d.client();
        register(&c, &repo().join("problems/softmax-256x4096")).await;
        let id = start_search(
            &c,
            json!({"problem": "softmax-256x4096", "proposer": "hill-climb",
                   "config": {"mode": "offline", "neighbours": 2, "accept": "median"},
                   "budget": 10, "seed": 11, "time_limit_secs": 600}),
        )
        .await;
        let t0 = Instant::now();
        loop {
            let s = c.get(&format!("/v1/searches/{id}")).await.expect("search");
            assert_eq!(s["state"], "running", "ended before the kill: {s}");
            if s["evaluated"].as_u64().unwrap_or(0) >= 4 {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(180));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        d.kill9();
        d.spawn();
        let c = d.client();
        let s = wait_end(&c, &id, Duration::from_secs(300)).await;
        assert_eq!(s["state"], "done", "{s}");
        assert_eq!(s["starts"], 2, "{s}");
        let log = c
            .get(&format!("/v1/searches/{id}/log"))
            .await
            .expect("log")
            .to_string();
        assert!(log.contains("resuming at step"), "{log}");
        let entries = archive(&c, &id).await;
        assert!(entries.len() > 4);
        for e in &entries {
            assert!(e["evaluation"].is_object(), "not evaluated: {e}");
        }
        // Every job kilnd ever made: one per candidate.
        let mut jobs: BTreeMap<String, u32> = BTreeMap::new();
        for n in 1.. {
            match c.get(&format!("/v1/jobs/{n}")).await {
                Ok(j) => {
                    *jobs
                        .entry(j["candidate_id"].as_str().expect("cid").into())
                        .or_default() += 1
                }
                Err(_) => break,
            }
        }
        assert_eq!(jobs.len(), entries.len(), "{jobs:?}");
        assert!(
            jobs.values().all(|&n| n == 1),
            "a candidate was evaluated twice: {jobs:?}"
        );
    });
}

fn test_wasm(name: &str) -> String {
    let p = repo().join(format!("target/plugins/{name}.wasm"));
    let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn abuse_wasm() -> String {
    test_wasm("kiln_test_plugin_abuse")
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The search's log, one string per line.
async fn log_lines(c: &Client, id: &str) -> Vec<String> {
    let log = c.get(&format!("/v1/searches/{id}/log")).await.expect("log");
    log["lines"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|l| l["message"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The layers the search's plugin host ran under, from its log: (active, not active).
async fn host_layers(c: &Client, id: &str) -> (String, String) {
    let lines = log_lines(c, id).await;
    let line = lines
        .iter()
        .find_map(|l| l.strip_prefix("plugin host jail: active: "))
        .unwrap_or_else(|| panic!("no jail line in the log: {lines:?}"));
    match line.split_once("; not active: ") {
        Some((on, off)) => (on.to_string(), off.to_string()),
        None => (line.to_string(), String::new()),
    }
}

/// Pids of running processes whose program is kiln-plugin-host, serving `search`.
fn plugin_hosts_of(search: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<&[u8]> = raw.split(|&b| b == 0).collect();
            args.first()
                .is_some_and(|a0| a0.ends_with(b"kiln-plugin-host"))
                && args
                    .windows(2)
                    .any(|w| w[0] == b"--search" && w[1] == search.as_bytes())
        })
        .collect()
}

/// A request from a process in the plugin host's process group (as a guest that escaped
/// wasmtime would be) is served the plugin routes only; the same request from the test
/// itself is served. The process joins the group at spawn (it is in kilnd's session).
fn plugin_host_peers_get_plugin_routes_only(socket: &Path, host_pid: u32) {
    use std::os::unix::process::CommandExt;
    if std::process::Command::new("python3")
        .arg("-V")
        .output()
        .is_err()
    {
        println!("SKIP the plugin-peer check: no python3");
        return;
    }
    let stat = std::fs::read_to_string(format!("/proc/{host_pid}/stat")).expect("stat");
    let pgid: i32 = stat[stat.rfind(')').expect("comm") + 1..]
        .split_whitespace()
        .nth(2)
        .and_then(|g| g.parse().ok())
        .expect("process group");
    let script = "import socket,sys\n\
        s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n\
        s.sendall(b'GET /v1/problems HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n')\n\
        out=b''\n\
        while True:\n    b=s.recv(65536)\n    if not b: break\n    out+=b\n\
        print(out.decode(errors='replace'))\n";
    let get = |group: Option<i32>| {
        let mut cmd = std::process::Command::new("python3");
        cmd.arg("-c").arg(script).arg(socket);
        if let Some(g) = group {
            cmd.process_group(g);
        }
        let out = cmd.output().expect("python3 runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let inside = get(Some(pgid));
    assert!(
        inside.starts_with("HTTP/1.1 403") && inside.contains("plugin routes only"),
        "{inside}"
    );
    let outside = get(None);
    assert!(outside.starts_with("HTTP/1.1 200"), "{outside}");
}

#[test]
fn plugin_abuse_search_host_is_jailed_sees_only_the_socket_and_dies_on_cancel() {
    build();
    let _g = serial();
    runtime().block_on(async {
        let d = Daemon::start_with_config(&config(""));
        let c = d.client();
        register(&c, &repo().join("problems/softmax-256x4096")).await;
        let id = start_search(
            &c,
            json!({"problem": "softmax-256x4096", "proposer": "abuse", "wasm_base64": abuse_wasm(),
                   "config": "spin", "time_limit_secs": 600}),
        )
        .await;
        let t0 = Instant::now();
        let pid = loop {
            if let [pid] = plugin_hosts_of(&id)[..] {
                break pid;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "no plugin host for {id}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let (on, off) = host_layers(&c, &id).await;
        for layer in [
            "seccomp",
            "no-new-privs",
            "rlimits",
            "env-cleared",
            "fds-closed",
        ] {
            assert!(on.contains(layer), "{layer} not active: {on} / {off}");
        }
        assert!(off.contains("cgroup"), "{off}");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
        assert!(status.contains("Seccomp:\t2"), "{status}");
        assert!(status.contains("NoNewPrivs:\t1"), "{status}");
        if is_root() {
            // Here the kernel grants every namespace: the host has its own network and
            // PID namespaces and a private root with nothing of kilnd's folder but the
            // socket (no state directory, no config, no log).
            for layer in [
                "user-namespace",
                "network-namespace",
                "pid-namespace",
                "private-root",
            ] {
                assert!(on.contains(layer), "{layer} not active: {on} / {off}");
            }
            let ns = |p: &str| std::fs::read_link(p).expect("ns link");
            assert_ne!(ns(&format!("/proc/{pid}/ns/net")), ns("/proc/self/ns/net"));
            assert_ne!(ns(&format!("/proc/{pid}/ns/pid")), ns("/proc/self/ns/pid"));
            let root = PathBuf::from(format!("/proc/{pid}/root"));
            let folder = std::fs::canonicalize(d.dir.path()).expect("canonical");
            let inside = root.join(folder.strip_prefix("/").expect("absolute"));
            let seen: Vec<String> = std::fs::read_dir(&inside)
                .expect("kilnd's folder inside the jail")
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            assert_eq!(seen, vec!["kiln.sock".to_string()], "{}", inside.display());
            assert!(!root.join("root").exists() && !root.join("home").exists());
            let mut scratch: Vec<String> = std::fs::read_dir(root.join("scratch"))
                .expect("scratch")
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            scratch.sort();
            assert_eq!(scratch, ["plugin.wasm", "token"]);
        }
        plugin_host_peers_get_plugin_routes_only(&d.socket, pid);
        let (st, v) = c
            .post(&format!("/v1/searches/{id}/cancel"), &json!({}))
            .await
            .expect("cancel");
        assert!(st == 200 || st == 202, "{st} {v}");
        let t0 = Instant::now();
        while !plugin_hosts_of(&id).is_empty() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the plugin host of a cancelled search is still running"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let s = c.get(&format!("/v1/searches/{id}")).await.expect("search");
        assert_eq!(s["state"], "cancelled", "{s}");
    });
}

#[test]
fn plugin_abuse_reading_a_host_file_is_refused_under_the_jail() {
    build();
    let _g = serial();
    runtime().block_on(async {
        let d = Daemon::start_with_config(&config(""));
        let c = d.client();
        register(&c, &repo().join("problems/softmax-256x4096")).await;
        let secret = d.config.display().to_string();
        let id = start_search(
            &c,
            json!({"problem": "softmax-256x4096", "proposer": "snoop-fs",
                   "wasm_base64": test_wasm("kiln_test_plugin_snoop_fs"), "config": secret}),
        )
        .await;
        let s = wait_end(&c, &id, Duration::from_secs(120)).await;
        assert_eq!(s["state"], "failed", "{s}");
        let error = s["error"].as_str().expect("error");
        assert!(
            error.contains("refused") && error.contains("wasi:filesystem"),
            "{error}"
        );
        assert!(!error.contains("READ"), "{error}");
        let (on, _) = host_layers(&c, &id).await;
        assert!(on.contains("seccomp"), "{on}");
    });
}

#[test]
fn search_runs_when_the_jail_has_no_namespaces_and_says_so() {
    build();
    let _g = serial();
    runtime().block_on(async {
        let d = Daemon::start_with_config(&config("[jail]\ndisable_namespaces = true"));
        let c = d.client();
        register(&c, &repo().join("problems/softmax-256x4096")).await;
        let id = start_search(
            &c,
            json!({"problem": "softmax-256x4096", "proposer": "abuse", "wasm_base64": abuse_wasm(),
                   "config": "host-calls"}),
        )
        .await;
        let s = wait_end(&c, &id, Duration::from_secs(180)).await;
        assert_eq!(s["state"], "done", "{s}");
        assert!(
            s["summary"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(&format!("search={id}"))),
            "{s}"
        );
        let (on, off) = host_layers(&c, &id).await;
        assert!(on.contains("seccomp") && on.contains("rlimits"), "{on}");
        for layer in ["user-namespace", "network-namespace", "private-root"] {
            assert!(off.contains(&format!("{layer} (")), "{layer}: {off}");
        }
        assert!(off.contains("disabled by configuration"), "{off}");
    });
}

#[test]
fn plugin_abuse_loop_and_memory_bomb_are_stopped_while_another_search_runs() {
    build();
    let _g = serial();
    runtime().block_on(async {
        let d = Daemon::start_with_config(&config("plugin_memory_mb = 64"));
        let c = d.client();
        register(&c, &repo().join("problems/softmax-256x4096")).await;
        let good = start_search(
            &c,
            json!({"problem": "softmax-256x4096", "proposer": "hill-climb",
                   "config": {"mode": "offline"}, "budget": 5, "seed": 1}),
        )
        .await;
        let wasm = abuse_wasm();
        let spin = start_search(
            &c,
            json!({"problem": "softmax-256x4096", "proposer": "abuse", "wasm_base64": wasm,
                   "config": "spin", "time_limit_secs": 5}),
        )
        .await;
        let bomb = start_search(
            &c,
            json!({"problem": "softmax-256x4096", "proposer": "abuse", "wasm_base64": wasm,
                   "config": "membomb"}),
        )
        .await;
        let s = wait_end(&c, &bomb, Duration::from_secs(120)).await;
        assert_eq!(s["state"], "failed", "{s}");
        assert!(
            s["error"].as_str().is_some_and(|e| e.contains("memory")),
            "{s}"
        );
        let s = wait_end(&c, &spin, Duration::from_secs(120)).await;
        assert_eq!(s["state"], "failed", "{s}");
        assert!(
            s["error"]
                .as_str()
                .is_some_and(|e| e.contains("wall") || e.contains("time")),
            "{s}"
        );
        let g = c.get(&format!("/v1/searches/{good}")).await.expect("good");
        assert!(g["state"] == "running" || g["state"] == "done", "{g}");
        let g = wait_end(&c, &good, Duration::from_secs(300)).await;
        assert_eq!(g["state"], "done", "{g}");
    });
}

#[test]
fn plugin_abuse_cannot_see_another_searchs_archive() {
    build();
    let _g = serial();
    runtime().block_on(async {
        let d = Daemon::start_with_config(&config(""));
        let c = d.client();
        register(&c, &repo().join("problems/softmax-256x4096")).await;
        let other = start_search(
            &c,
            json!({"problem": "softmax-256x4096", "proposer": "hill-climb",
                   "config": {"mode": "offline"}, "budget": 4, "seed": 2}),
        )
        .await;
        let o = wait_end(&c, &other, Duration::from_secs(300)).await;
        assert_eq!(o["state"], "done", "{o}");
        assert!(archive(&c, &other).await.len() >= 3);
        let snoop = start_search(
            &c,
            json!({"problem": "softmax-256x4096", "proposer": "abuse", "wasm_base64": abuse_wasm(),
                   "config": "host-calls"}),
        )
        .await;
        let s = wait_end(&c, &snoop, Duration::from_secs(120)).await;
        assert_eq!(s["state"], "done", "{s}");
        let msg = s["summary"]["message"].as_str().expect("message");
        assert!(msg.contains(&format!("search={snoop}")), "{msg}");
        // It submitted only the seed (which the other search also evaluated): its
        // archive holds that one candidate, not the other search's.
        assert!(msg.contains("archive=1;"), "{msg}");
        assert_eq!(archive(&c, &snoop).await.len(), 1);
    });
}

/// Every line of a search's log (paged).
async fn all_log_lines(c: &Client, id: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut after = 0i64;
    loop {
        let log = c
            .get(&format!("/v1/searches/{id}/log?after={after}&limit=1000"))
            .await
            .expect("log");
        let lines = log["lines"].as_array().cloned().unwrap_or_default();
        if lines.is_empty() {
            return out;
        }
        for l in &lines {
            after = after.max(l["id"].as_i64().unwrap_or(after));
            out.push(l["message"].as_str().unwrap_or("").to_string());
        }
    }
}

/// Bytes of the store's files (the database and its write-ahead log).
fn store_bytes(state: &Path) -> u64 {
    ["kiln.db", "kiln.db-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(state.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

#[test]
fn plugin_abuse_floods_of_logs_checkpoints_and_prompts_stay_within_their_limits() {
    build();
    let _g = serial();
    runtime().block_on(async {
        // A small log bound, so the flood meets it quickly: 2,000 lines or 1 MiB.
        let d = Daemon::start_with_config(&config("log_max_rows = 2000\nlog_max_bytes = 1048576"));
        let c = d.client();
        register(&c, &repo().join("problems/softmax-256x4096")).await;
        let search = |config: &str| {
            json!({"problem": "softmax-256x4096", "proposer": "abuse", "wasm_base64": abuse_wasm(),
                   "config": config, "time_limit_secs": 300})
        };
        let before = store_bytes(&d.state);

        // 20,000 lines of 1 KiB (20 MB) offered; the log keeps the bound and says so.
        let flood = start_search(&c, search("flood-log")).await;
        let s = wait_end(&c, &flood, Duration::from_secs(240)).await;
        assert_eq!(s["state"], "done", "{s}");
        let lines = all_log_lines(&c, &flood).await;
        let plugin_lines = lines.iter().filter(|l| l.starts_with("flood line")).count();
        assert!(
            (1000..=2000).contains(&plugin_lines),
            "{plugin_lines} plugin lines kept"
        );
        let notices: Vec<&String> = lines
            .iter()
            .filter(|l| l.contains("log limit reached"))
            .collect();
        assert_eq!(
            notices.len(),
            2,
            "one notice at the bound, one with the count: {notices:?}"
        );
        assert!(notices[0].contains("search.log_max_rows"), "{notices:?}");
        assert!(notices[1].contains("further lines dropped"), "{notices:?}");
        let grown = store_bytes(&d.state).saturating_sub(before);
        assert!(
            grown < 8 << 20,
            "the store grew by {grown} bytes for one flooding search"
        );

        // Checkpoints at the documented limit work end to end; past it, a typed error.
        let cp = start_search(&c, search("checkpoint-limits")).await;
        let s = wait_end(&c, &cp, Duration::from_secs(120)).await;
        assert_eq!(s["state"], "done", "{s}");
        let msg = s["summary"]["message"].as_str().unwrap_or("");
        for want in [
            "at_limit=Ok(())",
            "restored=true",
            "over=Err(TooLarge(16777216))",
            "big=Err(TooLarge(16777216))",
            "kept=true",
        ] {
            assert!(msg.contains(want), "{want} not in {msg}");
        }

        // Far past every limit: stopped, with the reason in kiln's words.
        let huge = start_search(&c, search("checkpoint-huge")).await;
        let s = wait_end(&c, &huge, Duration::from_secs(120)).await;
        assert_eq!(s["state"], "failed", "{s}");
        let error = s["error"].as_str().unwrap_or("");
        assert!(error.contains("more than 64 MiB in one call"), "{error}");
        assert!(!error.contains("hostcall"), "a wasmtime internal: {error}");

        // An oversized prompt fails that call only, with no LLM configured.
        let prompt = start_search(&c, search("huge-prompt")).await;
        let s = wait_end(&c, &prompt, Duration::from_secs(120)).await;
        assert_eq!(s["state"], "done", "{s}");
        let msg = s["summary"]["message"].as_str().unwrap_or("");
        assert!(
            msg.contains("huge=Some(Failed(") && msg.contains("over kiln's limit"),
            "{msg}"
        );
        assert!(msg.contains("small=Some(Unavailable)"), "{msg}");
    });
}
