//! The JSON bodies of the plugin host ↔ kilnd protocol (docs/plugins.md, "Plugin host ↔
//! kilnd protocol"), shared by kilnd (which serves them) and `kiln-plugin-host` (which
//! calls them on behalf of a plugin).
//!
//! Every request carries `Authorization: Bearer TOKEN`, a token kilnd minted for one
//! search; every path is under `/v1/searches/{id}/`. Errors are kilnd's usual
//! `{"error": {"code", "message"}}`; the codes in [`codes`] are the ones the host turns
//! into typed errors for the plugin. Any other error ends the plugin (`bridge`).

use serde::{Deserialize, Serialize};

/// Longest log line kilnd stores, bytes.
pub const MAX_LOG_BYTES: usize = 4096;

/// Largest checkpoint kilnd stores, bytes (before base64).
pub const MAX_CHECKPOINT_BYTES: usize = 16 << 20;

/// Largest LLM prompt (the contents of every message of one call together) a plugin may
/// send, bytes. A longer one fails that call only (`llm-error.failed`).
pub const MAX_PROMPT_BYTES: usize = 1 << 20;

/// The request body kilnd accepts on `PUT …/checkpoint`: a [`MAX_CHECKPOINT_BYTES`]
/// checkpoint in base64 inside its JSON object (above `server.max_body_bytes`, which
/// bounds every other route).
pub const CHECKPOINT_BODY_BYTES: usize = MAX_CHECKPOINT_BYTES.div_ceil(3) * 4 + 4096;

/// The request body kilnd accepts on `POST …/llm`: a [`MAX_PROMPT_BYTES`] prompt even if
/// every byte of it is JSON-escaped (`\u00XX`, six bytes), with the options.
pub const LLM_BODY_BYTES: usize = MAX_PROMPT_BYTES * 6 + (64 << 10);

/// Error codes with a meaning for the plugin; anything else ends the plugin.
pub mod codes {
    /// `400`: the candidate is malformed or invalid (also `invalid_field`, `invalid_json`,
    /// `payload_too_large`). The plugin gets `evaluator-error.invalid(message)`.
    pub const INVALID_CANDIDATE: &str = "invalid_candidate";
    /// `400`: a field of the candidate has the wrong type, is unknown or missing.
    pub const INVALID_FIELD: &str = "invalid_field";
    /// `400`: the body is not JSON.
    pub const INVALID_JSON: &str = "invalid_json";
    /// `413`: the candidate is larger than kilnd accepts.
    pub const PAYLOAD_TOO_LARGE: &str = "payload_too_large";
    /// `404`: `wait` named an id this search never submitted.
    pub const UNKNOWN_CANDIDATE: &str = "unknown_candidate";
    /// `409`: the search's candidate budget is spent.
    pub const BUDGET_EXHAUSTED: &str = "budget_exhausted";
    /// `429`: too many of this search's candidates are queued.
    pub const QUEUE_FULL: &str = "queue_full";
    /// `503`: no LLM is configured.
    pub const LLM_UNAVAILABLE: &str = "llm_unavailable";
    /// `429`: the search's token budget is spent.
    pub const LLM_BUDGET_EXCEEDED: &str = "llm_budget_exceeded";
    /// `502`: the provider failed after retries; `413`: the prompt is over
    /// [`super::MAX_PROMPT_BYTES`]. The plugin gets `llm-error.failed(message)`.
    pub const LLM_FAILED: &str = "llm_failed";
    /// `413`: the checkpoint is larger than kilnd stores.
    pub const CHECKPOINT_TOO_LARGE: &str = "checkpoint_too_large";
}

/// `GET /v1/searches/{id}/context`: everything the plugin needs to start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Context {
    /// The search's id.
    pub search_id: String,
    /// The problem's spec (kiln-types `ProblemSpec`, sources inlined), as
    /// `GET /v1/problems/{name}` returns it.
    pub problem: serde_json::Value,
    /// The backend the search evaluates on (`host`, `cuda`).
    pub backend: String,
    /// The seed kernel for that backend as a complete `Candidate`, or `null`.
    #[serde(default)]
    pub seed: Option<serde_json::Value>,
    /// Baselines measured for this problem on this device.
    #[serde(default)]
    pub baselines: Vec<Baseline>,
    /// The device.
    pub device: Device,
    /// The search's `--config` text, `""` when none.
    #[serde(default)]
    pub config: String,
    /// The search's random seed; `random-u64` is a stream seeded from it.
    pub random_seed: u64,
}

/// A baseline's time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    /// Name (`reference`, `cublas`, `torch-eager`...).
    pub name: String,
    /// Median, microseconds, or `null` when not measured yet.
    #[serde(default)]
    pub median_us: Option<f64>,
}

