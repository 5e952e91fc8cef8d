#![allow(unreachable_pub)]
//! Ordinary tools in the registry: a default one runs inline (no run), a background one is a
//! durable run of one journaled step with task notices, cancellation, and a step that runs
//! again after a crash until its outcome is recorded, once.

mod common;

use common::{completed_steps, Env, LEASE};
use eve_core::engine::{
    define_tool, define_workflow_tool, tool_call_run, ActivationEnd, Clock as _, EngineError,
    Registry, Tool, ToolCtx, WorkflowCtx, WorkflowError,
};
use eve_core::testing::{Fault, FaultyStore};
use eve_core::{
    workflow, CallId, CancelOutcome, Event, Execution, RunId, RunStatus, SessionEvent, SessionId,
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

#[derive(Deserialize, JsonSchema)]
struct Lookup {
    order_id: String,
}

/// Executions of background tool attempts by idempotency key.
fn executions() -> &'static Mutex<HashMap<String, u32>> {
    static E: OnceLock<Mutex<HashMap<String, u32>>> = OnceLock::new();
    E.get_or_init(Default::default)
}

fn executions_of(run: &RunId) -> u32 {
    let prefix = format!("{run}:");
    executions()
        .lock()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .map(|(_, n)| *n)
        .sum()
}

/// Looks an order up; counts its attempts by the step's idempotency key when it has one;
/// `fail-*` orders fail.
fn lookup() -> Tool {
    define_tool(
        "lookup_order",
        "Looks an order up.",
        |ctx: ToolCtx, input: Lookup| async move {
            if let Some(step) = &ctx.attempt {
                *executions()
                    .lock()
                    .unwrap()
                    .entry(step.idempotency_key())
                    .or_default() += 1;
            }
            if input.order_id.starts_with("fail-") {
                return Err(WorkflowError::new(format!(
                    "no order {} in the shop",
                    input.order_id
                )));
            }
            Ok(json!({"order": input.order_id, "status": "shipped", "tool": ctx.tool_name}))
        },
    )
}

