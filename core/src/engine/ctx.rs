//! [`WorkflowCtx`], the durable operations a body issues, and the deterministic combinators.
//!
//! Every ctx call assigns the next command counter synchronously and returns a handle at once
//! (like an eager JS promise). A handle becomes ready only when the engine delivers the journal
//! event that resolves it; handles never use wakers, since the engine polls the body after every
//! delivery.

use super::agent::{agent_token, AgentCall, AgentError};
use super::error::{StepError, StepFailed};
use super::replay::CmdTable;
use super::step::{parse_duration, RetryPolicy, StepCtx};
use crate::event::{
    Execution, InputRequest, InputResponse, Payload, WebhookRequest, WebhookResponse,
};
use crate::ids::{CallId, RequestId, RunId, SessionId};
use crate::time::Timestamp;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

pub(crate) use super::BoxFuture;
pub(crate) type StepRunner =
    Arc<dyn Fn(StepCtx) -> BoxFuture<Result<Payload, StepError>> + Send + Sync + 'static>;

/// How long a sleep lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SleepFor {
    /// This long after the sleep is scheduled.
    Duration(Duration),
    /// Until this time.
    Until(Timestamp),
}

/// What a sleep argument can be: a humantime string (`"4h"`), a [`Duration`], or a
/// [`Timestamp`] to sleep until.
pub trait IntoSleep {
    /// The sleep, or why the argument is not one.
    fn into_sleep(self) -> Result<SleepFor, String>;
}

impl IntoSleep for &str {
    fn into_sleep(self) -> Result<SleepFor, String> {
        parse_duration(self)
            .map(SleepFor::Duration)
            .map_err(|e| e.to_string())
    }
}

impl IntoSleep for &String {
    fn into_sleep(self) -> Result<SleepFor, String> {
        self.as_str().into_sleep()
    }
}

impl IntoSleep for Duration {
    fn into_sleep(self) -> Result<SleepFor, String> {
        Ok(SleepFor::Duration(self))
    }
}

impl IntoSleep for Timestamp {
    fn into_sleep(self) -> Result<SleepFor, String> {
        Ok(SleepFor::Until(self))
    }
}

pub(crate) enum CmdKind {
    Step {
        name: String,
        runner: StepRunner,
        policy: RetryPolicy,
        /// A local step (see [`StepFuture::local`]).
        local: bool,
    },
    Sleep(SleepFor),
    Hook {
        token: String,
        webhook: bool,
        respond_with: Option<Box<WebhookResponse>>,
    },
    Ask {
        request_id: RequestId,
        request: InputRequest,
    },
    Agent {
        call: Box<AgentCall>,
        /// The host form's hook token.
        token: String,
        /// The wire form's request id.
        request_id: RequestId,
    },
    Progress {
        value: Payload,
    },
    Message {
        message: Payload,
    },
    Patch {
        id: String,
    },
    Attributes {
        patch: Payload,
    },
}

impl CmdKind {
    pub(crate) fn describe(&self) -> String {
        match self {
            CmdKind::Step { name, .. } => format!("step {name:?}"),
            CmdKind::Sleep(_) => "sleep".into(),
            CmdKind::Hook { webhook: true, .. } => "webhook".into(),
            CmdKind::Hook { token, .. } => format!("hook {token:?}"),
            CmdKind::Ask { .. } => "ask".into(),
            CmdKind::Agent { call, .. } => format!("agent {:?}", call.key),
            CmdKind::Progress { .. } => "progress".into(),
            CmdKind::Message { .. } => "post_message".into(),
            CmdKind::Patch { id } => format!("patch {id:?}"),
            CmdKind::Attributes { .. } => "set_attributes".into(),
        }
    }

    /// Whether the body waits on it (its command event must be durable before steps start).
    pub(crate) fn is_wait(&self) -> bool {
        matches!(
            self,
            CmdKind::Sleep(_) | CmdKind::Hook { .. } | CmdKind::Ask { .. } | CmdKind::Agent { .. }
        )
    }
}

/// One command the body issued and what the journal says about it.
pub(crate) struct Cmd {
    pub(crate) kind: CmdKind,
    /// Step: attempts recorded so far.
    pub(crate) attempts: u32,
    /// Step: the next attempt is due then (a failed attempt will be retried).
    pub(crate) retry_at: Option<Timestamp>,
    /// Step: the final outcome, with the seq that delivered it.
    pub(crate) outcome: Option<(u64, Result<Payload, Box<StepFailed>>)>,
    /// Sleep: when it fires (from `SleepScheduled`).
    pub(crate) wake_at: Option<Timestamp>,
    /// Sleep: the seq of `SleepFired`.
    pub(crate) fired: Option<u64>,
    /// Hook: payloads received, with their seqs.
    pub(crate) payloads: Vec<(u64, Payload)>,
    /// Hook: payloads handed to the body.
    pub(crate) consumed: usize,
    /// Ask: the answer, with its seq.
    pub(crate) answer: Option<Box<(u64, InputResponse)>>,
    /// Ask: recorded (`InputRequested` in the journal) and neither answered nor withdrawn.
    pub(crate) pending: bool,
    /// Agent: the host acknowledged the start (`AgentStarted` in the journal).
    pub(crate) started: bool,
    /// Agent: recorded in the wire form (an `InputRequested`), served by a host over the wire
    /// rather than started through the registry's `AgentHost`.
    pub(crate) wire: bool,
    /// Step: the body's live handles ([`StepFuture`] and its clones). A step with a final
    /// outcome and none left is retired from the table (see [`CmdTable`]).
    pub(crate) handles: u32,
    /// Step: issued through [`WorkflowCtx::step`], whose handles count themselves in
    /// `handles`; only such a step is ever retired.
    pub(crate) counted: bool,
}

