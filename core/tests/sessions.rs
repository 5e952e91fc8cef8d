#![allow(unreachable_pub)]
//! Sessions (issue 4), on MemoryStore and SqliteStore: tool-call receipts and settlement, the
//! channel (persisted, followable after a restart), the turn policy (queue, steer), the task
//! index, `task_cancel` and `end`, answers (once, typed errors, from another store handle, days
//! later), withdrawals and hook disposal on every end, cancellation at each point of a 3-step
//! body with a cleanup step, and the return-rule table.
//!
//! Time is a `ManualClock`; workers are driven with `run_once`/`drain`. Gated steps wait on
//! test-controlled semaphores, never on wall-clock sleeps.

use eve_core::engine::{
    requests_turn, resume_hook, ActivationEnd, Clock, EngineError, ManualClock, NotATaskKind,
    Registry, Session, SessionError, SessionEventExt, ToolCallStart, TurnOutcome, TurnPolicy,
    Worker, WorkerConfig,
};
use eve_core::{
    CallId, CancelOutcome, Event, InputResponse, JournalStore, JournalStoreExt, MemoryStore,
    Payload, RequestId, RunId, RunStatus, SessionEntry, SessionEvent, SessionId, StoreError,
    Timestamp, ToolResult,
};
use eve_storage_sqlite::SqliteStore;
use futures::StreamExt;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

const START: Timestamp = Timestamp(1_700_000_000_000);
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);
/// Past every test tool's grace period (the default, 30 s).
const PAST_GRACE: Duration = Duration::from_secs(31);
/// A guard against a hang, never a synchronisation point: every wait below is on a channel.
const GUARD: Duration = Duration::from_secs(20);

mod tools {
    //! The test tools. Tool names come from the module names.
    use eve_core::engine::{
        define_workflow_tool, StepError, TaskHandle, WorkflowCtx, WorkflowError, WorkflowTool,
    };
    use eve_core::{
        background_workflow, workflow, Display, InputOption, InputRequest, InputResponse,
        OptionStyle,
    };
    use schemars::JsonSchema;
    use serde::Deserialize;
    use serde_json::{json, Value};
    use std::collections::HashMap;
    use std::sync::{Arc, LazyLock, Mutex};
    use tokio::sync::{mpsc, Semaphore};

    pub fn approve_or_cancel(prompt: &str) -> InputRequest {
        InputRequest {
            prompt: prompt.into(),
            display: Display::Confirmation,
            options: vec![
                InputOption {
                    id: "approve".into(),
                    label: "Approve".into(),
                    description: None,
                    style: Some(OptionStyle::Primary),
                },
                InputOption {
                    id: "cancel".into(),
                    label: "Cancel".into(),
                    description: None,
                    style: None,
                },
            ],
            allow_freeform: false,
            agent: None,
            approval: None,
        }
    }

    fn option(r: &InputResponse) -> Value {
        json!(r.option_id)
    }

    /// Default execution: waits on a hook, returns its payload.
    pub mod wait_hook {
        use super::*;
        #[derive(Deserialize, JsonSchema)]
        pub struct Input {
            pub token: String,
        }
        pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<Value, WorkflowError> {
            Ok(ctx.create_hook::<Value>(input.token).next().await?)
        }
        pub fn tool() -> WorkflowTool {
            define_workflow_tool("Waits for a callback.", workflow!(execute))
        }
    }

    /// Background: waits on a hook, returns its payload.
    pub mod watch {
        use super::*;
        #[derive(Deserialize, JsonSchema)]
        pub struct Input {
            pub token: String,
        }
        /// Fails when the payload is `"fail"`.
        pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<Value, WorkflowError> {
            let payload = ctx.create_hook::<Value>(input.token).next().await?;
            if payload == json!("fail") {
                return Err(WorkflowError::new("told to fail"));
            }
            Ok(payload)
        }
        pub fn tool() -> WorkflowTool {
            define_workflow_tool("Watches for a callback.", workflow!(execute)).background()
        }
    }

    /// Background: sleeps, returns the note.
    pub mod remind {
        use super::*;
        #[derive(Deserialize, JsonSchema)]
        pub struct Input {
            pub note: String,
            pub delay: String,
        }
        pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<Value, WorkflowError> {
            ctx.sleep(&input.delay).await;
            Ok(json!({ "reminder": input.note }))
        }
        pub fn tool() -> WorkflowTool {
            define_workflow_tool("Reminds later.", workflow!(execute)).background()
        }
    }

    /// Default execution: one confirmation.
    pub mod approve {
        use super::*;
        #[derive(Deserialize, JsonSchema)]
        pub struct Input {
            pub what: String,
        }
        pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<Value, WorkflowError> {
            let answer = ctx
                .ask(approve_or_cancel(&format!("Go ahead with {}?", input.what)))
                .await;
            Ok(json!({ "answer": option(&answer) }))
        }
        pub fn tool() -> WorkflowTool {
            define_workflow_tool("Asks for approval.", workflow!(execute))
        }
    }

    /// Background: asks now, acts when answered.
    pub mod refund {
        use super::*;
        #[derive(Deserialize, JsonSchema)]
        pub struct Input {
            pub order: String,
        }
        pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<Value, WorkflowError> {
            let answer = ctx
                .ask(approve_or_cancel(&format!("Refund {}?", input.order)))
                .await;
            Ok(json!({ "refunded": answer.option_id.as_deref() == Some("approve") }))
        }
        pub fn tool() -> WorkflowTool {
            define_workflow_tool("Refunds once approved.", workflow!(execute)).background()
        }
    }

    /// Default execution: a hook and two outstanding requests; returns after the first answer
    /// (or fails, with `fail`), leaving the second request and the hook to the run's end.
    pub mod two_asks {
        use super::*;
        #[derive(Deserialize, JsonSchema)]
        pub struct Input {
            pub token: String,
            #[serde(default)]
            pub fail: bool,
        }
        pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<Value, WorkflowError> {
            let _hook = ctx.create_hook::<Value>(input.token);
            let first = ctx.ask(approve_or_cancel("first?"));
            let _second = ctx.ask(InputRequest {
                prompt: "anything to add?".into(),
                display: Display::Text,
                options: vec![],
                allow_freeform: true,
                agent: None,
                approval: None,
            });
            let answer = first.await;
            if input.fail {
                return Err(WorkflowError::new("failed after the first answer"));
            }
            Ok(json!({ "first": option(&answer) }))
        }
        pub fn tool() -> WorkflowTool {
            define_workflow_tool("Asks two things.", workflow!(execute))
        }
    }

    /// Default execution: a step that stops early when the run is cancelled, then an ask —
    /// which a cancelled run in its grace period must not publish (no new waits in grace).
    pub mod step_then_ask {
        use super::*;
        #[derive(Deserialize, JsonSchema)]
        pub struct Input {}
        pub async fn execute(ctx: WorkflowCtx, _input: Input) -> Result<Value, WorkflowError> {
            let how: String = ctx
                .step("work", |s| async move {
                    Ok(if s.is_aborted() {
                        "stopped early"
                    } else {
                        "done"
                    }
                    .to_owned())
                })
                .await?;
            let answer = ctx.ask(approve_or_cancel("continue?")).await;
            Ok(json!({ "work": how, "answer": option(&answer) }))
        }
        pub fn tool() -> WorkflowTool {
            define_workflow_tool("Works, then asks.", workflow!(execute))
        }
    }

    /// Default execution: the body panics, which parks the run as blocked.
    pub mod panics {
        use super::*;
        #[derive(Deserialize, JsonSchema)]
        pub struct Input {}
        pub async fn execute(_ctx: WorkflowCtx, _input: Input) -> Result<Value, WorkflowError> {
            panic!("a bug in the body")
        }
        pub fn tool() -> WorkflowTool {
            define_workflow_tool("Panics.", workflow!(execute))
        }
    }

    /// Input of the return-rule tools.
    #[derive(Deserialize, JsonSchema)]
    pub struct ProgressInput {
        pub progress: Vec<Value>,
        pub output: Value,
    }

    /// Default execution: reports progress, returns `output` (a JSON value, `null` included).
    pub mod progress_default {
        use super::*;
        pub async fn execute(
            ctx: WorkflowCtx,
            input: ProgressInput,
        ) -> Result<Value, WorkflowError> {
            for p in &input.progress {
                ctx.progress(p);
            }
            Ok(input.output)
        }
        pub fn tool() -> WorkflowTool {
            define_workflow_tool("Reports progress.", workflow!(execute))
        }
    }

    /// Default execution: reports progress and returns nothing (`()`).
    pub mod progress_unit {
        use super::*;
        pub async fn execute(ctx: WorkflowCtx, input: ProgressInput) -> Result<(), WorkflowError> {
            for p in &input.progress {
                ctx.progress(p);
            }
            Ok(())
        }
        pub fn tool() -> WorkflowTool {
            define_workflow_tool("Reports progress, returns nothing.", workflow!(execute))
        }
    }

