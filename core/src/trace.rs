//! Traces: one OpenTelemetry-shaped trace per tool call, kept across waits, restarts and
//! processes.
//!
//! A run joins its caller's trace when the call carried a W3C `traceparent` (the start route's
//! header, MCP's `_meta.traceparent`), or starts its own. The context is kept as the
//! `traceparent` of [`Event::RunStarted`], so whichever process
//! resumes the run continues the same trace.
//!
//! # Spans
//! - `execute_tool {tool}`: the whole run, from `RunStarted` to its end (the OpenTelemetry
//!   GenAI convention's name and `gen_ai.*` attributes); a child of the caller's span.
//! - `activation`: one per activation (a claim of the run by a worker, until it suspends or
//!   ends).
//! - `step {name}`: one per step attempt, with its attempt number, outcome and retry delay.
//! - `ask`, `approval`, `agent {target}`, `hook`, `webhook`, `sleep`: one per wait, from the
//!   request to its answer or delivery (who answered), even days later in another process.
//! - `cancel`: from the cancel request to the run's end, with its reason and grace deadline.
//!
//! # Ids and exactly-once emission
//! Span ids are derived (SHA-256) from the run id and the command: the run, the command counter
//! and the attempt, the activation number. A span is reported to the [`TraceSink`] when it ends,
//! from the journal event that ends it, by the worker that delivers that event for the first
//! time: events it appends itself, and deliveries by others (answers, hook payloads, cancels)
//! written after the run was last processed. Replayed history is never reported again, so a
//! replayed or resumed run continues its spans and reports each once. (A worker that dies after
//! reporting a delivery's span and before it records anything more reports nothing else; the
//! next activation may report that one span again, with the same id.)
//!
//! The engine has no OpenTelemetry dependency: `eve-cli` exports to OTLP with its `OtlpSink`.

use crate::event::{Event, StoredEvent};
use crate::ids::RunId;
use crate::time::Timestamp;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// A 16-byte W3C trace id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceId(pub [u8; 16]);

/// An 8-byte W3C span id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpanId(pub [u8; 8]);

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        hex(f, &self.0)
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        hex(f, &self.0)
    }
}

fn hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    for b in bytes {
        write!(f, "{b:02x}")?;
    }
    Ok(())
}

/// A W3C trace context: which trace a span belongs to and which span is the parent of the
/// next one. [`Display`](fmt::Display) writes the `traceparent` header value
/// (`00-{trace id}-{span id}-{flags}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceContext {
    /// The trace.
    pub trace_id: TraceId,
    /// The span the next one is a child of.
    pub span_id: SpanId,
    /// The trace flags; bit 0 is "sampled".
    pub flags: u8,
}

impl TraceContext {
    /// Parses a `traceparent` header value (W3C Trace Context level 1): version `00` exactly
    /// as specified, a later version by its first four fields; all-zero ids and upper-case hex
    /// are invalid. `None` for anything malformed: a caller's bad header never fails a call,
    /// the run starts its own trace instead.
    pub fn parse(value: &str) -> Option<Self> {
        let v = value.trim().as_bytes();
        if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
            return None;
        }
        let version = unhex::<1>(&v[0..2])?[0];
        if version == 0xff
            || (version == 0 && v.len() != 55)
            || (version != 0 && v.len() > 55 && v[55] != b'-')
        {
            return None;
        }
        let trace_id = TraceId(unhex::<16>(&v[3..35])?);
        let span_id = SpanId(unhex::<8>(&v[36..52])?);
        let flags = unhex::<1>(&v[53..55])?[0];
        if trace_id.0 == [0; 16] || span_id.0 == [0; 8] {
            return None;
        }
        Some(TraceContext {
            trace_id,
            span_id,
            flags,
        })
    }

    /// Whether the caller sampled the trace (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            self.trace_id, self.span_id, self.flags
        )
    }
}

/// Lower-case hex only, as the W3C grammar says.
fn unhex<const N: usize>(s: &[u8]) -> Option<[u8; N]> {
    if s.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = digit(s[2 * i])? << 4 | digit(s[2 * i + 1])?;
    }
    Some(out)
}

/// An attribute value of a [`Span`].
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
}

impl From<&str> for AttrValue {
    fn from(v: &str) -> Self {
        AttrValue::Str(v.to_owned())
    }
}
impl From<String> for AttrValue {
    fn from(v: String) -> Self {
        AttrValue::Str(v)
    }
}
impl From<i64> for AttrValue {
    fn from(v: i64) -> Self {
        AttrValue::Int(v)
    }
}
impl From<bool> for AttrValue {
    fn from(v: bool) -> Self {
        AttrValue::Bool(v)
    }
}

