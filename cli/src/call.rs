//! `eve call TOOL --input JSON`: starts a call of one of the app's tools directly on the store,
//! and with `--wait` waits until it settles and prints its result. An ordinary tool of default
//! execution runs inline, here, and prints its result at once.

use crate::error::CliError;
use eve_core::engine::{
    default_worker_id, tool_call_run, EngineError, Registry, SystemClock, Tool, ToolCtx, Worker,
    WorkerConfig,
};
use eve_core::wake::until_ended;
use eve_core::{
    CallId, Event, JournalStore, JournalStoreExt, RunRecord, SessionId, Timestamp, WorkerId,
};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

/// What `eve call` was asked to do.
#[derive(Debug, Clone)]
pub struct CallRequest {
    /// The tool's name.
    pub tool: String,
    /// The input, as JSON text (an object).
    pub input: String,
    /// The session the call belongs to.
    pub session: String,
    /// The call id; with the session, the idempotency key of the start.
    pub call_id: String,
    /// `None`: do not wait. `Some(None)`: wait until the run ends. `Some(Some(d))`: wait at most
    /// `d`.
    pub wait: Option<Option<Duration>>,
    /// Run a worker for the app's deployment in this process while waiting.
    pub worker: bool,
}

/// Starts the call (or finds the run this session and call id started before, with the same
/// input) and prints one JSON line: `{"run", "session", "call_id", "created", "status"}`. With
/// `wait`, then waits (woken by the store's notifications, with a slow fallback poll) until
/// the run ends, and prints its result as the last line: `{"run", "status": "completed",
/// "output"}`, `{"run", "status": "failed", "error"}` or `{"run", "status": "cancelled"}`.
///
/// # Errors
/// `Usage` (exit code 2) for input that is not a JSON object or fails the tool's schema, and for
/// an unknown tool (naming the tools the app serves); `Store` when the start fails (a repeated
/// session and call id with another input is `IdempotencyMismatch`); `Wait` when the run has
/// not ended in time (it keeps running).
pub async fn run(
    store: Arc<dyn JournalStore>,
    registry: &Registry,
    req: &CallRequest,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let input = parse_input(&req.input)?;
    if let Some(t) = registry.ordinary(&req.tool) {
        return inline(t, req, input, out).await;
    }
    let new = tool_call_run(
        registry,
        &SessionId::new(req.session.clone()),
        &CallId::new(req.call_id.clone()),
        &req.tool,
        input,
    )
    .map_err(|e| match e {
        EngineError::UnknownTool { .. } => {
            let mut tools: Vec<&str> = registry
                .tools()
                .map(|t| t.name())
                .chain(registry.ordinary_tools().map(|t| t.name()))
                .collect();
            tools.sort_unstable();
            CliError::Usage(format!(
                "unknown tool {:?}; this app serves: {}",
                req.tool,
                tools.join(", ")
            ))
        }
        other => CliError::Usage(format!("cannot call {}: {other}", req.tool)),
    })?;
    let created = store
        .create_run(new, Timestamp::now())
        .await
        .map_err(CliError::store(format!(
            "cannot start a call of {}",
            req.tool
        )))?;
    let run = created.run;
    let _ = writeln!(
        out,
        "{}",
        serde_json::json!({
            "run": run.run_id,
            "session": run.session_id,
            "call_id": run.call_id,
            "created": created.created,
            "status": run.status,
        })
    );
    let Some(wait) = req.wait else {
        return Ok(());
    };
    let worker = if req.worker {
        // Its own id: the stable default is the one an `eve serve` of this deployment holds.
        let base = default_worker_id(registry.deployment().as_str(), 1);
        let id = WorkerId::new(format!("{base}/call-{}", std::process::id()));
        let w = Worker::new(
            store.clone(),
            registry.clone(),
            Arc::new(SystemClock),
            WorkerConfig {
                id: Some(id),
                ..WorkerConfig::default()
            },
        )
        .await
        .map_err(CliError::store("cannot register the worker"))?;
        Some(w.spawn())
    } else {
        None
    };
    let run_id = run.run_id.clone();
    let settled = until_ended(&*store, run, wait)
        .await
        .map_err(CliError::store(format!("cannot read run {run_id}")));
    if let Some(w) = worker {
        w.shutdown().await;
    }
    let run = settled?;
    if !run.status.is_terminal() {
        return Err(CliError::Wait(format!(
            "run {} has not ended after {}; it keeps running (eve runs show {}){}",
            run.run_id,
            humantime::format_duration(wait.unwrap_or_default()),
            run.run_id,
            if req.worker {
                ""
            } else {
                "; is a worker (eve serve) running this deployment? --worker runs one here"
            }
        )));
    }
    let _ = writeln!(out, "{}", result(&*store, &run).await?);
    Ok(())
}

