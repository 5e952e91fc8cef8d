#![allow(unreachable_pub)]
//! Local steps (`StepFuture::local`, `#[step(local)]`): consecutive local steps commit in one
//! append (with the run's end when the body returns), a replay never runs a committed one
//! again, a failed attempt ends the batch and retries as a normal step does, and a crash inside
//! a batch — before its append, or during it — runs exactly the uncommitted ones again while
//! every outcome is recorded once.

mod common;

use common::{completed_steps, Env, LEASE};
use eve_core::engine::{
    define_workflow_tool, ActivationEnd, Registry, RetryPolicy, StepCtx, StepError, WorkflowCtx,
    WorkflowError,
};
use eve_core::testing::{Fault, FaultyStore};
use eve_core::{workflow, Event, RunId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::Notify;

/// Step executions by idempotency key (run id + cmd).
fn executions() -> &'static Mutex<HashMap<String, u32>> {
    static E: OnceLock<Mutex<HashMap<String, u32>>> = OnceLock::new();
    E.get_or_init(Default::default)
}

fn count(s: &StepCtx) -> u32 {
    let mut m = executions().lock().unwrap();
    let n = m.entry(s.idempotency_key()).or_default();
    *n += 1;
    *n
}

/// Executions of each command of `run`, by cmd.
fn executions_of(run: &RunId) -> Vec<(u64, u32)> {
    let prefix = format!("{run}:");
    let mut v: Vec<(u64, u32)> = executions()
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(k, n)| Some((k.strip_prefix(&prefix)?.parse().ok()?, *n)))
        .collect();
    v.sort_unstable();
    v
}

/// Appends made through `store` (a counting wrapper).
fn appends(store: &FaultyStore) -> usize {
    store
        .call_log()
        .into_iter()
        .filter(|c| *c == "append")
        .count()
}

/// Every tool's input.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct Start {
    start: i64,
}

mod ten {
    use super::*;

    /// Ten local steps, each adding its number to the running total.
    pub async fn execute(ctx: WorkflowCtx, input: Start) -> Result<i64, WorkflowError> {
        let mut total = input.start;
        for i in 1..=10i64 {
            let t = total;
            total = ctx
                .step(format!("add-{i}"), move |s| async move {
                    count(&s);
                    Ok(t + i)
                })
                .local()
                .await?;
        }
        Ok(total)
    }

    pub fn tool() -> eve_core::engine::WorkflowTool {
        define_workflow_tool("Adds 1..10 in ten local steps.", workflow!(execute)).named("ten")
    }
}

mod mixed {
    use super::*;

    /// Three local steps, a normal one, two local, a sleep, two local, progress, then returns.
    pub async fn execute(ctx: WorkflowCtx, _input: Start) -> Result<Vec<u32>, WorkflowError> {
        let mut out = Vec::new();
        let local = |name: &str, v: u32| {
            ctx.step(name, move |s| async move {
                count(&s);
                Ok(v)
            })
            .local()
        };
        for i in 0..3 {
            out.push(local(&format!("a{i}"), i).await?);
        }
        out.push(
            ctx.step("normal", |s| async move {
                count(&s);
                Ok(100u32)
            })
            .await?,
        );
        for i in 0..2 {
            out.push(local(&format!("b{i}"), 10 + i).await?);
        }
        ctx.sleep("1m").await;
        for i in 0..2 {
            out.push(local(&format!("c{i}"), 20 + i).await?);
        }
        ctx.progress(&serde_json::json!({"done": out.len()}));
        Ok(out)
    }

    pub fn tool() -> eve_core::engine::WorkflowTool {
        define_workflow_tool("Local and normal steps, a sleep.", workflow!(execute)).named("mixed")
    }
}

mod flaky {
    use super::*;

    /// A local step whose first attempt fails (retried after 5 s), a local step that fails
    /// fatally (the body carries on), then one more local step.
    pub async fn execute(ctx: WorkflowCtx, _input: Start) -> Result<String, WorkflowError> {
        let a: u32 = ctx
            .step("flaky", |s| async move {
                if count(&s) == 1 {
                    return Err(StepError::retryable("busy"));
                }
                Ok(s.attempt())
            })
            .retry(RetryPolicy {
                max_retries: 2,
                initial_backoff: Duration::from_secs(5),
                ..RetryPolicy::default()
            })
            .local()
            .await?;
        let b = ctx
            .step("broken", |s| async move {
                count(&s);
                Err::<u32, _>(StepError::fatal("no such account"))
            })
            .local()
            .await;
        let c: u32 = ctx
            .step("after", |s| async move {
                count(&s);
                Ok(7)
            })
            .local()
            .await?;
        Ok(format!("{a}/{}/{c}", b.is_err()))
    }

    pub fn tool() -> eve_core::engine::WorkflowTool {
        define_workflow_tool("Failing local steps.", workflow!(execute)).named("flaky")
    }
}

