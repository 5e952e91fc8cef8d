// An inline (default) ordinary tool runs in the call, with no run to journal an approval in.
use eve_core::engine::{ToolCtx, WorkflowError};
use eve_macros::tool;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Input {}

/// Refunds at once.
#[tool(approval)]
async fn refund_now(_ctx: ToolCtx, _input: Input) -> Result<String, WorkflowError> {
    Ok(String::new())
}

fn main() {}
