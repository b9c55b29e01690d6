//! The clock policy in kilnd: with `lock`, each evaluation on a GPU lane runs inside a
//! clock window (`kiln_gpu::telemetry::ClockPolicy::enter`): the lock intent is written
//! to the store's clock journal before NVML locks the SM clock, and the clocks are reset
//! (and the release journalled) when the evaluation ends, however it ends. At start,
//! [`recover`] resets the clocks of every GPU whose last journal entry is a lock intent —
//! a daemon that died inside a window. With `observe` (the default) nothing here touches
//! a GPU.
//!
//! The NVML calls sit behind `ClockControl`, so all of this is tested with `FakeNvml`.
//! Locking needs root or CAP_SYS_ADMIN; [`lock_permitted`] is the read-only check
//! `kiln doctor` shows.

use std::sync::{Arc, Mutex};

use kiln_sandbox::kiln_gpu::telemetry::{ClockControl, ClockError, ClockEvent, ClockPolicy};

use crate::store::SqliteStore;

/// The clock control of one GPU, shared by its lane.
pub type SharedControl = Arc<Mutex<Box<dyn ClockControl + Send>>>;

/// The policy from the config: `observe`, or `lock` at `lock_mhz` (0 = base clock).
pub fn policy(name: &str, lock_mhz: u32) -> ClockPolicy {
    match name {
        "lock" => ClockPolicy::Lock {
            mhz: (lock_mhz > 0).then_some(lock_mhz),
        },
        _ => ClockPolicy::Observe,
    }
}

/// A lane's clock window: runs `f` with the GPU's clocks as the policy says.
pub struct LaneClocks {
    policy: ClockPolicy,
    gpu: String,
    ctl: SharedControl,
    store: Arc<SqliteStore>,
}

impl LaneClocks {
    /// Clock windows for the GPU `gpu` (its UUID) under `policy`.
    pub fn new(
        policy: ClockPolicy,
        gpu: &str,
        ctl: SharedControl,
        store: Arc<SqliteStore>,
    ) -> Self {
        LaneClocks {
            policy,
            gpu: gpu.to_string(),
            ctl,
            store,
        }
    }

    /// The policy as the telemetry shows it: `observe`, `lock base`, `lock 1500 MHz`.
    pub fn describe(&self) -> String {
        match self.policy {
            ClockPolicy::Observe => "observe".into(),
            ClockPolicy::Lock { mhz: None } => "lock base".into(),
            ClockPolicy::Lock { mhz: Some(m) } => format!("lock {m} MHz"),
        }
    }

    /// Runs `f` inside a clock window. With `lock`: journal, lock, run, reset, journal.
    /// A lock that fails (or cannot be journalled) means `f` does not run.
    pub fn around<T>(&self, f: impl FnOnce() -> T) -> Result<T, ClockError> {
        let mut ctl = self.ctl.lock().unwrap_or_else(|p| p.into_inner());
        let store = self.store.clone();
        let mut journal =
            move |e: &ClockEvent| store.journal_clock_event(e).map_err(|e| e.to_string());
        let window = self.policy.enter(&self.gpu, &mut **ctl, &mut journal)?;
        let out = f();
        window.release()?;
        Ok(out)
    }
}

/// At start: resets the clocks of every GPU whose last journal entry is a lock intent,
/// through `control(uuid)`. Returns the GPUs reset.
pub fn recover(
    store: &SqliteStore,
    mut control: impl FnMut(&str) -> Option<Box<dyn ClockControl + Send>>,
) -> Vec<String> {
    let events = match store.last_clock_events() {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, "cannot read the clock journal");
            return Vec::new();
        }
    };
    let mut reset = Vec::new();
    for event in events {
        let ClockEvent::LockIntent { gpu, .. } = &event else {
            continue;
        };
        let Some(mut ctl) = control(gpu) else {
            tracing::error!(
                gpu,
                "clocks were left locked, but this GPU cannot be reached to reset them"
            );
            continue;
        };
        match kiln_sandbox::kiln_gpu::telemetry::recover_after_crash(&mut *ctl, Some(&event)) {
            Ok(true) => {
                let released = ClockEvent::Released { gpu: gpu.clone() };
                if let Err(e) = store.journal_clock_event(&released) {
                    tracing::warn!(error = %e, "clocks reset, but the release could not be journalled");
                }
                reset.push(gpu.clone());
            }
            Ok(false) => {}
            Err(e) => tracing::error!(gpu, error = %e, "cannot reset clocks left locked"),
        }
    }
    reset
}

