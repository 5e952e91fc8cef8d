//! Turns and the task index over HTTP: `POST /v1/sessions/{id}/messages` (delivered when
//! idle, queued while a call is parked, steered: the call cancelled and its request
//! withdrawn), `GET /v1/sessions/{id}/turn` (woken by the session's notification, not by a
//! poll), the task index, `task_cancel` (a default-execution call is 409 `not_a_task`, a task
//! is cancelled once), background notices on the events route and in the turn, a message to
//! an ended session (409) and bad bodies (400 naming the field).

mod common;

use common::*;
use eve_core::engine::{
    define_workflow_tool, Registry, SystemClock, TaskHandle, Worker, WorkerConfig, WorkerHandle,
    WorkflowCtx, WorkflowError, WorkflowTool,
};
use eve_core::{background_workflow, workflow, InputRequest, JournalStore};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TURN_DEPLOYMENT: &str = "turn-tests";

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct Topic {
    topic: String,
}

fn question(topic: &str) -> InputRequest {
    InputRequest {
        prompt: format!("Anything about {topic}?"),
        display: eve_core::Display::Text,
        options: vec![],
        allow_freeform: true,
        agent: None,
        approval: None,
    }
}

/// A default-execution call that parks its turn on a question.
async fn park(ctx: WorkflowCtx, input: Topic) -> Result<Value, WorkflowError> {
    let answer = ctx.ask(question(&input.topic)).await;
    Ok(json!({ "answer": answer.text }))
}

/// A background task: posts a message to the parent (a turn), then waits for an answer; fails
/// when the answer is `fail`.
async fn watch(ctx: WorkflowCtx, task: TaskHandle, input: Topic) -> Result<Value, WorkflowError> {
    task.post_message(&json!({ "note": format!("watching {}", input.topic) }));
    let answer = ctx.ask(question(&input.topic)).await;
    if answer.text.as_deref() == Some("fail") {
        return Err(WorkflowError::new("told to fail"));
    }
    Ok(json!({ "seen": answer.text }))
}

fn turn_registry() -> Registry {
    let tools: Vec<WorkflowTool> = vec![
        define_workflow_tool("Park the turn on a question.", workflow!(park))
            .named("park")
            .grace(Duration::from_millis(200)),
        define_workflow_tool("Watch in the background.", background_workflow!(watch))
            .named("watch")
            .grace(Duration::from_millis(200)),
    ];
    tools
        .into_iter()
        .fold(Registry::new(TURN_DEPLOYMENT), Registry::with)
}

async fn turn_worker(store: Arc<dyn JournalStore>) -> WorkerHandle {
    let config = WorkerConfig {
        poll_interval: Duration::from_millis(20),
        ..WorkerConfig::default()
    };
    Worker::new(store, turn_registry(), Arc::new(SystemClock), config)
        .await
        .expect("register worker")
        .spawn()
}

/// A server with the turn tools whose waits fall back to a poll of 30 s: a turn that comes
/// back sooner was woken by a notification.
async fn server(store: Arc<dyn JournalStore>) -> TestServer {
    TestServer::start_with(
        store,
        |c| c.poll_interval = Duration::from_secs(30),
        |s| s.with_registry(turn_registry()),
    )
    .await
}

struct Api {
    base: String,
    client: reqwest::Client,
}

