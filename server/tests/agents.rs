//! Subagent calls over HTTP (`ctx.agent` without an in-process AgentHost): `agent.requested`
//! on the channel, `GET /v1/agents` listing the call (and `GET /v1/requests` not), and
//! `POST /v1/agents/{id}/result`: 422 naming the schema path with nothing recorded, 400 for a
//! body that is neither form, 404 unknown, 200 once and a duplicate 200 for the same result,
//! 409 for another, 410 once the run ended; `agent.completed` and the run's output.

mod common;

use common::*;
use eve_core::Event;
use serde_json::{json, Value};

async fn get(server: &TestServer, path: &str) -> (u16, Value) {
    let resp = reqwest::get(server.url(path)).await.expect("GET");
    (
        resp.status().as_u16(),
        resp.json().await.expect("JSON body"),
    )
}

async fn post(server: &TestServer, path: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(server.url(path))
        .json(&body)
        .send()
        .await
        .expect("POST");
    (
        resp.status().as_u16(),
        resp.json().await.expect("JSON body"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_calls_are_listed_and_completed_once_over_http() {
    let (_dir, store) = sqlite().await;
    let _worker = worker(store.clone()).await;
    let server =
        TestServer::start_with(store.clone(), |_| {}, |s| s.with_registry(registry())).await;
    let mut events = SseClient::connect(&server.url("/v1/sessions/s-agents/events"), None).await;
    let run = start(
        &store,
        "s-agents",
        "call-1",
        "delegate",
        json!({"topic": "tides"}),
    )
    .await;

    let asked = events.until("agent.requested").await.pop().unwrap().json();
    assert_eq!(asked["runId"], run.as_str());
    let data = &asked["event"]["data"];
    let id = data["requestId"].as_str().unwrap().to_owned();
    assert_eq!(data["agent"]["key"], "facts");
    assert_eq!(data["agent"]["target"], "researcher");
    assert_eq!(data["agent"]["message"], json!({"topic": "tides"}));
    assert!(data["agent"]["outputSchema"].is_object(), "{data}");

    let (status, page) = get(&server, "/v1/agents?session=s-agents").await;
    assert_eq!(status, 200, "{page}");
    let agents = page["agents"].as_array().unwrap();
    assert_eq!(agents.len(), 1, "{page}");
    assert_eq!(agents[0]["requestId"], id.as_str());
    assert_eq!(agents[0]["tool"], "delegate");
    assert_eq!(agents[0]["request"]["display"], "agent");
    assert_eq!(agents[0]["request"]["agent"]["key"], "facts");
    let (_, by_target) = get(&server, "/v1/agents?q=RESEARCHER").await;
    assert_eq!(by_target["agents"].as_array().unwrap().len(), 1);
    let (_, asks) = get(&server, "/v1/requests?session=s-agents").await;
    assert!(
        asks["requests"].as_array().unwrap().is_empty(),
        "questions only: {asks}"
    );
    let (status, _) = get(&server, "/v1/agents?limit=0").await;
    assert_eq!(status, 400);

    let result = format!("/v1/agents/{id}/result");
    // An output that does not match the schema: 422 naming where; nothing is recorded.
    let (status, err) = post(&server, &result, json!({"output": {"facts": [7]}})).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (422, Some("invalid_answer")),
        "{err}"
    );
    assert!(
        err["message"].as_str().unwrap().contains("/facts/0"),
        "{err}"
    );
    for body in [
        json!({}),
        json!({"output": [], "error": "x"}),
        json!({"text": "x"}),
        json!([1]),
    ] {
        let (status, err) = post(&server, &result, body.clone()).await;
        assert_eq!(status, 400, "{body}: {err}");
    }
    // An answer meant for a question is not a result.
    let (status, _) = post(
        &server,
        &format!("/v1/requests/{id}/answer"),
        json!({"optionId": "approve"}),
    )
    .await;
    assert_eq!(status, 422);
    let (status, _) = post(&server, "/v1/agents/nope:1/result", json!({"output": {}})).await;
    assert_eq!(status, 404);
    let answered = |events: &[eve_core::StoredEvent]| {
        count(events, |e| matches!(e, Event::InputAnswered { .. }))
    };
    assert_eq!(answered(&journal(&store, &run).await), 0);

    let output = json!({"output": {"facts": ["two a day"]}});
    let (status, first) = post(&server, &result, output.clone()).await;
    assert_eq!(
        (status, &first["duplicate"]),
        (200, &json!(false)),
        "{first}"
    );
    assert_eq!(first["runId"], run.as_str());
    let (status, again) = post(&server, &result, output.clone()).await;
    assert_eq!(
        (status, &again["duplicate"]),
        (200, &json!(true)),
        "{again}"
    );
    assert_eq!(again["seq"], first["seq"]);
    let (status, err) = post(&server, &result, json!({"error": "changed my mind"})).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (409, Some("already_answered")),
        "{err}"
    );

    let frames = events.until("tool.settled").await;
    assert!(
        frames
            .iter()
            .any(|f| f.event.as_deref() == Some("agent.completed")),
        "{frames:?}"
    );
    let settled = frames.last().unwrap().json();
    assert_eq!(
        settled["event"]["data"]["result"]["data"]["output"],
        json!({"facts": {"facts": ["two a day"]}})
    );
    assert_eq!(answered(&journal(&store, &run).await), 1);
    let (_, page) = get(&server, "/v1/agents?session=s-agents").await;
    assert!(page["agents"].as_array().unwrap().is_empty(), "{page}");

    // A call whose run is cancelled is withdrawn: 410.
    let run2 = start(
        &store,
        "s-agents",
        "call-2",
        "delegate",
        json!({"topic": "moon"}),
    )
    .await;
    let asked = events.until("agent.requested").await.pop().unwrap().json();
    let id2 = asked["event"]["data"]["requestId"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, _) = post(&server, &format!("/v1/runs/{run2}/cancel"), json!({})).await;
    assert_eq!(status, 202);
    events.until("tool.settled").await;
    let (status, err) = post(&server, &format!("/v1/agents/{id2}/result"), output).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (410, Some("withdrawn")),
        "{err}"
    );
    server.stop().await;
}
