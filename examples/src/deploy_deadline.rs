//! "Approve with a deadline and an escalation", the `ask` version: one request stays on the
//! channel the whole time; it is raced against a first deadline, on-call is paged (a step), and
//! the same request is raced against a second deadline. Returning withdraws it.

use crate::deploy_approval::{approve_or_cancel, compute_plan, run_deploy, Plan};
use eve_core::engine::{Either, WorkflowCtx, WorkflowError, WorkflowTool};
use eve_core::workflow;

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

/// The body.
pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<serde_json::Value, WorkflowError> {
    let service = input.service;
    let s = service.clone();
    let plan: Plan = ctx
        .step("plan_deploy", move |_| {
            let s = s.clone();
            async move { Ok(compute_plan(&s)) }
        })
        .await?;
    let pending = ctx.ask(approve_or_cancel(format!("Deploy {service}?"), "Deploy"));
    let first = input.first_deadline.unwrap_or_else(|| "4h".into());
    let second = input.second_deadline.unwrap_or_else(|| "20h".into());

    let mut answer = match ctx.race(pending.clone(), ctx.sleep(&first)).await {
        Either::Left(a) => Some(a),
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
        answer = match ctx.race(pending, ctx.sleep(&second)).await {
            Either::Left(a) => Some(a),
            Either::Right(()) => None,
        };
    }

    let Some(answer) = answer else {
        return Ok(serde_json::json!({ "deployed": false, "reason": "timed out" }));
    };
    if answer.option_id.as_deref() != Some("approve") {
        return Ok(serde_json::json!({ "deployed": false, "reason": "rejected" }));
    }
    let url: String = ctx
        .step("apply_deploy", move |_| {
            let plan = plan.clone();
            async move { Ok(run_deploy(&plan)) }
        })
        .await?;
    Ok(serde_json::json!({ "deployed": true, "url": url }))
}

/// The tool.
pub fn tool() -> WorkflowTool {
    crate::define(
        "Deploy a service. Asks for approval, pages on-call after a deadline, gives up after a second.",
        workflow!(execute),
    )
}