impl Cmd {
    fn new(kind: CmdKind) -> Self {
        Self {
            kind,
            attempts: 0,
            retry_at: None,
            outcome: None,
            wake_at: None,
            fired: None,
            payloads: Vec::new(),
            consumed: 0,
            answer: None,
            pending: false,
            started: false,
            wire: false,
            handles: 0,
            counted: false,
        }
    }
}

/// The run's command table, shared by the ctx handles and the engine.
pub(crate) struct Core {
    pub(crate) run_id: RunId,
    pub(crate) cmds: CmdTable,
    /// Steps without a final outcome and sleeps not fired: what a delivery may still resolve.
    pub(crate) open: BTreeSet<u64>,
    /// Waits whose command event is not in the journal yet.
    pub(crate) unrecorded: BTreeSet<u64>,
    /// Hooks issued (a hook may always receive another payload).
    pub(crate) hooks: u64,
    /// Time of the event being delivered.
    pub(crate) now: Timestamp,
    rng: u64,
    /// Ask commands by request id.
    pub(crate) requests: HashMap<RequestId, u64>,
    /// Agent keys issued (unique within the run).
    pub(crate) agent_keys: HashSet<String>,
    /// Webhook tokens recorded in the journal, by cmd (read back on replay, never redrawn).
    pub(crate) webhook_tokens: HashMap<u64, String>,
    /// The last `ctx.progress` value (the return rules' fallback output).
    pub(crate) last_progress: Option<Payload>,
    /// The run's attributes as this execution of the body set them (for the count limit).
    pub(crate) attributes: crate::search::Attributes,
    /// The seq of `CancelRequested`, once delivered: the abort signal.
    pub(crate) cancel_seq: Option<u64>,
    /// `Patched` markers read ahead in the journal, by cmd.
    pub(crate) patches: HashMap<u64, String>,
    /// The seq of the event being delivered.
    pub(crate) seq: u64,
    /// The journal's length when replay began (0: unknown): while events before it are still
    /// to be delivered, the body is replaying a recorded run.
    pub(crate) journal_end: u64,
    /// Set by the approval gate when it denied the call: the body's error is then the reason
    /// of a `RunDenied`, not a failure.
    pub(crate) denied: Option<String>,
}

impl Core {
    pub(crate) fn new(run_id: RunId, now: Timestamp) -> Self {
        // FNV-1a of the run id: stable across processes and Rust versions.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in run_id.as_str().bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        Self {
            run_id,
            cmds: CmdTable::default(),
            open: BTreeSet::new(),
            unrecorded: BTreeSet::new(),
            hooks: 0,
            now,
            rng: h,
            requests: HashMap::new(),
            agent_keys: HashSet::new(),
            webhook_tokens: HashMap::new(),
            last_progress: None,
            attributes: crate::search::Attributes::new(),
            cancel_seq: None,
            patches: HashMap::new(),
            seq: 0,
            journal_end: 0,
            denied: None,
        }
    }

    /// `ctx.patched(id)` (`new_runs: true`) or `ctx.deprecate_patch(id)` (`false`): takes a
    /// command counter only when the patch is (or, for a new execution, becomes) recorded, so
    /// runs recorded before the patch keep their counters.
    fn patch(&mut self, id: &str, new_runs: bool) -> bool {
        let cmd = self.cmds.len() as u64;
        let recorded = self.patches.get(&cmd).is_some_and(|p| p == id);
        let replaying = self.seq + 1 < self.journal_end;
        if recorded || (new_runs && !replaying) {
            self.issue(CmdKind::Patch { id: id.to_owned() });
            return true;
        }
        false
    }

    fn issue(&mut self, kind: CmdKind) -> u64 {
        let cmd = self.cmds.len() as u64;
        match kind {
            CmdKind::Step { .. } => {
                self.open.insert(cmd);
            }
            CmdKind::Sleep(_) => {
                self.open.insert(cmd);
                self.unrecorded.insert(cmd);
            }
            CmdKind::Hook { .. } => {
                self.hooks += 1;
                self.unrecorded.insert(cmd);
            }
            CmdKind::Ask { .. } | CmdKind::Agent { .. } => {
                self.open.insert(cmd);
                self.unrecorded.insert(cmd);
            }
            CmdKind::Progress { .. }
            | CmdKind::Message { .. }
            | CmdKind::Patch { .. }
            | CmdKind::Attributes { .. } => {
                self.unrecorded.insert(cmd);
            }
        }
        self.cmds.push(Cmd::new(kind));
        cmd
    }

    /// Whether a future delivery could still resolve a handle.
    pub(crate) fn has_outstanding(&self) -> bool {
        self.hooks > 0 || !self.open.is_empty()
    }

    fn next_random(&mut self) -> u64 {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

pub(crate) type SharedCore = Arc<Mutex<Core>>;

pub(crate) fn lock(core: &SharedCore) -> MutexGuard<'_, Core> {
    // A panicking body may poison the lock; the engine parks that run, the state stays usable.
    core.lock().unwrap_or_else(|e| e.into_inner())
}

