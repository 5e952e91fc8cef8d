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
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;

/// The longest `?wait=` honoured; a longer one waits this long.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// `GET /v1/tools` (read): `{"tools": [{name, description, execution, inputSchema}]}`, by name.
pub(crate) async fn list(State(inner): State<Arc<Inner>>) -> Json<serde_json::Value> {
    let mut tools: Vec<serde_json::Value> = inner
        .registry
        .iter()
        .flat_map(|r| r.tools())
        .map(|t| {
            serde_json::json!({
                "name": t.name(),
                "description": t.description(),
                "execution": t.execution(),
                "inputSchema": t.input_schema(),
            })
        })
        .collect();
    tools.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    Json(serde_json::json!({ "tools": tools }))
}

/// The body of `POST /v1/tools/{name}/calls`: `{session, callId, input}`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StartCall {
    session: String,
    /// Deprecated spelling `call_id`, accepted because it shipped (see
    /// [`crate::DEPRECATED_REQUEST_FIELDS`]).
    #[serde(alias = "call_id")]
    call_id: String,
    input: serde_json::Value,
}

/// Query of `POST /v1/tools/{name}/calls`.
#[derive(Debug, Deserialize)]
pub(crate) struct StartQuery {
    wait: Option<String>,
}

/// Parses `30s`, `500ms`, `2m` (or plain seconds).
fn parse_wait(s: &str) -> Option<Duration> {
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

/// `POST /v1/tools/{name}/calls` (operate) with `{session, callId, input}` (`call_id` is the
/// deprecated spelling, still accepted): 201 `{"run":
/// RunRecord, "settled": …}` when started, 200 with the same body when this session and call id
/// started it before (a retry), 409 `idempotency_mismatch` when they did with another input;
/// 404 unknown tool, 400 input that fails the tool's schema, 400 `invalid_id` for a session or
/// call id that breaks [`eve_core::check_client_id`]'s limits (nothing is created). With `?wait=30s` a default-execution
/// call is awaited (woken by the store's notifications, not a tight poll) until it settles or
/// the time is up: `settled` then holds `{"status", "output"}` or `{"status", "error"}`, else
/// `null`. Background calls are never awaited: they settle as tasks.
pub(crate) async fn start(
    State(inner): State<Arc<Inner>>,
    Path(tool): Path<String>,
    q: Result<Query<StartQuery>, QueryRejection>,
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
    let new = tool_call_run(
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
    Ok((
        status,
        Json(serde_json::json!({ "run": Camel(&run), "settled": settled })),
    )
        .into_response())
}

/// `{"status", "output"}` / `{"status", "error"}` of an ended run (its last event), else null.
async fn settled(store: &dyn JournalStore, run: &RunRecord) -> Result<serde_json::Value, ApiError> {
    if !run.status.is_terminal() {
        return Ok(serde_json::Value::Null);
    }
    let last = store.last_event(run).await?;
    Ok(match last.as_ref().map(|e| &e.event) {
        Some(Event::RunCompleted { output }) => serde_json::json!({
            "status": run.status,
            "output": serde_json::from_str::<serde_json::Value>(output.get()).unwrap_or_default(),
        }),
        Some(Event::RunFailed { error }) => {
            serde_json::json!({ "status": run.status, "error": error })
        }
        _ => serde_json::json!({ "status": run.status }),
    })
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
