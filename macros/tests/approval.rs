//! `#[workflow(approval)]` gates every call on a person's approval, and
//! `#[workflow(approval = path)]` lets a policy function decide per input: the approve path
//! runs the body, a denial ends the run `RunDenied` without running it.

use eve_core::engine::{
    start_tool_call, Approval, IntoWorkflowTool, ManualClock, Registry, Worker, WorkerConfig,
    WorkflowCtx, WorkflowError,
};
use eve_core::{
    CallId, Display, Event, InputResponse, JournalStore, JournalStoreExt, MemoryStore, RequestId,
    SessionId, Timestamp,
};
use eve_macros::workflow;
use std::sync::Arc;

/// A refund.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct Refund {
    /// Cents to refund.
    pub cents: u64,
}

/// Refund after a person approved.
#[workflow(approval)]
async fn refund(_ctx: WorkflowCtx, input: Refund) -> Result<u64, WorkflowError> {
    Ok(input.cents)
}

mod policies {
    use super::*;

    /// Small refunds run, large ones are denied.
    pub(crate) fn small_only(r: &Refund) -> Approval {
        if r.cents <= 1000 {
            Approval::Approve
        } else {
            Approval::deny("refunds above $10 need a manager")
        }
    }
}

/// Refund by policy.
#[workflow(approval = policies::small_only)]
async fn refund_by_policy(_ctx: WorkflowCtx, input: Refund) -> Result<u64, WorkflowError> {
    Ok(input.cents)
}

async fn events(store: &dyn JournalStore, run: &eve_core::RunId) -> Vec<Event> {
    store
        .read_all(run, 0)
        .await
        .expect("read")
        .into_iter()
        .map(|e| e.event)
        .collect()
}

#[tokio::test]
async fn the_approval_options_gate_the_body() {
    assert!(refund.into_tool().requires_approval());
    assert!(refund_by_policy.into_tool().requires_approval());
    let store: Arc<dyn JournalStore> = Arc::new(MemoryStore::new());
    let clock = ManualClock::new(Timestamp(1_700_000_000_000));
    let reg = Registry::new("v1").with(refund).with(refund_by_policy);
    let worker = Worker::new(
        store.clone(),
        reg.clone(),
        clock.clone(),
        WorkerConfig::default(),
    )
    .await
    .expect("worker");
    let start = |call: &'static str, tool: &'static str, cents: u64| {
        let (store, reg, clock) = (store.clone(), reg.clone(), clock.clone());
        async move {
            use eve_core::engine::Clock as _;
            start_tool_call(
                &*store,
                &reg,
                &SessionId::new("s"),
                &CallId::new(call),
                tool,
                serde_json::json!({ "cents": cents }),
                clock.now(),
            )
            .await
            .expect("start")
            .run
            .run_id
        }
    };

    // Always asks: the request is the approval gate; approving runs the body.
    let asked = start("c1", "refund", 500).await;
    worker.drain().await.expect("drain");
    let pending = store
        .pending_requests(&SessionId::new("s"))
        .await
        .expect("pending");
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].request.display, Display::Approval);
    assert_eq!(
        pending[0].request.approval.as_ref().expect("gate").tool,
        "refund"
    );
    use eve_core::engine::Clock as _;
    store
        .answer(
            &RequestId::for_command(&asked, 0),
            InputResponse::option("approve"),
            clock.now(),
        )
        .await
        .expect("answer");
    worker.drain().await.expect("drain");
    assert!(matches!(
        events(&*store, &asked).await.last(),
        Some(Event::RunCompleted { output }) if output.get() == "500"
    ));

    // The policy approves a small refund without asking and denies a large one.
    let small = start("c2", "refund_by_policy", 10).await;
    let large = start("c3", "refund_by_policy", 5000).await;
    worker.drain().await.expect("drain");
    let small_events = events(&*store, &small).await;
    assert!(!small_events
        .iter()
        .any(|e| matches!(e, Event::InputRequested { .. })));
    assert!(matches!(
        small_events.last(),
        Some(Event::RunCompleted { .. })
    ));
    assert_eq!(
        events(&*store, &large).await,
        vec![
            events(&*store, &large).await[0].clone(),
            Event::RunDenied {
                reason: "refunds above $10 need a manager".into()
            }
        ]
    );
}
