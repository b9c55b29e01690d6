//! `GET /v1/cluster`: the cluster as this node sees it — nodes (alive, lanes, classes,
//! leases held, searches hosted, drift), the queue per class, classes with work and no
//! live lane, calibrations — and this node's own state. On one host it says so.

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use super::{ApiError, AppState};

/// `GET /v1/cluster`
pub async fn status(State(s): State<AppState>) -> Result<Json<Value>, ApiError> {
    let this = json!({
        "id": s.store.node(),
        "classes": s.sched.classes(),
        "claiming": s.sched.paused().is_none() && !s.sched.classes().is_empty(),
        "paused": s.sched.paused(),
        "hosted_searches": s.supervisor.hosted_started(),
    });
    let Some(pg) = s.store.cluster() else {
        return Ok(Json(json!({
            "clustered": false,
            "this_node": this,
            "detail": "a single host: set [cluster] database_url (or KILN_DATABASE_URL) to share a PostgreSQL database with other nodes",
        })));
    };
    let status = pg.cluster_status().await?;
    let mut v = serde_json::to_value(status).map_err(ApiError::internal)?;
    v["clustered"] = json!(true);
    v["this_node"] = this;
    v["lease_secs"] = json!(s.config.cluster.lease_secs);
    Ok(Json(v))
}
