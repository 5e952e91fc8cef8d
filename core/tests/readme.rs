#![allow(unreachable_pub)]
//! The README's workflow tool, compiled and run: approved, it waits for its reviewer and
//! deploys; unanswered past its deadline, it returns and its request is withdrawn.

mod common;

use common::Env;
use eve_core::engine::{
    AgentCall, Clock as _, Registry, ScriptedAgentHost, StepError, WorkflowCtx, WorkflowError,
};
use eve_core::{Event, InputRequest, InputResponse, SessionId};
use eve_macros::{step, workflow};
use std::sync::Arc;
use std::time::Duration;

// Keep in sync with README.md, "Write a workflow tool" (the README imports eve::prelude::*).
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Deploy {
    service: String,
}

/// Deploy a service after approval.
#[workflow]
async fn deploy(ctx: WorkflowCtx, input: Deploy) -> Result<serde_json::Value, WorkflowError> {
    ctx.progress(&serde_json::json!({"status": "planning"})); // action.partial on the session
    let plan = plan(&ctx, input.service.clone()).await?;
    // A subagent, started once per (run, key) by the host's AgentHost.
    let review = ctx.agent(AgentCall::new("security-review", "reviewer", plan))?;
    // input.requested on the session; answerable once, from any process, days later.
    let approval = ctx.ask(InputRequest::confirmation(format!(
        "Deploy {}?",
        input.service
    )));
    match ctx.race(approval, ctx.sleep("4h")).await.left() {
        Some(answer) if answer.option_id.as_deref() == Some("approve") => {}
        // Returning withdraws the request (input.withdrawn) and settles the call.
        _ => return Ok(serde_json::json!({"deployed": false})),
    }
    let review = review.await?;
    apply(&ctx).await?;
    Ok(serde_json::json!({"deployed": true, "review": review}))
}

/// A step: runs once, its result recorded and replayed; its arguments are moved in.
#[step]
async fn plan(service: String) -> Result<String, StepError> {
    Ok(format!("roll out {service}"))
}

#[step(retries = 5, backoff = "2s")]
async fn apply() -> Result<(), StepError> {
    Ok(())
}

fn registry(env: &Env) -> Registry {
    let host = ScriptedAgentHost::new(env.store.clone())
        .with_clock(env.clock.clone())
        .reply("reviewer", |s| {
            Ok(serde_json::json!({"ok": true, "plan": s.message}))
        });
    Registry::new("v1")
        .with(deploy)
        .with_agent_host(Arc::new(host))
}

async fn readme_tool(env: Env) {
    let reg = registry(&env);
    let w = env.worker(&reg).await;
    let approved = env
        .start(&reg, "c1", "deploy", serde_json::json!({"service": "api"}))
        .await;
    let late = env
        .start(&reg, "c2", "deploy", serde_json::json!({"service": "db"}))
        .await;
    w.drain().await.unwrap();
    let pending = env
        .store
        .pending_requests(&SessionId::new("session-1"))
        .await
        .unwrap();
    let request = pending
        .iter()
        .find(|p| p.run_id == approved)
        .expect("the first run asks")
        .request_id
        .clone();
    env.store
        .answer(&request, InputResponse::option("approve"), env.clock.now())
        .await
        .unwrap();
    w.drain().await.unwrap();
    assert_eq!(
        env.output(&approved).await,
        serde_json::json!({"deployed": true, "review": {"ok": true, "plan": "roll out api"}})
    );
    env.clock.advance(Duration::from_secs(4 * 3600));
    w.drain().await.unwrap();
    assert_eq!(
        env.output(&late).await,
        serde_json::json!({"deployed": false})
    );
    assert!(env
        .events(&late)
        .await
        .iter()
        .any(|e| matches!(e, Event::InputWithdrawn { .. })));
}

on_both_stores!(readme_tool);
