//! Million-event journals grown by the engine (issue 28 item 3): one run that really takes N
//! steps through a worker, on one backend, printing one JSON line per result and a table.
//!
//! - **append**: the per-step cost (step start to the next step's start: the outcome's append,
//!   its delivery, the body's poll) as the mean over the `--window` steps ending at 1k, 10k,
//!   100k and 1M events (the sizes up to `--steps`);
//! - **warm resume**: at each of those sizes the body parks on a hook; a payload resumes it
//!   while the worker still holds it (`run_once`), and the time until it parks again is
//!   reported (it should not depend on the journal's length);
//! - **cold replay**: once the run completed, a fresh process of this binary replays its whole
//!   journal from the store (`Worker::replay_cold`) and reports its time and its peak resident
//!   memory (`VmHWM` from `/proc/self/status`).
//!
//! Backends: `sqlite-full` (a file in a temp dir), `postgres` (a fresh schema at
//! `EVE_TEST_POSTGRES_URL`), `dynamodb` (a fresh table at `EVE_TEST_DYNAMODB_ENDPOINT`).
//!
//! ```sh
//! cargo run --release -p eve-benches --bin long_journal -- --backend sqlite-full              # 1,000,000 steps
//! cargo run --release -p eve-benches --bin long_journal -- --backend postgres                 # 1,000,000 steps
//! cargo run --release -p eve-benches --bin long_journal -- --backend dynamodb                 # 100,000 steps
//! cargo run --release -p eve-benches --bin long_journal -- --backend sqlite-full --steps 20000
//! ```

use clap::Parser;
use eve_core::engine::{
    define_workflow_tool, resume_hook, tool_call_run, ActivationEnd, Clock, Registry, SystemClock,
    Worker, WorkerConfig, WorkflowCtx, WorkflowError, WorkflowTool,
};
use eve_core::{workflow, CallId, RunId, SessionId, WorkerId};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The deployment of the bench's run.
const DEPLOYMENT: &str = "long-journal";

/// The sizes at which the per-step cost and the warm resume are reported.
const SIZES: [u64; 4] = [1_000, 10_000, 100_000, 1_000_000];

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct LongRun {
    /// Steps in all.
    steps: u64,
    /// After these step counts the body parks twice on the hook.
    parks: Vec<u64>,
    token: String,
}

/// When each watched step started, by its number (1-based); only the window bounds are kept.
fn marks() -> &'static Mutex<Vec<(u64, Instant)>> {
    static MARKS: OnceLock<Mutex<Vec<(u64, Instant)>>> = OnceLock::new();
    MARKS.get_or_init(|| Mutex::new(Vec::new()))
}

/// The per-step window, set once from the command line.
static WINDOW: AtomicU64 = AtomicU64::new(500);

fn watched(i: u64) -> bool {
    let w = WINDOW.load(Ordering::Relaxed);
    SIZES.iter().any(|&n| i == n + 1 - w.min(n - 1) || i == n)
}

/// N steps; at each size in `parks` the body waits for two hook payloads (the first resume is
/// the measured warm one, the second lets it go on).
async fn long_run(ctx: WorkflowCtx, input: LongRun) -> Result<u64, WorkflowError> {
    let hook = ctx.create_hook::<u64>(input.token);
    let mut sum = 0u64;
    for i in 1..=input.steps {
        sum += ctx
            .step("s", move |_| async move {
                if watched(i) {
                    marks().lock().expect("marks").push((i, Instant::now()));
                }
                Ok(i)
            })
            .await?;
        if input.parks.contains(&i) {
            sum += hook.next().await?;
            sum += hook.next().await?;
        }
    }
    Ok(sum)
}

fn registry() -> Registry {
    let tool: WorkflowTool = define_workflow_tool(
        "N steps, parking on a hook at the report sizes.",
        workflow!(long_run),
    )
    .named("long_run");
    Registry::new(DEPLOYMENT).with(tool)
}

