//! [`Session`]: the agent conversation a tool call belongs to, seen from the host.
//!
//! A session owns its tool calls' runs. Everything it knows lives in the store (the runs indexed
//! by session, the per-session log, the pending requests), so a `Session` handle is a cheap view:
//! a host process may drop it, restart, open a new one on the same store and continue — follow
//! the channel from the seq it had reached, answer a request asked days ago, cancel a task.
//!
//! - **Tool calls: one call, one result.** [`Session::call_tool`] starts the run. A
//!   default-execution call is parked ([`ToolCallStart::Parked`]) until the run ends and is then
//!   settled once ([`Session::settlement`], [`Session::wait_settled`]) with the output, the error
//!   or the cancellation. A background call's one result is its receipt
//!   ([`ToolCallStart::Working`], `{"status":"working","taskId":…}`); what follows arrives as
//!   session events (`task.progress`, `task.message`, `task.completed`, …).
//! - **The channel.** [`Session::events`] pages the persisted log; [`Session::follow`] is a
//!   stream of it from any seq that keeps going as new entries land. [`SessionEventExt`] tells
//!   what the parent agent must act on from what is stream-only.
//! - **The turn policy.** [`Session::user_message`] persists the message in the session's
//!   queue (contract clause 10), then applies the policy: a `queue` message waits for the
//!   parked default-execution calls; a `steer` message cancels the turn, i.e. those calls' runs
//!   (the engine then withdraws their requests and settles them cancelled). Background runs are
//!   not part of a turn and survive it. Queued messages are delivered in order, each exactly
//!   once, once no call is parked ([`Session::next_turn`]; [`Session::try_next_turn`] without
//!   the wait, with the background tasks' turn-requesting notices since a cursor), to
//!   whichever handle asks: the queue survives this process. Answering a request ([`Session::answer`]) never steers.
//! - **The task index.** [`Session::tasks`] lists the background runs with their status, from
//!   the store; [`Session::task_cancel`] cancels one; [`Session::end`] ends the session in the
//!   store (no handle, process or HTTP call starts a tool call in it afterwards) and cancels
//!   every run of it that has not ended.

use super::clock::Clock;
use super::error::EngineError;
use super::tool::{tool_call_run, Registry};
use super::worker::Worker;
use crate::error::StoreError;
use crate::event::{Execution, InputResponse};
use crate::ids::{CallId, RequestId, RunId, SessionId};
use crate::session::{QueuedMessage, SessionEntry, SessionEvent, SessionRecord, ToolResult};
use crate::store::{
    CancelOutcome, JournalStore, PendingRequest, RunQuery, RunRecord, RunStatus, READ_PAGE,
};
use crate::wake::{Waiter, WatchKey};
use futures::Stream;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// How often [`Session::wait_settled`] and [`Session::follow`] look at the store for new
/// entries once caught up, when the store cannot notify them of a grown session log
/// (DynamoDB; the default, see [`Session::with_poll_interval`]).
pub const DEFAULT_SESSION_POLL: Duration = Duration::from_millis(50);

/// How often they look anyway when the store does notify them (memory, SQLite, Postgres),
/// for writes the notifications cannot see, such as another process's on SQLite.
pub const DEFAULT_SESSION_FALLBACK_POLL: Duration = Duration::from_secs(2);

/// The reason written in `CancelRequested` by a steering message.
pub const REASON_STEER: &str = "the turn was steered by a new user message";
/// The reason written in `CancelRequested` by [`Session::task_cancel`].
pub const REASON_TASK_CANCEL: &str = "task_cancel";
/// The reason written in `CancelRequested` by [`Session::end`].
pub const REASON_SESSION_END: &str = "the session ended";

/// What [`Session::call_tool`] returns at once: the call's receipt.
///
/// Serialized with a `status` tag: `{"status":"parked","runId":…}` and
/// `{"status":"working","taskId":…}` (the seed's background receipt, verbatim).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum ToolCallStart {
    /// Default execution: the call stays pending (the turn is parked) until the run ends and
    /// settles it once.
    #[serde(rename_all = "camelCase")]
    Parked {
        /// The run that will settle the call.
        run_id: RunId,
    },
    /// Background execution: this receipt is the call's one result; the run continues as a
    /// task of the session and ends with a task notification.
    #[serde(rename_all = "camelCase")]
    Working {
        /// The task id (the background run's id), for `task_cancel`.
        task_id: RunId,
    },
}

impl ToolCallStart {
    /// The run started for the call, in either mode.
    pub fn run_id(&self) -> &RunId {
        match self {
            ToolCallStart::Parked { run_id } => run_id,
            ToolCallStart::Working { task_id } => task_id,
        }
    }
}

