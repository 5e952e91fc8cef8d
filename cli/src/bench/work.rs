//! The workloads of `eve bench`, the same ones `benches/src/bin/workloads.rs`,
//! `webhook_load.rs` and the examples' `measure` bin run on their fixed backends: W1 (a
//! 10-step call, 1 and 8 callers), W2 (a 1,000-step run, SIGKILLed in its last step, replayed
//! cold and recovered by a fresh process), 64 runs × 50 steps, webhook latency at a fixed
//! rate over parked runs, and the memory a parked run holds.

use super::probe::Units;
use crate::error::CliError;
use eve_core::engine::{
    define_workflow_tool, start_tool_call, Registry, Session, SystemClock, Worker, WorkerConfig,
    WorkflowCtx, WorkflowError, WorkflowTool,
};
use eve_core::testing::canned::{nap_tool, noop_steps_tool};
use eve_core::{
    workflow, CallId, DeploymentId, Event, JournalStore, JournalStoreExt, RunId, RunQuery,
    RunStatus, SessionId, Timestamp, WebhookRequest, WorkerId,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The deployment of the bench's runs.
pub(crate) const DEPLOYMENT: &str = "eve-bench";

/// Step (1-based) of `many_steps` that announces itself on stdout and then waits to be
/// killed; 0: none. Set only in the `bench-child` process.
static KILL_AT: AtomicU32 = AtomicU32::new(0);

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Empty {}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Steps {
    steps: u32,
}

async fn ten_steps(ctx: WorkflowCtx, _: Empty) -> Result<u32, WorkflowError> {
    let mut n = 0;
    for i in 0..10u32 {
        n = ctx
            .step(format!("s{i}"), move |_| async move { Ok(i + 1) })
            .await?;
    }
    Ok(n)
}

async fn many_steps(ctx: WorkflowCtx, input: Steps) -> Result<u32, WorkflowError> {
    let mut n = 0;
    for i in 1..=input.steps {
        n = ctx
            .step(format!("s{i}"), move |_| async move {
                if KILL_AT.load(Ordering::Relaxed) == i {
                    // The parent reads this line and SIGKILLs the process: the step never
                    // ends, nothing is released.
                    {
                        use std::io::Write;
                        let mut out = std::io::stdout().lock();
                        let _ = writeln!(out, "waiting to be killed in step {i}");
                        let _ = out.flush();
                    }
                    std::future::pending::<()>().await;
                }
                Ok(i)
            })
            .await?;
    }
    Ok(n)
}

/// Resumed webhook bodies report `(delivery id, when)` here (one webhook measurement at a
/// time: stores are measured one after the other).
type Resumed = Mutex<Option<mpsc::UnboundedSender<(u64, Instant)>>>;

fn resumed() -> &'static Resumed {
    static TX: OnceLock<Resumed> = OnceLock::new();
    TX.get_or_init(Default::default)
}

async fn webhook_wait(ctx: WorkflowCtx, _: Empty) -> Result<(), WorkflowError> {
    let hook = ctx.create_webhook::<WebhookRequest>();
    let request = hook.next().await?;
    let id = request.body["id"].as_u64().unwrap_or(u64::MAX);
    ctx.step("resumed", move |_| async move {
        if let Some(tx) = resumed().lock().expect("resumed lock").as_ref() {
            let _ = tx.send((id, Instant::now()));
        }
        Ok(())
    })
    .await?;
    Ok(())
}

