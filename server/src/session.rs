//! The session channel over HTTP: the session log as Server-Sent Events, pending requests and
//! answers, the task index and task cancellation.

use crate::camel::Camel;
use crate::error::ApiError;
use crate::metrics::Surface;
use crate::Inner;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{FromRequestParts, Path, Query, RawQuery, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use eve_core::engine::{NotATaskKind, SessionError};
use eve_core::wake::{Waiter, WatchKey};
use eve_core::{
    check_client_id, ApiKey, CallId, CancelOutcome, InputResponse, RequestId, RunId, RunStatus,
    SessionEntry, SessionEvent, SessionId, Timestamp,
};
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

/// Entries read per store call while streaming.
const PAGE: usize = 512;

/// The SSE `event:` name of a session event: its channel type (`input.requested`, …).
pub(crate) fn event_type(e: &SessionEvent) -> &'static str {
    match e {
        SessionEvent::InputRequested { .. } => "input.requested",
        SessionEvent::InputAnswered { .. } => "input.answered",
        SessionEvent::InputWithdrawn { .. } => "input.withdrawn",
        SessionEvent::ActionPartial { .. } => "action.partial",
        SessionEvent::TaskProgress { .. } => "task.progress",
        SessionEvent::TaskMessage { .. } => "task.message",
        SessionEvent::TaskCompleted { .. } => "task.completed",
        SessionEvent::TaskFailed { .. } => "task.failed",
        SessionEvent::TaskCancelled => "task.cancelled",
        SessionEvent::TaskDenied { .. } => "task.denied",
        SessionEvent::ToolSettled { .. } => "tool.settled",
        SessionEvent::AgentRequested { .. } => "agent.requested",
        SessionEvent::AgentCompleted { .. } => "agent.completed",
        // SessionEvent is non-exhaustive in spirit: a new kind still streams, under a
        // generic name.
        #[allow(unreachable_patterns)]
        _ => "session.event",
    }
}

/// Drops every `action.partial` that a later `action.partial` of the same call in `entries`
/// supersedes (snapshots are last-write-wins per call), keeping everything else in order.
fn compact_partials(entries: Vec<SessionEntry>) -> Vec<SessionEntry> {
    let mut last: HashMap<CallId, u64> = HashMap::new();
    for e in &entries {
        if matches!(e.event, SessionEvent::ActionPartial { .. }) {
            last.insert(e.call_id.clone(), e.seq);
        }
    }
    entries
        .into_iter()
        .filter(|e| {
            !matches!(e.event, SessionEvent::ActionPartial { .. })
                || last.get(&e.call_id) == Some(&e.seq)
        })
        .collect()
}

/// Query of the events route.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventsQuery {
    /// The first seq to send when there is no `Last-Event-ID` header (default 0).
    from: Option<u64>,
}

pub(crate) fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(q)| q)
        .map_err(|e| ApiError::malformed(format!("bad query string: {}", e.body_text())))
}

