#![allow(unreachable_pub)]
//! Replay and determinism: non-determinism detection (changed, reordered, removed steps) parks
//! the run visibly and a fixed deployment resumes it; race winners, `ctx.now()` and
//! `ctx.random()` are identical on every replay; a body waiting on a non-durable future is
//! parked.

mod common;

use common::{completed_steps, Env};
use eve_core::engine::{
    define_workflow_tool, resume_hook, Either, Registry, Worker, WorkflowCtx, WorkflowError,
    WorkflowTool, CODE_NON_DETERMINISM, CODE_STUCK,
};
use eve_core::{workflow, Event, JournalStore, Resolution, RunStatus};
use schemars::JsonSchema;
use serde::Deserialize;
use std::time::Duration;

#[derive(Deserialize, JsonSchema)]
struct OrderIn {
    order: String,
}

mod orders {
    use super::*;

    async fn ship(ctx: &WorkflowCtx, order: &str) -> Result<String, WorkflowError> {
        let label = ctx
            .create_hook::<String>(format!("ship-{order}"))
            .next()
            .await?;
        ctx.step("ship", move |_| {
            let label = label.clone();
            async move { Ok(format!("shipped with {label}")) }
        })
        .await?;
        Ok("done".into())
    }

    pub async fn execute(ctx: WorkflowCtx, input: OrderIn) -> Result<String, WorkflowError> {
        ctx.step("reserve", |_| async { Ok(1) }).await?;
        ctx.step("charge", |_| async { Ok(2) }).await?;
        ship(&ctx, &input.order).await
    }

    pub async fn renamed(ctx: WorkflowCtx, input: OrderIn) -> Result<String, WorkflowError> {
        ctx.step("reserve", |_| async { Ok(1) }).await?;
        ctx.step("bill", |_| async { Ok(2) }).await?;
        ship(&ctx, &input.order).await
    }

    pub async fn reordered(ctx: WorkflowCtx, input: OrderIn) -> Result<String, WorkflowError> {
        ctx.step("charge", |_| async { Ok(2) }).await?;
        ctx.step("reserve", |_| async { Ok(1) }).await?;
        ship(&ctx, &input.order).await
    }

    pub async fn removed(ctx: WorkflowCtx, input: OrderIn) -> Result<String, WorkflowError> {
        ctx.step("reserve", |_| async { Ok(1) }).await?;
        ship(&ctx, &input.order).await
    }

    const ID: &str = "orders::execute";

    pub fn v1() -> WorkflowTool {
        define_workflow_tool(
            "Reserve, charge, wait for a label, ship.",
            workflow!(execute),
        )
    }
    pub fn variants() -> Vec<(&'static str, WorkflowTool, u64, &'static str, &'static str)> {
        vec![
            (
                "changed step name",
                define_workflow_tool("x", workflow!(renamed).with_id(ID)),
                1,
                "step \"charge\"",
                "step \"bill\"",
            ),
            (
                "reordered steps",
                define_workflow_tool("x", workflow!(reordered).with_id(ID)),
                0,
                "step \"reserve\"",
                "step \"charge\"",
            ),
            (
                "removed step",
                define_workflow_tool("x", workflow!(removed).with_id(ID)),
                1,
                "step \"charge\"",
                "hook \"ship-",
            ),
        ]
    }
}

async fn non_determinism_parks_and_resumes(env: Env) {
    let v1 = Registry::new("v1").with(orders::v1());
    for (i, (what, tool, cmd, expected, found)) in orders::variants().into_iter().enumerate() {
        let order = format!("o{i}");
        let run = env
            .start(&v1, &order, "orders", serde_json::json!({ "order": order }))
            .await;
        env.worker(&v1).await.drain().await.unwrap();
        assert_eq!(
            completed_steps(&env.events(&run).await),
            ["reserve", "charge"]
        );
        // A broken deployment (same deployment id, changed body) picks the run up.
        let broken = Registry::new("v1").with(tool.named("orders"));
        resume_hook(
            &*env.store,
            &format!("ship-{order}"),
            "LBL-1",
            None,
            env.clock.now_ts(),
        )
        .await
        .unwrap();
        env.worker(&broken).await.drain().await.unwrap();
        let reason = env.blocked_reason(&run).await;
        assert!(reason.contains(CODE_NON_DETERMINISM), "{what}: {reason}");
        assert!(
            reason.contains(&format!("command {cmd}")),
            "{what}: {reason}"
        );
        assert!(
            reason.contains(expected) && reason.contains(found),
            "{what}: {reason}"
        );
        // Parked, not retried in a loop.
        assert!(env.worker(&broken).await.drain().await.unwrap().is_empty());
        // The fix is deployed: an operator resumes it and it finishes where it stopped.
        env.store
            .resolve_blocked(&run, Resolution::Resume, env.clock.now_ts())
            .await
            .unwrap();
        env.worker(&v1).await.drain().await.unwrap();
        assert_eq!(env.output(&run).await, serde_json::json!("done"), "{what}");
        assert_eq!(
            completed_steps(&env.events(&run).await),
            ["reserve", "charge", "ship"],
            "{what}: no step ran twice"
        );
    }
}

