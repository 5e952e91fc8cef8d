//! `eve mcp`: the app's tools over MCP on stdin/stdout, with a worker in the same process, on
//! the store of `--store`. What an agent host launches (`"command": "eve", "args": ["mcp"]`).
//! stdout carries only MCP messages: `eve_mcp::serve_stdio` gives the protocol its own descriptor
//! for stdout and points fd 1 at stderr, so what tools, steps or dependencies print goes to
//! stderr; logs go to stderr too. With `--retain AGE` it purges runs
//! that ended more than AGE ago, like `eve serve --retain`.

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
            // shared one would make all but the first refuse to start).
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
    let store_for_retention = store.clone();
    let server =
        eve_mcp::McpServer::new(store, Arc::new(registry.clone())).with_worker(worker.clone());
    // stdout is the protocol's: the retention report goes to stderr.
    let retention = match args.retain {
        Some(age) => Some(
            crate::retention::spawn_retention(
                store_for_retention,
                age,
                "eve mcp",
                &mut std::io::stderr(),
            )
            .await,
        ),
        None => None,
    };
    let traces = crate::otlp::from_args(args.otlp.as_deref())?;
    if let Some(sink) = &traces {
        worker.trace_to(sink.clone());
    }
    let running = worker.spawn();
    let served = eve_mcp::serve_stdio(server).await;
    if let Some(r) = retention {
        r.abort();
    }
    running.shutdown().await;
    if let Some(sink) = traces {
        let _ =
            tokio::task::spawn_blocking(move || sink.shutdown(std::time::Duration::from_secs(5)))
                .await;
    }
    served.map_err(|e| CliError::Serve(format!("MCP on stdio: {e}")))
}
