//! `eve serve`: eve-server's HTTP surface, MCP at `/mcp` and a worker in one process, on the
//! store of `--store`, serving the app's tools.

use crate::cli::ServeArgs;
use crate::demo;
use crate::error::CliError;
use crate::store_url::StoreUrl;
use eve_core::engine::{Clock, Registry, SystemClock, Worker, WorkerConfig};
use eve_server::{AppState, ServerConfig};
use std::io::Write;
use std::sync::Arc;

/// Serves until Ctrl-C or SIGTERM (or, with `--demo`, until the demo's run has finished unless
/// `--keep-serving`): binds `args.listen`, starts a worker for `registry`'s deployment, the
/// server (with the start API and MCP at `/mcp`, both behind an operate key) and prints where
/// it listens. With `--retain AGE` it purges runs that ended more than AGE ago at start and
/// every hour ([`crate::retention::spawn_retention`]). On the way out the server stops accepting and the worker retires its lease, so
/// another process takes the runs over at once.
///
/// # Errors
/// The store cannot be opened, the worker cannot start (`WorkerIdInUse`: another live process
/// serves with the same worker id, named in the message), the address cannot be bound, or the
/// server fails; `--demo` on an app without the demo's tool.
pub async fn run(
    url: &StoreUrl,
    args: &ServeArgs,
    registry: &Registry,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    if args.demo && registry.by_name(demo::DEMO_TOOL).is_none() {
        return Err(CliError::Serve(format!(
            "--demo calls the examples' {} tool, which this app does not serve",
            demo::DEMO_TOOL
        )));
    }
    let store = url.open().await?;
    let deployment = registry.deployment().clone();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    // First, so that a second process with this worker id is refused (naming the first)
    // before it takes anything else, such as a port.
    let worker = Worker::new(
        store.clone(),
        registry.clone(),
        clock.clone(),
        WorkerConfig {
            id: args.worker_id.clone().map(eve_core::WorkerId::new),
            ..WorkerConfig::default()
        },
    )
    .await
    .map_err(CliError::store("cannot start the worker"))?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| CliError::Serve(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| CliError::Serve(format!("cannot read the bound address: {e}")))?;
    let base = args
        .base_url
        .clone()
        .unwrap_or_else(|| format!("http://{addr}"));
    let base = base.trim_end_matches('/').to_owned();
    // Bodies build webhook URLs in steps from EVE_BASE_URL (the seed's `createWebhook().url`):
    // --base-url when given, else the environment's value, else the bound address. Set
    // before the worker runs any step.
    if args.base_url.is_some() || std::env::var_os("EVE_BASE_URL").is_none() {
        std::env::set_var("EVE_BASE_URL", &base);
    }
    let traces = crate::otlp::from_args(args.otlp.as_deref())?;
    if let Some(sink) = &traces {
        worker.trace_to(sink.clone());
    }
    let worker_id = worker.lease().worker;
    let local_worker = worker.clone();
    let mut worker = worker.spawn();
    let tools: Vec<&str> = registry.tools().map(|t| t.name()).collect();
    let _ = writeln!(out, "eve serve: listening on {base}/ (store {url})");
    let _ = writeln!(out, "eve serve: MCP (streamable HTTP) at {base}/mcp");
    let _ = writeln!(
        out,
        "eve serve: worker {worker_id} runs deployment {deployment}: {}",
        tools.join(", ")
    );
    if args.base_url.is_none() && args.listen.ip().is_unspecified() {
        let warning = format!(
            "eve serve: WARNING: --listen {} without --base-url: webhook URLs name {base}, and a request by this machine's own address or name is refused 421 (the server answers for its base URL's host and loopback names only). Give --base-url http://HOST:{} with the name or address clients use.",
            args.listen,
            addr.port()
        );
        let _ = writeln!(out, "{warning}");
        eprintln!("{warning}");
    }
    if args.insecure_no_auth {
        let warning = format!(
            "eve serve: WARNING: --insecure-no-auth: every route of {base}/ is open to anyone who reaches it, without a key (reading journals, answering, cancelling). For tests only."
        );
        let _ = writeln!(out, "{warning}");
        eprintln!("{warning}");
    } else {
        first_key(&*store, out).await?;
    }
    let retention = match args.retain {
        Some(age) => {
            Some(crate::retention::spawn_retention(store.clone(), age, "eve serve", out).await)
        }
        None => None,
    };
    let state = AppState::new(store.clone(), clock)
        .with_config(ServerConfig {
            base_url: base.clone(),
            insecure_no_auth: args.insecure_no_auth,
            webhook_drop_headers: args.webhook_drop_headers.clone(),
            webhook_keep_headers: args.webhook_keep_headers.clone(),
            ..ServerConfig::default()
        })
        .with_metrics(crate::logging::metrics())
        .with_registry(registry.clone())
        .with_mcp(eve_mcp::router_for(
            eve_mcp::McpServer::new(store.clone(), Arc::new(registry.clone()))
                .with_worker(local_worker.clone())
                .with_config(eve_mcp::McpConfig {
                    page_url: Some(format!("{base}/requests")),
                    answer_links: Some(Arc::new(ServeLinks {
                        store: store.clone(),
                        base: base.clone(),
                    })),
                    ..eve_mcp::McpConfig::default()
                }),
            &base,
        ));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(eve_server::serve_with_shutdown(
        listener,
        state,
        async move {
            let _ = stopped.await;
        },
    ));
    let outcome = {
        let demo = async {
            if args.demo {
                let page = format!("{base}/");
                let store_arg = url.to_string();
                let result = demo::run_agent(
                    store.clone(),
                    Arc::new(registry.clone()),
                    local_worker.clone(),
                    &page,
                    &store_arg,
                    out,
                )
                .await;
                if result.is_ok() && args.keep_serving {
                    std::future::pending::<()>().await;
                }
                result.map(drop)
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            r = demo => r,
            () = shutdown_signal() => Ok(()),
            r = worker.stopped() => Err(CliError::Serve(format!(
                "the worker {worker_id} stopped: {}",
                match r {
                    Ok(()) => "it was shut down".into(),
                    Err(e) => e.to_string(),
                }
            ))),
            r = &mut server => Err(CliError::Serve(match r {
                Ok(Ok(())) => "the server stopped by itself".into(),
                Ok(Err(e)) => format!("the server failed: {e}"),
                Err(e) => format!("the server task failed: {e}"),
            })),
        }
    };
    let _ = stop.send(());
    if !server.is_finished() {
        let _ = server.await;
    }
    if let Some(r) = retention {
        r.abort();
    }
    worker.shutdown().await;
    if let Some(sink) = traces {
        // Exports the spans still queued (a blocking call: not on the runtime's threads).
        let _ =
            tokio::task::spawn_blocking(move || sink.shutdown(std::time::Duration::from_secs(5)))
                .await;
    }
    let _ = writeln!(out, "eve serve: stopped");
    outcome
}

/// Secure by default: when the store holds no active key, creates an admin key and prints it,
/// once (like a notebook server's token). Later starts print nothing: the key is only hashed in
/// the store.
async fn first_key(
    store: &dyn eve_core::JournalStore,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let keys = store
        .list_keys()
        .await
        .map_err(CliError::store("cannot read the API keys"))?;
    if keys.iter().any(|k| k.is_active(eve_core::Timestamp::now())) {
        let _ = writeln!(
            out,
            "eve serve: routes need an API key (`eve keys list`, `eve keys create`)"
        );
        return Ok(());
    }
    let key = eve_server::create_key(
        store,
        "admin (created by eve serve's first start)",
        eve_core::KeyScope::Admin,
        eve_core::Timestamp::now(),
    )
    .await
    .map_err(CliError::store("cannot create the first API key"))?;
    let _ = writeln!(
        out,
        "eve serve: no API key in the store; created admin key {} (shown once, store it now):\neve serve:   {}\neve serve: sign in on the page with it or send `Authorization: Bearer <key>`; more keys: eve keys create --name NAME --scope read|answer|operate|admin",
        key.record.id, key.text
    );
    Ok(())
}

/// Completes on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

/// The answer links `eve serve` names in the notice of an MCP call that waits for a person:
/// eve-server's (single use, expiring after its default of one day, opening the page at just
/// that request).
struct ServeLinks {
    store: Arc<dyn eve_core::JournalStore>,
    base: String,
}

impl std::fmt::Debug for ServeLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeLinks")
            .field("base", &self.base)
            .finish()
    }
}

#[async_trait::async_trait]
impl eve_mcp::AnswerLinks for ServeLinks {
    async fn link(&self, request: &eve_core::RequestId) -> Option<String> {
        let now = SystemClock.now();
        let ttl = eve_server::DEFAULT_LINK_TTL;
        match eve_server::create_answer_link(&*self.store, &self.base, request, ttl, now).await {
            Ok(link) => Some(link.url),
            Err(e) => {
                tracing::info!(%request, error = %e, "no answer link for an MCP notice");
                None
            }
        }
    }
}
