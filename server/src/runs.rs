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
    check_client_id, search_runs, DeploymentId, Event, JournalStoreExt, ResetFrom, ResetOutcome,
    Resolution, RunFilter, RunId, RunQuery, RunRecord, RunSearch, RunStatus, SessionId, StoreError,
    StoredEvent, TerminateOutcome, Timestamp,
};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Query of `GET /v1/runs`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    /// Only this session's runs.
    session: Option<String>,
    /// Only runs of this status: running, blocked, completed, failed or cancelled.
    status: Option<String>,
    /// Only this tool's runs.
    tool: Option<String>,
    /// Only runs whose run, session or call id contains this.
    q: Option<String>,
    /// `oldest` (default) or `newest` first.
    order: Option<String>,
    /// The page after this one: the previous page's `next`.
    before: Option<String>,
    /// Created at or after this time (epoch ms).
    since: Option<i64>,
    /// Created before this time (epoch ms).
    until: Option<i64>,
    /// At most this many runs (none: all); pages of at most 500 carry each run's `outcome`.
    limit: Option<usize>,
    /// Only runs matching this search on their input and attributes, e.g.
    /// `input.service = "api" and attr.region = "eu" and attr.cost >= 10` (paths `input.<field>…`
    /// and `attr.<key>`; `=`, `!=`, `<`, `<=`, `>`, `>=`; quoted strings, numbers, true, false;
    /// `and`). A query that does not parse is a 400 `invalid_query` naming the offending token.
    query: Option<String>,
}

/// How an ended or blocked run came out, from its last event.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Outcome {
    /// How it ended (or that it is blocked).
    kind: OutcomeKind,
    /// The error or the reason it is blocked; empty for completed and cancelled runs.
    detail: String,
    /// The error's `EVE-…` code, when it has one.
    code: Option<String>,
}

/// The kind of an [`Outcome`].
#[derive(Clone, Copy, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum OutcomeKind {
    /// Ended with an output.
    Completed,
    /// Ended with an error.
    Failed,
    /// Ended cancelled.
    Cancelled,
    /// Parked until an operator resumes or fails it.
    Blocked,
    /// Denied by the tool's approval policy or the person asked; the body never ran.
    Denied,
    /// Terminated by an operator (no grace, no cleanup); its status is `failed`.
    Terminated,
}

/// A run as `GET /v1/runs` lists it: its record and, on a page, its outcome.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ListedRun {
    /// The run's record (in [`Camel`] inside the flattened field: a flattened struct is written
    /// as a map, whose keys `Camel` leaves alone).
    #[serde(flatten)]
    #[schema(value_type = RunRecord)]
    run: Camel<RunRecord>,
    /// How it came out: on pages (a `limit` of at most 500), for ended and blocked runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    outcome: Option<Outcome>,
}

/// One page of runs.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct RunsPage {
    /// The runs, in the requested order.
    runs: Vec<ListedRun>,
    /// The `before=` of the following page, if there is one.
    next: Option<RunId>,
    /// The filtered runs by status (`running`, `blocked`, …), whatever the status filter and
    /// the page.
    counts: std::collections::BTreeMap<String, usize>,
}

