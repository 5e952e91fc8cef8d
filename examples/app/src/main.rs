//! `my-eve`: a user's own `eve`, serving one workflow tool, `refund`, with the whole command line:
//!
//! ```text
//! my-eve serve                      # HTTP: start API, MCP at /mcp, the page; prints a first admin key
//! my-eve mcp                        # MCP on stdio, for an agent host
//! my-eve requests / answer ID approve / runs list / journal RUN / cancel RUN / keys …
//! my-eve --store postgres://… serve # any backend by URL
//! ```

use eve::prelude::*;
use serde::Deserialize;

/// What the model sends.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct RefundInput {
    /// The order to refund.
    order: String,
    /// How much, in cents.
    amount_cents: u64,
}

/// Refund an order. A person approves the refund first; the call waits for them, minutes or
/// days, without holding a process.
#[workflow]
async fn refund(ctx: WorkflowCtx, input: RefundInput) -> Result<serde_json::Value, WorkflowError> {
    let quote = quote_refund(&ctx, input.order.clone(), input.amount_cents).await?;
    let answer = ctx
        .ask(InputRequest::confirmation(format!(
            "Refund order {}: {quote}?",
            input.order
        )))
        .await;
    if answer.option_id.as_deref() != Some("approve") {
        return Ok(serde_json::json!({ "refunded": false }));
    }
    let receipt = issue_refund(&ctx, input.order, input.amount_cents).await?;
    Ok(serde_json::json!({ "refunded": true, "receipt": receipt }))
}

/// Looks the refund up (a step: it runs once; a replay reads its recorded result).
#[step]
async fn quote_refund(order: String, amount_cents: u64) -> Result<String, StepError> {
    Ok(format!(
        "{}.{:02} USD back to the card of {order}",
        amount_cents / 100,
        amount_cents % 100
    ))
}

/// Moves the money: retried on failure, never run twice once it succeeded.
#[step(retries = 3, backoff = "1s")]
async fn issue_refund(order: String, amount_cents: u64) -> Result<String, StepError> {
    Ok(format!("rf_{order}_{amount_cents}"))
}

fn main() -> std::process::ExitCode {
    // The deployment names this code: change it when a change would replay runs differently.
    eve::App::new("my-app-v1").tool(refund).run()
}
