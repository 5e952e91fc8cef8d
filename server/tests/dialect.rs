//! The API speaks one dialect: every JSON field name of every response (bodies and SSE data) is
//! camelCase, payloads keep their authors' keys, the start body's deprecated `call_id` still
//! works, and an id a client chooses past the limits is refused before anything is written.

mod common;

use common::*;
use eve_core::{KeyScope, RunQuery, SessionId, Timestamp};
use reqwest::StatusCode;
use serde_json::{json, Value};

/// Keys whose values are payloads (a tool's input or output, a schema, a webhook's body and
/// headers) or plain text: their insides belong to whoever wrote them and are not checked.
const PAYLOADS: [&str; 8] = [
    "input",
    "output",
    "value",
    "message",
    "payload",
    "body",
    "headers",
    "inputSchema",
];

/// Every object key under `v` (outside payloads) that is not camelCase, with its path.
fn snake_keys(v: &Value, path: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, v) in o {
                let here = format!("{path}.{k}");
                if k.contains('_') || k.contains('-') {
                    out.push(here.clone());
                }
                if !PAYLOADS.contains(&k.as_str()) {
                    snake_keys(v, &here, out);
                }
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                snake_keys(v, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Every response body seen, by what asked for it.
#[derive(Default)]
struct Seen(Vec<(String, Value)>);

impl Seen {
    fn add(&mut self, what: impl Into<String>, body: &Value) -> Value {
        self.0.push((what.into(), body.clone()));
        body.clone()
    }
}

struct Api {
    client: reqwest::Client,
    base: String,
    key: String,
}

impl Api {
    async fn send(&self, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = self
            .client
            .request(method.parse().unwrap(), format!("{}{path}", self.base))
            .bearer_auth(&self.key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("the server answers");
        let status = resp.status();
        let text = resp.text().await.unwrap();
        let body = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}"));
        (status, body)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_field_is_camel_case_and_payloads_keep_their_keys() {
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let server = TestServer::start_with(
        store.clone(),
        |c| c.insecure_no_auth = false,
        |s| s.with_registry(registry()),
    )
    .await;
    let admin = eve_server::create_key(&*store, "dialect", KeyScope::Admin, Timestamp::now())
        .await
        .unwrap();
    let api = Api {
        client: reqwest::Client::new(),
        base: server.base.clone(),
        key: admin.text.clone(),
    };
    let mut seen = Seen::default();
    let mut expect = |what: &str, (status, body): (StatusCode, Value), want: u16| {
        assert_eq!(status.as_u16(), want, "{what}: {body}");
        seen.add(what, &body)
    };
    let session = "s-dialect";
    let mut stream = SseClient::connect_with(
        &server.url(&format!("/v1/sessions/{session}/events")),
        None,
        Some(&admin.text),
    )
    .await;

    let tools = expect(
        "GET /v1/tools",
        api.send("GET", "/v1/tools", None).await,
        200,
    );
    assert!(tools["tools"][0]["inputSchema"].is_object(), "{tools}");

    // A default-execution call and a background one, the latter started with the deprecated
    // `call_id`, its input keeping its snake_case key.
    let deploy_body = json!({ "session": session, "callId": "c1", "input": { "service": "api" } });
    let started = expect(
        "POST calls",
        api.send("POST", "/v1/tools/deploy/calls", Some(deploy_body.clone()))
            .await,
        201,
    );
    let deploy = started["run"]["runId"].as_str().unwrap().to_owned();
    assert_eq!(started["run"]["sessionId"], session, "{started}");
    assert_eq!(started["run"]["callId"], "c1", "{started}");
    assert!(started["run"]["createdAt"].is_i64(), "{started}");
    let old = json!({ "session": session, "call_id": "c2", "input": { "order_id": "A-1" } });
    let refund = expect(
        "POST calls (deprecated call_id)",
        api.send("POST", "/v1/tools/refund_order/calls", Some(old))
            .await,
        201,
    );
    assert_eq!(
        refund["run"]["callId"], "c2",
        "the deprecated call_id names the call"
    );
    let refund = refund["run"]["runId"].as_str().unwrap().to_owned();
    // `call_id` and `callId` are one field: the retry under the new name is the same call.
    let retry = json!({ "session": session, "callId": "c2", "input": { "order_id": "A-1" } });
    let again = expect(
        "POST calls (retry)",
        api.send("POST", "/v1/tools/refund_order/calls", Some(retry))
            .await,
        200,
    );
    assert_eq!(again["run"]["runId"], refund.as_str());

    // Both ask; the session stream says so.
    let mut asked = Vec::new();
    while asked.len() < 2 {
        let f = stream.next().await.expect("the stream stays open");
        let entry = seen.add("SSE /v1/sessions/{id}/events", &f.json());
        if f.event.as_deref() == Some("input.requested") {
            assert!(
                entry["runId"].is_string() && entry["callId"].is_string(),
                "{entry}"
            );
            asked.push((
                entry["runId"].as_str().unwrap().to_owned(),
                entry["event"]["data"]["requestId"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            ));
        }
    }
    let deploy_request = asked.iter().find(|(r, _)| *r == deploy).unwrap().1.clone();

    let mut expect = |what: &str, (status, body): (StatusCode, Value), want: u16| {
        assert_eq!(status.as_u16(), want, "{what}: {body}");
        seen.add(what, &body)
    };
    let pending = expect(
        "GET session requests",
        api.send("GET", &format!("/v1/sessions/{session}/requests"), None)
            .await,
        200,
    );
    assert_eq!(
        pending["requests"].as_array().unwrap().len(),
        2,
        "{pending}"
    );
    assert!(pending["requests"][0]["requestedAt"].is_i64(), "{pending}");
    expect(
        "GET /v1/requests",
        api.send("GET", "/v1/requests", None).await,
        200,
    );
    let tasks = expect(
        "GET tasks",
        api.send("GET", &format!("/v1/sessions/{session}/tasks"), None)
            .await,
        200,
    );
    assert_eq!(tasks["tasks"][0]["taskId"], refund.as_str());
    expect(
        "GET session",
        api.send("GET", &format!("/v1/sessions/{session}"), None)
            .await,
        200,
    );
    let shown = expect(
        "GET run",
        api.send("GET", &format!("/v1/runs/{refund}"), None).await,
        200,
    );
    let started_event = &shown["events"][0]["event"]["RunStarted"];
    assert_eq!(started_event["sessionId"], session, "{shown}");
    assert_eq!(
        started_event["input"],
        json!({ "order_id": "A-1" }),
        "a payload keeps its keys"
    );
    assert!(shown["run"]["nextSeq"].is_u64(), "{shown}");

    // Answered; the retry waits for the settled call.
    let answered = expect(
        "POST answer",
        api.send(
            "POST",
            &format!("/v1/requests/{deploy_request}/answer"),
            Some(json!({ "optionId": "approve" })),
        )
        .await,
        200,
    );
    assert_eq!(answered["runId"], deploy.as_str());
    let settled = expect(
        "POST calls?wait",
        api.send("POST", "/v1/tools/deploy/calls?wait=60s", Some(deploy_body))
            .await,
        200,
    );
    assert_eq!(settled["settled"]["status"], "completed", "{settled}");
    expect(
        "GET runs page",
        api.send("GET", "/v1/runs?limit=10", None).await,
        200,
    );
    expect("GET runs", api.send("GET", "/v1/runs", None).await, 200);
    expect(
        "GET deploy run",
        api.send("GET", &format!("/v1/runs/{deploy}"), None).await,
        200,
    );
    expect(
        "POST task cancel",
        api.send("POST", &format!("/v1/tasks/{refund}/cancel"), None)
            .await,
        202,
    );
    expect(
        "POST run cancel (ended)",
        api.send("POST", &format!("/v1/runs/{deploy}/cancel"), None)
            .await,
        200,
    );
    expect(
        "POST run resume (not blocked)",
        api.send("POST", &format!("/v1/runs/{deploy}/resume"), None)
            .await,
        400,
    );
    expect(
        "POST session end",
        api.send("POST", &format!("/v1/sessions/{session}/end"), None)
            .await,
        200,
    );
    // The multiplexed stream's backlog.
    let mut many = SseClient::connect_with(
        &server.url(&format!("/v1/events?session={session}")),
        None,
        Some(&admin.text),
    )
    .await;
    for _ in 0..4 {
        let f = many.next().await.expect("backlog");
        seen.add("SSE /v1/events", &f.json());
    }
    // Keys and sign-in.
    let mut expect = |what: &str, (status, body): (StatusCode, Value), want: u16| {
        assert_eq!(status.as_u16(), want, "{what}: {body}");
        seen.add(what, &body)
    };
    let made = expect(
        "POST keys",
        api.send(
            "POST",
            "/v1/keys",
            Some(json!({ "name": "ci", "scope": "read" })),
        )
        .await,
        201,
    );
    assert!(made["record"]["createdAt"].is_i64(), "{made}");
    let id = made["record"]["id"].as_str().unwrap().to_owned();
    expect("GET keys", api.send("GET", "/v1/keys", None).await, 200);
    let revoked = expect(
        "POST revoke",
        api.send("POST", &format!("/v1/keys/{id}/revoke"), None)
            .await,
        200,
    );
    assert!(revoked["key"]["revokedAt"].is_i64(), "{revoked}");
    expect(
        "POST sign-in",
        api.send(
            "POST",
            "/v1/auth/session",
            Some(json!({ "key": admin.text })),
        )
        .await,
        200,
    );
    expect("404", api.send("GET", "/v1/nothing", None).await, 404);
    expect("GET /healthz", api.send("GET", "/healthz", None).await, 200);

    let mut bad = Vec::new();
    for (what, body) in &seen.0 {
        let mut keys = Vec::new();
        snake_keys(body, "", &mut keys);
        if !keys.is_empty() {
            bad.push(format!("{what}: {keys:?}"));
        }
    }
    assert!(seen.0.len() >= 30, "{} bodies", seen.0.len());
    assert!(
        bad.is_empty(),
        "field names not in camelCase:\n{}",
        bad.join("\n")
    );
    // Values are not field names: they keep their form.
    assert!(seen
        .0
        .iter()
        .any(|(_, b)| b["outcome"] == "already_ended" || b["code"] == "not_found"));
    worker.shutdown().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_900_kb_session_id_is_refused_and_creates_nothing() {
    let (_dir, store) = sqlite().await;
    let server =
        TestServer::start_with(store.clone(), |_| {}, |s| s.with_registry(registry())).await;
    let client = reqwest::Client::new();
    let huge = "s".repeat(900 * 1024);
    let resp = client
        .post(server.url("/v1/tools/deploy/calls"))
        .json(&json!({ "session": huge, "callId": "c1", "input": { "service": "api" } }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["code"], "invalid_id", "{err}");
    let message = err["message"].as_str().unwrap();
    assert!(
        message.contains("session") && message.contains("at most 256 bytes"),
        "the message names the field and the limit: {message}"
    );
    assert!(
        store
            .list_runs(&RunQuery::default())
            .await
            .unwrap()
            .is_empty(),
        "no run was created"
    );
    // 256 bytes is fine, and the server still serves.
    let ok = "s".repeat(256);
    let resp = client
        .post(server.url("/v1/tools/deploy/calls"))
        .json(&json!({ "session": ok, "callId": "c1", "input": { "service": "api" } }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    assert_eq!(
        store
            .list_runs(&RunQuery {
                session: Some(SessionId::new(ok)),
                ..RunQuery::default()
            })
            .await
            .unwrap()
            .len(),
        1
    );
    server.stop().await;
}
