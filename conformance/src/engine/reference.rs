//! The reference interpreter: what must happen when a [`Program`] runs, computed without any
//! store, engine or clock.
//!
//! It walks the program the way the generic body does and numbers commands the way the engine
//! does (one `cmd` per ctx call: a step, a sleep, a hook), so it predicts the run's final status
//! and output, every step's attempts and results, the command sequence a replay must re-issue,
//! every await of the body and where the run parks (waiting on a sleep or a delivery).

use super::program::{digest, Node, Program, StepSpec};
use eve_core::engine::StepFailed;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::VecDeque;

/// How the driver delivers one scripted hook payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeliveryMode {
    /// Once, without a dedupe key.
    Once,
    /// Once, with a dedupe key.
    Keyed,
    /// Twice in a row with the same dedupe key: one event; the second call is a duplicate.
    KeyedTwice,
    /// Once with a key, and again with the same key at the next park point or at the end (a
    /// webhook retried late): still one event.
    KeyedRetryLater,
    /// Twice without a key: two events (delivery without a key is at-least-once); the body
    /// receives the payload twice.
    UnkeyedTwice,
}

impl DeliveryMode {
    /// Events the deliveries of one payload write.
    pub fn copies(self) -> usize {
        match self {
            DeliveryMode::UnkeyedTwice => 2,
            _ => 1,
        }
    }
}

/// A command the body issues, in `cmd` order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// `ctx.step(name, ..)`.
    Step(String),
    /// `ctx.sleep(..)`.
    Sleep,
    /// `ctx.create_hook(token)`, by token suffix.
    Hook(String),
    /// `ctx.ask(..)`.
    Ask,
    /// `ctx.progress(value)`, by the value's [`digest`].
    Progress(String),
    /// `ctx.agent(..)`, by key.
    Agent(String),
    /// `task.post_message(value)`, by the value's [`digest`].
    Message(String),
}

/// How the driver answers one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AnswerMode {
    /// Once.
    Once,
    /// Twice with the same answer: the second is a duplicate success.
    SameTwice,
    /// Then again with another answer: refused with `AlreadyAnswered`.
    OtherSecond,
}

/// One scripted answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The ask's command.
    pub cmd: u64,
    /// The answer's text.
    pub text: String,
    /// How it is delivered.
    pub mode: AnswerMode,
}

/// One scripted delivery, in the order the driver makes them.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery {
    /// The hook's token suffix.
    pub token: String,
    /// The payload.
    pub payload: Value,
    /// How it is delivered.
    pub mode: DeliveryMode,
}

/// One attempt of a step, as the journal must record it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// `StepFailed`; `retried` when a later attempt follows (`retry_at` set).
    Failed {
        /// Not retried because fatal.
        fatal: bool,
        /// Another attempt follows.
        retried: bool,
    },
    /// `StepCompleted` with an output of this [`digest`].
    Completed(String),
}

/// A step the run executes, with its attempts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepRecord {
    /// Its command counter.
    pub cmd: u64,
    /// Its name.
    pub name: String,
    /// Attempts 1, 2, … in order.
    pub attempts: Vec<Attempt>,
}

/// One await of the body, in the order the body awaits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Await {
    /// A step or a join: parks only while a retry backoff runs.
    Steps(Vec<u64>),
    /// A sleep.
    Sleep {
        /// Its command.
        cmd: u64,
    },
    /// `hook.next()` with `consumed` payloads of that hook received before.
    Hook {
        /// The hook's command.
        cmd: u64,
        /// Token suffix.
        token: String,
        /// Payloads the body took from this hook before.
        consumed: usize,
        /// The delivery (an index into [`Expected::deliveries`]) the run parks for; `None` when
        /// an earlier duplicate already satisfies this await.
        delivery: Option<usize>,
    },
    /// An ask, answered by [`Expected::answers`]`[answer]`.
    Ask {
        /// The ask's command.
        cmd: u64,
        /// The answer.
        answer: usize,
    },
    /// A race of an ask against a sleep.
    RaceAsk {
        /// The ask's command.
        ask: u64,
        /// The sleep's command.
        sleep: u64,
        /// The answer that wins it, if the ask wins.
        answer: Option<usize>,
    },
    /// An agent call (the scripted host replies at once: never parks).
    Agent {
        /// Its command.
        cmd: u64,
    },
    /// A race of a hook against a sleep.
    Race {
        /// The hook's command.
        hook: u64,
        /// The sleep's command.
        sleep: u64,
        /// Token suffix.
        token: String,
        /// The delivery that wins it, if the hook wins.
        delivery: Option<usize>,
    },
}