/// List runs, filtered and paged.
///
/// `GET /v1/runs`: `{"runs": [RunRecord…], "next": RUN_ID|null, "counts": {status: n}}`.
/// Filters: `session`, `status` (running, blocked, completed, failed, cancelled), `tool`,
/// `q` (a substring of the run, session or call id), `since`/`until` (creation time, epoch ms,
/// inclusive/exclusive), `query` (the run search of [`eve_core::search`] on input fields and
/// attributes: `input.service = "api" and attr.cost >= 10`). `order=newest` lists newest first (default oldest first); `limit`
/// pages (none means all) and `next` is the cursor of the following page, passed back as
/// `before=`. `counts` counts the filtered runs by status, whatever the status filter and the
/// page. A key limited to sessions lists and counts only its sessions' runs, and a `session=`
/// outside them is 403.
#[utoipa::path(
    get,
    path = "/v1/runs",
    operation_id = "listRuns",
    tag = "runs",
    params(ListQuery),
    responses(
        (status = 200, description = "One page of runs", body = RunsPage),
        (status = 400, description = "An unknown status, order or parameter, a `before` that is not a run of this listing, or a `query` that does not parse (`invalid_query`)", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["read"])),
)]
pub(crate) async fn list(
    State(inner): State<Arc<Inner>>,
    key: Option<axum::Extension<eve_core::ApiKey>>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<RunsPage>, ApiError> {
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
    let search = match text(q.query) {
        Some(s) => Some(RunSearch::parse(&s).map_err(|e| ApiError::invalid_query(e.to_string()))?),
        None => None,
    };
    let mut runs = search_runs(
        &*inner.store,
        &RunQuery {
            session: text(q.session).map(SessionId::new),
            status: None,
            deployment: None,
            attribute: None,
            limit: 0,
        },
        search.as_ref(),
    )
    .await?;
    // A key limited to sessions lists only its sessions' runs (and counts only those).
    runs.retain(|r| crate::limits::shows(key.as_deref(), &r.session_id));
    let filter = RunFilter {
        status,
        tool: text(q.tool),
        text: text(q.q),
        since: q.since.map(Timestamp),
        until: q.until.map(Timestamp),
        newest_first: newest,
        before: text(q.before).map(RunId::new),
        limit: q.limit.unwrap_or(0),
        query: search,
    };
    let page = filter
        .page(runs)
        .map_err(|e| ApiError::malformed(format!("before=: {e}")))?;
    // A page (not a whole listing) says how each ended or blocked run came out: one read of
    // its last event each.
    let with_outcomes = (1..=MAX_OUTCOMES).contains(&filter.limit);
    let mut runs = Vec::with_capacity(page.runs.len());
    for run in page.runs {
        let outcome = if with_outcomes {
            outcome(&*inner.store, &run).await?
        } else {
            None
        };
        runs.push(ListedRun {
            run: Camel(run),
            outcome,
        });
    }
    Ok(Json(RunsPage {
        runs,
        next: page.next,
        counts: page
            .counts
            .into_iter()
            .map(|(s, n)| (s.to_owned(), n))
            .collect(),
    }))
}

/// Pages of at most this many runs carry each run's `outcome`.
const MAX_OUTCOMES: usize = 500;

/// The [`Outcome`] of an ended or blocked run, from its last event (`code` is the error's
/// `EVE-…` code, when it has one); `None` for a live run.
async fn outcome(
    store: &dyn eve_core::JournalStore,
    r: &eve_core::RunRecord,
) -> Result<Option<Outcome>, ApiError> {
    if !(r.status.is_terminal() || r.status == RunStatus::Blocked) {
        return Ok(None);
    }
    let Some(e) = store.last_event(r).await? else {
        return Ok(None);
    };
    let (kind, detail) = match &e.event {
        Event::RunCompleted { .. } => (OutcomeKind::Completed, String::new()),
        Event::RunFailed { error } => (OutcomeKind::Failed, error.clone()),
        Event::RunCancelled => (OutcomeKind::Cancelled, String::new()),
        Event::RunBlocked { reason } => (OutcomeKind::Blocked, reason.clone()),
        Event::RunDenied { reason } => (OutcomeKind::Denied, reason.clone()),
        Event::RunTerminated { reason, by } => {
            (OutcomeKind::Terminated, Event::terminated_error(reason, by))
        }
        _ => return Ok(None),
    };
    let code = detail
        .split('[')
        .skip(1)
        .filter_map(|s| s.split_once(']').map(|(c, _)| c))
        .find(|c| c.starts_with("EVE-"))
        .map(str::to_owned);
    Ok(Some(Outcome { kind, detail, code }))
}

/// The most events `GET /v1/runs/{id}` returns at once (and its default page): a longer
/// journal is read in pages with `from`, following `nextSeq`.
pub(crate) const JOURNAL_PAGE_MAX: usize = 10_000;

/// Query of `GET /v1/runs/{id}`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct JournalQuery {
    /// The first event's seq (default 0): the previous page's `nextSeq`.
    from: Option<u64>,
    /// At most this many events (default and largest: 10000).
    limit: Option<usize>,
}

