//! Latency of eve-mcp, through rmcp's client over an in-memory duplex (the whole JSON-RPC path
//! minus a socket), on a SQLite file:
//!
//! - `tasks/get` of a parked task (waiting in `ctx.ask`) with 1,000 parked tasks in the store:
//!   p50 / p99 / max over 2,000 gets of random tasks;
//! - a blocking `tools/call` of a 10-step tool (no waits), against the same call made
//!   in-process (`Session::call_tool` + `wait_settled`): median of 200 each.
//!
//! `cargo bench -p eve-mcp --bench tasks_get`. Prints the figures; asserts nothing.

use eve_core::engine::{
    define_workflow_tool, start_tool_call, Session, SystemClock, Worker, WorkerConfig, WorkflowCtx,
    WorkflowError,
};
use eve_core::{workflow, CallId, JournalStore, RunId, RunQuery, SessionId, Timestamp};
use eve_mcp::McpServer;
use eve_storage_sqlite::SqliteStore;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, GetTaskParams, Implementation,
    TaskStatus,
};
use rmcp::ServiceExt;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

const PARKED: usize = 1_000;
const GETS: usize = 2_000;
const CALLS: usize = 200;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Steps {
    steps: u32,
}

mod ten {
    use super::*;
    pub(crate) async fn execute(ctx: WorkflowCtx, input: Steps) -> Result<u32, WorkflowError> {
        let mut sum = 0;
        for i in 0..input.steps {
            sum += ctx
                .step(format!("s{i}"), move |_| async move { Ok(i) })
                .await?;
        }
        Ok(sum)
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn JournalStore> =
        Arc::new(SqliteStore::open(dir.path().join("eve.db")).await.unwrap());
    let registry = eve_examples::registry()
        .with(define_workflow_tool("Ten steps.", workflow!(execute_ten)).named("ten"));
    let worker = Worker::new(
        store.clone(),
        registry.clone(),
        Arc::new(SystemClock),
        WorkerConfig {
            max_active_runs: 2_000,
            ..WorkerConfig::default()
        },
    )
    .await
    .unwrap();
    let registry = Arc::new(registry);
    let mcp = McpServer::new(store.clone(), registry.clone()).with_worker(worker.clone());
    let handle = worker.clone().spawn();

    // 1,000 deploy approvals, each parked in ctx.ask.
    let t = Instant::now();
    let mut ids = Vec::new();
    for i in 0..PARKED {
        let created = start_tool_call(
            &*store,
            &registry,
            &SessionId::new(format!("bench-{}", i % 50)),
            &CallId::new(format!("c{i}")),
            "deploy_approval",
            json!({"service": format!("svc{i}")}),
            Timestamp::now(),
        )
        .await
        .unwrap();
        ids.push(created.run.run_id);
    }
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(eve_mcp::serve_transport(mcp.clone(), server_io));
    let client = ClientConfig::new(
        ClientCapabilities::builder().enable_tasks().build(),
        Implementation::new("bench", "0"),
    )
    .serve(client_io)
    .await
    .unwrap();
    for id in &ids {
        loop {
            let got = client
                .get_task(GetTaskParams::new(id.as_str()))
                .await
                .unwrap();
            if got.task.status() == TaskStatus::InputRequired {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    println!(
        "{PARKED} deploy_approval tasks parked in ctx.ask in {:.1?}",
        t.elapsed()
    );

    // tasks/get of random parked tasks.
    let mut lat = Vec::with_capacity(GETS);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..GETS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let id: &RunId = &ids[(x % PARKED as u64) as usize];
        let t = Instant::now();
        let got = client
            .get_task(GetTaskParams::new(id.as_str()))
            .await
            .unwrap();
        lat.push(t.elapsed());
        assert_eq!(got.task.status(), TaskStatus::InputRequired);
    }
    lat.sort();
    println!(
        "tasks/get of a parked task, {PARKED} parked, SQLite: p50 {:.2?}  p99 {:.2?}  max {:.2?}  ({GETS} gets)",
        percentile(&lat, 0.50),
        percentile(&lat, 0.99),
        lat[lat.len() - 1]
    );

    // A 10-step tool: blocking MCP call vs the same call in-process.
    let plain = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("bench", "0"),
    );
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(eve_mcp::serve_transport(mcp, server_io));
    let blocking = plain.serve(client_io).await.unwrap();
    let args = json!({"steps": 10}).as_object().unwrap().clone();
    let mut over_mcp = Vec::new();
    for _ in 0..CALLS {
        let t = Instant::now();
        let r = blocking
            .call_tool(CallToolRequestParams::new("ten").with_arguments(args.clone()))
            .await
            .unwrap();
        over_mcp.push(t.elapsed());
        // A non-object output is text only for pre-2026 clients (rmcp strips it from
        // structuredContent).
        assert_eq!(r.content[0].as_text().map(|t| t.text.as_str()), Some("45"));
    }
    let session = Session::new(
        store.clone(),
        registry.clone(),
        Arc::new(SystemClock),
        SessionId::new("bench-inproc"),
    )
    .with_worker(worker);
    let mut in_process = Vec::new();
    for i in 0..CALLS {
        let t = Instant::now();
        let call = CallId::new(format!("ten{i}"));
        session
            .call_tool(call.clone(), "ten", json!({"steps": 10}))
            .await
            .unwrap();
        session.wait_settled(&call).await.unwrap();
        in_process.push(t.elapsed());
    }
    over_mcp.sort();
    in_process.sort();
    println!(
        "10-step tool, blocking call: over MCP median {:.2?} p99 {:.2?}; in-process median {:.2?} p99 {:.2?} ({CALLS} calls each)",
        percentile(&over_mcp, 0.5),
        percentile(&over_mcp, 0.99),
        percentile(&in_process, 0.5),
        percentile(&in_process, 0.99),
    );
    let left = store.list_runs(&RunQuery::default()).await.unwrap().len();
    println!("({left} runs in the store)");
    handle.shutdown().await;
}

use ten::execute as execute_ten;
