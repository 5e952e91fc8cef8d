//! eve-mcp: eve's workflow tools over the Model Context Protocol, with eve as the durable task
//! store behind MCP's tasks extension (`io.modelcontextprotocol/tasks`).
//!
//! | MCP | eve |
//! | --- | --- |
//! | `tools/list` | the [`Registry`]: name, description, `inputSchema` (schemars), `outputSchema` when the tool declares its output type (`WorkflowTool::output_schema_of`); `_meta` says whether the tool may wait for input ([`META_MAY_ASK`], `WorkflowTool::may_wait_for_input`) how it executes ([`META_EXECUTION`]) and whether calls wait for an approval ([`META_NEEDS_APPROVAL`]) |
//! | `tools/call`, client declared tasks | a run; answered with a task whose `taskId` is the run id |
//! | `tools/call` of an ordinary tool of default execution (`#[tool]`) | no run: the tool runs inline in the call, for every client (with or without tasks), and its output (or its error, as `isError`) is the result; its arguments are checked as a workflow tool's (-32602 `invalid_input`). An ordinary `#[tool(background)]` is a workflow tool of one step: a run and a task like any other |
//! | `tools/call`, no tasks | a run; the call blocks until the run settles. Progress goes out as `notifications/progress` (when a progress token was sent); a pending `ctx.ask` goes to the client as `elicitation/create` (when it declared elicitation, protocol ≤ 2025-11-25) or as an `input_required` result whose `requestState` is the run id (protocol 2026-07-28) |
//! | `tasks/get` | the run read from the store: `working`, `input_required` (pending asks as elicitation forms), `completed`, `failed`, `cancelled`; `statusMessage` = the last progress value |
//! | approval (`WorkflowTool::needs_approval` / `approval`) | the approval request is an ask like any other (elicitation in a blocking call, `input_required` in task mode, options `approve` / `deny`); a denied call answers a tool result with `isError: true` and `_meta` [`META_DENIED`] `{"reason"}` (in task mode: a `completed` task with that result) |
//! | `tasks/update` | `JournalStore::answer`, exactly once, with the HTTP API's errors as JSON-RPC errors; all or nothing: every response is checked before any is written |
//! | a pending `ctx.agent` call (no `AgentHost`) | `sampling/createMessage` (the call in `_meta` under `eve/` keys, [`META_RUN`] …; a prompt a model can serve): server-to-client in a blocking call of a client that declared `sampling` (one that did not gets -32600 naming the capability, the call staying pending), an entry of `inputRequests` in task mode and 2026-07-28 rounds; the result's text is the output, checked against the call's output schema before it is recorded once |
//! | `tools/call` with `_meta` [`META_TRACEPARENT`] (W3C trace context) | the run's spans join the client's trace (`eve_core::trace`); a malformed value is ignored |
//! | `tasks/cancel` | `JournalStore::request_cancel` (the tool's grace period and cleanup steps apply); a finished task is acknowledged with the empty result and stays as it is (SEP-2663: cancellation is an acknowledged signal) |
//! | elicitation `decline` / `cancel` | an approval is denied; an ask takes its `deny` (decline) or `cancel` (cancel) option, either falling back to the other; an ask offering neither records nothing (`tasks/update`: -32602 `still_pending`; a blocking call keeps waiting and says where to answer) |
//! | `notifications/cancelled` of a waiting blocking call (the host's stop) | `request_cancel` with [`REASON_STOP`]; a connection that merely drops leaves the run going |
//! | `DELETE /mcp`, the end of a stdio connection | the eve session ends (`end_session`, its live runs cancelled), unless `initialize` named it ([`META_SESSION`]) |
//! | a call waiting for a request the client cannot be asked | a notice of what it waits for and where to answer it (the page, an [`AnswerLinks`] link, `eve answer`): `notifications/message`, and `notifications/progress` every [`McpConfig::notice_interval`] when the call sent a progress token |
//! | a task's life | pushed: `notifications/tasks` (task clients), `notifications/progress` (with a token), `post_message` and a background task's end as `notifications/message`; a blocking call of a background tool answers the receipt `{status: "working", taskId}` at once |
//!
//! Nothing lives only in this process: a task is a run in the journal, so a restarted server, or
//! another server on the same store, answers `tasks/get` for it.
//!
//! # Call identity
//!
//! A call's run is keyed (its idempotency key) by the client key in `_meta`
//! ([`META_CALL_KEY`], any non-empty string) when the client sends one: the same key again, from
//! any connection or server process, returns the same run (with other arguments it is a -32602
//! error). Without a key, the identity is the MCP connection's eve session + the JSON-RPC request
//! id, so a request retried on the same connection does not start a second run. A 2026-07-28
//! `input_required` retry names its run by the echoed `requestState`, and must repeat that
//! call's tool and arguments (other ones: -32602, nothing answered).
//!
//! # Errors
//!
//! Every incoming message is checked before rmcp parses it, on stdio and on HTTP alike:
//!
//! | input | reply (stdio; HTTP status) |
//! | --- | --- |
//! | not JSON | -32700, `"id": null` (HTTP 400) |
//! | not a JSON-RPC message eve reads: a batch, no `"jsonrpc": "2.0"`, an id that is neither an integer nor a string of at most 256 characters, a method that is not a string; nested deeper than 128 levels | -32600, `"id": null` (HTTP 400) |
//! | longer than [`McpConfig::max_message_bytes`] | -32600, `"id": null` (HTTP 413) |
//! | params of `initialize`, `tools/list`, `tools/call`, `tasks/get`, `tasks/update`, `tasks/cancel` that do not fit (`tasks/get {}`, non-object `arguments`, a non-string `name`, no `inputResponses`) | -32602 with the request's id, the message and `data.field` naming the field (HTTP 200) |
//! | a second `initialize` on a live connection | -32600; the first one's capabilities stay |
//!
//! A notification that does not parse gets no reply, as JSON-RPC says. Unknown tool, arguments
//! that do not match the schema, arguments over [`McpConfig::max_arguments_bytes`], a malformed or
//! unknown `taskId`, an answer whose option is not offered, an answer to a request already
//! answered or withdrawn: JSON-RPC -32602 with a message saying what is wrong and `data.code` the
//! HTTP API's code (`invalid_input`, `not_found`, `invalid_answer`, `already_answered`,
//! `withdrawn`, `too_large`). No run is created or changed, and a `tasks/update` with one bad
//! entry writes none of the others. Methods eve does not serve (prompts, resources, …): -32601.
//! Ids, names and keys echoed in errors and logs are cut to 200 characters; a call key
//! ([`META_CALL_KEY`]) is at most 256.
//!
//! # stdout
//!
//! [`serve_stdio`] owns stdout: the protocol writes to a descriptor of its own and fd 1 is
//! pointed at stderr (Unix), so a step's `println!`, a dependency's output or a child process
//! never reach the MCP stream.
//!
//! # Serving
//!
//! ```no_run
//! # async fn demo(store: std::sync::Arc<dyn eve_core::JournalStore>, registry: eve_core::engine::Registry) -> Result<(), Box<dyn std::error::Error>> {
//! use eve_core::engine::{SystemClock, Worker, WorkerConfig};
//! use std::sync::Arc;
//! let worker = Worker::new(store.clone(), registry.clone(), Arc::new(SystemClock), WorkerConfig::default()).await?;
//! let mcp = eve_mcp::McpServer::new(store, Arc::new(registry)).with_worker(worker.clone());
//! let running = worker.spawn();
//! eve_mcp::serve_stdio(mcp).await?; // or: axum::Router::new().nest_service("/mcp", eve_mcp::router(mcp))
//! running.shutdown().await;
//! # Ok(()) }
//! ```

