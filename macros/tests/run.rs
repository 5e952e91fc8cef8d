//! A workflow made with the attributes runs to completion on the MemoryStore: its steps are
//! journaled under their function names, a step's arguments are moved in without clones by
//! hand, a failed attempt is retried by the attribute's policy, and the tool keeps its name,
//! description, schema and workflow id.

use eve_core::engine::{
    start_tool_call, IntoWorkflowTool, ManualClock, Registry, StepCtx, StepError, ToolCtx, Worker,
    WorkerConfig, WorkflowCtx, WorkflowError,
};
use eve_core::{CallId, Event, JournalStore, JournalStoreExt, MemoryStore, SessionId, Timestamp};
use eve_macros::{step, tool, workflow};
use std::sync::Arc;
use std::time::Duration;

/// The tool input.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct Order {
    /// The order.
    pub id: String,
    /// Cents to refund.
    pub cents: u64,
}

/// Refund an order.
///
/// Charges back in two steps.
#[workflow]
async fn refund(ctx: WorkflowCtx, input: Order) -> Result<String, WorkflowError> {
    let key = lookup(&ctx, input.id.clone()).await?;
    let receipt = charge_back(&ctx, key, input.cents).await?;
    Ok(receipt)
}

#[step]
async fn lookup(id: String) -> Result<String, StepError> {
    Ok(format!("order/{id}"))
}

#[step(name = "charge", retries = 2, backoff = "1s")]
async fn charge_back(sc: &StepCtx, key: String, cents: u64) -> Result<String, StepError> {
    if sc.attempt() == 1 {
        return Err(StepError::retryable("the bank is busy"));
    }
    Ok(format!(
        "{key}: {cents} refunded on attempt {}",
        sc.attempt()
    ))
}

/// Background reminder.
#[workflow(background, name = "remind_later", id = "reminders::v1")]
async fn remind(
    ctx: WorkflowCtx,
    task: eve_core::engine::TaskHandle,
    input: Order,
) -> Result<String, WorkflowError> {
    task.post_message("scheduled");
    ctx.sleep("1m").await;
    Ok(input.id)
}

/// Echo the order id.
#[tool]
async fn echo(_ctx: ToolCtx, input: Order) -> Result<String, WorkflowError> {
    Ok(input.id)
}

#[tokio::test]
async fn attribute_workflow_runs_with_steps_and_retries() {
    let store: Arc<dyn JournalStore> = Arc::new(MemoryStore::new());
    let clock = ManualClock::new(Timestamp(1_700_000_000_000));
    let reg = Registry::new("v1").with(refund).with(remind);
    let t = reg.by_name("refund").expect("named after the function");
    assert_eq!(t.workflow_id().as_str(), "refund");
    assert_eq!(
        t.description(),
        "Refund an order.\n\nCharges back in two steps."
    );
    assert!(t.input_schema()["properties"]["cents"].is_object());
    let bg = reg.by_name("remind_later").expect("the name override");
    assert_eq!(bg.workflow_id().as_str(), "reminders::v1");
    assert_eq!(bg.execution(), eve_core::Execution::Background);

    let worker = Worker::new(
        store.clone(),
        reg.clone(),
        clock.clone(),
        WorkerConfig::default(),
    )
    .await
    .expect("worker");
    let run = start_tool_call(
        &*store,
        &reg,
        &SessionId::new("s"),
        &CallId::new("c"),
        "refund",
        serde_json::json!({"id": "42", "cents": 500}),
        clock.now(),
    )
    .await
    .expect("start")
    .run
    .run_id;
    worker.drain().await.expect("drain");
    use eve_core::engine::Clock as _;
    clock.advance(Duration::from_secs(1));
    worker.drain().await.expect("drain");
    let events: Vec<Event> = store
        .read_all(&run, 0)
        .await
        .expect("read")
        .into_iter()
        .map(|e| e.event)
        .collect();
    let steps: Vec<(String, u32)> = events
        .iter()
        .filter_map(|e| match e {
            Event::StepCompleted { name, attempt, .. } => Some((name.clone(), *attempt)),
            _ => None,
        })
        .collect();
    assert_eq!(steps, [("lookup".into(), 1), ("charge".into(), 2)]);
    match events.last() {
        Some(Event::RunCompleted { output }) => assert_eq!(
            output.to_value::<String>().expect("json"),
            "order/42: 500 refunded on attempt 2"
        ),
        other => panic!("not completed: {other:?}; {events:#?}"),
    }
}

