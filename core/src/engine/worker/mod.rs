//! The worker: claims runnable runs, runs their bodies on the deterministic executor and their
//! steps on tokio, appends every outcome before the body sees it, and shares work with other
//! workers through the store's leases.

use super::agent::{result_payload, AgentStart};
use super::clock::Clock;
use super::error::{NonDeterminism, StepError, CODE_MISSING_WORKFLOW, CODE_POISON};
use super::replay::{Executor, Stop, GRACE_CMD, GUARD_CMD};
use super::step::{RetryPolicy, StepCtx};
use super::tool::Registry;
use crate::error::StoreError;
use crate::event::{Event, Payload, StoredEvent};
use crate::ids::{AppendId, RunId, WorkerId};
use crate::store::{
    Append, CreatedRun, JournalStore, JournalStoreExt, Lease, NewRun, RunQuery, RunRecord,
    RunStatus, READ_PAGE,
};
use crate::time::Timestamp;
use crate::wake::{Waiter, WatchKey};
use futures::FutureExt;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tracing::{debug, error, info, info_span, warn, Instrument};

mod activation;
mod claiming;
mod identity;
mod lease;
mod pages;
mod steps;

use activation::{Appendix, Sticky};
pub use identity::default_worker_id;
pub(crate) use identity::host_name;
use identity::{take_ordinal, Ordinal};
use pages::ReadAhead;

/// Worker tunables.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The worker's id. `None` (the default) derives a stable one (see [`default_worker_id`]):
    /// `{host}/{deployment}`, so a process restarted after a crash re-registers the same id,
    /// fences its dead incarnation and takes its runs back at once. A second worker of the same
    /// store and deployment in one process gets `{host}/{deployment}/2`, and so on. Two live
    /// processes given the same id do not both run: the later one's [`Worker::new`] fails
    /// `WorkerIdInUse`, naming the earlier (contract clause 11). Set it to run several
    /// processes of one deployment on one host.
    pub id: Option<WorkerId>,
    /// Lease length (default 9 s); heartbeats renew it at a third of it. Another worker takes
    /// over a dead worker's runs once its lease expires, so a shorter lease recovers sooner;
    /// but a live process that stalls longer than the lease (a paused VM, a blocked runtime)
    /// loses its runs too, and steps it was running may run again elsewhere (their results
    /// are recorded once: its appends are fenced). A restarted process does not wait for the
    /// lease at all: its re-registration fences its predecessor.
    pub lease_ttl: Duration,
    /// How often the worker polls the store when the store cannot notify it of new work and
    /// deliveries (DynamoDB; default 50 ms).
    pub poll_interval: Duration,
    /// How often it polls anyway when the store does notify it (memory, SQLite, Postgres),
    /// for writes the notifications cannot see, such as another process's on SQLite
    /// (default 2 s).
    pub fallback_poll: Duration,
    /// Runs active at once (default 64).
    pub max_active_runs: usize,
    /// Bodies of suspended runs kept in memory (default 256; 0 keeps none). When such a run is
    /// claimed again by this worker, its body goes on from where it stopped: only the events
    /// written since are read and delivered, so a resume costs the same whatever the journal's
    /// length. Others are replayed from the journal (read page by page).
    pub sticky_bodies: usize,
    /// A run claimed more than this many times without a successful append (its activations
    /// keep dying, even by crashing the process) is parked as poisoned (default 5).
    pub max_activations: u32,
    /// Retries of a store call that failed with a transient error (default 3).
    pub store_retries: u32,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            id: None,
            lease_ttl: Duration::from_secs(9),
            poll_interval: Duration::from_millis(50),
            fallback_poll: Duration::from_secs(2),
            max_active_runs: 64,
            sticky_bodies: 256,
            max_activations: 5,
            store_retries: 3,
        }
    }
}

/// How an activation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ActivationEnd {
    /// The run completed.
    Completed,
    /// The run failed (a body error, a step failure that escaped, a missing workflow).
    Failed(String),
    /// The run ended cancelled (its body finished its grace period, or had nothing left to
    /// run).
    Cancelled,
    /// The body waits on a timer or a delivery; the run was released.
    Suspended,
    /// The run was parked as blocked (non-determinism, panicking body, poison), with the reason.
    Blocked(String),
    /// The worker lost the run (fenced, ended by someone else) or the store failed; it was
    /// dropped from memory and another activation will pick it up.
    Dropped(String),
    /// The run ended denied by its tool's approval policy or the person asked (the body never
    /// ran), with the reason.
    Denied(String),
}