/// Identity of the tool call a run serves.
#[derive(Clone, Debug)]
pub(crate) struct CallInfo {
    pub(crate) tool: String,
    pub(crate) session_id: SessionId,
    pub(crate) call_id: CallId,
    pub(crate) execution: Execution,
}

/// The context a workflow body receives: the only way to issue durable operations.
///
/// Everything nondeterministic (I/O, clocks, randomness, env) belongs in steps; the body is
/// replayed and must issue the same commands in the same order every time. Use
/// [`WorkflowCtx::now`] and [`WorkflowCtx::random`] instead of the system clock and RNG, and
/// [`WorkflowCtx::race`]/[`select`](WorkflowCtx::select)/[`join_all`](WorkflowCtx::join_all)
/// instead of `tokio::select!`. A body is polled outside tokio's timers: `tokio::time::sleep`
/// in a body never completes, and the run is parked with `[EVE-STUCK-001]`.
#[derive(Clone)]
pub struct WorkflowCtx {
    pub(crate) core: SharedCore,
    pub(crate) call: Arc<CallInfo>,
}

impl fmt::Debug for WorkflowCtx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let core = lock(&self.core);
        f.debug_struct("WorkflowCtx")
            .field("run_id", &core.run_id)
            .field("tool", &self.call.tool)
            .field("commands", &core.cmds.len())
            .finish()
    }
}

impl WorkflowCtx {
    /// The run.
    pub fn run_id(&self) -> RunId {
        lock(&self.core).run_id.clone()
    }

    /// Marks the call denied by its approval gate (see [`WorkflowTool::approval`](super::WorkflowTool::approval)).
    pub(crate) fn deny(&self, reason: String) {
        lock(&self.core).denied = Some(reason);
    }

    /// The model-visible tool name.
    pub fn tool_name(&self) -> &str {
        &self.call.tool
    }

    /// The session the call belongs to.
    pub fn session_id(&self) -> &SessionId {
        &self.call.session_id
    }

    /// The tool call that started the run.
    pub fn call_id(&self) -> &CallId {
        &self.call.call_id
    }

    /// Default or background execution.
    pub fn execution(&self) -> Execution {
        self.call.execution
    }

    /// The time of the journal event being delivered: the same on the first run and on every
    /// replay.
    pub fn now(&self) -> Timestamp {
        lock(&self.core).now
    }

    /// A random number from a generator seeded by the run id: the same sequence on every
    /// replay.
    pub fn random(&self) -> u64 {
        lock(&self.core).next_random()
    }

    /// Issues a step: `f` runs on the worker's runtime (at least once; its recorded result is
    /// fed back on replay and it is not run again). Attempts are journaled; a retryable error is
    /// retried by the default [`RetryPolicy`] (3 retries, exponential backoff as durable timers)
    /// unless [`StepFuture::retry`] sets another; [`StepError::Fatal`] is never retried; a
    /// panicking attempt counts as a failed one. Steps issued before the body awaits run
    /// concurrently.
    pub fn step<T, F, Fut>(&self, name: impl Into<String>, f: F) -> StepFuture<T>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        F: Fn(StepCtx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, StepError>> + Send + 'static,
    {
        let runner: StepRunner = Arc::new(move |sc: StepCtx| {
            let fut = f(sc);
            Box::pin(async move {
                let value = fut.await?;
                Payload::from_value(&value).map_err(|e| {
                    StepError::fatal(format!("the step's output does not serialize as JSON: {e}"))
                })
            }) as BoxFuture<Result<Payload, StepError>>
        });
        let mut core = lock(&self.core);
        let cmd = core.issue(CmdKind::Step {
            name: name.into(),
            runner,
            policy: RetryPolicy::default(),
            local: false,
        });
        let c = &mut core.cmds[cmd as usize];
        c.handles = 1;
        c.counted = true;
        drop(core);
        StepFuture {
            core: self.core.clone(),
            cmd,
            _t: PhantomData,
        }
    }

    /// A durable timer: `"4h"`, `"30s"`, a [`Duration`], or a [`Timestamp`] to sleep until.
    /// The handle is ready once the timer fired. An unparsable string is a bug in the body: it
    /// panics, which parks the run as blocked with the message until a fix is deployed.
    pub fn sleep(&self, duration: impl IntoSleep) -> Sleep {
        let spec = duration
            .into_sleep()
            .unwrap_or_else(|e| panic!("ctx.sleep: {e}"));
        let cmd = lock(&self.core).issue(CmdKind::Sleep(spec));
        Sleep {
            core: self.core.clone(),
            cmd,
        }
    }

    /// Sleeps until `at`.
    pub fn sleep_until(&self, at: Timestamp) -> Sleep {
        self.sleep(at)
    }

    /// Creates a hook with a caller-chosen token; [`resume_hook`](super::resume_hook) delivers
    /// payloads to it, from any process. A hook takes several payloads; each
    /// [`Hook::next`] awaits the next one in journal order. The token is unique among live
    /// hooks of the store and released when the run ends.
    pub fn create_hook<T: DeserializeOwned + Send + 'static>(
        &self,
        token: impl Into<String>,
    ) -> Hook<T> {
        let token = token.into();
        let cmd = lock(&self.core).issue(CmdKind::Hook {
            token: token.clone(),
            webhook: false,
            respond_with: None,
        });
        Hook {
            core: self.core.clone(),
            cmd,
            token,
            _t: PhantomData,
        }
    }

