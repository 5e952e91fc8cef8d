#![allow(unreachable_pub)]
//! Steps: results recorded once across crashes at every store call, ambiguous commits, retry
//! with backoff as durable timers, fatal errors, panics in steps and bodies.

mod common;

use common::{completed_steps, Env, LEASE};
use eve_core::engine::{
    define_workflow_tool, ActivationEnd, Registry, RetryPolicy, StepCtx, StepError, WorkflowCtx,
    WorkflowError, CODE_BODY_PANIC,
};
use eve_core::testing::{Fault, FaultyStore};
use eve_core::{workflow, Event, JournalStore, Resolution, RunId, RunStatus};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

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

#[derive(Deserialize, JsonSchema)]
struct FiveIn {
    start: i64,
}

#[derive(Serialize, Deserialize, JsonSchema, Debug, PartialEq)]
struct FiveOut {
    total: i64,
}

mod five {
    use super::*;

    /// Five sequential steps, each adding its number to the running total.
    pub async fn execute(ctx: WorkflowCtx, input: FiveIn) -> Result<FiveOut, WorkflowError> {
        let mut total = input.start;
        for i in 1..=5i64 {
            let t = total;
            total = ctx
                .step(format!("add-{i}"), move |s| async move {
                    count(&s);
                    Ok(t + i)
                })
                .await?;
        }
        Ok(FiveOut { total })
    }

    pub fn tool() -> eve_core::engine::WorkflowTool {
        define_workflow_tool("Adds 1..5 in five steps.", workflow!(execute))
    }
}

fn five_registry() -> Registry {
    Registry::new("v1").with(five::tool())
}

async fn five_steps_complete_once(env: Env) {
    let reg = five_registry();
    assert_eq!(
        reg.by_name("five").unwrap().workflow_id().as_str(),
        "five::execute"
    );
    let run = env
        .start(&reg, "c1", "five", serde_json::json!({"start": 10}))
        .await;
    let w = env.worker(&reg).await;
    let ends = w.drain().await.unwrap();
    assert_eq!(ends, vec![(run.clone(), ActivationEnd::Completed)]);
    assert_eq!(env.output(&run).await, serde_json::json!({"total": 25}));
    let events = env.events(&run).await;
    assert_eq!(
        completed_steps(&events),
        ["add-1", "add-2", "add-3", "add-4", "add-5"]
    );
    // One append per step outcome plus the end: no StepScheduled, no guard timer.
    assert_eq!(executions_of(&run), 5);
    // A cold replay re-executes the body against the journal without running steps.
    let report = eve_core::engine::Worker::replay_cold(&env.store, &reg, &run)
        .await
        .unwrap();
    assert!(report.finished);
    assert_eq!(report.commands, 5);
    assert_eq!(report.events, events.len() as u64);
}

/// A crash (every store call fails from then on; the worker drops everything) after each
/// store call of a 5-step run; a new worker takes over after the lease expires. The run
/// finishes with the right output and each step's result is recorded exactly once.
async fn crash_at_every_store_call(env: Env) {
    let reg = five_registry();
    let mut crash_points = 0;
    for n in 0.. {
        let faulty = FaultyStore::new(env.store.clone());
        let run = env
            .start(
                &reg,
                &format!("crash-{n}"),
                "five",
                serde_json::json!({"start": 0}),
            )
            .await;
        let w1 = env.worker_on(faulty.clone(), &reg).await;
        faulty.set_fault(Fault::CrashAfter(n));
        let _ = w1.drain().await;
        let tripped = faulty.tripped();
        // The restarted process: a fresh worker once the old lease has expired.
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
            env.output(&run).await,
            serde_json::json!({"total": 15}),
            "crash after call {n} ({:?})",
            faulty.call_log()
        );
        let events = env.events(&run).await;
        assert_eq!(
            completed_steps(&events),
            ["add-1", "add-2", "add-3", "add-4", "add-5"],
            "crash after call {n}: each result recorded once"
        );
        assert!(executions_of(&run) >= 5);
        if !tripped {
            // The first worker finished without reaching call n: every point is covered.
            break;
        }
        crash_points += 1;
    }
    assert!(
        crash_points >= 8,
        "a 5-step run makes at least 8 store calls (claim, read, 5 step appends, the end)"
    );
}

mod step_then_hook {
    use super::*;

    /// One step, then waits for one payload on the hook `legacy-hook`.
    pub async fn execute(
        ctx: WorkflowCtx,
        _input: serde_json::Value,
    ) -> Result<String, WorkflowError> {
        let n: i64 = ctx
            .step("one", |s| async move {
                count(&s);
                Ok(1)
            })
            .await?;
        let hook = ctx.create_hook::<String>("legacy-hook");
        Ok(format!("{n}:{}", hook.next().await?))
    }

