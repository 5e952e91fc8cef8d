//! "Approve before it runs": a workflow tool gated by an approval policy
//! (`#[workflow(approval)]`). Every call journals an approval request first (display
//! `approval`: the tool and the model's input, options `approve` / `deny`); the body runs only
//! once a person approves, and a denial ends the call `denied` with the person's reason, the
//! body never run. Compare `deploy_approval`, whose body asks with `ctx.ask` after a step.

use eve::prelude::*;
use serde::Deserialize;

/// The tool input.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Input {
    /// The service to roll back.
    pub service: String,
    /// The release to go back to.
    pub to_release: u32,
}

/// The `roll_back` step's work: the release now serving.
pub fn run_rollback(service: &str, release: u32) -> String {
    format!("https://deploy.example/{service}/{release}")
}

/// Roll a service back to an earlier release. A person approves the rollback before anything
/// runs; a denial says why, and nothing is rolled back.
#[workflow(approval, name = "rollback")]
pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<serde_json::Value, WorkflowError> {
    let url = roll_back(&ctx, input.service, input.to_release).await?;
    Ok(serde_json::json!({ "rolledBack": true, "url": url }))
}

/// The `roll_back` step.
#[step]
pub async fn roll_back(service: String, to_release: u32) -> Result<String, StepError> {
    Ok(run_rollback(&service, to_release))
}