    /// Creates a webhook: an unguessable URL path (`/.well-known/workflow/v1/webhook/{token}`,
    /// 244 random bits from the OS) that `eve serve` answers with 202 Accepted and delivers as
    /// a [`WebhookRequest`]. The token is drawn once and read back from the journal on replay.
    pub fn create_webhook<T: DeserializeOwned + Send + 'static>(&self) -> Webhook<T> {
        self.webhook(None)
    }

    /// [`create_webhook`](Self::create_webhook) answering each delivery with `response`.
    pub fn create_webhook_with<T: DeserializeOwned + Send + 'static>(
        &self,
        response: WebhookResponse,
    ) -> Webhook<T> {
        self.webhook(Some(response))
    }

    fn webhook<T: DeserializeOwned + Send + 'static>(
        &self,
        respond_with: Option<WebhookResponse>,
    ) -> Webhook<T> {
        let mut core = lock(&self.core);
        let cmd = core.cmds.len() as u64;
        let token = core
            .webhook_tokens
            .get(&cmd)
            .cloned()
            .unwrap_or_else(new_webhook_token);
        core.issue(CmdKind::Hook {
            token: token.clone(),
            webhook: true,
            respond_with: respond_with.map(Box::new),
        });
        Webhook {
            hook: Hook {
                core: self.core.clone(),
                cmd,
                token,
                _t: PhantomData,
            },
        }
    }

    /// Asks a person: publishes `input.requested` on the session's channel. The handle resolves
    /// with the answer; race it against a sleep for a deadline and await it again later.
    /// Several requests may be outstanding; each is answered at most once (the store refuses a
    /// second answer, an answer after the run ended, and an option that is not offered). Ending
    /// the run withdraws it. An invalid request (empty prompt, duplicate option ids) is a bug
    /// in the body: it panics, which parks the run as blocked.
    pub fn ask(&self, request: InputRequest) -> Ask {
        if let Err(e) = validate_request(&request) {
            panic!("ctx.ask: {e}");
        }
        let mut core = lock(&self.core);
        let cmd = core.cmds.len() as u64;
        let request_id = RequestId::for_command(&core.run_id, cmd);
        core.requests.insert(request_id.clone(), cmd);
        core.issue(CmdKind::Ask {
            request_id: request_id.clone(),
            request,
        });
        Ask {
            core: self.core.clone(),
            cmd,
            request_id,
        }
    }

    /// Delegates to a subagent: a request the host fulfils, journaled once per `(run, key)`.
    /// With an [`AgentHost`](super::AgentHost) in the registry, the host starts (or, with
    /// `agent_id`, continues) the child once per `(run, key)` and reports its result with
    /// [`complete_agent`](super::complete_agent). Without one, the call is published as an
    /// input request carrying the call ([`InputRequest::agent`], request id `{run}:{cmd}`)
    /// that a host serves over the wire (MCP sampling, `GET /v1/agents` and
    /// `POST /v1/agents/{id}/result`) and answers once, its output checked against
    /// `output_schema` before it is recorded; ending the run withdraws it. The form is fixed
    /// when the call is first recorded and kept on every replay. The handle resolves with the
    /// child's output, validated against `output_schema` when one is given.
    ///
    /// # Errors
    /// [`AgentError::InvalidKey`] at the call when the key is empty or was used before in this
    /// run (deterministic on replay); no command is issued then.
    pub fn agent(&self, call: AgentCall) -> Result<Agent, AgentError> {
        let mut core = lock(&self.core);
        if call.key.trim().is_empty() {
            return Err(AgentError::InvalidKey {
                key: call.key,
                reason: "an agent call needs a non-empty key, unique within the run".into(),
            });
        }
        if !core.agent_keys.insert(call.key.clone()) {
            return Err(AgentError::InvalidKey {
                reason: format!(
                    "key {:?} was used by an earlier agent call of this run; give each agent call its own key",
                    call.key
                ),
                key: call.key,
            });
        }
        let token = agent_token(&core.run_id, &call.key);
        let request_id = RequestId::for_command(&core.run_id, core.cmds.len() as u64);
        let key = call.key.clone();
        let cmd = core.issue(CmdKind::Agent {
            call: Box::new(call),
            token,
            request_id,
        });
        Ok(Agent {
            core: self.core.clone(),
            cmd,
            key,
        })
    }

    /// Reports progress. In default execution it is an `action.partial` snapshot (last write
    /// wins per call, never in model history) and the fallback output when the body returns
    /// `null`; in background execution it is stream-only `task.progress`. Recorded once: a
    /// replay does not publish it again. A value that does not serialize is a bug in the body:
    /// it panics.
    pub fn progress<T: Serialize + ?Sized>(&self, value: &T) {
        let value = Payload::from_value(value)
            .unwrap_or_else(|e| panic!("ctx.progress: the value does not serialize: {e}"));
        let mut core = lock(&self.core);
        core.last_progress = Some(value.clone());
        core.issue(CmdKind::Progress { value });
    }

    /// Labels the run with attributes that `eve runs list --query 'attr.<key> = …'` and
    /// `GET /v1/runs?query=` find it by (indexed by every store): a JSON object of key →
    /// string, number or boolean. Set keys overwrite, `null` removes a key, keys not named stay.
    /// Journaled as `AttributesSet`, recorded once: a replay matches it and writes nothing. The
    /// store's record ([`RunRecord::attributes`](crate::RunRecord::attributes)) changes when
    /// the event is appended (with the body's next append).
    ///
    /// ```ignore
    /// ctx.set_attributes(json!({"region": "eu", "cost": 12.5, "draft": null}))?;
    /// ```
    ///
    /// # Errors
    /// [`AttributeError`](crate::AttributeError), and nothing is recorded, when `attributes` is
    /// not an object, a key is empty, longer than
    /// [`MAX_ATTRIBUTE_KEY_BYTES`](crate::search::MAX_ATTRIBUTE_KEY_BYTES) or not made of ASCII
    /// letters, digits, `_` and `-`, a value is an object or array or longer than
    /// [`MAX_ATTRIBUTE_VALUE_BYTES`](crate::search::MAX_ATTRIBUTE_VALUE_BYTES), or the run would
    /// hold more than [`MAX_ATTRIBUTES`](crate::search::MAX_ATTRIBUTES).
    pub fn set_attributes<T: Serialize + ?Sized>(
        &self,
        attributes: &T,
    ) -> Result<(), crate::AttributeError> {
        let value = serde_json::to_value(attributes)
            .map_err(|e| crate::AttributeError::NotAnObject(e.to_string()))?;
        let patch = crate::search::parse_patch(&value)?;
        let mut core = lock(&self.core);
        let mut merged = core.attributes.clone();
        crate::search::apply_patch(&mut merged, &patch);
        if merged.len() > crate::search::MAX_ATTRIBUTES {
            return Err(crate::AttributeError::TooMany {
                count: merged.len(),
                limit: crate::search::MAX_ATTRIBUTES,
            });
        }
        core.attributes = merged;
        core.issue(CmdKind::Attributes {
            patch: Payload::from(value),
        });
        Ok(())
    }

    /// A version marker, to change a body under runs in flight without a new deployment id:
    /// `true` on a run that reaches this point under the new code (the decision is journaled
    /// as `Patched`), `false` on a replay of a run that passed this point before the patch
    /// existed, so it keeps the old branch and its recorded commands. The same answer on every
    /// replay. Use one id per change; the ids of one body must differ.
    ///
    /// ```ignore
    /// if ctx.patched("audit-before-deploy") {
    ///     audit(&ctx, plan.clone()).await?; // new runs
    /// } // runs recorded before the patch skip it
    /// ```
    ///
    /// Once no run recorded before the patch is left, keep only the new branch and replace the
    /// call with [`deprecate_patch`](Self::deprecate_patch); once no run recorded with the patch
    /// is left either, delete that too. Deployment pinning (a new deployment id, the old code
    /// kept running for its runs) is the alternative when a change is too large to branch.
    pub fn patched(&self, id: &str) -> bool {
        lock(&self.core).patch(id, true)
    }

    /// What a [`patched`](Self::patched) call becomes once only its new branch is kept:
    /// runs that recorded the patch replay past their marker; new runs record nothing. Valid
    /// while no run recorded before the patch is left (those would now diverge).
    pub fn deprecate_patch(&self, id: &str) {
        lock(&self.core).patch(id, false);
    }

    /// The run's cancellation signal: durable (the same on every replay), ready once a cancel
    /// was requested. Race a step against it to run a cleanup step; steps themselves see it
    /// through [`StepCtx::aborted`]. The body then has its tool's grace period.
    pub fn abort_signal(&self) -> AbortSignal {
        AbortSignal {
            core: self.core.clone(),
        }
    }

    /// Waits for whichever of `a` and `b` resolved first in the journal (the same winner on
    /// every replay). The loser is left untouched: await it again later.
    pub fn race<A: Durable, B: Durable>(&self, a: A, b: B) -> Race<A, B> {
        Race { a, b }
    }

    /// Waits for the first of `items` to resolve in journal order; gives its index and output.
    pub fn select<D: Durable>(&self, items: Vec<D>) -> Select<D> {
        Select { items }
    }

    /// Waits for all of `items`; outputs in the order given.
    pub fn join_all<D: Durable>(&self, items: Vec<D>) -> JoinAll<D> {
        JoinAll { items }
    }
}

