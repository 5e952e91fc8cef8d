//! The start route's `traceparent` header: a well-formed one is kept with the run (its spans
//! join the caller's trace); a malformed one is ignored, never an error.

mod common;

use common::*;
use eve_core::Event;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traceparent_header_is_kept_and_a_bad_one_ignored() {
    let (_dir, store) = sqlite().await;
    let server =
        TestServer::start_with(store.clone(), |_| {}, |s| s.with_registry(registry())).await;
    let client = reqwest::Client::new();
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    for (call, header, kept) in [
        ("c1", Some(tp), Some(tp)),
        ("c2", Some("00-zz-not-a-trace-01"), None),
        ("c3", None, None),
    ] {
        let mut req = client
            .post(server.url("/v1/tools/deploy/calls"))
            .json(&json!({"session": "s", "callId": call, "input": {"service": "api"}}));
        if let Some(h) = header {
            req = req.header("traceparent", h);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 201, "{call}");
        let body: serde_json::Value = resp.json().await.unwrap();
        let run = eve_core::RunId::new(body["run"]["runId"].as_str().unwrap());
        let events = journal(&store, &run).await;
        let Event::RunStarted { traceparent, .. } = &events[0].event else {
            panic!("no RunStarted");
        };
        assert_eq!(traceparent.as_deref(), kept, "{call}");
    }
    server.stop().await;
}
