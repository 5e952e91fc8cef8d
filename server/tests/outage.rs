//! A store outage as a caller and an operator see it, on any store (a SQLite store behind
//! eve-core's fault injector): `/readyz` answers within its bound and says not ready while the
//! store hangs or fails; every 503 carries `Retry-After` and a message written for the caller
//! (the store's own wording stays in the log); one `warn` line marks the outage's start and one
//! `info` line its end with its length; a webhook whose delivery committed but whose configured
//! response cannot be read answers 503 (never the default 202), and the retry with the same
//! `Idempotency-Key` gets the configured response without a second payload.

mod common;

use common::*;
use eve_core::testing::{Fault, FaultyStore};
use eve_core::{Event, JournalStore};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt;

/// The log lines of the server (level and message), captured by a global subscriber.
fn logs() -> &'static Mutex<Vec<(tracing::Level, String)>> {
    static LOGS: OnceLock<Mutex<Vec<(tracing::Level, String)>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let subscriber = tracing_subscriber::registry().with(Capture);
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        Mutex::new(Vec::new())
    })
}

struct Capture;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut m = Message(String::new());
        event.record(&mut m);
        logs()
            .lock()
            .unwrap()
            .push((*event.metadata().level(), m.0));
    }
}

/// The tests that make outages run one at a time, so each sees its own outage's log lines.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How many lines were logged so far (the start of a test's own lines).
fn logged() -> usize {
    logs().lock().unwrap().len()
}

