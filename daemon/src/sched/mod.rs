//! The scheduler: takes jobs from the durable queue through compile and evaluation.
//!
//! One dispatcher claims queued jobs while a compile slot is free (the compile pool is
//! sized from the CPU count), so waiting jobs stay visibly `queued` in the store. Each
//! claimed job compiles in the pool, then waits for a lane of its backend (one per GPU
//! for cuda, [`LaneSlots`]: any free lane, or the one its `lane` option pins it to) — one
//! evaluation at a time per lane, so timings never overlap — gets its options applied to the evaluation plan ([`job_options`]), and ends with its
//! evaluation stored and the job `done`, or `failed` with the reason when the backend
//! itself broke (`job`). Jobs for a backend that is not usable here stay queued.
//! Baselines hold a GPU lane the same way ([`baseline`]).

pub mod baseline;
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
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::backends::Backend;
use crate::config::Config;
use crate::events::EventBus;
use crate::store::Store;

/// Shared state of the scheduler.
pub struct Scheduler {
    pub(crate) store: Arc<Store>,
    pub(crate) events: EventBus,
    pub(crate) backends: HashMap<&'static str, Arc<dyn Backend>>,
    pub(crate) config: Config,
    compile_slots: Arc<Semaphore>,
    pub(crate) lane_slots: HashMap<&'static str, Arc<LaneSlots>>,
    wake: Notify,
    shutdown: CancellationToken,
}

impl Scheduler {
    /// A scheduler over `backends` (only the usable ones receive jobs).
    pub fn new(
        store: Arc<Store>,
        events: EventBus,
        backends: Vec<Arc<dyn Backend>>,
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
        let backends = backends.into_iter().map(|b| (b.name(), b)).collect();
        Arc::new(Scheduler {
            store,
            events,
            backends,
            config,
            compile_slots: Arc::new(Semaphore::new(workers)),
            lane_slots,
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

    /// Runs until [`Scheduler::stop`], then drains: waits up to `drain` for running jobs,
    /// and puts those still running back in the queue.
    pub async fn run(self: Arc<Self>, drain: Duration) {
        let usable = self.usable_backends();
        tracing::info!(backends = ?usable, slots = self.compile_slots.available_permits(), "scheduler started");
        let mut tasks: JoinSet<i64> = JoinSet::new();
        let mut running: Vec<i64> = Vec::new();
        loop {
            // Reap finished jobs.
            while let Some(done) = tasks.try_join_next() {
                if let Ok(id) = done {
                    running.retain(|r| *r != id);
                }
            }
            let permit = tokio::select! {
                p = self.compile_slots.clone().acquire_owned() => p,
                _ = self.shutdown.cancelled() => break,
            };
            let Ok(permit) = permit else { break };
            let claimed = match self.store.claim_next(&usable) {
                Ok(job) => job,
                Err(e) => {
                    tracing::error!(error = %e, "cannot claim a job; retrying shortly");
                    None
                }
            };
            match claimed {
                Some(job) => {
                    running.push(job.id);
                    let me = self.clone();
                    tasks.spawn(async move {
                        let id = job.id;
                        me.run_job(job, permit).await;
                        id
                    });
                }
                None => {
                    drop(permit);
                    tokio::select! {
                        _ = self.wake.notified() => {}
                        _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                        Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                            if let Ok(id) = done { running.retain(|r| *r != id); }
                        }
                        _ = self.shutdown.cancelled() => break,
                    }
                }
            }
        }
        tracing::info!(running = tasks.len(), "scheduler draining");
        let deadline = tokio::time::Instant::now() + drain;
        while !tasks.is_empty() {
            match tokio::time::timeout_at(deadline, tasks.join_next()).await {
                Ok(Some(Ok(id))) => running.retain(|r| *r != id),
                Ok(Some(Err(_))) => {}
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(jobs = ?running, "drain timed out; these jobs are queued again");
                    for id in &running {
                        if let Err(e) = self.store.requeue_job(*id) {
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
