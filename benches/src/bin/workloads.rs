//! The end-to-end workloads eve is compared on (issue 12), printing one JSON line per result:
//!
//! - **W1**: a tool whose body runs 10 sequential no-op steps, started and awaited end to end
//!   (`Session::call_tool` → `Session::wait_settled`), by 1 caller and by 8 concurrent callers:
//!   workflows/s, p50 and p99 latency.
//! - **W1-local**: W1 with its 10 steps marked local (`StepFuture::local`): they commit in one
//!   append with the run's end (`w1-local --backend sqlite-full`).
//! - **W2**: a body of 1000 no-op steps: its total time in one process; then the same run in a
//!   child process that dies inside step 1000 (`abort`, no clean-up), the cold replay of the 999
//!   recorded steps, and a fresh process recovering it (`recover_total`: from that process's
//!   start to the run finished).
//! - **throughput**: 64 runs × 50 no-op steps at once: steps/s.
//! - **journal**: activation latency against journal length (1k to 1M events): a cold
//!   activation, a warm resume of a body the worker holds, a cold replay (events/s).
//!
//! Backends: `sqlite-full`, `sqlite-normal` (files in a temp dir) and `postgres` (a fresh
//! schema at `EVE_TEST_POSTGRES_URL`).
//!
//! ```sh
//! cargo run --release -p eve-benches --bin workloads -- all                 # every backend
//! cargo run --release -p eve-benches --bin workloads -- w1 --backend sqlite-full
//! cargo run --release -p eve-benches --bin workloads -- w2 --backend postgres
//! ```
//!
//! `child` and `recover` are the processes W2 and the restart tests (`benches/tests/restart.rs`)
//! start: `child` runs one call of `many_steps` (optionally dying, hanging or slowing at a
//! step) and `recover` finishes a run another process left.

use clap::{Parser, Subcommand};
use eve_core::engine::{
    define_workflow_tool, Registry, Session, SystemClock, Worker, WorkerConfig, WorkerHandle,
    WorkflowCtx, WorkflowError, WorkflowTool,
};
use eve_core::{workflow, CallId, JournalStore, JournalStoreExt, RunId, SessionId, WorkerId};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The deployment of every workload run.
const DEPLOYMENT: &str = "workloads";

/// Step (1-based) at which `many_steps` aborts the process; 0: never.
static CRASH_AT: AtomicU32 = AtomicU32::new(0);
/// Step at which it hangs forever (until the process is killed); 0: never.
static HANG_AT: AtomicU32 = AtomicU32::new(0);
/// Milliseconds every step sleeps.
static DELAY_MS: AtomicU32 = AtomicU32::new(0);

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

/// W1's body with local steps: the ten outcomes commit in one append, with the end.
async fn ten_local_steps(ctx: WorkflowCtx, _: Empty) -> Result<u32, WorkflowError> {
    let mut n = 0;
    for i in 0..10u32 {
        n = ctx
            .step(format!("s{i}"), move |_| async move { Ok(i + 1) })
            .local()
            .await?;
    }
    Ok(n)
}

async fn many_steps(ctx: WorkflowCtx, input: Steps) -> Result<u32, WorkflowError> {
    let mut n = 0;
    for i in 1..=input.steps {
        n = ctx
            .step(format!("s{i}"), move |_| async move {
                if CRASH_AT.load(Ordering::Relaxed) == i {
                    // A crash inside the step: no destructor, no store call, no release.
                    std::process::abort();
                }
                if HANG_AT.load(Ordering::Relaxed) == i {
                    println!("hanging at step {i}");
                    std::future::pending::<()>().await;
                }
                let delay = DELAY_MS.load(Ordering::Relaxed);
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay.into())).await;
                }
                Ok(i)
            })
            .await?;
    }
    Ok(n)
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct StepsThenHook {
    steps: u32,
    token: String,
}

async fn steps_then_hook(ctx: WorkflowCtx, input: StepsThenHook) -> Result<u32, WorkflowError> {
    for i in 1..=input.steps {
        ctx.step(format!("s{i}"), move |_| async move { Ok(i) })
            .await?;
    }
    let hook = ctx.create_hook::<u32>(input.token);
    let a = hook.next().await?;
    let b: u32 = ctx
        .step("between", move |_| async move { Ok(a + 1) })
        .await?;
    let c = hook.next().await?;
    let d = hook.next().await?;
    Ok(ctx
        .step("after", move |_| async move { Ok(b + c + d) })
        .await?)
}