impl Api {
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = tokio::time::timeout(WAIT, req.send())
            .await
            .expect("answer in time")
            .expect("request");
        let status = resp.status().as_u16();
        let text = resp.text().await.expect("body");
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("JSON body: {text}"))
        };
        (status, value)
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, path, None).await
    }

    /// Starts a call; returns its run id.
    async fn call(&self, session: &str, call: &str, tool: &str, topic: &str) -> String {
        let (status, body) = self
            .post(
                &format!("/v1/tools/{tool}/calls"),
                json!({"session": session, "callId": call, "input": {"topic": topic}}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        body["run"]["runId"].as_str().unwrap().to_owned()
    }

    /// The id of the session's one pending request of `run`.
    async fn request_of(&self, session: &str, run: &str) -> String {
        let (_, pending) = self.get(&format!("/v1/sessions/{session}/requests")).await;
        pending["requests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["runId"] == run)
            .unwrap_or_else(|| panic!("a request of {run}: {pending}"))["requestId"]
            .as_str()
            .unwrap()
            .to_owned()
    }
}

fn api(srv: &TestServer) -> Api {
    Api {
        base: srv.base.clone(),
        client: reqwest::Client::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_delivered_queued_or_steer_and_the_turn_wakes_on_notification() {
    let (_dir, store) = sqlite().await;
    let worker = turn_worker(store.clone()).await;
    let srv = server(store.clone()).await;
    let api = api(&srv);

    // Idle: nothing parked, the message starts a turn at once; nothing is left for `turn`.
    let (status, out) = api
        .post("/v1/sessions/idle/messages", json!({"message": "hi"}))
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["outcome"], "delivered", "{out}");
    assert_eq!(out["messages"][0]["message"], "hi", "{out}");
    assert_eq!(out["messages"][0]["sessionId"], "idle", "{out}");
    assert_eq!(api.get("/v1/sessions/idle/turn").await.0, 204);

    // Queue while a call is parked: the message waits; the turn comes when the call settles.
    let mut events = SseClient::connect(&srv.url("/v1/sessions/q/events"), None).await;
    let run = api.call("q", "park-1", "park", "queue").await;
    events.until("input.requested").await;
    let (status, out) = api
        .post(
            "/v1/sessions/q/messages",
            json!({"message": {"text": "and also"}, "policy": "queue"}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(
        out,
        json!({"outcome": "queued", "waitingOn": ["park-1"]}),
        "{out}"
    );
    assert_eq!(api.get("/v1/sessions/q/turn?wait=0s").await.0, 204);
    let (_, record) = api.get("/v1/sessions/q").await;
    assert_eq!(record["queued"][0]["message"]["text"], "and also");
    // The long poll is parked; the answer settles the call, whose log entry wakes it: it comes
    // back long before the server's 30 s fallback poll.
    let waiting = {
        let base = srv.base.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let resp = reqwest::get(format!("{base}/v1/sessions/q/turn?wait=60s"))
                .await
                .unwrap();
            (
                resp.status().as_u16(),
                resp.json::<Value>().await.unwrap(),
                started.elapsed(),
            )
        })
    };
    let request = api.request_of("q", &run).await;
    let (status, answered) = api
        .post(
            &format!("/v1/requests/{request}/answer"),
            json!({"text": "ok"}),
        )
        .await;
    assert_eq!(status, 200, "{answered}");
    let (status, turn, took) = tokio::time::timeout(WAIT, waiting)
        .await
        .expect("turn in time")
        .unwrap();
    assert_eq!(status, 200, "{turn}");
    assert_eq!(turn["messages"].as_array().unwrap().len(), 1, "{turn}");
    assert_eq!(turn["messages"][0]["message"]["text"], "and also");
    assert_eq!(turn["notices"], json!([]), "{turn}");
    assert_eq!(turn["nextSeq"], Value::Null, "{turn}");
    assert!(
        took < Duration::from_secs(20),
        "the turn waited {took:?}: it was not woken by the settlement"
    );
    // Delivered once: the queue is empty now.
    assert_eq!(api.get("/v1/sessions/q/turn").await.0, 204);

    // Steer: the parked call is cancelled, its request withdrawn; the message makes the turn.
    let mut events = SseClient::connect(&srv.url("/v1/sessions/st/events"), None).await;
    let run = api.call("st", "park-2", "park", "steer").await;
    events.until("input.requested").await;
    let request = api.request_of("st", &run).await;
    let (status, out) = api
        .post(
            "/v1/sessions/st/messages",
            json!({"message": "stop that", "policy": "steer"}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out, json!({"outcome": "steered", "cancelled": [run]}));
    let (status, turn) = api.get("/v1/sessions/st/turn?wait=60s").await;
    assert_eq!(status, 200, "{turn}");
    assert_eq!(turn["messages"][0]["message"], "stop that", "{turn}");
    let seen = events.until("tool.settled").await;
    assert!(
        seen.iter()
            .any(|f| f.event.as_deref() == Some("input.withdrawn")),
        "{seen:?}"
    );
    let settled = seen.last().unwrap().json();
    assert_eq!(settled["event"]["data"]["result"]["status"], "cancelled");
    let (_, pending) = api.get("/v1/sessions/st/requests").await;
    assert_eq!(pending["requests"], json!([]), "{pending}");
    let (status, gone) = api
        .post(
            &format!("/v1/requests/{request}/answer"),
            json!({"text": "too late"}),
        )
        .await;
    assert_eq!((status, gone["code"].as_str()), (410, Some("withdrawn")));

    srv.stop().await;
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_index_task_cancel_and_background_notices() {
    let (_dir, store) = sqlite().await;
    let worker = turn_worker(store.clone()).await;
    let srv = server(store.clone()).await;
    let api = api(&srv);
    let mut events = SseClient::connect(&srv.url("/v1/sessions/t/events"), None).await;

    // A background task: listed in the index; its postMessage reaches the events route and
    // makes a turn through `turn?from=`.
    let task = api.call("t", "watch-1", "watch", "prices").await;
    let (status, tasks) = api.get("/v1/sessions/t/tasks").await;
    assert_eq!(status, 200);
    assert_eq!(tasks["tasks"][0]["taskId"], task.as_str(), "{tasks}");
    assert_eq!(tasks["tasks"][0]["tool"], "watch", "{tasks}");
    assert_eq!(tasks["tasks"][0]["cancelRequested"], false, "{tasks}");
    let seen = events.until("task.message").await;
    let message = seen.last().unwrap().json();
    assert_eq!(
        message["event"]["data"]["message"]["note"],
        "watching prices"
    );
    let (status, turn) = api.get("/v1/sessions/t/turn?from=0&wait=60s").await;
    assert_eq!(status, 200, "{turn}");
    assert_eq!(turn["messages"], json!([]), "{turn}");
    let notices = turn["notices"].as_array().unwrap();
    assert_eq!(notices.len(), 1, "{turn}");
    assert_eq!(notices[0]["event"]["type"], "task.message", "{turn}");
    assert_eq!(notices[0]["runId"], task.as_str(), "{turn}");
    let next = turn["nextSeq"].as_u64().expect("a cursor");
    assert_eq!(
        api.get(&format!("/v1/sessions/t/turn?from={next}")).await.0,
        204
    );

    // A second task completes when answered: `task.completed` on the stream and in the turn.
    let done = api.call("t", "watch-2", "watch", "rates").await;
    events.until("task.message").await;
    let (status, turn) = api.get(&format!("/v1/sessions/t/turn?from={next}")).await;
    assert_eq!(status, 200, "{turn}");
    assert_eq!(turn["notices"][0]["runId"], done.as_str(), "{turn}");
    let next = turn["nextSeq"].as_u64().expect("a cursor");
    let request = api.request_of("t", &done).await;
    let waiting = {
        let base = srv.base.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let resp = reqwest::get(format!("{base}/v1/sessions/t/turn?from={next}&wait=60s"))
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (
                status,
                resp.json::<Value>().await.unwrap(),
                started.elapsed(),
            )
        })
    };
    let (status, _) = api
        .post(
            &format!("/v1/requests/{request}/answer"),
            json!({"text": "steady"}),
        )
        .await;
    assert_eq!(status, 200);
    let completed = events.until("task.completed").await.pop().unwrap().json();
    assert_eq!(completed["event"]["data"]["output"]["seen"], "steady");
    let (status, turn, took) = tokio::time::timeout(WAIT, waiting).await.unwrap().unwrap();
    assert_eq!(status, 200, "{turn}");
    let kinds: Vec<&str> = turn["notices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["event"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["task.completed"], "{turn}");
    let next = turn["nextSeq"].as_u64().expect("a cursor");

    // A task that fails: `task.failed` on the stream and in the next turn.
    let failing = api.call("t", "watch-3", "watch", "fx").await;
    events.until("task.message").await;
    let request = api.request_of("t", &failing).await;
    let (status, _) = api
        .post(
            &format!("/v1/requests/{request}/answer"),
            json!({"text": "fail"}),
        )
        .await;
    assert_eq!(status, 200);
    let failed = events.until("task.failed").await.pop().unwrap().json();
    assert_eq!(failed["event"]["data"]["error"], "told to fail", "{failed}");
    let (status, turn) = api.get(&format!("/v1/sessions/t/turn?from={next}")).await;
    assert_eq!(status, 200, "{turn}");
    let kinds: Vec<&str> = turn["notices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["event"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["task.message", "task.failed"], "{turn}");
    let next = turn["nextSeq"].as_u64().expect("a cursor");
    assert!(took < Duration::from_secs(20), "waited {took:?}");

    // task_cancel: a default-execution call is not a task (409), an unknown id or another
    // session's task is 404, a task is cancelled once, then reported ended.
    let parked = api.call("t", "park-1", "park", "x").await;
    let (status, err) = api
        .post(&format!("/v1/sessions/t/tasks/{parked}/cancel"), json!({}))
        .await;
    assert_eq!(
        (status, err["code"].as_str()),
        (409, Some("not_a_task")),
        "{err}"
    );
    let (status, err) = api
        .post("/v1/sessions/t/tasks/run_unknown/cancel", json!({}))
        .await;
    assert_eq!(
        (status, err["code"].as_str()),
        (404, Some("not_found")),
        "{err}"
    );
    let (status, err) = api
        .post(
            &format!("/v1/sessions/other/tasks/{task}/cancel"),
            json!({}),
        )
        .await;
    assert_eq!(
        (status, err["code"].as_str()),
        (404, Some("not_found")),
        "{err}"
    );
    // The route without a session shares the rules.
    let (status, err) = api
        .post(&format!("/v1/tasks/{parked}/cancel"), json!({}))
        .await;
    assert_eq!(
        (status, err["code"].as_str()),
        (409, Some("not_a_task")),
        "{err}"
    );
    let (status, out) = api
        .post(&format!("/v1/sessions/t/tasks/{task}/cancel"), json!({}))
        .await;
    assert_eq!(status, 202, "{out}");
    assert_eq!(out["outcome"], "requested", "{out}");
    let (status, out) = api
        .post(&format!("/v1/sessions/t/tasks/{task}/cancel"), json!({}))
        .await;
    assert_eq!(
        (status, out["outcome"].as_str()),
        (200, Some("already_requested"))
    );
    events.until("task.cancelled").await;
    let (status, out) = api
        .post(&format!("/v1/sessions/t/tasks/{task}/cancel"), json!({}))
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(
        out,
        json!({"outcome": "already_ended", "status": "cancelled"})
    );
    let (_, tasks) = api.get("/v1/sessions/t/tasks").await;
    let statuses: Vec<(&str, &str)> = tasks["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["taskId"].as_str().unwrap(), t["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        statuses,
        vec![
            (task.as_str(), "cancelled"),
            (done.as_str(), "completed"),
            (failing.as_str(), "failed")
        ],
        "{tasks}"
    );
    // The parked call is part of the turn: the turn waits for it even with notices pending.
    assert_eq!(
        api.get(&format!("/v1/sessions/t/turn?from={next}")).await.0,
        204
    );

    // An ended session takes no more messages.
    let (status, ended) = api.post("/v1/sessions/t/end", json!({})).await;
    assert_eq!(status, 200, "{ended}");
    assert_eq!(ended["cancelled"], json!([parked]), "{ended}");
    let (status, err) = api
        .post("/v1/sessions/t/messages", json!({"message": "anyone?"}))
        .await;
    assert_eq!(
        (status, err["code"].as_str()),
        (409, Some("session_ended")),
        "{err}"
    );

    srv.stop().await;
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_and_turn_queries_name_the_field() {
    let (_dir, store) = sqlite().await;
    let srv = server(store.clone()).await;
    let api = api(&srv);
    for (body, field) in [
        (json!({}), "message"),
        (json!({"message": null}), "message"),
        (json!({"message": "x", "policy": "later"}), "policy"),
        (json!({"message": "x", "policy": 3}), "policy"),
        (json!({"message": "x", "extra": 1}), "extra"),
        (json!(["message", "x"]), "an array"),
    ] {
        let (status, err) = api.post("/v1/sessions/b/messages", body.clone()).await;
        assert_eq!(status, 400, "{body} → {err}");
        assert_eq!(err["code"], "malformed", "{body} → {err}");
        assert!(
            err["message"].as_str().unwrap().contains(field),
            "{body} → {err}: the message names {field}"
        );
    }
    let (status, err) = api.get("/v1/sessions/b/turn?wait=soon").await;
    assert_eq!(
        (status, err["code"].as_str()),
        (400, Some("malformed")),
        "{err}"
    );
    let (status, err) = api.get("/v1/sessions/b/turn?from=-1").await;
    assert_eq!(status, 400, "{err}");
    let long = "s".repeat(300);
    let (status, err) = api
        .post(
            &format!("/v1/sessions/{long}/messages"),
            json!({"message": "x"}),
        )
        .await;
    assert_eq!(
        (status, err["code"].as_str()),
        (400, Some("invalid_id")),
        "{err}"
    );
    // Nothing was queued by the refusals.
    let (_, record) = api.get("/v1/sessions/b").await;
    assert_eq!(record["queued"], json!([]), "{record}");
    srv.stop().await;
}
