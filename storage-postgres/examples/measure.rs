//! Quick figures for eve-storage-postgres (the criterion benches live in `benches/`):
//! append throughput with 16 runs appending batches of 16 events concurrently, and a cold read
//! of a 10,000-event journal.
//!
//! ```text
//! EVE_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --release -p eve-storage-postgres --example measure
//! ```
//! Works in a fresh schema and drops it afterwards.

use eve_core::{
    AppendId, CallId, DeploymentId, Event, Execution, JournalStore, JournalStoreExt, NewRun,
    Payload, RunId, SessionId, StoreError, Timestamp, WorkerId, WorkflowId,
};
use eve_storage_postgres::{PostgresOptions, PostgresStore};
use std::sync::Arc;
use std::time::{Duration, Instant};

const RUNS: usize = 16;
const BATCH: usize = 16;
const BATCHES_PER_RUN: usize = 100;
const COLD_EVENTS: usize = 10_000;

fn new_run(i: usize, dep: &DeploymentId) -> NewRun {
    NewRun {
        run_id: RunId::new(format!("run-{i}")),
        idempotency_key: None,
        workflow_id: WorkflowId::new("bench"),
        deployment_id: dep.clone(),
        tool: "bench".into(),
        input: Payload::from_json("{}").expect("json"),
        session_id: SessionId::new("s"),
        call_id: CallId::new(format!("c{i}")),
        execution: Execution::Default,
        traceparent: None,
        reset_from: None,
    }
}

fn batch(first: u64) -> Vec<Event> {
    (0..BATCH as u64)
        .map(|i| Event::StepCompleted {
            cmd: first + i,
            name: "step".into(),
            attempt: 1,
            output: Payload::from_json(r#"{"ok":true,"n":12345}"#).expect("json"),
        })
        .collect()
}

#[tokio::main]
async fn main() -> Result<(), StoreError> {
    let url = std::env::var("EVE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = format!("eve_measure_{}", std::process::id());
    let opts = PostgresOptions {
        schema: schema.clone(),
        pool_size: 8,
        ..PostgresOptions::default()
    };
    let store = Arc::new(PostgresStore::connect_with(&url, opts.clone()).await?);
    let dep = DeploymentId::new("bench");
    let now = Timestamp(1);
    let lease = store
        .register_worker(&WorkerId::new("w"), &dep, Duration::from_secs(3600), now)
        .await?;
    for i in 0..=RUNS {
        store.create_run(new_run(i, &dep), now).await?;
    }
    let claimed = store.claim(&lease, RUNS + 1, now).await?;
    assert_eq!(claimed.len(), RUNS + 1);

    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..RUNS {
        let (store, lease) = (store.clone(), lease.clone());
        tasks.push(tokio::spawn(async move {
            let mut seq = 1u64;
            for _ in 0..BATCHES_PER_RUN {
                let r = store
                    .append(eve_core::Append {
                        run: RunId::new(format!("run-{i}")),
                        expected_seq: seq,
                        lease: lease.clone(),
                        append_id: AppendId::random(),
                        events: batch(seq),
                        now,
                    })
                    .await?;
                seq = r.next_seq;
            }
            Ok::<_, StoreError>(())
        }));
    }
    for t in tasks {
        t.await.expect("task")?;
    }
    let secs = start.elapsed().as_secs_f64();
    let events = RUNS * BATCH * BATCHES_PER_RUN;
    println!(
        "append: {RUNS} runs x {BATCHES_PER_RUN} batches of {BATCH}: {events} events in {secs:.3}s = {:.0} events/s ({:.0} appends/s)",
        events as f64 / secs,
        (RUNS * BATCHES_PER_RUN) as f64 / secs
    );

    // A 10,000-event journal on run RUNS, then a cold read through a fresh pool.
    let cold = RunId::new(format!("run-{RUNS}"));
    let mut seq = 1u64;
    while (seq as usize) < COLD_EVENTS {
        let n = BATCH.min(COLD_EVENTS - seq as usize);
        let mut ev = batch(seq);
        ev.truncate(n);
        seq = store
            .append(eve_core::Append {
                run: cold.clone(),
                expected_seq: seq,
                lease: lease.clone(),
                append_id: AppendId::random(),
                events: ev,
                now,
            })
            .await?
            .next_seq;
    }
    let fresh = PostgresStore::connect_with(&url, opts).await?;
    let start = Instant::now();
    let all = fresh.read_all(&cold, 0).await?;
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(all.len(), COLD_EVENTS);
    println!(
        "cold read: {} events in {:.4}s = {:.0} events/s (fresh pool, pages of 4096)",
        all.len(),
        secs,
        all.len() as f64 / secs
    );
    let start = Instant::now();
    let again = fresh.read_all(&cold, 0).await?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "warm read: {} events in {:.4}s = {:.0} events/s",
        again.len(),
        secs,
        again.len() as f64 / secs
    );

    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("cleanup");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA \"{schema}\" CASCADE"
    )))
    .execute(&mut conn)
    .await
    .expect("drop schema");
    Ok(())
}
