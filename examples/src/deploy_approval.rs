//! "Deploy with approval" (the seed's `deploy`): plan the deploy in a step, ask a person to
//! confirm it with `ctx.ask`, deploy in a step only when approved. The turn stays parked while
//! the person reads the plan, minutes or days; the model sees one tool result.

use eve::prelude::*;
use eve::{Display, InputOption, OptionStyle};
use serde::{Deserialize, Serialize};

/// The tool input.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Input {
    /// The service to deploy.
    pub service: String,
}

/// What `plan_deploy` computes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Plan {
    /// The service.
    pub service: String,
    /// What the approver reads.
    pub summary: String,
}

/// The confirmation the seed's deploy shows: approve (primary) or cancel.
pub fn approve_or_cancel(prompt: String, approve_label: &str) -> InputRequest {
    InputRequest {
        prompt,
        display: Display::Confirmation,
        options: vec![
            InputOption {
                id: "approve".into(),
                label: approve_label.into(),
                description: None,
                style: Some(OptionStyle::Primary),
            },
            InputOption {
                id: "cancel".into(),
                label: "Cancel".into(),
                description: None,
                style: None,
            },
        ],
        allow_freeform: false,
        agent: None,
        approval: None,
    }
}

/// The `plan_deploy` step's work.
pub fn compute_plan(service: &str) -> Plan {
    Plan {
        service: service.to_owned(),
        summary: format!("roll out {service} to 3 regions, 10% at a time"),
    }
}

/// The `apply_deploy` step's work: the deployment's URL.
pub fn run_deploy(plan: &Plan) -> String {
    format!("https://deploy.example/{}/1", plan.service)
}

/// Deploy a service to production. Pauses for a human to approve the plan.
#[workflow(name = "deploy_approval")]
pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<serde_json::Value, WorkflowError> {
    let service = input.service;
    let plan = plan_deploy(&ctx, service.clone()).await?;
    let answer = ctx
        .ask(approve_or_cancel(
            format!("Deploy {service}?\n\n{}", plan.summary),
            "Deploy",
        ))
        .await;
    if answer.option_id.as_deref() != Some("approve") {
        return Ok(serde_json::json!({ "deployed": false, "reason": "rejected" }));
    }
    let url = apply_deploy(&ctx, plan).await?;
    Ok(serde_json::json!({ "deployed": true, "url": url }))
}

/// The `plan_deploy` step.
#[step]
pub async fn plan_deploy(service: String) -> Result<Plan, StepError> {
    Ok(compute_plan(&service))
}

/// The `apply_deploy` step.
#[step]
pub async fn apply_deploy(plan: Plan) -> Result<String, StepError> {
    Ok(run_deploy(&plan))
}
