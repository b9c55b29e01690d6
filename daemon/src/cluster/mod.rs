//! Cluster membership: what a kilnd does besides its own work when it shares a
//! PostgreSQL database with other nodes (`[cluster] database_url`).
//!
//! - [`join`]: connects (retrying while the database is not up yet), migrates, registers
//!   the node (refused when another live process uses its id) and queues again the jobs
//!   this node held when it last stopped;
//! - [`Membership::run`]: the node's loops until it stops —
//!   - heartbeat: renews the node's row and the leases of every job and search it holds,
//!     and stops the plugin hosts of searches another node took over;
//!   - reaper: queues again (or fails after `queue.max_attempts`) jobs whose lease ran
//!     out, on every node, and takes over searches whose host died;
//!   - relay: jobs other nodes finished reach this node's event bus (SSE, long polls, the
//!     plugin hosts' waits, search progress), woken by `LISTEN` with a poll fallback;
//!     jobs queued anywhere wake this node's dispatcher;
//!   - calibration: times a fixed kernel per lane class when joining and then every
//!     `calibrate_every_secs`; a node further than `drift_threshold` from its class's
//!     median stops claiming and says why (metrics, `kiln doctor`, `kiln cluster status`).
//! - [`class`]: the GPU classes of this node's lanes.
//! - [`scratch_db`]: a throwaway PostgreSQL server for tests and `kiln bench cluster`.

pub mod class;
pub mod scratch_db;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::events::{Event, EventBus};
use crate::sched::Scheduler;
use crate::search::Supervisor;
use crate::store::StoreError;
use crate::store::postgres::{FINISHED_CHANNEL, NodeLane, PgSettings, PgStore, QUEUED_CHANNEL};

/// How many finish numbers back each relay pass looks again, for transactions that
/// committed after a later number was already seen.
const RELAY_WINDOW: i64 = 256;

/// This node's id: `[cluster] node_id`, else the host name.
pub fn node_id(config: &Config) -> String {
    if !config.cluster.node_id.is_empty() {
        return config.cluster.node_id.clone();
    }
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "kilnd".into())
}

