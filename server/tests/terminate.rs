//! `POST /v1/runs/{id}/terminate`: a parked call and a blocked run terminated over HTTP (the
//! call settles failed, naming the key and the reason; the pending request is withdrawn), an
//! ended run refused with 409 `not_live` naming its status, an unknown run 404, a missing
//! reason 400, an answer key 403, and `eve_terminates_total` counting each.

mod common;

use common::*;
use eve_core::{
    Event, JournalStore, JournalStoreExt, KeyScope, RunId, RunStatus, SessionId, Timestamp,
};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn until(what: &str, mut ok: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !ok().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn post(client: &reqwest::Client, url: String, key: &str, body: Value) -> (u16, Value) {
    let resp = client
        .post(url)
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("post");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_over_http_settles_refuses_ended_and_unknown() {
    let (_dir, store) = sqlite().await;
    let _worker = worker(store.clone()).await;
    let server = TestServer::start_with(
        store.clone(),
        |c| c.insecure_no_auth = false,
        |s| s.with_registry(registry()),
    )
    .await;
    let now = Timestamp::now();
    let ops = eve_server::create_key(&*store, "ops", KeyScope::Operate, now)
        .await
        .expect("key")
        .text;
    let answerer = eve_server::create_key(&*store, "answerer", KeyScope::Answer, now)
        .await
        .expect("key")
        .text;
    let client = reqwest::Client::new();

    // A call parked on its approval request.
    let run = start(&store, "s-term", "c1", "deploy", json!({"service": "api"})).await;
    let session = SessionId::new("s-term");
    until("the approval request", async || {
        !store.pending_requests(&session).await.unwrap().is_empty()
    })
    .await;
    let terminate = |id: &RunId| server.url(&format!("/v1/runs/{id}/terminate"));
    assert_eq!(
        post(&client, terminate(&run), &answerer, json!({"reason": "x"}))
            .await
            .0,
        403,
        "terminate needs an operate key"
    );
    let (status, body) = post(&client, terminate(&run), &ops, json!({})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("malformed")),
        "{body}"
    );
    let (status, body) = post(
        &client,
        terminate(&run),
        &ops,
        json!({"reason": "stuck", "by": "somebody else"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let seq = body["seq"].as_u64().expect("seq");
    let journal = journal(&store, &run).await;
    let tail: Vec<Event> = journal[seq as usize..]
        .iter()
        .map(|e| e.event.clone())
        .collect();
    assert!(
        matches!(&tail[..], [Event::InputWithdrawn { .. }, Event::RunTerminated { reason, by }]
            if reason == "stuck" && by == "ops"),
        "the request withdrawn, then RunTerminated by the key's name: {tail:?}"
    );
    assert!(store.pending_requests(&session).await.unwrap().is_empty());
    // The call settles failed, naming who and why.
    let (status, settled) = post(
        &client,
        server.url("/v1/tools/deploy/calls?wait=10s"),
        &ops,
        json!({"session": "s-term", "callId": "c1", "input": {"service": "api"}}),
    )
    .await;
    assert_eq!(status, 200, "{settled}");
    assert_eq!(settled["settled"]["status"], "failed", "{settled}");
    assert_eq!(
        settled["settled"]["error"], "terminated by ops: stuck",
        "{settled}"
    );

    // Again: 409 not_live naming the status; nothing written.
    let (status, body) = post(&client, terminate(&run), &ops, json!({"reason": "again"})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("not_live")),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("failed"),
        "{body}"
    );
    assert_eq!(store.read_all(&run, 0).await.unwrap().len(), journal.len());

    // Unknown: 404.
    let (status, body) = post(
        &client,
        terminate(&RunId::new("run-none")),
        &ops,
        json!({"reason": "x"}),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );

    // A blocked run.
    let blocked = start(&store, "s-term", "c2", "broken", json!({"service": "api"})).await;
    until("the broken run to block", async || {
        store.get_run(&blocked).await.unwrap().status == RunStatus::Blocked
    })
    .await;
    let (status, body) = post(&client, terminate(&blocked), &ops, json!({"reason": "bug"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        store.get_run(&blocked).await.unwrap().status,
        RunStatus::Failed
    );

    // The runs API shows the outcome; /metrics counts each terminate.
    let resp = client
        .get(server.url("/v1/runs?session=s-term&limit=10"))
        .bearer_auth(&ops)
        .send()
        .await
        .unwrap();
    let page: Value = resp.json().await.unwrap();
    let kinds: Vec<&str> = page["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["outcome"]["kind"].as_str())
        .collect();
    assert_eq!(kinds, vec!["terminated", "terminated"], "{page}");
    let metrics = client
        .get(server.url("/metrics"))
        .bearer_auth(&ops)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        r#"eve_terminates_total{outcome="terminated",surface="http"} 2"#,
        r#"eve_terminates_total{outcome="not_live",surface="http"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    server.stop().await;
    let _: Arc<dyn JournalStore> = store;
}
