// post_message (a TaskHandle) exists only in background bodies.
use eve_core::engine::{TaskHandle, WorkflowCtx, WorkflowError};
use eve_macros::workflow;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Input {
    note: String,
}

/// Remind.
#[workflow]
async fn remind(_ctx: WorkflowCtx, task: TaskHandle, input: Input) -> Result<String, WorkflowError> {
    task.post_message("scheduled");
    Ok(input.note)
}

fn main() {}
