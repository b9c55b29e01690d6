//! Searches: the proposer plugin they run, their state, checkpoint, log and archive, and
//! the LLM calls made on their behalf.

use rusqlite::{OptionalExtension, Row, params};
use serde::Serialize;
use serde_json::Value;

use super::{Result, SqliteStore, StoreError, corrupt, now_ms};

/// What starting a search needs.
#[derive(Debug, Clone)]
pub struct NewSearch {
    /// Problem name.
    pub problem: String,
    /// Proposer name (as given, or the wasm file's stem).
    pub proposer: String,
    /// Hash of the stored plugin.
    pub plugin_hash: String,
    /// The plugin's config, passed to its `run`.
    pub config: Value,
    /// Seed for the plugin's randomness.
    pub seed: u64,
    /// Most distinct candidates the search may submit.
    pub budget_candidates: u64,
    /// Wall-clock limit across restarts, ms.
    pub time_limit_ms: u64,
    /// LLM tokens the search may spend.
    pub llm_tokens: u64,
    /// The GPU class its candidates are evaluated on (`""`: any class of the backend).
    pub gpu_class: String,
    /// Its share of the lanes against other searches (fair queuing weight, > 0).
    pub weight: f64,
}

/// A search as stored, with its progress.
#[derive(Debug, Clone, Serialize)]
pub struct SearchRecord {
    /// Search id.
    pub id: String,
    /// Problem name.
    pub problem: String,
    /// Proposer name.
    pub proposer: String,
    /// Plugin hash.
    pub plugin_hash: String,
    /// Plugin config.
    pub config: Value,
    /// Seed.
    pub seed: u64,
    /// Candidate budget.
    pub budget_candidates: u64,
    /// Time limit, ms.
    pub time_limit_ms: u64,
    /// LLM token budget.
    pub llm_tokens: u64,
    /// `running`, `done`, `failed`, `cancelled`.
    pub state: String,
    /// What the plugin returned.
    pub summary: Option<Value>,
    /// Why it failed.
    pub error: Option<String>,
    /// Time spent running, ms, across restarts.
    pub elapsed_ms: u64,
    /// LLM tokens used.
    pub tokens_used: u64,
    /// Times the plugin was started (restarts after a daemon restart included).
    pub starts: u64,
    /// Created at, ms since the epoch.
    pub created_at: i64,
    /// Finished at.
    pub finished_at: Option<i64>,
    /// Distinct candidates submitted.
    pub submitted: u64,
    /// Of those, evaluated (job done or failed).
    pub evaluated: u64,
    /// Best `ok` candidate so far: (candidate id, median µs); raced-out and plain timings
    /// never count.
    pub best: Option<(String, f64)>,
    /// The GPU class its candidates are evaluated on.
    pub gpu_class: String,
    /// Its fair-share weight.
    pub weight: f64,
    /// The node running its plugin host (in a cluster; `None` on one host).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_node: Option<String>,
}

/// One entry of a search's archive.
#[derive(Debug, Clone, Serialize)]
pub struct ArchiveEntry {
    /// Order of submission within the search.
    pub seq: u64,
    /// Candidate id.
    pub candidate_id: String,
    /// Parent candidate, if any.
    pub parent: Option<String>,
    /// The proposer's note.
    pub note: Option<String>,
    /// Job state.
    pub state: Option<String>,
    /// The full evaluation, once there is one.
    pub evaluation: Option<Value>,
}

/// One line of a search's log.
#[derive(Debug, Clone, Serialize)]
pub struct LogLine {
    /// Monotonic id (for paging with `after`).
    pub id: i64,
    /// `debug`, `info`, `warn`, `error`.
    pub level: String,
    /// The text.
    pub message: String,
    /// When.
    pub created_at: i64,
}

/// An LLM call to record.
#[derive(Debug, Clone, Default)]
pub struct LlmCallRecord {
    /// Search that made it.
    pub search_id: Option<String>,
    /// Provider name.
    pub provider: String,
    /// Model.
    pub model: Option<String>,
    /// The request (messages, options).
    pub request: Value,
    /// The reply, when there was one.
    pub reply: Option<Value>,
    /// The error, when it failed.
    pub error: Option<String>,
    /// Tokens in the prompt.
    pub prompt_tokens: u64,
    /// Tokens in the completion.
    pub completion_tokens: u64,
    /// Attempts made (retries + 1).
    pub attempts: u32,
    /// Wall time of the whole call, ms.
    pub latency_ms: f64,
    /// Cost, when prices are configured.
    pub cost: Option<f64>,
}

