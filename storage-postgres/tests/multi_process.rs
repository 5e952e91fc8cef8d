//! Many worker processes on one PostgreSQL database (issue 5, item 3).
//!
//! Three worker processes share one schema and run 200 runs of a 10-step workflow. Half-way
//! (when 1,000 step executions have started) worker `w2` is killed with SIGKILL and a new
//! worker process (`w2-restarted`, a new worker id, so nothing is fenced by re-registration
//! and the dead worker's leases can only change hands by expiring) is started. The test then
//! checks, by reading the store and a table the steps write to:
//!
//! - every run is `Completed` with the right output, and none is left `Running`;
//! - each run's journal holds exactly one `StepCompleted` per step (`s0`..`s9`, in order, at
//!   distinct cmds) and no `StepFailed`;
//! - every step executed at least once (at-least-once: steps in flight in the dead worker run
//!   again; the test prints how many re-executions there were);
//! - every run the dead worker owned at the kill was finished by other workers, and none of
//!   them executed a step of it before the dead worker's lease expired.
//!
//! This target has no libtest harness: `main` is both the test and, when `EVE_MP_WORKER` is
//! set, the worker process the test spawns (it re-invokes its own executable), so no extra
//! binary is built. Without `EVE_TEST_POSTGRES_URL` it prints that it was skipped.

mod common;

use eve_core::engine::{
    define_workflow_tool, start_tool_call, Registry, StepError, SystemClock, Worker, WorkerConfig,
    WorkflowCtx, WorkflowError, WorkflowTool,
};
use eve_core::{
    workflow, CallId, Event, JournalStore, JournalStoreExt, RunQuery, RunStatus, SessionId,
    Timestamp, WorkerId,
};
use eve_storage_postgres::PostgresStore;
use schemars::JsonSchema;
use serde::Deserialize;
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool, Row};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Set in a worker process: its worker id.
const ROLE_VAR: &str = "EVE_MP_WORKER";
/// Set in a worker process: the schema to work in.
const SCHEMA_VAR: &str = "EVE_MP_SCHEMA";

const RUNS: usize = 200;
const STEPS: u32 = 10;
const LEASE: Duration = Duration::from_secs(2);
const STEP_TIME: Duration = Duration::from_millis(25);
const DEADLINE: Duration = Duration::from_secs(50);

#[derive(Deserialize, JsonSchema)]
struct In {
    steps: u32,
}

/// Where a worker process records step executions.
struct Recorder {
    pool: PgPool,
    insert: String,
    worker: String,
}

fn recorder() -> &'static OnceLock<Recorder> {
    static R: OnceLock<Recorder> = OnceLock::new();
    &R
}

mod tenstep {
    use super::*;

    /// `steps` sequential steps; each records its execution (run, cmd, worker, time) in the
    /// test's table as it starts, then takes a little while. Returns the sum of the step
    /// outputs.
    pub(crate) async fn execute(ctx: WorkflowCtx, input: In) -> Result<u64, WorkflowError> {
        let mut sum = 0;
        for i in 0..input.steps {
            let out: u64 = ctx
                .step(format!("s{i}"), move |s| async move {
                    let r = recorder()
                        .get()
                        .ok_or_else(|| StepError::fatal("the step recorder is not set up"))?;
                    sqlx::query(AssertSqlSafe(r.insert.clone()))
                        .bind(s.run_id().as_str())
                        .bind(i64::try_from(s.cmd()).map_err(StepError::fatal)?)
                        .bind(&r.worker)
                        .bind(Timestamp::now().millis())
                        .execute(&r.pool)
                        .await
                        .map_err(|e| StepError::retryable(format!("record execution: {e}")))?;
                    tokio::time::sleep(STEP_TIME).await;
                    Ok(u64::from(i) * 3)
                })
                .await?;
            sum += out;
        }
        Ok(sum)
    }

    pub(crate) fn tool() -> WorkflowTool {
        define_workflow_tool("Ten recorded steps.", workflow!(execute))
    }
}