    pub fn tool() -> eve_core::engine::WorkflowTool {
        define_workflow_tool("A step, then a hook.", workflow!(execute))
    }
}

mod long_then_hook {
    use super::*;

    /// 300 steps, then a hook payload, then one more step.
    pub async fn execute(
        ctx: WorkflowCtx,
        _input: serde_json::Value,
    ) -> Result<u32, WorkflowError> {
        for i in 0..300u32 {
            ctx.step(format!("s{i}"), move |_| async move { Ok(i) })
                .await?;
        }
        let hook = ctx.create_hook::<u32>("long-hook");
        let n = hook.next().await?;
        Ok(ctx.step("last", move |_| async move { Ok(n + 1) }).await?)
    }

    pub fn tool() -> eve_core::engine::WorkflowTool {
        define_workflow_tool("300 steps, a hook, a step.", workflow!(execute))
    }
}

/// A worker that still holds a suspended run's body resumes it from where it stopped: it reads
/// only the events written since (the hook payload), not the 300 steps before; with no sticky
/// bodies it replays the whole journal.
async fn warm_resume_reads_only_new_events(env: Env) {
    let reg = Registry::new("v1").with(long_then_hook::tool());
    for (sticky, tag) in [(256, "warm"), (0, "cold")] {
        let store = FaultyStore::new(env.store.clone());
        let run = env
            .start(
                &reg,
                &format!("long-{tag}"),
                "long_then_hook",
                serde_json::json!({}),
            )
            .await;
        let w = eve_core::engine::Worker::new(
            store.clone(),
            reg.clone(),
            env.clock.clone(),
            eve_core::engine::WorkerConfig {
                sticky_bodies: sticky,
                ..env.config()
            },
        )
        .await
        .unwrap();
        assert_eq!(w.drain().await.unwrap()[0].1, ActivationEnd::Suspended);
        store.set_fault(Fault::None);
        eve_core::engine::resume_hook(
            &*env.store,
            "long-hook",
            &41,
            None,
            eve_core::engine::Clock::now(&*env.clock),
        )
        .await
        .unwrap();
        assert_eq!(w.drain().await.unwrap()[0].1, ActivationEnd::Completed);
        assert_eq!(env.output(&run).await, serde_json::json!(42));
        let read = store.events_read();
        if sticky > 0 {
            assert!(read <= 2, "a warm resume read {read} events");
        } else {
            assert!(
                read > 300,
                "a cold resume replays the journal ({read} events read)"
            );
        }
    }
}

/// A journal written by an older version, whose worker died mid-run with its guard timer set
/// (`SleepScheduled` of `GUARD_CMD`, no `SleepFired`), still resumes at once (the run is
/// orphaned): the new worker replays past the guard, and when the body parks it fires the
/// guard, so its timer cannot keep the parked run claimable; the run then finishes on its
/// delivery, its step recorded once.
async fn journal_with_a_set_guard_timer_resumes(env: Env) {
    use eve_core::engine::GUARD_CMD;
    use eve_core::{Append, AppendId, DeploymentId, Payload, WorkerId};
    let reg = Registry::new("v1").with(step_then_hook::tool());
    let run = env
        .start(
            &reg,
            "legacy-guard",
            "step_then_hook",
            serde_json::json!({}),
        )
        .await;
    let now = eve_core::engine::Clock::now(&*env.clock);
    let old = env
        .store
        .register_worker(
            &WorkerId::new("old-version"),
            &DeploymentId::new("v1"),
            LEASE,
            now,
        )
        .await
        .unwrap();
    assert_eq!(env.store.claim(&old, 1, now).await.unwrap().len(), 1);
    env.store
        .append(Append {
            run: run.clone(),
            expected_seq: 1,
            lease: old.clone(),
            append_id: AppendId::random(),
            events: vec![
                Event::SleepScheduled {
                    cmd: GUARD_CMD,
                    wake_at: now.plus(LEASE),
                },
                Event::StepCompleted {
                    cmd: 0,
                    name: "one".into(),
                    attempt: 1,
                    output: Payload::from_value(&1).unwrap(),
                },
            ],
            now,
        })
        .await
        .unwrap();
    // The old process is gone; a new one registers its id again and takes the run at once.
    let w = eve_core::engine::Worker::new(
        env.store.clone(),
        reg.clone(),
        env.clock.clone(),
        eve_core::engine::WorkerConfig {
            id: Some(WorkerId::new("old-version")),
            ..env.config()
        },
    )
    .await
    .unwrap();
    let ends = w.drain().await.unwrap();
    assert_eq!(ends, vec![(run.clone(), ActivationEnd::Suspended)]);
    assert!(
        env.events(&run)
            .await
            .iter()
            .any(|e| matches!(e, Event::SleepFired { cmd } if *cmd == GUARD_CMD)),
        "the guard was fired"
    );
    env.clock.advance(LEASE * 2);
    assert!(
        w.drain().await.unwrap().is_empty(),
        "the parked run is not claimable once its old guard is due"
    );
    eve_core::engine::resume_hook(
        &*env.store,
        "legacy-hook",
        &"hi",
        None,
        eve_core::engine::Clock::now(&*env.clock),
    )
    .await
    .unwrap();
    w.drain().await.unwrap();
    assert_eq!(env.output(&run).await, serde_json::json!("1:hi"));
    assert_eq!(
        executions_of(&run),
        0,
        "the recorded step did not run again"
    );
}