const SEARCH_COLUMNS: &str = "id, problem, proposer, plugin_hash, config_json, seed, \
    budget_candidates, time_limit_ms, llm_tokens, state, summary, error, elapsed_ms, \
    tokens_used, starts, created_at, finished_at, gpu_class, weight";

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn search_from_row(r: &Row<'_>) -> rusqlite::Result<(SearchRecord, String, Option<String>)> {
    let config_json: String = r.get(4)?;
    let summary_json: Option<String> = r.get(10)?;
    Ok((
        SearchRecord {
            id: r.get(0)?,
            problem: r.get(1)?,
            proposer: r.get(2)?,
            plugin_hash: r.get(3)?,
            config: Value::Null,
            seed: r.get::<_, i64>(5).map(|s| s as u64)?,
            budget_candidates: to_u64(r.get(6)?),
            time_limit_ms: to_u64(r.get(7)?),
            llm_tokens: to_u64(r.get(8)?),
            state: r.get(9)?,
            summary: None,
            error: r.get(11)?,
            elapsed_ms: to_u64(r.get(12)?),
            tokens_used: to_u64(r.get(13)?),
            starts: to_u64(r.get(14)?),
            created_at: r.get(15)?,
            finished_at: r.get(16)?,
            submitted: 0,
            evaluated: 0,
            best: None,
            gpu_class: r.get(17)?,
            weight: r.get(18)?,
            host_node: None,
        },
        config_json,
        summary_json,
    ))
}

impl SqliteStore {
    /// Stores a plugin's wasm bytes; returns their hash. Storing the same bytes is a no-op.
    pub fn put_plugin(&self, name: &str, wasm: &[u8]) -> Result<String> {
        let hash = blake3::hash(wasm).to_hex()[..32].to_string();
        self.lock().execute(
            "INSERT OR IGNORE INTO plugins (hash, name, wasm, created_at) VALUES (?1, ?2, ?3, ?4)",
            params![hash, name, wasm, now_ms()],
        )?;
        Ok(hash)
    }

    /// A stored plugin's bytes.
    pub fn get_plugin(&self, hash: &str) -> Result<Option<Vec<u8>>> {
        Ok(self
            .lock()
            .query_row("SELECT wasm FROM plugins WHERE hash = ?1", [hash], |r| {
                r.get(0)
            })
            .optional()?)
    }