/// A run and one page of its journal.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct RunJournal {
    /// The run's record.
    #[schema(value_type = RunRecord)]
    run: Camel<RunRecord>,
    /// Its journal from `from` (default seq 0), at most `limit` events, webhook tokens
    /// redacted.
    #[schema(value_type = Vec<StoredEvent>)]
    events: Camel<Vec<StoredEvent>>,
    /// Where the next page starts (`?from=`), when the journal goes on past this page;
    /// absent on its last page.
    #[serde(rename = "nextSeq", skip_serializing_if = "Option::is_none")]
    next_seq: Option<u64>,
}

/// One run's record and a page of its journal.
///
/// `GET /v1/runs/{id}[?from=SEQ&limit=N]`: `{"run": RunRecord, "events": [StoredEvent…],
/// "nextSeq"?: SEQ}` with webhook tokens redacted (they are capabilities; the run's body knows
/// its own). A journal of up to 10000 events comes whole; a longer one in pages of at most
/// that many, each naming where the next starts (`nextSeq`), so neither the server nor the
/// page holds a million events at once.
#[utoipa::path(
    get,
    path = "/v1/runs/{id}",
    operation_id = "getRun",
    tag = "runs",
    params(("id" = String, Path, description = "The run"), JournalQuery),
    responses(
        (status = 200, description = "The run and a page of its journal", body = RunJournal),
        (status = 400, description = "A `limit` of 0 or over 10000, a `from` past the journal's end, or an unknown parameter", body = crate::error::ErrorBody),
        (status = 404, description = "No such run (or purged by retention)", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["read"])),
)]
pub(crate) async fn show(
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
    q: Result<Query<JournalQuery>, QueryRejection>,
) -> Result<Json<RunJournal>, ApiError> {
    let q = query(q)?;
    let limit = q.limit.unwrap_or(JOURNAL_PAGE_MAX);
    if limit == 0 || limit > JOURNAL_PAGE_MAX {
        return Err(ApiError::malformed(format!(
            "limit {limit} is out of range; ask for 1 to {JOURNAL_PAGE_MAX} events and follow nextSeq for more"
        )));
    }
    let from = q.from.unwrap_or(0);
    let run_id = RunId::new(id);
    let run = inner.store.get_run(&run_id).await?;
    if from > run.next_seq {
        return Err(ApiError::malformed(format!(
            "from {from} is past the end of run {run_id}'s journal ({} events); start at or before it",
            run.next_seq
        )));
    }
    let events: Vec<StoredEvent> = inner
        .store
        .read_range(&run_id, from, limit)
        .await?
        .into_iter()
        .map(|mut e| {
            e.event.mask_webhook_token();
            e
        })
        .collect();
    // The record was read first, so a journal that grew since shows at the next page.
    let next_seq = events
        .last()
        .map(|e| e.seq + 1)
        .filter(|&n| n < run.next_seq);
    Ok(Json(RunJournal {
        run: Camel(run),
        events: Camel(events),
        next_seq,
    }))
}

/// The body of the operator routes: why (cancel, optional) or the error a failed run ends with
/// (fail, required).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Decision {
    /// Why the run is cancelled (cancel; optional).
    reason: Option<String>,
    /// The error the run fails with (fail; required there).
    error: Option<String>,
}

/// The seq of the event an operator action wrote.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Written {
    /// Its seq in the run's journal.
    seq: u64,
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

/// Cancel a run.
///
/// `POST /v1/runs/{id}/cancel` (operate) with an optional `{"reason"}`: cancels any run, a
/// default-execution call included (its call settles cancelled); answers as the task cancel
/// route does (202 requested, 200 already requested or already ended, 404 unknown).
#[utoipa::path(
    post,
    path = "/v1/runs/{id}/cancel",
    operation_id = "cancelRun",
    tag = "runs",
    params(("id" = String, Path, description = "The run")),
    request_body(content = Option<Decision>, description = "`{\"reason\": …}`, optional (an empty body is fine)"),
    responses(
        (status = 202, description = "The cancel was written (`outcome: requested`)", body = crate::session::CancelAnswer),
        (status = 200, description = "Nothing written: `already_requested` or `already_ended`", body = crate::session::CancelAnswer),
        (status = 404, description = "No such run", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["operate"])),
)]
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

