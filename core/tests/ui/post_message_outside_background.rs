// post_message exists only on the TaskHandle a background body receives: a default-execution
// body has no way to call it.
use eve_core::engine::{define_workflow_tool, WorkflowCtx, WorkflowError};
use eve_core::workflow;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Input {
    note: String,
}

async fn execute(ctx: WorkflowCtx, input: Input) -> Result<(), WorkflowError> {
    ctx.post_message(&input.note);
    Ok(())
}

fn main() {
    let _ = define_workflow_tool("Remind.", workflow!(execute));
}