    /// Background: reports progress, posts one message, returns `output`.
    pub mod progress_background {
        use super::*;
        pub async fn execute(
            ctx: WorkflowCtx,
            task: TaskHandle,
            input: ProgressInput,
        ) -> Result<Value, WorkflowError> {
            for p in &input.progress {
                ctx.progress(p);
            }
            task.post_message(&json!({ "task": task.task_id().as_str() }));
            Ok(input.output)
        }
        pub fn tool() -> WorkflowTool {
            define_workflow_tool(
                "Reports progress in the background.",
                background_workflow!(execute),
            )
        }
    }

    /// A test's handle on the steps of one run of `three_steps`: what happened, in order, and
    /// permits that let steps finish.
    pub struct Gate {
        pub seen: Mutex<Option<mpsc::UnboundedReceiver<String>>>,
        tx: mpsc::UnboundedSender<String>,
        pub go: Semaphore,
    }

    static GATES: LazyLock<Mutex<HashMap<String, Arc<Gate>>>> = LazyLock::new(Default::default);

    /// The gate named `key` (made on first use).
    pub fn gate(key: &str) -> Arc<Gate> {
        GATES
            .lock()
            .unwrap()
            .entry(key.to_owned())
            .or_insert_with(|| {
                let (tx, rx) = mpsc::unbounded_channel();
                Arc::new(Gate {
                    seen: Mutex::new(Some(rx)),
                    tx,
                    go: Semaphore::new(0),
                })
            })
            .clone()
    }

    /// Three gated steps and a cleanup step run when the abort signal fired. Each gated step
    /// reports `start NAME`, then finishes when the test adds a permit, or fails fatally when
    /// the run's cancellation reaches it (reporting `aborted NAME`).
    pub mod three_steps {
        use super::*;
        #[derive(Deserialize, JsonSchema)]
        pub struct Input {
            pub gate: String,
            /// Gate the cleanup step too (to outlast the grace period).
            #[serde(default)]
            pub gate_cleanup: bool,
        }

        fn gated(
            ctx: &WorkflowCtx,
            key: &str,
            name: &'static str,
        ) -> eve_core::engine::StepFuture<String> {
            let key = key.to_owned();
            ctx.step(name, move |s| {
                let g = gate(&key);
                async move {
                    let _ = g.tx.send(format!("start {name}"));
                    tokio::select! {
                        permit = g.go.acquire() => {
                            permit.expect("gate open").forget();
                            let _ = g.tx.send(format!("done {name}"));
                            Ok(name.to_owned())
                        }
                        () = s.aborted() => {
                            let _ = g.tx.send(format!("aborted {name}"));
                            Err(StepError::fatal(format!("{name} aborted")))
                        }
                    }
                }
            })
        }

        pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<Value, WorkflowError> {
            let abort = ctx.abort_signal();
            let mut done = Vec::new();
            for name in ["one", "two", "three"] {
                if abort.is_aborted() {
                    break;
                }
                match gated(&ctx, &input.gate, name).await {
                    Ok(v) => done.push(v),
                    Err(_) => break,
                }
            }
            if abort.is_aborted() {
                if input.gate_cleanup {
                    // A cleanup that ignores the signal and waits for a permit that never
                    // comes: only the grace deadline ends the run.
                    let key = input.gate.clone();
                    ctx.step("cleanup", move |_| {
                        let g = gate(&key);
                        async move {
                            let _ = g.tx.send("start cleanup".to_owned());
                            g.go.acquire().await.expect("gate open").forget();
                            Ok(())
                        }
                    })
                    .await?;
                } else {
                    let key = input.gate.clone();
                    ctx.step("cleanup", move |_| {
                        let g = gate(&key);
                        async move {
                            let _ = g.tx.send("cleanup".to_owned());
                            Ok(())
                        }
                    })
                    .await?;
                }
            }
            Ok(json!({ "done": done }))
        }

        pub fn tool() -> WorkflowTool {
            define_workflow_tool("Three steps and a cleanup.", workflow!(execute))
        }
    }
}

fn registry() -> Arc<Registry> {
    Arc::new(
        Registry::new("sessions-v1")
            .with(tools::wait_hook::tool())
            .with(tools::watch::tool())
            .with(tools::remind::tool())
            .with(tools::approve::tool())
            .with(tools::refund::tool())
            .with(tools::two_asks::tool())
            .with(tools::progress_default::tool())
            .with(tools::progress_unit::tool())
            .with(tools::progress_background::tool())
            .with(tools::three_steps::tool())
            .with(tools::step_then_ask::tool())
            .with(tools::panics::tool()),
    )
}

/// A store under test and a second handle on the same storage (another process, as far as the
/// store can tell: a second connection pool on the same SQLite file; the same MemoryStore).
struct Env {
    store: Arc<dyn JournalStore>,
    second: Arc<dyn JournalStore>,
    clock: Arc<ManualClock>,
    registry: Arc<Registry>,
    _dir: Option<tempfile::TempDir>,
}

impl Env {
    async fn memory() -> Self {
        let store: Arc<dyn JournalStore> = Arc::new(MemoryStore::new());
        Self {
            second: store.clone(),
            store,
            clock: ManualClock::new(START),
            registry: registry(),
            _dir: None,
        }
    }

    async fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("eve.db");
        let store = SqliteStore::open(&path).await.expect("open sqlite");
        let second = SqliteStore::open(&path).await.expect("open sqlite again");
        Self {
            store: Arc::new(store),
            second: Arc::new(second),
            clock: ManualClock::new(START),
            registry: registry(),
            _dir: Some(dir),
        }
    }

    fn session_on(&self, store: &Arc<dyn JournalStore>, id: &str) -> Session {
        Session::new(
            store.clone(),
            self.registry.clone(),
            self.clock.clone(),
            SessionId::new(id),
        )
        .with_poll_interval(Duration::from_millis(2))
    }

    fn session(&self, id: &str) -> Session {
        self.session_on(&self.store, id)
    }

    async fn worker(&self) -> Worker {
        Worker::new(
            self.store.clone(),
            (*self.registry).clone(),
            self.clock.clone(),
            WorkerConfig {
                lease_ttl: Duration::from_secs(30),
                poll_interval: Duration::from_millis(2),
                store_retries: 0,
                ..WorkerConfig::default()
            },
        )
        .await
        .expect("register worker")
    }

    async fn journal(&self, run: &RunId) -> Vec<Event> {
        self.store
            .read_all(run, 0)
            .await
            .expect("read journal")
            .into_iter()
            .map(|e| e.event)
            .collect()
    }

    async fn status(&self, run: &RunId) -> RunStatus {
        self.store.get_run(run).await.expect("get run").status
    }
}

macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test]
                async fn memory() {
                    super::$name(super::Env::memory().await).await
                }
                #[tokio::test]
                async fn sqlite() {
                    super::$name(super::Env::sqlite().await).await
                }
            }
        )*
    };
}

on_both_stores!(
    background_receipt_and_task_index,
    default_call_parks_and_settles_once,
    waiting_on_an_own_call_lists_no_runs,
    settlement_wakes_waiters_without_polling,
    channel_is_persisted_and_followable_after_restart,
    queue_waits_and_steer_cancels_only_the_turn,
    steer_while_waiting_on_ask,
    session_end_cancels_two_background_tasks,
    ended_session_refuses_calls_from_any_handle,
    queued_messages_outlive_handles_and_arrive_in_order,
    background_failure_is_a_task_notification,
    answer_racing_a_steer_is_kept_or_withdrawn_never_both,
    task_cancel_rules,
    two_concurrent_answers_exactly_one_wins,
    answers_days_later_from_another_handle,
    answer_errors_are_typed,
    normal_end_withdraws_requests_and_disposes_hooks,
    failed_end_withdraws_requests_and_disposes_hooks,
    cancellation_before_the_first_step,
    cancellation_during_step_one,
    cancellation_during_step_two,
    cancellation_during_step_three,
    cancellation_after_the_body_ended,
    cleanup_outlasting_the_grace_period_is_cut_off,
    no_new_request_is_published_in_the_grace_period,
    return_rules_default_null_is_last_progress,
    return_rules_default_null_without_progress_is_null,
    return_rules_default_value_is_value,
    return_rules_default_unit_is_last_progress,
    return_rules_background_null_is_null,
    return_rules_background_value_is_value,
    try_next_turn_waits_for_parked_calls_and_collects_task_notices,
);

fn call(id: &str) -> CallId {
    CallId::new(id)
}

/// The messages of a [`TurnOutcome::Delivered`], panicking on any other outcome.
fn delivered(outcome: TurnOutcome) -> Vec<Value> {
    match outcome {
        TurnOutcome::Delivered { messages } => messages
            .iter()
            .map(|m| m.message.to_value::<Value>().unwrap())
            .collect(),
        other => panic!("the message should start a turn now: {other:?}"),
    }
}

fn events_of(log: &[SessionEntry], run: &RunId) -> Vec<SessionEvent> {
    log.iter()
        .filter(|e| &e.run_id == run)
        .map(|e| e.event.clone())
        .collect()
}

