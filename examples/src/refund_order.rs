//! "Ask now, act when answered": a background tool. The call returns a task receipt at once and
//! the conversation continues; the approval card stays on the channel; when it is answered the
//! refund runs and the parent agent is woken with the outcome (`task.completed`).

use crate::deploy_approval::approve_or_cancel;
use eve_core::engine::{WorkflowCtx, WorkflowError, WorkflowTool};
use eve_core::workflow;

/// The tool input.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct Input {
    /// The order.
    pub order_id: String,
    /// The amount, in dollars.
    pub amount: f64,
}

/// The `issue_refund` step's work: a receipt id.
pub fn issue_refund(order_id: &str, amount: f64) -> String {
    format!("rf-{order_id}-{}", (amount * 100.0).round() as i64)
}

/// The body.
pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<serde_json::Value, WorkflowError> {
    let Input { order_id, amount } = input;
    let mut request = approve_or_cancel(format!("Refund ${amount} on order {order_id}?"), "Refund");
    request.options[1].id = "deny".into();
    request.options[1].label = "Deny".into();
    let decision = ctx.ask(request).await;
    if decision.option_id.as_deref() != Some("approve") {
        return Ok(serde_json::json!({ "refunded": false }));
    }
    let receipt: String = ctx
        .step("issue_refund", move |s| {
            let order_id = order_id.clone();
            async move {
                println!(
                    "  [step] refunding ${amount} on {order_id} (idempotency key {})",
                    s.idempotency_key()
                );
                Ok(issue_refund(&order_id, amount))
            }
        })
        .await?;
    Ok(serde_json::json!({ "refunded": true, "receipt": receipt }))
}

/// The tool: background execution.
pub fn tool() -> WorkflowTool {
    crate::define(
        "Request approval to refund an order, then issue the refund once approved.",
        workflow!(execute),
    )
    .background()
}