impl ActivationEnd {
    /// The variant's name in snake case (`"suspended"`, `"completed"`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            ActivationEnd::Completed => "completed",
            ActivationEnd::Failed(_) => "failed",
            ActivationEnd::Cancelled => "cancelled",
            ActivationEnd::Suspended => "suspended",
            ActivationEnd::Blocked(_) => "blocked",
            ActivationEnd::Dropped(_) => "dropped",
            ActivationEnd::Denied(_) => "denied",
        }
    }
}

struct Inner {
    store: Arc<dyn JournalStore>,
    registry: Arc<Registry>,
    clock: Arc<dyn Clock>,
    config: WorkerConfig,
    lease: Mutex<Lease>,
    /// Bodies of suspended runs kept in memory (see [`WorkerConfig::sticky_bodies`]).
    sticky: Sticky,
    /// Where [`Worker::start`] hands eagerly claimed runs to the run loop, while it runs.
    eager: Mutex<Option<mpsc::UnboundedSender<(RunRecord, StoredEvent)>>>,
    /// Activations in flight in the run loop.
    running: AtomicUsize,
    /// Where finished spans go ([`Worker::trace_to`]); none records no spans.
    trace_sink: std::sync::OnceLock<Arc<dyn crate::trace::TraceSink>>,
    _ordinal: Ordinal,
    /// This process's hold on the worker id (contract clause 11), freed with the worker.
    _lock: crate::worker_lock::WorkerLock,
}

/// A worker process (or task): see the module docs. Cheap to clone.
#[derive(Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.inner.config.id)
            .field("deployment", self.inner.registry.deployment())
            .finish()
    }
}

/// Result of [`Worker::replay_cold`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayReport {
    /// Events read and delivered.
    pub events: u64,
    /// Commands the body issued.
    pub commands: u64,
    /// Whether the body returned by the end of the journal.
    pub finished: bool,
}

impl Worker {
    /// Takes the worker id's process lock ([`JournalStore::lock_worker`]), held as long as
    /// the worker (any clone, its background task) lives, and registers the worker for the
    /// registry's deployment.
    ///
    /// # Errors
    /// `WorkerIdInUse` when another live process (or another worker of this one) holds the id:
    /// its message names that process; other store errors.
    pub async fn new(
        store: Arc<dyn JournalStore>,
        registry: Registry,
        clock: Arc<dyn Clock>,
        mut config: WorkerConfig,
    ) -> Result<Self, StoreError> {
        let mut ordinal = Ordinal(None);
        let id = match &config.id {
            Some(id) => id.clone(),
            None => {
                let (sid, dep) = (store.store_id(), registry.deployment().to_string());
                let n = take_ordinal(&sid, &dep);
                ordinal.0 = Some((sid, dep, n));
                default_worker_id(registry.deployment().as_str(), n)
            }
        };
        config.id = Some(id.clone());
        // Held for the worker's life, before registering: a second live process with this id
        // is refused here instead of fencing the first (contract clause 11).
        let lock = store.lock_worker(&id).await?;
        let lease = store
            .register_worker(&id, registry.deployment(), config.lease_ttl, clock.now())
            .await?;
        if lease.epoch > 1 {
            info!(worker = %lease.worker, epoch = lease.epoch, "worker registered again: the runs of its earlier incarnations are taken back");
        }
        Ok(Self {
            inner: Arc::new(Inner {
                sticky: Sticky::new(config.sticky_bodies),
                eager: Mutex::new(None),
                running: AtomicUsize::new(0),
                trace_sink: std::sync::OnceLock::new(),
                store,
                registry: Arc::new(registry),
                clock,
                config,
                lease: Mutex::new(lease),
                _ordinal: ordinal,
                _lock: lock,
            }),
        })
    }

