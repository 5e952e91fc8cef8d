// Only a body marked with `workflow!` becomes a workflow tool: a bare closure does not.
use eve_core::engine::{define_workflow_tool, WorkflowCtx, WorkflowError};

fn main() {
    let _ = define_workflow_tool(
        "Deploy.",
        |_ctx: WorkflowCtx, _input: serde_json::Value| async { Ok::<_, WorkflowError>(()) },
    );
}
