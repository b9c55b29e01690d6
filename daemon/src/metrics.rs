//! Prometheus metrics: request counters kept in memory, queue and verdict figures read
//! from the store when scraped, and each evaluation lane's busy time (fed by the
//! scheduler through [`add_lane_busy`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use crate::store::Store;

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
    pub fn render(&self, store: &Store) -> String {
        let mut out = String::new();
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
        match store.job_counts() {
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
        match store.verdict_counts() {
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

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
