#![allow(unreachable_pub)]
//! Workers in the background on the system clock: two workers sharing one store never run the
//! live body of one run at once; graceful shutdown hands runs over; a 1 s sleep on SQLite
//! resumes shortly after it is due.

mod common;

use eve_core::engine::{
    define_workflow_tool, start_tool_call, Registry, SystemClock, Worker, WorkerConfig,
    WorkflowCtx, WorkflowError, WorkflowTool,
};
use eve_core::{
    workflow, CallId, Event, JournalStore, JournalStoreExt, MemoryStore, RunId, RunStatus,
    SessionId, Timestamp,
};
use schemars::JsonSchema;
use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::mpsc;

#[derive(Deserialize, JsonSchema)]
struct In {
    steps: u32,
}

/// Runs whose live body is executing a step right now, and executions by (run, cmd).
type Live = Mutex<(HashSet<String>, HashMap<String, u32>)>;

fn live() -> &'static Live {
    static L: OnceLock<Live> = OnceLock::new();
    L.get_or_init(Default::default)
}

fn done_tx() -> &'static Mutex<Option<mpsc::UnboundedSender<String>>> {
    static T: OnceLock<Mutex<Option<mpsc::UnboundedSender<String>>>> = OnceLock::new();
    T.get_or_init(Default::default)
}

mod busy {
    use super::*;