/// Follow a session's channel (Server-Sent Events).
///
/// `GET /v1/sessions/{id}/events`: the session log as SSE, from `Last-Event-ID` + 1 (or
/// `?from=`, or 0). Each event has `id:` = its session seq, `event:` = its type, and `data:` =
/// the [`SessionEntry`] as JSON. The backlog is sent with superseded `action.partial` entries
/// left out; then the stream follows new entries as they land. The stream reads only the
/// store, so a client reconnecting to another (or a restarted) server misses nothing.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/events",
    operation_id = "followSession",
    tag = "sessions",
    params(
        ("id" = String, Path, description = "The session"),
        ("Last-Event-ID" = Option<u64>, Header, description = "The session seq of the last event received: the stream resumes after it"),
        EventsQuery,
    ),
    responses(
        (status = 200, description = "An SSE stream: `id:` the session seq, `event:` the event's type (`input.requested`, `tool.settled`, …), `data:` a `SessionEntry` as JSON", content_type = "text/event-stream", body = String),
        (status = 400, description = "A `Last-Event-ID` that is not a seq, or a bad query", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["read"])),
)]
pub(crate) async fn events(
    State(inner): State<Arc<Inner>>,
    SessionPath(session): SessionPath,
    headers: HeaderMap,
    q: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let q = query(q)?;
    let from = match headers.get("last-event-id") {
        Some(v) => {
            let last: u64 = v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .ok_or_else(|| {
                    ApiError::malformed(
                        "Last-Event-ID must be the session seq of the last event received",
                    )
                })?;
            last.saturating_add(1)
        }
        None => q.from.unwrap_or(0),
    };
    let state = Follow::new(inner, session, from).await;
    let stream = futures::stream::unfold(state, |mut s| async move {
        let event = s.next_event().await?;
        Some((Ok(event), s))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// How often a caught-up stream re-reads the log anyway when the store notifies it.
const FALLBACK_POLL: Duration = Duration::from_secs(2);

struct Follow {
    inner: Arc<Inner>,
    changed: tokio::sync::watch::Receiver<u64>,
    /// The store's notifications that this session's log grew (a worker's writes included),
    /// with the poll interval as fallback.
    watch: Waiter,
    shutdown: tokio::sync::watch::Receiver<bool>,
    session: SessionId,
    next: u64,
    buf: VecDeque<SessionEntry>,
    catching_up: bool,
    first: bool,
}

impl Follow {
    /// Follows `session`'s log from seq `next`. Subscribed to the store's notifications before
    /// the first read, so nothing written after it is missed.
    async fn new(inner: Arc<Inner>, session: SessionId, next: u64) -> Self {
        let watch = Waiter::new(
            &*inner.store,
            &WatchKey::Session(session.clone()),
            inner.config.poll_interval.max(FALLBACK_POLL),
            inner.config.poll_interval,
        )
        .await;
        Follow {
            changed: inner.changed.subscribe(),
            shutdown: inner.shutdown.clone(),
            watch,
            inner,
            session,
            next,
            buf: VecDeque::new(),
            catching_up: true,
            first: true,
        }
    }

    /// The next SSE event, or `None` to end the stream (server shutdown, store failure: the
    /// client reconnects with `Last-Event-ID`).
    async fn next_event(&mut self) -> Option<SseEvent> {
        if self.first {
            self.first = false;
            // Tell browsers to reconnect quickly after a server restart.
            return Some(SseEvent::default().retry(Duration::from_millis(500)));
        }
        self.next_entry()
            .await
            .map(|e| sse_event(&e, e.seq.to_string()))
    }

    /// The next entry of the log, waiting for it; `None` on shutdown or a store failure.
    async fn next_entry(&mut self) -> Option<SessionEntry> {
        loop {
            if *self.shutdown.borrow() {
                return None;
            }
            if let Some(entry) = self.buf.pop_front() {
                return Some(entry);
            }
            // Mark the change counter seen before reading, so a write that lands after the
            // read wakes the wait below.
            self.changed.borrow_and_update();
            match self
                .inner
                .store
                .read_session(&self.session, self.next, PAGE)
                .await
            {
                Err(e) => {
                    tracing::warn!(session = %self.session, error = %e, "session stream ends on a store error");
                    return None;
                }
                Ok(page) if page.is_empty() => {
                    self.catching_up = false;
                    // A closed channel (its sender gone) never fires: waiting on it must not
                    // turn this wait into a busy loop. Where the store notifies this session's
                    // writes (this server's included), the server-wide counter is not needed:
                    // waking every stream of every session at each write would cost one read
                    // per followed session per write.
                    let notified = self.watch.notified();
                    let changed = async {
                        if notified || self.changed.changed().await.is_err() {
                            std::future::pending::<()>().await
                        }
                    };
                    let shutdown = async {
                        if self.shutdown.changed().await.is_err() {
                            std::future::pending::<()>().await
                        }
                    };
                    tokio::select! {
                        _ = changed => {}
                        _ = shutdown => {}
                        _ = self.watch.wait() => {}
                    }
                }
                Ok(page) => {
                    self.next = page.last().map_or(self.next, |e| e.seq + 1);
                    let page = if self.catching_up {
                        compact_partials(page)
                    } else {
                        page
                    };
                    self.buf.extend(page);
                }
            }
        }
    }
}

/// At most this many sessions on one `GET /v1/events` stream; more is a 400.
///
/// Each session on a stream has its own reader, woken by the store's notification for that
/// session (polling on a store that cannot notify), and the sessions are named in the URL
/// (which the `http` crate caps at 64 KiB): the cap keeps one connection's cost and its URL
/// bounded. The page follows the sessions it shows (its pinned sessions first, then those of
/// the requests and live runs on screen), at most this many; it finds requests in other
/// sessions by re-reading `GET /v1/requests` every few seconds, so thousands of sessions with
/// pending requests do not break it.
pub const MAX_STREAM_SESSIONS: usize = 500;

/// Follow several sessions on one SSE stream.
///
/// `GET /v1/events?session=A&session=B…`: several sessions' logs as one SSE stream, so a
/// page follows any number of sessions over one connection (browsers allow six per host over
/// HTTP/1.1). Each event is as on the per-session route, except `id:`: a cursor, the JSON object
/// of the last seq sent per session (`{"A":4,"B":9}`), which `Last-Event-ID` (or `?from=`)
/// sends back to resume every session where it was; a session missing from it starts at 0.
/// Entries of one session come in order; sessions interleave as their entries land.
#[utoipa::path(
    get,
    path = "/v1/events",
    operation_id = "followSessions",
    tag = "sessions",
    params(
        ("session" = Vec<String>, Query, description = "A session to follow (repeat for several, at most 500)", explode = true),
        ("from" = Option<String>, Query, description = "Where to resume when there is no `Last-Event-ID`: a cursor, the `id:` of the last event received"),
        ("Last-Event-ID" = Option<String>, Header, description = "The cursor of the last event received (`{\"A\":4,\"B\":9}`): every session resumes after its seq"),
    ),
    responses(
        (status = 200, description = "An SSE stream: `id:` a cursor (the JSON object of the last seq sent per session), `event:` the event's type, `data:` a `SessionEntry` as JSON", content_type = "text/event-stream", body = String),
        (status = 400, description = "No session, more than 500, an unknown parameter or a bad cursor", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["read"])),
)]
pub(crate) async fn events_many(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let mut sessions: Vec<String> = Vec::new();
    let mut from = None;
    for (k, v) in url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match &*k {
            "session" if !v.is_empty() => {
                check_client_id("session", &v)?;
                if !sessions.iter().any(|s| *s == v) {
                    sessions.push(v.into_owned());
                }
            }
            "from" => from = Some(v.into_owned()),
            other => {
                return Err(ApiError::malformed(format!(
                    "unknown query parameter {other:?}: use session=ID (repeatable) and from=CURSOR"
                )))
            }
        }
    }
    if sessions.is_empty() {
        return Err(ApiError::malformed(
            "name the sessions to follow: /v1/events?session=A&session=B",
        ));
    }
    if sessions.len() > MAX_STREAM_SESSIONS {
        return Err(ApiError::malformed(format!(
            "{} sessions on one stream; at most {MAX_STREAM_SESSIONS}",
            sessions.len()
        )));
    }
    let cursor_text = match headers.get("last-event-id") {
        Some(v) => Some(v.to_str().map(str::to_owned).map_err(|_| {
            ApiError::malformed("Last-Event-ID must be the id of the last event received")
        })?),
        None => from,
    };
    let mut cursor: std::collections::BTreeMap<String, u64> = match cursor_text {
        Some(t) if !t.trim().is_empty() => serde_json::from_str(&t).map_err(|_| {
            ApiError::malformed(
                "Last-Event-ID (or from=) must be the id of the last event received: a JSON object of session id to seq",
            )
        })?,
        _ => Default::default(),
    };
    cursor.retain(|s, _| sessions.contains(s));
    let mut streams = Vec::with_capacity(sessions.len());
    for session in &sessions {
        let next = cursor.get(session).map_or(0, |n| n.saturating_add(1));
        let follow = Follow::new(inner.clone(), SessionId::new(session.clone()), next).await;
        streams.push(Box::pin(futures::stream::unfold(
            follow,
            |mut f| async move {
                let entry = f.next_entry().await?;
                Some((entry, f))
            },
        )));
    }
    let retry =
        futures::stream::once(async { Ok(SseEvent::default().retry(Duration::from_millis(500))) });
    let events = futures::stream::select_all(streams).map(move |entry| {
        cursor.insert(entry.session_id.to_string(), entry.seq);
        let id = serde_json::to_string(&cursor).expect("a cursor serializes");
        Ok(sse_event(&entry, id))
    });
    Ok(Sse::new(retry.chain(events)).keep_alive(KeepAlive::default()))
}

