//! What one `ctx.agent` round trip through MCP sampling adds, through rmcp's client over an
//! in-memory duplex (the whole JSON-RPC path minus a socket), on a SQLite file.
//!
//! Two blocking `tools/call`s, interleaved, 200 of each: `plain` (a body that returns at once)
//! and `delegate` (a body whose one `ctx.agent` call, with an output schema, is served by the
//! client's `sampling/createMessage` handler, which answers at once and times itself). The
//! sampling round trip's added latency is `delegate − plain − the client's own time`: the
//! request journaled, sent, the result parsed, checked against the schema, recorded, and the
//! run resumed to its end.
//!
//! Then the same `delegate` call made in-process (`Session::call_tool`), its subagent served by
//! a host task that watches the session and answers with `complete_agent` as soon as the request
//! is journaled: the difference is what MCP (the request over JSON-RPC, the result's parsing)
//! adds over eve's own cost of an agent call (journal the request, record the reply, resume).
//!
//! `cargo bench -p eve-mcp --bench sampling`. Prints the figures; asserts nothing but results.

#![allow(deprecated)] // sampling: SEP-2577 deprecates it; eve maps `ctx.agent` onto it.

use eve_core::engine::{
    agent_request_id, complete_agent, define_workflow_tool, AgentCall, Session, SystemClock,
    ToolCallStart, Worker, WorkerConfig, WorkflowCtx, WorkflowError,
};
use eve_core::wake::{Waiter, WatchKey};
use eve_core::{workflow, CallId, JournalStore, SessionId, Timestamp};
use eve_mcp::McpServer;
use eve_storage_sqlite::SqliteStore;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, CreateMessageRequestParams,
    CreateMessageResult, Implementation, SamplingMessage,
};
use rmcp::service::{RequestContext, RoleClient};
use rmcp::{ClientHandler, ErrorData, ServiceExt};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CALLS: usize = 200;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Topic {
    topic: String,
}

async fn plain(_ctx: WorkflowCtx, input: Topic) -> Result<Value, WorkflowError> {
    Ok(json!({ "review": { "verdict": "pass" }, "topic": input.topic }))
}

async fn delegate(ctx: WorkflowCtx, input: Topic) -> Result<Value, WorkflowError> {
    let call = AgentCall::new(
        "review",
        "security-reviewer",
        json!({ "topic": input.topic }),
    )
    .schema(json!({
        "type": "object",
        "properties": { "verdict": { "type": "string", "enum": ["pass", "fail"] } },
        "required": ["verdict"],
    }));
    let review = ctx.agent(call)?.await?;
    Ok(json!({ "review": review, "topic": input.topic }))
}

/// Answers every sampling request at once with a verdict, timing its own handling.
#[derive(Clone, Debug, Default)]
struct Sampler {
    own: Arc<Mutex<Vec<Duration>>>,
    /// When each request arrived.
    arrived: Arc<Mutex<Vec<Instant>>>,
}

