#![allow(unreachable_pub)]
//! The engine's session operations on MemoryStore and SQLite: `ask` (answers, races against a
//! deadline, several outstanding, withdrawal on every end), `agent` (keys, idempotent starts
//! across a crash, output schemas), `progress` and `post_message` with the return rules,
//! cancellation with its grace period, and webhooks.

mod common;

use common::{completed_steps, Env};
use eve_core::engine::{
    define_workflow_tool, ActivationEnd, AgentCall, AgentError, Clock as _, Either, Registry,
    ScriptedAgentHost, StepError, TaskHandle, WorkflowCtx, WorkflowError, WorkflowTool, GRACE_CMD,
};
use eve_core::testing::{Fault, FaultyStore};
use eve_core::{
    background_workflow, workflow, CancelOutcome, Event, InputOption, InputRequest, InputResponse,
    JournalStore, RunStatus, SessionEvent, SessionId, StoreError, ToolResult, WebhookRequest,
    WebhookResponse,
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);

/// No input.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Empty {}

fn approval() -> InputRequest {
    InputRequest {
        prompt: "Deploy to production?".into(),
        display: eve_core::Display::Confirmation,
        options: vec![
            InputOption {
                id: "approve".into(),
                label: "Approve".into(),
                description: None,
                style: Some(eve_core::OptionStyle::Primary),
            },
            InputOption {
                id: "reject".into(),
                label: "Reject".into(),
                description: None,
                style: Some(eve_core::OptionStyle::Danger),
            },
        ],
        allow_freeform: false,
        agent: None,
        approval: None,
    }
}

async fn session_log(env: &Env) -> Vec<SessionEvent> {
    env.store
        .read_session(&SessionId::new("session-1"), 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event)
        .collect()
}

fn requested_ids(events: &[Event]) -> Vec<eve_core::RequestId> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::InputRequested { request_id, .. } => Some(request_id.clone()),
            _ => None,
        })
        .collect()
}

// ---- ask ---------------------------------------------------------------------------------

mod deploy {
    use super::*;

    pub async fn execute(ctx: WorkflowCtx, _: Empty) -> Result<String, WorkflowError> {
        let answer = ctx.ask(approval()).await;
        Ok(answer.option_id.unwrap_or_default())
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Deploy after approval.", workflow!(execute))
    }
}

async fn ask_is_answered_once_days_later(env: Env) {
    let reg = Registry::new("v1").with(deploy::tool());
    let run = env.start(&reg, "c1", "deploy", json!({})).await;
    let w = env.worker(&reg).await;
    assert_eq!(w.drain().await.unwrap()[0].1, ActivationEnd::Suspended);
    let pending = env
        .store
        .pending_requests(&SessionId::new("session-1"))
        .await
        .unwrap();
    assert_eq!(pending.len(), 1);
    let request = pending[0].request_id.clone();
    assert_eq!(request.as_str(), format!("{run}:0"));
    assert!(matches!(
        &session_log(&env).await[0],
        SessionEvent::InputRequested { request_id, request: r } if *request_id == request && *r == approval()
    ));

    env.clock.advance(72 * HOUR);
    let now = env.clock.now();
    // An option that is not offered is refused and changes nothing.
    let err = env
        .store
        .answer(&request, InputResponse::option("maybe"), now)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidAnswer { .. }), "{err}");
    // Free text is refused when the request does not allow it.
    let err = env
        .store
        .answer(&request, InputResponse::text("sure"), now)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidAnswer { .. }), "{err}");
    let first = env
        .store
        .answer(&request, InputResponse::option("approve"), now)
        .await
        .unwrap();
    assert!(!first.duplicate);
    // The same answer again is a duplicate success; another one is refused.
    let again = env
        .store
        .answer(&request, InputResponse::option("approve"), now)
        .await
        .unwrap();
    assert!(again.duplicate);
    let err = env
        .store
        .answer(&request, InputResponse::option("reject"), now)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::AlreadyAnswered { .. }), "{err}");

    w.drain().await.unwrap();
    assert_eq!(env.output(&run).await, json!("approve"));
    // After the run ended every answer is refused as withdrawn.
    let err = env
        .store
        .answer(&request, InputResponse::option("reject"), now)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Withdrawn { .. } | StoreError::AlreadyAnswered { .. }
        ),
        "{err}"
    );
    let log = session_log(&env).await;
    assert!(log.contains(&SessionEvent::InputAnswered {
        request_id: request.clone(),
        answered_by: None,
    }));
    assert!(matches!(
        log.last(),
        Some(SessionEvent::ToolSettled {
            result: ToolResult::Completed { .. }
        })
    ));
}

