//! eve-server: the HTTP surface of eve, on axum.
//!
//! One [`router`] serves, for any [`JournalStore`]:
//!
//! | route | scope | what |
//! | --- | --- | --- |
//! | `POST /.well-known/workflow/v1/webhook/{token}` | (the token) | delivers the request to the run waiting on the webhook ([`WEBHOOK_PATH`]) |
//! | `GET /v1/sessions/{id}/events` | read | the session's channel as Server-Sent Events, resumable with `Last-Event-ID` |
//! | `GET /v1/sessions/{id}/requests` | read | the session's pending input requests |
//! | `GET /v1/agents` | read | pending subagent calls (`ctx.agent` with no in-process `AgentHost`), paged and filtered as `GET /v1/requests`, each with its call in `request.agent` |
//! | `GET /v1/requests` | read | pending questions (not subagent calls) of every session (or `session`), one page at a time: newest run first (`order=oldest`), `tool`, `q` search, `limit` (default 100, at most 1000), `before` = the previous page's `next`; with `tools`, the tools of the live runs |
//! | `GET /v1/sessions/{id}/tasks` | read | the session's background runs (its task index) |
//! | `GET /v1/sessions/{id}` | read | the session's record: `endedAt` (null while live) and the user messages queued for its next turn |
//! | `GET /v1/runs` | read | runs, filtered (`session`, `status`, `tool`, `q` search, `since`/`until`), `order=newest`, paged (`limit`, `before` = the previous page's `next`), with `counts` by status |
//! | `GET /v1/runs/{id}` | read | one run's record and journal |
//! | `POST /v1/runs/{id}/cancel`, `…/resume`, `…/fail` | operate | cancel any run (`{"reason"}` optional); resume a blocked run; fail a blocked run with `{"error"}` |
//! | `POST /v1/runs/{id}/retry`, `…/reset` | operate | start a new run from an ended run's journal: `retry` a failed run from the first attempt of the step that failed it (else from where its end begins), `reset` any ended run to `{"to": seq}` (its events before `to` are copied, request ids rewritten; the new run's `RunStarted` names the old run in `resetFrom`); pinned to this server's deployment when its registry has the workflow. 201 `{"run", "created", "from", "copied"}`, 200 when the same reset was made before (idempotent); 409 `not_ended` for a live run (terminate or cancel it first); 400 for a bad `to` or a run that did not fail (retry); 404 unknown |
//! | `POST /v1/runs/{id}/terminate` | operate | end a live run at once with `{"reason", "by"?}` (no grace, no cleanup; `by` is the key's name when there is a key): 200 `{"seq"}`, 409 `not_live` for an ended run (the message names its status), 404 unknown |
//! | `POST /v1/requests/{id}/answer` | answer | answers a request with `{"optionId": …}` or `{"text": …}`; the journal records the key's name as `answeredBy` (none with [`ServerConfig::insecure_no_auth`]) |
//! | `POST /v1/requests/{id}/links` | operate | mints an answer link for a pending request, `{"expiresIn"?: "4h"}` (default one day, at most 30 days): 201 `{"url", "expiresAt", "linkId", "requestId"}` (see [`create_answer_link`], "Answer links" below) |
//! | `GET /answer/{token}`, `GET /v1/links/{token}`, `POST /v1/links/{token}/answer` | (the link) | an answer link's page of its one request, that request as JSON, and its answer (`{"optionId"}` or `{"text"}`, recorded with `answeredBy` = `link:<id>`); once answered the link is used up (410 `link_used`), 410 `link_expired` after its expiry, 404 unknown or forged |
//! | `POST /v1/agents/{id}/result` | answer | reports a subagent call's result, `{"output": …}` (checked against the call's `outputSchema`: 422 naming the path, nothing recorded) or `{"error": …}`, once (the same again is a duplicate, another 409, after the run ended 410) |
//! | `POST /v1/hooks/{token}` | operate | delivers the JSON body to the live hook `ctx.create_hook(token)` made, as `eve hook resume`: 200 `{"token", "runId", "seq", "duplicate"}`, exactly once per `Idempotency-Key` (a retry is `duplicate: true`; another payload under the same key 409 `idempotency_mismatch`); 404 no live hook has the token (or it is a webhook's or an agent call's), 400 a body that is not JSON |
//! | `POST /v1/tasks/{id}/cancel` | operate | requests cancellation of a background run |
//! | `POST /v1/sessions/{id}/end` | operate | ends the session for every handle (new calls in it are 409 `session_ended`) and cancels its runs that have not ended: `{"endedAt", "cancelled"}` |
//! | `GET /v1/events?session=A&session=B` | read | several sessions' logs (at most [`MAX_STREAM_SESSIONS`]) as one SSE stream; `id:` is a cursor (`{"A":4,"B":9}`) that `Last-Event-ID` or `?from=` resumes every session from |
//! | `GET /v1/tools` | read | the tools this server starts: `name`, `description`, `execution`, `inputSchema` |
//! | `POST /v1/tools/{name}/calls?wait=30s` | operate | starts a call with `{session, callId, input}`: 201, 200 on a retry, 409 on the same key with another input (`idempotency_mismatch`) or in an ended session (`session_ended`), 400 `invalid_input` naming the field of an input its schema refuses; `wait` long-polls a default-execution call until it settles; a background call's answer carries its receipt, `"status": "working"` and `"taskId"` (the run id) |
//! | `POST /v1/sessions/{id}/messages` | operate | a user message `{"message", "policy": "queue" \| "steer"}`, as `Session::user_message`: `delivered`, `queued` or `steered`; 409 `session_ended` |
//! | `GET /v1/sessions/{id}/turn?wait=30s&from=N` | operate | `next_turn`: the queued messages (and, with `from`, background tasks' notices) once no call is parked; 204 when none within `wait` (at most [`MAX_TURN_WAIT`]) |
//! | `POST /v1/sessions/{id}/tasks/{task}/cancel` | operate | `task_cancel` of the session's task; 404 not its task, 409 `not_a_task` for a default-execution call |
//! | `GET /v1/keys`, `POST /v1/keys`, `POST /v1/keys/{id}/revoke` | admin | list, create (`{"name", "scope", "sessions"?}`; the key is in the answer only) and revoke API keys (answer links are listed and revocable too) |
//! | `POST /v1/auth/session`, `DELETE /v1/auth/session` | (the key in the body) | signs the page in with `{"key": …}` (an HttpOnly, SameSite=Strict cookie), signs it out |
//! | `GET /v1/auth/session` | read | who is signed in: the key's `name`, `keyId` and `scope` |
//! | `GET /` | none | a page for a person: sign in with a key, then pending requests to answer, live updates, the runs and their journals |
//! | `GET /requests`, `/runs`, `/runs/{id}`, `/sessions`, `/sessions/{id}`, `/keys` | none | the same page, opened at that view (deep links) |
//! | `GET /metrics` | read | Prometheus text format (see [`Metrics`]) |
//! | `GET /healthz`, `GET /readyz` | none | the process answers; the store answers (within 1 s, else 503) |
//! | `GET /v1/openapi.json` | none | the OpenAPI 3.1 description of every route above (generated from the handlers and their types by utoipa) |
//!
//! The server holds no state of its own beyond caches: every answer comes from the store, so
//! several server processes may serve one store, and a restarted server continues where the
//! last one stopped (an SSE client reconnecting with `Last-Event-ID` misses nothing). Run a
//! [`Worker`](eve_core::engine::Worker) beside it to execute the runs.
//!
//! # One dialect
//!
//! Every JSON field name the API sends or takes is camelCase (`runId`, `sessionId`,
//! `createdAt`), as the journal's requests and answers and MCP are; records of eve-core that
//! stores keep in snake_case (runs, journal events, session log entries, keys) are renamed at
//! the API's edge. Values are not field names and keep their form (`"already_requested"`,
//! error codes such as `not_found`), and so do payloads: a tool's input and output, a
//! webhook's body and headers reach clients with the keys their authors chose. Request fields
//! that shipped in snake_case stay accepted, listed in [`DEPRECATED_REQUEST_FIELDS`].
//!
//! Ids a client chooses — the session and call id of a call, the session in a URL or a
//! filter, a key's name — are checked by [`eve_core::check_client_id`]: non-empty, at most
//! [`eve_core::MAX_CLIENT_ID_BYTES`] bytes, printable. Another is refused with 400
//! `invalid_id` naming the field and the limit, before anything is read or written.
//!
//! Errors are JSON objects `{"code": "...", "message": "..."}` with a status that says the
//! kind: 400 malformed request, 401 no usable key (with `WWW-Authenticate: Bearer realm="eve"`,
//! and `error="invalid_token"` when a key was sent but opens nothing), 403 a key of too small a scope or a
//! cross-origin browser request, 404 unknown id or token, 409 already answered (or not a task),
//! 410 withdrawn, 413 body too large, 421 a `Host` this server does not answer for, 422
//! invalid answer, 503 store unavailable (retry after the `Retry-After` seconds it carries).
//!
//! # Store outages
//!
//! When the store cannot be reached (a database restart, a dropped connection, a partition),
//! every route that needs it answers 503 `unavailable` with `Retry-After: 1` and a message for
//! the caller (the store's own wording goes to the log only); reads and writes resume by
//! themselves once it answers, without a restart. `/readyz` answers within 1 s whatever the
//! store's connection timeouts, so a load balancer sees the outage at once. The first failure
//! logs one `warn` line, "store unreachable since …"; the server then probes the store every
//! 0.5 s and logs one `info` line, "store reachable again; outage of …", when it answers. A
//! webhook delivery recorded just before the store went away answers 503 asking for a retry
//! with the same `Idempotency-Key` (which gets the webhook's configured response) rather than
//! a default 202.
//!
//! # Security
//!
//! - **Keys.** Every route but webhooks (their ≥128-bit token is the credential, which is why
//!   the runs API shows tokens redacted), the page's HTML, the health routes and
//!   `/v1/openapi.json` needs an API key
//!   (`Authorization: Bearer eve_…`, or the page's cookie) of the route's scope; scopes are
//!   ordered read < answer < operate < admin. Keys are minted by [`create_key`], stored as
//!   SHA-256 hashes by the store (contract clause 8), compared in constant time, revocable.
//!   [`ServerConfig::insecure_no_auth`] turns this off, for tests only.
//! - **Session-limited keys.** A key may be limited to sessions (`eve keys create --session S`,
//!   `POST /v1/keys` with `"sessions"`, [`create_key_limited`]). The limit narrows the key's
//!   scope and never widens it: the scope is checked first, then the session. Routes that name
//!   a session check it; routes that name a run, task or request check that run's session;
//!   `GET /v1/events` checks every `session=`; `POST /v1/tools/{name}/calls` checks the body's
//!   `session`; `GET /v1/requests`, `/v1/agents` and `/v1/runs` refuse a `session=` outside the
//!   key's and otherwise list only its sessions' entries (counts included). `GET /v1/tools`,
//!   `/v1/auth/session` and `/metrics` show no session's data and are allowed. Every other
//!   route (keys, `/mcp`, hooks, any route not named here) is 403 for a limited key. Outside
//!   its sessions a limited key gets 403 `forbidden` and nothing is written; an unknown run or
//!   request is 404 as for any key.
//! - **Answer links.** A link ([`create_answer_link`], `POST /v1/requests/{id}/links`) is a
//!   capability for one pending request: a 256-bit random token, stored (hashed) as a key
//!   record of scope answer limited to that request and its session, with an expiry. It opens
//!   that request's page and answer only, never an API route; it is used up by the answer it
//!   gives (a replay is 410 and writes nothing), and the journal records `link:<id>` as who
//!   answered. Being a store record, it works on every server process of the store and
//!   survives restarts.
//! - **Host.** A request whose `Host` is neither the base URL's host nor a loopback name
//!   (`localhost`, `127.0.0.1`, `[::1]`) is refused 421, so a page that rebinds its DNS name to
//!   this server's address (DNS rebinding) reaches nothing.
//! - **Origin.** Browser requests that act (answer, cancel, sign in, keys) must come from the
//!   configured origin (or the same port on a loopback name), never compared with the request's
//!   own `Host`; clients that send no `Origin` header (curl, the CLI) are not affected.
//! - **Headers.** Every response carries `X-Content-Type-Options: nosniff`,
//!   `Referrer-Policy: no-referrer`, `X-Frame-Options: DENY` and a content security policy with
//!   `frame-ancestors 'none'`.
//!
//! ```no_run
//! # async fn demo(store: std::sync::Arc<dyn eve_core::JournalStore>) -> std::io::Result<()> {
//! use eve_server::{serve, AppState};
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8787").await?;
//! serve(listener, AppState::new(store, std::sync::Arc::new(eve_core::engine::SystemClock))).await
//! # }
//! ```