/// The body of `POST /v1/runs/{id}/terminate`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TerminateBody {
    /// Why the run is terminated (required, recorded in `RunTerminated` and the call's error).
    reason: String,
    /// Who terminates it, when the server knows no key (`insecure_no_auth`); with a key, the
    /// key's name is recorded instead.
    by: Option<String>,
}

/// Who a terminate names when neither a key nor the body does.
pub(crate) const BY_OPERATOR: &str = "operator";

/// Terminate a live run.
///
/// `POST /v1/runs/{id}/terminate` (operate) with `{"reason", "by"?}`: ends a live run (running,
/// parked or blocked) at once — no grace period, no cleanup steps, unlike cancel — withdrawing
/// its pending requests and settling its call failed with `terminated by {by}: {reason}`; a
/// worker still running its body has its next append refused. `by` is the key's name (the
/// body's `by` only without a key). 200 `{"seq"}`; 409 `not_live` (naming the status) for a
/// run that has ended, nothing written; 404 for an unknown run.
#[utoipa::path(
    post,
    path = "/v1/runs/{id}/terminate",
    operation_id = "terminateRun",
    tag = "runs",
    params(("id" = String, Path, description = "The run")),
    request_body(content = TerminateBody, description = "`{\"reason\": \"why\", \"by\": \"who\"}` (`by` optional)"),
    responses(
        (status = 200, description = "Terminated: the seq the withdrawals and `RunTerminated` begin at", body = Written),
        (status = 400, description = "No reason given", body = crate::error::ErrorBody),
        (status = 404, description = "No such run", body = crate::error::ErrorBody),
        (status = 409, description = "`not_live`: the run has ended (the message names its status); nothing written", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["operate"])),
)]
pub(crate) async fn terminate(
    State(inner): State<Arc<Inner>>,
    headers: axum::http::HeaderMap,
    key: Option<axum::Extension<eve_core::ApiKey>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = crate::error::body(&inner, body)?;
    let body: TerminateBody = crate::error::json_object(
        &body,
        "{\"reason\": \"why the run is terminated\", \"by\": \"who\" (optional)}",
    )?;
    if body.reason.trim().is_empty() {
        return Err(ApiError::malformed(
            "send {\"reason\": \"why the run is terminated\"}: the reason is required",
        ));
    }
    let by = key
        .map(|axum::Extension(k)| k.name)
        .or(body.by.filter(|b| !b.trim().is_empty()))
        .unwrap_or_else(|| BY_OPERATOR.to_owned());
    let surface = crate::metrics::Surface::of(&headers);
    let run = RunId::new(id);
    match inner
        .store
        .terminate(&run, &body.reason, &by, inner.clock.now())
        .await?
    {
        TerminateOutcome::Terminated { seq } => {
            inner.metrics.terminate("terminated", surface);
            inner.wrote();
            Ok(Json(Written { seq }).into_response())
        }
        TerminateOutcome::NotLive { status } => {
            inner.metrics.terminate("not_live", surface);
            Err(ApiError::new(
                axum::http::StatusCode::CONFLICT,
                "not_live",
                format!(
                    "run {run} is {}, not live: only a running, parked or blocked run can be terminated; nothing was written",
                    status.as_str()
                ),
            ))
        }
    }
}

/// The body of `POST /v1/runs/{id}/reset`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResetBody {
    /// The cut: the old run's events with `0 < seq < to` are copied (1: only `RunStarted`).
    to: u64,
    /// The deployment to pin the new run to (default: this server's, when its registry has the
    /// run's workflow; else the old run's).
    deployment: Option<String>,
}

/// The body of `POST /v1/runs/{id}/retry` (optional).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetryBody {
    /// As in a reset.
    deployment: Option<String>,
}

