//! `/healthz` (the process answers) and `/readyz` (the store answers), for load balancers and
//! orchestrators; no key needed, nothing revealed.

use crate::error::ApiError;
use crate::Inner;
use axum::extract::State;
use axum::Json;
use eve_core::RunQuery;
use std::sync::Arc;

/// `GET /healthz`: 200 `{"status": "ok"}` while the process serves.
pub(crate) async fn alive() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

/// `GET /readyz`: 200 `{"status": "ready"}` when the store answers a one-run query, else its
/// error (503 `unavailable` for a transient fault).
pub(crate) async fn ready(
    State(inner): State<Arc<Inner>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    inner
        .store
        .list_runs(&RunQuery {
            limit: 1,
            ..RunQuery::default()
        })
        .await?;
    Ok(Json(serde_json::json!({ "status": "ready" })))
}
