//! The model-based property test: random sequences of store calls, run against the store (and,
//! when the factory can open a second handle, interleaved across two handles) and against the
//! reference [`Model`]; every outcome and the final journals, records and session logs must
//! agree. Failing sequences shrink to a minimal one and print the seed that reproduces them.
//!
//! Beyond appends, deliveries, leases and sessions, the calls cover what later waves added:
//! approval gates and wire-form agent calls with their answers and re-answers (a different
//! answer to an answered request must be `AlreadyAnswered` and change nothing), run attributes
//! (patches, refused patches, `list_runs` by attribute with a limit), `terminate`, `reset` and
//! `retry` ([`JournalStoreExt`]), and worker locks (`lock_worker`, contract clause 11).

use crate::fixtures::{json, retrying, unique, T0};
use crate::model::{Check, Model};
use crate::{case_count, StoreFactory};
use eve_core::{
    AgentReply, AgentRequest, Append, AppendId, CallId, DeploymentId, Event, Execution,
    InputOption, InputRequest, InputResponse, JournalStore, JournalStoreExt, Lease, NewRun,
    RequestId, Resolution, RunId, RunQuery, RunStatus, SessionId, StoreError, Timestamp, WorkerId,
    WorkflowId,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use std::sync::Arc;
use std::time::Duration;

/// Outcome counts by (call, outcome kind), printed after the run so coverage is visible.
pub type Stats =
    Arc<std::sync::Mutex<std::collections::BTreeMap<(&'static str, &'static str), u32>>>;

/// Lease length the sequences register workers with; `Advance` steps go past it.
const TTL: Duration = Duration::from_secs(30);
/// Shrinking stops after this many re-runs of a failing sequence.
const SHRINK_BUDGET: u32 = 200;
const PAYLOADS: [&str; 3] = ["{\"ok\": true}", "[1,2 , 3]", "\"é\\n\""];

/// One event an append carries; cmds, tokens and times are resolved when it runs.
#[derive(Debug, Clone)]
pub enum Ev {
    /// `StepCompleted`.
    Step(u8),
    /// `StepFailed` with a retry this many 100 ms later.
    Retry(u16),
    /// `StepFailed`, fatal.
    Fatal,
    /// `SleepScheduled` this many 100 ms later.
    Sleep(u16),
    /// `SleepFired` of one of the run's live timers.
    Fire(u8),
    /// `HookCreated` with one of four tokens.
    Hook(u8),
    /// `InputRequested`.
    Ask,
    /// `Progress`.
    Progress(u8),
    /// `MessagePosted`.
    Message,
    /// `RunCompleted`.
    Complete(u8),
    /// `RunFailed`.
    Fail,
    /// `RunCancelled`.
    Cancelled,
    /// `RunBlocked`.
    Block,
    /// `InputWithdrawn` of one of the run's pending requests while it keeps running (a
    /// `Progress` when it has none).
    Withdraw(u8),
    /// `InputRequested` of an approval gate ([`InputRequest::approval`]: options `approve`
    /// and `deny`, no free text).
    Approval,
    /// `InputRequested` of a subagent call (wire form: [`InputRequest::agent`]), with an output
    /// schema when even.
    Agent(u8),
    /// `RunDenied`, with a reason when odd.
    Deny(u8),
    /// `AttributesSet` with one of six patches (overwrites, removals, numbers two ways).
    Attrs(u8),
    /// `AttributesSet` with a nested value: the append is refused with `InvalidInput`.
    BadAttrs,
}

/// The attribute patches `Ev::Attrs` sets: overwrites, removals (`null`), numbers written two
/// ways (`2.0` is `2`).
const PATCHES: [&str; 6] = [
    r#"{"tier": "gold"}"#,
    r#"{"tier": "silver", "n": 1}"#,
    r#"{"n": 2.0}"#,
    r#"{"tier": null}"#,
    r#"{"vip": true, "n": 1}"#,
    r#"{"n": null, "vip": false}"#,
];

/// The attribute equalities `list_runs` queries with (`RunQuery::attribute`).
fn attribute_query(i: u8) -> (String, serde_json::Value) {
    let all = [
        ("tier", serde_json::json!("gold")),
        ("tier", serde_json::json!("silver")),
        ("n", serde_json::json!(1)),
        ("n", serde_json::json!(2)),
        ("vip", serde_json::json!(true)),
        ("vip", serde_json::json!(false)),
    ];
    let (k, v) = &all[i as usize % all.len()];
    ((*k).to_owned(), v.clone())
}

/// Which `expected_seq` an append names.
#[derive(Debug, Clone, Copy)]
pub enum SeqPick {
    /// The journal's next seq.
    Right,
    /// One less (a writer that missed an event).
    Stale,
    /// One more.
    Ahead,
}

/// One store call of a sequence. Indices pick among what exists when the call runs.
#[derive(Debug, Clone)]
pub enum Op {
    /// `create_run`.
    Create {
        /// Session 0 or 1.
        session: u8,
        /// An explicit key, or the default session/call key.
        key: Option<u8>,
        /// Call id (collides with the default key on purpose).
        call: u8,
        /// Input 0 or 1 (a repeated key with another input is a mismatch).
        input: u8,
        /// Background execution.
        background: bool,
        /// Reuse an existing run's id under a fresh key.
        reuse_id: Option<u8>,
        /// Deployment: mostly the workers' one.
        dep: u8,
    },
    /// `append`.
    Append {
        /// Run.
        run: u8,
        /// Write as the run's current owner (a run that has one), not as `worker`.
        owner: bool,
        /// Worker.
        worker: u8,
        /// Use the worker's first (stale) lease.
        stale: bool,
        /// Expected seq.
        seq: SeqPick,
        /// Events.
        events: Vec<Ev>,
    },
    /// Re-send an earlier append verbatim (same append id).
    Retry(u8),
    /// `answer`.
    Answer {
        /// Request.
        req: u8,
        /// Which of the answers for the request's kind (see `responses`): the last one
        /// of each kind is one the request does not accept.
        resp: u8,
    },
    /// `answer` to an answered request (mostly an approval gate): the same answer again
    /// (signed by someone else), or a different one, which must be `AlreadyAnswered` and change
    /// nothing. With nothing answered yet, a first answer to a pending request (a gate first).
    Reanswer {
        /// Request (among the answered ones).
        req: u8,
        /// The recorded answer again, not a different one.
        same: bool,
        /// Which different answer.
        resp: u8,
    },
    /// `terminate` ([`JournalStoreExt::terminate`]) of a run, live or not.
    Terminate(u8),
    /// `reset` ([`JournalStoreExt::reset`]) of a run (mostly an ended one) to a cut.
    Reset {
        /// Run.
        run: u8,
        /// The cut: 1 + this modulo one past the allowed range (so sometimes out of range), or 0.
        to: u8,
        /// The deployment the new run is pinned to.
        dep: u8,
    },
    /// `retry` ([`JournalStoreExt::retry`]) of a run (mostly an ended one).
    RetryRun(u8),
    /// `lock_worker` of worker id 0 or 1 (contract clause 11), kept until `Unlock`; from 128
    /// on, of an id whose lock is held (when one is), which must be refused.
    Lock(u8),
    /// Drops the lock of worker id 0 or 1, if held.
    Unlock(u8),
    /// `deliver_hook`.
    Deliver {
        /// Token.
        token: u8,
        /// Dedupe key.
        key: Option<u8>,
        /// Payload.
        payload: u8,
    },
    /// `request_cancel`.
    Cancel(u8),
    /// `purge` of every run that ended by now (retention, contract clause 9).
    Purge,
    /// `resolve_blocked`.
    Resolve {
        /// Run.
        run: u8,
        /// 0: resume, 1: fail, 2: terminate (any live run).
        how: u8,
    },
    /// `register_worker`.
    Register(u8),
    /// `heartbeat`.
    Heartbeat {
        /// Worker.
        worker: u8,
        /// With its first lease.
        stale: bool,
    },
    /// `claim`.
    Claim {
        /// Worker.
        worker: u8,
        /// Max runs.
        max: u8,
        /// With its first lease.
        stale: bool,
    },
    /// `release`.
    Release {
        /// Release as the run's current owner (a run that has one), not as `worker`.
        owner: bool,
        /// Worker.
        worker: u8,
        /// Run.
        run: u8,
        /// 0: next seq, 1: zero, 2: past the end.
        processed: u8,
        /// With its first lease.
        stale: bool,
    },
    /// `retire_worker`.
    Retire(u8),
    /// Advance the simulated clock.
    Advance(u32),
    /// Set the clock back this many ms: the next writers' and deliveries' `now` goes backwards
    /// (a skewed clock).
    Skew(u16),
    /// `end_session` of session 0, 1 or 2 (2 has no runs).
    EndSession(u8),
    /// `queue_message` to session 0, 1 or 2.
    Queue {
        /// Session.
        session: u8,
        /// Message.
        msg: u8,
    },
    /// `take_messages` of session 0, 1 or 2.
    Take(u8),
    /// `read`.
    Read {
        /// Run.
        run: u8,
        /// 0: start, 1: middle, 2: end, 3: past the end.
        from: u8,
        /// 0, 1, 2 or 1000.
        max: u8,
    },
    /// Two calls at once (when both are writes that can race: create, append, retry, answer,
    /// deliver, cancel, claim; otherwise one after the other).
    Pair(Box<Op>, Box<Op>),
    /// A query: 0 list_runs, 1 pending_requests, 2 read_session, 3 get_run, 4 next_wake,
    /// 5 get_session, 6 list_runs by an attribute alone.
    Query {
        /// Which.
        kind: u8,
        /// First argument.
        a: u8,
        /// Second argument.
        b: u8,
    },
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        4 => any::<u8>().prop_map(Ev::Step),
        2 => (1..400u16).prop_map(Ev::Retry),
        1 => Just(Ev::Fatal),
        2 => (1..400u16).prop_map(Ev::Sleep),
        2 => any::<u8>().prop_map(Ev::Fire),
        3 => any::<u8>().prop_map(Ev::Hook),
        3 => Just(Ev::Ask),
        1 => any::<u8>().prop_map(Ev::Progress),
        1 => Just(Ev::Message),
        1 => prop_oneof![any::<u8>().prop_map(Ev::Complete), Just(Ev::Fail), Just(Ev::Cancelled)],
        1 => Just(Ev::Block),
        1 => any::<u8>().prop_map(Ev::Withdraw),
        4 => Just(Ev::Approval),
        2 => any::<u8>().prop_map(Ev::Agent),
        1 => any::<u8>().prop_map(Ev::Deny),
        4 => any::<u8>().prop_map(Ev::Attrs),
        1 => prop::bool::weighted(0.3).prop_map(|bad| if bad { Ev::BadAttrs } else { Ev::Attrs(0) }),
    ]
}

