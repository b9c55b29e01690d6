//! The plain records on PostgreSQL, with the same meaning as on SQLite: problems,
//! candidates, plugins, baselines, incumbents, verdict counts and LLM calls.

use kiln_types::{BaselineResult, Candidate, Evaluation, ProblemSpec};
use serde_json::Value;
use tokio_postgres::Row;

use super::{PgStore, col, to_i64};
use crate::store::problems::spec_hash;
use crate::store::{
    BaselineSet, CandidateRecord, GpuKey, LlmCallRecord, ProblemSummary, PutProblem, Result,
    StoreError, corrupt, now_ms,
};

fn baseline_set(gpu: &GpuKey, problem: &str, row: &Row) -> Result<BaselineSet> {
    let json: String = col(row, "results_json")?;
    Ok(BaselineSet {
        gpu_model: gpu.model.clone(),
        driver: gpu.driver.clone(),
        problem: problem.to_string(),
        problem_hash: col(row, "problem_hash")?,
        measured_at: col(row, "measured_at")?,
        results: serde_json::from_str(&json)
            .map_err(|e| corrupt(format!("baselines of {problem}"), e))?,
    })
}

impl PgStore {
    /// Registers a problem; the same spec again is a no-op, a different one a conflict.
    pub async fn put_problem(&self, spec: &ProblemSpec) -> Result<PutProblem> {
        let json = serde_json::to_string(spec).map_err(|e| corrupt("problem", e))?;
        let hash = spec_hash(&json);
        let inserted = self
            .exec(
                "INSERT INTO problems (name, spec_json, spec_hash, created_at)
                 VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO NOTHING",
                &[&spec.name, &json, &hash, &now_ms()],
            )
            .await?;
        if inserted == 1 {
            return Ok(PutProblem::Created);
        }
        let row = self
            .row(
                "SELECT spec_hash FROM problems WHERE name = $1",
                &[&spec.name],
            )
            .await?;
        match row.map(|r| col::<String>(&r, "spec_hash")).transpose()? {
            Some(h) if h == hash => Ok(PutProblem::Unchanged),
            _ => Err(StoreError::Conflict(format!(
                "problem {:?} is already registered with a different spec; register it under a new name",
                spec.name
            ))),
        }
    }

    /// The spec of a registered problem.
    pub async fn get_problem(&self, name: &str) -> Result<Option<ProblemSpec>> {
        let row = self
            .row("SELECT spec_json FROM problems WHERE name = $1", &[&name])
            .await?;
        row.map(|r| {
            let json: String = col(&r, "spec_json")?;
            serde_json::from_str(&json).map_err(|e| corrupt(format!("problem {name}"), e))
        })
        .transpose()
    }

    /// Every registered problem, by name.
    pub async fn list_problems(&self) -> Result<Vec<ProblemSummary>> {
        let rows = self
            .rows(
                "SELECT name, spec_json, created_at FROM problems ORDER BY name",
                &[],
            )
            .await?;
        let mut out = Vec::new();
        for r in rows {
            let name: String = col(&r, "name")?;
            let json: String = col(&r, "spec_json")?;
            let spec: ProblemSpec =
                serde_json::from_str(&json).map_err(|e| corrupt(format!("problem {name}"), e))?;
            out.push(ProblemSummary {
                backends: spec.backends(),
                summary: spec.summary,
                name,
                created_at: col(&r, "created_at")?,
            });
        }
        Ok(out)
    }

    /// A candidate with its latest job and evaluation.
    pub async fn get_candidate(&self, id: &str) -> Result<Option<CandidateRecord>> {
        let Some(row) = self
            .row(
                "SELECT candidate_json, backend, created_at FROM candidates WHERE id = $1",
                &[&id],
            )
            .await?
        else {
            return Ok(None);
        };
        let json: String = col(&row, "candidate_json")?;
        let candidate: Candidate =
            serde_json::from_str(&json).map_err(|e| corrupt(format!("candidate {id}"), e))?;
        let job = self
            .row(
                &format!(
                    "SELECT {} FROM jobs WHERE candidate_id = $1 ORDER BY id DESC LIMIT 1",
                    super::queue::JOB_COLUMNS
                ),
                &[&id],
            )
            .await?
            .map(|r| super::queue::job_from_row(&r))
            .transpose()?;
        let evaluation = self.latest_evaluation(id).await?;
        Ok(Some(CandidateRecord {
            id: id.to_string(),
            candidate,
            backend: col(&row, "backend")?,
            created_at: col(&row, "created_at")?,
            job,
            evaluation,
        }))
    }

