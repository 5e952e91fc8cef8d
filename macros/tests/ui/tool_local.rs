// Only a step can be local.
use eve_core::engine::{ToolCtx, WorkflowError};
use eve_macros::tool;

#[tool(local)]
async fn echo(_ctx: ToolCtx, input: String) -> Result<String, WorkflowError> {
    Ok(input)
}

fn main() {}