/// The lines of `level` starting with `start` logged since line `from`.
fn lines(from: usize, level: tracing::Level, start: &str) -> Vec<String> {
    logs()
        .lock()
        .unwrap()
        .iter()
        .skip(from)
        .filter(|(l, m)| *l == level && m.starts_with(start))
        .map(|(_, m)| m.clone())
        .collect()
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Checks a 503 `unavailable`: `Retry-After: 1`, a message for the caller (no injected
/// wording, no backend name).
async fn assert_unavailable(resp: reqwest::Response) -> Value {
    assert_eq!(resp.status(), 503);
    assert_eq!(
        resp.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1"),
        "a 503 says when to retry"
    );
    let body: Value = resp.json().await.expect("a JSON error");
    assert_eq!(body["code"], "unavailable", "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("retry"), "{message}");
    for internal in ["injected", "faulty", "sqlite", "no answer within"] {
        assert!(
            !message.contains(internal),
            "the store's own wording reaches the caller: {message}"
        );
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_visible_bounded_and_logged_once() {
    let _serial = SERIAL.lock().await;
    let from = logged();
    let (_dir, sqlite) = sqlite().await;
    let faulty = FaultyStore::new(sqlite.clone());
    let store: Arc<dyn JournalStore> = faulty.clone();
    let server = TestServer::start(store.clone(), |_| {}).await;
    let client = reqwest::Client::builder()
        // Far above /readyz's own bound of 1 s: a /readyz that waits for a hung store fails.
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let get = |path: &str| client.get(server.url(path)).send();

    assert_eq!(get("/readyz").await.unwrap().status(), 200);

    // A store that hangs (a partition): /readyz answers anyway, not ready.
    faulty.set_fault(Fault::Stall);
    let readyz = get("/readyz").await.expect("/readyz answers a hung store");
    assert_unavailable(readyz).await;

    // A store that fails: every route that needs it answers 503 with Retry-After.
    faulty.set_fault(Fault::CrashAfter(0));
    for path in [
        "/readyz",
        "/v1/runs",
        "/v1/requests",
        "/v1/sessions/s/tasks",
    ] {
        assert_unavailable(get(path).await.unwrap()).await;
    }
    let answer = client
        .post(server.url("/v1/requests/r-1/answer"))
        .json(&json!({ "text": "yes" }))
        .send()
        .await
        .unwrap();
    assert_unavailable(answer).await;
    let started = lines(from, tracing::Level::WARN, "store unreachable since ");
    assert_eq!(started.len(), 1, "one line marks the start: {started:?}");

    // The store comes back: one line marks the end, with the outage's length, and the server
    // serves again without a restart.
    faulty.heal();
    until("the end of the outage is logged", || {
        !lines(
            from,
            tracing::Level::INFO,
            "store reachable again; outage of ",
        )
        .is_empty()
    })
    .await;
    assert_eq!(get("/readyz").await.unwrap().status(), 200);
    assert_eq!(get("/v1/runs").await.unwrap().status(), 200);
    let ended = lines(
        from,
        tracing::Level::INFO,
        "store reachable again; outage of ",
    );
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(
        lines(from, tracing::Level::WARN, "store unreachable since ").len(),
        1,
        "one start line for the whole outage"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_webhook_never_gets_a_default_202_for_its_configured_response() {
    let _serial = SERIAL.lock().await;
    let from = logged();
    let (_dir, sqlite) = sqlite().await;
    let faulty = FaultyStore::new(sqlite.clone());
    let server = TestServer::start(faulty.clone(), |_| {}).await;
    // The worker works on the store itself: only the server's calls meet the fault.
    let worker = worker(sqlite.clone()).await;
    let announced = expect_url("outage");
    let respond_with =
        json!({ "status": 200, "headers": { "x-eve": "thanks" }, "body": { "got": true } });
    let run = start(
        &sqlite,
        "s-outage",
        "call-1",
        "collect",
        json!({ "key": "outage", "count": 1, "respond_with": respond_with }),
    )
    .await;
    let url = server.url(&announced.await.expect("webhook announced"));
    let client = reqwest::Client::new();
    let post = || {
        client
            .post(&url)
            .header("idempotency-key", "delivery-1")
            .json(&json!({ "status": "ok" }))
            .send()
    };

    // The delivery commits (the server's first store call), then the store goes away before
    // the webhook's response is read.
    faulty.set_fault(Fault::CrashAfter(1));
    let first = post().await.unwrap();
    assert_eq!(faulty.call_log().first(), Some(&"deliver_hook"));
    let body = assert_unavailable(first).await;
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("same Idempotency-Key"),
        "{body}"
    );

    // The retry, once the store answers, is a duplicate that gets the configured response.
    faulty.heal();
    until("the end of the outage is logged", || {
        !lines(
            from,
            tracing::Level::INFO,
            "store reachable again; outage of ",
        )
        .is_empty()
    })
    .await;
    let retry = post().await.unwrap();
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers()["x-eve"], "thanks");
    assert_eq!(retry.json::<Value>().await.unwrap(), json!({ "got": true }));
    assert_eq!(
        count(&journal(&sqlite, &run).await, |e| matches!(
            e,
            Event::HookReceived { .. }
        )),
        1,
        "one payload for one Idempotency-Key"
    );
    worker.shutdown().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_with_503_storage_full_while_reads_work() {
    logs();
    let dir = tempfile::tempdir().unwrap();
    let sqlite = eve_storage_sqlite::SqliteStore::open_with(
        dir.path().join("eve.db"),
        eve_storage_sqlite::SqliteOptions {
            max_size_bytes: Some(1024 * 1024),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let store: Arc<dyn JournalStore> = Arc::new(sqlite);
    // Fill the store with small runs until it is full.
    let mut n = 0;
    let full = loop {
        n += 1;
        let new = eve_core::NewRun {
            run_id: eve_core::RunId::new(format!("filler-{n}")),
            idempotency_key: None,
            workflow_id: eve_core::WorkflowId::new("filler"),
            deployment_id: eve_core::DeploymentId::new(DEPLOYMENT),
            tool: "filler".into(),
            input: eve_core::Payload::from_json(format!("{{\"n\": \"{n:0>200}\"}}")).unwrap(),
            session_id: eve_core::SessionId::new(format!("s-{n}")),
            call_id: eve_core::CallId::new("c"),
            execution: eve_core::Execution::Default,
            traceparent: None,
            reset_from: None,
        };
        match store.create_run(new, eve_core::Timestamp::now()).await {
            Ok(_) => assert!(n < 100_000, "1 MiB never filled"),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(full, eve_core::StoreError::StorageFull { .. }),
        "{full:?}"
    );
    let server =
        TestServer::start_with(store.clone(), |_| {}, |s| s.with_registry(registry())).await;
    let client = reqwest::Client::new();

    // A write (a new call, larger than the run that no longer fitted): 503 storage_full.
    let call = client
        .post(server.url("/v1/tools/deploy/calls"))
        .json(&json!({ "session": "s-full", "callId": "c-1", "input": { "service": "x".repeat(2000) } }))
        .send()
        .await
        .unwrap();
    assert_eq!(call.status(), 503);
    assert_eq!(call.headers()["retry-after"], "30");
    let body: Value = call.json().await.unwrap();
    assert_eq!(body["code"], "storage_full", "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("storage is full"), "{message}");
    assert!(
        !message.contains("eve.db"),
        "the file is the operator's: {message}"
    );
    assert!(
        logs()
            .lock()
            .unwrap()
            .iter()
            .any(|(l, m)| *l == tracing::Level::ERROR && m.contains("storage is full")),
        "the operator's log says it"
    );

    // Reads still work.
    for path in ["/readyz", "/v1/runs", "/v1/runs/filler-1", "/v1/requests"] {
        let resp = client.get(server.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
    }
    server.stop().await;
}
