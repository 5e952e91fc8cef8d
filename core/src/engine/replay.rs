//! The deterministic executor: polls one body on the calling thread with a flag waker and
//! delivers journal events to it strictly in seq order, polling until stuck after each.

use super::agent::{reply_payload, AgentCall};
use super::ctx::{
    lock, BoxFuture, CallInfo, Cmd, CmdKind, Core, SharedCore, SleepFor, WorkflowCtx,
};
use super::error::{NonDeterminism, StepFailed, CODE_BODY_PANIC, CODE_STUCK};
use super::tool::{BodyOutcome, WorkflowTool};
use crate::event::{Event, Execution, StoredEvent};
use crate::ids::RequestId;
use crate::ids::RunId;
use crate::time::Timestamp;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// The engine-internal timer command that older versions journaled to keep a run claimable
/// while an activation ran steps. The store contract now makes a run whose owner's lease is no
/// longer valid claimable by itself, so no guard is written any more; journals that hold guard
/// events still replay (replay skips them, and a worker fires a guard left set so that its
/// timer does not keep the run claimable).
///
/// 2^53 − 1: far past any real command counter, and exact in an `i64` column and in a
/// JavaScript number.
pub const GUARD_CMD: u64 = (1 << 53) - 1;

/// The engine-internal timer command of a cancelled run's grace deadline: when it is due the
/// run ends cancelled, whatever the body is doing. Replay skips it like [`GUARD_CMD`].
pub const GRACE_CMD: u64 = (1 << 53) - 2;

/// The run's commands by counter. A step whose final outcome was delivered and whose every
/// handle the body dropped is retired: its slot is emptied (no journal event names it again,
/// and no handle can read it), so a body that runs a million steps one after the other holds
/// one pointer per step rather than the step, its closure and its output. Other commands stay.
#[derive(Default)]
pub(crate) struct CmdTable {
    slots: Vec<Option<Box<Cmd>>>,
}

impl CmdTable {
    /// Commands issued (retired ones included).
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn push(&mut self, cmd: Cmd) {
        self.slots.push(Some(Box::new(cmd)));
    }

    pub(crate) fn reserve(&mut self, n: usize) {
        self.slots.reserve(n);
    }

    /// The command, unless it was never issued or was retired.
    pub(crate) fn get(&self, i: usize) -> Option<&Cmd> {
        self.slots.get(i).and_then(|s| s.as_deref())
    }

    /// Whether command `i` was issued and retired.
    pub(crate) fn retired(&self, i: usize) -> bool {
        matches!(self.slots.get(i), Some(None))
    }

    /// One handle of step `cmd` dropped: retires it when it was the last and the step has its
    /// final outcome.
    pub(crate) fn release_handle(&mut self, cmd: u64) {
        let i = cmd as usize;
        if let Some(Some(c)) = self.slots.get_mut(i) {
            c.handles = c.handles.saturating_sub(1);
            if c.handles == 0 && c.outcome.is_some() {
                self.slots[i] = None;
            }
        }
    }

    /// Step `cmd` got its final outcome: retired at once when the body holds no handle (it
    /// dropped the step unawaited). Only steps issued through [`WorkflowCtx::step`] count
    /// handles, so nothing else is retired.
    fn resolved(&mut self, cmd: u64) {
        let i = cmd as usize;
        if let Some(Some(c)) = self.slots.get(i) {
            if c.handles == 0 && c.counted {
                self.slots[i] = None;
            }
        }
    }
}

impl std::ops::Index<usize> for CmdTable {
    type Output = Cmd;
    fn index(&self, i: usize) -> &Cmd {
        self.slots[i]
            .as_deref()
            .unwrap_or_else(|| panic!("command {i} was retired (a resolved step no handle reads)"))
    }
}

impl std::ops::IndexMut<usize> for CmdTable {
    fn index_mut(&mut self, i: usize) -> &mut Cmd {
        self.slots[i]
            .as_deref_mut()
            .unwrap_or_else(|| panic!("command {i} was retired (a resolved step no handle reads)"))
    }
}

/// Why replay stopped: each parks the run as blocked.
#[derive(Debug)]
pub(crate) enum Stop {
    NonDeterminism(NonDeterminism),
    Panic(String),
    Stuck,
}

