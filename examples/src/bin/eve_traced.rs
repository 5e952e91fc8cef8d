//! The examples' `eve` with one more tool, `release`, for the end-to-end trace test
//! (`tests/traces.rs`): two steps, one that fails its first attempt and is retried, and an ask
//! between them.

use eve::prelude::*;

/// The tool input.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct Input {
    /// The service to release.
    service: String,
}

/// Release a service: build it, push its image (the registry refuses the first push), ask for
/// approval, then roll it out.
#[workflow(name = "release")]
async fn release(ctx: WorkflowCtx, input: Input) -> Result<serde_json::Value, WorkflowError> {
    let service = input.service;
    let s = service.clone();
    let image: String = ctx
        .step("build", move |_| {
            let s = s.clone();
            async move { Ok(format!("{s}:1")) }
        })
        .await?;
    ctx.step("push_image", |s| async move {
        if s.attempt() == 1 {
            return Err(StepError::retryable("the registry is busy"));
        }
        Ok(())
    })
    .retry(RetryPolicy {
        initial_backoff: std::time::Duration::from_millis(200),
        ..RetryPolicy::retries(2)
    })
    .await?;
    let answer = ctx
        .ask(eve_examples::deploy_approval::approve_or_cancel(
            format!("Roll out {image}?"),
            "Roll out",
        ))
        .await;
    let approved = answer.option_id.as_deref() == Some("approve");
    if approved {
        ctx.step("roll_out", |_| async { Ok(()) }).await?;
    }
    Ok(serde_json::json!({ "released": approved }))
}

fn main() -> std::process::ExitCode {
    eve::App::from_registry(eve_examples::registry().with(release)).run()
}
