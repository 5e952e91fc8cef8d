//! The approval policy over MCP (streamable HTTP, rmcp's client): `tools/list` marks a gated
//! tool `eve/needsApproval`; a blocking client gets the approval request as an elicitation
//! showing the tool and the model's input, a task client as `input_required`; a denied call
//! answers a tool result with `isError` and `_meta["eve/denied"]`, and its body never ran.

mod common;

use common::*;
use eve_core::engine::{define_workflow_tool, Approval, Registry, WorkflowCtx, WorkflowError};
use eve_core::workflow;
use rmcp::model::{TaskPayload, TaskStatus, UpdateTaskParams};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Mutex;

static RAN: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);

fn ran(id: &str) -> usize {
    RAN.lock()
        .unwrap()
        .as_ref()
        .and_then(|m| m.get(id).copied())
        .unwrap_or(0)
}

/// A transfer.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct Transfer {
    /// Which call.
    pub id: String,
    /// Cents.
    pub cents: u64,
}

async fn transfer(_ctx: WorkflowCtx, input: Transfer) -> Result<serde_json::Value, WorkflowError> {
    *RAN.lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .entry(input.id.clone())
        .or_default() += 1;
    Ok(json!({ "sent": input.cents }))
}

fn frozen(_: &Transfer) -> Approval {
    Approval::deny("transfers are frozen")
}

fn registry() -> Registry {
    Registry::new("v1")
        .with(
            define_workflow_tool("Transfer after approval.", workflow!(transfer)).needs_approval(),
        )
        .with(
            define_workflow_tool(
                "Transfer, denied by policy.",
                workflow!(transfer).with_id("frozen_transfer"),
            )
            .named("frozen_transfer")
            .approval(frozen),
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_tool_is_listed_and_approved_through_elicitation() {
    let f = http_fixture_with(registry()).await;
    let client = TestClient::eliciting("approve");
    let c = connect(&f, client.clone()).await;
    let tools = c.list_all_tools().await.unwrap();
    let gated = tools.iter().find(|t| t.name == "transfer").unwrap();
    let meta = serde_json::to_value(&gated.meta).unwrap();
    assert_eq!(meta["eve/needsApproval"], true, "{meta}");
    assert_eq!(meta["eve/mayWaitForInput"], true, "{meta}");

    let result = c
        .call_tool(call("transfer", json!({"id": "mcp-approve", "cents": 42})))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(false), "{result:?}");
    assert_eq!(result.structured_content, Some(json!({"sent": 42})));
    let asked = client.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    let message = asked[0]["message"].as_str().unwrap();
    assert!(
        message.contains("transfer") && message.contains("\"cents\":42"),
        "the form shows the tool and its input: {message}"
    );
    assert_eq!(
        asked[0]["requestedSchema"]["properties"]["option"]["oneOf"],
        json!([{"const": "approve", "title": "Approve"}, {"const": "deny", "title": "Deny"}])
    );
    assert_eq!(ran("mcp-approve"), 1);

    // Denied by a person: a tool result with isError and eve/denied; the body never ran.
    let denier = TestClient::eliciting("deny");
    let d = connect(&f, denier).await;
    let result = d
        .call_tool(call("transfer", json!({"id": "mcp-deny", "cents": 7})))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(true), "{result:?}");
    let meta = serde_json::to_value(&result.meta).unwrap();
    assert!(meta["eve/denied"]["reason"].is_string(), "{meta}");
    assert_eq!(ran("mcp-deny"), 0);

    // Denied by the policy, nobody asked.
    let result = d
        .call_tool(call(
            "frozen_transfer",
            json!({"id": "mcp-frozen", "cents": 7}),
        ))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(true), "{result:?}");
    let meta = serde_json::to_value(&result.meta).unwrap();
    assert_eq!(
        meta["eve/denied"]["reason"], "transfers are frozen",
        "{meta}"
    );
    assert_eq!(ran("mcp-frozen"), 0);
    c.cancel().await.unwrap();
    d.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_client_gets_the_approval_as_input_required() {
    let f = http_fixture_with(registry()).await;
    let c = connect(&f, TestClient::tasks()).await;
    let start = |id: &'static str| {
        let c = c.peer().clone();
        async move {
            match c
                .call_tool_once(call("transfer", json!({"id": id, "cents": 9})))
                .await
                .unwrap()
            {
                rmcp::model::CallToolResponse::Task(t) => t.task.task_id,
                other => panic!("expected a task, got {other:?}"),
            }
        }
    };
    // Approved through tasks/update: completed with the body's output.
    let id = start("task-approve").await;
    let parked = wait_status(c.peer(), &id, TaskStatus::InputRequired).await;
    let (key, request) = only_request(&parked);
    assert!(
        request["params"]["message"]
            .as_str()
            .unwrap()
            .contains("\"cents\":9"),
        "{request}"
    );
    c.update_task(UpdateTaskParams::new(id.clone(), choose(&key, "approve")))
        .await
        .unwrap();
    let done = wait_status(c.peer(), &id, TaskStatus::Completed).await;
    assert_eq!(completed_output(&done), json!({"sent": 9}));
    assert_eq!(ran("task-approve"), 1);

    // Denied: the task completes with the denied tool result; the body never ran.
    let id = start("task-deny").await;
    let parked = wait_status(c.peer(), &id, TaskStatus::InputRequired).await;
    let (key, _) = only_request(&parked);
    // An option not offered is refused.
    let refused = c
        .update_task(UpdateTaskParams::new(id.clone(), choose(&key, "maybe")))
        .await;
    assert!(refused.is_err(), "{refused:?}");
    c.update_task(UpdateTaskParams::new(id.clone(), choose(&key, "deny")))
        .await
        .unwrap();
    let done = wait_status(c.peer(), &id, TaskStatus::Completed).await;
    match &done.task.payload {
        TaskPayload::Completed { result } => {
            assert_eq!(result["isError"], true, "{result:?}");
            assert!(
                result["_meta"]["eve/denied"]["reason"].is_string(),
                "{result:?}"
            );
        }
        other => panic!("not completed: {other:?}"),
    }
    assert_eq!(ran("task-deny"), 0);
    c.cancel().await.unwrap();
}