impl ClientHandler for Sampler {
    fn get_info(&self) -> ClientConfig {
        let mut caps = ClientCapabilities::default();
        caps.sampling = Some(Default::default());
        ClientConfig::new(caps, Implementation::new("bench", "0"))
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let t = Instant::now();
        self.arrived.lock().unwrap().push(t);
        assert!(params.system_prompt.is_some());
        let result = CreateMessageResult::new(
            SamplingMessage::assistant_text(r#"{"verdict": "pass"}"#),
            "bench".into(),
        );
        self.own.lock().unwrap().push(t.elapsed());
        Ok(result)
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
    let registry = eve_core::engine::Registry::new("bench")
        .with(define_workflow_tool("Returns at once.", workflow!(plain)).named("plain"))
        .with(
            define_workflow_tool("One subagent call.", workflow!(delegate))
                .named("delegate")
                .waits_for_input(),
        );
    let worker = Worker::new(
        store.clone(),
        registry.clone(),
        Arc::new(SystemClock),
        WorkerConfig::default(),
    )
    .await
    .unwrap();
    let registry = Arc::new(registry);
    let mcp = McpServer::new(store.clone(), registry.clone()).with_worker(worker.clone());
    let handle = worker.clone().spawn();
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(eve_mcp::serve_transport(mcp, server_io));
    let sampler = Sampler::default();
    let client = sampler.clone().serve(client_io).await.unwrap();

    let call = |tool: &str, i: usize| {
        CallToolRequestParams::new(tool.to_owned()).with_arguments(
            json!({ "topic": format!("t{i}") })
                .as_object()
                .unwrap()
                .clone(),
        )
    };
    let (mut base, mut sampled) = (Vec::new(), Vec::new());
    // From the call to the request's arrival at the client; from there to the call's result.
    let (mut to_request, mut from_answer) = (Vec::new(), Vec::new());
    for i in 0..CALLS {
        let t = Instant::now();
        let r = client.call_tool(call("plain", i)).await.unwrap();
        base.push(t.elapsed());
        assert_eq!(r.structured_content.unwrap()["review"]["verdict"], "pass");
        let t = Instant::now();
        let r = client.call_tool(call("delegate", i)).await.unwrap();
        sampled.push(t.elapsed());
        let arrived = *sampler.arrived.lock().unwrap().last().unwrap();
        to_request.push(arrived - t);
        from_answer.push(arrived.elapsed() - (t.elapsed() - sampled[i]));
        assert_eq!(
            r.structured_content
                .as_ref()
                .map(|v| &v["review"]["verdict"]),
            Some(&json!("pass")),
            "{r:?}"
        );
    }
    let mut own = sampler.own.lock().unwrap().clone();
    assert_eq!(own.len(), CALLS);
    base.sort();
    sampled.sort();
    own.sort();
    let (b, s, o) = (
        percentile(&base, 0.5),
        percentile(&sampled, 0.5),
        percentile(&own, 0.5),
    );
    println!(
        "blocking tools/call, SQLite, {CALLS} each: plain median {b:.2?} p99 {:.2?}; with one ctx.agent served by sampling median {s:.2?} p99 {:.2?}; the client's own time median {o:.2?}",
        percentile(&base, 0.99),
        percentile(&sampled, 0.99),
    );
    to_request.sort();
    from_answer.sort();
    println!(
        "of which: call → sampling request at the client median {:.2?}; request at the client → the call's result median {:.2?}",
        percentile(&to_request, 0.5),
        percentile(&from_answer, 0.5),
    );
    println!(
        "a sampling round trip adds {:.2?} (median delegate − median plain − median client time)",
        s.saturating_sub(b).saturating_sub(o)
    );

    // The same subagent call served in-process: a host task that watches the session, finds
    // the request and records the reply with complete_agent (no MCP between).
    let session_id = SessionId::new("bench-inproc");
    let session = Session::new(
        store.clone(),
        registry.clone(),
        Arc::new(SystemClock),
        session_id.clone(),
    )
    .with_worker(worker);
    let mut in_process = Vec::new();
    for i in 0..CALLS {
        let mut waiter = Waiter::new(
            &*store,
            &WatchKey::Session(session_id.clone()),
            Duration::from_secs(2),
            Duration::from_millis(100),
        )
        .await;
        let t = Instant::now();
        let call_id = CallId::new(format!("inproc{i}"));
        let started = session
            .call_tool(
                call_id.clone(),
                "delegate",
                json!({ "topic": format!("t{i}") }),
            )
            .await
            .unwrap();
        let ToolCallStart::Parked { run_id } = started else {
            panic!("a default-mode call parks")
        };
        while agent_request_id(&*store, &run_id, "review")
            .await
            .unwrap()
            .is_none()
        {
            waiter.wait().await;
        }
        complete_agent(
            &*store,
            &run_id,
            "review",
            Ok(json!({ "verdict": "pass" })),
            Timestamp::now(),
        )
        .await
        .unwrap();
        session.wait_settled(&call_id).await.unwrap();
        in_process.push(t.elapsed());
    }
    in_process.sort();
    let inp = percentile(&in_process, 0.5);
    println!(
        "the same call with its subagent served in-process (complete_agent): median {inp:.2?} p99 {:.2?}; over MCP sampling it takes {:.2?} more (median against median)",
        percentile(&in_process, 0.99),
        s.saturating_sub(inp),
    );
    handle.shutdown().await;
}
