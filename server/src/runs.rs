//! The runs API: list runs by session and status, one run with its journal.

use crate::error::ApiError;
use crate::session::query;
use crate::Inner;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use eve_core::{
    Event, JournalStoreExt, Resolution, RunId, RunQuery, RunStatus, SessionId, StoredEvent,
};
use serde::Deserialize;
use std::sync::Arc;

/// Query of `GET /v1/runs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    session: Option<String>,
    status: Option<String>,
    tool: Option<String>,
    q: Option<String>,
    order: Option<String>,
    before: Option<String>,
    since: Option<i64>,
    until: Option<i64>,
    limit: Option<usize>,
}

/// `GET /v1/runs`: `{"runs": [RunRecord…], "next": RUN_ID|null, "counts": {status: n}}`.
/// Filters: `session`, `status` (running, blocked, completed, failed, cancelled), `tool`,
/// `q` (a substring of the run, session or call id), `since`/`until` (creation time, epoch ms,
/// inclusive/exclusive). `order=newest` lists newest first (default oldest first); `limit`
/// pages (none means all) and `next` is the cursor of the following page, passed back as
/// `before=`. `counts` counts the filtered runs by status, whatever the status filter and the
/// page.
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
    let newest = match q.order.as_deref() {
        None | Some("") | Some("oldest") => false,
        Some("newest") => true,
        Some(o) => {
            return Err(ApiError::malformed(format!(
                "unknown order {o:?}; use newest or oldest"
            )))
        }
    };
    let text = |v: Option<String>| v.filter(|s| !s.is_empty());
    let (tool, needle) = (text(q.tool), text(q.q));
    let mut runs = inner
        .store
        .list_runs(&RunQuery {
            session: text(q.session).map(SessionId::new),
            status: None,
            deployment: None,
            limit: 0,
        })
        .await?;
    runs.retain(|r| {
        tool.as_ref().is_none_or(|t| &r.tool == t)
            && needle.as_ref().is_none_or(|n| {
                r.run_id.as_str().contains(n.as_str())
                    || r.session_id.as_str().contains(n.as_str())
                    || r.call_id.as_str().contains(n.as_str())
            })
            && q.since.is_none_or(|t| r.created_at.millis() >= t)
            && q.until.is_none_or(|t| r.created_at.millis() < t)
    });
    let mut counts = serde_json::Map::new();
    for s in ["running", "blocked", "completed", "failed", "cancelled"] {
        counts.insert(s.into(), 0.into());
    }
    for r in &runs {
        let n = counts.entry(r.status.as_str()).or_insert(0.into());
        *n = (n.as_u64().unwrap_or(0) + 1).into();
    }
    runs.retain(|r| status.is_none_or(|s| r.status == s));
    if newest {
        runs.reverse();
    }
    if let Some(before) = text(q.before) {
        let at = runs
            .iter()
            .position(|r| r.run_id.as_str() == before)
            .ok_or_else(|| {
                ApiError::malformed(format!(
                    "before={before:?} is not a run of this listing; pass the `next` of the previous page"
                ))
            })?;
        runs.drain(..=at);
    }
    let limit = q.limit.unwrap_or(0);
    let next = if limit > 0 && runs.len() > limit {
        runs.truncate(limit);
        runs.last().map(|r| r.run_id.to_string())
    } else {
        None
    };
    Ok(Json(
        serde_json::json!({ "runs": runs, "next": next, "counts": counts }),
    ))
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

/// The body of the operator routes: why (cancel, optional) or the error a failed run ends with
/// (fail, required).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Decision {
    reason: Option<String>,
    error: Option<String>,
}

fn decision(inner: &Inner, body: Result<Bytes, BytesRejection>) -> Result<Decision, ApiError> {
    let body = crate::error::body(inner, body)?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Decision::default());
    }
    crate::error::json_object(&body, "{\"reason\": …} or {\"error\": …}")
}

/// The reason `POST /v1/runs/{id}/cancel` writes when the body gives none.
pub(crate) const REASON_OPERATOR_CANCEL: &str = "cancelled by an operator";

/// `POST /v1/runs/{id}/cancel` (operate) with an optional `{"reason"}`: cancels any run, a
/// default-execution call included (its call settles cancelled); answers as the task cancel
/// route does (202 requested, 200 already requested or already ended, 404 unknown).
pub(crate) async fn cancel(
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let d = decision(&inner, body)?;
    let reason = d.reason.filter(|r| !r.trim().is_empty());
    crate::session::cancel_run(
        &inner,
        &RunId::new(id),
        reason.as_deref().unwrap_or(REASON_OPERATOR_CANCEL),
    )
    .await
}

/// `POST /v1/runs/{id}/resume` (operate): makes a blocked run claimable again (after a fix was
/// deployed): 200 `{"seq"}` of its `RunResumed`; 400 `invalid_input` when it is not blocked.
pub(crate) async fn resume(
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let seq = inner
        .store
        .resolve_blocked(&RunId::new(id), Resolution::Resume, inner.clock.now())
        .await?;
    inner.wrote();
    Ok(Json(serde_json::json!({ "seq": seq })).into_response())
}

/// `POST /v1/runs/{id}/fail` (operate) with `{"error"}`: ends a blocked run failed, settling
/// its call with that error; 400 when the error is missing or the run is not blocked.
pub(crate) async fn fail(
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let error = decision(&inner, body)?
        .error
        .filter(|e| !e.trim().is_empty())
        .ok_or_else(|| ApiError::malformed("send {\"error\": \"why the run failed\"}"))?;
    let seq = inner
        .store
        .resolve_blocked(
            &RunId::new(id),
            Resolution::Fail { error },
            inner.clock.now(),
        )
        .await?;
    inner.wrote();
    Ok(Json(serde_json::json!({ "seq": seq })).into_response())
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
