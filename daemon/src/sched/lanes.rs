//! Evaluation lanes: a backend's lanes (one per GPU for cuda, one for the host) handed out
//! one job at a time, so timings on a lane never overlap.

use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The lanes of one backend.
pub struct LanePool {
    sem: Arc<Semaphore>,
    free: Mutex<Vec<usize>>,
}

/// A lane held by one job; handed back when dropped.
pub struct LaneGuard {
    pool: Arc<LanePool>,
    /// The lane's index (< the backend's `lanes()`).
    pub index: usize,
    _permit: OwnedSemaphorePermit,
}

impl LanePool {
    /// `n` lanes (at least one).
    pub fn new(n: usize) -> Arc<LanePool> {
        let n = n.max(1);
        Arc::new(LanePool {
            sem: Arc::new(Semaphore::new(n)),
            // Popped from the end: lane 0 is handed out first.
            free: Mutex::new((0..n).rev().collect()),
        })
    }

    /// Waits for a free lane; `None` once the pool is closed.
    pub async fn acquire(self: &Arc<Self>) -> Option<LaneGuard> {
        let permit = self.sem.clone().acquire_owned().await.ok()?;
        let index = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
        Some(LaneGuard {
            pool: self.clone(),
            index,
            _permit: permit,
        })
    }
}

impl Drop for LaneGuard {
    fn drop(&mut self) {
        // Back in the free list before the permit (a field) is released.
        self.pool
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
        let pool = LanePool::new(2);
        let a = pool.acquire().await.expect("lane");
        let b = pool.acquire().await.expect("lane");
        assert_ne!(a.index, b.index);
        assert!(pool.sem.available_permits() == 0, "both lanes taken");
        let freed = a.index;
        drop(a);
        let c = pool.acquire().await.expect("lane");
        assert_eq!(c.index, freed, "the freed lane is handed out again");
        drop((b, c));
        assert_eq!(pool.sem.available_permits(), 2);
    }
}
