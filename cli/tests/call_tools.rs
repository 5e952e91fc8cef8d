//! `eve call` and `App` with ordinary tools: a default `#[tool]` runs inline (one result line,
//! nothing stored), its input checked like a workflow tool's; a background one is a run of one
//! step that `--wait --worker` sees complete.

use eve_cli::call::{self, CallRequest};
use eve_cli::{App, CliError};
use eve_core::engine::{define_tool, Registry, ToolCtx, WorkflowError};
use eve_core::{JournalStore, MemoryStore, RunQuery};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Lookup {
    order_id: String,
}

fn app() -> App {
    App::new("cli-tools-tests")
        .tool(define_tool(
            "lookup_order",
            "Look an order up.",
            |_ctx: ToolCtx, input: Lookup| async move {
                if input.order_id == "missing" {
                    return Err(WorkflowError::new("no order missing in the shop"));
                }
                Ok(json!({ "order": input.order_id }))
            },
        ))
        .tool(
            define_tool(
                "export_orders",
                "Export orders in the background.",
                |_ctx: ToolCtx, input: Lookup| async move {
                    Ok::<_, WorkflowError>(json!({ "exported": input.order_id }))
                },
            )
            .background(),
        )
}

fn request(tool: &str, input: Value) -> CallRequest {
    CallRequest {
        tool: tool.into(),
        input: input.to_string(),
        session: "cli".into(),
        call_id: format!("call-{tool}-{input}"),
        wait: None,
        worker: false,
    }
}

async fn lines(
    store: &Arc<dyn JournalStore>,
    registry: &Registry,
    req: &CallRequest,
) -> Result<Vec<Value>, CliError> {
    let mut out = Vec::new();
    call::run(store.clone(), registry, req, &mut out).await?;
    Ok(String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eve_call_runs_ordinary_tools() {
    let store: Arc<dyn JournalStore> = Arc::new(MemoryStore::new());
    let app = app();
    let registry = app.registry();
    assert!(registry.ordinary("lookup_order").is_some());
    assert!(registry.by_name("export_orders").is_some());

    // Inline: one line with the output, nothing stored.
    let got = lines(
        &store,
        registry,
        &request("lookup_order", json!({"order_id": "7"})),
    )
    .await
    .unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["status"], "completed");
    assert_eq!(got[0]["output"], json!({ "order": "7" }));
    assert_eq!(got[0]["tool"], "lookup_order");
    let got = lines(
        &store,
        registry,
        &request("lookup_order", json!({"order_id": "missing"})),
    )
    .await
    .unwrap();
    assert_eq!(got[0]["status"], "failed");
    assert_eq!(got[0]["error"], "no order missing in the shop");
    assert!(store
        .list_runs(&RunQuery::default())
        .await
        .unwrap()
        .is_empty());

    // Bad input: a usage error naming the field, for both kinds.
    for tool in ["lookup_order", "export_orders"] {
        match lines(&store, registry, &request(tool, json!({"order": 1}))).await {
            Err(CliError::Usage(m)) => assert!(m.contains("order_id"), "{m}"),
            other => panic!("{tool}: expected a usage error, got {other:?}"),
        }
    }
    // An unknown tool names every tool the app serves, ordinary ones too.
    match lines(&store, registry, &request("nope", json!({}))).await {
        Err(CliError::Usage(m)) => {
            assert!(
                m.contains("lookup_order") && m.contains("export_orders"),
                "{m}"
            )
        }
        other => panic!("expected a usage error, got {other:?}"),
    }

    // Background: a run of one step, completed by the worker `--worker` runs.
    let mut req = request("export_orders", json!({"order_id": "9"}));
    req.wait = Some(Some(Duration::from_secs(20)));
    req.worker = true;
    let got = lines(&store, registry, &req).await.unwrap();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0]["created"], true);
    assert_eq!(got[1]["status"], "completed");
    assert_eq!(got[1]["output"], json!({ "exported": "9" }));
}
