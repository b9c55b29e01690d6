//! The scheduler: takes jobs from the durable queue through compile and evaluation.
//!
//! One dispatcher claims queued jobs while a compile slot is free (the compile pool is
//! sized from the CPU count) and the job's backend has room: a backend holds at most
//! `lanes × (1 + ahead)` jobs at once, where `ahead` follows its compile time against its
//! evaluation time (at least `queue.lane_prefetch`, within the compile slots: [`ahead`]),
//! so jobs beyond that stay visibly `queued` in the store and the claim order (fair
//! across searches) is the order lanes serve them. A claimed job is `compiling`; once compiled it is `compiled` and waits for
//! a lane of its backend (one per GPU for cuda, [`LaneSlots`]: any free lane, or the one
//! its `lane` option pins it to) — one evaluation at a time
//! per lane, so timings never overlap. Only when its evaluation starts on a lane is it
//! `running` and its attempt counted; it gets its options applied to the evaluation plan
//! ([`job_options`]) and ends with its evaluation stored and the job `done`, or `failed`
//! with the reason when the backend itself broke (`job`). Jobs for a backend that is not
//! usable here stay queued. On stop, jobs not yet on a lane go back to the queue at once,
//! uncounted. Baselines hold a GPU lane the same way ([`baseline`]); the hosted ones are
//! the problem's module evaluated there as a hosted file ([`hosted_baseline`]).

pub mod ahead;
pub mod baseline;
mod calibrate;
pub mod hosted_baseline;
mod job;
pub mod job_options;
mod lane_slots;
#[cfg(test)]
mod tests;

pub use lane_slots::{LaneSlot, LaneSlots, Lanes};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};

use ahead::{Ahead, OwnedHold};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::backends::Backend;
use crate::config::Config;
use crate::events::EventBus;
use crate::store::{LaneClass, Store};

/// Shared state of the scheduler.
pub struct Scheduler {
    pub(crate) store: Arc<Store>,
    pub(crate) events: EventBus,
    pub(crate) backends: HashMap<&'static str, Arc<dyn Backend>>,
    pub(crate) config: Config,
    compile_slots: Arc<Semaphore>,
    pub(crate) lane_slots: HashMap<&'static str, Arc<LaneSlots>>,
    /// Per backend: the jobs it holds (compiling, compiled or running) and how many it
    /// may, following its compile and evaluation times ([`ahead`]).
    pub(crate) ahead: HashMap<&'static str, Arc<Ahead>>,
    /// The class each backend's lanes claim for; empty on a node that evaluates nothing
    /// (a gateway).
    classes: Vec<LaneClass>,
    /// Why this node stopped claiming (a calibration drifted), if it did.
    paused: std::sync::Mutex<Option<String>>,
    /// How long a store call is retried while the database is unavailable.
    pub(crate) write_patience: Duration,
    wake: Notify,
    shutdown: CancellationToken,
}

impl Scheduler {
    /// A scheduler over `backends`: the usable ones whose class is in `classes` receive
    /// jobs (a gateway passes no classes).
    pub fn new(
        store: Arc<Store>,
        events: EventBus,
        backends: Vec<Arc<dyn Backend>>,
        classes: Vec<LaneClass>,
        config: Config,
    ) -> Arc<Self> {
        let workers = match config.queue.compile_workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        for b in backends.iter().filter(|b| b.status().usable) {
            for lane in 0..b.lanes() {
                crate::metrics::register_lane(b.name(), lane);
            }
        }
        let lane_slots = backends
            .iter()
            .map(|b| (b.name(), LaneSlots::new(b.lanes())))
            .collect();
        let ahead = backends
            .iter()
            .map(|b| {
                let a = Ahead::new(
                    b.lanes(),
                    workers,
                    config.queue.lane_prefetch,
                    config.queue.max_lane_ahead,
                );
                (b.name(), Arc::new(a))
            })
            .collect();
        let backends = backends.into_iter().map(|b| (b.name(), b)).collect();
        // Long enough for a database restart or failover (a restarted database gives
        // every node a lease to renew before reaping: what this node holds is still its).
        let write_patience = Duration::from_secs_f64((2.0 * config.cluster.lease_secs).max(30.0));
        Arc::new(Scheduler {
            store,
            events,
            backends,
            config,
            compile_slots: Arc::new(Semaphore::new(workers)),
            lane_slots,
            ahead,
            classes,
            paused: std::sync::Mutex::new(None),
            write_patience,
            wake: Notify::new(),
            shutdown: CancellationToken::default(),
        })
    }

    /// Tells the dispatcher that a job was queued.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Names of the backends that take jobs here.
    pub fn usable_backends(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self
            .backends
            .values()
            .filter(|b| b.status().usable)
            .map(|b| b.name())
            .collect();
        v.sort_unstable();
        v
    }

