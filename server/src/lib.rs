//! eve-server: the HTTP surface of eve, on axum.
//!
//! One [`router`] serves, for any [`JournalStore`]:
//!
//! | route | what |
//! | --- | --- |
//! | `POST /.well-known/workflow/v1/webhook/{token}` | delivers the request to the run waiting on the webhook ([`WEBHOOK_PATH`]) |
//! | `GET /v1/sessions/{id}/events` | the session's channel as Server-Sent Events, resumable with `Last-Event-ID` |
//! | `GET /v1/sessions/{id}/requests` | the session's pending input requests |
//! | `POST /v1/requests/{id}/answer` | answers a request with `{"optionId": …}` or `{"text": …}` |
//! | `GET /v1/sessions/{id}/tasks` | the session's background runs (its task index) |
//! | `POST /v1/tasks/{id}/cancel` | requests cancellation of a background run |
//! | `GET /v1/runs?session=&status=&limit=` | runs, oldest first |
//! | `GET /v1/runs/{id}` | one run's record and journal |
//! | `GET /` | a page for a person: pending requests to answer, live updates, the runs and their journals |
//!
//! The server holds no state of its own beyond caches: every answer comes from the store, so
//! several server processes may serve one store, and a restarted server continues where the
//! last one stopped (an SSE client reconnecting with `Last-Event-ID` misses nothing). Run a
//! [`Worker`](eve_core::engine::Worker) beside it to execute the runs.
//!
//! Errors are JSON objects `{"code": "...", "message": "..."}` with a status that says the
//! kind: 400 malformed request, 403 cross-origin browser request, 404 unknown id or token, 409
//! already answered (or not a task), 410 withdrawn, 413 body too large, 422 invalid answer, 503
//! store unavailable (retry).
//!
//! The server has no authentication: bind it to loopback or put it behind a proxy that
//! authenticates everything but the webhook path (webhook tokens are capabilities: ≥128 random
//! bits, which is why the runs API shows them redacted). Answers and cancels sent by a browser
//! from another origin (a web page the person happens to visit) are refused with 403; clients
//! that send no `Origin` header (curl, the CLI) are not affected.
//!
//! ```no_run
//! # async fn demo(store: std::sync::Arc<dyn eve_core::JournalStore>) -> std::io::Result<()> {
//! use eve_server::{serve, AppState};
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8787").await?;
//! serve(listener, AppState::new(store, std::sync::Arc::new(eve_core::engine::SystemClock))).await
//! # }
//! ```

mod error;
mod page;
mod runs;
mod session;
mod webhook;

pub use error::ApiError;
pub use webhook::{is_webhook_token, IDEMPOTENCY_KEY_MAX};

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use eve_core::engine::Clock;
use eve_core::{JournalStore, RunId, WebhookResponse};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// The URL path prefix every webhook lives under (the same as
/// [`eve_core::engine::WEBHOOK_PATH`]).
pub const WEBHOOK_PATH: &str = eve_core::engine::WEBHOOK_PATH;

/// The default request body limit: 1 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// The default interval at which an SSE stream that has caught up looks at the store again.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Server tunables.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The largest request body accepted, in bytes (default [`DEFAULT_BODY_LIMIT`]); a larger
    /// one is answered 413 and touches no run. Bodies are also bound by the store's payload
    /// limit ([`eve_core::store::MAX_PAYLOAD_BYTES`]).
    pub body_limit: usize,
    /// The URL this server is reached at from outside, without a trailing slash (default
    /// `http://127.0.0.1:8787`). Workflows build their webhook URLs from it with
    /// [`ServerConfig::url`].
    pub base_url: String,
    /// How often an SSE stream that has caught up re-reads the session log when the store
    /// cannot notify it that the log grew (DynamoDB; default [`DEFAULT_POLL_INTERVAL`]).
    /// Where the store notifies (memory, SQLite, Postgres), streams wake at every write, a
    /// worker's included, and re-read every 2 s at most (or this interval if longer) for
    /// writes the notifications cannot see.
    pub poll_interval: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            body_limit: DEFAULT_BODY_LIMIT,
            base_url: "http://127.0.0.1:8787".into(),
            poll_interval: DEFAULT_POLL_INTERVAL,
        }
    }
}

