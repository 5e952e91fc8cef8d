//! One MCP connection's handler: tools from the registry, calls as runs, tasks read from the
//! store.

use crate::error::{from_engine, from_store, invalid};
use crate::task::{self, RunView};
use crate::wire::{clip, MAX_ID};
use crate::{
    McpServer, META_CALL_KEY, META_EXECUTION, META_MAY_ASK, META_NEEDS_APPROVAL, META_TRACEPARENT,
};
use eve_core::engine::tool_call_run;
use eve_core::wake::{Waiter, WatchKey};
use eve_core::{CallId, Execution, InputRequest, RequestId, RunId, RunRecord, SessionId};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
    CreateTaskResult, GetTaskParams, GetTaskResult, Implementation, InputRequiredResult,
    InputResponses, JsonObject, ListToolsResult, MetaObject, PaginatedRequestParams,
    ProtocolVersion, ServerCapabilities, ServerConfig, Tool, UpdateTaskParams,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// The handler of one MCP connection; its calls' runs belong to `session`.
#[derive(Clone, Debug)]
pub(crate) struct Connection {
    pub(crate) server: McpServer,
    pub(crate) session: SessionId,
    /// Set by the connection's `initialize`: a second one is refused.
    pub(crate) initialized: Arc<AtomicBool>,
    /// The eve session `initialize` named ([`crate::META_SESSION`]), if it did.
    pub(crate) named: Arc<OnceLock<SessionId>>,
}

/// Whether `id` may name a session: 1 to 128 printable ASCII characters.
pub(crate) fn session_id_ok(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_graphic())
}

/// The reason written in `CancelRequested` by `tasks/cancel`.
const REASON_CANCEL: &str = "tasks/cancel";

impl Connection {
    fn tool(t: &eve_core::engine::WorkflowTool) -> Tool {
        let schema = match t.input_schema() {
            Value::Object(m) => m.clone(),
            _ => JsonObject::new(),
        };
        let mut meta = JsonObject::new();
        meta.insert(META_MAY_ASK.into(), Value::Bool(t.may_wait_for_input()));
        meta.insert(
            META_NEEDS_APPROVAL.into(),
            Value::Bool(t.requires_approval()),
        );
        meta.insert(
            META_EXECUTION.into(),
            json!(match t.execution() {
                Execution::Default => "default",
                Execution::Background => "background",
            }),
        );
        let tool = Tool::new(
            t.name().to_owned(),
            t.description().to_owned(),
            Arc::new(schema),
        )
        .with_meta(MetaObject(meta));
        match t.output_schema() {
            Some(Value::Object(o)) => tool.with_raw_output_schema(Arc::new(o.clone())),
            _ => tool,
        }
    }

    /// An ordinary tool of default execution as MCP lists it: it never waits for input and
    /// runs inline in the call.
    fn ordinary(t: &eve_core::engine::Tool) -> Tool {
        let schema = match t.input_schema() {
            Value::Object(m) => m.clone(),
            _ => JsonObject::new(),
        };
        let mut meta = JsonObject::new();
        meta.insert(META_MAY_ASK.into(), Value::Bool(false));
        meta.insert(META_EXECUTION.into(), json!("default"));
        Tool::new(
            t.name().to_owned(),
            t.description().to_owned(),
            Arc::new(schema),
        )
        .with_meta(MetaObject(meta))
    }

    /// Calls an ordinary tool of default execution inline, in task mode too (there is no run
    /// to make a task of): the arguments are checked as a workflow tool's (-32602
    /// `invalid_input` naming what is wrong), then the tool runs once and its output (or its
    /// error, as `isError`) is the result. Nothing is stored.
    async fn call_inline(
        &self,
        tool: &eve_core::engine::Tool,
        request: &CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = Value::Object(request.arguments.clone().unwrap_or_default());
        check_size(&request.name, &args, self.server.config.max_arguments_bytes)?;
        tool.validate(&args).map_err(from_engine)?;
        let tctx = eve_core::engine::ToolCtx::inline(
            self.session(ctx),
            CallId::new(format!("mcp-request:{}", ctx.id)),
            tool.name(),
        );
        Ok(CallToolResponse::Complete(
            match tool.call(tctx, args).await {
                Ok(output) => task::completed(&eve_core::Payload::from(output)),
                Err(error) => CallToolResult::error(vec![ContentBlock::text(error)]),
            },
        ))
    }

