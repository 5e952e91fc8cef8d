//! "Remind me later": prepare, sleep durably, compose (slow), deliver.

use eve::prelude::*;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The tool input.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Input {
    /// What to remind about.
    pub note: String,
    /// How long to wait: "30s", "4h", …
    pub delay: String,
}

/// The tool output.
#[derive(Serialize, Deserialize, Debug)]
pub struct Output {
    /// The reminder text.
    pub reminder: String,
}

/// Remind the user about something after a delay.
#[workflow(background, name = "remind")]
pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<Output, WorkflowError> {
    prepare(&ctx, input.note.clone()).await?;
    ctx.sleep(&input.delay).await;
    let reminder = compose(&ctx, input.note).await?;
    deliver(&ctx, reminder.clone()).await?;
    Ok(Output { reminder })
}

#[step]
async fn prepare(sc: &StepCtx, note: String) -> Result<(), StepError> {
    println!("  [step] prepare {note:?} (key {})", sc.idempotency_key());
    Ok(())
}

#[step]
async fn compose(sc: &StepCtx, note: String) -> Result<String, StepError> {
    println!(
        "  [step] compose: working for 1.5 s (attempt {})",
        sc.attempt()
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Ok(format!("Reminder: {note}"))
}

#[step]
async fn deliver(reminder: String) -> Result<(), StepError> {
    println!("  [step] deliver {reminder:?}");
    Ok(())
}
