// ask/agent/sleep belong in the body: a step cannot take the WorkflowCtx.
use eve_core::engine::{StepError, WorkflowCtx};
use eve_core::InputRequest;
use eve_macros::step;

#[step]
async fn approve(ctx: &WorkflowCtx) -> Result<bool, StepError> {
    let answer = ctx.ask(InputRequest::confirmation("Deploy?")).await;
    Ok(answer.option_id.is_some())
}

fn main() {}
