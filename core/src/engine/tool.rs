//! Tool definitions: workflow tools (durable bodies taking a [`WorkflowCtx`]) and ordinary
//! tools (a [`ToolCtx`], no durable operations), the [`Registry`], and the entry points that
//! start runs and deliver hook payloads.

use super::ctx::{BoxFuture, TaskHandle, WorkflowCtx};
use super::error::{EngineError, WorkflowError};
use crate::event::{Execution, Payload};
use crate::ids::{CallId, DeploymentId, RunId, SessionId, WorkflowId};
use crate::store::{CreatedRun, Delivered, JournalStore, NewRun};
use crate::time::Timestamp;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

/// What a body returned: the output, or the error the run fails with.
pub(crate) type BodyOutcome = Result<Payload, String>;

/// An approval policy over the recorded input; `Err` fails the run with the message.
type ErasedPolicy = Arc<dyn Fn(&Payload) -> Result<Approval, String> + Send + Sync>;

pub(crate) type ErasedBody =
    Arc<dyn Fn(WorkflowCtx, &Payload) -> Result<BoxFuture<BodyOutcome>, String> + Send + Sync>;

/// A function marked as a workflow body, made by the [`workflow!`](crate::workflow) macro: it
/// captures the workflow id (module path without the crate name, plus the function name) and
/// only accepts `async fn(WorkflowCtx, I) -> Result<O, WorkflowError>`. Only a `Workflow` can
/// become a workflow tool.
pub struct Workflow<I, O> {
    id: WorkflowId,
    module: &'static str,
    execution: Execution,
    body: ErasedBody,
    _t: PhantomData<fn(I) -> O>,
}

impl<I, O> fmt::Debug for Workflow<I, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workflow").field("id", &self.id).finish()
    }
}

/// Strips the crate name from a `module_path!()`.
fn without_crate(module_path: &str) -> Option<&str> {
    module_path.split_once("::").map(|(_, rest)| rest)
}

impl<I, O> Workflow<I, O>
where
    I: DeserializeOwned + JsonSchema + Send + 'static,
    O: Serialize + Send + 'static,
{
    /// Used by [`workflow!`](crate::workflow); call the macro instead.
    #[doc(hidden)]
    pub fn __new<F, Fut>(module_path: &'static str, fn_name: &'static str, f: F) -> Self
    where
        F: Fn(WorkflowCtx, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, WorkflowError>> + Send + 'static,
    {
        let body: ErasedBody = Arc::new(move |ctx: WorkflowCtx, input: &Payload| {
            let input: I = input.to_value().map_err(|e| {
                format!("recorded input does not fit the workflow's input type: {e}")
            })?;
            let fut = f(ctx, input);
            Ok(Box::pin(async move { finish(fut.await) }) as BoxFuture<BodyOutcome>)
        });
        Self::erased(module_path, fn_name, Execution::Default, body)
    }

    /// Used by [`background_workflow!`](crate::background_workflow); call the macro instead.
    #[doc(hidden)]
    pub fn __new_background<F, Fut>(module_path: &'static str, fn_name: &'static str, f: F) -> Self
    where
        F: Fn(WorkflowCtx, TaskHandle, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, WorkflowError>> + Send + 'static,
    {
        let body: ErasedBody = Arc::new(move |ctx: WorkflowCtx, input: &Payload| {
            let input: I = input.to_value().map_err(|e| {
                format!("recorded input does not fit the workflow's input type: {e}")
            })?;
            let task = TaskHandle {
                core: ctx.core.clone(),
            };
            let fut = f(ctx, task, input);
            Ok(Box::pin(async move { finish(fut.await) }) as BoxFuture<BodyOutcome>)
        });
        Self::erased(module_path, fn_name, Execution::Background, body)
    }

    fn erased(
        module_path: &'static str,
        fn_name: &'static str,
        execution: Execution,
        body: ErasedBody,
    ) -> Self {
        let id = match without_crate(module_path) {
            Some(m) => format!("{m}::{fn_name}"),
            None => fn_name.to_owned(),
        };
        Self {
            id: WorkflowId::new(id),
            module: module_path,
            execution,
            body,
            _t: PhantomData,
        }
    }

    /// With an explicit workflow id instead of the derived one (keep the old id when moving or
    /// renaming the function, so runs in flight still find it).
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = WorkflowId::new(id);
        self
    }

    /// The workflow id.
    pub fn id(&self) -> &WorkflowId {
        &self.id
    }
}

/// A body's result as the run's outcome.
fn finish<O: Serialize>(out: Result<O, WorkflowError>) -> BodyOutcome {
    match out {
        Ok(out) => Payload::from_value(&out)
            .map_err(|e| format!("the workflow's output does not serialize: {e}")),
        Err(e) => Err(e.message().to_owned()),
    }
}

/// Marks an `async fn(WorkflowCtx, TaskHandle, I) -> Result<O, WorkflowError>` as a background
/// workflow body: a tool defined from it runs in the background (the call returns
/// `{status: "working", taskId}` at once) and only its body gets a [`TaskHandle`], so
/// `post_message` exists nowhere else. Ids as for [`workflow!`](crate::workflow).
#[macro_export]
macro_rules! background_workflow {
    ($f:ident) => {
        $crate::engine::Workflow::__new_background(
            ::core::module_path!(),
            ::core::stringify!($f),
            $f,
        )
    };
}

/// Marks an `async fn(WorkflowCtx, I) -> Result<O, WorkflowError>` as a workflow body; the
/// Rust form of `"use workflow"`. The workflow id is the function's module path (crate name
/// left out) and name: renaming or moving the function makes a new workflow.
///
/// ```ignore
/// async fn execute(ctx: WorkflowCtx, input: Remind) -> Result<Reminder, WorkflowError> { .. }
/// let tool = define_workflow_tool("Remind the user later.", workflow!(execute));
/// ```
#[macro_export]
macro_rules! workflow {
    ($f:ident) => {
        $crate::engine::Workflow::__new(::core::module_path!(), ::core::stringify!($f), $f)
    };
}

/// A workflow tool: what the model sees (name, description, input schema) and the durable body.
#[derive(Clone)]
pub struct WorkflowTool {
    name: String,
    description: String,
    workflow_id: WorkflowId,
    execution: Execution,
    grace: std::time::Duration,
    input_schema: serde_json::Value,
    output_schema: Option<serde_json::Value>,
    waits_for_input: bool,
    validate: fn(&serde_json::Value) -> Result<(), String>,
    needs_approval: bool,
    pub(crate) body: ErasedBody,
}

/// What a tool's approval policy decides for one call, before its body runs (the AI SDK's
/// `toolApproval`, the OpenAI Agents SDK's `needs_approval`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Approval {
    /// The call runs without asking anyone; nothing is journaled for the decision.
    Approve,
    /// The call is denied without asking: the run ends [`Event::RunDenied`](crate::Event::RunDenied)
    /// with this reason and the body never runs.
    Deny {
        /// Why; shown to the model as the call's `denied` result.
        reason: String,
    },
    /// A person decides: an approval request ([`InputRequest::approval`](crate::InputRequest::approval))
    /// is journaled and the call waits for its answer like any `ctx.ask`.
    Ask,
}

