//! "Delegate work: `ctx.agent`" (the seed's security review): plan a deploy in a step, ask the
//! visible subagent `reviewer` to review the plan (key `security-review`, stable across
//! replay), and use its structured result: deploy only when the review approves.

use crate::deploy_approval::{apply_deploy, plan_deploy};
use eve::prelude::*;
use serde::{Deserialize, Serialize};

/// The tool input.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Input {
    /// The service to deploy.
    pub service: String,
}

/// What the reviewer must answer (checked against [`review_schema`]).
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Review {
    /// Whether the plan may go ahead.
    pub approved: bool,
    /// What the reviewer found.
    #[serde(default)]
    pub findings: Vec<String>,
}

/// The call's key: one logical call site, one fixed key.
pub const KEY: &str = "security-review";
/// The model-visible subagent.
pub const TARGET: &str = "reviewer";

/// The output schema the reviewer's result must satisfy.
pub fn review_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "required": ["approved"],
        "properties": {
            "approved": { "type": "boolean" },
            "findings": { "type": "array", "items": { "type": "string" } }
        }
    })
}

/// Deploy a service once a security reviewer subagent approves the plan.
#[workflow(name = "security_review")]
pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<serde_json::Value, WorkflowError> {
    let service = input.service;
    let plan = plan_deploy(&ctx, service.clone()).await?;
    let result = ctx
        .agent(
            AgentCall::new(
                KEY,
                TARGET,
                format!(
                    "Review the deployment plan for security risks.\n\n{}",
                    plan.summary
                ),
            )
            .schema(review_schema()),
        )?
        .await?;
    let review: Review = serde_json::from_value(result)?;
    if !review.approved {
        return Ok(serde_json::json!({
            "deployed": false,
            "reason": "security review",
            "findings": review.findings,
        }));
    }
    let url = apply_deploy(&ctx, plan).await?;
    Ok(serde_json::json!({ "deployed": true, "url": url, "findings": review.findings }))
}
