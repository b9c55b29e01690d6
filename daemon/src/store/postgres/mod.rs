//! The PostgreSQL store: the records a cluster of kilnd nodes shares.
//!
//! One pool of connections per node (`deadpool-postgres` over `tokio-postgres`, TLS
//! through rustls when the URL asks for it). Schema migrations run under an advisory lock
//! (`schema.rs`). The queue (`queue.rs`) claims with `FOR UPDATE SKIP LOCKED` under a
//! lease with a fencing token, in start-time fair queuing order across searches; leases
//! are renewed by the node's heartbeat and re-queued by every node's reaper
//! (`nodes.rs`). Searches (`searches.rs`) have a lease of their own on the node that runs
//! their plugin host. Everything else (`records.rs`) is the same records as on SQLite.
//! Times that decide leases are the database's (`now()`), never a node's clock.

mod connect;
mod nodes;
mod queue;
mod records;
mod schema;
mod searches;

use std::sync::Arc;
use std::time::Duration;

pub use connect::HANDSHAKE_TIMEOUT;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

pub use nodes::{Calibration, ClassQueue, ClusterStatus, NodeInfo, NodeLane, Reaped};
pub use queue::Finished;

use super::{Result, StoreError};

/// Channel on which new jobs are announced (payload: the class), so idle nodes claim at
/// once instead of at their next poll.
pub const QUEUED_CHANNEL: &str = "kiln_queued";

/// Channel on which finished jobs are announced (the payload is empty: listeners read
/// what finished from the jobs table, so a missed notification costs only latency).
pub const FINISHED_CHANNEL: &str = "kiln_finished";

/// How this node uses the shared database.
#[derive(Debug, Clone)]
pub struct PgSettings {
    /// `postgres://…` (libpq URL or key=value form).
    pub url: String,
    /// This node's id (unique in the cluster).
    pub node: String,
    /// Lease of a claimed job or a hosted search, seconds.
    pub lease_secs: f64,
    /// Connections in the pool.
    pub pool_size: usize,
    /// Evaluations of a job cut short (by a node that died) before it fails.
    pub max_attempts: u32,
    /// A PEM file of CA certificates to trust besides the system's (private CAs).
    pub ca_file: String,
}

/// The shared store.
pub struct PgStore {
    pool: Pool,
    pg_config: tokio_postgres::Config,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    /// This node's id.
    pub(crate) node: String,
    /// Differs between two processes using the same node id.
    pub(crate) instance: String,
    lease_secs: f64,
    max_attempts: i32,
}

/// Leases that have run out: `lease_until` is past, and the database has been up for at
/// least one lease (a restarted database gives every node one lease to renew what it
/// holds before anything it held is taken from it). `$lease` is the lease in seconds.
pub(crate) fn lease_ran_out(column: &str, lease: &str) -> String {
    format!(
        "({column} < now() AND pg_postmaster_start_time() + make_interval(secs => {lease}) < now())"
    )
}

/// Maps a client error: connection trouble is `Unavailable` (worth retrying), the rest
/// is a database error with PostgreSQL's message.
pub(crate) fn pg_err(e: tokio_postgres::Error) -> StoreError {
    let transient_state = e.code().is_some_and(|c| {
        let code = c.code();
        code.starts_with("08") || code.starts_with("57") || code == "53300"
    });
    let io = std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>());
    let detail = match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    };
    if e.is_closed() || transient_state || io {
        StoreError::Unavailable(detail)
    } else {
        StoreError::Postgres(detail)
    }
}

fn pool_err(e: deadpool_postgres::PoolError) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => pg_err(e),
        other => StoreError::Unavailable(other.to_string()),
    }
}

/// How long one statement (with the wait for a pooled connection) may take before it is
/// given up as `Unavailable`: a database that stopped answering must not hang a node.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs one database call, bounded by [`CALL_TIMEOUT`] (the connection it held is dropped
/// with it).
pub(crate) async fn bounded<T>(call: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::Unavailable(format!(
            "the database did not answer within {} s",
            CALL_TIMEOUT.as_secs()
        ))),
    }
}