    /// Starts a run, eagerly when this worker runs in the background ([`Worker::spawn`]) with
    /// room for another activation: the store creates the run and claims it for this worker in
    /// one commit ([`JournalStore::create_run_claimed`]), and the body starts at once without a
    /// claim or a read. Otherwise (or on a store without eager start) it is a plain
    /// `create_run`, and a worker claims the run as usual. Idempotent like `create_run`.
    ///
    /// # Errors
    /// The store's error.
    pub async fn start(&self, new: NewRun) -> Result<CreatedRun, StoreError> {
        let inner = &self.inner;
        let now = inner.clock.now();
        let tx = inner
            .eager
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let room = inner.running.load(Ordering::SeqCst) < inner.config.max_active_runs;
        let Some(tx) = tx.filter(|_| room) else {
            return inner.store.create_run(new, now).await;
        };
        let lease = inner.lease();
        let first = StoredEvent {
            seq: 0,
            at: now,
            event: new.started_event(),
        };
        let created = inner.store.create_run_claimed(new, &lease, now).await?;
        if created.created && created.run.owner == Some((lease.worker, lease.epoch)) {
            // If the loop stopped meanwhile the run is orphaned (this worker retired or was
            // fenced), so another worker claims it.
            let _ = tx.send((created.run.clone(), first));
        }
        Ok(created)
    }

    /// Reports the spans of the runs this worker executes to `sink` (see [`crate::trace`]):
    /// set it before [`spawn`](Self::spawn). The first sink set stays; `false` when one was
    /// set already.
    pub fn trace_to(&self, sink: Arc<dyn crate::trace::TraceSink>) -> bool {
        self.inner.trace_sink.set(sink).is_ok()
    }

    /// The worker's id.
    pub fn id(&self) -> WorkerId {
        self.inner.lease().worker
    }

    /// The worker's current lease.
    pub fn lease(&self) -> Lease {
        self.inner.lease()
    }

    /// Claims runnable runs once and runs each activation to its end (completion, suspension,
    /// blocking), concurrently. Returns what each activation ended with. It does not heartbeat
    /// while activations run (only [`Worker::spawn`] does): for tests, tools and one-shot
    /// batches whose steps finish within the lease.
    ///
    /// # Errors
    /// The store's error on claim.
    pub async fn run_once(&self) -> Result<Vec<(RunId, ActivationEnd)>, StoreError> {
        self.inner.keep_lease().await?;
        let claimed = self
            .inner
            .claim(self.inner.config.max_active_runs, &HashSet::new())
            .await?;
        let handles: Vec<_> = claimed
            .into_iter()
            .map(|rec| {
                let inner = self.inner.clone();
                let id = rec.run_id.clone();
                (
                    id,
                    tokio::spawn(async move { inner.activate(rec, None).await }),
                )
            })
            .collect();
        let mut out = Vec::with_capacity(handles.len());
        for (id, h) in handles {
            let end = match h.await {
                Ok(end) => end,
                Err(e) => ActivationEnd::Dropped(format!("activation task failed: {e}")),
            };
            out.push((id, end));
        }
        Ok(out)
    }

    /// Runs [`Worker::run_once`] until nothing is claimable at the clock's current time.
    /// Returns every activation's end, in order.
    ///
    /// # Errors
    /// The store's error on claim.
    pub async fn drain(&self) -> Result<Vec<(RunId, ActivationEnd)>, StoreError> {
        let mut all = Vec::new();
        loop {
            let batch = self.run_once().await?;
            if batch.is_empty() {
                return Ok(all);
            }
            all.extend(batch);
        }
    }

    /// Runs the worker in the background until [`WorkerHandle::shutdown`]: claims work as it
    /// becomes due (sleeping until the store's next wake-up, polling at `poll_interval` for
    /// deliveries), heartbeats its lease, and never dies of a run's failure.
    pub fn spawn(self) -> WorkerHandle {
        let (stop_tx, stop_rx) = watch::channel(false);
        // Installed before the loop runs, so a start right after `spawn` is eager already.
        let (eager_tx, eager_rx) = mpsc::unbounded_channel();
        *self.inner.eager.lock().unwrap_or_else(|e| e.into_inner()) = Some(eager_tx);
        let inner = self.inner.clone();
        let join = tokio::spawn(async move { inner.run_loop(stop_rx, eager_rx).await });
        WorkerHandle {
            stop: stop_tx,
            join: Some(join),
        }
    }

