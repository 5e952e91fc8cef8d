//! What exporting traces costs a call: a 10-step call over HTTP (`POST /v1/tools/canned/calls
//! ?wait=30s`, the start route awaited until the run settles) against a server and a worker on
//! one SQLite file, with OTLP export off and on (`eve_cli::otlp::OtlpSink`, the batch
//! processor exporting over HTTP to a receiver in this process). The target: the p50 (median)
//! with export on within 10% of export off.
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
                async move {
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

criterion_group!(benches, call_10_steps);
criterion_main!(benches);
