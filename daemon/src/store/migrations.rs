//! Schema migrations, applied in order and recorded in `PRAGMA user_version`.
//!
//! A migration is never edited once released: a change is a new entry at the end.

use rusqlite::Connection;

use super::{Result, StoreError};

/// Each entry moves the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 1: problems, candidates, jobs, evaluations, compile cache.
    r#"
    CREATE TABLE problems (
        name        TEXT PRIMARY KEY,
        spec_json   TEXT NOT NULL,
        spec_hash   TEXT NOT NULL,
        created_at  INTEGER NOT NULL
    );
    CREATE TABLE candidates (
        id              TEXT PRIMARY KEY,
        problem         TEXT NOT NULL REFERENCES problems(name),
        backend         TEXT NOT NULL,
        candidate_json  TEXT NOT NULL,
        parent          TEXT,
        note            TEXT,
        created_at      INTEGER NOT NULL
    );
    CREATE INDEX candidates_problem ON candidates(problem, created_at);
    CREATE TABLE jobs (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        candidate_id  TEXT NOT NULL REFERENCES candidates(id),
        backend       TEXT NOT NULL,
        state         TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done', 'failed')),
        stage         TEXT,
        attempts      INTEGER NOT NULL DEFAULT 0,
        error         TEXT,
        created_at    INTEGER NOT NULL,
        started_at    INTEGER,
        finished_at   INTEGER,
        compile_ms    REAL,
        eval_ms       REAL
    );
    CREATE INDEX jobs_state ON jobs(state, id);
    CREATE INDEX jobs_candidate ON jobs(candidate_id);
    CREATE TABLE evaluations (
        id               INTEGER PRIMARY KEY AUTOINCREMENT,
        candidate_id     TEXT NOT NULL REFERENCES candidates(id),
        job_id           INTEGER NOT NULL REFERENCES jobs(id),
        verdict          TEXT NOT NULL,
        median_us        REAL,
        evaluation_json  TEXT NOT NULL,
        created_at       INTEGER NOT NULL
    );
    CREATE INDEX evaluations_candidate ON evaluations(candidate_id, id);
    CREATE TABLE artifacts (
        key           TEXT PRIMARY KEY,
        backend       TEXT NOT NULL,
        bytes         BLOB NOT NULL,
        compile_json  TEXT NOT NULL,
        created_at    INTEGER NOT NULL
    );
    "#,
    // 2: searches driven by proposer plugins, their log, the LLM calls they made, and
    //    the link from jobs to the search that submitted them (for fairness).
    r#"
    CREATE TABLE plugins (
        hash        TEXT PRIMARY KEY,
        name        TEXT NOT NULL,
        wasm        BLOB NOT NULL,
        created_at  INTEGER NOT NULL
    );
    CREATE TABLE searches (
        id                 TEXT PRIMARY KEY,
        problem            TEXT NOT NULL REFERENCES problems(name),
        proposer           TEXT NOT NULL,
        plugin_hash        TEXT NOT NULL REFERENCES plugins(hash),
        config_json        TEXT NOT NULL,
        seed               INTEGER NOT NULL,
        budget_candidates  INTEGER NOT NULL,
        time_limit_ms      INTEGER NOT NULL,
        llm_tokens         INTEGER NOT NULL,
        state              TEXT NOT NULL
                           CHECK (state IN ('running', 'done', 'failed', 'cancelled')),
        token_hash         TEXT,
        checkpoint         BLOB,
        summary            TEXT,
        error              TEXT,
        elapsed_ms         INTEGER NOT NULL DEFAULT 0,
        tokens_used        INTEGER NOT NULL DEFAULT 0,
        starts             INTEGER NOT NULL DEFAULT 0,
        created_at         INTEGER NOT NULL,
        finished_at        INTEGER
    );
    CREATE TABLE search_candidates (
        search_id     TEXT NOT NULL REFERENCES searches(id),
        candidate_id  TEXT NOT NULL REFERENCES candidates(id),
        seq           INTEGER NOT NULL,
        created_at    INTEGER NOT NULL,
        PRIMARY KEY (search_id, candidate_id)
    );
    CREATE TABLE search_log (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        search_id   TEXT NOT NULL REFERENCES searches(id),
        level       TEXT NOT NULL,
        message     TEXT NOT NULL,
        created_at  INTEGER NOT NULL
    );
    CREATE INDEX search_log_search ON search_log(search_id, id);
    CREATE TABLE llm_calls (
        id                 INTEGER PRIMARY KEY AUTOINCREMENT,
        search_id          TEXT,
        provider           TEXT NOT NULL,
        model              TEXT,
        request_json       TEXT NOT NULL,
        reply_json         TEXT,
        error              TEXT,
        prompt_tokens      INTEGER NOT NULL DEFAULT 0,
        completion_tokens  INTEGER NOT NULL DEFAULT 0,
        attempts           INTEGER NOT NULL DEFAULT 1,
        latency_ms         REAL NOT NULL DEFAULT 0,
        cost               REAL,
        created_at         INTEGER NOT NULL
    );
    CREATE INDEX llm_calls_search ON llm_calls(search_id, id);
    ALTER TABLE jobs ADD COLUMN search_id TEXT;
    CREATE INDEX jobs_search ON jobs(search_id, started_at);
    "#,
    // 3: job options (plain timing, racing) stored with the job; per evaluation whether it
    //    may rank as a best (raced-out and plain timings may not) and the upper bound of
    //    its time's 95 % interval, the incumbent a raced job is compared with.
    r#"
    ALTER TABLE jobs ADD COLUMN options_json TEXT;
    ALTER TABLE evaluations ADD COLUMN raced_out INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE evaluations ADD COLUMN plain INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE evaluations ADD COLUMN upper_us REAL;
    CREATE INDEX evaluations_job ON evaluations(job_id);
    "#,
    // 4: the clock-lock journal: a lock intent is written (and synced) before NVML locks a
    //    GPU's clocks and a release after they are reset, so a daemon that died in between
    //    resets them when it starts again.
    r#"
    CREATE TABLE clock_journal (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        gpu         TEXT NOT NULL,
        event_json  TEXT NOT NULL,
        created_at  INTEGER NOT NULL
    );
    CREATE INDEX clock_journal_gpu ON clock_journal(gpu, id);
    "#,
    // 5: baseline times (reference, cuBLAS, cuDNN, torch) per GPU model, driver and
    //    problem (by its spec hash, so a changed spec is measured afresh).
    r#"
    CREATE TABLE baselines (
        gpu_model     TEXT NOT NULL,
        driver        TEXT NOT NULL,
        problem       TEXT NOT NULL REFERENCES problems(name),
        problem_hash  TEXT NOT NULL,
        results_json  TEXT NOT NULL,
        measured_at   INTEGER NOT NULL,
        PRIMARY KEY (gpu_model, driver, problem, problem_hash)
    );
    "#,
    // 6: jobs wait for a lane in states of their own (`compiling`, `compiled`) and only an
    //    evaluation started on a lane (`running`) counts an attempt; the stage column goes
    //    (the state says it) and the lane of the evaluation is kept. SQLite cannot change a
    //    CHECK constraint, so the table is rebuilt (foreign keys are off while migrating).
    r#"
    CREATE TABLE jobs_v6 (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        candidate_id  TEXT NOT NULL REFERENCES candidates(id),
        backend       TEXT NOT NULL,
        state         TEXT NOT NULL CHECK (state IN ('queued', 'compiling', 'compiled',
                                                      'running', 'done', 'failed')),
        lane          INTEGER,
        attempts      INTEGER NOT NULL DEFAULT 0,
        error         TEXT,
        created_at    INTEGER NOT NULL,
        started_at    INTEGER,
        finished_at   INTEGER,
        compile_ms    REAL,
        eval_ms       REAL,
        search_id     TEXT,
        options_json  TEXT
    );
    INSERT INTO jobs_v6 (id, candidate_id, backend, state, attempts, error, created_at,
                         started_at, finished_at, compile_ms, eval_ms, search_id, options_json)
        SELECT id, candidate_id, backend, state, attempts, error, created_at,
               started_at, finished_at, compile_ms, eval_ms, search_id, options_json
        FROM jobs;
    DROP TABLE jobs;
    ALTER TABLE jobs_v6 RENAME TO jobs;
    CREATE INDEX jobs_state ON jobs(state, id);
    CREATE INDEX jobs_candidate ON jobs(candidate_id);
    CREATE INDEX jobs_search ON jobs(search_id, started_at);
    "#,
    // 7: what a cluster needs, kept on one host too: the GPU class a job is routed to and
    //    the node and lease token that hold it (a write with a stale token is refused);
    //    the node and class of every evaluation; a search's class and fair-share weight.
    r#"
    ALTER TABLE jobs ADD COLUMN gpu_class TEXT NOT NULL DEFAULT '';
    ALTER TABLE jobs ADD COLUMN node TEXT;
    ALTER TABLE jobs ADD COLUMN lease_token INTEGER;
    ALTER TABLE evaluations ADD COLUMN node TEXT;
    ALTER TABLE evaluations ADD COLUMN gpu_class TEXT;
    ALTER TABLE searches ADD COLUMN gpu_class TEXT NOT NULL DEFAULT '';
    ALTER TABLE searches ADD COLUMN weight REAL NOT NULL DEFAULT 1;
    "#,
];

