//! Test helpers (feature `test-util`): a fault-injecting [`JournalStore`] wrapper for crash and
//! ambiguous-commit tests, reused by the engine-level conformance suite and the benches.

use crate::error::StoreError;
use crate::event::{InputResponse, Payload, StoredEvent};
use crate::ids::{DeploymentId, RequestId, RunId, SessionId, WorkerId};
use crate::session::SessionEntry;
use crate::store::{
    Append, Appended, CancelOutcome, CreatedRun, Delivered, JournalStore, Lease, NewRun,
    PendingRequest, Resolution, RunQuery, RunRecord,
};
use crate::time::Timestamp;
use async_trait::async_trait;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
}

/// A [`JournalStore`] wrapper that injects a [`Fault`] and counts calls.
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn JournalStore>,
    calls: AtomicU64,
    fault: Mutex<Fault>,
    /// Names of the calls seen, in order (for messages).
    log: Mutex<Vec<&'static str>>,
}

impl FaultyStore {
    /// Wraps `inner` with no fault.
    pub fn new(inner: Arc<dyn JournalStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            calls: AtomicU64::new(0),
            fault: Mutex::new(Fault::None),
            log: Mutex::new(Vec::new()),
        })
    }

    /// Sets the fault and resets the call counter.
    pub fn set_fault(&self, fault: Fault) {
        *self.fault.lock().expect("fault lock") = fault;
        self.calls.store(0, Ordering::SeqCst);
        self.log.lock().expect("log lock").clear();
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
impl JournalStore for FaultyStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn create_run(&self, run: NewRun, now: Timestamp) -> Result<CreatedRun, StoreError> {
        self.call("create_run", self.inner.create_run(run, now))
            .await
    }

    async fn append(&self, append: Append) -> Result<Appended, StoreError> {
        self.call("append", self.inner.append(append)).await
    }

    async fn read(
        &self,
        run: &RunId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.call("read", self.inner.read(run, from_seq, max)).await
    }

    async fn get_run(&self, run: &RunId) -> Result<RunRecord, StoreError> {
        self.call("get_run", self.inner.get_run(run)).await
    }

    async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        self.call("list_runs", self.inner.list_runs(query)).await
    }

    async fn answer(
        &self,
        request: &RequestId,
        response: InputResponse,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        self.call("answer", self.inner.answer(request, response, now))
            .await
    }

    async fn deliver_hook(
        &self,
        token: &str,
        payload: Payload,
        dedupe_key: Option<&str>,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        self.call(
            "deliver_hook",
            self.inner.deliver_hook(token, payload, dedupe_key, now),
        )
        .await
    }

    async fn request_cancel(
        &self,
        run: &RunId,
        reason: &str,
        now: Timestamp,
    ) -> Result<CancelOutcome, StoreError> {
        self.call(
            "request_cancel",
            self.inner.request_cancel(run, reason, now),
        )
        .await
    }

    async fn resolve_blocked(
        &self,
        run: &RunId,
        resolution: Resolution,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        self.call(
            "resolve_blocked",
            self.inner.resolve_blocked(run, resolution, now),
        )
        .await
    }

    async fn pending_requests(
        &self,
        session: &SessionId,
    ) -> Result<Vec<PendingRequest>, StoreError> {
        self.call("pending_requests", self.inner.pending_requests(session))
            .await
    }

    async fn read_session(
        &self,
        session: &SessionId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<SessionEntry>, StoreError> {
        self.call(
            "read_session",
            self.inner.read_session(session, from_seq, max),
        )
        .await
    }

    async fn register_worker(
        &self,
        worker: &WorkerId,
        deployment: &DeploymentId,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        self.call(
            "register_worker",
            self.inner.register_worker(worker, deployment, ttl, now),
        )
        .await
    }

    async fn heartbeat(
        &self,
        lease: &Lease,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        self.call("heartbeat", self.inner.heartbeat(lease, ttl, now))
            .await
    }

    async fn claim(
        &self,
        lease: &Lease,
        max: usize,
        now: Timestamp,
    ) -> Result<Vec<RunRecord>, StoreError> {
        self.call("claim", self.inner.claim(lease, max, now)).await
    }

    async fn release(
        &self,
        lease: &Lease,
        run: &RunId,
        processed_seq: u64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.call(
            "release",
            self.inner.release(lease, run, processed_seq, now),
        )
        .await
    }

    async fn retire_worker(&self, lease: &Lease, now: Timestamp) -> Result<(), StoreError> {
        self.call("retire_worker", self.inner.retire_worker(lease, now))
            .await
    }

    async fn next_wake(
        &self,
        deployment: &DeploymentId,
        now: Timestamp,
    ) -> Result<Option<Timestamp>, StoreError> {
        self.call("next_wake", self.inner.next_wake(deployment, now))
            .await
    }
}
