//! `POST /v1/runs/{id}/retry` and `…/reset`: a live run refused with 409 `not_ended`, a bad
//! cut 400, an unknown run 404, an answer key 403; a terminated deploy retried over HTTP (201,
//! the new run's journal is the old prefix with its request id rewritten, `resetFrom` in the
//! run answer), answered and completed without its first step executing again; the same reset
//! again 200 with the same run; `eve_resets_total` counting each.

mod common;

use common::*;
use eve_core::{
    Event, InputResponse, JournalStore, JournalStoreExt, KeyScope, RequestId, RunId, RunStatus,
    SessionId, Timestamp,
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
async fn retry_and_reset_over_http() {
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
    let retry = |id: &RunId| server.url(&format!("/v1/runs/{id}/retry"));
    let reset = |id: &RunId| server.url(&format!("/v1/runs/{id}/reset"));

    // A deploy parked on its approval request: live, so refused.
    let run = start(&store, "s-reset", "c1", "deploy", json!({"service": "api"})).await;
    let session = SessionId::new("s-reset");
    until("the approval request", async || {
        !store.pending_requests(&session).await.unwrap().is_empty()
    })
    .await;
    assert_eq!(
        post(&client, retry(&run), &answerer, json!({})).await.0,
        403,
        "retry needs an operate key"
    );
    let (status, body) = post(&client, reset(&run), &ops, json!({"to": 1})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("not_ended")),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("terminate"),
        "{body}"
    );
    let (status, body) = post(&client, retry(&run), &ops, json!({})).await;
    assert_eq!((status, body["code"].as_str()), (409, Some("not_ended")));

    // Terminated: [RunStarted, plan_deploy, InputRequested, InputWithdrawn, RunTerminated].
    store
        .terminate(&run, "wrong region", "ops", Timestamp::now())
        .await
        .expect("terminate");
    let old = journal(&store, &run).await;
    assert_eq!(old.len(), 5, "{old:?}");
    let (status, body) = post(&client, reset(&run), &ops, json!({})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("malformed")),
        "{body}"
    );
    let (status, body) = post(&client, reset(&run), &ops, json!({"to": 4})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_input")),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("between 1"),
        "{body}"
    );

    // Retry: cut where the end begins (no step failed), the first step copied.
    let (status, body) = post(&client, retry(&run), &ops, json!({})).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["created"], true);
    assert_eq!(body["from"], json!({"run": run.as_str(), "seq": 3}));
    assert_eq!(body["copied"], 2);
    let new = RunId::new(body["run"]["runId"].as_str().expect("runId"));
    assert_eq!(body["run"]["callId"], "c1~reset-3", "{body}");
    let nj = journal(&store, &new).await;
    assert!(
        matches!(&nj[1].event, Event::StepCompleted { name, .. } if name == "plan_deploy"),
        "{nj:?}"
    );
    assert!(
        matches!(&nj[2].event, Event::InputRequested { request_id, .. }
            if request_id == &RequestId::for_command(&new, 1)),
        "{nj:?}"
    );
    // The run answer shows where it came from.
    let shown: Value = client
        .get(server.url(&format!("/v1/runs/{new}")))
        .bearer_auth(&ops)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        shown["events"][0]["event"]["RunStarted"]["resetFrom"],
        json!({"run": run.as_str(), "seq": 3}),
        "{shown}"
    );
    // Approved, it completes; plan_deploy recorded once (replayed, not executed again).
    store
        .answer(
            &RequestId::for_command(&new, 1),
            InputResponse::option("approve"),
            Timestamp::now(),
        )
        .await
        .expect("answer the new run's request");
    until("the new run to complete", async || {
        store.get_run(&new).await.unwrap().status == RunStatus::Completed
    })
    .await;
    let nj = journal(&store, &new).await;
    assert_eq!(
        count(
            &nj,
            |e| matches!(e, Event::StepCompleted { name, .. } if name == "plan_deploy")
        ),
        1
    );
    assert_eq!(store.get_run(&run).await.unwrap().status, RunStatus::Failed);
    assert_eq!(journal(&store, &run).await, old, "the old journal is kept");

    // The same cut again: 200, the same run, nothing written.
    let (status, body) = post(&client, reset(&run), &ops, json!({"to": 3})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["created"].as_bool(), body["run"]["runId"].as_str()),
        (Some(false), Some(new.as_str()))
    );

    // Unknown: 404.
    for (url, body) in [
        (reset(&RunId::new("run-none")), json!({"to": 1})),
        (retry(&RunId::new("run-none")), json!({})),
    ] {
        let (status, body) = post(&client, url, &ops, body).await;
        assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
    }

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
        r#"eve_resets_total{kind="retry",outcome="created",surface="http"} 1"#,
        r#"eve_resets_total{kind="retry",outcome="not_ended",surface="http"} 1"#,
        r#"eve_resets_total{kind="reset",outcome="not_ended",surface="http"} 1"#,
        r#"eve_resets_total{kind="reset",outcome="refused",surface="http"} 1"#,
        r#"eve_resets_total{kind="reset",outcome="repeated",surface="http"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    server.stop().await;
    let _: Arc<dyn JournalStore> = store;
}