mod error;
mod handler;
mod host;
mod sampling;
mod stdio;
mod task;
mod wire;

pub use error::McpServeError;
pub use host::REASON_STOP;
pub use sampling::{
    META_AGENT_ERROR, META_AGENT_ID, META_AGENT_KEY, META_MESSAGE, META_OUTPUT_SCHEMA,
    META_REQUEST, META_RUN, META_TARGET,
};

use eve_core::engine::{Clock, Registry, SystemClock, Worker};
use eve_core::{JournalStore, SessionId};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The `_meta` key of a tool call that carries the caller's W3C trace context: the run's
/// spans join that trace (a malformed value is ignored). See `eve_core::trace`.
pub const META_TRACEPARENT: &str = "traceparent";

/// The `_meta` key of a tool call that carries the client's call key (its identity; see the
/// crate docs).
pub const META_CALL_KEY: &str = "eve/callKey";
/// The `_meta` key of a listed tool saying whether it may wait for input (`ctx.ask`,
/// `ctx.agent`): `true` only for a tool that declares it (`WorkflowTool::waits_for_input`) or
/// whose `#[workflow]` body calls `.ask(..)` or `.agent(..)`.
pub const META_MAY_ASK: &str = "eve/mayWaitForInput";
/// The `_meta` key of a listed tool saying whether its calls pass an approval policy before the
/// body runs (`WorkflowTool::requires_approval`): the approval request reaches the client like
/// any ask (elicitation, or `input_required` in task mode).
pub const META_NEEDS_APPROVAL: &str = "eve/needsApproval";
/// The `_meta` key of a tool result (`isError: true`) whose call was denied by its approval
/// policy or the person asked: `{"reason": ".."}`. The body never ran.
pub const META_DENIED: &str = "eve/denied";
/// The `_meta` key of `initialize` naming the eve session the connection's calls belong to (a
/// string of 1 to 128 printable ASCII characters). A host that names its session keeps it past
/// its own process: neither a stdio EOF nor `DELETE /mcp` ends a named session (end it with
/// `POST /v1/sessions/{id}/end`), and the next connection that names it reattaches to its runs
/// and task index. Without it the session is `mcp_<id>` and ends with the connection (`DELETE
/// /mcp`, stdio EOF): new calls are refused and its runs that had not ended are cancelled.
pub const META_SESSION: &str = "eve/session";
/// The `_meta` key of a listed tool saying how it executes: `"default"` or `"background"`.
pub const META_EXECUTION: &str = "eve/execution";
/// The property of an elicitation form that holds the chosen option id.
pub const FIELD_OPTION: &str = "option";
/// The property of an elicitation form that holds free text.
pub const FIELD_TEXT: &str = "text";

