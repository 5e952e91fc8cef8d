#![allow(unreachable_pub)]
//! Paths no other test took: a step's own `StepError::retry_after` overriding the policy's
//! backoff, `AgentCall::continuing` handing the host the child to continue, and child agents
//! cancelled with their run. On memory and SQLite.

mod common;

use common::Env;
use eve_core::engine::{
    define_workflow_tool, ActivationEnd, AgentCall, Clock, Registry, ScriptedAgentHost, StepError,
    WorkflowCtx, WorkflowError, WorkflowTool,
};
use eve_core::{workflow, Event, RunStatus};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

mod throttled {
    use super::*;

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("A rate-limited call.", workflow!(execute)).named("api")
    }

    /// A step whose service answers "come back in 90 s" once, then succeeds.
    pub async fn execute(ctx: WorkflowCtx, _input: Value) -> Result<u32, WorkflowError> {
        Ok(ctx
            .step("call_api", |s| async move {
                if s.attempt() == 1 {
                    return Err(StepError::retry_after(
                        "429 Too Many Requests",
                        Duration::from_secs(90),
                    ));
                }
                Ok(s.attempt())
            })
            .await?)
    }
}

async fn retry_after_overrides_the_backoff(env: Env) {
    let reg = Registry::new("v1").with(throttled::tool());
    let t0 = env.clock.now().millis();
    let run = env.start(&reg, "r1", "api", json!({})).await;
    let w = env.worker(&reg).await;
    assert_eq!(w.drain().await.unwrap()[0].1, ActivationEnd::Suspended);
    let retry_at = env.events(&run).await.iter().find_map(|e| match e {
        Event::StepFailed { retry_at, .. } => *retry_at,
        _ => None,
    });
    assert_eq!(
        retry_at.map(|t| t.millis()),
        Some(t0 + 90_000),
        "the step's retry_after, not the policy's 1 s backoff"
    );
    // The default backoff's time passes: nothing is due.
    env.clock.advance(Duration::from_secs(1));
    assert!(w.drain().await.unwrap().is_empty());
    env.clock.advance(Duration::from_secs(89));
    w.drain().await.unwrap();
    assert_eq!(env.output(&run).await, json!(2));
}

mod researcher {
    use super::*;

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Research more.", workflow!(execute)).named("research")
    }

    /// Continues an existing child agent, then asks a fresh one.
    pub async fn execute(ctx: WorkflowCtx, _input: Value) -> Result<Value, WorkflowError> {
        let again = ctx
            .agent(
                AgentCall::new("follow-up", "researcher", json!("and the sources?"))
                    .continuing("agent-7"),
            )
            .map_err(WorkflowError::new)?
            .await
            .map_err(WorkflowError::new)?;
        Ok(again)
    }
}

async fn continuing_names_the_child_to_the_host(env: Env) {
    // The child answers later, as a real one would.
    let host = Arc::new(ScriptedAgentHost::new(env.store.clone()).with_clock(env.clock.clone()));
    let reg = Registry::new("v1")
        .with(researcher::tool())
        .with_agent_host(host.clone());
    let run = env.start(&reg, "r1", "research", json!({})).await;
    let w = env.worker(&reg).await;
    w.drain().await.unwrap();
    // The host was asked to continue agent-7, and the start is recorded with that child.
    let (id, starts) = host.starts(&run, "follow-up").unwrap();
    assert_eq!((id.as_str(), starts), ("agent-7", 1));
    let events = env.events(&run).await;
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::AgentStarted { key, agent_id, .. }
                if key == "follow-up" && agent_id.as_deref() == Some("agent-7")
        )),
        "{events:#?}"
    );
    host.finish(
        &run,
        "follow-up",
        Ok(json!({ "sources": ["a", "b"] })),
        env.clock.now(),
    )
    .await
    .unwrap();
    w.drain().await.unwrap();
    assert_eq!(env.output(&run).await, json!({ "sources": ["a", "b"] }));
    assert_eq!(host.starts(&run, "follow-up").unwrap().1, 1, "started once");
}

mod fan_out {
    use super::*;

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Fan out.", workflow!(execute)).named("fan")
    }

    /// Two children at once; the body waits for both.
    pub async fn execute(ctx: WorkflowCtx, _input: Value) -> Result<Value, WorkflowError> {
        let a = ctx
            .agent(AgentCall::new("a", "slow", json!(1)))
            .map_err(WorkflowError::new)?;
        let b = ctx
            .agent(AgentCall::new("b", "slow", json!(2)))
            .map_err(WorkflowError::new)?;
        let a = a.await.map_err(WorkflowError::new)?;
        let b = b.await.map_err(WorkflowError::new)?;
        Ok(json!([a, b]))
    }
}

async fn children_are_cancelled_with_their_run(env: Env) {
    // "slow" children never reply by themselves.
    let host = Arc::new(ScriptedAgentHost::new(env.store.clone()).with_clock(env.clock.clone()));
    let reg = Registry::new("v1")
        .with(fan_out::tool())
        .with_agent_host(host.clone());
    let run = env.start(&reg, "r1", "fan", json!({})).await;
    let w = env.worker(&reg).await;
    w.drain().await.unwrap();
    assert_eq!(host.starts(&run, "a").map(|s| s.1), Some(1));
    assert_eq!(host.starts(&run, "b").map(|s| s.1), Some(1));
    assert!(host.cancelled().is_empty());
    env.store
        .request_cancel(&run, "the user stopped it", env.clock.now())
        .await
        .unwrap();
    w.drain().await.unwrap();
    // The grace period passes with the children still out.
    env.clock.advance(Duration::from_secs(3600));
    w.drain().await.unwrap();
    assert_eq!(env.status(&run).await, RunStatus::Cancelled);
    let mut cancelled = host.cancelled();
    cancelled.sort();
    cancelled.dedup();
    assert_eq!(
        cancelled,
        [(run.clone(), "a".to_owned()), (run.clone(), "b".to_owned())],
        "both children are cancelled with their run"
    );
}

on_both_stores!(
    retry_after_overrides_the_backoff,
    continuing_names_the_child_to_the_host,
    children_are_cancelled_with_their_run,
);
