//! Starting calls over HTTP: the tool list, 201 / 200 on a retry / 409 on another input, the
//! refusals, and `?wait=` returning as soon as the call settles.

mod common;

use common::*;
use serde_json::{json, Value};
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_start_idempotently_and_wait_until_settled() {
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let state = eve_server::AppState::new(store.clone(), Arc::new(eve_core::engine::SystemClock))
        .with_config(eve_server::ServerConfig {
            base_url: base.clone(),
            ..eve_server::ServerConfig::default()
        })
        .with_registry(registry());
    tokio::spawn(eve_server::serve(listener, state));
    let operate = eve_server::create_key(
        &*store,
        "agent",
        eve_core::KeyScope::Operate,
        eve_core::Timestamp::now(),
    )
    .await
    .unwrap()
    .text;
    let client = reqwest::Client::new();

    let tools: Value = client
        .get(format!("{base}/v1/tools"))
        .bearer_auth(&operate)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let deploy = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "deploy")
        .expect("deploy is listed");
    assert_eq!(deploy["description"], "Deploy a service.");
    assert_eq!(deploy["execution"], "default");
    assert!(
        deploy["inputSchema"]["properties"]["service"].is_object(),
        "{deploy}"
    );

    let call = |tool: &'static str, body: Value, wait: &'static str| {
        let (client, base, key) = (client.clone(), base.clone(), operate.clone());
        async move {
            let resp = client
                .post(format!("{base}/v1/tools/{tool}/calls{wait}"))
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap())
        }
    };
    let body = json!({ "session": "s-calls", "callId": "c1", "input": { "service": "api" } });
    // Started, waiting: the long poll returns once the answer below lets the call settle.
    let waiting = tokio::spawn(call("deploy", body.clone(), "?wait=60s"));
    let mut events = SseClient::connect_with(
        &format!("{base}/v1/sessions/s-calls/events"),
        None,
        Some(&operate),
    )
    .await;
    let asked = events.until("input.requested").await.pop().unwrap().json();
    let request = asked["event"]["data"]["requestId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!waiting.is_finished(), "the call waits while it asks");
    let (status, _) = call("deploy", body.clone(), "").await;
    assert_eq!(status, 200, "a retry of a started call is 200");
    let answered = client
        .post(format!("{base}/v1/requests/{request}/answer"))
        .bearer_auth(&operate)
        .json(&json!({ "optionId": "approve" }))
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), 200);
    let (status, started) = waiting.await.unwrap();
    assert_eq!(status, 201, "{started}");
    assert_eq!(started["run"]["status"], "completed");
    assert_eq!(started["settled"]["status"], "completed");
    assert_eq!(started["settled"]["output"]["deployed"], true);
    let run_id = started["run"]["runId"].clone();

    // A retry after the end gets the same run and its outcome.
    let (status, again) = call("deploy", body.clone(), "?wait=1s").await;
    assert_eq!((status, &again["run"]["runId"]), (200, &run_id));
    assert_eq!(again["settled"]["output"]["deployed"], true);
    // The same session and call id with another input: 409.
    let other = json!({ "session": "s-calls", "callId": "c1", "input": { "service": "web" } });
    let (status, err) = call("deploy", other, "").await;
    assert_eq!(
        (status, err["code"].as_str()),
        (409, Some("idempotency_mismatch"))
    );
    // Unknown tool, input against the schema, malformed body, bad wait.
    let (status, err) = call("nope", body.clone(), "").await;
    assert_eq!((status, err["code"].as_str()), (404, Some("not_found")));
    let bad = json!({ "session": "s-calls", "callId": "c2", "input": { "service": 7 } });
    let (status, err) = call("deploy", bad, "").await;
    assert_eq!((status, err["code"].as_str()), (400, Some("invalid_input")));
    let (status, err) = call("deploy", json!(["s", "c", {}]), "").await;
    assert_eq!((status, err["code"].as_str()), (400, Some("malformed")));
    let (status, err) = call("deploy", body.clone(), "?wait=soon").await;
    assert_eq!((status, err["code"].as_str()), (400, Some("malformed")));
    // A short wait on a call that asks returns unsettled.
    let pending = json!({ "session": "s-calls", "callId": "c3", "input": { "service": "db" } });
    let (status, started) = call("deploy", pending, "?wait=300ms").await;
    assert_eq!(status, 201);
    assert_eq!(
        (&started["run"]["status"], &started["settled"]),
        (&json!("running"), &Value::Null)
    );
    let asking = started["run"]["runId"].clone();

    // Ending the session: its live call is cancelled, and no handle starts a call in it again.
    let end = |session: &'static str| {
        let (client, base, key) = (client.clone(), base.clone(), operate.clone());
        async move {
            let resp = client
                .post(format!("{base}/v1/sessions/{session}/end"))
                .bearer_auth(key)
                .send()
                .await
                .unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };
    let (status, ended) = end("s-calls").await;
    assert_eq!(status, 200, "{ended}");
    assert_eq!(
        ended["cancelled"],
        json!([asking]),
        "the asking call is cancelled"
    );
    let ended_at = ended["endedAt"].clone();
    assert!(ended_at.is_i64(), "{ended}");
    let late = json!({ "session": "s-calls", "callId": "c4", "input": { "service": "db" } });
    let (status, err) = call("deploy", late, "").await;
    assert_eq!(
        (status, err["code"].as_str()),
        (409, Some("session_ended")),
        "{err}"
    );
    let (status, again) = call("deploy", body.clone(), "").await;
    assert_eq!(
        (status, &again["run"]["runId"]),
        (200, &run_id),
        "a retry of a call started before the end still answers"
    );
    let record: Value = client
        .get(format!("{base}/v1/sessions/s-calls"))
        .bearer_auth(&operate)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(record["endedAt"], ended_at, "{record}");
    let (status, twice) = end("s-calls").await;
    assert_eq!(
        (status, &twice["endedAt"]),
        (200, &ended_at),
        "the first end's time stays"
    );
    let fresh = json!({ "session": "s-other", "callId": "c1", "input": { "service": "api" } });
    let (status, _) = call("deploy", fresh, "").await;
    assert_eq!(status, 201, "another session still starts calls");
    worker.shutdown().await;
}