impl Approval {
    /// A denial with `reason`.
    pub fn deny(reason: impl Into<String>) -> Self {
        Self::Deny {
            reason: reason.into(),
        }
    }
}

/// The reason a person's denial carries: their text, else who denied.
fn denial_reason(answer: &crate::InputResponse) -> String {
    match (&answer.text, &answer.answered_by) {
        (Some(t), _) if !t.trim().is_empty() => t.clone(),
        (_, Some(who)) => format!("denied by {who}"),
        _ => "denied by the person asked".into(),
    }
}

/// Wraps `body` in the approval gate `policy`. The policy is a function of the recorded input
/// only, so every replay decides the same; an `Ask` is the body's command 0 (the request id
/// `{run}:0`), and the body's own commands follow it.
fn gated(body: ErasedBody, policy: ErasedPolicy) -> ErasedBody {
    Arc::new(
        move |ctx: WorkflowCtx, input: &Payload| match policy(input)? {
            Approval::Approve => body(ctx, input),
            Approval::Deny { reason } => {
                ctx.deny(reason.clone());
                Ok(Box::pin(async move { Err(reason) }) as BoxFuture<BodyOutcome>)
            }
            Approval::Ask => {
                let shown: serde_json::Value = input
                    .to_value()
                    .map_err(|e| format!("the recorded input is not JSON: {e}"))?;
                let ask = ctx.ask(crate::InputRequest::approval(ctx.tool_name(), shown));
                let body = body.clone();
                let input = input.clone();
                Ok(Box::pin(async move {
                    let answer = ask.await;
                    if answer.option_id.as_deref() == Some(crate::event::APPROVE) {
                        body(ctx, &input)?.await
                    } else {
                        let reason = denial_reason(&answer);
                        ctx.deny(reason.clone());
                        Err(reason)
                    }
                }) as BoxFuture<BodyOutcome>)
            }
        },
    )
}

impl fmt::Debug for WorkflowTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkflowTool")
            .field("name", &self.name)
            .field("workflow_id", &self.workflow_id)
            .field("execution", &self.execution)
            .finish()
    }
}

/// The arguments checked as `I` would take them, the error naming the field (see
/// [`super::args`]).
fn validate_as<I: DeserializeOwned>(v: &serde_json::Value) -> Result<(), String> {
    super::args::check::<I>(v)
}

