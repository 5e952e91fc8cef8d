//! Turns and the task index over HTTP: `POST /v1/sessions/{id}/messages` is
//! [`Session::user_message`], `GET /v1/sessions/{id}/turn` is [`Session::try_next_turn`]
//! awaited on the session's notification, `POST /v1/sessions/{id}/tasks/{task}/cancel` is
//! [`Session::task_cancel`]. The turn policy, the task index and `task_cancel`'s rules live in
//! eve-core's [`Session`] only; these handlers parse, call it and map its typed errors.

use crate::camel::Camel;
use crate::error::ApiError;
use crate::session::{query, SessionPath};
use crate::Inner;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use eve_core::engine::{
    EngineError, NotATaskKind, Registry, Session, SessionError, Turn, TurnOutcome, TurnPolicy,
};
use eve_core::wake::{Waiter, WatchKey};
use eve_core::{CallId, QueuedMessage, RunId, SessionEntry, SessionId};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// The longest `GET /v1/sessions/{id}/turn?wait=` honoured; a longer one waits this long.
pub const MAX_TURN_WAIT: Duration = Duration::from_secs(60);

/// How often a turn wait re-reads the session anyway when the store notifies it: for a
/// message queued by another process (this server's own messages wake it at once).
const FALLBACK_POLL: Duration = Duration::from_secs(2);

/// A [`Session`] handle on `session` for the turn routes. Its registry is empty: these routes
/// never start a tool call through it (`POST /v1/tools/{name}/calls` does), and the policy,
/// the task index and `task_cancel` need none.
pub(crate) fn session(inner: &Inner, session: SessionId) -> Session {
    Session::new(
        inner.store.clone(),
        Arc::new(Registry::new("eve-server-turns")),
        inner.clock.clone(),
        session,
    )
}

/// [`SessionError`]'s kinds as HTTP answers.
impl From<SessionError> for ApiError {
    fn from(e: SessionError) -> Self {
        let (status, code) = match &e {
            SessionError::Store(_) | SessionError::Engine(EngineError::Store(_)) => {
                return match e {
                    SessionError::Store(s) | SessionError::Engine(EngineError::Store(s)) => {
                        s.into()
                    }
                    _ => unreachable!("matched a store error above"),
                };
            }
            SessionError::Ended { .. } => (StatusCode::CONFLICT, "session_ended"),
            SessionError::NotATask {
                kind: NotATaskKind::DefaultExecution,
                ..
            } => (StatusCode::CONFLICT, "not_a_task"),
            SessionError::NotATask { .. }
            | SessionError::UnknownCall { .. }
            | SessionError::UnknownRequest { .. }
            | SessionError::Engine(EngineError::UnknownTool { .. }) => {
                (StatusCode::NOT_FOUND, "not_found")
            }
            SessionError::BackgroundCall { .. } => (StatusCode::CONFLICT, "background_call"),
            SessionError::AlreadyAnswered { .. } => (StatusCode::CONFLICT, "already_answered"),
            SessionError::Withdrawn { .. } => (StatusCode::GONE, "withdrawn"),
            SessionError::InvalidAnswer { .. } => {
                (StatusCode::UNPROCESSABLE_ENTITY, "invalid_answer")
            }
            SessionError::Engine(_) => (StatusCode::BAD_REQUEST, "invalid_input"),
            _ => {
                tracing::error!(error = %e, "session error");
                (StatusCode::INTERNAL_SERVER_ERROR, "internal")
            }
        };
        ApiError::new(status, code, e.to_string())
    }
}

/// The body of `POST /v1/sessions/{id}/messages` (its schema; the handler reads the fields
/// one by one so that every refusal names its field).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
pub(crate) struct MessageBody {
    /// The user message, any JSON but `null` (kept as given).
    message: serde_json::Value,
    /// `queue` (default: wait for the parked calls) or `steer` (cancel the turn's parked
    /// calls).
    #[schema(value_type = Option<String>, example = "queue")]
    policy: Option<String>,
}

/// The expected body, for refusals.
const MESSAGE_BODY: &str = "{\"message\": …, \"policy\": \"queue\" | \"steer\"}";

/// The message and policy of a `POST /v1/sessions/{id}/messages` body; 400 `malformed`
/// naming the field otherwise.
fn message_body(body: &[u8]) -> Result<(serde_json::Value, TurnPolicy), ApiError> {
    let mut body: serde_json::Map<String, serde_json::Value> =
        crate::error::json_object(body, MESSAGE_BODY)?;
    if let Some(other) = body.keys().find(|k| *k != "message" && *k != "policy") {
        return Err(ApiError::malformed(format!(
            "unknown field `{other}`: send {MESSAGE_BODY}"
        )));
    }
    let policy = match body.remove("policy") {
        None | Some(serde_json::Value::Null) => TurnPolicy::Queue,
        Some(serde_json::Value::String(p)) if p == "queue" => TurnPolicy::Queue,
        Some(serde_json::Value::String(p)) if p == "steer" => TurnPolicy::Steer,
        Some(other) => {
            return Err(ApiError::malformed(format!(
                "field `policy` must be \"queue\" or \"steer\", got {other}"
            )))
        }
    };
    match body.remove("message") {
        None | Some(serde_json::Value::Null) => Err(ApiError::malformed(format!(
            "field `message` is required and must not be null: send {MESSAGE_BODY}"
        ))),
        Some(m) => Ok((m, policy)),
    }
}