/// The bench's tools: `ten_steps`, `many_steps`, `webhook_wait`, `canned` (no-op steps) and
/// `canned_nap` (one sleep).
pub(crate) fn registry() -> Registry {
    let ten: WorkflowTool =
        define_workflow_tool("10 sequential no-op steps.", workflow!(ten_steps)).named("ten_steps");
    let many: WorkflowTool =
        define_workflow_tool("N sequential no-op steps.", workflow!(many_steps))
            .named("many_steps");
    let hook: WorkflowTool =
        define_workflow_tool("Waits for one webhook delivery.", workflow!(webhook_wait))
            .named("webhook_wait");
    Registry::new(DEPLOYMENT)
        .with(ten)
        .with(many)
        .with(hook)
        .with(noop_steps_tool())
        .with(nap_tool())
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

async fn worker(
    store: &Arc<dyn JournalStore>,
    id: Option<String>,
    max_active_runs: usize,
) -> Result<Worker, CliError> {
    let config = WorkerConfig {
        id: Some(WorkerId::new(id.unwrap_or_else(|| unique("bench")))),
        max_active_runs,
        ..WorkerConfig::default()
    };
    Worker::new(store.clone(), registry(), Arc::new(SystemClock), config)
        .await
        .map_err(CliError::store("cannot register the bench worker"))
}

fn session(store: &Arc<dyn JournalStore>, id: &str) -> Session {
    Session::new(
        store.clone(),
        Arc::new(registry()),
        Arc::new(SystemClock),
        SessionId::new(id),
    )
}

/// The `p`-quantile of sorted durations, in milliseconds (nearest rank).
pub(crate) fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e3
}

/// Starts and awaits one call; its latency.
async fn call(
    s: &Session,
    call_id: &str,
    tool: &str,
    input: serde_json::Value,
) -> Result<Duration, CliError> {
    let t0 = Instant::now();
    s.call_tool(call_id, tool, input)
        .await
        .map_err(|e| CliError::Bench(format!("cannot start {tool}: {e}")))?;
    let r = s
        .wait_settled(&CallId::new(call_id))
        .await
        .map_err(|e| CliError::Bench(format!("{tool} did not settle: {e}")))?;
    match r {
        eve_core::ToolResult::Completed { .. } => Ok(t0.elapsed()),
        other => Err(CliError::Bench(format!(
            "{tool} call {call_id} ended {other:?} instead of completed"
        ))),
    }
}

/// W1 for `callers` concurrent callers of `calls` calls each: (calls/s, p50 ms, p99 ms).
pub(crate) async fn w1(
    store: &Arc<dyn JournalStore>,
    callers: usize,
    calls: usize,
    units: impl Fn() -> Option<Units>,
    mut tick: impl FnMut(),
) -> Result<(f64, f64, f64, Option<Units>), CliError> {
    let w = worker(store, None, 64).await?;
    let handle = w.clone().spawn();
    let result = async {
        // Calls start eagerly through the local worker (create and claim in one commit).
        let warm = session(store, &unique("w1-warm")).with_worker(w.clone());
        for i in 0..3 {
            call(&warm, &format!("w{i}"), "ten_steps", serde_json::json!({})).await?;
        }
        let (tx, mut rx) = mpsc::unbounded_channel();
        let units_before = units();
        let t0 = Instant::now();
        let tasks: Vec<_> = (0..callers)
            .map(|_| {
                let s = session(store, &unique("w1")).with_worker(w.clone());
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut lat = Vec::with_capacity(calls);
                    for i in 0..calls {
                        lat.push(
                            call(&s, &format!("c{i}"), "ten_steps", serde_json::json!({})).await?,
                        );
                        let _ = tx.send(());
                    }
                    Ok::<_, CliError>(lat)
                })
            })
            .collect();
        drop(tx);
        while rx.recv().await.is_some() {
            tick();
        }
        let mut lat = Vec::new();
        for t in tasks {
            lat.extend(
                t.await
                    .map_err(|e| CliError::Bench(format!("a W1 caller panicked: {e}")))??,
            );
        }
        let total = t0.elapsed();
        let used = units().zip(units_before).map(|(a, b)| a.since(b));
        lat.sort();
        Ok((
            lat.len() as f64 / total.as_secs_f64().max(1e-9),
            percentile_ms(&lat, 0.5),
            percentile_ms(&lat, 0.99),
            used,
        ))
    }
    .await;
    handle.shutdown().await;
    result
}