impl Await {
    /// Whether the run parks here waiting for the clock or a delivery (not just a retry).
    pub fn parks(&self) -> bool {
        match self {
            Await::Steps(_) | Await::Agent { .. } => false,
            Await::Sleep { .. }
            | Await::Race { .. }
            | Await::Ask { .. }
            | Await::RaceAsk { .. } => true,
            Await::Hook { delivery, .. } => delivery.is_some(),
        }
    }
}

/// How the run must end.
#[derive(Clone, Debug, PartialEq)]
pub enum End {
    /// `RunCompleted` with this output.
    Completed(Value),
    /// `RunFailed` with this error (a step's failure escaped the body).
    Failed(String),
    /// `RunCancelled` (a cancel request was delivered).
    Cancelled,
}

/// Everything the reference predicts for one program and delivery plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Expected {
    /// The commands the body issues, by `cmd`.
    pub commands: Vec<Command>,
    /// Where in the program each command comes from (indices into nested bodies; a join's
    /// step adds its index in the join).
    pub paths: Vec<Vec<usize>>,
    /// The steps executed, in `cmd` order.
    pub steps: Vec<StepRecord>,
    /// The body's awaits, in order.
    pub awaits: Vec<Await>,
    /// Commands issued when each await begins.
    pub issued: Vec<usize>,
    /// Await positions where the run parks on a sleep or a delivery, in order.
    pub parks: Vec<usize>,
    /// The deliveries the driver makes, in order.
    pub deliveries: Vec<Delivery>,
    /// The answers the driver gives, in order.
    pub answers: Vec<Answer>,
    /// Asks never answered: withdrawn when the run ends.
    pub withdrawn: Vec<u64>,
    /// The run's end.
    pub end: End,
}

impl Expected {
    /// The step records by name.
    pub fn step(&self, name: &str) -> Option<&StepRecord> {
        self.steps.iter().find(|s| s.name == name)
    }

    /// HookReceived events the hook with this token suffix must get.
    pub fn received(&self, token: &str) -> usize {
        self.deliveries
            .iter()
            .filter(|d| d.token == token)
            .map(|d| d.mode.copies())
            .sum()
    }
}

/// The error message a step's last attempt fails with (retryable or fatal).
pub fn attempt_error(spec: &StepSpec, attempt: u32) -> String {
    if attempt <= u32::from(spec.failures) {
        format!("{} attempt {attempt} failed", spec.name)
    } else {
        format!("{} failed fatally", spec.name)
    }
}

/// What the interpreter's output records for a step result.
pub(crate) fn step_ok(name: &str, v: &Value) -> Value {
    json!({ "step": name, "ok": digest(v) })
}

pub(crate) fn caught(f: &StepFailed) -> Value {
    json!({ "caught": f.name, "attempts": f.attempts, "fatal": f.fatal })
}

/// Runs `program` in the reference interpreter; the `n`-th delivery uses
/// `modes[n % modes.len()]` (`Once` when `modes` is empty).
pub fn expect(program: &Program, modes: &[DeliveryMode]) -> Expected {
    let mut r = Ref {
        modes,
        commands: Vec::new(),
        paths: Vec::new(),
        steps: Vec::new(),
        awaits: Vec::new(),
        issued: Vec::new(),
        parks: Vec::new(),
        deliveries: Vec::new(),
        answers: Vec::new(),
        withdrawn: Vec::new(),
        trace: vec![json!({ "input": digest(&program.input) })],
        path: Vec::new(),
    };
    let end = match r.block(&program.body) {
        Ok(()) => End::Completed(json!({ "trace": r.trace })),
        Err(f) => End::Failed(f.to_string()),
    };
    Expected {
        commands: r.commands,
        paths: r.paths,
        steps: r.steps,
        awaits: r.awaits,
        issued: r.issued,
        parks: r.parks,
        deliveries: r.deliveries,
        answers: r.answers,
        withdrawn: r.withdrawn,
        end,
    }
}

struct Ref<'a> {
    modes: &'a [DeliveryMode],
    commands: Vec<Command>,
    paths: Vec<Vec<usize>>,
    steps: Vec<StepRecord>,
    awaits: Vec<Await>,
    issued: Vec<usize>,
    parks: Vec<usize>,
    deliveries: Vec<Delivery>,
    answers: Vec<Answer>,
    withdrawn: Vec<u64>,
    trace: Vec<Value>,
    path: Vec<usize>,
}

