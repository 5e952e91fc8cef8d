//! `ctx.agent` through an MCP host: rmcp's client over streamable HTTP serves a workflow's
//! subagent call as `sampling/createMessage` (a blocking call; a 2026-07-28 `input_required`
//! round) or answers it with `tasks/update` (task mode). The reply is checked against the call's
//! output schema and recorded once; a client without `sampling`, a client that errors, a
//! mismatching output and an answer meant for another task each get a clear error and change
//! nothing.

mod common;

use common::*;
use eve_core::{
    AgentReply, Event, InputResponse, JournalStore, JournalStoreExt, RequestId, RunId, RunQuery,
    RunStatus,
};
use rmcp::model::{
    CallToolRequestParams, ErrorCode, RequestMetaObject, TaskStatus, UpdateTaskParams,
};
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A call of `delegate` about `topic`, keyed `key` when given.
fn delegate(topic: &str, key: Option<&str>) -> CallToolRequestParams {
    let mut p = CallToolRequestParams::new("delegate")
        .with_arguments(json!({ "topic": topic }).as_object().unwrap().clone());
    if let Some(k) = key {
        let mut meta = RequestMetaObject::new();
        meta.insert(eve_mcp::META_CALL_KEY.into(), json!(k));
        p.meta = Some(meta);
    }
    p
}

/// The agent replies recorded in `run`'s journal, in order.
async fn replies(store: &dyn JournalStore, run: &RunId) -> Vec<AgentReply> {
    store
        .read_all(run, 0)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.event {
            Event::InputAnswered { response, .. } => response.agent,
            _ => None,
        })
        .collect()
}

/// The only run in the store.
async fn only_run(store: &dyn JournalStore) -> eve_core::RunRecord {
    let mut runs = store.list_runs(&RunQuery::default()).await.unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs.remove(0)
}

