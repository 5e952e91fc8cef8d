//! `#[tool(background, approval)]` and `#[tool(background, approval = path)]`: a background
//! ordinary tool's call waits for a person's approval before its step runs; `approve` runs the
//! tool, `deny` ends the run `RunDenied` and the tool never runs. An inline (default) tool with
//! an approval policy is refused at registration.

use eve_core::engine::{
    define_tool, start_tool_call, Approval, Clock as _, EngineError, ManualClock, Registry, Tool,
    ToolCtx, Worker, WorkerConfig, WorkflowError,
};
use eve_core::{
    CallId, Display, Event, InputResponse, JournalStore, JournalStoreExt, MemoryStore, RequestId,
    RunId, SessionId, Timestamp,
};
use eve_macros::tool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A refund.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct Refund {
    /// Cents to refund.
    pub cents: u64,
}

/// How many times each tool's body ran.
static REFUNDS: AtomicUsize = AtomicUsize::new(0);
static POLICY_REFUNDS: AtomicUsize = AtomicUsize::new(0);

/// Refund, in the background, after a person approved.
#[tool(background, approval)]
async fn refund(_ctx: ToolCtx, input: Refund) -> Result<u64, WorkflowError> {
    REFUNDS.fetch_add(1, Ordering::SeqCst);
    Ok(input.cents)
}

mod policies {
    use super::*;

    /// Small refunds run, large ones are denied, the rest are asked.
    pub(crate) fn by_size(r: &Refund) -> Approval {
        match r.cents {
            0..=1000 => Approval::Approve,
            1001..=9999 => Approval::Ask,
            _ => Approval::deny("refunds of $100 or more need a manager"),
        }
    }
}

/// Refund by policy, in the background.
#[tool(background, approval = policies::by_size)]
async fn refund_by_policy(_ctx: ToolCtx, input: Refund) -> Result<u64, WorkflowError> {
    POLICY_REFUNDS.fetch_add(1, Ordering::SeqCst);
    Ok(input.cents)
}

async fn events(store: &dyn JournalStore, run: &RunId) -> Vec<Event> {
    store
        .read_all(run, 0)
        .await
        .expect("read")
        .into_iter()
        .map(|e| e.event)
        .collect()
}

fn steps(events: &[Event]) -> Vec<&str> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::StepCompleted { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_background_tool_with_approval_asks_before_it_runs() {
    assert!(refund.into_tool().requires_approval());
    assert!(refund_by_policy.into_tool().requires_approval());
    let store: Arc<dyn JournalStore> = Arc::new(MemoryStore::new());
    let clock = ManualClock::new(Timestamp(1_700_000_000_000));
    let reg = Registry::new("v1").with(refund).with(refund_by_policy);
    // Registered as workflow tools that declare the gate (MCP's `eve/needsApproval`).
    for name in ["refund", "refund_by_policy"] {
        let t = reg.by_name(name).expect("a workflow tool");
        assert!(t.requires_approval() && t.may_wait_for_input(), "{name}");
    }
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
    let pending = || {
        let store = store.clone();
        async move {
            store
                .pending_requests(&SessionId::new("s"))
                .await
                .expect("pending")
        }
    };

    // Asks: the approval request shows the tool and its input; nothing ran yet.
    let approved = start("c1", "refund", 500).await;
    let denied = start("c2", "refund", 700).await;
    worker.drain().await.expect("drain");
    let asked = pending().await;
    assert_eq!(asked.len(), 2, "{asked:?}");
    for p in &asked {
        assert_eq!(p.request.display, Display::Approval);
        assert_eq!(p.request.approval.as_ref().expect("gate").tool, "refund");
    }
    assert_eq!(
        REFUNDS.load(Ordering::SeqCst),
        0,
        "the tool ran before approval"
    );

    // Approve runs the tool's step; the run completes with its output.
    store
        .answer(
            &RequestId::for_command(&approved, 0),
            InputResponse::option("approve"),
            clock.now(),
        )
        .await
        .expect("answer");
    worker.drain().await.expect("drain");
    let ok = events(&*store, &approved).await;
    assert_eq!(steps(&ok), [Tool::STEP]);
    assert!(
        matches!(ok.last(), Some(Event::RunCompleted { output }) if output.get() == "500"),
        "{ok:#?}"
    );
    assert_eq!(REFUNDS.load(Ordering::SeqCst), 1);

    // Deny ends the run denied with the person's reason; the tool never ran.
    let mut no = InputResponse::option("deny");
    no.text = Some("not this customer".into());
    store
        .answer(&RequestId::for_command(&denied, 0), no, clock.now())
        .await
        .expect("answer");
    worker.drain().await.expect("drain");
    let ev = events(&*store, &denied).await;
    assert!(steps(&ev).is_empty(), "{ev:#?}");
    assert_eq!(
        ev.last(),
        Some(&Event::RunDenied {
            reason: "not this customer".into()
        })
    );
    assert_eq!(
        REFUNDS.load(Ordering::SeqCst),
        1,
        "the denied call ran the tool"
    );

    // The policy: approve without asking, deny without asking, or ask.
    let small = start("c3", "refund_by_policy", 10).await;
    let large = start("c4", "refund_by_policy", 50_000).await;
    let middle = start("c5", "refund_by_policy", 5_000).await;
    worker.drain().await.expect("drain");
    let small_events = events(&*store, &small).await;
    assert!(!small_events
        .iter()
        .any(|e| matches!(e, Event::InputRequested { .. })));
    assert!(
        matches!(small_events.last(), Some(Event::RunCompleted { output }) if output.get() == "10")
    );
    let large_events = events(&*store, &large).await;
    assert!(steps(&large_events).is_empty());
    assert_eq!(
        large_events.last(),
        Some(&Event::RunDenied {
            reason: "refunds of $100 or more need a manager".into()
        })
    );
    assert_eq!(POLICY_REFUNDS.load(Ordering::SeqCst), 1);
    let asked = pending().await;
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0].request_id, RequestId::for_command(&middle, 0));
    store
        .answer(
            &RequestId::for_command(&middle, 0),
            InputResponse::option("approve"),
            clock.now(),
        )
        .await
        .expect("answer");
    worker.drain().await.expect("drain");
    assert!(matches!(
        events(&*store, &middle).await.last(),
        Some(Event::RunCompleted { output }) if output.get() == "5000"
    ));
    assert_eq!(POLICY_REFUNDS.load(Ordering::SeqCst), 2);
}

#[test]
fn an_inline_tool_with_approval_is_refused_at_registration() {
    let gated = define_tool(
        "refund_now",
        "Refund at once.",
        |_ctx: ToolCtx, r: Refund| async move { Ok::<_, WorkflowError>(r.cents) },
    )
    .needs_approval();
    assert!(gated.requires_approval());
    let mut reg = Registry::new("v1");
    let err = reg.register_tool(gated.clone()).map(|_| ()).unwrap_err();
    assert!(
        matches!(&err, EngineError::ApprovalNeedsBackground { name } if name == "refund_now"),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("background") && message.contains("refund_now"),
        "{message}"
    );
    assert!(reg.ordinary("refund_now").is_none() && reg.by_name("refund_now").is_none());
    // In the background it registers, gated.
    reg.register_tool(gated.background()).expect("background");
    assert!(reg
        .by_name("refund_now")
        .expect("registered")
        .requires_approval());
}
