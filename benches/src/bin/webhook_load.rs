//! Webhook POST → body resumed, under load: `RUNS` runs park on a webhook each, then a load
//! generator on loopback POSTs to their URLs at `RATE` requests per second through eve-server,
//! and a worker in the same process resumes them. The latency of one delivery is from just
//! before its POST is sent to the moment the resumed body's next step starts. Prints p50, p99
//! and max per backend (SQLite FULL and NORMAL always, Postgres when `EVE_TEST_POSTGRES_URL`
//! is set), and the errors (a non-202 answer, a run that never resumed).
//!
//! ```sh
//! cargo run --release -p eve-benches --bin webhook_load            # 1,000 runs at 200 req/s
//! RUNS=200 RATE=100 cargo run --release -p eve-benches --bin webhook_load
//! ```

use eve_core::engine::{
    define_workflow_tool, start_tool_call, Registry, SystemClock, Worker, WorkerConfig,
    WorkflowCtx, WorkflowError, WorkflowTool,
};
use eve_core::{
    workflow, CallId, Event, JournalStore, JournalStoreExt, RunId, SessionId, Timestamp,
    WebhookRequest,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Where resumed bodies report `(delivery id, when)`.
type Resumed = Mutex<Option<mpsc::UnboundedSender<(u64, Instant)>>>;

/// Resumed bodies report `(delivery id, when)` here.
fn resumed() -> &'static Resumed {
    static TX: OnceLock<Resumed> = OnceLock::new();
    TX.get_or_init(Default::default)
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Empty {}

async fn execute(ctx: WorkflowCtx, _: Empty) -> Result<(), WorkflowError> {
    let hook = ctx.create_webhook::<WebhookRequest>();
    let request = hook.next().await?;
    let id = request.body["id"].as_u64().unwrap_or(u64::MAX);
    ctx.step("resumed", move |_| async move {
        if let Some(tx) = resumed().lock().expect("resumed lock").as_ref() {
            let _ = tx.send((id, Instant::now()));
        }
        Ok(())
    })
    .await?;
    Ok(())
}

fn tool() -> WorkflowTool {
    define_workflow_tool("Waits for one webhook delivery.", workflow!(execute))
        .named("webhook_wait")
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Report {
    backend: String,
    p50: Duration,
    p99: Duration,
    max: Duration,
    errors: usize,
    rate: f64,
}

async fn webhook_token(store: &dyn JournalStore, run: &RunId) -> Option<String> {
    store
        .read_all(run, 0)
        .await
        .ok()?
        .into_iter()
        .find_map(|e| match e.event {
            Event::HookCreated {
                token,
                webhook: true,
                ..
            } => Some(token),
            _ => None,
        })
}

async fn measure(backend: &str, store: Arc<dyn JournalStore>, runs: usize, rate: usize) -> Report {
    let (tx, mut rx) = mpsc::unbounded_channel();
    *resumed().lock().expect("resumed lock") = Some(tx);
    let reg = Registry::new("bench").with(tool());
    let worker = Worker::new(
        store.clone(),
        reg.clone(),
        Arc::new(SystemClock),
        WorkerConfig {
            max_active_runs: 256,
            ..WorkerConfig::default()
        },
    )
    .await
    .expect("worker")
    .spawn();
    let session = SessionId::new(format!("load-{}", RunId::random()));
    let mut ids = Vec::with_capacity(runs);
    for i in 0..runs {
        let created = start_tool_call(
            &*store,
            &reg,
            &session,
            &CallId::new(format!("call-{i}")),
            "webhook_wait",
            serde_json::json!({}),
            Timestamp::now(),
        )
        .await
        .expect("start run");
        ids.push(created.run.run_id);
    }
    // Wait until every run is parked on its webhook.
    let mut tokens = Vec::with_capacity(runs);
    for run in &ids {
        let token = loop {
            if let Some(t) = webhook_token(&*store, run).await {
                break t;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        tokens.push(token);
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let state = eve_server::AppState::new(store.clone(), Arc::new(SystemClock));
    let server = tokio::spawn(eve_server::serve(listener, state));
    let client = reqwest::Client::new();
    let sent: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let errors = Arc::new(Mutex::new(0usize));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    let started = Instant::now();
    let mut posts = Vec::with_capacity(runs);
    for (i, token) in tokens.iter().enumerate() {
        tick.tick().await;
        let url = format!("http://{addr}/.well-known/workflow/v1/webhook/{token}");
        let (client, sent, errors) = (client.clone(), sent.clone(), errors.clone());
        posts.push(tokio::spawn(async move {
            sent.lock()
                .expect("sent lock")
                .insert(i as u64, Instant::now());
            let ok = client
                .post(url)
                .header("idempotency-key", format!("delivery-{i}"))
                .json(&serde_json::json!({"id": i}))
                .send()
                .await
                .map(|r| r.status().as_u16() == 202)
                .unwrap_or(false);
            if !ok {
                *errors.lock().expect("errors lock") += 1;
            }
        }));
    }
    for p in posts {
        let _ = p.await;
    }
    let offered = runs as f64 / started.elapsed().as_secs_f64();
    let mut latencies = Vec::with_capacity(runs);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while latencies.len() < runs {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some((id, at))) => {
                if let Some(t0) = sent.lock().expect("sent lock").get(&id) {
                    latencies.push(at.duration_since(*t0));
                }
            }
            _ => break,
        }
    }
    let never = runs - latencies.len();
    latencies.sort();
    let pick = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or_default()
    };
    let report = Report {
        backend: backend.to_owned(),
        p50: pick(0.50),
        p99: pick(0.99),
        max: latencies.last().copied().unwrap_or_default(),
        errors: *errors.lock().expect("errors lock") + never,
        rate: offered,
    };
    server.abort();
    worker.shutdown().await;
    report
}

#[tokio::main]
async fn main() {
    let runs = env_or("RUNS", 1000);
    let rate = env_or("RATE", 200).max(1);
    let mut reports = Vec::new();
    for b in eve_benches::backends().await {
        if b.name == "memory" || b.name == "dynamodb" {
            continue;
        }
        eprintln!(
            "{}: parking {runs} runs, then {rate} webhook POSTs/s",
            b.name
        );
        reports.push(measure(&b.name, b.store, runs, rate).await);
    }
    println!("webhook POST -> body resumed, {runs} runs, {rate} req/s offered, loopback, one process (server + worker)");
    println!(
        "{:<14} {:>10} {:>10} {:>10} {:>8} {:>10}",
        "backend", "p50 ms", "p99 ms", "max ms", "errors", "req/s"
    );
    for r in reports {
        println!(
            "{:<14} {:>10.1} {:>10.1} {:>10.1} {:>8} {:>10.0}",
            r.backend,
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3,
            r.max.as_secs_f64() * 1e3,
            r.errors,
            r.rate
        );
    }
    eve_benches::drop_created().await;
}