    /// The `Mcp-Session-Id` of a request over streamable HTTP with sessions.
    fn mcp_session(ctx: &RequestContext<RoleServer>) -> Option<&str> {
        ctx.extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
            .filter(|id| session_id_ok(id))
    }

    /// The eve session of a request: the one `initialize` named, else `mcp_<Mcp-Session-Id>`
    /// over streamable HTTP with sessions, else the connection's own.
    fn session(&self, ctx: &RequestContext<RoleServer>) -> SessionId {
        let mcp = Self::mcp_session(ctx);
        if let Some(named) = self.named.get() {
            if let Some(id) = mcp {
                self.server.host.name(id, named.clone());
            }
            return named.clone();
        }
        mcp.map_or_else(
            || self.session.clone(),
            |id| SessionId::new(format!("mcp_{id}")),
        )
    }

    /// What names this request's transport in [`crate::host::HostState`]'s stops: the
    /// `Mcp-Session-Id` over HTTP, else the connection's own session id.
    fn transport_key(&self, ctx: &RequestContext<RoleServer>) -> String {
        Self::mcp_session(ctx).map_or_else(|| self.session.as_str().to_owned(), str::to_owned)
    }

    /// Creates (or finds, for a repeated identity) the run of a call.
    async fn start(
        &self,
        request: &CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<RunRecord, ErrorData> {
        let config = &self.server.config;
        let args = Value::Object(request.arguments.clone().unwrap_or_default());
        check_size(&request.name, &args, config.max_arguments_bytes)?;
        // rmcp moves a request's `_meta` into the context.
        let key = match request
            .meta
            .as_ref()
            .and_then(|m| m.get(META_CALL_KEY))
            .or_else(|| ctx.meta.get(META_CALL_KEY))
        {
            None => None,
            Some(Value::String(k)) if !k.is_empty() && k.chars().count() <= MAX_ID => {
                Some(k.clone())
            }
            Some(other) => {
                return Err(invalid(
                    "invalid_input",
                    format!(
                    "_meta[{META_CALL_KEY:?}] must be a string of 1 to {MAX_ID} characters, got {}",
                    clip(&other.to_string())
                ),
                ))
            }
        };
        let call = CallId::new(match &key {
            Some(k) => format!("mcp-key:{k}"),
            None => format!("mcp-request:{}", ctx.id),
        });
        let session = self.session(ctx);
        let mut new = tool_call_run(&self.server.registry, &session, &call, &request.name, args)
            .map_err(from_engine)?;
        // `_meta.traceparent` (W3C trace context): the run joins the client's trace. A
        // malformed value is ignored, and the run starts a trace of its own.
        new.traceparent = request
            .meta
            .as_ref()
            .and_then(|m| m.get(META_TRACEPARENT))
            .or_else(|| ctx.meta.get(META_TRACEPARENT))
            .and_then(Value::as_str)
            .and_then(eve_core::trace::TraceContext::parse)
            .map(|c| c.to_string());
        if let Some(k) = key {
            // A client key names the call across connections and processes.
            new.idempotency_key = Some(format!("mcp-key:{k}"));
        }
        let created = match &self.server.worker {
            Some(w) => w.start(new).await,
            None => {
                self.server
                    .store
                    .create_run(new, self.server.clock.now())
                    .await
            }
        };
        Ok(created.map_err(from_store)?.run)
    }

    /// Answers `responses` for the run `view` shows: every entry is checked first
    /// ([`task::plan`]), so one bad entry rejects the whole update and writes nothing; then each
    /// answer is written exactly once (the store decides; a concurrent answer to the same
    /// request between the check and the write fails that entry alone).
    async fn answer_all(
        &self,
        view: &RunView,
        run: &RunId,
        responses: &InputResponses,
    ) -> Result<(), ErrorData> {
        for (id, response) in task::plan(view, run, responses)? {
            self.server
                .store
                .answer(&id, response, self.server.clock.now())
                .await
                .map_err(from_store)?;
        }
        Ok(())
    }

    /// Waits until `run` settles, sending progress notifications and asking the client for
    /// pending input as it can. Returns the tool result, or an `input_required` result for a
    /// 2026-07-28 client (which retries with `requestState` = the run id).
    ///
    /// Never silent: a request the client cannot be asked (no elicitation), or that the person
    /// declined with nothing to choose for them, is announced to the host — what it waits for
    /// and where it can be answered ([`crate::host::notice`]) — as a progress notification
    /// (repeated every [`crate::McpConfig::notice_interval`], so client timeouts that reset on
    /// progress never fire) when the call sent a progress token, and once as a
    /// `notifications/message`. The host's stop (`notifications/cancelled` of this request)
    /// cancels the run; a closed connection leaves it going.
    async fn settle(
        &self,
        run: &RunRecord,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let store = &*self.server.store;
        let version = ctx.protocol_version();
        let mrtr = version
            .as_ref()
            .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
        let caps = ctx.client_capabilities();
        let elicit = !mrtr && caps.as_ref().is_some_and(|c| c.elicitation.is_some());
        let can_sample = caps.as_ref().is_some_and(|c| c.sampling.is_some());
        let mut waiter = Waiter::new(
            store,
            &WatchKey::Session(run.session_id.clone()),
            self.server.config.fallback_poll,
            crate::UNNOTIFIED_POLL,
        )
        .await;
        let mut view = RunView::default();
        let mut progress = crate::host::Progress::new(ctx.meta.get_progress_token());
        let mut elicited: HashSet<RequestId> = HashSet::new();
        // Requests the host was told about (not asked, or declined), with the notice repeated.
        let mut announced: HashMap<RequestId, String> = HashMap::new();
        let mut unasked: Vec<RequestId> = Vec::new();
        let mut beat = tokio::time::Instant::now() + self.server.config.notice_interval;
        let mut asking: tokio::task::JoinSet<Result<Option<RequestId>, ErrorData>> =
            tokio::task::JoinSet::new();
        loop {
            let before = view.progress.clone();
            view.refresh(store, &run.run_id).await?;
            if let Some(end) = &view.end {
                return Ok(CallToolResponse::Complete(match end {
                    task::End::Completed(output) => task::completed(output),
                    task::End::Failed(error) => {
                        CallToolResult::error(vec![ContentBlock::text(error.clone())])
                    }
                    task::End::Cancelled => CallToolResult::error(vec![ContentBlock::text(
                        "the run was cancelled before it finished",
                    )]),
                    task::End::Denied(reason) => task::denied(reason),
                }));
            }
            if let Some(value) = &view.progress {
                if before.as_ref() != Some(value) {
                    progress.send(&ctx.peer, task::render(value)).await;
                }
            }
            // A subagent call goes to the client as sampling: one that cannot serve it is told
            // so at once (the call stays pending, answerable elsewhere).
            if !can_sample {
                if let Some((id, call)) = view
                    .pending
                    .iter()
                    .find_map(|(id, r)| r.agent.as_ref().map(|call| (id, call)))
                {
                    return Err(crate::error::missing_sampling(&run.run_id, id, call));
                }
            }
            if mrtr && !view.pending.is_empty() {
                return Ok(CallToolResponse::InputRequired(InputRequiredResult::new(
                    Some(task::input_requests(
                        &run.run_id,
                        &view.pending,
                        self.server.config.sampling_max_tokens,
                    )),
                    Some(run.run_id.as_str().to_owned()),
                )));
            }
            for (id, request) in &view.pending {
                let sampling = request.agent.is_some();
                if (sampling || elicit) && elicited.insert(id.clone()) {
                    let this = self.clone();
                    let (run, id, request, peer) = (
                        run.run_id.clone(),
                        id.clone(),
                        request.clone(),
                        ctx.peer.clone(),
                    );
                    if sampling {
                        asking.spawn(async move {
                            this.sample(run, id, request, peer).await.map(|()| None)
                        });
                    } else {
                        asking.spawn(async move { Ok(this.elicit(run, id, request, peer).await) });
                    }
                } else if !sampling && !elicit && !elicited.contains(id) {
                    unasked.push(id.clone());
                }
            }
            // Tell the host about each request nobody is being asked in it.
            for id in unasked.drain(..) {
                let Some((_, request)) = view.pending.iter().find(|(r, _)| *r == id) else {
                    continue;
                };
                if !announced.contains_key(&id) {
                    let text = crate::host::notice(&self.server, &run.run_id, &id, request).await;
                    if announced.is_empty() {
                        beat = tokio::time::Instant::now() + self.server.config.notice_interval;
                    }
                    crate::host::announce(&ctx.peer, &run.run_id, &id, &text).await;
                    progress.send(&ctx.peer, text.clone()).await;
                    announced.insert(id.clone(), text);
                }
            }
            announced.retain(|id, _| view.pending.iter().any(|(r, _)| r == id));
            let heartbeat = progress.has_token() && !announced.is_empty();
            tokio::select! {
                () = waiter.wait() => {}
                () = tokio::time::sleep_until(beat), if heartbeat => {
                    beat = tokio::time::Instant::now() + self.server.config.notice_interval;
                    if let Some(text) = view.pending.iter().find_map(|(r, _)| announced.get(r)) {
                        progress.send(&ctx.peer, text.clone()).await;
                    }
                }
                Some(joined) = asking.join_next(), if !asking.is_empty() => match joined {
                    Ok(Err(e)) => return Err(e),
                    Ok(Ok(Some(id))) => unasked.push(id),
                    _ => {}
                },
                () = ctx.ct.cancelled() => {
                    if self.server.host.take_stop(&self.transport_key(ctx), &ctx.id) {
                        let outcome = store
                            .request_cancel(&run.run_id, crate::REASON_STOP, self.server.clock.now())
                            .await
                            .map_err(from_store)?;
                        tracing::info!(run = %run.run_id, ?outcome, "the host stopped the call: its run is cancelled");
                        return Err(ErrorData::internal_error(
                            format!("the host stopped the call: run {} is cancelled (its cleanup runs in the tool's grace period)", run.run_id),
                            None,
                        ));
                    }
                    return Err(ErrorData::internal_error(
                        format!("the connection closed; run {} goes on: call again with the same identity to wait for it", run.run_id),
                        None,
                    ));
                }
            }
        }
    }

    /// Sends one pending request to the client as `elicitation/create` and stores its answer.
    /// A request answered elsewhere meanwhile is left as it is. Returns the request when it is
    /// still pending because of the client: it declined with nothing to choose for the person,
    /// or the elicitation failed; the caller tells the host where else it can be answered.
    async fn elicit(
        self,
        run: RunId,
        id: RequestId,
        request: InputRequest,
        peer: rmcp::Peer<RoleServer>,
    ) -> Option<RequestId> {
        let params = match serde_json::from_value(task::form(&request)) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(request = %id, error = %e, "an input request does not fit an elicitation form");
                return Some(id);
            }
        };
        let result = match peer.create_elicitation(params).await {
            Ok(r) => serde_json::to_value(r).unwrap_or_default(),
            Err(e) => {
                tracing::info!(request = %id, error = %e, "elicitation failed; the request stays answerable elsewhere");
                return Some(id);
            }
        };
        let mut view = RunView::default();
        let responses: InputResponses = [(id.as_str().to_owned(), result)].into_iter().collect();
        let answered = match view.refresh(&*self.server.store, &run).await {
            Ok(()) => self.answer_all(&view, &run, &responses).await,
            Err(e) => Err(e),
        };
        match answered {
            Ok(()) => None,
            Err(e) => {
                tracing::info!(request = %id, error = %e.message, "the elicitation's answer was not recorded");
                Some(id)
            }
        }
    }
}

