//! Engine figures on this machine: cold replay throughput (10,000 completed steps) and durable
//! no-op step throughput (one run sequential, 64 runs concurrent), on MemoryStore and a SQLite
//! file. `cargo run --release -p eve-examples --bin measure`

use eve_core::engine::{start_tool_call, Registry, SystemClock, Worker, WorkerConfig};
use eve_core::testing::canned::{completed_steps_run, noop_steps_tool};
use eve_core::{CallId, JournalStore, MemoryStore, RunStatus, SessionId, Timestamp};
use eve_storage_sqlite::SqliteStore;
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn replay(store: &Arc<dyn JournalStore>, label: &str) {
    let reg = Registry::new("measure").with(noop_steps_tool());
    let run = completed_steps_run(&**store, "canned", 10_000, Timestamp::now())
        .await
        .expect("canned run");
    let mut best = f64::MAX;
    let mut events = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let report = Worker::replay_cold(store, &reg, &run)
            .await
            .expect("replay");
        best = best.min(t.elapsed().as_secs_f64());
        events = report.events;
    }
    println!(
        "{label:>7} cold replay: {events} events in {:.1} ms = {:.0} events/s",
        best * 1e3,
        events as f64 / best
    );
}

async fn steps(store: Arc<dyn JournalStore>, label: &str, runs: u32, per_run: u32) {
    let reg = Registry::new("measure").with(noop_steps_tool());
    let mut ids = Vec::new();
    for i in 0..runs {
        let created = start_tool_call(
            &*store,
            &reg,
            &SessionId::new("measure"),
            &CallId::new(format!("{label}-{runs}-{i}-{}", Timestamp::now())),
            "canned",
            serde_json::json!({ "steps": per_run }),
            Timestamp::now(),
        )
        .await
        .expect("start");
        ids.push(created.run.run_id);
    }
    let config = WorkerConfig {
        max_active_runs: 64,
        ..WorkerConfig::default()
    };
    let w = Worker::new(store.clone(), reg, Arc::new(SystemClock), config)
        .await
        .expect("worker");
    let t = Instant::now();
    w.drain().await.expect("drain");
    let secs = t.elapsed().as_secs_f64();
    for id in &ids {
        assert_eq!(
            store.get_run(id).await.unwrap().status,
            RunStatus::Completed
        );
    }
    let total = f64::from(runs * per_run);
    println!(
        "{label:>7} steps, {runs} run(s) x {per_run}: {:.0} steps/s ({:.2} s)",
        total / secs,
        secs
    );
}

fn rss_kib() -> u64 {
    eve_core::testing::proc_status_kib("VmRSS").unwrap_or(0)
}

/// 10,000 runs parked on a 1 h sleep: the worker's RSS before and after they park. The store is
/// a SQLite file (its own caches are bounded), so the growth is what the worker keeps.
async fn parked(store: Arc<dyn JournalStore>) {
    let reg = Registry::new("parked").with(eve_core::testing::canned::nap_tool());
    let w = Worker::new(
        store.clone(),
        reg.clone(),
        Arc::new(SystemClock),
        WorkerConfig::default(),
    )
    .await
    .expect("worker");
    // Warm up allocator and caches with a first batch.
    let start = |i: u32| {
        let store = store.clone();
        let reg = reg.clone();
        async move {
            start_tool_call(
                &*store,
                &reg,
                &SessionId::new("parked"),
                &CallId::new(format!("p{i}")),
                "canned_nap",
                serde_json::json!({"delay": "1h"}),
                Timestamp::now(),
            )
            .await
            .expect("start");
        }
    };
    for i in 0..1_000 {
        start(i).await;
    }
    w.drain().await.expect("drain");
    let before = rss_kib();
    for i in 1_000..11_000 {
        start(i).await;
    }
    w.drain().await.expect("drain");
    let after = rss_kib();
    println!(
        " sqlite 10,000 more parked runs: worker RSS {before} KiB -> {after} KiB (+{} KiB)",
        after.saturating_sub(before)
    );
}

#[tokio::main]
async fn main() {
    let dir = std::env::temp_dir().join(format!("eve-measure-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let memory: Arc<dyn JournalStore> = Arc::new(MemoryStore::new());
    let sqlite: Arc<dyn JournalStore> =
        Arc::new(SqliteStore::open(dir.join("m.db")).await.expect("sqlite"));
    replay(&memory, "memory").await;
    replay(&sqlite, "sqlite").await;
    steps(memory.clone(), "memory", 1, 2_000).await;
    steps(sqlite.clone(), "sqlite", 1, 1_000).await;
    steps(memory.clone(), "memory", 64, 200).await;
    steps(sqlite.clone(), "sqlite", 64, 100).await;
    let normal: Arc<dyn JournalStore> = Arc::new(
        SqliteStore::open_with(
            dir.join("n.db"),
            eve_storage_sqlite::SqliteOptions {
                synchronous: eve_storage_sqlite::Synchronous::Normal,
                ..Default::default()
            },
        )
        .await
        .expect("sqlite"),
    );
    steps(normal.clone(), "sqlite (synchronous=NORMAL)", 64, 100).await;
    let parked_store: Arc<dyn JournalStore> =
        Arc::new(SqliteStore::open(dir.join("p.db")).await.expect("sqlite"));
    parked(parked_store).await;
    let _ = std::fs::remove_dir_all(&dir);
    tokio::time::sleep(Duration::from_millis(1)).await;
}