impl Stop {
    pub(crate) fn reason(&self) -> String {
        match self {
            Stop::NonDeterminism(nd) => nd.to_string(),
            Stop::Panic(msg) => format!(
                "[{CODE_BODY_PANIC}] the workflow body panicked: {msg}; fix the body, deploy, and resume the run"
            ),
            Stop::Stuck => format!(
                "[{CODE_STUCK}] the workflow body is waiting on something that is not a durable operation (tokio::time::sleep, a channel, a spawned task?); only ctx operations can suspend a body"
            ),
        }
    }
}

#[derive(Default)]
struct FlagWaker(AtomicBool);

impl Wake for FlagWaker {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A step attempt the engine should start.
pub(crate) struct StepToRun {
    pub(crate) cmd: u64,
    pub(crate) name: String,
    pub(crate) attempt: u32,
    pub(crate) runner: super::ctx::StepRunner,
    pub(crate) policy: super::step::RetryPolicy,
    /// A local step: its outcome commits with the batch's.
    pub(crate) local: bool,
}

/// One run's body and command table.
pub(crate) struct Executor {
    pub(crate) core: SharedCore,
    body: Option<BoxFuture<BodyOutcome>>,
    /// Set once the body returned.
    pub(crate) finished: Option<BodyOutcome>,
    /// The next seq to deliver.
    pub(crate) next_seq: u64,
    /// The guard timer is set in the journal and not fired.
    pub(crate) guard_set: bool,
    /// The run was ended or parked by an event seen in the journal.
    pub(crate) ended: bool,
    /// Events delivered (for replay measurements).
    pub(crate) delivered: u64,
    /// Default or background: the return rules differ.
    execution: Execution,
    session: crate::ids::SessionId,
    /// The grace deadline of a cancelled run, once recorded.
    pub(crate) grace_at: Option<Timestamp>,
    /// Whether the registry has an `AgentHost`: agent calls not yet recorded are then recorded
    /// in the host form (a hook), else in the wire form (an input request).
    pub(crate) host_agents: bool,
    /// Set when the body woke itself during a poll; one for the executor's life rather than
    /// one allocation per delivered event.
    flag: Arc<FlagWaker>,
    waker: Waker,
    /// The run's trace: its context, and its spans when a sink is set.
    pub(crate) trace: crate::trace::RunTrace,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("next_seq", &self.next_seq)
            .field("finished", &self.finished.is_some())
            .finish()
    }
}

impl Executor {
    /// Builds the body from the run's `RunStarted` event (`first`, seq 0) without polling it.
    ///
    /// # Errors
    /// The message the run fails with when the input does not fit the body.
    pub(crate) fn new(
        run_id: RunId,
        tool: &WorkflowTool,
        first: &StoredEvent,
    ) -> Result<Self, String> {
        let Event::RunStarted {
            input,
            session_id,
            call_id,
            execution,
            tool: tool_name,
            ..
        } = &first.event
        else {
            return Err(format!(
                "journal of run {run_id} does not start with RunStarted"
            ));
        };
        let core = Arc::new(Mutex::new(Core::new(run_id.clone(), first.at)));
        let ctx = WorkflowCtx {
            core: core.clone(),
            call: Arc::new(CallInfo {
                tool: tool_name.clone(),
                session_id: session_id.clone(),
                call_id: call_id.clone(),
                execution: *execution,
            }),
        };
        let body = (tool.body)(ctx, input)?;
        let flag = Arc::new(FlagWaker::default());
        Ok(Self {
            core,
            body: Some(body),
            finished: None,
            next_seq: 0,
            guard_set: false,
            ended: false,
            delivered: 0,
            execution: *execution,
            session: session_id.clone(),
            grace_at: None,
            host_agents: false,
            trace: crate::trace::RunTrace::new(&run_id, first),
            waker: Waker::from(flag.clone()),
            flag,
        })
    }

    /// Reads ahead in the journal for what the body must get back at the call rather than at
    /// delivery: the webhook tokens drawn on the first run.
    pub(crate) fn prescan(&mut self, events: &[StoredEvent]) {
        let mut core = lock(&self.core);
        for ev in events {
            match &ev.event {
                Event::HookCreated {
                    cmd,
                    token,
                    webhook: true,
                    ..
                } => {
                    core.webhook_tokens.insert(*cmd, token.clone());
                }
                Event::Patched { cmd, id } => {
                    core.patches.insert(*cmd, id.clone());
                }
                _ => {}
            }
        }
    }

