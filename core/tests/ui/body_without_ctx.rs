// A body that does not take a WorkflowCtx is not a workflow: `workflow!` rejects it.
use eve_core::engine::{define_workflow_tool, WorkflowError};
use eve_core::workflow;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Input {
    service: String,
}

async fn execute(input: Input) -> Result<String, WorkflowError> {
    Ok(input.service)
}

fn main() {
    let _ = define_workflow_tool("Deploy.", workflow!(execute));
}
