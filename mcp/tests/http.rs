//! rmcp's own client against eve-mcp's streamable HTTP router on 127.0.0.1:0: tools, tasks,
//! blocking calls with elicitation and progress, concurrent answers, bad input.

mod common;

use common::*;
use eve_core::{Event, JournalStore, JournalStoreExt, RunId, RunQuery};
use rmcp::model::{
    CancelTaskParams, ErrorCode, GetTaskParams, RequestMetaObject, TaskStatus, UpdateTaskParams,
};
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_are_listed_from_the_registry() {
    let f = http_fixture().await;
    let c = connect(&f, TestClient::default()).await;
    let tools = c.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    for n in [
        "deploy_approval",
        "remind",
        "remind_with_progress",
        "refund_order",
    ] {
        assert!(names.contains(&n), "{names:?}");
    }
    let deploy = tools.iter().find(|t| t.name == "deploy_approval").unwrap();
    assert!(deploy.description.as_deref().unwrap().contains("approve"));
    assert_eq!(
        deploy.input_schema["properties"]["service"]["type"],
        "string"
    );
    let meta = deploy.meta.as_ref().unwrap();
    assert_eq!(meta.0[eve_mcp::META_MAY_ASK], json!(true));
    assert_eq!(meta.0[eve_mcp::META_EXECUTION], json!("default"));
    assert!(deploy.output_schema.is_none(), "no output type declared");
    // mayWaitForInput is true only for tools that can wait: derived by #[workflow] from the
    // body's ctx.ask (deploy_approval), declared with waits_for_input() (survey); false for a
    // body that never asks (remind, weigh, nap).
    let may_ask = |name: &str| {
        tools
            .iter()
            .find(|t| t.name == name)
            .unwrap()
            .meta
            .as_ref()
            .unwrap()
            .0[eve_mcp::META_MAY_ASK]
            .clone()
    };
    for (name, waits) in [
        ("deploy_approval", true),
        ("survey", true),
        ("remind", false),
        ("weigh", false),
        ("nap", false),
    ] {
        assert_eq!(may_ask(name), json!(waits), "{name}");
    }
    // A tool that declares its output type lists it as outputSchema, and its result conforms.
    let weigh = tools.iter().find(|t| t.name == "weigh").unwrap();
    let out = weigh
        .output_schema
        .as_ref()
        .expect("weigh declares its output");
    assert_eq!(out["type"], "object");
    assert_eq!(out["properties"]["kilograms"]["type"], "number");
    let result = c
        .call_tool(call("weigh", json!({ "grams": 1500 })))
        .await
        .unwrap();
    assert_eq!(result.structured_content, Some(json!({ "kilograms": 1.5 })));
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_a_durable_task_answered_through_tasks_update() {
    let f = http_fixture().await;
    let c = connect(&f, TestClient::tasks()).await;
    let id = start_task(&c, call("deploy_approval", json!({"service": "api"}))).await;
    assert!(id.starts_with("run_"), "the task id is the run id: {id}");
    let parked = wait_status(c.peer(), &id, TaskStatus::InputRequired).await;
    let (key, request) = only_request(&parked);
    assert_approval_form(&request);
    c.update_task(UpdateTaskParams::new(id.clone(), choose(&key, "approve")))
        .await
        .unwrap();
    // The same answer again is a retry: accepted, nothing new written.
    c.update_task(UpdateTaskParams::new(id.clone(), choose(&key, "approve")))
        .await
        .unwrap();
    let done = wait_status(c.peer(), &id, TaskStatus::Completed).await;
    assert_eq!(
        completed_output(&done),
        json!({"deployed": true, "url": "https://deploy.example/api/1"})
    );
    // Answering again after the end: withdrawn.
    let e = rpc_error(
        c.update_task(UpdateTaskParams::new(id.clone(), choose(&key, "cancel")))
            .await,
    );
    assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
    assert!(
        e.data.as_ref().unwrap()["code"] == "withdrawn"
            || e.data.as_ref().unwrap()["code"] == "already_answered",
        "{e:?}"
    );
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_task_reports_progress_in_status_message() {
    let f = http_fixture().await;
    let c = connect(&f, TestClient::tasks()).await;
    let id = start_task(
        &c,
        call(
            "remind_with_progress",
            json!({"note": "tea", "delay": "2s"}),
        ),
    )
    .await;
    let start = std::time::Instant::now();
    loop {
        let t = c.get_task(GetTaskParams::new(id.clone())).await.unwrap();
        if t.task.task.status_message.as_deref() == Some(r#"{"status":"preparing reminder"}"#) {
            assert_eq!(t.task.status(), TaskStatus::Working);
            break;
        }
        assert!(start.elapsed().as_secs() < 10, "no progress: {t:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let done = wait_status(c.peer(), &id, TaskStatus::Completed).await;
    assert_eq!(completed_output(&done), json!({"reminder": "tea"}));
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_ends_a_sleeping_task_cancelled_after_its_cleanup_step() {
    let f = http_fixture().await;
    let c = connect(&f, TestClient::tasks()).await;
    let id = start_task(&c, call("nap", json!({}))).await;
    // Parked on its sleep (the progress and the sleep are journaled together).
    let run = RunId::new(id.clone());
    let start = std::time::Instant::now();
    while c
        .get_task(GetTaskParams::new(id.clone()))
        .await
        .unwrap()
        .task
        .task
        .status_message
        .as_deref()
        != Some("napping")
    {
        assert!(start.elapsed().as_secs() < 10, "the nap never started");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    c.cancel_task(CancelTaskParams::new(id.clone()))
        .await
        .unwrap();
    wait_status(c.peer(), &id, TaskStatus::Cancelled).await;
    let journal = f.store.read_all(&run, 0).await.unwrap();
    assert!(
        journal.iter().any(|e| matches!(
            &e.event,
            Event::StepCompleted { name, .. } if name == "cleanup"
        )),
        "the cleanup step ran in the grace period: {journal:?}"
    );
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tasks_a_call_blocks_and_asks_through_elicitation() {
    let f = http_fixture().await;
    let client = TestClient::eliciting("approve");
    let c = connect(&f, client.clone()).await;
    let result = c
        .call_tool(call("deploy_approval", json!({"service": "api"})))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(false));
    assert_eq!(
        result.structured_content,
        Some(json!({"deployed": true, "url": "https://deploy.example/api/1"}))
    );
    let asked = client.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_approval_form(&json!({"method": "elicitation/create", "params": asked[0]}));
    // Exactly one answer was stored.
    let run = f
        .store
        .list_runs(&RunQuery::default())
        .await
        .unwrap()
        .remove(0);
    assert_eq!(answers(&*f.store, &run.run_id).await, 1);
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tasks_progress_goes_out_as_notifications() {
    let f = http_fixture().await;
    let client = TestClient::default();
    let c = connect(&f, client.clone()).await;
    let mut params = call(
        "remind_with_progress",
        json!({"note": "tea", "delay": "1s"}),
    );
    let mut meta = RequestMetaObject::new();
    meta.set_progress_token(rmcp::model::ProgressToken(
        rmcp::model::NumberOrString::Number(7),
    ));
    params.meta = Some(meta);
    // A background tool: the call answers its receipt at once; progress and the end follow
    // as notifications.
    let result = c.call_tool(params).await.unwrap();
    let receipt = result.structured_content.unwrap();
    assert_eq!(receipt["status"], "working", "{receipt}");
    eventually("the task's end pushed", || {
        client
            .logs
            .lock()
            .unwrap()
            .iter()
            .any(|d| d["kind"] == "task.completed" && d["taskId"] == receipt["taskId"])
    })
    .await;
    assert_eq!(
        client.progress.lock().unwrap().clone(),
        vec![r#"{"status":"preparing reminder"}"#.to_owned()]
    );
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_call_key_does_not_start_a_second_run() {
    let f = http_fixture().await;
    let keyed = |args: serde_json::Value| {
        let mut p = call("deploy_approval", args);
        let mut meta = RequestMetaObject::new();
        meta.insert(eve_mcp::META_CALL_KEY.into(), json!("call-1"));
        p.meta = Some(meta);
        p
    };
    let c = connect(&f, TestClient::tasks()).await;
    let first = start_task(&c, keyed(json!({"service": "api"}))).await;
    // Another connection, same key: the same run.
    let c2 = connect(&f, TestClient::tasks()).await;
    let second = start_task(&c2, keyed(json!({"service": "api"}))).await;
    assert_eq!(first, second);
    assert_eq!(runs(&*f.store).await, 1);
    // The same key with other arguments is refused.
    let e = rpc_error(c2.call_tool_once(keyed(json!({"service": "web"}))).await);
    assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
    assert_eq!(runs(&*f.store).await, 1);
    c.cancel().await.unwrap();
    c2.cancel().await.unwrap();
}

async fn answers(store: &dyn JournalStore, run: &RunId) -> usize {
    store
        .read_all(run, 0)
        .await
        .unwrap()
        .iter()
        .filter(|e| matches!(e.event, Event::InputAnswered { .. }))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_answering_at_once_record_one_answer() {
    let f = http_fixture().await;
    let a = connect(&f, TestClient::tasks()).await;
    let b = connect(&f, TestClient::tasks()).await;
    let id = start_task(&a, call("deploy_approval", json!({"service": "api"}))).await;
    let parked = wait_status(a.peer(), &id, TaskStatus::InputRequired).await;
    let (key, _) = only_request(&parked);
    let (ra, rb) = tokio::join!(
        a.update_task(UpdateTaskParams::new(id.clone(), choose(&key, "approve"))),
        b.update_task(UpdateTaskParams::new(id.clone(), choose(&key, "cancel"))),
    );
    let (won, lost) = match (&ra, &rb) {
        (Ok(()), Err(_)) => ("approve", rb),
        (Err(_), Ok(())) => ("cancel", ra),
        other => panic!("exactly one answer must win: {other:?}"),
    };
    let e = rpc_error(lost);
    assert_eq!(e.data.unwrap()["code"], "already_answered");
    let done = wait_status(a.peer(), &id, TaskStatus::Completed).await;
    assert_eq!(completed_output(&done)["deployed"], json!(won == "approve"));
    assert_eq!(answers(&*f.store, &RunId::new(id)).await, 1);
    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_json_rpc_error_and_changes_nothing() {
    let f = http_fixture().await;
    let c = connect(&f, TestClient::tasks()).await;
    let invalid = |e: rmcp::ErrorData, code: &str, says: &str| {
        assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{e:?}");
        assert_eq!(e.data.as_ref().unwrap()["code"], code, "{e:?}");
        assert!(
            e.message.contains(says),
            "{:?} should say {says:?}",
            e.message
        );
    };
    invalid(
        rpc_error(c.call_tool_once(call("no_such_tool", json!({}))).await),
        "not_found",
        "unknown tool \"no_such_tool\"",
    );
    invalid(
        rpc_error(
            c.call_tool_once(call("deploy_approval", json!({"service": 5})))
                .await,
        ),
        "invalid_input",
        "invalid input for tool \"deploy_approval\"",
    );
    let big = "x".repeat(1024 * 1024 + 1);
    invalid(
        rpc_error(
            c.call_tool_once(call("deploy_approval", json!({"service": big})))
                .await,
        ),
        "too_large",
        "the limit is 1048576",
    );
    assert_eq!(runs(&*f.store).await, 0, "no run was created");
    invalid(
        rpc_error(c.get_task(GetTaskParams::new("run_doesnotexist")).await),
        "not_found",
        "unknown task",
    );
    invalid(
        rpc_error(c.get_task(GetTaskParams::new("../etc passwd")).await),
        "malformed",
        "malformed taskId",
    );
    invalid(
        rpc_error(c.cancel_task(CancelTaskParams::new("")).await),
        "malformed",
        "malformed taskId",
    );
    // An option not offered, and a key that is not one of the task's requests.
    let id = start_task(&c, call("deploy_approval", json!({"service": "api"}))).await;
    let parked = wait_status(c.peer(), &id, TaskStatus::InputRequired).await;
    let (key, _) = only_request(&parked);
    invalid(
        rpc_error(
            c.update_task(UpdateTaskParams::new(id.clone(), choose(&key, "maybe")))
                .await,
        ),
        "invalid_answer",
        "maybe",
    );
    invalid(
        rpc_error(
            c.update_task(UpdateTaskParams::new(
                id.clone(),
                choose("req_other", "approve"),
            ))
            .await,
        ),
        "not_found",
        "is not an input request of task",
    );
    assert_eq!(answers(&*f.store, &RunId::new(id.clone())).await, 0);
    wait_status(c.peer(), &id, TaskStatus::InputRequired).await;
    // A method eve does not serve.
    let e = rpc_error(c.list_prompts(None).await);
    assert_eq!(e.code, ErrorCode::METHOD_NOT_FOUND, "{e:?}");
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_client_answers_an_input_required_result_and_retries_the_same_run() {
    use rmcp::model::ProtocolVersion;
    use rmcp::service::{serve_client_with_lifecycle, ClientLifecycleMode};
    let f = http_fixture().await;
    let client = TestClient::eliciting("approve");
    let c = serve_client_with_lifecycle(
        client.clone(),
        StreamableHttpClientTransport::from_uri(f.url.clone()),
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    )
    .await
    .expect("connect with server/discover");
    // rmcp's call_tool fulfils input_required rounds through the client's elicitation handler
    // and retries with the echoed requestState (the run id).
    let result = c
        .call_tool(call("deploy_approval", json!({"service": "api"})))
        .await
        .unwrap();
    assert_eq!(
        result.structured_content,
        Some(json!({"deployed": true, "url": "https://deploy.example/api/1"}))
    );
    assert_eq!(client.asked.lock().unwrap().len(), 1);
    assert_eq!(runs(&*f.store).await, 1, "the retry continued the same run");
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_session_is_an_eve_session() {
    let f = http_fixture().await;
    let c = connect(&f, TestClient::tasks()).await;
    let a = start_task(&c, call("remind", json!({"note": "a", "delay": "1h"}))).await;
    let b = start_task(&c, call("remind", json!({"note": "b", "delay": "1h"}))).await;
    let other = connect(&f, TestClient::tasks()).await;
    let o = start_task(&other, call("remind", json!({"note": "o", "delay": "1h"}))).await;
    let session = |id: &str| {
        let store = f.store.clone();
        let id = RunId::new(id);
        async move { store.get_run(&id).await.unwrap().session_id }
    };
    let (sa, sb, so) = (session(&a).await, session(&b).await, session(&o).await);
    assert!(sa.as_str().starts_with("mcp_"), "{sa}");
    assert_eq!(sa, sb, "one MCP session, one eve session");
    assert_ne!(sa, so, "another MCP session, another eve session");
    c.cancel().await.unwrap();
    other.cancel().await.unwrap();
}

/// The input request keys of an `input_required` task.
fn request_keys(task: &rmcp::model::GetTaskResult) -> Vec<String> {
    match &task.task.payload {
        rmcp::model::TaskPayload::InputRequired { input_requests } => {
            input_requests.keys().cloned().collect()
        }
        other => panic!("not input_required: {other:?}"),
    }
}

fn responses(entries: &[(&str, serde_json::Value)]) -> rmcp::model::InputResponses {
    entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_with_one_bad_answer_writes_none() {
    let f = http_fixture().await;
    let c = connect(&f, TestClient::tasks()).await;
    let id = start_task(&c, call("survey", json!({}))).await;
    let run = RunId::new(id.clone());
    let start = std::time::Instant::now();
    let keys = loop {
        let t = wait_status(c.peer(), &id, TaskStatus::InputRequired).await;
        let keys = request_keys(&t);
        if keys.len() == 2 {
            break keys;
        }
        assert!(start.elapsed().as_secs() < 10, "never two requests: {t:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let yes = json!({ "action": "accept", "content": { "option": "yes" } });
    let no = json!({ "action": "accept", "content": { "option": "no" } });
    for (bad, code) in [
        // An option not offered, after a good answer (in key order or not).
        (
            json!({ "action": "accept", "content": { "option": "maybe" } }),
            "invalid_answer",
        ),
        // Not an elicitation result.
        (json!({ "action": "shrug" }), "invalid_answer"),
    ] {
        let e = rpc_error(
            c.update_task(UpdateTaskParams::new(
                id.clone(),
                responses(&[(&keys[0], yes.clone()), (&keys[1], bad)]),
            ))
            .await,
        );
        assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{e:?}");
        assert_eq!(e.data.as_ref().unwrap()["code"], code, "{e:?}");
    }
    // A key that is not one of the task's requests, beside a good answer.
    let e = rpc_error(
        c.update_task(UpdateTaskParams::new(
            id.clone(),
            responses(&[(&keys[0], yes.clone()), ("zzz_not_a_request", yes.clone())]),
        ))
        .await,
    );
    assert_eq!(e.data.unwrap()["code"], "not_found");
    // Nothing was written: both requests are still pending.
    assert_eq!(answers(&*f.store, &run).await, 0);
    let t = wait_status(c.peer(), &id, TaskStatus::InputRequired).await;
    assert_eq!(request_keys(&t).len(), 2);
    // The whole update, right, completes the task.
    c.update_task(UpdateTaskParams::new(
        id.clone(),
        responses(&[(&keys[0], yes), (&keys[1], no)]),
    ))
    .await
    .unwrap();
    let done = wait_status(c.peer(), &id, TaskStatus::Completed).await;
    let out = completed_output(&done);
    let mut got: Vec<&str> = out
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    got.sort_unstable();
    assert_eq!(got, ["no", "yes"]);
    assert_eq!(answers(&*f.store, &run).await, 2);
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_other_arguments_is_refused() {
    let f = http_fixture().await;
    let c = connect(&f, TestClient::tasks()).await;
    let id = start_task(&c, call("deploy_approval", json!({"service": "api"}))).await;
    let parked = wait_status(c.peer(), &id, TaskStatus::InputRequired).await;
    let (key, _) = only_request(&parked);
    let retry = |service: &str| {
        let mut p = call("deploy_approval", json!({ "service": service }));
        p.request_state = Some(id.clone());
        p.input_responses = Some(choose(&key, "approve"));
        p
    };
    let e = rpc_error(c.call_tool_once(retry("web")).await);
    assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{e:?}");
    assert!(e.message.contains("arguments differ"), "{e:?}");
    assert_eq!(answers(&*f.store, &RunId::new(id.clone())).await, 0);
    assert_eq!(runs(&*f.store).await, 1);
    wait_status(c.peer(), &id, TaskStatus::InputRequired).await;
    // The same arguments: the retry answers and continues the same run.
    c.call_tool_once(retry("api")).await.unwrap();
    let done = wait_status(c.peer(), &id, TaskStatus::Completed).await;
    assert_eq!(completed_output(&done)["deployed"], json!(true));
    assert_eq!(runs(&*f.store).await, 1);
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_finished_task_is_acknowledged_and_changes_nothing() {
    let f = http_fixture().await;
    let c = connect(&f, TestClient::tasks()).await;
    let id = start_task(&c, call("weigh", json!({ "grams": 10 }))).await;
    wait_status(c.peer(), &id, TaskStatus::Completed).await;
    let run = RunId::new(id.clone());
    let before = f.store.read_all(&run, 0).await.unwrap().len();
    // SEP-2663: tasks/cancel is acknowledged with an empty result; a terminal task stays as it is.
    c.cancel_task(CancelTaskParams::new(id.clone()))
        .await
        .unwrap();
    assert_eq!(f.store.read_all(&run, 0).await.unwrap().len(), before);
    let after = c.get_task(GetTaskParams::new(id.clone())).await.unwrap();
    assert_eq!(after.task.status(), TaskStatus::Completed);
    assert_eq!(completed_output(&after), json!({ "kilograms": 0.01 }));
    c.cancel().await.unwrap();
}

/// POSTs `body` to the MCP endpoint as a client would; the status and the JSON body.
async fn post_raw(url: &str, body: impl Into<reqwest::Body>) -> (u16, serde_json::Value) {
    let r = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {status} {text}"));
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_json_rpc_errors_over_http_tell_the_truth() {
    let f = http_fixture().await;
    let error = |body: &serde_json::Value| {
        assert!(
            body.as_object().unwrap().contains_key("id"),
            "the id is always present: {body}"
        );
        (body["id"].clone(), body["error"]["code"].clone())
    };
    let (status, body) = post_raw(&f.url, "{not json").await;
    assert_eq!(
        (status, error(&body)),
        (400, (json!(null), json!(-32700))),
        "{body}"
    );
    for invalid in [
        "[]".to_owned(),
        r#"{"jsonrpc":"1.0","id":1,"method":"tools/list"}"#.to_owned(),
        format!(
            r#"{{"jsonrpc":"2.0","id":"{}","method":"ping"}}"#,
            "i".repeat(300)
        ),
        format!("{}{}", "[".repeat(300), "]".repeat(300)),
        // A notification that does not parse (found by fuzz_messages: rmcp answered 415 text).
        r#"{"jsonrpc":"2.0","method":"ping","params":["x"]}"#.to_owned(),
    ] {
        let (status, body) = post_raw(&f.url, invalid.clone()).await;
        assert_eq!(
            (status, error(&body)),
            (400, (json!(null), json!(-32600))),
            "{body}"
        );
    }
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"weigh","arguments":{{"x":"{}"}}}}}}"#,
        "x".repeat(4 * 1024 * 1024)
    );
    let (status, body) = post_raw(&f.url, huge).await;
    assert_eq!(
        (status, error(&body)),
        (413, (json!(null), json!(-32600))),
        "{body}"
    );
    for (params, method, field) in malformed_params() {
        let msg = json!({ "jsonrpc": "2.0", "id": 7, "method": method, "params": params });
        let (status, body) = post_raw(&f.url, msg.to_string()).await;
        assert_eq!(
            (status, error(&body)),
            (200, (json!(7), json!(-32602))),
            "{body}"
        );
        assert_eq!(body["error"]["data"]["field"], field, "{body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(field),
            "{body}"
        );
    }
    // DELETE of a session answers 204 (not 202).
    let init = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "raw", "version": "0" } },
    });
    let http = reqwest::Client::new();
    let r = http
        .post(&f.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(init.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let session = r.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    drop(r);
    let r = http
        .delete(&f.url)
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    // The server still serves, and nothing was started.
    let c = connect(&f, TestClient::default()).await;
    assert!(!c.list_all_tools().await.unwrap().is_empty());
    assert_eq!(runs(&*f.store).await, 0);
    c.cancel().await.unwrap();
}
