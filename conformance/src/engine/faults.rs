//! [`Faults`]: a fault-injecting [`JournalStore`] wrapper for one worker (like
//! `eve_core::testing::FaultyStore`, which it mirrors), that also tells at which call the
//! fault fired.

use async_trait::async_trait;
use eve_core::session::SessionEntry;
use eve_core::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a [`Faults`] does to the calls it wraps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Fault {
    /// Pass every call through.
    #[default]
    None,
    /// Calls `n + 1` on fail with `Unavailable` without reaching the store (the process died).
    CrashAfter(u64),
    /// Call `n + 1` reaches the store and then answers `Unavailable`; later calls pass.
    AmbiguousAt(u64),
    /// Call `n + 1` reaches the store and answers `Unavailable`; every later call fails.
    AmbiguousThenCrash(u64),
}

/// A [`JournalStore`] wrapper injecting one [`Fault`] and counting calls.
#[derive(Debug)]
pub struct Faults {
    inner: Arc<dyn JournalStore>,
    calls: AtomicU64,
    fault: Mutex<Fault>,
    log: Mutex<Vec<&'static str>>,
    fired: AtomicBool,
    fired_at: AtomicU64,
    dead: AtomicBool,
}

impl Faults {
    /// Wraps `inner`, passing calls through until [`Faults::arm`].
    pub fn new(inner: Arc<dyn JournalStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            calls: AtomicU64::new(0),
            fault: Mutex::new(Fault::None),
            log: Mutex::new(Vec::new()),
            fired: AtomicBool::new(false),
            fired_at: AtomicU64::new(0),
            dead: AtomicBool::new(false),
        })
    }

    /// Sets the fault and starts counting calls from zero.
    pub fn arm(&self, fault: Fault) {
        *self.fault.lock().expect("fault lock") = fault;
        self.calls.store(0, Ordering::SeqCst);
        self.log.lock().expect("log lock").clear();
    }

    fn fault(&self) -> Fault {
        *self.fault.lock().expect("fault lock")
    }

    /// Calls made (including failed ones).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Whether the fault fired.
    pub fn tripped(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }

    /// The name of the call the fault fired at.
    pub fn fired_at(&self) -> Option<&'static str> {
        let k = self.fired_at.load(Ordering::SeqCst);
        self.log
            .lock()
            .expect("log lock")
            .get(usize::try_from(k).ok()?)
            .copied()
    }

    fn unavailable(what: &str) -> StoreError {
        StoreError::Unavailable {
            backend: "faulty",
            message: format!("injected fault on {what}"),
        }
    }

    fn fire(&self, n: u64) {
        self.fired_at.store(n, Ordering::SeqCst);
        self.fired.store(true, Ordering::SeqCst);
    }

    async fn call<T, F>(&self, what: &'static str, f: F) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = Result<T, StoreError>>,
    {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        self.log.lock().expect("log lock").push(what);
        if self.dead.load(Ordering::SeqCst) {
            return Err(Self::unavailable(what));
        }
        let (ambiguous, die) = match self.fault() {
            Fault::CrashAfter(k) if n >= k => {
                self.fire(n);
                self.dead.store(true, Ordering::SeqCst);
                return Err(Self::unavailable(what));
            }
            Fault::AmbiguousAt(k) if n == k => {
                self.fire(n);
                (true, false)
            }
            Fault::AmbiguousThenCrash(k) if n >= k => {
                self.fire(n);
                (true, true)
            }
            _ => (false, false),
        };
        let r = f.await;
        if die {
            self.dead.store(true, Ordering::SeqCst);
        }
        if ambiguous {
            return Err(Self::unavailable(what));
        }
        r
    }
}

#[async_trait]
impl JournalStore for Faults {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn create_run(&self, run: NewRun, now: Timestamp) -> Result<CreatedRun, StoreError> {
        self.call("create_run", self.inner.create_run(run, now))
            .await
    }

    async fn create_run_claimed(
        &self,
        run: NewRun,
        lease: &Lease,
        now: Timestamp,
    ) -> Result<CreatedRun, StoreError> {
        self.call(
            "create_run_claimed",
            self.inner.create_run_claimed(run, lease, now),
        )
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

    async fn create_key(&self, key: eve_core::ApiKey) -> Result<(), StoreError> {
        self.inner.create_key(key).await
    }
    async fn list_keys(&self) -> Result<Vec<eve_core::ApiKey>, StoreError> {
        self.inner.list_keys().await
    }
    async fn revoke_key(&self, id: &str, now: Timestamp) -> Result<eve_core::ApiKey, StoreError> {
        self.inner.revoke_key(id, now).await
    }
    async fn key_by_hash(&self, hash: &str) -> Result<Option<eve_core::ApiKey>, StoreError> {
        self.inner.key_by_hash(hash).await
    }
    async fn end_session(
        &self,
        session: &SessionId,
        now: Timestamp,
    ) -> Result<SessionEnd, StoreError> {
        self.call("end_session", self.inner.end_session(session, now))
            .await
    }
    async fn get_session(&self, session: &SessionId) -> Result<SessionRecord, StoreError> {
        self.inner.get_session(session).await
    }
    async fn queue_message(
        &self,
        session: &SessionId,
        message: Payload,
        now: Timestamp,
    ) -> Result<QueuedMessage, StoreError> {
        self.call(
            "queue_message",
            self.inner.queue_message(session, message, now),
        )
        .await
    }
    async fn take_messages(&self, session: &SessionId) -> Result<Vec<QueuedMessage>, StoreError> {
        self.call("take_messages", self.inner.take_messages(session))
            .await
    }
    async fn purge(&self, ended_before: Timestamp, limit: usize) -> Result<usize, StoreError> {
        self.call("purge", self.inner.purge(ended_before, limit))
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

    // Passed through, outside the fault schedule and the call log: the process lock is no
    // journal call, and a simulated crash does not end the process that holds it.
    async fn lock_worker(&self, worker: &WorkerId) -> Result<eve_core::WorkerLock, StoreError> {
        self.inner.lock_worker(worker).await
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

    async fn wakeups(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.inner.wakeups().await
    }

    async fn watch(&self, key: &eve_core::WatchKey) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.inner.watch(key).await
    }

    fn store_id(&self) -> String {
        self.inner.store_id()
    }
}
