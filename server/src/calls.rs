//! Starting calls over HTTP: `GET /v1/tools` lists the tools of the registry the server was
//! given ([`crate::AppState::with_registry`]); `POST /v1/tools/{name}/calls` starts one, with
//! the session and call id as its idempotency key, and with `?wait=` long-polls until a
//! default-execution call settles.

use crate::camel::Camel;
use crate::error::ApiError;
use crate::Inner;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use eve_core::engine::{tool_call_run, EngineError};
use eve_core::wake::until_ended;
use eve_core::{
    check_client_id, CallId, Event, Execution, JournalStore, JournalStoreExt, RunRecord, SessionId,
    StoreError,
};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// The longest `?wait=` honoured; a longer one waits this long.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// A tool this server starts.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ToolView {
    /// The model-visible name.
    name: String,
    /// What it does, for a model.
    description: String,
    /// Default (the call waits for the run) or background (a task).
    execution: Execution,
    /// The JSON Schema its input must match.
    input_schema: serde_json::Value,
    /// Whether a call waits for an approval (options `approve` / `deny`) before the body runs:
    /// the tool's approval policy may ask a person, and a denied call settles `denied`.
    needs_approval: bool,
}

/// The tools this server starts.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Tools {
    /// By name.
    tools: Vec<ToolView>,
}

/// The tools this server starts.
///
/// `GET /v1/tools` (read): `{"tools": [{name, description, execution, inputSchema,
/// needsApproval}]}`, by name.
#[utoipa::path(
    get,
    path = "/v1/tools",
    operation_id = "listTools",
    tag = "tools",
    responses((status = 200, description = "The tools, by name (none when the server was given no registry)", body = Tools)),
    security(("bearer" = ["read"])),
)]
pub(crate) async fn list(State(inner): State<Arc<Inner>>) -> Json<Tools> {
    let mut tools: Vec<ToolView> = inner
        .registry
        .iter()
        .flat_map(|r| r.tools())
        .map(|t| ToolView {
            name: t.name().to_owned(),
            description: t.description().to_owned(),
            execution: t.execution(),
            input_schema: t.input_schema().clone(),
            needs_approval: t.requires_approval(),
        })
        .collect();
    // Ordinary tools of default execution run inline in the call.
    tools.extend(
        inner
            .registry
            .iter()
            .flat_map(|r| r.ordinary_tools())
            .map(|t| ToolView {
                name: t.name().to_owned(),
                description: t.description().to_owned(),
                execution: t.execution(),
                input_schema: t.input_schema().clone(),
                needs_approval: false,
            }),
    );
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    Json(Tools { tools })
}

/// The body of `POST /v1/tools/{name}/calls`: `{session, callId, input}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct StartCall {
    /// The session the call belongs to.
    session: String,
    /// The call's id within the session: with the session, the idempotency key. Deprecated
    /// spelling `call_id`, accepted because it shipped (see [`crate::DEPRECATED_REQUEST_FIELDS`]).
    #[serde(alias = "call_id")]
    call_id: String,
    /// The tool's input, matching its input schema.
    input: serde_json::Value,
}

/// Query of `POST /v1/tools/{name}/calls`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct StartQuery {
    /// Wait up to this long (`30s`, `500ms`, `2m`; at most 5 minutes) for a default-execution
    /// call to settle.
    wait: Option<String>,
}

/// A call started (or found again), or an ordinary tool's call run inline.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CallStarted {
    /// The call's run; `null` for an ordinary tool of default execution, which runs inline in
    /// the call (no run, no journal) and is `settled` at once.
    #[schema(value_type = Option<RunRecord>)]
    run: Option<Camel<RunRecord>>,
    /// How it settled, once it has ended; `null` while it runs.
    settled: Option<Settled>,
    /// A background call's receipt (the seed's `{status: "working", taskId}`, as MCP and
    /// `Session::call_tool` give it): always `working`, the call's one result, also on a retry
    /// after the task ended (`run.status` and `settled` say where the task stands). Absent for
    /// a default-execution call.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "working")]
    status: Option<&'static str>,
    /// A background call's task id: its run id, for `POST /v1/sessions/{id}/tasks/{task}/cancel`
    /// and the session's `task.*` events. Absent for a default-execution call.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    task_id: Option<eve_core::RunId>,
}