/// The SSE event of `entry`, with `id:` = `id` (the session seq, or a multiplexed cursor).
fn sse_event(entry: &SessionEntry, id: String) -> SseEvent {
    let data = serde_json::to_string(&Camel(entry)).expect("a session entry serializes");
    SseEvent::default()
        .id(id)
        .event(event_type(&entry.event))
        .data(data)
}

/// The pending input requests of a session.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct SessionRequests {
    /// Oldest first.
    #[schema(value_type = Vec<eve_core::PendingRequest>)]
    requests: Camel<Vec<eve_core::PendingRequest>>,
}

/// A session's pending input requests.
///
/// `GET /v1/sessions/{id}/requests`: `{"requests": [PendingRequest…]}`, oldest first.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/requests",
    operation_id = "sessionRequests",
    tag = "sessions",
    params(("id" = String, Path, description = "The session")),
    responses((status = 200, description = "The session's pending requests", body = SessionRequests)),
    security(("bearer" = ["read"])),
)]
pub(crate) async fn requests(
    State(inner): State<Arc<Inner>>,
    SessionPath(session): SessionPath,
) -> Result<Json<SessionRequests>, ApiError> {
    let pending = inner.store.pending_requests(&session).await?;
    Ok(Json(SessionRequests {
        requests: Camel(pending),
    }))
}