    /// Sequential steps that each check no other live body of the same run is in a step.
    pub async fn execute(ctx: WorkflowCtx, input: In) -> Result<u32, WorkflowError> {
        for i in 0..input.steps {
            ctx.step(format!("s{i}"), |s| async move {
                let run = s.run_id().to_string();
                {
                    let mut l = live().lock().unwrap();
                    assert!(
                        l.0.insert(run.clone()),
                        "two live bodies of run {run} at once"
                    );
                    *l.1.entry(s.idempotency_key()).or_default() += 1;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                live().lock().unwrap().0.remove(&run);
                Ok(())
            })
            .await?;
        }
        ctx.step("notify", |s| async move {
            if let Some(tx) = done_tx().lock().unwrap().as_ref() {
                let _ = tx.send(s.run_id().to_string());
            }
            Ok(())
        })
        .await?;
        Ok(input.steps)
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Busy sequential steps.", workflow!(execute))
    }
}

async fn start(store: &dyn JournalStore, reg: &Registry, call: &str, steps: u32) -> RunId {
    start_tool_call(
        store,
        reg,
        &SessionId::new("s"),
        &CallId::new(call),
        "busy",
        serde_json::json!({ "steps": steps }),
        Timestamp::now(),
    )
    .await
    .unwrap()
    .run
    .run_id
}

async fn await_done(rx: &mut mpsc::UnboundedReceiver<String>, runs: &[RunId]) {
    let mut want: HashSet<String> = runs.iter().map(ToString::to_string).collect();
    while !want.is_empty() {
        let id = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("runs finish")
            .unwrap();
        want.remove(&id);
    }
}

async fn wait_status(store: &dyn JournalStore, run: &RunId, status: RunStatus) {
    // The last step's notification precedes the RunCompleted append by one store call.
    for _ in 0..500 {
        if store.get_run(run).await.unwrap().status == status {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("run {run} never reached {status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_share_runs_without_overlap() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    *done_tx().lock().unwrap() = Some(tx);
    let store: Arc<dyn JournalStore> = Arc::new(MemoryStore::new());
    let reg = Registry::new("v1").with(busy::tool());
    let mut runs = Vec::new();
    for i in 0..20 {
        runs.push(start(&*store, &reg, &format!("c{i}"), 4).await);
    }
    let config = WorkerConfig {
        max_active_runs: 8,
        poll_interval: Duration::from_millis(5),
        ..WorkerConfig::default()
    };
    let mut handles = Vec::new();
    for _ in 0..2 {
        // Clones of one config: each worker still draws its own id (sharing one would make
        // them fence each other).
        let w = Worker::new(
            store.clone(),
            reg.clone(),
            Arc::new(SystemClock),
            config.clone(),
        )
        .await
        .unwrap();
        handles.push(w.spawn());
    }
    await_done(&mut rx, &runs).await;
    for run in &runs {
        wait_status(&*store, run, RunStatus::Completed).await;
        let steps = store
            .read_all(run, 0)
            .await
            .unwrap()
            .into_iter()
            .filter(|e| matches!(e.event, Event::StepCompleted { .. }))
            .count();
        assert_eq!(steps, 5);
    }
    // No faults: every step ran exactly once.
    let executions = live().lock().unwrap().1.clone();
    for run in &runs {
        let prefix = format!("{run}:");
        let execs: Vec<u32> = executions
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(execs, vec![1; 4], "run {run}");
    }
    for h in handles {
        h.shutdown().await;
    }
}

mod sleeper {
    use super::*;

    #[derive(Deserialize, JsonSchema)]
    pub struct Nap {}

    pub async fn execute(ctx: WorkflowCtx, _: Nap) -> Result<i64, WorkflowError> {
        ctx.sleep("1s").await;
        let woke: i64 = ctx
            .step("woke", |_| async { Ok(Timestamp::now().millis()) })
            .await?;
        Ok(woke)
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Sleeps one second.", workflow!(execute))
    }
}

/// A 1 s sleep on a SQLite file resumes within 150 ms of its due time (the target is 100 ms;
/// the worker polls every 50 ms and sleeps until the store's next wake-up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_second_sleep_on_sqlite_resumes_promptly() {
    let env = common::sqlite().await;
    let store = env.store.clone();
    let reg = Registry::new("v1").with(sleeper::tool());
    let w = Worker::new(
        store.clone(),
        reg.clone(),
        Arc::new(SystemClock),
        WorkerConfig::default(),
    )
    .await
    .unwrap();
    let h = w.spawn();
    let run = start_tool_call(
        &*store,
        &reg,
        &SessionId::new("s"),
        &CallId::new("nap"),
        "sleeper",
        serde_json::json!({}),
        Timestamp::now(),
    )
    .await
    .unwrap()
    .run
    .run_id;
    wait_status(&*store, &run, RunStatus::Completed).await;
    let events = store.read_all(&run, 0).await.unwrap();
    let due = events
        .iter()
        .find_map(|e| match e.event {
            Event::SleepScheduled { wake_at, .. } => Some(wake_at),
            _ => None,
        })
        .unwrap();
    let woke: i64 = match &events.last().unwrap().event {
        Event::RunCompleted { output } => output.to_value().unwrap(),
        other => panic!("{other:?}"),
    };
    let late = woke - due.millis();
    eprintln!("1 s sleep resumed {late} ms after due");
    assert!((0..150).contains(&late), "resumed {late} ms after due");
    h.shutdown().await;
}

/// Graceful shutdown abandons the activation and releases the lease: another worker finishes
/// the run without waiting for a lease to expire past the guard timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_hands_runs_over() {
    let store: Arc<dyn JournalStore> = Arc::new(MemoryStore::new());
    let reg = Registry::new("v1").with(sleeper::tool());
    let config = WorkerConfig {
        lease_ttl: Duration::from_secs(1),
        poll_interval: Duration::from_millis(10),
        ..WorkerConfig::default()
    };
    let run = start_tool_call(
        &*store,
        &reg,
        &SessionId::new("s"),
        &CallId::new("x"),
        "sleeper",
        serde_json::json!({}),
        Timestamp::now(),
    )
    .await
    .unwrap()
    .run
    .run_id;
    let a = Worker::new(
        store.clone(),
        reg.clone(),
        Arc::new(SystemClock),
        config.clone(),
    )
    .await
    .unwrap()
    .spawn();
    // Wait until the first worker scheduled the sleep, then stop it.
    for _ in 0..500 {
        if store.get_run(&run).await.unwrap().next_seq > 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    a.shutdown().await;
    assert_eq!(
        store.get_run(&run).await.unwrap().owner,
        None,
        "lease released"
    );
    let b = Worker::new(store.clone(), reg.clone(), Arc::new(SystemClock), config)
        .await
        .unwrap()
        .spawn();
    wait_status(&*store, &run, RunStatus::Completed).await;
    b.shutdown().await;
}

mod waiter {
    use super::*;

    #[derive(Deserialize, JsonSchema)]
    pub struct Token {
        pub token: String,
    }

    pub async fn execute(ctx: WorkflowCtx, input: Token) -> Result<String, WorkflowError> {
        let hook = ctx.create_hook::<String>(input.token);
        Ok(hook.next().await?)
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Waits for one hook payload.", eve_core::workflow!(execute))
    }
}

/// A worker whose polls (with and without the store's wake-ups) come once an hour: only
/// notifications move it.
async fn sleepy_worker(store: &Arc<dyn JournalStore>, reg: &Registry) -> Worker {
    Worker::new(
        store.clone(),
        reg.clone(),
        Arc::new(SystemClock),
        WorkerConfig {
            poll_interval: Duration::from_secs(3600),
            fallback_poll: Duration::from_secs(3600),
            ..WorkerConfig::default()
        },
    )
    .await
    .unwrap()
}

/// With a poll interval of an hour, only the store's wake-ups can make an idle worker pick up
/// a new run and then a hook payload at once.
async fn deliveries_wake_an_idle_worker(store: Arc<dyn JournalStore>) {
    let reg = Registry::new("v1").with(waiter::tool());
    let h = sleepy_worker(&store, &reg).await.spawn();
    let run = start_tool_call(
        &*store,
        &reg,
        &SessionId::new("s"),
        &CallId::new("c"),
        "waiter",
        serde_json::json!({"token": "wake-me"}),
        Timestamp::now(),
    )
    .await
    .unwrap()
    .run
    .run_id;
    // The new run is claimed at once and parks on its hook.
    let mut delivered = None;
    for _ in 0..500 {
        match store
            .deliver_hook(
                "wake-me",
                eve_core::Payload::from_value("hi").unwrap(),
                None,
                Timestamp::now(),
            )
            .await
        {
            Ok(d) => {
                delivered = Some(d);
                break;
            }
            Err(eve_core::StoreError::NotFound { .. }) => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(delivered.is_some(), "the worker never created the hook");
    wait_status(&*store, &run, RunStatus::Completed).await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_wake_an_idle_worker_on_memory() {
    deliveries_wake_an_idle_worker(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_wake_an_idle_worker_on_sqlite() {
    let env = common::sqlite().await;
    deliveries_wake_an_idle_worker(env.store.clone()).await;
}

mod stuck {
    use super::*;

    /// One step that runs until the run is cancelled.
    pub async fn execute(ctx: WorkflowCtx, _input: serde_json::Value) -> Result<(), WorkflowError> {
        ctx.step("until-aborted", |s| async move {
            s.aborted().await;
            Err::<(), _>(eve_core::engine::StepError::fatal("aborted"))
        })
        .await?;
        Ok(())
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool(
            "Runs one step until cancelled.",
            eve_core::workflow!(execute),
        )
    }
}

/// A delivery to a run whose step is running (here a cancel request) reaches its worker through
/// the store's run watch, not a poll: with both poll intervals at an hour, the step still sees
/// the abort and the run ends cancelled at once.
async fn deliveries_wake_a_running_activation(store: Arc<dyn JournalStore>) {
    let reg = Registry::new("v1").with(stuck::tool());
    let h = sleepy_worker(&store, &reg).await.spawn();
    let run = start_tool_call(
        &*store,
        &reg,
        &SessionId::new("s"),
        &CallId::new("c"),
        "stuck",
        serde_json::json!({}),
        Timestamp::now(),
    )
    .await
    .unwrap()
    .run
    .run_id;
    // Wait until the step is running (its run is held and has recorded nothing yet).
    for _ in 0..500 {
        if store.get_run(&run).await.unwrap().owner.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    store
        .request_cancel(&run, "test", Timestamp::now())
        .await
        .unwrap();
    wait_status(&*store, &run, RunStatus::Cancelled).await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_wake_a_running_activation_on_memory() {
    deliveries_wake_a_running_activation(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_wake_a_running_activation_on_sqlite() {
    let env = common::sqlite().await;
    deliveries_wake_a_running_activation(env.store.clone()).await;
}

mod two_steps {
    use super::*;

    /// Two no-op steps.
    pub async fn execute(
        ctx: WorkflowCtx,
        _input: serde_json::Value,
    ) -> Result<u32, WorkflowError> {
        let a: u32 = ctx.step("a", |_| async { Ok(1) }).await?;
        let b: u32 = ctx.step("b", move |_| async move { Ok(a + 1) }).await?;
        Ok(b)
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Two steps.", eve_core::workflow!(execute))
    }
}

/// Eager start: a session whose calls go through a running worker creates and claims the run
/// in one commit, and the body runs without a claim and without reading its journal.
async fn eager_start_runs_without_claim_or_read(store: Arc<dyn JournalStore>) {
    use eve_core::engine::Session;
    use eve_core::testing::{Fault, FaultyStore};
    let faulty = FaultyStore::new(store);
    let reg = Registry::new("v1").with(two_steps::tool());
    let store: Arc<dyn JournalStore> = faulty.clone();
    let worker = sleepy_worker(&store, &reg).await;
    let h = worker.clone().spawn();
    let s = Session::new(
        faulty.clone(),
        Arc::new(reg),
        Arc::new(SystemClock),
        SessionId::new("eager"),
    )
    .with_worker(worker);
    // Let the loop finish its first round (a claim that finds nothing) before measuring.
    while !faulty.call_log().contains(&"next_wake") {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    faulty.set_fault(Fault::None);
    s.call_tool("c1", "two_steps", serde_json::json!({}))
        .await
        .unwrap();
    let r = tokio::time::timeout(Duration::from_secs(20), s.wait_settled(&CallId::new("c1")))
        .await
        .expect("settled")
        .unwrap();
    assert_eq!(
        r,
        eve_core::ToolResult::Completed {
            output: eve_core::Payload::from_value(&2).unwrap()
        }
    );
    let log = faulty.call_log();
    assert_eq!(log.first(), Some(&"create_run_claimed"), "{log:?}");
    assert!(
        !log.contains(&"read"),
        "the body started without reading its journal: {log:?}"
    );
    let first_append = log.iter().position(|c| *c == "append").expect("appends");
    assert!(
        !log[..first_append].contains(&"claim"),
        "no claim between the start and the first step's append: {log:?}"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eager_start_runs_without_claim_or_read_on_memory() {
    eager_start_runs_without_claim_or_read(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eager_start_runs_without_claim_or_read_on_sqlite() {
    let env = common::sqlite().await;
    eager_start_runs_without_claim_or_read(env.store.clone()).await;
}
