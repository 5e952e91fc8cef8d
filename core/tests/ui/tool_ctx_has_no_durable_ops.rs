// Durable operations exist only on WorkflowCtx: an ordinary tool's ToolCtx has no step, sleep
// or hooks.
use eve_core::engine::ToolCtx;

async fn ordinary(ctx: ToolCtx) {
    ctx.sleep("4h").await;
    ctx.step("charge", |_| async { Ok(1) }).await;
    ctx.create_hook::<String>("token");
}

fn main() {
    let _ = ordinary;
}