/// The body of an answer: `{"optionId": "approve"}` or `{"text": "..."}` (or both when the
/// request allows free text beside an option).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct AnswerBody {
    /// The chosen option's id.
    #[serde(default)]
    option_id: Option<String>,
    /// Free text, where the request allows it.
    #[serde(default)]
    text: Option<String>,
}

/// What an accepted answer returns.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Answered {
    /// The request answered.
    request_id: RequestId,
    /// Its run.
    run_id: RunId,
    /// The seq of the `InputAnswered` event in the run's journal.
    seq: u64,
    /// Whether the same answer had been given before (nothing was written this time).
    duplicate: bool,
}

/// Answer an input request.
///
/// `POST /v1/requests/{id}/answer`: 200 when accepted (also for the same answer again, with
/// `duplicate: true`, whichever key sends it); 404 unknown request, 409 answered with another
/// response, 410 withdrawn, 422 not an answer the request accepts, 400 malformed body. The
/// journal's `InputAnswered` records the name of the API key that answered as `answeredBy`
/// (the first answer's, on a duplicate); a body cannot set it, and with `insecure_no_auth`
/// no name is recorded.
#[utoipa::path(
    post,
    path = "/v1/requests/{id}/answer",
    operation_id = "answerRequest",
    tag = "requests",
    params(("id" = String, Path, description = "The request")),
    request_body(content = AnswerBody, description = "`{\"optionId\": …}` or `{\"text\": …}` (or both where free text is allowed beside an option)"),
    responses(
        (status = 200, description = "Accepted, or the same answer again (`duplicate: true`)", body = Answered),
        (status = 400, description = "A body that is not such an object", body = crate::error::ErrorBody),
        (status = 404, description = "No such request", body = crate::error::ErrorBody),
        (status = 409, description = "`already_answered`, with another answer", body = crate::error::ErrorBody),
        (status = 410, description = "`withdrawn`: the request's run ended", body = crate::error::ErrorBody),
        (status = 422, description = "`invalid_answer`: an option the request does not offer, or text where it takes none", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["answer"])),
)]
pub(crate) async fn answer(
    State(inner): State<Arc<Inner>>,
    headers: axum::http::HeaderMap,
    key: Option<Extension<ApiKey>>,
    Path(request): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Answered>, ApiError> {
    let body = crate::error::body(&inner, body)?;
    // The same answer as before for a body that is not one object (an array included).
    let body: AnswerBody = crate::error::json_object(
        &body,
        "the answer as a JSON object {\"optionId\": …} or {\"text\": …}",
    )?;
    let request_id = RequestId::new(request);
    let response = InputResponse {
        option_id: body.option_id,
        text: body.text,
        answered_by: key.map(|Extension(k)| k.name),
        agent: None,
    };
    record_answer(&inner, request_id, response, Surface::of(&headers)).await
}

/// Records `response` to `request_id` (an answer, or a subagent call's result), counting it in
/// the metrics under the `surface` it came through and waking the server's followers when
/// something was written.
pub(crate) async fn record_answer(
    inner: &Inner,
    request_id: RequestId,
    response: InputResponse,
    surface: Surface,
) -> Result<Json<Answered>, ApiError> {
    let d = match inner
        .store
        .answer(&request_id, response, inner.clock.now())
        .await
    {
        Ok(d) => d,
        Err(e) => {
            inner.metrics.answer("refused", surface);
            return Err(e.into());
        }
    };
    inner
        .metrics
        .answer(if d.duplicate { "duplicate" } else { "accepted" }, surface);
    if !d.duplicate {
        inner.wrote();
    }
    Ok(Json(Answered {
        request_id,
        run_id: d.run,
        seq: d.seq,
        duplicate: d.duplicate,
    }))
}

/// One background run of a session, as the task index shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TaskView {
    /// The task's id: its run id.
    task_id: RunId,
    /// The tool call that started it.
    call_id: CallId,
    /// The tool.
    tool: String,
    /// Where it stands.
    status: RunStatus,
    /// Whether a cancel was requested.
    cancel_requested: bool,
    /// When it was created.
    created_at: Timestamp,
    /// When it last changed.
    updated_at: Timestamp,
}

