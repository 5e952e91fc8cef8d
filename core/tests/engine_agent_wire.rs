#![allow(unreachable_pub)]
//! `ctx.agent` in the wire form, on MemoryStore and SQLite: without an `AgentHost` in the
//! registry an agent call is an input request carrying the call, listed as pending, answered
//! once with an agent reply (its output checked against the call's schema before anything is
//! recorded), replayed in the form it was first recorded in (also by a registry that has a
//! host, and a host-form journal by one that has none), answered through `complete_agent` in
//! either form, and withdrawn when the run is cancelled.

mod common;

use common::Env;
use eve_core::engine::{
    agent_request_id, complete_agent, define_workflow_tool, ActivationEnd, AgentCall, Clock as _,
    EngineError, Registry, ScriptedAgentHost, WorkflowCtx, WorkflowError, WorkflowTool,
};
use eve_core::{
    workflow, AgentReply, Display, Event, InputResponse, PendingRequest, RequestId, RunStatus,
    SessionEvent, SessionId, StoreError,
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

/// No input.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Empty {}

mod delegate {
    use super::*;

    /// Two agent calls: `facts` must return `{facts: [..]}`, `check` anything.
    pub async fn execute(ctx: WorkflowCtx, _: Empty) -> Result<serde_json::Value, WorkflowError> {
        let facts = ctx.agent(
            AgentCall::new("facts", "researcher", json!({"topic": "tides"})).schema(json!({
                "type": "object",
                "required": ["facts"],
                "properties": {"facts": {"type": "array", "items": {"type": "string"}}}
            })),
        )?;
        let check = ctx.agent(AgentCall::new("check", "checker", json!("check the facts")))?;
        let facts = facts.await?;
        let check = match check.await {
            Ok(v) => v,
            Err(e) => json!({"failed": e.to_string()}),
        };
        Ok(json!({"facts": facts, "check": check}))
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Delegates to two subagents.", workflow!(execute))
    }
}

fn session() -> SessionId {
    SessionId::new("session-1")
}

/// The pending agent calls of the session, oldest first.
async fn pending_agents(env: &Env) -> Vec<PendingRequest> {
    env.store
        .pending_requests(&session())
        .await
        .unwrap()
        .into_iter()
        .filter(|p| p.request.agent.is_some())
        .collect()
}

fn reply(output: serde_json::Value) -> InputResponse {
    InputResponse {
        agent: Some(AgentReply::Output(output)),
        ..InputResponse::default()
    }
}

async fn session_log(env: &Env) -> Vec<SessionEvent> {
    env.store
        .read_session(&session(), 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event)
        .collect()
}

async fn answered(env: &Env, run: &eve_core::RunId) -> usize {
    env.events(run)
        .await
        .iter()
        .filter(|e| matches!(e, Event::InputAnswered { .. }))
        .count()
}

async fn a_call_is_a_request_answered_once(env: Env) {
    let reg = Registry::new("v1").with(delegate::tool());
    let run = env.start(&reg, "c1", "delegate", json!({})).await;
    let w = env.worker(&reg).await;
    assert_eq!(w.drain().await.unwrap()[0].1, ActivationEnd::Suspended);

    // Both calls are journaled once, as requests carrying the call, and listed as pending.
    let pending = pending_agents(&env).await;
    assert_eq!(pending.len(), 2, "{pending:#?}");
    let (facts, check) = (&pending[0], &pending[1]);
    assert_eq!(facts.request_id, RequestId::for_command(&run, 0));
    assert_eq!(facts.request.display, Display::Agent);
    let call = facts.request.agent.clone().unwrap();
    assert_eq!(
        (call.key.as_str(), call.target.as_str(), &call.message),
        ("facts", "researcher", &json!({"topic": "tides"}))
    );
    assert!(call.output_schema.is_some());
    let events = env.events(&run).await;
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::HookCreated { .. } | Event::AgentStarted { .. })),
        "no host form without a host: {events:#?}"
    );
    assert_eq!(
        agent_request_id(&*env.store, &run, "check").await.unwrap(),
        Some(check.request_id.clone())
    );

    let now = env.clock.now();
    // An output that does not match the schema is refused, naming where, and nothing is
    // recorded; so is an answer that is not an agent reply.
    let err = env
        .store
        .answer(&facts.request_id, reply(json!({"facts": [1]})), now)
        .await
        .unwrap_err();
    match &err {
        StoreError::InvalidAnswer { reason, .. } => {
            assert!(reason.contains("/facts/0"), "{reason}")
        }
        other => panic!("expected InvalidAnswer, got {other}"),
    }
    let err = env
        .store
        .answer(&facts.request_id, InputResponse::text("tides"), now)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidAnswer { .. }), "{err}");
    // The same through the Rust API.
    let err = complete_agent(&*env.store, &run, "facts", Ok(json!("no")), now)
        .await
        .unwrap_err();
    assert!(
        matches!(err, EngineError::Store(StoreError::InvalidAnswer { .. })),
        "{err}"
    );
    assert_eq!(answered(&env, &run).await, 0);
    assert_eq!(pending_agents(&env).await.len(), 2);

    // A matching output is recorded once; the same again is a duplicate, another is refused.
    let first = env
        .store
        .answer(
            &facts.request_id,
            reply(json!({"facts": ["two a day"]})),
            now,
        )
        .await
        .unwrap();
    assert!(!first.duplicate);
    let again = env
        .store
        .answer(
            &facts.request_id,
            reply(json!({"facts": ["two a day"]})),
            now,
        )
        .await
        .unwrap();
    assert!(again.duplicate);
    assert_eq!(again.seq, first.seq);
    let err = env
        .store
        .answer(&facts.request_id, reply(json!({"facts": []})), now)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::AlreadyAnswered { .. }), "{err}");

    // `complete_agent` answers the wire form too: a failed child, reported twice.
    let d = complete_agent(&*env.store, &run, "check", Err("no checker".into()), now)
        .await
        .unwrap();
    assert!(!d.duplicate);
    let d = complete_agent(&*env.store, &run, "check", Err("no checker".into()), now)
        .await
        .unwrap();
    assert!(d.duplicate);
    // An unknown key is not found.
    let err = complete_agent(&*env.store, &run, "nope", Ok(json!(1)), now)
        .await
        .unwrap_err();
    assert!(
        matches!(err, EngineError::Store(StoreError::NotFound { .. })),
        "{err}"
    );
    assert!(pending_agents(&env).await.is_empty());
    assert_eq!(answered(&env, &run).await, 2);

    // The channel shows the calls as agent.requested / agent.completed, never as questions.
    let log = session_log(&env).await;
    assert!(log.contains(&SessionEvent::AgentRequested {
        request_id: facts.request_id.clone(),
        agent: call.clone(),
    }));
    assert!(log.contains(&SessionEvent::AgentCompleted {
        request_id: check.request_id.clone(),
        answered_by: None,
        error: Some("no checker".into()),
    }));
    assert!(
        !log.iter().any(|e| matches!(
            e,
            SessionEvent::InputRequested { .. } | SessionEvent::InputAnswered { .. }
        )),
        "{log:#?}"
    );

    w.drain().await.unwrap();
    let output = env.output(&run).await;
    assert_eq!(output["facts"], json!({"facts": ["two a day"]}));
    assert!(
        output["check"]["failed"]
            .as_str()
            .unwrap()
            .contains("no checker"),
        "{output}"
    );
    // After the run ended the call can no longer be answered.
    let err = env
        .store
        .answer(&facts.request_id, reply(json!({"facts": ["x"]})), now)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Withdrawn { .. } | StoreError::AlreadyAnswered { .. }
        ),
        "{err}"
    );
}