async fn wf(_ctx: WorkflowCtx, _input: serde_json::Value) -> Result<String, WorkflowError> {
    Ok("done".into())
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

#[tokio::test]
async fn the_registry_holds_ordinary_tools_with_unique_names() {
    let reg = Registry::new("v1")
        .with(define_workflow_tool("A workflow.", workflow!(wf)).named("deploy"))
        .with(lookup())
        .with(lookup().named("lookup_later").background());
    // Default execution: kept as it is, found by `ordinary`, no workflow tool.
    let inline = reg.ordinary("lookup_order").expect("an inline tool");
    assert_eq!(inline.execution(), Execution::Default);
    assert!(reg.by_name("lookup_order").is_none());
    assert_eq!(
        reg.ordinary_tools().map(|t| t.name()).collect::<Vec<_>>(),
        ["lookup_order"]
    );
    // Background: a workflow tool, listed among `tools`, with the tool's schema and validation.
    let bg = reg.by_name("lookup_later").expect("a workflow tool");
    assert_eq!(bg.execution(), Execution::Background);
    assert!(!bg.may_wait_for_input());
    assert_eq!(bg.workflow_id().as_str(), "lookup_order");
    assert_eq!(bg.input_schema(), inline.input_schema());
    assert_eq!(bg.input_schema()["required"], json!(["order_id"]));
    assert!(reg.ordinary("lookup_later").is_none());

    // The same validation for both kinds, naming the field.
    for err in [
        inline.validate(&json!({"order": 1})).unwrap_err(),
        bg.validate(&json!({"order": 1})).unwrap_err(),
    ] {
        assert!(matches!(err, EngineError::InvalidInput { .. }), "{err}");
        assert!(err.to_string().contains("order_id"), "{err}");
    }
    assert!(inline.validate(&json!({"order_id": "1"})).is_ok());

    // An inline tool starts no run: a clear error says how it is called.
    let err = tool_call_run(
        &reg,
        &SessionId::new("s"),
        &CallId::new("c"),
        "lookup_order",
        json!({"order_id": "1"}),
    )
    .unwrap_err();
    assert!(matches!(err, EngineError::InlineTool { .. }), "{err}");
    assert!(err.to_string().contains("inline"), "{err}");

    // Names are unique across both kinds, whichever is registered first.
    let mut r = Registry::new("v1");
    r.register(define_workflow_tool("A workflow.", workflow!(wf)).named("lookup_order"))
        .unwrap();
    let err = r.register_tool(lookup()).unwrap_err();
    assert!(err.to_string().contains("registered already"), "{err}");
    let err = r
        .register_tool(lookup().background().with_id("other"))
        .unwrap_err();
    assert!(err.to_string().contains("registered already"), "{err}");
    let mut r = Registry::new("v1");
    r.register_tool(lookup()).unwrap();
    let err = r
        .register(define_workflow_tool("A workflow.", workflow!(wf)).named("lookup_order"))
        .unwrap_err();
    assert!(err.to_string().contains("unique across"), "{err}");
    let err = r.register_tool(lookup()).unwrap_err();
    assert!(err.to_string().contains("unique across"), "{err}");
}

#[tokio::test]
async fn an_inline_call_runs_the_tool_once_with_its_identity() {
    let reg = Registry::new("v1").with(lookup());
    let t = reg.ordinary("lookup_order").unwrap();
    let ctx = ToolCtx::inline(SessionId::new("s"), CallId::new("c"), t.name());
    assert!(ctx.attempt.is_none());
    assert_eq!(
        t.call(ctx.clone(), json!({"order_id": "7"})).await.unwrap(),
        json!({"order": "7", "status": "shipped", "tool": "lookup_order"})
    );
    assert_eq!(
        t.call(ctx, json!({"order_id": "fail-7"}))
            .await
            .unwrap_err(),
        "no order fail-7 in the shop"
    );
}

fn background_registry() -> Registry {
    Registry::new("v1").with(lookup().background())
}

async fn a_background_tool_is_a_run_of_one_step(env: Env) {
    let reg = background_registry();
    let run = env
        .start(&reg, "c1", "lookup_order", json!({"order_id": "42"}))
        .await;
    assert_eq!(
        env.store.get_run(&run).await.unwrap().execution,
        Execution::Background
    );
    let w = env.worker(&reg).await;
    assert_eq!(
        w.drain().await.unwrap(),
        vec![(run.clone(), ActivationEnd::Completed)]
    );
    let out = json!({"order": "42", "status": "shipped", "tool": "lookup_order"});
    assert_eq!(env.output(&run).await, out);
    let events = env.events(&run).await;
    assert_eq!(completed_steps(&events), [Tool::STEP]);
    assert_eq!(
        events.len(),
        3,
        "RunStarted, one StepCompleted, RunCompleted: {events:#?}"
    );
    assert_eq!(executions_of(&run), 1);
    assert!(session_log(&env).await.iter().any(
        |e| matches!(e, SessionEvent::TaskCompleted { output } if output.to_value::<serde_json::Value>().unwrap() == out)
    ));

    // A failing tool fails the run with its message, once (no retries), and notifies.
    let run = env
        .start(&reg, "c2", "lookup_order", json!({"order_id": "fail-1"}))
        .await;
    w.drain().await.unwrap();
    assert_eq!(env.error(&run).await, "no order fail-1 in the shop");
    assert_eq!(executions_of(&run), 1);
    assert!(session_log(&env).await.iter().any(
        |e| matches!(e, SessionEvent::TaskFailed { error } if error == "no order fail-1 in the shop")
    ));
}

/// A crash after each store call of a background tool's run; a new worker takes over once the
/// lease expired. The run completes with the tool's output, its step's outcome is recorded
/// exactly once, and the tool ran at least once.
async fn a_background_tool_survives_a_crash_at_every_store_call(env: Env) {
    let reg = background_registry();
    let mut crash_points = 0;
    let mut reran = false;
    for n in 0.. {
        let faulty = FaultyStore::new(env.store.clone());
        let run = env
            .start(
                &reg,
                &format!("crash-{n}"),
                "lookup_order",
                json!({"order_id": format!("o{n}")}),
            )
            .await;
        let w1 = env.worker_on(faulty.clone(), &reg).await;
        faulty.set_fault(Fault::CrashAfter(n));
        let _ = w1.drain().await;
        let tripped = faulty.tripped();
        env.clock.advance(LEASE + Duration::from_secs(1));
        let w2 = env.worker(&reg).await;
        for _ in 0..5 {
            w2.drain().await.unwrap();
            if env.status(&run).await.is_terminal() {
                break;
            }
            env.clock.advance(LEASE + Duration::from_secs(1));
        }
        assert_eq!(
            env.output(&run).await["order"],
            json!(format!("o{n}")),
            "crash after call {n}"
        );
        assert_eq!(
            completed_steps(&env.events(&run).await),
            [Tool::STEP],
            "crash after call {n}: the outcome recorded once"
        );
        assert!(executions_of(&run) >= 1);
        reran |= executions_of(&run) > 1;
        if !tripped {
            break;
        }
        crash_points += 1;
    }
    assert!(crash_points >= 2, "claim and the step's append at least");
    assert!(
        reran,
        "a crash before the step's outcome committed runs the tool again"
    );
}

/// Waits for the abort signal of its step, then reports it saw it.
fn waits_for_cancel(running: Arc<tokio::sync::Notify>) -> Tool {
    define_tool(
        "export",
        "Exports until cancelled.",
        move |ctx: ToolCtx, _: serde_json::Value| {
            let running = running.clone();
            async move {
                let step = ctx.attempt.expect("a background call runs in a step");
                running.notify_one();
                step.aborted().await;
                Ok::<_, WorkflowError>("stopped cleanly")
            }
        },
    )
    .background()
}

async fn task_cancel_aborts_a_background_tool(env: Env) {
    let running = Arc::new(tokio::sync::Notify::new());
    let reg = Registry::new("v1").with(waits_for_cancel(running.clone()));
    let run = env.start(&reg, "c1", "export", json!({})).await;
    let w = env.worker(&reg).await;
    let task = tokio::spawn(async move { w.run_once().await });
    running.notified().await;
    let out = env
        .store
        .request_cancel(&run, "task_cancel", env.clock.now())
        .await
        .unwrap();
    assert!(matches!(out, CancelOutcome::Requested { .. }));
    let ends = task.await.unwrap().unwrap();
    assert_eq!(ends[0].1, ActivationEnd::Cancelled);
    assert_eq!(env.status(&run).await, RunStatus::Cancelled);
    assert!(session_log(&env)
        .await
        .contains(&SessionEvent::TaskCancelled));
    assert_eq!(env.events(&run).await.last(), Some(&Event::RunCancelled));
}

on_both_stores!(
    a_background_tool_is_a_run_of_one_step,
    a_background_tool_survives_a_crash_at_every_store_call,
    task_cancel_aborts_a_background_tool,
);