    /// Creates a search in state `running`; returns its id.
    pub fn create_search(&self, s: &NewSearch) -> Result<String> {
        let id = format!("s-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
        let conn = self.lock();
        let known: bool = conn
            .query_row(
                "SELECT 1 FROM problems WHERE name = ?1",
                [&s.problem],
                |_| Ok(()),
            )
            .optional()?
            .is_some();
        if !known {
            return Err(StoreError::NotFound(format!("problem {:?}", s.problem)));
        }
        conn.execute(
            "INSERT INTO searches (id, problem, proposer, plugin_hash, config_json, seed,
                budget_candidates, time_limit_ms, llm_tokens, state, created_at, gpu_class, weight)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'running', ?10, ?11, ?12)",
            params![
                id,
                s.problem,
                s.proposer,
                s.plugin_hash,
                s.config.to_string(),
                s.seed as i64,
                to_i64(s.budget_candidates),
                to_i64(s.time_limit_ms),
                to_i64(s.llm_tokens),
                now_ms(),
                s.gpu_class,
                s.weight
            ],
        )?;
        Ok(id)
    }

    fn fill_search(
        &self,
        conn: &rusqlite::Connection,
        raw: (SearchRecord, String, Option<String>),
    ) -> Result<SearchRecord> {
        let (mut rec, config_json, summary_json) = raw;
        rec.config = serde_json::from_str(&config_json)
            .map_err(|e| corrupt(format!("search {}", rec.id), e))?;
        rec.summary = summary_json.map(|s| serde_json::from_str(&s).unwrap_or(Value::String(s)));
        let (submitted, evaluated): (i64, i64) = conn.query_row(
            "SELECT count(*),
                    count(*) FILTER (WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.candidate_id = sc.candidate_id
                                                   AND j.state IN ('done', 'failed')))
             FROM search_candidates sc WHERE sc.search_id = ?1",
            [&rec.id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        rec.submitted = to_u64(submitted);
        rec.evaluated = to_u64(evaluated);
        rec.best = conn
            .query_row(
                "SELECT e.candidate_id, min(e.median_us) FROM evaluations e
                 JOIN search_candidates sc ON sc.candidate_id = e.candidate_id
                 WHERE sc.search_id = ?1 AND e.verdict = 'ok' AND e.median_us IS NOT NULL
                   AND e.raced_out = 0 AND e.plain = 0",
                [&rec.id],
                |r| Ok((r.get::<_, Option<String>>(0)?, r.get::<_, Option<f64>>(1)?)),
            )
            .optional()?
            .and_then(|(c, m)| Some((c?, m?)));
        Ok(rec)
    }

    /// A search by id.
    pub fn get_search(&self, id: &str) -> Result<Option<SearchRecord>> {
        let conn = self.lock();
        let raw = conn
            .query_row(
                &format!("SELECT {SEARCH_COLUMNS} FROM searches WHERE id = ?1"),
                [id],
                search_from_row,
            )
            .optional()?;
        raw.map(|r| self.fill_search(&conn, r)).transpose()
    }

    /// Searches, newest first; only those in `state` when given.
    pub fn list_searches(&self, state: Option<&str>) -> Result<Vec<SearchRecord>> {
        let conn = self.lock();
        let mut stmt = conn.prepare(&format!(
            "SELECT {SEARCH_COLUMNS} FROM searches WHERE (?1 IS NULL OR state = ?1) ORDER BY created_at DESC, id"
        ))?;
        let raws = stmt
            .query_map(params![state], search_from_row)?
            .collect::<std::result::Result<Vec<_>, _>>()?;
        drop(stmt);
        raws.into_iter()
            .map(|r| self.fill_search(&conn, r))
            .collect()
    }

    /// Records a new token hash for a running search and counts a start; false when the
    /// search is not running.
    pub fn start_search(&self, id: &str, token_hash: &str) -> Result<bool> {
        let n = self.lock().execute(
            "UPDATE searches SET token_hash = ?2, starts = starts + 1
             WHERE id = ?1 AND state = 'running'",
            params![id, token_hash],
        )?;
        Ok(n == 1)
    }

    /// The search a token hash belongs to, when it is running.
    pub fn search_for_token(&self, id: &str, token_hash: &str) -> Result<bool> {
        Ok(self
            .lock()
            .query_row(
                "SELECT 1 FROM searches WHERE id = ?1 AND token_hash = ?2 AND state = 'running'",
                params![id, token_hash],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }

    /// Ends a search (only a running one: a cancelled search stays cancelled).
    pub fn finish_search(
        &self,
        id: &str,
        state: &str,
        summary: Option<&Value>,
        error: Option<&str>,
    ) -> Result<bool> {
        let n = self.lock().execute(
            "UPDATE searches SET state = ?2, summary = ?3, error = ?4, finished_at = ?5, token_hash = NULL
             WHERE id = ?1 AND state = 'running'",
            params![id, state, summary.map(Value::to_string), error, now_ms()],
        )?;
        Ok(n == 1)
    }

    /// Adds wall time to a search's account.
    pub fn add_search_elapsed(&self, id: &str, ms: u64) -> Result<()> {
        self.lock().execute(
            "UPDATE searches SET elapsed_ms = elapsed_ms + ?2 WHERE id = ?1",
            params![id, to_i64(ms)],
        )?;
        Ok(())
    }

    /// Adds LLM tokens to a search's account.
    pub fn add_search_tokens(&self, id: &str, tokens: u64) -> Result<()> {
        self.lock().execute(
            "UPDATE searches SET tokens_used = tokens_used + ?2 WHERE id = ?1",
            params![id, to_i64(tokens)],
        )?;
        Ok(())
    }

    /// Stores the plugin's checkpoint.
    pub fn save_checkpoint(&self, id: &str, bytes: &[u8]) -> Result<()> {
        self.lock().execute(
            "UPDATE searches SET checkpoint = ?2 WHERE id = ?1",
            params![id, bytes],
        )?;
        Ok(())
    }

    /// The plugin's last checkpoint.
    pub fn load_checkpoint(&self, id: &str) -> Result<Option<Vec<u8>>> {
        Ok(self
            .lock()
            .query_row("SELECT checkpoint FROM searches WHERE id = ?1", [id], |r| {
                r.get(0)
            })
            .optional()?
            .flatten())
    }

    /// Appends to a search's log.
    pub fn search_log(&self, id: &str, level: &str, message: &str) -> Result<()> {
        self.lock().execute(
            "INSERT INTO search_log (search_id, level, message, created_at) VALUES (?1, ?2, ?3, ?4)",
            params![id, level, message, now_ms()],
        )?;
        Ok(())
    }

    /// Lines of a search's log and the bytes of their messages.
    pub fn search_log_usage(&self, id: &str) -> Result<(u64, u64)> {
        let (rows, bytes): (i64, i64) = self.lock().query_row(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(CAST(message AS BLOB))), 0) FROM search_log
             WHERE search_id = ?1",
            params![id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok((rows.max(0) as u64, bytes.max(0) as u64))
    }

    /// A search's log lines after `after`, at most `limit`.
    pub fn get_search_log(&self, id: &str, after: i64, limit: u32) -> Result<Vec<LogLine>> {
        let conn = self.lock();
        let mut stmt = conn.prepare(
            "SELECT id, level, message, created_at FROM search_log
             WHERE search_id = ?1 AND id > ?2 ORDER BY id LIMIT ?3",
        )?;
        let lines = stmt
            .query_map(params![id, after, limit], |r| {
                Ok(LogLine {
                    id: r.get(0)?,
                    level: r.get(1)?,
                    message: r.get(2)?,
                    created_at: r.get(3)?,
                })
            })?
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(lines)
    }

    /// The search's archive: every candidate it submitted, in order, with its evaluation.
    pub fn search_archive(&self, id: &str) -> Result<Vec<ArchiveEntry>> {
        let conn = self.lock();
        let mut stmt = conn.prepare(
            "SELECT sc.seq, sc.candidate_id, c.parent, c.note,
                    (SELECT j.state FROM jobs j WHERE j.candidate_id = sc.candidate_id ORDER BY j.id DESC LIMIT 1),
                    (SELECT e.evaluation_json FROM evaluations e WHERE e.candidate_id = sc.candidate_id ORDER BY e.id DESC LIMIT 1)
             FROM search_candidates sc JOIN candidates c ON c.id = sc.candidate_id
             WHERE sc.search_id = ?1 ORDER BY sc.seq",
        )?;
        let rows = stmt
            .query_map([id], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<String>>(2)?,
                    r.get::<_, Option<String>>(3)?,
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, Option<String>>(5)?,
                ))
            })?
            .collect::<std::result::Result<Vec<_>, _>>()?;
        rows.into_iter()
            .map(|(seq, candidate_id, parent, note, state, eval)| {
                let evaluation = eval
                    .map(|e| {
                        serde_json::from_str(&e)
                            .map_err(|err| corrupt(format!("evaluation of {candidate_id}"), err))
                    })
                    .transpose()?;
                Ok(ArchiveEntry {
                    seq: to_u64(seq),
                    candidate_id,
                    parent,
                    note,
                    state,
                    evaluation,
                })
            })
            .collect()
    }

    /// Unfinished jobs of a search (queued, compiling, waiting for a lane or running: its
    /// backpressure cap counts them).
    pub fn search_queued(&self, id: &str) -> Result<u64> {
        let n: i64 = self.lock().query_row(
            "SELECT count(*) FROM jobs WHERE search_id = ?1 AND state NOT IN ('done', 'failed')",
            [id],
            |r| r.get(0),
        )?;
        Ok(to_u64(n))
    }

    /// Records one LLM call.
    pub fn record_llm_call(&self, c: &LlmCallRecord) -> Result<()> {
        self.lock().execute(
            "INSERT INTO llm_calls (search_id, provider, model, request_json, reply_json, error,
                prompt_tokens, completion_tokens, attempts, latency_ms, cost, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            params![
                c.search_id,
                c.provider,
                c.model,
                c.request.to_string(),
                c.reply.as_ref().map(Value::to_string),
                c.error,
                to_i64(c.prompt_tokens),
                to_i64(c.completion_tokens),
                c.attempts,
                c.latency_ms,
                c.cost,
                now_ms()
            ],
        )?;
        Ok(())
    }

    /// LLM calls of a search, oldest first.
    pub fn llm_calls(&self, search: &str) -> Result<Vec<Value>> {
        let conn = self.lock();
        let mut stmt = conn.prepare(
            "SELECT provider, model, request_json, reply_json, error, prompt_tokens, completion_tokens,
                    attempts, latency_ms, cost, created_at
             FROM llm_calls WHERE search_id = ?1 ORDER BY id",
        )?;
        let rows = stmt
            .query_map([search], |r| {
                let parse = |s: Option<String>| {
                    s.map(|s| serde_json::from_str::<Value>(&s).unwrap_or(Value::String(s)))
                };
                Ok(serde_json::json!({
                    "provider": r.get::<_, String>(0)?,
                    "model": r.get::<_, Option<String>>(1)?,
                    "request": parse(r.get(2)?),
                    "reply": parse(r.get(3)?),
                    "error": r.get::<_, Option<String>>(4)?,
                    "prompt_tokens": r.get::<_, i64>(5)?,
                    "completion_tokens": r.get::<_, i64>(6)?,
                    "attempts": r.get::<_, i64>(7)?,
                    "latency_ms": r.get::<_, f64>(8)?,
                    "cost": r.get::<_, Option<f64>>(9)?,
                    "created_at": r.get::<_, i64>(10)?,
                }))
            })?
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(rows)
    }
}

/// A search of problem `problem` (registered already) with a fake plugin, for tests.
#[cfg(test)]
pub(crate) async fn sample_search(store: &super::Store, problem: &str) -> String {
    let plugin_hash = store.put_plugin("t", b"\0asm").await.expect("plugin");
    store
        .create_search(&NewSearch {
            problem: problem.into(),
            proposer: "t".into(),
            plugin_hash,
            config: Value::Null,
            seed: 1,
            budget_candidates: 10,
            time_limit_ms: 1000,
            llm_tokens: 0,
            gpu_class: String::new(),
            weight: 1.0,
        })
        .await
        .expect("search")
}
