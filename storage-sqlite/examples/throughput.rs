//! Quick throughput check (not a benchmark suite; `benches/` has the criterion ones):
//! appends of 16-event batches across 16 concurrent runs under NORMAL and FULL, and cold reads
//! of a 10,000-event journal.
//!
//! `cargo run --release -p eve-storage-sqlite --example throughput`

use eve_core::{
    Append, AppendId, CallId, DeploymentId, Event, Execution, JournalStore, JournalStoreExt,
    NewRun, Payload, RunId, SessionId, Timestamp, WorkerId, WorkflowId,
};
use eve_storage_sqlite::{SqliteOptions, SqliteStore, Synchronous};
use std::sync::Arc;
use std::time::{Duration, Instant};

const T: Timestamp = Timestamp(1_700_000_000_000);
const RUNS: usize = 16;
const BATCH: usize = 16;
const BATCHES_PER_RUN: usize = 400;

fn step(cmd: u64) -> Event {
    Event::StepCompleted {
        cmd,
        name: "step".into(),
        attempt: 1,
        output: Payload::from_json(format!(r#"{{"ok":true,"n":{cmd}}}"#)).expect("json"),
    }
}

fn new_run(i: usize) -> NewRun {
    NewRun {
        run_id: RunId::random(),
        idempotency_key: None,
        workflow_id: WorkflowId::new("bench::workflow"),
        deployment_id: DeploymentId::new("bench"),
        tool: "bench".into(),
        input: Payload::from_json("{}").expect("json"),
        session_id: SessionId::new("s"),
        call_id: CallId::new(format!("call-{i}-{}", RunId::random())),
        execution: Execution::Default,
        traceparent: None,
        reset_from: None,
    }
}

async fn appends(sync: Synchronous) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = SqliteOptions {
        synchronous: sync,
        ..SqliteOptions::default()
    };
    let store = Arc::new(
        SqliteStore::open_with(dir.path().join("a.db"), options)
            .await
            .expect("open"),
    );
    let lease = store
        .register_worker(
            &WorkerId::random(),
            &DeploymentId::new("bench"),
            Duration::from_secs(3600),
            T,
        )
        .await
        .expect("register");
    let mut runs = Vec::new();
    for i in 0..RUNS {
        runs.push(
            store
                .create_run(new_run(i), T)
                .await
                .expect("create")
                .run
                .run_id,
        );
    }
    assert_eq!(
        store.claim(&lease, RUNS, T).await.expect("claim").len(),
        RUNS
    );
    let start = Instant::now();
    let mut tasks = Vec::new();
    for run in runs {
        let (store, lease) = (store.clone(), lease.clone());
        tasks.push(tokio::spawn(async move {
            let mut seq = 1;
            for _ in 0..BATCHES_PER_RUN {
                let events = (seq..seq + BATCH as u64).map(step).collect();
                let done = store
                    .append(Append {
                        run: run.clone(),
                        expected_seq: seq,
                        lease: lease.clone(),
                        append_id: AppendId::random(),
                        events,
                        now: T,
                    })
                    .await
                    .expect("append");
                seq = done.next_seq;
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    (RUNS * BATCHES_PER_RUN * BATCH) as f64 / start.elapsed().as_secs_f64()
}

async fn cold_reads() -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("r.db");
    let run = {
        let store = SqliteStore::open_with(
            &path,
            SqliteOptions {
                synchronous: Synchronous::Normal,
                ..SqliteOptions::default()
            },
        )
        .await
        .expect("open");
        let lease = store
            .register_worker(
                &WorkerId::random(),
                &DeploymentId::new("bench"),
                Duration::from_secs(3600),
                T,
            )
            .await
            .expect("register");
        let run = store
            .create_run(new_run(0), T)
            .await
            .expect("create")
            .run
            .run_id;
        store.claim(&lease, 1, T).await.expect("claim");
        let mut seq = 1;
        while seq < 10_000 {
            let n = (10_000 - seq).min(BATCH as u64);
            let events = (seq..seq + n).map(step).collect();
            seq = store
                .append(Append {
                    run: run.clone(),
                    expected_seq: seq,
                    lease: lease.clone(),
                    append_id: AppendId::random(),
                    events,
                    now: T,
                })
                .await
                .expect("append")
                .next_seq;
        }
        run
    };
    let mut best = 0f64;
    for _ in 0..10 {
        // Cold: a fresh handle (new connections, empty statement cache) per read.
        let store = SqliteStore::open(&path).await.expect("open");
        let start = Instant::now();
        let events = store.read_all(&run, 0).await.expect("read");
        let rate = events.len() as f64 / start.elapsed().as_secs_f64();
        assert_eq!(events.len(), 10_000);
        best = best.max(rate);
    }
    best
}

#[tokio::main]
async fn main() {
    println!(
        "cores: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    for sync in [Synchronous::Normal, Synchronous::Full] {
        println!(
            "append {RUNS} runs x batches of {BATCH}, synchronous={sync:?}: {:.0} events/s",
            appends(sync).await
        );
    }
    println!(
        "cold read of a 10,000-event journal: {:.0} events/s (best of 10)",
        cold_reads().await
    );
}
