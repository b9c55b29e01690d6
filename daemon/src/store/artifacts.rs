//! The compile cache: compiled artifacts keyed by what determines them.

use kiln_types::CompileInfo;
use rusqlite::{OptionalExtension, params};

use super::{Result, SqliteStore, corrupt, now_ms};

/// A cached compile result.
#[derive(Debug, Clone)]
pub struct Artifact {
    /// The compiled bytes (a shared object, a cubin...).
    pub bytes: Vec<u8>,
    /// What the compile reported.
    pub info: CompileInfo,
}

impl SqliteStore {
    /// A cached artifact.
    pub fn get_artifact(&self, key: &str) -> Result<Option<Artifact>> {
        let conn = self.lock();
        let row: Option<(Vec<u8>, String)> = conn
            .query_row(
                "SELECT bytes, compile_json FROM artifacts WHERE key = ?1",
                [key],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        row.map(|(bytes, json)| {
            let info =
                serde_json::from_str(&json).map_err(|e| corrupt(format!("artifact {key}"), e))?;
            Ok(Artifact { bytes, info })
        })
        .transpose()
    }

    /// Caches an artifact (replacing one under the same key).
    pub fn put_artifact(&self, key: &str, backend: &str, artifact: &Artifact) -> Result<()> {
        let json = serde_json::to_string(&artifact.info).map_err(|e| corrupt("compile info", e))?;
        self.lock().execute(
            "INSERT OR REPLACE INTO artifacts (key, backend, bytes, compile_json, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![key, backend, artifact.bytes, json, now_ms()],
        )?;
        Ok(())
    }
}