/// The answer of a retry or reset: the new run and where it came from.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ResetAnswer {
    /// The new run's record.
    #[schema(value_type = RunRecord)]
    run: Camel<RunRecord>,
    /// False when the same reset (same run, same cut) was made before: `run` is that run and
    /// nothing was written.
    created: bool,
    /// The old run and the cut.
    from: ResetFrom,
    /// How many of the old run's events the new run's journal holds after its `RunStarted`.
    copied: u64,
}

/// The deployment a retry or reset pins its new run to: the one asked for, else this server's
/// when its registry has the run's workflow (so a retry after a fix runs the fixed code), else
/// the old run's.
async fn reset_deployment(
    inner: &Inner,
    run: &RunId,
    asked: Option<String>,
) -> Result<DeploymentId, ApiError> {
    if let Some(d) = asked.filter(|d| !d.trim().is_empty()) {
        return Ok(DeploymentId::new(d));
    }
    let old = inner.store.get_run(run).await?;
    Ok(match &inner.registry {
        Some(r) if r.get(&old.workflow_id).is_some() => r.deployment().clone(),
        _ => old.deployment_id,
    })
}

/// Answers a retry or reset, counting it.
fn reset_answer(
    inner: &Inner,
    kind: &'static str,
    surface: crate::metrics::Surface,
    result: Result<ResetOutcome, StoreError>,
) -> Result<Response, ApiError> {
    match result {
        Ok(out) => {
            let status = if out.created {
                inner.metrics.reset(kind, "created", surface);
                inner.wrote();
                axum::http::StatusCode::CREATED
            } else {
                inner.metrics.reset(kind, "repeated", surface);
                axum::http::StatusCode::OK
            };
            let answer = ResetAnswer {
                run: Camel(out.run),
                created: out.created,
                from: out.from,
                copied: out.copied,
            };
            Ok((status, Json(answer)).into_response())
        }
        Err(e) => {
            let outcome = match &e {
                StoreError::RunNotEnded { .. } => "not_ended",
                StoreError::NotFound { .. } => return Err(e.into()),
                _ => "refused",
            };
            inner.metrics.reset(kind, outcome, surface);
            Err(e.into())
        }
    }
}

/// Retry a failed run.
///
/// `POST /v1/runs/{id}/retry` (operate), body optional `{"deployment"?}`: starts a new run of
/// the same tool, input and session from the failed run's journal, cut at the first attempt of
/// the step whose last attempt failed (so that step gets all its attempts again and the steps
/// completed before it are replayed, not executed), or, when no step failed, where the run's
/// end begins ([`eve_core::retry_point`]). The new run is pinned to this server's deployment
/// when its registry has the workflow, so a retry after a fix runs the fixed code. Idempotent:
/// the same retry again answers the same run. 201 with the new run; 200 when it was made
/// before; 409 `not_ended` for a live run (terminate or cancel it first); 400 `invalid_input`
/// for a run that did not fail; 404 unknown.
#[utoipa::path(
    post,
    path = "/v1/runs/{id}/retry",
    operation_id = "retryRun",
    tag = "runs",
    params(("id" = String, Path, description = "The failed run")),
    request_body(content = Option<RetryBody>, description = "Optional `{\"deployment\": \"v2\"}`"),
    responses(
        (status = 201, description = "The new run", body = ResetAnswer),
        (status = 200, description = "The same retry was made before: its run, nothing written", body = ResetAnswer),
        (status = 400, description = "`invalid_input`: the run did not fail (reset it instead)", body = crate::error::ErrorBody),
        (status = 404, description = "No such run", body = crate::error::ErrorBody),
        (status = 409, description = "`not_ended`: the run is live; terminate or cancel it first", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["operate"])),
)]
pub(crate) async fn retry(
    State(inner): State<Arc<Inner>>,
    headers: axum::http::HeaderMap,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = crate::error::body(&inner, body)?;
    let body: RetryBody = if body.iter().all(u8::is_ascii_whitespace) {
        RetryBody::default()
    } else {
        crate::error::json_object(&body, "{\"deployment\": \"v2\"} (optional)")?
    };
    let surface = crate::metrics::Surface::of(&headers);
    let run = RunId::new(id);
    let deployment = reset_deployment(&inner, &run, body.deployment).await?;
    let result = inner
        .store
        .retry(&run, &deployment, inner.clock.now())
        .await;
    reset_answer(&inner, "retry", surface, result)
}

