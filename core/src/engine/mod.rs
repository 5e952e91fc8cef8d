//! The replay engine: workflow tool definitions, the [`WorkflowCtx`] a body issues durable
//! operations through, the deterministic executor, and the [`Worker`].
//!
//! # How a run executes
//!
//! A body is an ordinary `async fn(WorkflowCtx, I)`. The worker polls it on its own
//! single-threaded executor (a flag waker, no tokio timers) and delivers the run's journal
//! events strictly in seq order, polling until the body is stuck after each. Each ctx call
//! takes the next command counter (`cmd`) at once; on replay the journal's command events are
//! matched by kind and name at their `cmd`, and a mismatch parks the run as blocked with
//! [`NonDeterminism`] (`[EVE-ND-001]`). Once the journal is exhausted the body runs live:
//! new waits are appended before any step starts, steps run concurrently on tokio, and every
//! outcome is appended first and delivered to the body after, so a live run and every later
//! replay see the same events in the same order. A live body stays in memory between steps
//! and is replayed only after a suspension, an eviction or a crash.

/// A boxed, sendable future: what bodies, steps and clocks hand around.
pub(crate) type BoxFuture<T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;

mod agent;
mod args;
mod clock;
mod ctx;
mod error;
mod replay;
mod session;
mod step;
mod tool;
mod worker;

pub use agent::{
    agent_request_id, agent_token, complete_agent, AgentCall, AgentError, AgentHost, AgentStart,
    ScriptedAgentHost,
};
pub use clock::{Clock, ManualClock, SystemClock};
pub use ctx::{
    AbortSignal, Agent, Ask, Durable, Either, Hook, HookNext, IntoSleep, JoinAll, PayloadError,
    Race, Select, Sleep, SleepFor, StepFuture, TaskHandle, Webhook, WorkflowCtx, WEBHOOK_PATH,
};
pub use error::{
    EngineError, NonDeterminism, StepError, StepFailed, WorkflowError, CODE_BODY_PANIC,
    CODE_MISSING_WORKFLOW, CODE_NON_DETERMINISM, CODE_POISON, CODE_STUCK,
};
pub use replay::{GRACE_CMD, GUARD_CMD};
pub use session::*;
pub use step::{parse_duration, RetryPolicy, StepCtx};
pub use tool::{
    define_tool, define_workflow_tool, resume_hook, start_tool_call, tool_call_run, Approval,
    IntoTool, IntoWorkflowTool, Registrable, Registry, Tool, ToolCtx, Workflow, WorkflowTool,
    DEFAULT_GRACE,
};
pub(crate) use worker::host_name;
pub use worker::{
    default_worker_id, ActivationEnd, ReplayError, ReplayReport, Worker, WorkerConfig, WorkerHandle,
};
