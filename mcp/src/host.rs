//! What the person at the agent host does besides answering, and what the host is told: the
//! stop button (`notifications/cancelled` of a waiting call cancels its run), the end of a
//! session (`DELETE /mcp`, a stdio EOF), the notice of a call that waits for a person, and the
//! notifications pushed while a task runs.

use crate::task::{self, RunView};
use crate::McpServer;
use eve_core::engine::{cancel_runs, REASON_SESSION_END};
use eve_core::wake::{Waiter, WatchKey};
use eve_core::{InputRequest, RequestId, RunId, SessionId};
use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, JsonRpcMessage, ProgressNotificationParam,
    ProgressToken, ServerNotification, TaskStatusNotification, TaskStatusNotificationParams,
};
#[allow(deprecated)] // logging: SEP-2577 deprecates it; it is what hosts show today.
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::service::{RoleServer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::json;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};

/// The reason written in `CancelRequested` when the host stops a waiting blocking call.
pub const REASON_STOP: &str = "notifications/cancelled: the host stopped the call";

/// How many stops are remembered at most (a stop for a request that already finished is never
/// taken; the oldest are forgotten first).
const MAX_STOPS: usize = 4096;

/// What the host's transports said that rmcp does not tell a handler in time: the requests the
/// host stopped with `notifications/cancelled` (rmcp cancels a handler's token both for that and
/// for a closed connection, which must not cancel the run), and the eve sessions that MCP
/// sessions named at `initialize`.
#[derive(Debug, Default)]
pub(crate) struct HostState {
    /// (transport key, JSON-RPC request id) of each stopped request, oldest first.
    stops: Mutex<VecDeque<(String, String)>>,
    /// `Mcp-Session-Id` → the eve session its `initialize` named.
    named: Mutex<HashMap<String, SessionId>>,
}

impl HostState {
    /// Records a stop if `message` is a `notifications/cancelled` naming a request.
    pub(crate) fn note(&self, transport: &str, message: &ClientJsonRpcMessage) {
        let JsonRpcMessage::Notification(n) = message else {
            return;
        };
        let ClientNotification::CancelledNotification(c) = &n.notification else {
            return;
        };
        let Some(id) = &c.params.request_id else {
            return;
        };
        let mut stops = self.stops.lock().unwrap_or_else(|e| e.into_inner());
        if stops.len() >= MAX_STOPS {
            stops.pop_front();
        }
        stops.push_back((transport.to_owned(), id.to_string()));
    }

    /// Whether the host stopped `request` on `transport` (forgetting the stop).
    pub(crate) fn take_stop(&self, transport: &str, request: &rmcp::model::RequestId) -> bool {
        let request = request.to_string();
        let mut stops = self.stops.lock().unwrap_or_else(|e| e.into_inner());
        match stops
            .iter()
            .position(|(t, r)| t == transport && *r == request)
        {
            Some(i) => {
                stops.remove(i);
                true
            }
            None => false,
        }
    }

    /// Remembers that the MCP session `mcp_session` named the eve session `session`.
    pub(crate) fn name(&self, mcp_session: &str, session: SessionId) {
        self.named
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(mcp_session.to_owned(), session);
    }

    /// The eve session the MCP session `mcp_session` ends with: `mcp_<id>`, or `None` when it
    /// named its session (a named session outlives its connections). With `forget`, the name
    /// is dropped (the MCP session is over).
    pub(crate) fn session_of(&self, mcp_session: &str, forget: bool) -> Option<SessionId> {
        let mut named = self.named.lock().unwrap_or_else(|e| e.into_inner());
        let was_named = if forget {
            named.remove(mcp_session).is_some()
        } else {
            named.contains_key(mcp_session)
        };
        (!was_named).then(|| SessionId::new(format!("mcp_{mcp_session}")))
    }
}

/// An rmcp transport that shows every incoming message to [`HostState::note`] first.
pub(crate) struct Watched<T> {
    pub(crate) inner: T,
    pub(crate) state: Arc<HostState>,
    pub(crate) key: String,
}

impl<T: Transport<RoleServer>> Transport<RoleServer> for Watched<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        let message = self.inner.receive().await?;
        self.state.note(&self.key, &message);
        Some(message)
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inner.close().await
    }
}

/// Ends `session` as the seed ends a session: no new call starts in it, and its runs that have
/// not ended (background tasks, parked calls) are cancelled with their grace periods. Failures
/// are logged: the host is gone and cannot be told.
pub(crate) async fn end_session(server: &McpServer, session: &SessionId) {
    let now = server.clock.now();
    let ended = match server.store.end_session(session, now).await {
        Ok(end) => cancel_runs(&*server.store, end.live, REASON_SESSION_END, now).await,
        Err(e) => Err(e),
    };
    match ended {
        Ok(cancelled) => {
            tracing::info!(%session, cancelled = cancelled.len(), "the MCP session ended; its runs that had not ended are cancelled");
        }
        Err(e) => {
            tracing::warn!(%session, error = %e, "ending the eve session of a closed MCP session failed; end it with `eve sessions end` or POST /v1/sessions/{{id}}/end");
        }
    }
}