/// Reset an ended run to a seq.
///
/// `POST /v1/runs/{id}/reset` (operate) with `{"to": seq, "deployment"?}`: starts a new run of
/// the same tool, input and session whose journal is the old run's events before `to` (request
/// ids rewritten to the new run's; its `RunStarted` names the old run and the cut in
/// `resetFrom`), as Temporal's reset; the old run and its journal are kept. `to` is 1 (run the
/// body from the start) up to where the old run's end, cancel or withdrawals begin.
/// Idempotent per (run, `to`). 201 with the new run; 200 when it was made before; 409
/// `not_ended` for a live run (terminate or cancel it first); 400 `invalid_input` for a `to`
/// outside the range (the message names it); 404 unknown.
#[utoipa::path(
    post,
    path = "/v1/runs/{id}/reset",
    operation_id = "resetRun",
    tag = "runs",
    params(("id" = String, Path, description = "The ended run")),
    request_body(content = ResetBody, description = "`{\"to\": 5}`: copy the events before seq 5"),
    responses(
        (status = 201, description = "The new run", body = ResetAnswer),
        (status = 200, description = "The same reset was made before: its run, nothing written", body = ResetAnswer),
        (status = 400, description = "`malformed` (no `to`) or `invalid_input`: `to` out of range", body = crate::error::ErrorBody),
        (status = 404, description = "No such run", body = crate::error::ErrorBody),
        (status = 409, description = "`not_ended`: the run is live; terminate or cancel it first", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["operate"])),
)]
pub(crate) async fn reset(
    State(inner): State<Arc<Inner>>,
    headers: axum::http::HeaderMap,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = crate::error::body(&inner, body)?;
    let body: ResetBody =
        crate::error::json_object(&body, "{\"to\": seq, \"deployment\": \"v2\" (optional)}")?;
    let surface = crate::metrics::Surface::of(&headers);
    let run = RunId::new(id);
    let deployment = reset_deployment(&inner, &run, body.deployment).await?;
    let result = inner
        .store
        .reset(&run, body.to, &deployment, inner.clock.now())
        .await;
    reset_answer(&inner, "reset", surface, result)
}

/// Resume a blocked run.
///
/// `POST /v1/runs/{id}/resume` (operate): makes a blocked run claimable again (after a fix was
/// deployed): 200 `{"seq"}` of its `RunResumed`; 400 `invalid_input` when it is not blocked.
#[utoipa::path(
    post,
    path = "/v1/runs/{id}/resume",
    operation_id = "resumeRun",
    tag = "runs",
    params(("id" = String, Path, description = "The run")),
    responses(
        (status = 200, description = "Resumed: the seq of `RunResumed`", body = Written),
        (status = 400, description = "`invalid_input`: the run is not blocked", body = crate::error::ErrorBody),
        (status = 404, description = "No such run", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["operate"])),
)]
pub(crate) async fn resume(
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let seq = inner
        .store
        .resolve_blocked(&RunId::new(id), Resolution::Resume, inner.clock.now())
        .await?;
    inner.wrote();
    Ok(Json(Written { seq }).into_response())
}

/// Fail a blocked run.
///
/// `POST /v1/runs/{id}/fail` (operate) with `{"error"}`: ends a blocked run failed, settling
/// its call with that error; 400 when the error is missing or the run is not blocked.
#[utoipa::path(
    post,
    path = "/v1/runs/{id}/fail",
    operation_id = "failRun",
    tag = "runs",
    params(("id" = String, Path, description = "The run")),
    request_body(content = Decision, description = "`{\"error\": \"why the run failed\"}`"),
    responses(
        (status = 200, description = "Failed: the seq of `RunFailed`", body = Written),
        (status = 400, description = "No error given, or the run is not blocked", body = crate::error::ErrorBody),
        (status = 404, description = "No such run", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["operate"])),
)]
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
    Ok(Json(Written { seq }).into_response())
}