/// Connects to the cluster's database, migrating it, and joins: registers this node and
/// queues again what it held when it stopped. Retries while the database is unreachable,
/// for up to `patience`.
pub async fn join(
    config: &Config,
    node: &str,
    lanes: &[NodeLane],
    patience: Duration,
) -> Result<PgStore, StoreError> {
    let settings = PgSettings {
        url: config.cluster.database_url.clone(),
        node: node.to_string(),
        lease_secs: config.cluster.lease_secs,
        pool_size: config.cluster.pool_size,
        max_attempts: config.queue.max_attempts,
        ca_file: config.cluster.ca_file.clone(),
    };
    let deadline = tokio::time::Instant::now() + patience;
    let pg = loop {
        match PgStore::connect(&settings).await {
            Ok(pg) => break pg,
            Err(StoreError::Unavailable(why)) if tokio::time::Instant::now() < deadline => {
                tracing::warn!(reason = %why, "the cluster's database is not reachable yet; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let evaluates = config.cluster.evaluate && !lanes.is_empty();
    // A node restarted right after a crash finds its old registration still within the
    // lease: wait for the lease to run out (then the old process is surely gone).
    loop {
        match pg
            .register_node(lanes, evaluates, config.cluster.run_searches)
            .await
        {
            Ok(()) => break,
            Err(StoreError::Conflict(why) | StoreError::Unavailable(why))
                if tokio::time::Instant::now() < deadline =>
            {
                tracing::warn!(reason = %why, "cannot register this node yet; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e),
        }
    }
    let recovery = pg.recover_interrupted(config.queue.max_attempts).await?;
    if recovery.waiting + recovery.requeued + recovery.failed > 0 {
        tracing::warn!(
            waiting = recovery.waiting,
            requeued = recovery.requeued,
            failed = recovery.failed,
            "queued again the jobs this node held when it last stopped"
        );
    }
    tracing::info!(node, lanes = ?lanes, evaluates, "joined the cluster");
    Ok(pg)
}

/// The cluster side of a running node.
pub struct Membership {
    /// The scheduler (claims pause on drift; calibration uses its lanes).
    pub sched: Arc<Scheduler>,
    /// Runs plugin hosts (takes over searches, drops lost ones).
    pub supervisor: Arc<Supervisor>,
    /// Where relayed events go.
    pub events: EventBus,
    /// Configuration in force.
    pub config: Config,
    /// This node's lanes and classes.
    pub lanes: Vec<NodeLane>,
}

impl Membership {
    /// Runs the node's cluster loops until `stop`, then leaves the cluster (the node is
    /// marked stopped; its leases were released by the scheduler's drain).
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let Some(_) = self.sched.store.cluster() else {
            return;
        };
        let loops = [
            tokio::spawn(self.clone().heartbeat(stop.clone())),
            tokio::spawn(self.clone().reaper(stop.clone())),
            tokio::spawn(self.clone().relay(stop.clone())),
            tokio::spawn(self.clone().calibration(stop.clone())),
        ];
        for l in loops {
            let _ = l.await;
        }
    }

    fn pg(&self) -> &PgStore {
        // `run` returns at once without a cluster store; the loops only run with one.
        self.sched
            .store
            .cluster()
            .unwrap_or_else(|| unreachable!("cluster loops run only in a cluster"))
    }

    async fn heartbeat(self: Arc<Self>, stop: CancellationToken) {
        let every = Duration::from_secs_f64(self.config.cluster.heartbeat_secs);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => break,
            }
            let beat = tokio::select! {
                b = self.pg().heartbeat() => b,
                _ = stop.cancelled() => break,
            };
            match beat {
                Ok(held) => {
                    let held: BTreeSet<String> = held.into_iter().collect();
                    for id in self.supervisor.hosted_started() {
                        if !held.contains(&id) {
                            self.supervisor.abandon(&id);
                        }
                    }
                }
                Err(StoreError::Fenced(why)) => {
                    tracing::error!(reason = %why, "this node's id was taken over; it stops claiming");
                    self.sched.pause_claims(Some(why));
                }
                Err(e) => {
                    crate::metrics::count_heartbeat_failure();
                    tracing::warn!(error = %e, "heartbeat failed; leases run out after cluster.lease_secs without one");
                }
            }
        }
    }

    async fn reaper(self: Arc<Self>, stop: CancellationToken) {
        let every = Duration::from_secs_f64(self.config.cluster.reaper_secs);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => break,
            }
            let reaped = tokio::select! {
                r = self.pg().reap_expired(self.config.queue.max_attempts) => r,
                _ = stop.cancelled() => break,
            };
            match reaped {
                Ok(r) if r.waiting + r.requeued + r.failed > 0 => {
                    crate::metrics::count_reaped(r.waiting + r.requeued, r.failed);
                    tracing::warn!(
                        waiting = r.waiting,
                        requeued = r.requeued,
                        failed = r.failed,
                        "reaped jobs whose lease ran out (their node stopped answering)"
                    );
                    self.sched.wake();
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "reaper pass failed"),
            }
            self.supervisor.resume_all().await;
        }
    }

    /// Relays jobs other nodes finished to this node's event bus.
    async fn relay(self: Arc<Self>, stop: CancellationToken) {
        let poll = Duration::from_millis(self.config.cluster.poll_ms);
        let mut last = loop {
            let seq = tokio::select! {
                s = self.pg().last_finish_seq() => s,
                _ = stop.cancelled() => return,
            };
            match seq {
                Ok(s) => break s,
                Err(e) => {
                    tracing::warn!(error = %e, "relay: cannot read the finish sequence yet");
                    tokio::select! {
                        _ = tokio::time::sleep(poll) => {}
                        _ = stop.cancelled() => return,
                    }
                }
            }
        };
        let mut seen: BTreeSet<i64> = BTreeSet::new();
        let mut listener: Option<(
            tokio_postgres::Client,
            tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>,
        )> = None;
        loop {
            if listener.is_none() {
                listener = tokio::select! {
                    l = self.listen() => l,
                    _ = stop.cancelled() => break,
                };
            }
            let notified = async {
                match listener.as_mut() {
                    Some((_, rx)) => rx.recv().await.map(|n| n.channel() == FINISHED_CHANNEL),
                    None => std::future::pending().await,
                }
            };
            // Whether finished jobs are to be read (a poll tick reads anyway).
            let mut finished = tokio::select! {
                n = notified => match n {
                    Some(finished) => finished,
                    None => { listener = None; true }
                },
                _ = tokio::time::sleep(poll) => true,
                _ = stop.cancelled() => break,
            };
            // Drain what else arrived meanwhile: one read serves them all.
            let mut queued = !finished;
            if let Some((_, rx)) = listener.as_mut() {
                while let Ok(n) = rx.try_recv() {
                    finished |= n.channel() == FINISHED_CHANNEL;
                    queued |= n.channel() == QUEUED_CHANNEL;
                }
            }
            if queued {
                // A job was queued somewhere: the dispatcher claims it if a lane fits.
                self.sched.wake();
            }
            if !finished {
                continue;
            }
            let read = tokio::select! {
                r = self.pg().finished_since(last - RELAY_WINDOW, 2000) => r,
                _ = stop.cancelled() => break,
            };
            match read {
                Ok(rows) => {
                    let mut relayed = 0;
                    let mut searches = BTreeSet::new();
                    for f in rows {
                        last = last.max(f.seq);
                        if !seen.insert(f.seq) {
                            continue;
                        }
                        if f.node.as_deref() == Some(self.pg().node()) {
                            continue; // published here when it finished
                        }
                        relayed += 1;
                        if let Some(s) = &f.search_id
                            && self.supervisor.hosts(s)
                        {
                            searches.insert(s.clone());
                        }
                        self.events.publish(Event::Job {
                            job_id: f.job_id,
                            candidate_id: f.candidate_id,
                            problem: f.problem,
                            state: f.state.as_str().to_string(),
                            lane: f.lane,
                            node: f.node,
                            verdict: f.verdict,
                            median_us: f.median_us,
                            error: f.error,
                        });
                    }
                    crate::metrics::count_remote_finished(relayed);
                    for s in searches {
                        self.supervisor.publish(&s).await;
                    }
                    let floor = last - RELAY_WINDOW;
                    seen = seen.split_off(&floor);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "relay: cannot read finished jobs");
                    listener = None;
                }
            }
        }
    }

    /// A connection listening for finished jobs, or `None` (the poll carries on).
    async fn listen(
        &self,
    ) -> Option<(
        tokio_postgres::Client,
        tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>,
    )> {
        match self.pg().dedicated().await {
            Ok((client, rx)) => match client
                .batch_execute(&format!(
                    "LISTEN {FINISHED_CHANNEL}; LISTEN {QUEUED_CHANNEL}"
                ))
                .await
            {
                Ok(()) => Some((client, rx)),
                Err(e) => {
                    tracing::debug!(error = %e, "relay: LISTEN failed; polling");
                    None
                }
            },
            Err(e) => {
                tracing::debug!(error = %e, "relay: cannot open a listening connection; polling");
                None
            }
        }
    }

    async fn calibration(self: Arc<Self>, stop: CancellationToken) {
        let every = self.config.cluster.calibrate_every_secs;
        if every == 0 || !self.config.cluster.evaluate {
            return;
        }
        let mut tick = tokio::time::interval(Duration::from_secs(every));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => break,
            }
            let mut drifts = Vec::new();
            for lane in &self.lanes {
                let median = match self.sched.calibrate(&lane.backend).await {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(class = %lane.class, error = %e, "calibration failed; drift is not judged this round");
                        continue;
                    }
                };
                match self.pg().record_calibration(&lane.class, median).await {
                    Ok((class_median, nodes)) => {
                        tracing::info!(class = %lane.class, median_us = median, class_median_us = class_median, nodes, "calibrated");
                        if let Some(d) = drift(
                            &lane.class,
                            median,
                            class_median,
                            nodes,
                            self.config.cluster.drift_threshold,
                        ) {
                            drifts.push(d);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot record the calibration"),
                }
            }
            let why = (!drifts.is_empty()).then(|| drifts.join("; "));
            if let Err(e) = self.pg().set_drift(why.as_deref()).await {
                tracing::warn!(error = %e, "cannot record the drift");
            }
            self.sched.pause_claims(why);
        }
    }
}