fn kinds(events: &[SessionEvent]) -> Vec<&'static str> {
    events
        .iter()
        .map(|e| match e {
            SessionEvent::InputRequested { .. } => "input.requested",
            SessionEvent::InputAnswered { .. } => "input.answered",
            SessionEvent::InputWithdrawn { .. } => "input.withdrawn",
            SessionEvent::ActionPartial { .. } => "action.partial",
            SessionEvent::TaskProgress { .. } => "task.progress",
            SessionEvent::TaskMessage { .. } => "task.message",
            SessionEvent::TaskCompleted { .. } => "task.completed",
            SessionEvent::TaskFailed { .. } => "task.failed",
            SessionEvent::TaskCancelled => "task.cancelled",
            SessionEvent::ToolSettled { .. } => "tool.settled",
            SessionEvent::AgentRequested { .. } => "agent.requested",
            SessionEvent::AgentCompleted { .. } => "agent.completed",
            SessionEvent::TaskDenied { .. } => "task.denied",
        })
        .collect()
}

async fn log(s: &Session) -> Vec<SessionEntry> {
    s.events(0, 10_000).await.expect("read session log")
}

fn completed(output: Value) -> ToolResult {
    ToolResult::Completed {
        output: Payload::from(output),
    }
}

fn parked(start: &ToolCallStart) -> RunId {
    match start {
        ToolCallStart::Parked { run_id } => run_id.clone(),
        other => panic!("expected a parked call, got {other:?}"),
    }
}

fn working(start: &ToolCallStart) -> RunId {
    match start {
        ToolCallStart::Working { task_id } => task_id.clone(),
        other => panic!("expected a background receipt, got {other:?}"),
    }
}

/// The requests of `two_asks`: the confirmation, then the free-text one.
fn two_requests(pending: &[eve_core::PendingRequest]) -> (RequestId, RequestId) {
    let by_prompt = |prompt: &str| {
        pending
            .iter()
            .find(|p| p.request.prompt == prompt)
            .unwrap_or_else(|| panic!("no pending request {prompt:?} in {pending:?}"))
            .request_id
            .clone()
    };
    (by_prompt("first?"), by_prompt("anything to add?"))
}

/// The one pending request of `run`.
async fn request_of(s: &Session, run: &RunId) -> RequestId {
    let pending: Vec<_> = s
        .pending_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|p| &p.run_id == run)
        .collect();
    assert_eq!(
        pending.len(),
        1,
        "one pending request of {run}: {pending:?}"
    );
    pending[0].request_id.clone()
}

// ---------------------------------------------------------------------------------------------
// Receipts, settlement, the channel
// ---------------------------------------------------------------------------------------------

async fn background_receipt_and_task_index(env: Env) {
    let s = env.session("s1");
    let start = s
        .call_tool("c1", "remind", json!({"note": "stretch", "delay": "1h"}))
        .await
        .unwrap();
    let task = working(&start);
    assert_eq!(
        serde_json::to_value(&start).unwrap(),
        json!({"status": "working", "taskId": task.as_str()}),
        "the seed's receipt, verbatim"
    );
    // One call, one result: the same call again returns the same receipt, starts nothing.
    assert_eq!(
        s.call_tool("c1", "remind", json!({"note": "stretch", "delay": "1h"}))
            .await
            .unwrap(),
        start
    );
    let p = s
        .call_tool("c2", "wait_hook", json!({"token": "bg-receipt-hook"}))
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_value(&p).unwrap(),
        json!({"status": "parked", "runId": parked(&p).as_str()})
    );
    let tasks = s.tasks().await.unwrap();
    assert_eq!(tasks.len(), 1, "only background runs are tasks: {tasks:?}");
    assert_eq!(tasks[0].task_id, task);
    assert_eq!(tasks[0].call_id, call("c1"));
    assert_eq!(tasks[0].tool, "remind");
    assert_eq!(tasks[0].status, RunStatus::Running);
    assert!(!tasks[0].cancel_requested);
    // A background call is never settled by a tool result.
    assert!(matches!(
        s.wait_settled(&call("c1")).await,
        Err(SessionError::BackgroundCall { task: t, .. }) if t == task
    ));
    assert!(matches!(
        s.wait_settled(&call("nope")).await,
        Err(SessionError::UnknownCall { .. })
    ));
    // Errors of the start come through typed.
    assert!(matches!(
        s.call_tool("c3", "no_such_tool", json!({})).await,
        Err(SessionError::Engine(EngineError::UnknownTool { .. }))
    ));
    assert!(matches!(
        s.call_tool("c3", "remind", json!({"note": 1})).await,
        Err(SessionError::Engine(EngineError::InvalidInput { .. }))
    ));
    // Another session sees neither task.
    assert!(env.session("s2").tasks().await.unwrap().is_empty());

    let w = env.worker().await;
    w.drain().await.unwrap();
    env.clock.advance(HOUR);
    w.drain().await.unwrap();
    let tasks = s.tasks().await.unwrap();
    assert_eq!(tasks[0].status, RunStatus::Completed);
    let events = events_of(&log(&s).await, &task);
    assert_eq!(
        events,
        vec![SessionEvent::TaskCompleted {
            output: Payload::from(json!({"reminder": "stretch"}))
        }]
    );
    assert!(events[0].requests_turn());
}

async fn default_call_parks_and_settles_once(env: Env) {
    let s = env.session("s1");
    let run = parked(
        &s.call_tool("c1", "wait_hook", json!({"token": "park-hook"}))
            .await
            .unwrap(),
    );
    let w = env.worker().await;
    assert_eq!(w.drain().await.unwrap()[0].1, ActivationEnd::Suspended);
    assert_eq!(s.settlement(&call("c1")).await.unwrap(), None, "parked");
    assert_eq!(
        s.user_message(TurnPolicy::Queue, json!("while parked"))
            .await
            .unwrap(),
        TurnOutcome::Queued {
            waiting_on: vec![call("c1")]
        }
    );
    // A waiter follows the persisted log; the run is worked meanwhile.
    let waiter = {
        let s = env.session("s1");
        tokio::spawn(async move { s.wait_settled(&call("c1")).await })
    };
    resume_hook(
        &*env.second,
        "park-hook",
        &json!({"ok": true}),
        None,
        env.clock.now(),
    )
    .await
    .unwrap();
    w.drain().await.unwrap();
    let result = tokio::time::timeout(GUARD, waiter)
        .await
        .expect("settled")
        .unwrap()
        .unwrap();
    assert_eq!(result, completed(json!({"ok": true})));
    assert_eq!(s.settlement(&call("c1")).await.unwrap(), Some(result));
    let settled: Vec<_> = events_of(&log(&s).await, &run)
        .into_iter()
        .filter(|e| matches!(e, SessionEvent::ToolSettled { .. }))
        .collect();
    assert_eq!(settled.len(), 1, "one call, one result");
    // The queued message waited in the store; the next turn gets it first, then this one.
    assert_eq!(
        delivered(
            s.user_message(TurnPolicy::Queue, json!("after"))
                .await
                .unwrap()
        ),
        [json!("while parked"), json!("after")]
    );
}

/// A handle waiting on a call it started itself reads the session log only: it knows how the
/// call executes without listing the session's runs (a listing per wait grows with the
/// session). A background call is still refused, and an unknown one. (Another handle, which
/// lists the runs, is `default_call_parks_and_settles_once`.)
async fn waiting_on_an_own_call_lists_no_runs(env: Env) {
    let counted = eve_core::testing::FaultyStore::new(env.store.clone());
    let s = env.session_on(&(counted.clone() as Arc<dyn JournalStore>), "own");
    parked(
        &s.call_tool("c1", "wait_hook", json!({"token": "own-hook"}))
            .await
            .unwrap(),
    );
    working(
        &s.call_tool("b1", "watch", json!({"token": "own-watch"}))
            .await
            .unwrap(),
    );
    let w = env.worker().await;
    w.drain().await.unwrap();
    let before = counted.call_log().len();
    let own = tokio::spawn(async move {
        let r = s.wait_settled(&call("c1")).await;
        (s, r)
    });
    resume_hook(&*env.store, "own-hook", &json!(7), None, env.clock.now())
        .await
        .unwrap();
    w.drain().await.unwrap();
    let (s, r) = tokio::time::timeout(GUARD, own)
        .await
        .expect("settled")
        .unwrap();
    assert_eq!(r.unwrap(), completed(json!(7)));
    let calls = counted.call_log()[before..].to_vec();
    assert!(calls.contains(&"read_session"), "{calls:?}");
    assert!(!calls.contains(&"list_runs"), "{calls:?}");
    assert!(matches!(
        s.wait_settled(&call("b1")).await,
        Err(SessionError::BackgroundCall { .. })
    ));
    assert!(matches!(
        s.wait_settled(&call("nope")).await,
        Err(SessionError::UnknownCall { .. })
    ));
}

