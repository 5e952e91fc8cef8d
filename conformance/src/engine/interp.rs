//! The generic workflow body that runs any [`Program`] on the real engine, and the shared
//! per-case state ([`Instance`]) its steps report to.
//!
//! The tool input is `{"instance": id, "program": <Program>}`. Step closures take their
//! scripted behaviour from the program (by attempt number), count their real executions in the
//! instance, and note any execution that starts after the step's outcome was recorded in the
//! store (seen through a [`Recorder`]). The body notes each await position it reaches and the
//! commands each of its executions issues, which the driver and the checks compare with the
//! [`reference`](super::reference).

use super::program::{digest, Node, Program, StepSpec};
use super::recorder::Recorder;
use super::reference::{attempt_error, caught, step_ok, Command};
use eve_core::engine::{
    define_workflow_tool, AgentCall, Durable, Either, RetryPolicy, StepCtx, StepError, StepFailed,
    TaskHandle, WorkflowCtx, WorkflowError, WorkflowTool,
};
use eve_core::{FencingToken, RunId};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::oneshot;

/// The workflow id of [`tool`]: stable, whatever module the body lives in.
pub const WORKFLOW_ID: &str = "eve_conformance::engine::program";
/// The tool name of [`tool`].
pub const TOOL: &str = "conformance_program";

/// The tool input.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProgramInput {
    /// The [`Instance`] this run reports to.
    pub instance: String,
    /// The program to run (unless the instance overrides it).
    pub program: Program,
}

/// The workflow tool that interprets programs.
pub fn tool() -> WorkflowTool {
    define_workflow_tool(
        "Runs a conformance program (steps, joins, sleeps, hooks, races).",
        eve_core::workflow!(program_body).with_id(WORKFLOW_ID),
    )
    .named(TOOL)
}

/// [`tool`] for the worker whose lease is made to expire: its step executions are tagged
/// [`STALE`] so the checks can tell them apart.
pub fn stale_tool() -> WorkflowTool {
    define_workflow_tool(
        "Runs a conformance program (steps, joins, sleeps, hooks, races).",
        eve_core::workflow!(stale_program_body).with_id(WORKFLOW_ID),
    )
    .named(TOOL)
}

/// The workflow id of [`background_tool`].
pub const BACKGROUND_WORKFLOW_ID: &str = "eve_conformance::engine::background_program";
/// The tool name of [`background_tool`].
pub const BACKGROUND_TOOL: &str = "conformance_background_program";

/// The background tool that interprets background programs (their bodies may post messages).
pub fn background_tool() -> WorkflowTool {
    define_workflow_tool(
        "Runs a conformance program in the background.",
        eve_core::background_workflow!(background_program_body).with_id(BACKGROUND_WORKFLOW_ID),
    )
    .named(BACKGROUND_TOOL)
}

/// [`background_tool`] for the worker whose lease is made to expire.
pub fn stale_background_tool() -> WorkflowTool {
    define_workflow_tool(
        "Runs a conformance program in the background.",
        eve_core::background_workflow!(stale_background_program_body)
            .with_id(BACKGROUND_WORKFLOW_ID),
    )
    .named(BACKGROUND_TOOL)
}

/// The tag of step executions by the worker of [`stale_tool`].
pub const STALE: &str = "the worker whose lease expired";

/// A step execution to hold at its start until the driver lets it go (a step still running
/// while its worker's lease expires).
#[derive(Debug)]
pub struct Hold {
    /// The step's name.
    pub step: String,
    /// Told when the step's first execution starts.
    pub reached: Option<oneshot::Sender<()>>,
    /// Awaited before the step goes on.
    pub release: Option<oneshot::Receiver<()>>,
}

