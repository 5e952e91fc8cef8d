//! `eve agents list` shows a pending subagent call (and `eve requests` does not);
//! `eve agents complete` refuses an output that does not match the call's schema, records a
//! matching one once (a retry is a duplicate), and the run completes with it.

use eve_cli::cli::{run, Cli};
use eve_core::engine::{
    define_workflow_tool, start_tool_call, AgentCall, Registry, SystemClock, Worker, WorkerConfig,
    WorkflowCtx, WorkflowError,
};
use eve_core::{workflow, CallId, Event, JournalStore, JournalStoreExt, SessionId, Timestamp};
use std::sync::Arc;

async fn delegate(
    ctx: WorkflowCtx,
    _input: serde_json::Value,
) -> Result<serde_json::Value, WorkflowError> {
    let facts = ctx
        .agent(
            AgentCall::new("facts", "researcher", serde_json::json!({"topic": "tides"}))
                .schema(serde_json::json!({"type": "object", "required": ["facts"]})),
        )?
        .await?;
    Ok(facts)
}

fn registry() -> Registry {
    Registry::new("cli-agents-tests")
        .with(define_workflow_tool("Delegates.", workflow!(delegate)).named("delegate"))
}

async fn eve(store_url: &str, args: &[&str]) -> Result<String, eve_cli::CliError> {
    let mut argv = vec!["eve", "--store", store_url];
    argv.extend_from_slice(args);
    let cli = <Cli as clap::Parser>::try_parse_from(argv).expect("arguments parse");
    let mut out = Vec::new();
    run(cli, &registry(), &mut out).await?;
    Ok(String::from_utf8(out).expect("UTF-8"))
}

#[tokio::test]
async fn agents_list_and_complete() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("eve.db");
    let url = format!("sqlite://{}", path.display());
    let store: Arc<dyn JournalStore> =
        Arc::new(eve_storage_sqlite::SqliteStore::open(&path).await.unwrap());
    let worker = Worker::new(
        store.clone(),
        registry(),
        Arc::new(SystemClock),
        WorkerConfig::default(),
    )
    .await
    .unwrap();
    let run_id = start_tool_call(
        &*store,
        &registry(),
        &SessionId::new("s1"),
        &CallId::new("c1"),
        "delegate",
        serde_json::json!({}),
        Timestamp::now(),
    )
    .await
    .unwrap()
    .run
    .run_id;
    worker.drain().await.unwrap();

    let listed = eve(&url, &["agents", "list"]).await.unwrap();
    let id = format!("{run_id}:0");
    assert!(listed.contains(&id), "{listed}");
    assert!(
        listed.contains("subagent \"researcher\" key \"facts\""),
        "{listed}"
    );
    assert!(listed.contains("1 pending agent call(s)"), "{listed}");
    let json = eve(&url, &["agents", "list", "--session", "s1", "--json"])
        .await
        .unwrap();
    let calls: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(calls[0]["request"]["agent"]["key"], "facts", "{json}");
    let asks = eve(&url, &["requests"]).await.unwrap();
    assert!(asks.contains("0 pending request(s)"), "{asks}");

    let err = eve(&url, &["agents", "complete", &id, "--output", "[1]"])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("outputSchema"), "{err}");
    let err = eve(&url, &["agents", "complete", &id, "--output", "{nope"])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not JSON"), "{err}");
    assert!(<Cli as clap::Parser>::try_parse_from(["eve", "agents", "complete", &id]).is_err());
    let done = eve(
        &url,
        &[
            "agents",
            "complete",
            &id,
            "--output",
            r#"{"facts": ["x"]}"#,
            "--as",
            "ops",
        ],
    )
    .await
    .unwrap();
    assert!(done.contains("completed agent call"), "{done}");
    let again = eve(
        &url,
        &["agents", "complete", &id, "--output", r#"{"facts": ["x"]}"#],
    )
    .await
    .unwrap();
    assert!(again.contains("already had this result"), "{again}");

    worker.drain().await.unwrap();
    let events = store.read_all(&run_id, 0).await.unwrap();
    assert!(matches!(
        &events.last().unwrap().event,
        Event::RunCompleted { output } if output.to_value::<serde_json::Value>().unwrap() == serde_json::json!({"facts": ["x"]})
    ));
}
