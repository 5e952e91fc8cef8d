//! The [`JournalStore`] contract that every backend implements, and the records it deals in.

use crate::error::StoreError;
use crate::event::{
    Event, Execution, InputRequest, InputResponse, Payload, ResetFrom, StoredEvent,
};
use crate::ids::{
    AppendId, CallId, DeploymentId, RequestId, RunId, SessionId, WorkerId, WorkflowId,
};
use crate::keys::ApiKey;
use crate::search::{AttributePatch, Attributes, RunSearch};
use crate::session::{
    QueuedMessage, SessionEnd, SessionEntry, SessionEvent, SessionRecord, ToolResult,
};
use crate::time::Timestamp;
use crate::wake::WatchKey;
use crate::worker_lock::WorkerLock;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::fmt::Debug;
use std::time::Duration;

/// At most this many events in one append.
pub const MAX_EVENTS_PER_APPEND: usize = 100;
/// At most this many bytes of JSON in one payload (4 MiB).
pub const MAX_PAYLOAD_BYTES: usize = 4 * 1024 * 1024;
/// At most this many bytes of payload in one append, all events together (4 MiB).
pub const MAX_APPEND_PAYLOAD_BYTES: usize = 4 * 1024 * 1024;
/// The page size [`JournalStoreExt::read_all`] asks for.
pub const READ_PAGE: usize = 4096;

/// Where a run stands.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Not ended; claimable when it has work.
    Running,
    /// Parked by the engine (non-determinism, panicking body, poison loop) until an operator
    /// resumes or fails it. Not claimable; deliveries are still accepted.
    Blocked,
    /// Ended with an output.
    Completed,
    /// Ended with an error.
    Failed,
    /// Ended cancelled.
    Cancelled,
}

impl RunStatus {
    /// Whether the run has ended.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        )
    }

    /// The lowercase name, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Blocked => "blocked",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// Parses [`RunStatus::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => RunStatus::Running,
            "blocked" => RunStatus::Blocked,
            "completed" => RunStatus::Completed,
            "failed" => RunStatus::Failed,
            "cancelled" => RunStatus::Cancelled,
            _ => return None,
        })
    }
}

/// What [`JournalStore::create_run`] needs. The store writes `RunStarted` at seq 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewRun {
    /// The id to give the run if it is new.
    pub run_id: RunId,
    /// Dedupes starts; `None` means `"{session_id}/{call_id}"`.
    pub idempotency_key: Option<String>,
    /// The body.
    pub workflow_id: WorkflowId,
    /// The deployment the run is pinned to.
    pub deployment_id: DeploymentId,
    /// Model-visible tool name.
    pub tool: String,
    /// The tool input (a JSON object).
    pub input: Payload,
    /// The session.
    pub session_id: SessionId,
    /// The tool call.
    pub call_id: CallId,
    /// Default or background.
    pub execution: Execution,
    /// The caller's W3C `traceparent` (from the start route's header or MCP's
    /// `_meta.traceparent`): the run's root span joins that trace. `None` starts a new trace.
    /// Ingresses keep only a well-formed value ([`crate::trace::TraceContext::parse`]).
    pub traceparent: Option<String>,
    /// Where the run was reset from ([`JournalStoreExt::reset`]); `None` for every other start.
    pub reset_from: Option<ResetFrom>,
}

impl NewRun {
    /// The effective idempotency key.
    pub fn key(&self) -> String {
        self.idempotency_key
            .clone()
            .unwrap_or_else(|| format!("{}/{}", self.session_id, self.call_id))
    }

    /// The `RunStarted` event for this run.
    pub fn started_event(&self) -> Event {
        Event::RunStarted {
            workflow_id: self.workflow_id.clone(),
            deployment_id: self.deployment_id.clone(),
            tool: self.tool.clone(),
            input: self.input.clone(),
            session_id: self.session_id.clone(),
            call_id: self.call_id.clone(),
            execution: self.execution,
            traceparent: self.traceparent.clone(),
            reset_from: self.reset_from.clone(),
        }
    }

    /// Checks the contract's rules for a start: non-empty ids and key, payload within limits.
    ///
    /// # Errors
    /// `InvalidInput` or `LimitExceeded`, saying which field.
    pub fn validate(&self) -> Result<(), StoreError> {
        for (what, v) in [
            ("run id", self.run_id.as_str()),
            ("workflow id", self.workflow_id.as_str()),
            ("deployment id", self.deployment_id.as_str()),
            ("session id", self.session_id.as_str()),
            ("call id", self.call_id.as_str()),
        ] {
            if v.is_empty() {
                return Err(StoreError::InvalidInput(format!(
                    "{what} must not be empty"
                )));
            }
        }
        if matches!(&self.idempotency_key, Some(k) if k.is_empty()) {
            return Err(StoreError::InvalidInput(
                "idempotency key must not be empty; pass None for the default session/call key"
                    .into(),
            ));
        }
        check_limits(std::slice::from_ref(&self.started_event()))
    }

    /// The record of the run this start creates: running, journal holding only `RunStarted`
    /// (next seq 1), nothing processed, no owner.
    pub fn record(&self, now: Timestamp) -> RunRecord {
        RunRecord {
            run_id: self.run_id.clone(),
            idempotency_key: self.key(),
            workflow_id: self.workflow_id.clone(),
            deployment_id: self.deployment_id.clone(),
            tool: self.tool.clone(),
            session_id: self.session_id.clone(),
            call_id: self.call_id.clone(),
            execution: self.execution,
            status: RunStatus::Running,
            next_seq: 1,
            processed_seq: 0,
            cancel_requested: false,
            activations: 0,
            owner: None,
            created_at: now,
            updated_at: now,
            attributes: Attributes::new(),
        }
    }

    /// Whether `existing` was started by an identical request (same workflow, tool, input and
    /// execution), so a repeated key may return it.
    pub fn matches(&self, existing: &Event) -> bool {
        match existing {
            Event::RunStarted {
                workflow_id,
                tool,
                input,
                execution,
                ..
            } => {
                workflow_id == &self.workflow_id
                    && tool == &self.tool
                    && input == &self.input
                    && execution == &self.execution
            }
            _ => false,
        }
    }
}

/// What a store knows of a run beside its journal.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The run.
    pub run_id: RunId,
    /// Its idempotency key.
    pub idempotency_key: String,
    /// The body.
    pub workflow_id: WorkflowId,
    /// The deployment it is pinned to.
    pub deployment_id: DeploymentId,
    /// Model-visible tool name.
    pub tool: String,
    /// The session.
    pub session_id: SessionId,
    /// The tool call.
    pub call_id: CallId,
    /// Default or background.
    pub execution: Execution,
    /// Where it stands.
    pub status: RunStatus,
    /// The journal's next seq (its length).
    pub next_seq: u64,
    /// How far a worker has processed the journal: events at or past this seq are undelivered.
    pub processed_seq: u64,
    /// Whether a cancel was requested.
    pub cancel_requested: bool,
    /// Claims since the last successful worker append: a run whose activations keep dying
    /// counts up here, so the engine can park it as poisoned.
    pub activations: u32,
    /// The worker holding it, if any, with the epoch it claimed under.
    #[cfg_attr(feature = "openapi", schema(schema_with = owner_schema))]
    pub owner: Option<(WorkerId, u64)>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
    /// What its body labelled it with ([`WorkflowCtx::set_attributes`](crate::engine::WorkflowCtx::set_attributes)):
    /// key → string, number or boolean, the merge of every `AttributesSet` in its journal.
    /// Indexed by `(key, value)` in every store ([`RunQuery::attribute`]). Absent from records
    /// serialized before attributes existed, and when empty.
    #[serde(default, skip_serializing_if = "Attributes::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub attributes: Attributes,
}

/// The schema of [`RunRecord::owner`]: `[worker id, epoch]`, or null. Written out because the
/// tuple schema utoipa derives closes the array with `items: false`, a boolean schema that
/// OpenAPI tools such as openapi-core cannot read.
#[cfg(feature = "openapi")]
fn owner_schema() -> utoipa::openapi::schema::Array {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, SchemaType, Type};
    ArrayBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Array, Type::Null]))
        .prefix_items([
            ObjectBuilder::new().schema_type(Type::String).build(),
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(0))
                .build(),
        ])
        .min_items(Some(2))
        .max_items(Some(2))
        .description(Some(
            "The worker holding the run and the epoch it claimed under; null when none does.",
        ))
        .build()
}

impl RunRecord {
    /// The fencing token of the activation that claimed this record: `(next_seq, activations)`
    /// at the claim. Every later claim of the run, by any worker, gets a larger token
    /// (contract clause 5), so a side-effecting service that remembers the largest token it was
    /// shown for a run and refuses smaller ones refuses a worker whose lease lapsed and whose
    /// run another worker took over. See [`StepCtx::fencing_token`](crate::engine::StepCtx::fencing_token).
    pub fn fencing_token(&self) -> FencingToken {
        FencingToken {
            seq: self.next_seq,
            claim: self.activations,
        }
    }
}

