//! Prometheus metrics: request counters kept in memory, queue and verdict figures read
//! from the store when scraped, each evaluation lane's busy time (fed by the scheduler
//! through [`add_lane_busy`]), the CUDA compiles' precompiled headers (the sandbox's
//! counts), and this node's own figures (claims and their latency,
//! writes fenced out, leases reaped, heartbeats missed, whether it claims), labelled with
//! the node's id so a cluster's scrapes can be told apart.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::store::{LaneClass, Store};

/// This node's counters (process-wide, like the lanes' busy time).
struct NodeCounters {
    claims: AtomicU64,
    claimed: AtomicU64,
    claim_micros: AtomicU64,
    claim_max_micros: AtomicU64,
    fenced: AtomicU64,
    store_unavailable: AtomicU64,
    reaped_requeued: AtomicU64,
    reaped_failed: AtomicU64,
    heartbeat_failures: AtomicU64,
    remote_finished: AtomicU64,
}

static NODE: NodeCounters = NodeCounters {
    claims: AtomicU64::new(0),
    claimed: AtomicU64::new(0),
    claim_micros: AtomicU64::new(0),
    claim_max_micros: AtomicU64::new(0),
    fenced: AtomicU64::new(0),
    store_unavailable: AtomicU64::new(0),
    reaped_requeued: AtomicU64::new(0),
    reaped_failed: AtomicU64::new(0),
    heartbeat_failures: AtomicU64::new(0),
    remote_finished: AtomicU64::new(0),
};

/// One claim statement took `secs`; `hit` when it returned a job.
pub fn observe_claim(secs: f64, hit: bool) {
    let micros = if secs.is_finite() && secs > 0.0 {
        (secs * 1e6) as u64
    } else {
        0
    };
    NODE.claims.fetch_add(1, Ordering::Relaxed);
    if hit {
        NODE.claimed.fetch_add(1, Ordering::Relaxed);
    }
    NODE.claim_micros.fetch_add(micros, Ordering::Relaxed);
    NODE.claim_max_micros.fetch_max(micros, Ordering::Relaxed);
}

/// A write of this node was refused: its lease had been taken over.
pub fn count_fenced() {
    NODE.fenced.fetch_add(1, Ordering::Relaxed);
}

/// A job went back to the queue because the database stayed out of reach.
pub fn count_store_unavailable() {
    NODE.store_unavailable.fetch_add(1, Ordering::Relaxed);
}

/// This node's reaper queued again or failed jobs whose lease ran out.
pub fn count_reaped(requeued: usize, failed: usize) {
    NODE.reaped_requeued
        .fetch_add(requeued as u64, Ordering::Relaxed);
    NODE.reaped_failed
        .fetch_add(failed as u64, Ordering::Relaxed);
}

/// A heartbeat could not reach the database.
pub fn count_heartbeat_failure() {
    NODE.heartbeat_failures.fetch_add(1, Ordering::Relaxed);
}

/// Jobs another node finished were relayed to this node's event bus.
pub fn count_remote_finished(n: usize) {
    NODE.remote_finished.fetch_add(n as u64, Ordering::Relaxed);
}

/// What the node figures are labelled with and whether the node claims.
pub struct NodeView<'a> {
    /// Node id.
    pub id: &'a str,
    /// Its lanes' classes (empty: a gateway).
    pub classes: &'a [LaneClass],
    /// Why it does not claim, if it does not.
    pub paused: Option<String>,
    /// Whether it is part of a cluster.
    pub clustered: bool,
}

/// Seconds each evaluation lane spent evaluating, by (backend, lane). Process-wide, since
/// the scheduler that feeds it and the API that renders it are built apart.
static LANE_BUSY: Mutex<BTreeMap<(String, usize), f64>> = Mutex::new(BTreeMap::new());

/// Lists a lane (at zero busy time) so it is counted before its first evaluation.
pub fn register_lane(backend: &str, lane: usize) {
    let mut map = LANE_BUSY.lock().unwrap_or_else(|p| p.into_inner());
    map.entry((backend.to_string(), lane)).or_default();
}