/// How a new user message treats a turn that is parked on default-execution tool calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TurnPolicy {
    /// The message waits until the parked calls are settled.
    #[default]
    Queue,
    /// The message cancels the turn: every parked default-execution run is cancelled (its
    /// pending requests are withdrawn and its call settles cancelled). Background runs survive.
    Steer,
}

/// What [`Session::user_message`] did with the message. The message itself is in the
/// session's queue in the store until it is delivered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub enum TurnOutcome {
    /// No call was parked: the queue was taken, this message last, and these messages start a
    /// turn now (oldest first; messages queued earlier and not yet delivered come first).
    Delivered {
        /// The messages of the new turn.
        messages: Vec<QueuedMessage>,
    },
    /// `queue`: the message waits for these parked calls to settle; [`Session::next_turn`]
    /// delivers it then.
    #[serde(rename_all = "camelCase")]
    Queued {
        /// The parked calls, oldest first.
        waiting_on: Vec<CallId>,
    },
    /// `steer`: cancellation was requested for these runs (the turn's parked calls, oldest
    /// first); the message starts a turn once they are settled cancelled
    /// ([`Session::next_turn`]).
    Steered {
        /// The runs whose cancellation was requested (empty when nothing was parked).
        cancelled: Vec<RunId>,
    },
}

/// One background run of a session, as the task index shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskInfo {
    /// The task id (the run id) named by the receipt and by `task_cancel`.
    pub task_id: RunId,
    /// The tool call that started it.
    pub call_id: CallId,
    /// The tool's model-visible name.
    pub tool: String,
    /// Where the run stands (`running` until it ends).
    pub status: RunStatus,
    /// Whether a cancel was requested (the run may still be unwinding in its grace period).
    pub cancel_requested: bool,
    /// When the task was started.
    pub created_at: crate::time::Timestamp,
    /// When the task's record last changed (its end, for an ended task).
    pub updated_at: crate::time::Timestamp,
}

impl TaskInfo {
    fn of(run: &RunRecord) -> Self {
        Self {
            task_id: run.run_id.clone(),
            call_id: run.call_id.clone(),
            tool: run.tool.clone(),
            status: run.status,
            cancel_requested: run.cancel_requested,
            created_at: run.created_at,
            updated_at: run.updated_at,
        }
    }
}

/// Why an id given to `task_cancel` names no background task of the session: what a surface
/// maps to its answer (the HTTP API: 404 for [`NotATaskKind::Unknown`] and
/// [`NotATaskKind::OtherSession`], 409 `not_a_task` for [`NotATaskKind::DefaultExecution`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NotATaskKind {
    /// No run has this id (never started, or purged).
    Unknown,
    /// The run belongs to another session (told apart so a session never acts on another's
    /// runs; surfaces show it as unknown).
    OtherSession,
    /// The run is a default-execution call: it is part of the turn, not a task, and is
    /// cancelled by steering the turn (the seed: `task_cancel` is for background runs).
    DefaultExecution,
}

impl NotATaskKind {
    /// The sentence [`SessionError::NotATask`] shows as its reason.
    pub fn reason(self) -> &'static str {
        match self {
            NotATaskKind::Unknown => "no such run",
            NotATaskKind::OtherSession => "the run belongs to another session",
            NotATaskKind::DefaultExecution => {
                "it is a default-execution call; send a steering message to cancel the turn"
            }
        }
    }
}

/// What makes the parent agent's next turn ([`Session::try_next_turn`]): the user messages
/// queued for it and, when asked for, the background tasks' notices that request a turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Turn {
    /// The queued user messages, oldest first, taken from the queue (each delivered exactly
    /// once, across handles and processes).
    pub messages: Vec<QueuedMessage>,
    /// The session log's entries from the cursor on that request a turn and are not a parked
    /// call's own result: `task.message` (a background task's `postMessage`),
    /// `task.completed`, `task.failed`, `task.cancelled`, in seq order. Not consumed: the
    /// cursor ([`Turn::next_seq`]) is the caller's.
    pub notices: Vec<SessionEntry>,
    /// Where the next call's notice cursor starts (the log's next seq when it was read);
    /// `None` when notices were not asked for.
    pub next_seq: Option<u64>,
}

