//! How many jobs a backend holds at once (claimed, compiling, compiled or evaluating):
//! enough that its lanes never wait for a compile, no more than its compile slots can
//! serve.
//!
//! While a lane evaluates one job (time E), the jobs behind it must be compiled (time C
//! each, on the compile pool). To keep the lane busy, about C / E jobs per lane must be
//! compiling at any moment, plus one ready to go. So each lane is given
//! `1 + ceil(C / E) + 1` jobs, never fewer than `1 + queue.lane_prefetch` and never more
//! than the compile slots can work on for it (`ceil(slots / lanes) + 1` ahead of the one
//! evaluating) nor `1 + queue.max_lane_ahead`. C and E are running means of what the
//! backend's jobs took here: a cold compile of a CUDA source that includes the toolkit's
//! headers (seconds) gets many jobs compiling ahead, a cached or plain one (milliseconds)
//! the floor. Jobs beyond the limit stay `queued` in the store, in the queue's fair order.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Weight of the newest observation in the running means.
const NEW_WEIGHT: f64 = 0.2;

/// The jobs one backend holds and how many it may.
#[derive(Debug)]
pub struct Ahead {
    lanes: usize,
    /// Jobs ahead of each lane's evaluating one, at least.
    floor: usize,
    /// Jobs ahead of each lane's evaluating one, at most.
    ceiling: usize,
    held: AtomicUsize,
    /// Running means, milliseconds: (compile, evaluation); `None` until measured.
    means: Mutex<(Option<f64>, Option<f64>)>,
}

/// One held job; the hold ends when it is dropped.
#[derive(Debug)]
pub struct OwnedHold {
    ahead: std::sync::Arc<Ahead>,
}

impl Drop for OwnedHold {
    fn drop(&mut self) {
        self.ahead.held.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Ahead {
    /// For a backend with `lanes` lanes, `slots` compile slots, at least `floor` and at
    /// most `max_ahead` jobs ahead of each lane's evaluating one.
    pub fn new(lanes: usize, slots: usize, floor: usize, max_ahead: usize) -> Ahead {
        let lanes = lanes.max(1);
        let by_slots = slots.max(1).div_ceil(lanes) + 1;
        let ceiling = by_slots.min(max_ahead).max(floor);
        Ahead {
            lanes,
            floor,
            ceiling,
            held: AtomicUsize::new(0),
            means: Mutex::new((None, None)),
        }
    }

    /// Jobs ahead of each lane's evaluating one, now.
    pub fn per_lane(&self) -> usize {
        let (c, e) = *self.means.lock().unwrap_or_else(|p| p.into_inner());
        let wanted = match (c, e) {
            (Some(c), Some(e)) if e > 0.0 => {
                let ratio = (c / e).ceil();
                if ratio.is_finite() && ratio >= 0.0 {
                    // Saturates: the ceiling bounds it below.
                    (ratio as usize).saturating_add(1)
                } else {
                    self.ceiling
                }
            }
            // Compiles measured, evaluations not yet: as deep as allowed until they are.
            (Some(_), _) => self.ceiling,
            _ => self.floor,
        };
        wanted.clamp(self.floor, self.ceiling)
    }

    /// Jobs the backend may hold now.
    pub fn limit(&self) -> usize {
        self.lanes.saturating_mul(1 + self.per_lane())
    }

    /// Jobs held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Takes a hold for one more job, if the limit allows.
    pub fn try_hold(self: &std::sync::Arc<Self>) -> Option<OwnedHold> {
        let limit = self.limit();
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                (h < limit).then_some(h + 1)
            })
            .ok()
            .map(|_| OwnedHold {
                ahead: self.clone(),
            })
    }

    /// Records a compile stage's time (cached or not), milliseconds.
    pub fn observe_compile(&self, ms: f64) {
        self.observe(ms, |m| &mut m.0);
    }

    /// Records an evaluation's time on a lane, milliseconds.
    pub fn observe_evaluation(&self, ms: f64) {
        self.observe(ms, |m| &mut m.1);
    }

    fn observe(
        &self,
        ms: f64,
        which: impl Fn(&mut (Option<f64>, Option<f64>)) -> &mut Option<f64>,
    ) {
        if !(ms.is_finite() && ms >= 0.0) {
            return;
        }
        let mut m = self.means.lock().unwrap_or_else(|p| p.into_inner());
        let slot = which(&mut m);
        *slot = Some(match *slot {
            Some(old) => old + NEW_WEIGHT * (ms - old),
            None => ms,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_compiles_get_more_jobs_ahead_within_the_slots() {
        // One lane, eight compile slots, at least two ahead, at most 32.
        let a = Ahead::new(1, 8, 2, 32);
        assert_eq!(a.per_lane(), 2, "nothing measured: the floor");
        a.observe_compile(2400.0);
        assert_eq!(
            a.per_lane(),
            9,
            "compiles seen, evaluations not: the ceiling"
        );
        a.observe_evaluation(200.0);
        assert_eq!(
            a.per_lane(),
            9,
            "12 compiles per evaluation, capped by 8 slots + 1"
        );
        let fast = Ahead::new(1, 8, 2, 32);
        fast.observe_compile(20.0);
        fast.observe_evaluation(200.0);
        assert_eq!(
            fast.per_lane(),
            2,
            "a compile shorter than an evaluation: the floor"
        );
        let mid = Ahead::new(1, 8, 2, 32);
        mid.observe_compile(700.0);
        mid.observe_evaluation(200.0);
        assert_eq!(mid.per_lane(), 5, "ceil(3.5) + 1");
    }

    #[test]
    fn the_limit_spreads_the_slots_over_the_lanes_and_honours_the_maximum() {
        let eight = Ahead::new(8, 16, 2, 32);
        eight.observe_compile(5000.0);
        eight.observe_evaluation(100.0);
        assert_eq!(
            eight.per_lane(),
            3,
            "16 slots over 8 lanes: 2 compiling + 1 ready"
        );
        assert_eq!(eight.limit(), 8 * 4);
        let capped = Ahead::new(1, 64, 2, 6);
        capped.observe_compile(5000.0);
        capped.observe_evaluation(100.0);
        assert_eq!(capped.per_lane(), 6, "queue.max_lane_ahead bounds it");
        let floor_wins = Ahead::new(4, 1, 5, 32);
        assert_eq!(floor_wins.per_lane(), 5, "the configured floor is kept");
    }

    #[test]
    fn holds_stop_at_the_limit_and_come_back_when_dropped() {
        let a = std::sync::Arc::new(Ahead::new(1, 8, 1, 32));
        let first = a.try_hold().expect("one");
        let second = a.try_hold().expect("two");
        assert!(a.try_hold().is_none(), "1 evaluating + 1 ahead");
        drop(first);
        assert_eq!(a.held(), 1);
        assert!(a.try_hold().is_some());
        drop(second);
    }

    #[test]
    fn the_means_follow_recent_jobs_and_ignore_nonsense() {
        let a = Ahead::new(1, 8, 1, 32);
        a.observe_compile(f64::NAN);
        a.observe_compile(-1.0);
        assert_eq!(a.per_lane(), 1, "no valid observation");
        a.observe_evaluation(100.0);
        a.observe_compile(100.0);
        for _ in 0..30 {
            a.observe_compile(600.0);
        }
        assert_eq!(a.per_lane(), 7, "the mean moved to 600 ms: ceil(6) + 1");
    }
}
