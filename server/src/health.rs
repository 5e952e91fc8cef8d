//! `/healthz` (the process answers) and `/readyz` (the store answers), for load balancers and
//! orchestrators; no key needed, nothing revealed.

use crate::error::ApiError;
use crate::Inner;
use axum::extract::State;
use axum::Json;
use serde::Serialize;
use std::sync::Arc;

/// What the health routes answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Health {
    /// `ok` (`/healthz`) or `ready` (`/readyz`).
    #[schema(example = "ok")]
    status: &'static str,
}

/// The process answers.
///
/// `GET /healthz`: 200 `{"status": "ok"}` while the process serves.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "health",
    responses((status = 200, description = "The process serves", body = Health)),
    security(()),
)]
pub(crate) async fn alive() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// The store answers.
///
/// `GET /readyz`: 200 `{"status": "ready"}` when the store answers a one-run query within 1 s,
/// else 503 `unavailable` with `Retry-After` (the store is unreachable, or too slow to serve).
/// It never waits longer than that second, whatever the store's own connection timeouts.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "health",
    responses(
        (status = 200, description = "The store answers", body = Health),
        (status = 503, description = "`unavailable`: the store does not answer within 1 s (retry after `Retry-After` seconds)", body = crate::error::ErrorBody),
    ),
    security(()),
)]
pub(crate) async fn ready(State(inner): State<Arc<Inner>>) -> Result<Json<Health>, ApiError> {
    crate::outage::probe(&inner.store).await?;
    Ok(Json(Health { status: "ready" }))
}