    /// The journal holds `end` events: until the last of them is delivered, the body replays
    /// a recorded run (what `ctx.patched` decides by).
    pub(crate) fn journal_ends_at(&mut self, end: u64) {
        let mut core = lock(&self.core);
        core.journal_end = core.journal_end.max(end);
        // About one command per recorded event (a step each): room for them up front rather
        // than growing the table by copying it while replaying. Bounded, as a long journal
        // may be one hook's payloads.
        let want = usize::try_from(end).unwrap_or(usize::MAX).min(4096);
        let len = core.cmds.len();
        core.cmds.reserve(want.saturating_sub(len));
    }

    /// The run's session.
    pub(crate) fn session_id(&self) -> crate::ids::SessionId {
        self.session.clone()
    }

    /// The seq of `CancelRequested`, once delivered.
    pub(crate) fn cancel_seq(&self) -> Option<u64> {
        lock(&self.core).cancel_seq
    }

    /// Requests recorded and neither answered nor withdrawn, in cmd order.
    pub(crate) fn pending_requests(&self) -> Vec<RequestId> {
        let core = lock(&self.core);
        // From the asks issued, not every command: its cost does not grow with the journal.
        let mut pending: Vec<(u64, RequestId)> = core
            .requests
            .iter()
            .filter(|(_, &cmd)| core.cmds[cmd as usize].pending)
            .map(|(id, &cmd)| (cmd, id.clone()))
            .collect();
        pending.sort_unstable();
        pending.into_iter().map(|(_, id)| id).collect()
    }

    /// Agent calls whose host has not acknowledged the start and whose result has not
    /// arrived, except those in `starting`. The worker starts them only once nothing is left
    /// unrecorded, so their intent is durable first.
    pub(crate) fn agents_to_start(&self, starting: &[u64]) -> Vec<(u64, AgentCall)> {
        let core = lock(&self.core);
        core.open
            .iter()
            .filter_map(|&i| {
                let c = &core.cmds[i as usize];
                match &c.kind {
                    CmdKind::Agent { call, .. }
                        if !c.wire
                            && !c.started
                            && c.payloads.is_empty()
                            && !starting.contains(&i) =>
                    {
                        Some((i, (**call).clone()))
                    }
                    _ => None,
                }
            })
            .collect()
    }

    /// Keys of host-form agent calls still waiting for their child's result (wire-form ones
    /// are withdrawn with the pending requests instead).
    pub(crate) fn pending_agents(&self) -> Vec<String> {
        let core = lock(&self.core);
        core.open
            .iter()
            .filter_map(|&i| {
                let c = &core.cmds[i as usize];
                match &c.kind {
                    CmdKind::Agent { call, .. } if !c.wire && c.payloads.is_empty() => {
                        Some(call.key.clone())
                    }
                    _ => None,
                }
            })
            .collect()
    }

    /// Delivers the next journal event and polls the body until it is stuck.
    pub(crate) fn deliver(&mut self, ev: &StoredEvent) -> Result<(), Stop> {
        debug_assert_eq!(ev.seq, self.next_seq, "events are delivered in seq order");
        self.next_seq = ev.seq + 1;
        self.delivered += 1;
        self.trace.observe(ev);
        self.apply(ev).map_err(Stop::NonDeterminism)?;
        self.poll()
    }

