#![allow(unreachable_pub)]
//! The seed's workflow tool examples with hooks standing in for `ask`: remind me later (sleep),
//! wait for an external system to call back (render), approve with a deadline and an
//! escalation; plus tool definitions, input validation, idempotent starts, several payloads on
//! one hook, deployments and missing workflows.

mod common;

use common::{completed_steps, Env};
use eve_core::engine::{
    define_tool, define_workflow_tool, resume_hook, start_tool_call, ActivationEnd, Either,
    EngineError, Registry, StepError, ToolCtx, WorkflowCtx, WorkflowError, WorkflowTool,
    CODE_MISSING_WORKFLOW,
};
use eve_core::{
    workflow, CallId, Event, Execution, JournalStore, JournalStoreExt, RunQuery, RunStatus,
    SessionEvent, SessionId, StoreError, Timestamp,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);

mod remind {
    use super::*;

    #[derive(Deserialize, JsonSchema)]
    pub struct Input {
        pub note: String,
        pub delay: String,
    }

    #[derive(Serialize, Deserialize)]
    pub struct Output {
        pub reminder: String,
    }

    pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<Output, WorkflowError> {
        ctx.sleep(&input.delay).await;
        Ok(Output {
            reminder: input.note,
        })
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool(
            "Remind the user about something after a delay.",
            workflow!(execute),
        )
        .background()
    }
}

async fn remind_me_later(env: Env) {
    let reg = Registry::new("v1").with(remind::tool());
    let tool = reg
        .by_name("remind")
        .expect("tool name from the module path");
    assert_eq!(tool.workflow_id().as_str(), "remind::execute");
    assert_eq!(tool.execution(), Execution::Background);
    assert_eq!(
        tool.input_schema()["required"],
        serde_json::json!(["note", "delay"])
    );
    let t0 = env.clock.now_ts();
    let run = env
        .start(
            &reg,
            "r",
            "remind",
            serde_json::json!({"note": "stretch", "delay": "4h"}),
        )
        .await;
    let w = env.worker(&reg).await;
    assert_eq!(w.drain().await.unwrap()[0].1, ActivationEnd::Suspended);
    assert!(env.events(&run).await.contains(&Event::SleepScheduled {
        cmd: 0,
        wake_at: t0.plus(4 * HOUR)
    }));
    env.clock.advance(4 * HOUR - Duration::from_millis(1));
    assert!(w.drain().await.unwrap().is_empty(), "not due yet");
    env.clock.advance(Duration::from_millis(1));
    w.drain().await.unwrap();
    assert_eq!(
        env.output(&run).await,
        serde_json::json!({"reminder": "stretch"})
    );
    // A background run ends with a task notification on its session.
    let log = env
        .store
        .read_session(&SessionId::new("session-1"), 0, 100)
        .await
        .unwrap();
    assert!(log
        .iter()
        .any(|e| matches!(&e.event, SessionEvent::TaskCompleted { .. })));
}

mod render_video {
    use super::*;

    #[derive(Deserialize, JsonSchema)]
    pub struct Input {
        pub project_id: String,
    }

    #[derive(Deserialize)]
    struct Callback {
        status: String,
        url: Option<String>,
    }

    pub async fn execute(
        ctx: WorkflowCtx,
        input: Input,
    ) -> Result<serde_json::Value, WorkflowError> {
        let done = ctx.create_hook::<Callback>(format!("render-{}", input.project_id));
        let project = input.project_id.clone();
        let job_id: String = ctx
            .step("submit_render", move |s| {
                let project = project.clone();
                // The render farm dedupes on the step's idempotency key.
                async move { Ok(format!("job-{project}-{}", s.idempotency_key().len())) }
            })
            .await?;
        let callback = done.next().await?;
        if callback.status != "ok" {
            let status = callback.status;
            ctx.step("report", move |_| {
                let m = format!("Render {} failed: {status}", "farm");
                async move { Err::<(), _>(StepError::fatal(m)) }
            })
            .await?;
        }
        Ok(serde_json::json!({ "url": callback.url, "job": job_id }))
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool(
            "Render a video. Returns the URL once the render farm finishes.",
            workflow!(execute),
        )
    }
}

