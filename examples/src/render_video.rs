//! "Wait for an external system to call back" (the seed's `render_video`, `createWebhook`
//! form): the body creates a webhook, submits the render with the webhook's URL, and waits. The
//! render farm POSTs `{status, url}` to that URL (`eve serve` answers it 202 and delivers it);
//! nothing runs in between. The URL is built in the step from `EVE_BASE_URL` (environment
//! belongs in steps), which `eve serve --base-url` sets. The hook version with a caller-chosen
//! token is [`render_hook`](crate::render_hook).

use eve::prelude::*;
use eve::WebhookRequest;
use serde::{Deserialize, Serialize};

/// The tool input.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Input {
    /// The project to render.
    pub project_id: String,
}

/// What the render farm posts to the webhook (`callback.json()`).
#[derive(Debug, Serialize, Deserialize)]
pub struct Callback {
    /// "ok" or an error status.
    pub status: String,
    /// The rendered video.
    #[serde(default)]
    pub url: Option<String>,
}

/// Where webhook URLs point when `EVE_BASE_URL` is not set: `eve serve`'s default address.
pub const DEFAULT_BASE_URL: &str = "http://127.0.0.1:8787";

/// Render a video. Returns the URL once the render farm finishes.
#[workflow(name = "render_video")]
pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<serde_json::Value, WorkflowError> {
    let done = ctx.create_webhook::<WebhookRequest>();
    let job_id = submit_render(&ctx, input.project_id, done.path()).await?;
    let callback = done.next().await?;
    let Callback { status, url } = serde_json::from_value(callback.body)?;
    if status != "ok" {
        return Err(WorkflowError::new(format!(
            "Render {job_id} failed: {status}"
        )));
    }
    Ok(serde_json::json!({ "url": url }))
}

/// The `submit_render` step: hands the [`farm`] the project and the absolute webhook URL
/// (`EVE_BASE_URL` + the webhook's path); records only the job id (the URL carries the
/// webhook's secret token, which the journal never shows).
#[step]
pub async fn submit_render(
    sc: &StepCtx,
    project_id: String,
    callback_path: String,
) -> Result<String, StepError> {
    let base = std::env::var("EVE_BASE_URL").unwrap_or_else(|_| DEFAULT_BASE_URL.to_owned());
    let callback_url = format!("{}{callback_path}", base.trim_end_matches('/'));
    let job_id = format!("job-{project_id}");
    println!(
        "  [step] submitted render {job_id} (idempotency key {})",
        sc.idempotency_key()
    );
    farm::submit(&job_id, &callback_url)?;
    Ok(job_id)
}

/// The render farm `submit_render` talks to: it keeps each job's callback URL in this process
/// and, when `RENDER_FARM_DIR` is set, also writes it to `{RENDER_FARM_DIR}/{job id}.url`, so
/// a farm in another process (a test driving `eve serve`) can call back.
pub mod farm {
    use eve::prelude::StepError;
    use std::collections::BTreeMap;
    use std::sync::{Mutex, OnceLock};

    fn jobs() -> &'static Mutex<BTreeMap<String, String>> {
        static JOBS: OnceLock<Mutex<BTreeMap<String, String>>> = OnceLock::new();
        JOBS.get_or_init(Default::default)
    }

    pub(crate) fn submit(job_id: &str, callback_url: &str) -> Result<(), StepError> {
        if let Some(dir) = std::env::var_os("RENDER_FARM_DIR") {
            std::fs::write(
                std::path::Path::new(&dir).join(format!("{job_id}.url")),
                callback_url,
            )?;
        }
        jobs()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(job_id.to_owned(), callback_url.to_owned());
        Ok(())
    }

    /// The URL the farm calls back when `job_id` is done, once submitted.
    pub fn callback_url(job_id: &str) -> Option<String> {
        jobs()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(job_id)
            .cloned()
    }
}
