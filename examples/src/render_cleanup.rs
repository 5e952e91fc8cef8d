//! "Cancel and clean up: `ctx.abortSignal`" (the seed's render with cleanup): submit a render,
//! wait for it in a step that observes the abort signal, and when the run was cancelled (a
//! steered turn for this waiting tool) abort the render job in a cleanup step, within the
//! tool's grace period (30 s). [`farm`] is the render farm the steps talk to, in process.

use eve::engine::parse_duration;
use eve::prelude::*;
use serde::Deserialize;

/// The tool input.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Input {
    /// The project to render.
    pub project_id: String,
    /// How long the farm takes to render (default "1h"; the example lets you shorten it).
    #[serde(default)]
    pub render_for: Option<String>,
}

/// Render a video; if the call is cancelled meanwhile, abort the render job.
#[workflow(name = "render_cleanup")]
pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<serde_json::Value, WorkflowError> {
    let render_for = input.render_for.unwrap_or_else(|| "1h".into());
    let job_id = submit_render(&ctx, input.project_id).await?;
    // try { return await waitForRender(jobId, ctx.abortSignal) }
    let rendered = wait_for_render(&ctx, job_id.clone(), render_for).await;
    // finally { if (ctx.abortSignal.aborted) await abortRender(jobId) }
    if ctx.abort_signal().is_aborted() {
        abort_render(&ctx, job_id).await?;
    }
    Ok(serde_json::json!({ "url": rendered? }))
}

/// The `submit_render` step: the farm's job id.
#[step]
pub async fn submit_render(sc: &StepCtx, project_id: String) -> Result<String, StepError> {
    let job_id = format!("job-{project_id}");
    println!(
        "  [step] submitted render {job_id} (idempotency key {})",
        sc.idempotency_key()
    );
    farm::set(&job_id, farm::JobState::Submitted);
    Ok(job_id)
}

/// The `wait_for_render` step: the video's URL once the farm is done, or a fatal error as soon
/// as the run's abort signal reaches the step.
#[step]
pub async fn wait_for_render(
    sc: &StepCtx,
    job_id: String,
    render_for: String,
) -> Result<String, StepError> {
    let takes = parse_duration(&render_for).map_err(StepError::fatal)?;
    farm::set(&job_id, farm::JobState::Rendering);
    tokio::select! {
        () = sc.aborted() => Err(StepError::fatal(format!("render {job_id} aborted"))),
        () = tokio::time::sleep(takes) => {
            farm::set(&job_id, farm::JobState::Done);
            Ok(format!("https://cdn.example/{job_id}.mp4"))
        }
    }
}

/// The `abort_render` step: the cleanup.
#[step]
pub async fn abort_render(job_id: String) -> Result<(), StepError> {
    println!("  [step] aborting render {job_id}");
    farm::set(&job_id, farm::JobState::Aborted);
    Ok(())
}

/// The render farm the steps talk to: a job table in this process.
pub mod farm {
    use std::collections::BTreeMap;
    use std::sync::{Mutex, OnceLock};

    /// Where a job is.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum JobState {
        /// Accepted.
        Submitted,
        /// Someone waits for it.
        Rendering,
        /// Finished.
        Done,
        /// Aborted by the cleanup step.
        Aborted,
    }

    fn jobs() -> &'static Mutex<BTreeMap<String, JobState>> {
        static JOBS: OnceLock<Mutex<BTreeMap<String, JobState>>> = OnceLock::new();
        JOBS.get_or_init(Default::default)
    }

    pub(crate) fn set(job_id: &str, state: JobState) {
        jobs()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(job_id.to_owned(), state);
    }

    /// Where the job is, if the farm knows it.
    pub fn state(job_id: &str) -> Option<JobState> {
        jobs()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(job_id)
            .copied()
    }
}