/// Defines a workflow tool from a description and a [`Workflow`] (see
/// [`workflow!`](crate::workflow)). The tool name defaults to the last segment of the body's
/// module path (`tools::deploy::execute` → `deploy`); default execution unless
/// [`WorkflowTool::background`].
pub fn define_workflow_tool<I, O>(
    description: impl Into<String>,
    workflow: Workflow<I, O>,
) -> WorkflowTool
where
    I: DeserializeOwned + JsonSchema + Send + 'static,
    O: Serialize + Send + 'static,
{
    let name = workflow
        .module
        .rsplit("::")
        .next()
        .filter(|_| workflow.module.contains("::"))
        .map(str::to_owned)
        .unwrap_or_else(|| {
            workflow
                .id
                .as_str()
                .rsplit("::")
                .next()
                .unwrap_or_default()
                .to_owned()
        });
    let schema = schemars::schema_for!(I);
    WorkflowTool {
        name,
        description: description.into(),
        workflow_id: workflow.id,
        execution: workflow.execution,
        grace: DEFAULT_GRACE,
        input_schema: serde_json::to_value(&schema).unwrap_or(serde_json::Value::Null),
        output_schema: None,
        waits_for_input: false,
        validate: validate_as::<I>,
        needs_approval: false,
        body: workflow.body,
    }
}

/// How long a cancelled run's body may keep running cleanup steps (see
/// [`WorkflowTool::grace`]).
pub const DEFAULT_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

impl WorkflowTool {
    /// Runs in the background: the call returns a task receipt at once. (A body that needs
    /// `post_message` is made with [`background_workflow!`](crate::background_workflow).)
    pub fn background(mut self) -> Self {
        self.execution = Execution::Background;
        self
    }

