//! The durable store: one SQLite database in WAL mode under the state directory.
//!
//! It holds problems, candidates, jobs, evaluations and the compile cache. Every write that
//! the API acknowledges is committed before the reply (synchronous = FULL), so an accepted
//! job survives `kill -9`. The schema is versioned with `PRAGMA user_version`; migrations
//! run at start and the result is read back and checked before the daemon serves.

mod artifacts;
mod baselines;
mod candidates;
mod clocks;
mod incumbents;
mod jobs;
mod migrations;
mod problems;
mod searches;
mod timeline;

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::Connection;
use thiserror::Error;

pub use artifacts::Artifact;
pub use baselines::{BaselineSet, GpuKey, Speedup};
pub use candidates::{CandidateRecord, Submitted};
pub use jobs::{JobRecord, JobState};
pub use problems::{ProblemSummary, PutProblem};
pub use searches::{ArchiveEntry, LlmCallRecord, LogLine, NewSearch, SearchRecord};
pub use timeline::TimelineEntry;

/// Errors from the store.
#[derive(Debug, Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A stored JSON document did not parse (the database was changed by hand or is damaged).
    #[error("stored record {what} is damaged: {message}")]
    Corrupt {
        /// Which record.
        what: String,
        /// The parse error.
        message: String,
    },
    /// The database's schema is newer than this kilnd or does not match what it expects.
    #[error("database schema: {0}")]
    Schema(String),
    /// A named thing does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// A write conflicts with what is stored.
    #[error("{0}")]
    Conflict(String),
}

/// Result alias for the store.
pub type Result<T> = std::result::Result<T, StoreError>;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The database handle. Cheap operations run under one mutex; SQLite itself is fast
/// enough for the rates kilnd sees (a few hundred writes a second).
pub struct Store {
    conn: Mutex<Connection>,
}

impl Store {
    /// Opens (creating if needed) `DIR/kiln.db`, applies migrations and checks the schema.
    pub fn open(state_dir: &Path) -> Result<Self> {
        let path = state_dir.join("kiln.db");
        let conn = Connection::open(&path)?;
        Self::init(conn)
    }

    fn init(mut conn: Connection) -> Result<Self> {
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Schema(format!(
                "journal_mode is {mode:?}, WAL was asked for"
            )));
        }
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        migrations::apply(&mut conn)?;
        migrations::check(&conn)?;
        Ok(Store {
            conn: Mutex::new(conn),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave SQLite half-written (statements are
        // atomic), so a poisoned mutex is safe to keep using.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn corrupt(what: impl Into<String>, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        what: what.into(),
        message: e.to_string(),
    }
}

#[cfg(test)]
pub(crate) use problems::sample_spec;
#[cfg(test)]
pub(crate) use searches::sample_search;

#[cfg(test)]
pub(crate) fn open_temp() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open store");
    (dir, store)
}
