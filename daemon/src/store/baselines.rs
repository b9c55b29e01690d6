//! Baseline times per (GPU model, driver version, problem + spec hash): measured once on
//! this machine's GPU and reused until someone asks to re-measure.

use kiln_types::BaselineResult;
use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use super::{Result, SqliteStore, StoreError, corrupt, now_ms};

/// Which GPU a baseline was measured on: its model and driver version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuKey {
    /// Marketing name (`NVIDIA H200`).
    pub model: String,
    /// Driver version (`580.159.04`).
    pub driver: String,
}

/// The baselines of one problem on one GPU model and driver.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BaselineSet {
    /// GPU model.
    pub gpu_model: String,
    /// Driver version.
    pub driver: String,
    /// Problem name.
    pub problem: String,
    /// The problem's spec hash when measured.
    pub problem_hash: String,
    /// When measured, ms since the epoch.
    pub measured_at: i64,
    /// One entry per baseline.
    pub results: Vec<BaselineResult>,
}

/// A candidate's speedup against one measured baseline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Speedup {
    /// The baseline (`reference`, `cublas-fp32`, `torch-eager-tf32`, ...).
    pub baseline: String,
    /// Its precision label.
    pub precision: String,
    /// Its median, µs.
    pub baseline_us: f64,
    /// `baseline_us / candidate median`: above 1 is faster than the baseline.
    pub speedup: f64,
    /// How the baseline was timed.
    pub harness: kiln_types::baseline::Harness,
    /// Whether the candidate was timed by the same harness: the figure to rank by (a
    /// hosted candidate against a hosted baseline, any other against an in-process one).
    pub same_harness: bool,
}

impl BaselineSet {
    /// Speedup of a candidate with median `median_us`, timed by `harness`, against each
    /// measured baseline.
    pub fn speedups(&self, median_us: f64, harness: kiln_types::baseline::Harness) -> Vec<Speedup> {
        if !(median_us.is_finite() && median_us > 0.0) {
            return Vec::new();
        }
        self.results
            .iter()
            .filter_map(|r| {
                let b = r.median_us()?;
                Some(Speedup {
                    baseline: r.name.clone(),
                    precision: r.precision.clone(),
                    baseline_us: b,
                    speedup: b / median_us,
                    harness: r.harness,
                    same_harness: r.harness == harness,
                })
            })
            .collect()
    }
}

impl SqliteStore {
    /// Stores (or replaces) the baselines of a registered problem on `gpu`.
    pub fn put_baselines(
        &self,
        gpu: &GpuKey,
        problem: &str,
        results: &[BaselineResult],
    ) -> Result<BaselineSet> {
        let json = serde_json::to_string(results).map_err(|e| corrupt("baselines", e))?;
        let conn = self.lock();
        let hash: String = conn
            .query_row(
                "SELECT spec_hash FROM problems WHERE name = ?1",
                [problem],
                |r| r.get(0),
            )
            .optional()?
            .ok_or_else(|| StoreError::NotFound(format!("problem {problem:?}")))?;
        let at = now_ms();
        conn.execute(
            "INSERT OR REPLACE INTO baselines
                 (gpu_model, driver, problem, problem_hash, results_json, measured_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![gpu.model, gpu.driver, problem, hash, json, at],
        )?;
        Ok(BaselineSet {
            gpu_model: gpu.model.clone(),
            driver: gpu.driver.clone(),
            problem: problem.to_string(),
            problem_hash: hash,
            measured_at: at,
            results: results.to_vec(),
        })
    }

    /// The baselines of `problem` (as registered now) on `gpu`, if measured.
    pub fn get_baselines(&self, gpu: &GpuKey, problem: &str) -> Result<Option<BaselineSet>> {
        let conn = self.lock();
        let row: Option<(String, String, i64)> = conn
            .query_row(
                "SELECT b.problem_hash, b.results_json, b.measured_at
                 FROM baselines b JOIN problems p
                   ON p.name = b.problem AND p.spec_hash = b.problem_hash
                 WHERE b.gpu_model = ?1 AND b.driver = ?2 AND b.problem = ?3",
                params![gpu.model, gpu.driver, problem],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        row.map(|(hash, json, at)| {
            let results = serde_json::from_str(&json)
                .map_err(|e| corrupt(format!("baselines of {problem}"), e))?;
            Ok(BaselineSet {
                gpu_model: gpu.model.clone(),
                driver: gpu.driver.clone(),
                problem: problem.to_string(),
                problem_hash: hash,
                measured_at: at,
                results,
            })
        })
        .transpose()
    }

    /// Every stored baseline set of `problem` (any GPU, current spec only), newest first.
    pub fn list_baselines(&self, problem: &str) -> Result<Vec<BaselineSet>> {
        let conn = self.lock();
        let mut stmt = conn.prepare(
            "SELECT b.gpu_model, b.driver, b.problem_hash, b.results_json, b.measured_at
             FROM baselines b JOIN problems p
               ON p.name = b.problem AND p.spec_hash = b.problem_hash
             WHERE b.problem = ?1 ORDER BY b.measured_at DESC",
        )?;
        let rows = stmt.query_map([problem], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, i64>(4)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (gpu_model, driver, problem_hash, json, measured_at) = row?;
            out.push(BaselineSet {
                results: serde_json::from_str(&json)
                    .map_err(|e| corrupt(format!("baselines of {problem}"), e))?,
                gpu_model,
                driver,
                problem: problem.to_string(),
                problem_hash,
                measured_at,
            });
        }
        Ok(out)
    }
}

/// A `reference` baseline measured at `us` µs, for tests.
#[cfg(test)]
pub(crate) fn measured_reference(us: f64) -> BaselineResult {
    use kiln_types::TimingStats;
    use kiln_types::baseline::{BaselineStatus, precision};
    let mut r = BaselineResult::not_measured(
        "reference",
        "kiln",
        precision::REFERENCE,
        BaselineStatus::Measured,
        "",
    );
    r.timing = Some(TimingStats {
        median_us: us,
        ..TimingStats::default()
    });
    r
}