/// How often a blocking call re-reads its run on a store that cannot notify it of changes.
pub const UNNOTIFIED_POLL: Duration = Duration::from_millis(100);

/// Tunables of an [`McpServer`].
#[derive(Clone, Debug)]
pub struct McpConfig {
    /// The largest `arguments` object accepted, in bytes of JSON (default 1 MiB, the HTTP API's
    /// body limit); a larger one is a -32602 error and starts nothing.
    pub max_arguments_bytes: usize,
    /// The `pollIntervalMs` suggested to task clients (default 500 ms).
    pub task_poll_interval: Duration,
    /// At most how long a blocking call sleeps between reads of its run on a store that notifies
    /// it (default 2 s; notifications wake it at once). On a store that cannot notify
    /// (DynamoDB) it re-reads every [`UNNOTIFIED_POLL`].
    pub fallback_poll: Duration,
    /// The longest JSON-RPC message accepted, in bytes (default 4 MiB, room for
    /// [`McpConfig::max_arguments_bytes`] of arguments): a longer stdio line is answered with
    /// -32600 (its rest skipped), a longer HTTP body with 413 and a -32600 body.
    pub max_message_bytes: usize,
    /// The `maxTokens` of the `sampling/createMessage` request that serves a subagent call
    /// (`ctx.agent`; default 4096).
    pub sampling_max_tokens: u32,
    /// Where a person answers requests on a page (e.g. `http://127.0.0.1:8787/requests`),
    /// named in the notice a waiting call sends the host (default: none, the notice names
    /// `eve answer`).
    pub page_url: Option<String>,
    /// Mints an answer link for a request a blocking call waits for, named in its notice so a
    /// person without a key can answer (default: none). `eve serve` mints eve-server's answer
    /// links (signed, single use, expiring).
    pub answer_links: Option<Arc<dyn AnswerLinks>>,
    /// How often a blocking call that waits for a person repeats its notice as a progress
    /// notification (when the call sent a progress token), so client timeouts that reset on
    /// progress never fire while a person has yet to answer (default 15 s).
    pub notice_interval: Duration,
}

impl Default for McpConfig {
    fn default() -> Self {
        Self {
            max_arguments_bytes: 1024 * 1024,
            task_poll_interval: Duration::from_millis(500),
            fallback_poll: Duration::from_secs(2),
            max_message_bytes: 4 * 1024 * 1024,
            sampling_max_tokens: 4096,
            page_url: None,
            answer_links: None,
            notice_interval: Duration::from_secs(15),
        }
    }
}

/// Mints answer links: a URL that lets a person with no key answer one pending request (for
/// example `eve_server::create_answer_link`). Named in the notice of a call that waits for the
/// request; it never widens what the MCP client itself may do (it can answer the request anyway).
#[async_trait::async_trait]
pub trait AnswerLinks: Send + Sync + fmt::Debug {
    /// A link answering `request`, or `None` when none can be made (the notice then names the
    /// page and `eve answer` only).
    async fn link(&self, request: &eve_core::RequestId) -> Option<String>;
}