/// What a call that waits for `request` tells the host: what it waits for and where a person
/// can answer it (an answer link when the server mints them, the page, `eve answer`, HTTP).
pub(crate) async fn notice(
    server: &McpServer,
    run: &RunId,
    id: &RequestId,
    request: &InputRequest,
) -> String {
    let example = request
        .options
        .first()
        .map_or_else(|| "--text '…'".to_owned(), |o| o.id.clone());
    let link = match &server.config.answer_links {
        Some(links) => links.link(id).await,
        None => None,
    };
    let mut places = Vec::new();
    if let Some(link) = link {
        places.push(format!("with this link (no key needed): {link}"));
    }
    if let Some(url) = &server.config.page_url {
        places.push(format!("on the page {url}"));
    }
    places.push(format!("with `eve answer {id} {example}`"));
    places.push(format!("over HTTP: POST /v1/requests/{id}/answer"));
    format!(
        "waiting for a person to answer {:?} (request {id} of task {run}); answer it {}. The call settles once it is answered; stopping the call cancels the run.",
        crate::wire::clip(&request.prompt),
        places.join(", or ")
    )
}

/// The progress notifications of one call: each goes out with the next count, and only when
/// the call sent a progress token.
pub(crate) struct Progress {
    token: Option<ProgressToken>,
    count: u32,
}

impl Progress {
    pub(crate) fn new(token: Option<ProgressToken>) -> Self {
        Self { token, count: 0 }
    }

    /// Whether the call sent a progress token.
    pub(crate) fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Sends `message` as the next progress notification (failures are ignored: the
    /// connection may be gone).
    pub(crate) async fn send(&mut self, peer: &rmcp::Peer<RoleServer>, message: String) {
        let Some(token) = &self.token else {
            return;
        };
        self.count += 1;
        let _ = peer
            .notify_progress(
                ProgressNotificationParam::new(token.clone(), f64::from(self.count))
                    .with_message(message),
            )
            .await;
    }
}

/// Sends the notice `text` of request `id` of task `run` as a `notifications/message` of kind
/// `input.requested`.
pub(crate) async fn announce(
    peer: &rmcp::Peer<RoleServer>,
    run: &RunId,
    id: &RequestId,
    text: &str,
) {
    log(
        peer,
        text,
        json!({ "taskId": run.as_str(), "requestId": id.as_str(), "kind": "input.requested" }),
    )
    .await;
}

/// Sends `message` as a `notifications/message` (level notice, logger `eve`) with `data`
/// beside it. The host may ignore it; failures are ignored (the connection may be gone).
#[allow(deprecated)] // logging: SEP-2577 deprecates it; it is what hosts show today.
pub(crate) async fn log(peer: &rmcp::Peer<RoleServer>, message: &str, data: serde_json::Value) {
    let mut data = data;
    if let Some(o) = data.as_object_mut() {
        o.insert("message".into(), json!(message));
    }
    let _ = peer
        .notify_logging_message(
            LoggingMessageNotificationParam::new(LoggingLevel::Notice, data).with_logger("eve"),
        )
        .await;
}

/// Follows the task `run` for the client at `peer` until it ends or the connection closes,
/// pushing what changes: a `notifications/tasks` status notification on each change of status
/// or status message (task clients), a `notifications/progress` per new progress value when the
/// call sent a progress token, and each `post_message` as a `notifications/message`. A client
/// without tasks is also sent each request's notice ([`notice`]) and the task's end as
/// `notifications/message`.
pub(crate) async fn follow(
    server: McpServer,
    run: RunId,
    session: SessionId,
    peer: rmcp::Peer<RoleServer>,
    tasks: bool,
    progress_token: Option<ProgressToken>,
) {
    let store = &*server.store;
    let mut waiter = Waiter::new(
        store,
        &WatchKey::Session(session),
        server.config.fallback_poll,
        crate::UNNOTIFIED_POLL,
    )
    .await;
    let mut view = RunView::default();
    let mut last: Option<(String, Option<String>)> = None;
    let mut progress = Progress::new(progress_token);
    let mut announced: Vec<RequestId> = Vec::new();
    loop {
        if peer.is_transport_closed() {
            return;
        }
        let before = view.progress.clone();
        let told = view.messages.len();
        if let Err(e) = view.refresh(store, &run).await {
            tracing::info!(%run, error = %e.message, "following a task stopped");
            return;
        }
        for message in &view.messages[told..] {
            log(
                &peer,
                &task::render(message),
                json!({ "taskId": run.as_str(), "kind": "task.message" }),
            )
            .await;
        }
        if let Some(value) = &view.progress {
            if before.as_ref() != Some(value) {
                progress.send(&peer, task::render(value)).await;
            }
        }
        // A client without tasks has no inputRequests to read: it is told of each request and
        // where it can be answered.
        if !tasks {
            for (id, request) in &view.pending {
                if request.agent.is_none() && !announced.contains(id) {
                    announced.push(id.clone());
                    announce(&peer, &run, id, &notice(&server, &run, id, request).await).await;
                }
            }
        }
        let Ok(record) = store.get_run(&run).await else {
            return;
        };
        let detailed = task::detailed(
            &record,
            &view,
            server.config.task_poll_interval,
            server.config.sampling_max_tokens,
        );
        let status = format!("{:?}", detailed.status());
        let now = (status, detailed.task.status_message.clone());
        if last.as_ref() != Some(&now) {
            if tasks {
                let params = TaskStatusNotificationParams::from(detailed);
                let _ = peer
                    .send_notification(ServerNotification::TaskStatusNotification(
                        TaskStatusNotification::new(params),
                    ))
                    .await;
            }
            last = Some(now);
        }
        if let Some(end) = &view.end {
            if !tasks {
                log(
                    &peer,
                    &format!("task {run} {}", end.describe()),
                    json!({ "taskId": run.as_str(), "kind": end.kind() }),
                )
                .await;
            }
            return;
        }
        waiter.wait().await;
    }
}