#[tokio::test]
async fn attribute_tool_runs_once() {
    let tool = echo.into_tool();
    assert_eq!(tool.name(), "echo");
    assert_eq!(tool.description(), "Echo the order id.");
    let ctx = ToolCtx::inline(SessionId::new("s"), CallId::new("c"), "echo");
    let out = tool
        .call(ctx, serde_json::json!({"id": "7", "cents": 1}))
        .await
        .expect("call");
    assert_eq!(out, serde_json::json!("7"));
    // The IntoWorkflowTool trait is what Registry::with takes.
    let _ = refund.into_tool();
}

/// A typed result.
#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Quote {
    /// Cents back.
    pub cents: u64,
}

/// Quote a refund.
#[workflow(output_schema)]
async fn quote(_ctx: WorkflowCtx, input: Order) -> Result<Quote, WorkflowError> {
    Ok(Quote { cents: input.cents })
}

#[test]
fn output_schema_lists_the_ok_type() {
    let tool = quote.into_tool();
    let schema = tool.output_schema().expect("declared by the attribute");
    assert_eq!(schema["type"], "object");
    assert_eq!(schema["properties"]["cents"]["type"], "integer");
    assert!(refund.into_tool().output_schema().is_none());
}

/// Confirm a refund with a person.
#[workflow]
async fn confirm_refund(ctx: WorkflowCtx, input: Order) -> Result<bool, WorkflowError> {
    let answer = ctx
        .ask(eve_core::InputRequest::confirmation(format!(
            "Refund {}?",
            input.id
        )))
        .await;
    Ok(answer.option_id.as_deref() == Some("approve"))
}

/// Asks in a helper, so the attribute cannot see it: declared.
#[workflow(waits_for_input)]
async fn refund_via_helper(ctx: WorkflowCtx, input: Order) -> Result<bool, WorkflowError> {
    confirm(&ctx, input.id).await
}

async fn confirm(ctx: &WorkflowCtx, id: String) -> Result<bool, WorkflowError> {
    let answer = ctx
        .ask(eve_core::InputRequest::confirmation(format!(
            "Refund {id}?"
        )))
        .await;
    Ok(answer.option_id.is_some())
}

#[test]
fn waiting_for_input_is_derived_from_the_body_or_declared() {
    assert!(confirm_refund.into_tool().may_wait_for_input());
    assert!(refund_via_helper.into_tool().may_wait_for_input());
    // Steps and sleeps are not input: refund and remind never wait for a person.
    assert!(!refund.into_tool().may_wait_for_input());
    assert!(!remind.into_tool().may_wait_for_input());
}

#[step(local)]
async fn add_cents(total: u64, cents: u64) -> Result<u64, StepError> {
    Ok(total + cents)
}

#[step(local, name = "tax", retries = 1)]
async fn add_tax(total: u64) -> Result<u64, StepError> {
    Ok(total + total / 10)
}

/// Totals an order with local steps.
#[workflow]
async fn local_total(ctx: WorkflowCtx, input: Order) -> Result<u64, WorkflowError> {
    let a = add_cents(&ctx, 0, input.cents).await?;
    let b = add_cents(&ctx, a, 100).await?;
    Ok(add_tax(&ctx, b).await?)
}

/// `#[step(local)]` makes local steps: the three outcomes and the run's end commit in one
/// append, under the steps' names.
#[tokio::test]
async fn local_steps_commit_in_one_append() {
    use eve_core::engine::Clock as _;
    let memory: Arc<dyn JournalStore> = Arc::new(MemoryStore::new());
    let counting = eve_core::testing::FaultyStore::new(memory.clone());
    let clock = ManualClock::new(Timestamp(1_700_000_000_000));
    let reg = Registry::new("v1").with(local_total);
    let worker = Worker::new(
        counting.clone(),
        reg.clone(),
        clock.clone(),
        WorkerConfig::default(),
    )
    .await
    .expect("worker");
    let run = start_tool_call(
        &*memory,
        &reg,
        &SessionId::new("s"),
        &CallId::new("c"),
        "local_total",
        serde_json::json!({"id": "1", "cents": 400}),
        clock.now(),
    )
    .await
    .expect("start")
    .run
    .run_id;
    worker.drain().await.expect("drain");
    let events: Vec<Event> = memory
        .read_all(&run, 0)
        .await
        .expect("read")
        .into_iter()
        .map(|e| e.event)
        .collect();
    let steps: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            Event::StepCompleted { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(steps, ["add_cents", "add_cents", "tax"]);
    assert!(
        matches!(events.last(), Some(Event::RunCompleted { output }) if output.to_value::<u64>().ok() == Some(550)),
        "{events:#?}"
    );
    let appends = counting
        .call_log()
        .into_iter()
        .filter(|c| *c == "append")
        .count();
    assert_eq!(appends, 1, "{:?}", counting.call_log());
}