/// How a span ended (OpenTelemetry's span status).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpanStatus {
    /// Nothing to say.
    Unset,
    /// It failed, with a description.
    Error(String),
}

/// A finished span, as the engine reports it to a [`TraceSink`].
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    /// The trace.
    pub trace_id: TraceId,
    /// The span's own id, derived from the run and the command.
    pub span_id: SpanId,
    /// The parent span: the run's root span, or for the root the caller's span (`None` when
    /// the call carried no `traceparent`).
    pub parent_span_id: Option<SpanId>,
    /// The caller's trace flags (sampled unless the caller said otherwise).
    pub flags: u8,
    /// The span's name.
    pub name: String,
    /// When it started.
    pub start: Timestamp,
    /// When it ended.
    pub end: Timestamp,
    /// Attributes, OpenTelemetry semantic-convention keys where one exists, `eve.*` otherwise.
    pub attributes: Vec<(&'static str, AttrValue)>,
    /// Error or unset.
    pub status: SpanStatus,
}

impl Span {
    /// The attribute `key`, if set.
    pub fn attr(&self, key: &str) -> Option<&AttrValue> {
        self.attributes
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }
}

/// Where a worker reports finished spans ([`Worker::trace_to`](crate::engine::Worker::trace_to)).
///
/// # Contract
/// `export` is called on the worker's task as a span ends: it must not block (queue the span
/// and export in the background, as OpenTelemetry's batch processor does).
pub trait TraceSink: fmt::Debug + Send + Sync + 'static {
    /// Takes one finished span.
    fn export(&self, span: Span);
}

/// A [`TraceSink`] that keeps every span in memory, for tests.
#[derive(Debug, Default, Clone)]
pub struct CollectingSink {
    spans: Arc<Mutex<Vec<Span>>>,
}

impl CollectingSink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// The spans reported so far, in report order.
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl TraceSink for CollectingSink {
    fn export(&self, span: Span) {
        self.spans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(span);
    }
}

/// The derived id of one of a run's spans: SHA-256 over the run id, what the span is and two
/// numbers (a command and an attempt, an activation). The same in every process and release.
pub fn derive_span_id(run: &RunId, what: &str, a: u64, b: u64) -> SpanId {
    let d = digest(run, what, a, b);
    let mut id = [0u8; 8];
    id.copy_from_slice(&d[..8]);
    if id == [0; 8] {
        id[7] = 1;
    }
    SpanId(id)
}

fn digest(run: &RunId, what: &str, a: u64, b: u64) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(run.as_str().as_bytes());
    h.update([0]);
    h.update(what.as_bytes());
    h.update([0]);
    h.update(a.to_le_bytes());
    h.update(b.to_le_bytes());
    h.finalize().into()
}

/// The trace context of a run: the caller's, when it sent a valid `traceparent`, else a trace
/// of the run's own (its id derived from the run id), and the run's root span.
pub fn run_context(run: &RunId, traceparent: Option<&str>) -> (TraceContext, Option<SpanId>) {
    let root = derive_span_id(run, "run", 0, 0);
    match traceparent.and_then(TraceContext::parse) {
        Some(caller) => (
            TraceContext {
                span_id: root,
                ..caller
            },
            Some(caller.span_id),
        ),
        None => {
            let d = digest(run, "trace", 0, 0);
            let mut id = [0u8; 16];
            id.copy_from_slice(&d[..16]);
            (
                TraceContext {
                    trace_id: TraceId(id),
                    span_id: root,
                    flags: 1,
                },
                None,
            )
        }
    }
}

/// The span id of a step attempt.
pub fn step_span_id(run: &RunId, cmd: u64, attempt: u32) -> SpanId {
    derive_span_id(run, "step", cmd, u64::from(attempt))
}

/// What a wait is.
#[derive(Clone, Debug)]
enum WaitKind {
    Sleep,
    Hook {
        webhook: bool,
    },
    Ask {
        request_id: String,
        kind: &'static str,
    },
    Agent {
        key: String,
        target: String,
    },
}

#[derive(Clone, Debug)]
struct OpenWait {
    kind: WaitKind,
    start: Timestamp,
}