/// An append that lands but answers `Unavailable` is retried with the same append id and
/// recognised as a duplicate: nothing is written twice and the run goes on.
async fn ambiguous_commits(env: Env) {
    let reg = five_registry();
    for n in 0..30 {
        let faulty = FaultyStore::new(env.store.clone());
        let run = env
            .start(
                &reg,
                &format!("amb-{n}"),
                "five",
                serde_json::json!({"start": 1}),
            )
            .await;
        let w = eve_core::engine::Worker::new(
            faulty.clone(),
            reg.clone(),
            env.clock.clone(),
            eve_core::engine::WorkerConfig {
                store_retries: 3,
                lease_ttl: LEASE,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        faulty.set_fault(Fault::AmbiguousAt(n));
        w.drain().await.unwrap();
        if env.status(&run).await != RunStatus::Completed {
            // An ambiguous claim or release: the run waits for the lease to expire.
            env.clock.advance(LEASE + Duration::from_secs(1));
            w.drain().await.unwrap();
        }
        assert_eq!(env.output(&run).await, serde_json::json!({"total": 16}));
        assert_eq!(
            completed_steps(&env.events(&run).await).len(),
            5,
            "at call {n}"
        );
    }
}

mod flaky {
    use super::*;

    #[derive(Deserialize, JsonSchema)]
    pub struct In {
        /// Attempts that fail before one succeeds.
        pub failures: u32,
        /// Fail fatally instead.
        pub fatal: bool,
        /// Retries allowed.
        pub retries: u32,
        /// Panic instead of returning an error.
        pub panic: bool,
    }

    pub async fn execute(ctx: WorkflowCtx, input: In) -> Result<u32, WorkflowError> {
        let In {
            failures,
            fatal,
            retries,
            panic,
        } = input;
        let attempt = ctx
            .step("flaky", move |s| async move {
                if s.attempt() <= failures {
                    if panic {
                        panic!("boom at attempt {}", s.attempt());
                    }
                    if fatal {
                        return Err(StepError::fatal("card declined"));
                    }
                    return Err(StepError::retryable(format!("try {} failed", s.attempt())));
                }
                Ok(s.attempt())
            })
            .retry(RetryPolicy::retries(retries))
            .await?;
        Ok(attempt)
    }

    pub fn tool() -> eve_core::engine::WorkflowTool {
        define_workflow_tool("A step that fails some attempts.", workflow!(execute))
    }
}

fn failures(events: &[Event]) -> Vec<(u32, bool, Option<i64>)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::StepFailed {
                attempt,
                fatal,
                retry_at,
                ..
            } => Some((*attempt, *fatal, retry_at.map(|t| t.millis()))),
            _ => None,
        })
        .collect()
}