mod auth;
mod calls;
mod camel;
mod error;
mod guard;
mod health;
mod hooks;
mod limits;
mod links;
mod metrics;
mod openapi;
mod outage;
mod page;
mod requests;
mod runs;
mod session;
mod turns;
mod webhook;

pub use auth::{
    create_key, create_key_expiring, create_key_limited, key_hash, NewKey, COOKIE, KEY_PREFIX,
};
pub use calls::MAX_WAIT;
pub use error::ApiError;
pub use links::{
    create_answer_link, AnswerLink, DEFAULT_LINK_TTL, LINK_PATH, LINK_PREFIX, MAX_LINK_TTL,
};
pub use metrics::{Metrics, SpanMetrics};
pub use requests::{DEFAULT_REQUESTS_PAGE, MAX_REQUESTS_PAGE};
pub use session::MAX_STREAM_SESSIONS;
pub use turns::MAX_TURN_WAIT;
pub use webhook::{
    is_sensitive_header, is_webhook_token, IDEMPOTENCY_KEY_MAX, MAX_JSON_DEPTH, SENSITIVE_HEADERS,
    SENSITIVE_SUFFIXES,
};

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use eve_core::engine::{Clock, Registry};
use eve_core::{JournalStore, KeyScope, RunId, WebhookResponse};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// The URL path prefix every webhook lives under (the same as
/// [`eve_core::engine::WEBHOOK_PATH`]).
pub const WEBHOOK_PATH: &str = eve_core::engine::WEBHOOK_PATH;