#[derive(Deserialize, JsonSchema)]
struct RaceIn {
    token: String,
}

mod racer {
    use super::*;

    /// Races a hook against a 1 h timer, records the winner in a step, then waits for a second
    /// hook so the run is replayed from the journal before it ends.
    pub async fn execute(
        ctx: WorkflowCtx,
        input: RaceIn,
    ) -> Result<serde_json::Value, WorkflowError> {
        let started = ctx.now();
        let lucky = ctx.random();
        let hook = ctx.create_hook::<String>(input.token.clone());
        let timer = ctx.sleep("1h");
        let winner = match ctx.race(hook.next(), timer.clone()).await {
            Either::Left(payload) => format!("hook:{}", payload?),
            Either::Right(()) => "timer".to_owned(),
        };
        let w = winner.clone();
        let recorded: (String, u64, i64) = ctx
            .step("record", move |_| {
                let w = w.clone();
                async move { Ok((w, lucky, started.millis())) }
            })
            .await?;
        if recorded != (winner.clone(), lucky, started.millis()) {
            return Err(WorkflowError::new(format!(
                "replay diverged: recorded {recorded:?}, replayed {winner} {lucky} {started}"
            )));
        }
        ctx.create_hook::<()>(format!("{}-done", input.token))
            .next()
            .await?;
        Ok(serde_json::json!({ "winner": winner, "random": lucky }))
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Race a hook against a timer.", workflow!(execute))
    }
}

async fn race_winners_identical_on_replay(env: Env) {
    let reg = Registry::new("v1").with(racer::tool());
    let w = env.worker(&reg).await;
    let now = || env.clock.now_ts();

    // A: the hook payload lands first, then the timer is due: the hook wins (earlier seq).
    let a = env
        .start(&reg, "a", "racer", serde_json::json!({"token": "a"}))
        .await;
    w.drain().await.unwrap();
    resume_hook(&*env.store, "a", "early", None, now())
        .await
        .unwrap();
    env.clock.advance(Duration::from_secs(7200));
    w.drain().await.unwrap();
    // B: the timer fires first; a payload arriving later loses, also on replay.
    let b = env
        .start(&reg, "b", "racer", serde_json::json!({"token": "b"}))
        .await;
    w.drain().await.unwrap();
    env.clock.advance(Duration::from_secs(7200));
    w.drain().await.unwrap();
    resume_hook(&*env.store, "b", "late", None, now())
        .await
        .unwrap();
    w.drain().await.unwrap();

    for (run, winner) in [(&a, "hook:early"), (&b, "timer")] {
        let events = env.events(run).await;
        assert!(
            events
                .iter()
                .any(|e| matches!(e, Event::SleepFired { cmd: 1 })),
            "the timer fired in both runs: {events:#?}"
        );
        // Replay from cold (every replay) gives the same winner; the body checks its recorded
        // winner, random number and start time against the replayed ones.
        let report = Worker::replay_cold(&env.store, &reg, run).await.unwrap();
        assert!(!report.finished);
        let token = if run == &a { "a-done" } else { "b-done" };
        resume_hook(&*env.store, token, &(), None, now())
            .await
            .unwrap();
        w.drain().await.unwrap();
        let out = env.output(run).await;
        assert_eq!(out["winner"], winner, "{events:#?}");
    }
    assert_ne!(
        env.output(&a).await["random"],
        env.output(&b).await["random"],
        "ctx.random() is seeded per run"
    );
}

#[derive(Deserialize, JsonSchema)]
struct Empty {}

mod stuck {
    use super::*;

    pub async fn execute(ctx: WorkflowCtx, _: Empty) -> Result<(), WorkflowError> {
        ctx.step("first", |_| async { Ok(()) }).await?;
        // Not a durable operation: the body can never be resumed by the journal.
        std::future::pending::<()>().await;
        Ok(())
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Waits on a non-durable future.", workflow!(execute))
    }
}

async fn non_durable_wait_is_parked(env: Env) {
    let reg = Registry::new("v1").with(stuck::tool());
    let run = env.start(&reg, "s", "stuck", serde_json::json!({})).await;
    env.worker(&reg).await.drain().await.unwrap();
    let reason = env.blocked_reason(&run).await;
    assert!(reason.contains(CODE_STUCK), "{reason}");
    assert_eq!(env.status(&run).await, RunStatus::Blocked);
}

trait Now {
    fn now_ts(&self) -> eve_core::Timestamp;
}

impl Now for std::sync::Arc<eve_core::engine::ManualClock> {
    fn now_ts(&self) -> eve_core::Timestamp {
        eve_core::engine::Clock::now(&**self)
    }
}

#[allow(dead_code)]
fn _store(_: &dyn JournalStore) {}

on_both_stores!(
    non_determinism_parks_and_resumes,
    race_winners_identical_on_replay,
    non_durable_wait_is_parked,
);
