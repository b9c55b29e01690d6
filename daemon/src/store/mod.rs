//! The durable store: one interface, two implementations.
//!
//! [`Store`] is what the daemon uses; the shared records are reached through the
//! [`Records`] trait, one implementation per store. On one host (the default) everything lives in one
//! SQLite database under the state directory ([`SqliteStore`]); with `[cluster]
//! database_url` the shared records — problems, candidates, jobs, evaluations,
//! baselines, searches, plugins, checkpoints, LLM calls — live in PostgreSQL
//! ([`postgres::PgStore`]), shared by every kilnd of the cluster, while the compile cache
//! and the clock journal stay in the node's own SQLite file. Both implementations pass
//! one conformance suite (`daemon/tests/store_conformance.rs`).
//!
//! SQLite calls run inline (they are local and fast, as they always were); PostgreSQL
//! calls are async network round trips and never block the runtime.

mod artifacts;
mod baselines;
mod candidates;
mod clocks;
mod incumbents;
mod jobs;
mod migrations;
pub mod postgres;
mod problems;
mod searches;
mod sqlite;
mod timeline;

use std::path::Path;
use std::sync::Arc;

use kiln_types::{BaselineResult, Candidate, Evaluation, JobOptions, ProblemSpec};
use serde_json::Value;
use thiserror::Error;

pub use artifacts::Artifact;
pub use baselines::{BaselineSet, GpuKey, Speedup};
pub use candidates::{CandidateRecord, Submitted};
pub use jobs::{JobRecord, JobState, LaneClass, Recovery};
pub use problems::{ProblemSummary, PutProblem};
pub use searches::{ArchiveEntry, LlmCallRecord, LogLine, NewSearch, SearchRecord};
pub use sqlite::SqliteStore;
pub use timeline::TimelineEntry;

/// Errors from the store.
#[derive(Debug, Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// PostgreSQL answered with an error.
    #[error("database error: {0}")]
    Postgres(String),
    /// PostgreSQL cannot be reached (down, restarting, network): worth retrying.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
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
    /// The lease a write depended on is no longer this node's: the write was refused.
    #[error("fenced out: {0}")]
    Fenced(String),
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

fn corrupt(what: impl Into<String>, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        what: what.into(),
        message: e.to_string(),
    }
}

/// The store the daemon uses: the node's SQLite database, and PostgreSQL for the shared
/// records when the node is part of a cluster.
pub struct Store {
    local: Arc<SqliteStore>,
    /// Where the shared records live: the node's SQLite database, or PostgreSQL.
    records: Arc<dyn Records>,
    shared: Option<Arc<postgres::PgStore>>,
}