/// What `POST /v1/sessions/{id}/messages` did: [`TurnOutcome`], tagged by `outcome`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub(crate) enum MessageOutcome {
    /// No call was parked: these messages (every queued one, this one last) start a turn now.
    Delivered {
        /// Oldest first.
        #[schema(value_type = Vec<QueuedMessage>)]
        messages: Vec<QueuedMessage>,
    },
    /// `queue`: the message waits for these parked calls; `GET …/turn` delivers it then.
    #[serde(rename_all = "camelCase")]
    Queued {
        /// The parked calls, oldest first.
        #[schema(value_type = Vec<String>)]
        waiting_on: Vec<CallId>,
    },
    /// `steer`: cancellation was requested for these runs (the turn's parked calls); the
    /// message starts a turn (`GET …/turn`) once they settled cancelled.
    Steered {
        /// The runs whose cancellation was requested.
        #[schema(value_type = Vec<String>)]
        cancelled: Vec<RunId>,
    },
}

impl From<TurnOutcome> for MessageOutcome {
    fn from(o: TurnOutcome) -> Self {
        match o {
            TurnOutcome::Delivered { messages } => MessageOutcome::Delivered { messages },
            TurnOutcome::Queued { waiting_on } => MessageOutcome::Queued { waiting_on },
            TurnOutcome::Steered { cancelled } => MessageOutcome::Steered { cancelled },
        }
    }
}

/// Send a user message to a session (queue or steer).
///
/// `POST /v1/sessions/{id}/messages` with `{"message": …, "policy": "queue" | "steer"}`
/// (`policy` defaults to `queue`): the message is persisted in the session's queue, then the
/// turn policy applies, exactly as `Session::user_message` does. 200 with `outcome`:
/// `delivered` (no call was parked: `messages` start a turn now, every earlier queued one
/// first), `queued` (`waitingOn`: the parked calls it waits for) or `steered` (`cancelled`:
/// the parked calls' runs whose cancellation was requested; their requests are withdrawn and
/// the calls settle cancelled). Background tasks are never part of a turn. A queued or
/// steering message is delivered by `GET /v1/sessions/{id}/turn`. 409 `session_ended` once
/// the session ended; 400 `malformed` naming the field for a bad body.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/messages",
    operation_id = "sendMessage",
    tag = "sessions",
    params(("id" = String, Path, description = "The session")),
    request_body(content = MessageBody, description = "`{\"message\": …, \"policy\": \"queue\" | \"steer\"}`"),
    responses(
        (status = 200, description = "`delivered`, `queued` or `steered`", body = MessageOutcome),
        (status = 400, description = "`malformed`: not such an object, no `message`, or a `policy` that is neither `queue` nor `steer` (the message names the field)", body = crate::error::ErrorBody),
        (status = 409, description = "`session_ended`: the session takes no more messages", body = crate::error::ErrorBody),
        (status = 413, description = "`too_large`: a message over the store's payload limit", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["operate"])),
)]
pub(crate) async fn message(
    State(inner): State<Arc<Inner>>,
    SessionPath(id): SessionPath,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<MessageOutcome>, ApiError> {
    let body = crate::error::body(&inner, body)?;
    let (message, policy) = message_body(&body)?;
    let outcome = session(&inner, id).user_message(policy, message).await;
    // A queued message wakes this server's turn waits at once; a steer wrote cancels.
    inner.wrote();
    Ok(Json(outcome?.into()))
}

/// Query of `GET /v1/sessions/{id}/turn`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct TurnQuery {
    /// Wait up to this long (`30s`, `500ms`, `1m`; at most 60 s) for a turn; default 0
    /// (answer at once).
    wait: Option<String>,
    /// The session-log seq from which background tasks' notices (`task.message`,
    /// `task.completed`, `task.failed`, `task.cancelled`) make a turn too: the `nextSeq` of
    /// the previous turn (0 the first time). Without it only user messages make a turn.
    from: Option<u64>,
}

/// The next turn: what it is made of.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TurnView {
    /// The queued user messages, oldest first; each is delivered by exactly one turn.
    #[schema(value_type = Vec<QueuedMessage>)]
    messages: Vec<QueuedMessage>,
    /// With `from`: the background tasks' notices since it, in seq order (not consumed; the
    /// cursor is the client's).
    #[schema(value_type = Vec<SessionEntry>)]
    notices: Camel<Vec<SessionEntry>>,
    /// With `from`: the `from` of the next call; `null` without it.
    next_seq: Option<u64>,
}