    fn apply(&mut self, ev: &StoredEvent) -> Result<(), NonDeterminism> {
        let mut core = lock(&self.core);
        core.now = ev.at;
        core.seq = ev.seq;
        let issued = core.cmds.len() as u64;
        // Looks up the command the event names, checking kind and name. What was expected is
        // described only on a mismatch: formatting it for every delivered event cost as much as
        // the rest of the check.
        let check = |core: &Core,
                     cmd: u64,
                     expected: &dyn Fn() -> String,
                     ok: &dyn Fn(&CmdKind) -> bool| {
            match core.cmds.get(usize::try_from(cmd).unwrap_or(usize::MAX)) {
                Some(c) if ok(&c.kind) => Ok(()),
                Some(c) => Err(NonDeterminism {
                    cmd,
                    expected: expected(),
                    found: c.kind.describe(),
                    hint: "the body issues a different operation here than when the run was recorded (a renamed or reordered step or wait?); deploy the old code under its deployment id, or fail the run".into(),
                }),
                None if core.cmds.retired(usize::try_from(cmd).unwrap_or(usize::MAX)) => Err(NonDeterminism {
                    cmd,
                    expected: expected(),
                    found: "a step already resolved by an earlier event".into(),
                    hint: "the journal records a second outcome for one step; inspect it with `eve journal`, and fail the run".into(),
                }),
                None => Err(NonDeterminism {
                    cmd,
                    expected: expected(),
                    found: format!("nothing (the body issued {issued} command(s) and then waited or returned)"),
                    hint: "a step or wait was removed, or the body took another branch than when the run was recorded; deploy the old code under its deployment id, or fail the run".into(),
                }),
            }
        };
        match &ev.event {
            Event::StepCompleted {
                cmd,
                name,
                attempt,
                output,
            } => {
                check(
                    &core,
                    *cmd,
                    &|| format!("step {name:?}"),
                    &|k| matches!(k, CmdKind::Step { name: n, .. } if n == name),
                )?;
                core.open.remove(cmd);
                let c = &mut core.cmds[*cmd as usize];
                c.attempts = *attempt;
                c.retry_at = None;
                c.outcome = Some((ev.seq, Ok(output.clone())));
                core.cmds.resolved(*cmd);
            }
            Event::StepFailed {
                cmd,
                name,
                attempt,
                error,
                fatal,
                retry_at,
            } => {
                check(
                    &core,
                    *cmd,
                    &|| format!("step {name:?}"),
                    &|k| matches!(k, CmdKind::Step { name: n, .. } if n == name),
                )?;
                if retry_at.is_none() {
                    core.open.remove(cmd);
                }
                let c = &mut core.cmds[*cmd as usize];
                c.attempts = *attempt;
                c.retry_at = *retry_at;
                if retry_at.is_none() {
                    c.outcome = Some((
                        ev.seq,
                        Err(Box::new(StepFailed {
                            name: name.clone(),
                            cmd: *cmd,
                            attempts: *attempt,
                            message: error.clone(),
                            fatal: *fatal,
                        })),
                    ));
                    core.cmds.resolved(*cmd);
                }
            }
            Event::SleepScheduled { cmd, .. } if *cmd == GUARD_CMD => self.guard_set = true,
            Event::SleepFired { cmd } if *cmd == GUARD_CMD => self.guard_set = false,
            Event::SleepScheduled { cmd, wake_at } if *cmd == GRACE_CMD => {
                self.grace_at = Some(*wake_at)
            }
            Event::SleepFired { cmd } if *cmd == GRACE_CMD => {}
            Event::SleepScheduled { cmd, wake_at } => {
                check(&core, *cmd, &|| "sleep".into(), &|k| {
                    matches!(k, CmdKind::Sleep(_))
                })?;
                core.unrecorded.remove(cmd);
                core.cmds[*cmd as usize].wake_at = Some(*wake_at);
            }
            Event::SleepFired { cmd } => {
                check(&core, *cmd, &|| "sleep".into(), &|k| {
                    matches!(k, CmdKind::Sleep(_))
                })?;
                core.open.remove(cmd);
                core.cmds[*cmd as usize].fired = Some(ev.seq);
            }
            Event::HookCreated {
                cmd,
                token,
                webhook,
                ..
            } => {
                let what = || {
                    if *webhook {
                        "webhook".to_owned()
                    } else {
                        format!("hook {token:?}")
                    }
                };
                check(&core, *cmd, &what, &|k| match k {
                    CmdKind::Hook { token: t, .. } | CmdKind::Agent { token: t, .. } => t == token,
                    _ => false,
                })?;
                core.unrecorded.remove(cmd);
            }
            Event::HookReceived { cmd, payload } => {
                check(&core, *cmd, &|| "a hook".into(), &|k| {
                    matches!(k, CmdKind::Hook { .. } | CmdKind::Agent { .. })
                })?;
                let c = &mut core.cmds[*cmd as usize];
                c.payloads.push((ev.seq, payload.clone()));
                if matches!(c.kind, CmdKind::Agent { .. }) {
                    core.open.remove(cmd);
                }
            }
            Event::InputRequested {
                cmd,
                request_id,
                request,
            } => {
                let what = || match &request.agent {
                    Some(call) => format!("agent {:?}", call.key),
                    None => "ask".into(),
                };
                check(&core, *cmd, &what, &|k| match (k, &request.agent) {
                    (CmdKind::Ask { request_id: r, .. }, None) => r == request_id,
                    (
                        CmdKind::Agent {
                            call,
                            request_id: r,
                            ..
                        },
                        Some(a),
                    ) => r == request_id && call.key == a.key,
                    _ => false,
                })?;
                core.unrecorded.remove(cmd);
                if request.agent.is_some() {
                    core.requests.insert(request_id.clone(), *cmd);
                    core.cmds[*cmd as usize].wire = true;
                }
                core.cmds[*cmd as usize].pending = true;
            }
            Event::InputAnswered {
                request_id,
                response,
            } => {
                if let Some(cmd) = core.requests.get(request_id).copied() {
                    core.open.remove(&cmd);
                    let c = &mut core.cmds[cmd as usize];
                    c.pending = false;
                    if matches!(c.kind, CmdKind::Agent { .. }) {
                        c.payloads
                            .push((ev.seq, reply_payload(response.agent.as_ref())));
                    } else {
                        c.answer = Some(Box::new((ev.seq, response.clone())));
                    }
                }
            }
            Event::InputWithdrawn { request_id } => {
                if let Some(cmd) = core.requests.get(request_id).copied() {
                    core.open.remove(&cmd);
                    core.cmds[cmd as usize].pending = false;
                }
            }
            Event::AgentStarted { cmd, key, .. } => {
                check(
                    &core,
                    *cmd,
                    &|| format!("agent {key:?}"),
                    &|k| matches!(k, CmdKind::Agent { call, .. } if &call.key == key),
                )?;
                core.cmds[*cmd as usize].started = true;
            }
            Event::Progress { cmd, .. } => {
                check(&core, *cmd, &|| "progress".into(), &|k| {
                    matches!(k, CmdKind::Progress { .. })
                })?;
                core.unrecorded.remove(cmd);
            }
            Event::MessagePosted { cmd, .. } => {
                check(&core, *cmd, &|| "post_message".into(), &|k| {
                    matches!(k, CmdKind::Message { .. })
                })?;
                core.unrecorded.remove(cmd);
            }
            Event::AttributesSet { cmd, .. } => {
                check(&core, *cmd, &|| "set_attributes".into(), &|k| {
                    matches!(k, CmdKind::Attributes { .. })
                })?;
                core.unrecorded.remove(cmd);
            }
            Event::Patched { cmd, id } => {
                check(
                    &core,
                    *cmd,
                    &|| format!("patch {id:?}"),
                    &|k| matches!(k, CmdKind::Patch { id: i } if i == id),
                )?;
                core.unrecorded.remove(cmd);
            }
            Event::CancelRequested { .. } => {
                core.cancel_seq.get_or_insert(ev.seq);
            }
            Event::RunCompleted { .. }
            | Event::RunFailed { .. }
            | Event::RunCancelled
            | Event::RunDenied { .. }
            | Event::RunTerminated { .. } => {
                self.ended = true;
            }
            Event::RunStarted { .. }
            | Event::AgentCompleted { .. }
            | Event::AgentFailed { .. }
            | Event::RunBlocked { .. }
            | Event::RunResumed => {}
        }
        Ok(())
    }