/// The `{id}` of a `/v1/sessions/{id}/…` route, checked by [`check_client_id`] (400
/// `invalid_id`) before the handler runs, so every session route refuses the same ids.
pub(crate) struct SessionPath(pub(crate) SessionId);

impl<S: Send + Sync> FromRequestParts<S> for SessionPath {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        let Path(session) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        check_client_id("session", &session).map_err(|e| ApiError::from(e).into_response())?;
        Ok(SessionPath(SessionId::new(session)))
    }
}

/// A session's background runs.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct SessionTasks {
    /// Oldest first.
    tasks: Vec<TaskView>,
}

/// A session's background runs (its task index).
///
/// `GET /v1/sessions/{id}/tasks`: `{"tasks": [...]}`, the session's background runs, oldest
/// first.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/tasks",
    operation_id = "sessionTasks",
    tag = "sessions",
    params(("id" = String, Path, description = "The session")),
    responses((status = 200, description = "The session's background runs", body = SessionTasks)),
    security(("bearer" = ["read"])),
)]
pub(crate) async fn tasks(
    State(inner): State<Arc<Inner>>,
    SessionPath(session): SessionPath,
) -> Result<Json<SessionTasks>, ApiError> {
    // The task index is the library's (`Session::tasks`), not a second listing.
    let tasks = crate::turns::session(&inner, session)
        .tasks()
        .await?
        .into_iter()
        .map(|t| TaskView {
            task_id: t.task_id,
            call_id: t.call_id,
            tool: t.tool,
            status: t.status,
            cancel_requested: t.cancel_requested,
            created_at: t.created_at,
            updated_at: t.updated_at,
        })
        .collect();
    Ok(Json(SessionTasks { tasks }))
}

/// Request the cancellation of a background task.
///
/// `POST /v1/tasks/{id}/cancel`: 202 `{"outcome": "requested", "seq": n}` when the cancel was
/// written; 200 `{"outcome": "already_requested"}` or `{"outcome": "already_ended", "status":
/// …}` otherwise. 404 unknown run; 409 `not_a_task` for a default-execution run (cancel its
/// turn instead).
#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/cancel",
    operation_id = "cancelTask",
    tag = "sessions",
    params(("id" = String, Path, description = "The task (its run id)")),
    responses(
        (status = 202, description = "The cancel was written (`outcome: requested`)", body = CancelAnswer),
        (status = 200, description = "Nothing written: `already_requested` or `already_ended`", body = CancelAnswer),
        (status = 404, description = "No such task", body = crate::error::ErrorBody),
        (status = 409, description = "`not_a_task`: a default-execution call", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["operate"])),
)]
pub(crate) async fn cancel(
    State(inner): State<Arc<Inner>>,
    Path(task): Path<String>,
) -> Result<Response, ApiError> {
    let run_id = RunId::new(task);
    // The seed's `task_cancel`, shared with `POST /v1/sessions/{id}/tasks/{task}/cancel` and
    // `Session::task_cancel`; any session's task.
    let outcome = eve_core::engine::task_cancel(&*inner.store, None, &run_id, inner.clock.now())
        .await
        .map_err(|e| match e {
            SessionError::NotATask {
                kind: NotATaskKind::DefaultExecution,
                ..
            } => ApiError::new(
                StatusCode::CONFLICT,
                "not_a_task",
                format!("{run_id} is a default-execution call, not a background task; steer its session's turn to cancel it"),
            ),
            SessionError::NotATask { .. } => ApiError::not_found(format!("no task {run_id}")),
            e => e.into(),
        })?;
    Ok(cancel_answer(&inner, outcome))
}