/// Calls an ordinary tool of default execution inline (nothing is stored, `--wait` changes
/// nothing) and prints one line: `{"tool", "session", "call_id", "status": "completed",
/// "output"}` or `{.., "status": "failed", "error"}`.
///
/// # Errors
/// `Usage` for input that fails the tool's schema.
async fn inline(
    tool: &Tool,
    req: &CallRequest,
    input: serde_json::Value,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    tool.validate(&input)
        .map_err(|e| CliError::Usage(format!("cannot call {}: {e}", req.tool)))?;
    let ctx = ToolCtx::inline(
        SessionId::new(req.session.clone()),
        CallId::new(req.call_id.clone()),
        tool.name(),
    );
    let mut line = serde_json::json!({
        "tool": tool.name(),
        "session": req.session,
        "call_id": req.call_id,
    });
    match tool.call(ctx, input).await {
        Ok(output) => {
            line["status"] = "completed".into();
            line["output"] = output;
        }
        Err(error) => {
            line["status"] = "failed".into();
            line["error"] = error.into();
        }
    }
    let _ = writeln!(out, "{line}");
    Ok(())
}

/// The result line of an ended run, from its last event.
async fn result(store: &dyn JournalStore, run: &RunRecord) -> Result<serde_json::Value, CliError> {
    let last = store
        .last_event(run)
        .await
        .map_err(CliError::store(format!("cannot read run {}", run.run_id)))?;
    Ok(match last.as_ref().map(|e| &e.event) {
        Some(Event::RunCompleted { output }) => serde_json::json!({
            "run": run.run_id,
            "status": run.status,
            "output": serde_json::from_str::<serde_json::Value>(output.get()).unwrap_or_default(),
        }),
        Some(Event::RunFailed { error }) => {
            serde_json::json!({ "run": run.run_id, "status": run.status, "error": error })
        }
        Some(Event::RunTerminated { reason, by }) => serde_json::json!({
            "run": run.run_id, "status": run.status,
            "error": Event::terminated_error(reason, by),
        }),
        Some(Event::RunDenied { reason }) => serde_json::json!({
            "run": run.run_id, "status": run.status, "error": reason, "denied": true,
        }),
        _ => serde_json::json!({ "run": run.run_id, "status": run.status }),
    })
}

