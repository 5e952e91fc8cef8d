//! `GET /v1/requests`: pending input requests across sessions, one page at a time, for a page
//! that cannot afford one call per session.
//!
//! The store answers pending requests per session ([`eve_core::JournalStore::pending_requests`])
//! and live runs in one listing ([`eve_core::JournalStore::list_runs`]). A page walks the live
//! runs (running and blocked: a blocked run's requests stay answerable) in creation order and
//! reads the pending requests of only the sessions it needs, once each, until the page is
//! full: its cost grows with the page and the number of live runs, not with the number of
//! sessions or of requests elsewhere.

use crate::camel::Camel;
use crate::error::ApiError;
use crate::session::query;
use crate::Inner;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use eve_core::{
    check_client_id, AgentReply, ApiKey, InputResponse, PendingRequest, RequestId, RunQuery,
    RunRecord, RunStatus, SessionId, Timestamp,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// The page size when the query names none.
pub const DEFAULT_REQUESTS_PAGE: usize = 100;

/// The largest page `GET /v1/requests` returns (`limit` above it is lowered to it).
pub const MAX_REQUESTS_PAGE: usize = 1000;

/// Query of `GET /v1/requests`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct RequestsQuery {
    /// Only this session's requests.
    session: Option<String>,
    /// Only this tool's requests.
    tool: Option<String>,
    /// Only requests whose prompt, session, run, request id or tool contains this
    /// (case-insensitive).
    q: Option<String>,
    /// `newest` (default) or `oldest` run first.
    order: Option<String>,
    /// The page after this one: the previous page's `next`.
    before: Option<String>,
    /// At most this many requests (default 100, at most 1000; a run's requests are never split).
    limit: Option<usize>,
}

/// A pending request with the tool of its run.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ToolRequest {
    /// The request (in [`Camel`] inside the flattened field: a flattened struct is written as
    /// a map, whose keys `Camel` leaves alone).
    #[serde(flatten)]
    #[schema(value_type = PendingRequest)]
    request: Camel<PendingRequest>,
    /// The tool whose run asked.
    tool: String,
}

/// One page of pending requests across sessions.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct RequestsPage {
    /// The requests, a run's together, its requests in the order they were asked.
    requests: Vec<ToolRequest>,
    /// The `before=` of the following page, if there is one.
    next: Option<String>,
    /// The tools of every live run, whatever the filters.
    tools: Vec<String>,
}

/// Where a page ends: the creation time and id of its last run, as `"{ms}:{run_id}"`. It
/// stays meaningful when that run ends (answered requests end runs all the time), unlike a
/// run id looked up in the listing.
fn cursor_of(r: &RunRecord) -> String {
    format!("{}:{}", r.created_at.0, r.run_id)
}

fn parse_cursor(s: &str) -> Option<(i64, &str)> {
    let (at, run) = s.split_once(':')?;
    Some((at.parse().ok()?, run))
}

/// Pending input requests of every session, one page at a time.
///
/// `GET /v1/requests` (read): `{"requests": [PendingRequest + "tool"…], "next": CURSOR|null,
/// "tools": [name…]}`.
///
/// Pending questions (`ctx.ask`) of every session (or of `session=`), grouped by run; the
/// subagent calls that are also pending requests are listed by `GET /v1/agents` instead: the runs in creation
/// order, newest first by default (`order=oldest` for the longest waiting first), each run's
/// requests in the order they were asked; a run's requests are never split across pages.
/// `tool=` keeps one tool's; `q=` keeps those whose prompt, session, run, request id or tool
/// contains it (case-insensitive). `limit` (default [`DEFAULT_REQUESTS_PAGE`], at most
/// [`MAX_REQUESTS_PAGE`]) requests a page, and `next`, passed back as `before=`, continues
/// after the page's last run. `tools` names the tools of every live run (whatever the
/// filters), for a filter to offer. A key limited to sessions lists only its sessions'
/// requests and tools, and a `session=` outside them is 403.
#[utoipa::path(
    get,
    path = "/v1/requests",
    operation_id = "listRequests",
    tag = "requests",
    params(RequestsQuery),
    responses(
        (status = 200, description = "One page of pending requests", body = RequestsPage),
        (status = 400, description = "An unknown order or parameter, a bad `before` or `limit=0`", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["read"])),
)]
pub(crate) async fn list(
    State(inner): State<Arc<Inner>>,
    key: Option<Extension<ApiKey>>,
    q: Result<Query<RequestsQuery>, QueryRejection>,
) -> Result<Json<RequestsPage>, ApiError> {
    let key = key.map(|Extension(k)| k);
    let (requests, next, tools) = pending_page(&inner, query(q)?, Kind::Asks, key.as_ref()).await?;
    Ok(Json(RequestsPage {
        requests,
        next,
        tools,
    }))
}