/// Waits until `run`'s journal has a pending subagent call and returns its request id.
async fn pending_agent_call(store: &dyn JournalStore, run: &RunId) -> RequestId {
    let start = Instant::now();
    loop {
        let events = store.read_all(run, 0).await.unwrap();
        let asked = events.iter().find_map(|e| match &e.event {
            Event::InputRequested {
                request_id,
                request,
                ..
            } if request.agent.is_some() => Some(request_id.clone()),
            _ => None,
        });
        if let Some(id) = asked {
            return id;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no agent call in {run}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Checks the `sampling/createMessage` params of `delegate`'s call (topic `topic`).
fn assert_sampling_params(params: &Value, run: &str, topic: &str) {
    let meta = &params["_meta"];
    assert_eq!(meta[eve_mcp::META_RUN], run, "{params}");
    assert_eq!(meta[eve_mcp::META_AGENT_KEY], "review", "{params}");
    assert_eq!(meta[eve_mcp::META_TARGET], "security-reviewer", "{params}");
    assert_eq!(
        meta[eve_mcp::META_MESSAGE],
        json!({ "topic": topic }),
        "{params}"
    );
    assert_eq!(
        meta[eve_mcp::META_OUTPUT_SCHEMA],
        verdict_schema(),
        "{params}"
    );
    assert!(meta[eve_mcp::META_REQUEST]
        .as_str()
        .is_some_and(|r| !r.is_empty()));
    assert!(meta.get(eve_mcp::META_AGENT_ID).is_none(), "{params}");
    assert_eq!(params["messages"][0]["role"], "user");
    assert!(params["messages"][0]["content"]["text"]
        .as_str()
        .unwrap()
        .contains(topic));
    assert!(params["systemPrompt"]
        .as_str()
        .unwrap()
        .contains("security-reviewer"));
    assert_eq!(params["maxTokens"], 4096);
}

/// A sampling result whose text is `text`.
fn sampled(text: &str) -> Value {
    json!({ "role": "assistant", "model": "m", "content": { "type": "text", "text": text } })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_call_serves_its_subagent_through_sampling() {
    let f = http_fixture().await;
    let client = TestClient::sampling(r#"{"verdict": "pass", "notes": "no secrets"}"#);
    let c = connect(&f, client.clone()).await;
    let result = c.call_tool(delegate("the login form", None)).await.unwrap();
    assert_eq!(result.is_error, Some(false), "{result:?}");
    assert_eq!(
        result.structured_content,
        Some(json!({ "review": { "verdict": "pass", "notes": "no secrets" } }))
    );
    let run = only_run(&*f.store).await;
    let sampled = client.sampled.lock().unwrap().clone();
    assert_eq!(sampled.len(), 1, "{sampled:?}");
    assert_sampling_params(&sampled[0], run.run_id.as_str(), "the login form");
    assert_eq!(
        replies(&*f.store, &run.run_id).await,
        [AgentReply::Output(
            json!({ "verdict": "pass", "notes": "no secrets" })
        )]
    );
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampled_output_that_misses_the_schema_is_reported_and_nothing_is_recorded() {
    let f = http_fixture().await;
    let bad = connect(&f, TestClient::sampling(r#"{"verdict": "maybe"}"#)).await;
    let e = rpc_error(bad.call_tool(delegate("tls", Some("review-tls"))).await);
    assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{e:?}");
    let data = e.data.clone().unwrap();
    assert_eq!(data["code"], "invalid_answer", "{e:?}");
    assert!(e.message.contains("outputSchema"), "{}", e.message);
    assert!(e.message.contains("stays pending"), "{}", e.message);
    let run = only_run(&*f.store).await;
    assert_eq!(data["taskId"], run.run_id.as_str());
    assert!(replies(&*f.store, &run.run_id).await.is_empty());
    // Text that is not JSON where the call has a schema: the same.
    let prose = connect(&f, TestClient::sampling("Looks fine to me.")).await;
    let e = rpc_error(prose.call_tool(delegate("tls", Some("review-tls"))).await);
    assert_eq!(e.data.unwrap()["code"], "invalid_answer");
    assert!(e.message.contains("not JSON"), "{}", e.message);
    assert!(replies(&*f.store, &run.run_id).await.is_empty());
    assert!(!f
        .store
        .get_run(&run.run_id)
        .await
        .unwrap()
        .status
        .is_terminal());
    // The same identity again, from a client whose output fits: the same run completes.
    let good = connect(
        &f,
        TestClient::sampling(
            r#"```json
{"verdict": "fail"}
```"#,
        ),
    )
    .await;
    let result = good
        .call_tool(delegate("tls", Some("review-tls")))
        .await
        .unwrap();
    assert_eq!(
        result.structured_content,
        Some(json!({ "review": { "verdict": "fail" } }))
    );
    assert_eq!(only_run(&*f.store).await.run_id, run.run_id);
    assert_eq!(replies(&*f.store, &run.run_id).await.len(), 1);
    for c in [bad, prose, good] {
        c.cancel().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_sampling_is_told_and_the_call_stays_answerable() {
    let f = http_fixture().await;
    let c = connect(&f, TestClient::eliciting("approve")).await;
    let e = rpc_error(c.call_tool(delegate("cookies", None)).await);
    assert_eq!(e.code, ErrorCode::INVALID_REQUEST, "{e:?}");
    assert!(e.message.contains("`sampling` capability"), "{}", e.message);
    let data = e.data.unwrap();
    assert_eq!(
        (data["code"].clone(), data["capability"].clone()),
        (json!("missing_capability"), json!("sampling"))
    );
    let run = only_run(&*f.store).await;
    assert_eq!(data["taskId"], run.run_id.as_str());
    // Not failed: the call waits, and is answered through the store's answer path (what the
    // HTTP API's POST /v1/agents/{id}/result calls).
    let request = pending_agent_call(&*f.store, &run.run_id).await;
    assert_eq!(data["requestId"], request.as_str());
    let status = f.store.get_run(&run.run_id).await.unwrap().status;
    assert!(!status.is_terminal(), "{status:?}");
    let reply = InputResponse {
        agent: Some(AgentReply::Output(json!({ "verdict": "pass" }))),
        ..InputResponse::default()
    };
    f.store
        .answer(&request, reply, eve_core::Timestamp::now())
        .await
        .unwrap();
    let done = wait_run(&*f.store, &run.run_id).await;
    assert_eq!(done, RunStatus::Completed);
    assert_eq!(replies(&*f.store, &run.run_id).await.len(), 1);
    c.cancel().await.unwrap();
}

/// Waits until `run` ends and returns its status.
async fn wait_run(store: &dyn JournalStore, run: &RunId) -> RunStatus {
    let start = Instant::now();
    loop {
        let status = store.get_run(run).await.unwrap().status;
        if status.is_terminal() {
            return status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{run} never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_answers_sampling_with_an_error_records_nothing() {
    let f = http_fixture().await;
    let client = TestClient {
        sample: Some(Err("the user rejected the sampling request".into())),
        ..TestClient::default()
    };
    let c = connect(&f, client).await;
    let e = rpc_error(c.call_tool(delegate("keys", None)).await);
    let data = e.data.clone().unwrap();
    assert_eq!(data["code"], "sampling_failed", "{e:?}");
    assert!(
        e.message.contains("the user rejected the sampling request")
            && e.message.contains("stays pending"),
        "{}",
        e.message
    );
    let run = only_run(&*f.store).await;
    assert!(replies(&*f.store, &run.run_id).await.is_empty());
    assert!(!f
        .store
        .get_run(&run.run_id)
        .await
        .unwrap()
        .status
        .is_terminal());
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_task_mode_a_subagent_call_is_a_sampling_input_request_answered_by_tasks_update() {
    let f = http_fixture().await;
    let c = connect(&f, TestClient::tasks()).await;
    let id = start_task(&c, delegate("uploads", None)).await;
    let parked = wait_status(c.peer(), &id, TaskStatus::InputRequired).await;
    let (key, request) = only_request(&parked);
    assert_eq!(request["method"], "sampling/createMessage", "{request}");
    assert_sampling_params(&request["params"], &id, "uploads");
    assert_eq!(
        request["params"]["_meta"][eve_mcp::META_REQUEST],
        key.as_str()
    );
    let update = |result: Value| {
        UpdateTaskParams::new(id.clone(), [(key.clone(), result)].into_iter().collect())
    };
    let run = RunId::new(id.as_str());
    // Each bad answer is refused with the HTTP API's code, and writes nothing.
    for (bad, code, says) in [
        (
            sampled(r#"{"verdict": 3}"#),
            "invalid_answer",
            "outputSchema",
        ),
        (sampled("fine"), "invalid_answer", "not JSON"),
        (
            json!({ "action": "accept", "content": { "option": "approve" } }),
            "invalid_answer",
            "content",
        ),
        (
            json!({ "role": "user", "content": { "type": "text", "text": "{}" } }),
            "invalid_answer",
            "assistant",
        ),
    ] {
        let e = rpc_error(c.update_task(update(bad.clone())).await);
        assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{bad}: {e:?}");
        assert_eq!(e.data.unwrap()["code"], code, "{bad}");
        assert!(e.message.contains(says), "{bad}: {}", e.message);
        assert!(replies(&*f.store, &run).await.is_empty());
    }
    c.update_task(update(sampled(r#"{"verdict": "pass"}"#)))
        .await
        .unwrap();
    let done = wait_status(c.peer(), &id, TaskStatus::Completed).await;
    assert_eq!(
        completed_output(&done),
        json!({ "review": { "verdict": "pass" } })
    );
    // The same answer again is a retry (nothing written); another answer is refused.
    c.update_task(update(sampled(r#"{"verdict": "pass"}"#)))
        .await
        .unwrap();
    let e = rpc_error(
        c.update_task(update(sampled(r#"{"verdict": "fail"}"#)))
            .await,
    );
    assert_eq!(e.data.unwrap()["code"], "already_answered");
    assert_eq!(
        replies(&*f.store, &run).await,
        [AgentReply::Output(json!({ "verdict": "pass" }))]
    );
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_failure_is_recorded_as_the_calls_error() {
    let f = http_fixture().await;
    let c = connect(&f, TestClient::tasks()).await;
    let id = start_task(&c, delegate("dns", None)).await;
    let parked = wait_status(c.peer(), &id, TaskStatus::InputRequired).await;
    let (key, _) = only_request(&parked);
    let mut failed = sampled("");
    failed["_meta"] = json!({ eve_mcp::META_AGENT_ERROR: "the reviewer timed out" });
    c.update_task(UpdateTaskParams::new(
        id.clone(),
        [(key, failed)].into_iter().collect(),
    ))
    .await
    .unwrap();
    let done = wait_status(c.peer(), &id, TaskStatus::Completed).await;
    assert_eq!(
        completed_output(&done),
        json!({ "failed": "the reviewer timed out" })
    );
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampling_answer_for_another_task_is_refused_and_changes_nothing() {
    let f = http_fixture().await;
    let c = connect(&f, TestClient::tasks()).await;
    let a = start_task(&c, delegate("a", None)).await;
    let b = start_task(&c, delegate("b", None)).await;
    let (key_a, _) = only_request(&wait_status(c.peer(), &a, TaskStatus::InputRequired).await);
    let (key_b, _) = only_request(&wait_status(c.peer(), &b, TaskStatus::InputRequired).await);
    assert_ne!(key_a, key_b);
    // B's request answered through task A.
    let e = rpc_error(
        c.update_task(UpdateTaskParams::new(
            a.clone(),
            [(key_b.clone(), sampled(r#"{"verdict": "pass"}"#))]
                .into_iter()
                .collect(),
        ))
        .await,
    );
    assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
    assert_eq!(e.data.unwrap()["code"], "not_found");
    assert!(e.message.contains(&a), "{}", e.message);
    for id in [&a, &b] {
        assert!(replies(&*f.store, &RunId::new(id.as_str()))
            .await
            .is_empty());
        wait_status(c.peer(), id, TaskStatus::InputRequired).await;
    }
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_client_serves_the_subagent_in_an_input_required_round() {
    use rmcp::model::ProtocolVersion;
    use rmcp::service::{serve_client_with_lifecycle, ClientLifecycleMode};
    let f = http_fixture().await;
    let client = TestClient::sampling(r#"{"verdict": "pass"}"#);
    let c = serve_client_with_lifecycle(
        client.clone(),
        StreamableHttpClientTransport::from_uri(f.url.clone()),
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    )
    .await
    .expect("connect with server/discover");
    // rmcp's call_tool fulfils the input_required round through the client's sampling handler
    // and retries with the echoed requestState (the run id).
    let result = c.call_tool(delegate("csrf", None)).await.unwrap();
    assert_eq!(
        result.structured_content,
        Some(json!({ "review": { "verdict": "pass" } }))
    );
    let run = only_run(&*f.store).await;
    assert_eq!(client.sampled.lock().unwrap().len(), 1);
    assert_eq!(replies(&*f.store, &run.run_id).await.len(), 1);
    c.cancel().await.unwrap();
}
