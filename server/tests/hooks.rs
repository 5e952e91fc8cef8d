//! The host's remaining routes (issue 43, item 7): `POST /v1/hooks/{token}` resumes a hook a
//! workflow created with its own token, exactly once per `Idempotency-Key`, behind an operate
//! key, with typed refusals; the HTTP start of a background tool answers the seed's receipt
//! (`status: "working"`, `taskId`); and an input the tool's type refuses is answered 400
//! naming the field.

mod common;

use common::*;
use eve_core::engine::{SystemClock, Worker, WorkerConfig};
use eve_core::{Event, KeyScope, RunStatus, Timestamp};
use serde_json::{json, Value};
use std::sync::Arc;

/// A server with keys on, serving the test tools.
async fn keyed(store: Arc<dyn eve_core::JournalStore>) -> TestServer {
    TestServer::start_with(
        store,
        |c| c.insecure_no_auth = false,
        |s| s.with_registry(registry()),
    )
    .await
}

/// A worker the test drives with `drain` (no polling, no sleeps).
async fn driven(store: Arc<dyn eve_core::JournalStore>) -> Worker {
    Worker::new(
        store,
        registry(),
        Arc::new(SystemClock),
        WorkerConfig::default(),
    )
    .await
    .expect("register worker")
}

/// `POST {path}` with `body` (raw text), the key and an optional `Idempotency-Key`.
async fn post(
    server: &TestServer,
    path: &str,
    key: Option<&str>,
    body: &str,
    idempotency: Option<&str>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(server.url(path))
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    if let Some(i) = idempotency {
        req = req.header("idempotency-key", i);
    }
    let resp = req.send().await.expect("send");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_hook_is_resumed_over_http_once_per_idempotency_key() {
    let (_dir, store) = sqlite().await;
    let server = keyed(store.clone()).await;
    let worker = driven(store.clone()).await;
    let now = Timestamp::now();
    let operate = eve_server::create_key(&*store, "ops", KeyScope::Operate, now)
        .await
        .unwrap()
        .text;
    let answer = eve_server::create_key(&*store, "person", KeyScope::Answer, now)
        .await
        .unwrap()
        .text;
    let run = start(
        &store,
        "s-hooks",
        "c1",
        "await_hook",
        json!({ "token": "render-p1", "count": 2 }),
    )
    .await;
    worker.drain().await.unwrap();
    let path = "/v1/hooks/render-p1";
    let ops = Some(operate.as_str());

    // Scope: operate (a hook's token is no credential).
    let (status, _) = post(&server, path, None, "{}", None).await;
    assert_eq!(status, 401);
    let (status, err) = post(&server, path, Some(&answer), "{}", None).await;
    assert_eq!((status, err["code"].as_str()), (403, Some("forbidden")));

    // Delivered once per key: a retry is a duplicate with the same seq.
    let (status, first) = post(&server, path, ops, r#"{"frame": 1}"#, Some("k1")).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["token"], "render-p1");
    assert_eq!(first["runId"], run.as_str());
    assert_eq!(first["duplicate"], false);
    let (status, again) = post(&server, path, ops, r#"{ "frame" : 1 }"#, Some("k1")).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(
        (again["duplicate"].as_bool(), &again["seq"]),
        (Some(true), &first["seq"])
    );
    // The same key with another payload delivers nothing.
    let (status, err) = post(&server, path, ops, r#"{"frame": 2}"#, Some("k1")).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (409, Some("idempotency_mismatch")),
        "{err}"
    );

    // Refusals, before the store is touched or typed by it.
    for (body, why) in [("{not json", "not JSON"), ("", "no body")] {
        let (status, err) = post(&server, path, ops, body, None).await;
        assert_eq!(
            (status, err["code"].as_str()),
            (400, Some("malformed")),
            "{why}: {err}"
        );
    }
    let (status, err) = post(&server, path, ops, "1", Some(&"k".repeat(300))).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (400, Some("malformed")),
        "{err}"
    );
    let (status, err) = post(&server, "/v1/hooks/nobody-made-this", ops, "1", None).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (404, Some("not_found")),
        "{err}"
    );
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("\"nobody-made-this\""),
        "{err}"
    );
    let webhook = format!("/v1/hooks/wh_{}", "0".repeat(32));
    let (status, err) = post(&server, &webhook, ops, "1", None).await;
    assert_eq!(status, 404, "{err}");
    assert!(
        err["message"].as_str().unwrap().contains("webhook"),
        "{err}"
    );
    let (status, err) = post(&server, "/v1/hooks/agent:run-x:review", ops, "1", None).await;
    assert_eq!(status, 404, "{err}");
    assert!(
        err["message"].as_str().unwrap().contains("/v1/agents"),
        "{err}"
    );

    // Without a key, at least once: the second payload ends the run.
    let (status, second) = post(&server, path, ops, r#""done""#, None).await;
    assert_eq!((status, second["duplicate"].as_bool()), (200, Some(false)));
    worker.drain().await.unwrap();
    let record = store.get_run(&run).await.unwrap();
    assert_eq!(record.status, RunStatus::Completed);
    let events = journal(&store, &run).await;
    assert_eq!(
        count(&events, |e| matches!(e, Event::HookReceived { .. })),
        2,
        "one payload per key: {events:?}"
    );
    match &events.last().unwrap().event {
        Event::RunCompleted { output } => assert_eq!(
            output.to_value::<Value>().unwrap(),
            json!([{ "frame": 1 }, "done"])
        ),
        other => panic!("not completed: {other:?}"),
    }

    // The token is released with the run; a retry of a delivered key is still answered.
    let (status, err) = post(&server, path, ops, "3", Some("k3")).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (404, Some("not_found")),
        "{err}"
    );
    let (status, late) = post(&server, path, ops, r#"{"frame": 1}"#, Some("k1")).await;
    assert_eq!(
        (status, late["duplicate"].as_bool()),
        (200, Some(true)),
        "{late}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_background_start_answers_the_receipt() {
    let (_dir, store) = sqlite().await;
    let server =
        TestServer::start_with(store.clone(), |_| {}, |s| s.with_registry(registry())).await;
    let body = json!({ "session": "s-receipt", "callId": "r1", "input": { "order_id": "o-1" } })
        .to_string();
    let (status, started) = post(&server, "/v1/tools/refund_order/calls", None, &body, None).await;
    assert_eq!(status, 201, "{started}");
    assert_eq!(started["status"], "working", "{started}");
    assert_eq!(started["taskId"], started["run"]["runId"], "{started}");
    assert!(started["settled"].is_null(), "{started}");
    // A retry answers the same receipt.
    let (status, again) = post(&server, "/v1/tools/refund_order/calls", None, &body, None).await;
    assert_eq!(status, 200);
    assert_eq!(
        (&again["status"], &again["taskId"]),
        (&started["status"], &started["taskId"])
    );
    // A default-execution call has no receipt fields.
    let body = json!({ "session": "s-receipt", "callId": "d1", "input": { "service": "api" } })
        .to_string();
    let (status, parked) = post(&server, "/v1/tools/deploy/calls", None, &body, None).await;
    assert_eq!(status, 201, "{parked}");
    assert!(
        parked.get("status").is_none() && parked.get("taskId").is_none(),
        "{parked}"
    );
    server.stop().await;
}

#[tokio::test]
async fn an_input_error_names_the_field() {
    let (_dir, store) = sqlite().await;
    let server =
        TestServer::start_with(store.clone(), |_| {}, |s| s.with_registry(registry())).await;
    for (tool, input, says) in [
        // A workflow tool and an ordinary tool run inline: the same check.
        (
            "await_hook",
            json!({ "token": "t", "count": "two" }),
            r#"count: expected an integer of 0 or more, got the string "two""#,
        ),
        (
            "await_hook",
            json!({ "count": 2 }),
            "token: missing; the arguments must have it",
        ),
        (
            "lookup_order",
            json!({ "order_id": 7 }),
            "order_id: expected a string, got the number 7",
        ),
        (
            "lookup_order",
            json!([7]),
            "the arguments must be a JSON object, got an array",
        ),
    ] {
        let body = json!({ "session": "s-input", "callId": "x", "input": input }).to_string();
        let (status, err) = post(
            &server,
            &format!("/v1/tools/{tool}/calls"),
            None,
            &body,
            None,
        )
        .await;
        assert_eq!(
            (status, err["code"].as_str()),
            (400, Some("invalid_input")),
            "{tool}: {err}"
        );
        assert!(
            err["message"].as_str().unwrap().contains(says),
            "{tool}: {err}"
        );
    }
    server.stop().await;
}