/// What a [`Session`] call can fail with. The message says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The session was ended ([`Session::end`], from any handle or process): it starts no more
    /// tool calls and takes no more messages.
    #[error("session {session} has ended; start a new session for new tool calls")]
    Ended {
        /// The session.
        session: SessionId,
    },
    /// No run of this session was started for the call id.
    #[error(
        "tool call {call} was not started in session {session}; start it with Session::call_tool"
    )]
    UnknownCall {
        /// The session.
        session: SessionId,
        /// The call id.
        call: CallId,
    },
    /// The call runs in the background: its one result was the receipt, and it is never
    /// settled by a tool result.
    #[error("tool call {call} runs in the background as task {task}; its result was the receipt: follow the session for task.completed, task.failed or task.cancelled")]
    BackgroundCall {
        /// The call id.
        call: CallId,
        /// Its task id.
        task: RunId,
    },
    /// The request was not asked in this session (unknown, or another session's).
    #[error("request {request} was not asked in session {session}; answer it through the session that shows it")]
    UnknownRequest {
        /// The session.
        session: SessionId,
        /// The request.
        request: RequestId,
    },
    /// The request was answered already with another response. Requests are answered once.
    #[error("request {request} was already answered; a request is answered once, ask again for a new answer")]
    AlreadyAnswered {
        /// The request.
        request: RequestId,
    },
    /// The request was withdrawn: its run ended (returned, failed or was cancelled).
    #[error("request {request} was withdrawn (its run ended); it can no longer be answered")]
    Withdrawn {
        /// The request.
        request: RequestId,
    },
    /// The response is not one the request accepts.
    #[error("invalid answer to request {request}: {reason}")]
    InvalidAnswer {
        /// The request.
        request: RequestId,
        /// What was wrong (e.g. the option ids offered).
        reason: String,
    },
    /// The id names no background run of this session.
    #[error("{task} is not a background task of session {session}: {reason}")]
    NotATask {
        /// The session.
        session: SessionId,
        /// The id given.
        task: RunId,
        /// Why not (unknown, another session's run, a default-execution call), as a sentence.
        reason: &'static str,
        /// Why not, as a kind a caller matches on.
        kind: NotATaskKind,
    },
    /// Starting the tool call failed (unknown tool, invalid input, store).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The store failed.
    #[error(transparent)]
    Store(StoreError),
}

/// The store's refusal of an ended session is [`SessionError::Ended`]; any other store error
/// is [`SessionError::Store`].
impl From<StoreError> for SessionError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::SessionEnded { session } => SessionError::Ended { session },
            e => SessionError::Store(e),
        }
    }
}

/// What the parent agent must act on, told apart from what only streams to the user.
///
/// Implemented for [`SessionEvent`] (its type lives in [`crate::session`]; this trait keeps the
/// classification next to the turn logic that uses it).
pub trait SessionEventExt {
    /// Whether the event requests a parent-agent turn: a settled tool result (`tool.settled`),
    /// a background task's end (`task.completed`, `task.failed`, `task.cancelled`) or its
    /// message (`task.message`). Everything else (`action.partial`, `task.progress`,
    /// `input.requested`, `input.answered`, `input.withdrawn`, `agent.requested`,
    /// `agent.completed`) is stream-only: rendered on the channel, never in model history.
    fn requests_turn(&self) -> bool;

    /// The negation of [`SessionEventExt::requests_turn`].
    fn is_stream_only(&self) -> bool {
        !self.requests_turn()
    }
}

impl SessionEventExt for SessionEvent {
    fn requests_turn(&self) -> bool {
        requests_turn(self)
    }
}

/// See [`SessionEventExt::requests_turn`].
pub fn requests_turn(event: &SessionEvent) -> bool {
    match event {
        SessionEvent::ToolSettled { .. }
        | SessionEvent::TaskCompleted { .. }
        | SessionEvent::TaskFailed { .. }
        | SessionEvent::TaskCancelled
        | SessionEvent::TaskDenied { .. }
        | SessionEvent::TaskMessage { .. } => true,
        SessionEvent::InputRequested { .. }
        | SessionEvent::InputAnswered { .. }
        | SessionEvent::InputWithdrawn { .. }
        | SessionEvent::ActionPartial { .. }
        | SessionEvent::TaskProgress { .. }
        | SessionEvent::AgentRequested { .. }
        | SessionEvent::AgentCompleted { .. } => false,
    }
}

