//! PostgreSQL schema migrations: applied in order, each in its own transaction, by the
//! first node to start, while it holds a session advisory lock (so two nodes starting at
//! once never migrate twice); recorded in `kiln_schema`. A database newer than this kilnd
//! is refused. A migration is never edited once released: a change is a new entry.

use super::{PgStore, pg_err};
use crate::store::{Result, StoreError};

/// Key of the advisory lock held while migrating.
const MIGRATION_LOCK: i64 = 0x6b69_6c6e_6d69_6772; // "kilnmigr"

/// Each entry moves the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 1: everything a cluster shares: the records of one host's SQLite store plus what the
    //    queue needs (class, fair-queuing tag, lease, finish sequence), nodes and their
    //    calibrations, search leases.
    r#"
    CREATE TABLE problems (
        name        TEXT PRIMARY KEY,
        spec_json   TEXT NOT NULL,
        spec_hash   TEXT NOT NULL,
        created_at  BIGINT NOT NULL
    );
    CREATE TABLE candidates (
        id              TEXT PRIMARY KEY,
        problem         TEXT NOT NULL REFERENCES problems(name),
        backend         TEXT NOT NULL,
        candidate_json  TEXT NOT NULL,
        parent          TEXT,
        note            TEXT,
        created_at      BIGINT NOT NULL
    );
    CREATE INDEX candidates_problem ON candidates(problem, created_at);
    CREATE TABLE plugins (
        hash        TEXT PRIMARY KEY,
        name        TEXT NOT NULL,
        wasm        BYTEA NOT NULL,
        created_at  BIGINT NOT NULL
    );
    CREATE TABLE searches (
        id                 TEXT PRIMARY KEY,
        problem            TEXT NOT NULL REFERENCES problems(name),
        proposer           TEXT NOT NULL,
        plugin_hash        TEXT NOT NULL REFERENCES plugins(hash),
        config_json        TEXT NOT NULL,
        seed               BIGINT NOT NULL,
        budget_candidates  BIGINT NOT NULL,
        time_limit_ms      BIGINT NOT NULL,
        llm_tokens         BIGINT NOT NULL,
        state              TEXT NOT NULL
                           CHECK (state IN ('running', 'done', 'failed', 'cancelled')),
        token_hash         TEXT,
        checkpoint         BYTEA,
        summary            TEXT,
        error              TEXT,
        elapsed_ms         BIGINT NOT NULL DEFAULT 0,
        tokens_used        BIGINT NOT NULL DEFAULT 0,
        starts             BIGINT NOT NULL DEFAULT 0,
        created_at         BIGINT NOT NULL,
        finished_at        BIGINT,
        gpu_class          TEXT NOT NULL DEFAULT '',
        weight             DOUBLE PRECISION NOT NULL DEFAULT 1 CHECK (weight > 0),
        host_node          TEXT,
        host_until         TIMESTAMPTZ
    );
    CREATE INDEX searches_hosted ON searches(host_until) WHERE state = 'running';
    CREATE TABLE search_candidates (
        search_id     TEXT NOT NULL REFERENCES searches(id),
        candidate_id  TEXT NOT NULL REFERENCES candidates(id),
        seq           BIGINT NOT NULL,
        created_at    BIGINT NOT NULL,
        PRIMARY KEY (search_id, candidate_id)
    );
    CREATE INDEX search_candidates_candidate ON search_candidates(candidate_id);
    CREATE TABLE search_log (
        id          BIGSERIAL PRIMARY KEY,
        search_id   TEXT NOT NULL REFERENCES searches(id),
        level       TEXT NOT NULL,
        message     TEXT NOT NULL,
        created_at  BIGINT NOT NULL
    );
    CREATE INDEX search_log_search ON search_log(search_id, id);
    CREATE TABLE llm_calls (
        id                 BIGSERIAL PRIMARY KEY,
        search_id          TEXT,
        provider           TEXT NOT NULL,
        model              TEXT,
        request_json       TEXT NOT NULL,
        reply_json         TEXT,
        error              TEXT,
        prompt_tokens      BIGINT NOT NULL DEFAULT 0,
        completion_tokens  BIGINT NOT NULL DEFAULT 0,
        attempts           INTEGER NOT NULL DEFAULT 1,
        latency_ms         DOUBLE PRECISION NOT NULL DEFAULT 0,
        cost               DOUBLE PRECISION,
        created_at         BIGINT NOT NULL
    );
    CREATE INDEX llm_calls_search ON llm_calls(search_id, id);
    CREATE SEQUENCE lease_tokens;
    CREATE SEQUENCE finish_seq;
    CREATE TABLE jobs (
        id            BIGSERIAL PRIMARY KEY,
        candidate_id  TEXT NOT NULL REFERENCES candidates(id),
        backend       TEXT NOT NULL,
        state         TEXT NOT NULL CHECK (state IN ('queued', 'compiling', 'compiled',
                                                      'running', 'done', 'failed')),
        lane          INTEGER,
        attempts      INTEGER NOT NULL DEFAULT 0,
        error         TEXT,
        created_at    BIGINT NOT NULL,
        started_at    BIGINT,
        finished_at   BIGINT,
        compile_ms    DOUBLE PRECISION,
        eval_ms       DOUBLE PRECISION,
        search_id     TEXT,
        options_json  TEXT,
        gpu_class     TEXT NOT NULL DEFAULT '',
        node          TEXT,
        lease_token   BIGINT,
        lease_until   TIMESTAMPTZ,
        vt            DOUBLE PRECISION NOT NULL DEFAULT 0,
        finish_seq    BIGINT
    ) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.01);
    CREATE INDEX jobs_ready ON jobs (gpu_class, vt, id) WHERE state = 'queued';
    CREATE INDEX jobs_state ON jobs (state);
    CREATE INDEX jobs_class_vt ON jobs (gpu_class, vt);
    CREATE INDEX jobs_leased ON jobs (lease_until)
        WHERE state IN ('compiling', 'compiled', 'running');
    CREATE INDEX jobs_held ON jobs (node) WHERE state IN ('compiling', 'compiled', 'running');
    CREATE INDEX jobs_candidate ON jobs(candidate_id, id);
    CREATE INDEX jobs_search ON jobs(search_id) WHERE state NOT IN ('done', 'failed');
    CREATE INDEX jobs_finished ON jobs(finish_seq) WHERE finish_seq IS NOT NULL;
    CREATE TABLE queue_flows (
        flow       TEXT NOT NULL,
        gpu_class  TEXT NOT NULL,
        last_vt    DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (flow, gpu_class)
    );
    CREATE TABLE evaluations (
        id               BIGSERIAL PRIMARY KEY,
        candidate_id     TEXT NOT NULL REFERENCES candidates(id),
        job_id           BIGINT NOT NULL REFERENCES jobs(id),
        verdict          TEXT NOT NULL,
        median_us        DOUBLE PRECISION,
        evaluation_json  TEXT NOT NULL,
        created_at       BIGINT NOT NULL,
        raced_out        BOOLEAN NOT NULL DEFAULT false,
        plain            BOOLEAN NOT NULL DEFAULT false,
        upper_us         DOUBLE PRECISION,
        node             TEXT,
        gpu_class        TEXT
    );
    CREATE INDEX evaluations_candidate ON evaluations(candidate_id, id);
    CREATE UNIQUE INDEX evaluations_one_per_job ON evaluations(job_id);
    CREATE TABLE baselines (
        gpu_model     TEXT NOT NULL,
        driver        TEXT NOT NULL,
        problem       TEXT NOT NULL REFERENCES problems(name),
        problem_hash  TEXT NOT NULL,
        results_json  TEXT NOT NULL,
        measured_at   BIGINT NOT NULL,
        PRIMARY KEY (gpu_model, driver, problem, problem_hash)
    );
    CREATE TABLE nodes (
        id             TEXT PRIMARY KEY,
        instance       TEXT NOT NULL,
        version        TEXT NOT NULL,
        started_at     BIGINT NOT NULL,
        last_seen      TIMESTAMPTZ NOT NULL,
        lanes_json     TEXT NOT NULL,
        evaluates      BOOLEAN NOT NULL,
        runs_searches  BOOLEAN NOT NULL,
        drift          TEXT,
        stopped        BOOLEAN NOT NULL DEFAULT false
    );
    CREATE TABLE calibrations (
        node         TEXT NOT NULL,
        gpu_class    TEXT NOT NULL,
        median_us    DOUBLE PRECISION NOT NULL,
        measured_at  BIGINT NOT NULL,
        PRIMARY KEY (node, gpu_class)
    );
    "#,
    // 2: lapsed leases. A running job whose lease ran out records the process (node
    //    instance) that held it; when that process's heartbeat comes back (it was slow,
    //    not dead) the attempt is given back. The time of the last lapse lets a job that
    //    reached its attempts wait one lease for such a refund before it fails.
    r#"
    ALTER TABLE jobs ADD COLUMN lapsed TEXT[] NOT NULL DEFAULT '{}';
    ALTER TABLE jobs ADD COLUMN lapsed_at TIMESTAMPTZ;
    CREATE INDEX jobs_lapsed ON jobs(id) WHERE cardinality(lapsed) > 0;
    "#,
];

