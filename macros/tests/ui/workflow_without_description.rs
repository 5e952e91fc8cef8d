// A workflow tool needs a description: the doc comment.
use eve_core::engine::{WorkflowCtx, WorkflowError};
use eve_macros::workflow;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Input {
    service: String,
}

#[workflow]
async fn deploy(_ctx: WorkflowCtx, input: Input) -> Result<String, WorkflowError> {
    Ok(input.service)
}

fn main() {}
