//! "Wait for an external system to call back", the hook version: submit a render, wait on a hook
//! with a caller-chosen token that another process resumes (`render resume`). The seed's own
//! form, with a webhook URL, is [`render_video`](crate::render_video).

use eve::prelude::*;
use serde::Deserialize;

/// The tool input.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Input {
    /// The project to render.
    pub project_id: String,
}

/// What the render farm posts back.
#[derive(Deserialize, serde::Serialize, Debug)]
pub struct Callback {
    /// "ok" or an error status.
    pub status: String,
    /// The rendered video.
    #[serde(default)]
    pub url: Option<String>,
}

/// The hook token for a project (caller-chosen, so another process can name it).
pub fn token(project_id: &str) -> String {
    format!("render-{project_id}")
}

/// Render a video. Returns the URL once the render farm finishes.
#[workflow(name = "render_hook")]
pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<serde_json::Value, WorkflowError> {
    let done = ctx.create_hook::<Callback>(token(&input.project_id));
    let job = submit_render(&ctx, input.project_id).await?;
    let callback = done.next().await?;
    if callback.status != "ok" {
        fail(&ctx, format!("Render {job} failed: {}", callback.status)).await?;
    }
    Ok(serde_json::json!({ "job": job, "url": callback.url }))
}

#[step]
async fn submit_render(sc: &StepCtx, project: String) -> Result<String, StepError> {
    println!(
        "  [step] submitted render of {project} (idempotency key {})",
        sc.idempotency_key()
    );
    Ok(format!("job-{project}"))
}

/// A step that fails the run with `message` (recorded, so a replay fails the same way).
#[step]
async fn fail(message: String) -> Result<(), StepError> {
    Err(StepError::fatal(message))
}