/// A handle on a durable operation that the deterministic combinators can order: it knows the
/// journal seq at which it resolved. All ctx handles implement it, and so do [`Race`],
/// [`Select`] and [`JoinAll`].
pub trait Durable: Future + Unpin + Send {
    /// The seq of the journal event that resolved it, once delivered; `None` while pending.
    /// Never consumes anything.
    fn resolved_seq(&self) -> Option<u64>;
}

/// Either of two outputs, from [`WorkflowCtx::race`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Either<L, R> {
    /// The first argument won.
    Left(L),
    /// The second argument won.
    Right(R),
}

impl<L, R> Either<L, R> {
    /// The first argument's output if it won: `ctx.race(answer, ctx.sleep("4h")).await.left()`
    /// is `None` on a timeout.
    pub fn left(self) -> Option<L> {
        match self {
            Either::Left(l) => Some(l),
            Either::Right(_) => None,
        }
    }
}

/// A step's handle: resolves with its output, or [`StepFailed`] once a fatal error or the last
/// retry failed. Clone it to await the same result again.
#[must_use = "a step runs whether or not it is awaited; await it to get its result"]
pub struct StepFuture<T> {
    core: SharedCore,
    cmd: u64,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for StepFuture<T> {
    fn clone(&self) -> Self {
        lock(&self.core).cmds[self.cmd as usize].handles += 1;
        Self {
            core: self.core.clone(),
            cmd: self.cmd,
            _t: PhantomData,
        }
    }
}

impl<T> Drop for StepFuture<T> {
    fn drop(&mut self) {
        // The last handle of a resolved step: nothing can read its outcome any more, so a long
        // run's table does not keep every step it ever ran.
        lock(&self.core).cmds.release_handle(self.cmd);
    }
}

impl<T> fmt::Debug for StepFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepFuture")
            .field("cmd", &self.cmd)
            .finish()
    }
}

