//! "Approve with a deadline and an escalation": one pending request (a hook, until `ask`
//! lands) raced against a first deadline, a page step, the same request against a second.

use eve_core::engine::{Either, WorkflowCtx, WorkflowError, WorkflowTool};
use eve_core::workflow;
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

/// The body.
pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<serde_json::Value, WorkflowError> {
    let service = input.service;
    let s = service.clone();
    let plan: String = ctx
        .step("plan_deploy", move |_| {
            let s = s.clone();
            async move { Ok(format!("roll out {s} to 3 regions")) }
        })
        .await?;
    let pending = ctx.create_hook::<Answer>(token(&service));
    let first = input.first_deadline.unwrap_or_else(|| "4h".into());
    let second = input.second_deadline.unwrap_or_else(|| "20h".into());
    let mut answer = match ctx.race(pending.next(), ctx.sleep(&first)).await {
        Either::Left(a) => Some(a?),
        Either::Right(()) => None,
    };
    if answer.is_none() {
        let s = service.clone();
        ctx.step("page_on_call", move |_| {
            let s = s.clone();
            async move {
                println!("  [step] paging on-call about {s}");
                Ok(())
            }
        })
        .await?;
        answer = match ctx.race(pending.next(), ctx.sleep(&second)).await {
            Either::Left(a) => Some(a?),
            Either::Right(()) => None,
        };
    }
    let Some(answer) = answer else {
        return Ok(serde_json::json!({ "deployed": false, "reason": "timed out" }));
    };
    if answer.option_id != "approve" {
        return Ok(serde_json::json!({ "deployed": false, "reason": "rejected" }));
    }
    let url: String = ctx
        .step("apply_deploy", move |_| {
            let plan = plan.clone();
            async move {
                println!("  [step] applying: {plan}");
                Ok("https://deploy.example/123".to_owned())
            }
        })
        .await?;
    Ok(serde_json::json!({ "deployed": true, "url": url }))
}

/// The tool.
pub fn tool() -> WorkflowTool {
    crate::define(
        "Deploy a service to production. Pauses for approval, pages on-call after a deadline.",
        workflow!(execute),
    )
}
