// A workflow body's first parameter is its WorkflowCtx.
use eve_core::engine::{ToolCtx, WorkflowError};
use eve_macros::workflow;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Input {
    service: String,
}

/// Deploy.
#[workflow]
async fn deploy(_ctx: ToolCtx, input: Input) -> Result<String, WorkflowError> {
    Ok(input.service)
}

fn main() {}
