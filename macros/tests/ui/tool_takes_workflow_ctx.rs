// An ordinary tool cannot wait durably: it takes ToolCtx, not WorkflowCtx.
use eve_core::engine::{WorkflowCtx, WorkflowError};
use eve_macros::tool;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Input {
    service: String,
}

/// Look a service up.
#[tool]
async fn lookup(_ctx: WorkflowCtx, input: Input) -> Result<String, WorkflowError> {
    Ok(input.service)
}

fn main() {}
