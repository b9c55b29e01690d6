//! Registered problems, stored as their full spec (sources inlined).

use kiln_types::BackendKind;
use kiln_types::ProblemSpec;
use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use super::{Result, SqliteStore, StoreError, corrupt, now_ms};

/// What registering a problem did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutProblem {
    /// It was new.
    Created,
    /// The same spec was already registered.
    Unchanged,
}

/// One line of the problem list.
#[derive(Debug, Clone, Serialize)]
pub struct ProblemSummary {
    /// Name.
    pub name: String,
    /// One-line summary.
    pub summary: String,
    /// Backends with a reference.
    pub backends: Vec<BackendKind>,
    /// Registration time, ms since the epoch.
    pub created_at: i64,
}

pub(super) fn spec_hash(json: &str) -> String {
    blake3::hash(json.as_bytes()).to_hex()[..32].to_string()
}

impl SqliteStore {
    /// Registers a problem. Registering the same spec again is a no-op; a different spec
    /// under a registered name is a conflict (results would silently change meaning).
    pub fn put_problem(&self, spec: &ProblemSpec) -> Result<PutProblem> {
        let json = serde_json::to_string(spec).map_err(|e| corrupt("problem", e))?;
        let hash = spec_hash(&json);
        let conn = self.lock();
        let existing: Option<String> = conn
            .query_row(
                "SELECT spec_hash FROM problems WHERE name = ?1",
                [&spec.name],
                |r| r.get(0),
            )
            .optional()?;
        match existing {
            Some(h) if h == hash => Ok(PutProblem::Unchanged),
            Some(_) => Err(StoreError::Conflict(format!(
                "problem {:?} is already registered with a different spec; register it under a new name",
                spec.name
            ))),
            None => {
                conn.execute(
                    "INSERT INTO problems (name, spec_json, spec_hash, created_at) VALUES (?1, ?2, ?3, ?4)",
                    params![spec.name, json, hash, now_ms()],
                )?;
                Ok(PutProblem::Created)
            }
        }
    }

    /// The spec of a registered problem.
    pub fn get_problem(&self, name: &str) -> Result<Option<ProblemSpec>> {
        let conn = self.lock();
        let json: Option<String> = conn
            .query_row(
                "SELECT spec_json FROM problems WHERE name = ?1",
                [name],
                |r| r.get(0),
            )
            .optional()?;
        json.map(|j| serde_json::from_str(&j).map_err(|e| corrupt(format!("problem {name}"), e)))
            .transpose()
    }

    /// Every registered problem, by name.
    pub fn list_problems(&self) -> Result<Vec<ProblemSummary>> {
        let conn = self.lock();
        let mut stmt =
            conn.prepare("SELECT name, spec_json, created_at FROM problems ORDER BY name")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (name, json, created_at) = row?;
            let spec: ProblemSpec =
                serde_json::from_str(&json).map_err(|e| corrupt(format!("problem {name}"), e))?;
            out.push(ProblemSummary {
                backends: spec.backends(),
                summary: spec.summary,
                name,
                created_at,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
pub(crate) fn sample_spec(name: &str) -> ProblemSpec {
    let text = format!(
        r#"
name = "{name}"
summary = "y = 2x"
[[tensor]]
name = "x"
dtype = "f32"
shape = [16]
role = "input"
[[tensor]]
name = "y"
dtype = "f32"
shape = [16]
role = "output"
[tolerance]
atol = 1e-6
rtol = 1e-6
[reference.host]
file = "reference.c"
source = "void ref(const float*x,float*y){{for(int i=0;i<16;i++)y[i]=2*x[i];}}"
launches = [{{ kernel = "ref", args = ["x", "y"] }}]
"#
    );
    ProblemSpec::from_toml(&text).expect("sample spec")
}