/// Declares the shared records' operations once: the [`Records`] trait (what a store must
/// do, with the same meaning on every store; `daemon/tests/store_conformance.rs` holds
/// each store to it), its two implementations (SQLite's synchronous calls, PostgreSQL's
/// async ones) and [`Store`]'s methods, which call the node's [`Records`].
macro_rules! records {
    ($($(#[$doc:meta])* fn $name:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;)*) => {
        /// The shared records' operations: problems, candidates, jobs, evaluations,
        /// baselines, searches, plugins, checkpoints, LLM calls. A store is an
        /// implementation of this trait that passes the conformance suite
        /// (`daemon/tests/store_conformance.rs`); docs/architecture.md, "Adding a store".
        #[async_trait::async_trait]
        pub trait Records: Send + Sync {
            $(
                $(#[$doc])*
                async fn $name(&self $(, $arg: $ty)*) -> Result<$ret>;
            )*
        }

        #[async_trait::async_trait]
        impl Records for SqliteStore {
            $(
                async fn $name(&self $(, $arg: $ty)*) -> Result<$ret> {
                    SqliteStore::$name(self $(, $arg)*)
                }
            )*
        }

        #[async_trait::async_trait]
        impl Records for postgres::PgStore {
            $(
                async fn $name(&self $(, $arg: $ty)*) -> Result<$ret> {
                    postgres::PgStore::$name(self $(, $arg)*).await
                }
            )*
        }

        impl Store {
            $(
                $(#[$doc])*
                pub async fn $name(&self $(, $arg: $ty)*) -> Result<$ret> {
                    self.records.$name($($arg),*).await
                }
            )*
        }
    };
}

records! {
    /// Registers a problem (the same spec again is a no-op, a different one a conflict).
    fn put_problem(&self, spec: &ProblemSpec) -> PutProblem;
    /// The spec of a registered problem.
    fn get_problem(&self, name: &str) -> Option<ProblemSpec>;
    /// Every registered problem, by name.
    fn list_problems(&self) -> Vec<ProblemSummary>;
    /// Stores a candidate and queues a job for it (a search's job goes to the search's
    /// class); a stored candidate is not queued again.
    fn submit(&self, candidate: &Candidate, search: Option<&str>) -> Submitted;
    /// [`Store::submit`] with job options and the class to route the job to (`""`: any
    /// class of its backend).
    fn submit_with(
        &self,
        candidate: &Candidate,
        search: Option<&str>,
        options: Option<&JobOptions>,
        gpu_class: &str,
    ) -> Submitted;
    /// A candidate with its latest job and evaluation.
    fn get_candidate(&self, id: &str) -> Option<CandidateRecord>;
    /// Ids of the newest candidates, optionally for one problem.
    fn list_candidates(&self, problem: Option<&str>, limit: u32) -> Vec<String>;
    /// A job by id.
    fn get_job(&self, id: i64) -> Option<JobRecord>;
    /// Claims the next queued job for one of these lanes' classes, for compiling.
    fn claim_next(&self, lanes: &[LaneClass]) -> Option<JobRecord>;
    /// A claimed job is compiled and waits for a lane.
    fn mark_compiled(&self, id: i64, token: i64) -> ();
    /// The job's evaluation starts on `lane`: the attempt counts. False when the lease is
    /// gone (requeued or taken by another node meanwhile).
    fn start_evaluation(&self, id: i64, token: i64, lane: u32) -> bool;
    /// Stores the evaluation and marks the job done, fenced by the lease token.
    fn finish_job(
        &self,
        id: i64,
        token: i64,
        evaluation: &Evaluation,
        compile_ms: f64,
        eval_ms: f64,
    ) -> ();
    /// Queues another evaluation of a stored candidate; returns the job id.
    fn queue_job(
        &self,
        candidate_id: &str,
        options: Option<&JobOptions>,
        gpu_class: &str,
    ) -> i64;
    /// The evaluation a job produced, once it is done.
    fn job_evaluation(&self, job_id: i64) -> Option<Evaluation>;
    /// Marks a job failed (kiln's failure, not a verdict), fenced by the lease token.
    fn fail_job(&self, id: i64, token: i64, error: &str) -> ();
    /// Puts a claimed job back in the queue without counting anything.
    fn requeue_job(&self, id: i64, token: i64) -> ();
    /// At start: jobs this node left claimed are queued again (or failed after
    /// `max_attempts` evaluations cut short).
    fn recover_interrupted(&self, max_attempts: u32) -> Recovery;
    /// Number of jobs in each state.
    fn job_counts(&self) -> Vec<(JobState, i64)>;
    /// Number of evaluations per verdict.
    fn verdict_counts(&self) -> Vec<(String, i64)>;
    /// Stores a plugin's bytes; returns their hash.
    fn put_plugin(&self, name: &str, wasm: &[u8]) -> String;
    /// A stored plugin's bytes.
    fn get_plugin(&self, hash: &str) -> Option<Vec<u8>>;
    /// Creates a search in state `running`; returns its id.
    fn create_search(&self, s: &NewSearch) -> String;
    /// A search by id, with its progress.
    fn get_search(&self, id: &str) -> Option<SearchRecord>;
    /// Searches, newest first; only those in `state` when given.
    fn list_searches(&self, state: Option<&str>) -> Vec<SearchRecord>;
    /// Records a new token hash for a search and counts a start (in a cluster: this node
    /// takes the search's lease). False when the search is not running.
    fn start_search(&self, id: &str, token_hash: &str) -> bool;
    /// Whether the token hash belongs to the running search.
    fn search_for_token(&self, id: &str, token_hash: &str) -> bool;
    /// Ends a running search; false when it was not running.
    fn finish_search(
        &self,
        id: &str,
        state: &str,
        summary: Option<&Value>,
        error: Option<&str>,
    ) -> bool;
    /// Adds wall time to a search's account.
    fn add_search_elapsed(&self, id: &str, ms: u64) -> ();
    /// Adds LLM tokens to a search's account.
    fn add_search_tokens(&self, id: &str, tokens: u64) -> ();
    /// Stores the plugin's checkpoint.
    fn save_checkpoint(&self, id: &str, bytes: &[u8]) -> ();
    /// The plugin's last checkpoint.
    fn load_checkpoint(&self, id: &str) -> Option<Vec<u8>>;
    /// Appends to a search's log.
    fn search_log(&self, id: &str, level: &str, message: &str) -> ();
    /// Lines of a search's log and the bytes of their messages.
    fn search_log_usage(&self, id: &str) -> (u64, u64);
    /// A search's log lines after `after`, at most `limit`.
    fn get_search_log(&self, id: &str, after: i64, limit: u32) -> Vec<LogLine>;
    /// The search's archive, in order, with evaluations.
    fn search_archive(&self, id: &str) -> Vec<ArchiveEntry>;
    /// Unfinished jobs of a search.
    fn search_queued(&self, id: &str) -> u64;
    /// Every candidate a search submitted, in order, with its times and latest evaluation.
    fn search_timeline(&self, id: &str) -> Vec<TimelineEntry>;
    /// Records one LLM call.
    fn record_llm_call(&self, c: &LlmCallRecord) -> ();
    /// LLM calls of a search, oldest first.
    fn llm_calls(&self, search: &str) -> Vec<Value>;
    /// The incumbent's upper bound (µs) within a search.
    fn search_incumbent_upper(&self, search_id: &str) -> Option<f64>;
    /// The incumbent's upper bound (µs) among a problem's evaluations on a backend (in a
    /// cluster: on one GPU class, when the job has one).
    fn problem_incumbent_upper(&self, problem: &str, backend: &str, gpu_class: &str) -> Option<f64>;
    /// Stores (or replaces) the baselines of a problem on a GPU.
    fn put_baselines(&self, gpu: &GpuKey, problem: &str, results: &[BaselineResult]) -> BaselineSet;
    /// The baselines of a problem on a GPU, if measured.
    fn get_baselines(&self, gpu: &GpuKey, problem: &str) -> Option<BaselineSet>;
    /// Every stored baseline set of a problem (current spec), newest first.
    fn list_baselines(&self, problem: &str) -> Vec<BaselineSet>;
}

impl Store {
    /// The single-host store: everything in `DIR/kiln.db`.
    pub fn open(state_dir: &Path, node: &str) -> Result<Self> {
        Ok(Store::single(Arc::new(SqliteStore::open(state_dir, node)?)))
    }

    /// The single-host store over an open SQLite database.
    pub fn single(local: Arc<SqliteStore>) -> Self {
        Store {
            records: local.clone(),
            local,
            shared: None,
        }
    }

    /// A cluster member's store: the shared records in PostgreSQL, the compile cache and
    /// clock journal in the node's SQLite database.
    pub fn with_shared(local: Arc<SqliteStore>, shared: postgres::PgStore) -> Self {
        let shared = Arc::new(shared);
        Store {
            local,
            records: shared.clone(),
            shared: Some(shared),
        }
    }

    /// A store whose shared records live in another implementation of [`Records`] (a
    /// new store under test, run through the conformance suite); the compile cache and
    /// clock journal stay in `local`, and no cluster operations are offered.
    pub fn with_records(local: Arc<SqliteStore>, records: Arc<dyn Records>) -> Self {
        Store {
            local,
            records,
            shared: None,
        }
    }

    /// This node's id (recorded on the jobs it claims and the evaluations it stores).
    pub fn node(&self) -> &str {
        &self.local.node
    }

    /// The node's own SQLite database (compile cache, clock journal).
    pub fn local(&self) -> &Arc<SqliteStore> {
        &self.local
    }

    /// The shared PostgreSQL store, when this node is part of a cluster.
    pub fn cluster(&self) -> Option<&postgres::PgStore> {
        self.shared.as_deref()
    }

    /// The shared records' store: PostgreSQL in a cluster, else the node's SQLite.
    pub fn records(&self) -> &Arc<dyn Records> {
        &self.records
    }

    /// A cached artifact (node-local).
    pub fn get_artifact(&self, key: &str) -> Result<Option<Artifact>> {
        self.local.get_artifact(key)
    }

    /// Caches an artifact (node-local).
    pub fn put_artifact(&self, key: &str, backend: &str, artifact: &Artifact) -> Result<()> {
        self.local.put_artifact(key, backend, artifact)
    }
}

#[cfg(test)]
pub(crate) use baselines::measured_reference;
#[cfg(test)]
pub(crate) use problems::sample_spec;
#[cfg(test)]
pub(crate) use searches::sample_search;

/// A fresh single-host SQLite store in a temporary directory.
#[cfg(test)]
pub(crate) fn sqlite_temp() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path(), "test-node").expect("open store");
    (dir, store)
}

/// A fresh single-host [`Store`] in a temporary directory.
#[cfg(test)]
pub(crate) fn open_temp() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path(), "test-node").expect("open store");
    (dir, store)
}