impl<T> StepFuture<T> {
    /// Overrides the retry policy of this step. Call it right away, before the body awaits.
    pub fn retry(self, policy: RetryPolicy) -> Self {
        if let CmdKind::Step { policy: p, .. } = &mut lock(&self.core).cmds[self.cmd as usize].kind
        {
            *p = policy;
        }
        self
    }

    /// Marks this step local. Call it right away, before the body awaits.
    ///
    /// A local step is journaled like any step (its outcome is a `StepCompleted` or
    /// `StepFailed` event; a replay feeds it back and never runs it again), but its outcome is
    /// not committed on its own: consecutive local steps run back to back in the activation,
    /// each outcome is handed to the body at once, and the outcomes commit together in one
    /// append, with the next thing the run journals (a wait, progress, the run's end) or just
    /// before it (a normal step starting, a suspension), or when one append is full. That saves
    /// a commit (an fsync on a durable store) per step.
    ///
    /// The cost: a crash, a lost lease or a delivery to the run (an answer, a cancel) that gets
    /// into the journal before the batch's append runs the uncommitted local steps of the batch
    /// again in the next activation. Steps run at least once anyway; a local step may run again
    /// after it *succeeded* and the body went on, so give it only work that is cheap and safe to
    /// repeat (or keyed by [`StepCtx::idempotency_key`](super::StepCtx::idempotency_key)).
    ///
    /// A failed attempt ends the batch: its `StepFailed` commits with the batch, and a retry
    /// waits for its backoff as a durable timer, as for a normal step. Local steps batch only
    /// while nothing else runs: issued beside running normal steps (a `join` of both), they run
    /// as normal steps.
    pub fn local(self) -> Self {
        if let CmdKind::Step { local, .. } = &mut lock(&self.core).cmds[self.cmd as usize].kind {
            *local = true;
        }
        self
    }

    /// The step's command counter.
    pub fn cmd(&self) -> u64 {
        self.cmd
    }
}

impl<T: DeserializeOwned> Future for StepFuture<T> {
    type Output = Result<T, StepFailed>;

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        let core = lock(&self.core);
        let c = &core.cmds[self.cmd as usize];
        match &c.outcome {
            None => Poll::Pending,
            Some((_, Err(e))) => Poll::Ready(Err((**e).clone())),
            Some((_, Ok(p))) => Poll::Ready(p.to_value::<T>().map_err(|e| {
                let name = match &c.kind {
                    CmdKind::Step { name, .. } => name.clone(),
                    _ => String::new(),
                };
                StepFailed {
                    name,
                    cmd: self.cmd,
                    attempts: c.attempts,
                    message: format!("recorded output does not match the step's type: {e}"),
                    fatal: true,
                }
            })),
        }
    }
}

impl<T: DeserializeOwned> Durable for StepFuture<T> {
    fn resolved_seq(&self) -> Option<u64> {
        lock(&self.core).cmds[self.cmd as usize]
            .outcome
            .as_ref()
            .map(|(s, _)| *s)
    }
}

/// A durable timer's handle: ready once it fired. Clone it to await it again.
#[derive(Clone)]
#[must_use = "a sleep does nothing unless awaited or raced"]
pub struct Sleep {
    core: SharedCore,
    cmd: u64,
}

impl fmt::Debug for Sleep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sleep").field("cmd", &self.cmd).finish()
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.resolved_seq().is_some() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Durable for Sleep {
    fn resolved_seq(&self) -> Option<u64> {
        lock(&self.core).cmds[self.cmd as usize].fired
    }
}