/// One page of pending subagent calls across sessions.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct AgentsPage {
    /// The pending agent calls (each a pending request whose `request.agent` is the call), a
    /// run's together, in the order they were made.
    agents: Vec<ToolRequest>,
    /// The `before=` of the following page, if there is one.
    next: Option<String>,
    /// The tools of every live run, whatever the filters.
    tools: Vec<String>,
}

/// Pending subagent calls of every session, one page at a time.
///
/// `GET /v1/agents` (read): `{"agents": [PendingRequest + "tool"…], "next": CURSOR|null,
/// "tools": [name…]}`.
///
/// The calls `ctx.agent` made in runs whose registry has no in-process `AgentHost` (the wire
/// form): each is a pending request whose `request.agent` holds the call (`key`, `target`,
/// `message`, `agentId`, `outputSchema`); the host serves it and reports the child's result
/// with `POST /v1/agents/{requestId}/result`. Paged and filtered exactly as
/// `GET /v1/requests` (which lists the other requests, the questions for a person); `q=`
/// also matches the call's key and target.
#[utoipa::path(
    get,
    path = "/v1/agents",
    operation_id = "listAgentCalls",
    tag = "agents",
    params(RequestsQuery),
    responses(
        (status = 200, description = "One page of pending agent calls", body = AgentsPage),
        (status = 400, description = "An unknown order or parameter, a bad `before` or `limit=0`", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["read"])),
)]
pub(crate) async fn list_agents(
    State(inner): State<Arc<Inner>>,
    key: Option<Extension<ApiKey>>,
    q: Result<Query<RequestsQuery>, QueryRejection>,
) -> Result<Json<AgentsPage>, ApiError> {
    let key = key.map(|Extension(k)| k);
    let (agents, next, tools) = pending_page(&inner, query(q)?, Kind::Agents, key.as_ref()).await?;
    Ok(Json(AgentsPage {
        agents,
        next,
        tools,
    }))
}

/// Which pending requests a listing keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Questions for a person (`ctx.ask`).
    Asks,
    /// Subagent calls for the host (`ctx.agent` in the wire form).
    Agents,
}

type Page = (Vec<ToolRequest>, Option<String>, Vec<String>);

/// One page of `kind`'s pending requests; of `key`'s sessions only when it is limited to some.
async fn pending_page(
    inner: &Inner,
    q: RequestsQuery,
    kind: Kind,
    key: Option<&ApiKey>,
) -> Result<Page, ApiError> {
    let text = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    let newest = match q.order.as_deref() {
        None | Some("") | Some("newest") => true,
        Some("oldest") => false,
        Some(o) => {
            return Err(ApiError::malformed(format!(
                "unknown order {o:?}; use newest or oldest"
            )))
        }
    };
    let before = match text(q.before) {
        None => None,
        Some(b) => {
            let (at, run) = parse_cursor(&b).ok_or_else(|| {
                ApiError::malformed("before= must be the `next` of the previous page")
            })?;
            Some((Timestamp(at), run.to_owned()))
        }
    };
    let limit = match q.limit {
        None => DEFAULT_REQUESTS_PAGE,
        Some(0) => return Err(ApiError::malformed("limit must be at least 1")),
        Some(n) => n.min(MAX_REQUESTS_PAGE),
    };
    let session = text(q.session);
    if let Some(s) = &session {
        check_client_id("session", s)?;
    }
    let session = session.map(SessionId::new);
    let tool = text(q.tool);
    let needle = text(q.q).map(|s| s.to_lowercase());

    let mut runs = Vec::new();
    for status in [RunStatus::Running, RunStatus::Blocked] {
        runs.extend(
            inner
                .store
                .list_runs(&RunQuery {
                    session: session.clone(),
                    status: Some(status),
                    ..RunQuery::default()
                })
                .await?,
        );
    }
    runs.retain(|r| crate::limits::shows(key, &r.session_id));
    let tools: BTreeSet<&str> = runs.iter().map(|r| r.tool.as_str()).collect();
    let tools: Vec<String> = tools.into_iter().map(str::to_owned).collect();
    runs.retain(|r| tool.as_ref().is_none_or(|t| &r.tool == t));
    runs.sort_by(|a, b| (a.created_at, &a.run_id).cmp(&(b.created_at, &b.run_id)));
    if newest {
        runs.reverse();
    }
    if let Some((at, run)) = &before {
        let key = (*at, run.as_str());
        runs.retain(|r| {
            let k = (r.created_at, r.run_id.as_str());
            if newest {
                k < key
            } else {
                k > key
            }
        });
    }

    // Each session's pending requests, read once per call, by run.
    let mut by_session: HashMap<SessionId, HashMap<String, Vec<PendingRequest>>> = HashMap::new();
    let mut page = Vec::new();
    let mut next = None;
    for (i, r) in runs.iter().enumerate() {
        if page.len() >= limit {
            next = Some(cursor_of(&runs[i - 1]));
            break;
        }
        if !by_session.contains_key(&r.session_id) {
            let mut of_run: HashMap<String, Vec<PendingRequest>> = HashMap::new();
            for p in inner.store.pending_requests(&r.session_id).await? {
                of_run.entry(p.run_id.to_string()).or_default().push(p);
            }
            by_session.insert(r.session_id.clone(), of_run);
        }
        let Some(mine) = by_session
            .get_mut(&r.session_id)
            .and_then(|m| m.remove(r.run_id.as_str()))
        else {
            continue;
        };
        for p in mine {
            if (kind == Kind::Agents) != p.request.agent.is_some() {
                continue;
            }
            if let Some(n) = &needle {
                let (key, target) = p
                    .request
                    .agent
                    .as_ref()
                    .map_or(("", ""), |a| (a.key.as_str(), a.target.as_str()));
                let hay = [
                    p.request.prompt.as_str(),
                    p.session_id.as_str(),
                    p.run_id.as_str(),
                    p.request_id.as_str(),
                    r.tool.as_str(),
                    key,
                    target,
                ];
                if !hay.iter().any(|h| h.to_lowercase().contains(n.as_str())) {
                    continue;
                }
            }
            page.push(ToolRequest {
                request: Camel(p),
                tool: r.tool.clone(),
            });
        }
    }
    Ok((page, next, tools))
}