/// A number that grows with every claim of a run (see [`RunRecord::fencing_token`]). Compare
/// tokens of the same run only; order is by journal length at the claim, then by the claim's
/// count since the last append.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FencingToken {
    seq: u64,
    claim: u32,
}

impl FencingToken {
    /// The token as one number, ordered like the token: `seq * 2^32 + claim`. Store it in a
    /// `NUMERIC` column, or as its two parts compared as a pair.
    pub fn value(self) -> u128 {
        (u128::from(self.seq) << 32) | u128::from(self.claim)
    }

    /// The journal's length when the run was claimed.
    pub fn seq(self) -> u64 {
        self.seq
    }

    /// Claims of the run since the last append, this one included.
    pub fn claim(self) -> u32 {
        self.claim
    }
}

impl std::fmt::Display for FencingToken {
    /// The decimal [`value`](Self::value).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.value())
    }
}

/// The answer of [`JournalStore::create_run`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatedRun {
    /// The run (new or existing).
    pub run: RunRecord,
    /// False when the idempotency key named an existing run.
    pub created: bool,
}

/// A worker's lease: one per worker, renewed by heartbeats. Every run the worker claims is held
/// under it; a newer epoch of the same worker id supersedes (fences) the older. A lease is
/// *valid* at `now` while its worker is not retired, its epoch is the worker's current one, and
/// `expires_at > now`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The worker.
    pub worker: WorkerId,
    /// The deployment whose runs it claims.
    pub deployment: DeploymentId,
    /// Incarnation number; grows at every registration of this worker id.
    pub epoch: u64,
    /// The lease is valid until then unless renewed.
    pub expires_at: Timestamp,
}

/// A conditional, fenced append.
#[derive(Clone, Debug)]
pub struct Append {
    /// The run.
    pub run: RunId,
    /// The seq the first event must get (the journal's next seq as the writer last saw it).
    pub expected_seq: u64,
    /// The writer's lease; must be the run's owner at its current epoch.
    pub lease: Lease,
    /// Recognises a retry of this append after an ambiguous commit.
    pub append_id: AppendId,
    /// 1 to [`MAX_EVENTS_PER_APPEND`] events.
    pub events: Vec<Event>,
    /// The writer's clock, stamped on each event.
    pub now: Timestamp,
}

/// The answer of a successful append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    /// Seq of the first event written.
    pub first_seq: u64,
    /// The journal's next seq after the append.
    pub next_seq: u64,
    /// True when this append id had landed before (an ambiguous commit's retry).
    pub duplicate: bool,
}

/// The answer of a successful external delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivered {
    /// The run delivered to.
    pub run: RunId,
    /// The seq of the delivered event.
    pub seq: u64,
    /// True when this was a retry of a delivery already accepted (same dedupe key, or the same
    /// answer again); nothing new was written.
    pub duplicate: bool,
}

/// The answer of [`JournalStore::request_cancel`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    /// `CancelRequested` was written at this seq.
    Requested {
        /// Its seq.
        seq: u64,
    },
    /// A cancel was requested before; nothing new was written.
    AlreadyRequested,
    /// The run had ended; nothing was written.
    AlreadyEnded {
        /// How it ended.
        status: RunStatus,
    },
}

/// The answer of [`JournalStoreExt::terminate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TerminateOutcome {
    /// The withdrawals and `RunTerminated` were written from this seq on.
    Terminated {
        /// The seq of the append's first event.
        seq: u64,
    },
    /// The run had ended already; nothing was written.
    NotLive {
        /// How it ended.
        status: RunStatus,
    },
}

/// The answer of [`JournalStoreExt::reset`] and [`JournalStoreExt::retry`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResetOutcome {
    /// The new run, as the reset left it (on a repeat, as it is now).
    pub run: RunRecord,
    /// False when the same reset (same old run, same cut) was made before: `run` is the run it
    /// made then, and nothing was written.
    pub created: bool,
    /// The old run and the cut.
    pub from: ResetFrom,
    /// How many of the old run's events the new run's journal holds after its `RunStarted`.
    pub copied: u64,
}

/// The seq at which an ended run's end begins: its first `CancelRequested`, withdrawal
/// (`InputWithdrawn`, written only by a cancel or in the append that ends a run) or end event
/// (`RunCompleted`, `RunFailed`, `RunCancelled`, `RunDenied`, `RunTerminated`); the journal's
/// length when it has none. A reset may cut at most here: what follows would cancel, withdraw
/// from or end the new run.
pub fn reset_limit(journal: &[StoredEvent]) -> u64 {
    journal
        .iter()
        .find(|e| {
            e.event.is_terminal()
                || matches!(
                    e.event,
                    Event::CancelRequested { .. } | Event::InputWithdrawn { .. }
                )
        })
        .map_or(journal.len() as u64, |e| e.seq)
}

/// Where [`JournalStoreExt::retry`] cuts a failed run's journal: at the first `StepFailed` of
/// the last step whose final attempt failed (fatal, or its retries exhausted: `retry_at` is
/// none) before the run's end, so that step gets all its attempts again and every step that
/// completed before it is replayed, not executed; when no step failed that way, at
/// [`reset_limit`] (the first event of the run's end), so the body runs again from where it
/// failed. The run must have ended with `RunFailed` or `RunTerminated`.
///
/// # Errors
/// `InvalidInput` when the run did not end failed or terminated (use a reset with an explicit
/// cut).
pub fn retry_point(run: &RunId, journal: &[StoredEvent]) -> Result<u64, StoreError> {
    let limit = reset_limit(journal);
    let end = journal.iter().find(|e| e.event.is_terminal());
    if !matches!(
        end.map(|e| &e.event),
        Some(Event::RunFailed { .. } | Event::RunTerminated { .. })
    ) {
        let how = end.map_or("not ended", |e| e.event.kind());
        return Err(StoreError::InvalidInput(format!(
            "run {run} ended {how}: only a failed (or terminated) run can be retried; reset it to a chosen seq instead (`eve runs reset {run} --to SEQ`)"
        )));
    }
    let before = &journal[..usize::try_from(limit)
        .unwrap_or(usize::MAX)
        .min(journal.len())];
    let last = before.iter().rev().find_map(|e| match &e.event {
        Event::StepFailed {
            cmd,
            retry_at: None,
            ..
        } => Some(*cmd),
        _ => None,
    });
    Ok(match last {
        Some(step) => before
            .iter()
            .find(|e| matches!(&e.event, Event::StepFailed { cmd, .. } if *cmd == step))
            .map_or(limit, |e| e.seq),
        None => limit,
    })
}

/// The events a reset of `old` cut at `to` copies into the new run `new`, in order, after its
/// `RunStarted`: the old run's events with `0 < seq < to`, with what names the old run
/// rewritten to name the new one (request ids `"{old}:{cmd}"` and host-agent hook tokens
/// `"agent:{old}:{key}"`), and without:
/// - `RunBlocked` / `RunResumed` (the engine's and the operator's state, not the body's
///   history: a copied `RunBlocked` would park the new run);
/// - an `AgentStarted` whose child's result is not in the copy (the child was started for the
///   old run and reports to it; the new run starts its own).
///
/// # Errors
/// `InvalidInput` unless `1 <= to <= reset_limit(journal)`, naming the allowed range.
pub fn reset_events(
    old: &RunId,
    new: &RunId,
    journal: &[StoredEvent],
    to: u64,
) -> Result<Vec<Event>, StoreError> {
    let limit = reset_limit(journal);
    if to < 1 || to > limit {
        return Err(StoreError::InvalidInput(format!(
            "cannot reset run {old} to seq {to}: the cut must be between 1 (only RunStarted) and {limit} (where its end, cancel or withdrawals begin), inclusive"
        )));
    }
    let prefix = &journal[1..usize::try_from(to).unwrap_or(usize::MAX).min(journal.len())];
    let rebase_request = |id: &RequestId| match id.as_str().strip_prefix(&format!("{old}:")) {
        Some(cmd) => RequestId::new(format!("{new}:{cmd}")),
        None => id.clone(),
    };
    let agent_prefix = format!("agent:{old}:");
    let answered_agents: std::collections::HashSet<u64> = prefix
        .iter()
        .filter_map(|e| match &e.event {
            Event::HookReceived { cmd, .. } => Some(*cmd),
            _ => None,
        })
        .collect();
    let mut out = Vec::with_capacity(prefix.len());
    for e in prefix {
        let event = match &e.event {
            Event::RunBlocked { .. } | Event::RunResumed => continue,
            Event::AgentStarted { cmd, .. } if !answered_agents.contains(cmd) => continue,
            Event::InputRequested {
                cmd,
                request_id,
                request,
            } => Event::InputRequested {
                cmd: *cmd,
                request_id: rebase_request(request_id),
                request: request.clone(),
            },
            Event::InputAnswered {
                request_id,
                response,
            } => Event::InputAnswered {
                request_id: rebase_request(request_id),
                response: response.clone(),
            },
            Event::HookCreated {
                cmd,
                token,
                webhook,
                respond_with,
            } => Event::HookCreated {
                cmd: *cmd,
                token: match token.strip_prefix(&agent_prefix) {
                    Some(key) => format!("agent:{new}:{key}"),
                    None => token.clone(),
                },
                webhook: *webhook,
                respond_with: respond_with.clone(),
            },
            other => other.clone(),
        };
        out.push(event);
    }
    Ok(out)
}

