//! "Report progress" (the seed's `remind_with_progress`): a background body reports stream-only
//! progress, posts one message to the parent agent (which requests a turn; the task stays
//! open), sleeps durably and completes with the reminder.

use eve::prelude::*;
use serde::{Deserialize, Serialize};

/// The tool input.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Input {
    /// What to remind about.
    pub note: String,
    /// How long to wait: "30s", "4h", …
    pub delay: String,
}

/// The tool output (the task completion notification).
#[derive(Debug, Serialize, Deserialize)]
pub struct Output {
    /// The note.
    pub reminder: String,
}

/// Schedule a reminder and report progress before waiting.
#[workflow(background, name = "remind_with_progress")]
pub async fn execute(
    ctx: WorkflowCtx,
    task: TaskHandle,
    input: Input,
) -> Result<Output, WorkflowError> {
    ctx.progress(&serde_json::json!({ "status": "preparing reminder" }));
    task.post_message(&format!("Reminder scheduled for {}.", input.delay));
    ctx.sleep(&input.delay).await;
    Ok(Output {
        reminder: input.note,
    })
}