/// A hook's handle. [`Hook::next`] awaits the next payload.
pub struct Hook<T> {
    core: SharedCore,
    cmd: u64,
    token: String,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for Hook<T> {
    fn clone(&self) -> Self {
        Self {
            core: self.core.clone(),
            cmd: self.cmd,
            token: self.token.clone(),
            _t: PhantomData,
        }
    }
}

impl<T> fmt::Debug for Hook<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hook")
            .field("cmd", &self.cmd)
            .field("token", &self.token)
            .finish()
    }
}

impl<T: DeserializeOwned> Hook<T> {
    /// The token that [`resume_hook`](super::resume_hook) names.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The next payload not yet handed to the body, in journal order. A payload is consumed
    /// only when a `next()` future returns it, so a `next()` that lost a race takes nothing.
    pub fn next(&self) -> HookNext<T> {
        HookNext {
            core: self.core.clone(),
            cmd: self.cmd,
            _t: PhantomData,
        }
    }
}

/// The next payload of a hook; see [`Hook::next`].
#[must_use = "await it to receive the payload"]
pub struct HookNext<T> {
    core: SharedCore,
    cmd: u64,
    _t: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for HookNext<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HookNext").field("cmd", &self.cmd).finish()
    }
}

/// A hook payload that does not match the type the body expects.
#[derive(Debug, thiserror::Error)]
#[error("hook payload does not match the expected type: {0}")]
pub struct PayloadError(#[from] serde_json::Error);

impl<T: DeserializeOwned> Future for HookNext<T> {
    type Output = Result<T, PayloadError>;

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut core = lock(&self.core);
        let c = &mut core.cmds[self.cmd as usize];
        match c.payloads.get(c.consumed) {
            None => Poll::Pending,
            Some((_, p)) => {
                let out = p.to_value::<T>().map_err(PayloadError);
                c.consumed += 1;
                Poll::Ready(out)
            }
        }
    }
}

impl<T: DeserializeOwned> Durable for HookNext<T> {
    fn resolved_seq(&self) -> Option<u64> {
        let core = lock(&self.core);
        let c = &core.cmds[self.cmd as usize];
        c.payloads.get(c.consumed).map(|(s, _)| *s)
    }
}

/// See [`WorkflowCtx::race`].
#[derive(Debug)]
#[must_use = "await the race"]
pub struct Race<A, B> {
    a: A,
    b: B,
}

impl<A: Durable, B: Durable> Future for Race<A, B> {
    type Output = Either<A::Output, B::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let left_wins = match (self.a.resolved_seq(), self.b.resolved_seq()) {
            (None, None) => return Poll::Pending,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(x), Some(y)) => x <= y,
        };
        if left_wins {
            Pin::new(&mut self.a).poll(cx).map(Either::Left)
        } else {
            Pin::new(&mut self.b).poll(cx).map(Either::Right)
        }
    }
}

impl<A: Durable, B: Durable> Durable for Race<A, B> {
    fn resolved_seq(&self) -> Option<u64> {
        match (self.a.resolved_seq(), self.b.resolved_seq()) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        }
    }
}

/// See [`WorkflowCtx::select`].
#[derive(Debug)]
#[must_use = "await the select"]
pub struct Select<D> {
    items: Vec<D>,
}

impl<D: Durable> Future for Select<D> {
    type Output = (usize, D::Output);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let winner = self
            .items
            .iter()
            .enumerate()
            .filter_map(|(i, d)| d.resolved_seq().map(|s| (s, i)))
            .min();
        match winner {
            None => Poll::Pending,
            Some((_, i)) => Pin::new(&mut self.items[i]).poll(cx).map(|o| (i, o)),
        }
    }
}

impl<D: Durable> Durable for Select<D> {
    fn resolved_seq(&self) -> Option<u64> {
        self.items.iter().filter_map(Durable::resolved_seq).min()
    }
}

/// See [`WorkflowCtx::join_all`].
#[derive(Debug)]
#[must_use = "await the join"]
pub struct JoinAll<D> {
    items: Vec<D>,
}

impl<D: Durable> Future for JoinAll<D> {
    type Output = Vec<D::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.items.iter().any(|d| d.resolved_seq().is_none()) {
            return Poll::Pending;
        }
        let mut out = Vec::with_capacity(self.items.len());
        for d in &mut self.items {
            match Pin::new(d).poll(cx) {
                Poll::Ready(o) => out.push(o),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(out)
    }
}

impl<D: Durable> Durable for JoinAll<D> {
    fn resolved_seq(&self) -> Option<u64> {
        let mut max = 0;
        for d in &self.items {
            max = max.max(d.resolved_seq()?);
        }
        Some(max)
    }
}

/// 244 random bits from the OS (two v4 UUIDs), hex: the unguessable part of a webhook URL.
fn new_webhook_token() -> String {
    format!(
        "wh_{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

fn validate_request(r: &InputRequest) -> Result<(), String> {
    if r.prompt.trim().is_empty() {
        return Err("the request needs a non-empty prompt".into());
    }
    let mut seen = HashSet::new();
    for o in &r.options {
        if o.id.is_empty() {
            return Err("an option needs a non-empty id".into());
        }
        if !seen.insert(o.id.as_str()) {
            return Err(format!("option id {:?} appears twice", o.id));
        }
    }
    Ok(())
}

/// A webhook's handle (see [`WorkflowCtx::create_webhook`]): a [`Hook`] with a URL path.
pub struct Webhook<T = WebhookRequest> {
    hook: Hook<T>,
}

impl<T> Clone for Webhook<T> {
    fn clone(&self) -> Self {
        Self {
            hook: self.hook.clone(),
        }
    }
}

impl<T> fmt::Debug for Webhook<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Webhook")
            .field("cmd", &self.hook.cmd)
            .finish()
    }
}

/// The URL path prefix every webhook lives under.
pub const WEBHOOK_PATH: &str = "/.well-known/workflow/v1/webhook/";

impl<T: DeserializeOwned> Webhook<T> {
    /// The token (the last path segment).
    pub fn token(&self) -> &str {
        self.hook.token()
    }