/// Converts a non-negative count or id to `u64` (negative values, which the schema never
/// stores, become 0).
pub(crate) fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Converts a `u64` to PostgreSQL's `bigint`, saturating.
pub(crate) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A column of a row, with the column named when the type does not fit.
pub(crate) fn col<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    name: &str,
) -> Result<T> {
    row.try_get(name)
        .map_err(|e| StoreError::Postgres(format!("column {name}: {e}")))
}

fn tls_connector(ca_file: &str) -> Result<tokio_postgres_rustls::MakeRustlsConnect> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    if !ca_file.is_empty() {
        let pem = std::fs::read(ca_file).map_err(|e| {
            StoreError::Unavailable(format!("cannot read cluster.ca_file {ca_file}: {e}"))
        })?;
        let mut n = 0;
        for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(&pem) {
            let cert: rustls::pki_types::CertificateDer<'static> = cert
                .map_err(|e| StoreError::Unavailable(format!("cluster.ca_file {ca_file}: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| StoreError::Unavailable(format!("cluster.ca_file {ca_file}: {e}")))?;
            n += 1;
        }
        if n == 0 {
            return Err(StoreError::Unavailable(format!(
                "cluster.ca_file {ca_file} holds no certificate"
            )));
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Unavailable(format!("TLS set-up: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

impl PgStore {
    /// Connects, migrates the schema under the advisory lock (refusing a database newer
    /// than this kilnd) and checks it. `Unavailable` when the database cannot be reached.
    pub async fn connect(settings: &PgSettings) -> Result<PgStore> {
        let pg_config: tokio_postgres::Config = settings.url.parse().map_err(|e| {
            StoreError::Unavailable(format!("cluster.database_url does not parse: {e}"))
        })?;
        let tls = tls_connector(&settings.ca_file)?;
        let manager = Manager::from_connect(
            pg_config.clone(),
            connect::Guarded { tls: tls.clone() },
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(settings.pool_size.max(2))
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(HANDSHAKE_TIMEOUT + Duration::from_secs(1)))
            .wait_timeout(Some(Duration::from_secs(30)))
            .recycle_timeout(Some(Duration::from_secs(5)))
            .build()
            .map_err(|e| StoreError::Unavailable(format!("connection pool: {e}")))?;
        let store = PgStore {
            pool,
            pg_config,
            tls,
            node: settings.node.clone(),
            instance: format!("{:016x}", rand::random::<u64>()),
            lease_secs: settings.lease_secs,
            max_attempts: i32::try_from(settings.max_attempts.max(1)).unwrap_or(i32::MAX),
        };
        schema::migrate(&store).await?;
        Ok(store)
    }

    /// A connection of the pool.
    pub(crate) async fn conn(&self) -> Result<deadpool_postgres::Client> {
        self.pool.get().await.map_err(pool_err)
    }

    /// A connection of its own, outside the pool (migrations, LISTEN), with the task that
    /// drives it; notifications arrive on the returned receiver.
    pub(crate) async fn dedicated(
        &self,
    ) -> Result<(
        tokio_postgres::Client,
        tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>,
    )> {
        let opened = connect::open(&self.pg_config, &self.tls).await?;
        Ok((opened.client, opened.notifications))
    }

    /// Runs a statement (prepared once per connection); returns the rows.
    pub(crate) async fn rows(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
        bounded(async {
            let c = self.conn().await?;
            let st = c.prepare_cached(sql).await.map_err(pg_err)?;
            c.query(&st, params).await.map_err(pg_err)
        })
        .await
    }

    /// Runs a statement; returns at most one row.
    pub(crate) async fn row(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>> {
        bounded(async {
            let c = self.conn().await?;
            let st = c.prepare_cached(sql).await.map_err(pg_err)?;
            c.query_opt(&st, params).await.map_err(pg_err)
        })
        .await
    }

    /// Runs a statement; returns the rows it changed.
    pub(crate) async fn exec(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
        bounded(async {
            let c = self.conn().await?;
            let st = c.prepare_cached(sql).await.map_err(pg_err)?;
            c.execute(&st, params).await.map_err(pg_err)
        })
        .await
    }

    /// The lease as an SQL interval argument (seconds).
    pub(crate) fn lease(&self) -> f64 {
        self.lease_secs
    }

    /// This node's id.
    pub fn node(&self) -> &str {
        &self.node
    }
}