/// Waiters sleep until the store says the session log grew: with an hour-long poll interval a
/// `wait_settled` and a `follow` still see the settlement as soon as the run ends (without
/// the store's wake-up both would wait an hour and time out here).
async fn settlement_wakes_waiters_without_polling(env: Env) {
    let hour = Duration::from_secs(3600);
    let s = env.session("wake").with_poll_interval(hour);
    parked(
        &s.call_tool("c1", "wait_hook", json!({"token": "wake-hook"}))
            .await
            .unwrap(),
    );
    let w = env.worker().await;
    assert_eq!(w.drain().await.unwrap()[0].1, ActivationEnd::Suspended);
    let from = log(&s).await.len() as u64;
    let waiter = {
        let s = env.session("wake").with_poll_interval(hour);
        tokio::spawn(async move { s.wait_settled(&call("c1")).await })
    };
    let mut follower = Box::pin(env.session("wake").with_poll_interval(hour).follow(from));
    // Let both reach their wait before anything happens.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished(), "nothing settled yet");
    resume_hook(
        &*env.store,
        "wake-hook",
        &json!({"ok": 1}),
        None,
        env.clock.now(),
    )
    .await
    .unwrap();
    w.drain().await.unwrap();
    let result = tokio::time::timeout(GUARD, waiter)
        .await
        .expect("the waiter was woken, not left to its hour-long poll")
        .unwrap()
        .unwrap();
    assert_eq!(result, completed(json!({"ok": 1})));
    let entry = tokio::time::timeout(GUARD, follower.next())
        .await
        .expect("the follower was woken")
        .expect("an entry")
        .unwrap();
    assert!(
        matches!(entry.event, SessionEvent::ToolSettled { .. }),
        "{entry:?}"
    );
}