    /// The URL path: `/.well-known/workflow/v1/webhook/{token}`.
    pub fn path(&self) -> String {
        format!("{WEBHOOK_PATH}{}", self.hook.token())
    }

    /// The next delivered request, in journal order.
    pub fn next(&self) -> HookNext<T> {
        self.hook.next()
    }
}

/// An [`WorkflowCtx::ask`] handle: resolves with the answer. Clone it to await it again.
#[derive(Clone)]
#[must_use = "the request is published whether or not it is awaited; await it for the answer"]
pub struct Ask {
    core: SharedCore,
    cmd: u64,
    request_id: RequestId,
}

impl fmt::Debug for Ask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ask")
            .field("cmd", &self.cmd)
            .field("request_id", &self.request_id)
            .finish()
    }
}

impl Ask {
    /// The request id a person answers ([`RequestId::for_command`]: `"{run_id}:{cmd}"`).
    pub fn request_id(&self) -> &RequestId {
        &self.request_id
    }
}

impl Future for Ask {
    type Output = InputResponse;

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<InputResponse> {
        match lock(&self.core).cmds[self.cmd as usize].answer.as_deref() {
            Some((_, r)) => Poll::Ready(r.clone()),
            None => Poll::Pending,
        }
    }
}

impl Durable for Ask {
    fn resolved_seq(&self) -> Option<u64> {
        lock(&self.core).cmds[self.cmd as usize]
            .answer
            .as_deref()
            .map(|(s, _)| *s)
    }
}

/// A [`WorkflowCtx::agent`] handle: resolves with the child's output. Clone it to await it
/// again.
#[derive(Clone)]
#[must_use = "the child is started whether or not it is awaited; await it for its output"]
pub struct Agent {
    core: SharedCore,
    cmd: u64,
    key: String,
}

impl fmt::Debug for Agent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Agent")
            .field("cmd", &self.cmd)
            .field("key", &self.key)
            .finish()
    }
}

impl Agent {
    /// The call's key.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl Future for Agent {
    type Output = Result<serde_json::Value, AgentError>;

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        let core = lock(&self.core);
        let c = &core.cmds[self.cmd as usize];
        let (Some((_, payload)), CmdKind::Agent { call, .. }) = (c.payloads.first(), &c.kind)
        else {
            return Poll::Pending;
        };
        Poll::Ready(super::agent::agent_outcome(call, payload))
    }
}

impl Durable for Agent {
    fn resolved_seq(&self) -> Option<u64> {
        lock(&self.core).cmds[self.cmd as usize]
            .payloads
            .first()
            .map(|(s, _)| *s)
    }
}

/// The run's cancellation signal (see [`WorkflowCtx::abort_signal`]). Ready once a cancel was
/// requested; awaiting it never consumes anything.
#[derive(Clone)]
pub struct AbortSignal {
    core: SharedCore,
}

impl fmt::Debug for AbortSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AbortSignal")
            .field("aborted", &self.is_aborted())
            .finish()
    }
}

impl AbortSignal {
    /// Whether a cancel was requested (as of the journal event being delivered).
    pub fn is_aborted(&self) -> bool {
        lock(&self.core).cancel_seq.is_some()
    }
}

impl Future for AbortSignal {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.is_aborted() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Durable for AbortSignal {
    fn resolved_seq(&self) -> Option<u64> {
        lock(&self.core).cancel_seq
    }
}

/// What a background body receives besides its [`WorkflowCtx`]: the task's own operations.
/// Only background bodies (see [`background_workflow!`](crate::background_workflow)) get one,
/// so `post_message` outside a background run does not compile.
#[derive(Clone)]
pub struct TaskHandle {
    pub(crate) core: SharedCore,
}

impl fmt::Debug for TaskHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskHandle")
            .field("task_id", &lock(&self.core).run_id)
            .finish()
    }
}

impl TaskHandle {
    /// The task id (the background run's id).
    pub fn task_id(&self) -> RunId {
        lock(&self.core).run_id.clone()
    }

    /// Sends a message to the parent agent (`task.message`, which asks for a turn). Recorded in
    /// the journal, so it is sent exactly once even across replays. A message that does not
    /// serialize is a bug in the body: it panics.
    pub fn post_message<T: Serialize + ?Sized>(&self, message: &T) {
        let message = Payload::from_value(message)
            .unwrap_or_else(|e| panic!("task.post_message: the message does not serialize: {e}"));
        lock(&self.core).issue(CmdKind::Message { message });
    }
}