impl ServerConfig {
    /// The absolute URL of `path` on this server: `base_url` + `path`, e.g. a webhook's URL
    /// from [`eve_core::engine::Webhook::path`].
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base_url.trim_end_matches('/'), path)
    }
}

/// What the server serves from.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The store every route reads and delivers to.
    pub store: Arc<dyn JournalStore>,
    /// The clock that stamps deliveries (answers, webhook payloads, cancel requests).
    pub clock: Arc<dyn Clock>,
    /// Tunables.
    pub config: ServerConfig,
}

impl AppState {
    /// A state with the default [`ServerConfig`].
    pub fn new(store: Arc<dyn JournalStore>, clock: Arc<dyn Clock>) -> Self {
        Self {
            store,
            clock,
            config: ServerConfig::default(),
        }
    }

    /// The same state with `config`.
    pub fn with_config(mut self, config: ServerConfig) -> Self {
        self.config = config;
        self
    }
}

/// A webhook's `respond_with`, cached per `(run, cmd)`: it never changes once recorded.
type HookCache = HashMap<(RunId, u64), Option<WebhookResponse>>;

/// At most this many webhooks' responses are cached; the cache is emptied when full.
const HOOK_CACHE_MAX: usize = 4096;

/// Shared by every handler of one router.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) store: Arc<dyn JournalStore>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) config: ServerConfig,
    /// Bumped after every write this server makes, so SSE streams look at once.
    pub(crate) changed: watch::Sender<u64>,
    /// Set when the server shuts down: SSE streams end, so connections can close.
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) hooks: Mutex<HookCache>,
}

impl Inner {
    pub(crate) fn wrote(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// The server's routes over `state` (see the crate docs). Serve it with [`serve`], or nest it
/// in a larger axum app.
pub fn router(state: AppState) -> Router {
    // A router without a shutdown signal: its SSE streams end when their clients go away.
    let (_tx, rx) = watch::channel(false);
    build(state, rx)
}

fn build(state: AppState, shutdown: watch::Receiver<bool>) -> Router {
    let body_limit = state.config.body_limit;
    let inner = Arc::new(Inner {
        store: state.store,
        clock: state.clock,
        config: state.config,
        changed: watch::Sender::new(0),
        shutdown,
        hooks: Mutex::new(HashMap::new()),
    });
    Router::new()
        .route(
            "/.well-known/workflow/v1/webhook/{token}",
            post(webhook::receive)
                .put(webhook::receive)
                .patch(webhook::receive),
        )
        .route("/v1/sessions/{id}/events", get(session::events))
        .route("/v1/sessions/{id}/requests", get(session::requests))
        .route("/v1/sessions/{id}/tasks", get(session::tasks))
        .merge(
            // What a person does (answer, cancel) must not be doable by another web site the
            // person visits: cross-origin browser requests are refused.
            Router::new()
                .route("/v1/requests/{id}/answer", post(session::answer))
                .route("/v1/tasks/{id}/cancel", post(session::cancel))
                .route_layer(axum::middleware::from_fn(error::same_origin)),
        )
        .route("/v1/runs", get(runs::list))
        .route("/v1/runs/{id}", get(runs::show))
        .route("/", get(page::index))
        .fallback(error::not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(inner)
}

/// Serves [`router`] on `listener` until the process ends.
///
/// # Errors
/// The listener's I/O error.
pub async fn serve(listener: tokio::net::TcpListener, state: AppState) -> std::io::Result<()> {
    serve_with_shutdown(listener, state, std::future::pending()).await
}

/// Serves [`router`] on `listener` until `signal` completes, then shuts down gracefully: stops
/// accepting, ends every SSE stream (clients reconnect with `Last-Event-ID` to a new server)
/// and waits for in-flight requests to finish.
///
/// # Errors
/// The listener's I/O error.
pub async fn serve_with_shutdown(
    listener: tokio::net::TcpListener,
    state: AppState,
    signal: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (tx, rx) = watch::channel(false);
    let app = build(state, rx);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            signal.await;
            let _ = tx.send(true);
        })
        .await
}