fn registry() -> Registry {
    let ten: WorkflowTool =
        define_workflow_tool("10 sequential no-op steps.", workflow!(ten_steps)).named("ten_steps");
    let many: WorkflowTool =
        define_workflow_tool("N sequential no-op steps.", workflow!(many_steps))
            .named("many_steps");
    let long: WorkflowTool = define_workflow_tool(
        "N steps, two hook payloads, a step.",
        workflow!(steps_then_hook),
    )
    .named("steps_then_hook");
    let ten_local: WorkflowTool = define_workflow_tool(
        "10 sequential no-op local steps.",
        workflow!(ten_local_steps),
    )
    .named("ten_local_steps");
    Registry::new(DEPLOYMENT)
        .with(ten)
        .with(many)
        .with(long)
        .with(ten_local)
}

#[derive(Parser)]
#[command(about = "eve's end-to-end workloads (W1, W2, throughput); one JSON line per result")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Every workload on every backend.
    All,
    /// W1: 10 no-op steps, started and awaited end to end, 1 and 8 callers.
    W1 {
        #[arg(long)]
        backend: String,
        /// Calls per caller.
        #[arg(long, default_value_t = 200)]
        calls: usize,
    },
    /// W1 with the 10 steps local (one commit for the steps and the end), 1 and 8 callers.
    W1Local {
        #[arg(long)]
        backend: String,
        /// Calls per caller.
        #[arg(long, default_value_t = 200)]
        calls: usize,
    },
    /// W2: 1000 no-op steps; a crash in step 1000, replay and recovery by a fresh process.
    W2 {
        #[arg(long)]
        backend: String,
        #[arg(long, default_value_t = 1000)]
        steps: u32,
    },
    /// 64 runs × 50 no-op steps at once.
    Throughput {
        #[arg(long)]
        backend: String,
        #[arg(long, default_value_t = 64)]
        runs: usize,
        #[arg(long, default_value_t = 50)]
        steps: u32,
    },
    /// Long journals: for each length, a journal of N recorded steps and a parked hook is
    /// written directly; then a cold activation (a hook payload → replay of N events → a step
    /// → parked again), a warm resume of the body this worker holds (a second payload → parked
    /// again), a last one (the third payload → its step, the end) and a cold replay of the
    /// whole journal.
    Journal {
        #[arg(long)]
        backend: String,
        /// Journal lengths (steps).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "1000,10000,100000,1000000"
        )]
        lengths: Vec<u32>,
    },
    /// The parts of W2's cold replay on a warm store, repeated: a finished run of STEPS steps,
    /// then ROUNDS times the journal's read (`read_all`) and its replay in memory; medians.
    Replay {
        #[arg(long)]
        backend: String,
        #[arg(long, default_value_t = 1000)]
        steps: u32,
        #[arg(long, default_value_t = 200)]
        rounds: u32,
    },
    /// Runs one call of `many_steps` on TARGET; prints `run <id>` first.
    Child {
        #[command(flatten)]
        proc: Proc,
        #[arg(long)]
        steps: u32,
        /// Abort the process inside this step.
        #[arg(long, default_value_t = 0)]
        crash_at: u32,
        /// Hang forever inside this step (prints `hanging at step N`).
        #[arg(long, default_value_t = 0)]
        hang_at: u32,
        /// Sleep this long in every step.
        #[arg(long, default_value_t = 0)]
        delay_ms: u32,
    },
    /// Finishes RUN, left by another process; prints `{"recover_ms": …}` (from this process's
    /// start to the run finished).
    Recover {
        #[command(flatten)]
        proc: Proc,
        #[arg(long)]
        run: String,
        /// Sleep this long in every step.
        #[arg(long, default_value_t = 0)]
        delay_ms: u32,
    },
}

/// What a `child` or `recover` process needs.
#[derive(clap::Args)]
struct Proc {
    /// `sqlite-full:PATH`, `sqlite-normal:PATH` or `postgres:SCHEMA` (at `EVE_TEST_POSTGRES_URL`).
    #[arg(long)]
    target: String,
    /// The worker's id; by default the stable `{host}/{deployment}`.
    #[arg(long)]
    worker_id: Option<String>,
    /// The worker's lease in seconds.
    #[arg(long)]
    lease_secs: Option<u64>,
}

