//! The SQLite store: one database in WAL mode under the state directory.
//!
//! On one host it holds everything; in a cluster it keeps only what belongs to this node
//! (the compile cache and the clock journal). Every write that the API acknowledges is
//! committed before the reply (synchronous = FULL), so an accepted job survives `kill -9`.
//! The schema is versioned with `PRAGMA user_version`; migrations run at start and the
//! result is read back and checked before the daemon serves. Cheap operations run under
//! one mutex; SQLite itself is fast enough for the rates one kilnd sees (a few hundred
//! writes a second).

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::Connection;

use super::{Result, StoreError, migrations};

/// The SQLite database handle.
pub struct SqliteStore {
    conn: Mutex<Connection>,
    /// This node's id, recorded on the jobs it claims and the evaluations it stores.
    pub(super) node: String,
}

impl SqliteStore {
    /// Opens (creating if needed) `DIR/kiln.db`, applies migrations and checks the schema.
    pub fn open(state_dir: &Path, node: &str) -> Result<Self> {
        let path = state_dir.join("kiln.db");
        let conn = Connection::open(&path)?;
        Self::init(conn, node)
    }

    fn init(mut conn: Connection, node: &str) -> Result<Self> {
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Schema(format!(
                "journal_mode is {mode:?}, WAL was asked for"
            )));
        }
        conn.pragma_update(None, "synchronous", "FULL")?;
        migrations::apply(&mut conn)?;
        migrations::check(&conn)?;
        Ok(SqliteStore {
            conn: Mutex::new(conn),
            node: node.to_string(),
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave SQLite half-written (statements are
        // atomic), so a poisoned mutex is safe to keep using.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }
}
