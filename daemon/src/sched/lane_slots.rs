//! [`LaneSlots`]: a backend's lanes (one per GPU for cuda, one for the host) handed out as
//! [`LaneSlot`]s, one holder at a time per lane, so timings on a lane never overlap.
//!
//! A holder may take any lane ([`Lanes::Any`]) or only some ([`Lanes::Only`]: a job
//! pinned to a lane, baselines on the lanes of one GPU model). Waiters are served in the
//! order they came: a lane handed back goes to the first waiter that may take it, so a
//! pinned job never starves the others and is never starved by them. The lowest free
//! lane is handed out first. The lanes themselves are the backend's.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// Which lanes a holder may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lanes {
    /// Any lane of the backend.
    Any,
    /// One of these lane indices.
    Only(Vec<usize>),
}

impl Lanes {
    fn allows(&self, lane: usize) -> bool {
        match self {
            Lanes::Any => true,
            Lanes::Only(v) => v.contains(&lane),
        }
    }
}

/// The lanes of one backend: which are free, and who waits for one.
pub struct LaneSlots {
    inner: Mutex<Inner>,
    count: usize,
}

struct Inner {
    free: Vec<bool>,
    waiting: VecDeque<(Lanes, oneshot::Sender<LaneSlot>)>,
}

/// A lane held by one holder; handed back when dropped.
pub struct LaneSlot {
    slots: Arc<LaneSlots>,
    /// The lane's index (< the backend's `lanes()`).
    pub index: usize,
    /// False while the slot is in flight to a waiter that has gone (nothing to hand back).
    armed: bool,
}

impl LaneSlots {
    /// `n` lanes (at least one).
    pub fn new(n: usize) -> Arc<LaneSlots> {
        let n = n.max(1);
        Arc::new(LaneSlots {
            inner: Mutex::new(Inner {
                free: vec![true; n],
                waiting: VecDeque::new(),
            }),
            count: n,
        })
    }