/// W2's first part: one `steps`-step call in this process; its latency.
pub(crate) async fn w2_total(
    store: &Arc<dyn JournalStore>,
    steps: u32,
) -> Result<Duration, CliError> {
    let w = worker(store, None, 64).await?;
    let handle = w.clone().spawn();
    let s = session(store, &unique("w2")).with_worker(w);
    let result = async {
        call(&s, "warm", "many_steps", serde_json::json!({"steps": 10})).await?;
        call(&s, "c", "many_steps", serde_json::json!({"steps": steps})).await
    }
    .await;
    handle.shutdown().await;
    result
}

/// What W2's crash and recovery measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Recovery {
    /// Cold replay of the journal the killed process left.
    pub(crate) replay: Duration,
    /// Events replayed.
    pub(crate) events: u64,
    /// From spawning the fresh process to its exit with the run completed.
    pub(crate) recover_wall: Duration,
    /// From the fresh process's start (its bench-child command) to the run completed.
    pub(crate) recover_inside: Duration,
}

/// W2's second part: a child `eve bench-child` process runs `steps` steps on the store at
/// `location`, announces the last one and is SIGKILLed there; the journal is replayed cold;
/// a fresh child with the same worker id takes the run back and finishes it.
pub(crate) async fn w2_crash(
    store_url: &str,
    store: &Arc<dyn JournalStore>,
    location: &str,
    steps: u32,
) -> Result<Recovery, CliError> {
    use tokio::io::AsyncBufReadExt;
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Bench(format!("cannot find the eve binary to re-run: {e}")))?;
    let worker_id = unique("w2-worker");
    let mut child = tokio::process::Command::new(&exe)
        .args(["--store", store_url, "bench-child", "--location", location])
        .args(["--worker-id", &worker_id, "--steps", &steps.to_string()])
        .args(["--kill-at", &steps.to_string()])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| CliError::Bench(format!("cannot start {}: {e}", exe.display())))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let mut run = None;
    loop {
        let line = lines
            .next_line()
            .await
            .map_err(|e| CliError::Bench(format!("reading the W2 child: {e}")))?;
        match line {
            Some(l) if l.starts_with("run ") => run = Some(l[4..].trim().to_owned()),
            Some(l) if l.starts_with("waiting to be killed") => break,
            Some(_) => {}
            None => {
                let status = child.wait().await.ok();
                return Err(CliError::Bench(format!(
                    "the W2 child ended ({status:?}) before its last step"
                )));
            }
        }
    }
    // SIGKILL: no destructor, no release, no store call.
    child
        .kill()
        .await
        .map_err(|e| CliError::Bench(format!("cannot SIGKILL the W2 child: {e}")))?;
    let run = run.ok_or_else(|| CliError::Bench("the W2 child printed no run id".into()))?;
    let run = RunId::new(run);
    let t0 = Instant::now();
    let report = Worker::replay_cold(store, &registry(), &run)
        .await
        .map_err(CliError::store("W2's cold replay failed"))?;
    let replay = t0.elapsed();
    let t0 = Instant::now();
    let out = tokio::process::Command::new(&exe)
        .args(["--store", store_url, "bench-child", "--location", location])
        .args(["--worker-id", &worker_id, "--recover", run.as_str()])
        .output()
        .await
        .map_err(|e| CliError::Bench(format!("cannot start the W2 recovery: {e}")))?;
    let recover_wall = t0.elapsed();
    if !out.status.success() {
        return Err(CliError::Bench(format!(
            "the W2 recovery failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let inner: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| CliError::Bench(format!("the W2 recovery printed no JSON: {e}")))?;
    let rec = store
        .get_run(&run)
        .await
        .map_err(CliError::store("cannot read the W2 run"))?;
    if rec.status != RunStatus::Completed {
        return Err(CliError::Bench(format!(
            "W2 run {run} is {} after the recovery, not completed",
            rec.status.as_str()
        )));
    }
    Ok(Recovery {
        replay,
        events: report.events,
        recover_wall,
        recover_inside: Duration::from_secs_f64(
            inner["recoverMs"].as_f64().unwrap_or_default() / 1e3,
        ),
    })
}

/// The hidden `eve bench-child` command: runs `steps` steps of `many_steps` (waiting to be
/// killed in step `kill_at`), or, with `recover`, finishes that run and prints how long it
/// took as `{"recoverMs": …}`.
pub(crate) async fn child(
    store: Arc<dyn JournalStore>,
    worker_id: String,
    steps: u32,
    kill_at: u32,
    recover: Option<String>,
    out: &mut dyn std::io::Write,
) -> Result<(), CliError> {
    let started = Instant::now();
    KILL_AT.store(kill_at, Ordering::Relaxed);
    // The killed process's lock on the worker id is freed by the OS (SQLite), the database
    // (Postgres, when it sees the connection gone) or heartbeat staleness (DynamoDB, seconds):
    // the recovery waits for it, as a restarted server would, and that wait is part of its time.
    let deadline = Instant::now() + Duration::from_secs(60);
    let handle = loop {
        let config = WorkerConfig {
            id: Some(WorkerId::new(worker_id.as_str())),
            max_active_runs: 64,
            ..WorkerConfig::default()
        };
        match Worker::new(store.clone(), registry(), Arc::new(SystemClock), config).await {
            Ok(w) => break w.spawn(),
            Err(eve_core::StoreError::WorkerIdInUse { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(CliError::store("cannot register the bench worker")(e)),
        }
    };
    let (s, call_id) = match recover {
        Some(run) => {
            let rec = store
                .get_run(&RunId::new(run))
                .await
                .map_err(CliError::store("cannot read the run to recover"))?;
            (session(&store, rec.session_id.as_str()), rec.call_id)
        }
        None => {
            let s = session(&store, &unique("w2-crash"));
            let start = s
                .call_tool("c1", "many_steps", serde_json::json!({"steps": steps}))
                .await
                .map_err(|e| CliError::Bench(format!("cannot start the W2 run: {e}")))?;
            let eve_core::engine::ToolCallStart::Parked { run_id } = start else {
                return Err(CliError::Bench(format!("unexpected start {start:?}")));
            };
            let _ = writeln!(out, "run {run_id}");
            let _ = out.flush();
            (s, CallId::new("c1"))
        }
    };
    s.wait_settled(&call_id)
        .await
        .map_err(|e| CliError::Bench(format!("the W2 run did not settle: {e}")))?;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    handle.shutdown().await;
    let _ = writeln!(out, "{}", serde_json::json!({ "recoverMs": ms }));
    Ok(())
}

/// `runs` runs × `per_run` no-op steps started at once, drained by one worker: steps/s.
pub(crate) async fn throughput(
    store: &Arc<dyn JournalStore>,
    runs: u32,
    per_run: u32,
    mut progress: impl FnMut(u64),
) -> Result<f64, CliError> {
    let deployment = unique(DEPLOYMENT);
    let registry = Registry::new(deployment.as_str()).with(noop_steps_tool());
    let session = SessionId::new(unique("tp"));
    for i in 0..runs {
        start_tool_call(
            &**store,
            &registry,
            &session,
            &CallId::new(format!("call-{i}")),
            noop_steps_tool().name(),
            serde_json::json!({ "steps": per_run }),
            Timestamp::now(),
        )
        .await
        .map_err(CliError::engine("cannot start a bench run"))?;
    }
    let config = WorkerConfig {
        max_active_runs: 64,
        ..WorkerConfig::default()
    };
    let worker = Worker::new(store.clone(), registry, Arc::new(SystemClock), config)
        .await
        .map_err(CliError::store("cannot register the bench worker"))?;
    let query = RunQuery {
        session: Some(session.clone()),
        deployment: Some(DeploymentId::new(deployment.as_str())),
        ..RunQuery::default()
    };
    let start = Instant::now();
    let drain = worker.drain();
    tokio::pin!(drain);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let ends = loop {
        tokio::select! {
            ends = &mut drain => break ends,
            _ = tick.tick() => {
                // Progress only: a failed read just skips this tick.
                if let Ok(list) = store.list_runs(&query).await {
                    progress(list.iter()
                        .map(|r| r.next_seq.saturating_sub(1).min(u64::from(per_run)))
                        .sum());
                }
            }
        }
    };
    let elapsed = start.elapsed();
    ends.map_err(CliError::store("the bench worker failed"))?;
    let list = store
        .list_runs(&query)
        .await
        .map_err(CliError::store("cannot list the bench runs"))?;
    if let Some(r) = list.iter().find(|r| r.status != RunStatus::Completed) {
        return Err(CliError::Bench(format!(
            "bench run {} ended {} instead of completed",
            r.run_id,
            r.status.as_str()
        )));
    }
    Ok(f64::from(runs) * f64::from(per_run) / elapsed.as_secs_f64().max(1e-9))
}

/// What the webhook measurement found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WebhookLatency {
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    /// Non-202 answers and runs that never resumed.
    pub(crate) errors: usize,
    /// Resumes measured.
    pub(crate) resumed: usize,
    /// Capacity units from every run parked to every resume seen (DynamoDB only).
    pub(crate) units: Option<Units>,
}

async fn webhook_token(store: &dyn JournalStore, run: &RunId) -> Option<String> {
    store
        .read_all(run, 0)
        .await
        .ok()?
        .into_iter()
        .find_map(|e| match e.event {
            Event::HookCreated {
                token,
                webhook: true,
                ..
            } => Some(token),
            _ => None,
        })
}

/// `runs` runs park on a webhook each; then POSTs at `rate` per second through eve-server on
/// loopback resume them; latency from just before a POST to the resumed body's next step.
pub(crate) async fn webhook(
    store: &Arc<dyn JournalStore>,
    runs: usize,
    rate: usize,
    units: impl Fn() -> Option<Units>,
    mut tick: impl FnMut(),
) -> Result<WebhookLatency, CliError> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    *resumed().lock().expect("resumed lock") = Some(tx);
    let reg = registry();
    let worker = worker(store, None, 256).await?.spawn();
    let result = async {
        let session = SessionId::new(unique("webhook"));
        let mut ids = Vec::with_capacity(runs);
        for i in 0..runs {
            let created = start_tool_call(
                &**store,
                &reg,
                &session,
                &CallId::new(format!("call-{i}")),
                "webhook_wait",
                serde_json::json!({}),
                Timestamp::now(),
            )
            .await
            .map_err(CliError::engine("cannot start a webhook run"))?;
            ids.push(created.run.run_id);
        }
        // Every run parked on its webhook: its token is in the journal.
        let mut tokens = Vec::with_capacity(runs);
        let deadline = Instant::now() + Duration::from_secs(120);
        for run in &ids {
            let token = loop {
                if let Some(t) = webhook_token(&**store, run).await {
                    break t;
                }
                if Instant::now() > deadline {
                    return Err(CliError::Bench(format!(
                        "run {run} did not park on its webhook in 120 s"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            tokens.push(token);
        }
        let units_before = units();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| CliError::Bench(format!("cannot bind loopback: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| CliError::Bench(format!("no local address: {e}")))?;
        let state = eve_server::AppState::new(store.clone(), Arc::new(SystemClock));
        let server = tokio::spawn(eve_server::serve(listener, state));
        let client = reqwest::Client::new();
        let sent: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
        let errors = Arc::new(Mutex::new(0usize));
        let mut every = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(1) as f64));
        let mut posts = Vec::with_capacity(runs);
        for (i, token) in tokens.iter().enumerate() {
            every.tick().await;
            let url = format!("http://{addr}/.well-known/workflow/v1/webhook/{token}");
            let (client, sent, errors) = (client.clone(), sent.clone(), errors.clone());
            posts.push(tokio::spawn(async move {
                sent.lock()
                    .expect("sent lock")
                    .insert(i as u64, Instant::now());
                let ok = client
                    .post(url)
                    .header("idempotency-key", format!("delivery-{i}"))
                    .json(&serde_json::json!({"id": i}))
                    .send()
                    .await
                    .map(|r| r.status().as_u16() == 202)
                    .unwrap_or(false);
                if !ok {
                    *errors.lock().expect("errors lock") += 1;
                }
            }));
        }
        for p in posts {
            let _ = p.await;
        }
        let mut latencies = Vec::with_capacity(runs);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while latencies.len() < runs {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some((id, at))) => {
                    if let Some(t0) = sent.lock().expect("sent lock").get(&id) {
                        latencies.push(at.duration_since(*t0));
                        tick();
                    }
                }
                _ => break,
            }
        }
        let used = units().zip(units_before).map(|(a, b)| a.since(b));
        server.abort();
        latencies.sort();
        let never = runs - latencies.len();
        let errors = *errors.lock().expect("errors lock") + never;
        Ok(WebhookLatency {
            p50_ms: percentile_ms(&latencies, 0.5),
            p99_ms: percentile_ms(&latencies, 0.99),
            errors,
            resumed: latencies.len(),
            units: used,
        })
    }
    .await;
    *resumed().lock().expect("resumed lock") = None;
    worker.shutdown().await;
    result
}

/// This process's resident set size in KiB (Linux `/proc/self/status`; 0 elsewhere).
pub(crate) fn rss_kib() -> u64 {
    eve_core::testing::proc_status_kib("VmRSS").unwrap_or(0)
}

/// Worker memory per parked run, measured in a fresh `eve bench-child --parked` process on
/// the store at `location`: KiB of RSS growth per run.
pub(crate) async fn parked_in_child(
    store_url: &str,
    location: &str,
    runs: u32,
) -> Result<f64, CliError> {
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Bench(format!("cannot find the eve binary to re-run: {e}")))?;
    let out = tokio::process::Command::new(&exe)
        .args(["--store", store_url, "bench-child", "--location", location])
        .args([
            "--worker-id",
            &unique("parked"),
            "--parked",
            &runs.to_string(),
        ])
        .output()
        .await
        .map_err(|e| CliError::Bench(format!("cannot start {}: {e}", exe.display())))?;
    if !out.status.success() {
        return Err(CliError::Bench(format!(
            "the parked-runs process failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| CliError::Bench(format!("the parked-runs process printed no JSON: {e}")))?;
    v["kibPerRun"]
        .as_f64()
        .ok_or_else(|| CliError::Bench(format!("no kibPerRun in {v}")))
}

/// The hidden `eve bench-child --parked N`: prints `{"kibPerRun": …}`, see [`parked`].
pub(crate) async fn parked_child(
    store: Arc<dyn JournalStore>,
    worker_id: String,
    runs: u32,
    out: &mut dyn std::io::Write,
) -> Result<(), CliError> {
    let kib = parked(&store, worker_id, runs).await?;
    let _ = writeln!(out, "{}", serde_json::json!({ "kibPerRun": kib }));
    Ok(())
}

/// Worker memory per parked run: `runs` runs parked on a 1 h sleep after a warm-up batch;
/// the RSS growth of this process divided by `runs`, in KiB.
async fn parked(
    store: &Arc<dyn JournalStore>,
    worker_id: String,
    runs: u32,
) -> Result<f64, CliError> {
    let reg = registry();
    let w = worker(store, Some(worker_id), 64).await?;
    let session = SessionId::new(unique("parked"));
    let start = |i: u32| {
        let (store, reg, session) = (store.clone(), reg.clone(), session.clone());
        async move {
            start_tool_call(
                &*store,
                &reg,
                &session,
                &CallId::new(format!("p{i}")),
                "canned_nap",
                serde_json::json!({"delay": "1h"}),
                Timestamp::now(),
            )
            .await
            .map_err(CliError::engine("cannot start a parked run"))
            .map(drop)
        }
    };
    // Warm the allocator and the caches with a first batch.
    let warm = (runs / 10).max(1);
    for i in 0..warm {
        start(i).await?;
    }
    w.drain()
        .await
        .map_err(CliError::store("the parking worker failed"))?;
    let before = rss_kib();
    for i in warm..warm + runs {
        start(i).await?;
    }
    w.drain()
        .await
        .map_err(CliError::store("the parking worker failed"))?;
    let after = rss_kib();
    Ok(after.saturating_sub(before) as f64 / f64::from(runs.max(1)))
}
