//! Per-search bounds on the log a plugin writes (`search.log_max_rows`,
//! `search.log_max_bytes`), so a plugin that floods its log cannot fill the state
//! directory. Lines past the bound are dropped; the search's log says so once when the
//! bound is reached, and once more, with the number dropped, when the plugin host ends.
//! Counts are kept in memory and read back from the store the first time a search logs
//! after kilnd starts, so a search resumed after a restart keeps its bound.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::store::{Result, Store};

/// What to do with one plugin log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// Store it.
    Store,
    /// The bound is reached now: store this notice instead, and drop the line.
    Notice(String),
    /// Past the bound: drop it.
    Drop,
}

#[derive(Debug, Default)]
struct Usage {
    rows: u64,
    bytes: u64,
    dropped: u64,
    noticed: bool,
}

/// The bounds and every search's use of them.
#[derive(Debug)]
pub struct LogQuota {
    max_rows: u64,
    max_bytes: u64,
    used: Mutex<HashMap<String, Usage>>,
}

impl LogQuota {
    /// Bounds of `max_rows` lines and `max_bytes` bytes of messages per search.
    pub fn new(max_rows: u64, max_bytes: u64) -> LogQuota {
        LogQuota {
            max_rows,
            max_bytes,
            used: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Usage>> {
        self.used.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Decides about one line of `bytes` bytes for `search`.
    pub async fn admit(&self, store: &Store, search: &str, bytes: usize) -> Result<Admit> {
        let known = self.lock().contains_key(search);
        if !known {
            // Read outside the lock (a database round trip in a cluster); a line that
            // raced this one in the meantime keeps the counts it already made.
            let (rows, bytes_used) = store.search_log_usage(search).await?;
            let over = rows >= self.max_rows || bytes_used >= self.max_bytes;
            self.lock().entry(search.to_string()).or_insert(Usage {
                rows,
                bytes: bytes_used,
                dropped: 0,
                noticed: over,
            });
        }
        let mut map = self.lock();
        let Some(u) = map.get_mut(search) else {
            return Ok(Admit::Drop);
        };
        let bytes = bytes as u64;
        if u.rows < self.max_rows && u.bytes.saturating_add(bytes) <= self.max_bytes {
            u.rows += 1;
            u.bytes += bytes;
            return Ok(Admit::Store);
        }
        u.dropped += 1;
        if u.noticed {
            return Ok(Admit::Drop);
        }
        u.noticed = true;
        Ok(Admit::Notice(format!(
            "log limit reached ({} lines or {} bytes per search: search.log_max_rows, \
             search.log_max_bytes); further lines from the plugin are dropped",
            self.max_rows, self.max_bytes
        )))
    }

    /// Forgets a search's counts without writing anything (another node hosts it now).
    pub fn forget(&self, search: &str) {
        self.lock().remove(search);
    }

    /// The search's host ended: records how many lines were dropped (if any) and forgets
    /// the search's counts.
    pub async fn close(&self, store: &Store, search: &str) -> Result<()> {
        let dropped = self.lock().remove(search).map_or(0, |u| u.dropped);
        if dropped > 0 {
            store
                .search_log(
                    search,
                    "warn",
                    &format!("log limit reached; {dropped} further lines dropped"),
                )
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_past_the_bound_are_dropped_with_one_notice_and_a_count() {
        let (_dir, store) = crate::store::open_temp();
        store
            .put_problem(&crate::store::sample_spec("p"))
            .await
            .expect("problem");
        let hash = store
            .put_plugin("abuse", b"\0asm fake")
            .await
            .expect("plugin");
        let new = crate::store::NewSearch {
            problem: "p".into(),
            proposer: "abuse".into(),
            plugin_hash: hash,
            config: serde_json::Value::Null,
            seed: 1,
            budget_candidates: 1,
            time_limit_ms: 1000,
            llm_tokens: 0,
            gpu_class: String::new(),
            weight: 1.0,
        };
        let id = &store.create_search(&new).await.expect("search");
        let q = LogQuota::new(3, 1000);
        for _ in 0..3 {
            assert_eq!(q.admit(&store, id, 10).await.expect("admit"), Admit::Store);
            store
                .search_log(id, "info", "0123456789")
                .await
                .expect("log");
        }
        let Admit::Notice(n) = q.admit(&store, id, 10).await.expect("admit") else {
            panic!("no notice at the bound");
        };
        store.search_log(id, "warn", &n).await.expect("log");
        for _ in 0..5 {
            assert_eq!(q.admit(&store, id, 10).await.expect("admit"), Admit::Drop);
        }
        q.close(&store, id).await.expect("close");
        let lines = store.get_search_log(id, 0, 100).await.expect("lines");
        assert_eq!(lines.len(), 5, "{lines:?}");
        assert!(lines[3].message.contains("log limit reached"));
        assert!(
            lines[4].message.contains("6 further lines dropped"),
            "{lines:?}"
        );
        // After a restart the bound holds, without a second notice.
        let q = LogQuota::new(3, 1000);
        assert_eq!(q.admit(&store, id, 1).await.expect("admit"), Admit::Drop);
        // Bytes bound too.
        let q = LogQuota::new(100, 25);
        assert_eq!(
            q.admit(&store, "s2", 20).await.expect("admit"),
            Admit::Store
        );
        assert!(matches!(
            q.admit(&store, "s2", 20).await.expect("admit"),
            Admit::Notice(_)
        ));
    }
}
