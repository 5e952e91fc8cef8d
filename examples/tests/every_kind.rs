//! The examples' registry (the one the `eve` binary serves) has one tool of every kind, each
//! called here through it on a SQLite file with a manual clock and a worker driven by `drain`:
//! an approval-gated workflow tool (`rollback`: approved runs the body, denied never does), an
//! ordinary tool run inline (`order_status`), a background ordinary tool (`export_report`: a
//! receipt, one journaled step, `task.completed`), and a workflow tool that sets search
//! attributes (`triage_ticket`: found by `attr.team = "billing"`).

use eve_core::engine::{ManualClock, Session, ToolCallStart, ToolCtx, Worker, WorkerConfig};
use eve_core::{
    search_runs, CallId, Display, Event, InputResponse, JournalStore, JournalStoreExt, RunQuery,
    RunSearch, SessionEvent, SessionId, Timestamp, ToolResult,
};
use eve_examples::registry;
use eve_storage_sqlite::SqliteStore;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

struct Env {
    store: Arc<dyn JournalStore>,
    worker: Worker,
    session: Session,
    _dir: tempfile::TempDir,
}

impl Env {
    async fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn JournalStore> = Arc::new(
            SqliteStore::open(dir.path().join("examples.db"))
                .await
                .expect("open sqlite"),
        );
        let clock = ManualClock::new(Timestamp(1_700_000_000_000));
        let worker = Worker::new(
            store.clone(),
            registry(),
            clock.clone(),
            WorkerConfig {
                lease_ttl: Duration::from_secs(30),
                store_retries: 0,
                ..WorkerConfig::default()
            },
        )
        .await
        .expect("register worker");
        let session = Session::new(
            store.clone(),
            Arc::new(registry()),
            clock,
            SessionId::new("kinds"),
        );
        Self {
            store,
            worker,
            session,
            _dir: dir,
        }
    }

    async fn call(&self, call: &str, tool: &str, input: Value) -> ToolCallStart {
        let started = self
            .session
            .call_tool(call, tool, input)
            .await
            .expect("call");
        self.worker.drain().await.expect("drain");
        started
    }

    async fn settled(&self, call: &str) -> ToolResult {
        self.session
            .settlement(&CallId::new(call))
            .await
            .unwrap()
            .expect("the call is settled")
    }

    async fn events(&self, run: &eve_core::RunId) -> Vec<Event> {
        self.store
            .read_all(run, 0)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.event)
            .collect()
    }
}

fn output(result: ToolResult) -> Value {
    match result {
        ToolResult::Completed { output } => output.to_value().unwrap(),
        other => panic!("not completed: {other:?}"),
    }
}

#[tokio::test]
async fn every_kind_of_tool_is_registered() {
    let reg = registry();
    let rollback = reg.by_name("rollback").expect("rollback");
    assert!(rollback.requires_approval());
    let inline = reg.ordinary("order_status").expect("order_status");
    assert_eq!(inline.execution(), eve_core::Execution::Default);
    let export = reg.by_name("export_report").expect("export_report");
    assert_eq!(export.execution(), eve_core::Execution::Background);
    assert!(reg.by_name("triage_ticket").is_some());
}