fn seq_pick() -> impl Strategy<Value = SeqPick> {
    prop_oneof![6 => Just(SeqPick::Right), 1 => Just(SeqPick::Stale), 1 => Just(SeqPick::Ahead)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..2u8, prop::option::of(0..3u8), 0..3u8, 0..2u8, any::<bool>(), prop::option::weighted(0.1, any::<u8>()), any::<u8>())
            .prop_map(|(session, key, call, input, background, reuse_id, dep)| Op::Create { session, key, call, input, background, reuse_id, dep }),
        8 => (any::<u8>(), prop::bool::weighted(0.8), 0..3u8, prop::bool::weighted(0.15), seq_pick(), vec(ev(), 1..4))
            .prop_map(|(run, owner, worker, stale, seq, events)| Op::Append { run, owner, worker, stale, seq, events }),
        // A run's owner asks (an approval gate, a subagent call, a question) or labels it: the
        // requests and attributes the answers, re-answers and queries below need.
        3 => (any::<u8>(), 0..2u8, 0..4u8, any::<u8>()).prop_map(|(run, worker, kind, p)| Op::Append {
            run,
            owner: true,
            worker,
            stale: false,
            seq: SeqPick::Right,
            events: vec![match kind {
                0 | 1 => Ev::Approval,
                2 => Ev::Agent(p),
                _ => Ev::Attrs(p),
            }],
        }),
        1 => any::<u8>().prop_map(Op::Retry),
        3 => (any::<u8>(), any::<u8>()).prop_map(|(req, resp)| Op::Answer { req, resp }),
        3 => (any::<u8>(), any::<bool>(), any::<u8>()).prop_map(|(req, same, resp)| Op::Reanswer { req, same, resp }),
        1 => any::<u8>().prop_map(Op::Terminate),
        2 => (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(run, to, dep)| Op::Reset { run, to, dep }),
        1 => any::<u8>().prop_map(Op::RetryRun),
        2 => prop_oneof![2 => any::<u8>().prop_map(Op::Lock), 1 => (0..2u8).prop_map(Op::Unlock)],
        4 => (0..8u8, prop::option::of(0..3u8), 0..3u8).prop_map(|(token, key, payload)| Op::Deliver { token, key, payload }),
        1 => any::<u8>().prop_map(Op::Cancel),
        1 => Just(Op::Purge),
        1 => (any::<u8>(), 0u8..3).prop_map(|(run, how)| Op::Resolve { run, how }),
        1 => (0..3u8).prop_map(Op::Register),
        2 => (0..3u8, prop::bool::weighted(0.2)).prop_map(|(worker, stale)| Op::Heartbeat { worker, stale }),
        4 => (0..3u8, 1..4u8, prop::bool::weighted(0.15)).prop_map(|(worker, max, stale)| Op::Claim { worker, max, stale }),
        2 => (prop::bool::weighted(0.7), 0..3u8, any::<u8>(), 0..3u8, prop::bool::weighted(0.15))
            .prop_map(|(owner, worker, run, processed, stale)| Op::Release { owner, worker, run, processed, stale }),
        1 => (0..3u8).prop_map(Op::Retire),
        2 => prop_oneof![4 => 0..8_000u32, 1 => 8_000..40_000u32].prop_map(Op::Advance),
        1 => (any::<u8>(), 0..4u8, 0..4u8).prop_map(|(run, from, max)| Op::Read { run, from, max }),
        3 => (0..6u8, any::<u8>(), any::<u8>()).prop_map(|(kind, a, b)| Op::Query { kind, a, b }),
        2 => (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Op::Query { kind: 6, a, b }),
        1 => (1..2_000u16).prop_map(Op::Skew),
        1 => (0..3u8).prop_map(Op::EndSession),
        2 => (0..3u8, 0..3u8).prop_map(|(session, msg)| Op::Queue { session, msg }),
        1 => (0..3u8).prop_map(Op::Take),
    ]
}

