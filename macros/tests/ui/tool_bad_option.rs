// An ordinary tool has no retry policy: it runs once (inline, or as one step in the background).
use eve_core::engine::{ToolCtx, WorkflowError};
use eve_macros::tool;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Input {}

/// Looks an order up.
#[tool(retries = 3)]
async fn lookup_order(_ctx: ToolCtx, _input: Input) -> Result<String, WorkflowError> {
    Ok(String::new())
}

fn main() {}