    /// The classes this node's lanes claim for.
    pub fn classes(&self) -> &[LaneClass] {
        &self.classes
    }

    /// The class of this node's lanes of `backend`, if it has usable ones.
    pub fn class_of(&self, backend: &str) -> Option<&str> {
        self.classes
            .iter()
            .find(|c| c.backend == backend)
            .map(|c| c.class.as_str())
    }

    /// Stops claiming new jobs, saying why (`None`: claims again). Jobs already claimed
    /// run on.
    pub fn pause_claims(&self, why: Option<String>) {
        let mut p = self.paused.lock().unwrap_or_else(|p| p.into_inner());
        if *p != why {
            match &why {
                Some(w) => tracing::warn!(reason = %w, "this node stops claiming jobs"),
                None => tracing::info!("this node claims jobs again"),
            }
        }
        *p = why;
        drop(p);
        self.wake();
    }

    /// Why this node does not claim jobs, if it does not.
    pub fn paused(&self) -> Option<String> {
        self.paused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Room for one more job of each claiming lane class that has some: the classes with
    /// their permits (none while claims are paused).
    fn lanes_with_room(&self) -> Vec<(LaneClass, OwnedHold)> {
        if self.paused().is_some() {
            return Vec::new();
        }
        self.classes
            .iter()
            .filter_map(|c| {
                let hold = self.ahead.get(c.backend.as_str())?.try_hold()?;
                Some((c.clone(), hold))
            })
            .collect()
    }

    /// Runs until [`Scheduler::stop`], then drains: jobs not yet on a lane are queued
    /// again at once; running ones are waited for up to `drain`, then queued again too.
    pub async fn run(self: Arc<Self>, drain: Duration) {
        tracing::info!(classes = ?self.classes, slots = self.compile_slots.available_permits(), "scheduler started");
        let mut tasks: JoinSet<i64> = JoinSet::new();
        // Claimed jobs still running here, with their lease tokens.
        let mut claimed: Vec<(i64, i64)> = Vec::new();
        loop {
            // Reap finished jobs.
            while let Some(done) = tasks.try_join_next() {
                if let Ok(id) = done {
                    claimed.retain(|r| r.0 != id);
                }
            }
            let permit = tokio::select! {
                p = self.compile_slots.clone().acquire_owned() => p,
                _ = self.shutdown.cancelled() => break,
            };
            let Ok(permit) = permit else { break };
            let mut room = self.lanes_with_room();
            let lanes: Vec<LaneClass> = room.iter().map(|(c, _)| c.clone()).collect();
            let job = if lanes.is_empty() {
                None
            } else {
                let t0 = std::time::Instant::now();
                let claim = self.store.claim_next(&lanes).await;
                crate::metrics::observe_claim(
                    t0.elapsed().as_secs_f64(),
                    matches!(claim, Ok(Some(_))),
                );
                match claim {
                    Ok(job) => job,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot claim a job; retrying shortly");
                        None
                    }
                }
            };
            let held = job
                .as_ref()
                .and_then(|j| room.iter().position(|(c, _)| c.backend == j.backend))
                .map(|i| room.swap_remove(i).1);
            drop(room);
            match (job, held) {
                (Some(job), Some(held)) => {
                    claimed.push((job.id, job.lease_token));
                    let me = self.clone();
                    tasks.spawn(async move {
                        let id = job.id;
                        me.run_job(job, permit).await;
                        drop(held);
                        id
                    });
                }
                (job, _) => {
                    if let Some(job) = job {
                        // Cannot happen (claims are for backends with room); put it back.
                        let _ = self.store.requeue_job(job.id, job.lease_token).await;
                    }
                    drop(permit);
                    tokio::select! {
                        _ = self.wake.notified() => {}
                        _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                        Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                            if let Ok(id) = done { claimed.retain(|r| r.0 != id); }
                        }
                        _ = self.shutdown.cancelled() => break,
                    }
                }
            }
        }
        tracing::info!(jobs = tasks.len(), "scheduler draining");
        let deadline = tokio::time::Instant::now() + drain;
        while !tasks.is_empty() {
            match tokio::time::timeout_at(deadline, tasks.join_next()).await {
                Ok(Some(Ok(id))) => claimed.retain(|r| r.0 != id),
                Ok(Some(Err(_))) => {}
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(jobs = ?claimed.iter().map(|c| c.0).collect::<Vec<_>>(), "drain timed out; these jobs are queued again");
                    for (id, token) in &claimed {
                        if let Err(e) = self.store.requeue_job(*id, *token).await {
                            tracing::error!(job = id, error = %e, "cannot requeue job");
                        }
                    }
                    tasks.abort_all();
                    break;
                }
            }
        }
        tracing::info!("scheduler stopped");
    }

    /// Asks [`Scheduler::run`] to stop claiming jobs and drain.
    pub fn stop(&self) {
        self.shutdown.cancel();
    }
}