/// One run's trace state inside an executor: the open spans (from journal times, so a resumed
/// run knows when its waits began) and the finished ones not reported yet.
#[derive(Debug)]
pub(crate) struct RunTrace {
    run: RunId,
    ctx: TraceContext,
    caller: Option<SpanId>,
    tool: String,
    call_id: String,
    session_id: String,
    started: Timestamp,
    /// Whether spans are recorded at all (a sink is set); off, nothing is kept.
    pub(crate) on: bool,
    /// Events at or past this seq end spans this worker reports.
    pub(crate) report_from: u64,
    waits: HashMap<u64, OpenWait>,
    /// The command of each open ask, by request id.
    asks: HashMap<String, u64>,
    /// The command of each open host-form agent call, by key.
    agents: HashMap<String, u64>,
    /// Step attempts started by this process, by command: (attempt, start).
    steps: HashMap<u64, (u32, Timestamp)>,
    /// When a step's next attempt is due (from its last failure).
    retry_due: HashMap<u64, Timestamp>,
    cancel: Option<(Timestamp, String)>,
    grace_at: Option<Timestamp>,
    /// When the run ended, once its end event was seen.
    ended_at: Option<Timestamp>,
    /// Finished spans not reported yet: reported once their events are in the journal.
    pub(crate) done: Vec<Span>,
}

impl RunTrace {
    /// The trace of the run `first` (its `RunStarted`) starts.
    pub(crate) fn new(run: &RunId, first: &StoredEvent) -> Self {
        let (mut tool, mut call_id, mut session_id, mut tp) =
            (String::new(), String::new(), String::new(), None);
        if let Event::RunStarted {
            tool: t,
            call_id: c,
            session_id: s,
            traceparent,
            ..
        } = &first.event
        {
            tool.clone_from(t);
            call_id = c.to_string();
            session_id = s.to_string();
            tp = traceparent.as_deref();
        }
        let (ctx, caller) = run_context(run, tp);
        Self {
            run: run.clone(),
            ctx,
            caller,
            tool,
            call_id,
            session_id,
            started: first.at,
            on: false,
            report_from: 0,
            waits: HashMap::new(),
            asks: HashMap::new(),
            agents: HashMap::new(),
            steps: HashMap::new(),
            retry_due: HashMap::new(),
            cancel: None,
            grace_at: None,
            ended_at: None,
            done: Vec::new(),
        }
    }

    /// The run's context: its trace and its root span.
    pub(crate) fn context(&self) -> TraceContext {
        self.ctx
    }

    /// The context a step attempt's outgoing calls carry: the attempt's span.
    pub(crate) fn step_context(&self, cmd: u64, attempt: u32) -> TraceContext {
        TraceContext {
            span_id: step_span_id(&self.run, cmd, attempt),
            ..self.ctx
        }
    }

    /// A step attempt starts in this process now.
    pub(crate) fn step_started(&mut self, cmd: u64, attempt: u32, now: Timestamp) {
        if self.on {
            self.steps.insert(cmd, (attempt, now));
        }
    }

    fn span(&self, span_id: SpanId, name: String, start: Timestamp, end: Timestamp) -> Span {
        Span {
            trace_id: self.ctx.trace_id,
            span_id,
            parent_span_id: Some(self.ctx.span_id),
            flags: self.ctx.flags,
            name,
            start,
            end: end.max(start),
            attributes: vec![("eve.run.id", AttrValue::Str(self.run.to_string()))],
            status: SpanStatus::Unset,
        }
    }

    /// An activation of this process ended: the one that claimed the run at journal length
    /// `at_seq` as its `n`-th claim without progress (the pair names it among the run's).
    pub(crate) fn activation(
        &mut self,
        at_seq: u64,
        n: u32,
        start: Timestamp,
        end: Timestamp,
        outcome: &str,
    ) {
        if !self.on {
            return;
        }
        // The activation that ended the run closes within it (its cleanup after the end
        // event is not part of the run).
        let end = self.ended_at.map_or(end, |e| end.min(e));
        let mut s = self.span(
            derive_span_id(&self.run, "activation", at_seq, u64::from(n)),
            "activation".into(),
            start.min(end),
            end,
        );
        s.attributes
            .push(("eve.activation.from_seq", (at_seq as i64).into()));
        s.attributes
            .push(("eve.activation.outcome", outcome.into()));
        self.done.push(s);
    }

    fn open(&mut self, cmd: u64, kind: WaitKind, at: Timestamp) {
        self.waits.insert(cmd, OpenWait { kind, start: at });
    }