/// -32602 `too_large` when the arguments are over `limit` bytes of JSON.
fn check_size(name: &str, args: &Value, limit: usize) -> Result<(), ErrorData> {
    let size = serde_json::to_vec(args).map_or(usize::MAX, |v| v.len());
    if size > limit {
        return Err(invalid(
            "too_large",
            format!(
                "the arguments of {:?} are {size} bytes of JSON, the limit is {limit}; pass large data by reference",
                clip(name)
            ),
        ));
    }
    Ok(())
}

impl Connection {
    /// Sends one pending subagent call to the client as `sampling/createMessage` and records
    /// its result as the call's reply, exactly once (the store decides). A call answered
    /// elsewhere meanwhile is left as it is.
    ///
    /// # Errors
    /// What the blocking call fails with, the agent call staying pending: the client answered
    /// with an error, or with a result that is not the call's reply (not a sampling result,
    /// not JSON where the call has an output schema, an output that does not satisfy it).
    #[allow(deprecated)] // sampling: SEP-2577 deprecates it; eve maps `ctx.agent` onto it.
    async fn sample(
        self,
        run: RunId,
        id: RequestId,
        request: InputRequest,
        peer: rmcp::Peer<RoleServer>,
    ) -> Result<(), ErrorData> {
        let Some(call) = &request.agent else {
            return Ok(());
        };
        let params =
            crate::sampling::params(&run, &id, call, self.server.config.sampling_max_tokens);
        let params: rmcp::model::CreateMessageRequestParams = serde_json::from_value(params)
            .map_err(|e| {
                ErrorData::internal_error(
                    format!("the sampling request of {id} does not serialize: {e}"),
                    None,
                )
            })?;
        let result = match peer.create_message(params).await {
            Ok(r) => serde_json::to_value(r).unwrap_or_default(),
            Err(rmcp::ServiceError::McpError(e)) => {
                let mut data = serde_json::Map::new();
                data.insert("code".into(), json!("sampling_failed"));
                data.insert("taskId".into(), json!(run.as_str()));
                data.insert("requestId".into(), json!(id.as_str()));
                return Err(ErrorData::internal_error(
                    format!(
                        "the client answered the sampling request for subagent call {:?} of run {run} with an error ({}: {}); nothing was recorded: the call stays pending. Call again with the same identity to be asked again, or answer it with tasks/update or over HTTP (POST /v1/agents/{id}/result); to record that the child failed, answer with a result whose _meta[{:?}] says why",
                        clip(&call.key), e.code.0, clip(&e.message), crate::META_AGENT_ERROR
                    ),
                    Some(Value::Object(data)),
                ));
            }
            Err(e) => {
                tracing::info!(request = %id, error = %e, "sampling failed; the agent call stays answerable elsewhere");
                return Ok(());
            }
        };
        let mut view = RunView::default();
        let responses: InputResponses = [(id.as_str().to_owned(), result)].into_iter().collect();
        view.refresh(&*self.server.store, &run).await?;
        match self.answer_all(&view, &run, &responses).await {
            Ok(()) => Ok(()),
            Err(e)
                if e.data.as_ref().and_then(|d| d.get("code"))
                    == Some(&json!("invalid_answer")) =>
            {
                let mut e = e;
                e.message = format!(
                    "{}; nothing was recorded: the subagent call stays pending (call again with the same identity to be asked again, or answer it over HTTP)",
                    e.message
                )
                .into();
                if let Some(Value::Object(data)) = e.data.as_mut() {
                    data.insert("taskId".into(), json!(run.as_str()));
                    data.insert("requestId".into(), json!(id.as_str()));
                }
                Err(e)
            }
            Err(e) => {
                tracing::info!(request = %id, error = %e.message, "the sampling result was not recorded");
                Ok(())
            }
        }
    }
}