#[tokio::test]
async fn rollback_runs_only_once_approved() {
    let env = Env::new().await;
    let input = json!({ "service": "api", "to_release": 41 });
    let ToolCallStart::Parked { run_id } = env.call("approve-1", "rollback", input.clone()).await
    else {
        panic!("a default-execution call parks")
    };
    // The approval request comes first, showing the tool and the model's input.
    let pending = env.session.pending_requests().await.unwrap();
    assert_eq!(pending.len(), 1);
    let request = &pending[0].request;
    assert_eq!(request.display, Display::Approval);
    let gate = request.approval.as_ref().expect("an approval request");
    assert_eq!((gate.tool.as_str(), &gate.input), ("rollback", &input));
    assert!(
        !env.events(&run_id)
            .await
            .iter()
            .any(|e| matches!(e, Event::StepCompleted { .. })),
        "nothing runs before the approval"
    );
    env.session
        .answer(&pending[0].request_id, InputResponse::option("approve"))
        .await
        .unwrap();
    env.worker.drain().await.unwrap();
    assert_eq!(
        output(env.settled("approve-1").await),
        json!({ "rolledBack": true, "url": "https://deploy.example/api/41" })
    );

    // Denied: the call settles denied with the reason, and the body never ran.
    let ToolCallStart::Parked { run_id } = env.call("deny-1", "rollback", input).await else {
        panic!("a default-execution call parks")
    };
    let pending = env.session.pending_requests().await.unwrap();
    let deny = InputResponse {
        option_id: Some(eve_core::event::DENY.into()),
        text: Some("not during the sale".into()),
        ..InputResponse::default()
    };
    env.session
        .answer(&pending[0].request_id, deny)
        .await
        .unwrap();
    env.worker.drain().await.unwrap();
    assert_eq!(
        env.settled("deny-1").await,
        ToolResult::Denied {
            reason: "not during the sale".into()
        }
    );
    assert!(!env
        .events(&run_id)
        .await
        .iter()
        .any(|e| matches!(e, Event::StepCompleted { .. })));
}

#[tokio::test]
async fn order_status_answers_inline() {
    let reg = registry();
    let tool = reg.ordinary("order_status").expect("an inline tool");
    let ctx = ToolCtx::inline(SessionId::new("kinds"), CallId::new("c"), "order_status");
    let status = tool
        .call(ctx.clone(), json!({ "order_id": "o-7" }))
        .await
        .unwrap();
    assert_eq!(status["order_id"], "o-7");
    assert!(
        ["packing", "shipped", "delivered"].contains(&status["status"].as_str().unwrap()),
        "{status}"
    );
    let err = tool
        .call(ctx, json!({ "order_id": "o-missing" }))
        .await
        .unwrap_err();
    assert!(err.contains("no order o-missing"), "{err}");
    // Its input is checked as a workflow tool's, naming the field.
    let err = tool.validate(&json!({ "order_id": 7 })).unwrap_err();
    assert!(
        err.to_string()
            .contains("order_id: expected a string, got the number 7"),
        "{err}"
    );
}

#[tokio::test]
async fn export_report_is_a_task_of_one_step() {
    let env = Env::new().await;
    let ToolCallStart::Working { task_id } = env
        .call("export-1", "export_report", json!({ "month": "2026-11" }))
        .await
    else {
        panic!("a background call answers a receipt")
    };
    let events = env.events(&task_id).await;
    let steps: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            Event::StepCompleted { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(steps, [eve_core::engine::Tool::STEP]);
    let done = env
        .session
        .events(0, 100)
        .await
        .unwrap()
        .into_iter()
        .find_map(|e| match e.event {
            SessionEvent::TaskCompleted { output } if e.run_id == task_id => Some(output),
            _ => None,
        })
        .expect("task.completed");
    let report: Value = done.to_value().unwrap();
    assert_eq!(report["url"], "https://reports.example/sales/2026-11.csv");
    assert_eq!(report["idempotency_key"], format!("{task_id}:0"));
}

#[tokio::test]
async fn triage_ticket_is_found_by_its_attributes() {
    let env = Env::new().await;
    for (call, text) in [
        ("t-1", "I was charged twice, please refund asap"),
        ("t-2", "The app shows an error on login"),
    ] {
        let ticket = call.replace('t', "ticket");
        env.call(
            call,
            "triage_ticket",
            json!({ "ticket_id": ticket, "text": text }),
        )
        .await;
    }
    assert_eq!(
        output(env.settled("t-1").await),
        json!({ "team": "billing", "urgent": true, "queue": "billing/ticket-1" })
    );
    let search = RunSearch::parse(r#"attr.team = "billing" and attr.urgent = true"#).unwrap();
    let found = search_runs(&*env.store, &RunQuery::default(), Some(&search))
        .await
        .unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].attributes["ticket"], "ticket-1");
    let search = RunSearch::parse(r#"attr.team = "engineering""#).unwrap();
    let found = search_runs(&*env.store, &RunQuery::default(), Some(&search))
        .await
        .unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].attributes["urgent"], false);
}
