//! `eve bench --store URL`: replay and step throughput on a backend, with progress bars and a
//! table at the end. The figures are the engine's (`Worker::replay_cold`, `Worker::drain` over
//! no-op steps), the same ones `cargo run -p eve-examples --bin measure` prints for memory and
//! SQLite, here for any backend a URL names.

use std::time::Duration;
#[cfg(feature = "conformance")]
use {
    crate::{error::CliError, factory::UrlFactory, store_url::StoreUrl},
    eve_conformance::StoreFactory,
    eve_core::engine::{start_tool_call, Registry, SystemClock, Worker, WorkerConfig},
    eve_core::testing::canned::{completed_steps_run, noop_steps_tool},
    eve_core::{CallId, DeploymentId, JournalStore, RunQuery, RunStatus, SessionId, Timestamp},
    indicatif::{ProgressBar, ProgressStyle},
    std::io::Write,
    std::sync::Arc,
    std::time::Instant,
};

/// How much work `eve bench` does. The defaults take a few seconds on a SQLite file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BenchConfig {
    /// Completed steps in the journal that is replayed cold.
    pub replay_steps: u32,
    /// Cold replays of it (the best is reported).
    pub replays: u32,
    /// No-op steps of the one sequential run.
    pub sequential_steps: u32,
    /// Runs started at once for the concurrent figure.
    pub concurrent_runs: u32,
    /// No-op steps of each of those runs.
    pub steps_per_run: u32,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            replay_steps: 10_000,
            replays: 5,
            sequential_steps: 1_000,
            concurrent_runs: 64,
            steps_per_run: 50,
        }
    }
}

/// One row of the final table.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// What was measured.
    pub what: String,
    /// How many units (events or steps).
    pub count: u64,
    /// The unit: "events" or "steps".
    pub unit: &'static str,
    /// Wall-clock time.
    pub elapsed: Duration,
}

impl Figure {
    /// Units per second.
    pub fn rate(&self) -> f64 {
        self.count as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

#[cfg(feature = "conformance")]
const DEPLOYMENT: &str = "eve-bench";
#[cfg(feature = "conformance")]
const CANNED_DEPLOYMENT: &str = "eve-bench-canned";

#[cfg(feature = "conformance")]
/// Runs the benchmark on fresh storage beside `url` (a temp file next to the SQLite file, a
/// random schema or table, all removed at the end), printing the table on `out` and progress
/// bars on stderr when it is a terminal.
///
/// Must run on a multi-thread tokio runtime.
///
/// # Errors
/// The backend's error, or the engine's when a run does not complete.
pub async fn run(
    url: &StoreUrl,
    config: BenchConfig,
    out: &mut dyn Write,
) -> Result<Vec<Figure>, CliError> {
    url.check_compiled()?;
    let factory =
        UrlFactory::beside(url.clone()).map_err(CliError::store("cannot make a temp dir"))?;
    let result = measure(&factory, config, out).await;
    let cleanup = factory.cleanup().await;
    let figures = result?;
    let backend = url.backend();
    let _ = writeln!(
        out,
        "{:<9} {:<34} {:>8} {:>6} {:>10} {:>14}",
        "BACKEND", "MEASURE", "COUNT", "UNIT", "TIME", "RATE"
    );
    for f in &figures {
        let _ = writeln!(
            out,
            "{:<9} {:<34} {:>8} {:>6} {:>10} {:>12.0}/s",
            backend,
            f.what,
            f.count,
            f.unit,
            format!("{:.1} ms", f.elapsed.as_secs_f64() * 1e3),
            f.rate()
        );
    }
    if let Err(e) = cleanup {
        let _ = writeln!(out, "note: could not remove the bench schema/table: {e}");
    }
    Ok(figures)
}

#[cfg(feature = "conformance")]
async fn measure(
    factory: &UrlFactory,
    config: BenchConfig,
    out: &mut dyn Write,
) -> Result<Vec<Figure>, CliError> {
    let store = factory
        .create()
        .await
        .map_err(CliError::store(format!(
            "cannot open fresh storage beside {}",
            factory.url()
        )))?
        .store;
    let _ = writeln!(
        out,
        "bench on fresh {} storage beside {}",
        store.backend(),
        factory.url()
    );
    let mut figures = Vec::new();
    figures.push(replay(&*store, config).await?);
    figures.push(
        steps(
            store.clone(),
            format!("steps, 1 run x {} sequential", config.sequential_steps),
            1,
            config.sequential_steps,
        )
        .await?,
    );
    figures.push(
        steps(
            store.clone(),
            format!(
                "steps, {} runs x {} concurrent",
                config.concurrent_runs, config.steps_per_run
            ),
            config.concurrent_runs,
            config.steps_per_run,
        )
        .await?,
    );
    Ok(figures)
}

#[cfg(feature = "conformance")]
fn bar(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg:<34} {bar:30.cyan/blue} {pos}/{len} {elapsed}")
            .expect("valid template"),
    );
    bar.set_message(what.to_owned());
    bar
}