    /// Polls the body until it is stuck (repeating while it woke itself).
    pub(crate) fn poll(&mut self) -> Result<(), Stop> {
        let Some(body) = self.body.as_mut() else {
            return Ok(());
        };
        let flag = &self.flag;
        let mut cx = Context::from_waker(&self.waker);
        loop {
            flag.0.store(false, Ordering::SeqCst);
            match catch_unwind(AssertUnwindSafe(|| body.as_mut().poll(&mut cx))) {
                Err(panic) => {
                    self.body = None;
                    let msg = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a non-string panic payload".into());
                    return Err(Stop::Panic(msg));
                }
                Ok(Poll::Ready(out)) => {
                    self.body = None;
                    self.finished = Some(self.return_rules(out));
                    return Ok(());
                }
                Ok(Poll::Pending) if flag.0.load(Ordering::SeqCst) => continue,
                Ok(Poll::Pending) => break,
            }
        }
        let core = lock(&self.core);
        // A cancelled body waiting on a withdrawn request or a dropped timer is abandoned at
        // the end of its grace period, not parked as stuck.
        if core.has_outstanding() || core.cancel_seq.is_some() {
            Ok(())
        } else {
            Err(Stop::Stuck)
        }
    }

    /// The approval gate's denial, when it denied the call (see [`WorkflowTool::approval`]).
    pub(crate) fn denied(&self) -> Option<String> {
        lock(&self.core).denied.clone()
    }

    /// The seed's return rules: a default-execution body that returns `null` settles with its
    /// last progress value (if any); a background body's `null` stays `null`.
    fn return_rules(&self, out: BodyOutcome) -> BodyOutcome {
        match out {
            Ok(p) if p.is_null() && self.execution == Execution::Default => {
                Ok(lock(&self.core).last_progress.clone().unwrap_or(p))
            }
            other => other,
        }
    }

