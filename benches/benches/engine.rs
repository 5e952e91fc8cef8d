//! Engine throughput per backend: cold replay of a run with 10,000 completed steps (read +
//! decode + re-execute the body, events/s) and durable no-op steps per second (one run
//! sequential; 64 runs concurrent on one worker).
//!
//! `cargo bench -p eve-benches --bench engine`. Server backends join when
//! `EVE_TEST_POSTGRES_URL` / `EVE_TEST_DYNAMODB_ENDPOINT` are set.

#![allow(missing_docs)] // criterion_group! generates undocumented items.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use eve_core::engine::{start_tool_call, Registry, SystemClock, Worker, WorkerConfig};
use eve_core::testing::canned::{completed_steps_run, noop_steps_tool};
use eve_core::{CallId, JournalStore, RunStatus, SessionId, Timestamp};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn replay(c: &mut Criterion) {
    const STEPS: u32 = 10_000;
    let rt = rt();
    let backends = rt.block_on(eve_benches::backends());
    let reg = Registry::new("bench-replay").with(noop_steps_tool());
    let mut g = c.benchmark_group("replay_cold");
    g.sample_size(10).measurement_time(Duration::from_secs(4));
    // RunStarted + one StepCompleted per step.
    g.throughput(Throughput::Elements(u64::from(STEPS) + 1));
    for b in &backends {
        let store = b.store.clone();
        let run = rt
            .block_on(completed_steps_run(
                &*store,
                "bench-canned",
                STEPS,
                Timestamp::now(),
            ))
            .expect("canned run");
        g.bench_function(BenchmarkId::new(&b.name, STEPS), |bench| {
            bench.to_async(&rt).iter(|| {
                let (store, reg, run) = (store.clone(), reg.clone(), run.clone());
                async move {
                    let report = Worker::replay_cold(&store, &reg, &run)
                        .await
                        .expect("replay");
                    assert_eq!(report.events, u64::from(STEPS) + 1);
                    report
                }
            })
        });
    }
    g.finish();
}

/// Starts `runs` runs of `per_run` no-op steps and measures one worker draining them.
async fn drain(store: Arc<dyn JournalStore>, runs: u32, per_run: u32) -> Duration {
    let reg =
        Registry::new(format!("bench-steps-{}", Timestamp::now().millis())).with(noop_steps_tool());
    let session = SessionId::new(format!("bench-{}", Timestamp::now().millis()));
    let mut ids = Vec::new();
    for i in 0..runs {
        let created = start_tool_call(
            &*store,
            &reg,
            &session,
            &CallId::new(format!("call-{i}")),
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
    let worker = Worker::new(store.clone(), reg, Arc::new(SystemClock), config)
        .await
        .expect("worker");
    let t = Instant::now();
    worker.drain().await.expect("drain");
    let took = t.elapsed();
    for id in &ids {
        assert_eq!(
            store.get_run(id).await.expect("run").status,
            RunStatus::Completed
        );
    }
    took
}

fn steps(c: &mut Criterion) {
    let rt = rt();
    let backends = rt.block_on(eve_benches::backends());
    let mut g = c.benchmark_group("steps");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    for b in &backends {
        for (runs, per_run) in [(1u32, 200u32), (64, 20)] {
            g.throughput(Throughput::Elements(u64::from(runs * per_run)));
            g.bench_function(BenchmarkId::new(&b.name, format!("{runs}runs")), |bench| {
                let store = b.store.clone();
                bench.to_async(&rt).iter_custom(|iters| {
                    let store = store.clone();
                    async move {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            total += drain(store.clone(), runs, per_run).await;
                        }
                        total
                    }
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, replay, steps);
criterion_main!(benches);