/// Request fields accepted under a deprecated snake_case spelling because they shipped that
/// way: `(route, deprecated name, name to send)`. Responses use only the camelCase names.
pub const DEPRECATED_REQUEST_FIELDS: &[(&str, &str, &str)] =
    &[("POST /v1/tools/{name}/calls", "call_id", "callId")];

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
    /// Serve every route without a key (default false). For tests only: anyone who reaches
    /// the server then reads every journal, answers every request and cancels every task.
    /// Answers then record no `answered_by` (there is no key to name).
    pub insecure_no_auth: bool,
    /// Webhook request headers left out of the journaled payload beside those of the built-in
    /// rule ([`SENSITIVE_HEADERS`], names ending in one of [`SENSITIVE_SUFFIXES`]);
    /// case-insensitive names, default none.
    pub webhook_drop_headers: Vec<String>,
    /// Sensitive headers journaled anyway, for tools that must see them (e.g. a sender that
    /// signs with `authorization`, or `x-gitlab-token` checked by the tool); default none.
    pub webhook_keep_headers: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            body_limit: DEFAULT_BODY_LIMIT,
            base_url: "http://127.0.0.1:8787".into(),
            poll_interval: DEFAULT_POLL_INTERVAL,
            insecure_no_auth: false,
            webhook_drop_headers: Vec::new(),
            webhook_keep_headers: Vec::new(),
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
    /// Where the server counts (see [`Metrics`]); fresh ones by default.
    pub metrics: Arc<Metrics>,
    /// The tools `GET /v1/tools` lists and `POST /v1/tools/{name}/calls` starts; none by
    /// default.
    pub registry: Option<Registry>,
    /// An MCP endpoint (e.g. `eve_mcp::router_for`) mounted at `/mcp` behind an operate key,
    /// the Host allow-list and the same-origin check; none by default.
    pub mcp: Option<Router>,
}

