//! Test helpers (feature `test-util`): a fault-injecting [`JournalStore`] wrapper for crash and
//! ambiguous-commit tests, reused by the engine-level conformance suite and the benches.

use crate::error::StoreError;
use crate::event::StoredEvent;
use crate::ids::RunId;
use crate::store::JournalStore;
use crate::wrap::{Call, StoreWrapper, OUTSIDE_FAULTS};
use async_trait::async_trait;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A memory figure of this process in KiB from Linux's `/proc/self/status`: `field` is e.g.
/// `"VmRSS"` (resident now) or `"VmHWM"` (peak resident). `None` where the platform does not
/// report it. For the benches' memory figures.
pub fn proc_status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| {
        l.strip_prefix(field)
            .is_some_and(|rest| rest.starts_with(':'))
    })?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// What a [`FaultyStore`] does to the calls it wraps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Fault {
    /// Pass every call through.
    #[default]
    None,
    /// The process "crashes" after `n` calls went through: call `n + 1` and every later call
    /// fail with `Unavailable` without reaching the store, until [`FaultyStore::heal`].
    CrashAfter(u64),
    /// Call `n + 1` is performed on the store, then answered with `Unavailable` (an ambiguous
    /// commit: the write landed but the caller cannot know); later calls pass.
    AmbiguousAt(u64),
    /// Like [`Fault::AmbiguousAt`], then every later call fails too (the process died right
    /// after the write landed).
    AmbiguousThenCrash(u64),
    /// Every call waits, unanswered, until the fault is changed (a store that is partitioned
    /// away: connections hang rather than fail); then it goes through.
    Stall,
}

/// A [`JournalStore`] wrapper that injects a [`Fault`] and counts calls.
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn JournalStore>,
    calls: AtomicU64,
    fault: Mutex<Fault>,
    /// Names of the calls seen, in order (for messages).
    log: Mutex<Vec<&'static str>>,
    /// Journal events returned by `read` since the fault was set.
    events_read: AtomicU64,
}