    /// How many lanes there are.
    pub fn count(&self) -> usize {
        self.count
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a free lane among `which`; `None` when `which` names no lane that exists
    /// (it would wait for ever).
    pub async fn acquire(self: &Arc<Self>, which: Lanes) -> Option<LaneSlot> {
        if let Lanes::Only(v) = &which
            && !v.iter().any(|l| *l < self.count)
        {
            return None;
        }
        let rx = {
            let mut inner = self.lock();
            // Only lanes no earlier waiter may take are free, so taking one jumps no queue.
            let free = (0..self.count).find(|l| inner.free[*l] && which.allows(*l));
            if let Some(index) = free {
                inner.free[index] = false;
                return Some(LaneSlot {
                    slots: self.clone(),
                    index,
                    armed: true,
                });
            }
            let (tx, rx) = oneshot::channel();
            inner.waiting.push_back((which, tx));
            rx
        };
        // A slot sent to a waiter that is dropped meanwhile is dropped with the channel,
        // which hands the lane back.
        rx.await.ok()
    }

    /// Hands lane `index` to the first waiter that may take it, or marks it free. The
    /// slot is sent outside the lock: a send that fails drops nothing here.
    fn release(self: &Arc<Self>, index: usize) {
        loop {
            let tx = {
                let mut inner = self.lock();
                inner.waiting.retain(|(_, tx)| !tx.is_closed());
                let first = inner.waiting.iter().position(|(w, _)| w.allows(index));
                match first.and_then(|at| inner.waiting.remove(at)) {
                    Some((_, tx)) => tx,
                    None => {
                        inner.free[index] = true;
                        return;
                    }
                }
            };
            let slot = LaneSlot {
                slots: self.clone(),
                index,
                armed: true,
            };
            match tx.send(slot) {
                Ok(()) => return,
                // The waiter went away just now: the next one, or free.
                Err(mut slot) => slot.armed = false,
            }
        }
    }

    #[cfg(test)]
    fn free_count(&self) -> usize {
        self.lock().free.iter().filter(|f| **f).count()
    }
}

impl Drop for LaneSlot {
    fn drop(&mut self) {
        if self.armed {
            self.slots.release(self.index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lanes_are_exclusive_and_returned() {
        let slots = LaneSlots::new(2);
        let a = slots.acquire(Lanes::Any).await.expect("lane");
        let b = slots.acquire(Lanes::Any).await.expect("lane");
        assert_eq!((a.index, b.index), (0, 1), "the lowest free lane first");
        assert_eq!(slots.free_count(), 0, "both lanes taken");
        let freed = a.index;
        drop(a);
        let c = slots.acquire(Lanes::Any).await.expect("lane");
        assert_eq!(c.index, freed, "the freed lane is handed out again");
        drop((b, c));
        assert_eq!(slots.free_count(), 2);
    }

    #[tokio::test]
    async fn a_pinned_holder_gets_its_lane_and_waits_only_for_it() {
        let slots = LaneSlots::new(3);
        let l1 = slots.acquire(Lanes::Only(vec![1])).await.expect("lane 1");
        assert_eq!(l1.index, 1);
        // Lane 1 is taken: a second holder pinned to it waits, while lanes 0 and 2 are
        // still handed to anyone.
        let s = slots.clone();
        let pinned = tokio::spawn(async move { s.acquire(Lanes::Only(vec![1])).await });
        tokio::task::yield_now().await;
        let a = slots.acquire(Lanes::Any).await.expect("lane");
        let b = slots.acquire(Lanes::Any).await.expect("lane");
        assert_eq!((a.index, b.index), (0, 2));
        assert!(!pinned.is_finished());
        drop(l1);
        let got = pinned.await.expect("task").expect("lane");
        assert_eq!(got.index, 1);
        assert!(
            slots.acquire(Lanes::Only(vec![7])).await.is_none(),
            "no lane 7"
        );
    }

    #[tokio::test]
    async fn a_returned_lane_goes_to_the_first_waiter_that_may_take_it() {
        let slots = LaneSlots::new(2);
        let l0 = slots.acquire(Lanes::Any).await.expect("lane");
        let l1 = slots.acquire(Lanes::Any).await.expect("lane");
        let (s1, s2, s3) = (slots.clone(), slots.clone(), slots.clone());
        // Waiters in this order: pinned to 1, any, any.
        let pinned = tokio::spawn(async move { s1.acquire(Lanes::Only(vec![1])).await });
        tokio::task::yield_now().await;
        let first_any = tokio::spawn(async move { s2.acquire(Lanes::Any).await });
        tokio::task::yield_now().await;
        let second_any = tokio::spawn(async move { s3.acquire(Lanes::Any).await });
        tokio::task::yield_now().await;
        // Lane 0 back: the pinned waiter cannot take it, the first `any` one does.
        drop(l0);
        let got = first_any.await.expect("task").expect("lane");
        assert_eq!(got.index, 0);
        assert!(!pinned.is_finished() && !second_any.is_finished());
        // Lane 1 back: the pinned waiter came first.
        drop(l1);
        let kept = pinned.await.expect("task").expect("lane");
        assert_eq!(kept.index, 1);
        assert!(!second_any.is_finished());
        drop(got);
        assert_eq!(second_any.await.expect("task").expect("lane").index, 0);
        drop(kept);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_loses_no_lane() {
        let slots = LaneSlots::new(1);
        let held = slots.acquire(Lanes::Any).await.expect("lane");
        let s = slots.clone();
        let gone = tokio::spawn(async move { s.acquire(Lanes::Any).await });
        tokio::task::yield_now().await;
        gone.abort();
        let _ = gone.await;
        drop(held);
        assert_eq!(slots.free_count(), 1, "the lane is free again");
        assert_eq!(slots.acquire(Lanes::Any).await.expect("lane").index, 0);
    }
}