    /// The cancellation grace period: after a cancel request the body may run steps (cleanup)
    /// this long; then the run ends cancelled whether or not the body finished (default
    /// [`DEFAULT_GRACE`]).
    pub fn grace(mut self, grace: std::time::Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The cancellation grace period.
    pub fn grace_period(&self) -> std::time::Duration {
        self.grace
    }

    /// Overrides the model-visible name.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Declares the tool's output type `O` (the body's `Ok` value), whose schemars schema MCP
    /// lists as the tool's `outputSchema`. It must describe a JSON object (MCP's rule for
    /// structured results); the body's output then conforms to it by construction.
    ///
    /// # Panics
    /// When `O`'s schema is not an object schema (a programming error at startup).
    pub fn output_schema_of<O: JsonSchema>(mut self) -> Self {
        let schema =
            serde_json::to_value(schemars::schema_for!(O)).unwrap_or(serde_json::Value::Null);
        assert!(
            schema["type"] == "object",
            "tool {}: an output schema must describe a JSON object (MCP's structured results), got {}",
            self.name,
            schema["type"]
        );
        self.output_schema = Some(schema);
        self
    }

    /// Declares that the body may wait for input from the caller's side: a person's answer
    /// (`ctx.ask`) or an agent call the host fulfils (`ctx.agent`). Hosts show it (MCP lists it
    /// as `_meta["eve/mayWaitForInput"]`) so a client knows the call may park on
    /// `input_required`. `#[workflow]` derives it from the body (a `.ask(..)` or `.agent(..)`
    /// call in it) and takes `#[workflow(waits_for_input)]` for a body that asks in a helper;
    /// a tool made with [`define_workflow_tool`] declares it here. Undeclared: `false`.
    pub fn waits_for_input(mut self) -> Self {
        self.waits_for_input = true;
        self
    }

    /// Gates every call on a person's approval: before the body runs, eve journals an approval
    /// request showing the tool and the model's input (options `approve` / `deny`, display
    /// [`Display::Approval`](crate::Display::Approval)), answered like any `ctx.ask` (the
    /// page, `eve answer`, HTTP, MCP). `approve` runs the body; `deny` ends the run
    /// [`Event::RunDenied`](crate::Event::RunDenied) (the call settles `denied`) and the
    /// body never runs. Costs one journal append before the body. The request is the run's
    /// command 0, so adding or removing the gate changes the body's replay: give the tool a
    /// new workflow id (or let the runs in flight end) when you do.
    pub fn needs_approval(self) -> Self {
        self.approval_by(|_| Ok(Approval::Ask))
    }

    /// Gates calls by `policy`, a function of the tool's input `I` (the type the body takes)
    /// deciding [`Approval::Approve`] (runs at once, nothing journaled),
    /// [`Approval::Deny`] (the run ends denied, nothing asked, the body never runs) or
    /// [`Approval::Ask`] (as [`needs_approval`](Self::needs_approval)). The policy must be a
    /// pure function of the input: a replay decides again and must decide the same. An input
    /// that does not deserialize as `I` fails the run with a message saying so.
    pub fn approval<I, F>(self, policy: F) -> Self
    where
        I: DeserializeOwned + 'static,
        F: Fn(&I) -> Approval + Send + Sync + 'static,
    {
        self.approval_by(typed_policy(policy))
    }

    fn approval_by(
        mut self,
        policy: impl Fn(&Payload) -> Result<Approval, String> + Send + Sync + 'static,
    ) -> Self {
        self.body = gated(self.body, Arc::new(policy));
        self.needs_approval = true;
        self.waits_for_input = true;
        self
    }

    /// Whether calls pass an approval policy before the body runs (MCP lists it as
    /// `_meta["eve/needsApproval"]`).
    pub fn requires_approval(&self) -> bool {
        self.needs_approval
    }

    /// Whether the body may wait for input (see [`WorkflowTool::waits_for_input`]).
    pub fn may_wait_for_input(&self) -> bool {
        self.waits_for_input
    }

    /// The declared output schema, if any (see [`WorkflowTool::output_schema_of`]).
    pub fn output_schema(&self) -> Option<&serde_json::Value> {
        self.output_schema.as_ref()
    }

    /// The model-visible name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The description the model sees.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The body's workflow id.
    pub fn workflow_id(&self) -> &WorkflowId {
        &self.workflow_id
    }

    /// Default or background.
    pub fn execution(&self) -> Execution {
        self.execution
    }

    /// The input's JSON schema (from schemars).
    pub fn input_schema(&self) -> &serde_json::Value {
        &self.input_schema
    }

    /// Checks a tool input: a JSON object that the input type accepts.
    ///
    /// # Errors
    /// [`EngineError::InvalidInput`] whose reason names the field path and what is wrong with
    /// it, for every kind of violation: `amount: expected a number, got the string "ten"`,
    /// `order_id: missing; the arguments must have it`, `the arguments must be a JSON object,
    /// got an array` (errors of the whole input start `at the root:`).
    pub fn validate(&self, input: &serde_json::Value) -> Result<(), EngineError> {
        (self.validate)(input).map_err(|reason| EngineError::InvalidInput {
            tool: self.name.clone(),
            reason,
        })
    }
}

/// What a [`Registry`] accepts: a [`WorkflowTool`], or the unit struct a `#[workflow]` function
/// becomes.
pub trait IntoWorkflowTool {
    /// The tool.
    fn into_tool(self) -> WorkflowTool;
}

impl IntoWorkflowTool for WorkflowTool {
    fn into_tool(self) -> WorkflowTool {
        self
    }
}

/// The workflow tools one deployment serves. Workers run only runs of their registry's
/// deployment, and fail runs whose workflow id is missing from it.
#[derive(Clone, Debug)]
pub struct Registry {
    deployment: DeploymentId,
    agent_host: Option<Arc<dyn super::AgentHost>>,
    by_id: BTreeMap<WorkflowId, Arc<WorkflowTool>>,
    by_name: BTreeMap<String, WorkflowId>,
    /// Ordinary tools of default execution, run inline in the call (background ones are
    /// wrapped as workflow tools and live in `by_id`).
    ordinary: BTreeMap<String, Arc<Tool>>,
}

impl Registry {
    /// An empty registry for `deployment` (a stable version string you choose).
    pub fn new(deployment: impl Into<DeploymentId>) -> Self {
        Self {
            deployment: deployment.into(),
            agent_host: None,
            by_id: BTreeMap::new(),
            by_name: BTreeMap::new(),
            ordinary: BTreeMap::new(),
        }
    }

    /// Adds a tool.
    ///
    /// # Errors
    /// `InvalidInput` when another tool (workflow or ordinary) has the same name, or another
    /// workflow tool the same workflow id.
    pub fn register(&mut self, tool: impl IntoWorkflowTool) -> Result<&mut Self, EngineError> {
        let tool = tool.into_tool();
        if self.ordinary.contains_key(&tool.name) {
            return Err(name_taken(&tool.name));
        }
        if self.by_name.contains_key(&tool.name) || self.by_id.contains_key(&tool.workflow_id) {
            return Err(EngineError::InvalidInput {
                tool: tool.name.clone(),
                reason: format!(
                    "a tool named {:?} or with workflow id {} is registered already; give it another name with WorkflowTool::named",
                    tool.name, tool.workflow_id
                ),
            });
        }
        self.by_name
            .insert(tool.name.clone(), tool.workflow_id.clone());
        self.by_id.insert(tool.workflow_id.clone(), Arc::new(tool));
        Ok(self)
    }