/// Whether this process could lock clocks (read-only: nothing is changed): root, or
/// CAP_SYS_ADMIN in the effective set. NVML itself may still refuse (some GPUs and
/// drivers do not support locked clocks); the first lock would say so.
pub fn lock_permitted() -> (bool, String) {
    if nix::unistd::geteuid().is_root() {
        return (true, "running as root".into());
    }
    match std::fs::read_to_string("/proc/self/status") {
        Ok(status) => {
            let eff = status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .unwrap_or(0);
            const CAP_SYS_ADMIN: u32 = 21;
            if eff & (1 << CAP_SYS_ADMIN) != 0 {
                (true, "CAP_SYS_ADMIN is in the effective set".into())
            } else {
                (
                    false,
                    "not root and no CAP_SYS_ADMIN: NVML would refuse to lock clocks \
                     (the packaged drop-in grants it to kilnd)"
                        .into(),
                )
            }
        }
        Err(e) => (false, format!("cannot read /proc/self/status: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use kiln_sandbox::kiln_gpu::FakeNvml;

    use super::*;

    fn shared(fake: &FakeNvml) -> SharedControl {
        Arc::new(Mutex::new(Box::new(fake.clone())))
    }

    #[test]
    fn lock_is_journalled_before_it_is_applied_and_reset_after() {
        let (_dir, store) = crate::store::sqlite_temp();
        let store = Arc::new(store);
        let fake = FakeNvml::default();
        let log = fake.log.clone();
        let clocks = LaneClocks::new(policy("lock", 1500), "GPU-x", shared(&fake), store.clone());
        let seen_during = clocks
            .around(|| {
                // Inside the window: the intent is already durable, the lock applied.
                let last = store.last_clock_events().expect("journal");
                (last, log.lock().expect("log").clone())
            })
            .expect("window");
        assert!(
            matches!(seen_during.0.as_slice(), [ClockEvent::LockIntent { gpu, .. }] if gpu == "GPU-x")
        );
        assert_eq!(seen_during.1, vec!["nvml:lock 1500-1500"]);
        assert_eq!(
            *log.lock().expect("log"),
            vec!["nvml:lock 1500-1500", "nvml:reset"]
        );
        assert_eq!(
            store.last_clock_events().expect("journal"),
            vec![ClockEvent::Released {
                gpu: "GPU-x".into()
            }]
        );
    }

    #[test]
    fn observe_touches_nothing_and_base_is_the_default_lock() {
        let (_dir, store) = crate::store::sqlite_temp();
        let store = Arc::new(store);
        let fake = FakeNvml::default();
        let clocks = LaneClocks::new(policy("observe", 0), "GPU-x", shared(&fake), store.clone());
        assert_eq!(clocks.around(|| 7).expect("window"), 7);
        assert!(fake.log.lock().expect("log").is_empty());
        assert!(store.last_clock_events().expect("journal").is_empty());
        assert_eq!(policy("lock", 0), ClockPolicy::Lock { mhz: None });
    }

    #[test]
    fn a_failed_lock_does_not_run_the_evaluation_and_resets() {
        let (_dir, store) = crate::store::sqlite_temp();
        let fake = FakeNvml {
            fail_lock: true,
            ..FakeNvml::default()
        };
        let clocks = LaneClocks::new(policy("lock", 0), "GPU-x", shared(&fake), Arc::new(store));
        let mut ran = false;
        assert!(clocks.around(|| ran = true).is_err());
        assert!(!ran);
        assert_eq!(
            *fake.log.lock().expect("log"),
            vec!["nvml:lock base", "nvml:reset"]
        );
    }

    #[test]
    fn a_crash_inside_a_window_is_reset_at_the_next_start() {
        let (_dir, store) = crate::store::sqlite_temp();
        // The previous daemon journalled an intent and died.
        store
            .journal_clock_event(&ClockEvent::LockIntent {
                gpu: "GPU-a".into(),
                setting: kiln_sandbox::kiln_gpu::telemetry::LockSetting::Base,
            })
            .expect("journal");
        store
            .journal_clock_event(&ClockEvent::Released {
                gpu: "GPU-b".into(),
            })
            .expect("journal");
        let fake = FakeNvml::default();
        let log = fake.log.clone();
        let reset = recover(&store, |gpu| {
            assert_eq!(gpu, "GPU-a", "only the GPU left locked is touched");
            Some(Box::new(fake.clone()))
        });
        assert_eq!(reset, vec!["GPU-a"]);
        assert_eq!(*log.lock().expect("log"), vec!["nvml:reset"]);
        // Journalled as released: a second start does nothing.
        assert!(recover(&store, |_| panic!("nothing left to reset")).is_empty());
    }
}