    /// Replays a run from cold without writing anything: reads its journal page by page
    /// up to the journal's length when the replay starts ([`READ_PAGE`] events, one page read
    /// ahead for the webhook tokens and patch markers the body gets back at the call, and the
    /// next two read and decoded by tasks of their own while the current one is delivered) and
    /// re-executes the body against it (no step runs). Holds at most four pages of events at a
    /// time, so its memory is the body's command table, not the journal. For benchmarks and
    /// diagnostics.
    ///
    /// # Errors
    /// The store's error; `InvalidInput` when the run's workflow is not in `registry`, or
    /// replay stops (non-determinism, panic) with its reason.
    pub async fn replay_cold(
        store: &Arc<dyn JournalStore>,
        registry: &Registry,
        run: &RunId,
    ) -> Result<ReplayReport, StoreError> {
        let invalid = |e: ReplayError| StoreError::InvalidInput(format!("run {run}: {e}"));
        let end = store.get_run(run).await?.next_seq;
        let mut page = store.read(run, 0, READ_PAGE).await?;
        if page.is_empty() {
            return Err(StoreError::InvalidInput(format!("run {run} has no events")));
        }
        let mut replay = PagedReplay::new(registry, run, &page, end).map_err(invalid)?;
        let after = page.last().map_or(end, |e| e.seq + 1);
        let mut pages = ReadAhead::start(store, run, after, end, 0);
        loop {
            let ahead = pages.next_page().await?;
            replay.prescan(&ahead);
            replay.deliver(&page).map_err(invalid)?;
            if ahead.is_empty() {
                break;
            }
            page = ahead;
        }
        Ok(replay.report())
    }

    /// Replays a recorded journal (e.g. exported with `eve journal --json`) against
    /// `registry`'s current code, without a store and without running any step: whether the
    /// code would resume the run as it was recorded. The deployment the run was started under
    /// is not checked (that is the point: new code against old runs).
    ///
    /// # Errors
    /// A [`ReplayError`] saying why the journal does not replay: not a journal, its workflow
    /// missing from `registry`, or the body diverging from it.
    pub fn replay_journal(
        registry: &Registry,
        run: &RunId,
        events: &[StoredEvent],
    ) -> Result<ReplayReport, ReplayError> {
        let mut replay = PagedReplay::new(registry, run, events, events.len() as u64)?;
        replay.deliver(events)?;
        Ok(replay.report())
    }
}

/// A replay without a store fed one page at a time, in seq order: the body's executor and the
/// seq it expects next. Nothing of a delivered page is kept beyond what the body's command
/// table holds.
struct PagedReplay {
    exec: Executor,
    expected: u64,
}

impl PagedReplay {
    /// Builds the body from the journal's first page (which must start with `RunStarted` at
    /// seq 0) and reads the page ahead for what the body gets back at the call. `end` is the
    /// journal's length (what `ctx.patched` decides by).
    fn new(
        registry: &Registry,
        run: &RunId,
        first_page: &[StoredEvent],
        end: u64,
    ) -> Result<Self, ReplayError> {
        let first = first_page.first().ok_or(ReplayError::Empty)?;
        let Event::RunStarted {
            workflow_id, tool, ..
        } = &first.event
        else {
            return Err(ReplayError::NotARun {
                seq: first.seq,
                found: first.event.kind().to_owned(),
            });
        };
        if first.seq != 0 {
            return Err(ReplayError::Gap {
                expected: 0,
                found: first.seq,
            });
        }
        let body = registry
            .get(workflow_id)
            .ok_or_else(|| ReplayError::MissingWorkflow {
                workflow_id: workflow_id.to_string(),
                tool: tool.clone(),
            })?;
        let mut exec = Executor::new(run.clone(), body, first).map_err(ReplayError::Input)?;
        exec.prescan(first_page);
        exec.journal_ends_at(end);
        Ok(Self { exec, expected: 0 })
    }

    /// Reads a page ahead of the one being delivered (see [`Executor::prescan`]).
    fn prescan(&mut self, page: &[StoredEvent]) {
        self.exec.prescan(page);
    }

    /// Delivers the next page, checking that it goes on where the last one stopped.
    fn deliver(&mut self, page: &[StoredEvent]) -> Result<(), ReplayError> {
        for ev in page {
            if ev.seq != self.expected {
                return Err(ReplayError::Gap {
                    expected: self.expected,
                    found: ev.seq,
                });
            }
            self.expected += 1;
            self.exec.deliver(ev).map_err(|stop| match stop {
                Stop::NonDeterminism(nd) => ReplayError::NonDeterminism(nd),
                other => ReplayError::Stopped(other.reason()),
            })?;
        }
        Ok(())
    }

    fn report(&self) -> ReplayReport {
        ReplayReport {
            events: self.exec.delivered,
            commands: self.exec.commands(),
            finished: self.exec.finished.is_some(),
        }
    }
}

