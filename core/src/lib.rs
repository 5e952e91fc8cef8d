//! eve-core: durable workflow tools for AI agents.
//!
//! This crate holds the journal model ([`Event`], ids, the versioned [`codec`]), the
//! [`JournalStore`] contract every backend implements, [`StoreError`], and [`MemoryStore`], the
//! reference implementation. Backends live in their own crates (`eve-storage-sqlite`, …) and
//! prove the contract with `eve-conformance`.

pub mod codec;
pub mod engine;
pub mod error;
pub mod event;
pub mod ids;
pub mod keys;
pub mod memory;
pub mod search;
pub mod session;
pub mod store;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod time;
pub mod trace;
pub mod wake;
pub mod worker_lock;
pub mod wrap;

pub use error::StoreError;
pub use event::{
    AgentReply, AgentRequest, ApprovalRequest, Display, Event, Execution, InputOption,
    InputRequest, InputResponse, OptionStyle, Payload, ResetFrom, StoredEvent, WebhookRequest,
    WebhookResponse, MASKED_TOKEN_CHARS,
};
pub use ids::{
    check_client_id, AppendId, CallId, DeploymentId, InvalidId, RequestId, RunId, SessionId,
    WorkerId, WorkflowId, MAX_CLIENT_ID_BYTES,
};
pub use keys::{ApiKey, KeyScope};
pub use memory::MemoryStore;
pub use search::{AttributeError, Attributes, RunSearch};
pub use session::{
    QueuedMessage, SessionEnd, SessionEntry, SessionEvent, SessionRecord, ToolResult,
};
pub use store::{
    check_limits, reset_events, reset_limit, retry_point, search_runs, Append, Appended,
    CancelOutcome, CreatedRun, Delivered, Effects, FencingToken, JournalStore, JournalStoreExt,
    Lease, NewRun, PendingRequest, ResetOutcome, Resolution, RunFilter, RunPage, RunQuery,
    RunRecord, RunStatus, TerminateOutcome, RESET_LEASE_TTL,
};
pub use time::Timestamp;
pub use trace::{CollectingSink, Span, TraceContext, TraceSink};
pub use wake::{WakeSignal, WatchHub, WatchKey};
pub use worker_lock::WorkerLock;
pub use wrap::StoreWrapper;