impl ServerHandler for Connection {
    #[allow(deprecated)] // logging: SEP-2577 deprecates it; eve's notices use it.
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .enable_logging()
                .build(),
        )
        .with_server_info(Implementation::new("eve", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Workflow tools of eve: durable runs that may pause for a person's input. Declare the tasks extension to get a task per call; otherwise calls block until the run settles.",
        )
    }

    /// The connection's handshake, once: a second `initialize` on a live connection is an
    /// error and changes nothing (the first one's client info and capabilities stay).
    async fn initialize(
        &self,
        request: rmcp::model::InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::InitializeResult, ErrorData> {
        if self.initialized.swap(true, Ordering::SeqCst) {
            return Err(ErrorData::invalid_request(
                "this connection is initialized already; a second initialize changes nothing (open a new connection to start over)",
                None,
            ));
        }
        let named = request
            .meta
            .as_ref()
            .and_then(|m| m.get(crate::META_SESSION))
            .or_else(|| context.meta.get(crate::META_SESSION));
        match named {
            None => {}
            Some(Value::String(id)) if session_id_ok(id) => {
                let _ = self.named.set(SessionId::new(id.as_str()));
            }
            Some(other) => {
                self.initialized.store(false, Ordering::SeqCst);
                return Err(invalid(
                    "invalid_input",
                    format!(
                        "_meta[{:?}] must be a string of 1 to 128 printable ASCII characters naming the eve session to attach to, got {}",
                        crate::META_SESSION,
                        clip(&other.to_string())
                    ),
                ));
            }
        }
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    /// Accepted; eve sends its notices (`notifications/message`, level notice) whatever the
    /// level.
    #[allow(deprecated)] // logging: SEP-2577 deprecates it; it is what hosts show today.
    async fn set_level(
        &self,
        _request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Ok(())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            self.server
                .registry
                .tools()
                .map(|t| Self::tool(t))
                .chain(
                    self.server
                        .registry
                        .ordinary_tools()
                        .map(|t| Self::ordinary(t)),
                )
                .collect(),
        ))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.server
            .registry
            .by_name(name)
            .map(|t| Self::tool(t))
            .or_else(|| {
                self.server
                    .registry
                    .ordinary(name)
                    .map(|t| Self::ordinary(t))
            })
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let run = match &request.request_state {
            // A 2026-07-28 retry after input_required: the state names the run.
            Some(state) => {
                let store = &*self.server.store;
                let run = task::get_run(store, state).await?;
                if run.tool != request.name {
                    return Err(invalid(
                        "invalid_input",
                        format!(
                            "requestState names a call of {:?}, not of {:?}; echo the requestState of this call's input_required result",
                            run.tool, clip(&request.name)
                        ),
                    ));
                }
                let mut view = RunView::default();
                view.refresh(store, &run.run_id).await?;
                let args = Value::Object(request.arguments.clone().unwrap_or_default());
                let recorded = view.input.as_ref().and_then(|p| p.to_value::<Value>().ok());
                if recorded.as_ref() != Some(&args) {
                    return Err(invalid(
                        "invalid_input",
                        format!(
                            "the arguments differ from those of the call requestState names (run {}); a retry repeats the original call's arguments",
                            run.run_id
                        ),
                    ));
                }
                if let Some(responses) = &request.input_responses {
                    self.answer_all(&view, &run.run_id, responses).await?;
                }
                run
            }
            None => {
                if let Some(t) = self.server.registry.ordinary(&request.name) {
                    return self.call_inline(t, &request, &context).await;
                }
                self.start(&request, &context).await?
            }
        };
        let tasks = context
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks());
        let background = self
            .server
            .registry
            .by_name(&run.tool)
            .is_some_and(|t| t.execution() == Execution::Background);
        if tasks || (background && request.request_state.is_none()) {
            // Pushed while it runs: status (task clients), progress, post_message, its end.
            tokio::spawn(crate::host::follow(
                self.server.clone(),
                run.run_id.clone(),
                run.session_id.clone(),
                context.peer.clone(),
                tasks,
                context.meta.get_progress_token(),
            ));
        }
        if tasks {
            let task = task::base_task(&run, self.server.config.task_poll_interval);
            return Ok(CallToolResponse::Task(CreateTaskResult::new(task)));
        }
        if background && request.request_state.is_none() {
            return Ok(CallToolResponse::Complete(task::receipt(&run)));
        }
        self.settle(&run, &context).await
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let store = &*self.server.store;
        let run = task::get_run(store, &request.task_id).await?;
        let mut view = RunView::default();
        view.refresh(store, &run.run_id).await?;
        // The record may lag the journal by nothing but the run's end, which the view has.
        Ok(GetTaskResult::new(task::detailed(
            &run,
            &view,
            self.server.config.task_poll_interval,
            self.server.config.sampling_max_tokens,
        )))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let store = &*self.server.store;
        let run = task::get_run(store, &request.task_id).await?;
        if request.input_responses.is_empty() {
            return Err(invalid(
                "invalid_input",
                "tasks/update needs inputResponses: one elicitation result per key of the task's inputRequests",
            ));
        }
        let mut view = RunView::default();
        view.refresh(store, &run.run_id).await?;
        self.answer_all(&view, &run.run_id, &request.input_responses)
            .await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let run = task::get_run(&*self.server.store, &request.task_id).await?;
        self.server
            .store
            .request_cancel(&run.run_id, REASON_CANCEL, self.server.clock.now())
            .await
            .map_err(from_store)?;
        Ok(())
    }
}
