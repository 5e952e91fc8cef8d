//! The person at the agent host stays in control (streamable HTTP and an in-process stdio-like
//! transport, rmcp's client): decline and cancel answer what the person chose, the host's stop
//! cancels the run, the end of a session ends eve's, a host that cannot be asked is told where
//! to answer, and what happens is pushed.

mod common;

use common::*;
use eve_core::{Event, JournalStore, JournalStoreExt, RunId, SessionId};
use rmcp::model::{
    ElicitationAction, NumberOrString, ProgressToken, RequestMetaObject, TaskStatus,
    UpdateTaskParams,
};
use rmcp::ServiceExt;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn journal(store: &dyn JournalStore, run: &RunId) -> Vec<Event> {
    store
        .read_all(run, 0)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event)
        .collect()
}

async fn only_run(store: &dyn JournalStore, tool: &str) -> RunId {
    let runs = store
        .list_runs(&eve_core::RunQuery::default())
        .await
        .unwrap();
    let mine: Vec<_> = runs.into_iter().filter(|r| r.tool == tool).collect();
    assert_eq!(mine.len(), 1, "{mine:?}");
    mine[0].run_id.clone()
}

/// Waits until a run of `tool` exists and returns its id.
async fn started(store: &dyn JournalStore, tool: &str) -> RunId {
    let start = Instant::now();
    loop {
        let runs = store
            .list_runs(&eve_core::RunQuery::default())
            .await
            .unwrap();
        if let Some(r) = runs.iter().find(|r| r.tool == tool) {
            return r.run_id.clone();
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no {tool} run");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The result of a blocking call spawned earlier, once it settles (panics after 20 s).
async fn settled(
    call: tokio::task::JoinHandle<Result<rmcp::model::CallToolResult, rmcp::ServiceError>>,
) -> rmcp::model::CallToolResult {
    tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("the call settles once answered")
        .unwrap()
        .unwrap()
}

/// Waits until `run` has a pending request and returns its id.
async fn pending(store: &dyn JournalStore, run: &RunId) -> eve_core::RequestId {
    let start = Instant::now();
    loop {
        let events = journal(store, run).await;
        let asked = events.iter().rev().find_map(|e| match e {
            Event::InputRequested { request_id, .. } => Some(request_id.clone()),
            _ => None,
        });
        if let Some(id) = asked {
            return id;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{run} never asked"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn with_progress(
    mut params: rmcp::model::CallToolRequestParams,
) -> rmcp::model::CallToolRequestParams {
    let mut meta = RequestMetaObject::new();
    meta.set_progress_token(ProgressToken(NumberOrString::Number(1)));
    params.meta = Some(meta);
    params
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decline_denies_an_approval_and_cancel_chooses_cancel() {
    let f = http_fixture().await;
    let declining = TestClient::refusing(ElicitationAction::Decline);
    let c = connect(&f, declining.clone()).await;
    let result = tokio::time::timeout(
        Duration::from_secs(20),
        c.call_tool(call("transfer", json!({"cents": 5}))),
    )
    .await
    .expect("a declined approval settles the call")
    .unwrap();
    assert_eq!(result.is_error, Some(true), "{result:?}");
    let meta = serde_json::to_value(&result.meta).unwrap();
    assert!(meta["eve/denied"]["reason"].is_string(), "{meta}");
    let run = only_run(&*f.store, "transfer").await;
    let events = journal(&*f.store, &run).await;
    assert!(
        events.iter().any(|e| matches!(e, Event::RunDenied { .. })),
        "{events:?}"
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::StepCompleted { .. })),
        "the body never ran: {events:?}"
    );
    c.cancel().await.unwrap();

    // A confirmation offering cancel: the person's cancel chooses it, and the call settles.
    let cancelling = TestClient::refusing(ElicitationAction::Cancel);
    let c = connect(&f, cancelling).await;
    let result = tokio::time::timeout(
        Duration::from_secs(20),
        c.call_tool(call("deploy_approval", json!({"service": "api"}))),
    )
    .await
    .expect("a cancelled confirmation settles the call")
    .unwrap();
    let run = only_run(&*f.store, "deploy_approval").await;
    let events = journal(&*f.store, &run).await;
    let answered: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::InputAnswered { response, .. } => response.option_id.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(answered, vec!["cancel".to_owned()], "{result:?}");
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decline_with_nothing_to_choose_keeps_waiting_and_says_where_to_answer() {
    let f = http_fixture().await;
    let client = TestClient::refusing(ElicitationAction::Decline);
    let c = Arc::new(connect(&f, client.clone()).await);
    let caller = c.clone();
    let call = tokio::spawn(async move {
        caller
            .call_tool(with_progress(call("explain", json!({}))))
            .await
    });
    let run = started(&*f.store, "explain").await;
    let request = pending(&*f.store, &run).await;
    // The host is told what the call waits for and where to answer it: as progress (the call
    // sent a token) and as a log message.
    eventually("a notice naming the request", || {
        client
            .progress
            .lock()
            .unwrap()
            .iter()
            .any(|m| m.contains(request.as_str()) && m.contains("eve answer"))
    })
    .await;
    eventually("a log message naming the request", || {
        client
            .logs
            .lock()
            .unwrap()
            .iter()
            .any(|d| d["requestId"] == request.as_str())
    })
    .await;
    assert!(!call.is_finished(), "the call keeps waiting");
    // Answered elsewhere (the page, `eve answer`): the call settles with that answer.
    f.store
        .answer(
            &request,
            eve_core::InputResponse {
                text: Some("the release train".into()),
                ..Default::default()
            },
            eve_core::Timestamp::now(),
        )
        .await
        .unwrap();
    let result = settled(call).await;
    let text = serde_json::to_value(&result.content).unwrap();
    assert!(
        text.as_array()
            .unwrap()
            .iter()
            .any(|c| c["text"] == "the release train"),
        "{result:?}"
    );
    Arc::try_unwrap(c).unwrap().cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_without_elicitation_or_tasks_is_told_and_the_call_settles() {
    let f = http_fixture().await;
    let client = TestClient::default();
    let c = Arc::new(connect(&f, client.clone()).await);
    let caller = c.clone();
    let call = tokio::spawn(async move {
        caller
            .call_tool(with_progress(call(
                "deploy_approval",
                json!({"service": "api"}),
            )))
            .await
    });
    eventually("a notice", || !client.logs.lock().unwrap().is_empty()).await;
    let log = client.logs.lock().unwrap()[0].clone();
    assert_eq!(log["kind"], "input.requested", "{log}");
    let request = eve_core::RequestId::new(log["requestId"].as_str().unwrap());
    assert!(
        log["message"].as_str().unwrap().contains("eve answer"),
        "{log}"
    );
    assert!(!call.is_finished());
    f.store
        .answer(
            &request,
            eve_core::InputResponse::option("approve"),
            eve_core::Timestamp::now(),
        )
        .await
        .unwrap();
    let result = settled(call).await;
    assert_eq!(result.is_error, Some(false), "{result:?}");
    Arc::try_unwrap(c).unwrap().cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_mode_decline_is_deny_or_an_error_never_a_silent_complete() {
    let f = http_fixture().await;
    let c = connect(&f, TestClient::tasks()).await;
    let gated = start_task(&c, call("transfer", json!({"cents": 7}))).await;
    let task = wait_status(c.peer(), &gated, TaskStatus::InputRequired).await;
    let (key, _) = only_request(&task);
    let decline: rmcp::model::InputResponses =
        [(key, json!({"action": "decline"}))].into_iter().collect();
    c.update_task(UpdateTaskParams::new(gated.clone(), decline))
        .await
        .unwrap();
    let done = wait_status(c.peer(), &gated, TaskStatus::Completed).await;
    let result = serde_json::to_value(&done.task).unwrap();
    assert!(
        result.to_string().contains("eve/denied"),
        "a declined approval completes denied: {result}"
    );

    let free = start_task(&c, call("explain", json!({}))).await;
    let task = wait_status(c.peer(), &free, TaskStatus::InputRequired).await;
    let (key, _) = only_request(&task);
    let before = journal(&*f.store, &RunId::new(free.as_str())).await.len();
    let decline: rmcp::model::InputResponses =
        [(key, json!({"action": "decline"}))].into_iter().collect();
    let e = rpc_error(
        c.update_task(UpdateTaskParams::new(free.clone(), decline))
            .await,
    );
    assert_eq!(e.data.unwrap()["code"], "still_pending", "{}", e.message);
    assert_eq!(
        journal(&*f.store, &RunId::new(free.as_str())).await.len(),
        before,
        "nothing was recorded"
    );
    wait_status(c.peer(), &free, TaskStatus::InputRequired).await;
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hosts_stop_cancels_the_run_and_a_closed_connection_does_not() {
    let f = http_fixture().await;
    let c = connect(&f, TestClient::default()).await;
    let handle = c
        .send_cancellable_request(
            rmcp::model::ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(call(
                "nap",
                json!({}),
            ))),
            rmcp::service::PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    let run = started(&*f.store, "nap").await;
    // Wait until the body is napping (its progress is journaled), then press stop.
    let start = Instant::now();
    while !journal(&*f.store, &run)
        .await
        .iter()
        .any(|e| matches!(e, Event::Progress { .. }))
    {
        assert!(start.elapsed() < Duration::from_secs(20));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    handle.cancel(Some("stop".into())).await.unwrap();
    let start = Instant::now();
    loop {
        let events = journal(&*f.store, &run).await;
        if events.iter().any(|e| matches!(e, Event::RunCancelled)) {
            let why = events.iter().find_map(|e| match e {
                Event::CancelRequested { reason, .. } => Some(reason.clone()),
                _ => None,
            });
            assert_eq!(why.as_deref(), Some(eve_mcp::REASON_STOP));
            assert!(
                events
                    .iter()
                    .any(|e| matches!(e, Event::StepCompleted { name, .. } if name == "cleanup")),
                "the cleanup step ran in the grace period: {events:?}"
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the stop did not cancel the run: {events:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_session_ends_it_and_cancels_its_runs_unless_the_host_named_it() {
    let f = http_fixture().await;
    let c = connect(&f, TestClient::tasks()).await;
    let task = start_task(&c, call("nap", json!({}))).await;
    let run = RunId::new(task.as_str());
    let session = f.store.get_run(&run).await.unwrap().session_id;
    c.cancel().await.unwrap(); // DELETE /mcp
    let start = Instant::now();
    loop {
        let record = f.store.get_session(&session).await.unwrap();
        let cancelled = f.store.get_run(&run).await.unwrap().cancel_requested;
        if record.ended_at.is_some() && cancelled {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "session {session} not ended or run not cancelled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Over a stdio-like transport: EOF ends an unnamed session, not a named one, and the next
    // connection naming it reattaches (its runs are in the same eve session).
    let dir = tempfile::tempdir().unwrap();
    let (mcp, store, _worker) = server(&dir.path().join("eve.db")).await;
    for named in [None, Some("host-7")] {
        let (server_io, client_io) = tokio::io::duplex(1 << 16);
        let served = tokio::spawn(eve_mcp::serve_transport(mcp.clone(), server_io));
        let mut client = TestClient::tasks();
        client.session = named.map(str::to_owned);
        let c = client.serve(client_io).await.unwrap();
        let task = start_task(&c, call("nap", json!({}))).await;
        let run = RunId::new(task.as_str());
        let session = store.get_run(&run).await.unwrap().session_id;
        c.cancel().await.unwrap(); // EOF
        served.await.unwrap().unwrap();
        let record = store.get_session(&session).await.unwrap();
        match named {
            None => {
                assert!(record.ended_at.is_some(), "EOF ends {session}");
                assert!(store.get_run(&run).await.unwrap().cancel_requested);
            }
            Some(name) => {
                assert_eq!(session, SessionId::new(name));
                assert!(record.ended_at.is_none(), "a named session outlives EOF");
                assert!(!store.get_run(&run).await.unwrap().cancel_requested);
                let (server_io, client_io) = tokio::io::duplex(1 << 16);
                tokio::spawn(eve_mcp::serve_transport(mcp.clone(), server_io));
                let mut again = TestClient::tasks();
                again.session = Some(name.to_owned());
                let c = again.serve(client_io).await.unwrap();
                let second = start_task(&c, call("nap", json!({}))).await;
                let s2 = store
                    .get_run(&RunId::new(second.as_str()))
                    .await
                    .unwrap()
                    .session_id;
                assert_eq!(s2, session, "reattached to the named session");
                c.cancel().await.unwrap();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_tool_answers_its_receipt_and_pushes_its_end() {
    let f = http_fixture().await;
    let client = TestClient::default();
    let c = connect(&f, client.clone()).await;
    let result = tokio::time::timeout(
        Duration::from_secs(20),
        c.call_tool(call(
            "refund_order",
            json!({"order_id": "o-1", "amount": 5.0}),
        )),
    )
    .await
    .expect("a background tool answers at once")
    .unwrap();
    let receipt = result.structured_content.unwrap();
    assert_eq!(receipt["status"], "working", "{receipt}");
    let run = RunId::new(receipt["taskId"].as_str().unwrap());
    let request = pending(&*f.store, &run).await;
    f.store
        .answer(
            &request,
            eve_core::InputResponse::option("approve"),
            eve_core::Timestamp::now(),
        )
        .await
        .unwrap();
    eventually("the task's end pushed as a log message", || {
        client
            .logs
            .lock()
            .unwrap()
            .iter()
            .any(|d| d["kind"] == "task.completed" && d["taskId"] == run.as_str())
    })
    .await;

    // A task client is pushed status notifications.
    let tasks = TestClient::tasks();
    let t = connect(&f, tasks.clone()).await;
    let task = start_task(&t, call("weigh", json!({"grams": 1500}))).await;
    eventually("a completed status notification", || {
        tasks
            .statuses
            .lock()
            .unwrap()
            .iter()
            .any(|s| s["taskId"] == task.as_str() && s["status"] == "completed")
    })
    .await;
    c.cancel().await.unwrap();
    t.cancel().await.unwrap();
}

/// eve-server's answer links as the notice's links (what `eve serve` sets up).
#[derive(Debug)]
struct Links {
    store: Arc<dyn JournalStore>,
    base: String,
}

#[async_trait::async_trait]
impl eve_mcp::AnswerLinks for Links {
    async fn link(&self, request: &eve_core::RequestId) -> Option<String> {
        let ttl = eve_server::DEFAULT_LINK_TTL;
        let now = eve_core::Timestamp::now();
        eve_server::create_answer_link(&*self.store, &self.base, request, ttl, now)
            .await
            .ok()
            .map(|l| l.url)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_notice_carries_an_answer_link_a_person_without_a_key_answers_with() {
    let dir = tempfile::tempdir().unwrap();
    let (mcp, store, worker) = server(&dir.path().join("eve.db")).await;
    // The page and its API on one port, MCP (whose notices name the page's links) on another.
    let page = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", page.local_addr().unwrap());
    let state = eve_server::AppState::new(store.clone(), Arc::new(eve_core::engine::SystemClock));
    tokio::spawn(eve_server::serve(page, state));
    let mcp = mcp.with_config(eve_mcp::McpConfig {
        page_url: Some(format!("{base}/requests")),
        answer_links: Some(Arc::new(Links {
            store: store.clone(),
            base: base.clone(),
        })),
        ..eve_mcp::McpConfig::default()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let app = axum::Router::new().nest_service("/mcp", eve_mcp::router(mcp));
    tokio::spawn(async move {
        let _worker = worker;
        axum::serve(listener, app).await.unwrap();
    });
    let client = TestClient::default();
    let c = Arc::new(
        client
            .clone()
            .serve(rmcp::transport::StreamableHttpClientTransport::from_uri(
                url,
            ))
            .await
            .unwrap(),
    );
    let caller = c.clone();
    let call = tokio::spawn(async move {
        caller
            .call_tool(call("deploy_approval", json!({"service": "api"})))
            .await
    });
    eventually("a notice", || !client.logs.lock().unwrap().is_empty()).await;
    let notice = client.logs.lock().unwrap()[0]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(notice.contains(&format!("{base}/requests")), "{notice}");
    let link = notice
        .split_whitespace()
        .find(|w| w.contains("/answer/"))
        .unwrap_or_else(|| panic!("no answer link: {notice}"))
        .trim_end_matches(',');
    let token = link.rsplit('/').next().unwrap();
    // A person with no key answers through the link; the call settles with that answer.
    let http = reqwest::Client::new();
    let answered = http
        .post(format!("{base}/v1/links/{token}/answer"))
        .header("content-type", "application/json")
        .body(json!({"optionId": "approve"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(
        answered.status().as_u16(),
        200,
        "{:?}",
        answered.text().await
    );
    let result = settled(call).await;
    assert_eq!(result.is_error, Some(false), "{result:?}");
    assert_eq!(result.structured_content.unwrap()["deployed"], true);
    // Single use: the link opens nothing any more.
    let again = http
        .post(format!("{base}/v1/links/{token}/answer"))
        .header("content-type", "application/json")
        .body(json!({"optionId": "approve"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(again.status().as_u16(), 410);
    Arc::try_unwrap(c).unwrap().cancel().await.unwrap();
}
