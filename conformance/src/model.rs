//! The reference model of the [`JournalStore`](eve_core::JournalStore) contract: pure,
//! synchronous, written from the contract text (not from any store).
//!
//! Each `check_*` method takes a call's arguments and the outcome the store under test gave,
//! checks that outcome is one the contract allows, and applies it to the model. Where the
//! contract leaves a choice open the model accepts every allowed answer and follows the store:
//! which error wins when several apply, which of several equally due runs a claim takes, and
//! whether a lease past its expiry that nobody took over may still write (`Ok` or `Fenced`).

use eve_core::{
    AppendId, CancelOutcome, CreatedRun, Delivered, DeploymentId, Event, Execution, InputRequest,
    InputResponse, Lease, NewRun, Payload, PendingRequest, QueuedMessage, RequestId, ResetOutcome,
    Resolution, RunId, RunQuery, RunRecord, RunStatus, SessionEnd, SessionEntry, SessionEvent,
    SessionId, SessionRecord, StoreError, StoredEvent, TerminateOutcome, Timestamp, ToolResult,
    WorkerId,
};
use std::collections::BTreeMap;
use std::time::Duration;

/// The outcome of a check: `Err` describes how the store broke the contract.
pub type Check = Result<(), String>;

/// The stable name of an error kind, for comparing outcomes.
pub fn kind(e: &StoreError) -> &'static str {
    match e {
        StoreError::NotFound { .. } => "NotFound",
        StoreError::AlreadyExists { .. } => "AlreadyExists",
        StoreError::Conflict { .. } => "Conflict",
        StoreError::Fenced { .. } => "Fenced",
        StoreError::AlreadyAnswered { .. } => "AlreadyAnswered",
        StoreError::Withdrawn { .. } => "Withdrawn",
        StoreError::InvalidAnswer { .. } => "InvalidAnswer",
        StoreError::RunEnded { .. } => "RunEnded",
        StoreError::IdempotencyMismatch { .. } => "IdempotencyMismatch",
        StoreError::InvalidInput(_) => "InvalidInput",
        StoreError::LimitExceeded { .. } => "LimitExceeded",
        StoreError::Corrupt { .. } => "Corrupt",
        StoreError::Unavailable { .. } => "Unavailable",
        StoreError::SessionEnded { .. } => "SessionEnded",
        StoreError::WorkerIdInUse { .. } => "WorkerIdInUse",
        StoreError::RunNotEnded { .. } => "RunNotEnded",
        _ => "Other",
    }
}

/// A record with the field the contract leaves to the backend (`updated_at`) blanked, for
/// comparison.
pub fn comparable(r: &RunRecord) -> RunRecord {
    RunRecord {
        updated_at: Timestamp(0),
        ..r.clone()
    }
}

fn expect_err<T: std::fmt::Debug>(
    what: &str,
    actual: &Result<T, StoreError>,
    allowed: &[&str],
) -> Check {
    match actual {
        Err(e) if allowed.contains(&kind(e)) => Ok(()),
        other => Err(format!(
            "{what}: expected an error of kind {allowed:?}, got {other:?}"
        )),
    }
}

#[derive(Debug, Clone)]
struct MRun {
    rec: RunRecord,
    started: Event,
    events: Vec<StoredEvent>,
    landed: BTreeMap<AppendId, (u64, u64)>,
    timers: BTreeMap<u64, Timestamp>,
}

#[derive(Debug, Clone, PartialEq)]
enum ReqState {
    Pending,
    Answered(InputResponse, u64),
    Withdrawn,
}

#[derive(Debug, Clone)]
struct MReq {
    info: PendingRequest,
    state: ReqState,
}

#[derive(Debug, Clone)]
struct MWorker {
    epoch: u64,
    deployment: DeploymentId,
    expires_at: Timestamp,
    retired: bool,
}

#[derive(Debug, Clone, Default)]
struct MSession {
    ended_at: Option<Timestamp>,
    next_message: u64,
    queued: Vec<QueuedMessage>,
}

/// The model's state: what every store must hold after the same calls.
#[derive(Debug, Clone, Default)]
pub struct Model {
    runs: BTreeMap<RunId, MRun>,
    order: Vec<RunId>,
    keys: BTreeMap<String, RunId>,
    hooks: BTreeMap<String, (RunId, u64)>,
    dedupe: BTreeMap<(RunId, u64, String), u64>,
    /// (token, key) → every keyed delivery accepted with them, of any run (a token is reusable
    /// once its run ended): a retry after the run ended may be answered with any of them.
    delivered: BTreeMap<(String, String), Vec<(RunId, u64)>>,
    requests: BTreeMap<RequestId, MReq>,
    request_order: Vec<RequestId>,
    sessions: BTreeMap<SessionId, Vec<SessionEntry>>,
    /// Each session log's next seq, apart from the log: a purge never frees a seq.
    session_next: BTreeMap<SessionId, u64>,
    workers: BTreeMap<WorkerId, MWorker>,
    /// Session records (contract clause 10): ended sessions, message counters and queues.
    session_records: BTreeMap<SessionId, MSession>,
    /// Set while checking claims that raced each other: they may split the claimable runs, so
    /// each may return fewer than `max` (never a run that is not claimable, never one twice).
    contended_claims: bool,
    /// Worker ids whose [`WorkerLock`](eve_core::WorkerLock) the caller holds (contract clause
    /// 11).
    locked: std::collections::BTreeSet<WorkerId>,
}

/// How a lease relates to a run it writes to.
#[derive(Debug, PartialEq)]
enum Standing {
    /// Owner at the current epoch, lease valid.
    Holder,
    /// Owner at the current epoch, but the lease expired and nobody took over.
    Lapsed,
    /// Not the owner, or the epoch is superseded, or the worker retired.
    Fenced,
}

impl Model {
    /// Runs in creation order.
    pub fn runs(&self) -> &[RunId] {
        &self.order
    }

    /// Every request ever opened, in order.
    pub fn requests(&self) -> &[RequestId] {
        &self.request_order
    }

    /// Requests that are pending now, in the order they were opened.
    pub fn pending_ids(&self) -> Vec<RequestId> {
        self.request_order
            .iter()
            .filter(|id| self.requests[*id].state == ReqState::Pending)
            .cloned()
            .collect()
    }

    /// Pending requests of one run, oldest first.
    pub fn pending_of(&self, run: &RunId) -> Vec<RequestId> {
        self.request_order
            .iter()
            .filter(|id| {
                let r = &self.requests[*id];
                r.state == ReqState::Pending && &r.info.run_id == run
            })
            .cloned()
            .collect()
    }

    /// Tokens of live hooks.
    pub fn live_tokens(&self) -> Vec<String> {
        self.hooks.keys().cloned().collect()
    }

    /// Sessions that have a log.
    pub fn sessions(&self) -> impl Iterator<Item = &SessionId> {
        self.sessions.keys()
    }

    /// The model's record of a run.
    pub fn record(&self, run: &RunId) -> Option<&RunRecord> {
        self.runs.get(run).map(|r| &r.rec)
    }

    /// The model's journal of a run.
    pub fn journal(&self, run: &RunId) -> Option<&[StoredEvent]> {
        self.runs.get(run).map(|r| r.events.as_slice())
    }

    /// The model's session log.
    pub fn session_log(&self, s: &SessionId) -> &[SessionEntry] {
        self.sessions.get(s).map_or(&[], Vec::as_slice)
    }

    /// Live timer cmds of a run.
    pub fn timers(&self, run: &RunId) -> Vec<u64> {
        self.runs
            .get(run)
            .map(|r| r.timers.keys().copied().collect())
            .unwrap_or_default()
    }