/// Drops every `action.partial` entry that a later `action.partial` of the same call id in
/// `entries` supersedes: what a channel re-sends on resume, since snapshots are
/// last-write-wins per call id. Other entries are kept, in order.
pub fn compact_partials(entries: Vec<SessionEntry>) -> Vec<SessionEntry> {
    let mut last: HashMap<&CallId, u64> = HashMap::new();
    for e in &entries {
        if matches!(e.event, SessionEvent::ActionPartial { .. }) {
            last.insert(&e.call_id, e.seq);
        }
    }
    let keep: Vec<bool> = entries
        .iter()
        .map(|e| {
            !matches!(e.event, SessionEvent::ActionPartial { .. })
                || last.get(&e.call_id) == Some(&e.seq)
        })
        .collect();
    entries
        .into_iter()
        .zip(keep)
        .filter_map(|(e, k)| k.then_some(e))
        .collect()
}

/// What the handle has learnt from the session log so far (read forward only, so it is always
/// a prefix of the persisted log).
#[derive(Default)]
struct LogIndex {
    next_seq: u64,
    settled: HashMap<CallId, ToolResult>,
    requests: HashMap<RequestId, RunId>,
    /// How the calls this handle started execute, so waiting on one needs no run listing.
    started: HashMap<CallId, Execution>,
}

/// The agent conversation a tool call belongs to; see the module docs. Cheap to create: all
/// state is in the store, so any number of handles (in any processes) may view one session.
pub struct Session {
    store: Arc<dyn JournalStore>,
    registry: Arc<Registry>,
    clock: Arc<dyn Clock>,
    id: SessionId,
    /// Set by [`Session::with_poll_interval`]; `None`: the defaults.
    poll: Option<Duration>,
    /// Set by [`Session::with_worker`]: starts calls eagerly.
    worker: Option<Worker>,
    index: tokio::sync::Mutex<LogIndex>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("store", &self.store.backend())
            .field("deployment", self.registry.deployment())
            .finish()
    }
}

impl Session {
    /// A handle on session `id`: its tool calls start runs of `registry`'s deployment in
    /// `store`, stamped with `clock`'s time.
    pub fn new(
        store: Arc<dyn JournalStore>,
        registry: Arc<Registry>,
        clock: Arc<dyn Clock>,
        id: SessionId,
    ) -> Self {
        Self {
            store,
            registry,
            clock,
            id,
            poll: None,
            worker: None,
            index: tokio::sync::Mutex::new(LogIndex::default()),
        }
    }

    /// How often [`Session::wait_settled`] and [`Session::follow`] re-read the store once they
    /// have caught up and nothing woke them. By default they sleep until the store notifies
    /// them that the session log grew, re-reading every [`DEFAULT_SESSION_FALLBACK_POLL`]
    /// anyway, or every [`DEFAULT_SESSION_POLL`] on a store that cannot notify. Wall-clock
    /// time, independent of the session's [`Clock`], so a test's manual clock never stalls a
    /// follower.
    pub fn with_poll_interval(mut self, every: Duration) -> Self {
        self.poll = Some(every.max(Duration::from_millis(1)));
        self
    }

    /// Starts this session's calls through `worker` (a worker of the same store and
    /// deployment, running in this process): when it has room, a call's run is created and
    /// claimed in one commit and its body starts at once (see [`Worker::start`]).
    pub fn with_worker(mut self, worker: Worker) -> Self {
        self.worker = Some(worker);
        self
    }

    /// A waiter on this session's log.
    async fn waiter(store: &dyn JournalStore, id: &SessionId, poll: Option<Duration>) -> Waiter {
        Waiter::new(
            store,
            &WatchKey::Session(id.clone()),
            poll.unwrap_or(DEFAULT_SESSION_FALLBACK_POLL),
            poll.unwrap_or(DEFAULT_SESSION_POLL),
        )
        .await
    }

    /// The session id.
    pub fn id(&self) -> &SessionId {
        &self.id
    }

    /// Starts the run of a tool call (see [`start_tool_call`](super::start_tool_call)): validates the input, then
    /// creates the run. Idempotent by call id: calling again with the same call id and input
    /// returns the same receipt and starts nothing.
    ///
    /// # Errors
    /// [`SessionError::Ended`] once the session was ended (by any handle: the store refuses the
    /// start; a retry of a call started before the end still returns its receipt);
    /// [`SessionError::Engine`] for an unknown tool, an invalid input, the same call id with
    /// another input, or the store.
    pub async fn call_tool(
        &self,
        call_id: impl Into<CallId>,
        tool_name: &str,
        input: serde_json::Value,
    ) -> Result<ToolCallStart, SessionError> {
        let call_id = call_id.into();
        let new = tool_call_run(&self.registry, &self.id, &call_id, tool_name, input)?;
        let created = match &self.worker {
            Some(w) => w.start(new).await,
            None => self.store.create_run(new, self.clock.now()).await,
        }?;
        let run = created.run;
        self.index
            .lock()
            .await
            .started
            .insert(call_id, run.execution);
        Ok(match run.execution {
            Execution::Default => ToolCallStart::Parked { run_id: run.run_id },
            Execution::Background => ToolCallStart::Working {
                task_id: run.run_id,
            },
        })
    }

