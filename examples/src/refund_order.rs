//! "Ask now, act when answered": a background tool. The call returns a task receipt at once and
//! the conversation continues; the approval card stays on the channel; when it is answered the
//! refund runs and the parent agent is woken with the outcome (`task.completed`).

use crate::deploy_approval::approve_or_cancel;
use eve::prelude::*;

/// The tool input.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct Input {
    /// The order.
    pub order_id: String,
    /// The amount, in dollars.
    pub amount: f64,
}

/// Request approval to refund an order, then issue the refund once approved.
#[workflow(background, name = "refund_order")]
pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<serde_json::Value, WorkflowError> {
    let Input { order_id, amount } = input;
    let mut request = approve_or_cancel(format!("Refund ${amount} on order {order_id}?"), "Refund");
    request.options[1].id = "deny".into();
    request.options[1].label = "Deny".into();
    let decision = ctx.ask(request).await;
    if decision.option_id.as_deref() != Some("approve") {
        return Ok(serde_json::json!({ "refunded": false }));
    }
    let receipt = issue_refund(&ctx, order_id, amount).await?;
    Ok(serde_json::json!({ "refunded": true, "receipt": receipt }))
}

/// The `issue_refund` step: a receipt id.
#[step]
pub async fn issue_refund(
    sc: &StepCtx,
    order_id: String,
    amount: f64,
) -> Result<String, StepError> {
    println!(
        "  [step] refunding ${amount} on {order_id} (idempotency key {})",
        sc.idempotency_key()
    );
    Ok(format!("rf-{order_id}-{}", (amount * 100.0).round() as i64))
}