async fn channel_is_persisted_and_followable_after_restart(env: Env) {
    let s = env.session("s1");
    let a = working(
        &s.call_tool(
            "c1",
            "progress_background",
            json!({"progress": [1, 2], "output": "a"}),
        )
        .await
        .unwrap(),
    );
    let w = env.worker().await;
    w.drain().await.unwrap();
    // First follower: reads what is there, then stops (its process "dies").
    let first: Vec<SessionEntry> =
        tokio::time::timeout(GUARD, s.follow(0).take(4).collect::<Vec<_>>())
            .await
            .expect("four entries")
            .into_iter()
            .map(Result::unwrap)
            .collect();
    assert_eq!(
        kinds(&first.iter().map(|e| e.event.clone()).collect::<Vec<_>>()),
        [
            "task.progress",
            "task.progress",
            "task.message",
            "task.completed"
        ]
    );
    assert!(first.iter().all(|e| e.run_id == a));
    assert_eq!(
        first.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    let resume_from = first.last().unwrap().seq + 1;

    // After a restart: a new handle on another store handle follows from where the first
    // stopped, and sees entries written after it started following.
    let restarted = env.session_on(&env.second, "s1");
    let mut follower = Box::pin(restarted.follow(resume_from));
    let b = working(
        &s.call_tool(
            "c2",
            "progress_background",
            json!({"progress": [3], "output": "b"}),
        )
        .await
        .unwrap(),
    );
    w.drain().await.unwrap();
    let mut next = Vec::new();
    for _ in 0..3 {
        let e = tokio::time::timeout(GUARD, follower.next())
            .await
            .expect("an entry")
            .expect("the stream goes on")
            .unwrap();
        next.push(e);
    }
    assert_eq!(next[0].seq, resume_from, "nothing missed, nothing twice");
    assert!(next.iter().all(|e| e.run_id == b));
    assert_eq!(
        kinds(&next.iter().map(|e| e.event.clone()).collect::<Vec<_>>()),
        ["task.progress", "task.message", "task.completed"]
    );
    // Classification: progress is stream-only; message and completion request a turn.
    assert_eq!(
        next.iter()
            .map(|e| e.event.requests_turn())
            .collect::<Vec<_>>(),
        [false, true, true]
    );
    assert!(matches!(
        &next[1].event,
        SessionEvent::TaskMessage { message } if message.to_value::<Value>().unwrap() == json!({"task": b.as_str()})
    ));
}

// ---------------------------------------------------------------------------------------------
// Turn policy, task index, end
// ---------------------------------------------------------------------------------------------

async fn queue_waits_and_steer_cancels_only_the_turn(env: Env) {
    let s = env.session("s1");
    assert_eq!(
        delivered(
            s.user_message(TurnPolicy::Steer, json!("first"))
                .await
                .unwrap()
        ),
        [json!("first")],
        "nothing parked: nothing cancelled, the message starts a turn"
    );
    let bg = working(
        &s.call_tool("bg", "watch", json!({"token": "steer-bg"}))
            .await
            .unwrap(),
    );
    let fg = parked(
        &s.call_tool("fg", "wait_hook", json!({"token": "steer-fg"}))
            .await
            .unwrap(),
    );
    let w = env.worker().await;
    w.drain().await.unwrap();
    assert_eq!(
        s.user_message(TurnPolicy::Queue, json!("a user message"))
            .await
            .unwrap(),
        TurnOutcome::Queued {
            waiting_on: vec![call("fg")]
        },
        "a background run does not hold the turn"
    );
    assert_eq!(
        s.user_message(TurnPolicy::Steer, json!("a user message"))
            .await
            .unwrap(),
        TurnOutcome::Steered {
            cancelled: vec![fg.clone()]
        }
    );
    w.drain().await.unwrap();
    // Parked on a hook, the body does not observe the signal; it is abandoned after the grace.
    env.clock.advance(PAST_GRACE);
    w.drain().await.unwrap();
    assert_eq!(env.status(&fg).await, RunStatus::Cancelled);
    assert_eq!(
        s.settlement(&call("fg")).await.unwrap(),
        Some(ToolResult::Cancelled)
    );
    assert!(
        matches!(
            resume_hook(&*env.store, "steer-fg", &json!(1), None, env.clock.now()).await,
            Err(EngineError::Store(StoreError::NotFound { .. }))
        ),
        "the cancelled run's hook is disposed"
    );
    // The background run survived the steered turn and still takes its callback.
    assert_eq!(env.status(&bg).await, RunStatus::Running);
    assert!(!s.tasks().await.unwrap()[0].cancel_requested);
    resume_hook(
        &*env.store,
        "steer-bg",
        &json!("late"),
        None,
        env.clock.now(),
    )
    .await
    .unwrap();
    w.drain().await.unwrap();
    assert_eq!(
        events_of(&log(&s).await, &bg),
        vec![SessionEvent::TaskCompleted {
            output: Payload::from(json!("late"))
        }]
    );
}

async fn steer_while_waiting_on_ask(env: Env) {
    let s = env.session("s1");
    let fg = parked(
        &s.call_tool("fg", "approve", json!({"what": "deploy"}))
            .await
            .unwrap(),
    );
    let refund = working(
        &s.call_tool("bg", "refund", json!({"order": "o-1"}))
            .await
            .unwrap(),
    );
    let reminder = working(
        &s.call_tool("bg2", "remind", json!({"note": "n", "delay": "1h"}))
            .await
            .unwrap(),
    );
    let w = env.worker().await;
    w.drain().await.unwrap();
    let fg_request = request_of(&s, &fg).await;
    let bg_request = request_of(&s, &refund).await;

    assert_eq!(
        s.user_message(TurnPolicy::Steer, json!("a user message"))
            .await
            .unwrap(),
        TurnOutcome::Steered {
            cancelled: vec![fg.clone()]
        }
    );
    w.drain().await.unwrap();
    // The cancel withdrew the turn's request at once (before the grace period ends)...
    assert!(matches!(
        s.answer(&fg_request, InputResponse::option("approve"))
            .await,
        Err(SessionError::Withdrawn { .. })
    ));
    assert!(
        events_of(&log(&s).await, &fg).contains(&SessionEvent::InputWithdrawn {
            request_id: fg_request.clone()
        })
    );
    // ... and the run ends cancelled when the grace period is over.
    env.clock.advance(PAST_GRACE);
    w.drain().await.unwrap();
    assert_eq!(env.status(&fg).await, RunStatus::Cancelled);
    assert_eq!(
        kinds(&events_of(&log(&s).await, &fg)),
        ["input.requested", "input.withdrawn", "tool.settled"]
    );
    assert_eq!(
        s.settlement(&call("fg")).await.unwrap(),
        Some(ToolResult::Cancelled)
    );
    // Background runs survived: the refund's request is still answerable...
    let pending = s.pending_requests().await.unwrap();
    assert_eq!(
        pending.iter().map(|p| &p.request_id).collect::<Vec<_>>(),
        [&bg_request]
    );
    s.answer(&bg_request, InputResponse::option("approve"))
        .await
        .unwrap();
    env.clock.advance(HOUR);
    w.drain().await.unwrap();
    // ... and both tasks completed normally.
    assert!(
        events_of(&log(&s).await, &refund).contains(&SessionEvent::TaskCompleted {
            output: Payload::from(json!({"refunded": true}))
        })
    );
    assert!(
        events_of(&log(&s).await, &reminder).contains(&SessionEvent::TaskCompleted {
            output: Payload::from(json!({"reminder": "n"}))
        })
    );
}

async fn session_end_cancels_two_background_tasks(env: Env) {
    let s = env.session("s1");
    let a = working(
        &s.call_tool("a", "remind", json!({"note": "a", "delay": "1h"}))
            .await
            .unwrap(),
    );
    let b = working(
        &s.call_tool("b", "refund", json!({"order": "o-2"}))
            .await
            .unwrap(),
    );
    let fg = parked(
        &s.call_tool("fg", "wait_hook", json!({"token": "end-fg"}))
            .await
            .unwrap(),
    );
    let other = env.session("s2");
    let c = working(
        &other
            .call_tool("c", "remind", json!({"note": "c", "delay": "1h"}))
            .await
            .unwrap(),
    );
    let w = env.worker().await;
    w.drain().await.unwrap();
    let b_request = request_of(&s, &b).await;

    let mut ended = s.end().await.unwrap();
    ended.sort();
    let mut expected = vec![a.clone(), b.clone(), fg.clone()];
    expected.sort();
    assert_eq!(
        ended, expected,
        "both tasks and the parked call, not the other session's task"
    );
    assert!(matches!(
        s.call_tool("d", "remind", json!({"note": "d", "delay": "1h"}))
            .await,
        Err(SessionError::Ended { .. })
    ));
    w.drain().await.unwrap();
    assert!(matches!(
        s.answer(&b_request, InputResponse::option("approve")).await,
        Err(SessionError::Withdrawn { .. })
    ));
    env.clock.advance(PAST_GRACE);
    w.drain().await.unwrap();
    let tasks = s.tasks().await.unwrap();
    assert_eq!(
        tasks.iter().map(|t| t.status).collect::<Vec<_>>(),
        [RunStatus::Cancelled, RunStatus::Cancelled]
    );
    assert_eq!(
        s.settlement(&call("fg")).await.unwrap(),
        Some(ToolResult::Cancelled)
    );
    let entries = log(&s).await;
    assert_eq!(kinds(&events_of(&entries, &a)), ["task.cancelled"]);
    assert_eq!(
        kinds(&events_of(&entries, &b)),
        ["input.requested", "input.withdrawn", "task.cancelled"]
    );
    assert!(entries
        .iter()
        .filter(|e| e.event == SessionEvent::TaskCancelled)
        .all(|e| e.event.requests_turn()));
    // Ending again writes nothing new and reports nothing left to cancel.
    assert_eq!(s.end().await.unwrap(), Vec::<RunId>::new());
    // The other session's task is untouched.
    env.clock.advance(HOUR);
    w.drain().await.unwrap();
    assert_eq!(env.status(&c).await, RunStatus::Completed);
}

/// The end is a record in the store: a handle opened afterwards (here on a second store
/// handle, as another process would) cannot start a call or queue a message; a retried start
/// of a call made before the end still gets its receipt.
async fn ended_session_refuses_calls_from_any_handle(env: Env) {
    let s = env.session("s1");
    let before = s
        .call_tool("a", "remind", json!({"note": "a", "delay": "1h"}))
        .await
        .unwrap();
    assert_eq!(s.end().await.unwrap(), vec![before.run_id().clone()]);
    let later = env.session_on(&env.second, "s1");
    assert!(matches!(
        later
            .call_tool("b", "remind", json!({"note": "b", "delay": "1h"}))
            .await,
        Err(SessionError::Ended { session }) if session.as_str() == "s1"
    ));
    assert!(matches!(
        later.user_message(TurnPolicy::Queue, json!("hello?")).await,
        Err(SessionError::Ended { .. })
    ));
    assert_eq!(
        later
            .call_tool("a", "remind", json!({"note": "a", "delay": "1h"}))
            .await
            .unwrap(),
        before,
        "a retry of a call started before the end is not a new call"
    );
    assert_eq!(
        later.record().await.unwrap().ended_at,
        Some(START),
        "the end is in the store"
    );
    assert_eq!(
        later.tasks().await.unwrap().len(),
        1,
        "no refused call left a run"
    );
    // Other sessions are untouched.
    env.session_on(&env.second, "s2")
        .call_tool("c", "remind", json!({"note": "c", "delay": "1h"}))
        .await
        .unwrap();
}

/// Queued user messages live in the store: queued through two handles while a call is parked,
/// they are still there for a third handle, which gets them in order, once, when the call
/// settles; nobody gets them twice.
async fn queued_messages_outlive_handles_and_arrive_in_order(env: Env) {
    let first = env.session("s1");
    parked(
        &first
            .call_tool("c1", "wait_hook", json!({"token": "queue-hook"}))
            .await
            .unwrap(),
    );
    let w = env.worker().await;
    w.drain().await.unwrap();
    assert!(matches!(
        first
            .user_message(TurnPolicy::Queue, json!("one"))
            .await
            .unwrap(),
        TurnOutcome::Queued { .. }
    ));
    let second = env.session_on(&env.second, "s1");
    assert!(matches!(
        second
            .user_message(TurnPolicy::Queue, json!({"text": "two"}))
            .await
            .unwrap(),
        TurnOutcome::Queued { .. }
    ));
    drop((first, second));
    let third = env.session_on(&env.second, "s1");
    let queued: Vec<Value> = third
        .record()
        .await
        .unwrap()
        .queued
        .iter()
        .map(|m| m.message.to_value::<Value>().unwrap())
        .collect();
    assert_eq!(queued, [json!("one"), json!({"text": "two"})]);
    let turn = tokio::spawn(async move { third.next_turn().await });
    resume_hook(
        &*env.store,
        "queue-hook",
        &json!({"ok": true}),
        None,
        env.clock.now(),
    )
    .await
    .unwrap();
    w.drain().await.unwrap();
    let messages = tokio::time::timeout(GUARD, turn)
        .await
        .expect("the turn starts once the call settled")
        .unwrap()
        .unwrap();
    assert_eq!(
        messages.iter().map(|m| m.seq).collect::<Vec<_>>(),
        [0, 1],
        "in the order they were queued"
    );
    assert_eq!(
        env.session("s1").next_turn().await.unwrap(),
        vec![],
        "each message is delivered once"
    );
}

async fn background_failure_is_a_task_notification(env: Env) {
    let s = env.session("s1");
    let task = working(
        &s.call_tool("t", "watch", json!({"token": "fail-bg"}))
            .await
            .unwrap(),
    );
    let w = env.worker().await;
    w.drain().await.unwrap();
    resume_hook(
        &*env.second,
        "fail-bg",
        &json!("fail"),
        None,
        env.clock.now(),
    )
    .await
    .unwrap();
    w.drain().await.unwrap();
    let events = events_of(&log(&s).await, &task);
    assert_eq!(
        events,
        [SessionEvent::TaskFailed {
            error: "told to fail".into()
        }]
    );
    assert!(events[0].requests_turn());
    assert_eq!(s.tasks().await.unwrap()[0].status, RunStatus::Failed);
    assert_eq!(
        s.settlement(&call("t")).await.unwrap(),
        None,
        "a task is never settled"
    );
}

/// A steer's cancel request withdraws the run's pending requests in the same append, so an
/// answer that arrives after it is refused as withdrawn (never accepted and then dropped), and
/// an answer that landed before it is kept.
async fn answer_racing_a_steer_is_kept_or_withdrawn_never_both(env: Env) {
    let s = env.session("s1");
    let run = parked(
        &s.call_tool("c", "approve", json!({"what": "z"}))
            .await
            .unwrap(),
    );
    let w = env.worker().await;
    w.drain().await.unwrap();
    let request = request_of(&s, &run).await;
    assert_eq!(
        s.user_message(TurnPolicy::Steer, json!("a user message"))
            .await
            .unwrap(),
        TurnOutcome::Steered {
            cancelled: vec![run.clone()]
        }
    );
    assert!(matches!(
        env.session_on(&env.second, "s1")
            .answer(&request, InputResponse::option("approve"))
            .await,
        Err(SessionError::Withdrawn { .. })
    ));
    w.drain().await.unwrap();
    env.clock.advance(PAST_GRACE);
    w.drain().await.unwrap();
    assert_eq!(env.status(&run).await, RunStatus::Cancelled);
    assert_eq!(
        kinds(&events_of(&log(&s).await, &run)),
        ["input.requested", "input.withdrawn", "tool.settled"]
    );
    assert_eq!(
        s.settlement(&call("c")).await.unwrap(),
        Some(ToolResult::Cancelled)
    );

    // Answered first: the answer is kept and the cancel withdraws nothing.
    let run = parked(
        &s.call_tool("c2", "approve", json!({"what": "y"}))
            .await
            .unwrap(),
    );
    w.drain().await.unwrap();
    let request = request_of(&s, &run).await;
    env.session_on(&env.second, "s1")
        .answer(&request, InputResponse::option("approve"))
        .await
        .expect("pending when answered");
    env.store
        .request_cancel(&run, "steer", env.clock.now())
        .await
        .unwrap();
    w.drain().await.unwrap();
    env.clock.advance(PAST_GRACE);
    w.drain().await.unwrap();
    let kinds = kinds(&events_of(&log(&s).await, &run));
    assert_eq!(&kinds[..2], ["input.requested", "input.answered"]);
    assert!(!kinds.contains(&"input.withdrawn"), "{kinds:?}");
}

async fn task_cancel_rules(env: Env) {
    let s = env.session("s1");
    let task = working(
        &s.call_tool("t", "watch", json!({"token": "cancel-me"}))
            .await
            .unwrap(),
    );
    let fg = parked(
        &s.call_tool("fg", "wait_hook", json!({"token": "not-a-task"}))
            .await
            .unwrap(),
    );
    let foreign = working(
        &env.session("s2")
            .call_tool("x", "watch", json!({"token": "foreign"}))
            .await
            .unwrap(),
    );
    let w = env.worker().await;
    w.drain().await.unwrap();
    for (id, why, want) in [
        (
            fg.clone(),
            "default-execution",
            NotATaskKind::DefaultExecution,
        ),
        (
            foreign.clone(),
            "another session",
            NotATaskKind::OtherSession,
        ),
        (
            RunId::new("run_unknown"),
            "no such run",
            NotATaskKind::Unknown,
        ),
    ] {
        match s.task_cancel(&id).await {
            Err(SessionError::NotATask {
                task, reason, kind, ..
            }) => {
                assert_eq!(task, id);
                assert_eq!(kind, want, "{id}");
                assert!(
                    reason.contains(why.split(' ').next().unwrap()),
                    "{reason} / {why}"
                );
            }
            other => panic!("task_cancel({id}) = {other:?}, expected NotATask ({why})"),
        }
    }
    assert!(matches!(
        s.task_cancel(&task).await.unwrap(),
        CancelOutcome::Requested { .. }
    ));
    assert_eq!(
        s.task_cancel(&task).await.unwrap(),
        CancelOutcome::AlreadyRequested
    );
    assert!(s.tasks().await.unwrap()[0].cancel_requested);
    w.drain().await.unwrap();
    env.clock.advance(PAST_GRACE);
    w.drain().await.unwrap();
    assert_eq!(kinds(&events_of(&log(&s).await, &task)), ["task.cancelled"]);
    assert_eq!(
        s.task_cancel(&task).await.unwrap(),
        CancelOutcome::AlreadyEnded {
            status: RunStatus::Cancelled
        },
        "cancelling an ended task is a no-op with a clear result"
    );
    assert_eq!(
        env.status(&fg).await,
        RunStatus::Running,
        "the turn is untouched"
    );
    assert_eq!(env.status(&foreign).await, RunStatus::Running);
}

// ---------------------------------------------------------------------------------------------
// Answers
// ---------------------------------------------------------------------------------------------

async fn two_concurrent_answers_exactly_one_wins(env: Env) {
    let s = env.session("s1");
    let run = parked(
        &s.call_tool("c", "approve", json!({"what": "x"}))
            .await
            .unwrap(),
    );
    env.worker().await.drain().await.unwrap();
    let request = request_of(&s, &run).await;
    // Two handles on the store (two processes sharing the SQLite file) answer at once.
    let one = env.session_on(&env.store, "s1");
    let two = env.session_on(&env.second, "s1");
    let (r1, r2) = tokio::join!(
        one.answer(&request, InputResponse::option("approve")),
        two.answer(&request, InputResponse::option("cancel")),
    );
    let winner = match (&r1, &r2) {
        (Ok(_), Err(SessionError::AlreadyAnswered { .. })) => "approve",
        (Err(SessionError::AlreadyAnswered { .. }), Ok(_)) => "cancel",
        other => panic!("exactly one answer must win: {other:?}"),
    };
    let answered: Vec<_> = env
        .journal(&run)
        .await
        .into_iter()
        .filter(|e| matches!(e, Event::InputAnswered { .. }))
        .collect();
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert!(
        !env.journal(&run)
            .await
            .iter()
            .any(|e| matches!(e, Event::CancelRequested { .. })),
        "a response never steers"
    );
    // The winner's identical retry is a duplicate success; the loser stays refused.
    let retry = one
        .answer(&request, InputResponse::option(winner))
        .await
        .unwrap();
    assert!(retry.duplicate);
    env.worker().await.drain().await.unwrap();
    assert_eq!(
        s.settlement(&call("c")).await.unwrap(),
        Some(completed(json!({"answer": winner})))
    );
}

async fn answers_days_later_from_another_handle(env: Env) {
    let s = env.session("s1");
    let run = parked(
        &s.call_tool("c", "approve", json!({"what": "y"}))
            .await
            .unwrap(),
    );
    env.worker().await.drain().await.unwrap();
    env.clock.advance(3 * DAY);
    // Another process, days later, with a fresh handle on another store handle.
    let later = env.session_on(&env.second, "s1");
    let pending = later.pending_requests().await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].run_id, run);
    assert_eq!(pending[0].requested_at, START);
    later
        .answer(&pending[0].request_id, InputResponse::option("approve"))
        .await
        .unwrap();
    env.worker().await.drain().await.unwrap();
    assert_eq!(
        later.settlement(&call("c")).await.unwrap(),
        Some(completed(json!({"answer": "approve"})))
    );
    assert_eq!(
        kinds(&events_of(&log(&s).await, &run)),
        ["input.requested", "input.answered", "tool.settled"]
    );
}

