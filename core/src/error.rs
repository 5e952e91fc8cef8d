//! Storage errors: one matchable kind per way a store call can fail. No backend types leak in.

use crate::ids::{RequestId, RunId, SessionId};

/// An error from a [`crate::JournalStore`] call.
///
/// Match on the kind; the message says what to do. [`StoreError::is_retryable`] tells transient
/// faults (retry the same call) from answers (retrying gives the same answer).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The thing named does not exist.
    #[error("{what} {id:?} not found")]
    NotFound {
        /// What kind of thing: "run", "hook token", "request", "worker".
        what: &'static str,
        /// Its id.
        id: String,
    },
    /// The thing named exists already and cannot be created again.
    #[error("{what} {id:?} already exists: {hint}")]
    AlreadyExists {
        /// What kind of thing: "run", "hook token".
        what: &'static str,
        /// Its id.
        id: String,
        /// What to do instead.
        hint: &'static str,
    },
    /// A conditional append lost: the journal's next seq is `actual`, not `expected`. Read the
    /// events from `expected`, deliver them, and append again at `actual`.
    #[error("append conflict on run {run}: expected next seq {expected}, journal is at {actual}; read the new events and append again")]
    Conflict {
        /// The run.
        run: RunId,
        /// The seq the append named.
        expected: u64,
        /// The journal's next seq.
        actual: u64,
    },
    /// The writer's lease was superseded (another worker claimed the run, or the worker
    /// re-registered with a newer epoch). Drop the run: it is someone else's now. With an empty
    /// `run`, the worker itself was fenced (a heartbeat or a claim): its id was registered again
    /// elsewhere or retired, and it must stop.
    #[error("{}", fenced_message(run, worker, *epoch))]
    Fenced {
        /// The run (empty for a worker-level fence such as a heartbeat).
        run: String,
        /// The worker.
        worker: String,
        /// The epoch the call carried.
        epoch: u64,
    },
    /// Another live holder (another process, or another worker of this one) holds this worker
    /// id (contract clause 11): two live processes with one id would fence each other's runs,
    /// so the later one refuses to start.
    #[error("worker id {worker:?} is in use by another live process ({holder}); stop that process first, or give this one its own worker id (WorkerConfig::id, `eve serve --worker-id`)")]
    WorkerIdInUse {
        /// The worker id.
        worker: String,
        /// Who holds it: pid, host and since when, as far as the backend knows.
        holder: String,
    },
    /// The request was answered already with a different response. Ask again for a new answer.
    #[error("request {request} was already answered; a request is answered once, ask again for a new answer")]
    AlreadyAnswered {
        /// The request.
        request: RequestId,
    },
    /// The request can no longer be answered: its run ended or withdrew it.
    #[error("request {request} was withdrawn (its run ended); it can no longer be answered")]
    Withdrawn {
        /// The request.
        request: RequestId,
    },
    /// The answer is not one the request accepts (an option not offered, text where only options
    /// are allowed).
    #[error("invalid answer to request {request}: {reason}")]
    InvalidAnswer {
        /// The request.
        request: RequestId,
        /// What was wrong.
        reason: String,
    },
    /// The run has ended; it takes no more deliveries or appends.
    #[error("run {run} has ended; it takes no more events")]
    RunEnded {
        /// The run.
        run: RunId,
    },
    /// The run has not ended, so it cannot be reset or retried (a reset copies an ended run's
    /// journal into a new run; two live runs of one call would both act). Terminate or cancel
    /// it first.
    #[error("run {run} is {status}, not ended: terminate or cancel it first (`eve runs terminate`, `eve runs cancel`), then reset or retry it")]
    RunNotEnded {
        /// The run.
        run: RunId,
        /// Its status (`running` or `blocked`).
        status: &'static str,
    },
    /// The session was ended: it starts no new run and queues no message. Start a new
    /// session.
    #[error("session {session} has ended; it starts no new tool calls and takes no messages: start a new session")]
    SessionEnded {
        /// The session.
        session: SessionId,
    },
    /// An idempotency key was reused with a different input.
    #[error("idempotency key {key:?} was used before with a different input (run {existing}); use a new key for a new call")]
    IdempotencyMismatch {
        /// The key.
        key: String,
        /// The run the key already names.
        existing: RunId,
    },
    /// The call's arguments break the contract (an empty key, an empty event list, a read past
    /// the end, a RunStarted outside seq 0). Fix the caller.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A limit of the contract was exceeded. Split the work or shrink the payload.
    #[error("limit exceeded: {what} is {actual}, the limit is {limit}")]
    LimitExceeded {
        /// What was measured.
        what: &'static str,
        /// Its size.
        actual: usize,
        /// The limit.
        limit: usize,
    },
    /// A stored row could not be decoded (unknown format version, truncated or corrupted bytes).
    /// Nothing was changed; an operator must inspect the row.
    #[error("corrupt journal row for run {run} at seq {seq}: {reason}")]
    Corrupt {
        /// The run.
        run: RunId,
        /// The first seq of the row.
        seq: u64,
        /// What was wrong.
        reason: String,
    },
    /// A stored event was written by a newer eve, in an event format this build cannot read
    /// (contract: a newer version's data is refused, never misread). Nothing was changed;
    /// upgrade eve to at least the version that wrote it.
    #[error("journal row for run {run} at seq {seq} was written by a newer eve (event format version {version}; this build reads versions up to {supported}); upgrade eve to read it")]
    FormatTooNew {
        /// The run.
        run: RunId,
        /// The first seq of the row.
        seq: u64,
        /// The row's format version.
        version: u16,
        /// The newest format version this build reads ([`crate::codec::FORMAT_VERSION`]).
        supported: u16,
    },
    /// A transient fault (connection lost, throttled, busy). Retry the call; appends carry an
    /// append id, so a retry of an append that landed is answered as success.
    #[error("store unavailable ({backend}): {message}; retry the call")]
    Unavailable {
        /// The backend.
        backend: &'static str,
        /// What happened.
        message: String,
    },
    /// The store's storage is full (the disk, or a size limit the store was given): nothing of
    /// the call was written. Reads still work; writes succeed again once an operator frees
    /// space (or raises the limit). Retrying at once gives the same answer.
    #[error("the {backend} store cannot write: {path} is full (its disk, or the store's size limit); free disk space or raise the limit, then retry: nothing of this call was written, and reads still work")]
    StorageFull {
        /// The backend.
        backend: &'static str,
        /// The file (or volume) that is full.
        path: String,
    },
    /// Any other backend failure.
    #[error("{backend} store error: {source}")]
    Other {
        /// The backend.
        backend: &'static str,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl StoreError {
    /// Whether the same call may succeed if retried (a transient fault). A `Conflict` is not
    /// retryable as is: it needs a re-read and a new `expected_seq`.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }

    /// Shorthand for [`StoreError::NotFound`].
    pub fn not_found(what: &'static str, id: impl ToString) -> Self {
        StoreError::NotFound {
            what,
            id: id.to_string(),
        }
    }
}

/// The message of [`StoreError::Fenced`]: a run's lease, or (empty `run`) the worker's own.
fn fenced_message(run: &str, worker: &str, epoch: u64) -> String {
    if run.is_empty() {
        format!("worker {worker} epoch {epoch} was fenced: the same worker id was registered again (by another process, or a restart) or retired; this worker stops and leaves its runs to the new registration")
    } else {
        format!("lease fenced on run {run}: worker {worker} epoch {epoch} no longer holds it; drop the run from memory")
    }
}