/// Facts about the device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    /// `host` or `cuda`.
    pub backend: String,
    /// Device name.
    pub name: String,
    /// Compute capability (`"9.0"`), cuda only.
    #[serde(default)]
    pub compute_capability: Option<String>,
    /// SMs (cuda) or CPU cores (host).
    #[serde(default)]
    pub units: Option<u32>,
    /// Device memory, bytes.
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    /// Anything else kilnd knows (free-form object).
    #[serde(default)]
    pub extra: serde_json::Value,
}

/// Reply of `POST /v1/searches/{id}/candidates` (`202` new, `200` duplicate).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submitted {
    /// The candidate's id (content hash).
    pub id: String,
    /// The evaluation job, when one was queued or exists.
    #[serde(default)]
    pub job_id: Option<i64>,
    /// True if and only if the candidate had already been submitted.
    pub duplicate: bool,
}

/// Body of `POST /v1/searches/{id}/wait`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitRequest {
    /// Candidate ids, each submitted by this search.
    pub ids: Vec<String>,
    /// Hold the request until all are finished or this many milliseconds have passed.
    pub timeout_ms: u64,
}

/// Reply of `POST /v1/searches/{id}/wait`: the finished ones among the ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaitReply {
    /// One entry per finished candidate, in any order.
    pub finished: Vec<Finished>,
}

/// A finished candidate: an evaluation, or the reason kiln could not evaluate it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finished {
    /// The candidate.
    pub candidate_id: String,
    /// Its evaluation (kiln-types `Evaluation`), when it was evaluated.
    #[serde(default)]
    pub evaluation: Option<serde_json::Value>,
    /// Why its job failed (kiln's failure, not a verdict), when it was not.
    #[serde(default)]
    pub error: Option<String>,
}

/// Reply of `GET /v1/searches/{id}/archive`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArchiveReply {
    /// Every candidate of the search, oldest first.
    pub entries: Vec<ArchiveEntry>,
}

/// One candidate of the archive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArchiveEntry {
    /// Its id.
    pub id: String,
    /// The candidate as submitted.
    pub candidate: serde_json::Value,
    /// Its evaluation, once finished.
    #[serde(default)]
    pub evaluation: Option<serde_json::Value>,
    /// Why its job failed, if it did.
    #[serde(default)]
    pub error: Option<String>,
}

/// One message of a chat request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// Body of `POST /v1/searches/{id}/llm` (OpenAI's chat shape, trimmed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Model, or `null` for the gateway's default.
    #[serde(default)]
    pub model: Option<String>,
    /// Most tokens to generate, or `null`.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Temperature, or `null`.
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Stop sequences.
    #[serde(default)]
    pub stop: Vec<String>,
}

/// Reply of `POST /v1/searches/{id}/llm`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatReply {
    /// The text.
    pub content: String,
    /// The model that answered.
    pub model: String,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Completion tokens.
    pub completion_tokens: u32,
    /// `stop`, `length`...
    pub finish_reason: String,
}

/// Body of `PUT /v1/searches/{id}/checkpoint`, and reply of `GET` (with `data: null`
/// when there is no checkpoint).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The plugin's state, base64 (standard alphabet, padded).
    pub data: Option<String>,
}

/// Body of `POST /v1/searches/{id}/log`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogLine {
    /// `trace`, `debug`, `info`, `warn` or `error`.
    pub level: String,
    /// The line (at most [`MAX_LOG_BYTES`]).
    pub message: String,
}

/// Reply of `GET /v1/searches/{id}/budget`; `null` is unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Budget {
    /// Candidates that may still be submitted.
    #[serde(default)]
    pub candidates_left: Option<u64>,
    /// Milliseconds left in the search's time limit.
    #[serde(default)]
    pub ms_left: Option<u64>,
    /// LLM tokens left.
    #[serde(default)]
    pub tokens_left: Option<u64>,
}

/// What a plugin returned on success.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// The best candidate, or `null`.
    pub best: Option<String>,
    /// Free text.
    pub message: String,
}

/// Why a plugin did not end with a summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// Machine-readable kind : `plugin_error`, `trap`,
    /// `out_of_fuel`, `wall_clock`, `memory_cap`, `refused`, `bridge`, `host`.
    pub kind: String,
    /// For people.
    pub message: String,
}

/// Resource use of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RunStats {
    /// Fuel consumed by guest code.
    pub fuel_used: u64,
    /// Wall time from start to end, milliseconds.
    pub wall_ms: u64,
    /// Largest linear memory the plugin reached, bytes.
    pub peak_memory_bytes: u64,
}

/// Body of `POST /v1/searches/{id}/finish`, and the last line the host prints on stdout
/// (with `exit_code` added there). Exactly one of `ok` and `error` is present.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finish {
    /// The plugin's summary, when it returned `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ok: Option<Summary>,
    /// Why it ended otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Failure>,
    /// The end of what the plugin wrote to stderr (bounded), lossily UTF-8.
    pub stderr: String,
    /// Resource use.
    pub stats: RunStats,
}

/// kilnd's error body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// Code and message of an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Stable code.
    pub code: String,
    /// For people.
    pub message: String,
}