    /// Adds a tool, workflow (a `#[workflow]` function, a [`WorkflowTool`]) or ordinary (a
    /// `#[tool]` function, a [`Tool`]); builder form.
    ///
    /// # Panics
    /// When the name or workflow id is taken (a programming error at startup).
    pub fn with(mut self, tool: impl Registrable) -> Self {
        if let Err(e) = tool.register_in(&mut self) {
            panic!("{e}");
        }
        self
    }

    /// Starts the children of `ctx.agent` calls with `host` (the host form). Without one, an
    /// agent call is recorded as an input request carrying the call, for a host on the other
    /// side of MCP or HTTP to serve (the wire form, see [`complete_agent`](super::complete_agent));
    /// a call recorded in the host form keeps it, and fails with an error that says so when
    /// no host is configured to start it.
    pub fn with_agent_host(mut self, host: Arc<dyn super::AgentHost>) -> Self {
        self.agent_host = Some(host);
        self
    }

    /// The agent host, if any.
    pub fn agent_host(&self) -> Option<&Arc<dyn super::AgentHost>> {
        self.agent_host.as_ref()
    }

    /// The deployment id.
    pub fn deployment(&self) -> &DeploymentId {
        &self.deployment
    }

    /// The tool whose body has this workflow id.
    pub fn get(&self, id: &WorkflowId) -> Option<&Arc<WorkflowTool>> {
        self.by_id.get(id)
    }

    /// The tool with this model-visible name.
    pub fn by_name(&self, name: &str) -> Option<&Arc<WorkflowTool>> {
        self.by_name.get(name).and_then(|id| self.by_id.get(id))
    }

    /// All tools, by workflow id.
    pub fn tools(&self) -> impl Iterator<Item = &Arc<WorkflowTool>> {
        self.by_id.values()
    }
}

/// Starts the run of a workflow tool call: validates `input` against the tool (a clear
/// [`EngineError::InvalidInput`] before any run exists), then creates the run pinned to the
/// registry's deployment. Idempotent by session + call id: a repeated call returns the same run
/// (`created: false`); the same call with another input is `IdempotencyMismatch`.
///
/// # Errors
/// `InvalidInput`, `UnknownTool`, or the store's error.
pub async fn start_tool_call(
    store: &dyn JournalStore,
    registry: &Registry,
    session: &SessionId,
    call: &CallId,
    tool: &str,
    input: serde_json::Value,
    now: Timestamp,
) -> Result<CreatedRun, EngineError> {
    let new = tool_call_run(registry, session, call, tool, input)?;
    Ok(store.create_run(new, now).await?)
}

/// The start request of a tool call: looks the tool up by name and validates `input` against
/// its schema, as [`start_tool_call`] does, without starting anything.
///
/// # Errors
/// `UnknownTool`, `InvalidInput`.
pub fn tool_call_run(
    registry: &Registry,
    session: &SessionId,
    call: &CallId,
    tool: &str,
    input: serde_json::Value,
) -> Result<NewRun, EngineError> {
    let t = registry.by_name(tool).ok_or_else(|| {
        if registry.ordinary(tool).is_some() {
            EngineError::InlineTool {
                name: tool.to_owned(),
            }
        } else {
            EngineError::UnknownTool {
                name: tool.to_owned(),
            }
        }
    })?;
    t.validate(&input)?;
    Ok(NewRun {
        run_id: RunId::random(),
        idempotency_key: None,
        workflow_id: t.workflow_id.clone(),
        deployment_id: registry.deployment.clone(),
        tool: t.name.clone(),
        input: Payload::from(input),
        session_id: session.clone(),
        call_id: call.clone(),
        execution: t.execution,
        traceparent: None,
        reset_from: None,
    })
}

/// Delivers `payload` to the live hook of `token`, from any process. With a `dedupe_key` (an
/// `Idempotency-Key`, a provider's delivery id) a retried delivery is recognised and written
/// once; without one, delivery is at-least-once.
///
/// # Errors
/// `NotFound` when no live hook has the token (not created yet, or its run ended); the store's
/// errors otherwise.
pub async fn resume_hook<T: Serialize + ?Sized>(
    store: &dyn JournalStore,
    token: &str,
    payload: &T,
    dedupe_key: Option<&str>,
    now: Timestamp,
) -> Result<Delivered, EngineError> {
    let payload = Payload::from_value(payload).map_err(|e| EngineError::InvalidInput {
        tool: String::new(),
        reason: format!("hook payload does not serialize as JSON: {e}"),
    })?;
    Ok(store.deliver_hook(token, payload, dedupe_key, now).await?)
}

/// What an ordinary tool receives: the call's identity, and no durable operations (no `step`,
/// `sleep`, hooks, `ask` or `agent`: those exist only on [`WorkflowCtx`]).
#[derive(Clone, Debug)]
pub struct ToolCtx {
    /// The session.
    pub session_id: SessionId,
    /// The tool call.
    pub call_id: CallId,
    /// The tool's name.
    pub tool_name: String,
    /// In background execution, the step attempt that runs this call (its
    /// [`StepCtx::idempotency_key`](super::StepCtx::idempotency_key) is stable across the
    /// attempts of one call, and [`StepCtx::aborted`](super::StepCtx::aborted) completes when
    /// the task is cancelled); `None` when the tool runs inline in the call.
    pub attempt: Option<super::StepCtx>,
}

impl ToolCtx {
    /// The context of an inline call (default execution): no step.
    pub fn inline(session_id: SessionId, call_id: CallId, tool_name: impl Into<String>) -> Self {
        Self {
            session_id,
            call_id,
            tool_name: tool_name.into(),
            attempt: None,
        }
    }
}

type ToolFn = Arc<
    dyn Fn(ToolCtx, serde_json::Value) -> BoxFuture<Result<serde_json::Value, String>>
        + Send
        + Sync,
>;

/// An ordinary tool: its body runs once per call and cannot suspend durably. In default
/// execution it runs inline in the call (no run, no journal: the call settles with its output or
/// its error); in background execution ([`Tool::background`]) the call is a durable run whose
/// body is one journaled step running the tool, so it gets a task receipt, task notices and
/// cancellation like a workflow tool, and survives a restart (the step runs again, at least
/// once, when the process died before its outcome was recorded).
#[derive(Clone)]
pub struct Tool {
    name: String,
    description: String,
    input_schema: serde_json::Value,
    run: ToolFn,
    execution: Execution,
    workflow_id: WorkflowId,
    validate: fn(&serde_json::Value) -> Result<(), String>,
    /// The approval policy its background runs pass before the step (see
    /// [`Tool::needs_approval`]).
    approval: Option<ErasedPolicy>,
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tool")
            .field("name", &self.name)
            .field("execution", &self.execution)
            .field("needs_approval", &self.approval.is_some())
            .finish()
    }
}

