#![allow(unreachable_pub)]
//! Steps that start and resume: `StepCtx::start_call` starts a child tool call in the run's
//! session and `StepCtx::resume_hook` delivers to another run's hook, with no store captured by
//! the step. A step that did both and then failed its attempt, or whose worker died before its
//! outcome was recorded, is run again: there is still one child run and one delivery.

mod common;

use common::{Env, LEASE};
use eve_core::engine::{
    define_workflow_tool, EngineError, Registry, StepError, WorkflowCtx, WorkflowError,
    WorkflowTool,
};
use eve_core::testing::{Fault, FaultyStore};
use eve_core::{workflow, Event, RunId, RunQuery, RunStatus, SessionId, StoreError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How the parent's step ends its first execution after starting the child and resuming the
/// hook.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Mode {
    /// The attempt fails (retryable): `StepFailed`, then attempt 2.
    FailOnce,
    /// The worker's store "crashes" before the outcome is appended: nothing is recorded, and
    /// a new worker runs the step again (still attempt 1).
    Crash,
}

#[derive(Deserialize, JsonSchema)]
struct ParentIn {
    token: String,
    mode: Mode,
}

/// What the parent's step returns: what its last execution saw.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct FanOut {
    child_call: String,
    child_run: String,
    child_created: bool,
    delivery_duplicate: bool,
    session: String,
}

/// Executions of the parent's step, by run.
fn executions() -> &'static Mutex<HashMap<RunId, u32>> {
    static E: OnceLock<Mutex<HashMap<RunId, u32>>> = OnceLock::new();
    E.get_or_init(Default::default)
}

/// The store to crash during a parent's first execution, by run.
fn crashes() -> &'static Mutex<HashMap<RunId, Arc<FaultyStore>>> {
    static C: OnceLock<Mutex<HashMap<RunId, Arc<FaultyStore>>>> = OnceLock::new();
    C.get_or_init(Default::default)
}

mod parent {
    use super::*;

    /// One step that starts a child call and resumes the waiter's hook.
    pub async fn execute(ctx: WorkflowCtx, input: ParentIn) -> Result<FanOut, WorkflowError> {
        let (token, mode) = (input.token, input.mode);
        let out = ctx
            .step("fan_out", move |s| {
                let token = token.clone();
                async move {
                    let child = s.start_call("child", &json!({ "x": 7 })).await?;
                    let delivered = s.resume_hook(&token, &json!({ "approved": true })).await?;
                    let n = {
                        let mut e = executions().lock().unwrap();
                        let n = e.entry(s.run_id().clone()).or_default();
                        *n += 1;
                        *n
                    };
                    if n == 1 {
                        match mode {
                            Mode::FailOnce => {
                                return Err(StepError::retry_after(
                                    "simulated failure after the effects",
                                    Duration::from_secs(1),
                                ))
                            }
                            Mode::Crash => {
                                let faulty = crashes().lock().unwrap().get(s.run_id()).cloned();
                                faulty
                                    .expect("the test registered the store to crash")
                                    .set_fault(Fault::CrashAfter(0));
                            }
                        }
                    }
                    Ok(FanOut {
                        child_call: s.child_call_id(0).to_string(),
                        child_run: child.run.run_id.to_string(),
                        child_created: child.created,
                        delivery_duplicate: delivered.duplicate,
                        session: s.session_id().to_string(),
                    })
                }
            })
            .await?;
        Ok(out)
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Starts a child and resumes a hook.", workflow!(execute))
    }
}

#[derive(Deserialize, JsonSchema)]
struct ChildIn {
    x: i64,
}

mod child {
    use super::*;

    /// One step doubling `x`.
    pub async fn execute(ctx: WorkflowCtx, input: ChildIn) -> Result<i64, WorkflowError> {
        let x = input.x;
        Ok(ctx
            .step("double", move |_| async move { Ok(2 * x) })
            .await?)
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Doubles x.", workflow!(execute))
    }
}

#[derive(Deserialize, JsonSchema)]
struct WaiterIn {
    token: String,
}

mod waiter {
    use super::*;

    /// Waits for one payload on its hook and returns it.
    pub async fn execute(
        ctx: WorkflowCtx,
        input: WaiterIn,
    ) -> Result<serde_json::Value, WorkflowError> {
        let hook = ctx.create_hook::<serde_json::Value>(input.token);
        Ok(hook.next().await?)
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Waits for one payload.", workflow!(execute))
    }
}

mod bad_parent {
    use super::*;

    /// A step that starts a tool the registry does not have.
    pub async fn execute(
        ctx: WorkflowCtx,
        _input: serde_json::Value,
    ) -> Result<String, WorkflowError> {
        Ok(ctx
            .step("start_unknown", |s| async move {
                s.start_call("no_such_tool", &json!({})).await?;
                Ok("started".to_owned())
            })
            .await?)
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Starts an unknown tool.", workflow!(execute))
    }
}

fn registry() -> Registry {
    Registry::new("v1")
        .with(parent::tool())
        .with(child::tool())
        .with(waiter::tool())
        .with(bad_parent::tool())
}

/// Drains with fresh workers (moving the clock past any lease and retry) until `runs` ended.
async fn finish(env: &Env, reg: &Registry, runs: &[&RunId]) {
    let w = env.worker(reg).await;
    for _ in 0..10 {
        w.drain().await.expect("drain");
        let mut all = true;
        for r in runs {
            all &= env.status(r).await.is_terminal();
        }
        if all {
            return;
        }
        env.clock.advance(LEASE + Duration::from_secs(1));
    }
    panic!("runs did not end");
}