impl Ref<'_> {
    fn issue(&mut self, c: Command, sub: Option<usize>) -> u64 {
        let mut p = self.path.clone();
        p.extend(sub);
        self.commands.push(c);
        self.paths.push(p);
        self.commands.len() as u64 - 1
    }

    fn wait(&mut self, a: Await) {
        if a.parks() {
            self.parks.push(self.awaits.len());
        }
        self.awaits.push(a);
        self.issued.push(self.commands.len());
    }

    fn deliver(&mut self, token: &str, payload: &Value) -> (usize, DeliveryMode) {
        let mode = if self.modes.is_empty() {
            DeliveryMode::Once
        } else {
            self.modes[self.deliveries.len() % self.modes.len()]
        };
        self.deliveries.push(Delivery {
            token: token.to_owned(),
            payload: payload.clone(),
            mode,
        });
        (self.deliveries.len() - 1, mode)
    }

    fn answer(&mut self, cmd: u64, text: &str) -> usize {
        let mode = if self.modes.is_empty() {
            AnswerMode::Once
        } else {
            match self.modes[self.answers.len() % self.modes.len()] {
                DeliveryMode::Once | DeliveryMode::Keyed => AnswerMode::Once,
                DeliveryMode::KeyedTwice | DeliveryMode::KeyedRetryLater => AnswerMode::SameTwice,
                DeliveryMode::UnkeyedTwice => AnswerMode::OtherSecond,
            }
        };
        self.answers.push(Answer {
            cmd,
            text: text.to_owned(),
            mode,
        });
        self.answers.len() - 1
    }

    /// Issues a step and computes its attempts; its result as the body sees it.
    fn step(&mut self, spec: &StepSpec, sub: Option<usize>) -> (u64, Result<Value, StepFailed>) {
        let cmd = self.issue(Command::Step(spec.name.clone()), sub);
        let allowed = u32::from(spec.retries) + 1;
        let mut attempts = Vec::new();
        let mut result = None;
        for a in 1..=allowed {
            if a <= u32::from(spec.failures) {
                attempts.push(Attempt::Failed {
                    fatal: false,
                    retried: a < allowed,
                });
                if a == allowed {
                    result = Some(Err(self.failed(spec, cmd, a, false)));
                }
            } else if spec.fatal {
                attempts.push(Attempt::Failed {
                    fatal: true,
                    retried: false,
                });
                result = Some(Err(self.failed(spec, cmd, a, true)));
                break;
            } else {
                let v = spec.output.value();
                attempts.push(Attempt::Completed(digest(&v)));
                result = Some(Ok(v));
                break;
            }
        }
        self.steps.push(StepRecord {
            cmd,
            name: spec.name.clone(),
            attempts,
        });
        (cmd, result.expect("a step's last allowed attempt decides"))
    }

    fn failed(&self, spec: &StepSpec, cmd: u64, attempts: u32, fatal: bool) -> StepFailed {
        StepFailed {
            name: spec.name.clone(),
            cmd,
            attempts,
            message: attempt_error(spec, attempts),
            fatal,
        }
    }

    fn block(&mut self, nodes: &[Node]) -> Result<(), StepFailed> {
        for (i, n) in nodes.iter().enumerate() {
            self.path.push(i);
            let r = self.node(n);
            self.path.pop();
            r?;
        }
        Ok(())
    }

    fn node(&mut self, n: &Node) -> Result<(), StepFailed> {
        match n {
            Node::Step(spec) => {
                let (cmd, r) = self.step(spec, None);
                self.wait(Await::Steps(vec![cmd]));
                let v = r?;
                self.trace.push(step_ok(&spec.name, &v));
            }
            Node::Join(specs) => {
                let mut cmds = Vec::new();
                let mut results = Vec::new();
                for (j, s) in specs.iter().enumerate() {
                    let (cmd, r) = self.step(s, Some(j));
                    cmds.push(cmd);
                    results.push((s, r));
                }
                self.wait(Await::Steps(cmds));
                for (s, r) in results {
                    let v = r?;
                    self.trace.push(step_ok(&s.name, &v));
                }
            }
            Node::Sleep { .. } => {
                let cmd = self.issue(Command::Sleep, None);
                self.wait(Await::Sleep { cmd });
                self.trace.push(json!({ "slept": cmd }));
            }
            Node::Hook { token, payloads } => {
                let cmd = self.issue(Command::Hook(token.clone()), None);
                let mut queue: VecDeque<Value> = VecDeque::new();
                let mut scripted = payloads.iter();
                for consumed in 0..payloads.len() {
                    let delivery = if queue.is_empty() {
                        let p = scripted.next().expect("one scripted payload per park");
                        let (d, mode) = self.deliver(token, p);
                        queue.extend(std::iter::repeat_n(p.clone(), mode.copies()));
                        Some(d)
                    } else {
                        None
                    };
                    self.wait(Await::Hook {
                        cmd,
                        token: token.clone(),
                        consumed,
                        delivery,
                    });
                    let got = queue.pop_front().expect("a payload was delivered");
                    self.trace
                        .push(json!({ "hook": token, "got": digest(&got) }));
                }
            }
            Node::Race { token, payload, .. } => {
                let hook = self.issue(Command::Hook(token.clone()), None);
                let sleep = self.issue(Command::Sleep, None);
                let delivery = payload.as_ref().map(|p| self.deliver(token, p).0);
                self.wait(Await::Race {
                    hook,
                    sleep,
                    token: token.clone(),
                    delivery,
                });
                self.trace.push(match payload {
                    Some(p) => json!({ "race": token, "hook": digest(p) }),
                    None => json!({ "race": token, "sleep": true }),
                });
            }
            Node::Catch(body) => {
                if let Err(f) = self.block(body) {
                    self.trace.push(caught(&f));
                }
            }
            Node::Ask { text } => {
                let cmd = self.issue(Command::Ask, None);
                let answer = self.answer(cmd, text);
                self.wait(Await::Ask { cmd, answer });
                self.trace.push(json!({ "asked": cmd, "got": text }));
            }
            Node::RaceAsk { answer, .. } => {
                let ask = self.issue(Command::Ask, None);
                let sleep = self.issue(Command::Sleep, None);
                let a = answer.as_ref().map(|t| self.answer(ask, t));
                self.wait(Await::RaceAsk {
                    ask,
                    sleep,
                    answer: a,
                });
                self.trace.push(match answer {
                    Some(t) => json!({ "race_ask": ask, "answer": t }),
                    None => {
                        self.withdrawn.push(ask);
                        json!({ "race_ask": ask, "sleep": true })
                    }
                });
            }
            Node::Progress { value } => {
                self.issue(Command::Progress(digest(value)), None);
            }
            Node::Message { value } => {
                self.issue(Command::Message(digest(value)), None);
            }
            Node::Agent { key, reply } => {
                let cmd = self.issue(Command::Agent(key.clone()), None);
                self.wait(Await::Agent { cmd });
                self.trace.push(match reply {
                    Ok(v) => json!({ "agent": key, "ok": digest(v) }),
                    Err(_) => json!({ "agent": key, "failed": true }),
                });
            }
        }
        Ok(())
    }
}