/// Tables every current schema has; checked after migrating.
const EXPECTED_TABLES: &[&str] = &[
    "problems",
    "candidates",
    "jobs",
    "evaluations",
    "artifacts",
    "plugins",
    "searches",
    "search_candidates",
    "search_log",
    "llm_calls",
    "clock_journal",
    "baselines",
];

/// The schema version this build writes.
pub fn latest() -> i64 {
    i64::try_from(MIGRATIONS.len()).unwrap_or(i64::MAX)
}

fn version(conn: &Connection) -> Result<i64> {
    Ok(conn.pragma_query_value(None, "user_version", |r| r.get(0))?)
}

/// Applies every migration past the database's version, each in its own transaction.
/// Foreign keys are off meanwhile (a migration may rebuild a table others refer to) and
/// checked before each commit.
pub fn apply(conn: &mut Connection) -> Result<()> {
    let current = version(conn)?;
    if current > latest() {
        return Err(StoreError::Schema(format!(
            "the database is at version {current}, newer than this kilnd knows ({}); upgrade kilnd",
            latest()
        )));
    }
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    let applied = apply_from(conn, current);
    conn.pragma_update(None, "foreign_keys", "ON")?;
    applied
}

fn apply_from(conn: &mut Connection, current: i64) -> Result<()> {
    for (i, sql) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(usize::try_from(current).unwrap_or(0))
    {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        let broken: i64 =
            tx.query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
                r.get(0)
            })?;
        if broken > 0 {
            return Err(StoreError::Schema(format!(
                "migration {} would leave {broken} broken references",
                i + 1
            )));
        }
        tx.pragma_update(
            None,
            "user_version",
            i64::try_from(i + 1).unwrap_or(i64::MAX),
        )?;
        tx.commit()?;
        tracing::info!(version = i + 1, "applied schema migration");
    }
    Ok(())
}

