//! `kiln bench cluster`: many kilnd nodes on this machine (host backend) sharing one
//! PostgreSQL database, for each node count in `--nodes`: evaluations per minute, claim
//! latency (the claim statement as each node timed it, and the queue wait from accepted to
//! claimed), and the database's own cost (its CPU time and commits per evaluation).
//!
//! It starts everything itself: a scratch PostgreSQL server (or uses `--database-url`,
//! where it creates one database per run), N kilnd processes with their own state
//! directories and sockets, a tiny built-in problem, and a burst of distinct candidates
//! spread over the nodes. The nodes share the machine's cores, so the figures measure
//! the queue and the database, not GPU throughput.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use kiln_daemon::client::Client;
use kiln_daemon::cluster::scratch_db::ScratchDb;
use serde_json::{Value, json};

use super::common::{self, Summary};
use crate::Output;
use crate::output::print_json;

/// Arguments of `kiln bench cluster`.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// Node counts to measure, comma-separated (default 1,2,3; 1,2 with --smoke).
    #[arg(long, value_delimiter = ',')]
    nodes: Vec<usize>,
    /// Distinct candidates per run (default 200; 12 with --smoke).
    #[arg(long)]
    candidates: Option<usize>,
    /// Submissions outstanding at once.
    #[arg(long, default_value_t = 16)]
    in_flight: usize,
    /// An existing PostgreSQL server to use (the benchmark creates a database per run
    /// in it); default: a scratch server of this machine's PostgreSQL.
    #[arg(long)]
    database_url: Option<String>,
    /// The kilnd binary (default: `kilnd` beside this `kiln`).
    #[arg(long)]
    kilnd: Option<PathBuf>,
    /// Compile workers per node.
    #[arg(long, default_value_t = 1)]
    compile_workers: usize,
    /// Give up on a run after this many seconds.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
    /// A short run that checks the benchmark works (CI), not how fast.
    #[arg(long)]
    smoke: bool,
}

/// The benchmark's problem: y = 2x over 1024 floats, host backend.
const PROBLEM: &str = r#"
name = "bench-cluster-double"
summary = "y = 2x (kiln bench cluster)"
[[tensor]]
name = "x"
dtype = "f32"
shape = [1024]
role = "input"
[[tensor]]
name = "y"
dtype = "f32"
shape = [1024]
role = "output"
[tolerance]
atol = 1e-6
rtol = 1e-6
[reference.host]
file = "reference.c"
source = "void ref(const float *x, float *y, int n) { for (int i = 0; i < n; i++) y[i] = 2.0f * x[i]; }\n"
launches = [{ kernel = "ref", args = ["x", "y", { i32 = 1024 }] }]
"#;

/// A node of the benchmark's cluster; killed when dropped.
struct Node {
    socket: PathBuf,
    child: Child,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where the database is: a scratch server, or the one given.
enum Database {
    Scratch(ScratchDb),
    Given(String),
}

impl Database {
    fn url(&self, db: &str) -> Result<String> {
        match self {
            Database::Scratch(s) => Ok(s.url(db)),
            Database::Given(base) => {
                let mut cfg: tokio_postgres::Config =
                    base.parse().context("--database-url does not parse")?;
                cfg.dbname(db);
                let host = cfg
                    .get_hosts()
                    .first()
                    .map(|h| match h {
                        tokio_postgres::config::Host::Tcp(t) => t.clone(),
                        tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
                    })
                    .unwrap_or_else(|| "localhost".into());
                let port = cfg.get_ports().first().copied().unwrap_or(5432);
                let user = cfg.get_user().unwrap_or("kiln");
                let pass = cfg
                    .get_password()
                    .map(|p| format!(":{}", String::from_utf8_lossy(p)))
                    .unwrap_or_default();
                Ok(format!("postgres://{user}{pass}@{host}:{port}/{db}"))
            }
        }
    }
}

/// Runs SQL on the run's database; the rows.
async fn sql(url: &str, q: &str) -> Result<Vec<tokio_postgres::Row>> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .context("cannot connect to the benchmark's database")?;
    tokio::spawn(conn);
    client.query(q, &[]).await.context("benchmark query")
}

async fn create_database(db: &Database, name: &str) -> Result<()> {
    match db {
        Database::Scratch(s) => s.create_database(name).map_err(anyhow::Error::msg),
        Database::Given(_) => {
            sql(&db.url("postgres")?, &format!("CREATE DATABASE {name}")).await?;
            Ok(())
        }
    }
}

/// CPU seconds the database server used so far (scratch server: the postmaster and its
/// children, live and exited), when it can be read.
fn db_cpu_secs(db: &Database) -> Option<f64> {
    let Database::Scratch(s) = db else {
        return None;
    };
    let root = s.pid()?;
    let tick = 100.0; // USER_HZ on Linux
    let fields = |pid: u32| -> Option<Vec<String>> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = stat.rsplit_once(')')?.1;
        Some(rest.split_whitespace().map(str::to_string).collect())
    };
    // After ")": state ppid ... utime(12) stime(13) cutime(14) cstime(15), 0-based from state.
    let f = fields(root)?;
    let num = |v: &[String], i: usize| v.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    let mut total = num(&f, 11) + num(&f, 12) + num(&f, 13) + num(&f, 14);
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(v) = fields(pid)
            && v.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(root)
        {
            total += num(&v, 11) + num(&v, 12);
        }
    }
    Some(total / tick)
}