/// Why a node whose calibration median is `mine` stops claiming for `class`, whose live
/// nodes' median is `class_median` over `nodes` nodes; `None` when it is within
/// `threshold` (a fraction) or it is the class's only node.
pub fn drift(
    class: &str,
    mine: f64,
    class_median: f64,
    nodes: usize,
    threshold: f64,
) -> Option<String> {
    if nodes < 2 || !(mine > 0.0 && class_median > 0.0) {
        return None;
    }
    let off = mine / class_median - 1.0;
    (off.abs() > threshold).then(|| {
        format!(
            "calibration drifted on {class}: {mine:.1} us against the class median {class_median:.1} us of {nodes} nodes ({:+.1} %, limit {:.1} %)",
            off * 100.0,
            threshold * 100.0
        )
    })
}

#[cfg(test)]
mod tests {
    use super::drift;

    #[test]
    fn drift_needs_two_nodes_and_a_gap_past_the_threshold() {
        assert_eq!(drift("host/x", 150.0, 100.0, 1, 0.1), None, "alone");
        assert_eq!(drift("host/x", 105.0, 100.0, 3, 0.1), None, "within");
        let why = drift("host/x", 150.0, 100.0, 3, 0.1).expect("drifted");
        assert!(why.contains("+50.0 %") && why.contains("host/x"), "{why}");
        assert!(
            drift("host/x", 80.0, 100.0, 2, 0.1).is_some(),
            "faster counts too"
        );
        assert_eq!(drift("host/x", 0.0, 100.0, 3, 0.1), None, "no figure");
    }
}