async fn answer_errors_are_typed(env: Env) {
    let s = env.session("s1");
    let run = parked(
        &s.call_tool("c", "two_asks", json!({"token": "typed-errors"}))
            .await
            .unwrap(),
    );
    env.worker().await.drain().await.unwrap();
    let pending = s.pending_requests().await.unwrap();
    assert_eq!(pending.len(), 2, "several requests may be outstanding");
    let (first, second) = two_requests(&pending);
    let (first, second) = (&first, &second);
    assert!(matches!(
        s.answer(first, InputResponse::option("maybe")).await,
        Err(SessionError::InvalidAnswer { reason, .. }) if reason.contains("not offered")
    ));
    assert!(matches!(
        s.answer(first, InputResponse::text("free text")).await,
        Err(SessionError::InvalidAnswer { .. })
    ));
    assert!(
        matches!(
            env.session("s2")
                .answer(first, InputResponse::option("approve"))
                .await,
            Err(SessionError::UnknownRequest { .. })
        ),
        "another session cannot answer it"
    );
    assert!(matches!(
        s.answer(&RequestId::new("nope"), InputResponse::option("approve"))
            .await,
        Err(SessionError::UnknownRequest { .. })
    ));
    // The freeform request takes text.
    s.answer(second, InputResponse::text("ship it"))
        .await
        .unwrap();
    assert!(matches!(
        s.answer(second, InputResponse::text("something else"))
            .await,
        Err(SessionError::AlreadyAnswered { .. })
    ));
    s.answer(first, InputResponse::option("approve"))
        .await
        .unwrap();
    env.worker().await.drain().await.unwrap();
    assert_eq!(env.status(&run).await, RunStatus::Completed);
}

async fn ends_withdraw_and_dispose(env: Env, fail: bool) {
    let s = env.session("s1");
    let token = if fail { "end-fail" } else { "end-ok" };
    let run = parked(
        &s.call_tool("c", "two_asks", json!({"token": token, "fail": fail}))
            .await
            .unwrap(),
    );
    let w = env.worker().await;
    w.drain().await.unwrap();
    let (first, second) = two_requests(&s.pending_requests().await.unwrap());
    s.answer(&first, InputResponse::option("cancel"))
        .await
        .unwrap();
    w.drain().await.unwrap();
    assert_eq!(
        env.status(&run).await,
        if fail {
            RunStatus::Failed
        } else {
            RunStatus::Completed
        }
    );
    assert!(s.pending_requests().await.unwrap().is_empty());
    assert!(matches!(
        s.answer(&second, InputResponse::text("too late")).await,
        Err(SessionError::Withdrawn { .. })
    ));
    assert!(
        matches!(
            resume_hook(&*env.store, token, &json!(1), None, env.clock.now()).await,
            Err(EngineError::Store(StoreError::NotFound { .. }))
        ),
        "the ended run's hook is disposed"
    );
    let events = events_of(&log(&s).await, &run);
    assert_eq!(
        kinds(&events),
        [
            "input.requested",
            "input.requested",
            "input.answered",
            "input.withdrawn",
            "tool.settled"
        ]
    );
    assert_eq!(
        events[3],
        SessionEvent::InputWithdrawn { request_id: second }
    );
    let expected = if fail {
        ToolResult::Failed {
            error: "failed after the first answer".into(),
        }
    } else {
        completed(json!({"first": "cancel"}))
    };
    assert_eq!(s.settlement(&call("c")).await.unwrap(), Some(expected));
}

async fn normal_end_withdraws_requests_and_disposes_hooks(env: Env) {
    ends_withdraw_and_dispose(env, false).await
}

async fn failed_end_withdraws_requests_and_disposes_hooks(env: Env) {
    ends_withdraw_and_dispose(env, true).await
}

// ---------------------------------------------------------------------------------------------
// Cancellation at each point of a 3-step body with a cleanup step
// ---------------------------------------------------------------------------------------------

/// Where the cancel arrives.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Point {
    BeforeFirstStep,
    During(usize),
    AfterEnd,
}

struct Gated {
    s: Session,
    run: RunId,
    gate: Arc<tools::Gate>,
    seen: tokio::sync::mpsc::UnboundedReceiver<String>,
    worker: Worker,
}

impl Gated {
    async fn start(env: &Env, key: &str, gate_cleanup: bool) -> Self {
        let s = env.session("s1");
        let gate = tools::gate(key);
        let seen = gate.seen.lock().unwrap().take().expect("a fresh gate");
        let run = parked(
            &s.call_tool(
                "c",
                "three_steps",
                json!({"gate": key, "gate_cleanup": gate_cleanup}),
            )
            .await
            .unwrap(),
        );
        Self {
            s,
            run,
            gate,
            seen,
            worker: env.worker().await,
        }
    }