/// Why a recorded journal does not replay against the current code
/// ([`Worker::replay_journal`]).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// No events at all.
    #[error("the journal is empty")]
    Empty,
    /// The first event is not `RunStarted`.
    #[error("the journal does not start with RunStarted (found {found} at seq {seq}); export whole journals with `eve journal RUN --json`")]
    NotARun {
        /// The first event's seq.
        seq: u64,
        /// Its kind.
        found: String,
    },
    /// Events are missing or out of order.
    #[error(
        "the journal skips from seq {expected} to seq {found}: events are missing or out of order"
    )]
    Gap {
        /// The seq that should come next.
        expected: u64,
        /// The seq found instead.
        found: u64,
    },
    /// The run's workflow is not among the registry's tools.
    #[error("[{code}] workflow {workflow_id} (tool {tool:?}) is not among these tools: was it renamed or removed? Keep its id with #[workflow(id = \"..\")]", code = CODE_MISSING_WORKFLOW)]
    MissingWorkflow {
        /// The recorded workflow id.
        workflow_id: String,
        /// The recorded tool name.
        tool: String,
    },
    /// The recorded input no longer fits the body's input type.
    #[error("the recorded input does not fit the body: {0}")]
    Input(String),
    /// The body issues other operations than the journal recorded.
    #[error(transparent)]
    NonDeterminism(NonDeterminism),
    /// The body panicked or waited on something that is not durable, with the code and reason.
    #[error("{0}")]
    Stopped(String),
}

/// A worker running in the background; see [`Worker::spawn`].
#[derive(Debug)]
pub struct WorkerHandle {
    stop: watch::Sender<bool>,
    /// `None` once [`WorkerHandle::stopped`] saw the worker stop.
    join: Option<tokio::task::JoinHandle<Result<(), StoreError>>>,
}

/// The worker task's result, a panic of the task as `Other`.
fn task_result(
    r: Result<Result<(), StoreError>, tokio::task::JoinError>,
) -> Result<(), StoreError> {
    r.unwrap_or_else(|e| {
        Err(StoreError::Other {
            backend: "engine",
            source: format!("the worker task failed: {e}").into(),
        })
    })
}

impl WorkerHandle {
    /// Graceful shutdown: stops claiming, abandons running activations and retires the worker,
    /// which leaves their runs to other workers at once.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        if let Some(join) = self.join {
            let _ = join.await;
        }
    }

    /// Waits until the worker stops by itself, which it does only when it is fenced: its id was
    /// registered again despite its lock (see [`JournalStore::lock_worker`]: a direct
    /// `register_worker`, or a DynamoDB lock that lapsed while the process stalled). Returns
    /// that `Fenced` error.
    ///
    /// # Errors
    /// `Fenced`; `Other` if the worker task panicked.
    pub async fn join(mut self) -> Result<(), StoreError> {
        self.stopped().await
    }

    /// Like [`join`](Self::join) without giving up the handle, so it can sit in a `select!`
    /// beside other work and the handle still shuts the worker down afterwards. Cancel safe.
    /// Once it has returned, later calls wait forever.
    ///
    /// # Errors
    /// As [`join`](Self::join).
    pub async fn stopped(&mut self) -> Result<(), StoreError> {
        match self.join.as_mut() {
            Some(join) => {
                let r = task_result(join.await);
                self.join = None;
                r
            }
            None => std::future::pending().await,
        }
    }

    /// Whether the worker has stopped (fenced, or shut down).
    pub fn is_finished(&self) -> bool {
        self.join.as_ref().is_none_or(|j| j.is_finished())
    }
}

impl Inner {
    fn lease(&self) -> Lease {
        self.lease.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A waiter on `key` of this worker's store, with its poll intervals.
    async fn watch(&self, key: WatchKey) -> Waiter {
        Waiter::new(
            &*self.store,
            &key,
            self.config.fallback_poll,
            self.config.poll_interval,
        )
        .await
    }

    /// Retries `op` on transient errors, up to the configured `store_retries`.
    async fn retrying<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        retrying(self.config.store_retries, op).await
    }
}

/// Runs `op`, and again on a transient error (with a growing pause) up to `retries` times.
async fn retrying<T, F, Fut>(retries: u32, mut op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut tries = 0;
    loop {
        match op().await {
            Err(e) if e.is_retryable() && tries < retries => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(10 << tries.min(6))).await;
            }
            other => return other,
        }
    }
}
