//! What exporting traces costs a call: a 10-step call over HTTP (`POST /v1/tools/canned/calls
//! ?wait=30s`, the start route awaited until the run settles) against a server and a worker on
//! one SQLite file, with OTLP export off and on (`eve_cli::otlp::OtlpSink`, the batch
//! processor exporting over HTTP to a receiver in this process). The target: the p50 (median)
//! with export on within 10% of export off.
//!
//! Criterion measures export off, then export on. Because a busy machine can change between the
//! two, `interleaved` then runs both servers side by side and alternates calls between them
//! (`EVE_TRACES_ROUNDS` pairs, 1,000 by default), printing one JSON line with each side's p50
//! and p90 and the ratio of the p50s: the figure the target is judged by.
//!
//! `cargo bench -p eve-benches --bench traces`.

#![allow(missing_docs)] // criterion_group! generates undocumented items.

use criterion::{criterion_group, criterion_main, Criterion};
use eve_core::engine::{Registry, SystemClock, Worker, WorkerConfig, WorkerHandle};
use eve_core::testing::canned::noop_steps_tool;
use eve_core::JournalStore;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A receiver that accepts every OTLP export and counts the bytes.
async fn receiver(bytes: Arc<AtomicU64>) -> String {
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let bytes = bytes.clone();
            async move {
                bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// A server and a spawned worker on a fresh SQLite file; `otlp` exports their spans.
async fn serve(
    dir: &tempfile::TempDir,
    otlp: Option<&str>,
) -> (String, WorkerHandle, Option<Arc<eve_cli::otlp::OtlpSink>>) {
    let store: Arc<dyn JournalStore> = Arc::new(
        eve_storage_sqlite::SqliteStore::open(dir.path().join("eve.db"))
            .await
            .expect("sqlite"),
    );
    let reg = Registry::new("bench-traces").with(noop_steps_tool());
    let worker = Worker::new(
        store.clone(),
        reg.clone(),
        Arc::new(SystemClock),
        WorkerConfig::default(),
    )
    .await
    .expect("worker");
    let sink = otlp.map(|url| Arc::new(eve_cli::otlp::OtlpSink::new(Some(url)).expect("otlp")));
    if let Some(s) = &sink {
        worker.trace_to(s.clone());
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let state = eve_server::AppState::new(store, Arc::new(SystemClock))
        .with_config(eve_server::ServerConfig {
            base_url: base.clone(),
            insecure_no_auth: true,
            ..eve_server::ServerConfig::default()
        })
        .with_registry(reg);
    tokio::spawn(eve_server::serve(listener, state));
    (base, worker.spawn(), sink)
}

fn call_10_steps(c: &mut Criterion) {
    let rt = rt();
    let exported = Arc::new(AtomicU64::new(0));
    let otlp = rt.block_on(receiver(exported.clone()));
    let client = reqwest::Client::new();
    let mut g = c.benchmark_group("call_10_steps");
    g.sample_size(200).measurement_time(Duration::from_secs(10));
    for (name, export) in [("export_off", None), ("export_on", Some(otlp.as_str()))] {
        let dir = tempfile::tempdir().unwrap();
        let (base, worker, sink) = rt.block_on(serve(&dir, export));
        let n = AtomicU64::new(0);
        g.bench_function(name, |b| {
            b.to_async(&rt).iter(|| {
                let i = n.fetch_add(1, Ordering::Relaxed);
                let (client, base) = (client.clone(), base.clone());
                async move { call(&client, &base, i).await }
            })
        });
        rt.block_on(worker.shutdown());
        if let Some(s) = sink {
            s.shutdown(Duration::from_secs(5));
            assert!(exported.load(Ordering::Relaxed) > 0, "spans were exported");
        }
    }
    g.finish();
}

/// One 10-step call through `base`, awaited until it settles.
async fn call(client: &reqwest::Client, base: &str, i: u64) {
    let resp: serde_json::Value = client
        .post(format!("{base}/v1/tools/canned/calls?wait=30s"))
        .json(&serde_json::json!({
            "session": "bench",
            "callId": format!("call-{i}"),
            "input": {"steps": 10}
        }))
        .send()
        .await
        .expect("call")
        .json()
        .await
        .expect("body");
    assert_eq!(resp["settled"]["status"], "completed", "{resp}");
}

/// Export off and on side by side, calls alternating between them (which goes first alternates
/// too), so both face the same load; prints the p50s and their ratio.
fn interleaved(_: &mut Criterion) {
    let rounds: u64 = std::env::var("EVE_TRACES_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    let rt = rt();
    let exported = Arc::new(AtomicU64::new(0));
    let otlp = rt.block_on(receiver(exported.clone()));
    let client = reqwest::Client::new();
    let (off_dir, on_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (off, off_worker, _) = rt.block_on(serve(&off_dir, None));
    let (on, on_worker, sink) = rt.block_on(serve(&on_dir, Some(otlp.as_str())));
    let (mut t_off, mut t_on) = (Vec::new(), Vec::new());
    rt.block_on(async {
        // Warm both (connections, SQLite pages, the exporter's first batch).
        for i in 0..50 {
            call(&client, &off, 1_000_000 + i).await;
            call(&client, &on, 1_000_000 + i).await;
        }
        for i in 0..rounds {
            let order = if i % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for export in order {
                let (base, times) = if export {
                    (&on, &mut t_on)
                } else {
                    (&off, &mut t_off)
                };
                let t = std::time::Instant::now();
                call(&client, base, i).await;
                times.push(t.elapsed());
            }
        }
    });
    rt.block_on(off_worker.shutdown());
    rt.block_on(on_worker.shutdown());
    if let Some(s) = sink {
        s.shutdown(Duration::from_secs(5));
    }
    assert!(exported.load(Ordering::Relaxed) > 0, "spans were exported");
    let q = |t: &mut Vec<Duration>, p: f64| {
        t.sort();
        t[((t.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e3
    };
    let (off50, on50) = (q(&mut t_off, 0.5), q(&mut t_on, 0.5));
    println!(
        "{}",
        serde_json::json!({
            "bench": "traces/interleaved",
            "rounds": rounds,
            "export_off_ms": {"p50": off50, "p90": q(&mut t_off, 0.9)},
            "export_on_ms": {"p50": on50, "p90": q(&mut t_on, 0.9)},
            "p50_on_over_off": on50 / off50,
            "exported_bytes": exported.load(Ordering::Relaxed),
        })
    );
}

criterion_group!(benches, call_10_steps, interleaved);
criterion_main!(benches);
