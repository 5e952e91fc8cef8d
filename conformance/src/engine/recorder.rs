//! [`Recorder`]: a transparent [`JournalStore`] wrapper that remembers which step outcomes have
//! landed in the store, so a step closure can tell whether it runs after its own result was
//! recorded (which the engine must never do).

use async_trait::async_trait;
use eve_core::session::SessionEntry;
use eve_core::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What has landed for one step command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Landed {
    /// The highest attempt with a recorded outcome.
    pub attempt: u32,
    /// A final outcome (completed, fatal, or retries exhausted) landed.
    pub settled: bool,
}

/// Passes every call through to the wrapped store and notes each step outcome of a successful
/// append (also one answered as a duplicate, and one whose caller then saw an injected fault:
/// the note is taken below the fault injection).
#[derive(Debug)]
pub struct Recorder {
    inner: Arc<dyn JournalStore>,
    landed: Mutex<HashMap<(RunId, u64), Landed>>,
}

impl Recorder {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn JournalStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            landed: Mutex::new(HashMap::new()),
        })
    }

    /// What has landed for step `cmd` of `run`.
    pub fn landed(&self, run: &RunId, cmd: u64) -> Landed {
        self.landed
            .lock()
            .expect("recorder lock")
            .get(&(run.clone(), cmd))
            .copied()
            .unwrap_or_default()
    }

    fn note(&self, run: &RunId, events: &[Event]) {
        let mut landed = self.landed.lock().expect("recorder lock");
        for e in events {
            let (cmd, attempt, settled) = match e {
                Event::StepCompleted { cmd, attempt, .. } => (*cmd, *attempt, true),
                Event::StepFailed {
                    cmd,
                    attempt,
                    retry_at,
                    ..
                } => (*cmd, *attempt, retry_at.is_none()),
                _ => continue,
            };
            let l = landed.entry((run.clone(), cmd)).or_default();
            l.attempt = l.attempt.max(attempt);
            l.settled |= settled;
        }
    }
}

#[async_trait]
impl JournalStore for Recorder {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn create_run(&self, run: NewRun, now: Timestamp) -> Result<CreatedRun, StoreError> {
        self.inner.create_run(run, now).await
    }

    async fn create_run_claimed(
        &self,
        run: NewRun,
        lease: &Lease,
        now: Timestamp,
    ) -> Result<CreatedRun, StoreError> {
        self.inner.create_run_claimed(run, lease, now).await
    }

    async fn append(&self, append: Append) -> Result<Appended, StoreError> {
        let run = append.run.clone();
        let events = append.events.clone();
        let r = self.inner.append(append).await;
        if r.is_ok() {
            self.note(&run, &events);
        }
        r
    }

    async fn read(
        &self,
        run: &RunId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.inner.read(run, from_seq, max).await
    }

    async fn get_run(&self, run: &RunId) -> Result<RunRecord, StoreError> {
        self.inner.get_run(run).await
    }

    async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.list_runs(query).await
    }

    async fn answer(
        &self,
        request: &RequestId,
        response: InputResponse,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        self.inner.answer(request, response, now).await
    }

    async fn deliver_hook(
        &self,
        token: &str,
        payload: Payload,
        dedupe_key: Option<&str>,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        self.inner
            .deliver_hook(token, payload, dedupe_key, now)
            .await
    }

    async fn request_cancel(
        &self,
        run: &RunId,
        reason: &str,
        now: Timestamp,
    ) -> Result<CancelOutcome, StoreError> {
        self.inner.request_cancel(run, reason, now).await
    }

    async fn resolve_blocked(
        &self,
        run: &RunId,
        resolution: Resolution,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        self.inner.resolve_blocked(run, resolution, now).await
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
        self.inner.end_session(session, now).await
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
        self.inner.queue_message(session, message, now).await
    }
    async fn take_messages(&self, session: &SessionId) -> Result<Vec<QueuedMessage>, StoreError> {
        self.inner.take_messages(session).await
    }
    async fn purge(&self, ended_before: Timestamp, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge(ended_before, limit).await
    }
    async fn pending_requests(
        &self,
        session: &SessionId,
    ) -> Result<Vec<PendingRequest>, StoreError> {
        self.inner.pending_requests(session).await
    }

    async fn read_session(
        &self,
        session: &SessionId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<SessionEntry>, StoreError> {
        self.inner.read_session(session, from_seq, max).await
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
        self.inner
            .register_worker(worker, deployment, ttl, now)
            .await
    }

    async fn heartbeat(
        &self,
        lease: &Lease,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        self.inner.heartbeat(lease, ttl, now).await
    }

    async fn claim(
        &self,
        lease: &Lease,
        max: usize,
        now: Timestamp,
    ) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.claim(lease, max, now).await
    }

    async fn release(
        &self,
        lease: &Lease,
        run: &RunId,
        processed_seq: u64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.inner.release(lease, run, processed_seq, now).await
    }

    async fn retire_worker(&self, lease: &Lease, now: Timestamp) -> Result<(), StoreError> {
        self.inner.retire_worker(lease, now).await
    }

    async fn next_wake(
        &self,
        deployment: &DeploymentId,
        now: Timestamp,
    ) -> Result<Option<Timestamp>, StoreError> {
        self.inner.next_wake(deployment, now).await
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