async fn wait_for_a_callback(env: Env) {
    let reg = Registry::new("v1").with(render_video::tool());
    let w = env.worker(&reg).await;
    let now = env.clock.now_ts();
    // Unknown token: NotFound, nothing written.
    assert!(matches!(
        resume_hook(&*env.store, "render-p1", &serde_json::json!({}), None, now).await,
        Err(EngineError::Store(StoreError::NotFound { .. }))
    ));
    let run = env
        .start(
            &reg,
            "r1",
            "render_video",
            serde_json::json!({"project_id": "p1"}),
        )
        .await;
    w.drain().await.unwrap();
    // The hook was durable before the step ran.
    let events = env.events(&run).await;
    let hook_at = events
        .iter()
        .position(|e| matches!(e, Event::HookCreated { .. }))
        .unwrap();
    let step_at = events
        .iter()
        .position(|e| matches!(e, Event::StepCompleted { .. }))
        .unwrap();
    assert!(hook_at < step_at, "{events:#?}");
    assert_eq!(env.status(&run).await, RunStatus::Running);
    // The farm calls back twice with the same delivery id: written once.
    let body = serde_json::json!({"status": "ok", "url": "https://cdn/p1.mp4"});
    let first = resume_hook(&*env.store, "render-p1", &body, Some("d-1"), now)
        .await
        .unwrap();
    let again = resume_hook(&*env.store, "render-p1", &body, Some("d-1"), now)
        .await
        .unwrap();
    assert!(!first.duplicate && again.duplicate && first.seq == again.seq);
    w.drain().await.unwrap();
    let out = env.output(&run).await;
    assert_eq!(out["url"], "https://cdn/p1.mp4");
    // The run ended: its token is released.
    assert!(resume_hook(&*env.store, "render-p1", &body, None, now)
        .await
        .is_err());

    // A failed render fails the run with the fatal step error.
    let run = env
        .start(
            &reg,
            "r2",
            "render_video",
            serde_json::json!({"project_id": "p2"}),
        )
        .await;
    w.drain().await.unwrap();
    resume_hook(
        &*env.store,
        "render-p2",
        &serde_json::json!({"status": "gpu on fire"}),
        None,
        now,
    )
    .await
    .unwrap();
    w.drain().await.unwrap();
    assert!(env.error(&run).await.contains("gpu on fire"));
}

mod deploy {
    use super::*;

    #[derive(Deserialize, JsonSchema)]
    pub struct Input {
        pub service: String,
    }

    #[derive(Deserialize)]
    pub struct Answer {
        pub option_id: String,
    }

    /// The seed's "Approve with a deadline and an escalation", with a hook for the request:
    /// one pending request raced against 4 h, a page step, the same request against 20 h.
    pub async fn execute(
        ctx: WorkflowCtx,
        input: Input,
    ) -> Result<serde_json::Value, WorkflowError> {
        let service = input.service;
        let s = service.clone();
        let plan: String = ctx
            .step("plan_deploy", move |_| {
                let s = s.clone();
                async move { Ok(format!("plan for {s}")) }
            })
            .await?;
        let pending = ctx.create_hook::<Answer>(format!("approve-{service}"));
        let mut answer = match ctx.race(pending.next(), ctx.sleep("4h")).await {
            Either::Left(a) => Some(a?),
            Either::Right(()) => None,
        };
        if answer.is_none() {
            let s = service.clone();
            ctx.step("page_on_call", move |_| {
                let s = s.clone();
                async move { Ok(format!("paged on-call for {s}")) }
            })
            .await?;
            answer = match ctx.race(pending.next(), ctx.sleep("20h")).await {
                Either::Left(a) => Some(a?),
                Either::Right(()) => None,
            };
        }
        let Some(answer) = answer else {
            return Ok(serde_json::json!({"deployed": false, "reason": "timed out"}));
        };
        if answer.option_id != "approve" {
            return Ok(serde_json::json!({"deployed": false, "reason": "rejected"}));
        }
        let url: String = ctx
            .step("apply_deploy", move |_| {
                let plan = plan.clone();
                async move { Ok(format!("https://{}.example", plan.len())) }
            })
            .await?;
        Ok(serde_json::json!({"deployed": true, "url": url}))
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool(
            "Deploy a service to production after approval, escalating when nobody answers.",
            workflow!(execute),
        )
    }
}

