//! A cluster on one machine: three kilnd nodes with the host backend on loopback, sharing
//! one PostgreSQL database (a scratch server the test starts).
//!
//! - a 1,000-candidate burst spread over the nodes, with `kill -9` of a node and a
//!   restart of the database in the middle: every accepted candidate is evaluated exactly
//!   once in the record, by all three nodes between them, and nothing fails;
//! - a search started on node 1 is evaluated on all three nodes, and when node 1 is
//!   killed it resumes on node 2 from its checkpoint without evaluating anything twice;
//! - a gateway (a node without lanes) queues work the others evaluate, and a node whose
//!   calibration drifts from its class stops claiming and says why.
//!
//! Without PostgreSQL's server binaries these tests say so and pass, unless
//! `KILN_REQUIRE_POSTGRES=1` (CI sets it).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{Daemon, FAST_CONFIG, double_candidate, register, write_double_problem};
use kiln_daemon::client::Client;
use kiln_daemon::cluster::scratch_db::ScratchDb;
use serde_json::{Value, json};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One cluster at a time: three nodes on two cores are plenty.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn scratch_server() -> Option<ScratchDb> {
    match ScratchDb::start() {
        Ok(db) => Some(db),
        Err(e) if std::env::var("KILN_REQUIRE_POSTGRES").as_deref() == Ok("1") => {
            panic!("KILN_REQUIRE_POSTGRES=1 but no PostgreSQL server could be started: {e}")
        }
        Err(e) => {
            eprintln!("skipping the cluster tests: {e}");
            None
        }
    }
}

/// A node's config: the fast timing plan, one compile worker, short leases.
fn node_config(url: &str, node: &str, class: &str, extra: &str) -> String {
    node_config_leased(url, node, class, (3.0, 1.0, 1.0), extra)
}

/// [`node_config`] with its (lease, heartbeat, reaper) periods in seconds.
fn node_config_leased(
    url: &str,
    node: &str,
    class: &str,
    (lease, heartbeat, reaper): (f64, f64, f64),
    extra: &str,
) -> String {
    format!(
        r#"{FAST_CONFIG}
[queue]
compile_workers = 1
[search]
proposers_dir = "{proposers}"
[cluster]
database_url = "{url}"
node_id = "{node}"
gpu_class = "{class}"
lease_secs = {lease:.1}
heartbeat_secs = {heartbeat:.1}
reaper_secs = {reaper:.1}
poll_ms = 200
pool_size = 4
calibrate_every_secs = 0
{extra}
"#,
        proposers = repo().join("target/debug/proposers").display()
    )
}

