//! "Report progress, then ask" (the seed's example under "How suspension works"): the body
//! yields a progress snapshot (`action.partial` for the pending call), then asks whether to
//! continue. Awaiting the unanswered request is the durable wait: the call stays pending, in
//! default execution, until the answer arrives and the body returns it.

use eve::prelude::*;
use serde::Deserialize;

/// The tool input (the seed's example takes none).
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
pub struct Input {}

/// Report progress, then ask whether to continue.
#[workflow(name = "progress_then_ask")]
pub async fn execute(ctx: WorkflowCtx, _input: Input) -> Result<serde_json::Value, WorkflowError> {
    ctx.progress(&serde_json::json!({ "status": "awaiting approval" }));
    let answer = ctx.ask(InputRequest::confirmation("Continue?")).await;
    Ok(serde_json::json!({ "answer": answer }))
}
