//! The runs API: list runs by session and status, one run with its journal.

use crate::error::ApiError;
use crate::session::query;
use crate::Inner;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::Json;
use eve_core::{Event, JournalStoreExt, RunId, RunQuery, RunStatus, SessionId, StoredEvent};
use serde::Deserialize;
use std::sync::Arc;

/// Query of `GET /v1/runs`.
#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    session: Option<String>,
    status: Option<String>,
    limit: Option<usize>,
}

/// `GET /v1/runs?session=&status=&limit=`: `{"runs": [RunRecord…]}`, oldest first; `status`
/// is one of running, blocked, completed, failed, cancelled; no `limit` means all.
pub(crate) async fn list(
    State(inner): State<Arc<Inner>>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let q = query(q)?;
    let status = match q.status.as_deref() {
        None | Some("") => None,
        Some(s) => Some(RunStatus::parse(s).ok_or_else(|| {
            ApiError::malformed(format!(
                "unknown status {s:?}; use running, blocked, completed, failed or cancelled"
            ))
        })?),
    };
    let runs = inner
        .store
        .list_runs(&RunQuery {
            session: q.session.filter(|s| !s.is_empty()).map(SessionId::new),
            status,
            deployment: None,
            limit: q.limit.unwrap_or(0),
        })
        .await?;
    Ok(Json(serde_json::json!({ "runs": runs })))
}

/// `GET /v1/runs/{id}`: `{"run": RunRecord, "events": [StoredEvent…]}` with webhook tokens
/// redacted (they are capabilities; the run's body knows its own).
pub(crate) async fn show(
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let run_id = RunId::new(id);
    let run = inner.store.get_run(&run_id).await?;
    let events: Vec<StoredEvent> = inner
        .store
        .read_all(&run_id, 0)
        .await?
        .into_iter()
        .map(redact)
        .collect();
    Ok(Json(serde_json::json!({ "run": run, "events": events })))
}

/// Hides a webhook token but its first characters, enough to tell webhooks apart.
fn redact(mut e: StoredEvent) -> StoredEvent {
    if let Event::HookCreated {
        token,
        webhook: true,
        ..
    } = &mut e.event
    {
        let shown: String = token.chars().take(7).collect();
        *token = format!("{shown}…");
    }
    e
}