/// The strategy for whole sequences: `(handle, call)` pairs.
pub fn sequence() -> impl Strategy<Value = Vec<(u8, Op)>> {
    let item = prop_oneof![
        8 => op(),
        2 => (op(), op()).prop_map(|(a, b)| Op::Pair(Box::new(a), Box::new(b))),
    ];
    vec((any::<u8>(), item), 1..40)
}

/// The answers [`Op::Answer`] picks from for a request of this kind (`None`: an unknown
/// request): the last one is never accepted.
fn responses(request: Option<&InputRequest>) -> Vec<InputResponse> {
    let with = |option: &str, text: &str| InputResponse {
        option_id: Some(option.into()),
        text: Some(text.into()),
        ..InputResponse::default()
    };
    let reply = |reply: AgentReply| InputResponse {
        agent: Some(reply),
        ..InputResponse::default()
    };
    match request {
        Some(r) if r.approval.is_some() => vec![
            InputResponse::option(eve_core::event::APPROVE),
            InputResponse::option(eve_core::event::DENY),
            with(eve_core::event::DENY, "too risky"),
            with(eve_core::event::APPROVE, "fine"),
            InputResponse::text("free"),
        ],
        Some(r) if r.agent.is_some() => vec![
            reply(AgentReply::Output(serde_json::json!({"answer": 42}))),
            reply(AgentReply::Output(serde_json::json!("no answer field"))),
            reply(AgentReply::Error("the child failed".into())),
            InputResponse::option("yes"),
        ],
        _ => vec![
            InputResponse::option("yes"),
            InputResponse::option("no"),
            InputResponse::text("free"),
            InputResponse::option("maybe"),
        ],
    }
}