/// Tables every current schema has; checked after migrating.
const EXPECTED_TABLES: &[&str] = &[
    "problems",
    "candidates",
    "plugins",
    "searches",
    "search_candidates",
    "search_log",
    "llm_calls",
    "jobs",
    "queue_flows",
    "evaluations",
    "baselines",
    "nodes",
    "calibrations",
];

/// The schema version this build writes.
pub fn latest() -> i64 {
    i64::try_from(MIGRATIONS.len()).unwrap_or(i64::MAX)
}

/// Migrates under the advisory lock, then checks the result.
pub(super) async fn migrate(store: &PgStore) -> Result<()> {
    // A connection of its own: the session lock goes with it, whatever happens here.
    let (mut client, _notifications) = store.dedicated().await?;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(pg_err)?;
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS kiln_schema (
                 version     INTEGER PRIMARY KEY,
                 applied_at  TIMESTAMPTZ NOT NULL DEFAULT now()
             )",
        )
        .await
        .map_err(pg_err)?;
    let current: i64 = client
        .query_one(
            "SELECT coalesce(max(version), 0)::bigint FROM kiln_schema",
            &[],
        )
        .await
        .map_err(pg_err)?
        .get(0);
    if current > latest() {
        return Err(StoreError::Schema(format!(
            "the database is at version {current}, newer than this kilnd knows ({}); upgrade kilnd",
            latest()
        )));
    }
    for (i, sql) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(usize::try_from(current).unwrap_or(0))
    {
        let version = i32::try_from(i + 1).unwrap_or(i32::MAX);
        let tx = client.transaction().await.map_err(pg_err)?;
        tx.batch_execute(sql).await.map_err(pg_err)?;
        tx.execute("INSERT INTO kiln_schema (version) VALUES ($1)", &[&version])
            .await
            .map_err(pg_err)?;
        tx.commit().await.map_err(pg_err)?;
        tracing::info!(version, "applied PostgreSQL schema migration");
    }
    check(&client).await?;
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(pg_err)?;
    Ok(())
}

/// Reads the schema back: the version must be the latest and every table present.
async fn check(client: &tokio_postgres::Client) -> Result<()> {
    let v: i64 = client
        .query_one(
            "SELECT coalesce(max(version), 0)::bigint FROM kiln_schema",
            &[],
        )
        .await
        .map_err(pg_err)?
        .get(0);
    if v != latest() {
        return Err(StoreError::Schema(format!(
            "version {v} after migrating, expected {}",
            latest()
        )));
    }
    for table in EXPECTED_TABLES {
        let n: i64 = client
            .query_one(
                "SELECT count(*) FROM information_schema.tables
                 WHERE table_schema = current_schema() AND table_name = $1",
                &[table],
            )
            .await
            .map_err(pg_err)?
            .get(0);
        if n != 1 {
            return Err(StoreError::Schema(format!("table {table} is missing")));
        }
    }
    Ok(())
}