    /// The newest evaluation of a candidate.
    pub(super) async fn latest_evaluation(&self, candidate_id: &str) -> Result<Option<Evaluation>> {
        let row = self
            .row(
                "SELECT evaluation_json FROM evaluations WHERE candidate_id = $1
                 ORDER BY id DESC LIMIT 1",
                &[&candidate_id],
            )
            .await?;
        row.map(|r| {
            let json: String = col(&r, "evaluation_json")?;
            serde_json::from_str(&json)
                .map_err(|e| corrupt(format!("evaluation of {candidate_id}"), e))
        })
        .transpose()
    }

    /// Ids of the newest candidates, optionally for one problem.
    pub async fn list_candidates(&self, problem: Option<&str>, limit: u32) -> Result<Vec<String>> {
        let rows = self
            .rows(
                "SELECT id FROM candidates WHERE ($1::text IS NULL OR problem = $1)
                 ORDER BY created_at DESC, id LIMIT $2",
                &[&problem, &i64::from(limit)],
            )
            .await?;
        rows.iter().map(|r| col(r, "id")).collect()
    }

    /// Stores a plugin's bytes; returns their hash (the same bytes again are a no-op).
    pub async fn put_plugin(&self, name: &str, wasm: &[u8]) -> Result<String> {
        let hash = blake3::hash(wasm).to_hex()[..32].to_string();
        self.exec(
            "INSERT INTO plugins (hash, name, wasm, created_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (hash) DO NOTHING",
            &[&hash, &name, &wasm, &now_ms()],
        )
        .await?;
        Ok(hash)
    }

    /// A stored plugin's bytes.
    pub async fn get_plugin(&self, hash: &str) -> Result<Option<Vec<u8>>> {
        let row = self
            .row("SELECT wasm FROM plugins WHERE hash = $1", &[&hash])
            .await?;
        row.map(|r| col(&r, "wasm")).transpose()
    }

    /// Number of evaluations per verdict.
    pub async fn verdict_counts(&self) -> Result<Vec<(String, i64)>> {
        let rows = self
            .rows(
                "SELECT verdict, count(*) AS n FROM evaluations GROUP BY verdict ORDER BY verdict",
                &[],
            )
            .await?;
        rows.iter()
            .map(|r| Ok((col(r, "verdict")?, col(r, "n")?)))
            .collect()
    }

    /// The incumbent's upper bound (µs) within a search.
    pub async fn search_incumbent_upper(&self, search_id: &str) -> Result<Option<f64>> {
        let row = self
            .row(
                "SELECT min(e.upper_us) AS upper FROM evaluations e
                 JOIN search_candidates sc ON sc.candidate_id = e.candidate_id
                 WHERE sc.search_id = $1 AND e.verdict = 'ok' AND NOT e.raced_out AND NOT e.plain",
                &[&search_id],
            )
            .await?;
        Ok(row
            .map(|r| col::<Option<f64>>(&r, "upper"))
            .transpose()?
            .flatten())
    }

    /// The incumbent's upper bound (µs) among a problem's evaluations on a backend; with
    /// a class, only evaluations timed on that class count (times from other GPUs are
    /// not comparable).
    pub async fn problem_incumbent_upper(
        &self,
        problem: &str,
        backend: &str,
        gpu_class: &str,
    ) -> Result<Option<f64>> {
        let row = self
            .row(
                "SELECT min(e.upper_us) AS upper FROM evaluations e
                 JOIN candidates c ON c.id = e.candidate_id
                 WHERE c.problem = $1 AND c.backend = $2 AND e.verdict = 'ok'
                   AND NOT e.raced_out AND NOT e.plain
                   AND ($3 = '' OR e.gpu_class = $3)",
                &[&problem, &backend, &gpu_class],
            )
            .await?;
        Ok(row
            .map(|r| col::<Option<f64>>(&r, "upper"))
            .transpose()?
            .flatten())
    }

