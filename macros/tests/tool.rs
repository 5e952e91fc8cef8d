//! `#[tool]` and `#[tool(background)]` in the registry: a default tool is kept as an ordinary
//! tool that runs inline, a background one becomes a durable run of one journaled step under
//! the function's workflow id, and both keep the name, description and input schema.

use eve_core::engine::{
    start_tool_call, Clock as _, IntoTool, ManualClock, Registry, Tool, ToolCtx, Worker,
    WorkerConfig, WorkflowError,
};
use eve_core::{
    CallId, Event, Execution, JournalStore, JournalStoreExt, MemoryStore, SessionEvent, SessionId,
    Timestamp,
};
use eve_macros::tool;
use std::sync::Arc;

/// The tool input.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct Lookup {
    /// The order.
    pub order_id: String,
}

/// Look an order up.
#[tool]
async fn lookup_order(_ctx: ToolCtx, input: Lookup) -> Result<String, WorkflowError> {
    Ok(format!("{} shipped", input.order_id))
}

/// Export the orders, in the background.
#[tool(background)]
async fn export_orders(ctx: ToolCtx, input: Lookup) -> Result<String, WorkflowError> {
    let step = ctx.attempt.expect("a background call runs in a step");
    Ok(format!(
        "exported {} as {} ({})",
        input.order_id,
        ctx.tool_name,
        step.name()
    ))
}

mod shop {
    use super::*;

    /// Archive an order, in the background, under a kept workflow id.
    #[tool(background, name = "archive", id = "shop::archive_v1")]
    pub(super) async fn archive_order(
        _ctx: ToolCtx,
        input: Lookup,
    ) -> Result<String, WorkflowError> {
        Ok(input.order_id)
    }
}

#[test]
fn tool_attributes_register_both_kinds() {
    let reg = Registry::new("v1")
        .with(lookup_order)
        .with(export_orders)
        .with(shop::archive_order);
    let inline = reg.ordinary("lookup_order").expect("an inline tool");
    assert_eq!(inline.execution(), Execution::Default);
    assert_eq!(inline.description(), "Look an order up.");
    assert!(reg.by_name("lookup_order").is_none());

    let bg = reg.by_name("export_orders").expect("a workflow tool");
    assert_eq!(bg.execution(), Execution::Background);
    assert_eq!(bg.description(), "Export the orders, in the background.");
    // The function's module path (crate name left out) and name, as #[workflow]'s.
    assert_eq!(bg.workflow_id().as_str(), "export_orders");
    assert_eq!(
        bg.input_schema()["required"],
        serde_json::json!(["order_id"])
    );
    assert!(!bg.may_wait_for_input());

    let kept = reg.by_name("archive").expect("the name override");
    assert_eq!(kept.workflow_id().as_str(), "shop::archive_v1");
    assert_eq!(kept.execution(), Execution::Background);

    // The IntoTool trait gives the Tool, as the inherent into_tool does.
    let t: Tool = IntoTool::into_tool(export_orders);
    assert_eq!(t.execution(), Execution::Background);
    assert_eq!(t.workflow_id().as_str(), "export_orders");
}

#[test]
#[should_panic(expected = "registered already")]
fn a_name_clash_between_kinds_is_refused() {
    let _ = Registry::new("v1")
        .with(lookup_order)
        .with(export_orders.into_tool().named("lookup_order"));
}

#[tokio::test]
async fn a_background_tool_attribute_runs_as_one_step() {
    let store: Arc<dyn JournalStore> = Arc::new(MemoryStore::new());
    let clock = ManualClock::new(Timestamp(1_700_000_000_000));
    let reg = Registry::new("v1").with(export_orders);
    let worker = Worker::new(
        store.clone(),
        reg.clone(),
        clock.clone(),
        WorkerConfig::default(),
    )
    .await
    .expect("worker");
    let created = start_tool_call(
        &*store,
        &reg,
        &SessionId::new("s"),
        &CallId::new("c"),
        "export_orders",
        serde_json::json!({"order_id": "42"}),
        clock.now(),
    )
    .await
    .expect("start");
    assert_eq!(created.run.execution, Execution::Background);
    worker.drain().await.expect("drain");
    let events: Vec<Event> = store
        .read_all(&created.run.run_id, 0)
        .await
        .expect("read")
        .into_iter()
        .map(|e| e.event)
        .collect();
    let steps: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            Event::StepCompleted { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(steps, [Tool::STEP]);
    match events.last() {
        Some(Event::RunCompleted { output }) => assert_eq!(
            output.to_value::<String>().expect("json"),
            "exported 42 as export_orders (tool)"
        ),
        other => panic!("not completed: {other:?}; {events:#?}"),
    }
    let log = store
        .read_session(&SessionId::new("s"), 0, 100)
        .await
        .expect("session log");
    assert!(log
        .iter()
        .any(|e| matches!(e.event, SessionEvent::TaskCompleted { .. })));
}