/// A fresh target of `backend` (a new file, a new schema).
fn fresh_target(backend: &str, dir: &std::path::Path) -> String {
    let tag = RunId::random().as_str()[4..16].to_owned();
    match backend {
        "sqlite-full" | "sqlite-normal" => {
            format!("{backend}:{}", dir.join(format!("{tag}.db")).display())
        }
        "postgres" => format!(
            "postgres:{}",
            eve_benches::created_schema(format!("wl_{tag}"))
        ),
        other => panic!("unknown backend {other}; use sqlite-full, sqlite-normal or postgres"),
    }
}

async fn worker(store: &Arc<dyn JournalStore>, id: Option<String>, lease: Option<u64>) -> Worker {
    let mut config = WorkerConfig {
        id: id.map(WorkerId::new),
        ..WorkerConfig::default()
    };
    if let Some(s) = lease {
        config.lease_ttl = Duration::from_secs(s);
    }
    match Worker::new(store.clone(), registry(), Arc::new(SystemClock), config).await {
        Ok(worker) => worker,
        Err(e) => {
            // Another live process holds this worker id (or the store failed): say so, exit 4.
            eprintln!("cannot start the worker: {e}");
            std::process::exit(4);
        }
    }
}

fn session(store: &Arc<dyn JournalStore>, id: &str) -> Session {
    Session::new(
        store.clone(),
        Arc::new(registry()),
        Arc::new(SystemClock),
        SessionId::new(id),
    )
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// Starts and awaits one call; returns its latency.
async fn call(s: &Session, call_id: &str, tool: &str, input: serde_json::Value) -> Duration {
    let t0 = Instant::now();
    s.call_tool(call_id, tool, input).await.expect("call_tool");
    let r = s
        .wait_settled(&CallId::new(call_id))
        .await
        .expect("wait_settled");
    assert!(matches!(r, eve_core::ToolResult::Completed { .. }), "{r:?}");
    t0.elapsed()
}

/// W1: `tool` (ten no-op steps) called end to end by 1 and by 8 callers; `workload` names the
/// JSON lines, `tag` prefixes the worker and session ids.
async fn w1(
    backend: &str,
    calls: usize,
    dir: &std::path::Path,
    (workload, tool, tag): (&str, &'static str, &str),
) {
    let store = eve_benches::open_target(&fresh_target(backend, dir)).await;
    let w = worker(&store, Some(format!("{tag}-{}", RunId::random())), None).await;
    let handle = w.clone().spawn();
    // Calls start eagerly through the local worker (create and claim in one commit).
    let session =
        |store: &Arc<dyn JournalStore>, id: &str| session(store, id).with_worker(w.clone());
    for callers in [1usize, 8] {
        // Warm-up: connections, statement caches.
        let warm = session(&store, &format!("warm-{tag}-{callers}"));
        for i in 0..10 {
            call(&warm, &format!("w{i}"), tool, serde_json::json!({})).await;
        }
        let t0 = Instant::now();
        let tasks: Vec<_> = (0..callers)
            .map(|c| {
                let s = session(&store, &format!("{tag}-{callers}-{c}"));
                tokio::spawn(async move {
                    let mut lat = Vec::with_capacity(calls);
                    for i in 0..calls {
                        lat.push(call(&s, &format!("c{i}"), tool, serde_json::json!({})).await);
                    }
                    lat
                })
            })
            .collect();
        let mut lat = Vec::new();
        for t in tasks {
            lat.extend(t.await.expect("caller"));
        }
        let total = t0.elapsed();
        lat.sort();
        println!(
            "{}",
            serde_json::json!({
                "workload": workload, "backend": backend, "callers": callers, "calls": lat.len(),
                "wf_per_s": lat.len() as f64 / total.as_secs_f64(),
                "p50_ms": percentile(&lat, 0.5), "p99_ms": percentile(&lat, 0.99),
                "total_s": total.as_secs_f64(),
            })
        );
    }
    handle.shutdown().await;
}

/// W1 of `ten_steps`.
const W1: (&str, &str, &str) = ("W1", "ten_steps", "w1");
/// W1 with `ten_local_steps`: the same calls, the steps local.
const W1_LOCAL: (&str, &str, &str) = ("W1-local", "ten_local_steps", "w1l");

async fn w2(backend: &str, steps: u32, dir: &std::path::Path) {
    // The whole body in one process.
    let store = eve_benches::open_target(&fresh_target(backend, dir)).await;
    let w = worker(&store, Some(format!("w2-{}", RunId::random())), None).await;
    let handle = w.clone().spawn();
    let s = session(&store, "w2-total").with_worker(w);
    call(&s, "warm", "many_steps", serde_json::json!({"steps": 10})).await;
    let total = call(&s, "c", "many_steps", serde_json::json!({"steps": steps})).await;
    handle.shutdown().await;
    drop(store);

    // A child process that dies inside the last step.
    let target = fresh_target(backend, dir);
    let exe = std::env::current_exe().expect("this binary");
    let out = std::process::Command::new(&exe)
        .args(["child", "--target", &target, "--steps", &steps.to_string()])
        .args(["--crash-at", &steps.to_string()])
        .output()
        .expect("run the child");
    assert!(
        !out.status.success(),
        "the child was to die inside its last step"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let run = stdout
        .lines()
        .find_map(|l| l.strip_prefix("run "))
        .expect("the child printed its run id")
        .to_owned();
    let store = eve_benches::open_target(&target).await;
    let t0 = Instant::now();
    let report = Worker::replay_cold(&store, &registry(), &RunId::new(&run))
        .await
        .expect("replay");
    let replay = t0.elapsed();
    assert_eq!(report.commands, u64::from(steps), "{report:?}");
    // The same again on the now warm store, split into its two parts: the read (store round
    // trips, decoding) and the replay of the events in memory.
    let t0 = Instant::now();
    let events = store
        .read_all(&RunId::new(&run), 0)
        .await
        .expect("read the journal");
    let read_warm = t0.elapsed();
    let t0 = Instant::now();
    Worker::replay_journal(&registry(), &RunId::new(&run), &events).expect("replay");
    let replay_only = t0.elapsed();
    drop(store);

    // A fresh process (same default worker id) takes the run back and finishes it.
    let t0 = Instant::now();
    let out = std::process::Command::new(&exe)
        .args(["recover", "--target", &target, "--run", &run])
        .output()
        .expect("run the recovery");
    let wall = t0.elapsed();
    assert!(
        out.status.success(),
        "recovery failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout);
    let inner: serde_json::Value = serde_json::from_str(line.trim()).expect("recover's JSON");
    println!(
        "{}",
        serde_json::json!({
            "workload": "W2", "backend": backend, "steps": steps,
            "total_s": total.as_secs_f64(),
            "replay_ms": replay.as_secs_f64() * 1e3, "replayed_events": report.events,
            "read_warm_ms": read_warm.as_secs_f64() * 1e3,
            "replay_only_ms": replay_only.as_secs_f64() * 1e3,
            "recover_total_ms": inner["recover_ms"],
            "recover_process_wall_ms": wall.as_secs_f64() * 1e3,
        })
    );
}

async fn throughput(backend: &str, runs: usize, steps: u32, dir: &std::path::Path) {
    let store = eve_benches::open_target(&fresh_target(backend, dir)).await;
    let w = worker(&store, Some(format!("tp-{}", RunId::random())), None).await;
    let handle = w.clone().spawn();
    let session =
        |store: &Arc<dyn JournalStore>, id: &str| session(store, id).with_worker(w.clone());
    let warm = session(&store, "tp-warm");
    call(&warm, "w", "many_steps", serde_json::json!({"steps": 5})).await;
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..runs)
        .map(|i| {
            let s = session(&store, &format!("tp-{i}"));
            tokio::spawn(async move {
                call(&s, "c", "many_steps", serde_json::json!({"steps": steps})).await
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("run");
    }
    let total = t0.elapsed();
    handle.shutdown().await;
    let n = runs as f64 * f64::from(steps);
    println!(
        "{}",
        serde_json::json!({
            "workload": "throughput", "backend": backend, "runs": runs, "steps_per_run": steps,
            "steps_per_s": n / total.as_secs_f64(), "total_s": total.as_secs_f64(),
        })
    );
}

async fn journal(backend: &str, lengths: &[u32], dir: &std::path::Path) {
    use eve_core::engine::{resume_hook, tool_call_run, ActivationEnd, Clock};
    use eve_core::{Append, AppendId, DeploymentId, Event, Payload};
    for &n in lengths {
        let store = eve_benches::open_target(&fresh_target(backend, dir)).await;
        let reg = registry();
        let token = format!("jl-{}", RunId::random());
        let new = tool_call_run(
            &reg,
            &SessionId::new("journal"),
            &CallId::new("c"),
            "steps_then_hook",
            serde_json::json!({"steps": n, "token": token}),
        )
        .expect("start request");
        let clock = SystemClock;
        let run = store
            .create_run(new, clock.now())
            .await
            .expect("create")
            .run
            .run_id;
        // The journal a worker would have written: N step results, then the hook.
        let lease = store
            .register_worker(
                &WorkerId::new(format!("builder-{}", RunId::random())),
                &DeploymentId::new(DEPLOYMENT),
                Duration::from_secs(3600),
                clock.now(),
            )
            .await
            .expect("register");
        store.claim(&lease, 1, clock.now()).await.expect("claim");
        let mut seq = 1;
        let t0 = Instant::now();
        let mut events: Vec<Event> = (1..=n)
            .map(|i| Event::StepCompleted {
                cmd: u64::from(i - 1),
                name: format!("s{i}"),
                attempt: 1,
                output: Payload::from_value(&i).expect("json"),
            })
            .collect();
        events.push(Event::HookCreated {
            cmd: u64::from(n),
            token: token.clone(),
            webhook: false,
            respond_with: None,
        });
        for chunk in events.chunks(eve_core::store::MAX_EVENTS_PER_APPEND) {
            let done = store
                .append(Append {
                    run: run.clone(),
                    expected_seq: seq,
                    lease: lease.clone(),
                    append_id: AppendId::random(),
                    events: chunk.to_vec(),
                    now: clock.now(),
                })
                .await
                .expect("append");
            seq = done.next_seq;
        }
        let write = t0.elapsed();
        drop(events);
        store
            .release(&lease, &run, seq, clock.now())
            .await
            .expect("release");
        store
            .retire_worker(&lease, clock.now())
            .await
            .expect("retire");

        let w = worker(&store, Some(format!("journal-{}", RunId::random())), None).await;
        // The first payload: a cold activation replays the N steps, then waits for the second.
        resume_hook(&*store, &token, &7, None, clock.now())
            .await
            .expect("hook");
        let t0 = Instant::now();
        let ends = w.run_once().await.expect("cold activation");
        let cold = t0.elapsed();
        assert_eq!(
            ends.first().map(|e| &e.1),
            Some(&ActivationEnd::Suspended),
            "{ends:?}"
        );
        // The second: the worker still holds the body and reads only that payload; the body
        // parks again on the third.
        resume_hook(&*store, &token, &8, None, clock.now())
            .await
            .expect("hook");
        let t0 = Instant::now();
        let ends = w.run_once().await.expect("warm resume");
        let warm = t0.elapsed();
        assert_eq!(
            ends.first().map(|e| &e.1),
            Some(&ActivationEnd::Suspended),
            "{ends:?}"
        );
        // The third ends the run: its last step and the end.
        resume_hook(&*store, &token, &9, None, clock.now())
            .await
            .expect("hook");
        let t0 = Instant::now();
        let ends = w.run_once().await.expect("last resume");
        let last = t0.elapsed();
        assert_eq!(
            ends.first().map(|e| &e.1),
            Some(&ActivationEnd::Completed),
            "{ends:?}"
        );
        let t0 = Instant::now();
        let report = Worker::replay_cold(&store, &reg, &run)
            .await
            .expect("replay");
        let replay = t0.elapsed();
        println!(
            "{}",
            serde_json::json!({
                "workload": "journal", "backend": backend, "steps": n,
                "events": report.events,
                "write_s": write.as_secs_f64(),
                "cold_activation_ms": cold.as_secs_f64() * 1e3,
                "warm_resume_ms": warm.as_secs_f64() * 1e3,
                "warm_resume_to_end_ms": last.as_secs_f64() * 1e3,
                "cold_replay_ms": replay.as_secs_f64() * 1e3,
                "cold_replay_events_per_s": report.events as f64 / replay.as_secs_f64(),
            })
        );
    }
}

async fn replay_parts(backend: &str, steps: u32, rounds: u32, dir: &std::path::Path) {
    let store = eve_benches::open_target(&fresh_target(backend, dir)).await;
    let w = worker(&store, Some(format!("rp-{}", RunId::random())), None).await;
    let handle = w.clone().spawn();
    let s = session(&store, "replay").with_worker(w);
    call(&s, "c", "many_steps", serde_json::json!({"steps": steps})).await;
    handle.shutdown().await;
    let rec = store
        .list_runs(&eve_core::RunQuery {
            session: Some(SessionId::new("replay")),
            ..Default::default()
        })
        .await
        .expect("runs")
        .pop()
        .expect("the run");
    let run = rec.run_id;
    let reg = registry();
    let (mut reads, mut replays) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t0 = Instant::now();
        let events = store.read_all(&run, 0).await.expect("read");
        reads.push(t0.elapsed());
        let t0 = Instant::now();
        Worker::replay_journal(&reg, &run, &events).expect("replay");
        replays.push(t0.elapsed());
    }
    reads.sort();
    replays.sort();
    println!(
        "{}",
        serde_json::json!({
            "workload": "replay_parts", "backend": backend, "steps": steps, "rounds": rounds,
            "read_p50_ms": percentile(&reads, 0.5), "read_min_ms": percentile(&reads, 0.0),
            "replay_p50_ms": percentile(&replays, 0.5), "replay_min_ms": percentile(&replays, 0.0),
        })
    );
}

/// Waits for the call's result or for the worker to stop by itself (fenced): exits 3 then.
async fn settle_or_fenced(s: &Session, call_id: &CallId, mut handle: WorkerHandle) -> WorkerHandle {
    tokio::select! {
        r = s.wait_settled(call_id) => {
            r.expect("wait_settled");
        }
        e = handle.stopped() => {
            eprintln!("worker stopped: {e:?}");
            std::process::exit(3);
        }
    }
    handle
}

async fn child(p: Proc, steps: u32, crash_at: u32, hang_at: u32, delay_ms: u32) {
    CRASH_AT.store(crash_at, Ordering::Relaxed);
    HANG_AT.store(hang_at, Ordering::Relaxed);
    DELAY_MS.store(delay_ms, Ordering::Relaxed);
    let store = eve_benches::open_target(&p.target).await;
    let handle = worker(&store, p.worker_id, p.lease_secs).await.spawn();
    let s = session(&store, "restart");
    let start = s
        .call_tool("c1", "many_steps", serde_json::json!({"steps": steps}))
        .await
        .expect("call_tool");
    let run = match start {
        eve_core::engine::ToolCallStart::Parked { run_id } => run_id,
        other => panic!("{other:?}"),
    };
    println!("run {run}");
    let handle = settle_or_fenced(&s, &CallId::new("c1"), handle).await;
    handle.shutdown().await;
}

async fn recover(p: Proc, run: String, started: Instant) {
    let store = eve_benches::open_target(&p.target).await;
    let handle = worker(&store, p.worker_id, p.lease_secs).await.spawn();
    let rec = store.get_run(&RunId::new(run)).await.expect("the run");
    let s = session(&store, rec.session_id.as_str());
    let handle = settle_or_fenced(&s, &rec.call_id, handle).await;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    handle.shutdown().await;
    println!("{}", serde_json::json!({ "recover_ms": ms }));
}

fn main() {
    let started = Instant::now();
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    rt.block_on(async move {
        match cli.command {
            Command::All => {
                let mut backends = vec!["sqlite-full", "sqlite-normal"];
                if std::env::var("EVE_TEST_POSTGRES_URL").is_ok() {
                    backends.push("postgres");
                }
                for b in backends {
                    w1(b, 200, dir.path(), W1).await;
                    w2(b, 1000, dir.path()).await;
                    throughput(b, 64, 50, dir.path()).await;
                }
            }
            Command::W1 { backend, calls } => w1(&backend, calls, dir.path(), W1).await,
            Command::W1Local { backend, calls } => w1(&backend, calls, dir.path(), W1_LOCAL).await,
            Command::W2 { backend, steps } => w2(&backend, steps, dir.path()).await,
            Command::Replay {
                backend,
                steps,
                rounds,
            } => replay_parts(&backend, steps, rounds, dir.path()).await,
            Command::Journal { backend, lengths } => journal(&backend, &lengths, dir.path()).await,
            Command::Throughput {
                backend,
                runs,
                steps,
            } => throughput(&backend, runs, steps, dir.path()).await,
            Command::Child {
                proc,
                steps,
                crash_at,
                hang_at,
                delay_ms,
            } => child(proc, steps, crash_at, hang_at, delay_ms).await,
            Command::Recover {
                proc,
                run,
                delay_ms,
            } => {
                DELAY_MS.store(delay_ms, Ordering::Relaxed);
                recover(proc, run, started).await
            }
        }
        // The fresh schemas of the measurements above (children and recoveries make none).
        eve_benches::drop_created().await;
    });
}