    /// Stores (or replaces) the baselines of a registered problem on `gpu`.
    pub async fn put_baselines(
        &self,
        gpu: &GpuKey,
        problem: &str,
        results: &[BaselineResult],
    ) -> Result<BaselineSet> {
        let json = serde_json::to_string(results).map_err(|e| corrupt("baselines", e))?;
        let hash: String = self
            .row(
                "SELECT spec_hash FROM problems WHERE name = $1",
                &[&problem],
            )
            .await?
            .map(|r| col(&r, "spec_hash"))
            .transpose()?
            .ok_or_else(|| StoreError::NotFound(format!("problem {problem:?}")))?;
        let at = now_ms();
        self.exec(
            "INSERT INTO baselines (gpu_model, driver, problem, problem_hash, results_json, measured_at)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (gpu_model, driver, problem, problem_hash)
             DO UPDATE SET results_json = excluded.results_json, measured_at = excluded.measured_at",
            &[&gpu.model, &gpu.driver, &problem, &hash, &json, &at],
        )
        .await?;
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
    pub async fn get_baselines(&self, gpu: &GpuKey, problem: &str) -> Result<Option<BaselineSet>> {
        let row = self
            .row(
                "SELECT b.problem_hash, b.results_json, b.measured_at
                 FROM baselines b JOIN problems p
                   ON p.name = b.problem AND p.spec_hash = b.problem_hash
                 WHERE b.gpu_model = $1 AND b.driver = $2 AND b.problem = $3",
                &[&gpu.model, &gpu.driver, &problem],
            )
            .await?;
        row.map(|r| baseline_set(gpu, problem, &r)).transpose()
    }

    /// Every stored baseline set of `problem` (any GPU, current spec only), newest first.
    pub async fn list_baselines(&self, problem: &str) -> Result<Vec<BaselineSet>> {
        let rows = self
            .rows(
                "SELECT b.gpu_model, b.driver, b.problem_hash, b.results_json, b.measured_at
                 FROM baselines b JOIN problems p
                   ON p.name = b.problem AND p.spec_hash = b.problem_hash
                 WHERE b.problem = $1 ORDER BY b.measured_at DESC",
                &[&problem],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let gpu = GpuKey {
                    model: col(r, "gpu_model")?,
                    driver: col(r, "driver")?,
                };
                baseline_set(&gpu, problem, r)
            })
            .collect()
    }

    /// Records one LLM call.
    pub async fn record_llm_call(&self, c: &LlmCallRecord) -> Result<()> {
        self.exec(
            "INSERT INTO llm_calls (search_id, provider, model, request_json, reply_json, error,
                prompt_tokens, completion_tokens, attempts, latency_ms, cost, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            &[
                &c.search_id,
                &c.provider,
                &c.model,
                &c.request.to_string(),
                &c.reply.as_ref().map(Value::to_string),
                &c.error,
                &to_i64(c.prompt_tokens),
                &to_i64(c.completion_tokens),
                &i32::try_from(c.attempts).unwrap_or(i32::MAX),
                &c.latency_ms,
                &c.cost,
                &now_ms(),
            ],
        )
        .await?;
        Ok(())
    }

    /// LLM calls of a search, oldest first.
    pub async fn llm_calls(&self, search: &str) -> Result<Vec<Value>> {
        let rows = self
            .rows(
                "SELECT provider, model, request_json, reply_json, error, prompt_tokens,
                        completion_tokens, attempts, latency_ms, cost, created_at
                 FROM llm_calls WHERE search_id = $1 ORDER BY id",
                &[&search],
            )
            .await?;
        let parse = |s: Option<String>| {
            s.map(|s| serde_json::from_str::<Value>(&s).unwrap_or(Value::String(s)))
        };
        rows.iter()
            .map(|r| {
                Ok(serde_json::json!({
                    "provider": col::<String>(r, "provider")?,
                    "model": col::<Option<String>>(r, "model")?,
                    "request": parse(col(r, "request_json")?),
                    "reply": parse(col(r, "reply_json")?),
                    "error": col::<Option<String>>(r, "error")?,
                    "prompt_tokens": col::<i64>(r, "prompt_tokens")?,
                    "completion_tokens": col::<i64>(r, "completion_tokens")?,
                    "attempts": i64::from(col::<i32>(r, "attempts")?),
                    "latency_ms": col::<f64>(r, "latency_ms")?,
                    "cost": col::<Option<f64>>(r, "cost")?,
                    "created_at": col::<i64>(r, "created_at")?,
                }))
            })
            .collect()
    }
}