fn registry() -> Registry {
    Registry::new("mp-v1").with(tenstep::tool())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn main() {
    if let Ok(id) = std::env::var(ROLE_VAR) {
        runtime().block_on(worker_process(id));
        return;
    }
    // Behave like a libtest target towards `cargo test` arguments: list, and filter by name.
    const NAME: &str = "three_processes_survive_a_sigkill";
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        println!("{NAME}: test");
        return;
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    if !filters.is_empty() && !filters.iter().any(|f| NAME.contains(f.as_str())) {
        return;
    }
    let Some(url) = common::url_or_skip("multi_process") else {
        return;
    };
    let started = Instant::now();
    runtime().block_on(three_processes_survive_a_sigkill(url));
    println!(
        "test {NAME} ... ok ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
}

/// A worker process: runs until its stdin closes (then shuts down gracefully) or it is killed.
async fn worker_process(id: String) {
    let url = std::env::var(common::URL_VAR).expect("worker: EVE_TEST_POSTGRES_URL");
    let schema = std::env::var(SCHEMA_VAR).expect("worker: EVE_MP_SCHEMA");
    let store = PostgresStore::connect_with(&url, common::options(&schema))
        .await
        .unwrap_or_else(|e| panic!("worker {id}: connect: {e}"));
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await
        .unwrap_or_else(|e| panic!("worker {id}: connect the recorder: {e}"));
    let insert = format!(
        "INSERT INTO \"{schema}\".mp_exec (run_id, cmd, worker, at_ms) VALUES ($1, $2, $3, $4)"
    );
    if recorder()
        .set(Recorder {
            pool,
            insert,
            worker: id.clone(),
        })
        .is_err()
    {
        panic!("worker {id}: recorder set twice");
    }
    let config = WorkerConfig {
        id: Some(WorkerId::new(id.clone())),
        lease_ttl: LEASE,
        poll_interval: Duration::from_millis(20),
        max_active_runs: 16,
        ..WorkerConfig::default()
    };
    let handle = Worker::new(Arc::new(store), registry(), Arc::new(SystemClock), config)
        .await
        .unwrap_or_else(|e| panic!("worker {id}: register: {e}"))
        .spawn();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        let _ = tx.send(());
    });
    let _ = rx.await;
    handle.shutdown().await;
}

/// The worker processes; killed (SIGKILL) when dropped, so a failing test leaves none behind.
struct Procs(Vec<(String, Child)>);

impl Procs {
    fn spawn(&mut self, url: &str, schema: &str, id: &str) {
        let exe = std::env::current_exe().expect("current exe");
        let child = Command::new(exe)
            .env(ROLE_VAR, id)
            .env(SCHEMA_VAR, schema)
            .env(common::URL_VAR, url)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn a worker process");
        self.0.push((id.to_owned(), child));
    }