impl FaultyStore {
    /// Wraps `inner` with no fault.
    pub fn new(inner: Arc<dyn JournalStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            calls: AtomicU64::new(0),
            fault: Mutex::new(Fault::None),
            log: Mutex::new(Vec::new()),
            events_read: AtomicU64::new(0),
        })
    }

    /// Sets the fault and resets the call counter.
    pub fn set_fault(&self, fault: Fault) {
        *self.fault.lock().expect("fault lock") = fault;
        self.calls.store(0, Ordering::SeqCst);
        self.events_read.store(0, Ordering::SeqCst);
        self.log.lock().expect("log lock").clear();
    }

    /// Journal events returned by `read` since the fault was set.
    pub fn events_read(&self) -> u64 {
        self.events_read.load(Ordering::SeqCst)
    }

    /// Removes the fault (a restarted process).
    pub fn heal(&self) {
        self.set_fault(Fault::None);
    }

    /// Calls made since the fault was set (including failed ones).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Names of the calls made since the fault was set.
    pub fn call_log(&self) -> Vec<&'static str> {
        self.log.lock().expect("log lock").clone()
    }

    /// Whether the fault fired (a crash or an ambiguous commit happened).
    pub fn tripped(&self) -> bool {
        let n = self.calls();
        match *self.fault.lock().expect("fault lock") {
            Fault::None => false,
            Fault::Stall => n > 0,
            Fault::CrashAfter(k) | Fault::AmbiguousAt(k) | Fault::AmbiguousThenCrash(k) => n > k,
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<dyn JournalStore> {
        &self.inner
    }

    fn unavailable(what: &str) -> StoreError {
        StoreError::Unavailable {
            backend: "faulty",
            message: format!("injected fault on {what}"),
        }
    }

    async fn call<T, F>(&self, what: &'static str, f: F) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = Result<T, StoreError>>,
    {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        self.log.lock().expect("log lock").push(what);
        let fault = *self.fault.lock().expect("fault lock");
        match fault {
            Fault::None => f.await,
            Fault::Stall => {
                while *self.fault.lock().expect("fault lock") == Fault::Stall {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                f.await
            }
            Fault::CrashAfter(k) if n >= k => Err(Self::unavailable(what)),
            Fault::CrashAfter(_) => f.await,
            Fault::AmbiguousAt(k) if n == k => {
                let _ = f.await;
                Err(Self::unavailable(what))
            }
            Fault::AmbiguousAt(_) => f.await,
            Fault::AmbiguousThenCrash(k) if n == k => {
                let _ = f.await;
                Err(Self::unavailable(what))
            }
            Fault::AmbiguousThenCrash(k) if n > k => Err(Self::unavailable(what)),
            Fault::AmbiguousThenCrash(_) => f.await,
        }
    }
}

#[async_trait]
impl StoreWrapper for FaultyStore {
    fn wrapped(&self) -> &dyn JournalStore {
        &*self.inner
    }

    fn around<'a, T: Send + 'a>(&'a self, method: &'static str, call: Call<'a, T>) -> Call<'a, T> {
        if OUTSIDE_FAULTS.contains(&method) {
            return call;
        }
        Box::pin(self.call(method, call))
    }

    async fn read(
        &self,
        run: &RunId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let page = self
            .around("read", self.inner.read(run, from_seq, max))
            .await?;
        self.events_read
            .fetch_add(page.len() as u64, Ordering::SeqCst);
        Ok(page)
    }
}

/// Canned workflows and journals for benches and engine tests.
pub mod canned {
    use crate::engine::{define_workflow_tool, WorkflowCtx, WorkflowError, WorkflowTool};
    use crate::error::StoreError;
    use crate::event::{Event, Execution, Payload};
    use crate::ids::{AppendId, CallId, DeploymentId, RunId, SessionId, WorkerId};
    use crate::store::{Append, JournalStore, NewRun, MAX_EVENTS_PER_APPEND};
    use crate::time::Timestamp;
    use std::time::Duration;

    /// Input of [`noop_steps`].
    #[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
    pub struct Steps {
        /// How many steps.
        pub steps: u32,
    }

    /// The body: `steps` sequential no-op steps named `"noop"`, each returning its index;
    /// returns the count.
    pub async fn noop_steps(ctx: WorkflowCtx, input: Steps) -> Result<u32, WorkflowError> {
        for i in 0..input.steps {
            ctx.step("noop", move |_| async move { Ok(i) }).await?;
        }
        Ok(input.steps)
    }

    /// Input of [`nap`].
    #[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
    pub struct Nap {
        /// How long: "1h", "30s", …
        pub delay: String,
    }

    /// The body: one durable sleep.
    pub async fn nap(ctx: WorkflowCtx, input: Nap) -> Result<(), WorkflowError> {
        ctx.sleep(&input.delay).await;
        Ok(())
    }

    /// The [`nap`] tool (name `canned_nap`), for parked-run benchmarks.
    pub fn nap_tool() -> WorkflowTool {
        define_workflow_tool("One durable sleep, for benchmarks.", crate::workflow!(nap))
            .named("canned_nap")
    }

    /// The [`noop_steps`] tool (workflow id `testing::canned::noop_steps`, name `canned`).
    pub fn noop_steps_tool() -> WorkflowTool {
        define_workflow_tool("No-op steps, for benchmarks.", crate::workflow!(noop_steps))
    }

    /// Creates a run of [`noop_steps_tool`] in `deployment` whose journal already holds `steps`
    /// completed steps (appended 100 per append by a throwaway worker, which then retires,
    /// leaving the run unclaimable): what a cold replay benchmark reads back. The throwaway
    /// worker claims every claimable run of `deployment`, so use one no real worker serves.
    ///
    /// # Errors
    /// The store's errors.
    pub async fn completed_steps_run(
        store: &dyn JournalStore,
        deployment: &str,
        steps: u32,
        now: Timestamp,
    ) -> Result<RunId, StoreError> {
        let run = RunId::random();
        let tool = noop_steps_tool();
        store
            .create_run(
                NewRun {
                    run_id: run.clone(),
                    idempotency_key: Some(format!("canned/{run}")),
                    workflow_id: tool.workflow_id().clone(),
                    deployment_id: DeploymentId::new(deployment),
                    tool: tool.name().to_owned(),
                    input: Payload::from_value(&serde_json::json!({ "steps": steps }))
                        .expect("json"),
                    session_id: SessionId::new("canned"),
                    call_id: CallId::new(run.as_str()),
                    execution: Execution::Default,
                    traceparent: None,
                    reset_from: None,
                },
                now,
            )
            .await?;
        let worker = WorkerId::new(format!("canned-{run}"));
        let lease = store
            .register_worker(
                &worker,
                &DeploymentId::new(deployment),
                Duration::from_secs(3600),
                now,
            )
            .await?;
        store.claim(&lease, usize::MAX, now).await?;
        let mut next = 1;
        let events: Vec<Event> = (0..steps)
            .map(|i| Event::StepCompleted {
                cmd: u64::from(i),
                name: "noop".into(),
                attempt: 1,
                output: Payload::from_value(&i).expect("json"),
            })
            .collect();
        for chunk in events.chunks(MAX_EVENTS_PER_APPEND) {
            let done = store
                .append(Append {
                    run: run.clone(),
                    expected_seq: next,
                    lease: lease.clone(),
                    append_id: AppendId::random(),
                    events: chunk.to_vec(),
                    now,
                })
                .await?;
            next = done.next_seq;
        }
        store.retire_worker(&lease, now).await?;
        Ok(run)
    }
}

/// How many cases a fuzz test runs: `EVE_FUZZ_CASES=N` if set, a million with `EVE_FUZZ_DEEP=1`
/// (the deep mode of README "Fuzzing"), else `default` (what CI runs).
///
/// # Panics
/// When `EVE_FUZZ_CASES` is not a number.
#[must_use]
pub fn fuzz_cases(default: u32) -> u32 {
    if let Ok(v) = std::env::var("EVE_FUZZ_CASES") {
        return v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("EVE_FUZZ_CASES={v:?} is not a number"));
    }
    match std::env::var("EVE_FUZZ_DEEP").as_deref() {
        Ok("1" | "true" | "yes") => 1_000_000,
        _ => default,
    }
}