/// An MCP server over a store and a registry. Cheap to clone; holds no state of its own: every
/// answer comes from the store. Each MCP connection gets its own eve session (`mcp_<uuid>`), in
/// which its calls' runs are started.
#[derive(Clone)]
pub struct McpServer {
    pub(crate) store: Arc<dyn JournalStore>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) worker: Option<Worker>,
    pub(crate) config: McpConfig,
    pub(crate) host: Arc<host::HostState>,
}

impl fmt::Debug for McpServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpServer")
            .field("store", &self.store.backend())
            .field("deployment", self.registry.deployment())
            .field("config", &self.config)
            .finish()
    }
}

impl McpServer {
    /// A server whose tools are `registry`'s, starting runs in `store`, stamped by the system
    /// clock. Runs are executed by whatever worker serves the registry's deployment on the store;
    /// give it this process' worker with [`McpServer::with_worker`].
    pub fn new(store: Arc<dyn JournalStore>, registry: Arc<Registry>) -> Self {
        Self {
            store,
            registry,
            clock: Arc::new(SystemClock),
            worker: None,
            config: McpConfig::default(),
            host: Arc::default(),
        }
    }

    /// Starts calls through `worker` (same store and deployment, running in this process): a
    /// call's run is created and claimed in one commit when the worker has room.
    pub fn with_worker(mut self, worker: Worker) -> Self {
        self.worker = Some(worker);
        self
    }

    /// Stamps deliveries with `clock` instead of the system clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The same server with `config`.
    pub fn with_config(mut self, config: McpConfig) -> Self {
        self.config = config;
        self
    }

    /// The handler of one MCP connection, in a new eve session.
    fn connection(&self) -> handler::Connection {
        handler::Connection {
            server: self.clone(),
            session: SessionId::new(format!("mcp_{}", uuid::Uuid::new_v4().simple())),
            initialized: Default::default(),
            named: Default::default(),
        }
    }
}

/// Serves MCP over this process' stdin and stdout (what desktop agent hosts launch) until the
/// client closes stdin.
///
/// stdout belongs to the protocol from here on: on Unix the protocol writer takes a descriptor
/// of its own for stdout and fd 1 is pointed at stderr, so whatever else the process prints (a
/// step's `println!`, a dependency, a child process) goes to stderr and never corrupts the MCP
/// stream. Every incoming line is checked before it is parsed (see the crate docs' *Errors*).
///
/// # Errors
/// stdout cannot be taken over, the MCP handshake fails, or the transport breaks.
pub async fn serve_stdio(server: McpServer) -> Result<(), McpServeError> {
    #[cfg(unix)]
    let out = stdio::take_stdout().map_err(McpServeError::Stdout)?;
    #[cfg(not(unix))]
    let out = tokio::io::stdout();
    let limit = server.config.max_message_bytes;
    serve_transport(
        server,
        stdio::LineTransport::new(tokio::io::stdin(), out, limit),
    )
    .await
}

/// Serves MCP over any rmcp transport (a pair of async streams, a socket) until it closes.
/// The connection's end ends its eve session as `DELETE /mcp` does (new calls refused, its
/// runs that had not ended cancelled), unless the host named its session at `initialize`
/// ([`META_SESSION`]): a named session outlives the connection.
///
/// # Errors
/// The MCP handshake fails, or the transport breaks.
pub async fn serve_transport<T, E, A>(server: McpServer, transport: T) -> Result<(), McpServeError>
where
    T: rmcp::transport::IntoTransport<rmcp::RoleServer, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let connection = server.connection();
    let watched = host::Watched {
        inner: transport.into_transport(),
        state: server.host.clone(),
        key: connection.session.as_str().to_owned(),
    };
    let running = connection
        .clone()
        .serve(watched)
        .await
        .map_err(|e| McpServeError::Handshake(e.to_string()))?;
    let served = running
        .waiting()
        .await
        .map_err(|e| McpServeError::Transport(e.to_string()));
    if connection.named.get().is_none() {
        host::end_session(&server, &connection.session).await;
    }
    served?;
    Ok(())
}

/// MCP's streamable HTTP transport as an axum router: mount it with
/// `Router::nest_service("/mcp", eve_mcp::router(server))`. Each MCP session (`Mcp-Session-Id`)
/// gets its own eve session; tasks outlive sessions and processes. Like rmcp's server, it only
/// accepts loopback `Host` headers (DNS rebinding protection); [`router_for`] also accepts the
/// host of a public URL. A JSON POST body is checked before rmcp reads it (invalid JSON: 400
/// with a -32700 body; see the crate docs' *Errors*), and `DELETE` of a session answers 204.
pub fn router(server: McpServer) -> axum::Router {
    http_router(server, StreamableHttpServerConfig::default())
}