mod escalate {
    use super::*;

    /// Approve with a deadline: the ask races a 4 h sleep; on timeout a second request goes to
    /// an escalation contact, and the first stays answerable (awaited again).
    pub async fn execute(ctx: WorkflowCtx, _: Empty) -> Result<serde_json::Value, WorkflowError> {
        let pending = ctx.ask(approval());
        match ctx.race(pending.clone(), ctx.sleep("4h")).await {
            Either::Left(a) => Ok(json!({"by": "owner", "answer": a.option_id})),
            Either::Right(()) => {
                let mut req = approval();
                req.prompt = "Escalation: deploy to production?".into();
                let escalated = ctx.ask(req);
                match ctx.select(vec![pending, escalated]).await {
                    (0, a) => Ok(json!({"by": "owner-late", "answer": a.option_id})),
                    (_, a) => Ok(json!({"by": "escalation", "answer": a.option_id})),
                }
            }
        }
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Approve with a deadline.", workflow!(execute))
    }
}

async fn ask_races_a_deadline_and_escalates(env: Env) {
    let reg = Registry::new("v1").with(escalate::tool());
    let run = env.start(&reg, "c1", "escalate", json!({})).await;
    let w = env.worker(&reg).await;
    w.drain().await.unwrap();
    env.clock.advance(4 * HOUR);
    w.drain().await.unwrap();
    let events = env.events(&run).await;
    let ids = requested_ids(&events);
    assert_eq!(ids.len(), 2, "two requests outstanding: {events:#?}");
    // The escalation contact answers; the owner's request is withdrawn when the run ends.
    env.store
        .answer(&ids[1], InputResponse::option("approve"), env.clock.now())
        .await
        .unwrap();
    w.drain().await.unwrap();
    assert_eq!(
        env.output(&run).await,
        json!({"by": "escalation", "answer": "approve"})
    );
    let events = env.events(&run).await;
    assert!(events.contains(&Event::InputWithdrawn {
        request_id: ids[0].clone()
    }));
    assert!(session_log(&env)
        .await
        .contains(&SessionEvent::InputWithdrawn {
            request_id: ids[0].clone()
        }));
    let err = env
        .store
        .answer(&ids[0], InputResponse::option("approve"), env.clock.now())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Withdrawn { .. }), "{err}");
}

mod leftovers {
    use super::*;

    /// Leaves a request and a hook pending and returns once its first request is answered.
    pub async fn execute(ctx: WorkflowCtx, _: Empty) -> Result<(), WorkflowError> {
        let first = ctx.ask(approval());
        let _second = ctx.ask(InputRequest {
            prompt: "Anything else?".into(),
            display: eve_core::Display::Text,
            options: vec![],
            allow_freeform: true,
            agent: None,
            approval: None,
        });
        let _hook = ctx.create_hook::<serde_json::Value>(format!("left-{}", ctx.run_id()));
        first.await;
        Ok(())
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Leaves waits behind.", workflow!(execute))
    }
}