/// Defines an ordinary tool named `name` (default execution: it runs inline in the call; see
/// [`Tool::background`]).
pub fn define_tool<I, O, F, Fut>(
    name: impl Into<String>,
    description: impl Into<String>,
    f: F,
) -> Tool
where
    I: DeserializeOwned + JsonSchema + Send + 'static,
    O: Serialize + 'static,
    F: Fn(ToolCtx, I) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, WorkflowError>> + Send + 'static,
{
    let name = name.into();
    let tool_name = name.clone();
    let f = Arc::new(f);
    let run: ToolFn = Arc::new(move |ctx, input| {
        let f = f.clone();
        let tool_name = tool_name.clone();
        Box::pin(async move {
            validate_as::<I>(&input)
                .map_err(|r| format!("invalid input for tool {tool_name:?}: {r}"))?;
            let input: I = serde_json::from_value(input).map_err(|e| e.to_string())?;
            let out = f(ctx, input).await.map_err(|e| e.message().to_owned())?;
            serde_json::to_value(out).map_err(|e| e.to_string())
        })
    });
    Tool {
        workflow_id: WorkflowId::new(name.clone()),
        name,
        description: description.into(),
        input_schema: serde_json::to_value(schemars::schema_for!(I))
            .unwrap_or(serde_json::Value::Null),
        run,
        execution: Execution::Default,
        validate: validate_as::<I>,
        approval: None,
    }
}

impl Tool {
    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The description.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The input's JSON schema.
    pub fn input_schema(&self) -> &serde_json::Value {
        &self.input_schema
    }

    /// Default (inline in the call) or background (a durable run of one step).
    pub fn execution(&self) -> Execution {
        self.execution
    }

    /// Runs in the background: the call returns a task receipt at once, and the tool runs as a
    /// durable run whose body is one journaled step (see [`Tool`]).
    pub fn background(mut self) -> Self {
        self.execution = Execution::Background;
        self
    }

    /// Overrides the model-visible name.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Gates every call on a person's approval, as [`WorkflowTool::needs_approval`]: before
    /// the tool's step runs, eve journals an approval request showing the tool and the model's
    /// input; `approve` runs the step, `deny` ends the run
    /// [`Event::RunDenied`](crate::Event::RunDenied) and the tool never runs. Only a
    /// [`background`](Self::background) tool can be gated (its call is a run that journals the
    /// request): [`Registry::register_tool`] refuses a default-execution tool with a policy
    /// ([`EngineError::ApprovalNeedsBackground`]).
    pub fn needs_approval(self) -> Self {
        self.approval_by(|_| Ok(Approval::Ask))
    }