/// [`router`] for a server reached at `base_url` (e.g. `https://agents.example.com`): `Host`
/// headers naming that host (with its port, if the URL has one) are accepted besides loopback.
pub fn router_for(server: McpServer, base_url: &str) -> axum::Router {
    let mut config = StreamableHttpServerConfig::default();
    let authority = base_url
        .split_once("://")
        .map_or(base_url, |(_, rest)| rest)
        .split(['/', '?', '#'])
        .next()
        .unwrap_or_default();
    if !authority.is_empty() && !config.allowed_hosts.iter().any(|h| h == authority) {
        config.allowed_hosts.push(authority.to_owned());
    }
    http_router(server, config)
}

fn http_router(server: McpServer, mut config: StreamableHttpServerConfig) -> axum::Router {
    let limit = server.config.max_message_bytes;
    config.max_request_body_bytes = limit;
    let connections = server.clone();
    let service = StreamableHttpService::new(
        move || Ok(connections.connection()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    axum::Router::new()
        .fallback_service(service)
        .layer(axum::middleware::from_fn(move |req, next| {
            http_checks(server.clone(), req, next)
        }))
}

/// In front of rmcp's HTTP transport: a JSON POST body is checked like a stdio line (invalid
/// JSON: 400 with a -32700 body; an invalid request: 400 with -32600; params that do not fit a
/// method eve serves: 200 with the -32602 error; a notification or response that does not parse:
/// 400 with -32600; too long: 413 with -32600); a `notifications/cancelled` is noted for the
/// call it stops; and a session closed by `DELETE` answers 204 (rmcp answers 202, which clients
/// log as a failure) and ends its eve session.
async fn http_checks(
    server: McpServer,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::{header, Method, StatusCode};
    use axum::response::IntoResponse;
    let limit = server.config.max_message_bytes;
    let mcp_session = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .filter(|id| handler::session_id_ok(id))
        .map(str::to_owned);
    let reply = |status: StatusCode, r: wire::Rejection| {
        tracing::info!(code = r.code.0, message = %r.message, "rejected an MCP message");
        (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            r.to_bytes(),
        )
            .into_response()
    };
    let json_body = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    match req.method().clone() {
        Method::POST if json_body => {
            let (parts, body) = req.into_parts();
            let Ok(bytes) = axum::body::to_bytes(body, limit).await else {
                return reply(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    wire::Rejection::too_long(limit),
                );
            };
            match wire::check(&bytes, limit) {
                wire::Checked::Reply(r) => {
                    let status = if r.code == rmcp::model::ErrorCode::INVALID_PARAMS {
                        StatusCode::OK
                    } else {
                        StatusCode::BAD_REQUEST
                    };
                    reply(status, r)
                }
                // A notification or response that does not parse: stdio drops it (JSON-RPC
                // answers no notification), but HTTP has a status to say it was not accepted
                // (the transport spec: an error status, a JSON-RPC error with no id).
                wire::Checked::Ignore => reply(
                    StatusCode::BAD_REQUEST,
                    wire::Rejection::invalid_request(
                        "Invalid Request: this notification or response does not parse as MCP (params must be an object of the method's fields); it was dropped",
                    ),
                ),
                // rmcp gets the message as eve parsed it (as on stdio), so what eve accepted
                // rmcp reads the same way (a duplicate key, for one, is resolved once, here).
                wire::Checked::Message(m) => {
                    if let Some(id) = &mcp_session {
                        server.host.note(id, &m);
                    }
                    let bytes = serde_json::to_vec(&m).map_or(bytes, Into::into);
                    next.run(axum::extract::Request::from_parts(parts, bytes.into()))
                        .await
                }
            }
        }
        Method::DELETE => {
            let response = next.run(req).await;
            if response.status() != StatusCode::ACCEPTED {
                return response;
            }
            if let Some(id) = &mcp_session {
                // A session the host named outlives its connections (see META_SESSION).
                if let Some(session) = server.host.session_of(id, true) {
                    host::end_session(&server, &session).await;
                }
            }
            let (mut parts, _) = response.into_parts();
            parts.status = StatusCode::NO_CONTENT;
            parts.headers.remove(header::CONTENT_LENGTH);
            parts.headers.remove(header::CONTENT_TYPE);
            axum::response::Response::from_parts(parts, axum::body::Body::empty())
        }
        _ => next.run(req).await,
    }
}