impl From<Turn> for TurnView {
    fn from(t: Turn) -> Self {
        TurnView {
            messages: t.messages,
            notices: Camel(t.notices),
            next_seq: t.next_seq,
        }
    }
}

/// Wait for the session's next turn.
///
/// `GET /v1/sessions/{id}/turn?wait=30s&from=N` is `Session::next_turn` over HTTP: once no
/// default-execution call of the session is parked, it takes the queued user messages
/// (exactly once across every client and process) and, with `from`, collects the background
/// tasks' turn-requesting notices (a `postMessage` is `task.message`) from that seq on. 200
/// `{"messages", "notices", "nextSeq"}` when there is a turn; 204 (no body) when none came
/// within `wait` (at most 60 s; default 0) or a call stayed parked that long. The wait is
/// woken by the session log's notifications (a call settling, a task's notice) and by
/// messages sent to this server; a message queued through another process is seen within
/// 2 s. Scope operate: taking the queue acts on the session.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/turn",
    operation_id = "nextTurn",
    tag = "sessions",
    params(("id" = String, Path, description = "The session"), TurnQuery),
    responses(
        (status = 200, description = "The next turn: messages taken from the queue and, with `from`, the notices since it", body = TurnView),
        (status = 204, description = "No turn within `wait` (nothing queued or noticed, or a call stayed parked)"),
        (status = 400, description = "`malformed`: a bad `wait` or `from`", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["operate"])),
)]
pub(crate) async fn turn(
    State(inner): State<Arc<Inner>>,
    SessionPath(id): SessionPath,
    q: Result<Query<TurnQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let wait = match q.wait.as_deref() {
        None | Some("") => Duration::ZERO,
        Some(w) => crate::calls::parse_wait(w).ok_or_else(|| {
            ApiError::malformed(format!(
                "wait={w:?} is not a duration such as 30s, 500ms or 1m"
            ))
        })?,
    }
    .min(MAX_TURN_WAIT);
    let deadline = tokio::time::Instant::now() + wait;
    // Subscribed before the first read: nothing written after it is missed.
    let mut watch = Waiter::new(
        &*inner.store,
        &WatchKey::Session(id.clone()),
        inner.config.poll_interval.max(FALLBACK_POLL),
        inner.config.poll_interval,
    )
    .await;
    let mut changed = inner.changed.subscribe();
    let mut shutdown = inner.shutdown.clone();
    let session = session(&inner, id);
    loop {
        changed.borrow_and_update();
        if let Some(turn) = session.try_next_turn(q.from).await? {
            return Ok(Json(TurnView::from(turn)).into_response());
        }
        if tokio::time::Instant::now() >= deadline || *shutdown.borrow() {
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        let changed = async {
            if changed.changed().await.is_err() {
                std::future::pending::<()>().await
            }
        };
        let stopping = async {
            if shutdown.changed().await.is_err() {
                std::future::pending::<()>().await
            }
        };
        tokio::select! {
            _ = watch.wait() => {}
            _ = changed => {}
            _ = stopping => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// Cancel a background task of a session (`task_cancel`).
///
/// `POST /v1/sessions/{id}/tasks/{task}/cancel` follows the seed's `task_cancel`
/// (`Session::task_cancel`): 202 `{"outcome": "requested", "seq"}` when the cancel was
/// written (the body gets its grace period, then the task ends `task.cancelled`); 200
/// `already_requested`, or `already_ended` with its `status` for a task that ended. 404
/// `not_found` when the id names no run of this session; 409 `not_a_task` for a
/// default-execution call (it belongs to the turn: send a steering message to cancel it).
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/tasks/{task}/cancel",
    operation_id = "cancelSessionTask",
    tag = "sessions",
    params(
        ("id" = String, Path, description = "The session"),
        ("task" = String, Path, description = "The task (its run id, the receipt's `taskId`)"),
    ),
    responses(
        (status = 202, description = "The cancel was written (`outcome: requested`)", body = crate::session::CancelAnswer),
        (status = 200, description = "Nothing written: `already_requested` or `already_ended`", body = crate::session::CancelAnswer),
        (status = 404, description = "No such task in this session", body = crate::error::ErrorBody),
        (status = 409, description = "`not_a_task`: a default-execution call (steer the turn instead)", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["operate"])),
)]
pub(crate) async fn cancel_task(
    State(inner): State<Arc<Inner>>,
    Path((id, task)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    eve_core::check_client_id("session", &id)?;
    let outcome = session(&inner, SessionId::new(id))
        .task_cancel(&RunId::new(task))
        .await?;
    Ok(crate::session::cancel_answer(&inner, outcome))
}