#[derive(Parser)]
#[command(about = "A run of N steps through the engine: per-step cost, warm resume, cold replay")]
struct Cli {
    /// sqlite-full, postgres or dynamodb.
    #[arg(long, default_value = "sqlite-full")]
    backend: String,
    /// Steps of the run (default 1,000,000; 100,000 on DynamoDB).
    #[arg(long)]
    steps: Option<u64>,
    /// Steps averaged for each per-step figure (the window ends at the reported size).
    #[arg(long, default_value_t = 500)]
    window: u64,
    /// Keep the SQLite file in DIR (not a temporary directory), to replay it again with
    /// `--replay-target sqlite-full:DIR/long.db --run RUN` (the run id is in the last line).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// Internal: replay RUN cold from TARGET in this process and print its time and peak RSS.
    #[arg(long, hide = true, requires = "run")]
    replay_target: Option<String>,
    /// Internal: the run `--replay-target` replays.
    #[arg(long, hide = true)]
    run: Option<String>,
}

/// Peak resident memory of this process in MiB (`VmHWM`), if the platform reports it.
fn peak_rss_mib() -> Option<f64> {
    eve_core::testing::proc_status_kib("VmHWM").map(|kib| kib as f64 / 1024.0)
}

/// The child process: a cold replay of `run` and this process's peak memory.
async fn replay_child(target: &str, run: &str) {
    let store = eve_benches::open_target(target).await;
    let rss_before = peak_rss_mib();
    let t0 = Instant::now();
    let report = Worker::replay_cold(&store, &registry(), &RunId::new(run))
        .await
        .expect("cold replay");
    let s = t0.elapsed().as_secs_f64();
    assert!(report.finished, "the replayed body must reach its end");
    println!(
        "{}",
        serde_json::json!({
            "events": report.events,
            "cold_replay_s": s,
            "events_per_s": report.events as f64 / s,
            "peak_rss_mib": peak_rss_mib(),
            "rss_before_mib": rss_before,
        })
    );
}

/// One activation that must end as `want`.
async fn activation(w: &Worker, want: ActivationEnd) -> Duration {
    let t0 = Instant::now();
    let ends = w.run_once().await.expect("activation");
    let took = t0.elapsed();
    assert_eq!(ends.first().map(|e| &e.1), Some(&want), "{ends:?}");
    took
}

