//! rmcp's own client against eve-mcp's streamable HTTP router on 127.0.0.1:0: tools, tasks,
//! blocking calls with elicitation and progress, concurrent answers, bad input.

mod common;

use common::*;
use eve_core::{Event, JournalStore, JournalStoreExt, RunId, RunQuery};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ErrorCode, GetTaskParams,
    RequestMetaObject, TaskStatus, UpdateTaskParams,
};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceError, ServiceExt};
use serde_json::json;
use std::sync::Arc;

struct Fixture {
    _dir: tempfile::TempDir,
    url: String,
    store: Arc<dyn JournalStore>,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let (mcp, store, worker) = server(&dir.path().join("eve.db")).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().nest_service("/mcp", eve_mcp::router(mcp));
    tokio::spawn(async move {
        let _worker = worker;
        axum::serve(listener, app).await.unwrap();
    });
    Fixture {
        _dir: dir,
        url: format!("http://{addr}/mcp"),
        store,
    }
}

async fn connect(f: &Fixture, client: TestClient) -> RunningService<RoleClient, TestClient> {
    client
        .serve(StreamableHttpClientTransport::from_uri(f.url.clone()))
        .await
        .expect("connect")
}

fn call(tool: &str, args: serde_json::Value) -> CallToolRequestParams {
    CallToolRequestParams::new(tool.to_owned()).with_arguments(args.as_object().unwrap().clone())
}

async fn start_task(
    c: &RunningService<RoleClient, TestClient>,
    p: CallToolRequestParams,
) -> String {
    match c.call_tool_once(p).await.expect("tools/call") {
        CallToolResponse::Task(t) => {
            assert!(t.task.poll_interval_ms.is_some());
            t.task.task_id
        }
        other => panic!("expected a task, got {other:?}"),
    }
}

fn rpc_error(r: Result<impl std::fmt::Debug, ServiceError>) -> rmcp::ErrorData {
    match r {
        Err(ServiceError::McpError(e)) => e,
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

async fn runs(store: &dyn JournalStore) -> usize {
    store.list_runs(&RunQuery::default()).await.unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_are_listed_from_the_registry() {
    let f = fixture().await;
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
    let f = fixture().await;
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
    let f = fixture().await;
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
    let f = fixture().await;
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
    let f = fixture().await;
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
    let f = fixture().await;
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
    let result = c.call_tool(params).await.unwrap();
    assert_eq!(result.structured_content, Some(json!({"reminder": "tea"})));
    assert_eq!(
        client.progress.lock().unwrap().clone(),
        vec![r#"{"status":"preparing reminder"}"#.to_owned()]
    );
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_call_key_does_not_start_a_second_run() {
    let f = fixture().await;
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
    let f = fixture().await;
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
    let f = fixture().await;
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
    let f = fixture().await;
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
    let f = fixture().await;
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
