//! "Approve with a deadline and an escalation", the `ask` version: one request stays on the
//! channel the whole time; it is raced against a first deadline, on-call is paged (a step), and
//! the same request is raced against a second deadline. Returning withdraws it.

use crate::deploy_approval::{apply_deploy, approve_or_cancel, plan_deploy};
use eve::prelude::*;

/// The tool input. The seed uses 4 h and 20 h; the example lets you shorten them.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct Input {
    /// The service to deploy.
    pub service: String,
    /// First deadline (default "4h").
    #[serde(default)]
    pub first_deadline: Option<String>,
    /// Second deadline, after paging (default "20h").
    #[serde(default)]
    pub second_deadline: Option<String>,
}

/// Deploy a service. Asks for approval, pages on-call after a deadline, gives up after a second.
#[workflow(name = "deploy_deadline")]
pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<serde_json::Value, WorkflowError> {
    let service = input.service;
    let plan = plan_deploy(&ctx, service.clone()).await?;
    let pending = ctx.ask(approve_or_cancel(format!("Deploy {service}?"), "Deploy"));
    let first = input.first_deadline.unwrap_or_else(|| "4h".into());
    let second = input.second_deadline.unwrap_or_else(|| "20h".into());

    let mut answer = ctx.race(pending.clone(), ctx.sleep(&first)).await.left();
    if answer.is_none() {
        page_on_call(&ctx, service).await?;
        answer = ctx.race(pending, ctx.sleep(&second)).await.left();
    }

    let Some(answer) = answer else {
        return Ok(serde_json::json!({ "deployed": false, "reason": "timed out" }));
    };
    if answer.option_id.as_deref() != Some("approve") {
        return Ok(serde_json::json!({ "deployed": false, "reason": "rejected" }));
    }
    let url = apply_deploy(&ctx, plan).await?;
    Ok(serde_json::json!({ "deployed": true, "url": url }))
}

/// The `page_on_call` step.
#[step]
pub async fn page_on_call(service: String) -> Result<(), StepError> {
    println!("  [step] paging on-call about {service}");
    Ok(())
}