impl AppState {
    /// A state with the default [`ServerConfig`].
    pub fn new(store: Arc<dyn JournalStore>, clock: Arc<dyn Clock>) -> Self {
        Self {
            store,
            clock,
            config: ServerConfig::default(),
            metrics: Metrics::new(),
            registry: None,
            mcp: None,
        }
    }

    /// The same state serving `mcp` at `/mcp` (MCP's streamable HTTP transport), behind an
    /// API key of scope operate (`Authorization: Bearer <key>`) unless
    /// [`ServerConfig::insecure_no_auth`].
    pub fn with_mcp(mut self, mcp: Router) -> Self {
        self.mcp = Some(mcp);
        self
    }

    /// The same state starting calls of `registry`'s tools over HTTP.
    pub fn with_registry(mut self, registry: Registry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// The same state counting into `metrics` (shared with a [`Metrics::layer`], so `/metrics`
    /// shows the worker's steps too).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The same state with `config`.
    pub fn with_config(mut self, config: ServerConfig) -> Self {
        self.config = config;
        self
    }
}

/// A webhook's `respond_with`, cached per `(run, token)` (a token names one hook of a run): it
/// never changes once recorded.
type HookCache = HashMap<(RunId, String), Option<WebhookResponse>>;

/// At most this many webhooks' responses are cached; the cache is emptied when full.
const HOOK_CACHE_MAX: usize = 4096;

/// Shared by every handler of one router.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) store: Arc<dyn JournalStore>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) config: ServerConfig,
    /// The host and origin of `config.base_url`, for the host and origin checks.
    pub(crate) origins: guard::Origins,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) registry: Option<Registry>,
    /// Bumped after every write this server makes, so SSE streams look at once.
    pub(crate) changed: watch::Sender<u64>,
    /// Set when the server shuts down: SSE streams end, so connections can close.
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) hooks: Mutex<HookCache>,
    /// The store outage in progress, if any (logged at its start and end).
    pub(crate) outage: Arc<outage::Outage>,
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
    use axum::middleware::{from_fn, from_fn_with_state};
    let body_limit = state.config.body_limit;
    let inner = Arc::new(Inner {
        store: state.store,
        clock: state.clock,
        origins: guard::Origins::of(&state.config.base_url),
        metrics: state.metrics,
        registry: state.registry,
        config: state.config,
        changed: watch::Sender::new(0),
        shutdown,
        hooks: Mutex::new(HashMap::new()),
        outage: Arc::default(),
    });
    let scope = |s: KeyScope| from_fn_with_state((inner.clone(), s), auth::require);
    let mcp = state.mcp;
    let read = Router::new()
        .route("/v1/sessions/{id}/events", get(session::events))
        .route("/v1/events", get(session::events_many))
        .route("/v1/sessions/{id}/requests", get(session::requests))
        .route("/v1/requests", get(requests::list))
        .route("/v1/sessions/{id}/tasks", get(session::tasks))
        .route("/v1/sessions/{id}", get(session::record))
        .route("/v1/runs", get(runs::list))
        .route("/v1/runs/{id}", get(runs::show))
        .route("/metrics", get(metrics::scrape))
        .route("/v1/tools", get(calls::list))
        .route("/v1/agents", get(requests::list_agents))
        .route("/v1/auth/session", get(auth::whoami))
        .route_layer(scope(KeyScope::Read));
    let answer = Router::new()
        .route("/v1/requests/{id}/answer", post(session::answer))
        .route("/v1/agents/{id}/result", post(requests::complete_agent))
        .route_layer(scope(KeyScope::Answer));
    let mut operate = Router::new()
        .route("/v1/tasks/{id}/cancel", post(session::cancel))
        .route("/v1/sessions/{id}/end", post(session::end))
        .route("/v1/requests/{id}/links", post(links::create))
        .route("/v1/tools/{name}/calls", post(calls::start))
        .route("/v1/runs/{id}/cancel", post(runs::cancel))
        .route("/v1/runs/{id}/resume", post(runs::resume))
        .route("/v1/runs/{id}/fail", post(runs::fail))
        .route("/v1/runs/{id}/terminate", post(runs::terminate))
        .route("/v1/runs/{id}/retry", post(runs::retry))
        .route("/v1/runs/{id}/reset", post(runs::reset))
        .route("/v1/hooks/{token}", post(hooks::resume))
        .route("/v1/sessions/{id}/messages", post(turns::message))
        .route("/v1/sessions/{id}/turn", get(turns::turn))
        .route(
            "/v1/sessions/{id}/tasks/{task}/cancel",
            post(turns::cancel_task),
        );
    if let Some(mcp) = mcp {
        operate = operate.nest_service("/mcp", mcp);
    }
    let operate = operate.route_layer(scope(KeyScope::Operate));
    let admin = Router::new()
        .route("/v1/keys", get(auth::list).post(auth::create))
        .route("/v1/keys/{id}/revoke", post(auth::revoke))
        .route_layer(scope(KeyScope::Admin));
    // What a person does (answer, cancel, sign in, manage keys) must not be doable by another
    // web site the person visits: cross-origin browser requests are refused.
    let acts = answer
        .merge(operate)
        .merge(admin)
        .route(
            "/v1/auth/session",
            post(auth::sign_in).delete(auth::sign_out),
        )
        .route("/v1/links/{token}/answer", post(links::answer))
        .route_layer(from_fn_with_state(inner.clone(), guard::same_origin));
    Router::new()
        .route(
            "/.well-known/workflow/v1/webhook/{token}",
            post(webhook::receive)
                .put(webhook::receive)
                .patch(webhook::receive),
        )
        .merge(read)
        .merge(acts)
        .route("/", get(page::index))
        .route("/requests", get(page::requests))
        .route("/runs", get(page::runs))
        .route("/runs/{id}", get(page::run))
        .route("/sessions", get(page::sessions))
        .route("/sessions/{id}", get(page::session))
        .route("/keys", get(page::keys))
        .route("/answer/{token}", get(links::page))
        .route("/v1/links/{token}", get(links::show))
        .route("/v1/openapi.json", get(openapi::document))
        .route("/healthz", get(health::alive))
        .route("/readyz", get(health::ready))
        .fallback(error::not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(from_fn_with_state(inner.clone(), guard::host))
        .layer(from_fn(error::json_errors))
        .layer(from_fn(guard::headers))
        .layer(from_fn_with_state(inner.clone(), outage::watch))
        .layer(from_fn_with_state(inner.clone(), metrics::access_log))
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