/// Notified (once per run) when a held step of the run starts.
fn gate(run: &RunId) -> Arc<Notify> {
    static G: OnceLock<Mutex<HashMap<RunId, Arc<Notify>>>> = OnceLock::new();
    G.get_or_init(Default::default)
        .lock()
        .unwrap()
        .entry(run.clone())
        .or_default()
        .clone()
}

mod held {
    use super::*;

    /// Ten local steps; the sixth one's first execution tells the test it runs and then never
    /// finishes (the test drops the worker meanwhile: a crash inside the batch).
    pub async fn execute(ctx: WorkflowCtx, _input: Start) -> Result<u32, WorkflowError> {
        let mut sum = 0;
        for i in 1..=10u32 {
            sum += ctx
                .step(format!("h{i}"), move |s| async move {
                    if count(&s) == 1 && i == 6 {
                        gate(s.run_id()).notify_one();
                        std::future::pending::<()>().await;
                    }
                    Ok(i)
                })
                .local()
                .await?;
        }
        Ok(sum)
    }

    pub fn tool() -> eve_core::engine::WorkflowTool {
        define_workflow_tool("Ten local steps, one held.", workflow!(execute)).named("held")
    }
}

fn registry() -> Registry {
    Registry::new("v1")
        .with(ten::tool())
        .with(mixed::tool())
        .with(flaky::tool())
        .with(held::tool())
}

/// Ten local steps commit in one append, together with the run's end: the call costs one
/// commit after its start. A cold replay feeds the outcomes back without running a step.
async fn ten_local_steps_commit_once(env: Env) {
    let reg = registry();
    let counting = FaultyStore::new(env.store.clone());
    let run = env
        .start(&reg, "ten", "ten", serde_json::json!({"start": 5}))
        .await;
    let w = env.worker_on(counting.clone(), &reg).await;
    assert_eq!(
        w.drain().await.unwrap(),
        vec![(run.clone(), ActivationEnd::Completed)]
    );
    assert_eq!(env.output(&run).await, serde_json::json!(60));
    let names: Vec<String> = (1..=10).map(|i| format!("add-{i}")).collect();
    assert_eq!(completed_steps(&env.events(&run).await), names);
    assert_eq!(
        appends(&counting),
        1,
        "ten local steps and the end in one append: {:?}",
        counting.call_log()
    );
    let journal = env.events(&run).await;
    assert_eq!(journal.len(), 12, "RunStarted, 10 outcomes, RunCompleted");
    assert_eq!(
        executions_of(&run),
        (0..10).map(|c| (c, 1)).collect::<Vec<_>>()
    );
    // Replay runs no step: the recorded outcomes are fed back, as for normal steps.
    let report = eve_core::engine::Worker::replay_cold(&env.store, &reg, &run)
        .await
        .unwrap();
    assert!(report.finished);
    assert_eq!(report.commands, 10);
    assert_eq!(
        executions_of(&run),
        (0..10).map(|c| (c, 1)).collect::<Vec<_>>()
    );
}

/// A batch ends at a normal step (committed just before it starts), at a sleep (committed with
/// the sleep's timer) and at the end (with the end and the last progress); each outcome is
/// recorded once, in command order, and the run replays.
async fn batches_end_at_other_commands(env: Env) {
    let reg = registry();
    let counting = FaultyStore::new(env.store.clone());
    let run = env
        .start(&reg, "mixed", "mixed", serde_json::json!({"start": 0}))
        .await;
    let w = env.worker_on(counting.clone(), &reg).await;
    w.drain().await.unwrap();
    env.clock.advance(Duration::from_secs(61));
    w.drain().await.unwrap();
    assert_eq!(
        env.output(&run).await,
        serde_json::json!([0, 1, 2, 100, 10, 11, 20, 21])
    );
    let events = env.events(&run).await;
    assert_eq!(
        completed_steps(&events),
        ["a0", "a1", "a2", "normal", "b0", "b1", "c0", "c1"]
    );
    // a0..a2 | normal | b0,b1 | sleep scheduled | fired | c0,c1 + progress + end.
    let n = appends(&counting);
    assert!(
        n <= 6,
        "at most one append per batch and per other command, got {n}: {:?}",
        counting.call_log()
    );
    assert!(executions_of(&run).iter().all(|(_, n)| *n == 1));
    let report = eve_core::engine::Worker::replay_cold(&env.store, &reg, &run)
        .await
        .unwrap();
    assert!(report.finished);
    assert_eq!(report.commands, 10, "8 steps, the sleep and the progress");
}