    /// Reads the session log from where this handle stopped, page by page, to its end.
    async fn refresh(&self) -> Result<tokio::sync::MutexGuard<'_, LogIndex>, StoreError> {
        let mut index = self.index.lock().await;
        loop {
            let page = self
                .store
                .read_session(&self.id, index.next_seq, READ_PAGE)
                .await?;
            let Some(last) = page.last() else {
                return Ok(index);
            };
            index.next_seq = last.seq + 1;
            let more = page.len() == READ_PAGE;
            for e in page {
                match e.event {
                    SessionEvent::ToolSettled { result } => {
                        index.settled.insert(e.call_id, result);
                    }
                    SessionEvent::InputRequested { request_id, .. } => {
                        index.requests.insert(request_id, e.run_id);
                    }
                    _ => {}
                }
            }
            // A short page is the log's end when it was read.
            if !more {
                return Ok(index);
            }
        }
    }

    /// The one result of a default-execution call, from the session log's `tool.settled`
    /// entry: `None` while the call is parked (or was never made, or runs in the background).
    /// Once `Some`, it never changes.
    ///
    /// # Errors
    /// The store's error.
    pub async fn settlement(&self, call_id: &CallId) -> Result<Option<ToolResult>, SessionError> {
        Ok(self.refresh().await?.settled.get(call_id).cloned())
    }

    /// Waits for a default-execution call's one result. Follows the persisted log, woken by the
    /// store when it grows (with a slow fallback poll; see [`Session::with_poll_interval`]),
    /// so it costs no store call while nothing happens, sees runs worked by other processes
    /// and survives this process' restarts (call it again). A blocked run keeps the call parked
    /// until an operator resumes or fails it.
    ///
    /// # Errors
    /// [`SessionError::UnknownCall`] when the session has no run for the call,
    /// [`SessionError::BackgroundCall`] for a background call (never settled), the store's
    /// error.
    ///
    /// # Cancel safety
    /// Dropping the future loses nothing: it only reads.
    pub async fn wait_settled(&self, call_id: &CallId) -> Result<ToolResult, SessionError> {
        if let Some(r) = self.settlement(call_id).await? {
            return Ok(r);
        }
        let started = self.index.lock().await.started.get(call_id).copied();
        if started != Some(Execution::Default) {
            let run = self.run_of_call(call_id).await?;
            if run.execution == Execution::Background {
                return Err(SessionError::BackgroundCall {
                    call: call_id.clone(),
                    task: run.run_id,
                });
            }
        }
        let mut waiter = Self::waiter(&*self.store, &self.id, self.poll).await;
        loop {
            // Subscribed before this read: an entry written after it wakes the wait.
            if let Some(r) = self.settlement(call_id).await? {
                return Ok(r);
            }
            waiter.wait().await;
        }
    }

    async fn runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.store
            .list_runs(&RunQuery {
                session: Some(self.id.clone()),
                ..RunQuery::default()
            })
            .await
    }

    async fn run_of_call(&self, call_id: &CallId) -> Result<RunRecord, SessionError> {
        self.runs()
            .await?
            .into_iter()
            .find(|r| &r.call_id == call_id)
            .ok_or_else(|| SessionError::UnknownCall {
                session: self.id.clone(),
                call: call_id.clone(),
            })
    }

    /// Up to `max` entries of the session log from `from_seq` on, as persisted (every
    /// `action.partial` included; see [`compact_partials`] for a resume).
    ///
    /// # Errors
    /// The store's error (`InvalidInput` for `max` = 0).
    pub async fn events(
        &self,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<SessionEntry>, SessionError> {
        Ok(self.store.read_session(&self.id, from_seq, max).await?)
    }

    /// The session log from `from_seq` on as a stream that never ends by itself: it yields the
    /// persisted entries in seq order, then waits for new ones (woken by the store when the
    /// log grows, with a slow fallback poll).
    /// Entries come from the store, so a follower started after a restart from the last seq it
    /// saw misses nothing and sees nothing twice. After a store error the stream yields it and
    /// ends; follow again from the next seq.
    pub fn follow(
        &self,
        from_seq: u64,
    ) -> impl Stream<Item = Result<SessionEntry, SessionError>> + Send + 'static {
        struct State {
            store: Arc<dyn JournalStore>,
            id: SessionId,
            next: u64,
            buf: VecDeque<SessionEntry>,
            waiter: Option<Waiter>,
            poll: Option<Duration>,
            failed: bool,
        }
        let state = State {
            store: self.store.clone(),
            id: self.id.clone(),
            next: from_seq,
            buf: VecDeque::new(),
            waiter: None,
            poll: self.poll,
            failed: false,
        };
        futures::stream::unfold(state, |mut s| async move {
            if s.failed {
                return None;
            }
            loop {
                if let Some(e) = s.buf.pop_front() {
                    return Some((Ok(e), s));
                }
                if s.waiter.is_none() {
                    // Subscribed before the first read: nothing written after it is missed.
                    s.waiter = Some(Session::waiter(&*s.store, &s.id, s.poll).await);
                }
                match s.store.read_session(&s.id, s.next, READ_PAGE).await {
                    Err(e) => {
                        s.failed = true;
                        return Some((Err(SessionError::Store(e)), s));
                    }
                    Ok(page) if page.is_empty() => {
                        if let Some(w) = s.waiter.as_mut() {
                            w.wait().await;
                        }
                    }
                    Ok(page) => {
                        s.next = page.last().map_or(s.next, |e| e.seq + 1);
                        s.buf.extend(page);
                    }
                }
            }
        })
    }

    /// The session's requests that can still be answered, oldest first (from every run of the
    /// session, background ones included).
    ///
    /// # Errors
    /// The store's error.
    pub async fn pending_requests(&self) -> Result<Vec<PendingRequest>, SessionError> {
        Ok(self.store.pending_requests(&self.id).await?)
    }

    /// Answers a request asked in this session, at most once: the store checks atomically that
    /// it is pending and that the response is one it accepts. The same response again is a
    /// duplicate success (a retry); the answer resumes the run that asked and never steers the
    /// turn. Works from any process on the store, any time before the run ends.
    ///
    /// # Errors
    /// [`SessionError::UnknownRequest`] (not asked in this session),
    /// [`SessionError::AlreadyAnswered`] (answered with another response),
    /// [`SessionError::Withdrawn`] (its run ended), [`SessionError::InvalidAnswer`] (an option
    /// not offered, free text where it is not allowed), the store's error.
    pub async fn answer(
        &self,
        request_id: &RequestId,
        response: InputResponse,
    ) -> Result<crate::store::Delivered, SessionError> {
        let known = self.refresh().await?.requests.contains_key(request_id);
        if !known {
            return Err(SessionError::UnknownRequest {
                session: self.id.clone(),
                request: request_id.clone(),
            });
        }
        match self
            .store
            .answer(request_id, response, self.clock.now())
            .await
        {
            Ok(d) => Ok(d),
            Err(StoreError::AlreadyAnswered { request }) => {
                Err(SessionError::AlreadyAnswered { request })
            }
            Err(StoreError::Withdrawn { request }) => Err(SessionError::Withdrawn { request }),
            Err(StoreError::InvalidAnswer { request, reason }) => {
                Err(SessionError::InvalidAnswer { request, reason })
            }
            // The run ended between the log read and the answer.
            Err(StoreError::RunEnded { .. }) => Err(SessionError::Withdrawn {
                request: request_id.clone(),
            }),
            Err(e) => Err(SessionError::Store(e)),
        }
    }

    /// The task index: the session's background runs, oldest first, with their status.
    ///
    /// # Errors
    /// The store's error.
    pub async fn tasks(&self) -> Result<Vec<TaskInfo>, SessionError> {
        Ok(self
            .runs()
            .await?
            .iter()
            .filter(|r| r.execution == Execution::Background)
            .map(TaskInfo::of)
            .collect())
    }

    /// Cancels a background task of this session: writes `CancelRequested` once; the engine
    /// then gives the body its grace period and ends it `task.cancelled`. Cancelling a task
    /// that ended is a no-op answered with [`CancelOutcome::AlreadyEnded`]; cancelling twice
    /// with [`CancelOutcome::AlreadyRequested`]. The same rules as every surface's
    /// `task_cancel` ([`task_cancel`], which this calls).
    ///
    /// # Errors
    /// [`SessionError::NotATask`] when the id names no run, another session's run or a
    /// default-execution call (steer the turn to cancel that); the store's error.
    pub async fn task_cancel(&self, task_id: &RunId) -> Result<CancelOutcome, SessionError> {
        task_cancel(&*self.store, Some(&self.id), task_id, self.clock.now()).await
    }

    /// The session's default-execution calls that are not settled: the current turn's parked
    /// calls (blocked runs included: their calls are pending too).
    async fn parked(&self) -> Result<Vec<RunRecord>, StoreError> {
        Ok(self
            .runs()
            .await?
            .into_iter()
            .filter(|r| r.execution == Execution::Default && !r.status.is_terminal())
            .collect())
    }

    /// A user message: persisted in the session's queue first (so it survives this process),
    /// then the turn policy applies. With no call parked, the queue is taken at once and the
    /// outcome is [`TurnOutcome::Delivered`] with every queued message, this one last. `queue`
    /// otherwise reports the parked calls the message waits for; `steer` requests cancellation
    /// of every parked default-execution run (their requests are withdrawn and their calls
    /// settle `cancelled` once the engine ends them) and leaves background runs alone. Either
    /// way [`Session::next_turn`] delivers the queue once no call is parked. An answer to a
    /// request is not a user message: it never steers.
    ///
    /// # Errors
    /// [`SessionError::Ended`] once the session was ended; the store's error. A steer may have
    /// cancelled some runs before the error.
    pub async fn user_message(
        &self,
        policy: TurnPolicy,
        message: serde_json::Value,
    ) -> Result<TurnOutcome, SessionError> {
        self.store
            .queue_message(&self.id, message.into(), self.clock.now())
            .await?;
        let parked = self.parked().await?;
        if parked.is_empty() {
            return Ok(TurnOutcome::Delivered {
                messages: self.store.take_messages(&self.id).await?,
            });
        }
        match policy {
            TurnPolicy::Queue => Ok(TurnOutcome::Queued {
                waiting_on: parked.into_iter().map(|r| r.call_id).collect(),
            }),
            TurnPolicy::Steer => Ok(TurnOutcome::Steered {
                cancelled: cancel_runs(
                    &*self.store,
                    parked.into_iter().map(|r| r.run_id),
                    REASON_STEER,
                    self.clock.now(),
                )
                .await?,
            }),
        }
    }

    /// Waits until no default-execution call of the session is parked, then takes the queued
    /// user messages (oldest first) for the next turn. Each message is delivered exactly once
    /// across every handle and process: when another handle took them first, this returns
    /// what is left (possibly nothing). Woken by the session log, like
    /// [`Session::wait_settled`]; a blocked run keeps its call parked until an operator
    /// resolves it.
    ///
    /// # Errors
    /// The store's error.
    ///
    /// # Cancel safety
    /// Dropping the future before it returns loses nothing; once the store handed the
    /// messages over, they are this call's.
    pub async fn next_turn(&self) -> Result<Vec<QueuedMessage>, SessionError> {
        let mut waiter = Self::waiter(&*self.store, &self.id, self.poll).await;
        loop {
            if self.parked().await?.is_empty() {
                return Ok(self.store.take_messages(&self.id).await?);
            }
            waiter.wait().await;
        }
    }

    /// [`Session::next_turn`] without the wait: `None` while a default-execution call of the
    /// session is parked, or when nothing makes a turn; otherwise takes the queued user
    /// messages (exactly once, as `next_turn` does) and, with `notices_from`, collects the
    /// session log's turn-requesting notices of background tasks from that seq on
    /// ([`Turn::notices`]). A turn has at least one message or notice.
    ///
    /// A host that waits for a turn subscribes with [`Session::watch`] first, then calls this
    /// after each wake-up: the session log's notification covers calls settling and tasks'
    /// notices; a message queued by another process is seen at the waiter's fallback poll.
    ///
    /// # Errors
    /// The store's error.
    ///
    /// # Cancel safety
    /// As [`Session::next_turn`]: once the store handed the messages over, they are this
    /// call's; drop the future only before or after it.
    pub async fn try_next_turn(
        &self,
        notices_from: Option<u64>,
    ) -> Result<Option<Turn>, SessionError> {
        if !self.parked().await?.is_empty() {
            return Ok(None);
        }
        let mut notices = Vec::new();
        let mut next_seq = None;
        if let Some(mut from) = notices_from {
            loop {
                let page = self.store.read_session(&self.id, from, READ_PAGE).await?;
                let Some(last) = page.last() else { break };
                from = last.seq + 1;
                let more = page.len() == READ_PAGE;
                notices.extend(page.into_iter().filter(is_turn_notice));
                if !more {
                    break;
                }
            }
            next_seq = Some(from);
        }
        let messages = self.store.take_messages(&self.id).await?;
        if messages.is_empty() && notices.is_empty() {
            return Ok(None);
        }
        Ok(Some(Turn {
            messages,
            notices,
            next_seq,
        }))
    }

    /// A waiter on this session's log, woken by the store when it grows (a call settled, a
    /// task ended or posted a message, a request was opened), with the handle's poll
    /// interval as fallback ([`Session::with_poll_interval`]). Subscribe before reading, then
    /// re-read after each [`Waiter::wait`].
    pub async fn watch(&self) -> Waiter {
        Self::waiter(&*self.store, &self.id, self.poll).await
    }

    /// The session's record in the store: whether (and when) it ended, and the user messages
    /// queued for the next turn.
    ///
    /// # Errors
    /// The store's error.
    pub async fn record(&self) -> Result<SessionRecord, SessionError> {
        Ok(self.store.get_session(&self.id).await?)
    }

    /// Ends the session in the store, then requests cancellation of every run of it that had
    /// not ended — its background tasks and any parked default-execution call — and returns
    /// those runs, oldest first. The engine ends each cancelled (`task.cancelled` /
    /// `tool.settled` cancelled) after its grace period. From the end on, no handle (in this
    /// process or another, or the HTTP API) starts a tool call in the session or queues a
    /// message: they get [`SessionError::Ended`]. Calling it again returns the runs still
    /// unwinding and writes nothing new.
    ///
    /// # Errors
    /// The store's error.
    pub async fn end(&self) -> Result<Vec<RunId>, SessionError> {
        let now = self.clock.now();
        let end = self.store.end_session(&self.id, now).await?;
        Ok(cancel_runs(&*self.store, end.live, REASON_SESSION_END, now).await?)
    }
}