async fn approve_with_deadline_and_escalation(env: Env) {
    let reg = Registry::new("v1").with(deploy::tool());
    let w = env.worker(&reg).await;
    let approve = serde_json::json!({"option_id": "approve"});
    let now = || env.clock.now_ts();

    // Approved within 4 h: no page.
    let fast = env
        .start(
            &reg,
            "fast",
            "deploy",
            serde_json::json!({"service": "api"}),
        )
        .await;
    w.drain().await.unwrap();
    env.clock.advance(HOUR);
    resume_hook(&*env.store, "approve-api", &approve, None, now())
        .await
        .unwrap();
    w.drain().await.unwrap();
    assert_eq!(env.output(&fast).await["deployed"], true);
    assert_eq!(
        completed_steps(&env.events(&fast).await),
        ["plan_deploy", "apply_deploy"]
    );

    // Nobody answers for 4 h: page, then the same request is approved at hour 10.
    let slow = env
        .start(
            &reg,
            "slow",
            "deploy",
            serde_json::json!({"service": "web"}),
        )
        .await;
    w.drain().await.unwrap();
    env.clock.advance(4 * HOUR);
    w.drain().await.unwrap();
    assert_eq!(
        completed_steps(&env.events(&slow).await),
        ["plan_deploy", "page_on_call"]
    );
    env.clock.advance(6 * HOUR);
    resume_hook(&*env.store, "approve-web", &approve, None, now())
        .await
        .unwrap();
    w.drain().await.unwrap();
    assert_eq!(env.output(&slow).await["deployed"], true);

    // Nobody ever answers: timed out after 24 h; a rejection is reported as such.
    let never = env
        .start(
            &reg,
            "never",
            "deploy",
            serde_json::json!({"service": "db"}),
        )
        .await;
    let rejected = env
        .start(&reg, "rej", "deploy", serde_json::json!({"service": "cdn"}))
        .await;
    w.drain().await.unwrap();
    resume_hook(
        &*env.store,
        "approve-cdn",
        &serde_json::json!({"option_id": "cancel"}),
        None,
        now(),
    )
    .await
    .unwrap();
    env.clock.advance(4 * HOUR);
    w.drain().await.unwrap();
    env.clock.advance(20 * HOUR);
    w.drain().await.unwrap();
    assert_eq!(
        env.output(&never).await,
        serde_json::json!({"deployed": false, "reason": "timed out"})
    );
    assert_eq!(env.output(&rejected).await["reason"], "rejected");
    if std::env::var_os("EVE_WRITE_FIXTURES").is_some() && env.store.backend() == "memory" {
        for (run, name) in [
            (&slow, "escalation_approved_late"),
            (&never, "escalation_timed_out"),
        ] {
            let journal = env.store.read_all(run, 0).await.unwrap();
            std::fs::write(
                format!("{}/tests/fixtures/{name}.json", env!("CARGO_MANIFEST_DIR")),
                serde_json::to_string_pretty(&journal).unwrap(),
            )
            .unwrap();
        }
    }
    // The request's token is released when the run ends.
    assert!(
        resume_hook(&*env.store, "approve-db", &approve, None, now())
            .await
            .is_err()
    );
}

mod collect {
    use super::*;

    #[derive(Deserialize, JsonSchema)]
    pub struct Input {
        pub token: String,
        pub count: usize,
    }

    /// Takes `count` payloads from one hook, each awaited in order.
    pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<Vec<u32>, WorkflowError> {
        let hook = ctx.create_hook::<u32>(input.token);
        let mut got = Vec::new();
        for _ in 0..input.count {
            got.push(hook.next().await?);
        }
        Ok(got)
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Collects payloads.", workflow!(execute))
    }
}

