//! Searches on PostgreSQL: the same records as on SQLite, plus the search lease.
//!
//! A search's plugin host runs on one node at a time: the node that starts (or resumes)
//! it takes the lease (`host_node`, `host_until`) together with the new token hash, and
//! its heartbeat renews the lease. When the lease runs out (the node died), any node that
//! runs searches may take it over; taking it replaces the token hash, so the old host's
//! plugin calls are refused from then on (fenced out).

use serde_json::Value;
use tokio_postgres::Row;

use super::{PgStore, col, to_i64, to_u64};
use crate::store::{
    ArchiveEntry, LogLine, NewSearch, Result, SearchRecord, StoreError, TimelineEntry, corrupt,
    now_ms,
};

const SEARCH_COLUMNS: &str = "id, problem, proposer, plugin_hash, config_json, seed, \
    budget_candidates, time_limit_ms, llm_tokens, state, summary, error, elapsed_ms, \
    tokens_used, starts, created_at, finished_at, gpu_class, weight, host_node";

fn search_from_row(r: &Row) -> Result<SearchRecord> {
    let id: String = col(r, "id")?;
    let config_json: String = col(r, "config_json")?;
    let summary: Option<String> = col(r, "summary")?;
    Ok(SearchRecord {
        config: serde_json::from_str(&config_json)
            .map_err(|e| corrupt(format!("search {id}"), e))?,
        summary: summary.map(|s| serde_json::from_str(&s).unwrap_or(Value::String(s))),
        problem: col(r, "problem")?,
        proposer: col(r, "proposer")?,
        plugin_hash: col(r, "plugin_hash")?,
        seed: col::<i64>(r, "seed")? as u64,
        budget_candidates: to_u64(col(r, "budget_candidates")?),
        time_limit_ms: to_u64(col(r, "time_limit_ms")?),
        llm_tokens: to_u64(col(r, "llm_tokens")?),
        state: col(r, "state")?,
        error: col(r, "error")?,
        elapsed_ms: to_u64(col(r, "elapsed_ms")?),
        tokens_used: to_u64(col(r, "tokens_used")?),
        starts: to_u64(col(r, "starts")?),
        created_at: col(r, "created_at")?,
        finished_at: col(r, "finished_at")?,
        gpu_class: col(r, "gpu_class")?,
        weight: col(r, "weight")?,
        host_node: col(r, "host_node")?,
        submitted: 0,
        evaluated: 0,
        best: None,
        id,
    })
}

