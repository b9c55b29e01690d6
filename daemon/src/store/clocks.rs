//! The clock-lock journal (see `kiln_gpu::telemetry::ClockPolicy`): lock intents and
//! releases per GPU, so clocks a crashed daemon left locked are reset at the next start.

use kiln_sandbox::kiln_gpu::telemetry::ClockEvent;
use rusqlite::params;

use super::{Result, SqliteStore, corrupt, now_ms};

impl SqliteStore {
    /// Appends a clock event (SQLite commits it durably before returning: WAL with
    /// `synchronous = FULL`).
    pub fn journal_clock_event(&self, event: &ClockEvent) -> Result<()> {
        let gpu = match event {
            ClockEvent::LockIntent { gpu, .. } | ClockEvent::Released { gpu } => gpu,
        };
        let json = serde_json::to_string(event).map_err(|e| corrupt("clock event", e))?;
        self.lock().execute(
            "INSERT INTO clock_journal (gpu, event_json, created_at) VALUES (?1, ?2, ?3)",
            params![gpu, json, now_ms()],
        )?;
        Ok(())
    }

    /// The last clock event of every GPU that has one.
    pub fn last_clock_events(&self) -> Result<Vec<ClockEvent>> {
        let conn = self.lock();
        let mut stmt = conn.prepare(
            "SELECT event_json FROM clock_journal WHERE id IN
               (SELECT max(id) FROM clock_journal GROUP BY gpu) ORDER BY id",
        )?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        let mut out = Vec::new();
        for json in rows {
            let json = json?;
            out.push(serde_json::from_str(&json).map_err(|e| corrupt("clock event", e))?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use kiln_sandbox::kiln_gpu::telemetry::LockSetting;

    use super::*;

    #[test]
    fn last_event_per_gpu() {
        let (_dir, store) = crate::store::sqlite_temp();
        assert!(store.last_clock_events().expect("read").is_empty());
        let lock = |gpu: &str| ClockEvent::LockIntent {
            gpu: gpu.into(),
            setting: LockSetting::Base,
        };
        store.journal_clock_event(&lock("GPU-a")).expect("write");
        store
            .journal_clock_event(&ClockEvent::Released {
                gpu: "GPU-a".into(),
            })
            .expect("write");
        store.journal_clock_event(&lock("GPU-b")).expect("write");
        let last = store.last_clock_events().expect("read");
        assert_eq!(
            last,
            vec![
                ClockEvent::Released {
                    gpu: "GPU-a".into()
                },
                lock("GPU-b")
            ]
        );
    }
}