async fn retry_backoff_and_fatal(env: Env) {
    let reg = Registry::new("v1").with(flaky::tool());
    let t0 = env.clock.now_ms();
    // Two failures, default backoff 1 s then 2 s, as durable timers.
    let run = env
        .start(
            &reg,
            "r1",
            "flaky",
            serde_json::json!({"failures": 2, "fatal": false, "retries": 3, "panic": false}),
        )
        .await;
    let w = env.worker(&reg).await;
    assert_eq!(w.drain().await.unwrap()[0].1, ActivationEnd::Suspended);
    assert_eq!(
        failures(&env.events(&run).await),
        [(1, false, Some(t0 + 1000))]
    );
    // Not due yet: nothing to claim.
    env.clock.advance(Duration::from_millis(999));
    assert!(w.drain().await.unwrap().is_empty());
    env.clock.advance(Duration::from_millis(1));
    w.drain().await.unwrap();
    assert_eq!(
        failures(&env.events(&run).await),
        [(1, false, Some(t0 + 1000)), (2, false, Some(t0 + 3000))]
    );
    env.clock.advance(Duration::from_secs(2));
    w.drain().await.unwrap();
    assert_eq!(env.output(&run).await, serde_json::json!(3));

    // Retries exhausted: 1 retry = 2 attempts, then the step error escapes and fails the run.
    let run = env
        .start(
            &reg,
            "r2",
            "flaky",
            serde_json::json!({"failures": 9, "fatal": false, "retries": 1, "panic": false}),
        )
        .await;
    w.drain().await.unwrap();
    env.clock.advance(Duration::from_secs(1));
    w.drain().await.unwrap();
    let f = failures(&env.events(&run).await);
    assert_eq!(f.len(), 2);
    assert_eq!(f[1].2, None, "the last attempt schedules no retry");
    let err = env.error(&run).await;
    assert!(
        err.contains("\"flaky\"") && err.contains("2 attempt"),
        "{err}"
    );

    // Fatal: never retried.
    let run = env
        .start(
            &reg,
            "r3",
            "flaky",
            serde_json::json!({"failures": 9, "fatal": true, "retries": 3, "panic": false}),
        )
        .await;
    w.drain().await.unwrap();
    assert_eq!(failures(&env.events(&run).await), [(1, true, None)]);
    assert!(env.error(&run).await.contains("card declined"));
}

async fn panicking_step_is_a_failed_attempt(env: Env) {
    let reg = Registry::new("v1").with(flaky::tool());
    let run = env
        .start(
            &reg,
            "p1",
            "flaky",
            serde_json::json!({"failures": 1, "fatal": false, "retries": 3, "panic": true}),
        )
        .await;
    let w = env.worker(&reg).await;
    w.drain().await.unwrap();
    let events = env.events(&run).await;
    let msg = events
        .iter()
        .find_map(|e| match e {
            Event::StepFailed { error, .. } => Some(error.clone()),
            _ => None,
        })
        .unwrap();
    assert!(
        msg.contains("panicked") && msg.contains("boom at attempt 1"),
        "{msg}"
    );
    env.clock.advance(Duration::from_secs(1));
    w.drain().await.unwrap();
    assert_eq!(env.output(&run).await, serde_json::json!(2));
}

mod panicky {
    use super::*;

    #[derive(Deserialize, JsonSchema)]
    pub struct In {}

    pub async fn execute(ctx: WorkflowCtx, _: In) -> Result<(), WorkflowError> {
        ctx.step("before", |_| async { Ok(()) }).await?;
        let v: Vec<u32> = Vec::new();
        if v.is_empty() {
            panic!("body bug: index out of range");
        }
        Ok(())
    }

    pub fn tool() -> eve_core::engine::WorkflowTool {
        define_workflow_tool("A body that panics.", workflow!(execute))
    }
}

async fn panicking_body_parks_the_run(env: Env) {
    let reg = Registry::new("v1").with(panicky::tool()).with(five::tool());
    let run = env
        .start(&reg, "b1", "panicky", serde_json::json!({}))
        .await;
    let other = env
        .start(&reg, "b2", "five", serde_json::json!({"start": 0}))
        .await;
    let w = env.worker(&reg).await;
    w.drain().await.unwrap();
    let reason = env.blocked_reason(&run).await;
    assert!(
        reason.contains(CODE_BODY_PANIC) && reason.contains("body bug"),
        "{reason}"
    );
    // The worker is unharmed and ran the other run.
    assert_eq!(env.status(&other).await, RunStatus::Completed);
    // Blocked runs are not claimed again in a loop.
    assert!(w.drain().await.unwrap().is_empty());
    // An operator fails it, which settles its tool call.
    env.store
        .resolve_blocked(
            &run,
            Resolution::Fail {
                error: "failed by operator".into(),
            },
            env.clock.now_ts(),
        )
        .await
        .unwrap();
    assert_eq!(env.status(&run).await, RunStatus::Failed);
}

