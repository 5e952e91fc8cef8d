//! Engine errors, kept apart from storage errors: configuration errors (non-determinism, a
//! missing workflow, a bad input), application errors (a step or body error) and infrastructure
//! errors (the store).

use crate::error::StoreError;
use std::fmt;
use std::time::Duration;

/// Stable code of a non-determinism error: search for it in the docs.
pub const CODE_NON_DETERMINISM: &str = "EVE-ND-001";
/// Stable code of a body that panicked.
pub const CODE_BODY_PANIC: &str = "EVE-PANIC-001";
/// Stable code of a body that waits on something that is not a durable operation.
pub const CODE_STUCK: &str = "EVE-STUCK-001";
/// Stable code of a run parked after too many failed activations.
pub const CODE_POISON: &str = "EVE-POISON-001";
/// Stable code of a run whose workflow is missing from the worker's registry.
pub const CODE_MISSING_WORKFLOW: &str = "EVE-MISSING-001";

/// The body issued a different command than the journal recorded at `cmd`. The run is parked
/// as blocked (never retried in a loop) until a fixed deployment resumes it or an operator fails
/// it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("[{code}] non-determinism at command {cmd}: the journal recorded {expected}, the body issued {found}; {hint}", code = CODE_NON_DETERMINISM)]
pub struct NonDeterminism {
    /// The command counter where replay diverged.
    pub cmd: u64,
    /// What the journal recorded there (e.g. `step "charge"`).
    pub expected: String,
    /// What the body issued there (e.g. `step "refund"`, or `nothing`).
    pub found: String,
    /// What probably changed, and what to do.
    pub hint: String,
}

/// Why a step attempt failed, as the step closure reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepError {
    /// Never retried: the step fails at once.
    Fatal(String),
    /// Retried by the step's [`RetryPolicy`](super::RetryPolicy); `retry_after` overrides the
    /// policy's backoff for the next attempt.
    Retryable {
        /// What went wrong.
        message: String,
        /// Wait this long before the next attempt instead of the policy's backoff.
        retry_after: Option<Duration>,
    },
}

impl StepError {
    /// A fatal error: never retried.
    pub fn fatal(message: impl fmt::Display) -> Self {
        StepError::Fatal(message.to_string())
    }

    /// A retryable error with the policy's backoff.
    pub fn retryable(message: impl fmt::Display) -> Self {
        StepError::Retryable {
            message: message.to_string(),
            retry_after: None,
        }
    }

    /// A retryable error that asks for the next attempt after `retry_after`.
    pub fn retry_after(message: impl fmt::Display, retry_after: Duration) -> Self {
        StepError::Retryable {
            message: message.to_string(),
            retry_after: Some(retry_after),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        match self {
            StepError::Fatal(m) | StepError::Retryable { message: m, .. } => m,
        }
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepError::Fatal(m) => write!(f, "fatal: {m}"),
            StepError::Retryable { message, .. } => write!(f, "{message}"),
        }
    }
}

impl std::error::Error for StepError {}

impl From<std::io::Error> for StepError {
    fn from(e: std::io::Error) -> Self {
        StepError::retryable(e)
    }
}

impl From<serde_json::Error> for StepError {
    fn from(e: serde_json::Error) -> Self {
        StepError::fatal(format!("step output does not (de)serialize: {e}"))
    }
}

/// An engine call made in a step ([`StepCtx::start_call`](super::StepCtx::start_call),
/// [`StepCtx::resume_hook`](super::StepCtx::resume_hook)) that failed, as the step's error (so
/// `?` works in a step): fatal when no retry can succeed (an unknown tool, an invalid input,
/// an idempotency key reused with another input, an ended session or run, a limit, a corrupt
/// row), retryable otherwise (a transient fault, a hook not created yet, an unknown backend
/// failure).
impl From<EngineError> for StepError {
    fn from(e: EngineError) -> Self {
        let fatal = matches!(
            e,
            EngineError::InvalidInput { .. }
                | EngineError::UnknownTool { .. }
                | EngineError::InvalidDuration { .. }
        ) || matches!(
            &e,
            EngineError::Store(
                StoreError::AlreadyExists { .. }
                    | StoreError::IdempotencyMismatch { .. }
                    | StoreError::InvalidInput(_)
                    | StoreError::LimitExceeded { .. }
                    | StoreError::Corrupt { .. }
                    | StoreError::SessionEnded { .. }
                    | StoreError::RunEnded { .. }
                    | StoreError::AlreadyAnswered { .. }
                    | StoreError::Withdrawn { .. }
                    | StoreError::InvalidAnswer { .. }
            )
        );
        if fatal {
            StepError::fatal(e)
        } else {
            StepError::retryable(e)
        }
    }
}

/// A step that failed for good: a fatal error, or its retries are exhausted. Escaping the body
/// (with `?`) fails the run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("step {name:?} (command {cmd}) failed after {attempts} attempt(s): {message}")]
pub struct StepFailed {
    /// The step's name.
    pub name: String,
    /// Its command counter.
    pub cmd: u64,
    /// Attempts made.
    pub attempts: u32,
    /// The last attempt's error.
    pub message: String,
    /// Whether the last error was fatal (not retried).
    pub fatal: bool,
}

/// An error that ends a workflow body: the run fails with its message.
#[derive(Debug)]
pub struct WorkflowError {
    message: String,
}

impl WorkflowError {
    /// A body error with this message.
    pub fn new(message: impl fmt::Display) -> Self {
        Self {
            message: message.to_string(),
        }
    }

    /// The message the run fails with.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for WorkflowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl<E: std::error::Error> From<E> for WorkflowError {
    fn from(e: E) -> Self {
        Self::new(e)
    }
}

/// What [`start_tool_call`](super::start_tool_call) and other engine entry points can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The tool input was not a JSON object matching the tool's input type. No run was created.
    #[error("invalid input for tool {tool:?}: {reason}; the input must be a JSON object matching the tool's input schema")]
    InvalidInput {
        /// The tool.
        tool: String,
        /// What was wrong.
        reason: String,
    },
    /// No tool of that name or workflow id in the registry.
    #[error("[{code}] no workflow tool {name:?} in this registry; register it with Registry::register", code = CODE_MISSING_WORKFLOW)]
    UnknownTool {
        /// The name looked up.
        name: String,
    },
    /// A duration string that humantime-style parsing rejects.
    #[error(
        "invalid duration {input:?}: {reason} (write e.g. \"30s\", \"4h\", \"1h 30m\", \"500ms\")"
    )]
    InvalidDuration {
        /// The string.
        input: String,
        /// Why.
        reason: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The tool is an ordinary tool of default execution: it runs inline in the call
    /// (`Registry::ordinary`, then `Tool::call`), so no run is started for it.
    #[error("tool {name:?} is an ordinary tool: it runs inline in the call, not as a run; call it with Registry::ordinary(name) and Tool::call, or make it #[tool(background)]")]
    InlineTool {
        /// The tool's name.
        name: String,
    },
    /// An ordinary tool of default execution was given an approval policy
    /// (`Tool::needs_approval` / `Tool::approval`, `#[tool(approval)]`): it runs inline in the
    /// call, with no run to journal the approval request in, so it is not registered.
    #[error("tool {name:?} has an approval policy but runs inline in the call, with no run to journal the approval in; make it a background tool (Tool::background, #[tool(background, approval)]) or drop the policy")]
    ApprovalNeedsBackground {
        /// The tool's name.
        name: String,
    },
}