/// Splits `events` into appends within the per-append limits ([`MAX_EVENTS_PER_APPEND`],
/// [`MAX_APPEND_PAYLOAD_BYTES`]), in order.
fn append_chunks(events: Vec<Event>) -> Vec<Vec<Event>> {
    let mut chunks: Vec<Vec<Event>> = Vec::new();
    let mut bytes = 0;
    for e in events {
        let n = e.payload_bytes();
        match chunks.last_mut() {
            Some(c) if c.len() < MAX_EVENTS_PER_APPEND && bytes + n <= MAX_APPEND_PAYLOAD_BYTES => {
                bytes += n;
                c.push(e);
            }
            _ => {
                bytes = n;
                chunks.push(vec![e]);
            }
        }
    }
    chunks
}

/// How long the operator lease of a reset lives: a reset that dies halfway leaves its new run
/// held this long at most (less: see [`JournalStoreExt::reset`]).
pub const RESET_LEASE_TTL: Duration = Duration::from_secs(60);

/// An operator's decision on a run: resume or fail a blocked one, terminate a live one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Make it claimable again (after a fix was deployed): writes `RunResumed`.
    Resume,
    /// End it failed, which settles its tool call: withdraws its pending requests and writes
    /// `RunFailed`.
    Fail {
        /// The error the call is settled with.
        error: String,
    },
    /// End any live run (running, parked or blocked) at once: no grace period, no cleanup
    /// steps. Withdraws its pending requests and writes `RunTerminated`, which settles its tool
    /// call failed; the run's lease is released, so a worker still running its body finds its
    /// next append refused (`RunEnded`). On an ended run: `RunEnded`, nothing written.
    Terminate {
        /// Why.
        reason: String,
        /// Who.
        by: String,
    },
}

impl Resolution {
    /// Checks that `resolution` applies to a run in `status` (the backend's check, under the
    /// same lock as its write): `Resume` and `Fail` only to a blocked run (`InvalidInput`),
    /// `Terminate` to any live run (`RunEnded`).
    ///
    /// # Errors
    /// As above.
    pub fn check(&self, run: &RunId, status: RunStatus) -> Result<(), StoreError> {
        match self {
            Resolution::Terminate { .. } if status.is_terminal() => {
                Err(StoreError::RunEnded { run: run.clone() })
            }
            Resolution::Terminate { .. } => Ok(()),
            _ if status != RunStatus::Blocked => Err(StoreError::InvalidInput(format!(
                "run {run} is {}, not blocked; only a blocked run can be resumed or failed this way",
                status.as_str()
            ))),
            _ => Ok(()),
        }
    }

    /// The events a resolution writes, in one append, given the run's pending requests
    /// (ordered by cmd): `RunResumed`; or the withdrawals then `RunFailed` / `RunTerminated`.
    pub fn events(self, pending: impl IntoIterator<Item = RequestId>) -> Vec<Event> {
        let end = match self {
            Resolution::Resume => return vec![Event::RunResumed],
            Resolution::Fail { error } => Event::RunFailed { error },
            Resolution::Terminate { reason, by } => Event::RunTerminated { reason, by },
        };
        let mut events: Vec<Event> = pending
            .into_iter()
            .map(|request_id| Event::InputWithdrawn { request_id })
            .collect();
        events.push(end);
        events
    }

    /// Whether the events need the run's pending requests.
    pub fn withdraws(&self) -> bool {
        !matches!(self, Resolution::Resume)
    }
}

/// Which runs [`JournalStore::list_runs`] returns. All set fields must match.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunQuery {
    /// Runs of this session (the task index).
    pub session: Option<SessionId>,
    /// Runs in this status.
    pub status: Option<RunStatus>,
    /// Runs of this deployment.
    pub deployment: Option<DeploymentId>,
    /// Runs whose attribute `key` equals this value (a string, a number in
    /// [canonical form](crate::search::canonical_number), a boolean): backends answer it from
    /// their `(key, value)` index.
    pub attribute: Option<(String, serde_json::Value)>,
    /// At most this many (0 means no limit); ordered by creation time, then run id.
    pub limit: usize,
}

impl RunQuery {
    /// Whether `run` matches the filters (not the limit).
    pub fn matches(&self, run: &RunRecord) -> bool {
        self.session.as_ref().is_none_or(|s| s == &run.session_id)
            && self.status.is_none_or(|s| s == run.status)
            && self
                .deployment
                .as_ref()
                .is_none_or(|d| d == &run.deployment_id)
            && self.attribute.as_ref().is_none_or(|(k, v)| {
                run.attributes
                    .get(k)
                    .is_some_and(|a| crate::search::index_value(a) == crate::search::index_value(v))
            })
    }
}

/// How a person lists runs (the HTTP API's `GET /v1/runs`, `eve runs list`): filters and a
/// page over a store's [`JournalStore::list_runs`] listing, applied in memory. Fine for tens of
/// thousands of runs, not for millions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunFilter {
    /// Only runs in this status (the counts ignore it).
    pub status: Option<RunStatus>,
    /// Only runs of this tool.
    pub tool: Option<String>,
    /// Only runs whose run, session or call id contains this.
    pub text: Option<String>,
    /// Only runs created at or after this time.
    pub since: Option<Timestamp>,
    /// Only runs created before this time.
    pub until: Option<Timestamp>,
    /// Newest first (else oldest first, the store's order).
    pub newest_first: bool,
    /// The page after this run (the previous page's [`RunPage::next`]).
    pub before: Option<RunId>,
    /// At most this many (0: all).
    pub limit: usize,
    /// Only runs matching this search (on input and attributes). [`page`](Self::page) does not
    /// evaluate it (it needs the runs' inputs): list with [`search_runs`], which does.
    pub query: Option<RunSearch>,
}

/// One page of runs (see [`RunFilter::page`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RunPage {
    /// The runs, in the filter's order.
    pub runs: Vec<RunRecord>,
    /// The cursor of the following page, if there is one.
    pub next: Option<RunId>,
    /// The filtered runs by status (`running`, `blocked`, …), whatever the status filter and
    /// the page.
    pub counts: std::collections::BTreeMap<&'static str, usize>,
}

/// The runs of `query` that match `search` (all of them without one), oldest first: the
/// listing of [`JournalStore::list_runs`], narrowed by the store's attribute index when the search
/// has an `attr.<key> = value` predicate, then every predicate evaluated here, for every backend
/// the same way. Input predicates read each remaining run's `RunStarted` (one read per run).
///
/// # Errors
/// The store's.
pub async fn search_runs(
    store: &dyn JournalStore,
    query: &RunQuery,
    search: Option<&RunSearch>,
) -> Result<Vec<RunRecord>, StoreError> {
    let Some(search) = search else {
        return store.list_runs(query).await;
    };
    let mut q = query.clone();
    if q.attribute.is_none() {
        q.attribute = search.attr_equality();
    }
    // The limit applies to matches, not to what the index returns.
    q.limit = 0;
    let mut runs = store.list_runs(&q).await?;
    runs.retain(|r| search.matches_attributes(&r.attributes));
    if search.needs_input() {
        let mut kept = Vec::with_capacity(runs.len());
        for r in runs {
            let input = match store.read(&r.run_id, 0, 1).await?.into_iter().next() {
                Some(StoredEvent {
                    event: Event::RunStarted { input, .. },
                    ..
                }) => input.to_value().unwrap_or(serde_json::Value::Null),
                _ => serde_json::Value::Null,
            };
            if search.matches_input(&input) {
                kept.push(r);
            }
        }
        runs = kept;
    }
    if query.limit > 0 {
        runs.truncate(query.limit);
    }
    Ok(runs)
}