/// A run whose activations keep dying (here: the store fails every append) is claimed again
/// after each lease expiry, and parked as poisoned after `max_activations`.
async fn poison_runs_are_parked(env: Env) {
    let reg = five_registry();
    let run = env
        .start(&reg, "poison", "five", serde_json::json!({"start": 0}))
        .await;
    let faulty = FaultyStore::new(env.store.clone());
    let config = eve_core::engine::WorkerConfig {
        id: Some(eve_core::WorkerId::new("crashy")),
        ..env.config()
    };
    for _ in 0..6 {
        // A process that registers, claims and reads, then dies mid-activation; each restart
        // re-registers the same worker id (fencing the dead epoch).
        faulty.set_fault(Fault::CrashAfter(3));
        let w = eve_core::engine::Worker::new(
            faulty.clone(),
            reg.clone(),
            env.clock.clone(),
            config.clone(),
        )
        .await
        .unwrap();
        let _ = w.drain().await;
    }
    faulty.heal();
    let w = eve_core::engine::Worker::new(faulty.clone(), reg.clone(), env.clock.clone(), config)
        .await
        .unwrap();
    w.drain().await.unwrap();
    let reason = env.blocked_reason(&run).await;
    assert!(reason.contains("EVE-POISON-001"), "{reason}");
}

mod pair {
    use super::*;

    #[derive(Deserialize, JsonSchema)]
    pub struct In {
        pub id: String,
    }

    fn barrier(id: &str) -> Arc<tokio::sync::Barrier> {
        static B: OnceLock<Mutex<HashMap<String, Arc<tokio::sync::Barrier>>>> = OnceLock::new();
        B.get_or_init(Default::default)
            .lock()
            .unwrap()
            .entry(id.to_owned())
            .or_insert_with(|| Arc::new(tokio::sync::Barrier::new(2)))
            .clone()
    }

    /// Two steps issued together, each waiting for the other at a barrier: they complete only
    /// if they run concurrently. Then a select over two more steps.
    pub async fn execute(ctx: WorkflowCtx, input: In) -> Result<Vec<String>, WorkflowError> {
        let mk = |name: &'static str| {
            let id = input.id.clone();
            ctx.step(name, move |_| {
                let b = barrier(&id);
                async move {
                    tokio::time::timeout(Duration::from_secs(10), b.wait())
                        .await
                        .map_err(|_| StepError::fatal("steps did not run concurrently"))?;
                    Ok(name.to_owned())
                }
            })
        };
        let both = ctx.join_all(vec![mk("left"), mk("right")]).await;
        let mut out: Vec<String> = both.into_iter().collect::<Result<_, _>>()?;
        let (i, first) = ctx
            .select(vec![
                ctx.step("slow", |_| async { Ok("slow".to_owned()) }),
                ctx.step("fast", |_| async { Ok("fast".to_owned()) }),
            ])
            .await;
        out.push(format!("{i}:{}", first?));
        Ok(out)
    }

    pub fn tool() -> eve_core::engine::WorkflowTool {
        define_workflow_tool("Concurrent steps.", workflow!(execute))
    }
}

/// Steps issued together run concurrently; `select` takes the one recorded first in the
/// journal, and a cold replay agrees.
async fn steps_issued_together_run_concurrently(env: Env) {
    let reg = Registry::new("v1").with(pair::tool());
    let id = format!("{:p}", &env);
    let run = env
        .start(&reg, "j", "pair", serde_json::json!({ "id": id }))
        .await;
    env.worker(&reg).await.drain().await.unwrap();
    let out = env.output(&run).await;
    let events = env.events(&run).await;
    let steps = completed_steps(&events);
    let first_of_select = steps
        .iter()
        .position(|s| s == "slow" || s == "fast")
        .unwrap();
    let expected = if steps[first_of_select] == "slow" {
        "0:slow"
    } else {
        "1:fast"
    };
    assert_eq!(
        out,
        serde_json::json!(["left", "right", expected]),
        "{events:#?}"
    );
    let report = eve_core::engine::Worker::replay_cold(&env.store, &reg, &run)
        .await
        .unwrap();
    assert!(report.finished);
}

trait ClockExt {
    fn now_ms(&self) -> i64;
    fn now_ts(&self) -> eve_core::Timestamp;
}

impl ClockExt for Arc<eve_core::engine::ManualClock> {
    fn now_ms(&self) -> i64 {
        self.now_ts().millis()
    }
    fn now_ts(&self) -> eve_core::Timestamp {
        use eve_core::engine::Clock;
        Clock::now(&**self)
    }
}

on_both_stores!(
    journal_with_a_set_guard_timer_resumes,
    warm_resume_reads_only_new_events,
    five_steps_complete_once,
    crash_at_every_store_call,
    ambiguous_commits,
    retry_backoff_and_fatal,
    panicking_step_is_a_failed_attempt,
    panicking_body_parks_the_run,
    poison_runs_are_parked,
    steps_issued_together_run_concurrently,
);

#[allow(dead_code)]
fn _unused(_: &dyn JournalStore) {}
