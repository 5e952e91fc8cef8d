//! Small builders the cases share: fresh stores, runs, workers, events and appends.

use crate::{Opened, StoreFactory};
use eve_core::{
    Append, AppendId, Appended, CallId, DeploymentId, Event, Execution, InputOption, InputRequest,
    JournalStore, JournalStoreExt, Lease, NewRun, Payload, RequestId, RunId, RunRecord, SessionId,
    StoreError, StoredEvent, Timestamp, WorkerId, WorkflowId,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The simulated clock every case starts from (2023-11-14, in ms).
pub const T0: Timestamp = Timestamp(1_700_000_000_000);
/// The lease length cases register workers with.
pub const TTL: Duration = Duration::from_secs(30);
/// The deployment cases use.
pub const DEPLOYMENT: &str = "conformance-deployment";

/// `T0` plus `ms` milliseconds.
pub fn at(ms: i64) -> Timestamp {
    Timestamp(T0.0 + ms)
}

/// Fresh isolated storage from `factory`, panicking with the backend's error.
pub async fn fresh(factory: &dyn StoreFactory) -> Opened {
    factory
        .create()
        .await
        .unwrap_or_else(|e| panic!("StoreFactory::create failed: {e}"))
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A process-unique suffix, so ids of one case never collide with another's on a shared server.
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}

/// A start request with unique run, session and call ids, on [`DEPLOYMENT`].
pub fn new_run(tag: &str) -> NewRun {
    NewRun {
        run_id: RunId::new(unique(&format!("run-{tag}"))),
        idempotency_key: None,
        workflow_id: WorkflowId::new("conformance::workflow"),
        deployment_id: DeploymentId::new(DEPLOYMENT),
        tool: "conformance_tool".into(),
        input: json(r#"{"tag": "input"}"#),
        session_id: SessionId::new(unique("session")),
        call_id: CallId::new(unique("call")),
        execution: Execution::Default,
        traceparent: None,
        reset_from: None,
    }
}

/// A payload from JSON text (kept byte for byte).
///
/// # Panics
/// When `s` is not valid JSON.
pub fn json(s: &str) -> Payload {
    Payload::from_json(s.to_owned()).unwrap_or_else(|e| panic!("test JSON {s:?} is invalid: {e}"))
}

/// A `StepCompleted` of `cmd` with output `out` (JSON text).
pub fn step(cmd: u64, out: &str) -> Event {
    Event::StepCompleted {
        cmd,
        name: format!("step{cmd}"),
        attempt: 1,
        output: json(out),
    }
}

/// A `HookCreated` of `cmd`.
pub fn hook(cmd: u64, token: &str) -> Event {
    Event::HookCreated {
        cmd,
        token: token.to_owned(),
        webhook: false,
        respond_with: None,
    }
}

/// An `InputRequested` at `cmd` of `run` offering options "yes" and "no", with free text allowed.
pub fn ask(run: &RunId, cmd: u64) -> (RequestId, Event) {
    let id = RequestId::for_command(run, cmd);
    let opt = |id: &str| InputOption {
        id: id.into(),
        label: id.to_uppercase(),
        description: None,
        style: None,
    };
    let event = Event::InputRequested {
        cmd,
        request_id: id.clone(),
        request: InputRequest {
            prompt: format!("question {cmd}?"),
            display: eve_core::Display::Confirmation,
            options: vec![opt("yes"), opt("no")],
            allow_freeform: true,
            agent: None,
            approval: None,
        },
    };
    (id, event)
}

/// A `SleepScheduled` of `cmd` waking at `wake_at`.
pub fn sleep(cmd: u64, wake_at: Timestamp) -> Event {
    Event::SleepScheduled { cmd, wake_at }
}

/// `RunCompleted` with output `out` (JSON text).
pub fn completed(out: &str) -> Event {
    Event::RunCompleted { output: json(out) }
}

/// Registers a worker with a unique id on [`DEPLOYMENT`].
pub async fn worker(store: &dyn JournalStore, now: Timestamp) -> Lease {
    let id = WorkerId::new(unique("worker"));
    store
        .register_worker(&id, &DeploymentId::new(DEPLOYMENT), TTL, now)
        .await
        .unwrap_or_else(|e| panic!("register_worker failed: {e}"))
}

/// Claims with `lease` until `run` is among the claimed runs (it must be claimable).
pub async fn claim_run(store: &dyn JournalStore, lease: &Lease, run: &RunId, now: Timestamp) {
    let claimed = store
        .claim(lease, 1000, now)
        .await
        .unwrap_or_else(|e| panic!("claim failed: {e}"));
    assert!(
        claimed.iter().any(|r| &r.run_id == run),
        "run {run} should be claimable at {now} and claimed by {}; claim gave {:?}",
        lease.worker,
        claimed
            .iter()
            .map(|r| r.run_id.as_str())
            .collect::<Vec<_>>()
    );
}

/// Creates a run and claims it with a new worker: the usual start of a case.
pub async fn started(store: &dyn JournalStore, new: NewRun, now: Timestamp) -> (RunRecord, Lease) {
    let created = store
        .create_run(new, now)
        .await
        .unwrap_or_else(|e| panic!("create_run failed: {e}"));
    assert!(created.created, "a fresh run id and key must create a run");
    let lease = worker(store, now).await;
    claim_run(store, &lease, &created.run.run_id, now).await;
    (created.run, lease)
}

/// An append with a fresh append id.
pub fn append(
    run: &RunId,
    expected_seq: u64,
    lease: &Lease,
    events: Vec<Event>,
    now: Timestamp,
) -> Append {
    Append {
        run: run.clone(),
        expected_seq,
        lease: lease.clone(),
        append_id: AppendId::random(),
        events,
        now,
    }
}

/// Appends and panics with the error if it fails.
pub async fn must_append(store: &dyn JournalStore, a: Append) -> Appended {
    let what = format!("append to {} at seq {}", a.run, a.expected_seq);
    store
        .append(a)
        .await
        .unwrap_or_else(|e| panic!("{what} failed: {e}"))
}

/// The whole journal, panicking on error.
pub async fn journal(store: &dyn JournalStore, run: &RunId) -> Vec<StoredEvent> {
    store
        .read_all(run, 0)
        .await
        .unwrap_or_else(|e| panic!("reading the journal of {run} failed: {e}"))
}

/// The run's record, panicking on error.
pub async fn record(store: &dyn JournalStore, run: &RunId) -> RunRecord {
    store
        .get_run(run)
        .await
        .unwrap_or_else(|e| panic!("get_run({run}) failed: {e}"))
}

/// Asserts that `result` is an error matching `pattern`, naming `what` in the message.
#[macro_export]
macro_rules! assert_err {
    ($result:expr, $pattern:pat, $($what:tt)+) => {
        match $result {
            Err($pattern) => {}
            other => panic!(
                "{}: expected Err({}), got {:?}",
                format_args!($($what)+),
                stringify!($pattern),
                other
            ),
        }
    };
}

/// Shorthand: an error is a `StoreError` (keeps the cases' imports short).
pub type Res<T> = Result<T, StoreError>;

/// Calls `f` again while it fails with a retryable error ([`StoreError::is_retryable`]: a
/// transient fault such as DynamoDB's transaction contention), as a real client would, with a
/// short backoff; up to 30 attempts. Any other outcome is returned as is.
///
/// # Errors
/// The last error.
pub async fn retrying<T, F, Fut>(mut f: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut attempt = 0u64;
    loop {
        match f().await {
            Err(e) if e.is_retryable() && attempt < 30 => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(2 * attempt)).await;
            }
            r => return r,
        }
    }
}