impl PgStore {
    /// Creates a search in state `running`; returns its id.
    pub async fn create_search(&self, s: &NewSearch) -> Result<String> {
        let id = format!("s-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
        if self
            .row("SELECT 1 FROM problems WHERE name = $1", &[&s.problem])
            .await?
            .is_none()
        {
            return Err(StoreError::NotFound(format!("problem {:?}", s.problem)));
        }
        let weight = if s.weight.is_finite() && s.weight > 0.0 {
            s.weight
        } else {
            1.0
        };
        self.exec(
            "INSERT INTO searches (id, problem, proposer, plugin_hash, config_json, seed,
                budget_candidates, time_limit_ms, llm_tokens, state, created_at, gpu_class, weight)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'running', $10, $11, $12)",
            &[
                &id,
                &s.problem,
                &s.proposer,
                &s.plugin_hash,
                &s.config.to_string(),
                &(s.seed as i64),
                &to_i64(s.budget_candidates),
                &to_i64(s.time_limit_ms),
                &to_i64(s.llm_tokens),
                &now_ms(),
                &s.gpu_class,
                &weight,
            ],
        )
        .await?;
        Ok(id)
    }

    async fn fill_search(&self, mut rec: SearchRecord) -> Result<SearchRecord> {
        let counts = self
            .row(
                "SELECT count(*) AS submitted,
                        count(*) FILTER (WHERE EXISTS (
                            SELECT 1 FROM jobs j WHERE j.candidate_id = sc.candidate_id
                              AND j.state IN ('done', 'failed'))) AS evaluated
                 FROM search_candidates sc WHERE sc.search_id = $1",
                &[&rec.id],
            )
            .await?;
        if let Some(r) = counts {
            rec.submitted = to_u64(col(&r, "submitted")?);
            rec.evaluated = to_u64(col(&r, "evaluated")?);
        }
        rec.best = self
            .row(
                "SELECT e.candidate_id, e.median_us FROM evaluations e
                 JOIN search_candidates sc ON sc.candidate_id = e.candidate_id
                 WHERE sc.search_id = $1 AND e.verdict = 'ok' AND e.median_us IS NOT NULL
                   AND NOT e.raced_out AND NOT e.plain
                 ORDER BY e.median_us, e.id LIMIT 1",
                &[&rec.id],
            )
            .await?
            .map(|r| Ok::<_, StoreError>((col(&r, "candidate_id")?, col(&r, "median_us")?)))
            .transpose()?;
        Ok(rec)
    }

    /// A search by id.
    pub async fn get_search(&self, id: &str) -> Result<Option<SearchRecord>> {
        let row = self
            .row(
                &format!("SELECT {SEARCH_COLUMNS} FROM searches WHERE id = $1"),
                &[&id],
            )
            .await?;
        match row {
            Some(r) => Ok(Some(self.fill_search(search_from_row(&r)?).await?)),
            None => Ok(None),
        }
    }

    /// Searches, newest first; only those in `state` when given.
    pub async fn list_searches(&self, state: Option<&str>) -> Result<Vec<SearchRecord>> {
        let rows = self
            .rows(
                &format!(
                    "SELECT {SEARCH_COLUMNS} FROM searches WHERE ($1::text IS NULL OR state = $1)
                     ORDER BY created_at DESC, id"
                ),
                &[&state],
            )
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            out.push(self.fill_search(search_from_row(r)?).await?);
        }
        Ok(out)
    }

    /// This node takes a running search's lease with a new token hash, and counts a
    /// start: when the search has no host, its host's lease ran out, or this node is its
    /// host already. False otherwise (another node runs it) or when it is not running.
    pub async fn start_search(&self, id: &str, token_hash: &str) -> Result<bool> {
        let n = self
            .exec(
                &format!(
                    "UPDATE searches SET token_hash = $2, starts = starts + 1, host_node = $3,
                        host_until = now() + make_interval(secs => $4)
                 WHERE id = $1 AND state = 'running'
                   AND (host_node IS NULL OR host_node = $3 OR host_until IS NULL
                        OR {})",
                    super::lease_ran_out("host_until", "$4")
                ),
                &[&id, &token_hash, &self.node, &self.lease()],
            )
            .await?;
        Ok(n == 1)
    }

    /// Whether the token hash belongs to the running search.
    pub async fn search_for_token(&self, id: &str, token_hash: &str) -> Result<bool> {
        Ok(self
            .row(
                "SELECT 1 FROM searches WHERE id = $1 AND token_hash = $2 AND state = 'running'",
                &[&id, &token_hash],
            )
            .await?
            .is_some())
    }

    /// Ends a running search (a cancelled one stays cancelled); its lease ends with it.
    pub async fn finish_search(
        &self,
        id: &str,
        state: &str,
        summary: Option<&Value>,
        error: Option<&str>,
    ) -> Result<bool> {
        let n = self
            .exec(
                "UPDATE searches SET state = $2, summary = $3, error = $4, finished_at = $5,
                        token_hash = NULL, host_until = NULL
                 WHERE id = $1 AND state = 'running'",
                &[
                    &id,
                    &state,
                    &summary.map(Value::to_string),
                    &error,
                    &now_ms(),
                ],
            )
            .await?;
        Ok(n == 1)
    }

    /// Adds wall time to a search's account.
    pub async fn add_search_elapsed(&self, id: &str, ms: u64) -> Result<()> {
        self.exec(
            "UPDATE searches SET elapsed_ms = elapsed_ms + $2 WHERE id = $1",
            &[&id, &to_i64(ms)],
        )
        .await?;
        Ok(())
    }

    /// Adds LLM tokens to a search's account.
    pub async fn add_search_tokens(&self, id: &str, tokens: u64) -> Result<()> {
        self.exec(
            "UPDATE searches SET tokens_used = tokens_used + $2 WHERE id = $1",
            &[&id, &to_i64(tokens)],
        )
        .await?;
        Ok(())
    }

    /// Stores the plugin's checkpoint.
    pub async fn save_checkpoint(&self, id: &str, bytes: &[u8]) -> Result<()> {
        self.exec(
            "UPDATE searches SET checkpoint = $2 WHERE id = $1",
            &[&id, &bytes],
        )
        .await?;
        Ok(())
    }

    /// The plugin's last checkpoint.
    pub async fn load_checkpoint(&self, id: &str) -> Result<Option<Vec<u8>>> {
        let row = self
            .row("SELECT checkpoint FROM searches WHERE id = $1", &[&id])
            .await?;
        Ok(row
            .map(|r| col::<Option<Vec<u8>>>(&r, "checkpoint"))
            .transpose()?
            .flatten())
    }

    /// Appends to a search's log.
    pub async fn search_log(&self, id: &str, level: &str, message: &str) -> Result<()> {
        self.exec(
            "INSERT INTO search_log (search_id, level, message, created_at) VALUES ($1, $2, $3, $4)",
            &[&id, &level, &message, &now_ms()],
        )
        .await?;
        Ok(())
    }

    /// Lines of a search's log and the bytes of their messages.
    pub async fn search_log_usage(&self, id: &str) -> Result<(u64, u64)> {
        let row = self
            .row(
                "SELECT COUNT(*)::BIGINT AS n, COALESCE(SUM(octet_length(message)), 0)::BIGINT AS b
                 FROM search_log WHERE search_id = $1",
                &[&id],
            )
            .await?;
        let Some(r) = row else {
            return Ok((0, 0));
        };
        let rows: i64 = col(&r, "n")?;
        let bytes: i64 = col(&r, "b")?;
        Ok((rows.max(0) as u64, bytes.max(0) as u64))
    }

    /// A search's log lines after `after`, at most `limit`.
    pub async fn get_search_log(&self, id: &str, after: i64, limit: u32) -> Result<Vec<LogLine>> {
        let rows = self
            .rows(
                "SELECT id, level, message, created_at FROM search_log
                 WHERE search_id = $1 AND id > $2 ORDER BY id LIMIT $3",
                &[&id, &after, &i64::from(limit)],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(LogLine {
                    id: col(r, "id")?,
                    level: col(r, "level")?,
                    message: col(r, "message")?,
                    created_at: col(r, "created_at")?,
                })
            })
            .collect()
    }

    /// The search's archive: every candidate it submitted, in order, with its evaluation.
    pub async fn search_archive(&self, id: &str) -> Result<Vec<ArchiveEntry>> {
        let rows = self
            .rows(
                "SELECT sc.seq, sc.candidate_id, c.parent, c.note,
                        (SELECT j.state FROM jobs j WHERE j.candidate_id = sc.candidate_id
                         ORDER BY j.id DESC LIMIT 1) AS state,
                        (SELECT e.evaluation_json FROM evaluations e
                         WHERE e.candidate_id = sc.candidate_id ORDER BY e.id DESC LIMIT 1) AS eval
                 FROM search_candidates sc JOIN candidates c ON c.id = sc.candidate_id
                 WHERE sc.search_id = $1 ORDER BY sc.seq, sc.created_at",
                &[&id],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let candidate_id: String = col(r, "candidate_id")?;
                let eval: Option<String> = col(r, "eval")?;
                let evaluation = eval
                    .map(|e| {
                        serde_json::from_str(&e)
                            .map_err(|err| corrupt(format!("evaluation of {candidate_id}"), err))
                    })
                    .transpose()?;
                Ok(ArchiveEntry {
                    seq: to_u64(col(r, "seq")?),
                    parent: col(r, "parent")?,
                    note: col(r, "note")?,
                    state: col(r, "state")?,
                    evaluation,
                    candidate_id,
                })
            })
            .collect()
    }

    /// Every candidate search `id` submitted, in submission order, with its times and its
    /// latest evaluation. Empty for an unknown search.
    pub async fn search_timeline(&self, id: &str) -> Result<Vec<TimelineEntry>> {
        let rows = self
            .rows(
                "SELECT sc.seq, sc.candidate_id, c.parent, c.note, sc.created_at AS submitted_at,
                        j.state, j.error, j.finished_at, e.created_at AS evaluated_at,
                        e.evaluation_json
                 FROM search_candidates sc
                 JOIN candidates c ON c.id = sc.candidate_id
                 LEFT JOIN jobs j ON j.id =
                     (SELECT max(j2.id) FROM jobs j2 WHERE j2.candidate_id = sc.candidate_id)
                 LEFT JOIN evaluations e ON e.id =
                     (SELECT max(e2.id) FROM evaluations e2 WHERE e2.candidate_id = sc.candidate_id)
                 WHERE sc.search_id = $1 ORDER BY sc.seq",
                &[&id],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let candidate_id: String = col(r, "candidate_id")?;
                let json: Option<String> = col(r, "evaluation_json")?;
                let evaluation = json
                    .map(|j| {
                        serde_json::from_str(&j)
                            .map_err(|e| corrupt(format!("evaluation of {candidate_id}"), e))
                    })
                    .transpose()?;
                Ok(TimelineEntry {
                    seq: to_u64(col(r, "seq")?),
                    parent: col(r, "parent")?,
                    note: col(r, "note")?,
                    submitted_at: col(r, "submitted_at")?,
                    job_state: col(r, "state")?,
                    job_error: col(r, "error")?,
                    job_finished_at: col(r, "finished_at")?,
                    evaluated_at: col(r, "evaluated_at")?,
                    evaluation,
                    candidate_id,
                })
            })
            .collect()
    }

    /// Running searches this node may host now: its own (after a restart) and those
    /// whose host's lease ran out or that never had a host.
    pub async fn searches_to_host(&self) -> Result<Vec<String>> {
        let rows = self
            .rows(
                &format!(
                    "SELECT id FROM searches WHERE state = 'running'
                       AND (host_node IS NULL OR host_node = $1 OR host_until IS NULL
                            OR {})
                     ORDER BY created_at",
                    super::lease_ran_out("host_until", "$2")
                ),
                &[&self.node, &self.lease()],
            )
            .await?;
        rows.iter().map(|r| col(r, "id")).collect()
    }

    /// Renews the leases of the searches this node hosts; returns the ids it still holds.
    pub async fn renew_search_leases(&self) -> Result<Vec<String>> {
        let rows = self
            .rows(
                "UPDATE searches SET host_until = now() + make_interval(secs => $2)
                 WHERE host_node = $1 AND state = 'running' AND host_until IS NOT NULL
                 RETURNING id",
                &[&self.node, &self.lease()],
            )
            .await?;
        rows.iter().map(|r| col(r, "id")).collect()
    }
}