/// A session's record.
///
/// `GET /v1/sessions/{id}`: the session's record (contract clause 10): `endedAt` (null while
/// it takes calls) and the user messages queued for its next turn.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}",
    operation_id = "getSession",
    tag = "sessions",
    params(("id" = String, Path, description = "The session")),
    responses((status = 200, description = "The session's record (a session never heard of reads as live with an empty queue)", body = eve_core::SessionRecord)),
    security(("bearer" = ["read"])),
)]
pub(crate) async fn record(
    State(inner): State<Arc<Inner>>,
    SessionPath(session): SessionPath,
) -> Result<Json<Camel<eve_core::SessionRecord>>, ApiError> {
    Ok(Json(Camel(inner.store.get_session(&session).await?)))
}

/// The end of a session.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SessionEnded {
    /// When the session was ended (the first end's time, also on a repeated end).
    ended_at: Timestamp,
    /// The runs of the session whose cancellation this end requested.
    cancelled: Vec<RunId>,
}

/// End a session and cancel its runs.
///
/// `POST /v1/sessions/{id}/end`: ends the session in the store — no handle, process or
/// `POST /v1/tools/{name}/calls` starts a call in it afterwards (409 `session_ended`) — and
/// requests cancellation of every run of it that had not ended (background tasks and parked
/// calls alike). 200 `{"endedAt", "cancelled": [run ids]}`; ending again keeps the first time
/// and lists the runs still unwinding.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/end",
    operation_id = "endSession",
    tag = "sessions",
    params(("id" = String, Path, description = "The session")),
    responses((status = 200, description = "Ended", body = SessionEnded)),
    security(("bearer" = ["operate"])),
)]
pub(crate) async fn end(
    State(inner): State<Arc<Inner>>,
    SessionPath(session): SessionPath,
) -> Result<Response, ApiError> {
    let now = inner.clock.now();
    let end = inner.store.end_session(&session, now).await?;
    // The same reason and the same skips as the library's `Session::end`.
    let cancelled = eve_core::engine::cancel_runs(
        &*inner.store,
        end.live,
        eve_core::engine::REASON_SESSION_END,
        now,
    )
    .await?;
    if !cancelled.is_empty() {
        inner.wrote();
    }
    Ok(Json(SessionEnded {
        ended_at: end.ended_at,
        cancelled,
    })
    .into_response())
}

/// What a cancel route answers: whether it wrote the cancel, and if not why.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub(crate) enum CancelAnswer {
    /// The cancel was written (202).
    Requested {
        /// The seq of `CancelRequested` in the run's journal.
        seq: u64,
    },
    /// A cancel had been requested before (200).
    AlreadyRequested,
    /// The run had ended (200).
    AlreadyEnded {
        /// How it ended.
        status: RunStatus,
    },
}

/// Requests cancellation of `run_id` and answers as `POST /v1/tasks/{id}/cancel` does.
pub(crate) async fn cancel_run(
    inner: &Inner,
    run_id: &RunId,
    reason: &str,
) -> Result<Response, ApiError> {
    let outcome = inner
        .store
        .request_cancel(run_id, reason, inner.clock.now())
        .await?;
    Ok(cancel_answer(inner, outcome))
}

/// The answer of a cancel route for `outcome`: 202 when the cancel was written, else 200.
pub(crate) fn cancel_answer(inner: &Inner, outcome: CancelOutcome) -> Response {
    match outcome {
        CancelOutcome::Requested { seq } => {
            inner.wrote();
            (StatusCode::ACCEPTED, Json(CancelAnswer::Requested { seq })).into_response()
        }
        CancelOutcome::AlreadyRequested => Json(CancelAnswer::AlreadyRequested).into_response(),
        CancelOutcome::AlreadyEnded { status } => {
            Json(CancelAnswer::AlreadyEnded { status }).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eve_core::Payload;

    fn entry(seq: u64, call: &str, event: SessionEvent) -> SessionEntry {
        SessionEntry {
            session_id: SessionId::new("s"),
            seq,
            at: Timestamp(0),
            run_id: RunId::new(format!("run-{call}")),
            call_id: CallId::new(call),
            event,
        }
    }

    #[test]
    fn backlog_keeps_the_latest_partial_per_call() {
        let partial = |v: &str| SessionEvent::ActionPartial {
            value: Payload::from_json(v).unwrap(),
        };
        let out = compact_partials(vec![
            entry(0, "a", partial("1")),
            entry(1, "b", partial("1")),
            entry(2, "a", SessionEvent::TaskCancelled),
            entry(3, "a", partial("2")),
        ]);
        let seqs: Vec<u64> = out.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
        assert_eq!(event_type(&out[1].event), "task.cancelled");
    }
}