async fn ending_normally_withdraws_requests_and_disposes_hooks(env: Env) {
    let reg = Registry::new("v1").with(leftovers::tool());
    let run = env.start(&reg, "c1", "leftovers", json!({})).await;
    let w = env.worker(&reg).await;
    w.drain().await.unwrap();
    let ids = requested_ids(&env.events(&run).await);
    assert_eq!(ids.len(), 2);
    env.store
        .answer(&ids[0], InputResponse::option("approve"), env.clock.now())
        .await
        .unwrap();
    w.drain().await.unwrap();
    assert_eq!(env.status(&run).await, RunStatus::Completed);
    assert!(env.events(&run).await.contains(&Event::InputWithdrawn {
        request_id: ids[1].clone()
    }));
    assert!(env
        .store
        .pending_requests(&SessionId::new("session-1"))
        .await
        .unwrap()
        .is_empty());
    let err = env
        .store
        .deliver_hook(
            &format!("left-{run}"),
            eve_core::Payload::null(),
            None,
            env.clock.now(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
}

// ---- agent -------------------------------------------------------------------------------

mod research {
    use super::*;

    pub async fn execute(ctx: WorkflowCtx, _: Empty) -> Result<serde_json::Value, WorkflowError> {
        // Invalid keys are refused at the call, the same way on every replay.
        let empty = ctx.agent(AgentCall::new("", "researcher", json!("x")));
        assert!(matches!(empty, Err(AgentError::InvalidKey { .. })));
        let a = ctx
            .agent(
                AgentCall::new("facts", "researcher", json!("find facts"))
                    .schema(json!({"type": "object", "required": ["facts"]})),
            )
            .map_err(|e| WorkflowError::new(e.to_string()))?;
        let dup = ctx.agent(AgentCall::new("facts", "researcher", json!("again")));
        assert!(matches!(dup, Err(AgentError::InvalidKey { .. })));
        let bad = ctx
            .agent(
                AgentCall::new("sloppy", "sloppy", json!("?"))
                    .schema(json!({"type": "object", "required": ["facts"]})),
            )
            .map_err(|e| WorkflowError::new(e.to_string()))?;
        let facts = a.await.map_err(|e| WorkflowError::new(e.to_string()))?;
        let sloppy = match bad.await {
            Err(AgentError::SchemaMismatch { errors, .. }) => errors,
            other => {
                return Err(WorkflowError::new(format!(
                    "expected a schema error: {other:?}"
                )))
            }
        };
        Ok(json!({"facts": facts, "sloppy": !sloppy.is_empty()}))
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Delegates research.", workflow!(execute))
    }
}

async fn agent_calls_start_once_and_validate_outputs(env: Env) {
    let faulty = FaultyStore::new(env.store.clone());
    let host = ScriptedAgentHost::new(env.store.clone())
        .with_clock(env.clock.clone())
        .reply("sloppy", |_| Ok(json!("not an object")));
    let reg = Registry::new("v1")
        .with(research::tool())
        .with_agent_host(Arc::new(host.clone()));
    let run = env.start(&reg, "c1", "research", json!({})).await;
    // The first activation records the intent, asks the host to start both children (the
    // researcher works on; the sloppy one replies at once), and then crashes before it records
    // the start acknowledgements.
    let w = env
        .worker_on(faulty.clone() as Arc<dyn JournalStore>, &reg)
        .await;
    // claim, two reads of the journal, the append of the intent; the next call (the append
    // of the start acknowledgements) fails as if the process died.
    faulty.set_fault(Fault::CrashAfter(4));
    let _ = w.run_once().await;
    let log = faulty.call_log();
    faulty.heal();
    env.clock.advance(common::LEASE * 2);
    let w2 = env.worker(&reg).await;
    w2.drain().await.unwrap();
    assert_eq!(env.status(&run).await, RunStatus::Running);
    host.finish(
        &run,
        "facts",
        Ok(json!({"facts": ["find facts"]})),
        env.clock.now(),
    )
    .await
    .unwrap();
    // A report retried by the host is a duplicate, not a second result.
    let again = host
        .finish(
            &run,
            "facts",
            Ok(json!({"facts": ["find facts"]})),
            env.clock.now(),
        )
        .await
        .unwrap();
    assert!(again.duplicate);
    w2.drain().await.unwrap();
    assert_eq!(
        env.output(&run).await,
        json!({"facts": {"facts": ["find facts"]}, "sloppy": true})
    );
    let (child, asked) = host.starts(&run, "facts").expect("started");
    assert_eq!(child, format!("agent-{run}-facts"));
    assert_eq!(asked, 2, "asked again after the crash; store calls {log:?}");
    // Whatever number of times the host was asked, one child exists per key and its result
    // was recorded once.
    let events = env.events(&run).await;
    let results = events
        .iter()
        .filter(|e| matches!(e, Event::HookReceived { .. }))
        .count();
    assert_eq!(results, 2, "{events:#?}");
}

// ---- progress, post_message, return rules -------------------------------------------------

mod rules {
    use super::*;

    #[derive(Deserialize, JsonSchema)]
    pub struct Input {
        pub progress: Vec<serde_json::Value>,
        pub output: serde_json::Value,
    }

    pub async fn execute(
        ctx: WorkflowCtx,
        input: Input,
    ) -> Result<serde_json::Value, WorkflowError> {
        for p in &input.progress {
            ctx.progress(p);
            ctx.sleep("1s").await;
        }
        Ok(input.output)
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Return rules.", workflow!(execute))
    }

    pub async fn background(
        ctx: WorkflowCtx,
        task: TaskHandle,
        input: Input,
    ) -> Result<serde_json::Value, WorkflowError> {
        for p in &input.progress {
            ctx.progress(p);
            task.post_message(&json!({"note": p}));
            ctx.sleep("1s").await;
        }
        Ok(input.output)
    }

    pub fn background_tool() -> WorkflowTool {
        define_workflow_tool(
            "Return rules in the background.",
            background_workflow!(background),
        )
        .named("rules_bg")
    }
}

async fn return_rules_row_by_row(env: Env) {
    let reg = Registry::new("v1")
        .with(rules::tool())
        .with(rules::background_tool());
    let w = env.worker(&reg).await;
    // (tool, progress, returned, settled output)
    let rows = [
        ("rules", json!([1, 2]), json!(null), json!(2)),
        ("rules", json!([]), json!(null), json!(null)),
        ("rules", json!([1]), json!("done"), json!("done")),
        ("rules_bg", json!([1, 2]), json!(null), json!(null)),
        ("rules_bg", json!([1]), json!({"x": 1}), json!({"x": 1})),
    ];
    for (i, (tool, progress, returned, settled)) in rows.into_iter().enumerate() {
        let run = env
            .start(
                &reg,
                &format!("row{i}"),
                tool,
                json!({"progress": progress, "output": returned}),
            )
            .await;
        for _ in 0..4 {
            w.drain().await.unwrap();
            env.clock.advance(Duration::from_secs(1));
        }
        assert_eq!(env.output(&run).await, settled, "row {i}: {tool}");
    }
    let log = session_log(&env).await;
    let partials = log
        .iter()
        .filter(|e| matches!(e, SessionEvent::ActionPartial { .. }))
        .count();
    let task_progress = log
        .iter()
        .filter(|e| matches!(e, SessionEvent::TaskProgress { .. }))
        .count();
    let messages = log
        .iter()
        .filter(|e| matches!(e, SessionEvent::TaskMessage { .. }))
        .count();
    assert_eq!((partials, task_progress, messages), (3, 3, 3), "{log:#?}");
    assert!(log.contains(&SessionEvent::ToolSettled {
        result: ToolResult::Completed {
            output: eve_core::Payload::from_json("2").unwrap()
        }
    }));
    assert!(log.contains(&SessionEvent::TaskCompleted {
        output: eve_core::Payload::null()
    }));
}

async fn post_message_is_sent_once_across_replays(env: Env) {
    let reg = Registry::new("v1").with(rules::background_tool());
    let run = env
        .start(
            &reg,
            "c1",
            "rules_bg",
            json!({"progress": ["a", "b"], "output": null}),
        )
        .await;
    // Each activation is a fresh worker: every wake-up replays the body from the journal.
    for _ in 0..3 {
        env.worker(&reg).await.drain().await.unwrap();
        env.clock.advance(Duration::from_secs(1));
    }
    assert_eq!(env.status(&run).await, RunStatus::Completed);
    let messages: Vec<_> = session_log(&env)
        .await
        .into_iter()
        .filter_map(|e| match e {
            SessionEvent::TaskMessage { message } => {
                Some(message.to_value::<serde_json::Value>().unwrap())
            }
            _ => None,
        })
        .collect();
    assert_eq!(messages, vec![json!({"note": "a"}), json!({"note": "b"})]);
}

// ---- cancellation -------------------------------------------------------------------------

mod render {
    use super::*;
    use std::sync::Mutex;

    /// What the test sees of the steps: how often each ran.
    #[derive(Default, Debug)]
    pub struct Seen {
        pub ran: Mutex<Vec<String>>,
    }

    pub fn tool(seen: Arc<Seen>, cleanup_hangs: bool) -> WorkflowTool {
        let body = move |ctx: WorkflowCtx, _: Empty| {
            let seen = seen.clone();
            async move {
                let s1 = seen.clone();
                ctx.step("submit", move |_| {
                    s1.ran.lock().unwrap().push("submit".into());
                    async { Ok("job-1".to_owned()) }
                })
                .await?;
                let s2 = seen.clone();
                let render = ctx.step("render", move |sc| {
                    s2.ran.lock().unwrap().push("render".into());
                    async move {
                        // Long work that stops when the run is cancelled.
                        sc.aborted().await;
                        Err::<String, _>(StepError::fatal("render aborted"))
                    }
                });
                match render.await {
                    Ok(url) => Ok(url),
                    Err(e) => {
                        if ctx.abort_signal().is_aborted() {
                            let s3 = seen.clone();
                            ctx.step("abort_render", move |_| {
                                s3.ran.lock().unwrap().push("abort_render".into());
                                async move {
                                    if cleanup_hangs {
                                        std::future::pending::<()>().await;
                                    }
                                    Ok(())
                                }
                            })
                            .await?;
                        }
                        Err(e.into())
                    }
                }
            }
        };
        define_workflow_tool(
            "Render with cleanup.",
            eve_core::engine::Workflow::__new("tests::render", "execute", body),
        )
        .named("render")
        .grace(Duration::from_secs(30))
    }
}

async fn cancel_runs_the_cleanup_step_in_grace(env: Env) {
    let seen = Arc::new(render::Seen::default());
    let reg = Registry::new("v1").with(render::tool(seen.clone(), false));
    let run = env.start(&reg, "c1", "render", json!({})).await;
    let w = env.worker(&reg).await;
    let task = tokio::spawn(async move { w.run_once().await });
    // Wait until the render step runs, then cancel from "another process".
    while !seen.ran.lock().unwrap().contains(&"render".to_owned()) {
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let out = env
        .store
        .request_cancel(&run, "the user steered", env.clock.now())
        .await
        .unwrap();
    assert!(matches!(out, CancelOutcome::Requested { .. }));
    let ends = task.await.unwrap().unwrap();
    assert_eq!(ends[0].1, ActivationEnd::Cancelled);
    assert_eq!(env.status(&run).await, RunStatus::Cancelled);
    let events = env.events(&run).await;
    assert_eq!(completed_steps(&events), vec!["submit", "abort_render"]);
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::SleepScheduled { cmd, .. } if *cmd == GRACE_CMD)));
    assert!(matches!(
        session_log(&env).await.last(),
        Some(SessionEvent::ToolSettled {
            result: ToolResult::Cancelled
        })
    ));
    // Cancelling an ended run is a no-op that says so.
    let again = env
        .store
        .request_cancel(&run, "again", env.clock.now())
        .await
        .unwrap();
    assert_eq!(
        again,
        CancelOutcome::AlreadyEnded {
            status: RunStatus::Cancelled
        }
    );
}