async fn a_wire_call_replays_in_the_wire_form_after_a_restart(env: Env) {
    let reg = Registry::new("v1").with(delegate::tool());
    let run = env.start(&reg, "c1", "delegate", json!({})).await;
    env.worker(&reg).await.drain().await.unwrap();
    let pending = pending_agents(&env).await;
    let now = env.clock.now();
    env.store
        .answer(&pending[0].request_id, reply(json!({"facts": ["a"]})), now)
        .await
        .unwrap();
    // A restarted process, now with an AgentHost: the recorded calls keep their wire form,
    // the host is never asked to start them.
    let host = ScriptedAgentHost::new(env.store.clone()).with_clock(env.clock.clone());
    let with_host = Registry::new("v1")
        .with(delegate::tool())
        .with_agent_host(Arc::new(host.clone()));
    let w = env.worker(&with_host).await;
    w.drain().await.unwrap();
    assert_eq!(env.status(&run).await, RunStatus::Running);
    assert_eq!(host.starts(&run, "check"), None);
    assert_eq!(pending_agents(&env).await.len(), 1);
    env.store
        .answer(&pending[1].request_id, reply(json!("ok")), now)
        .await
        .unwrap();
    // Another restart replays the whole journal from seq 0.
    env.worker(&reg).await.drain().await.unwrap();
    assert_eq!(
        env.output(&run).await,
        json!({"facts": {"facts": ["a"]}, "check": "ok"})
    );
    assert_eq!(host.starts(&run, "facts"), None);
}

