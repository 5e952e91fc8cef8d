#![allow(unreachable_pub)]
//! Retry and reset through the engine: a run whose step failed fatally, retried after a fix is
//! deployed, completes in a new run that replays the steps completed before the failure (they
//! are not executed again) and runs the failed step and the rest; a reset to seq 1 runs
//! everything again; the old run and its journal stay as they were.

mod common;

use common::{completed_steps, Env};
use eve_core::engine::{
    define_workflow_tool, ActivationEnd, Clock as _, Registry, StepError, WorkflowCtx,
    WorkflowError,
};
use eve_core::{workflow, DeploymentId, Event, JournalStoreExt, RunStatus};
use schemars::JsonSchema;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Per test tag: whether the "charge" step is broken, and executions per step name.
#[derive(Default)]
struct Tagged {
    broken: bool,
    executions: HashMap<&'static str, u32>,
}

fn state() -> &'static Mutex<HashMap<String, Tagged>> {
    static S: OnceLock<Mutex<HashMap<String, Tagged>>> = OnceLock::new();
    S.get_or_init(Default::default)
}

fn executed(tag: &str, step: &'static str) -> bool {
    let mut s = state().lock().unwrap();
    let t = s.entry(tag.to_owned()).or_default();
    *t.executions.entry(step).or_default() += 1;
    t.broken
}

fn executions(tag: &str) -> [u32; 3] {
    let s = state().lock().unwrap();
    let t = &s[tag];
    ["fetch", "charge", "notify"].map(|n| t.executions.get(n).copied().unwrap_or(0))
}

fn set_broken(tag: &str, broken: bool) {
    state()
        .lock()
        .unwrap()
        .entry(tag.to_owned())
        .or_default()
        .broken = broken;
}

#[derive(Deserialize, JsonSchema)]
struct OrderIn {
    tag: String,
}

mod order {
    use super::*;

    /// Fetch, charge (fails fatally while the tag is broken), notify.
    pub async fn execute(ctx: WorkflowCtx, input: OrderIn) -> Result<i64, WorkflowError> {
        let tag = input.tag;
        let t = tag.clone();
        let a: i64 = ctx
            .step("fetch", move |_| {
                let t = t.clone();
                async move {
                    executed(&t, "fetch");
                    Ok(1)
                }
            })
            .await?;
        let t = tag.clone();
        let b: i64 = ctx
            .step("charge", move |_| {
                let t = t.clone();
                async move {
                    if executed(&t, "charge") {
                        return Err(StepError::fatal("card processor misconfigured"));
                    }
                    Ok(10)
                }
            })
            .await?;
        let t = tag.clone();
        let c: i64 = ctx
            .step("notify", move |_| {
                let t = t.clone();
                async move {
                    executed(&t, "notify");
                    Ok(100)
                }
            })
            .await?;
        Ok(a + b + c)
    }

    pub fn tool() -> eve_core::engine::WorkflowTool {
        define_workflow_tool("Fetch, charge, notify.", workflow!(execute))
    }
}

async fn retry_after_a_fix_replays_completed_steps(env: Env, tag: &str) {
    let v1 = Registry::new("v1").with(order::tool());
    set_broken(tag, true);
    let run = env
        .start(&v1, "call-1", "order", serde_json::json!({ "tag": tag }))
        .await;
    let w1 = env.worker(&v1).await;
    let ends = w1.drain().await.unwrap();
    assert!(
        matches!(&ends[..], [(_, ActivationEnd::Failed(e))] if e.contains("misconfigured")),
        "{ends:?}"
    );
    assert_eq!(executions(tag), [1, 1, 0]);
    let old_journal = env.store.read_all(&run, 0).await.unwrap();

    // A retry of a live run is refused; of a failed one before the fix is deployed, allowed.
    // Here: the fix is deployed as v2, and the retry pins the new run to it.
    set_broken(tag, false);
    let v2 = Registry::new("v2").with(order::tool());
    let w2 = env.worker(&v2).await;
    let out = env
        .store
        .retry(&run, &DeploymentId::new("v2"), env.clock.now())
        .await
        .expect("retry");
    assert!(out.created);
    let first_charge = old_journal
        .iter()
        .find(|e| matches!(&e.event, Event::StepFailed { name, .. } if name == "charge"))
        .unwrap()
        .seq;
    assert_eq!(out.from.seq, first_charge, "cut at the failed step");
    assert_eq!(out.run.deployment_id.as_str(), "v2");
    assert!(
        w1.drain().await.unwrap().is_empty(),
        "v1's worker does not take the v2 run"
    );
    let ends = w2.drain().await.unwrap();
    assert!(
        matches!(&ends[..], [(r, ActivationEnd::Completed)] if r == &out.run.run_id),
        "{ends:?}"
    );
    assert_eq!(env.output(&out.run.run_id).await, serde_json::json!(111));
    assert_eq!(
        executions(tag),
        [1, 2, 1],
        "fetch replayed, not executed again; charge and notify executed"
    );
    let events = env.events(&out.run.run_id).await;
    assert_eq!(completed_steps(&events), ["fetch", "charge", "notify"]);
    assert!(matches!(&events[0], Event::RunStarted { reset_from: Some(f), .. } if f == &out.from));
    // The old run is kept as it was.
    assert_eq!(env.status(&run).await, RunStatus::Failed);
    assert_eq!(env.store.read_all(&run, 0).await.unwrap(), old_journal);

    // Idempotent: the same retry names the same run and runs nothing.
    let again = env
        .store
        .retry(&run, &DeploymentId::new("v2"), env.clock.now())
        .await
        .expect("retry again");
    assert_eq!((again.created, again.run.run_id), (false, out.run.run_id));
    assert!(w2.drain().await.unwrap().is_empty());

    // A reset to 1 runs the body from the start: every step again.
    let fresh = env
        .store
        .reset(&run, 1, &DeploymentId::new("v2"), env.clock.now())
        .await
        .expect("reset to 1");
    w2.drain().await.unwrap();
    assert_eq!(env.output(&fresh.run.run_id).await, serde_json::json!(111));
    assert_eq!(executions(tag), [2, 3, 2]);
}

#[tokio::test]
async fn retry_after_a_fix_memory() {
    retry_after_a_fix_replays_completed_steps(common::memory().await, "memory").await
}

#[tokio::test]
async fn retry_after_a_fix_sqlite() {
    retry_after_a_fix_replays_completed_steps(common::sqlite().await, "sqlite").await
}
