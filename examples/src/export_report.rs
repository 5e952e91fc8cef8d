//! A background ordinary tool (`#[tool(background)]`): the call answers a task receipt at once
//! (`{"status": "working", "taskId"}`) and the tool runs as one journaled step of a durable run,
//! so it has a task, `task.completed` on the session's channel, `task_cancel`, and runs again
//! after a crash before its outcome was recorded. Its step's idempotency key
//! (`ctx.attempt`) lets the export system drop a repeated attempt.

use eve::prelude::*;
use serde::{Deserialize, Serialize};

/// The tool input.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Input {
    /// The month to export, `YYYY-MM`.
    pub month: String,
}

/// Where the export went.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Report {
    /// The month.
    pub month: String,
    /// The report's location.
    pub url: String,
    /// The idempotency key the export system was given (stable across attempts of the call).
    pub idempotency_key: String,
}

/// Export a month's sales report, in the background. Returns a task at once; the report's
/// location arrives with the task's completion.
#[tool(background)]
pub async fn export_report(ctx: ToolCtx, input: Input) -> Result<Report, WorkflowError> {
    let month = input.month;
    if month.len() != 7 || month.as_bytes()[4] != b'-' {
        return Err(WorkflowError::new(format!(
            "month {month:?} is not YYYY-MM (e.g. 2026-11)"
        )));
    }
    let key = ctx
        .attempt
        .as_ref()
        .map(|a| a.idempotency_key())
        .unwrap_or_default();
    Ok(Report {
        url: format!("https://reports.example/sales/{month}.csv"),
        month,
        idempotency_key: key,
    })
}
