//! Session-limited keys ([`ApiKey::sessions`]): which routes such a key may use and how each
//! finds the session it acts in. The limit narrows a key's scope, never widens it: the scope
//! check ([`crate::auth::require`]) runs first, then this one.
//!
//! | routes | the session checked |
//! | --- | --- |
//! | `/v1/sessions/{id}…` (record, events, requests, tasks, end, messages, turn, task cancel) | `{id}` |
//! | `/v1/runs/{id}…` (show, cancel, resume, fail, terminate, retry, reset), `POST /v1/tasks/{id}/cancel` | the run's |
//! | `POST /v1/requests/{id}/answer`, `POST /v1/requests/{id}/links`, `POST /v1/agents/{id}/result` | the request's run's |
//! | `GET /v1/events` | every `session=` |
//! | `POST /v1/tools/{name}/calls` | the body's `session` |
//! | `GET /v1/requests`, `GET /v1/agents`, `GET /v1/runs` | `session=` when given; the listing keeps only the key's sessions' |
//! | `GET /v1/tools`, `GET /v1/auth/session`, `GET /metrics` | none: they show no session's data |
//!
//! Every other route (the keys routes, `/mcp`, the hook routes, any route added later) names no
//! session this check could hold it to, and refuses a limited key with 403. A run, request or
//! task the store does not know is left to the handler, which answers 404 as for any key.

use crate::error::ApiError;
use crate::Inner;
use axum::body::Body;
use axum::extract::{FromRequestParts, MatchedPath, Query, RawPathParams, Request};
use axum::http::StatusCode;
use eve_core::{ApiKey, RunId, SessionId, StoreError};

/// What a route acts on, for the session check.
enum Target {
    /// The session of the path's `{id}`.
    Session(String),
    /// The session of the run (or task) of the path's `{id}`.
    Run(String),
    /// The session of the run of the request of the path's `{id}` (`{run}:{cmd}`).
    Request(String),
    /// The `session=` values of the query: each must be one of the key's.
    QuerySessions,
    /// A listing: its `session=` (if any) must be one of the key's; the handler keeps only the
    /// key's sessions' entries.
    Listing,
    /// `POST /v1/tools/{name}/calls`: the body's `session`.
    CallBody,
    /// No session's data.
    Free,
    /// A route this check cannot hold to a session: refused.
    Refused,
}

fn target(route: &str, params: &RawPathParams) -> Target {
    let id = || {
        params
            .iter()
            .find(|(k, _)| *k == "id")
            .map(|(_, v)| v.to_owned())
            .unwrap_or_default()
    };
    match route {
        r if r == "/v1/sessions/{id}" || r.starts_with("/v1/sessions/{id}/") => {
            Target::Session(id())
        }
        r if r == "/v1/runs/{id}" || r.starts_with("/v1/runs/{id}/") => Target::Run(id()),
        "/v1/tasks/{id}/cancel" => Target::Run(id()),
        "/v1/requests/{id}/answer" | "/v1/requests/{id}/links" | "/v1/agents/{id}/result" => {
            Target::Request(id())
        }
        "/v1/events" => Target::QuerySessions,
        "/v1/requests" | "/v1/agents" | "/v1/runs" => Target::Listing,
        "/v1/tools/{name}/calls" => Target::CallBody,
        "/v1/tools" | "/v1/auth/session" | "/metrics" => Target::Free,
        _ => Target::Refused,
    }
}

/// 403 for a limited key acting outside its sessions (`what` says on what).
fn outside(key: &ApiKey, what: &str) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!(
            "key {} is limited to the sessions {}; {what} is in none of them: use a key of that session, or one without a session limit",
            key.id,
            sessions_of(key)
        ),
    )
}

fn sessions_of(key: &ApiKey) -> String {
    key.sessions
        .iter()
        .flatten()
        .map(|s| format!("{:?}", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Lets `req` through when `key` (limited to sessions) may use its route in the session it
/// names; 403 `forbidden` otherwise. Returns the request (rebuilt when its body was read).
pub(crate) async fn check(inner: &Inner, key: &ApiKey, req: Request) -> Result<Request, ApiError> {
    if !key.is_limited() {
        return Ok(req);
    }
    let (mut parts, body) = req.into_parts();
    let route = parts
        .extensions
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_default();
    let params = RawPathParams::from_request_parts(&mut parts, &())
        .await
        .map_err(|_| ApiError::malformed("the path's parameters are not valid UTF-8"))?;
    let query_sessions = || -> Vec<String> {
        Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
            .map(|Query(q)| {
                q.into_iter()
                    .filter(|(k, v)| k == "session" && !v.is_empty())
                    .map(|(_, v)| v)
                    .collect()
            })
            .unwrap_or_default()
    };
    let allowed = |s: &str| key.allows_session(&SessionId::new(s));
    let mut body = Some(body);
    match target(&route, &params) {
        Target::Free => {}
        Target::Refused => {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "key {} is limited to sessions, and {route} acts on no one session; use a key without a session limit",
                    key.id
                ),
            ))
        }
        Target::Session(s) => {
            if !allowed(&s) {
                return Err(outside(key, &format!("session {s:?}")));
            }
        }
        Target::Run(run) => check_run(inner, key, &run, &format!("run {run}")).await?,
        Target::Request(request) => {
            if let Some((run, _)) = request.rsplit_once(':') {
                check_run(inner, key, run, &format!("request {request}")).await?;
            }
        }
        Target::QuerySessions | Target::Listing => {
            if let Some(s) = query_sessions().into_iter().find(|s| !allowed(s)) {
                return Err(outside(key, &format!("session {s:?}")));
            }
        }
        Target::CallBody => {
            let bytes = axum::body::to_bytes(body.take().unwrap_or_default(), inner.config.body_limit)
                .await
                .map_err(|_| ApiError::too_large(inner.config.body_limit))?;
            let session = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v.get("session")?.as_str().map(str::to_owned));
            // A body without a session is the handler's to refuse (400), as for any key.
            if let Some(s) = session.filter(|s| !allowed(s)) {
                return Err(outside(key, &format!("session {s:?}")));
            }
            body = Some(Body::from(bytes));
        }
    }
    Ok(Request::from_parts(parts, body.unwrap_or_default()))
}

/// 403 unless `run` is in one of `key`'s sessions; an unknown run passes (the handler answers
/// 404).
async fn check_run(inner: &Inner, key: &ApiKey, run: &str, what: &str) -> Result<(), ApiError> {
    match inner.store.get_run(&RunId::new(run)).await {
        Ok(r) if key.allows_session(&r.session_id) => Ok(()),
        Ok(_) => Err(outside(key, what)),
        Err(StoreError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Whether `key` (none: the server runs without keys) may see what belongs to `session`: for
/// listings, which keep only the key's sessions' entries.
pub(crate) fn shows(key: Option<&ApiKey>, session: &SessionId) -> bool {
    key.is_none_or(|k| k.allows_session(session))
}
