//! [`LaneSlots`]: a backend's lanes (one per GPU for cuda, one for the host) handed out as
//! [`LaneSlot`]s, one job at a time per lane, so timings on a lane never overlap. A
//! semaphore over lane indices: the lanes themselves are the backend's.

use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The free lane indices of one backend.
pub struct LaneSlots {
    sem: Arc<Semaphore>,
    free: Mutex<Vec<usize>>,
}

/// A lane held by one job; handed back when dropped.
pub struct LaneSlot {
    slots: Arc<LaneSlots>,
    /// The lane's index (< the backend's `lanes()`).
    pub index: usize,
    _permit: OwnedSemaphorePermit,
}

impl LaneSlots {
    /// `n` lanes (at least one).
    pub fn new(n: usize) -> Arc<LaneSlots> {
        let n = n.max(1);
        Arc::new(LaneSlots {
            sem: Arc::new(Semaphore::new(n)),
            // Popped from the end: lane 0 is handed out first.
            free: Mutex::new((0..n).rev().collect()),
        })
    }

    /// Waits for a free lane; `None` once the semaphore is closed.
    pub async fn acquire(self: &Arc<Self>) -> Option<LaneSlot> {
        let permit = self.sem.clone().acquire_owned().await.ok()?;
        let index = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
        Some(LaneSlot {
            slots: self.clone(),
            index,
            _permit: permit,
        })
    }
}

impl Drop for LaneSlot {
    fn drop(&mut self) {
        // Back in the free list before the permit (a field) is released.
        self.slots
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lanes_are_exclusive_and_returned() {
        let slots = LaneSlots::new(2);
        let a = slots.acquire().await.expect("lane");
        let b = slots.acquire().await.expect("lane");
        assert_ne!(a.index, b.index);
        assert!(slots.sem.available_permits() == 0, "both lanes taken");
        let freed = a.index;
        drop(a);
        let c = slots.acquire().await.expect("lane");
        assert_eq!(c.index, freed, "the freed lane is handed out again");
        drop((b, c));
        assert_eq!(slots.sem.available_permits(), 2);
    }
}
