//! One build for many compiles: what the shared, once-built compile state (NVRTC's
//! precompiled headers, torch's precompiled extension header) needs to be built by one
//! compile only, and not again and again when it fails.
//!
//! - [`Claim`]: an `O_EXCL` lock file beside the folder's files, removed when dropped, so
//!   that two compiles (or two kilnd processes) do not build the same key at once; a lock
//!   older than its stale age is a crashed builder's and is taken over.
//! - [`HeldBack`]: the keys whose build failed, not tried again before a given time.

use std::collections::HashMap;
use std::fs;
use std::io::ErrorKind;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A claim on building one key, held until dropped.
#[derive(Debug)]
pub struct Claim {
    path: PathBuf,
}

impl Claim {
    /// Takes the lock file `lock`: `None` when another holds it (and it is younger than
    /// `stale`) or it cannot be made (`what` names the build in the warning).
    pub fn take(lock: PathBuf, stale: Duration, what: &str) -> Option<Claim> {
        for _ in 0..2 {
            match fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&lock)
            {
                Ok(_) => return Some(Claim { path: lock }),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    let age = fs::metadata(&lock)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok());
                    if age.is_some_and(|a| a > stale) {
                        let _ = fs::remove_file(&lock);
                        continue;
                    }
                    return None;
                }
                Err(e) => {
                    tracing::warn!(lock = %lock.display(), "cannot claim {what}: {e}");
                    return None;
                }
            }
        }
        None
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Keys not to build again before an instant (process-wide: a `static`).
#[derive(Debug)]
pub struct HeldBack(Mutex<Option<HashMap<String, Instant>>>);

impl HeldBack {
    /// An empty set.
    pub const fn new() -> HeldBack {
        HeldBack(Mutex::new(None))
    }

    /// `key` is not built again for `time`.
    pub fn hold(&self, key: &str, time: Duration) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let map = map.get_or_insert_with(HashMap::new);
        let now = Instant::now();
        map.retain(|_, until| *until > now);
        map.insert(key.to_string(), now + time);
    }

    /// Whether `key` is held back now.
    pub fn held(&self, key: &str) -> bool {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.as_ref()
            .and_then(|m| m.get(key))
            .is_some_and(|until| *until > Instant::now())
    }
}

impl Default for HeldBack {
    fn default() -> Self {
        HeldBack::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claim is exclusive until dropped, and a stale lock (a crashed builder's) is
    /// taken over.
    #[test]
    fn a_claim_is_exclusive_until_dropped_or_stale() {
        let dir = tempfile::tempdir().expect("dir");
        let lock = dir.path().join(".k.lock");
        let hour = Duration::from_secs(3600);
        let first = Claim::take(lock.clone(), hour, "a test build").expect("first");
        assert!(Claim::take(lock.clone(), hour, "a test build").is_none());
        drop(first);
        assert!(!lock.exists());
        let second = Claim::take(lock.clone(), hour, "a test build").expect("after a drop");
        // Two hours old: a crashed builder's.
        let f = fs::File::options().write(true).open(&lock).expect("lock");
        f.set_modified(std::time::SystemTime::now() - 2 * hour)
            .expect("mtime");
        std::mem::forget(second);
        assert!(Claim::take(lock, hour, "a test build").is_some());
    }

    /// A held-back key is held until its time; others are not.
    #[test]
    fn a_key_is_held_back_for_its_time() {
        let held = HeldBack::new();
        held.hold("a", Duration::from_secs(3600));
        held.hold("b", Duration::ZERO);
        assert!(held.held("a"));
        assert!(!held.held("b"));
        assert!(!held.held("c"));
    }
}