    /// Gates calls by `policy`, a pure function of the tool's input `I` deciding
    /// [`Approval::Approve`], [`Approval::Deny`] or [`Approval::Ask`], as
    /// [`WorkflowTool::approval`]. Background tools only, as
    /// [`needs_approval`](Self::needs_approval).
    pub fn approval<I, F>(self, policy: F) -> Self
    where
        I: DeserializeOwned + 'static,
        F: Fn(&I) -> Approval + Send + Sync + 'static,
    {
        self.approval_by(typed_policy(policy))
    }

    fn approval_by(
        mut self,
        policy: impl Fn(&Payload) -> Result<Approval, String> + Send + Sync + 'static,
    ) -> Self {
        self.approval = Some(Arc::new(policy));
        self
    }

    /// Whether calls pass an approval policy before the tool runs (see
    /// [`Tool::needs_approval`]).
    pub fn requires_approval(&self) -> bool {
        self.approval.is_some()
    }

    /// The workflow id its background runs are pinned to (default: the tool's name when made
    /// with [`define_tool`]; the function's module path and name for a `#[tool]`). Keep it when
    /// moving or renaming a background tool, so runs in flight still find it.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.workflow_id = WorkflowId::new(id);
        self
    }

    /// Used by `#[tool]`: the workflow id of a tool function, as [`workflow!`](crate::workflow)
    /// derives it (module path without the crate name, plus the function name).
    #[doc(hidden)]
    pub fn __id(module_path: &str, fn_name: &str) -> String {
        match without_crate(module_path) {
            Some(m) => format!("{m}::{fn_name}"),
            None => fn_name.to_owned(),
        }
    }

    /// The workflow id of its background runs (see [`Tool::with_id`]).
    pub fn workflow_id(&self) -> &WorkflowId {
        &self.workflow_id
    }

    /// Checks a tool input exactly as [`WorkflowTool::validate`] does: a JSON object that the
    /// input type accepts.
    ///
    /// # Errors
    /// [`EngineError::InvalidInput`] naming the field path and what is wrong with it, as
    /// [`WorkflowTool::validate`].
    pub fn validate(&self, input: &serde_json::Value) -> Result<(), EngineError> {
        (self.validate)(input).map_err(|reason| EngineError::InvalidInput {
            tool: self.name.clone(),
            reason,
        })
    }

    /// Runs the tool once.
    ///
    /// # Errors
    /// The tool's error message, or a message naming an invalid input.
    pub async fn call(
        &self,
        ctx: ToolCtx,
        input: serde_json::Value,
    ) -> Result<serde_json::Value, String> {
        (self.run)(ctx, input).await
    }

    /// The step name of its background runs.
    pub const STEP: &'static str = "tool";

    /// This tool as a workflow tool whose body is one journaled step (named [`Tool::STEP`])
    /// running the tool with no retries: the step's outcome is the run's (an error fails the
    /// run with the tool's message). The step runs again only when the process died before
    /// its outcome was recorded (at least once, like every step); [`ToolCtx::attempt`] gives the
    /// attempt's idempotency key and abort signal. Its execution is the tool's; the registry
    /// uses this for background tools. The tool's approval policy ([`Tool::needs_approval`],
    /// [`Tool::approval`]) becomes the workflow tool's: the gate runs before the step.
    pub fn into_workflow_tool(mut self) -> WorkflowTool {
        let approval = self.approval.take();
        let tool = Arc::new(self);
        let runner = tool.clone();
        let body: ErasedBody = Arc::new(move |ctx: WorkflowCtx, input: &Payload| {
            let input: serde_json::Value = input
                .to_value()
                .map_err(|e| format!("recorded input is not JSON: {e}"))?;
            let base = ToolCtx {
                session_id: ctx.session_id().clone(),
                call_id: ctx.call_id().clone(),
                tool_name: ctx.tool_name().to_owned(),
                attempt: None,
            };
            let runner = runner.clone();
            let step = ctx
                .step(Tool::STEP, move |sc| {
                    let (runner, input) = (runner.clone(), input.clone());
                    let mut tctx = base.clone();
                    tctx.attempt = Some(sc);
                    async move {
                        runner
                            .call(tctx, input)
                            .await
                            .map_err(super::StepError::fatal)
                    }
                })
                .retry(super::RetryPolicy {
                    max_retries: 0,
                    ..super::RetryPolicy::default()
                });
            Ok(Box::pin(async move {
                let out: serde_json::Value = step.await.map_err(|e| e.message)?;
                Payload::from_value(&out)
                    .map_err(|e| format!("the tool's output does not serialize: {e}"))
            }) as BoxFuture<BodyOutcome>)
        });
        let workflow = WorkflowTool {
            name: tool.name.clone(),
            description: tool.description.clone(),
            workflow_id: tool.workflow_id.clone(),
            execution: tool.execution,
            grace: DEFAULT_GRACE,
            input_schema: tool.input_schema.clone(),
            output_schema: None,
            waits_for_input: false,
            needs_approval: false,
            validate: tool.validate,
            body,
        };
        match approval {
            Some(policy) => workflow.approval_by(move |input: &Payload| policy(input)),
            None => workflow,
        }
    }
}

