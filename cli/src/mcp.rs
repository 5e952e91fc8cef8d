//! `eve mcp`: the app's tools over MCP on stdin/stdout, with a worker in the same process, on
//! the store of `--store`. What an agent host launches (`"command": "eve", "args": ["mcp"]`).
//! stdout carries only MCP messages; logs go to stderr.

use crate::cli::McpArgs;
use crate::error::CliError;
use crate::store_url::StoreUrl;
use eve_core::engine::{default_worker_id, Registry, SystemClock, Worker, WorkerConfig};
use eve_core::WorkerId;
use std::sync::Arc;

/// Serves MCP on stdio until the client closes stdin, then retires the worker's lease so
/// another process takes its runs at once. Runs outlive the process: a task started here is
/// answered by `tasks/get` from any later `eve mcp` or `eve serve` on the same store.
///
/// # Errors
/// The store cannot be opened, the worker cannot register, or the MCP transport fails.
pub async fn run(url: &StoreUrl, args: &McpArgs, registry: &Registry) -> Result<(), CliError> {
    let store = url.open().await?;
    let id = args
        .worker_id
        .clone()
        .map(WorkerId::new)
        .unwrap_or_else(|| {
            // Agent hosts may launch several of these at once: each gets its own worker id (a
            // shared one would fence the other process).
            let base = default_worker_id(registry.deployment().as_str(), 1);
            WorkerId::new(format!("{base}/mcp-{}", std::process::id()))
        });
    let worker = Worker::new(
        store.clone(),
        registry.clone(),
        Arc::new(SystemClock),
        WorkerConfig {
            id: Some(id.clone()),
            ..WorkerConfig::default()
        },
    )
    .await
    .map_err(CliError::store("cannot register the worker"))?;
    tracing::info!(worker = %id, deployment = %registry.deployment(), "eve mcp: serving on stdio");
    let server =
        eve_mcp::McpServer::new(store, Arc::new(registry.clone())).with_worker(worker.clone());
    let running = worker.spawn();
    let served = eve_mcp::serve_stdio(server).await;
    running.shutdown().await;
    served.map_err(|e| CliError::Serve(format!("MCP on stdio: {e}")))
}
