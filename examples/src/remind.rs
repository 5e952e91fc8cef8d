//! "Remind me later": prepare, sleep durably, compose (slow), deliver.

use eve_core::engine::{WorkflowCtx, WorkflowError, WorkflowTool};
use eve_core::workflow;
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

/// The body: a step, a durable sleep, a slow step (where the demo kills the worker), a step.
pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<Output, WorkflowError> {
    let note = input.note;
    let n = note.clone();
    ctx.step("prepare", move |s| {
        let n = n.clone();
        async move {
            println!("  [step] prepare {n:?} (key {})", s.idempotency_key());
            Ok(())
        }
    })
    .await?;
    ctx.sleep(&input.delay).await;
    let n = note.clone();
    let text: String = ctx
        .step("compose", move |s| {
            let n = n.clone();
            async move {
                println!(
                    "  [step] compose: working for 1.5 s (attempt {})",
                    s.attempt()
                );
                tokio::time::sleep(Duration::from_millis(1500)).await;
                Ok(format!("Reminder: {n}"))
            }
        })
        .await?;
    let t = text.clone();
    ctx.step("deliver", move |_| {
        let t = t.clone();
        async move {
            println!("  [step] deliver {t:?}");
            Ok(())
        }
    })
    .await?;
    Ok(Output { reminder: text })
}

/// The tool: background execution, like the seed's.
pub fn tool() -> WorkflowTool {
    crate::define(
        "Remind the user about something after a delay.",
        workflow!(execute),
    )
    .background()
}