    /// Closes the wait of `cmd` at `end` (reported when `report`).
    fn close(&mut self, cmd: u64, end: Timestamp, report: bool, outcome: &str, by: Option<&str>) {
        let Some(w) = self.waits.remove(&cmd) else {
            return;
        };
        if !report {
            return;
        }
        let (name, kind) = match &w.kind {
            WaitKind::Sleep => ("sleep".to_owned(), "sleep"),
            WaitKind::Hook { webhook: true } => ("webhook".to_owned(), "webhook"),
            WaitKind::Hook { webhook: false } => ("hook".to_owned(), "hook"),
            WaitKind::Ask { kind, .. } => ((*kind).to_owned(), *kind),
            WaitKind::Agent { target, .. } => (format!("agent {target}"), "agent"),
        };
        let mut s = self.span(
            derive_span_id(&self.run, "wait", cmd, 0),
            name,
            w.start,
            end,
        );
        s.attributes.push(("eve.cmd", (cmd as i64).into()));
        s.attributes.push(("eve.wait.kind", kind.into()));
        s.attributes.push(("eve.wait.outcome", outcome.into()));
        match &w.kind {
            WaitKind::Ask { request_id, .. } => {
                s.attributes
                    .push(("eve.request.id", request_id.clone().into()));
            }
            WaitKind::Agent { key, target } => {
                s.attributes
                    .push(("gen_ai.agent.name", target.clone().into()));
                s.attributes.push(("eve.agent.key", key.clone().into()));
            }
            _ => {}
        }
        if let Some(by) = by {
            s.attributes.push(("eve.answered_by", by.to_owned().into()));
        }
        self.done.push(s);
    }

    /// Takes in a delivered event: opens or closes spans, and queues those that end at an event
    /// this worker reports.
    pub(crate) fn observe(&mut self, ev: &StoredEvent) {
        self.observe_at(ev.seq, ev.at, &ev.event);
    }

    /// [`observe`](Self::observe) of `event` recorded at `seq` and `at`.
    pub(crate) fn observe_at(&mut self, seq: u64, at: Timestamp, event: &Event) {
        if !self.on {
            return;
        }
        let report = seq >= self.report_from;
        match event {
            Event::StepCompleted {
                cmd, name, attempt, ..
            } => {
                self.step_ended(*cmd, name, *attempt, at, report, None);
            }
            Event::StepFailed {
                cmd,
                name,
                attempt,
                error,
                fatal,
                retry_at,
            } => {
                self.step_ended(
                    *cmd,
                    name,
                    *attempt,
                    at,
                    report,
                    Some((error, *fatal, *retry_at)),
                );
            }
            Event::SleepScheduled { cmd, wake_at } => {
                if *cmd == crate::engine::GRACE_CMD {
                    self.grace_at = Some(*wake_at);
                } else if *cmd != crate::engine::GUARD_CMD {
                    self.open(*cmd, WaitKind::Sleep, at);
                }
            }
            Event::SleepFired { cmd } => self.close(*cmd, at, report, "fired", None),
            Event::HookCreated { cmd, webhook, .. } => {
                self.open(*cmd, WaitKind::Hook { webhook: *webhook }, at);
            }
            Event::HookReceived { cmd, .. } => self.close(*cmd, at, report, "received", None),
            Event::InputRequested {
                cmd,
                request_id,
                request,
            } => {
                let kind = if request.approval.is_some() {
                    "approval"
                } else if request.agent.is_some() {
                    "agent"
                } else {
                    "ask"
                };
                self.asks.insert(request_id.to_string(), *cmd);
                self.open(
                    *cmd,
                    WaitKind::Ask {
                        request_id: request_id.to_string(),
                        kind,
                    },
                    at,
                );
            }
            Event::InputAnswered {
                request_id,
                response,
            } => {
                if let Some(cmd) = self.asks.remove(request_id.as_str()) {
                    self.close(cmd, at, report, "answered", response.answered_by.as_deref());
                }
            }
            Event::InputWithdrawn { request_id } => {
                if let Some(cmd) = self.asks.remove(request_id.as_str()) {
                    self.close(cmd, at, report, "withdrawn", None);
                }
            }
            Event::AgentStarted {
                cmd, key, target, ..
            } => {
                self.agents.insert(key.clone(), *cmd);
                self.open(
                    *cmd,
                    WaitKind::Agent {
                        key: key.clone(),
                        target: target.clone(),
                    },
                    at,
                );
            }
            Event::AgentCompleted { key, .. } => {
                if let Some(cmd) = self.agents.remove(key) {
                    self.close(cmd, at, report, "completed", None);
                }
            }
            Event::AgentFailed { key, .. } => {
                if let Some(cmd) = self.agents.remove(key) {
                    self.close(cmd, at, report, "failed", None);
                }
            }
            Event::CancelRequested { reason } => self.cancel = Some((at, reason.clone())),
            e @ (Event::RunCompleted { .. }
            | Event::RunFailed { .. }
            | Event::RunCancelled
            | Event::RunDenied { .. }
            | Event::RunTerminated { .. }) => self.ended(e, at, report),
            _ => {}
        }
    }