    async fn expect(&mut self, what: &str) {
        let got = tokio::time::timeout(GUARD, self.seen.recv())
            .await
            .unwrap_or_else(|_| panic!("waiting for {what:?}"))
            .expect("gate open");
        assert_eq!(got, what);
    }
}

async fn cancel_at(env: Env, point: Point) {
    let key = format!("{}-{point:?}-{}", env.store.backend(), RunId::random());
    let mut g = Gated::start(&env, &key, false).await;
    if point == Point::BeforeFirstStep {
        assert!(matches!(
            env.store
                .request_cancel(&g.run, "test", env.clock.now())
                .await
                .unwrap(),
            CancelOutcome::Requested { .. }
        ));
    }
    let worker = g.worker.clone();
    let activation = tokio::spawn(async move { worker.run_once().await });
    let steps = ["one", "two", "three"];
    match point {
        Point::BeforeFirstStep => {}
        Point::During(n) => {
            for (i, name) in steps.iter().enumerate() {
                g.expect(&format!("start {name}")).await;
                if i == n {
                    break;
                }
                g.gate.go.add_permits(1);
                g.expect(&format!("done {name}")).await;
            }
            assert_eq!(
                g.s.user_message(TurnPolicy::Steer, json!("a user message"))
                    .await
                    .unwrap(),
                TurnOutcome::Steered {
                    cancelled: vec![g.run.clone()]
                }
            );
            // The running step observes the abort.
            g.expect(&format!("aborted {}", steps[n])).await;
        }
        Point::AfterEnd => {
            for name in steps {
                g.expect(&format!("start {name}")).await;
                g.gate.go.add_permits(1);
                g.expect(&format!("done {name}")).await;
            }
        }
    }
    let ends = tokio::time::timeout(GUARD, activation)
        .await
        .expect("the activation ends")
        .unwrap()
        .unwrap();
    assert_eq!(ends.len(), 1, "{ends:?}");
    let journal = env.journal(&g.run).await;
    let completed_steps: Vec<&str> = journal
        .iter()
        .filter_map(|e| match e {
            Event::StepCompleted { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    match point {
        Point::AfterEnd => {
            assert_eq!(completed_steps, ["one", "two", "three"]);
            assert_eq!(env.status(&g.run).await, RunStatus::Completed);
            assert_eq!(
                env.store
                    .request_cancel(&g.run, "late", env.clock.now())
                    .await
                    .unwrap(),
                CancelOutcome::AlreadyEnded {
                    status: RunStatus::Completed
                },
                "cancelling an ended run is a no-op with a clear result"
            );
            assert_eq!(
                delivered(
                    g.s.user_message(TurnPolicy::Steer, json!("late"))
                        .await
                        .unwrap()
                ),
                [json!("late")],
                "nothing is parked any more: nothing to cancel"
            );
            assert_eq!(
                g.s.settlement(&call("c")).await.unwrap(),
                Some(completed(json!({"done": ["one", "two", "three"]})))
            );
            assert!(!journal
                .iter()
                .any(|e| matches!(e, Event::CancelRequested { .. })));
        }
        Point::BeforeFirstStep | Point::During(_) => {
            let before = match point {
                Point::During(n) => n,
                _ => 0,
            };
            let mut expected: Vec<&str> = steps[..before].to_vec();
            expected.push("cleanup");
            assert_eq!(completed_steps, expected, "{journal:#?}");
            let mut rest = Vec::new();
            while let Ok(m) = g.seen.try_recv() {
                rest.push(m);
            }
            if point == Point::BeforeFirstStep {
                // The body may have started step one before it saw the signal; the step then
                // observes the abort at once.
                assert!(
                    rest == ["cleanup"] || rest == ["start one", "aborted one", "cleanup"],
                    "{rest:?}"
                );
            } else {
                assert_eq!(rest, ["cleanup"]);
            }
            assert_eq!(ends[0].1, ActivationEnd::Cancelled);
            assert_eq!(env.status(&g.run).await, RunStatus::Cancelled);
            assert_eq!(journal.last(), Some(&Event::RunCancelled));
            assert_eq!(
                g.s.settlement(&call("c")).await.unwrap(),
                Some(ToolResult::Cancelled)
            );
            assert_eq!(
                env.store
                    .request_cancel(&g.run, "again", env.clock.now())
                    .await
                    .unwrap(),
                CancelOutcome::AlreadyEnded {
                    status: RunStatus::Cancelled
                }
            );
        }
    }
}

async fn cancellation_before_the_first_step(env: Env) {
    cancel_at(env, Point::BeforeFirstStep).await
}

async fn cancellation_during_step_one(env: Env) {
    cancel_at(env, Point::During(0)).await
}

async fn cancellation_during_step_two(env: Env) {
    cancel_at(env, Point::During(1)).await
}

async fn cancellation_during_step_three(env: Env) {
    cancel_at(env, Point::During(2)).await
}

async fn cancellation_after_the_body_ended(env: Env) {
    cancel_at(env, Point::AfterEnd).await
}

async fn cleanup_outlasting_the_grace_period_is_cut_off(env: Env) {
    let key = format!("{}-grace-{}", env.store.backend(), RunId::random());
    let mut g = Gated::start(&env, &key, true).await;
    let worker = g.worker.clone();
    let activation = tokio::spawn(async move { worker.run_once().await });
    g.expect("start one").await;
    g.gate.go.add_permits(1);
    g.expect("done one").await;
    g.expect("start two").await;
    assert!(matches!(
        g.s.task_cancel(&g.run).await,
        Err(SessionError::NotATask { .. })
    ));
    g.s.user_message(TurnPolicy::Steer, json!("a user message"))
        .await
        .unwrap();
    g.expect("aborted two").await;
    // The cleanup step runs in the grace period, but never finishes.
    g.expect("start cleanup").await;
    env.clock.advance(PAST_GRACE);
    let ends = tokio::time::timeout(GUARD, activation)
        .await
        .expect("the grace deadline ends the activation")
        .unwrap()
        .unwrap();
    assert_eq!(ends[0].1, ActivationEnd::Cancelled);
    assert_eq!(env.status(&g.run).await, RunStatus::Cancelled);
    assert_eq!(
        g.s.settlement(&call("c")).await.unwrap(),
        Some(ToolResult::Cancelled)
    );
    let journal = env.journal(&g.run).await;
    assert!(
        !journal
            .iter()
            .any(|e| matches!(e, Event::StepCompleted { name, .. } if name == "cleanup")),
        "{journal:#?}"
    );
}

async fn no_new_request_is_published_in_the_grace_period(env: Env) {
    let s = env.session("s1");
    let run = parked(&s.call_tool("c", "step_then_ask", json!({})).await.unwrap());
    assert_eq!(
        s.user_message(TurnPolicy::Steer, json!("a user message"))
            .await
            .unwrap(),
        TurnOutcome::Steered {
            cancelled: vec![run.clone()]
        }
    );
    let w = env.worker().await;
    w.drain().await.unwrap();
    // The step ran in the grace period and saw the signal; the ask after it was not published.
    assert!(env.journal(&run).await.iter().any(|e| matches!(
        e,
        Event::StepCompleted { name, output, .. }
            if name == "work" && output.get() == r#""stopped early""#
    )));
    assert!(s.pending_requests().await.unwrap().is_empty());
    env.clock.advance(PAST_GRACE);
    w.drain().await.unwrap();
    assert_eq!(env.status(&run).await, RunStatus::Cancelled);
    assert_eq!(
        events_of(&log(&s).await, &run),
        [SessionEvent::ToolSettled {
            result: ToolResult::Cancelled
        }]
    );
}

/// A blocked default-execution call is part of the parked turn; steering must settle it too,
/// or the steering message never gets its turn. No worker claims a blocked run, so the cancel
/// request itself ends it, in the same append.
#[tokio::test]
async fn steer_settles_a_blocked_call() {
    let env = Env::memory().await;
    let s = env.session("s1");
    let run = parked(&s.call_tool("c", "panics", json!({})).await.unwrap());
    let w = env.worker().await;
    w.drain().await.unwrap();
    assert_eq!(env.status(&run).await, RunStatus::Blocked);
    assert_eq!(
        s.user_message(TurnPolicy::Queue, json!("a user message"))
            .await
            .unwrap(),
        TurnOutcome::Queued {
            waiting_on: vec![call("c")]
        }
    );
    assert_eq!(
        s.user_message(TurnPolicy::Steer, json!("a user message"))
            .await
            .unwrap(),
        TurnOutcome::Steered {
            cancelled: vec![run.clone()]
        }
    );
    assert_eq!(env.status(&run).await, RunStatus::Cancelled);
    assert_eq!(
        s.settlement(&call("c")).await.unwrap(),
        Some(ToolResult::Cancelled)
    );
    w.drain().await.unwrap();
    assert_eq!(env.status(&run).await, RunStatus::Cancelled);
}

// ---------------------------------------------------------------------------------------------
// The return-rule table, row by row
// ---------------------------------------------------------------------------------------------

/// Runs `tool` with `progress` and `output`; returns the session events of the run.
async fn run_progress(env: &Env, tool: &str, progress: Value, output: Value) -> Vec<SessionEvent> {
    let s = env.session("s1");
    let start = s
        .call_tool("c", tool, json!({"progress": progress, "output": output}))
        .await
        .unwrap();
    env.worker().await.drain().await.unwrap();
    assert_eq!(env.status(start.run_id()).await, RunStatus::Completed);
    events_of(&log(&s).await, start.run_id())
}

fn partials(events: &[SessionEvent]) -> Vec<Value> {
    events
        .iter()
        .filter_map(|e| match e {
            SessionEvent::ActionPartial { value } | SessionEvent::TaskProgress { value } => {
                Some(value.to_value().unwrap())
            }
            _ => None,
        })
        .collect()
}

async fn return_rules_default_null_is_last_progress(env: Env) {
    let events = run_progress(
        &env,
        "progress_default",
        json!([{"step": 1}, {"step": 2}]),
        Value::Null,
    )
    .await;
    assert_eq!(
        kinds(&events),
        ["action.partial", "action.partial", "tool.settled"]
    );
    assert_eq!(partials(&events), [json!({"step": 1}), json!({"step": 2})]);
    // The snapshot used as the final output enters history as the tool result; the snapshots
    // themselves stay stream-only.
    assert_eq!(
        events[2],
        SessionEvent::ToolSettled {
            result: completed(json!({"step": 2}))
        }
    );
    assert_eq!(
        events.iter().map(requests_turn).collect::<Vec<_>>(),
        [false, false, true]
    );
    // Last-write-wins per call id: a resumed channel re-sends only the latest snapshot.
    let compact = eve_core::engine::compact_partials(log(&env.session("s1")).await);
    assert_eq!(
        kinds(&compact.into_iter().map(|e| e.event).collect::<Vec<_>>()),
        ["action.partial", "tool.settled"]
    );
}

async fn return_rules_default_null_without_progress_is_null(env: Env) {
    let events = run_progress(&env, "progress_default", json!([]), Value::Null).await;
    assert_eq!(
        events,
        [SessionEvent::ToolSettled {
            result: completed(Value::Null)
        }]
    );
}

async fn return_rules_default_value_is_value(env: Env) {
    let events = run_progress(
        &env,
        "progress_default",
        json!([{"step": 1}]),
        json!({"deployed": true}),
    )
    .await;
    assert_eq!(partials(&events), [json!({"step": 1})]);
    assert_eq!(
        events.last().unwrap(),
        &SessionEvent::ToolSettled {
            result: completed(json!({"deployed": true}))
        }
    );
}

async fn return_rules_default_unit_is_last_progress(env: Env) {
    let events = run_progress(&env, "progress_unit", json!(["a", "b"]), Value::Null).await;
    assert_eq!(
        events.last().unwrap(),
        &SessionEvent::ToolSettled {
            result: completed(json!("b"))
        },
        "no return value: the last progress value"
    );
}

async fn return_rules_background_null_is_null(env: Env) {
    let events = run_progress(
        &env,
        "progress_background",
        json!([{"step": 1}]),
        Value::Null,
    )
    .await;
    assert_eq!(
        kinds(&events),
        ["task.progress", "task.message", "task.completed"]
    );
    assert_eq!(partials(&events), [json!({"step": 1})]);
    assert_eq!(
        events[2],
        SessionEvent::TaskCompleted {
            output: Payload::null()
        },
        "background: yielded progress is not the task output"
    );
    assert_eq!(
        events.iter().map(|e| e.requests_turn()).collect::<Vec<_>>(),
        [false, true, true]
    );
}

async fn return_rules_background_value_is_value(env: Env) {
    let events = run_progress(
        &env,
        "progress_background",
        json!([{"step": 1}]),
        json!({"reminder": "x"}),
    )
    .await;
    assert_eq!(
        events.last().unwrap(),
        &SessionEvent::TaskCompleted {
            output: Payload::from(json!({"reminder": "x"}))
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Classification (no store)
// ---------------------------------------------------------------------------------------------

#[test]
fn what_requests_a_turn() {
    let p = || Payload::from(json!(1));
    let r = RequestId::new("r");
    let turn = [
        SessionEvent::ToolSettled {
            result: ToolResult::Cancelled,
        },
        SessionEvent::TaskCompleted { output: p() },
        SessionEvent::TaskFailed { error: "e".into() },
        SessionEvent::TaskCancelled,
        SessionEvent::TaskMessage { message: p() },
    ];
    let stream = [
        SessionEvent::ActionPartial { value: p() },
        SessionEvent::TaskProgress { value: p() },
        SessionEvent::InputRequested {
            request_id: r.clone(),
            request: tools::approve_or_cancel("?"),
        },
        SessionEvent::InputAnswered {
            request_id: r.clone(),
            answered_by: Some("alice".into()),
        },
        SessionEvent::InputWithdrawn { request_id: r },
    ];
    assert!(turn
        .iter()
        .all(|e| e.requests_turn() && !e.is_stream_only()));
    assert!(stream
        .iter()
        .all(|e| !e.requests_turn() && e.is_stream_only()));
}

#[test]
fn a_resume_resends_only_the_latest_snapshot_per_call() {
    let entry = |seq: u64, call: &str, event: SessionEvent| SessionEntry {
        session_id: SessionId::new("s"),
        seq,
        at: START,
        run_id: RunId::new(format!("run-{call}")),
        call_id: CallId::new(call),
        event,
    };
    let partial = |v: i64| SessionEvent::ActionPartial {
        value: Payload::from(json!(v)),
    };
    let entries = vec![
        entry(0, "a", partial(1)),
        entry(1, "b", partial(10)),
        entry(2, "a", partial(2)),
        entry(
            3,
            "a",
            SessionEvent::InputRequested {
                request_id: RequestId::new("r"),
                request: tools::approve_or_cancel("?"),
            },
        ),
        entry(4, "a", partial(3)),
    ];
    let kept: Vec<u64> = eve_core::engine::compact_partials(entries)
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(
        kept,
        [1, 3, 4],
        "latest snapshot of each call, other entries kept"
    );
}

#[test]
fn receipts_and_outcomes_serialize_as_documented() {
    let run = RunId::new("run_1");
    assert_eq!(
        serde_json::to_value(ToolCallStart::Working {
            task_id: run.clone()
        })
        .unwrap(),
        json!({"status": "working", "taskId": "run_1"})
    );
    assert_eq!(
        serde_json::to_value(TurnOutcome::Queued {
            waiting_on: vec![call("c")]
        })
        .unwrap(),
        json!({"outcome": "queued", "waitingOn": ["c"]})
    );
    assert_eq!(
        serde_json::to_value(TurnPolicy::Steer).unwrap(),
        json!("steer")
    );
}

/// `try_next_turn`: no turn while a default-execution call is parked; then the queued messages
/// (taken once) and, from the cursor, the background tasks' turn-requesting notices, without
/// the parked call's own `tool.settled`; the cursor moves past them.
async fn try_next_turn_waits_for_parked_calls_and_collects_task_notices(env: Env) {
    let s = env.session("turns");
    assert_eq!(s.try_next_turn(Some(0)).await.unwrap(), None, "nothing yet");
    let fg = parked(
        &s.call_tool("fg", "wait_hook", json!({"token": "turn-fg"}))
            .await
            .unwrap(),
    );
    let bg = working(
        &s.call_tool("bg", "watch", json!({"token": "turn-bg"}))
            .await
            .unwrap(),
    );
    let w = env.worker().await;
    w.drain().await.unwrap();
    assert_eq!(
        s.user_message(TurnPolicy::Queue, json!("later"))
            .await
            .unwrap(),
        TurnOutcome::Queued {
            waiting_on: vec![call("fg")]
        }
    );
    resume_hook(
        &*env.store,
        "turn-bg",
        &json!("seen"),
        None,
        env.clock.now(),
    )
    .await
    .unwrap();
    w.drain().await.unwrap();
    assert_eq!(
        s.try_next_turn(Some(0)).await.unwrap(),
        None,
        "a parked call holds the turn, notices and messages alike"
    );
    resume_hook(
        &*env.store,
        "turn-fg",
        &json!("done"),
        None,
        env.clock.now(),
    )
    .await
    .unwrap();
    w.drain().await.unwrap();
    let turn = s.try_next_turn(Some(0)).await.unwrap().expect("a turn");
    let messages: Vec<Value> = turn
        .messages
        .iter()
        .map(|m| m.message.to_value::<Value>().unwrap())
        .collect();
    assert_eq!(messages, [json!("later")]);
    let notices: Vec<SessionEvent> = turn.notices.iter().map(|e| e.event.clone()).collect();
    assert_eq!(kinds(&notices), ["task.completed"], "{turn:?}");
    assert_eq!(turn.notices[0].run_id, bg);
    let all = log(&s).await;
    assert_eq!(turn.next_seq, Some(all.len() as u64));
    assert!(
        events_of(&all, &fg).contains(&SessionEvent::ToolSettled {
            result: completed(json!("done"))
        }),
        "the settlement is on the log, not in the turn"
    );
    assert_eq!(
        s.try_next_turn(turn.next_seq).await.unwrap(),
        None,
        "messages are taken once; the cursor is past the notices"
    );
    assert_eq!(
        s.try_next_turn(None).await.unwrap(),
        None,
        "without a cursor only messages make a turn"
    );
}