fn psql_count(db: &ScratchDb, sql: &str) -> i64 {
    db.psql("kiln", sql)
        .expect("psql")
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Submits until accepted: a node that is down or a database that restarts answers with
/// an error, and a retry of a submission that did commit is answered as a duplicate.
async fn submit_retrying(nodes: &[PathBuf], first: usize, body: &Value) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut i = first;
    loop {
        let c = Client::new(&nodes[i % nodes.len()]);
        match c.post("/v1/candidates", body).await {
            Ok((status, v)) if status == 202 || status == 200 => {
                return v["id"].as_str().expect("id").to_string();
            }
            other => {
                assert!(
                    Instant::now() < deadline,
                    "no node accepted the candidate: {other:?}"
                );
                i += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The failed jobs, if any: each one's id, node and error, and the lines of that node's
/// log that name the job (with a few lines around each).
fn failed_jobs(db: &ScratchDb, nodes: &[Daemon]) -> Option<String> {
    let rows = db
        .psql(
            "kiln",
            "SELECT id || '|' || coalesce(node, '-') || '|' || coalesce(error, '-') FROM jobs
             WHERE state = 'failed' ORDER BY id",
        )
        .ok()?;
    if rows.trim().is_empty() {
        return None;
    }
    let mut out = String::new();
    for row in rows.lines() {
        let mut parts = row.splitn(3, '|');
        let (id, node, error) = (
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
        );
        out.push_str(&format!("job {id} failed on node {node}: {error}\n"));
        let log = nodes
            .iter()
            .find(|d| {
                std::fs::read_to_string(&d.config)
                    .is_ok_and(|c| c.contains(&format!("node_id = \"{node}\"")))
            })
            .map(Daemon::log)
            .unwrap_or_default();
        out.push_str(&log_around(&log, &format!("job{{id={id} "), 5));
    }
    Some(out)
}

/// The lines of `log` that contain `needle`, with `context` lines around each (at most
/// 60 lines in all).
fn log_around(log: &str, needle: &str, context: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    let mut keep = std::collections::BTreeSet::new();
    for (i, l) in lines.iter().enumerate() {
        if l.contains(needle) {
            keep.extend(i.saturating_sub(context)..(i + context + 1).min(lines.len()));
        }
    }
    let picked: Vec<&str> = keep.into_iter().map(|i| lines[i]).collect();
    let tail = &picked[picked.len().saturating_sub(60)..];
    if tail.is_empty() {
        format!("(no log line names {needle})\n")
    } else {
        tail.join("\n") + "\n"
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn cluster_burst_survives_a_killed_node_and_a_database_restart() {
    let _g = serial();
    let Some(mut db) = scratch_server() else {
        return;
    };
    db.create_database("kiln").expect("database");
    let url = db.url("kiln");
    let mut nodes: Vec<Daemon> = (1..=3)
        .map(|n| Daemon::start_with_config(&node_config(&url, &format!("n{n}"), "test-a", "")))
        .collect();
    let sockets: Vec<PathBuf> = nodes.iter().map(|d| d.socket.clone()).collect();
    // KILN_TEST_BURST makes it smaller while debugging; CI runs the full 1,000.
    let burst: usize = std::env::var("KILN_TEST_BURST")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let rt = runtime();
    let t0 = Instant::now();
    rt.block_on(async {
        // Each node has a lane (a node without a usable backend would leave the burst
        // queued until the deadline).
        for d in &nodes {
            let c = d.client().get("/v1/cluster").await.expect("cluster");
            assert!(
                c["this_node"]["classes"].as_array().is_some_and(|a| !a.is_empty()),
                "a node without lanes: {c}\n{}",
                d.log()
            );
        }
        let problems = nodes[0].dir.path().join("problems");
        register(&nodes[0].client(), &write_double_problem(&problems, "double")).await;
        // Submitters, each spreading its candidates over the nodes.
        let mut submitters = tokio::task::JoinSet::new();
        const TASKS: usize = 6;
        for t in 0..TASKS {
            let sockets = sockets.clone();
            submitters.spawn(async move {
                let mut ids = Vec::new();
                for n in (t..burst).step_by(TASKS) {
                    let body = double_candidate(
                        "double",
                        &format!("/* {n} */ for (int i = 0; i < n; i++) y[i] = 2.0f * x[i];"),
                    );
                    ids.push(submit_retrying(&sockets, n, &body).await);
                }
                ids
            });
        }
        let done = |db: &ScratchDb| psql_count(db, "SELECT count(*) FROM jobs WHERE state = 'done'");
        // Mid-burst: kill node 2, restart the database, bring node 2 back.
        let wait_done = async |db: &ScratchDb, nodes: &[Daemon], n: i64| {
            let deadline = Instant::now() + Duration::from_secs(600);
            while done(db) < n {
                // A failed job can never be done: say which and why at once.
                if let Some(why) = failed_jobs(db, nodes) {
                    panic!("a job of the burst failed:\n{why}");
                }
                if Instant::now() > deadline {
                    let states = db.psql("kiln", "SELECT state || ' ' || coalesce(node, '-') || ' ' || count(*) FROM jobs GROUP BY state, node").unwrap_or_default();
                    let logs: Vec<String> = nodes.iter().map(|d| {
                        let l = d.log();
                        l[l.len().saturating_sub(4000)..].to_string()
                    }).collect();
                    panic!("stuck below {n} done: {states}\nlogs:\n{}", logs.join("\n-----\n"));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        let quarter = (burst / 7) as i64;
        wait_done(&db, &nodes, quarter).await;
        eprintln!("{:?}: killing node 2", t0.elapsed());
        nodes[1].kill9();
        wait_done(&db, &nodes, 2 * quarter).await;
        eprintln!("{:?}: restarting the database", t0.elapsed());
        db.restart().expect("database restart");
        wait_done(&db, &nodes, 3 * quarter).await;
        eprintln!("{:?}: node 2 comes back", t0.elapsed());
        nodes[1].spawn();
        let mut accepted = Vec::new();
        while let Some(r) = submitters.join_next().await {
            accepted.extend(r.expect("submitter"));
        }
        assert_eq!(accepted.len(), burst);
        wait_done(&db, &nodes, burst as i64).await;
        eprintln!("{:?}: all {burst} done", t0.elapsed());
    });
    // The record: one candidate, one job and one evaluation each; nothing failed; every
    // node evaluated some.
    let counts = db
        .psql(
            "kiln",
            "SELECT state || '=' || count(*) FROM jobs GROUP BY state ORDER BY state",
        )
        .expect("states");
    assert_eq!(counts, format!("done={burst}"), "job states");
    assert_eq!(
        psql_count(&db, "SELECT count(*) FROM candidates"),
        burst as i64
    );
    assert_eq!(
        psql_count(&db, "SELECT count(*) FROM evaluations"),
        burst as i64
    );
    assert_eq!(
        psql_count(&db, "SELECT count(DISTINCT candidate_id) FROM evaluations"),
        burst as i64,
        "each candidate evaluated once"
    );
    let per_node = db
        .psql(
            "kiln",
            "SELECT node || '=' || count(*) FROM evaluations GROUP BY node ORDER BY node",
        )
        .expect("per node");
    eprintln!(
        "evaluations per node: {per_node:?}; attempts: {:?}",
        db.psql(
            "kiln",
            "SELECT attempts || '=' || count(*) FROM jobs GROUP BY attempts ORDER BY attempts"
        )
    );
    for n in ["n1", "n2", "n3"] {
        assert!(
            per_node.contains(&format!("{n}=")),
            "{n} evaluated nothing: {per_node}"
        );
    }
    assert_eq!(
        psql_count(
            &db,
            "SELECT count(*) FROM evaluations WHERE gpu_class <> 'host/test-a'"
        ),
        0,
        "every evaluation records its class"
    );
    for d in &mut nodes {
        assert!(d.terminate(), "a node stops cleanly; log:\n{}", d.log());
    }
    assert_eq!(
        psql_count(&db, "SELECT count(*) FROM nodes WHERE NOT stopped"),
        0,
        "every node left the cluster"
    );
    eprintln!("burst test took {:?}", t0.elapsed());
}

/// Builds the hill-climb proposer, the plugin host and the jail helper, once.
fn build_plugins() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let root = repo();
        let st = std::process::Command::new(root.join("scripts/build-plugins.sh"))
            .current_dir(&root)
            .arg("kiln-hill-climb")
            .status()
            .expect("run scripts/build-plugins.sh");
        assert!(st.success(), "scripts/build-plugins.sh failed");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = std::process::Command::new(cargo)
            .current_dir(&root)
            .args(["build", "-p", "kiln-plugin-host", "-p", "kiln-sandbox"])
            .status()
            .expect("run cargo build");
        assert!(
            st.success(),
            "building kiln-plugin-host and kiln-worker failed"
        );
    });
}

fn search_nodes(db: &ScratchDb, id: &str) -> Vec<String> {
    db.psql(
        "kiln",
        &format!(
            "SELECT DISTINCT e.node FROM evaluations e
             JOIN search_candidates sc ON sc.candidate_id = e.candidate_id
             WHERE sc.search_id = '{id}' ORDER BY 1"
        ),
    )
    .expect("psql")
    .lines()
    .map(str::to_string)
    .collect()
}

#[test]
fn cluster_search_is_evaluated_everywhere_and_resumes_on_another_node() {
    build_plugins();
    let _g = serial();
    let Some(db) = scratch_server() else { return };
    db.create_database("kiln").expect("database");
    let url = db.url("kiln");
    // Node 3 evaluates but never hosts searches, so the search must move to node 2.
    let mut nodes: Vec<Daemon> = (1..=3)
        .map(|n| {
            let extra = if n == 3 { "run_searches = false" } else { "" };
            Daemon::start_with_config(&node_config(&url, &format!("n{n}"), "test-a", extra))
        })
        .collect();
    let rt = runtime();
    rt.block_on(async {
        let c1 = nodes[0].client();
        register(&c1, &repo().join("problems/softmax-256x4096")).await;
        // Node 1's event stream: jobs the other nodes finish must reach it.
        let mut stream = c1.events().await.expect("events");
        let relayed = tokio::spawn(async move {
            let mut from = std::collections::BTreeSet::new();
            while let Some((name, data)) = stream.next().await {
                if name == "job"
                    && data["state"] == "done"
                    && let Some(n) = data["node"].as_str()
                {
                    from.insert(n.to_string());
                }
                if from.contains("n2") && from.contains("n3") {
                    break;
                }
            }
            from
        });
        let (status, v) = c1
            .post(
                "/v1/searches",
                &json!({"problem": "softmax-256x4096", "proposer": "hill-climb",
                        "config": {"mode": "offline", "neighbours": 3, "restart_after": 2,
                                   "accept": "median"},
                        "budget": 18, "seed": 5, "time_limit_secs": 600}),
            )
            .await
            .expect("start search");
        assert_eq!(status, 201, "{v}");
        let id = v["id"].as_str().expect("id").to_string();
        // Evaluated on all three nodes while node 1 hosts it.
        let t0 = Instant::now();
        loop {
            let s = c1.get(&format!("/v1/searches/{id}")).await.expect("search");
            assert_eq!(s["state"], "running", "ended before the kill: {s}");
            let on = search_nodes(&db, &id);
            if on.len() == 3 && s["evaluated"].as_u64().unwrap_or(0) >= 6 {
                eprintln!("{:?}: evaluated on {on:?}: {}", t0.elapsed(), s["evaluated"]);
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(300),
                "not evaluated on every node: {on:?} {s}\n{}",
                nodes[0].log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let from = tokio::time::timeout(Duration::from_secs(60), relayed)
            .await
            .expect("relayed events")
            .expect("reader");
        assert!(
            from.contains("n2") && from.contains("n3"),
            "node 1's events carry other nodes' results: {from:?}"
        );
        assert_eq!(
            db.psql("kiln", &format!("SELECT host_node FROM searches WHERE id = '{id}'"))
                .expect("host"),
            "n1"
        );
        nodes[0].kill9();
        // Node 2 takes the search over once node 1's lease runs out, and finishes it.
        let c2 = nodes[1].client();
        let t1 = Instant::now();
        let s = loop {
            let s = c2.get(&format!("/v1/searches/{id}")).await.expect("search");
            if s["state"] != "running" {
                break s;
            }
            assert!(
                t1.elapsed() < Duration::from_secs(300),
                "the search did not end after node 1 died: {s}\n{}",
                nodes[1].log()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        };
        eprintln!("{:?}: search ended on node 2: {s}", t1.elapsed());
        assert_eq!(s["state"], "done", "{s}");
        assert_eq!(s["starts"], 2, "started on node 1, resumed once: {s}");
        assert_eq!(s["host_node"], "n2", "{s}");
        let log = c2
            .get(&format!("/v1/searches/{id}/log"))
            .await
            .expect("log")
            .to_string();
        assert!(log.contains("plugin host starting on node n2"), "{log}");
        assert!(log.contains("resuming at step"), "resumed from its checkpoint: {log}");
        // Nothing evaluated twice: one job per candidate, each with one evaluation.
        let twice = db
            .psql(
                "kiln",
                &format!(
                    "SELECT count(*) FROM (SELECT j.candidate_id FROM jobs j
                       JOIN search_candidates sc ON sc.candidate_id = j.candidate_id
                       WHERE sc.search_id = '{id}' GROUP BY j.candidate_id
                       HAVING count(*) > 1) d"
                ),
            )
            .expect("twice");
        assert_eq!(twice, "0", "a candidate was queued twice");
        let unevaluated = db
            .psql(
                "kiln",
                &format!(
                    "SELECT count(*) FROM search_candidates sc WHERE sc.search_id = '{id}'
                       AND NOT EXISTS (SELECT 1 FROM evaluations e WHERE e.candidate_id = sc.candidate_id)"
                ),
            )
            .expect("unevaluated");
        assert_eq!(unevaluated, "0");
    });
}

#[test]
fn cluster_gateway_queues_for_others_and_a_drifting_node_stops_claiming() {
    let _g = serial();
    let Some(db) = scratch_server() else { return };
    db.create_database("kiln").expect("database");
    let url = db.url("kiln");
    let gateway = Daemon::start_with_config(&node_config(&url, "gw", "test-a", "evaluate = false"));
    let worker = Daemon::start_with_config(&node_config(&url, "w1", "test-a", ""));
    let rt = runtime();
    rt.block_on(async {
        let g = gateway.client();
        let problems = gateway.dir.path().join("problems");
        register(&g, &write_double_problem(&problems, "double")).await;
        let mut ids = Vec::new();
        for n in 0..5 {
            let body = double_candidate(
                "double",
                &format!("/* gw {n} */ for (int i = 0; i < n; i++) y[i] = 2.0f * x[i];"),
            );
            let (status, v) = g.post("/v1/candidates", &body).await.expect("submit");
            assert_eq!(status, 202, "{v}");
            ids.push(v["id"].as_str().expect("id").to_string());
        }
        for id in &ids {
            let r = g
                .get(&format!("/v1/candidates/{id}?wait=60"))
                .await
                .expect("candidate");
            assert_eq!(r["job"]["state"], "done", "{r}");
            assert_eq!(r["job"]["node"], "w1", "the gateway evaluates nothing: {r}");
        }
        let status = g.get("/v1/cluster").await.expect("cluster status");
        let nodes = status["nodes"].as_array().expect("nodes");
        let gw = nodes
            .iter()
            .find(|n| n["id"] == "gw")
            .expect("gateway listed");
        assert_eq!(gw["evaluates"], false, "{status}");
        let metrics = g.get_text("/metrics").await.expect("metrics");
        assert!(
            metrics.contains(r#"kiln_node_claiming{node="gw",reason="no lanes (gateway)"} 0"#),
            "{metrics}"
        );
    });
    drop(worker);
    drop(gateway);

    // Two nodes of one class whose calibrations can never agree within a limit of one
    // part in a billion: both stop claiming and say why.
    db.create_database("drift").expect("database");
    let url = db.url("drift");
    let strict = "calibrate_every_secs = 1\ndrift_threshold = 0.000000001";
    let a = Daemon::start_with_config(
        &node_config(&url, "d1", "test-a", strict).replace("calibrate_every_secs = 0\n", ""),
    );
    let b = Daemon::start_with_config(
        &node_config(&url, "d2", "test-a", strict).replace("calibrate_every_secs = 0\n", ""),
    );
    rt.block_on(async {
        let c = a.client();
        let t0 = Instant::now();
        let status = loop {
            let s = c.get("/v1/cluster").await.expect("status");
            let drifting = s["nodes"]
                .as_array()
                .map(|n| n.iter().filter(|n| !n["drift"].is_null()).count())
                .unwrap_or(0);
            if drifting == 2 {
                break s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "the nodes did not stop claiming: {s}\n{}",
                a.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let why = status["nodes"][0]["drift"].as_str().unwrap_or("");
        assert!(
            why.contains("calibration drifted on host/test-a"),
            "{status}"
        );
        let metrics = c.get_text("/metrics").await.expect("metrics");
        assert!(
            metrics.contains(r#"kiln_node_claiming{node="d1",reason="calibration drifted"#),
            "{metrics}"
        );
        // kiln doctor says so, and fails.
        let out = std::process::Command::new(common::kiln_cli())
            .env("KILN_SOCKET", &a.socket)
            .args(["doctor", "--no-run", "-o", "json"])
            .output()
            .expect("kiln doctor");
        assert!(!out.status.success(), "doctor passes a drifting node");
        let doc: Value = serde_json::from_slice(&out.stdout).expect("doctor json");
        assert!(
            doc["cluster"]["this_node"]["paused"]
                .as_str()
                .is_some_and(|p| p.contains("calibration drifted")),
            "{doc}"
        );
        // A candidate submitted now waits: no lane of the class claims.
        let problems = a.dir.path().join("problems");
        register(&c, &write_double_problem(&problems, "double")).await;
        let (_, v) = c
            .post(
                "/v1/candidates",
                &double_candidate("double", "for (int i = 0; i < n; i++) y[i] = 2.0f * x[i];"),
            )
            .await
            .expect("submit");
        let job = v["job_id"].as_i64().expect("job");
        let j = c.get(&format!("/v1/jobs/{job}?wait=3")).await.expect("job");
        assert_eq!(j["state"], "queued", "{j}");
        let s = c.get("/v1/cluster").await.expect("status");
        assert!(
            s["queued_without_capacity"]
                .as_array()
                .is_some_and(|q| q.iter().any(|c| c == "host/test-a")),
            "{s}"
        );
    });
    drop((a, b));
}

/// Waits until `node` serves its API (it has joined the cluster: the schema exists).
fn joined(rt: &tokio::runtime::Runtime, node: &Daemon) {
    rt.block_on(async {
        let c = node.client().get("/v1/cluster").await.expect("cluster");
        assert!(
            c["this_node"]["classes"]
                .as_array()
                .is_some_and(|a| !a.is_empty()),
            "a node without lanes (is kiln-worker built?): {c}\n{}",
            node.log()
        );
    });
}

/// Creates `trigger` on `table` running PL/pgSQL `body` (the test's fault injection: the
/// product's own statements meet it in the database).
fn install_trigger(db: &ScratchDb, table: &str, when: &str, name: &str, body: &str) {
    db.psql(
        "kiln",
        &format!(
            "CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN {body} RETURN NEW; END $f$;
             CREATE TRIGGER {name} BEFORE UPDATE ON {table} FOR EACH ROW {when} EXECUTE FUNCTION {name}();"
        ),
    )
    .expect("install trigger");
}

/// Polls `sql` (a count) until it reaches `n`, failing fast when a job failed.
async fn wait_count(db: &ScratchDb, nodes: &[Daemon], sql: &str, n: i64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(180);
    while psql_count(db, sql) < n {
        if let Some(why) = failed_jobs(db, nodes) {
            panic!("waiting for {what}, a job failed:\n{why}");
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not happen: {}\nlog:\n{}",
            db.psql(
                "kiln",
                "SELECT id || ' ' || state || ' ' || attempts || ' ' || lapsed::text FROM jobs"
            )
            .unwrap_or_default(),
            nodes
                .iter()
                .map(Daemon::log)
                .collect::<Vec<_>>()
                .join("\n-----\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The database fails the write that finishes a job, as a restart would (SQLSTATE
/// 57P01, "terminating connection due to administrator command"), six times: the node
/// retries the write and every job is done exactly once, with one attempt; nothing fails.
#[test]
fn a_store_error_as_a_job_finishes_is_retried_and_the_job_done_once() {
    let _g = serial();
    let Some(db) = scratch_server() else { return };
    db.create_database("kiln").expect("database");
    let url = db.url("kiln");
    let nodes = vec![Daemon::start_with_config(&node_config(
        &url, "n1", "test-a", "",
    ))];
    let rt = runtime();
    joined(&rt, &nodes[0]);
    db.psql("kiln", "CREATE SEQUENCE injected")
        .expect("sequence");
    install_trigger(
        &db,
        "jobs",
        "WHEN (NEW.state = 'done' AND OLD.state <> 'done')",
        "fail_finish",
        "IF nextval('injected') <= 6 THEN
             RAISE EXCEPTION 'injected: terminating connection due to administrator command'
                 USING ERRCODE = '57P01';
         END IF;",
    );
    rt.block_on(async {
        let c = nodes[0].client();
        let problems = nodes[0].dir.path().join("problems");
        register(&c, &write_double_problem(&problems, "double")).await;
        for n in 0..3 {
            let body = double_candidate(
                "double",
                &format!("/* finish {n} */ for (int i = 0; i < n; i++) y[i] = 2.0f * x[i];"),
            );
            let (status, v) = c.post("/v1/candidates", &body).await.expect("submit");
            assert_eq!(status, 202, "{v}");
        }
        wait_count(
            &db,
            &nodes,
            "SELECT count(*) FROM jobs WHERE state = 'done'",
            3,
            "three jobs done",
        )
        .await;
    });
    assert!(
        psql_count(&db, "SELECT last_value FROM injected") >= 9,
        "six finishes refused, three recorded"
    );
    assert_eq!(
        db.psql(
            "kiln",
            "SELECT state || ' ' || attempts || ' ' || (SELECT count(*) FROM evaluations e WHERE e.job_id = j.id)
             FROM jobs j ORDER BY id"
        )
        .expect("jobs"),
        "done 1 1\ndone 1 1\ndone 1 1",
        "each job done once, on its first attempt, with one evaluation"
    );
    assert!(
        nodes[0].log().contains("retrying the write"),
        "the node said it retried: {}",
        nodes[0].log()
    );
}

/// A candidate whose every call sleeps about `ms` milliseconds (and doubles its input,
/// so it is correct).
fn slow_candidate(ms: u32) -> Value {
    json!({
        "problem": "double",
        "language": "c",
        "source": format!(
            "#define _POSIX_C_SOURCE 199309L\n\
             #include <time.h>\n\
             void k(const float *x, float *y, int n) {{\n\
               struct timespec t = {{ {s}, {ns}L }};\n\
               nanosleep(&t, 0);\n\
               for (int i = 0; i < n; i++) y[i] = 2.0f * x[i];\n\
             }}\n",
            s = ms / 1000,
            ns = (ms % 1000) * 1_000_000
        ),
        "launches": [{"kernel": "k", "args": ["x", "y", {"i32": 1024}]}],
    })
}

/// Whether a node's log says its reaper queued again a job whose evaluation was running.
fn reaped_running(log: &str) -> bool {
    log.lines().any(|l| {
        l.contains("reaped jobs whose lease ran out")
            && l.split_whitespace()
                .any(|w| w.strip_prefix("requeued=").is_some_and(|n| n != "0"))
    })
}

/// A node whose heartbeat is held in the database past its lease while it evaluates a
/// job (slow, not dead): the reaper takes the lease, the job runs again, the late result
/// is fenced out, and once the heartbeat comes back the lost attempt is given back. The
/// job ends done exactly once, with one evaluation and one attempt.
#[test]
fn a_heartbeat_late_past_the_lease_runs_the_job_once_and_costs_no_attempt() {
    let _g = serial();
    let Some(db) = scratch_server() else { return };
    db.create_database("kiln").expect("database");
    let url = db.url("kiln");
    let nodes = vec![Daemon::start_with_config(&node_config_leased(
        &url,
        "n1",
        "test-a",
        (1.0, 0.4, 0.3),
        "",
    ))];
    let rt = runtime();
    joined(&rt, &nodes[0]);
    db.psql(
        "kiln",
        "CREATE TABLE hold (on_ boolean); INSERT INTO hold VALUES (false)",
    )
    .expect("hold table");
    install_trigger(
        &db,
        "nodes",
        "WHEN (NEW.last_seen IS DISTINCT FROM OLD.last_seen)",
        "slow_heartbeat",
        "IF (SELECT on_ FROM hold) THEN PERFORM pg_sleep(3); END IF;",
    );
    rt.block_on(async {
        let c = nodes[0].client();
        let problems = nodes[0].dir.path().join("problems");
        register(&c, &write_double_problem(&problems, "double")).await;
        let (status, v) = c
            .post("/v1/candidates", &slow_candidate(1000))
            .await
            .expect("submit");
        assert_eq!(status, 202, "{v}");
        wait_count(
            &db,
            &nodes,
            "SELECT count(*) FROM jobs WHERE state = 'running'",
            1,
            "the evaluation starting",
        )
        .await;
        db.psql("kiln", "UPDATE hold SET on_ = true").expect("hold");
        // The reaper's log line stays (the job's `lapsed` mark is cleared again as soon
        // as a held heartbeat gets through, which it does every few seconds).
        let deadline = Instant::now() + Duration::from_secs(180);
        while !reaped_running(&nodes[0].log()) {
            assert!(
                Instant::now() < deadline,
                "the running job's lease never lapsed; log:\n{}",
                nodes[0].log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        db.psql("kiln", "UPDATE hold SET on_ = false")
            .expect("release");
        wait_count(
            &db,
            &nodes,
            "SELECT count(*) FROM jobs WHERE state = 'done'",
            1,
            "the job done",
        )
        .await;
    });
    assert_eq!(
        db.psql(
            "kiln",
            "SELECT state || ' ' || attempts || ' ' || (SELECT count(*) FROM evaluations e WHERE e.job_id = j.id)
             FROM jobs j"
        )
        .expect("job"),
        "done 1 1",
        "done once, with one attempt and one evaluation"
    );
    let log = nodes[0].log();
    eprintln!(
        "{}",
        log_around(&log, "job done", 0) + &log_around(&log, "fenced_out", 0)
    );
    assert!(
        log.contains("fenced_out"),
        "the late result was refused: {log}"
    );
    assert!(
        log.contains("attempts were given back"),
        "the node said its lapse cost nothing: {log}"
    );
}

/// A database that stops answering (its port taken by a server that accepts and says
/// nothing) does not keep kilnd from stopping on SIGTERM.
#[test]
fn kilnd_stops_on_sigterm_when_the_database_answers_nothing() {
    let _g = serial();
    let Some(mut db) = scratch_server() else {
        return;
    };
    db.create_database("kiln").expect("database");
    let url = db.url("kiln");
    let mut node = Daemon::start_with_config(&format!(
        "{}\n[server]\nshutdown_timeout_secs = 5\n",
        node_config(&url, "n1", "test-a", "")
    ));
    joined(&runtime(), &node);
    let port = db.port();
    db.stop();
    let silent = std::net::TcpListener::bind(("127.0.0.1", port)).expect("take the port");
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        silent.set_nonblocking(true).expect("nonblocking");
        let until = Instant::now() + Duration::from_secs(120);
        while Instant::now() < until {
            match silent.accept() {
                Ok((s, _)) => conns.push(s),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
            if conns.len() >= 3 {
                break;
            }
        }
        conns.len()
    });
    // Let the node's loops meet the silent server.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !held.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let exited = node.terminate_within(Duration::from_secs(60));
    assert_eq!(
        exited,
        Some(true),
        "kilnd did not stop cleanly on SIGTERM; log:\n{}",
        node.log()
    );
}