/// The name an answer is counted under in the statistics: `call` for a plain ask, with
/// `(approval)` or `(agent)` for those requests.
fn answer_label(request: Option<&InputRequest>, call: &'static str) -> &'static str {
    let approval = request.is_some_and(|r| r.approval.is_some());
    let agent = request.is_some_and(|r| r.agent.is_some());
    match (call, approval, agent) {
        ("answer", true, _) => "answer(approval)",
        ("answer", _, true) => "answer(agent)",
        ("reanswer:same", true, _) => "reanswer:same(approval)",
        ("reanswer:same", _, true) => "reanswer:same(agent)",
        ("reanswer:different", true, _) => "reanswer:different(approval)",
        ("reanswer:different", _, true) => "reanswer:different(agent)",
        _ => call,
    }
}

/// A call's arguments, built before it runs (so two can run at once).
#[derive(Debug, Clone)]
enum Call {
    Create(NewRun),
    Append(Append),
    /// The request, the answer, and the call's name in the statistics (by the request's kind).
    Answer(RequestId, InputResponse, &'static str),
    Deliver(String, eve_core::Payload, Option<String>),
    Cancel(RunId),
    Claim(Lease, usize),
}

/// What the store answered to a [`Call`].
enum Outcome {
    Create(Result<eve_core::CreatedRun, StoreError>),
    Append(Result<eve_core::Appended, StoreError>),
    Delivered(&'static str, Result<eve_core::Delivered, StoreError>),
    Cancel(Result<eve_core::CancelOutcome, StoreError>),
    Claim(Result<Vec<eve_core::RunRecord>, StoreError>),
}

const CANCEL_REASON: &str = "sequence";

/// Runs a call, retrying transient (retryable) faults as a client would.
async fn exec(st: &dyn JournalStore, call: &Call, now: Timestamp) -> Outcome {
    match call {
        Call::Create(new) => Outcome::Create(retrying(|| st.create_run(new.clone(), now)).await),
        Call::Append(a) => Outcome::Append(retrying(|| st.append(a.clone())).await),
        Call::Answer(id, resp, label) => {
            Outcome::Delivered(label, retrying(|| st.answer(id, resp.clone(), now)).await)
        }
        Call::Deliver(token, payload, key) => Outcome::Delivered(
            "deliver_hook",
            retrying(|| st.deliver_hook(token, payload.clone(), key.as_deref(), now)).await,
        ),
        Call::Cancel(run) => {
            Outcome::Cancel(retrying(|| st.request_cancel(run, CANCEL_REASON, now)).await)
        }
        Call::Claim(lease, max) => Outcome::Claim(retrying(|| st.claim(lease, *max, now)).await),
    }
}

fn check(model: &mut Model, call: &Call, out: &Outcome, now: Timestamp) -> Check {
    match (call, out) {
        (Call::Create(new), Outcome::Create(r)) => model.check_create(new, now, r),
        (Call::Append(a), Outcome::Append(r)) => model.check_append(
            &a.run,
            a.expected_seq,
            &a.lease,
            &a.append_id,
            &a.events,
            a.now,
            r,
        ),
        (Call::Answer(id, resp, _), Outcome::Delivered(_, r)) => {
            model.check_answer(id, resp, now, r)
        }
        (Call::Deliver(token, payload, key), Outcome::Delivered(_, r)) => {
            model.check_deliver(token, payload, key.as_deref(), now, r)
        }
        (Call::Cancel(run), Outcome::Cancel(r)) => model.check_cancel(run, CANCEL_REASON, now, r),
        (Call::Claim(lease, max), Outcome::Claim(r)) => model.check_claim(lease, *max, now, r),
        _ => unreachable!("exec answers each call with its own outcome"),
    }
}

struct Harness {
    handles: Vec<Arc<dyn JournalStore>>,
    model: Model,
    now: Timestamp,
    prefix: String,
    made: u32,
    leases: [Vec<Lease>; 3],
    sent: Vec<Append>,
    cmd: u64,
    stats: Stats,
    /// Worker locks held (contract clause 11), by worker index.
    locks: std::collections::BTreeMap<u8, eve_core::WorkerLock>,
}

impl Harness {
    fn dep(&self, i: u8) -> DeploymentId {
        DeploymentId::new(format!("{}-d{}", self.prefix, i % 2))
    }

    fn worker_id(&self, w: u8) -> WorkerId {
        WorkerId::new(format!("{}-w{w}", self.prefix))
    }

    /// Workers 0 and 1 serve deployment 0, worker 2 deployment 1.
    fn worker_dep(&self, w: u8) -> DeploymentId {
        self.dep(u8::from(w == 2))
    }

    fn lease(&self, w: u8, stale: bool) -> Lease {
        let all = &self.leases[w as usize % 3];
        let pick = if stale { all.first() } else { all.last() };
        pick.cloned().unwrap_or_else(|| Lease {
            worker: self.worker_id(w),
            deployment: self.worker_dep(w),
            epoch: 0,
            expires_at: self.now,
        })
    }

    fn run(&self, i: u8) -> RunId {
        let runs = self.model.runs();
        if runs.is_empty() || i % 16 == 15 {
            RunId::new(format!("{}-unknown", self.prefix))
        } else {
            runs[i as usize % runs.len()].clone()
        }
    }

    /// A run that has an owner whose lease this harness holds, and that lease.
    fn owned(&self, i: u8) -> Option<(RunId, Lease)> {
        let owned: Vec<(RunId, Lease)> = self
            .model
            .runs()
            .iter()
            .filter_map(|id| {
                let (w, e) = self.model.record(id)?.owner.clone()?;
                let lease = self
                    .leases
                    .iter()
                    .filter_map(|all| all.last())
                    .find(|l| l.worker == w && l.epoch == e)?;
                Some((id.clone(), lease.clone()))
            })
            .collect();
        (!owned.is_empty()).then(|| owned[i as usize % owned.len()].clone())
    }

    fn token(&self, t: u8) -> String {
        format!("{}-t{}", self.prefix, t % 4)
    }

    fn session(&self, s: u8) -> SessionId {
        SessionId::new(format!("{}-s{}", self.prefix, s % 2))
    }

    /// Session 0, 1 (where runs start) or 2 (where none does).
    fn any_session(&self, s: u8) -> SessionId {
        SessionId::new(format!("{}-s{}", self.prefix, s % 3))
    }

    fn event(&mut self, run: &RunId, e: &Ev) -> Event {
        self.cmd += 1;
        let cmd = self.cmd;
        let later = |n: u16| self.now.plus(Duration::from_millis(u64::from(n) * 100));
        match e {
            Ev::Step(p) => Event::StepCompleted {
                cmd,
                name: format!("s{cmd}"),
                attempt: 1,
                output: json(PAYLOADS[*p as usize % 3]),
            },
            Ev::Retry(d) => Event::StepFailed {
                cmd,
                name: format!("s{cmd}"),
                attempt: 1,
                error: "flaky".into(),
                fatal: false,
                retry_at: Some(later(*d)),
            },
            Ev::Fatal => Event::StepFailed {
                cmd,
                name: format!("s{cmd}"),
                attempt: 2,
                error: "fatal".into(),
                fatal: true,
                retry_at: None,
            },
            Ev::Sleep(d) => Event::SleepScheduled {
                cmd,
                wake_at: later(*d),
            },
            Ev::Fire(i) => {
                let timers = self.model.timers(run);
                let cmd = if timers.is_empty() {
                    cmd
                } else {
                    timers[*i as usize % timers.len()]
                };
                Event::SleepFired { cmd }
            }
            Ev::Hook(t) => Event::HookCreated {
                cmd,
                token: self.token(*t),
                webhook: t % 2 == 0,
                respond_with: None,
            },
            Ev::Ask => {
                let opt = |id: &str| InputOption {
                    id: id.into(),
                    label: id.into(),
                    description: None,
                    style: None,
                };
                Event::InputRequested {
                    cmd,
                    request_id: RequestId::for_command(run, cmd),
                    request: InputRequest {
                        prompt: format!("q{cmd}"),
                        display: eve_core::Display::Select,
                        options: vec![opt("yes"), opt("no")],
                        allow_freeform: cmd % 2 == 0,
                        agent: None,
                        approval: None,
                    },
                }
            }
            Ev::Progress(p) => Event::Progress {
                cmd,
                value: json(PAYLOADS[*p as usize % 3]),
            },
            Ev::Message => Event::MessagePosted {
                cmd,
                message: json("\"msg\""),
            },
            Ev::Complete(p) => Event::RunCompleted {
                output: json(PAYLOADS[*p as usize % 3]),
            },
            Ev::Fail => Event::RunFailed {
                error: "failed".into(),
            },
            Ev::Cancelled => Event::RunCancelled,
            Ev::Block => Event::RunBlocked {
                reason: "[EVE-TEST] blocked".into(),
            },
            Ev::Approval => Event::InputRequested {
                cmd,
                request_id: RequestId::for_command(run, cmd),
                request: InputRequest::approval("seq_tool", serde_json::json!({"a": cmd})),
            },
            Ev::Agent(k) => Event::InputRequested {
                cmd,
                request_id: RequestId::for_command(run, cmd),
                request: InputRequest {
                    prompt: format!("agent {cmd}"),
                    display: eve_core::Display::Agent,
                    options: Vec::new(),
                    allow_freeform: false,
                    approval: None,
                    agent: Some(AgentRequest {
                        key: format!("k{cmd}"),
                        target: "researcher".into(),
                        message: serde_json::json!({"topic": cmd}),
                        agent_id: None,
                        output_schema: (k % 2 == 0)
                            .then(|| serde_json::json!({"type": "object", "required": ["answer"]})),
                    }),
                },
            },
            Ev::Deny(r) => Event::RunDenied {
                reason: if r % 2 == 1 {
                    "too risky".into()
                } else {
                    String::new()
                },
            },
            Ev::Attrs(p) => Event::AttributesSet {
                cmd,
                attributes: json(PATCHES[*p as usize % PATCHES.len()]),
            },
            Ev::BadAttrs => Event::AttributesSet {
                cmd,
                attributes: json(r#"{"nested": {"x": 1}}"#),
            },
            Ev::Withdraw(i) => {
                let pending = self.model.pending_of(run);
                if pending.is_empty() {
                    Event::Progress {
                        cmd,
                        value: json("0"),
                    }
                } else {
                    Event::InputWithdrawn {
                        request_id: pending[*i as usize % pending.len()].clone(),
                    }
                }
            }
        }
    }

    /// Mostly an ended run (what a reset or retry starts from), sometimes any run.
    fn ended_run(&self, i: u8) -> RunId {
        let ended: Vec<RunId> = self
            .model
            .runs()
            .iter()
            .filter(|id| {
                self.model
                    .record(id)
                    .is_some_and(|r| r.status.is_terminal())
            })
            .cloned()
            .collect();
        if i % 5 != 0 && !ended.is_empty() {
            ended[i as usize % ended.len()].clone()
        } else {
            self.run(i)
        }
    }

    fn note<T>(&self, call: &'static str, r: &Result<T, eve_core::StoreError>) {
        let outcome = r.as_ref().err().map_or("Ok", crate::model::kind);
        *self
            .stats
            .lock()
            .expect("stats lock")
            .entry((call, outcome))
            .or_default() += 1;
    }

    /// Builds the arguments of a call that may run concurrently with another; `None` for the
    /// other calls (and a retry with nothing sent yet).
    fn prepare(&mut self, op: &Op) -> Option<Call> {
        let now = self.now;
        match op {
            Op::Create {
                session,
                key,
                call,
                input,
                background,
                reuse_id,
                dep,
            } => {
                self.made += 1;
                let mut run_id = RunId::new(format!("{}-r{:04}", self.prefix, self.made));
                let mut idempotency_key = key.map(|k| format!("{}-k{k}", self.prefix));
                if let Some(i) = reuse_id {
                    if !self.model.runs().is_empty() {
                        run_id = self.run(*i % 15);
                        idempotency_key = Some(format!("{}-fresh{}", self.prefix, self.made));
                    }
                }
                let new = NewRun {
                    run_id,
                    idempotency_key,
                    workflow_id: WorkflowId::new("seq::workflow"),
                    deployment_id: self.dep(u8::from(dep % 4 == 3)),
                    tool: "seq_tool".into(),
                    input: json(if *input == 0 {
                        "{\"a\": 1}"
                    } else {
                        "{\"a\":2}"
                    }),
                    session_id: self.session(*session),
                    call_id: CallId::new(format!("c{call}")),
                    execution: if *background {
                        Execution::Background
                    } else {
                        Execution::Default
                    },
                    traceparent: None,
                    reset_from: None,
                };
                Some(Call::Create(new))
            }
            Op::Append {
                run,
                owner,
                worker,
                stale,
                seq,
                events,
            } => {
                let (run, lease) = match self.owned(*run).filter(|_| *owner) {
                    Some(found) => found,
                    None => (self.run(*run), self.lease(*worker, *stale)),
                };
                let next = self.model.record(&run).map_or(1, |r| r.next_seq);
                let expected_seq = match seq {
                    SeqPick::Right => next,
                    SeqPick::Stale => next.saturating_sub(1),
                    SeqPick::Ahead => next + 1,
                };
                let events: Vec<Event> = events.iter().map(|e| self.event(&run, e)).collect();
                let a = Append {
                    run: run.clone(),
                    expected_seq,
                    lease,
                    append_id: AppendId::new(unique("append")),
                    events,
                    now,
                };
                self.sent.push(a.clone());
                Some(Call::Append(a))
            }
            Op::Retry(i) => (!self.sent.is_empty())
                .then(|| Call::Append(self.sent[*i as usize % self.sent.len()].clone())),
            Op::Answer { req, resp } => {
                let pending = self.model.pending_ids();
                // Half the time a pending approval gate, when there is one.
                let gates: Vec<RequestId> = pending
                    .iter()
                    .filter(|id| self.model.request(id).is_some_and(|r| r.approval.is_some()))
                    .cloned()
                    .collect();
                let reqs = if req % 2 == 1 && !gates.is_empty() {
                    gates
                } else if req % 4 != 0 && !pending.is_empty() {
                    pending
                } else {
                    self.model.requests().to_vec()
                };
                let id = if reqs.is_empty() || req % 10 == 9 {
                    RequestId::new(format!("{}-unknown-request", self.prefix))
                } else {
                    reqs[*req as usize % reqs.len()].clone()
                };
                let all = responses(self.model.request(&id));
                let response = all[*resp as usize % all.len()].clone();
                let label = answer_label(self.model.request(&id), "answer");
                Some(Call::Answer(id, response, label))
            }
            Op::Reanswer { req, same, resp } => {
                let mut answered = self.model.answered();
                // Mostly an approval when one was answered: its answer decides the whole call.
                let approvals: Vec<(RequestId, InputResponse)> = answered
                    .iter()
                    .filter(|(id, _)| self.model.request(id).is_some_and(|r| r.approval.is_some()))
                    .cloned()
                    .collect();
                if req % 3 != 0 && !approvals.is_empty() {
                    answered = approvals;
                }
                if answered.is_empty() {
                    // Nothing answered yet: answer a pending request (a gate when there is
                    // one) with an answer it accepts, for a later re-answer to meet.
                    let pending = self.model.pending_ids();
                    let gate = pending
                        .iter()
                        .find(|id| self.model.request(id).is_some_and(|r| r.approval.is_some()));
                    let id = gate.or(pending.first())?.clone();
                    let all = responses(self.model.request(&id));
                    let response = all[*resp as usize % (all.len() - 1)].clone();
                    let label = answer_label(self.model.request(&id), "answer");
                    return Some(Call::Answer(id, response, label));
                }
                let (id, recorded) = answered[*req as usize % answered.len()].clone();
                let response = if *same {
                    recorded.by(format!("someone-{resp}"))
                } else {
                    let different: Vec<InputResponse> = responses(self.model.request(&id))
                        .into_iter()
                        .filter(|r| !r.same_answer(&recorded))
                        .collect();
                    different[*resp as usize % different.len()].clone()
                };
                let label = answer_label(
                    self.model.request(&id),
                    if *same {
                        "reanswer:same"
                    } else {
                        "reanswer:different"
                    },
                );
                Some(Call::Answer(id, response, label))
            }
            Op::Deliver {
                token,
                key,
                payload,
            } => {
                let live = self.model.live_tokens();
                let token = if *token != 0 && !live.is_empty() {
                    live[*token as usize % live.len()].clone()
                } else {
                    self.token(*token)
                };
                let key = key.map(|k| format!("dk{k}"));
                let payload = json(PAYLOADS[*payload as usize % 3]);
                Some(Call::Deliver(token, payload, key))
            }
            Op::Cancel(run) => Some(Call::Cancel(self.run(*run))),
            Op::Claim { worker, max, stale } => {
                Some(Call::Claim(self.lease(*worker, *stale), *max as usize))
            }
            _ => None,
        }
    }

    /// Before an append as a run's owner: when nothing is held, claim first, as a worker would;
    /// for one run index in four, claim more anyway, so the owners' writes spread over more
    /// runs than the oldest one (attributes on several runs, requests in several).
    async fn preclaim(&mut self, st: &dyn JournalStore, op: &Op) -> Check {
        if let Op::Append {
            run,
            owner: true,
            worker,
            ..
        } = op
        {
            if self.owned(*run).is_none() || run % 4 == 3 {
                let lease = self.lease(*worker, false);
                let r = st.claim(&lease, 1, self.now).await;
                self.note("claim", &r);
                self.model.check_claim(&lease, 1, self.now, &r)?;
            }
        }
        Ok(())
    }

    /// Two calls at once, on two handles when there are two: the outcomes must match one of
    /// the two serial orders.
    async fn pair(&mut self, handle: u8, a: &Op, b: &Op) -> Check {
        let n = self.handles.len();
        let (s1, s2) = (
            Arc::clone(&self.handles[handle as usize % n]),
            Arc::clone(&self.handles[(handle as usize + 1) % n]),
        );
        self.preclaim(&*s1, a).await?;
        self.preclaim(&*s2, b).await?;
        let (Some(ca), Some(cb)) = (self.prepare(a), self.prepare(b)) else {
            self.step(handle, a).await?;
            return self.step(handle.wrapping_add(1), b).await;
        };
        let now = self.now;
        let (ra, rb) = tokio::join!(exec(&*s1, &ca, now), exec(&*s2, &cb, now));
        self.note_outcome(&ca, &ra);
        self.note_outcome(&cb, &rb);
        let mut m1 = self.model.clone();
        let ab = check(&mut m1, &ca, &ra, now).and_then(|()| check(&mut m1, &cb, &rb, now));
        let mut m2 = self.model.clone();
        let ba = check(&mut m2, &cb, &rb, now).and_then(|()| check(&mut m2, &ca, &ra, now));
        match (ab.is_ok(), ba.is_ok()) {
            (true, true) => {
                // The outcomes fit both orders (two appends to different runs of one session,
                // say); the session logs show which order the store took.
                let first_then_second = self.session_logs_match(&m1, &*s1).await;
                self.model = if first_then_second { m1 } else { m2 };
                return Ok(());
            }
            (true, false) => {
                self.model = m1;
                return Ok(());
            }
            (false, true) => {
                self.model = m2;
                return Ok(());
            }
            (false, false) => {}
        }
        if matches!((&ca, &cb), (Call::Claim(..), Call::Claim(..))) {
            // Racing claims may split the claimable runs between them (conditional per-run
            // claims on DynamoDB, SKIP LOCKED on Postgres): accept either order with short claims.
            for first_a in [true, false] {
                let mut m = self.model.clone();
                m.set_contended_claims(true);
                let (c1, r1, c2, r2) = if first_a {
                    (&ca, &ra, &cb, &rb)
                } else {
                    (&cb, &rb, &ca, &ra)
                };
                if check(&mut m, c1, r1, now)
                    .and_then(|()| check(&mut m, c2, r2, now))
                    .is_ok()
                {
                    m.set_contended_claims(false);
                    self.model = m;
                    return Ok(());
                }
            }
        }
        Err(format!(
            "concurrent calls match no serial order\n  first then second: {}\n  second then first: {}",
            ab.unwrap_err(),
            ba.unwrap_err()
        ))
    }

    /// Whether the store's session logs equal `model`'s (the final check compares them again).
    async fn session_logs_match(&self, model: &Model, st: &dyn JournalStore) -> bool {
        for s in 0..2 {
            let s = self.session(s);
            match st.read_session(&s, 0, 100_000).await {
                Ok(log) if log.as_slice() == model.session_log(&s) => {}
                _ => return false,
            }
        }
        true
    }

    fn note_outcome(&self, call: &Call, out: &Outcome) {
        let _ = call;
        match out {
            Outcome::Create(r) => self.note("create_run", r),
            Outcome::Append(r) => self.note("append", r),
            Outcome::Delivered(name, r) => self.note(name, r),
            Outcome::Cancel(r) => self.note("request_cancel", r),
            Outcome::Claim(r) => self.note("claim", r),
        }
    }

    async fn step(&mut self, handle: u8, op: &Op) -> Check {
        let store = Arc::clone(&self.handles[handle as usize % self.handles.len()]);
        let st = &*store;
        let now = self.now;
        match op {
            Op::Create { .. }
            | Op::Append { .. }
            | Op::Retry(_)
            | Op::Answer { .. }
            | Op::Reanswer { .. }
            | Op::Deliver { .. }
            | Op::Cancel(_)
            | Op::Claim { .. } => {
                self.preclaim(st, op).await?;
                let Some(call) = self.prepare(op) else {
                    return Ok(());
                };
                let out = exec(st, &call, now).await;
                self.note_outcome(&call, &out);
                check(&mut self.model, &call, &out, now)
            }
            Op::Pair(a, b) => Box::pin(self.pair(handle, a, b)).await,
            Op::Resolve { run, how } => {
                let blocked: Vec<RunId> = self
                    .model
                    .runs()
                    .iter()
                    .filter(|id| {
                        self.model
                            .record(id)
                            .is_some_and(|r| r.status == RunStatus::Blocked)
                    })
                    .cloned()
                    .collect();
                let run = if run % 4 != 0 && !blocked.is_empty() {
                    blocked[*run as usize % blocked.len()].clone()
                } else {
                    self.run(*run)
                };
                let res = match how {
                    0 => Resolution::Resume,
                    1 => Resolution::Fail {
                        error: "operator".into(),
                    },
                    _ => Resolution::Terminate {
                        reason: "runaway".into(),
                        by: "operator".into(),
                    },
                };
                let r = st.resolve_blocked(&run, res.clone(), now).await;
                self.note("resolve_blocked", &r);
                self.model.check_resolve(&run, &res, now, &r)
            }
            Op::Terminate(run) => {
                let run = self.run(*run);
                let r = st.terminate(&run, "runaway", "operator", now).await;
                self.note("terminate", &r);
                self.model
                    .check_terminate(&run, "runaway", "operator", now, &r)
            }
            Op::Reset { run, to, dep } => {
                let run = self.ended_run(*run);
                let limit = self.model.reset_limit(&run).unwrap_or(1);
                let to = match to {
                    0 => 0,
                    t => 1 + u64::from(*t) % (limit + 1),
                };
                if self.model.reset_clashes(&run, Some(to)) {
                    return Ok(());
                }
                let dep = self.dep(u8::from(dep % 4 == 3));
                let r = st.reset(&run, to, &dep, now).await;
                self.note("reset", &r);
                self.model.check_reset(&run, Some(to), &dep, now, &r)
            }
            Op::RetryRun(run) => {
                let run = self.ended_run(*run);
                if self.model.reset_clashes(&run, None) {
                    return Ok(());
                }
                let dep = self.dep(0);
                let r = st.retry(&run, &dep, now).await;
                self.note("retry", &r);
                self.model.check_reset(&run, None, &dep, now, &r)
            }
            Op::Lock(w) => {
                let held: Vec<u8> = self.locks.keys().copied().collect();
                let w = &if *w >= 128 && !held.is_empty() {
                    held[*w as usize % held.len()]
                } else {
                    w % 2
                };
                let id = self.worker_id(*w);
                let r = st.lock_worker(&id).await;
                self.note("lock_worker", &r);
                self.model.check_lock(&id, &r)?;
                if let Ok(lock) = r {
                    self.locks.insert(*w, lock);
                }
                Ok(())
            }
            Op::Unlock(w) => {
                if self.locks.remove(w).is_some() {
                    self.model.unlock(&self.worker_id(*w));
                }
                Ok(())
            }
            Op::Register(w) => {
                let (id, dep) = (self.worker_id(*w), self.worker_dep(*w));
                let r = st.register_worker(&id, &dep, TTL, now).await;
                self.note("register_worker", &r);
                self.model.check_register(&id, &dep, TTL, now, &r)?;
                self.leases[*w as usize % 3].push(r.expect("checked"));
                Ok(())
            }
            Op::Heartbeat { worker, stale } => {
                let lease = self.lease(*worker, *stale);
                let r = st.heartbeat(&lease, TTL, now).await;
                self.note("heartbeat", &r);
                self.model.check_heartbeat(&lease, TTL, now, &r)?;
                if let Ok(l) = r {
                    if let Some(last) = self.leases[*worker as usize % 3]
                        .iter_mut()
                        .rev()
                        .find(|x| x.epoch == l.epoch)
                    {
                        *last = l;
                    }
                }
                Ok(())
            }
            Op::Release {
                owner,
                worker,
                run,
                processed,
                stale,
            } => {
                if *owner && self.owned(*run).is_none() {
                    // Nothing is held: claim first, as a worker would before appending.
                    let lease = self.lease(*worker, false);
                    let r = st.claim(&lease, 1, now).await;
                    self.note("claim", &r);
                    self.model.check_claim(&lease, 1, now, &r)?;
                }
                let (run, lease) = match self.owned(*run).filter(|_| *owner) {
                    Some(found) => found,
                    None => (self.run(*run), self.lease(*worker, *stale)),
                };
                let next = self.model.record(&run).map_or(1, |r| r.next_seq);
                let p = match processed {
                    0 => next,
                    1 => 0,
                    _ => next + 5,
                };
                let r = st.release(&lease, &run, p, now).await;
                self.note("release", &r);
                self.model.check_release(&lease, &run, p, now, &r)
            }
            Op::Retire(w) => {
                let lease = self.lease(*w, false);
                let r = st.retire_worker(&lease, now).await;
                self.note("retire_worker", &r);
                self.model.check_retire(&lease, now, &r)
            }
            Op::Purge => {
                let cutoff = now.plus(Duration::from_millis(1));
                let r = st.purge(cutoff, 0).await;
                self.note("purge", &r);
                self.model.check_purge(cutoff, &r)
            }
            Op::Advance(ms) => {
                self.now = self.now.plus(Duration::from_millis(u64::from(*ms)));
                Ok(())
            }
            Op::Skew(ms) => {
                self.now = Timestamp(self.now.0 - i64::from(*ms));
                Ok(())
            }
            Op::EndSession(i) => {
                let session = self.any_session(*i);
                let r = st.end_session(&session, now).await;
                self.note("end_session", &r);
                self.model.check_end_session(&session, now, &r)
            }
            Op::Queue { session, msg } => {
                let session = self.any_session(*session);
                let message = json(PAYLOADS[*msg as usize % 3]);
                let r = st.queue_message(&session, message.clone(), now).await;
                self.note("queue_message", &r);
                self.model.check_queue(&session, &message, now, &r)
            }
            Op::Take(i) => {
                let session = self.any_session(*i);
                let r = st.take_messages(&session).await;
                self.note("take_messages", &r);
                self.model.check_take(&session, &r)
            }
            Op::Read { run, from, max } => {
                let run = self.run(*run);
                let len = self.model.journal(&run).map_or(0, |j| j.len() as u64);
                let from = match from {
                    0 => 0,
                    1 => len / 2,
                    2 => len,
                    _ => len + 1,
                };
                let max = [0, 1, 2, 1000][*max as usize % 4];
                let r = st.read(&run, from, max).await;
                self.note("read", &r);
                self.model.check_read(&run, from, max, &r)
            }
            Op::Query { kind, a, b } => match kind {
                0 => {
                    let statuses = [
                        RunStatus::Running,
                        RunStatus::Blocked,
                        RunStatus::Completed,
                        RunStatus::Failed,
                        RunStatus::Cancelled,
                    ];
                    let q = RunQuery {
                        session: (a % 3 != 2).then(|| self.session(*a)),
                        status: (b % 6 != 5).then(|| statuses[*b as usize % 6 % 5]),
                        deployment: (a % 5 == 4).then(|| self.dep(0)),
                        attribute: (a % 7 >= 4).then(|| attribute_query(a / 7)),
                        limit: (*b as usize / 64) % 3,
                    };
                    let r = st.list_runs(&q).await;
                    self.note("list_runs", &r);
                    self.model.check_list(&q, &r)
                }
                1 => {
                    let s = self.session(*a);
                    let r = st.pending_requests(&s).await;
                    self.note("pending_requests", &r);
                    self.model.check_pending(&s, &r)
                }
                2 => {
                    let s = self.session(*a);
                    let (from, max) = (u64::from(b % 4), [0, 1, 3, 100][*b as usize / 4 % 4]);
                    let r = st.read_session(&s, from, max).await;
                    self.note("read_session", &r);
                    self.model.check_read_session(&s, from, max, &r)
                }
                3 => {
                    let run = self.run(*a);
                    let r = st.get_run(&run).await;
                    self.note("get_run", &r);
                    self.model.check_get(&run, &r)
                }
                6 => {
                    // The attribute index alone, often with a limit: the limit counts matches.
                    // Mostly a value some run other than the oldest holds, so that a limit
                    // applied before the filter would miss it.
                    let held: Vec<(String, serde_json::Value)> = self
                        .model
                        .runs()
                        .iter()
                        .skip(1)
                        .filter_map(|id| self.model.record(id))
                        .flat_map(|r| r.attributes.clone())
                        .collect();
                    let attribute = if a % 4 != 0 && !held.is_empty() {
                        held[*a as usize % held.len()].clone()
                    } else {
                        attribute_query(*a)
                    };
                    let q = RunQuery {
                        attribute: Some(attribute),
                        limit: [1, 1, 2, 0][*b as usize % 4],
                        ..RunQuery::default()
                    };
                    let r = st.list_runs(&q).await;
                    self.note("list_runs(attribute)", &r);
                    self.model.check_list(&q, &r)
                }
                5 => {
                    let session = self.any_session(*a);
                    let r = st.get_session(&session).await;
                    self.note("get_session", &r);
                    self.model.check_get_session(&session, &r)
                }
                _ => {
                    let dep = self.dep(*a);
                    let r = st.next_wake(&dep, now).await;
                    self.note("next_wake", &r);
                    self.model.check_next_wake(&dep, now, &r)
                }
            },
        }
    }

    /// After the sequence: every journal, record, session log and session record (its end and
    /// queue, which outlive `purge`), read through every handle.
    async fn final_check(&self) -> Check {
        for (h, st) in self.handles.iter().enumerate() {
            for run in self.model.runs() {
                let j = st
                    .read_all(run, 0)
                    .await
                    .map_err(|e| format!("final read of {run} (handle {h}): {e}"))?;
                let want = self.model.journal(run).expect("model run");
                if j != want {
                    return Err(format!("final journal of {run} (handle {h}) differs\n  store: {j:?}\n  model: {want:?}"));
                }
                self.model
                    .check_get(run, &st.get_run(run).await)
                    .map_err(|e| format!("final (handle {h}): {e}"))?;
            }
            for s in 0..2 {
                let s = self.session(s);
                let log = st.read_session(&s, 0, 100_000).await;
                self.model
                    .check_read_session(&s, 0, 100_000, &log)
                    .map_err(|e| format!("final (handle {h}): {e}"))?;
                self.model
                    .check_pending(&s, &st.pending_requests(&s).await)
                    .map_err(|e| format!("final (handle {h}): {e}"))?;
            }
            for s in 0..3 {
                let s = self.any_session(s);
                self.model
                    .check_get_session(&s, &st.get_session(&s).await)
                    .map_err(|e| format!("final (handle {h}): {e}"))?;
            }
            self.model
                .check_list(
                    &RunQuery::default(),
                    &st.list_runs(&RunQuery::default()).await,
                )
                .map_err(|e| format!("final (handle {h}): {e}"))?;
        }
        Ok(())
    }
}

/// Runs one sequence on a fresh store; `Err` says which call broke the contract and how.
pub async fn run_sequence(factory: &dyn StoreFactory, ops: &[(u8, Op)], stats: Stats) -> Check {
    let opened = factory
        .create()
        .await
        .map_err(|e| format!("StoreFactory::create failed: {e}"))?;
    let mut handles = vec![Arc::clone(&opened.store)];
    if let Some(second) = factory
        .open(&opened.location)
        .await
        .map_err(|e| format!("StoreFactory::open failed: {e}"))?
    {
        handles.push(second);
    }
    let mut h = Harness {
        handles,
        model: Model::default(),
        now: T0,
        prefix: unique("seq"),
        made: 0,
        leases: Default::default(),
        sent: Vec::new(),
        cmd: 0,
        stats,
        locks: Default::default(),
    };
    // Every sequence starts with its workers registered and two runs, so that the random calls
    // mostly meet a store with something in it.
    let preamble = [Op::Register(0), Op::Register(1), Op::Register(2)]
        .into_iter()
        .chain((0..2).map(|i| Op::Create {
            session: i,
            key: None,
            call: i,
            input: 0,
            background: i == 1,
            reuse_id: None,
            dep: 0,
        }));
    for op in preamble {
        h.step(0, &op)
            .await
            .map_err(|e| format!("preamble call {op:?}: {e}"))?;
    }
    for (i, (handle, op)) in ops.iter().enumerate() {
        h.step(*handle, op).await.map_err(|e| {
            format!(
                "call #{i} {op:?} on handle {}: {e}",
                *handle as usize % h.handles.len()
            )
        })?;
    }
    h.final_check().await
}

fn seed_from_env() -> u64 {
    match std::env::var("EVE_CONFORMANCE_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("EVE_CONFORMANCE_SEED={s:?} is not a u64 seed")),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32)
        }
    }
}

/// [`case_count`] random call sequences match the reference model; shrinks and prints the seed
/// (`EVE_CONFORMANCE_SEED`) on failure.
pub async fn random_sequences_match_model(factory: &dyn StoreFactory) {
    let seed = seed_from_env();
    let cases = case_count();
    println!(
        "store sequences: {cases} cases, seed {seed} (EVE_CONFORMANCE_SEED={seed} replays them)"
    );
    if let Err(why) = check_sequences(factory, cases, seed).await {
        panic!("{why}");
    }
}

/// Runs `cases` random call sequences from `seed` against fresh stores of `factory` and the
/// model. `Err` holds the shrunk failing sequence, the seed and what went wrong.
///
/// # Errors
/// The first sequence that broke the contract, shrunk.
pub async fn check_sequences(factory: &dyn StoreFactory, cases: u32, seed: u64) -> Check {
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(
            &(seed
                .wrapping_add(i as u64)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .to_le_bytes(),
        );
    }
    // Proptest's value trees are not `Send`, so generation and shrinking run on their own
    // thread and hand each sequence to this task, which runs it on the store.
    let (to_runner, mut sequences) = tokio::sync::mpsc::unbounded_channel::<(u32, Vec<(u8, Op)>)>();
    let (to_generator, verdicts) = std::sync::mpsc::channel::<bool>();
    let generator = std::thread::spawn(move || {
        let mut runner = TestRunner::new_with_rng(
            Config::default(),
            TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
        );
        let strategy = sequence();
        let run = |case: u32, ops: Vec<(u8, Op)>| -> Option<bool> {
            to_runner.send((case, ops)).ok()?;
            verdicts.recv().ok()
        };
        for case in 0..cases {
            let mut tree = strategy
                .new_tree(&mut runner)
                .expect("generate a call sequence");
            match run(case, tree.current()) {
                Some(true) => continue,
                Some(false) => {}
                None => return,
            }
            let mut budget = SHRINK_BUDGET;
            if !tree.simplify() {
                return;
            }
            while budget > 0 {
                budget -= 1;
                match run(case, tree.current()) {
                    Some(false) if tree.simplify() => {}
                    Some(true) if tree.complicate() => {}
                    _ => return,
                }
            }
            return;
        }
    });
    let stats = Stats::default();
    let mut failure = None;
    while let Some((case, ops)) = sequences.recv().await {
        let result = run_sequence(factory, &ops, Arc::clone(&stats)).await;
        let passed = result.is_ok();
        if let Err(why) = result {
            failure = Some((case, ops, why));
        }
        if to_generator.send(passed).is_err() {
            break;
        }
    }
    generator
        .join()
        .expect("the sequence generator thread panicked");
    let stats = stats.lock().expect("stats lock");
    let summary: Vec<String> = stats
        .iter()
        .map(|((call, outcome), n)| format!("{call}:{outcome}={n}"))
        .collect();
    println!("store sequences: outcomes {}", summary.join(" "));
    if let Some((case, best, why)) = failure {
        return Err(format!(
            "store call sequence {case} of {cases} broke the contract (seed {seed}; rerun with EVE_CONFORMANCE_SEED={seed}).\n\
             Shrunk to {} calls ((handle, call) pairs):\n{best:#?}\n{why}",
            best.len()
        ));
    }
    Ok(())
}