async fn grace_period_ends_a_hanging_cleanup(env: Env) {
    let seen = Arc::new(render::Seen::default());
    let reg = Registry::new("v1").with(render::tool(seen.clone(), true));
    let run = env.start(&reg, "c1", "render", json!({})).await;
    let w = env.worker(&reg).await;
    let task = tokio::spawn(async move { w.run_once().await });
    while !seen.ran.lock().unwrap().contains(&"render".to_owned()) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    env.store
        .request_cancel(&run, "stop", env.clock.now())
        .await
        .unwrap();
    while !seen
        .ran
        .lock()
        .unwrap()
        .contains(&"abort_render".to_owned())
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The cleanup hangs; the simulated clock reaches the deadline.
    env.clock.advance(Duration::from_secs(30));
    let ends = task.await.unwrap().unwrap();
    assert_eq!(ends[0].1, ActivationEnd::Cancelled);
    let events = env.events(&run).await;
    assert_eq!(completed_steps(&events), vec!["submit"]);
    assert_eq!(events.last(), Some(&Event::RunCancelled));
}

mod parked {
    use super::*;

    pub async fn execute(ctx: WorkflowCtx, _: Empty) -> Result<(), WorkflowError> {
        let _question = ctx.ask(approval());
        ctx.sleep("1d").await;
        ctx.step("never", |_| async { Ok(()) }).await?;
        Ok(())
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Parks on a sleep.", workflow!(execute))
    }
}

