//! Ordinary tools over MCP (rmcp's client, streamable HTTP): `tools/list` shows them with their
//! input schema and `eve/mayWaitForInput: false`; a default one runs inline in `tools/call`
//! (also for a client with the tasks extension: there is no run to make a task of), with the
//! workflow tools' input check (-32602 naming the field); a background one is a task.

mod common;

use common::*;
use eve_core::engine::{define_tool, Registry, ToolCtx, WorkflowError};
use rmcp::model::{CallToolResponse, ErrorCode, TaskStatus};
use rmcp::ServiceError;
use serde_json::json;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Lookup {
    order_id: String,
}

fn tools() -> Registry {
    registry()
        .with(define_tool(
            "lookup_order",
            "Look an order up.",
            |_ctx: ToolCtx, input: Lookup| async move {
                if input.order_id == "missing" {
                    return Err(WorkflowError::new("no order missing in the shop"));
                }
                Ok(json!({ "order": input.order_id, "status": "shipped" }))
            },
        ))
        .with(
            define_tool(
                "export_orders",
                "Export orders in the background.",
                |ctx: ToolCtx, input: Lookup| async move {
                    assert!(ctx.attempt.is_some(), "a background call runs in a step");
                    Ok(json!({ "exported": input.order_id }))
                },
            )
            .background(),
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordinary_tools_are_listed_and_called_inline() {
    let f = http_fixture_with(tools()).await;
    let c = connect(&f, TestClient::default()).await;
    let listed = c.list_all_tools().await.unwrap();
    let lookup = listed
        .iter()
        .find(|t| t.name == "lookup_order")
        .expect("listed");
    assert_eq!(lookup.description.as_deref(), Some("Look an order up."));
    assert_eq!(lookup.input_schema["required"], json!(["order_id"]));
    let meta = &lookup.meta.as_ref().unwrap().0;
    assert_eq!(meta[eve_mcp::META_MAY_ASK], json!(false));
    assert_eq!(meta[eve_mcp::META_EXECUTION], json!("default"));
    let export = listed.iter().find(|t| t.name == "export_orders").unwrap();
    let meta = &export.meta.as_ref().unwrap().0;
    assert_eq!(meta[eve_mcp::META_MAY_ASK], json!(false));
    assert_eq!(meta[eve_mcp::META_EXECUTION], json!("background"));
    // The workflow tools are still there.
    assert!(listed.iter().any(|t| t.name == "deploy_approval"));

    // Inline, blocking: the tool's output, no run.
    let result = c
        .call_tool(call("lookup_order", json!({"order_id": "42"})))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(false));
    assert_eq!(
        result.structured_content,
        Some(json!({"order": "42", "status": "shipped"}))
    );
    // The tool's error is a tool result with isError.
    let result = c
        .call_tool(call("lookup_order", json!({"order_id": "missing"})))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(true));
    assert!(
        format!("{:?}", result.content).contains("no order missing in the shop"),
        "{result:?}"
    );
    // Bad input: -32602 naming the field, as for a workflow tool.
    for tool in ["lookup_order", "export_orders", "deploy_approval"] {
        let err = match c.call_tool(call(tool, json!({"order": 1}))).await {
            Err(ServiceError::McpError(e)) => e,
            other => panic!("expected a JSON-RPC error, got {other:?}"),
        };
        assert_eq!(err.code, ErrorCode::INVALID_PARAMS, "{tool}: {err:?}");
        assert_eq!(err.data.as_ref().unwrap()["code"], "invalid_input");
        if tool != "deploy_approval" {
            assert!(err.message.contains("order_id"), "{err:?}");
        }
    }
    assert_eq!(runs(&*f.store).await, 0, "no run for inline calls");

    // A client with the tasks extension gets the inline result too: there is no task.
    let t = connect(&f, TestClient::tasks()).await;
    match t
        .call_tool_once(call("lookup_order", json!({"order_id": "7"})))
        .await
        .unwrap()
    {
        CallToolResponse::Complete(r) => assert_eq!(
            r.structured_content,
            Some(json!({"order": "7", "status": "shipped"}))
        ),
        other => panic!("expected the inline result, got {other:?}"),
    }
    assert_eq!(runs(&*f.store).await, 0);

    // Background: a task that completes with the tool's output, one run of one step.
    let task = match t
        .call_tool_once(call("export_orders", json!({"order_id": "9"})))
        .await
        .unwrap()
    {
        CallToolResponse::Task(task) => task.task.task_id,
        other => panic!("expected a task, got {other:?}"),
    };
    let done = wait_status(t.peer(), &task, TaskStatus::Completed).await;
    assert_eq!(completed_output(&done), json!({"exported": "9"}));
    assert_eq!(runs(&*f.store).await, 1);
    // Without the tasks extension the same call answers the receipt at once; the run settles
    // with the tool's output.
    let result = c
        .call_tool(call("export_orders", json!({"order_id": "10"})))
        .await
        .unwrap();
    let receipt = result.structured_content.unwrap();
    assert_eq!(receipt["status"], "working", "{receipt}");
    let done = wait_status(
        t.peer(),
        receipt["taskId"].as_str().unwrap(),
        TaskStatus::Completed,
    )
    .await;
    assert_eq!(completed_output(&done), json!({"exported": "10"}));
}
