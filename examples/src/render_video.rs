//! "Wait for an external system to call back": submit a render, wait on a hook that another
//! process resumes (`render resume`).

use eve_core::engine::{StepError, WorkflowCtx, WorkflowError, WorkflowTool};
use eve_core::workflow;
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

/// The body.
pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<serde_json::Value, WorkflowError> {
    let done = ctx.create_hook::<Callback>(token(&input.project_id));
    let project = input.project_id.clone();
    let job: String = ctx
        .step("submit_render", move |s| {
            let project = project.clone();
            async move {
                println!(
                    "  [step] submitted render of {project} (idempotency key {})",
                    s.idempotency_key()
                );
                Ok(format!("job-{project}"))
            }
        })
        .await?;
    let callback = done.next().await?;
    if callback.status != "ok" {
        let message = format!("Render {job} failed: {}", callback.status);
        ctx.step("fail", move |_| {
            let m = message.clone();
            async move { Err::<(), _>(StepError::fatal(m)) }
        })
        .await?;
    }
    Ok(serde_json::json!({ "job": job, "url": callback.url }))
}

/// The tool.
pub fn tool() -> WorkflowTool {
    crate::define(
        "Render a video. Returns the URL once the render farm finishes.",
        workflow!(execute),
    )
}