async fn cancel_abandons_a_parked_body_and_withdraws_its_requests(env: Env) {
    let reg = Registry::new("v1").with(parked::tool());
    let run = env.start(&reg, "c1", "parked", json!({})).await;
    let w = env.worker(&reg).await;
    w.drain().await.unwrap();
    let ids = requested_ids(&env.events(&run).await);
    env.store
        .request_cancel(&run, "steer", env.clock.now())
        .await
        .unwrap();
    let ends = w.drain().await.unwrap();
    assert_eq!(ends[0].1, ActivationEnd::Cancelled);
    let events = env.events(&run).await;
    assert!(events.contains(&Event::InputWithdrawn {
        request_id: ids[0].clone()
    }));
    assert!(completed_steps(&events).is_empty());
    // The sleep's timer was dropped: nothing wakes the run again.
    env.clock.advance(48 * HOUR);
    assert!(w.drain().await.unwrap().is_empty());
    let err = env
        .store
        .answer(&ids[0], InputResponse::option("approve"), env.clock.now())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Withdrawn { .. }), "{err}");
}

// ---- webhooks -----------------------------------------------------------------------------

mod callback {
    use super::*;

    pub async fn execute(ctx: WorkflowCtx, _: Empty) -> Result<serde_json::Value, WorkflowError> {
        let hook =
            ctx.create_webhook_with::<WebhookRequest>(WebhookResponse::json(json!({"ok": true})));
        let path = hook.path();
        ctx.step("submit", move |_| {
            let path = path.clone();
            async move { Ok(path) }
        })
        .await?;
        let req = hook.next().await?;
        Ok(json!({"path": hook.path(), "body": req.body}))
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Waits for a webhook.", workflow!(execute))
    }
}