    /// Command events the body issued that the journal does not hold yet, in cmd order: waits
    /// (sleeps get `wake_at = now + duration`) and progress/messages. With `waits: false` (a
    /// cancelled run in its grace period, where no new wait is published) only the latter.
    pub(crate) fn unrecorded_commands(&self, now: Timestamp, waits: bool) -> Vec<Event> {
        let core = lock(&self.core);
        core.unrecorded
            .iter()
            .filter(|&&cmd| waits || !core.cmds[cmd as usize].kind.is_wait())
            .filter_map(|&cmd| match &core.cmds[cmd as usize].kind {
                CmdKind::Sleep(SleepFor::Duration(d)) => Some(Event::SleepScheduled {
                    cmd,
                    wake_at: now.plus(*d),
                }),
                CmdKind::Sleep(SleepFor::Until(at)) => {
                    Some(Event::SleepScheduled { cmd, wake_at: *at })
                }
                CmdKind::Hook {
                    token,
                    webhook,
                    respond_with,
                } => Some(Event::HookCreated {
                    cmd,
                    token: token.clone(),
                    webhook: *webhook,
                    respond_with: respond_with.as_deref().cloned(),
                }),
                CmdKind::Agent { token, .. } if self.host_agents => Some(Event::HookCreated {
                    cmd,
                    token: token.clone(),
                    webhook: false,
                    respond_with: None,
                }),
                CmdKind::Agent {
                    call, request_id, ..
                } => Some(Event::InputRequested {
                    cmd,
                    request_id: request_id.clone(),
                    request: call.to_request(),
                }),
                CmdKind::Ask {
                    request_id,
                    request,
                } => Some(Event::InputRequested {
                    cmd,
                    request_id: request_id.clone(),
                    request: request.clone(),
                }),
                CmdKind::Progress { value } => Some(Event::Progress {
                    cmd,
                    value: value.clone(),
                }),
                CmdKind::Message { message } => Some(Event::MessagePosted {
                    cmd,
                    message: message.clone(),
                }),
                CmdKind::Patch { id } => Some(Event::Patched {
                    cmd,
                    id: id.clone(),
                }),
                CmdKind::Attributes { patch } => Some(Event::AttributesSet {
                    cmd,
                    attributes: patch.clone(),
                }),
                CmdKind::Step { .. } => None,
            })
            .collect()
    }

    /// Whether the body issued a command whose event the journal does not hold yet.
    pub(crate) fn has_unrecorded(&self) -> bool {
        !lock(&self.core).unrecorded.is_empty()
    }

    /// Step attempts that may start at `now` (no final outcome, retry wait over), except those
    /// in `running`.
    pub(crate) fn runnable_steps(&self, now: Timestamp, running: &[u64]) -> Vec<StepToRun> {
        let core = lock(&self.core);
        core.open
            .iter()
            .map(|&i| (i as usize, &core.cmds[i as usize]))
            .filter_map(|(i, c)| match &c.kind {
                CmdKind::Step {
                    name,
                    runner,
                    policy,
                    local,
                } if c.outcome.is_none()
                    && c.retry_at.is_none_or(|at| at <= now)
                    && !running.contains(&(i as u64)) =>
                {
                    Some(StepToRun {
                        cmd: i as u64,
                        name: name.clone(),
                        attempt: c.attempts + 1,
                        runner: runner.clone(),
                        policy: policy.clone(),
                        local: *local,
                    })
                }
                _ => None,
            })
            .collect()
    }

    /// Recorded sleeps that have not fired, with their wake times.
    pub(crate) fn pending_sleeps(&self) -> Vec<(u64, Timestamp)> {
        let core = lock(&self.core);
        core.open
            .iter()
            .map(|&i| (i as usize, &core.cmds[i as usize]))
            .filter_map(|(i, c)| match (&c.kind, c.wake_at, c.fired) {
                (CmdKind::Sleep(_), Some(at), None) => Some((i as u64, at)),
                _ => None,
            })
            .collect()
    }

    /// The earliest pending retry wait.
    pub(crate) fn next_retry(&self) -> Option<Timestamp> {
        let core = lock(&self.core);
        core.open
            .iter()
            .filter_map(|&i| core.cmds[i as usize].retry_at)
            .min()
    }

    /// Commands issued so far.
    pub(crate) fn commands(&self) -> u64 {
        lock(&self.core).cmds.len() as u64
    }
}