#[cfg(feature = "conformance")]
async fn replay(store: &dyn JournalStore, config: BenchConfig) -> Result<Figure, CliError> {
    let registry = Registry::new(CANNED_DEPLOYMENT).with(noop_steps_tool());
    let setup = bar(
        1,
        &format!("writing a {}-step journal", config.replay_steps),
    );
    let run = completed_steps_run(
        store,
        CANNED_DEPLOYMENT,
        config.replay_steps,
        Timestamp::now(),
    )
    .await
    .map_err(CliError::store("cannot write the journal to replay"))?;
    setup.finish_and_clear();
    let what = format!("cold replay of {} steps", config.replay_steps);
    let progress = bar(u64::from(config.replays.max(1)), &what);
    let mut best = Duration::MAX;
    let mut events = 0;
    for _ in 0..config.replays.max(1) {
        let start = Instant::now();
        let report = Worker::replay_cold(store, &registry, &run)
            .await
            .map_err(CliError::store("cold replay failed"))?;
        best = best.min(start.elapsed());
        events = report.events;
        progress.inc(1);
    }
    progress.finish_and_clear();
    Ok(Figure {
        what,
        count: events,
        unit: "events",
        elapsed: best,
    })
}

#[cfg(feature = "conformance")]
async fn steps(
    store: Arc<dyn JournalStore>,
    what: String,
    runs: u32,
    per_run: u32,
) -> Result<Figure, CliError> {
    let deployment = format!("{DEPLOYMENT}-{}", uuid::Uuid::new_v4().simple());
    let registry = Registry::new(deployment.as_str()).with(noop_steps_tool());
    let session = SessionId::new(format!("bench-{}", uuid::Uuid::new_v4().simple()));
    for i in 0..runs {
        start_tool_call(
            &*store,
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
    let total = u64::from(runs) * u64::from(per_run);
    let progress = bar(total, &what);
    let query = RunQuery {
        session: Some(session.clone()),
        deployment: Some(DeploymentId::new(deployment.as_str())),
        ..RunQuery::default()
    };
    let start = Instant::now();
    let drain = worker.drain();
    tokio::pin!(drain);
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let ends = loop {
        tokio::select! {
            ends = &mut drain => break ends,
            _ = tick.tick() => {
                // Progress only: a failed read just skips this tick.
                if let Ok(list) = store.list_runs(&query).await {
                    let done: u64 = list
                        .iter()
                        .map(|r| r.next_seq.saturating_sub(1).min(u64::from(per_run)))
                        .sum();
                    progress.set_position(done);
                }
            }
        }
    };
    let elapsed = start.elapsed();
    progress.finish_and_clear();
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
    Ok(Figure {
        what,
        count: total,
        unit: "steps",
        elapsed,
    })
}
