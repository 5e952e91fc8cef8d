//! [`Faults`]: a fault-injecting [`JournalStore`] wrapper for one worker (like
//! `eve_core::testing::FaultyStore`, which it mirrors), that can steer clear of a known engine
//! bug so the suite stays green until the engine is fixed (see [`KNOWN_BUGS_ENV`]).

use async_trait::async_trait;
use eve_core::engine::{GRACE_CMD, GUARD_CMD};
use eve_core::session::SessionEntry;
use eve_core::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Set to `1` to also generate the fault placements that hit known, reported engine bugs
/// (for now: [`StrandedAfterSleepFired`](KnownBug::StrandedAfterSleepFired)).
pub const KNOWN_BUGS_ENV: &str = "EVE_CONFORMANCE_KNOWN_BUGS";

/// Engine bugs found by this suite and reported, whose fault placements the suite avoids
/// unless [`KNOWN_BUGS_ENV`] is set. Each has an ignored reproduction in
/// `conformance/tests/engine_known_bugs.rs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KnownBug {
    /// A worker appends `SleepFired` for a sleep its body waits on without the guard timer;
    /// the append sets the run's processed seq past it. If the worker dies after that append
    /// landed and before its next write lands (a crash at the next store call, or an ambiguous
    /// commit of the `SleepFired` append itself and then the crash), the run has no due timer
    /// and no undelivered event: it is never claimable again, although its body has work to
    /// do. Avoided by moving such a crash to just after the worker's next write landed.
    StrandedAfterSleepFired,
}

/// Whether the known bugs' placements are generated too.
pub fn known_bugs_included() -> bool {
    std::env::var(KNOWN_BUGS_ENV).is_ok_and(|v| v == "1" || v == "true")
}

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
    avoid_known_bugs: bool,
    log: Mutex<Vec<&'static str>>,
    avoided: Mutex<Option<KnownBug>>,
    fired: AtomicBool,
    fired_at: AtomicU64,
    dead: AtomicBool,
    /// The last append that landed fired a body sleep.
    stranding: AtomicBool,
}

impl Faults {
    /// Wraps `inner`, passing calls through until [`Faults::arm`]; with `avoid_known_bugs`,
    /// placements that hit a [`KnownBug`] are turned into harmless ones.
    pub fn new(inner: Arc<dyn JournalStore>, avoid_known_bugs: bool) -> Arc<Self> {
        Arc::new(Self {
            inner,
            calls: AtomicU64::new(0),
            fault: Mutex::new(Fault::None),
            avoid_known_bugs,
            log: Mutex::new(Vec::new()),
            avoided: Mutex::new(None),
            fired: AtomicBool::new(false),
            fired_at: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            stranding: AtomicBool::new(false),
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

    /// The known bug whose placement was avoided, if any.
    pub fn avoided(&self) -> Option<KnownBug> {
        *self.avoided.lock().expect("avoided lock")
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

    /// Whether firing now would hit a known bug: the process would die while the last write
    /// that landed (or the one about to land) is an append of `SleepFired` for a body sleep.
    fn would_strand(&self, sleep_fired: bool) -> bool {
        self.avoid_known_bugs && (sleep_fired || self.stranding.load(Ordering::SeqCst))
    }

    fn avoid(&self) {
        *self.avoided.lock().expect("avoided lock") = Some(KnownBug::StrandedAfterSleepFired);
    }

    async fn call<T, F>(&self, what: &'static str, sleep_fired: bool, f: F) -> Result<T, StoreError>
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
                if self.would_strand(false) {
                    // Die a little later, once a write made the run safe to abandon.
                    self.avoid();
                    (false, false)
                } else {
                    self.fire(n);
                    self.dead.store(true, Ordering::SeqCst);
                    return Err(Self::unavailable(what));
                }
            }
            Fault::AmbiguousAt(k) if n == k => {
                self.fire(n);
                (true, false)
            }
            Fault::AmbiguousThenCrash(k) if n >= k => {
                if self.would_strand(sleep_fired) {
                    self.avoid();
                    (false, false)
                } else {
                    self.fire(n);
                    (true, true)
                }
            }
            _ => (false, false),
        };
        let r = f.await;
        if what == "append" && r.is_ok() {
            self.stranding.store(sleep_fired, Ordering::SeqCst);
        }
        if die {
            self.dead.store(true, Ordering::SeqCst);
        }
        if ambiguous {
            return Err(Self::unavailable(what));
        }
        r
    }
}

/// Whether an append carries a `SleepFired` of a body sleep (not the engine's own timers).
fn fires_body_sleep(a: &Append) -> bool {
    a.events
        .iter()
        .any(|e| matches!(e, Event::SleepFired { cmd } if *cmd != GUARD_CMD && *cmd != GRACE_CMD))
}

#[async_trait]
impl JournalStore for Faults {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn create_run(&self, run: NewRun, now: Timestamp) -> Result<CreatedRun, StoreError> {
        self.call("create_run", false, self.inner.create_run(run, now))
            .await
    }

    async fn append(&self, append: Append) -> Result<Appended, StoreError> {
        let bug = fires_body_sleep(&append);
        self.call("append", bug, self.inner.append(append)).await
    }

    async fn read(
        &self,
        run: &RunId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.call("read", false, self.inner.read(run, from_seq, max))
            .await
    }

    async fn get_run(&self, run: &RunId) -> Result<RunRecord, StoreError> {
        self.call("get_run", false, self.inner.get_run(run)).await
    }

    async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        self.call("list_runs", false, self.inner.list_runs(query))
            .await
    }

    async fn answer(
        &self,
        request: &RequestId,
        response: InputResponse,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        self.call("answer", false, self.inner.answer(request, response, now))
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
            false,
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
            false,
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
            false,
            self.inner.resolve_blocked(run, resolution, now),
        )
        .await
    }

    async fn pending_requests(
        &self,
        session: &SessionId,
    ) -> Result<Vec<PendingRequest>, StoreError> {
        self.call(
            "pending_requests",
            false,
            self.inner.pending_requests(session),
        )
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
            false,
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
            false,
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
        self.call("heartbeat", false, self.inner.heartbeat(lease, ttl, now))
            .await
    }

    async fn claim(
        &self,
        lease: &Lease,
        max: usize,
        now: Timestamp,
    ) -> Result<Vec<RunRecord>, StoreError> {
        self.call("claim", false, self.inner.claim(lease, max, now))
            .await
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
            false,
            self.inner.release(lease, run, processed_seq, now),
        )
        .await
    }

    async fn retire_worker(&self, lease: &Lease, now: Timestamp) -> Result<(), StoreError> {
        self.call("retire_worker", false, self.inner.retire_worker(lease, now))
            .await
    }

    async fn next_wake(
        &self,
        deployment: &DeploymentId,
        now: Timestamp,
    ) -> Result<Option<Timestamp>, StoreError> {
        self.call("next_wake", false, self.inner.next_wake(deployment, now))
            .await
    }
}