/// A retryable failure ends the batch with its `StepFailed` (a durable retry timer, as for a
/// normal step); a fatal one is handed to the body, which goes on with the next local step.
async fn failed_local_attempts_retry_durably(env: Env) {
    let reg = registry();
    let run = env
        .start(&reg, "flaky", "flaky", serde_json::json!({"start": 0}))
        .await;
    let w = env.worker(&reg).await;
    assert_eq!(
        w.drain().await.unwrap(),
        vec![(run.clone(), ActivationEnd::Suspended)],
        "the retry waits for its backoff"
    );
    let events = env.events(&run).await;
    assert!(
        matches!(
            events.last(),
            Some(Event::StepFailed { name, attempt: 1, retry_at: Some(_), fatal: false, .. }) if name == "flaky"
        ),
        "{events:#?}"
    );
    env.clock.advance(Duration::from_secs(5));
    w.drain().await.unwrap();
    assert_eq!(env.output(&run).await, serde_json::json!("2/true/7"));
    let events = env.events(&run).await;
    assert_eq!(completed_steps(&events), ["flaky", "after"]);
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, Event::StepFailed { name, fatal: true, retry_at: None, .. } if name == "broken"))
            .count(),
        1
    );
}

/// A crash inside a batch (the worker is dropped while the sixth of ten local steps runs, so
/// five outcomes were delivered to the body and none committed) runs exactly the uncommitted
/// steps again in the next activation; each outcome is recorded once.
async fn crash_inside_a_batch_reruns_the_uncommitted(env: Env) {
    let reg = registry();
    let run = env
        .start(&reg, "held", "held", serde_json::json!({"start": 0}))
        .await;
    let w1 = Arc::new(env.worker(&reg).await);
    let task = {
        let w1 = w1.clone();
        tokio::spawn(async move { w1.drain().await })
    };
    gate(&run).notified().await;
    task.abort();
    let _ = task.await;
    drop(w1);
    assert_eq!(
        env.events(&run).await.len(),
        1,
        "nothing of the batch was committed"
    );
    env.clock.advance(LEASE + Duration::from_secs(1));
    let w2 = env.worker(&reg).await;
    w2.drain().await.unwrap();
    assert_eq!(env.output(&run).await, serde_json::json!(55));
    let names: Vec<String> = (1..=10).map(|i| format!("h{i}")).collect();
    assert_eq!(completed_steps(&env.events(&run).await), names);
    let expected: Vec<(u64, u32)> = (0..10).map(|c| (c, if c < 6 { 2 } else { 1 })).collect();
    assert_eq!(
        executions_of(&run),
        expected,
        "the five delivered and the held one ran again, the rest once"
    );
}

/// A crash after each store call of the ten-local-step run, and an ambiguous commit (the
/// batch's append lands, the worker cannot know, and dies) at each: the run finishes with the
/// right output, each outcome recorded once; steps run again only when their batch's append
/// did not land.
async fn crash_at_every_store_call(env: Env) {
    let reg = registry();
    for ambiguous in [false, true] {
        for n in 0.. {
            let faulty = FaultyStore::new(env.store.clone());
            let run = env
                .start(
                    &reg,
                    &format!("crash-{ambiguous}-{n}"),
                    "ten",
                    serde_json::json!({"start": 0}),
                )
                .await;
            let w1 = env.worker_on(faulty.clone(), &reg).await;
            faulty.set_fault(if ambiguous {
                Fault::AmbiguousThenCrash(n)
            } else {
                Fault::CrashAfter(n)
            });
            let _ = w1.drain().await;
            let tripped = faulty.tripped();
            drop(w1);
            env.clock.advance(LEASE + Duration::from_secs(1));
            let w2 = env.worker(&reg).await;
            for _ in 0..5 {
                w2.drain().await.unwrap();
                if env.status(&run).await.is_terminal() {
                    break;
                }
                env.clock.advance(LEASE + Duration::from_secs(1));
            }
            let log = faulty.call_log();
            assert_eq!(
                env.output(&run).await,
                serde_json::json!(55),
                "crash after call {n} ({log:?})"
            );
            let names: Vec<String> = (1..=10).map(|i| format!("add-{i}")).collect();
            assert_eq!(
                completed_steps(&env.events(&run).await),
                names,
                "crash after call {n}: each outcome recorded once"
            );
            // The batch is one append: its steps all ran again, or none did.
            let runs: Vec<u32> = executions_of(&run).into_iter().map(|(_, n)| n).collect();
            assert_eq!(runs.len(), 10);
            assert!(
                runs.iter().all(|r| *r == runs[0]) && (1..=2).contains(&runs[0]),
                "crash after call {n} ({log:?}): {runs:?}"
            );
            if ambiguous && log.get(n as usize) == Some(&"append") {
                assert_eq!(
                    runs[0], 1,
                    "the ambiguous append landed: nothing runs again"
                );
            }
            if !tripped {
                break;
            }
            drop(faulty);
        }
    }
}

on_both_stores!(
    ten_local_steps_commit_once,
    batches_end_at_other_commands,
    failed_local_attempts_retry_durably,
    crash_inside_a_batch_reruns_the_uncommitted,
    crash_at_every_store_call,
);