async fn hook_takes_several_payloads_in_order(env: Env) {
    let reg = Registry::new("v1").with(collect::tool());
    let run = env
        .start(
            &reg,
            "c",
            "collect",
            serde_json::json!({"token": "t", "count": 3}),
        )
        .await;
    let w = env.worker(&reg).await;
    w.drain().await.unwrap();
    for v in [3, 1, 2] {
        resume_hook(&*env.store, "t", &v, None, env.clock.now_ts())
            .await
            .unwrap();
    }
    w.drain().await.unwrap();
    assert_eq!(env.output(&run).await, serde_json::json!([3, 1, 2]));
}

async fn input_validation_and_idempotent_starts(env: Env) {
    let reg = Registry::new("v1").with(remind::tool());
    let session = SessionId::new("s");
    let now = Timestamp(1);
    for (input, says) in [
        (
            serde_json::json!(["note"]),
            "the arguments must be a JSON object, got an array",
        ),
        (
            serde_json::json!("note"),
            "the arguments must be a JSON object, got the string \"note\"",
        ),
        (
            serde_json::json!({"note": "x"}),
            "delay: missing; the arguments must have it",
        ),
        (
            serde_json::json!({"note": 1, "delay": "1h"}),
            "note: expected a string, got the number 1",
        ),
    ] {
        let err = start_tool_call(
            &*env.store,
            &reg,
            &session,
            &CallId::new("c"),
            "remind",
            input,
            now,
        )
        .await
        .unwrap_err();
        assert!(matches!(err, EngineError::InvalidInput { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains(says) && msg.contains("remind"), "{msg}");
    }
    assert!(matches!(
        start_tool_call(
            &*env.store,
            &reg,
            &session,
            &CallId::new("c"),
            "nope",
            serde_json::json!({}),
            now
        )
        .await,
        Err(EngineError::UnknownTool { .. })
    ));
    assert!(
        env.store
            .list_runs(&RunQuery::default())
            .await
            .unwrap()
            .is_empty(),
        "no run exists"
    );

    let input = serde_json::json!({"note": "n", "delay": "1h"});
    let a = start_tool_call(
        &*env.store,
        &reg,
        &session,
        &CallId::new("c"),
        "remind",
        input.clone(),
        now,
    )
    .await
    .unwrap();
    let b = start_tool_call(
        &*env.store,
        &reg,
        &session,
        &CallId::new("c"),
        "remind",
        input,
        now,
    )
    .await
    .unwrap();
    assert!(a.created && !b.created);
    assert_eq!(a.run.run_id, b.run.run_id);
    let other = serde_json::json!({"note": "other", "delay": "1h"});
    assert!(matches!(
        start_tool_call(
            &*env.store,
            &reg,
            &session,
            &CallId::new("c"),
            "remind",
            other,
            now
        )
        .await,
        Err(EngineError::Store(StoreError::IdempotencyMismatch { .. }))
    ));
}

async fn deployments_and_missing_workflows(env: Env) {
    let v1 = Registry::new("v1")
        .with(remind::tool())
        .with(deploy::tool());
    let run = env
        .start(
            &v1,
            "m",
            "remind",
            serde_json::json!({"note": "n", "delay": "1s"}),
        )
        .await;
    // A worker of another deployment never claims the run.
    let v2 = Registry::new("v2").with(remind::tool());
    assert!(env.worker(&v2).await.drain().await.unwrap().is_empty());
    // A worker of the run's deployment whose registry lacks the workflow fails it, naming it.
    let broken = Registry::new("v1").with(deploy::tool());
    env.worker(&broken).await.drain().await.unwrap();
    let err = env.error(&run).await;
    assert!(
        err.contains(CODE_MISSING_WORKFLOW) && err.contains("remind::execute"),
        "{err}"
    );
    // One call, one result: the call is settled with that error.
    let log = env
        .store
        .read_session(&SessionId::new("session-1"), 0, 100)
        .await
        .unwrap();
    assert!(log.iter().any(|e| matches!(
        &e.event,
        SessionEvent::TaskFailed { error } if error.contains("remind::execute")
    )));
}

#[derive(Deserialize, JsonSchema)]
struct Greet {
    name: String,
}

#[tokio::test]
async fn ordinary_tools_run_once_and_validate() {
    let tool = define_tool(
        "greet",
        "Says hello.",
        |ctx: ToolCtx, g: Greet| async move {
            Ok::<_, WorkflowError>(format!("hello {} from {}", g.name, ctx.tool_name))
        },
    );
    let ctx = ToolCtx::inline(SessionId::new("s"), CallId::new("c"), "greet");
    assert_eq!(
        tool.call(ctx.clone(), serde_json::json!({"name": "ada"}))
            .await
            .unwrap(),
        serde_json::json!("hello ada from greet")
    );
    let err = tool
        .call(ctx.clone(), serde_json::json!([1]))
        .await
        .unwrap_err();
    assert!(
        err.contains("the arguments must be a JSON object, got an array"),
        "{err}"
    );
    let err = tool
        .call(ctx, serde_json::json!({"name": 7}))
        .await
        .unwrap_err();
    assert!(
        err.contains("name: expected a string, got the number 7"),
        "{err}"
    );
    assert_eq!(tool.input_schema()["required"], serde_json::json!(["name"]));
}

/// Journals recorded by an earlier build (`EVE_WRITE_FIXTURES=1` rewrites them) must still
/// replay to the end without non-determinism: a change to the engine or the example that
/// breaks runs in flight fails here.
#[tokio::test]
async fn recorded_journals_still_replay() {
    use eve_core::engine::Worker;
    use eve_core::{Append, AppendId, DeploymentId, NewRun, StoredEvent, WorkerId};
    let reg = Registry::new("v1").with(deploy::tool());
    for name in ["escalation_approved_late", "escalation_timed_out"] {
        let path = format!("{}/tests/fixtures/{name}.json", env!("CARGO_MANIFEST_DIR"));
        let journal: Vec<StoredEvent> =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let store: std::sync::Arc<dyn JournalStore> =
            std::sync::Arc::new(eve_core::MemoryStore::new());
        let Event::RunStarted {
            workflow_id,
            deployment_id,
            tool,
            input,
            session_id,
            call_id,
            execution,
            traceparent,
            reset_from,
        } = journal[0].event.clone()
        else {
            panic!("{name}: no RunStarted");
        };
        let run = eve_core::RunId::new(name);
        store
            .create_run(
                NewRun {
                    run_id: run.clone(),
                    idempotency_key: None,
                    workflow_id,
                    deployment_id,
                    tool,
                    input,
                    session_id,
                    call_id,
                    execution,
                    traceparent,
                    reset_from,
                },
                journal[0].at,
            )
            .await
            .unwrap();
        let lease = store
            .register_worker(
                &WorkerId::new("fixture"),
                &DeploymentId::new("v1"),
                HOUR * 1000,
                journal[0].at,
            )
            .await
            .unwrap();
        store.claim(&lease, 1, journal[0].at).await.unwrap();
        for e in &journal[1..] {
            store
                .append(Append {
                    run: run.clone(),
                    expected_seq: e.seq,
                    lease: lease.clone(),
                    append_id: AppendId::random(),
                    events: vec![e.event.clone()],
                    now: e.at,
                })
                .await
                .unwrap();
        }
        let report = Worker::replay_cold(&store, &reg, &run)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            report.finished,
            "{name}: the body returns at the end of its journal"
        );
        assert_eq!(report.events, journal.len() as u64);
    }
}

trait Now {
    fn now_ts(&self) -> Timestamp;
}

impl Now for std::sync::Arc<eve_core::engine::ManualClock> {
    fn now_ts(&self) -> Timestamp {
        eve_core::engine::Clock::now(&**self)
    }
}

on_both_stores!(
    remind_me_later,
    wait_for_a_callback,
    approve_with_deadline_and_escalation,
    hook_takes_several_payloads_in_order,
    input_validation_and_idempotent_starts,
    deployments_and_missing_workflows,
);
