//! "Deploy with approval" (the seed's `deploy`): plan the deploy in a step, ask a person to
//! confirm it with `ctx.ask`, deploy in a step only when approved. The turn stays parked while
//! the person reads the plan, minutes or days; the model sees one tool result.

use eve_core::engine::{WorkflowCtx, WorkflowError, WorkflowTool};
use eve_core::{workflow, Display, InputOption, InputRequest, OptionStyle};
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
    let answer = ctx
        .ask(approve_or_cancel(
            format!("Deploy {service}?\n\n{}", plan.summary),
            "Deploy",
        ))
        .await;
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

/// The tool (default execution: the call stays pending until the run ends).
pub fn tool() -> WorkflowTool {
    crate::define(
        "Deploy a service to production. Pauses for a human to approve the plan.",
        workflow!(execute),
    )
}
