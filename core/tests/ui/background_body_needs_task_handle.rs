// A background body takes (WorkflowCtx, TaskHandle, input); a default body cannot be passed
// to background_workflow!.
use eve_core::engine::{define_workflow_tool, WorkflowCtx, WorkflowError};
use eve_core::background_workflow;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Input {
    note: String,
}

async fn execute(_ctx: WorkflowCtx, input: Input) -> Result<String, WorkflowError> {
    Ok(input.note)
}

fn main() {
    let _ = define_workflow_tool("Remind.", background_workflow!(execute));
}
