//! Cluster members on PostgreSQL: registration (one live process per node id), the
//! heartbeat that renews the node's row and every lease it holds, calibrations per GPU
//! class, and the cluster's status (nodes, classes, queue per class).

use serde::{Deserialize, Serialize};

use super::{PgStore, col};
use crate::store::{Result, StoreError, now_ms};

/// One kind of lane a node has: its backend, GPU class and how many.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeLane {
    /// Backend name.
    pub backend: String,
    /// GPU class.
    pub class: String,
    /// Lanes of this class on the node.
    pub lanes: usize,
    /// The device's name (`NVIDIA H200`, `host CPU`).
    pub device: String,
}

/// A node as the cluster sees it.
#[derive(Debug, Clone, Serialize)]
pub struct NodeInfo {
    /// Node id.
    pub id: String,
    /// kiln version it runs.
    pub version: String,
    /// When it started, ms since the epoch (its clock).
    pub started_at: i64,
    /// Seconds since its last heartbeat (database time).
    pub seen_secs_ago: f64,
    /// Heartbeat within the lease and not stopped.
    pub alive: bool,
    /// Stopped cleanly.
    pub stopped: bool,
    /// Its lanes.
    pub lanes: Vec<NodeLane>,
    /// Claims work (false: a gateway, or stopped claiming).
    pub evaluates: bool,
    /// May host searches' plugin hosts.
    pub runs_searches: bool,
    /// Why it stopped claiming after a calibration, if it did.
    pub drift: Option<String>,
    /// Jobs it holds now (compiling, compiled, running).
    pub held_jobs: i64,
    /// Searches whose plugin host it runs.
    pub hosted_searches: i64,
}

/// The queue of one GPU class.
#[derive(Debug, Clone, Serialize)]
pub struct ClassQueue {
    /// GPU class (`""`: jobs any class of their backend may take).
    pub class: String,
    /// Jobs waiting to be claimed.
    pub queued: i64,
    /// Jobs claimed and not yet evaluating (compiling or compiled).
    pub claimed: i64,
    /// Jobs evaluating.
    pub running: i64,
    /// Lanes of live, claiming nodes in this class.
    pub live_lanes: usize,
}

/// What `kiln cluster status` shows.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterStatus {
    /// This node's id.
    pub node: String,
    /// Every node that ever joined, alive first.
    pub nodes: Vec<NodeInfo>,
    /// The queue per class, with the capacity serving it.
    pub classes: Vec<ClassQueue>,
    /// Classes with queued jobs and no live lane to take them.
    pub queued_without_capacity: Vec<String>,
    /// The latest calibrations, per node and class.
    pub calibrations: Vec<Calibration>,
}

/// A node's calibration on its class: the median of the fixed calibration kernel.
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    /// Node id.
    pub node: String,
    /// GPU class.
    pub class: String,
    /// Median, µs.
    pub median_us: f64,
    /// When, ms since the epoch.
    pub measured_at: i64,
}

/// What one reaper pass did.
pub type Reaped = crate::store::Recovery;