    fn child(&mut self, id: &str) -> &mut Child {
        &mut self
            .0
            .iter_mut()
            .find(|(i, _)| i == id)
            .expect("known worker")
            .1
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn scalar(pool: &PgPool, sql: String) -> i64 {
    sqlx::query(AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .expect("query")
        .get(0)
}

/// Polls `cond` every 20 ms until it holds, or panics with `what` at the test's deadline.
async fn wait_until<F, Fut>(start: Instant, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    while !cond().await {
        assert!(
            start.elapsed() < DEADLINE,
            "timed out after {DEADLINE:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn three_processes_survive_a_sigkill(url: String) {
    let start = Instant::now();
    let factory = common::PgFactory::from_env().expect("url is set");
    let store = factory.store().await;
    let schema = store.schema().to_owned();
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .expect("connect");
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE \"{schema}\".mp_exec (id BIGSERIAL PRIMARY KEY, run_id TEXT NOT NULL, \
         cmd BIGINT NOT NULL, worker TEXT NOT NULL, at_ms BIGINT NOT NULL)"
    )))
    .execute(&pool)
    .await
    .expect("create the executions table");

    let reg = registry();
    let mut runs = Vec::new();
    for i in 0..RUNS {
        let created = start_tool_call(
            &store,
            &reg,
            &SessionId::new("mp"),
            &CallId::new(format!("c{i}")),
            "tenstep",
            serde_json::json!({ "steps": STEPS }),
            Timestamp::now(),
        )
        .await
        .expect("start a run");
        runs.push(created.run.run_id);
    }

    let mut procs = Procs(Vec::new());
    for id in ["w1", "w2", "w3"] {
        procs.spawn(&url, &schema, id);
    }

    // Half-way: half of the 2,000 step executions have started.
    let half = i64::from(STEPS) * RUNS as i64 / 2;
    let count = format!("SELECT count(*) FROM \"{schema}\".mp_exec");
    wait_until(start, "half of the steps ran", || {
        let (pool, sql) = (&pool, count.clone());
        async move { scalar(pool, sql).await >= half }
    })
    .await;
    let started_at_kill = scalar(&pool, count.clone()).await;
    let victim = procs.child("w2");
    victim.kill().expect("SIGKILL w2");
    victim.wait().expect("reap w2");
    let killed_at = Timestamp::now().millis();
    procs.spawn(&url, &schema, "w2-restarted");

    // The dead worker's state, final now: its runs, their progress, its lease expiry.
    let expires_at: i64 = sqlx::query(AssertSqlSafe(format!(
        "SELECT expires_at FROM \"{schema}\".workers WHERE worker_id = 'w2'"
    )))
    .fetch_one(&pool)
    .await
    .expect("w2's worker row")
    .get(0);
    let mut orphaned = Vec::new();
    for r in store
        .list_runs(&RunQuery {
            status: Some(RunStatus::Running),
            ..RunQuery::default()
        })
        .await
        .expect("list runs")
    {
        if r.owner.as_ref().is_some_and(|(w, _)| w.as_str() == "w2") {
            orphaned.push(r.run_id);
        }
    }
    // How far each of them had got: StepCompleted events in its journal at the kill.
    let mut progress_at_kill: BTreeMap<usize, usize> = BTreeMap::new();
    for run in &orphaned {
        let steps = store
            .read_all(run, 0)
            .await
            .expect("read journal")
            .iter()
            .filter(|e| matches!(e.event, Event::StepCompleted { .. }))
            .count();
        *progress_at_kill.entry(steps).or_default() += 1;
    }
    let done_at_kill = store
        .list_runs(&RunQuery {
            status: Some(RunStatus::Completed),
            ..RunQuery::default()
        })
        .await
        .expect("list runs")
        .len();
    assert!(
        !orphaned.is_empty(),
        "w2 owned no running run when it was killed: the kill tested nothing"
    );

    // Every run completes; none is left running.
    wait_until(start, "every run left running", || {
        let store = &store;
        async move {
            store
                .list_runs(&RunQuery {
                    status: Some(RunStatus::Running),
                    limit: 1,
                    ..RunQuery::default()
                })
                .await
                .expect("list runs")
                .is_empty()
        }
    })
    .await;
    let finished = start.elapsed();

    // Graceful shutdown of the survivors (closing stdin), so their leases are released.
    for (id, c) in &mut procs.0 {
        if id != "w2" {
            drop(c.stdin.take());
            let status = c.wait().expect("wait for a worker");
            assert!(status.success(), "worker {id} exited with {status}");
        }
    }

    // Executions by (run, cmd), and by run: (worker, at) of each execution.
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT run_id, cmd, worker, at_ms FROM \"{schema}\".mp_exec ORDER BY id"
    )))
    .fetch_all(&pool)
    .await
    .expect("read executions");
    let mut per_cmd: BTreeMap<(String, i64), u32> = BTreeMap::new();
    let mut per_run: HashMap<String, Vec<(i64, String, i64)>> = HashMap::new();
    let mut by_worker: BTreeMap<String, u32> = BTreeMap::new();
    for row in &rows {
        let (run, cmd, worker, at): (String, i64, String, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        *per_cmd.entry((run.clone(), cmd)).or_default() += 1;
        *by_worker.entry(worker.clone()).or_default() += 1;
        per_run.entry(run).or_default().push((cmd, worker, at));
    }

    let mut step_cmds: HashSet<(String, i64)> = HashSet::new();
    // Per run: ms from its last StepCompleted to its RunCompleted (the writers' clocks).
    let mut completion_gaps: Vec<i64> = Vec::new();
    // Per step after the first: ms from the previous StepCompleted.
    let mut step_gaps: Vec<i64> = Vec::new();
    for run in &runs {
        let rec = store.get_run(run).await.expect("get run");
        assert_eq!(rec.status, RunStatus::Completed, "run {run}");
        let events = store.read_all(run, 0).await.expect("read journal");
        let mut names = Vec::new();
        let mut last_step_at = 0;
        let mut outputs = Vec::new();
        for e in &events {
            match &e.event {
                Event::StepCompleted { cmd, name, .. } => {
                    if last_step_at > 0 {
                        step_gaps.push(e.at.millis() - last_step_at);
                    }
                    last_step_at = e.at.millis();
                    let cmd = i64::try_from(*cmd).expect("cmd fits i64");
                    assert!(
                        step_cmds.insert((run.to_string(), cmd)),
                        "run {run}: two StepCompleted for cmd {cmd}"
                    );
                    names.push(name.clone());
                }
                Event::StepFailed { name, error, .. } => {
                    panic!("run {run}: step {name} failed: {error}")
                }
                Event::RunCompleted { output } => {
                    outputs.push(output.get().to_owned());
                    completion_gaps.push(e.at.millis() - last_step_at);
                }
                _ => {}
            }
        }
        let want: Vec<String> = (0..STEPS).map(|i| format!("s{i}")).collect();
        assert_eq!(names, want, "run {run}: each step recorded exactly once");
        let sum: u32 = (0..STEPS).map(|i| i * 3).sum();
        assert_eq!(outputs, [sum.to_string()], "run {run}: one RunCompleted");
    }
    // Every recorded step executed at least once, and nothing executed that was not a step.
    for key in &step_cmds {
        assert!(
            per_cmd.contains_key(key),
            "step {key:?} recorded but never executed"
        );
    }
    assert_eq!(per_cmd.len(), step_cmds.len(), "executions of unknown cmds");
    let reexecuted: u32 = per_cmd.values().map(|n| n - 1).sum();
    let reexecuted_steps = per_cmd.values().filter(|n| **n > 1).count();
    completion_gaps.sort_unstable();
    step_gaps.sort_unstable();

    // The dead worker's runs were finished by others, only after its lease expired: each got
    // appends after the kill (w2 was dead, so from another worker), none before the expiry.
    let mut first_append = i64::MAX;
    let mut last_append = i64::MIN;
    let mut stepped_after = 0;
    for run in &orphaned {
        let after: Vec<_> = store
            .read_all(run, 0)
            .await
            .expect("read journal")
            .into_iter()
            .filter(|e| e.at.millis() > killed_at)
            .collect();
        assert!(
            after
                .iter()
                .any(|e| matches!(e.event, Event::RunCompleted { .. })),
            "run {run}, owned by w2 at the kill, was not completed by another worker"
        );
        for e in &after {
            assert!(
                e.at.millis() >= expires_at,
                "run {run}: seq {} appended at {} by another worker, before w2's lease \
                 expired at {expires_at}",
                e.seq,
                e.at.millis()
            );
        }
        first_append = first_append.min(after[0].at.millis());
        last_append = last_append.max(after[after.len() - 1].at.millis());
        let execs = per_run.get(run.as_str()).map_or(&[][..], Vec::as_slice);
        assert!(
            execs.iter().all(|(_, w, at)| w != "w2" || *at <= killed_at),
            "run {run}: w2 executed a step after it was killed"
        );
        if execs.iter().any(|(_, w, at)| w != "w2" && *at > killed_at) {
            stepped_after += 1;
        }
    }

    println!(
        "multi_process: {RUNS} runs x {STEPS} steps, 3 worker processes, lease {LEASE:?}; \
         all completed in {:.1} s",
        finished.as_secs_f64()
    );
    println!(
        "multi_process: w2 SIGKILLed with {done_at_kill} runs completed and {} executions \
         started; it owned {} running runs (by StepCompleted count at the kill: {progress_at_kill:?}); \
         all were completed by other workers ({stepped_after} also ran steps of them), \
         appending from {} ms to {} ms after the kill (lease expiry: {} ms after the kill)",
        started_at_kill,
        orphaned.len(),
        first_append - killed_at,
        last_append - killed_at,
        expires_at - killed_at,
    );
    println!(
        "multi_process: {} executions for {} recorded steps: {reexecuted} re-executions of \
         {reexecuted_steps} steps; executions by worker: {by_worker:?}",
        rows.len(),
        step_cmds.len()
    );
    println!(
        "multi_process: StepCompleted -> next StepCompleted: median {} ms, p90 {} ms; \
         last StepCompleted -> RunCompleted: median {} ms, p90 {} ms, max {} ms",
        step_gaps[step_gaps.len() / 2],
        step_gaps[step_gaps.len() * 9 / 10],
        completion_gaps[completion_gaps.len() / 2],
        completion_gaps[completion_gaps.len() * 9 / 10],
        completion_gaps[completion_gaps.len() - 1]
    );
}