/// Adds `secs` of evaluation to a lane's busy time (`kiln_lane_busy_seconds_total`).
pub fn add_lane_busy(backend: &str, lane: usize, secs: f64) {
    if !(secs.is_finite() && secs > 0.0) {
        return;
    }
    let mut map = LANE_BUSY.lock().unwrap_or_else(|p| p.into_inner());
    *map.entry((backend.to_string(), lane)).or_default() += secs;
}

/// Seconds lane `lane` of `backend` has spent evaluating so far.
pub fn lane_busy_seconds(backend: &str, lane: usize) -> f64 {
    let map = LANE_BUSY.lock().unwrap_or_else(|p| p.into_inner());
    map.get(&(backend.to_string(), lane))
        .copied()
        .unwrap_or(0.0)
}

/// In-memory counters.
#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
    refused: std::sync::atomic::AtomicU64,
}

impl Metrics {
    /// Counts one answered request.
    pub fn request(&self, method: &str, route: &str, status: u16) {
        let mut map = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        *map.entry((method.to_string(), route.to_string(), status))
            .or_default() += 1;
    }

    /// Counts one connection refused by the allow-list.
    pub fn refused(&self) {
        self.refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Renders the Prometheus text exposition format.
    pub async fn render(&self, store: &Store, node: &NodeView<'_>) -> String {
        let mut out = String::new();
        render_node(&mut out, node);
        out.push_str(
            "# HELP kiln_requests_total API requests answered, by method, route and status.\n",
        );
        out.push_str("# TYPE kiln_requests_total counter\n");
        {
            let map = self.requests.lock().unwrap_or_else(|p| p.into_inner());
            for ((method, route, status), n) in map.iter() {
                let _ = writeln!(
                    out,
                    "kiln_requests_total{{method=\"{method}\",route=\"{}\",status=\"{status}\"}} {n}",
                    escape(route)
                );
            }
        }
        out.push_str(
            "# HELP kiln_refused_connections_total Connections refused by the peer allow-list.\n",
        );
        out.push_str("# TYPE kiln_refused_connections_total counter\n");
        let _ = writeln!(
            out,
            "kiln_refused_connections_total {}",
            self.refused.load(std::sync::atomic::Ordering::Relaxed)
        );
        out.push_str(
            "# HELP kiln_lane_busy_seconds_total Seconds each evaluation lane spent evaluating.\n",
        );
        out.push_str("# TYPE kiln_lane_busy_seconds_total counter\n");
        {
            let map = LANE_BUSY.lock().unwrap_or_else(|p| p.into_inner());
            for ((backend, lane), secs) in map.iter() {
                let _ = writeln!(
                    out,
                    "kiln_lane_busy_seconds_total{{backend=\"{}\",lane=\"{lane}\"}} {secs}",
                    escape(backend)
                );
            }
        }
        {
            let pch = kiln_sandbox::engine::cuda::pch::counts();
            out.push_str(
                "# HELP kiln_cuda_pch_total CUDA compiles given a precompiled header (used or not) and precompiled headers built (or failed), since start.\n",
            );
            out.push_str("# TYPE kiln_cuda_pch_total counter\n");
            for (what, n) in [
                ("used", pch.used),
                ("not_used", pch.not_used),
                ("built", pch.built),
                ("build_failed", pch.build_failed),
            ] {
                let _ = writeln!(out, "kiln_cuda_pch_total{{outcome=\"{what}\"}} {n}");
            }
        }
        match store.job_counts().await {
            Ok(counts) => {
                out.push_str("# HELP kiln_jobs Jobs in the store, by state (running: evaluating on a lane).\n");
                out.push_str("# TYPE kiln_jobs gauge\n");
                for (state, n) in &counts {
                    let _ = writeln!(out, "kiln_jobs{{state=\"{}\"}} {n}", state.as_str());
                }
                let queued: i64 = counts
                    .iter()
                    .filter(|(s, _)| s.is_waiting())
                    .map(|(_, n)| n)
                    .sum();
                out.push_str(
                    "# HELP kiln_queue_depth Jobs not yet evaluating: queued, compiling, or compiled and waiting for a lane.\n",
                );
                out.push_str("# TYPE kiln_queue_depth gauge\n");
                let _ = writeln!(out, "kiln_queue_depth {queued}");
            }
            Err(e) => tracing::warn!(error = %e, "metrics: cannot read job counts"),
        }
        match store.verdict_counts().await {
            Ok(counts) => {
                out.push_str("# HELP kiln_evaluations_total Evaluations stored, by verdict.\n");
                out.push_str("# TYPE kiln_evaluations_total counter\n");
                for (verdict, n) in counts {
                    let _ = writeln!(
                        out,
                        "kiln_evaluations_total{{verdict=\"{}\"}} {n}",
                        escape(&verdict)
                    );
                }
            }
            Err(e) => tracing::warn!(error = %e, "metrics: cannot read verdict counts"),
        }
        out
    }
}

fn render_node(out: &mut String, node: &NodeView<'_>) {
    let id = escape(node.id);
    out.push_str("# HELP kiln_node_info This node: its id, whether it is in a cluster, and each lane class.\n");
    out.push_str("# TYPE kiln_node_info gauge\n");
    if node.classes.is_empty() {
        let _ = writeln!(
            out,
            "kiln_node_info{{node=\"{id}\",clustered=\"{}\",class=\"\"}} 1",
            node.clustered
        );
    }
    for c in node.classes {
        let _ = writeln!(
            out,
            "kiln_node_info{{node=\"{id}\",clustered=\"{}\",class=\"{}\"}} 1",
            node.clustered,
            escape(&c.class)
        );
    }
    out.push_str("# HELP kiln_node_claiming 1 while this node claims jobs; 0 with the reason (a gateway, a drifted calibration).\n");
    out.push_str("# TYPE kiln_node_claiming gauge\n");
    let reason = match (&node.paused, node.classes.is_empty()) {
        (Some(r), _) => r.clone(),
        (None, true) => "no lanes (gateway)".to_string(),
        (None, false) => String::new(),
    };
    let _ = writeln!(
        out,
        "kiln_node_claiming{{node=\"{id}\",reason=\"{}\"}} {}",
        escape(&reason),
        u8::from(reason.is_empty())
    );
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let counters: [(&str, &str, u64); 8] = [
        (
            "kiln_node_claims_total",
            "Claim statements this node ran.",
            load(&NODE.claims),
        ),
        (
            "kiln_node_claimed_total",
            "Jobs this node claimed.",
            load(&NODE.claimed),
        ),
        (
            "kiln_node_fenced_total",
            "Writes of this node refused because its lease had been taken over.",
            load(&NODE.fenced),
        ),
        (
            "kiln_node_jobs_given_back_total",
            "Jobs this node queued again (uncounted) because the database stayed out of reach.",
            load(&NODE.store_unavailable),
        ),
        (
            "kiln_node_reaped_requeued_total",
            "Jobs with an expired lease this node's reaper queued again.",
            load(&NODE.reaped_requeued),
        ),
        (
            "kiln_node_reaped_failed_total",
            "Jobs with an expired lease this node's reaper failed (attempts used up).",
            load(&NODE.reaped_failed),
        ),
        (
            "kiln_node_heartbeat_failures_total",
            "Heartbeats that could not reach the database.",
            load(&NODE.heartbeat_failures),
        ),
        (
            "kiln_node_remote_finished_total",
            "Jobs finished by other nodes and relayed to this node's events.",
            load(&NODE.remote_finished),
        ),
    ];
    for (name, help, v) in counters {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{node=\"{id}\"}} {v}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP kiln_node_claim_seconds Time of this node's claim statements.\n# TYPE kiln_node_claim_seconds summary\n\
         kiln_node_claim_seconds_sum{{node=\"{id}\"}} {}\nkiln_node_claim_seconds_count{{node=\"{id}\"}} {}",
        load(&NODE.claim_micros) as f64 / 1e6,
        load(&NODE.claims)
    );
    let _ = writeln!(
        out,
        "# HELP kiln_node_claim_seconds_max Slowest claim statement of this node.\n# TYPE kiln_node_claim_seconds_max gauge\n\
         kiln_node_claim_seconds_max{{node=\"{id}\"}} {}",
        load(&NODE.claim_max_micros) as f64 / 1e6
    );
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