/// A policy over the tool's typed input as one over the recorded input: an input that does not
/// deserialize as `I` fails the run with a message saying so.
fn typed_policy<I, F>(
    policy: F,
) -> impl Fn(&Payload) -> Result<Approval, String> + Send + Sync + 'static
where
    I: DeserializeOwned + 'static,
    F: Fn(&I) -> Approval + Send + Sync + 'static,
{
    move |input: &Payload| {
        let input: I = input.to_value().map_err(|e| {
            format!("the approval policy's input type does not fit the recorded input: {e}")
        })?;
        Ok(policy(&input))
    }
}

/// What makes an ordinary [`Tool`]: a `Tool`, or the unit struct a `#[tool]` function becomes.
pub trait IntoTool {
    /// The tool.
    fn into_tool(self) -> Tool;
}

impl IntoTool for Tool {
    fn into_tool(self) -> Tool {
        self
    }
}

/// What [`Registry::with`] accepts: any [`IntoWorkflowTool`] (a workflow tool), a [`Tool`], or
/// a `#[tool]` function (the macro implements this trait for it).
pub trait Registrable {
    /// Adds itself to `registry`.
    ///
    /// # Errors
    /// As [`Registry::register`] / [`Registry::register_tool`].
    fn register_in(self, registry: &mut Registry) -> Result<(), EngineError>;
}

impl<T: IntoWorkflowTool> Registrable for T {
    fn register_in(self, registry: &mut Registry) -> Result<(), EngineError> {
        registry.register(self).map(|_| ())
    }
}

impl Registrable for Tool {
    fn register_in(self, registry: &mut Registry) -> Result<(), EngineError> {
        registry.register_tool(self).map(|_| ())
    }
}

/// The error of a name that is taken.
fn name_taken(name: &str) -> EngineError {
    EngineError::InvalidInput {
        tool: name.to_owned(),
        reason: format!(
            "a tool named {name:?} is registered already (names are unique across workflow and ordinary tools); rename one with WorkflowTool::named, Tool::named or #[tool(name = \"..\")]"
        ),
    }
}

impl Registry {
    /// Adds an ordinary tool. A default-execution tool is kept as it is and runs inline in each
    /// call ([`Registry::ordinary`]); a background one is registered as the workflow tool
    /// [`Tool::into_workflow_tool`] makes, so it is found by [`Registry::by_name`] and its calls
    /// are runs.
    ///
    /// # Errors
    /// `InvalidInput` when another tool (workflow or ordinary) has the same name, or (in the
    /// background) another workflow tool the same workflow id;
    /// [`EngineError::ApprovalNeedsBackground`] for a default-execution tool with an approval
    /// policy (nothing is registered).
    pub fn register_tool(&mut self, tool: impl IntoTool) -> Result<&mut Self, EngineError> {
        let tool = tool.into_tool();
        if tool.execution == Execution::Background {
            return self.register(tool.into_workflow_tool());
        }
        if tool.approval.is_some() {
            return Err(EngineError::ApprovalNeedsBackground {
                name: tool.name.clone(),
            });
        }
        if self.ordinary.contains_key(&tool.name) || self.by_name.contains_key(&tool.name) {
            return Err(name_taken(&tool.name));
        }
        self.ordinary.insert(tool.name.clone(), Arc::new(tool));
        Ok(self)
    }

    /// The ordinary tool of default execution with this name: its calls run inline
    /// ([`Tool::validate`], then [`Tool::call`]), not as runs.
    pub fn ordinary(&self, name: &str) -> Option<&Arc<Tool>> {
        self.ordinary.get(name)
    }

    /// The ordinary tools of default execution, by name (background ones are among
    /// [`Registry::tools`]).
    pub fn ordinary_tools(&self) -> impl Iterator<Item = &Arc<Tool>> {
        self.ordinary.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{WorkflowCtx, WorkflowError};

    #[derive(serde::Deserialize, JsonSchema)]
    struct In {}

    async fn body(_ctx: WorkflowCtx, _: In) -> Result<String, WorkflowError> {
        Ok("done".into())
    }

    #[test]
    #[should_panic(expected = "an output schema must describe a JSON object")]
    fn an_output_schema_must_be_an_object() {
        let _ = define_workflow_tool("A string output.", crate::workflow!(body))
            .output_schema_of::<String>();
    }

    #[test]
    fn no_output_schema_unless_declared() {
        assert!(
            define_workflow_tool("A string output.", crate::workflow!(body))
                .output_schema()
                .is_none()
        );
    }
}
