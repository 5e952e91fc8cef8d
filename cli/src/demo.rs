//! The demo a newcomer sees first (`eve serve --demo`): a scripted agent calls the seed's
//! `deploy` tool (the examples' `eve_examples::deploy_approval`, tool name
//! [`DEMO_TOOL`]), whose body asks a person for approval with `ctx.ask`; the person answers on
//! the page or with `eve answer`; the run resumes, deploys and settles the call.
//!
//! Everything lives in the store, so the demo survives a restart of the server while the ask
//! is pending: the agent's call is idempotent (fixed session and call id), the worker replays
//! the run from its journal, and the follower re-reads the session log from the start.

use crate::error::CliError;
use crate::format::utc;
use eve_core::engine::{Registry, Session, SystemClock, Worker};
use eve_core::{JournalStore, SessionEvent, SessionId, ToolResult};
use futures::StreamExt;
use std::io::Write;
use std::sync::Arc;

/// The session the demo's scripted agent talks in.
pub const DEMO_SESSION: &str = "demo";
/// The tool call id of the agent's one `deploy` call.
pub const DEMO_CALL: &str = "demo-deploy-1";
/// The tool the agent calls: the seed's `deploy` with `ctx.ask`.
pub const DEMO_TOOL: &str = "deploy_approval";
/// The service the agent asks to deploy.
pub const DEMO_SERVICE: &str = "checkout";

/// Plays the agent: calls [`DEMO_TOOL`] once (idempotently), then follows the session channel,
/// printing the request with the page URL and the exact `eve answer` command, and returns once
/// the call is settled with the run's result.
///
/// # Errors
/// The engine's or the store's error.
pub async fn run_agent(
    store: Arc<dyn JournalStore>,
    registry: Arc<Registry>,
    worker: Worker,
    page_url: &str,
    store_arg: &str,
    out: &mut dyn Write,
) -> Result<ToolResult, CliError> {
    // The call starts eagerly on the server's own worker (created and claimed in one commit).
    let session = Session::new(
        store,
        registry,
        Arc::new(SystemClock),
        SessionId::new(DEMO_SESSION),
    )
    .with_worker(worker);
    let receipt = session
        .call_tool(
            DEMO_CALL,
            DEMO_TOOL,
            serde_json::json!({ "service": DEMO_SERVICE }),
        )
        .await
        .map_err(|e| CliError::Serve(format!("the demo agent cannot call {DEMO_TOOL}: {e}")))?;
    let run = receipt.run_id().clone();
    let _ = writeln!(
        out,
        "demo: the agent called {DEMO_TOOL} {{\"service\": \"{DEMO_SERVICE}\"}} (session {DEMO_SESSION}, run {run}); the turn is parked"
    );
    let mut events = Box::pin(session.follow(0));
    while let Some(entry) = events.next().await {
        let entry = entry
            .map_err(|e| CliError::Serve(format!("the demo cannot follow its session: {e}")))?;
        if entry.run_id != run {
            continue;
        }
        let at = utc(entry.at);
        match &entry.event {
            SessionEvent::InputRequested {
                request_id,
                request,
            } => {
                let _ = writeln!(
                    out,
                    "demo: {at} {DEMO_TOOL} asks {:?}\n      answer it on the page: {page_url}\n      or run: eve answer {request_id} approve --store {store_arg}",
                    request.prompt.lines().next().unwrap_or_default()
                );
            }
            SessionEvent::InputAnswered { request_id, .. } => {
                let _ = writeln!(
                    out,
                    "demo: {at} request {request_id} answered; the run resumes"
                );
            }
            SessionEvent::InputWithdrawn { request_id } => {
                let _ = writeln!(out, "demo: {at} request {request_id} withdrawn");
            }
            SessionEvent::ToolSettled { result } => {
                let _ = writeln!(
                    out,
                    "demo: {at} run {run} finished; the agent's call settled: {}",
                    serde_json::to_string(result).unwrap_or_default()
                );
                return Ok(result.clone());
            }
            _ => {}
        }
    }
    Err(CliError::Serve(
        "the demo's session channel ended before the call settled".into(),
    ))
}
