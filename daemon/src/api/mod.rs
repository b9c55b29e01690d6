//! The HTTP/1.1 + JSON API on the Unix socket, Docker-daemon style.
//!
//! Each accepted connection's peer credentials (SO_PEERCRED) are checked against the
//! allow-list before any request is read; a refused caller gets 403 on every request
//! and a log line. Routes live one resource per file; handlers only parse and call the
//! store or the scheduler.

mod access;
mod baselines;
mod candidates;
mod cluster;
mod error;
mod events;
mod fit;
pub mod plugin;
mod problems;
mod reports;
mod searches;
mod system;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use kiln_types::plugin::{CHECKPOINT_BODY_BYTES, LLM_BODY_BYTES};
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

pub use access::Access;
pub use error::{ApiError, parse_json};

use crate::config::Config;
use crate::events::EventBus;
use crate::metrics::Metrics;
use crate::sched::Scheduler;
use crate::store::Store;

/// Everything a handler may need.
#[derive(Clone)]
pub struct AppState {
    /// The store.
    pub store: Arc<Store>,
    /// The scheduler (to wake it on submit).
    pub sched: Arc<Scheduler>,
    /// Event bus for SSE.
    pub events: EventBus,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Configuration in force.
    pub config: Arc<Config>,
    /// Facts gathered once at start (GPUs, jail layers, backends).
    pub facts: Arc<system::Facts>,
    /// Start time, for uptime.
    pub started: Instant,
    /// Runs the plugin hosts of searches.
    pub supervisor: Arc<crate::search::Supervisor>,
    /// The LLM gateway.
    pub llm: Arc<crate::llm::Gateway>,
}

pub use system::Facts;

/// The plugin routes (each checks the search's bearer token) but the log, whose GET is a
/// user route on the same path.
fn plugin_routes(r: Router<AppState>) -> Router<AppState> {
    r.route("/v1/searches/{id}/archive", get(plugin::archive))
        .route("/v1/searches/{id}/context", get(plugin::context))
        .route("/v1/searches/{id}/candidates", post(plugin::submit))
        .route("/v1/searches/{id}/wait", post(plugin::wait))
        // Bodies above server.max_body_bytes where the ABI's own limits need them.
        .route(
            "/v1/searches/{id}/llm",
            post(plugin::llm).layer(DefaultBodyLimit::max(LLM_BODY_BYTES)),
        )
        .route(
            "/v1/searches/{id}/checkpoint",
            get(plugin::get_checkpoint)
                .put(plugin::put_checkpoint)
                .layer(DefaultBodyLimit::max(CHECKPOINT_BODY_BYTES)),
        )
        .route("/v1/searches/{id}/budget", get(plugin::budget))
        .route("/v1/searches/{id}/finish", post(plugin::finish))
}

/// Body limit, request metrics and the state, for either router.
fn finish_router(r: Router<AppState>, state: AppState) -> Router {
    let limit = state.config.server.max_body_bytes;
    r.method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .with_state(state)
}

/// The routes a plugin host uses, with the same limits and metrics: all a connection from
/// a plugin host's jail is served.
pub fn plugin_router(state: AppState) -> Router {
    let r = Router::new().route("/v1/searches/{id}/log", post(plugin::post_log));
    finish_router(plugin_routes(r).fallback(plugin_only), state)
}

async fn plugin_only(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!(
            "a plugin host may use its search's plugin routes only, not {} {}",
            req.method(),
            req.uri().path()
        ),
    )
}

/// The router with every route, limits and request metrics.
pub fn router(state: AppState) -> Router {
    let r = Router::new()
        .route("/v1/health", get(system::health))
        .route("/v1/info", get(system::info))
        .route("/v1/cluster", get(cluster::status))
        .route("/metrics", get(system::metrics))
        .route("/v1/problems", get(problems::list).post(problems::register))
        .route("/v1/problems/{name}", get(problems::show))
        .route(
            "/v1/problems/{name}/baselines",
            get(baselines::get).post(baselines::measure),
        )
        .route(
            "/v1/candidates",
            get(candidates::list).post(candidates::submit),
        )
        .route("/v1/candidates/batch", post(candidates::submit_batch))
        .route("/v1/candidates/{id}", get(candidates::show))
        .route("/v1/candidates/{id}/report", get(reports::candidate))
        .route("/v1/candidates/{id}/jobs", post(candidates::requeue))
        .route("/v1/jobs/{id}", get(candidates::job))
        .route("/v1/events", get(events::stream))
        .route("/v1/searches", get(searches::list).post(searches::start))
        .route("/v1/searches/{id}", get(searches::show))
        .route("/v1/searches/{id}/report", get(reports::search))
        .route(
            "/v1/searches/{id}/log",
            get(searches::log).post(plugin::post_log),
        )
        .route("/v1/searches/{id}/llm-calls", get(searches::llm_calls))
        .route("/v1/searches/{id}/cancel", post(searches::cancel));
    finish_router(plugin_routes(r).fallback(not_found), state)
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!(
        "no route for {} {}",
        req.method(),
        req.uri().path()
    ))
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

async fn count_requests(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let method = req.method().to_string();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let resp = next.run(req).await;
    state
        .metrics
        .request(&method, &route, resp.status().as_u16());
    resp
}

/// Serves the API on `listener` until `shutdown` is cancelled.
pub async fn serve(
    listener: UnixListener,
    state: AppState,
    access: Arc<Access>,
    shutdown: CancellationToken,
) {
    let app = router(state.clone());
    let plugin_app = plugin_router(state.clone());
    let refused = Router::new().fallback(refused_handler);
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let service = match stream.peer_cred() {
            Ok(cred)
                if access.allows(cred.uid(), cred.gid())
                    && crate::search::peers::is_plugin_host(cred.pid()) =>
            {
                tracing::debug!(pid = ?cred.pid(), "a plugin host's connection: plugin routes only");
                plugin_app.clone()
            }
            Ok(cred) if access.allows(cred.uid(), cred.gid()) => app.clone(),
            Ok(cred) => {
                tracing::warn!(
                    uid = cred.uid(),
                    gid = cred.gid(),
                    pid = ?cred.pid(),
                    "refused a connection: caller is not in the allow-list"
                );
                state.metrics.refused();
                refused.clone()
            }
            Err(e) => {
                tracing::warn!(error = %e, "refused a connection: no peer credentials");
                state.metrics.refused();
                refused.clone()
            }
        };
        let conn_shutdown = shutdown.clone();
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                }
                _ = conn_shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), conn).await;
                }
            }
        });
    }
}

async fn refused_handler() -> Response {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        "this user is not allowed to use kilnd (see [access] in the daemon's config)",
    )
    .into_response()
}