/// Reads the schema back: the version must be the latest and every table present.
pub fn check(conn: &Connection) -> Result<()> {
    let v = version(conn)?;
    if v != latest() {
        return Err(StoreError::Schema(format!(
            "version {v} after migrating, expected {}",
            latest()
        )));
    }
    for table in EXPECTED_TABLES {
        let n: i64 = conn.query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [table],
            |r| r.get(0),
        )?;
        if n != 1 {
            return Err(StoreError::Schema(format!("table {table} is missing")));
        }
    }
    let ok: String = conn.query_row("PRAGMA quick_check", [], |r| r.get(0))?;
    if ok != "ok" {
        return Err(StoreError::Schema(format!("quick_check: {ok}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrates_from_empty_and_is_idempotent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.db");
        let mut conn = Connection::open(&path).expect("open");
        apply(&mut conn).expect("migrate");
        check(&conn).expect("check");
        apply(&mut conn).expect("second apply is a no-op");
        assert_eq!(version(&conn).expect("version"), latest());
    }

    #[test]
    fn refuses_a_newer_database() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut conn = Connection::open(dir.path().join("t.db")).expect("open");
        conn.pragma_update(None, "user_version", latest() + 1)
            .expect("set version");
        let err = apply(&mut conn).expect_err("newer schema");
        assert!(err.to_string().contains("newer"), "{err}");
    }

    #[test]
    fn jobs_rebuild_keeps_rows_and_references() {
        // Migrate up to version 5, add a job with an evaluation, then go on.
        let dir = tempfile::tempdir().expect("tempdir");
        let mut conn = Connection::open(dir.path().join("t.db")).expect("open");
        for (i, sql) in MIGRATIONS.iter().take(5).enumerate() {
            conn.execute_batch(sql).expect("old migration");
            conn.pragma_update(None, "user_version", i64::try_from(i + 1).expect("v"))
                .expect("version");
        }
        conn.execute_batch(
            "INSERT INTO problems VALUES ('p', '{}', 'h', 1);
             INSERT INTO candidates VALUES ('c', 'p', 'host', '{}', NULL, NULL, 1);
             INSERT INTO jobs (candidate_id, backend, state, stage, attempts, created_at)
                 VALUES ('c', 'host', 'running', 'evaluating', 2, 1);
             INSERT INTO evaluations (candidate_id, job_id, verdict, evaluation_json, created_at)
                 VALUES ('c', 1, 'ok', '{}', 2);",
        )
        .expect("rows");
        apply(&mut conn).expect("migrate");
        check(&conn).expect("check");
        let (state, attempts): (String, i64) = conn
            .query_row("SELECT state, attempts FROM jobs WHERE id = 1", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .expect("job kept");
        assert_eq!((state.as_str(), attempts), ("running", 2));
        conn.execute(
            "INSERT INTO jobs (candidate_id, backend, state, created_at) VALUES ('c', 'host', 'compiled', 3)",
            [],
        )
        .expect("a new state is allowed");
        let id: i64 = conn
            .query_row("SELECT max(id) FROM jobs", [], |r| r.get(0))
            .expect("id");
        assert_eq!(id, 2, "ids go on after the rebuild");
        let refs: i64 = conn
            .query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
                r.get(0)
            })
            .expect("fk check");
        assert_eq!(refs, 0);
    }

    #[test]
    fn check_notices_a_missing_table() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut conn = Connection::open(dir.path().join("t.db")).expect("open");
        apply(&mut conn).expect("migrate");
        conn.execute_batch("DROP TABLE artifacts").expect("drop");
        assert!(check(&conn).is_err());
    }
}