fn node_config(url: &str, node: &str, workers: usize) -> String {
    format!(
        r#"
[evaluation]
trials = 2
run_timeout_ms = 2000
[evaluation.timing]
warmup = 1
min_samples = 5
min_time_ms = 2.0
max_rse = 0.05
max_samples = 50
wall_cap_ms = 100.0
[queue]
compile_workers = {workers}
[cluster]
database_url = "{url}"
node_id = "{node}"
gpu_class = "bench"
lease_secs = 10.0
heartbeat_secs = 2.0
reaper_secs = 2.0
poll_ms = 200
calibrate_every_secs = 0
"#
    )
}

fn start_node(kilnd: &Path, dir: &Path, url: &str, name: &str, workers: usize) -> Result<Node> {
    let conf = dir.join(format!("{name}.toml"));
    std::fs::write(&conf, node_config(url, name, workers))?;
    let socket = dir.join(format!("{name}.sock"));
    let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
    let child = Command::new(kilnd)
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(dir.join(name))
        .arg("--config")
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot start {}", kilnd.display()))?;
    Ok(Node { socket, child })
}

async fn wait_ready(node: &mut Node, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let c = Client::new(&node.socket);
    loop {
        if c.get("/v1/health").await.is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = node.child.try_wait() {
            bail!("a kilnd node exited with {status} at start (its log is beside its socket)");
        }
        if Instant::now() > deadline {
            bail!(
                "a kilnd node did not come up within {} s",
                timeout.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sums a metric's samples over the nodes' `/metrics`.
async fn metric_sum(nodes: &[Node], name: &str) -> f64 {
    let mut total = 0.0;
    for n in nodes {
        if let Ok(text) = Client::new(&n.socket).get_text("/metrics").await {
            for line in text.lines() {
                if let Some(rest) = line.strip_prefix(name)
                    && (rest.starts_with('{') || rest.starts_with(' '))
                    && let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok())
                {
                    total += v;
                }
            }
        }
    }
    total
}

/// One run with `n` nodes.
async fn run_once(
    a: &ClusterArgs,
    db: &Database,
    kilnd: &Path,
    n: usize,
    count: usize,
) -> Result<Value> {
    let name = format!(
        "bench_{n}_{}",
        common::run_tag().to_lowercase().replace('-', "_")
    );
    create_database(db, &name).await?;
    let url = db.url(&name)?;
    let dir = tempfile::Builder::new()
        .prefix("kiln-bench-cluster-")
        .tempdir()?;
    let mut nodes = Vec::new();
    for i in 1..=n {
        nodes.push(start_node(
            kilnd,
            dir.path(),
            &url,
            &format!("node{i}"),
            a.compile_workers,
        )?);
    }
    for node in &mut nodes {
        wait_ready(node, Duration::from_secs(90)).await?;
    }
    let first = Client::new(&nodes[0].socket);
    let spec = kiln_types::ProblemSpec::from_toml(PROBLEM).context("the built-in problem")?;
    first
        .post("/v1/problems", &serde_json::to_value(&spec)?)
        .await?;
    let tag = common::run_tag();
    let cpu0 = db_cpu_secs(db);
    let commits = async || -> Result<i64> {
        let rows = sql(
            &url,
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
        )
        .await?;
        Ok(rows.first().map(|r| r.get::<_, i64>(0)).unwrap_or(0))
    };
    let commits0 = commits().await?;
    let t0 = Instant::now();
    let sockets: Vec<PathBuf> = nodes.iter().map(|n| n.socket.clone()).collect();
    let mut set = tokio::task::JoinSet::new();
    let in_flight = a.in_flight.max(1);
    for w in 0..in_flight {
        let sockets = sockets.clone();
        let tag = tag.clone();
        let timeout = Duration::from_secs(a.timeout);
        set.spawn(async move {
            let mut done = Vec::new();
            for i in (w..count).step_by(in_flight) {
                let c = Client::new(&sockets[i % sockets.len()]);
                let cand = json!({
                    "problem": "bench-cluster-double", "language": "c",
                    "source": format!("void k(const float *x, float *y, int n) {{ /* {tag} {i} */ for (int i = 0; i < n; i++) y[i] = 2.0f * x[i]; }}\n"),
                    "launches": [{"kernel": "k", "args": ["x", "y", {"i32": 1024}]}],
                });
                let (_, r) = c.post("/v1/candidates", &cand).await?;
                let job = r["job_id"].as_i64().context("no job id")?;
                done.push(common::wait_job(&c, job, timeout).await?);
            }
            anyhow::Ok(done)
        });
    }
    let mut jobs = Vec::new();
    while let Some(r) = set.join_next().await {
        jobs.extend(r.context("a submitter")??);
    }
    let wall = t0.elapsed().as_secs_f64();
    let failed = jobs.iter().filter(|j| j["state"] != "done").count();
    let queue_wait: Vec<f64> = jobs
        .iter()
        .filter_map(|j| Some(j["started_at"].as_f64()? - j["created_at"].as_f64()?))
        .collect();
    let claims = metric_sum(&nodes, "kiln_node_claims_total").await;
    let claim_secs = metric_sum(&nodes, "kiln_node_claim_seconds_sum").await;
    let per_node = sql(
        &url,
        "SELECT node, count(*) FROM evaluations GROUP BY node ORDER BY node",
    )
    .await?
    .iter()
    .map(|r| {
        (
            r.get::<_, Option<String>>(0).unwrap_or_default(),
            r.get::<_, i64>(1),
        )
    })
    .collect::<Vec<_>>();
    // Stopped nodes close their sessions: the server then has their statistics and
    // their backends' CPU time (the teardown's few idle seconds are in it too).
    drop(nodes);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let cpu = match (cpu0, db_cpu_secs(db)) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    let commits = commits().await? - commits0;
    let evals = jobs.len() - failed;
    Ok(json!({
        "nodes": n,
        "candidates": count,
        "failed": failed,
        "wall_s": wall,
        "evaluations_per_minute": evals as f64 / wall * 60.0,
        "claim_statement_ms_mean": if claims > 0.0 { claim_secs / claims * 1e3 } else { 0.0 },
        "claim_statements": claims,
        "queue_wait_ms": common::summary(&queue_wait),
        "db_cpu_s": cpu,
        "db_cpu_ms_per_evaluation": cpu.map(|c| c / evals.max(1) as f64 * 1e3),
        "db_commits_per_evaluation": commits as f64 / evals.max(1) as f64,
        "evaluations_per_node": per_node.into_iter().map(|(n, c)| json!({"node": n, "evaluations": c})).collect::<Vec<_>>(),
    }))
}

/// Runs the benchmark and prints its report.
pub async fn run(out: Output, a: ClusterArgs) -> Result<std::process::ExitCode> {
    let counts: Vec<usize> = if a.nodes.is_empty() {
        if a.smoke { vec![1, 2] } else { vec![1, 2, 3] }
    } else {
        a.nodes.clone()
    };
    if counts.contains(&0) {
        bail!("--nodes: each count must be at least 1");
    }
    let count = a
        .candidates
        .unwrap_or(if a.smoke { 12 } else { 200 })
        .max(1);
    let kilnd = match &a.kilnd {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .map(|d| d.join("kilnd"))
            .context("cannot find kilnd beside kiln; give --kilnd")?,
    };
    if !kilnd.is_file() {
        bail!("{} is not a file; give --kilnd", kilnd.display());
    }
    let db = match &a.database_url {
        Some(u) => Database::Given(u.clone()),
        None => Database::Scratch(ScratchDb::start().map_err(anyhow::Error::msg)?),
    };
    let mut runs = Vec::new();
    for &n in &counts {
        if out == Output::Text {
            eprintln!("kiln bench cluster: {n} node(s), {count} candidates…");
        }
        runs.push(run_once(&a, &db, &kilnd, n, count).await?);
    }
    let report = json!({
        "bench": "cluster",
        "smoke": a.smoke,
        "backend": "host",
        "machine_cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "database": match &db { Database::Scratch(_) => "scratch PostgreSQL on this machine (fsync off)", Database::Given(_) => "the given server" },
        "runs": runs,
    });
    if out == Output::Json {
        print_json(&report);
    } else {
        println!(
            "kiln bench cluster — host backend, {count} candidates per run, {} CPUs shared by every node and the database",
            report["machine_cpus"]
        );
        println!(
            "{:>5} {:>10} {:>13} {:>12} {:>12} {:>14} {:>13}",
            "nodes",
            "evals/min",
            "claim ms avg",
            "wait p50 ms",
            "wait p90 ms",
            "db cpu ms/eval",
            "commits/eval"
        );
        for r in &runs {
            let w: Summary = serde_json::from_value(r["queue_wait_ms"].clone()).unwrap_or_default();
            println!(
                "{:>5} {:>10.0} {:>13.2} {:>12.0} {:>12.0} {:>14} {:>13.1}",
                r["nodes"],
                r["evaluations_per_minute"].as_f64().unwrap_or(0.0),
                r["claim_statement_ms_mean"].as_f64().unwrap_or(0.0),
                w.p50,
                w.p90,
                r["db_cpu_ms_per_evaluation"]
                    .as_f64()
                    .map_or("-".into(), |v| format!("{v:.2}")),
                r["db_commits_per_evaluation"].as_f64().unwrap_or(0.0),
            );
        }
    }
    let failed: u64 = runs.iter().filter_map(|r| r["failed"].as_u64()).sum();
    Ok(if failed == 0 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}
