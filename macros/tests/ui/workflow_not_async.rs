// A workflow body must be an async fn.
use eve_core::engine::{WorkflowCtx, WorkflowError};
use eve_macros::workflow;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Input {
    service: String,
}

/// Deploy.
#[workflow]
fn deploy(_ctx: WorkflowCtx, input: Input) -> Result<String, WorkflowError> {
    Ok(input.service)
}

fn main() {}