/// How an ended call settled.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Settled {
    /// How the run ended.
    status: eve_core::RunStatus,
    /// The output of a completed run.
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<serde_json::Value>,
    /// The error of a failed run; the reason of a denied one.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// Set when the call was denied by its tool's approval policy or the person asked (the
    /// body never ran): `status` is then `failed` and `error` the reason.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    denied: bool,
}

/// Parses `30s`, `500ms`, `2m` (or plain seconds).
pub(crate) fn parse_wait(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (n, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = n.parse().ok()?;
    Some(match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60)?),
        _ => return None,
    })
}

/// Start a tool call.
///
/// `POST /v1/tools/{name}/calls` (operate) with `{session, callId, input}` (`call_id` is the
/// deprecated spelling, still accepted): 201 `{"run":
/// RunRecord, "settled": …}` when started, 200 with the same body when this session and call id
/// started it before (a retry), 409 `idempotency_mismatch` when they did with another input;
/// 404 unknown tool, 400 `invalid_input` naming the field of an input the tool's input type
/// refuses (`amount: expected a number, got the string "ten"`), 400 `invalid_id` for a session or
/// call id that breaks [`eve_core::check_client_id`]'s limits (nothing is created). With `?wait=30s` a default-execution
/// call is awaited (woken by the store's notifications, not a tight poll) until it settles or
/// the time is up: `settled` then holds `{"status", "output"}` or `{"status", "error"}`, else
/// `null`. Background calls are never awaited: they settle as tasks, and their answer carries
/// the receipt, `"status": "working"` and `"taskId"` (the run id). An ordinary tool of default
/// execution runs inline: 200 with `"run": null` and `settled` at once (nothing is stored; a
/// retry runs it again).
///
/// A W3C `traceparent` header makes the run's spans part of the caller's trace (see
/// [`eve_core::trace`]); a malformed one is ignored, and the run starts a trace of its own.
#[utoipa::path(
    post,
    path = "/v1/tools/{name}/calls",
    operation_id = "startCall",
    tag = "tools",
    params(
        ("name" = String, Path, description = "The tool"),
        ("traceparent" = Option<String>, Header, description = "W3C trace context of the caller: the run's root span becomes its child (a malformed value is ignored)"),
        StartQuery
    ),
    request_body = StartCall,
    responses(
        (status = 201, description = "Started; a background call's answer carries its receipt, `status: \"working\"` and `taskId`", body = CallStarted),
        (status = 200, description = "Started before by this session and call id (a retry), or an ordinary tool run inline (`run` null, `settled` set)", body = CallStarted),
        (status = 400, description = "An input that fails the tool's schema (`invalid_input`, the message naming the field path), a session or call id that breaks the limits of ids a client chooses (`invalid_id`), a bad body or `wait` (`malformed`)", body = crate::error::ErrorBody),
        (status = 404, description = "No such tool", body = crate::error::ErrorBody),
        (status = 409, description = "`idempotency_mismatch` (this session and call id started it with another input) or `session_ended`", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["operate"])),
)]
pub(crate) async fn start(
    State(inner): State<Arc<Inner>>,
    Path(tool): Path<String>,
    q: Result<Query<StartQuery>, QueryRejection>,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let q = crate::session::query(q)?;
    let wait = match q.wait.as_deref() {
        None | Some("") => None,
        Some(w) => Some(parse_wait(w).ok_or_else(|| {
            ApiError::malformed(format!(
                "wait={w:?} is not a duration such as 30s, 500ms or 2m"
            ))
        })?),
    };
    let body = crate::error::body(&inner, body)?;
    let req: StartCall =
        crate::error::json_object(&body, "{\"session\": …, \"callId\": …, \"input\": {…}}")?;
    check_client_id("session", &req.session)?;
    check_client_id("callId", &req.call_id)?;
    let Some(registry) = &inner.registry else {
        return Err(ApiError::not_found(
            "this server was given no tools to start",
        ));
    };
    if let Some(t) = registry.ordinary(&tool) {
        return inline(t, req).await;
    }
    let mut new = tool_call_run(
        registry,
        &SessionId::new(req.session),
        &CallId::new(req.call_id),
        &tool,
        req.input,
    )
    .map_err(|e| match e {
        EngineError::UnknownTool { .. } => ApiError::not_found(e.to_string()),
        other => ApiError::new(StatusCode::BAD_REQUEST, "invalid_input", other.to_string()),
    })?;
    // Only a well-formed context is kept; anything else starts the run's own trace.
    new.traceparent = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(eve_core::trace::TraceContext::parse)
        .map(|c| c.to_string());
    let created = match inner.store.create_run(new, inner.clock.now()).await {
        Ok(c) => c,
        Err(e @ StoreError::IdempotencyMismatch { .. }) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "idempotency_mismatch",
                e.to_string(),
            ))
        }
        Err(e) => return Err(e.into()),
    };
    if created.created {
        inner.wrote();
    }
    let mut run = created.run;
    if let Some(wait) = wait.filter(|_| run.execution == Execution::Default) {
        run = until_ended(&*inner.store, run, Some(wait.min(MAX_WAIT))).await?;
    }
    let settled = settled(&*inner.store, &run).await?;
    let status = if created.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let (receipt, task_id) = match run.execution {
        Execution::Background => (Some("working"), Some(run.run_id.clone())),
        Execution::Default => (None, None),
    };
    Ok((
        status,
        Json(CallStarted {
            run: Some(Camel(run)),
            settled,
            status: receipt,
            task_id,
        }),
    )
        .into_response())
}