async fn a_host_call_replays_in_the_host_form_without_a_host(env: Env) {
    let host = ScriptedAgentHost::new(env.store.clone()).with_clock(env.clock.clone());
    let with_host = Registry::new("v1")
        .with(delegate::tool())
        .with_agent_host(Arc::new(host.clone()));
    let run = env.start(&with_host, "c1", "delegate", json!({})).await;
    env.worker(&with_host).await.drain().await.unwrap();
    assert!(host.starts(&run, "facts").is_some());
    assert!(pending_agents(&env).await.is_empty());
    // A restart without a host: the started children stay in the host form (no request is
    // published) and their results arrive through complete_agent.
    let reg = Registry::new("v1").with(delegate::tool());
    let w = env.worker(&reg).await;
    let now = env.clock.now();
    complete_agent(&*env.store, &run, "facts", Ok(json!({"facts": ["b"]})), now)
        .await
        .unwrap();
    w.drain().await.unwrap();
    complete_agent(&*env.store, &run, "check", Ok(json!("fine")), now)
        .await
        .unwrap();
    w.drain().await.unwrap();
    assert_eq!(
        env.output(&run).await,
        json!({"facts": {"facts": ["b"]}, "check": "fine"})
    );
    let events = env.events(&run).await;
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::InputRequested { .. })),
        "{events:#?}"
    );
    assert!(pending_agents(&env).await.is_empty());
}

async fn cancel_withdraws_a_pending_call(env: Env) {
    let reg = Registry::new("v1").with(delegate::tool());
    let run = env.start(&reg, "c1", "delegate", json!({})).await;
    let w = env.worker(&reg).await;
    w.drain().await.unwrap();
    let pending = pending_agents(&env).await;
    assert_eq!(pending.len(), 2);
    env.store
        .request_cancel(&run, "stop", env.clock.now())
        .await
        .unwrap();
    assert_eq!(w.drain().await.unwrap()[0].1, ActivationEnd::Cancelled);
    assert!(pending_agents(&env).await.is_empty());
    let events = env.events(&run).await;
    for p in &pending {
        assert!(events.contains(&Event::InputWithdrawn {
            request_id: p.request_id.clone()
        }));
    }
    let log = session_log(&env).await;
    assert!(log.contains(&SessionEvent::InputWithdrawn {
        request_id: pending[0].request_id.clone()
    }));
    let err = env
        .store
        .answer(
            &pending[0].request_id,
            reply(json!({"facts": []})),
            env.clock.now(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Withdrawn { .. }), "{err}");
    let err = complete_agent(&*env.store, &run, "check", Ok(json!(1)), env.clock.now())
        .await
        .unwrap_err();
    assert!(
        matches!(err, EngineError::Store(StoreError::Withdrawn { .. })),
        "{err}"
    );
}

on_both_stores!(
    a_call_is_a_request_answered_once,
    a_wire_call_replays_in_the_wire_form_after_a_restart,
    a_host_call_replays_in_the_host_form_without_a_host,
    cancel_withdraws_a_pending_call,
);