    fn held(&self, rec: &RunRecord, now: Timestamp) -> bool {
        rec.owner.as_ref().is_some_and(|(w, e)| {
            self.workers
                .get(w)
                .is_some_and(|mw| !mw.retired && mw.epoch == *e && mw.expires_at > now)
        })
    }

    fn current(&self, lease: &Lease) -> bool {
        self.workers
            .get(&lease.worker)
            .is_some_and(|w| !w.retired && w.epoch == lease.epoch)
    }

    fn standing(&self, lease: &Lease, rec: &RunRecord, now: Timestamp) -> Standing {
        if rec.owner.as_ref() != Some(&(lease.worker.clone(), lease.epoch)) || !self.current(lease)
        {
            Standing::Fenced
        } else if self.held(rec, now) {
            Standing::Holder
        } else {
            Standing::Lapsed
        }
    }

    /// The run's claim key if no valid lease holds it (contract clause 5): when its work is
    /// due, and for an orphaned run (its owner's lease is no longer valid) the earlier of that
    /// and its `updated_at`.
    fn claim_key(&self, run: &MRun, now: Timestamp) -> Option<Timestamp> {
        if run.rec.status != RunStatus::Running || self.held(&run.rec, now) {
            return None;
        }
        let work = Self::work_at(run);
        if run.rec.owner.is_some() {
            Some(work.map_or(run.rec.updated_at, |w| w.min(run.rec.updated_at)))
        } else {
            work
        }
    }

    fn work_at(run: &MRun) -> Option<Timestamp> {
        if run.rec.status != RunStatus::Running {
            return None;
        }
        let pending = run.events.get(run.rec.processed_seq as usize).map(|e| e.at);
        let timer = run.timers.values().min().copied();
        [pending, timer].into_iter().flatten().min()
    }

    /// Hook tokens a batch would register that clash with live ones or each other.
    fn token_clash(&self, events: &[Event]) -> bool {
        let mut seen = Vec::new();
        for e in events {
            if let Event::HookCreated { token, .. } = e {
                if self.hooks.contains_key(token) || seen.contains(&token) {
                    return true;
                }
                seen.push(token);
            }
        }
        false
    }