/// Calls an ordinary tool of default execution inline: validates the input as a workflow
/// tool's (400 `invalid_input` naming what is wrong), runs the tool once and answers 200
/// `{"run": null, "settled": {"status": "completed", "output"}}` or `{.., "status": "failed",
/// "error"}`. Nothing is stored, so a retry runs the tool again.
async fn inline(tool: &eve_core::engine::Tool, req: StartCall) -> Result<Response, ApiError> {
    tool.validate(&req.input)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_input", e.to_string()))?;
    let ctx = eve_core::engine::ToolCtx::inline(
        SessionId::new(req.session),
        CallId::new(req.call_id),
        tool.name(),
    );
    let settled = match tool.call(ctx, req.input).await {
        Ok(output) => Settled {
            status: eve_core::RunStatus::Completed,
            output: Some(output),
            error: None,
            denied: false,
        },
        Err(error) => Settled {
            status: eve_core::RunStatus::Failed,
            output: None,
            error: Some(error),
            denied: false,
        },
    };
    Ok((
        StatusCode::OK,
        Json(CallStarted {
            run: None,
            settled: Some(settled),
            status: None,
            task_id: None,
        }),
    )
        .into_response())
}

/// `{"status", "output"}` / `{"status", "error"}` of an ended run (its last event), else `None`.
async fn settled(store: &dyn JournalStore, run: &RunRecord) -> Result<Option<Settled>, ApiError> {
    if !run.status.is_terminal() {
        return Ok(None);
    }
    let last = store.last_event(run).await?;
    let mut settled = Settled {
        status: run.status,
        output: None,
        error: None,
        denied: false,
    };
    match last.as_ref().map(|e| &e.event) {
        Some(Event::RunCompleted { output }) => {
            settled.output =
                Some(serde_json::from_str::<serde_json::Value>(output.get()).unwrap_or_default());
        }
        Some(Event::RunFailed { error }) => settled.error = Some(error.clone()),
        Some(Event::RunTerminated { reason, by }) => {
            settled.error = Some(Event::terminated_error(reason, by));
        }
        Some(Event::RunDenied { reason }) => {
            settled.error = Some(reason.clone());
            settled.denied = true;
        }
        _ => {}
    }
    Ok(Some(settled))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits() {
        assert_eq!(parse_wait("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_wait("30"), Some(Duration::from_secs(30)));
        assert_eq!(parse_wait("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_wait("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_wait("soon"), None);
        assert_eq!(parse_wait("5h"), None);
    }
}