impl RunFilter {
    /// Filters, counts, orders and pages `runs` (a listing in the store's order). The
    /// [`query`](Self::query) is not evaluated here: pass the runs [`search_runs`] returns.
    ///
    /// # Errors
    /// `InvalidInput` when [`before`](Self::before) names no run of the filtered listing.
    pub fn page(&self, mut runs: Vec<RunRecord>) -> Result<RunPage, StoreError> {
        runs.retain(|r| {
            self.tool.as_ref().is_none_or(|t| &r.tool == t)
                && self.text.as_ref().is_none_or(|n| {
                    r.run_id.as_str().contains(n.as_str())
                        || r.session_id.as_str().contains(n.as_str())
                        || r.call_id.as_str().contains(n.as_str())
                })
                && self.since.is_none_or(|t| r.created_at >= t)
                && self.until.is_none_or(|t| r.created_at < t)
        });
        let mut counts: std::collections::BTreeMap<&'static str, usize> = [
            RunStatus::Running,
            RunStatus::Blocked,
            RunStatus::Completed,
            RunStatus::Failed,
            RunStatus::Cancelled,
        ]
        .into_iter()
        .map(|s| (s.as_str(), 0))
        .collect();
        for r in &runs {
            *counts.entry(r.status.as_str()).or_default() += 1;
        }
        runs.retain(|r| self.status.is_none_or(|s| r.status == s));
        if self.newest_first {
            runs.reverse();
        }
        if let Some(before) = &self.before {
            let at = runs.iter().position(|r| &r.run_id == before).ok_or_else(|| {
                StoreError::InvalidInput(format!(
                    "{before} is not a run of this listing: pass the cursor of the previous page with the same filters"
                ))
            })?;
            runs.drain(..=at);
        }
        let next = if self.limit > 0 && runs.len() > self.limit {
            runs.truncate(self.limit);
            runs.last().map(|r| r.run_id.clone())
        } else {
            None
        };
        Ok(RunPage { runs, next, counts })
    }
}

/// An input request that can still be answered.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingRequest {
    /// The request.
    pub request_id: RequestId,
    /// Its run.
    pub run_id: RunId,
    /// Its session.
    pub session_id: SessionId,
    /// The command that asked.
    pub cmd: u64,
    /// What was asked.
    pub request: InputRequest,
    /// When.
    pub requested_at: Timestamp,
}

/// Checks the per-append limits: event count and payload sizes, and that every
/// `AttributesSet` carries a valid patch ([`crate::search::parse_patch`]).
///
/// # Errors
/// `InvalidInput` for an empty list or an invalid attribute patch, `LimitExceeded` naming the
/// limit.
pub fn check_limits(events: &[Event]) -> Result<(), StoreError> {
    if events.is_empty() {
        return Err(StoreError::InvalidInput(
            "an append needs at least one event".into(),
        ));
    }
    for e in events {
        if let Event::AttributesSet { attributes, .. } = e {
            let v: serde_json::Value = attributes
                .to_value()
                .map_err(|e| StoreError::InvalidInput(format!("attributes: {e}")))?;
            crate::search::parse_patch(&v)?;
        }
    }
    if events.len() > MAX_EVENTS_PER_APPEND {
        return Err(StoreError::LimitExceeded {
            what: "events in one append",
            actual: events.len(),
            limit: MAX_EVENTS_PER_APPEND,
        });
    }
    let mut total = 0;
    for e in events {
        let n = e.payload_bytes();
        if n > MAX_PAYLOAD_BYTES {
            return Err(StoreError::LimitExceeded {
                what: "payload bytes of one event",
                actual: n,
                limit: MAX_PAYLOAD_BYTES,
            });
        }
        total += n;
    }
    if total > MAX_APPEND_PAYLOAD_BYTES {
        return Err(StoreError::LimitExceeded {
            what: "payload bytes of one append",
            actual: total,
            limit: MAX_APPEND_PAYLOAD_BYTES,
        });
    }
    Ok(())
}

/// The events [`JournalStore::request_cancel`] writes, in one append, on a run that has not
/// ended and has no cancel request yet: `CancelRequested`, then the withdrawal of every request
/// in `pending` (the run's pending requests, ordered by cmd), so an answer racing the cancel
/// either landed before it or is refused as `Withdrawn`; and on a `blocked` run, which no
/// worker claims, `RunCancelled` too, so its tool call settles at once.
pub fn cancel_events(
    reason: &str,
    blocked: bool,
    pending: impl IntoIterator<Item = RequestId>,
) -> Vec<Event> {
    let mut events = vec![Event::CancelRequested {
        reason: reason.to_owned(),
    }];
    events.extend(
        pending
            .into_iter()
            .map(|request_id| Event::InputWithdrawn { request_id }),
    );
    if blocked {
        events.push(Event::RunCancelled);
    }
    events
}

/// Checks the arguments of [`JournalStore::register_worker`]: non-empty worker and deployment
/// ids.
///
/// # Errors
/// `InvalidInput`.
pub fn check_worker_ids(worker: &WorkerId, deployment: &DeploymentId) -> Result<(), StoreError> {
    if worker.as_str().is_empty() || deployment.as_str().is_empty() {
        return Err(StoreError::InvalidInput(
            "worker id and deployment id must not be empty".into(),
        ));
    }
    Ok(())
}

/// Checks the worker id given to [`JournalStore::lock_worker`]: not empty.
///
/// # Errors
/// `InvalidInput`.
pub fn check_worker_id(worker: &WorkerId) -> Result<(), StoreError> {
    if worker.as_str().is_empty() {
        return Err(StoreError::InvalidInput(
            "worker id must not be empty".into(),
        ));
    }
    Ok(())
}

/// Checks a session id given to the session methods of contract clause 10: not empty.
///
/// # Errors
/// `InvalidInput`.
pub fn check_session_id(session: &SessionId) -> Result<(), StoreError> {
    if session.as_str().is_empty() {
        return Err(StoreError::InvalidInput(
            "session id must not be empty".into(),
        ));
    }
    Ok(())
}

/// Checks the arguments of [`JournalStore::queue_message`]: a non-empty session id and a
/// message of at most [`MAX_PAYLOAD_BYTES`].
///
/// # Errors
/// `InvalidInput`, `LimitExceeded`.
pub fn check_message(session: &SessionId, message: &Payload) -> Result<(), StoreError> {
    check_session_id(session)?;
    let n = message.get().len();
    if n > MAX_PAYLOAD_BYTES {
        return Err(StoreError::LimitExceeded {
            what: "payload bytes of one message",
            actual: n,
            limit: MAX_PAYLOAD_BYTES,
        });
    }
    Ok(())
}

/// Checks the arguments of [`JournalStore::deliver_hook`]: a non-empty token, and a dedupe key
/// that is either absent or non-empty.
///
/// # Errors
/// `InvalidInput` saying which argument was empty.
pub fn check_hook_delivery(token: &str, dedupe_key: Option<&str>) -> Result<(), StoreError> {
    if token.is_empty() {
        return Err(StoreError::InvalidInput(
            "hook token must not be empty".into(),
        ));
    }
    if dedupe_key == Some("") {
        return Err(StoreError::InvalidInput(
            "dedupe key must not be empty; pass None for at-least-once delivery".into(),
        ));
    }
    Ok(())
}

/// The index changes an append implies, computed once here so that every backend derives the
/// same hooks, requests, timers, status and session events from the same events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// `(token, cmd, webhook)` to register; a token that is live (for any run) fails the append
    /// with `AlreadyExists`.
    pub hooks_created: Vec<(String, u64, bool)>,
    /// Requests that became pending.
    pub requests_opened: Vec<(RequestId, u64, InputRequest)>,
    /// Requests answered or withdrawn by these events.
    pub requests_closed: Vec<RequestId>,
    /// `(cmd, due)` timers to set (replacing a timer of the same cmd).
    pub timers_set: Vec<(u64, Timestamp)>,
    /// Timers to clear.
    pub timers_cleared: Vec<u64>,
    /// The status after these events, if they change it.
    pub status: Option<RunStatus>,
    /// Whether a `CancelRequested` is among them.
    pub cancel_requested: bool,
    /// Session events to write, in order, in the same transaction.
    pub session_events: Vec<SessionEvent>,
    /// Attribute changes (`AttributesSet` patches, in order): `Some` sets (upsert in the
    /// index), `None` removes. Apply with [`apply_patch`](crate::search::apply_patch).
    pub attributes: AttributePatch,
}

impl Effects {
    /// Whether these events end the run. A backend then also releases every hook token of the
    /// run, closes every pending request and drops every timer, whatever the events named.
    pub fn ends_run(&self) -> bool {
        self.status.is_some_and(RunStatus::is_terminal)
    }