    /// Writes events at the run's next seq with their effects; returns the first seq.
    fn write(&mut self, run_id: &RunId, events: Vec<Event>, now: Timestamp) -> u64 {
        let run = self.runs.get_mut(run_id).expect("caller checked the run");
        let background = run.rec.execution == Execution::Background;
        let first = run.rec.next_seq;
        let mut session_events = Vec::new();
        let mut opened = Vec::new();
        let mut closed = Vec::new();
        let mut tokens = Vec::new();
        for e in &events {
            match e {
                Event::StepCompleted { cmd, .. } | Event::SleepFired { cmd } => {
                    run.timers.remove(cmd);
                }
                Event::StepFailed { cmd, retry_at, .. } => match retry_at {
                    Some(t) => {
                        run.timers.insert(*cmd, *t);
                    }
                    None => {
                        run.timers.remove(cmd);
                    }
                },
                Event::SleepScheduled { cmd, wake_at } => {
                    run.timers.insert(*cmd, *wake_at);
                }
                Event::HookCreated { cmd, token, .. } => tokens.push((token.clone(), *cmd)),
                Event::InputRequested {
                    cmd,
                    request_id,
                    request,
                } => {
                    opened.push((request_id.clone(), *cmd, request.clone()));
                    session_events.push(match &request.agent {
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
                    closed.push(request_id.clone());
                    session_events.push(match &response.agent {
                        Some(reply) => SessionEvent::AgentCompleted {
                            request_id: request_id.clone(),
                            answered_by: response.answered_by.clone(),
                            error: match reply {
                                eve_core::AgentReply::Error(e) => Some(e.clone()),
                                eve_core::AgentReply::Output(_) => None,
                            },
                        },
                        None => SessionEvent::InputAnswered {
                            request_id: request_id.clone(),
                            answered_by: response.answered_by.clone(),
                        },
                    });
                }
                Event::InputWithdrawn { request_id } => {
                    closed.push(request_id.clone());
                    session_events.push(SessionEvent::InputWithdrawn {
                        request_id: request_id.clone(),
                    });
                }
                Event::Progress { value, .. } => session_events.push(if background {
                    SessionEvent::TaskProgress {
                        value: value.clone(),
                    }
                } else {
                    SessionEvent::ActionPartial {
                        value: value.clone(),
                    }
                }),
                Event::MessagePosted { message, .. } => {
                    session_events.push(SessionEvent::TaskMessage {
                        message: message.clone(),
                    })
                }
                Event::CancelRequested { .. } => run.rec.cancel_requested = true,
                Event::RunCompleted { output } => {
                    run.rec.status = RunStatus::Completed;
                    session_events.push(if background {
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
                    run.rec.status = RunStatus::Failed;
                    session_events.push(if background {
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
                    run.rec.status = RunStatus::Cancelled;
                    session_events.push(if background {
                        SessionEvent::TaskCancelled
                    } else {
                        SessionEvent::ToolSettled {
                            result: ToolResult::Cancelled,
                        }
                    });
                }
                Event::RunTerminated { reason, by } => {
                    run.rec.status = RunStatus::Failed;
                    let error = Event::terminated_error(reason, by);
                    session_events.push(if background {
                        SessionEvent::TaskFailed { error }
                    } else {
                        SessionEvent::ToolSettled {
                            result: ToolResult::Failed { error },
                        }
                    });
                }
                Event::RunDenied { reason } => {
                    run.rec.status = RunStatus::Failed;
                    session_events.push(if background {
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
                Event::RunBlocked { .. } => run.rec.status = RunStatus::Blocked,
                Event::RunResumed => run.rec.status = RunStatus::Running,
                Event::AttributesSet { attributes, .. } => {
                    if let Some(p) = attributes
                        .to_value::<serde_json::Value>()
                        .ok()
                        .and_then(|v| eve_core::search::parse_patch(&v).ok())
                    {
                        eve_core::search::apply_patch(&mut run.rec.attributes, &p);
                    }
                }
                _ => {}
            }
        }
        for (i, event) in events.into_iter().enumerate() {
            run.events.push(StoredEvent {
                seq: first + i as u64,
                at: now,
                event,
            });
        }
        run.rec.next_seq = run.events.len() as u64;
        run.rec.updated_at = now;
        let ended = run.rec.status.is_terminal();
        if ended {
            run.timers.clear();
            run.rec.owner = None;
        }
        let (session, call) = (run.rec.session_id.clone(), run.rec.call_id.clone());
        for (token, cmd) in tokens {
            self.hooks.insert(token, (run_id.clone(), cmd));
        }
        for (request_id, cmd, request) in opened {
            self.request_order.push(request_id.clone());
            self.requests.insert(
                request_id.clone(),
                MReq {
                    info: PendingRequest {
                        request_id,
                        run_id: run_id.clone(),
                        session_id: session.clone(),
                        cmd,
                        request,
                        requested_at: now,
                    },
                    state: ReqState::Pending,
                },
            );
        }
        for id in closed {
            if let Some(r) = self.requests.get_mut(&id) {
                if r.state == ReqState::Pending {
                    r.state = ReqState::Withdrawn;
                }
            }
        }
        if ended {
            self.hooks.retain(|_, (r, _)| r != run_id);
            for r in self.requests.values_mut() {
                if &r.info.run_id == run_id && r.state == ReqState::Pending {
                    r.state = ReqState::Withdrawn;
                }
            }
        }
        let log = self.sessions.entry(session.clone()).or_default();
        let next = self.session_next.entry(session.clone()).or_default();
        for event in session_events {
            let seq = *next;
            *next += 1;
            log.push(SessionEntry {
                session_id: session.clone(),
                seq,
                at: now,
                run_id: run_id.clone(),
                call_id: call.clone(),
                event,
            });
        }
        first
    }

    fn same_record(what: &str, actual: &RunRecord, expected: &RunRecord) -> Check {
        if comparable(actual) == comparable(expected) {
            Ok(())
        } else {
            Err(format!(
                "{what}: record differs (updated_at ignored)\n  store: {actual:?}\n  model: {expected:?}"
            ))
        }
    }

    /// `create_run(new, now)`.
    pub fn check_create(
        &mut self,
        new: &NewRun,
        now: Timestamp,
        actual: &Result<CreatedRun, StoreError>,
    ) -> Check {
        let key = new.key();
        if let Some(existing) = self.keys.get(&key).cloned() {
            let run = &self.runs[&existing];
            let same = match &run.started {
                Event::RunStarted {
                    workflow_id,
                    tool,
                    input,
                    execution,
                    ..
                } => {
                    workflow_id == &new.workflow_id
                        && tool == &new.tool
                        && input == &new.input
                        && execution == &new.execution
                }
                _ => false,
            };
            if !same {
                return match actual {
                    Err(StoreError::IdempotencyMismatch { existing: e, .. }) if e == &existing => {
                        Ok(())
                    }
                    other => Err(format!(
                        "create_run with key {key:?} (run {existing}) and another input: expected IdempotencyMismatch naming {existing}, got {other:?}"
                    )),
                };
            }
            return match actual {
                Ok(c) if !c.created => {
                    Self::same_record("create_run with a repeated key", &c.run, &run.rec)
                }
                other => Err(format!(
                    "create_run with repeated key {key:?}: expected the existing run {existing} with created=false, got {other:?}"
                )),
            };
        }
        let ended = self
            .session_records
            .get(&new.session_id)
            .is_some_and(|s| s.ended_at.is_some());
        if self.runs.contains_key(&new.run_id) {
            // Both refusals apply: either may win.
            let allowed: &[&str] = if ended {
                &["AlreadyExists", "SessionEnded"]
            } else {
                &["AlreadyExists"]
            };
            return expect_err("create_run with a taken run id", actual, allowed);
        }
        if ended {
            return expect_err(
                "create_run of a new run in an ended session",
                actual,
                &["SessionEnded"],
            );
        }
        let rec = RunRecord {
            run_id: new.run_id.clone(),
            idempotency_key: key.clone(),
            workflow_id: new.workflow_id.clone(),
            deployment_id: new.deployment_id.clone(),
            tool: new.tool.clone(),
            session_id: new.session_id.clone(),
            call_id: new.call_id.clone(),
            execution: new.execution,
            status: RunStatus::Running,
            next_seq: 1,
            processed_seq: 0,
            cancel_requested: false,
            activations: 0,
            owner: None,
            created_at: now,
            updated_at: now,
            attributes: Default::default(),
        };
        match actual {
            Ok(c) if c.created => Self::same_record("create_run", &c.run, &rec)?,
            other => {
                return Err(format!(
                    "create_run of a new key: expected a new run, got {other:?}"
                ))
            }
        }
        let started = new.started_event();
        self.runs.insert(
            new.run_id.clone(),
            MRun {
                rec,
                started: started.clone(),
                events: vec![StoredEvent {
                    seq: 0,
                    at: now,
                    event: started,
                }],
                landed: BTreeMap::new(),
                timers: BTreeMap::new(),
            },
        );
        self.order.push(new.run_id.clone());
        self.keys.insert(key, new.run_id.clone());
        Ok(())
    }

    /// `end_session(session, now)`: the first end's time, and the session's runs that have not
    /// ended (compared as a set: the contract orders them oldest first, and stores order ties
    /// of creation time differently).
    pub fn check_end_session(
        &mut self,
        session: &SessionId,
        now: Timestamp,
        actual: &Result<SessionEnd, StoreError>,
    ) -> Check {
        let rec = self.session_records.entry(session.clone()).or_default();
        let ended_at = *rec.ended_at.get_or_insert(now);
        let mut live: Vec<RunId> = self
            .order
            .iter()
            .filter(|id| {
                let r = &self.runs[*id].rec;
                &r.session_id == session && !r.status.is_terminal()
            })
            .cloned()
            .collect();
        live.sort();
        match actual {
            Ok(end) => {
                let mut got = end.live.clone();
                got.sort();
                if end.ended_at != ended_at || got != live {
                    return Err(format!(
                        "end_session({session}): expected ended_at {ended_at:?} and live runs {live:?}, got {end:?}"
                    ));
                }
                Ok(())
            }
            Err(e) => Err(format!("end_session({session}) failed: {e}")),
        }
    }

    /// `queue_message(session, message, now)`.
    pub fn check_queue(
        &mut self,
        session: &SessionId,
        message: &Payload,
        now: Timestamp,
        actual: &Result<QueuedMessage, StoreError>,
    ) -> Check {
        let rec = self.session_records.entry(session.clone()).or_default();
        if rec.ended_at.is_some() {
            return expect_err(
                "queue_message in an ended session",
                actual,
                &["SessionEnded"],
            );
        }
        let expected = QueuedMessage {
            session_id: session.clone(),
            seq: rec.next_message,
            at: now,
            message: message.clone(),
        };
        match actual {
            Ok(q) if q == &expected => {
                rec.next_message += 1;
                rec.queued.push(expected);
                Ok(())
            }
            other => Err(format!(
                "queue_message({session}): expected {expected:?}, got {other:?}"
            )),
        }
    }

    /// `take_messages(session)`: the whole queue, oldest first, once.
    pub fn check_take(
        &mut self,
        session: &SessionId,
        actual: &Result<Vec<QueuedMessage>, StoreError>,
    ) -> Check {
        let queued = self
            .session_records
            .get_mut(session)
            .map(|r| std::mem::take(&mut r.queued))
            .unwrap_or_default();
        match actual {
            Ok(got) if got == &queued => Ok(()),
            other => Err(format!(
                "take_messages({session}): expected {queued:?}, got {other:?}"
            )),
        }
    }

    /// `get_session(session)`.
    pub fn check_get_session(
        &self,
        session: &SessionId,
        actual: &Result<SessionRecord, StoreError>,
    ) -> Check {
        let rec = self.session_records.get(session);
        let expected = SessionRecord {
            session_id: session.clone(),
            ended_at: rec.and_then(|r| r.ended_at),
            queued: rec.map(|r| r.queued.clone()).unwrap_or_default(),
        };
        match actual {
            Ok(got) if got == &expected => Ok(()),
            other => Err(format!(
                "get_session({session}): expected {expected:?}, got {other:?}"
            )),
        }
    }

    /// `append(a)`; `a` fields passed apart so the caller keeps the append for retries.
    #[allow(clippy::too_many_arguments)]
    pub fn check_append(
        &mut self,
        run_id: &RunId,
        expected_seq: u64,
        lease: &Lease,
        append_id: &AppendId,
        events: &[Event],
        now: Timestamp,
        actual: &Result<eve_core::Appended, StoreError>,
    ) -> Check {
        if let Some(bad) = events.iter().find(|e| !valid_attributes(e)) {
            // Refused whole, whatever else applies (which error wins is the store's choice).
            let mut allowed = vec!["InvalidInput"];
            match self.runs.get(run_id) {
                None => allowed.push("NotFound"),
                Some(run) => {
                    if run.rec.status.is_terminal() {
                        allowed.push("RunEnded");
                    }
                    if self.standing(lease, &run.rec, now) != Standing::Holder {
                        allowed.push("Fenced");
                    }
                    if run.rec.next_seq != expected_seq {
                        allowed.push("Conflict");
                    }
                    if self.token_clash(events) {
                        allowed.push("AlreadyExists");
                    }
                }
            }
            return expect_err(
                &format!("an append carrying the invalid attribute patch {bad:?}"),
                actual,
                &allowed,
            );
        }
        let Some(run) = self.runs.get(run_id) else {
            return expect_err("append to an unknown run", actual, &["NotFound"]);
        };
        if let Some((first, next)) = run.landed.get(append_id).copied() {
            return match actual {
                Ok(a) if a.duplicate && (a.first_seq, a.next_seq) == (first, next) => Ok(()),
                other => Err(format!(
                    "retry of landed append {append_id}: expected duplicate success at {first}..{next}, got {other:?}"
                )),
            };
        }
        let mut allowed = Vec::new();
        if run.rec.status.is_terminal() {
            allowed.push("RunEnded");
        }
        let standing = self.standing(lease, &run.rec, now);
        if standing != Standing::Holder {
            allowed.push("Fenced");
        }
        if run.rec.next_seq != expected_seq {
            allowed.push("Conflict");
        }
        if self.token_clash(events) {
            allowed.push("AlreadyExists");
        }
        let must_fail = allowed.iter().any(|k| *k != "Fenced") || standing == Standing::Fenced;
        match actual {
            Err(StoreError::Conflict {
                expected, actual: a, ..
            }) if allowed.contains(&"Conflict") => {
                if (*expected, *a) != (expected_seq, run.rec.next_seq) {
                    return Err(format!(
                        "append conflict must say expected {expected_seq}, actual {}, said {expected}, {a}",
                        run.rec.next_seq
                    ));
                }
                Ok(())
            }
            Err(e) if allowed.contains(&kind(e)) && kind(e) != "Conflict" => Ok(()),
            Ok(a) if !must_fail => {
                let first = run.rec.next_seq;
                let n = events.len() as u64;
                if (a.first_seq, a.next_seq, a.duplicate) != (first, first + n, false) {
                    return Err(format!(
                        "append: expected first_seq {first}, next_seq {}, not duplicate; got {a:?}",
                        first + n
                    ));
                }
                self.write(run_id, events.to_vec(), now);
                let run = self.runs.get_mut(run_id).expect("checked");
                run.rec.processed_seq = run.rec.next_seq;
                run.rec.activations = 0;
                run.landed
                    .insert(append_id.clone(), (first, run.rec.next_seq));
                Ok(())
            }
            other => Err(format!(
                "append to {run_id} at {expected_seq} by {}@{} ({standing:?}, journal at {}): allowed errors {allowed:?}{}, got {other:?}",
                lease.worker,
                lease.epoch,
                run.rec.next_seq,
                if must_fail { "" } else { " or success" }
            )),
        }
    }

    /// `answer(request, response, now)`.
    pub fn check_answer(
        &mut self,
        request: &RequestId,
        response: &InputResponse,
        now: Timestamp,
        actual: &Result<Delivered, StoreError>,
    ) -> Check {
        let Some(r) = self.requests.get(request).cloned() else {
            return expect_err("answer to an unknown request", actual, &["NotFound"]);
        };
        let valid = r.info.request.accepts(response).is_ok();
        match &r.state {
            ReqState::Answered(prev, seq) if prev.same_answer(response) => match actual {
                Ok(d) if d.duplicate && d.seq == *seq && d.run == r.info.run_id => Ok(()),
                other => Err(format!(
                    "the same answer again: expected a duplicate success at seq {seq}, got {other:?}"
                )),
            },
            ReqState::Answered(..) => {
                let allowed: &[&str] = if valid {
                    &["AlreadyAnswered"]
                } else {
                    &["AlreadyAnswered", "InvalidAnswer"]
                };
                expect_err("a different answer to an answered request", actual, allowed)
            }
            ReqState::Withdrawn => {
                let allowed: &[&str] = if valid {
                    &["Withdrawn"]
                } else {
                    &["Withdrawn", "InvalidAnswer"]
                };
                expect_err("an answer to a withdrawn request", actual, allowed)
            }
            ReqState::Pending if !valid => {
                expect_err("an answer the request does not accept", actual, &["InvalidAnswer"])
            }
            ReqState::Pending => {
                let seq = self.runs[&r.info.run_id].rec.next_seq;
                match actual {
                    Ok(d) if !d.duplicate && d.seq == seq && d.run == r.info.run_id => {}
                    other => {
                        return Err(format!(
                            "answer to pending request {request}: expected a new event at seq {seq}, got {other:?}"
                        ))
                    }
                }
                self.write(
                    &r.info.run_id,
                    vec![Event::InputAnswered {
                        request_id: request.clone(),
                        response: response.clone(),
                    }],
                    now,
                );
                self.requests.get_mut(request).expect("known").state =
                    ReqState::Answered(response.clone(), seq);
                Ok(())
            }
        }
    }

    /// `deliver_hook(token, payload, dedupe_key, now)`.
    pub fn check_deliver(
        &mut self,
        token: &str,
        payload: &Payload,
        dedupe_key: Option<&str>,
        now: Timestamp,
        actual: &Result<Delivered, StoreError>,
    ) -> Check {
        let Some((run_id, cmd)) = self.hooks.get(token).cloned() else {
            let retained = dedupe_key
                .and_then(|k| self.delivered.get(&(token.to_owned(), k.to_owned())))
                .filter(|d| !d.is_empty());
            return match (retained, actual) {
                (None, _) => expect_err(
                    "a delivery to a token with no live hook",
                    actual,
                    &["NotFound"],
                ),
                (Some(d), Ok(got))
                    if got.duplicate
                        && d.iter().any(|(r, seq)| &got.run == r && got.seq == *seq) =>
                {
                    Ok(())
                }
                (Some(d), other) => Err(format!(
                    "a keyed delivery {dedupe_key:?} to {token:?} after its run ended: expected a \
                     duplicate success naming one of {d:?}, got {other:?}"
                )),
            };
        };
        let key = dedupe_key.map(|k| (run_id.clone(), cmd, k.to_owned()));
        if let Some(seq) = key.as_ref().and_then(|k| self.dedupe.get(k)).copied() {
            return match actual {
                Ok(d) if d.duplicate && d.seq == seq && d.run == run_id => Ok(()),
                other => Err(format!(
                    "a repeated dedupe key {dedupe_key:?}: expected a duplicate success at seq {seq}, got {other:?}"
                )),
            };
        }
        let seq = self.runs[&run_id].rec.next_seq;
        match actual {
            Ok(d) if !d.duplicate && d.seq == seq && d.run == run_id => {}
            other => {
                return Err(format!(
                    "delivery to hook {token:?} of {run_id}: expected a new event at seq {seq}, got {other:?}"
                ))
            }
        }
        self.write(
            &run_id,
            vec![Event::HookReceived {
                cmd,
                payload: payload.clone(),
            }],
            now,
        );
        if let Some(k) = key {
            self.delivered
                .entry((token.to_owned(), k.2.clone()))
                .or_default()
                .push((run_id, seq));
            self.dedupe.insert(k, seq);
        }
        Ok(())
    }

    /// `request_cancel(run, reason, now)`.
    pub fn check_cancel(
        &mut self,
        run_id: &RunId,
        reason: &str,
        now: Timestamp,
        actual: &Result<CancelOutcome, StoreError>,
    ) -> Check {
        let Some(run) = self.runs.get(run_id) else {
            return expect_err("cancel of an unknown run", actual, &["NotFound"]);
        };
        let expected = if run.rec.status.is_terminal() {
            CancelOutcome::AlreadyEnded {
                status: run.rec.status,
            }
        } else if run.rec.cancel_requested {
            CancelOutcome::AlreadyRequested
        } else {
            CancelOutcome::Requested {
                seq: run.rec.next_seq,
            }
        };
        match actual {
            Ok(o) if o == &expected => {}
            other => {
                return Err(format!(
                    "request_cancel({run_id}): expected {expected:?}, got {other:?}"
                ))
            }
        }
        if matches!(expected, CancelOutcome::Requested { .. }) {
            // One append: the request, the withdrawal of every pending request and, on a
            // blocked run (which no worker will claim to act on it), the end.
            let blocked = run.rec.status == RunStatus::Blocked;
            let mut events = vec![Event::CancelRequested {
                reason: reason.to_owned(),
            }];
            events.extend(self.withdrawals(run_id));
            if blocked {
                events.push(Event::RunCancelled);
            }
            self.write(run_id, events, now);
        }
        Ok(())
    }

    /// `InputWithdrawn` for every pending request of a run, ordered by cmd.
    fn withdrawals(&self, run_id: &RunId) -> Vec<Event> {
        let mut pending: Vec<&MReq> = self
            .requests
            .values()
            .filter(|r| &r.info.run_id == run_id && r.state == ReqState::Pending)
            .collect();
        pending.sort_by_key(|r| r.info.cmd);
        pending
            .iter()
            .map(|r| Event::InputWithdrawn {
                request_id: r.info.request_id.clone(),
            })
            .collect()
    }

    /// `resolve_blocked(run, resolution, now)`.
    pub fn check_resolve(
        &mut self,
        run_id: &RunId,
        resolution: &Resolution,
        now: Timestamp,
        actual: &Result<u64, StoreError>,
    ) -> Check {
        let Some(run) = self.runs.get(run_id) else {
            return expect_err("resolve_blocked of an unknown run", actual, &["NotFound"]);
        };
        let terminate = matches!(resolution, Resolution::Terminate { .. });
        if terminate && run.rec.status.is_terminal() {
            return expect_err("terminate of an ended run", actual, &["RunEnded"]);
        }
        if !terminate && run.rec.status != RunStatus::Blocked {
            return expect_err(
                "resolve_blocked of a run that is not blocked",
                actual,
                &["InvalidInput"],
            );
        }
        let seq = run.rec.next_seq;
        match actual {
            Ok(s) if *s == seq => {}
            other => {
                return Err(format!(
                    "resolve_blocked({run_id}, {resolution:?}): expected Ok({seq}), got {other:?}"
                ))
            }
        }
        let events = match resolution {
            Resolution::Resume => vec![Event::RunResumed],
            Resolution::Fail { error } => {
                let mut ev = self.withdrawals(run_id);
                ev.push(Event::RunFailed {
                    error: error.clone(),
                });
                ev
            }
            Resolution::Terminate { reason, by } => {
                let mut ev = self.withdrawals(run_id);
                ev.push(Event::RunTerminated {
                    reason: reason.clone(),
                    by: by.clone(),
                });
                ev
            }
        };
        self.write(run_id, events, now);
        Ok(())
    }

    /// `register_worker(worker, deployment, ttl, now)`; the store picks the epoch, which must
    /// be newer than every earlier one of this worker id.
    pub fn check_register(
        &mut self,
        worker: &WorkerId,
        deployment: &DeploymentId,
        ttl: Duration,
        now: Timestamp,
        actual: &Result<Lease, StoreError>,
    ) -> Check {
        let lease = match actual {
            Ok(l) => l,
            Err(e) => return Err(format!("register_worker({worker}) failed: {e:?}")),
        };
        let prev = self.workers.get(worker).map(|w| w.epoch);
        if prev.is_some_and(|p| lease.epoch <= p) {
            return Err(format!(
                "re-registering {worker} must give an epoch above {prev:?}, got {}",
                lease.epoch
            ));
        }
        if (&lease.worker, &lease.deployment, lease.expires_at)
            != (worker, deployment, now.plus(ttl))
        {
            return Err(format!(
                "register_worker({worker}, {deployment}) at {now} for {ttl:?}: got {lease:?}"
            ));
        }
        self.workers.insert(
            worker.clone(),
            MWorker {
                epoch: lease.epoch,
                deployment: deployment.clone(),
                expires_at: lease.expires_at,
                retired: false,
            },
        );
        Ok(())
    }

    /// `heartbeat(lease, ttl, now)`.
    pub fn check_heartbeat(
        &mut self,
        lease: &Lease,
        ttl: Duration,
        now: Timestamp,
        actual: &Result<Lease, StoreError>,
    ) -> Check {
        let Some(w) = self.workers.get(&lease.worker).cloned() else {
            return expect_err("heartbeat of an unknown worker", actual, &["NotFound"]);
        };
        if w.retired {
            return expect_err(
                "heartbeat of a retired worker",
                actual,
                &["Fenced", "NotFound"],
            );
        }
        if w.epoch != lease.epoch {
            return expect_err("heartbeat under a superseded epoch", actual, &["Fenced"]);
        }
        let expired = w.expires_at <= now;
        let expected = Lease {
            worker: lease.worker.clone(),
            deployment: w.deployment.clone(),
            epoch: w.epoch,
            expires_at: now.plus(ttl),
        };
        match actual {
            Ok(l) if l == &expected => {
                self.workers
                    .get_mut(&lease.worker)
                    .expect("known")
                    .expires_at = l.expires_at;
                Ok(())
            }
            Err(StoreError::Fenced { .. }) if expired => Ok(()),
            other => Err(format!("heartbeat: expected {expected:?}, got {other:?}")),
        }
    }

    /// Lets claims come up short of `max` while set: for checking two claims that raced.
    pub fn set_contended_claims(&mut self, on: bool) {
        self.contended_claims = on;
    }

    /// `claim(lease, max, now)`: the store may pick any of the equally early runs.
    pub fn check_claim(
        &mut self,
        lease: &Lease,
        max: usize,
        now: Timestamp,
        actual: &Result<Vec<RunRecord>, StoreError>,
    ) -> Check {
        let valid = self
            .workers
            .get(&lease.worker)
            .is_some_and(|w| !w.retired && w.epoch == lease.epoch && w.expires_at > now);
        if !valid {
            return expect_err(
                "claim under an expired, superseded or unknown lease",
                actual,
                &["Fenced"],
            );
        }
        let claimed = match actual {
            Ok(c) => c,
            Err(e) => return Err(format!("claim by {}@{}: {e:?}", lease.worker, lease.epoch)),
        };
        let mut ready: BTreeMap<RunId, Timestamp> = BTreeMap::new();
        for (id, run) in &self.runs {
            if run.rec.deployment_id == lease.deployment {
                if let Some(t) = self.claim_key(run, now).filter(|t| *t <= now) {
                    ready.insert(id.clone(), t);
                }
            }
        }
        let want = max.min(ready.len());
        let ids: Vec<&RunId> = claimed.iter().map(|r| &r.run_id).collect();
        let short_by_contention = self.contended_claims && ids.len() < want;
        if ids.len() != want && !short_by_contention {
            return Err(format!(
                "claim(max {max}) at {now}: {} runs are claimable ({:?}), store claimed {ids:?}",
                ready.len(),
                ready
            ));
        }
        let mut latest_taken = None;
        for (i, id) in ids.iter().enumerate() {
            if ids[..i].contains(id) {
                return Err(format!("claim returned {id} twice"));
            }
            let Some(t) = ready.get(*id) else {
                return Err(format!(
                    "claim returned {id}, which is not claimable at {now}; claimable: {ready:?}"
                ));
            };
            latest_taken = latest_taken.max(Some(*t));
        }
        if let Some(latest) = latest_taken {
            if let Some((skipped, t)) = ready
                .iter()
                .find(|(id, t)| !ids.contains(id) && **t < latest)
            {
                return Err(format!(
                    "claim must take earliest work first: left {skipped} (work at {t}) for a run with work at {latest}"
                ));
            }
        }
        for r in claimed {
            let run = self.runs.get_mut(&r.run_id).expect("checked");
            run.rec.owner = Some((lease.worker.clone(), lease.epoch));
            run.rec.activations += 1;
            run.rec.updated_at = now;
            Self::same_record("claimed run", r, &run.rec)?;
        }
        Ok(())
    }

    /// `release(lease, run, processed_seq, now)`.
    pub fn check_release(
        &mut self,
        lease: &Lease,
        run_id: &RunId,
        processed_seq: u64,
        now: Timestamp,
        actual: &Result<(), StoreError>,
    ) -> Check {
        let Some(run) = self.runs.get(run_id) else {
            return expect_err("release of an unknown run", actual, &["NotFound", "Fenced"]);
        };
        let standing = self.standing(lease, &run.rec, now);
        match (standing, actual) {
            (Standing::Fenced, a) => expect_err("release by a non-owner", a, &["Fenced"]),
            (Standing::Lapsed, Err(StoreError::Fenced { .. })) => Ok(()),
            (_, Ok(())) => {
                let run = self.runs.get_mut(run_id).expect("checked");
                run.rec.owner = None;
                run.rec.processed_seq = run
                    .rec
                    .processed_seq
                    .max(processed_seq.min(run.rec.next_seq));
                run.rec.updated_at = now;
                Ok(())
            }
            (s, other) => Err(format!(
                "release by the owner ({s:?}): expected Ok, got {other:?}"
            )),
        }
    }

    /// `retire_worker(lease, now)`.
    pub fn check_retire(
        &mut self,
        lease: &Lease,
        now: Timestamp,
        actual: &Result<(), StoreError>,
    ) -> Check {
        if !self.current(lease) {
            return expect_err(
                "retire under a superseded or unknown lease",
                actual,
                &["Fenced"],
            );
        }
        let expired = self.workers[&lease.worker].expires_at <= now;
        match actual {
            Ok(()) => {}
            Err(StoreError::Fenced { .. }) if expired => return Ok(()),
            other => return Err(format!("retire_worker: expected Ok, got {other:?}")),
        }
        // The runs it still holds keep naming it: orphaned, they are claimable at once.
        self.workers
            .get_mut(&lease.worker)
            .expect("current")
            .retired = true;
        Ok(())
    }

    /// `read(run, from_seq, max)`.
    pub fn check_read(
        &self,
        run_id: &RunId,
        from_seq: u64,
        max: usize,
        actual: &Result<Vec<StoredEvent>, StoreError>,
    ) -> Check {
        let run = self.runs.get(run_id);
        if max == 0 {
            let allowed: &[&str] = if run.is_some() {
                &["InvalidInput"]
            } else {
                &["InvalidInput", "NotFound"]
            };
            return expect_err("read with max = 0", actual, allowed);
        }
        let Some(run) = run else {
            return expect_err("read of an unknown run", actual, &["NotFound"]);
        };
        let len = run.events.len() as u64;
        if from_seq > len {
            return expect_err("read past the end", actual, &["InvalidInput"]);
        }
        let start = from_seq as usize;
        let want = &run.events[start..(start + max).min(run.events.len())];
        match actual {
            // A backend may return a short page, but never a wrong one.
            Ok(page)
                if !page.is_empty()
                    && page.len() <= want.len()
                    && page[..] == want[..page.len()] =>
            {
                Ok(())
            }
            Ok(page) if page.is_empty() && want.is_empty() => Ok(()),
            other => Err(format!(
                "read({run_id}, {from_seq}, {max}): expected {want:?}, got {other:?}"
            )),
        }
    }

    /// `get_run(run)`.
    pub fn check_get(&self, run_id: &RunId, actual: &Result<RunRecord, StoreError>) -> Check {
        match (self.runs.get(run_id), actual) {
            (None, a) => expect_err("get_run of an unknown run", a, &["NotFound"]),
            (Some(run), Ok(r)) => Self::same_record("get_run", r, &run.rec),
            (Some(_), Err(e)) => Err(format!("get_run({run_id}) failed: {e:?}")),
        }
    }

    /// `list_runs(query)`: creation order, then run id.
    pub fn check_list(
        &self,
        query: &RunQuery,
        actual: &Result<Vec<RunRecord>, StoreError>,
    ) -> Check {
        let mut want: Vec<&RunRecord> = self
            .order
            .iter()
            .map(|id| &self.runs[id].rec)
            .filter(|r| query.matches(r))
            .collect();
        want.sort_by(|a, b| (a.created_at, &a.run_id).cmp(&(b.created_at, &b.run_id)));
        if query.limit > 0 {
            want.truncate(query.limit);
        }
        let want: Vec<RunRecord> = want.into_iter().map(comparable).collect();
        match actual {
            Ok(got) if got.iter().map(comparable).collect::<Vec<_>>() == want => Ok(()),
            other => Err(format!(
                "list_runs({query:?}): expected {want:?}, got {other:?}"
            )),
        }
    }

    /// `pending_requests(session)`: oldest first (ties in any order).
    pub fn check_pending(
        &self,
        session: &SessionId,
        actual: &Result<Vec<PendingRequest>, StoreError>,
    ) -> Check {
        let mut want: Vec<PendingRequest> = self
            .requests
            .values()
            .filter(|r| &r.info.session_id == session && r.state == ReqState::Pending)
            .map(|r| r.info.clone())
            .collect();
        let key = |p: &PendingRequest| (p.requested_at, p.request_id.clone());
        want.sort_by_key(key);
        let got = match actual {
            Ok(g) => g,
            Err(e) => return Err(format!("pending_requests({session}) failed: {e:?}")),
        };
        if got
            .windows(2)
            .any(|w| w[0].requested_at > w[1].requested_at)
        {
            return Err(format!("pending_requests must be oldest first: {got:?}"));
        }
        let mut sorted = got.clone();
        sorted.sort_by_key(key);
        if sorted != want {
            return Err(format!(
                "pending_requests({session}): expected {want:?}, got {got:?}"
            ));
        }
        Ok(())
    }

    /// `read_session(session, from_seq, max)`.
    pub fn check_read_session(
        &self,
        session: &SessionId,
        from_seq: u64,
        max: usize,
        actual: &Result<Vec<SessionEntry>, StoreError>,
    ) -> Check {
        if max == 0 {
            return expect_err("read_session with max = 0", actual, &["InvalidInput"]);
        }
        let log = self.session_log(session);
        let want: Vec<SessionEntry> = log
            .iter()
            .filter(|e| e.seq >= from_seq)
            .take(max)
            .cloned()
            .collect();
        match actual {
            Ok(got) if got == &want => Ok(()),
            other => Err(format!(
                "read_session({session}, {from_seq}, {max}): expected {want:?}, got {other:?}"
            )),
        }
    }

    /// `purge(ended_before, 0)`: every run that ended before the cutoff goes, with its
    /// requests, session-log entries, idempotency key and delivery records.
    pub fn check_purge(
        &mut self,
        ended_before: Timestamp,
        actual: &Result<usize, StoreError>,
    ) -> Check {
        let doomed: Vec<RunId> = self
            .order
            .iter()
            .filter(|id| {
                let r = &self.runs[*id].rec;
                r.status.is_terminal() && r.updated_at < ended_before
            })
            .cloned()
            .collect();
        match actual {
            Ok(n) if *n == doomed.len() => {}
            other => {
                return Err(format!(
                "purge before {ended_before}: expected {} runs purged ({doomed:?}), got {other:?}",
                doomed.len()
            ))
            }
        }
        let gone: std::collections::BTreeSet<RunId> = doomed.into_iter().collect();
        self.runs.retain(|id, _| !gone.contains(id));
        self.order.retain(|id| !gone.contains(id));
        self.keys.retain(|_, id| !gone.contains(id));
        self.hooks.retain(|_, (id, _)| !gone.contains(id));
        self.dedupe.retain(|(id, _, _), _| !gone.contains(id));
        for d in self.delivered.values_mut() {
            d.retain(|(id, _)| !gone.contains(id));
        }
        let requests = &mut self.requests;
        requests.retain(|_, r| !gone.contains(&r.info.run_id));
        self.request_order.retain(|id| requests.contains_key(id));
        for log in self.sessions.values_mut() {
            log.retain(|e| !gone.contains(&e.run_id));
        }
        Ok(())
    }

    /// `next_wake(deployment, now)`.
    pub fn check_next_wake(
        &self,
        deployment: &DeploymentId,
        now: Timestamp,
        actual: &Result<Option<Timestamp>, StoreError>,
    ) -> Check {
        let want = self
            .runs
            .values()
            .filter(|r| &r.rec.deployment_id == deployment)
            .filter_map(|r| self.claim_key(r, now))
            .min();
        match actual {
            Ok(t) if *t == want => Ok(()),
            other => Err(format!(
                "next_wake({deployment}) at {now}: expected {want:?}, got {other:?}"
            )),
        }
    }

    /// The request an `InputRequested` of this model opened, for building answers.
    pub fn request(&self, id: &RequestId) -> Option<&InputRequest> {
        self.requests.get(id).map(|r| &r.info.request)
    }

    /// Requests that were answered, in the order they were opened, with the answer recorded.
    pub fn answered(&self) -> Vec<(RequestId, InputResponse)> {
        self.request_order
            .iter()
            .filter_map(|id| match &self.requests[id].state {
                ReqState::Answered(response, _) => Some((id.clone(), response.clone())),
                _ => None,
            })
            .collect()
    }

    /// `terminate(run, reason, by, now)` ([`JournalStoreExt::terminate`](eve_core::JournalStoreExt::terminate)):
    /// on a live run, the withdrawal of its pending requests and `RunTerminated` in one write;
    /// on an ended one `NotLive` with its status, nothing written.
    pub fn check_terminate(
        &mut self,
        run_id: &RunId,
        reason: &str,
        by: &str,
        now: Timestamp,
        actual: &Result<TerminateOutcome, StoreError>,
    ) -> Check {
        let Some(run) = self.runs.get(run_id) else {
            return expect_err("terminate of an unknown run", actual, &["NotFound"]);
        };
        let expected = if run.rec.status.is_terminal() {
            TerminateOutcome::NotLive {
                status: run.rec.status,
            }
        } else {
            TerminateOutcome::Terminated {
                seq: run.rec.next_seq,
            }
        };
        match actual {
            Ok(o) if o == &expected => {}
            other => {
                return Err(format!(
                    "terminate({run_id}): expected {expected:?}, got {other:?}"
                ))
            }
        }
        if matches!(expected, TerminateOutcome::Terminated { .. }) {
            let mut events = self.withdrawals(run_id);
            events.push(Event::RunTerminated {
                reason: reason.to_owned(),
                by: by.to_owned(),
            });
            self.write(run_id, events, now);
        }
        Ok(())
    }

    /// Whether the caller holds the lock of `worker` (see [`check_lock`](Self::check_lock)).
    pub fn is_locked(&self, worker: &WorkerId) -> bool {
        self.locked.contains(worker)
    }

    /// `lock_worker(worker)` (contract clause 11): a lock while no lock of the caller holds the
    /// id, else `WorkerIdInUse` naming the holder (this process: its pid).
    pub fn check_lock<T: std::fmt::Debug>(
        &mut self,
        worker: &WorkerId,
        actual: &Result<T, StoreError>,
    ) -> Check {
        if self.locked.contains(worker) {
            return match actual {
                Err(StoreError::WorkerIdInUse { worker: w, holder })
                    if w == worker.as_str()
                        && holder.contains(&format!("pid {}", std::process::id())) =>
                {
                    Ok(())
                }
                other => Err(format!(
                    "lock_worker({worker}) while this process holds it: expected WorkerIdInUse naming pid {}, got {other:?}",
                    std::process::id()
                )),
            };
        }
        match actual {
            Ok(_) => {
                self.locked.insert(worker.clone());
                Ok(())
            }
            other => Err(format!(
                "lock_worker({worker}) of a free id: expected a lock, got {other:?}"
            )),
        }
    }

    /// The caller dropped its lock of `worker`: the id is free again.
    pub fn unlock(&mut self, worker: &WorkerId) {
        self.locked.remove(worker);
    }

    /// Whether a reset of `old` to `to` (a retry when `None`) would copy a hook token that is
    /// live now: the reset then ends its new run failed with the store's error text, which the
    /// model cannot predict, so the sequences do not make such resets (the directed case
    /// `resets::reset_copies_prefix_idempotently` does).
    pub fn reset_clashes(&self, old: &RunId, to: Option<u64>) -> bool {
        let Some(run) = self.runs.get(old) else {
            return false;
        };
        let limit = cut_limit(&run.events);
        let Some(to) = to.or_else(|| retry_cut(&run.events, limit)) else {
            return false;
        };
        if to < 1 || to > limit {
            return false;
        }
        let probe = RunId::new("probe");
        reset_copy(old, &probe, &run.events, to).iter().any(
            |e| matches!(e, Event::HookCreated { token, .. } if self.hooks.contains_key(token)),
        )
    }

    /// Where a reset of `run` may cut at most: the first event of its end, cancel or
    /// withdrawals (`None` for an unknown run).
    pub fn reset_limit(&self, run: &RunId) -> Option<u64> {
        self.runs.get(run).map(|r| cut_limit(&r.events))
    }

    /// `reset(old, to, deployment, now)`, or `retry(old, deployment, now)` when `to` is `None`
    /// ([`JournalStoreExt`](eve_core::JournalStoreExt)): a new run (its id is the store's
    /// choice, learnt from the outcome) created claimed by the operator worker
    /// `reset:{new run}`, which then retires, whose journal is `RunStarted` (naming the old run
    /// and the cut in `reset_from`, on `deployment`, call id `{old call}~reset-{to}`) and the
    /// old run's events before the cut, request ids and agent tokens rewritten, `RunBlocked`,
    /// `RunResumed` and unanswered `AgentStarted` left out, stamped `now`. The same reset
    /// again is `created: false` with the run as it is now; errors in the contract's order.
    pub fn check_reset(
        &mut self,
        old: &RunId,
        to: Option<u64>,
        deployment: &DeploymentId,
        now: Timestamp,
        actual: &Result<ResetOutcome, StoreError>,
    ) -> Check {
        let what = match to {
            Some(to) => format!("reset({old}, {to})"),
            None => format!("retry({old})"),
        };
        let Some(run) = self.runs.get(old) else {
            return expect_err(&format!("{what} of an unknown run"), actual, &["NotFound"]);
        };
        if !run.rec.status.is_terminal() {
            return expect_err(&format!("{what} of a live run"), actual, &["RunNotEnded"]);
        }
        let limit = cut_limit(&run.events);
        let to = match to {
            Some(to) => to,
            None => match retry_cut(&run.events, limit) {
                Some(to) => to,
                None => {
                    return expect_err(
                        &format!("{what} of a run that did not end failed or terminated"),
                        actual,
                        &["InvalidInput"],
                    )
                }
            },
        };
        if to < 1 || to > limit {
            return expect_err(
                &format!("{what} to a cut outside 1..={limit}"),
                actual,
                &["InvalidInput"],
            );
        }
        let from = eve_core::ResetFrom {
            run: old.clone(),
            seq: to,
        };
        let copied = reset_copy(old, &RunId::new("probe"), &run.events, to).len() as u64;
        let key = format!("reset:{old}@{to}");
        if let Some(existing) = self.keys.get(&key) {
            let rec = &self.runs[existing].rec;
            return match actual {
                Ok(o) if !o.created && o.from == from && o.copied == copied => {
                    Self::same_record(&format!("{what} again"), &o.run, rec)
                }
                other => Err(format!(
                    "{what} again: expected run {existing} with created=false, from {from:?}, \
                     copied {copied}, got {other:?}"
                )),
            };
        }
        let session_ended = self
            .session_records
            .get(&run.rec.session_id)
            .is_some_and(|s| s.ended_at.is_some());
        if session_ended {
            return expect_err(
                &format!("{what} in an ended session"),
                actual,
                &["SessionEnded"],
            );
        }
        let out = match actual {
            Ok(o) if o.created && o.from == from && o.copied == copied => o,
            other => {
                return Err(format!(
                    "{what}: expected a new run (created, from {from:?}, copied {copied}), got {other:?}"
                ))
            }
        };
        let new_id = out.run.run_id.clone();
        if self.runs.contains_key(&new_id) {
            return Err(format!("{what} made its new run under a taken id {new_id}"));
        }
        let operator = WorkerId::new(format!("reset:{new_id}"));
        let epoch = match &out.run.owner {
            Some((w, e)) if w == &operator => *e,
            other => {
                return Err(format!(
                    "{what}: the new run must still name its retired operator worker {operator}, names {other:?}"
                ))
            }
        };
        self.workers.insert(
            operator.clone(),
            MWorker {
                epoch,
                deployment: deployment.clone(),
                expires_at: now.plus(eve_core::store::RESET_LEASE_TTL),
                retired: true,
            },
        );
        let old_rec = run.rec.clone();
        let copy = reset_copy(old, &new_id, &run.events, to);
        let started = match &run.started {
            Event::RunStarted {
                workflow_id,
                tool,
                input,
                session_id,
                execution,
                traceparent,
                ..
            } => Event::RunStarted {
                workflow_id: workflow_id.clone(),
                deployment_id: deployment.clone(),
                tool: tool.clone(),
                input: input.clone(),
                session_id: session_id.clone(),
                call_id: eve_core::CallId::new(format!("{}~reset-{to}", old_rec.call_id)),
                execution: *execution,
                traceparent: traceparent.clone(),
                reset_from: Some(from.clone()),
            },
            other => return Err(format!("the model's run {old} starts with {other:?}")),
        };
        let rec = RunRecord {
            run_id: new_id.clone(),
            idempotency_key: key.clone(),
            workflow_id: old_rec.workflow_id.clone(),
            deployment_id: deployment.clone(),
            tool: old_rec.tool.clone(),
            session_id: old_rec.session_id.clone(),
            call_id: eve_core::CallId::new(format!("{}~reset-{to}", old_rec.call_id)),
            execution: old_rec.execution,
            status: RunStatus::Running,
            next_seq: 1,
            processed_seq: 0,
            cancel_requested: false,
            activations: 1,
            owner: Some((operator, epoch)),
            created_at: now,
            updated_at: now,
            attributes: Default::default(),
        };
        self.runs.insert(
            new_id.clone(),
            MRun {
                rec,
                started: started.clone(),
                events: vec![StoredEvent {
                    seq: 0,
                    at: now,
                    event: started,
                }],
                landed: BTreeMap::new(),
                timers: BTreeMap::new(),
            },
        );
        self.order.push(new_id.clone());
        self.keys.insert(key, new_id.clone());
        if !copy.is_empty() {
            self.write(&new_id, copy, now);
            let run = self.runs.get_mut(&new_id).expect("inserted");
            run.rec.processed_seq = run.rec.next_seq;
            run.rec.activations = 0;
        }
        Self::same_record(&what, &out.run, &self.runs[&new_id].rec)
    }
}

/// Whether `e` is no `AttributesSet`, or one whose patch is valid.
fn valid_attributes(e: &Event) -> bool {
    match e {
        Event::AttributesSet { attributes, .. } => attributes
            .to_value::<serde_json::Value>()
            .ok()
            .is_some_and(|v| eve_core::search::parse_patch(&v).is_ok()),
        _ => true,
    }
}

/// The seq of a journal's first end, cancel or withdrawal event (its length when it has none):
/// a reset copies at most what comes before.
fn cut_limit(events: &[StoredEvent]) -> u64 {
    events
        .iter()
        .find(|e| {
            matches!(
                e.event,
                Event::RunCompleted { .. }
                    | Event::RunFailed { .. }
                    | Event::RunCancelled
                    | Event::RunDenied { .. }
                    | Event::RunTerminated { .. }
                    | Event::CancelRequested { .. }
                    | Event::InputWithdrawn { .. }
            )
        })
        .map_or(events.len() as u64, |e| e.seq)
}

/// Where a retry cuts: at the first attempt of the last step whose final attempt failed before
/// the end, else at `limit`; `None` unless the run ended failed or terminated.
fn retry_cut(events: &[StoredEvent], limit: u64) -> Option<u64> {
    let end = events.iter().find(|e| {
        matches!(
            e.event,
            Event::RunCompleted { .. }
                | Event::RunFailed { .. }
                | Event::RunCancelled
                | Event::RunDenied { .. }
                | Event::RunTerminated { .. }
        )
    })?;
    if !matches!(
        end.event,
        Event::RunFailed { .. } | Event::RunTerminated { .. }
    ) {
        return None;
    }
    let before: Vec<&StoredEvent> = events.iter().filter(|e| e.seq < limit).collect();
    let failed = before.iter().rev().find_map(|e| match &e.event {
        Event::StepFailed {
            cmd,
            retry_at: None,
            ..
        } => Some(*cmd),
        _ => None,
    });
    Some(match failed {
        Some(step) => before
            .iter()
            .find(|e| matches!(&e.event, Event::StepFailed { cmd, .. } if *cmd == step))
            .map_or(limit, |e| e.seq),
        None => limit,
    })
}

/// The events a reset of `old` cut at `to` gives `new` after its `RunStarted`.
fn reset_copy(old: &RunId, new: &RunId, events: &[StoredEvent], to: u64) -> Vec<Event> {
    let prefix: Vec<&StoredEvent> = events.iter().filter(|e| e.seq > 0 && e.seq < to).collect();
    let rebase = |id: &RequestId| match id.as_str().strip_prefix(&format!("{old}:")) {
        Some(cmd) => RequestId::new(format!("{new}:{cmd}")),
        None => id.clone(),
    };
    let answered_agents: Vec<u64> = prefix
        .iter()
        .filter_map(|e| match &e.event {
            Event::HookReceived { cmd, .. } => Some(*cmd),
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    for e in prefix {
        out.push(match &e.event {
            Event::RunBlocked { .. } | Event::RunResumed => continue,
            Event::AgentStarted { cmd, .. } if !answered_agents.contains(cmd) => continue,
            Event::InputRequested {
                cmd,
                request_id,
                request,
            } => Event::InputRequested {
                cmd: *cmd,
                request_id: rebase(request_id),
                request: request.clone(),
            },
            Event::InputAnswered {
                request_id,
                response,
            } => Event::InputAnswered {
                request_id: rebase(request_id),
                response: response.clone(),
            },
            Event::HookCreated {
                cmd,
                token,
                webhook,
                respond_with,
            } => Event::HookCreated {
                cmd: *cmd,
                token: match token.strip_prefix(&format!("agent:{old}:")) {
                    Some(key) => format!("agent:{new}:{key}"),
                    None => token.clone(),
                },
                webhook: *webhook,
                respond_with: respond_with.clone(),
            },
            other => other.clone(),
        });
    }
    out
}