/// Whether a session log entry is a notice that makes a turn ([`Turn::notices`]): it requests
/// a turn ([`requests_turn`]) and is not a parked call's own result (`tool.settled`, which the
/// turn that made the call continues with).
fn is_turn_notice(e: &SessionEntry) -> bool {
    requests_turn(&e.event) && !matches!(e.event, SessionEvent::ToolSettled { .. })
}

/// The seed's `task_cancel`, shared by [`Session::task_cancel`] and every surface (the HTTP
/// API's task routes): cancels the background run `task_id` of `session` (of any session
/// with `None`), writing `CancelRequested` with [`REASON_TASK_CANCEL`] once. A task that
/// ended answers [`CancelOutcome::AlreadyEnded`]; a second cancel
/// [`CancelOutcome::AlreadyRequested`].
///
/// # Errors
/// [`SessionError::NotATask`] with its [`NotATaskKind`] when the id names no run, another
/// session's run or a default-execution call; the store's error.
pub async fn task_cancel(
    store: &dyn JournalStore,
    session: Option<&SessionId>,
    task_id: &RunId,
    now: crate::time::Timestamp,
) -> Result<CancelOutcome, SessionError> {
    let not_a_task = |session: &SessionId, kind: NotATaskKind| SessionError::NotATask {
        session: session.clone(),
        task: task_id.clone(),
        reason: kind.reason(),
        kind,
    };
    let run = match store.get_run(task_id).await {
        Ok(r) => r,
        Err(StoreError::NotFound { .. }) => {
            let unknown = SessionId::new("");
            return Err(not_a_task(
                session.unwrap_or(&unknown),
                NotATaskKind::Unknown,
            ));
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(session) = session {
        if &run.session_id != session {
            return Err(not_a_task(session, NotATaskKind::OtherSession));
        }
    }
    if run.execution != Execution::Background {
        return Err(not_a_task(&run.session_id, NotATaskKind::DefaultExecution));
    }
    Ok(store
        .request_cancel(task_id, REASON_TASK_CANCEL, now)
        .await?)
}

/// Requests cancellation of each run with `reason`, and returns those whose cancel is now
/// requested (by this call or before), in the order given; runs that ended (or were purged)
/// meanwhile are skipped. What [`Session::end`] and a steering message do with the runs they
/// cancel; a surface that ends a session without a [`Session`] (the HTTP API) does the same.
///
/// # Errors
/// The store's error; runs before it may have been cancelled.
pub async fn cancel_runs(
    store: &dyn JournalStore,
    runs: impl IntoIterator<Item = RunId>,
    reason: &str,
    now: crate::time::Timestamp,
) -> Result<Vec<RunId>, StoreError> {
    let mut cancelled = Vec::new();
    for run in runs {
        match store.request_cancel(&run, reason, now).await {
            Ok(CancelOutcome::Requested { .. } | CancelOutcome::AlreadyRequested) => {
                cancelled.push(run)
            }
            Ok(CancelOutcome::AlreadyEnded { .. }) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(cancelled)
}