async fn one_child_one_delivery(env: Env, mode: Mode) {
    let reg = registry();
    let token = "approval-hook";
    let waiter = env
        .start(&reg, "wait-1", "waiter", json!({ "token": token }))
        .await;
    env.worker(&reg).await.drain().await.unwrap();
    assert_eq!(
        env.status(&waiter).await,
        RunStatus::Running,
        "waits on its hook"
    );

    let parent = env
        .start(
            &reg,
            "parent-1",
            "parent",
            json!({ "token": token, "mode": mode }),
        )
        .await;
    let faulty = FaultyStore::new(env.store.clone());
    crashes()
        .lock()
        .unwrap()
        .insert(parent.clone(), faulty.clone());
    let w1 = env.worker_on(faulty.clone(), &reg).await;
    // The first execution starts the child and resumes the hook, then fails its attempt (or
    // crashes its worker before the outcome is appended).
    let _ = w1.drain().await;
    if mode == Mode::Crash {
        assert!(faulty.tripped(), "the worker crashed");
        drop(w1);
        assert!(
            !env.events(&parent)
                .await
                .iter()
                .any(|e| matches!(e, Event::StepCompleted { .. } | Event::StepFailed { .. })),
            "the first execution's outcome was never recorded"
        );
    } else {
        let events = env.events(&parent).await;
        assert!(
            events
                .iter()
                .any(|e| matches!(e, Event::StepFailed { attempt: 1, .. })),
            "{events:?}"
        );
    }
    // Retry after the backoff (or the restarted process, once the old lease has expired).
    env.clock.advance(LEASE + Duration::from_secs(1));
    finish(&env, &reg, &[&parent, &waiter]).await;

    assert_eq!(
        executions().lock().unwrap()[&parent],
        2,
        "the step ran twice"
    );
    let out: FanOut = serde_json::from_value(env.output(&parent).await).unwrap();
    let cmd = 0;
    assert_eq!(
        out,
        FanOut {
            child_call: format!("{parent}:{cmd}:0"),
            child_run: out.child_run.clone(),
            child_created: false,
            delivery_duplicate: true,
            session: "session-1".into(),
        },
        "the second execution found the child and the delivery of the first"
    );
    let attempts = env
        .events(&parent)
        .await
        .iter()
        .find_map(|e| match e {
            Event::StepCompleted { attempt, .. } => Some(*attempt),
            _ => None,
        })
        .unwrap();
    assert_eq!(attempts, if mode == Mode::Crash { 1 } else { 2 });

    // One child run, in the parent's session, under the derived call id; it ran to its end.
    let runs = env
        .store
        .list_runs(&RunQuery {
            session: Some(SessionId::new("session-1")),
            ..RunQuery::default()
        })
        .await
        .unwrap();
    let children: Vec<_> = runs.iter().filter(|r| r.tool == "child").collect();
    assert_eq!(children.len(), 1, "{runs:?}");
    assert_eq!(children[0].call_id.as_str(), out.child_call);
    assert_eq!(children[0].run_id.as_str(), out.child_run);
    finish(&env, &reg, &[&children[0].run_id]).await;
    assert_eq!(env.output(&children[0].run_id).await, json!(14));

    // One delivery to the waiter's hook.
    let received = env
        .events(&waiter)
        .await
        .into_iter()
        .filter(|e| matches!(e, Event::HookReceived { .. }))
        .count();
    assert_eq!(received, 1);
    assert_eq!(env.output(&waiter).await, json!({ "approved": true }));
}

async fn retried_after_a_failed_attempt(env: Env) {
    one_child_one_delivery(env, Mode::FailOnce).await
}

async fn retried_after_a_crash(env: Env) {
    one_child_one_delivery(env, Mode::Crash).await
}

/// Starting a tool the registry does not have is a fatal step error: the run fails at once,
/// naming the tool, and nothing is started.
async fn unknown_child_tool_fails_the_step(env: Env) {
    let reg = registry();
    let run = env.start(&reg, "bad-1", "bad_parent", json!({})).await;
    env.worker(&reg).await.drain().await.unwrap();
    let error = env.error(&run).await;
    assert!(error.contains("no_such_tool"), "{error}");
    let steps_failed: Vec<bool> = env
        .events(&run)
        .await
        .iter()
        .filter_map(|e| match e {
            Event::StepFailed { fatal, .. } => Some(*fatal),
            _ => None,
        })
        .collect();
    assert_eq!(steps_failed, [true], "one attempt, fatal");
}

#[test]
fn engine_errors_as_step_errors() {
    let fatal = StepError::from(EngineError::UnknownTool { name: "x".into() });
    assert!(matches!(fatal, StepError::Fatal(m) if m.contains("\"x\"")));
    let retry = StepError::from(EngineError::Store(StoreError::not_found("hook token", "t")));
    assert!(matches!(retry, StepError::Retryable { .. }), "{retry:?}");
    let retry = StepError::from(EngineError::Store(StoreError::Unavailable {
        backend: "test",
        message: "down".into(),
    }));
    assert!(matches!(retry, StepError::Retryable { .. }));
    let fatal = StepError::from(EngineError::Store(StoreError::IdempotencyMismatch {
        key: "k".into(),
        existing: RunId::new("r"),
    }));
    assert!(matches!(fatal, StepError::Fatal(_)));
}

on_both_stores!(
    retried_after_a_failed_attempt,
    retried_after_a_crash,
    unknown_child_tool_fails_the_step,
);