    /// Computes the effects of `events` appended to a run with the given execution mode.
    pub fn of(execution: Execution, events: &[Event]) -> Self {
        let mut fx = Effects::default();
        let background = execution == Execution::Background;
        for e in events {
            match e {
                Event::StepCompleted { cmd, .. } | Event::SleepFired { cmd } => {
                    fx.timers_cleared.push(*cmd)
                }
                Event::StepFailed { cmd, retry_at, .. } => match retry_at {
                    Some(at) => fx.timers_set.push((*cmd, *at)),
                    None => fx.timers_cleared.push(*cmd),
                },
                Event::SleepScheduled { cmd, wake_at } => fx.timers_set.push((*cmd, *wake_at)),
                Event::HookCreated {
                    cmd,
                    token,
                    webhook,
                    ..
                } => fx.hooks_created.push((token.clone(), *cmd, *webhook)),
                Event::InputRequested {
                    cmd,
                    request_id,
                    request,
                } => {
                    fx.requests_opened
                        .push((request_id.clone(), *cmd, request.clone()));
                    fx.session_events.push(match &request.agent {
                        Some(agent) => SessionEvent::AgentRequested {
                            request_id: request_id.clone(),
                            agent: agent.clone(),
                        },
                        None => SessionEvent::InputRequested {
                            request_id: request_id.clone(),
                            request: request.clone(),
                        },
                    });
                }
                Event::InputAnswered {
                    request_id,
                    response,
                } => {
                    fx.requests_closed.push(request_id.clone());
                    fx.session_events.push(match &response.agent {
                        Some(reply) => SessionEvent::AgentCompleted {
                            request_id: request_id.clone(),
                            answered_by: response.answered_by.clone(),
                            error: match reply {
                                crate::event::AgentReply::Error(e) => Some(e.clone()),
                                crate::event::AgentReply::Output(_) => None,
                            },
                        },
                        None => SessionEvent::InputAnswered {
                            request_id: request_id.clone(),
                            answered_by: response.answered_by.clone(),
                        },
                    });
                }
                Event::InputWithdrawn { request_id } => {
                    fx.requests_closed.push(request_id.clone());
                    fx.session_events.push(SessionEvent::InputWithdrawn {
                        request_id: request_id.clone(),
                    });
                }
                Event::Progress { value, .. } => fx.session_events.push(if background {
                    SessionEvent::TaskProgress {
                        value: value.clone(),
                    }
                } else {
                    SessionEvent::ActionPartial {
                        value: value.clone(),
                    }
                }),
                Event::MessagePosted { message, .. } => {
                    fx.session_events.push(SessionEvent::TaskMessage {
                        message: message.clone(),
                    })
                }
                Event::CancelRequested { .. } => fx.cancel_requested = true,
                Event::RunCompleted { output } => {
                    fx.status = Some(RunStatus::Completed);
                    fx.session_events.push(if background {
                        SessionEvent::TaskCompleted {
                            output: output.clone(),
                        }
                    } else {
                        SessionEvent::ToolSettled {
                            result: ToolResult::Completed {
                                output: output.clone(),
                            },
                        }
                    });
                }
                Event::RunFailed { error } => {
                    fx.status = Some(RunStatus::Failed);
                    fx.session_events.push(if background {
                        SessionEvent::TaskFailed {
                            error: error.clone(),
                        }
                    } else {
                        SessionEvent::ToolSettled {
                            result: ToolResult::Failed {
                                error: error.clone(),
                            },
                        }
                    });
                }
                Event::RunCancelled => {
                    fx.status = Some(RunStatus::Cancelled);
                    fx.session_events.push(if background {
                        SessionEvent::TaskCancelled
                    } else {
                        SessionEvent::ToolSettled {
                            result: ToolResult::Cancelled,
                        }
                    });
                }
                Event::RunDenied { reason } => {
                    // A denied run is a failed run to the stores (no status of its own); the
                    // session sees the typed outcome.
                    fx.status = Some(RunStatus::Failed);
                    fx.session_events.push(if background {
                        SessionEvent::TaskDenied {
                            reason: reason.clone(),
                        }
                    } else {
                        SessionEvent::ToolSettled {
                            result: ToolResult::Denied {
                                reason: reason.clone(),
                            },
                        }
                    });
                }
                Event::RunTerminated { reason, by } => {
                    // A terminated run is a failed run to the stores; its call settles failed
                    // with an error naming who terminated it and why.
                    fx.status = Some(RunStatus::Failed);
                    let error = Event::terminated_error(reason, by);
                    fx.session_events.push(if background {
                        SessionEvent::TaskFailed { error }
                    } else {
                        SessionEvent::ToolSettled {
                            result: ToolResult::Failed { error },
                        }
                    });
                }
                Event::RunBlocked { .. } => fx.status = Some(RunStatus::Blocked),
                Event::RunResumed => fx.status = Some(RunStatus::Running),
                Event::Patched { .. } => {}
                Event::AttributesSet { attributes, .. } => {
                    // check_limits refused an invalid patch before any backend got here.
                    if let Some(p) = attributes
                        .to_value::<serde_json::Value>()
                        .ok()
                        .and_then(|v| crate::search::parse_patch(&v).ok())
                    {
                        fx.attributes.extend(p);
                    }
                }
                Event::RunStarted { .. }
                | Event::HookReceived { .. }
                | Event::AgentStarted { .. }
                | Event::AgentCompleted { .. }
                | Event::AgentFailed { .. } => {}
            }
        }
        fx
    }
}

