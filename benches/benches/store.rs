//! Store-level throughput: appended events/s (one run, batches of 1 and 16; 16 runs appending
//! batches of 16 concurrently) and cold read throughput (events/s read and decoded from a
//! 10,000-event journal), per backend.
//!
//! `cargo bench -p eve-benches --bench store`. Server backends join when
//! `EVE_TEST_POSTGRES_URL` / `EVE_TEST_DYNAMODB_ENDPOINT` are set.

#![allow(missing_docs)] // criterion_group! generates undocumented items.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use eve_benches::{append_batches, claimed_runs, lease};
use eve_core::{JournalStoreExt, Timestamp};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn append(c: &mut Criterion) {
    let rt = rt();
    let backends = rt.block_on(eve_benches::backends());
    let mut g = c.benchmark_group("append");
    g.sample_size(10).measurement_time(Duration::from_secs(4));
    for b in &backends {
        for batch in [1usize, 16] {
            g.throughput(Throughput::Elements(batch as u64));
            g.bench_with_input(
                BenchmarkId::new(format!("{}/1run", b.name), batch),
                &batch,
                |bench, &batch| {
                    let store = b.store.clone();
                    bench.to_async(&rt).iter_custom(|iters| {
                        let store = store.clone();
                        async move {
                            let now = Timestamp::now();
                            let l = lease(&*store, now).await.expect("lease");
                            let run = claimed_runs(&*store, &l, 1, now).await.expect("run");
                            let t = Instant::now();
                            append_batches(&*store, &l, &run[0], 1, iters as usize, batch, now)
                                .await
                                .expect("append");
                            t.elapsed()
                        }
                    })
                },
            );
        }
        let runs = 16usize;
        let batch = 16usize;
        g.throughput(Throughput::Elements((runs * batch) as u64));
        g.bench_function(
            BenchmarkId::new(format!("{}/16runs", b.name), batch),
            |bench| {
                let store = b.store.clone();
                bench.to_async(&rt).iter_custom(|iters| {
                    let store = store.clone();
                    async move {
                        let now = Timestamp::now();
                        let l = lease(&*store, now).await.expect("lease");
                        let ids = claimed_runs(&*store, &l, runs, now).await.expect("runs");
                        let t = Instant::now();
                        let tasks: Vec<_> = ids
                            .into_iter()
                            .map(|run| {
                                let (store, l) = (store.clone(), l.clone());
                                tokio::spawn(async move {
                                    append_batches(&*store, &l, &run, 1, iters as usize, batch, now)
                                        .await
                                        .expect("append")
                                })
                            })
                            .collect();
                        for t in tasks {
                            t.await.expect("task");
                        }
                        t.elapsed()
                    }
                })
            },
        );
    }
    g.finish();
}

fn cold_read(c: &mut Criterion) {
    const EVENTS: usize = 10_000;
    let rt = rt();
    let backends = rt.block_on(eve_benches::backends());
    let mut g = c.benchmark_group("cold_read");
    g.sample_size(10).measurement_time(Duration::from_secs(4));
    g.throughput(Throughput::Elements(EVENTS as u64));
    for b in &backends {
        let store = b.store.clone();
        let run = rt.block_on(async {
            let now = Timestamp::now();
            let l = lease(&*store, now).await.expect("lease");
            let ids = claimed_runs(&*store, &l, 1, now).await.expect("run");
            // 1 RunStarted + 9,999 step events in appends of 100 (the per-append limit).
            let mut seq = 1;
            while (seq as usize) < EVENTS {
                let n = (EVENTS - seq as usize).min(100);
                seq = append_batches(&*store, &l, &ids[0], seq, 1, n, now)
                    .await
                    .expect("append");
            }
            ids[0].clone()
        });
        g.bench_function(BenchmarkId::new(&b.name, EVENTS), |bench| {
            let store: Arc<_> = store.clone();
            let run = run.clone();
            bench.to_async(&rt).iter(|| {
                let (store, run) = (store.clone(), run.clone());
                async move {
                    let events = store.read_all(&run, 0).await.expect("read");
                    assert_eq!(events.len(), EVENTS);
                    events
                }
            })
        });
    }
    g.finish();
}

criterion_group!(benches, append, cold_read);
criterion_main!(benches);
