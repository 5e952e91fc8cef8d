// An ordinary tool's body (taking ToolCtx) cannot be registered as a workflow tool.
use eve_core::engine::{define_workflow_tool, ToolCtx, WorkflowError};
use eve_core::workflow;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Input {
    service: String,
}

async fn execute(_ctx: ToolCtx, input: Input) -> Result<String, WorkflowError> {
    Ok(input.service)
}

fn main() {
    let _ = define_workflow_tool("Deploy.", workflow!(execute));
}
