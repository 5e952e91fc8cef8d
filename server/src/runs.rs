//! The runs API: list runs by session and status, one run with its journal.

use crate::camel::Camel;
use crate::error::ApiError;
use crate::session::query;
use crate::Inner;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use eve_core::{
    check_client_id, Event, JournalStoreExt, Resolution, RunFilter, RunId, RunQuery, RunStatus,
    SessionId, StoredEvent, Timestamp,
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
    if let Some(s) = text(q.session.clone()) {
        check_client_id("session", &s)?;
    }
    let runs = inner
        .store
        .list_runs(&RunQuery {
            session: text(q.session).map(SessionId::new),
            status: None,
            deployment: None,
            limit: 0,
        })
        .await?;
    let filter = RunFilter {
        status,
        tool: text(q.tool),
        text: text(q.q),
        since: q.since.map(Timestamp),
        until: q.until.map(Timestamp),
        newest_first: newest,
        before: text(q.before).map(RunId::new),
        limit: q.limit.unwrap_or(0),
    };
    let page = filter
        .page(runs)
        .map_err(|e| ApiError::malformed(format!("before=: {e}")))?;
    let mut body = serde_json::to_value(Camel(&page)).expect("a page serializes");
    // A page (not a whole listing) says how each ended or blocked run came out: one read of
    // its last event each.
    if (1..=MAX_OUTCOMES).contains(&filter.limit) {
        for (r, json) in page
            .runs
            .iter()
            .zip(body["runs"].as_array_mut().into_iter().flatten())
        {
            if let Some(outcome) = outcome(&*inner.store, r).await? {
                json["outcome"] = outcome;
            }
        }
    }
    Ok(Json(body))
}

/// Pages of at most this many runs carry each run's `outcome`.
const MAX_OUTCOMES: usize = 500;

/// `{"kind", "detail", "code"}` of an ended or blocked run, from its last event (`code` is the
/// error's `EVE-…` code, when it has one); `None` for a live run.
async fn outcome(
    store: &dyn eve_core::JournalStore,
    r: &eve_core::RunRecord,
) -> Result<Option<serde_json::Value>, ApiError> {
    if !(r.status.is_terminal() || r.status == RunStatus::Blocked) {
        return Ok(None);
    }
    let Some(e) = store.last_event(r).await? else {
        return Ok(None);
    };
    let (kind, detail) = match &e.event {
        Event::RunCompleted { .. } => ("completed", String::new()),
        Event::RunFailed { error } => ("failed", error.clone()),
        Event::RunCancelled => ("cancelled", String::new()),
        Event::RunBlocked { reason } => ("blocked", reason.clone()),
        _ => return Ok(None),
    };
    let code = detail
        .split('[')
        .skip(1)
        .filter_map(|s| s.split_once(']').map(|(c, _)| c))
        .find(|c| c.starts_with("EVE-"));
    Ok(Some(
        serde_json::json!({ "kind": kind, "detail": detail, "code": code }),
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
        .map(|mut e| {
            e.event.mask_webhook_token();
            e
        })
        .collect();
    Ok(Json(
        serde_json::json!({ "run": Camel(&run), "events": Camel(&events) }),
    ))
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
