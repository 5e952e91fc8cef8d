//! Ordinary tools over HTTP: listed by `GET /v1/tools` beside the workflow tools; a default one
//! runs inline in `POST /v1/tools/{name}/calls` (200, `run: null`, settled at once, its input
//! checked like a workflow tool's); a background one is a task that completes with
//! `task.completed` and is cancelled by `POST /v1/tasks/{id}/cancel`.

mod common;

use common::*;
use eve_core::engine::WorkflowError;
use eve_core::engine::{define_tool, Registry, SystemClock, ToolCtx, Worker, WorkerConfig};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// The test tools (with the inline `lookup_order`) plus two background ordinary tools.
fn tools() -> Registry {
    registry()
        .with(
            define_tool(
                "export_orders",
                "Export orders in the background.",
                |ctx: ToolCtx, input: LookupInput| async move {
                    Ok(json!({ "exported": input.order_id, "session": ctx.session_id }))
                },
            )
            .background(),
        )
        .with(
            define_tool(
                "long_export",
                "Exports until cancelled.",
                |ctx: ToolCtx, _input: Value| async move {
                    if let Some(step) = ctx.attempt {
                        step.aborted().await;
                    }
                    Ok::<_, WorkflowError>("stopped")
                },
            )
            .background(),
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordinary_tools_are_listed_and_called() {
    let (_dir, store) = sqlite().await;
    let config = WorkerConfig {
        poll_interval: Duration::from_millis(20),
        ..WorkerConfig::default()
    };
    let worker = Worker::new(store.clone(), tools(), Arc::new(SystemClock), config)
        .await
        .expect("register worker")
        .spawn();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let state = eve_server::AppState::new(store.clone(), Arc::new(SystemClock))
        .with_config(eve_server::ServerConfig {
            base_url: base.clone(),
            ..eve_server::ServerConfig::default()
        })
        .with_registry(tools());
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

    // Listed by name beside the workflow tools, with their input schema and execution.
    let listed: Value = client
        .get(format!("{base}/v1/tools"))
        .bearer_auth(&operate)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let listed = listed["tools"].as_array().unwrap();
    let names: Vec<&str> = listed.iter().map(|t| t["name"].as_str().unwrap()).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted, "by name");
    let find = |name: &str| listed.iter().find(|t| t["name"] == name).unwrap().clone();
    let lookup = find("lookup_order");
    assert_eq!(lookup["execution"], "default");
    assert_eq!(lookup["description"], "Look an order up.");
    assert_eq!(lookup["inputSchema"]["required"], json!(["order_id"]));
    assert_eq!(find("export_orders")["execution"], "background");
    assert_eq!(find("deploy")["execution"], "default");

    let call = |tool: &'static str, body: Value| {
        let (client, base, key) = (client.clone(), base.clone(), operate.clone());
        async move {
            let resp = client
                .post(format!("{base}/v1/tools/{tool}/calls"))
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap())
        }
    };

    // Inline: settled in the response, no run, nothing stored.
    let in_session = eve_core::RunQuery {
        session: Some("s-tools".into()),
        ..eve_core::RunQuery::default()
    };
    let (status, got) = call(
        "lookup_order",
        json!({ "session": "s-tools", "callId": "c1", "input": { "order_id": "42" } }),
    )
    .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["run"], Value::Null);
    assert_eq!(got["settled"]["status"], "completed");
    assert_eq!(
        got["settled"]["output"],
        json!({ "order": "42", "status": "shipped" })
    );
    let (status, got) = call(
        "lookup_order",
        json!({ "session": "s-tools", "callId": "c2", "input": { "order_id": "missing" } }),
    )
    .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["settled"]["status"], "failed");
    assert_eq!(got["settled"]["error"], "no order missing in the shop");
    assert!(
        store.list_runs(&in_session).await.unwrap().is_empty(),
        "an inline call stores no run"
    );

    // Bad input: the same refusal as a workflow tool's, naming the field.
    for (tool, input) in [
        ("lookup_order", json!({ "order": 1 })),
        ("export_orders", json!({ "order": 1 })),
    ] {
        let (status, err) = call(
            tool,
            json!({ "session": "s-tools", "callId": "bad", "input": input }),
        )
        .await;
        assert_eq!(
            (status, err["code"].as_str()),
            (400, Some("invalid_input")),
            "{tool}: {err}"
        );
        assert!(
            err["message"].as_str().unwrap().contains("order_id"),
            "{err}"
        );
    }

    // Background: a task receipt, then task.completed on the session's channel.
    let mut events = SseClient::connect_with(
        &format!("{base}/v1/sessions/s-tools/events"),
        None,
        Some(&operate),
    )
    .await;
    let (status, started) = call(
        "export_orders",
        json!({ "session": "s-tools", "callId": "c3", "input": { "order_id": "7" } }),
    )
    .await;
    assert_eq!(status, 201, "{started}");
    assert_eq!(started["run"]["execution"], "background");
    let completed = events.until("task.completed").await.pop().unwrap().json();
    assert_eq!(
        completed["event"]["data"]["output"],
        json!({ "exported": "7", "session": "s-tools" }),
        "{completed}"
    );
    let run = started["run"]["runId"].as_str().unwrap().to_owned();
    let journal = journal(&store, &run.as_str().into()).await;
    assert_eq!(
        count(&journal, |e| matches!(
            e,
            eve_core::Event::StepCompleted { .. }
        )),
        1
    );

    // A background tool is cancelled like any task.
    let (status, started) = call(
        "long_export",
        json!({ "session": "s-tools", "callId": "c4", "input": {} }),
    )
    .await;
    assert_eq!(status, 201, "{started}");
    let task = started["run"]["runId"].as_str().unwrap().to_owned();
    let cancelled = client
        .post(format!("{base}/v1/tasks/{task}/cancel"))
        .bearer_auth(&operate)
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), 202);
    events.until("task.cancelled").await;

    worker.shutdown().await;
}
