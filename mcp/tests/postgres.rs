//! Several eve servers on one PostgreSQL schema serve `tasks/get` and `tasks/update` for any
//! task: server A (with the worker) starts a task, server B (its own store connection, no
//! worker: another process as far as the store can tell) sees it parked, answers it, and sees it
//! complete. Skipped, loudly, without `EVE_TEST_POSTGRES_URL`.

mod common;

use common::*;
use eve_core::engine::{SystemClock, Worker, WorkerConfig};
use eve_core::JournalStore;
use eve_mcp::McpServer;
use eve_storage_postgres::{PostgresOptions, PostgresStore};
use rmcp::model::{CallToolRequestParams, CallToolResponse, TaskStatus, UpdateTaskParams};
use rmcp::ServiceExt;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

async fn open(url: &str, schema: &str) -> Arc<dyn JournalStore> {
    let options = PostgresOptions {
        schema: schema.to_owned(),
        pool_size: 4,
        ..PostgresOptions::default()
    };
    Arc::new(
        PostgresStore::connect_with(url, options)
            .await
            .expect("connect"),
    )
}

async fn drop_schema(url: &str, schema: &str) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_server_on_the_store_serves_any_task() {
    let url = match std::env::var("EVE_TEST_POSTGRES_URL") {
        Ok(u) if !u.is_empty() => u,
        _ => {
            println!("SKIPPED: eve-mcp on PostgreSQL: EVE_TEST_POSTGRES_URL is unset; set it (e.g. postgres://postgres@127.0.0.1:5432/test) to run it");
            return;
        }
    };
    let schema = format!("eve_t_{}", uuid::Uuid::new_v4().simple());
    let (a_store, b_store) = (open(&url, &schema).await, open(&url, &schema).await);
    let registry = Arc::new(common::registry());
    let worker = Worker::new(
        a_store.clone(),
        (*registry).clone(),
        Arc::new(SystemClock),
        WorkerConfig {
            poll_interval: Duration::from_millis(50),
            ..WorkerConfig::default()
        },
    )
    .await
    .unwrap();
    let a = McpServer::new(a_store, registry.clone()).with_worker(worker.clone());
    let b = McpServer::new(b_store, registry);
    let running = worker.spawn();
    let (a_io, a_client_io) = tokio::io::duplex(1 << 16);
    let (b_io, b_client_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(eve_mcp::serve_transport(a, a_io));
    tokio::spawn(eve_mcp::serve_transport(b, b_io));
    let ca = TestClient::tasks().serve(a_client_io).await.unwrap();
    let cb = TestClient::tasks().serve(b_client_io).await.unwrap();

    let args = json!({"service": "api"}).as_object().unwrap().clone();
    let id = match ca
        .call_tool_once(CallToolRequestParams::new("deploy_approval").with_arguments(args))
        .await
        .unwrap()
    {
        CallToolResponse::Task(t) => t.task.task_id,
        other => panic!("expected a task, got {other:?}"),
    };
    let parked = wait_status(cb.peer(), &id, TaskStatus::InputRequired).await;
    let (key, request) = only_request(&parked);
    assert_approval_form(&request);
    cb.update_task(UpdateTaskParams::new(id.clone(), choose(&key, "approve")))
        .await
        .unwrap();
    let done = wait_status(cb.peer(), &id, TaskStatus::Completed).await;
    assert_eq!(completed_output(&done)["deployed"], json!(true));
    wait_status(ca.peer(), &id, TaskStatus::Completed).await;
    ca.cancel().await.unwrap();
    cb.cancel().await.unwrap();
    running.shutdown().await;
    drop_schema(&url, &schema).await;
}