async fn bench(backend: &str, steps: u64, window: u64, keep: Option<std::path::PathBuf>) {
    let temp = tempfile::tempdir().expect("temp dir");
    let dir = keep.unwrap_or_else(|| temp.path().to_owned());
    let tag = RunId::random().as_str()[4..16].to_owned();
    let target = match backend {
        "sqlite-full" => format!("sqlite-full:{}", dir.join("long.db").display()),
        "postgres" => format!("postgres:lj_{tag}"),
        "dynamodb" => format!("dynamodb:lj_{tag}"),
        other => panic!("unknown backend {other}; use sqlite-full, postgres or dynamodb"),
    };
    let store = eve_benches::open_new_target(&target).await;
    let reg = registry();
    let sizes: Vec<u64> = SIZES.iter().copied().filter(|&n| n <= steps).collect();
    let token = format!("lj-{tag}");
    let new = tool_call_run(
        &reg,
        &SessionId::new("long-journal"),
        &CallId::new("c"),
        "long_run",
        serde_json::json!({"steps": steps, "parks": sizes, "token": token}),
    )
    .expect("start request");
    let clock = SystemClock;
    let run = store
        .create_run(new, clock.now())
        .await
        .expect("create the run")
        .run
        .run_id;
    // One activation runs every step up to the next park: a long one, so a lease that does not
    // lapse while the worker is busy.
    let config = WorkerConfig {
        id: Some(WorkerId::new(format!("lj-{tag}"))),
        lease_ttl: Duration::from_secs(24 * 3600),
        ..WorkerConfig::default()
    };
    let w = Worker::new(store.clone(), registry(), Arc::new(SystemClock), config)
        .await
        .expect("worker");
    let mut rows = Vec::new();
    let started = Instant::now();
    let mut delivered = 0u64;
    for &n in &sizes {
        let run_steps = activation(&w, ActivationEnd::Suspended).await;
        // The steps ran; the body waits for the first payload at N steps.
        delivered += 1;
        resume_hook(&*store, &token, &delivered, None, clock.now())
            .await
            .expect("hook payload");
        let warm = activation(&w, ActivationEnd::Suspended).await;
        delivered += 1;
        resume_hook(&*store, &token, &delivered, None, clock.now())
            .await
            .expect("hook payload");
        let marks = marks().lock().expect("marks").clone();
        let at = |k: u64| marks.iter().find(|m| m.0 == k).map(|m| m.1);
        let w = window.min(n - 1);
        let per_step_us = match (at(n + 1 - w), at(n)) {
            (Some(a), Some(b)) if w > 1 => Some((b - a).as_secs_f64() * 1e6 / (w - 1) as f64),
            _ => None,
        };
        let events = store.get_run(&run).await.expect("run").next_seq;
        let row = serde_json::json!({
            "bench": "long_journal", "backend": backend, "steps": n, "events": events,
            "per_step_us": per_step_us, "window": w,
            "warm_resume_ms": warm.as_secs_f64() * 1e3,
            "activation_s": run_steps.as_secs_f64(),
            "elapsed_s": started.elapsed().as_secs_f64(),
        });
        println!("{row}");
        rows.push(row);
    }
    // The rest of the steps (if any) and the end.
    activation(&w, ActivationEnd::Completed).await;
    let total = store.get_run(&run).await.expect("run").next_seq;
    drop(w);
    // The cold replay in a fresh process: its peak memory is the replay's alone.
    let out = std::process::Command::new(std::env::current_exe().expect("this binary"))
        .args(["--replay-target", &target, "--run", run.as_str()])
        .output()
        .expect("the replay process");
    assert!(
        out.status.success(),
        "replay process failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let replay: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the replay process's JSON line");
    let line = serde_json::json!({
        "bench": "long_journal", "backend": backend, "steps": steps, "events": total,
        "target": target, "run": run.as_str(), "cold_replay_s": replay["cold_replay_s"], "events_per_s": replay["events_per_s"],
        "peak_rss_mib": replay["peak_rss_mib"], "total_s": started.elapsed().as_secs_f64(),
    });
    println!("{line}");
    println!();
    println!("{backend}: {steps} steps through the engine");
    println!(
        "{:>10} {:>10} {:>14} {:>16}",
        "steps", "events", "per step µs", "warm resume ms"
    );
    for r in &rows {
        println!(
            "{:>10} {:>10} {:>14.1} {:>16.2}",
            r["steps"].as_u64().unwrap_or(0),
            r["events"].as_u64().unwrap_or(0),
            r["per_step_us"].as_f64().unwrap_or(f64::NAN),
            r["warm_resume_ms"].as_f64().unwrap_or(f64::NAN)
        );
    }
    println!(
        "cold replay of {total} events: {:.3} s, peak RSS {:.0} MiB",
        replay["cold_replay_s"].as_f64().unwrap_or(f64::NAN),
        replay["peak_rss_mib"].as_f64().unwrap_or(f64::NAN)
    );
    // The figures are out: the schema or table goes (a SQLite file goes with its temp dir).
    eve_benches::drop_target(&target).await;
}

fn main() {
    let cli = Cli::parse();
    WINDOW.store(cli.window.max(2), Ordering::Relaxed);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        if let (Some(target), Some(run)) = (&cli.replay_target, &cli.run) {
            replay_child(target, run).await;
            return;
        }
        let steps = cli.steps.unwrap_or(if cli.backend == "dynamodb" {
            100_000
        } else {
            1_000_000
        });
        bench(&cli.backend, steps, cli.window.max(2), cli.dir).await;
    });
}