impl PgStore {
    /// Joins the cluster: records this node, its lanes and roles. Refused when another
    /// live process already uses this node id (two nodes with one id would take each
    /// other's leases).
    pub async fn register_node(
        &self,
        lanes: &[NodeLane],
        evaluates: bool,
        runs_searches: bool,
    ) -> Result<()> {
        let lanes_json = serde_json::to_string(lanes).unwrap_or_else(|_| "[]".into());
        let row = self
            .row(
                "INSERT INTO nodes (id, instance, version, started_at, last_seen, lanes_json,
                                    evaluates, runs_searches, drift, stopped)
                 VALUES ($1, $2, $3, $4, now(), $5, $6, $7, NULL, false)
                 ON CONFLICT (id) DO UPDATE SET instance = $2, version = $3, started_at = $4,
                        last_seen = now(), lanes_json = $5, evaluates = $6, runs_searches = $7,
                        drift = NULL, stopped = false
                 WHERE nodes.stopped OR nodes.instance = $2
                    OR nodes.last_seen < now() - make_interval(secs => $8)
                 RETURNING id",
                &[
                    &self.node,
                    &self.instance,
                    &env!("CARGO_PKG_VERSION"),
                    &now_ms(),
                    &lanes_json,
                    &evaluates,
                    &runs_searches,
                    &self.lease(),
                ],
            )
            .await?;
        if row.is_none() {
            return Err(StoreError::Conflict(format!(
                "another kilnd with node id {:?} is alive in this cluster (its heartbeat is \
                 within the lease); give each node its own cluster.node_id",
                self.node
            )));
        }
        Ok(())
    }

    /// The heartbeat: this node's row and the leases of every job and search it holds
    /// are renewed. Returns the ids of the searches it still hosts; `Fenced` when another
    /// process took this node id over.
    pub async fn heartbeat(&self) -> Result<Vec<String>> {
        let n = self
            .exec(
                "UPDATE nodes SET last_seen = now() WHERE id = $1 AND instance = $2",
                &[&self.node, &self.instance],
            )
            .await?;
        if n == 0 {
            return Err(StoreError::Fenced(format!(
                "node id {:?} was taken over by another process",
                self.node
            )));
        }
        self.exec(
            "UPDATE jobs SET lease_until = now() + make_interval(secs => $2)
             WHERE node = $1 AND state IN ('compiling', 'compiled', 'running')
               AND lease_token IS NOT NULL",
            &[&self.node, &self.lease()],
        )
        .await?;
        let refunded = self.give_back_lapsed().await?;
        if refunded > 0 {
            tracing::warn!(
                jobs = refunded,
                "this node was late with its heartbeat and lost leases it held; those jobs run again elsewhere, and their attempts were given back"
            );
        }
        self.renew_search_leases().await
    }

    /// Gives back the attempts of jobs whose lease this process let lapse while it was
    /// alive (its heartbeat came back): a slow node is not a dead one, and only deaths
    /// count against a job. Returns how many jobs got attempts back.
    pub async fn give_back_lapsed(&self) -> Result<u64> {
        self.exec(
            "UPDATE jobs SET
                 attempts = greatest(attempts
                     - (SELECT count(*) FROM unnest(lapsed) AS l(i) WHERE l.i = $1)::int, 0),
                 lapsed = array_remove(lapsed, $1)
             WHERE cardinality(lapsed) > 0 AND $1 = ANY(lapsed)
               AND state NOT IN ('done', 'failed')",
            &[&self.instance],
        )
        .await
    }

    /// Says why this node stopped claiming (`None`: it claims again).
    pub async fn set_drift(&self, drift: Option<&str>) -> Result<()> {
        self.exec(
            "UPDATE nodes SET drift = $2 WHERE id = $1 AND instance = $3",
            &[&self.node, &drift, &self.instance],
        )
        .await?;
        Ok(())
    }

    /// Leaves the cluster cleanly (a stopping kilnd): the row stays, marked stopped.
    pub async fn deregister(&self) -> Result<()> {
        self.exec(
            "UPDATE nodes SET stopped = true WHERE id = $1 AND instance = $2",
            &[&self.node, &self.instance],
        )
        .await?;
        Ok(())
    }

    /// Records this node's calibration on `class`; returns the median of the latest
    /// calibrations of the class's live nodes (this one included) and how many there are.
    pub async fn record_calibration(&self, class: &str, median_us: f64) -> Result<(f64, usize)> {
        self.exec(
            "INSERT INTO calibrations (node, gpu_class, median_us, measured_at)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (node, gpu_class) DO UPDATE SET median_us = $3, measured_at = $4",
            &[&self.node, &class, &median_us, &now_ms()],
        )
        .await?;
        let row = self
            .row(
                "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY c.median_us) AS m,
                        count(*) AS n
                 FROM calibrations c JOIN nodes n ON n.id = c.node
                 WHERE c.gpu_class = $1 AND NOT n.stopped
                   AND n.last_seen >= now() - make_interval(secs => $2)",
                &[&class, &self.lease()],
            )
            .await?;
        let (m, n) = match row {
            Some(r) => (
                col::<Option<f64>>(&r, "m")?.unwrap_or(median_us),
                usize::try_from(col::<i64>(&r, "n")?).unwrap_or(0),
            ),
            None => (median_us, 1),
        };
        Ok((m, n))
    }

    /// Classes of the live nodes that claim work, with their lane counts.
    pub async fn live_lanes(&self) -> Result<Vec<NodeLane>> {
        let rows = self
            .rows(
                "SELECT lanes_json FROM nodes
                 WHERE NOT stopped AND evaluates AND drift IS NULL
                   AND last_seen >= now() - make_interval(secs => $1)",
                &[&self.lease()],
            )
            .await?;
        let mut out: Vec<NodeLane> = Vec::new();
        for r in &rows {
            let json: String = col(r, "lanes_json")?;
            for l in serde_json::from_str::<Vec<NodeLane>>(&json).unwrap_or_default() {
                match out.iter_mut().find(|o| o.class == l.class) {
                    Some(o) => o.lanes += l.lanes,
                    None => out.push(l),
                }
            }
        }
        out.sort_by(|a, b| b.lanes.cmp(&a.lanes).then(a.class.cmp(&b.class)));
        Ok(out)
    }

    /// Nodes, classes, leases and the queue per class.
    pub async fn cluster_status(&self) -> Result<ClusterStatus> {
        let rows = self
            .rows(
                "SELECT n.id, n.version, n.started_at, n.lanes_json, n.evaluates, n.runs_searches,
                        n.drift, n.stopped,
                        extract(epoch FROM now() - n.last_seen)::float8 AS ago,
                        (SELECT count(*) FROM jobs j WHERE j.node = n.id
                           AND j.state IN ('compiling', 'compiled', 'running')) AS held,
                        (SELECT count(*) FROM searches s WHERE s.host_node = n.id
                           AND s.state = 'running') AS hosted
                 FROM nodes n ORDER BY n.stopped, n.id",
                &[],
            )
            .await?;
        let lease = self.lease();
        let mut nodes = Vec::new();
        for r in &rows {
            let json: String = col(r, "lanes_json")?;
            let ago: f64 = col(r, "ago")?;
            let stopped: bool = col(r, "stopped")?;
            nodes.push(NodeInfo {
                id: col(r, "id")?,
                version: col(r, "version")?,
                started_at: col(r, "started_at")?,
                seen_secs_ago: ago,
                alive: !stopped && ago <= lease,
                stopped,
                lanes: serde_json::from_str(&json).unwrap_or_default(),
                evaluates: col(r, "evaluates")?,
                runs_searches: col(r, "runs_searches")?,
                drift: col(r, "drift")?,
                held_jobs: col(r, "held")?,
                hosted_searches: col(r, "hosted")?,
            });
        }
        let live = self.live_lanes().await?;
        let rows = self
            .rows(
                "SELECT gpu_class,
                        count(*) FILTER (WHERE state = 'queued') AS queued,
                        count(*) FILTER (WHERE state IN ('compiling', 'compiled')) AS claimed,
                        count(*) FILTER (WHERE state = 'running') AS running
                 FROM jobs WHERE state NOT IN ('done', 'failed')
                 GROUP BY gpu_class ORDER BY gpu_class",
                &[],
            )
            .await?;
        let mut classes = Vec::new();
        for r in &rows {
            let class: String = col(r, "gpu_class")?;
            let live_lanes = live
                .iter()
                .filter(|l| l.class == class || class.is_empty())
                .map(|l| l.lanes)
                .sum();
            classes.push(ClassQueue {
                queued: col(r, "queued")?,
                claimed: col(r, "claimed")?,
                running: col(r, "running")?,
                live_lanes,
                class,
            });
        }
        let queued_without_capacity = classes
            .iter()
            .filter(|c| c.queued > 0 && c.live_lanes == 0)
            .map(|c| c.class.clone())
            .collect();
        let rows = self
            .rows(
                "SELECT node, gpu_class, median_us, measured_at FROM calibrations
                 ORDER BY gpu_class, node",
                &[],
            )
            .await?;
        let calibrations = rows
            .iter()
            .map(|r| {
                Ok(Calibration {
                    node: col(r, "node")?,
                    class: col(r, "gpu_class")?,
                    median_us: col(r, "median_us")?,
                    measured_at: col(r, "measured_at")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ClusterStatus {
            node: self.node.clone(),
            nodes,
            classes,
            queued_without_capacity,
            calibrations,
        })
    }
}
