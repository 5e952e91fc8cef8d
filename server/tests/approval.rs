//! The approval policy over HTTP: the gate is a pending request showing the tool and the
//! model's input; approving runs the body, denying settles the call `denied` with the body
//! never run; an option not offered is 422; a pending approval survives a server and worker
//! restart.

mod common;

use common::*;
use eve_core::engine::{
    define_workflow_tool, Registry, SystemClock, Worker, WorkerConfig, WorkerHandle, WorkflowCtx,
    WorkflowError,
};
use eve_core::{workflow, JournalStore};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Times the body ran, by the input's `id`.
static RAN: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);

fn ran(id: &str) -> usize {
    RAN.lock()
        .unwrap()
        .as_ref()
        .and_then(|m| m.get(id).copied())
        .unwrap_or(0)
}

/// A payment.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct Pay {
    /// Which call.
    pub id: String,
    /// Cents.
    pub cents: u64,
}

async fn pay(_ctx: WorkflowCtx, input: Pay) -> Result<Value, WorkflowError> {
    *RAN.lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .entry(input.id.clone())
        .or_default() += 1;
    Ok(json!({ "paid": input.cents }))
}

fn gated_registry() -> Registry {
    Registry::new(DEPLOYMENT)
        .with(define_workflow_tool("Pay after approval.", workflow!(pay)).needs_approval())
}

async fn gated_worker(store: Arc<dyn JournalStore>) -> WorkerHandle {
    let config = WorkerConfig {
        poll_interval: Duration::from_millis(20),
        ..WorkerConfig::default()
    };
    Worker::new(store, gated_registry(), Arc::new(SystemClock), config)
        .await
        .expect("register worker")
        .spawn()
}

async fn gated_server(
    store: Arc<dyn JournalStore>,
    addr: Option<std::net::SocketAddr>,
) -> TestServer {
    match addr {
        None => TestServer::start_with(store, |_| {}, |s| s.with_registry(gated_registry())).await,
        Some(addr) => {
            // A restart on the same address: the page and clients keep their URL.
            let server =
                TestServer::start_with_on(addr, store, |s| s.with_registry(gated_registry())).await;
            server
        }
    }
}

async fn send(method: reqwest::Method, url: String, body: Option<Value>) -> (u16, Value) {
    let mut req = reqwest::Client::new().request(method, url);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.expect("reaches the server");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Starts a call of `pay` and waits until its approval request is pending; its request id.
async fn call_and_wait_for_gate(server: &TestServer, session: &str, id: &str) -> String {
    let (status, started) = send(
        reqwest::Method::POST,
        server.url("/v1/tools/pay/calls"),
        Some(json!({ "session": session, "callId": id, "input": { "id": id, "cents": 250 } })),
    )
    .await;
    assert_eq!(status, 201, "{started}");
    let mut events =
        SseClient::connect(&server.url(&format!("/v1/sessions/{session}/events")), None).await;
    let asked = events.until("input.requested").await.pop().unwrap().json();
    let request = &asked["event"]["data"]["request"];
    assert_eq!(request["display"], "approval", "{asked}");
    assert_eq!(request["approval"]["tool"], "pay");
    assert_eq!(
        request["approval"]["input"],
        json!({ "id": id, "cents": 250 })
    );
    assert_eq!(request["options"][0]["id"], "approve");
    assert_eq!(request["options"][1]["id"], "deny");
    asked["event"]["data"]["requestId"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The call's settled result, waiting for it.
async fn settled(server: &TestServer, session: &str, id: &str) -> Value {
    let (status, again) = send(
        reqwest::Method::POST,
        server.url("/v1/tools/pay/calls?wait=30s"),
        Some(json!({ "session": session, "callId": id, "input": { "id": id, "cents": 250 } })),
    )
    .await;
    assert_eq!(status, 200, "{again}");
    again["settled"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_runs_the_body_deny_settles_denied() {
    let (_dir, store) = sqlite().await;
    let _worker = gated_worker(store.clone()).await;
    let server = gated_server(store.clone(), None).await;

    let (_, tools) = send(reqwest::Method::GET, server.url("/v1/tools"), None).await;
    assert_eq!(tools["tools"][0]["name"], "pay");
    assert_eq!(tools["tools"][0]["needsApproval"], true);

    // Approve: the body runs once.
    let request = call_and_wait_for_gate(&server, "s-approve", "approve-1").await;
    assert_eq!(ran("approve-1"), 0);
    // An option not offered: 422, nothing recorded.
    let (status, err) = send(
        reqwest::Method::POST,
        server.url(&format!("/v1/requests/{request}/answer")),
        Some(json!({ "optionId": "maybe" })),
    )
    .await;
    assert_eq!(
        (status, err["code"].as_str()),
        (422, Some("invalid_answer")),
        "{err}"
    );
    let (status, _) = send(
        reqwest::Method::POST,
        server.url(&format!("/v1/requests/{request}/answer")),
        Some(json!({ "optionId": "approve" })),
    )
    .await;
    assert_eq!(status, 200);
    let done = settled(&server, "s-approve", "approve-1").await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["output"]["paid"], 250);
    assert!(done.get("denied").is_none(), "{done}");
    assert_eq!(ran("approve-1"), 1);

    // Deny with a reason: the call settles denied and the body never ran.
    let request = call_and_wait_for_gate(&server, "s-deny", "deny-1").await;
    let (status, _) = send(
        reqwest::Method::POST,
        server.url(&format!("/v1/requests/{request}/answer")),
        Some(json!({ "optionId": "deny", "text": "over budget" })),
    )
    .await;
    assert_eq!(status, 200);
    let done = settled(&server, "s-deny", "deny-1").await;
    assert_eq!(done["denied"], true, "{done}");
    assert_eq!(done["status"], "failed");
    assert_eq!(done["error"], "over budget");
    assert_eq!(ran("deny-1"), 0, "the body never ran");
    // The channel says so.
    let mut events = SseClient::connect(&server.url("/v1/sessions/s-deny/events"), None).await;
    let settled_event = events.until("tool.settled").await.pop().unwrap().json();
    assert_eq!(settled_event["event"]["data"]["result"]["status"], "denied");
    assert_eq!(
        settled_event["event"]["data"]["result"]["data"]["reason"],
        "over budget"
    );
    // The runs API names the outcome.
    let (_, runs) = send(
        reqwest::Method::GET,
        server.url("/v1/runs?session=s-deny&limit=10"),
        None,
    )
    .await;
    assert_eq!(runs["runs"][0]["outcome"]["kind"], "denied", "{runs}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_approval_survives_a_restart() {
    let (_dir, store) = sqlite().await;
    let worker = gated_worker(store.clone()).await;
    let first = gated_server(store.clone(), None).await;
    let request = call_and_wait_for_gate(&first, "s-restart", "restart-1").await;
    let addr = first.addr;
    first.stop().await;
    worker.shutdown().await;

    // A new process: a new worker and server on the same store and address.
    let _worker = gated_worker(store.clone()).await;
    let second = gated_server(store.clone(), Some(addr)).await;
    let (status, pending) = send(
        reqwest::Method::GET,
        second.url("/v1/sessions/s-restart/requests"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert!(pending.to_string().contains(&request), "{pending}");
    let (status, _) = send(
        reqwest::Method::POST,
        second.url(&format!("/v1/requests/{request}/answer")),
        Some(json!({ "optionId": "approve" })),
    )
    .await;
    assert_eq!(status, 200);
    let done = settled(&second, "s-restart", "restart-1").await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(ran("restart-1"), 1);
    second.stop().await;
}