async fn webhook_tokens_are_random_and_read_back_on_replay(env: Env) {
    let reg = Registry::new("v1").with(callback::tool());
    let a = env.start(&reg, "c1", "callback", json!({})).await;
    let b = env.start(&reg, "c2", "callback", json!({})).await;
    env.worker(&reg).await.drain().await.unwrap();
    let token = |events: Vec<Event>| {
        events
            .into_iter()
            .find_map(|e| match e {
                Event::HookCreated {
                    token,
                    webhook: true,
                    respond_with,
                    ..
                } => Some((token, respond_with)),
                _ => None,
            })
            .expect("a webhook")
    };
    let (ta, respond) = token(env.events(&a).await);
    let (tb, _) = token(env.events(&b).await);
    assert_ne!(ta, tb);
    assert!(ta.len() >= 32, "at least 128 random bits: {ta}");
    assert_eq!(respond, Some(WebhookResponse::json(json!({"ok": true}))));
    let payload = WebhookRequest {
        method: "POST".into(),
        headers: Default::default(),
        body: json!({"url": "https://cdn/x.mp4"}),
    };
    env.store
        .deliver_hook(
            &ta,
            eve_core::Payload::from_value(&payload).unwrap(),
            Some("delivery-1"),
            env.clock.now(),
        )
        .await
        .unwrap();
    // A fresh worker replays the body from the journal: the token it sees is the recorded one.
    env.worker(&reg).await.drain().await.unwrap();
    assert_eq!(
        env.output(&a).await,
        json!({"path": format!("/.well-known/workflow/v1/webhook/{ta}"), "body": {"url": "https://cdn/x.mp4"}})
    );
    let submitted = env.events(&a).await.into_iter().find_map(|e| match e {
        Event::StepCompleted { output, .. } => Some(output.to_value::<String>().unwrap()),
        _ => None,
    });
    assert_eq!(
        submitted,
        Some(format!("/.well-known/workflow/v1/webhook/{ta}"))
    );
}

on_both_stores!(
    ask_is_answered_once_days_later,
    ask_races_a_deadline_and_escalates,
    ending_normally_withdraws_requests_and_disposes_hooks,
    agent_calls_start_once_and_validate_outputs,
    return_rules_row_by_row,
    post_message_is_sent_once_across_replays,
    cancel_runs_the_cleanup_step_in_grace,
    grace_period_ends_a_hanging_cleanup,
    cancel_abandons_a_parked_body_and_withdraws_its_requests,
    webhook_tokens_are_random_and_read_back_on_replay,
);