/// Shared state of one case: what the body and its steps report while the engine runs them.
#[derive(Debug)]
pub struct Instance {
    /// The id in the tool input (also the hook tokens' prefix).
    pub id: String,
    recorder: Option<Arc<Recorder>>,
    program: Mutex<Option<Program>>,
    position: Mutex<Option<usize>>,
    executions: Mutex<HashMap<(String, u32), u32>>,
    violations: Mutex<Vec<(Option<&'static str>, String)>>,
    /// Late executions whose fencing token a fencing service refused.
    fenced: Mutex<Vec<(Option<&'static str>, String)>>,
    /// The fencing service: the largest token shown per run.
    highest: Mutex<HashMap<RunId, FencingToken>>,
    /// Every execution's (tag, token), by (step name, attempt), for messages.
    shown: Mutex<HashMap<(String, u32), Vec<Shown>>>,
    traces: Mutex<Vec<Arc<Mutex<Vec<Command>>>>>,
    hold: Mutex<Option<Hold>>,
}

/// One execution as the fencing service saw it: the body's tag and the token.
type Shown = (Option<&'static str>, FencingToken);

fn instances() -> &'static Mutex<HashMap<String, Arc<Instance>>> {
    static I: OnceLock<Mutex<HashMap<String, Arc<Instance>>>> = OnceLock::new();
    I.get_or_init(Default::default)
}

impl Instance {
    /// Registers a fresh instance under `id`; steps check their executions against `recorder`.
    pub fn register(id: impl Into<String>, recorder: Option<Arc<Recorder>>) -> Arc<Self> {
        let id = id.into();
        let inst = Arc::new(Self {
            id: id.clone(),
            recorder,
            program: Mutex::new(None),
            position: Mutex::new(None),
            executions: Mutex::new(HashMap::new()),
            violations: Mutex::new(Vec::new()),
            fenced: Mutex::new(Vec::new()),
            highest: Mutex::new(HashMap::new()),
            shown: Mutex::new(HashMap::new()),
            traces: Mutex::new(Vec::new()),
            hold: Mutex::new(None),
        });
        instances()
            .lock()
            .expect("instances lock")
            .insert(id, inst.clone());
        inst
    }

    /// The instance registered under `id`, or a detached one (a run replayed where no case
    /// registered it still runs, reporting nowhere).
    pub fn get(id: &str) -> Arc<Self> {
        let found = instances().lock().expect("instances lock").get(id).cloned();
        found.unwrap_or_else(|| {
            Arc::new(Self {
                id: id.to_owned(),
                recorder: None,
                program: Mutex::new(None),
                position: Mutex::new(None),
                executions: Mutex::new(HashMap::new()),
                violations: Mutex::new(Vec::new()),
                fenced: Mutex::new(Vec::new()),
                highest: Mutex::new(HashMap::new()),
                shown: Mutex::new(HashMap::new()),
                traces: Mutex::new(Vec::new()),
                hold: Mutex::new(None),
            })
        })
    }

    /// Forgets the instance.
    pub fn unregister(&self) {
        instances().lock().expect("instances lock").remove(&self.id);
    }

    /// From now on, bodies run `program` instead of their input's (a deployment whose code
    /// changed).
    pub fn override_program(&self, program: Program) {
        *self.program.lock().expect("instance lock") = Some(program);
    }

    /// Bodies run their input's program again (the original code is deployed again).
    pub fn clear_override(&self) {
        *self.program.lock().expect("instance lock") = None;
    }

    /// Holds the first execution of step `step` at its start; returns the receiver told when it
    /// is reached and the sender that lets it go.
    pub fn hold(&self, step: &str) -> (oneshot::Receiver<()>, oneshot::Sender<()>) {
        let (reached_tx, reached_rx) = oneshot::channel();
        let (release_tx, release_rx) = oneshot::channel();
        *self.hold.lock().expect("instance lock") = Some(Hold {
            step: step.to_owned(),
            reached: Some(reached_tx),
            release: Some(release_rx),
        });
        (reached_rx, release_tx)
    }

    /// The furthest await position any body execution reached (where a parked run waits).
    pub fn position(&self) -> Option<usize> {
        *self.position.lock().expect("instance lock")
    }

    /// Real executions of each (step name, attempt).
    pub fn executions(&self) -> HashMap<(String, u32), u32> {
        self.executions.lock().expect("instance lock").clone()
    }

    /// Step executions that started after the step's outcome was recorded and that a fencing
    /// service would have let through (their token was not below one it had seen), with the
    /// tag of the body that ran them.
    pub fn violations(&self) -> Vec<(Option<&'static str>, String)> {
        self.violations.lock().expect("instance lock").clone()
    }

    /// Step executions that started after the step's outcome was recorded, all refused by a
    /// fencing service: each carried a token below one a later activation had shown.
    pub fn fenced(&self) -> Vec<(Option<&'static str>, String)> {
        self.fenced.lock().expect("instance lock").clone()
    }

    /// The commands each body execution issued, oldest execution first.
    pub fn traces(&self) -> Vec<Vec<Command>> {
        self.traces
            .lock()
            .expect("instance lock")
            .iter()
            .map(|t| t.lock().expect("trace lock").clone())
            .collect()
    }

    /// The full token of a hook by its suffix.
    pub fn token(&self, suffix: &str) -> String {
        format!("{}/{suffix}", self.id)
    }

    fn reach(&self, pos: usize) {
        let mut p = self.position.lock().expect("instance lock");
        *p = Some(p.map_or(pos, |q| q.max(pos)));
    }

    fn new_trace(&self) -> Arc<Mutex<Vec<Command>>> {
        let t = Arc::new(Mutex::new(Vec::new()));
        self.traces.lock().expect("instance lock").push(t.clone());
        t
    }

    async fn executed(&self, sc: &StepCtx, tag: Option<&'static str>) {
        *self
            .executions
            .lock()
            .expect("instance lock")
            .entry((sc.name().to_owned(), sc.attempt()))
            .or_default() += 1;
        // Whether the step's outcome was recorded before this attempt started: read first, so
        // that the token of whoever recorded it (shown when its own attempt started, before
        // the recording) is already known to the fencing service below.
        let landed = self
            .recorder
            .as_ref()
            .map(|rec| rec.landed(sc.run_id(), sc.cmd()))
            .filter(|l| l.settled || l.attempt >= sc.attempt());
        // The service a step calls, fencing: it keeps the largest token shown per run and
        // refuses smaller ones.
        let (refused, seen) = {
            let mut highest = self.highest.lock().expect("instance lock");
            let seen = highest
                .entry(sc.run_id().clone())
                .or_insert(sc.fencing_token());
            let before = *seen;
            if sc.fencing_token() < *seen {
                (true, before)
            } else {
                *seen = sc.fencing_token();
                (false, before)
            }
        };
        let earlier: Vec<_> = {
            let mut shown = self.shown.lock().expect("instance lock");
            let list = shown
                .entry((sc.name().to_owned(), sc.attempt()))
                .or_default();
            let earlier = list.clone();
            list.push((tag, sc.fencing_token()));
            earlier
        };
        if let Some(landed) = landed {
            let list = if refused {
                &self.fenced
            } else {
                &self.violations
            };
            list.lock().expect("instance lock").push((
                tag,
                format!(
                    "step {:?} (command {}) attempt {} started after {} was recorded; its fencing token {:?}, the largest shown before {:?}; earlier executions of this attempt {:?}",
                    sc.name(),
                    sc.cmd(),
                    sc.attempt(),
                    if landed.settled {
                        "its final outcome".to_owned()
                    } else {
                        format!("attempt {}", landed.attempt)
                    },
                    sc.fencing_token(),
                    seen,
                    earlier,
                ),
            ));
        }
        let hold = {
            let mut h = self.hold.lock().expect("instance lock");
            match h.as_ref() {
                Some(x) if x.step == sc.name() => h.take(),
                _ => None,
            }
        };
        if let Some(mut hold) = hold {
            if let Some(tx) = hold.reached.take() {
                let _ = tx.send(());
            }
            if let Some(rx) = hold.release.take() {
                let _ = rx.await;
            }
        }
    }
}

/// The generic body: interprets the program of its input (or the instance's override).
///
/// # Errors
/// A step failure that no [`Node::Catch`] caught, or an input that is not a [`ProgramInput`].
pub async fn program_body(ctx: WorkflowCtx, input: Value) -> Result<Value, WorkflowError> {
    interpret(ctx, input, None, None).await
}

/// [`program_body`] whose step executions are tagged [`STALE`].
///
/// # Errors
/// As [`program_body`].
pub async fn stale_program_body(ctx: WorkflowCtx, input: Value) -> Result<Value, WorkflowError> {
    interpret(ctx, input, Some(STALE), None).await
}

/// [`program_body`] for background programs.
///
/// # Errors
/// As [`program_body`].
pub async fn background_program_body(
    ctx: WorkflowCtx,
    task: TaskHandle,
    input: Value,
) -> Result<Value, WorkflowError> {
    interpret(ctx, input, None, Some(task)).await
}

/// [`background_program_body`] whose step executions are tagged [`STALE`].
///
/// # Errors
/// As [`program_body`].
pub async fn stale_background_program_body(
    ctx: WorkflowCtx,
    task: TaskHandle,
    input: Value,
) -> Result<Value, WorkflowError> {
    interpret(ctx, input, Some(STALE), Some(task)).await
}

async fn interpret(
    ctx: WorkflowCtx,
    input: Value,
    tag: Option<&'static str>,
    task: Option<TaskHandle>,
) -> Result<Value, WorkflowError> {
    let input: ProgramInput = serde_json::from_value(input)
        .map_err(|e| WorkflowError::new(format!("not a conformance program input: {e}")))?;
    let inst = Instance::get(&input.instance);
    let program = inst
        .program
        .lock()
        .expect("instance lock")
        .clone()
        .unwrap_or(input.program);
    let trace = inst.new_trace();
    let mut it = Interp {
        task,
        cancellable: program.cleanup.is_some(),
        ctx,
        inst,
        trace,
        tag,
        pos: 0,
        out: vec![json!({ "input": digest(&program.input) })],
    };
    match it.block(&program.body).await {
        Ok(()) => Ok(json!({ "trace": it.out })),
        Err(Halt::Failed(f)) => Err(f.into()),
        Err(Halt::Cancelled) => {
            let cleanup = program
                .cleanup
                .as_ref()
                .expect("only a body with a cleanup step gives up waiting");
            let f = it.step(cleanup);
            f.await?;
            Ok(json!({ "cancelled": true }))
        }
    }
}

/// The agent target of [`Node::Agent`] calls.
pub const AGENT_TARGET: &str = "conformance";

/// The scripted agent host of a case: children of [`AGENT_TARGET`] reply at once with the
/// `reply` (or fail with the `error`) of their message, reported through `store`.
pub fn agent_host(
    store: Arc<dyn eve_core::JournalStore>,
    clock: Arc<dyn eve_core::engine::Clock>,
) -> eve_core::engine::ScriptedAgentHost {
    eve_core::engine::ScriptedAgentHost::new(store)
        .with_clock(clock)
        .reply(AGENT_TARGET, |start| {
            match (start.message.get("reply"), start.message.get("error")) {
                (Some(v), _) => Ok(v.clone()),
                (None, Some(e)) => Err(e.as_str().unwrap_or_default().to_owned()),
                (None, None) => Err("no scripted reply".into()),
            }
        })
}

/// The request every ask publishes: free text.
fn request() -> eve_core::InputRequest {
    eve_core::InputRequest {
        prompt: "conformance: answer with any text".into(),
        display: eve_core::Display::Text,
        options: Vec::new(),
        allow_freeform: true,
        agent: None,
        approval: None,
    }
}

/// Why a block stopped early.
enum Halt {
    /// A step failed for good.
    Failed(StepFailed),
    /// The run's cancel request was delivered (only with a cleanup step).
    Cancelled,
}

impl From<StepFailed> for Halt {
    fn from(f: StepFailed) -> Self {
        Halt::Failed(f)
    }
}

struct Interp {
    ctx: WorkflowCtx,
    task: Option<TaskHandle>,
    cancellable: bool,
    inst: Arc<Instance>,
    trace: Arc<Mutex<Vec<Command>>>,
    tag: Option<&'static str>,
    pos: usize,
    out: Vec<Value>,
}

impl Interp {
    fn issued(&self, c: Command) {
        self.trace.lock().expect("trace lock").push(c);
    }

    fn reach(&mut self) {
        self.inst.reach(self.pos);
        self.pos += 1;
    }

    fn step(&self, spec: &StepSpec) -> eve_core::engine::StepFuture<Value> {
        self.issued(Command::Step(spec.name.clone()));
        let inst = self.inst.clone();
        let spec2 = spec.clone();
        let tag = self.tag;
        let f = self
            .ctx
            .step(spec.name.clone(), move |sc: StepCtx| {
                let inst = inst.clone();
                let spec = spec2.clone();
                async move {
                    inst.executed(&sc, tag).await;
                    let a = sc.attempt();
                    if a <= u32::from(spec.failures) {
                        Err(StepError::retryable(attempt_error(&spec, a)))
                    } else if spec.fatal {
                        Err(StepError::fatal(attempt_error(&spec, a)))
                    } else {
                        Ok(spec.output.value())
                    }
                }
            })
            .retry(RetryPolicy::retries(u32::from(spec.retries)));
        if spec.local {
            f.local()
        } else {
            f
        }
    }

    /// Awaits `f`; with a cleanup step, gives up once the run's cancel request is delivered.
    async fn wait<F: Durable>(&self, f: F) -> Result<F::Output, Halt> {
        if !self.cancellable {
            return Ok(f.await);
        }
        match self.ctx.race(f, self.ctx.abort_signal()).await {
            Either::Left(v) => Ok(v),
            Either::Right(()) => Err(Halt::Cancelled),
        }
    }

    fn block<'a>(&'a mut self, nodes: &'a [Node]) -> BoxFuture<'a, Result<(), Halt>> {
        Box::pin(async move {
            for n in nodes {
                self.node(n).await?;
            }
            Ok(())
        })
    }

    async fn node(&mut self, n: &Node) -> Result<(), Halt> {
        match n {
            Node::Step(spec) => {
                let f = self.step(spec);
                self.reach();
                let v = f.await?;
                self.out.push(step_ok(&spec.name, &v));
            }
            Node::Join(specs) => {
                let fs: Vec<_> = specs.iter().map(|s| self.step(s)).collect();
                self.reach();
                let results = self.ctx.join_all(fs).await;
                for (s, r) in specs.iter().zip(results) {
                    let v = r?;
                    self.out.push(step_ok(&s.name, &v));
                }
            }
            Node::Sleep { ms } => {
                self.issued(Command::Sleep);
                let s = self.ctx.sleep(Duration::from_millis(*ms));
                let cmd = self.pos_cmd();
                self.reach();
                self.wait(s).await?;
                self.out.push(json!({ "slept": cmd }));
            }
            Node::Hook { token, payloads } => {
                self.issued(Command::Hook(token.clone()));
                let h = self.ctx.create_hook::<Value>(self.inst.token(token));
                for _ in payloads {
                    self.reach();
                    let got = self
                        .wait(h.next())
                        .await?
                        .expect("any JSON payload deserializes as a Value");
                    self.out.push(json!({ "hook": token, "got": digest(&got) }));
                }
            }
            Node::Race {
                token, sleep_ms, ..
            } => {
                self.issued(Command::Hook(token.clone()));
                let h = self.ctx.create_hook::<Value>(self.inst.token(token));
                self.issued(Command::Sleep);
                let s = self.ctx.sleep(Duration::from_millis(*sleep_ms));
                self.reach();
                self.out
                    .push(match self.wait(self.ctx.race(h.next(), s)).await? {
                        Either::Left(got) => json!({
                            "race": token,
                            "hook": digest(&got.expect("any JSON payload deserializes as a Value")),
                        }),
                        Either::Right(()) => json!({ "race": token, "sleep": true }),
                    });
            }
            Node::Catch(body) => match self.block(body).await {
                Err(Halt::Failed(f)) => self.out.push(caught(&f)),
                Err(Halt::Cancelled) => return Err(Halt::Cancelled),
                Ok(()) => {}
            },
            Node::Ask { .. } => {
                self.issued(Command::Ask);
                let a = self.ctx.ask(request());
                let cmd = self.pos_cmd();
                self.reach();
                let r = self.wait(a).await?;
                self.out
                    .push(json!({ "asked": cmd, "got": r.text.unwrap_or_default() }));
            }
            Node::RaceAsk { sleep_ms, .. } => {
                self.issued(Command::Ask);
                let a = self.ctx.ask(request());
                let cmd = self.pos_cmd();
                self.issued(Command::Sleep);
                let s = self.ctx.sleep(Duration::from_millis(*sleep_ms));
                self.reach();
                self.out.push(match self.wait(self.ctx.race(a, s)).await? {
                    Either::Left(r) => {
                        json!({ "race_ask": cmd, "answer": r.text.unwrap_or_default() })
                    }
                    Either::Right(()) => json!({ "race_ask": cmd, "sleep": true }),
                });
            }
            Node::Progress { value } => {
                self.issued(Command::Progress(digest(value)));
                self.ctx.progress(value);
            }
            Node::Message { value } => {
                self.issued(Command::Message(digest(value)));
                self.task
                    .as_ref()
                    .expect("messages are generated only in background programs")
                    .post_message(value);
            }
            Node::Agent { key, reply } => {
                self.issued(Command::Agent(key.clone()));
                let message = match reply {
                    Ok(v) => json!({ "reply": v }),
                    Err(e) => json!({ "error": e }),
                };
                let a = self
                    .ctx
                    .agent(AgentCall::new(key.clone(), AGENT_TARGET, message))
                    .expect("agent keys are unique in a program");
                self.reach();
                self.out.push(match a.await {
                    Ok(v) => json!({ "agent": key, "ok": digest(&v) }),
                    Err(_) => json!({ "agent": key, "failed": true }),
                });
            }
        }
        Ok(())
    }

    /// The cmd of the command just issued.
    fn pos_cmd(&self) -> u64 {
        self.trace.lock().expect("trace lock").len() as u64 - 1
    }
}