    fn step_ended(
        &mut self,
        cmd: u64,
        name: &str,
        attempt: u32,
        at: Timestamp,
        report: bool,
        failed: Option<(&String, bool, Option<Timestamp>)>,
    ) {
        let ran_here = self.steps.remove(&cmd).filter(|(a, _)| *a == attempt);
        let due = self.retry_due.remove(&cmd);
        if let Some((_, _, Some(retry_at))) = failed {
            self.retry_due.insert(cmd, retry_at);
        }
        if !report {
            return;
        }
        let start = ran_here.map(|(_, t)| t).or(due).unwrap_or(at);
        let mut s = self.span(
            step_span_id(&self.run, cmd, attempt),
            format!("step {name}"),
            start,
            at,
        );
        s.attributes.push(("eve.cmd", (cmd as i64).into()));
        s.attributes.push(("eve.step.name", name.to_owned().into()));
        s.attributes
            .push(("eve.step.attempt", i64::from(attempt).into()));
        match failed {
            None => s.attributes.push(("eve.step.outcome", "ok".into())),
            Some((error, fatal, retry_at)) => {
                let outcome = match retry_at {
                    Some(_) => "retry",
                    None if fatal => "fatal",
                    None => "failed",
                };
                s.attributes.push(("eve.step.outcome", outcome.into()));
                if let Some(r) = retry_at {
                    s.attributes
                        .push(("eve.step.retry_delay_ms", (r.0 - at.0).into()));
                }
                s.attributes.push(("error.type", "step_error".into()));
                s.status = SpanStatus::Error(error.clone());
            }
        }
        self.done.push(s);
    }

    fn ended(&mut self, terminal: &Event, at: Timestamp, report: bool) {
        self.ended_at = Some(at);
        // Waits still open end with the run (a hook never delivered, a sleep cut short).
        let open: Vec<u64> = self.waits.keys().copied().collect();
        for cmd in open {
            self.close(cmd, at, report, "run ended", None);
        }
        if !report {
            return;
        }
        if let Some((start, reason)) = self.cancel.take() {
            let mut s = self.span(
                derive_span_id(&self.run, "cancel", 0, 0),
                "cancel".into(),
                start,
                at,
            );
            s.attributes.push(("eve.cancel.reason", reason.into()));
            if let Some(g) = self.grace_at {
                s.attributes
                    .push(("eve.cancel.grace_ms", (g.0 - start.0).into()));
                s.attributes
                    .push(("eve.cancel.grace_expired", (at >= g).into()));
            }
            self.done.push(s);
        }
        let mut root = self.span(
            self.ctx.span_id,
            format!("execute_tool {}", self.tool),
            self.started,
            at,
        );
        root.parent_span_id = self.caller;
        root.attributes.extend([
            ("gen_ai.operation.name", "execute_tool".into()),
            ("gen_ai.tool.name", self.tool.clone().into()),
            ("gen_ai.tool.call.id", self.call_id.clone().into()),
            ("session.id", self.session_id.clone().into()),
        ]);
        let outcome = match terminal {
            Event::RunCompleted { .. } => "completed",
            Event::RunFailed { error } => {
                root.status = SpanStatus::Error(error.clone());
                root.attributes.push(("error.type", "run_failed".into()));
                "failed"
            }
            Event::RunCancelled => "cancelled",
            Event::RunTerminated { reason, by } => {
                root.status = SpanStatus::Error(Event::terminated_error(reason, by));
                root.attributes
                    .push(("error.type", "run_terminated".into()));
                root.attributes
                    .push(("eve.terminated_by", by.clone().into()));
                "terminated"
            }
            _ => "denied",
        };
        root.attributes.push(("eve.run.outcome", outcome.into()));
        self.done.push(root);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_and_bad_values_are_none() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let c = TraceContext::parse(tp).unwrap();
        assert_eq!(c.to_string(), tp);
        assert!(c.sampled());
        assert_eq!(c.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        // A later version may append fields.
        assert!(TraceContext::parse(&format!("01{}-extra", &tp[2..])).is_some());
        for bad in [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad:?}");
        }
    }
}
