//! "Approve with a deadline and an escalation": one pending request (a hook, until `ask`
//! lands) raced against a first deadline, a page step, the same request against a second.

use eve::prelude::*;
use serde::{Deserialize, Serialize};

/// The tool input. The seed uses 4 h and 20 h; the example lets you shorten them.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Input {
    /// The service to deploy.
    pub service: String,
    /// First deadline (default "4h").
    #[serde(default)]
    pub first_deadline: Option<String>,
    /// Second deadline after paging (default "20h").
    #[serde(default)]
    pub second_deadline: Option<String>,
}

/// An approver's answer.
#[derive(Deserialize, Serialize, Debug)]
pub struct Answer {
    /// "approve" or "cancel".
    pub option_id: String,
}

/// The hook token of a service's approval request.
pub fn token(service: &str) -> String {
    format!("approve-{service}")
}

/// Deploy a service to production. Pauses for approval, pages on-call after a deadline.
#[workflow(name = "deploy")]
pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<serde_json::Value, WorkflowError> {
    let service = input.service;
    let plan = plan_deploy(&ctx, service.clone()).await?;
    let pending = ctx.create_hook::<Answer>(token(&service));
    let first = input.first_deadline.unwrap_or_else(|| "4h".into());
    let second = input.second_deadline.unwrap_or_else(|| "20h".into());
    let mut answer = ctx.race(pending.next(), ctx.sleep(&first)).await.left();
    if answer.is_none() {
        crate::deploy_deadline::page_on_call(&ctx, service).await?;
        answer = ctx.race(pending.next(), ctx.sleep(&second)).await.left();
    }
    let Some(answer) = answer.transpose()? else {
        return Ok(serde_json::json!({ "deployed": false, "reason": "timed out" }));
    };
    if answer.option_id != "approve" {
        return Ok(serde_json::json!({ "deployed": false, "reason": "rejected" }));
    }
    let url = apply_deploy(&ctx, plan).await?;
    Ok(serde_json::json!({ "deployed": true, "url": url }))
}

#[step]
async fn plan_deploy(service: String) -> Result<String, StepError> {
    Ok(format!("roll out {service} to 3 regions"))
}

#[step]
async fn apply_deploy(plan: String) -> Result<String, StepError> {
    println!("  [step] applying: {plan}");
    Ok("https://deploy.example/123".to_owned())
}