impl Await {
    fn delivery(&self) -> Option<usize> {
        match self {
            Await::Hook { delivery, .. } | Await::Race { delivery, .. } => *delivery,
            _ => None,
        }
    }

    fn answer(&self) -> Option<usize> {
        match self {
            Await::Ask { answer, .. } => Some(*answer),
            Await::RaceAsk { answer, .. } => *answer,
            _ => None,
        }
    }
}

/// What must happen when a cancel request reaches the run of `program` while it is parked at
/// its `k`-th park point (`full` is [`expect`] of the program): the commands issued so far, and
/// the cleanup step if the program has one; every request still pending withdrawn; the run
/// ends `RunCancelled`.
pub fn cancelled_at(program: &Program, full: &Expected, k: usize) -> Expected {
    let p = full.parks[k];
    let n = full.issued[p];
    let before = &full.awaits[..p];
    let deliveries = before
        .iter()
        .filter_map(Await::delivery)
        .max()
        .map_or(0, |d| d + 1);
    let answers = before
        .iter()
        .filter_map(Await::answer)
        .max()
        .map_or(0, |a| a + 1);
    let mut e = Expected {
        commands: full.commands[..n].to_vec(),
        paths: full.paths[..n].to_vec(),
        steps: full
            .steps
            .iter()
            .filter(|s| (s.cmd as usize) < n)
            .cloned()
            .collect(),
        awaits: full.awaits[..=p].to_vec(),
        issued: full.issued[..=p].to_vec(),
        parks: full.parks[..=k].to_vec(),
        deliveries: full.deliveries[..deliveries].to_vec(),
        answers: full.answers[..answers].to_vec(),
        withdrawn: Vec::new(),
        end: End::Cancelled,
    };
    e.withdrawn = (0..n as u64)
        .filter(|c| {
            e.commands[*c as usize] == Command::Ask && !e.answers.iter().any(|a| a.cmd == *c)
        })
        .collect();
    if let Some(c) = &program.cleanup {
        let mut r = Ref {
            modes: &[],
            commands: std::mem::take(&mut e.commands),
            paths: std::mem::take(&mut e.paths),
            steps: std::mem::take(&mut e.steps),
            awaits: Vec::new(),
            issued: Vec::new(),
            parks: Vec::new(),
            deliveries: Vec::new(),
            answers: Vec::new(),
            withdrawn: Vec::new(),
            trace: Vec::new(),
            path: Vec::new(),
        };
        let _ = r.step(c, None);
        e.commands = r.commands;
        e.paths = r.paths;
        e.steps = r.steps;
    }
    e
}
