//! eve: durable workflow tools for AI agents, in one crate.
//!
//! A workflow tool is an `async fn` marked [`macro@workflow`]: a model calls it like any tool,
//! and its body may wait minutes or days (for a person's answer, a timer, a callback) while
//! every step's result is journaled, so a crash or a restart replays it to where it was.
//! [`macro@step`] marks the side effects, [`macro@tool`] an ordinary tool.
//!
//! ```
//! use eve::prelude::*;
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Refund {
//!     order: String,
//! }
//!
//! /// Refund an order once a person approves.
//! #[workflow]
//! async fn refund(ctx: WorkflowCtx, input: Refund) -> Result<String, WorkflowError> {
//!     let answer = ctx.ask(InputRequest::confirmation(format!("Refund {}?", input.order))).await;
//!     if answer.option_id.as_deref() != Some("approve") {
//!         return Ok("not refunded".into());
//!     }
//!     Ok(issue_refund(&ctx, input.order).await?)
//! }
//!
//! /// A step: runs once, its result recorded and replayed.
//! #[step(retries = 5, backoff = "2s")]
//! async fn issue_refund(order: String) -> Result<String, StepError> {
//!     Ok(format!("refunded {order}"))
//! }
//!
//! let registry = Registry::new("v1").with(refund);
//! assert!(registry.by_name("refund").is_some());
//! ```
//!
//! Backends are features: `sqlite` (default, [`sqlite`]), `postgres`, `dynamodb`; `server`
//! adds the HTTP server, `mcp` the MCP server, and `cli` `App`: your own `eve` command line
//! serving your tools (`App::new("my-deployment").tool(refund).run()`). The in-memory store is
//! [`MemoryStore`].

pub use eve_core::*;
pub use eve_macros::{step, tool, workflow};

#[cfg(feature = "cli")]
pub use eve_cli::App;
#[cfg(feature = "mcp")]
pub use eve_mcp as mcp;
#[cfg(feature = "server")]
pub use eve_server as server;
#[cfg(feature = "dynamodb")]
pub use eve_storage_dynamodb as dynamodb;
#[cfg(feature = "postgres")]
pub use eve_storage_postgres as postgres;
#[cfg(feature = "sqlite")]
pub use eve_storage_sqlite as sqlite;

/// What a tool module needs: `use eve::prelude::*;`.
pub mod prelude {
    pub use crate::engine::{
        AgentCall, Approval, Either, IntoWorkflowTool, Registry, RetryPolicy, Session, StepCtx,
        StepError, StepFuture, TaskHandle, ToolCtx, Worker, WorkerConfig, WorkflowCtx,
        WorkflowError,
    };
    pub use crate::{step, tool, workflow};
    pub use crate::{InputRequest, InputResponse, JournalStore, MemoryStore};
}
