#![allow(unreachable_pub)]
//! `ctx.set_attributes` through the engine: each call is journaled once as `AttributesSet`
//! (a replay after a sleep matches it and writes nothing), the run's record carries the merged
//! attributes, and an invalid patch is a typed error in the body that records nothing.

mod common;

use common::Env;
use eve_core::engine::{define_workflow_tool, Registry, WorkflowCtx, WorkflowError};
use eve_core::{workflow, AttributeError, Event, RunSearch, RunStatus};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::time::Duration;

#[derive(Deserialize, JsonSchema)]
struct LabelIn {
    region: String,
}

mod label {
    use super::*;

    /// Labels the run, sleeps (so the next activation replays), relabels, then tries a nested
    /// value and reports the error's kind.
    pub async fn execute(ctx: WorkflowCtx, input: LabelIn) -> Result<String, WorkflowError> {
        ctx.set_attributes(&json!({"region": input.region, "cost": 10.0, "stage": "start"}))
            .expect("valid attributes");
        ctx.sleep("1m").await;
        ctx.set_attributes(&json!({"stage": null, "cost": 12.5}))
            .expect("valid attributes");
        let refused = match ctx.set_attributes(&json!({"nested": {"a": 1}})) {
            Err(AttributeError::InvalidValue { key, .. }) => format!("invalid value {key}"),
            other => format!("unexpected {other:?}"),
        };
        Ok(refused)
    }

    pub fn tool() -> eve_core::engine::WorkflowTool {
        define_workflow_tool("Labels its run.", workflow!(execute))
    }
}

async fn journaled_once_across_replays(env: Env) {
    let registry = Registry::new("v1").with(label::tool());
    let run = env
        .start(&registry, "call-1", "label", json!({"region": "eu"}))
        .await;
    let worker = env.worker(&registry).await;
    worker.drain().await.unwrap();
    let rec = env.store.get_run(&run).await.unwrap();
    assert_eq!(
        serde_json::to_value(&rec.attributes).unwrap(),
        json!({"region": "eu", "cost": 10, "stage": "start"}),
        "recorded before the sleep"
    );
    env.clock.advance(Duration::from_secs(61));
    worker.drain().await.unwrap();
    assert_eq!(env.status(&run).await, RunStatus::Completed);
    assert_eq!(env.output(&run).await, json!("invalid value nested"));
    let events = env.events(&run).await;
    let sets: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            Event::AttributesSet { cmd, .. } => Some(*cmd),
            _ => None,
        })
        .collect();
    assert_eq!(
        sets.len(),
        2,
        "one event per call, none on replay: {events:?}"
    );
    let rec = env.store.get_run(&run).await.unwrap();
    assert_eq!(
        serde_json::to_value(&rec.attributes).unwrap(),
        json!({"region": "eu", "cost": 12.5})
    );
    let found = eve_core::search_runs(
        &*env.store,
        &eve_core::RunQuery::default(),
        Some(
            &RunSearch::parse("attr.region = \"eu\" and attr.cost > 12 and input.region = \"eu\"")
                .unwrap(),
        ),
    )
    .await
    .unwrap();
    assert_eq!(found.len(), 1);
}

on_both_stores!(journaled_once_across_replays);