/// Where a run's journal and indexes live. Held as `Arc<dyn JournalStore>`.
///
/// # Contract
///
/// Every backend gives these guarantees; `eve-conformance` checks each one.
///
/// 1. **Linearizable appends.** [`append`](Self::append) writes all its events or none, only if
///    the journal's next seq is `expected_seq`, only if the append's lease owns the run at the
///    worker's current epoch; of concurrent appends at one seq exactly one wins, the rest get
///    `Conflict { expected, actual }`. A retry of an append that landed (same `append_id`) is
///    answered as success with `duplicate: true`. A store may group several runs' appends into
///    one transaction, but each append has its own outcome.
/// 2. **External deliveries, exactly once.** [`answer`](Self::answer) (atomic with the check that
///    the request is pending and accepts the response; the same answer again is a duplicate
///    success, a different one `AlreadyAnswered`, after the run ended `Withdrawn`),
///    [`deliver_hook`](Self::deliver_hook) (deduped by an optional caller key; without one,
///    at-least-once; a key belongs to one hook; a keyed delivery stays answerable as a
///    duplicate after its run ended, until the run is purged) and
///    [`request_cancel`](Self::request_cancel):
///    each writes at the next seq, chosen by the store, and needs no lease. Ended runs refuse
///    deliveries. A cancel request withdraws the run's pending requests in the same append
///    (an answer racing it lands before it and is kept, or is refused as `Withdrawn`), and on a
///    blocked run also ends it cancelled, so its call settles ([`cancel_events`]).
/// 3. **Idempotent starts.** [`create_run`](Self::create_run) returns the existing run for a
///    repeated idempotency key, also under concurrent duplicates; the same key with a different
///    input is `IdempotencyMismatch`.
/// 4. **Hooks.** A `HookCreated` event registers its token; a token maps to at most one live
///    hook store-wide (a second registration fails the append with `AlreadyExists`); tokens are
///    released when the run ends; deliveries to unknown tokens are `NotFound`.
/// 5. **Durable wake-ups and leases.** A running run is *claimable* when no valid lease holds
///    it (see [`Lease`]) and either
///    - it has work due at `now`: an event at or past `processed_seq`, or a timer
///      (`SleepScheduled`, a `StepFailed` retry) due at `now`; or
///    - it is *orphaned*: it still names an owner whose lease is no longer valid (expired at
///      `now`, superseded by a newer epoch of its worker id, or retired), so the activation
///      that owner was running may have died anywhere. It is claimable at once, with or
///      without work: no timer has to be journaled to guard an activation.
///
///    [`claim`](Self::claim) hands claimable runs to one worker, earliest *claim key* first:
///    the time its work is due, and for an orphaned run the earlier of that and its
///    `updated_at` (ties by creation order). The run stays that worker's until it
///    [`release`](Self::release)s it or ends it, or the worker's lease expires, is superseded
///    or retired. Nothing due is lost across crashes: work lives only in the store. A lease
///    that expired but whose runs nobody took over still writes: fencing is decided by
///    ownership and epoch, never by the writer's clock, so a slow worker that comes back loses
///    only the runs another worker claimed meanwhile.
///
///    Every claim (and an eager start) counts the run's `activations` up; only a worker's
///    [`append`](Self::append), which lengthens the journal, resets it. So the
///    [`RunRecord::fencing_token`] of successive claims of one run strictly increases,
///    whichever workers make them.
/// 6. **Faithful reads.** [`read`](Self::read) returns exactly what was appended, in seq order,
///    payloads byte for byte, paged; payloads up to [`MAX_PAYLOAD_BYTES`].
/// 7. **Queries.** Runs by id, by session, by status; pending requests by session; the session
///    log by seq.
/// 8. **API keys.** [`create_key`](Self::create_key) stores an [`ApiKey`] (its hash, never its
///    secret, and its optional expiry, returned as stored) whose id and hash are unique
///    store-wide; [`key_by_hash`](Self::key_by_hash) finds
///    it, revoked or not; [`revoke_key`](Self::revoke_key) marks it revoked once (the first
///    revocation time stays); [`list_keys`](Self::list_keys) lists every key, oldest first.
///
/// 9. **Retention.** [`purge`](Self::purge) deletes runs that *ended* before a cutoff (status
///    completed, failed or cancelled, and `updated_at`, the time of the write that ended them,
///    earlier than the cutoff) with everything kept for them: journal, append ids, session-log
///    entries, hook and dedupe records, requests and the idempotency key. Live runs (running,
///    blocked) are never touched. A purged run is as if it never existed: `get_run` and `read`
///    are `NotFound`, the session log and the task index no longer list it, its hook tokens and
///    idempotency key are free. The session log keeps its seq counter: later entries never reuse
///    a purged entry's seq.
/// 10. **Sessions and turns.** [`end_session`](Self::end_session) ends a session once (the first
///    end's time stays) and returns, consistently, every run of it that had not ended at that
///    commit; from then on [`create_run`](Self::create_run) and
///    [`create_run_claimed`](Self::create_run_claimed) of a new run in it fail
///    `SessionEnded`, from any handle or process (a retry of a start that landed before the end
///    still returns its run). [`queue_message`](Self::queue_message) persists a user message
///    at the session's next message seq (refused `SessionEnded` once ended);
///    [`take_messages`](Self::take_messages) hands every queued message over exactly once,
///    oldest first: concurrent takers never both get one message.
///    [`get_session`](Self::get_session) reads both. Sessions outlive [`purge`](Self::purge).
/// 11. **One live holder per worker id.** [`lock_worker`](Self::lock_worker) gives a
///    [`WorkerLock`] on a worker id while no other live lock holds that id on the same
///    storage, from any handle or process; otherwise it fails `WorkerIdInUse` naming the holder
///    (pid, host, since when). The lock is freed when it is dropped and when its process dies,
///    with no lease to wait out where the backend can tell (a file lock, a database session),
///    so a process restarted after a crash gets it at once; where it cannot (DynamoDB) within a
///    few seconds. The lock is separate from the lease: [`register_worker`](Self::register_worker)
///    does not check it, so a restart still fences its dead predecessor's epoch.
///
/// Time is always an argument (`now`), never the store's own clock, so tests can simulate it.
/// Limits are the same on every backend: [`MAX_EVENTS_PER_APPEND`], [`MAX_PAYLOAD_BYTES`],
/// [`MAX_APPEND_PAYLOAD_BYTES`], checked with [`check_limits`].
///
/// # Cancel safety
/// Dropping a future of a write (append, delivery, claim) may leave it applied or not; the
/// write itself is atomic. Retry an append with the same `append_id` to learn which.
#[async_trait]
pub trait JournalStore: Debug + Send + Sync + 'static {
    /// A short name for messages and benchmarks: "memory", "sqlite", "postgres", "dynamodb".
    fn backend(&self) -> &'static str;

    /// Starts a run (writes `RunStarted` at seq 0) or returns the run its idempotency key
    /// already names.
    ///
    /// # Errors
    /// `InvalidInput` (empty ids or key), `LimitExceeded`, `IdempotencyMismatch`,
    /// `AlreadyExists` (the run id exists under another key), `SessionEnded` (a new run in a
    /// session [`end_session`](Self::end_session) ended).
    async fn create_run(&self, run: NewRun, now: Timestamp) -> Result<CreatedRun, StoreError>;

    /// Eager start: [`create_run`](Self::create_run) and, in the same commit, a claim of the new
    /// run under `lease` when the lease is valid at `now` (the record then names the lease as
    /// owner and counts one activation), so the creating process runs the body at once with no
    /// claim round trip and no read (its journal is the `RunStarted` just written). A repeated
    /// key returns the existing run as `create_run` does, claiming nothing; an invalid lease
    /// claims nothing. The default claims nothing: workers claim the run as usual.
    ///
    /// # Errors
    /// As [`create_run`](Self::create_run).
    async fn create_run_claimed(
        &self,
        run: NewRun,
        lease: &Lease,
        now: Timestamp,
    ) -> Result<CreatedRun, StoreError> {
        let _ = lease;
        self.create_run(run, now).await
    }

    /// The conditional, fenced append of guarantee 1. Applies the [`Effects`] of its events in
    /// the same transaction. A successful append also sets `processed_seq` to the new next seq
    /// (the writer has seen its own events) and resets `activations`.
    ///
    /// # Errors
    /// `Conflict`, `Fenced`, `NotFound` (run), `RunEnded`, `AlreadyExists` (hook token live),
    /// `InvalidInput` (empty list, a `RunStarted`), `LimitExceeded`.
    async fn append(&self, append: Append) -> Result<Appended, StoreError>;

    /// Up to `max` events from `from_seq` on, in order. `from_seq` equal to the journal's length
    /// gives an empty page.
    ///
    /// # Errors
    /// `NotFound` (run), `InvalidInput` (`from_seq` past the end, or `max` = 0), `Corrupt`.
    async fn read(
        &self,
        run: &RunId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, StoreError>;

    /// The run's record.
    ///
    /// # Errors
    /// `NotFound`.
    async fn get_run(&self, run: &RunId) -> Result<RunRecord, StoreError>;

    /// Runs matching `query`, oldest first.
    ///
    /// # Errors
    /// Backend faults only.
    async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError>;

    /// Answers a pending request: writes `InputAnswered` at the run's next seq.
    ///
    /// # Errors
    /// `NotFound` (unknown request), `AlreadyAnswered` (answered with another response),
    /// `Withdrawn` (the run ended or withdrew it), `InvalidAnswer`.
    async fn answer(
        &self,
        request: &RequestId,
        response: InputResponse,
        now: Timestamp,
    ) -> Result<Delivered, StoreError>;

    /// Delivers a payload to the live hook of `token`: writes `HookReceived` at the run's next
    /// seq. With a `dedupe_key`, a repeated key for the same hook is a duplicate success, also
    /// after the hook's run ended (the token released), until that run is purged: a sender
    /// who only saw a disconnect learns that its delivery was accepted, and where.
    ///
    /// # Errors
    /// `NotFound` (no live hook has this token, and no retained delivery has this token and
    /// key), `InvalidInput` (empty token or key), `LimitExceeded`.
    async fn deliver_hook(
        &self,
        token: &str,
        payload: Payload,
        dedupe_key: Option<&str>,
        now: Timestamp,
    ) -> Result<Delivered, StoreError>;

    /// Requests cancellation: writes [`cancel_events`] once, in one append: `CancelRequested`,
    /// the withdrawal of every pending request and, on a blocked run, `RunCancelled`. An ended
    /// run answers `AlreadyEnded`, even when a cancel had been requested before it ended.
    ///
    /// # Errors
    /// `NotFound`.
    async fn request_cancel(
        &self,
        run: &RunId,
        reason: &str,
        now: Timestamp,
    ) -> Result<CancelOutcome, StoreError>;

    /// Resumes or fails a blocked run, or terminates any live run ([`Resolution::check`],
    /// [`Resolution::events`]).
    ///
    /// # Errors
    /// `NotFound`; `InvalidInput` when the run is not blocked (resume, fail); `RunEnded` when
    /// it ended (terminate).
    async fn resolve_blocked(
        &self,
        run: &RunId,
        resolution: Resolution,
        now: Timestamp,
    ) -> Result<u64, StoreError>;

    /// Pending requests of a session, oldest first.
    ///
    /// # Errors
    /// Backend faults only.
    async fn pending_requests(
        &self,
        session: &SessionId,
    ) -> Result<Vec<PendingRequest>, StoreError>;

    /// Up to `max` entries of a session's log from `from_seq` on (an unknown session has an
    /// empty log).
    ///
    /// # Errors
    /// `InvalidInput` (`max` = 0), `Corrupt`.
    async fn read_session(
        &self,
        session: &SessionId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<SessionEntry>, StoreError>;

    /// Registers (or re-registers) a worker: a new epoch that supersedes every earlier one of
    /// this worker id, valid for `ttl`. The runs the earlier epochs still hold become orphaned
    /// and claimable at once (contract clause 5): this is how a restarted process takes back
    /// its dead predecessor's runs without waiting for their lease to expire.
    ///
    /// # Errors
    /// `InvalidInput` (empty id).
    async fn register_worker(
        &self,
        worker: &WorkerId,
        deployment: &DeploymentId,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError>;

    /// Renews a lease for another `ttl` from `now`.
    ///
    /// # Errors
    /// `Fenced` when the epoch was superseded or the worker retired; `NotFound` for a worker id
    /// never registered.
    async fn heartbeat(
        &self,
        lease: &Lease,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError>;

    /// Claims up to `max` claimable runs of the lease's deployment, earliest work first, and
    /// counts one activation on each. Claims racing each other may split the claimable runs
    /// between them, so a claim under contention may return fewer than `max` runs; it never
    /// returns a run that another valid lease holds.
    ///
    /// # Errors
    /// `Fenced` when the lease is superseded or expired at `now`.
    async fn claim(
        &self,
        lease: &Lease,
        max: usize,
        now: Timestamp,
    ) -> Result<Vec<RunRecord>, StoreError>;

    /// Gives a run back, recording that the journal was processed up to `processed_seq`
    /// (exclusive). Deliveries after that seq make it claimable again.
    ///
    /// # Errors
    /// `Fenced` when the lease does not own the run; `NotFound`.
    async fn release(
        &self,
        lease: &Lease,
        run: &RunId,
        processed_seq: u64,
        now: Timestamp,
    ) -> Result<(), StoreError>;

    /// Retires the worker (graceful shutdown): its lease is no longer valid, so every run it
    /// still holds is orphaned and claimable at once by other workers (contract clause 5).
    ///
    /// # Errors
    /// `Fenced` when the epoch was superseded.
    async fn retire_worker(&self, lease: &Lease, now: Timestamp) -> Result<(), StoreError>;

    /// Takes the process lock of `worker` (contract clause 11), which a worker holds for its
    /// whole life so that an accidental second process with the same id refuses to start
    /// instead of fencing the first. Uses the wall clock, not a `now` argument: it is about
    /// live processes, not journal time.
    ///
    /// The default holds the id within this process only ([`lock_in_process`] on
    /// [`store_id`](Self::store_id)); a backend shared by several processes overrides it with
    /// a lock its processes share and that is freed when the holder dies. A wrapper store
    /// forwards both this and `store_id`, else all its instances share one set of ids.
    ///
    /// # Errors
    /// `WorkerIdInUse` while another live lock holds the id; `InvalidInput` (empty id);
    /// backend faults.
    ///
    /// [`lock_in_process`]: crate::worker_lock::lock_in_process
    async fn lock_worker(&self, worker: &WorkerId) -> Result<WorkerLock, StoreError> {
        check_worker_id(worker)?;
        crate::worker_lock::lock_in_process(&self.store_id(), worker)
    }

    /// The earliest time a run of `deployment` that no valid lease holds will have work (now or
    /// later), so an idle worker knows how long it may sleep. `None`: nothing scheduled.
    ///
    /// # Errors
    /// Backend faults only.
    async fn next_wake(
        &self,
        deployment: &DeploymentId,
        now: Timestamp,
    ) -> Result<Option<Timestamp>, StoreError>;

    /// Wake-ups for idle workers: a receiver whose value changes when a run may have become
    /// claimable without a timer (a new run, an answer, a hook payload, a cancel request, a
    /// resumed run, a retired worker). Only a hint that saves polling latency: a worker still
    /// polls slowly, and a backend may miss wake-ups from other processes. `None` (the
    /// default): the backend has none, workers poll.
    async fn wakeups(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// A receiver whose value changes when `key` may have changed: a session's log grew, or an
    /// external delivery reached a run (see [`WatchKey`]). Like [`wakeups`](Self::wakeups) only
    /// a hint: the waiter re-reads the store, and keeps a slow fallback poll for what the
    /// backend cannot see. `None` (the default): the backend cannot tell, waiters poll.
    async fn watch(&self, key: &WatchKey) -> Option<tokio::sync::watch::Receiver<u64>> {
        let _ = key;
        None
    }

    /// A stable name of where this store keeps its data, the same in every process that opens
    /// the same store (a file's canonical path, a database and schema, an endpoint and table).
    /// Default worker ids are derived from it, so a restarted process takes back its
    /// predecessor's runs. The default is [`backend`](Self::backend).
    fn store_id(&self) -> String {
        self.backend().to_owned()
    }

    /// Stores a new API key (contract clause 8). The default: keys are not supported.
    ///
    /// # Errors
    /// `InvalidInput` (see [`ApiKey::validate`]), `AlreadyExists` (its id or hash is taken).
    async fn create_key(&self, key: ApiKey) -> Result<(), StoreError> {
        let _ = key;
        Err(keys_unsupported(self.backend()))
    }

    /// Every API key, revoked ones included, oldest first (by creation time, then id).
    ///
    /// # Errors
    /// Backend faults only.
    async fn list_keys(&self) -> Result<Vec<ApiKey>, StoreError> {
        Err(keys_unsupported(self.backend()))
    }

    /// Revokes the key `id` at `now` and returns its record. Revoking a revoked key changes
    /// nothing and returns it as it is.
    ///
    /// # Errors
    /// `NotFound`.
    async fn revoke_key(&self, id: &str, now: Timestamp) -> Result<ApiKey, StoreError> {
        let _ = (id, now);
        Err(keys_unsupported(self.backend()))
    }

    /// The key whose hash is `hash`, revoked or not; `None` when no key has it.
    ///
    /// # Errors
    /// Backend faults only.
    async fn key_by_hash(&self, hash: &str) -> Result<Option<ApiKey>, StoreError> {
        let _ = hash;
        Err(keys_unsupported(self.backend()))
    }

    /// Retention (contract clause 9): deletes up to `limit` runs (0: no limit) that ended
    /// before `ended_before`, and everything kept for them, and returns how many it deleted.
    /// Each run is deleted whole: in one transaction, or (DynamoDB, whose runs span many
    /// items) with its record deleted last, so a purge interrupted halfway leaves the run listed
    /// and the next call finishes it. Live runs are never touched. Idempotent: once a call
    /// returned less than `limit` (or had no limit), another call with the same cutoff deletes
    /// nothing and returns 0. Work per call is bounded by `limit`, so a caller that wants
    /// everything gone calls again while the answer equals `limit`.
    ///
    /// # Errors
    /// Backend faults only.
    async fn purge(&self, ended_before: Timestamp, limit: usize) -> Result<usize, StoreError>;

    /// Ends `session` (contract clause 10): from this commit on no new run starts in it and no
    /// message is queued. Idempotent: ending it again keeps the first end's time. Returns the
    /// session's runs that had not ended at the end's commit, for the caller to cancel. The
    /// default: sessions are not supported.
    ///
    /// # Errors
    /// `InvalidInput` (empty id).
    async fn end_session(
        &self,
        session: &SessionId,
        now: Timestamp,
    ) -> Result<SessionEnd, StoreError> {
        let _ = (session, now);
        Err(sessions_unsupported(self.backend()))
    }

    /// The session's record: when it ended, and its queued messages oldest first. An unknown
    /// session is live with an empty queue.
    ///
    /// # Errors
    /// `InvalidInput` (empty id), `Corrupt`.
    async fn get_session(&self, session: &SessionId) -> Result<SessionRecord, StoreError> {
        let _ = session;
        Err(sessions_unsupported(self.backend()))
    }

    /// Persists a user message in the session's queue at its next message seq (from 0, never
    /// reused). Not deduplicated: each call queues one message.
    ///
    /// # Errors
    /// `SessionEnded`, `InvalidInput` (empty id), `LimitExceeded` (over
    /// [`MAX_PAYLOAD_BYTES`]).
    async fn queue_message(
        &self,
        session: &SessionId,
        message: Payload,
        now: Timestamp,
    ) -> Result<QueuedMessage, StoreError> {
        let _ = (session, message, now);
        Err(sessions_unsupported(self.backend()))
    }

    /// Takes every queued message of the session, oldest first, and removes them from the
    /// queue in the same commit: each message is taken exactly once, whichever handles or
    /// processes take concurrently. Empty when nothing is queued.
    ///
    /// # Errors
    /// `InvalidInput` (empty id), `Corrupt`.
    async fn take_messages(&self, session: &SessionId) -> Result<Vec<QueuedMessage>, StoreError> {
        let _ = session;
        Err(sessions_unsupported(self.backend()))
    }
}

/// The answer of the default session methods of a store without sessions.
fn sessions_unsupported(backend: &'static str) -> StoreError {
    StoreError::Other {
        backend,
        source: "this store keeps no session records (contract clause 10); implement end_session, get_session, queue_message and take_messages"
            .into(),
    }
}

/// The answer of the default key methods of a store without API keys.
fn keys_unsupported(backend: &'static str) -> StoreError {
    StoreError::Other {
        backend,
        source: "this store keeps no API keys; use the memory, SQLite, Postgres or DynamoDB store"
            .into(),
    }
}

/// Conveniences over [`JournalStore`], for every store.
#[async_trait]
pub trait JournalStoreExt: JournalStore {
    /// The whole journal from `from_seq`, read page by page.
    ///
    /// # Errors
    /// As [`JournalStore::read`].
    async fn read_all(&self, run: &RunId, from_seq: u64) -> Result<Vec<StoredEvent>, StoreError> {
        let mut out = Vec::new();
        let mut seq = from_seq;
        loop {
            let page = self.read(run, seq, READ_PAGE).await?;
            let Some(last) = page.last() else {
                return Ok(out);
            };
            // A backend may return short pages (DynamoDB's 1 MB query pages), so only an empty
            // page ends the journal.
            seq = last.seq + 1;
            out.extend(page);
        }
    }

    /// Up to `limit` events from `from_seq` on, read in pages of at most [`READ_PAGE`]: one
    /// window of a long journal, so a reader (`eve journal --from --limit`, the runs API) holds
    /// what it shows and no more. Fewer than `limit` only at the journal's end.
    ///
    /// # Errors
    /// As [`JournalStore::read`].
    async fn read_range(
        &self,
        run: &RunId,
        from_seq: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let mut out = Vec::with_capacity(limit.min(READ_PAGE));
        let mut seq = from_seq;
        while out.len() < limit {
            let page = self
                .read(run, seq, (limit - out.len()).min(READ_PAGE))
                .await?;
            let Some(last) = page.last() else {
                break;
            };
            seq = last.seq + 1;
            out.extend(page);
        }
        Ok(out)
    }

    /// Terminates a live run ([`Resolution::Terminate`]): `Terminated` with the seq the
    /// append began at, or `NotLive` naming how the run had ended (nothing written).
    ///
    /// # Errors
    /// `NotFound`; backend faults.
    async fn terminate(
        &self,
        run: &RunId,
        reason: &str,
        by: &str,
        now: Timestamp,
    ) -> Result<TerminateOutcome, StoreError> {
        let resolution = Resolution::Terminate {
            reason: reason.to_owned(),
            by: by.to_owned(),
        };
        match self.resolve_blocked(run, resolution, now).await {
            Ok(seq) => Ok(TerminateOutcome::Terminated { seq }),
            Err(StoreError::RunEnded { .. }) => Ok(TerminateOutcome::NotLive {
                status: self.get_run(run).await?.status,
            }),
            Err(e) => Err(e),
        }
    }

    /// Resets an ended run to the cut `to` (Temporal's reset): starts a new run of the same
    /// workflow, tool, input and session, pinned to `deployment` (pass the deployment that now
    /// serves the tool, so a reset after a fix runs the new code), whose journal is its
    /// `RunStarted` (naming the old run and the cut in `reset_from`) followed by the old run's
    /// events with `0 < seq < to` as [`reset_events`] rewrites them. A worker then replays
    /// that prefix (its steps are not executed again) and runs the body on from there. The old
    /// run and its journal are kept as they were.
    ///
    /// - The new run's call id is `"{old call}~reset-{to}"`; its run id is fresh.
    /// - **Idempotent**: the new run's idempotency key is `"reset:{old run}@{to}"`, so the same
    ///   reset again (from any process, also after a crash) returns the run it made
    ///   (`created: false`) and writes nothing.
    /// - **No worker runs the new run before its copy is in**: the new run is created claimed
    ///   by a short-lived operator worker (`reset:{new run}`, registered for [`RESET_LEASE_TTL`])
    ///   and the copy is appended under that lease, in one fenced append (several when the copy
    ///   exceeds the per-append limits); then the operator worker retires, which hands the run
    ///   to the deployment's workers at once. A reset that dies halfway leaves the new run
    ///   with its `RunStarted` and none, or (only for a copy of over
    ///   [`MAX_EVENTS_PER_APPEND`] events) some, of the copy: a shorter prefix of the same
    ///   history, which replays like a reset to an earlier cut; its lease expires and a worker
    ///   takes it over.
    /// - A copied request that was answered within the prefix is closed in the new run (not
    ///   answerable); one still open is pending under the new run's request id. Hook tokens
    ///   are copied (the old run released them when it ended); webhook URLs stay the same.
    /// - When the copy cannot be written (a copied hook token is live again, for instance held
    ///   by an earlier reset's run that is still running), the new run is ended failed with the
    ///   reason, and the error is returned.
    /// - Copied events carry the reset's time, not their first one: `ctx.now()` in the replayed
    ///   part reads the time of the reset.
    ///
    /// # Errors
    /// `NotFound` (no such run); `RunNotEnded` (the run is running or blocked: terminate or
    /// cancel it first); `InvalidInput` (`to` outside `1..=`[`reset_limit`]); `SessionEnded`
    /// (the old run's session was ended); backend faults.
    async fn reset(
        &self,
        run: &RunId,
        to: u64,
        deployment: &DeploymentId,
        now: Timestamp,
    ) -> Result<ResetOutcome, StoreError> {
        let (old, journal) = ended_run(self, run).await?;
        reset_to(self, &old, &journal, to, deployment, now).await
    }

    /// Retries a failed run: [`reset`](Self::reset) to [`retry_point`] (the first attempt of
    /// the step whose failure failed the run, else the start of the run's end), with the same
    /// guarantees; idempotent like a reset to that cut.
    ///
    /// # Errors
    /// As [`reset`](Self::reset); `InvalidInput` for a run that ended other than failed or
    /// terminated (completed, cancelled, denied).
    async fn retry(
        &self,
        run: &RunId,
        deployment: &DeploymentId,
        now: Timestamp,
    ) -> Result<ResetOutcome, StoreError> {
        let (old, journal) = ended_run(self, run).await?;
        let to = retry_point(run, &journal)?;
        reset_to(self, &old, &journal, to, deployment, now).await
    }

    /// The last event of `run`'s journal as `run` (a record read before) knows it: for an
    /// ended run, the `RunCompleted`/`RunFailed`/`RunCancelled` that ended it.
    ///
    /// # Errors
    /// As [`JournalStore::read`].
    async fn last_event(&self, run: &RunRecord) -> Result<Option<StoredEvent>, StoreError> {
        if run.next_seq == 0 {
            return Ok(None);
        }
        Ok(self
            .read(&run.run_id, run.next_seq - 1, 1)
            .await?
            .into_iter()
            .next())
    }
}

impl<T: JournalStore + ?Sized> JournalStoreExt for T {}

/// The record and journal of `run`, which must have ended (what a reset or retry starts from).
async fn ended_run<S: JournalStore + ?Sized>(
    store: &S,
    run: &RunId,
) -> Result<(RunRecord, Vec<StoredEvent>), StoreError> {
    let old = store.get_run(run).await?;
    if !old.status.is_terminal() {
        return Err(StoreError::RunNotEnded {
            run: run.clone(),
            status: old.status.as_str(),
        });
    }
    let journal = store.read_all(run, 0).await?;
    Ok((old, journal))
}

/// [`JournalStoreExt::reset`] once the old run was read and found ended.
async fn reset_to<S: JournalStore + ?Sized>(
    store: &S,
    old: &RunRecord,
    journal: &[StoredEvent],
    to: u64,
    deployment: &DeploymentId,
    now: Timestamp,
) -> Result<ResetOutcome, StoreError> {
    let new_id = RunId::random();
    let events = reset_events(&old.run_id, &new_id, journal, to)?;
    let Some(Event::RunStarted {
        input, traceparent, ..
    }) = journal.first().map(|e| &e.event)
    else {
        return Err(StoreError::Corrupt {
            run: old.run_id.clone(),
            seq: 0,
            reason: "the journal does not start with RunStarted".into(),
        });
    };
    let from = ResetFrom {
        run: old.run_id.clone(),
        seq: to,
    };
    let new = NewRun {
        run_id: new_id.clone(),
        idempotency_key: Some(format!("reset:{}@{to}", old.run_id)),
        workflow_id: old.workflow_id.clone(),
        deployment_id: deployment.clone(),
        tool: old.tool.clone(),
        input: input.clone(),
        session_id: old.session_id.clone(),
        call_id: CallId::new(format!("{}~reset-{to}", old.call_id)),
        execution: old.execution,
        traceparent: traceparent.clone(),
        reset_from: Some(from.clone()),
    };
    let copied = events.len() as u64;
    let worker = WorkerId::new(format!("reset:{new_id}"));
    let lease = store
        .register_worker(&worker, deployment, RESET_LEASE_TTL, now)
        .await?;
    let created = match store.create_run_claimed(new, &lease, now).await {
        Ok(c) => c,
        Err(e) => {
            let _ = store.retire_worker(&lease, now).await;
            return Err(e);
        }
    };
    if !created.created {
        let _ = store.retire_worker(&lease, now).await;
        return Ok(ResetOutcome {
            run: created.run,
            created: false,
            from,
            copied,
        });
    }
    let copy = async {
        if created.run.owner != Some((lease.worker.clone(), lease.epoch)) {
            return Err(StoreError::Other {
                backend: store.backend(),
                source: "create_run_claimed did not claim the new run: this store cannot reset runs safely (implement create_run_claimed)".into(),
            });
        }
        let mut seq = 1;
        for chunk in append_chunks(events) {
            let appended = store
                .append(Append {
                    run: new_id.clone(),
                    expected_seq: seq,
                    lease: lease.clone(),
                    append_id: AppendId::random(),
                    events: chunk,
                    now,
                })
                .await?;
            seq = appended.next_seq;
        }
        Ok(())
    };
    let result = copy.await;
    if let Err(e) = &result {
        // The new run must not run a partial or empty history as if it were the whole one:
        // end it failed, naming why.
        let _ = store
            .append(Append {
                run: new_id.clone(),
                expected_seq: store.get_run(&new_id).await.map_or(1, |r| r.next_seq),
                lease: lease.clone(),
                append_id: AppendId::random(),
                events: vec![Event::RunFailed {
                    error: format!(
                        "[reset_failed] the reset of run {} to seq {to} could not copy its journal: {e}",
                        old.run_id
                    ),
                }],
                now,
            })
            .await;
    }
    // Retiring orphans the new run, so the deployment's workers claim it at once.
    let retired = store.retire_worker(&lease, now).await;
    result?;
    retired?;
    Ok(ResetOutcome {
        run: store.get_run(&new_id).await?,
        created: true,
        from,
        copied,
    })
}