/// The result of a subagent call: exactly one of `output` (the child's output) or `error`
/// (why it failed).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) enum AgentResultBody {
    /// The child's output: any JSON value that satisfies the call's `outputSchema`.
    Output(serde_json::Value),
    /// Why the child failed.
    Error(String),
}

/// Report the result of a subagent call.
///
/// `POST /v1/agents/{id}/result` (answer), body `{"output": …}` or `{"error": "…"}`: records
/// the result of the pending agent call `id` (its request id), once, which resumes the run.
/// 200 when accepted (also for the same result again, with `duplicate: true`); 422
/// `invalid_answer` when the output does not match the call's `outputSchema` (the message
/// names the failing path, e.g. `at /facts/0`; nothing is recorded) or `id` is a question
/// rather than an agent call; 404 unknown id; 409 `already_answered` with another result;
/// 410 `withdrawn` when the run ended; 400 a body that is not one of the two forms.
#[utoipa::path(
    post,
    path = "/v1/agents/{id}/result",
    operation_id = "completeAgentCall",
    tag = "agents",
    params(("id" = String, Path, description = "The agent call's request id")),
    request_body(content = AgentResultBody, description = "`{\"output\": …}` or `{\"error\": \"…\"}`"),
    responses(
        (status = 200, description = "Recorded, or the same result again (`duplicate: true`)", body = crate::session::Answered),
        (status = 400, description = "A body that is not `{output}` or `{error}`", body = crate::error::ErrorBody),
        (status = 404, description = "No such agent call", body = crate::error::ErrorBody),
        (status = 409, description = "`already_answered`: another result was recorded", body = crate::error::ErrorBody),
        (status = 410, description = "`withdrawn`: the call's run ended", body = crate::error::ErrorBody),
        (status = 422, description = "`invalid_answer`: the output does not match the call's `outputSchema` (the message names the path), or the id is not an agent call", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["answer"])),
)]
pub(crate) async fn complete_agent(
    State(inner): State<Arc<Inner>>,
    headers: axum::http::HeaderMap,
    key: Option<Extension<ApiKey>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<crate::session::Answered>, ApiError> {
    let body = crate::error::body(&inner, body)?;
    let body: AgentResultBody = crate::error::json_object(
        &body,
        "the result as a JSON object {\"output\": …} or {\"error\": \"…\"}",
    )?;
    let reply = match body {
        AgentResultBody::Output(v) => AgentReply::Output(v),
        AgentResultBody::Error(e) => AgentReply::Error(e),
    };
    let response = InputResponse {
        answered_by: key.map(|Extension(k)| k.name),
        agent: Some(reply),
        ..InputResponse::default()
    };
    let surface = crate::metrics::Surface::of(&headers);
    crate::session::record_answer(&inner, RequestId::new(id), response, surface).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_with_colons_in_run_ids() {
        assert_eq!(
            parse_cursor("1700000000000:run:a:1"),
            Some((1700000000000, "run:a:1"))
        );
        assert_eq!(parse_cursor("-5:r"), Some((-5, "r")));
        assert_eq!(parse_cursor("soon:r"), None);
        assert_eq!(parse_cursor("r"), None);
    }
}