/// `eve --url URL call TOOL --input JSON [--wait [D]]`: starts the call through the server's
/// `POST /v1/tools/{name}/calls` (an operate key), printing what [`run`] prints on the store:
/// the run's line, and with `--wait` its result once it settles (the server long-polls, at most
/// [`eve_server::MAX_WAIT`] a request, asked again until `--wait`'s limit). The server's worker
/// runs the call; `--worker` is refused.
///
/// # Errors
/// [`CliError::Usage`] for an input that is not a JSON object or `--worker`; the server's
/// refusal (unknown tool, invalid input, a key of too small a scope); [`CliError::Wait`] when
/// the run has not ended in time.
pub async fn run_remote(
    remote: &crate::remote::Remote,
    req: &CallRequest,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    use crate::target::TargetError;
    if req.worker {
        return Err(CliError::Usage(
            "--worker runs a worker on the store; with --url the server's worker runs the call"
                .into(),
        ));
    }
    let input = parse_input(&req.input)?;
    let path = format!("/v1/tools/{}/calls", crate::remote::segment(&req.tool));
    let body = serde_json::json!({ "session": req.session, "callId": req.call_id, "input": input });
    let doing = format!("cannot start a call of {}", req.tool);
    let deadline = req.wait.map(|w| w.map(|d| tokio::time::Instant::now() + d));
    let doing = &doing;
    let post = |wait: Option<Duration>| {
        let query: Vec<(&str, String)> = wait
            .map(|w| vec![("wait", format!("{}ms", w.as_millis().max(1)))])
            .unwrap_or_default();
        let (path, body) = (&path, &body);
        async move {
            remote
                .post(path, &query, body, wait)
                .await
                .map_err(|e| CliError::at(doing.clone())(TargetError::Remote(e)))
        }
    };
    // Started without waiting first, so the run's line shows it as created, as on the store.
    let (status, mut answer) = post(None).await?;
    let read = |v: serde_json::Value| -> Result<Option<RunRecord>, CliError> {
        crate::wire::from_api(v).map_err(|e| CliError::Remote {
            doing: doing.clone(),
            source: crate::remote::RemoteError::Unexpected {
                url: remote.url().to_owned(),
                reason: format!("run: {e}"),
            },
        })
    };
    let Some(run) = read(answer["run"].take())? else {
        // An ordinary tool, run inline by the server: printed as `inline` prints it.
        let settled = &answer["settled"];
        let mut line = serde_json::json!({
            "tool": req.tool,
            "session": req.session,
            "call_id": req.call_id,
            "status": settled["status"],
        });
        for k in ["output", "error"] {
            if let Some(v) = settled.get(k) {
                line[k] = v.clone();
            }
        }
        let _ = writeln!(out, "{line}");
        return Ok(());
    };
    let created = status == reqwest::StatusCode::CREATED;
    // The run as it was created, as the store's `create_run` answers.
    let _ = writeln!(
        out,
        "{}",
        serde_json::json!({
            "run": run.run_id,
            "session": run.session_id,
            "call_id": run.call_id,
            "created": created,
            "status": run.status,
        })
    );
    let Some(deadline) = deadline else {
        return Ok(());
    };
    let mut settled = answer["settled"].take();
    let mut run = run;
    while settled.is_null() {
        let left = remaining(deadline);
        if left.is_zero() {
            return Err(CliError::Wait(format!(
                "run {} has not ended after {}; it keeps running (eve runs show {})",
                run.run_id,
                humantime::format_duration(req.wait.flatten().unwrap_or_default()),
                run.run_id,
            )));
        }
        let (_, mut again) = post(Some(left)).await?;
        if let Some(r) = read(again["run"].take())? {
            run = r;
        }
        settled = again["settled"].take();
    }
    let mut line = serde_json::json!({ "run": run.run_id, "status": settled["status"] });
    for k in ["output", "error", "denied"] {
        if let Some(v) = settled.get(k) {
            line[k] = v.clone();
        }
    }
    let _ = writeln!(out, "{line}");
    Ok(())
}

/// `--input`: a JSON object.
fn parse_input(input: &str) -> Result<serde_json::Value, CliError> {
    let input: serde_json::Value = serde_json::from_str(input).map_err(|e| {
        CliError::Usage(format!(
            "--input is not JSON: {e}; pass an object such as '{{\"service\": \"api\"}}'"
        ))
    })?;
    if !input.is_object() {
        return Err(CliError::Usage(format!(
            "--input must be a JSON object, not {input}"
        )));
    }
    Ok(input)
}

/// How long is left until `deadline` (`None`: no limit), at most what one request may wait.
fn remaining(deadline: Option<tokio::time::Instant>) -> Duration {
    match deadline {
        Some(d) => d.saturating_duration_since(tokio::time::Instant::now()),
        None => eve_server::MAX_WAIT,
    }
    .min(eve_server::MAX_WAIT)
}
