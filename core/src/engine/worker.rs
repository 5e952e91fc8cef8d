//! The worker: claims runnable runs, runs their bodies on the deterministic executor and their
//! steps on tokio, appends every outcome before the body sees it, and shares work with other
//! workers through the store's leases.

use super::agent::{result_payload, AgentStart};
use super::clock::Clock;
use super::error::{StepError, CODE_MISSING_WORKFLOW, CODE_POISON};
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

/// Worker tunables.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The worker's id. `None` (the default) derives a stable one (see [`default_worker_id`]):
    /// `{host}/{deployment}`, so a process restarted after a crash re-registers the same id,
    /// fences its dead incarnation and takes its runs back at once. A second worker of the same
    /// store and deployment in one process gets `{host}/{deployment}/2`, and so on. Two live
    /// processes given the same id do not both run: the later one fences the earlier, which
    /// stops with an error (see [`WorkerHandle::join`]). Set it to run several processes of one
    /// deployment on one host.
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

/// Ordinals of the default-id workers alive in this process, per (store, deployment).
static ORDINALS: Mutex<Vec<(String, String, u32)>> = Mutex::new(Vec::new());

/// Takes the smallest free ordinal (1, 2, …) of `(store, deployment)` in this process.
fn take_ordinal(store: &str, deployment: &str) -> u32 {
    let mut taken = ORDINALS.lock().unwrap_or_else(|e| e.into_inner());
    let n = (1..)
        .find(|n| {
            !taken
                .iter()
                .any(|(s, d, m)| s == store && d == deployment && m == n)
        })
        .expect("some ordinal is free");
    taken.push((store.to_owned(), deployment.to_owned(), n));
    n
}

/// The host's name: `/proc/sys/kernel/hostname`, else `$HOSTNAME`, else `localhost`.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// The id a worker gets when [`WorkerConfig::id`] is `None`: `{host}/{deployment}` for the
/// `ordinal`-th such worker of one store in this process (1 for the first), with `/{ordinal}`
/// appended from the second on. Stable across restarts of the process, so a restarted
/// process fences its dead predecessor and claims its runs at once.
pub fn default_worker_id(deployment: &str, ordinal: u32) -> WorkerId {
    let host = host_name();
    if ordinal <= 1 {
        WorkerId::new(format!("{host}/{deployment}"))
    } else {
        WorkerId::new(format!("{host}/{deployment}/{ordinal}"))
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
    _ordinal: Ordinal,
}

/// A bounded cache of suspended bodies: the least recently suspended is evicted first.
struct Sticky {
    cap: usize,
    bodies: Mutex<StickyBodies>,
}

/// A tick counter, and each cached body with the tick it was put at.
type StickyBodies = (u64, HashMap<RunId, (u64, Executor)>);

impl Sticky {
    fn take(&self, run: &RunId) -> Option<Executor> {
        let mut g = self.bodies.lock().unwrap_or_else(|e| e.into_inner());
        g.1.remove(run).map(|(_, e)| e)
    }

    fn put(&self, run: RunId, exec: Executor) {
        if self.cap == 0 {
            return;
        }
        let mut g = self.bodies.lock().unwrap_or_else(|e| e.into_inner());
        let (tick, bodies) = &mut *g;
        *tick += 1;
        bodies.insert(run, (*tick, exec));
        if bodies.len() > self.cap {
            if let Some(oldest) = bodies
                .iter()
                .min_by_key(|(_, (t, _))| *t)
                .map(|(r, _)| r.clone())
            {
                bodies.remove(&oldest);
            }
        }
    }
}

/// The default-id ordinal a worker holds (see [`take_ordinal`]), given back when dropped.
struct Ordinal(Option<(String, String, u32)>);

impl Drop for Ordinal {
    fn drop(&mut self) {
        if let Some(o) = self.0.take() {
            let mut taken = ORDINALS.lock().unwrap_or_else(|e| e.into_inner());
            taken.retain(|t| t != &o);
        }
    }
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
    /// Registers a worker for the registry's deployment.
    ///
    /// # Errors
    /// The store's error.
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
        let lease = store
            .register_worker(&id, registry.deployment(), config.lease_ttl, clock.now())
            .await?;
        if lease.epoch > 1 {
            info!(worker = %lease.worker, epoch = lease.epoch, "worker registered again: the runs of its earlier incarnations are taken back");
        }
        Ok(Self {
            inner: Arc::new(Inner {
                sticky: Sticky {
                    cap: config.sticky_bodies,
                    bodies: Mutex::new((0, HashMap::new())),
                },
                eager: Mutex::new(None),
                running: AtomicUsize::new(0),
                store,
                registry: Arc::new(registry),
                clock,
                config,
                lease: Mutex::new(lease),
                _ordinal: ordinal,
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
            join,
        }
    }

    /// Replays a run from cold without writing anything: reads its whole journal, decodes it
    /// and re-executes the body against it (no step runs). For benchmarks and diagnostics.
    ///
    /// # Errors
    /// The store's error; `InvalidInput` when the run's workflow is not in `registry`, or
    /// replay stops (non-determinism, panic) with its reason.
    pub async fn replay_cold(
        store: &dyn JournalStore,
        registry: &Registry,
        run: &RunId,
    ) -> Result<ReplayReport, StoreError> {
        let events = store.read_all(run, 0).await?;
        let first = events
            .first()
            .ok_or_else(|| StoreError::InvalidInput(format!("run {run} has no events")))?;
        let Event::RunStarted { workflow_id, .. } = &first.event else {
            return Err(StoreError::InvalidInput(format!(
                "run {run} does not start with RunStarted"
            )));
        };
        let tool = registry.get(workflow_id).ok_or_else(|| {
            StoreError::InvalidInput(format!("workflow {workflow_id} is not in the registry"))
        })?;
        let mut exec = Executor::new(run.clone(), tool, first).map_err(StoreError::InvalidInput)?;
        for ev in &events {
            exec.deliver(ev)
                .map_err(|s| StoreError::InvalidInput(s.reason()))?;
        }
        Ok(ReplayReport {
            events: exec.delivered,
            commands: exec.commands(),
            finished: exec.finished.is_some(),
        })
    }
}

/// A worker running in the background; see [`Worker::spawn`].
#[derive(Debug)]
pub struct WorkerHandle {
    stop: watch::Sender<bool>,
    join: tokio::task::JoinHandle<Result<(), StoreError>>,
}

impl WorkerHandle {
    /// Graceful shutdown: stops claiming, abandons running activations and retires the worker,
    /// which leaves their runs to other workers at once.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.join.await;
    }

    /// Waits until the worker stops by itself, which it does only when it is fenced: another
    /// process registered the same worker id. Returns that `Fenced` error.
    ///
    /// # Errors
    /// `Fenced`; `Other` if the worker task panicked.
    pub async fn join(self) -> Result<(), StoreError> {
        match self.join.await {
            Ok(r) => r,
            Err(e) => Err(StoreError::Other {
                backend: "engine",
                source: format!("the worker task failed: {e}").into(),
            }),
        }
    }

    /// Whether the worker has stopped (fenced, or shut down).
    pub fn is_finished(&self) -> bool {
        self.join.is_finished()
    }
}

type StepResult = (u64, Result<Payload, StepError>);

struct Running {
    name: String,
    attempt: u32,
    policy: RetryPolicy,
    abort: tokio::task::AbortHandle,
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".into())
}

/// Outcome of one append attempt inside an activation.
enum Appendix {
    Done,
    /// New events arrived first; they were delivered.
    Conflict,
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

    /// When the lease is due for renewal: a third of the way through it.
    fn renew_at(&self) -> Timestamp {
        let lease = self.lease();
        Timestamp(lease.expires_at.0 - (self.config.lease_ttl * 2 / 3).as_millis() as i64)
    }

    /// Heartbeats once a third of the lease has passed. Re-registers when the store lost the
    /// worker (`NotFound`); a superseded epoch is `Fenced`: another process registered this
    /// worker id, and this one must stop.
    async fn keep_lease(&self) -> Result<(), StoreError> {
        if self.clock.now() < self.renew_at() {
            return Ok(());
        }
        self.renew().await
    }

    /// Heartbeats now; see [`Inner::keep_lease`].
    async fn renew(&self) -> Result<(), StoreError> {
        let lease = self.lease();
        let now = self.clock.now();
        let renewed = match self
            .store
            .heartbeat(&lease, self.config.lease_ttl, now)
            .await
        {
            Ok(l) => l,
            Err(StoreError::NotFound { .. }) => {
                warn!(worker = %lease.worker, "the store does not know this worker any more; registering it again");
                self.store
                    .register_worker(&lease.worker, &lease.deployment, self.config.lease_ttl, now)
                    .await?
            }
            Err(e) => return Err(e),
        };
        *self.lease.lock().unwrap_or_else(|e| e.into_inner()) = renewed;
        Ok(())
    }

    /// Spawns the activation of a claimed run in the run loop's task set.
    fn spawn_activation(
        self: &Arc<Self>,
        tasks: &mut tokio::task::JoinSet<RunId>,
        active: &mut HashSet<RunId>,
        rec: RunRecord,
        journal: Option<Vec<StoredEvent>>,
    ) {
        let inner = self.clone();
        active.insert(rec.run_id.clone());
        self.running.fetch_add(1, Ordering::SeqCst);
        tasks.spawn(async move {
            let id = rec.run_id.clone();
            inner.clone().activate(rec, journal).await;
            inner.running.fetch_sub(1, Ordering::SeqCst);
            id
        });
    }

    /// Claims, activates and heartbeats until stopped; see [`Worker::spawn`]. Ends with
    /// `Fenced` when another process registered this worker id.
    async fn run_loop(
        self: Arc<Self>,
        mut stop: watch::Receiver<bool>,
        mut eager: mpsc::UnboundedReceiver<(RunRecord, StoredEvent)>,
    ) -> Result<(), StoreError> {
        let mut tasks = tokio::task::JoinSet::new();
        let mut active: HashSet<RunId> = HashSet::new();
        // New work and deliveries wake an idle worker at once where the store can tell; a slow
        // poll covers the rest (other processes on SQLite), a fast one stores that cannot
        // tell (DynamoDB).
        let mut wakeups = self.store.wakeups().await;
        let poll = if wakeups.is_some() {
            self.config.fallback_poll
        } else {
            self.config.poll_interval
        };
        // Whether to look for work (claim, then ask when the next work is due) this round:
        // not after handing over an eagerly started run, which brings no other work.
        let mut look = true;
        let mut wake = self.renew_at();
        let fenced = loop {
            if *stop.borrow() {
                break None;
            }
            while let Some(done) = tasks.try_join_next() {
                if let Ok(id) = done {
                    active.remove(&id);
                }
            }
            match self.keep_lease().await {
                Ok(()) => {}
                Err(e @ StoreError::Fenced { .. }) => break Some(e),
                Err(e) => warn!(error = %e, "heartbeat failed"),
            }
            let free = self.config.max_active_runs.saturating_sub(tasks.len());
            if look {
                let mut claimed = 0;
                if free > 0 {
                    match self.claim(free, &active).await {
                        // Fenced with a lease that is not due for renewal: superseded or
                        // retired by another process, unless the lease lapsed (a stall); a
                        // heartbeat now tells which.
                        Err(StoreError::Fenced { .. }) => match self.renew().await {
                            Err(e @ StoreError::Fenced { .. }) => break Some(e),
                            Err(e) => warn!(error = %e, "heartbeat failed"),
                            Ok(()) => {}
                        },
                        Ok(runs) => {
                            claimed = runs.len();
                            for rec in runs {
                                self.spawn_activation(&mut tasks, &mut active, rec, None);
                            }
                        }
                        Err(e) => warn!(error = %e, "claim failed"),
                    }
                }
                if claimed > 0 && claimed == free {
                    continue;
                }
                let now = self.clock.now();
                wake = self.renew_at();
                if free > 0 {
                    if let Ok(Some(at)) =
                        self.store.next_wake(self.registry.deployment(), now).await
                    {
                        wake = wake.min(at.max(now));
                    }
                }
            }
            wake = wake.min(self.renew_at());
            look = true;
            let until = self.clock.sleep_until(wake);
            let woken = async {
                match wakeups.as_mut() {
                    Some(rx) => rx.changed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = stop.changed() => {}
                _ = until => {}
                _ = tokio::time::sleep(poll) => {}
                Ok(()) = woken => {}
                Some((rec, first)) = eager.recv() => {
                    self.spawn_activation(&mut tasks, &mut active, rec, Some(vec![first]));
                    look = false;
                }
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    if let Ok(id) = done {
                        active.remove(&id);
                    }
                }
            }
        };
        // Runs started eagerly from now on are left to the store's claims.
        self.eager.lock().unwrap_or_else(|e| e.into_inner()).take();
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        self.running.store(0, Ordering::SeqCst);
        if let Some(e) = fenced {
            let lease = self.lease();
            error!(worker = %lease.worker, epoch = lease.epoch, error = %e, "worker fenced: another process registered the same worker id, so this one stops; give each live process its own worker id (WorkerConfig::id)");
            return Err(e);
        }
        let lease = self.lease();
        if let Err(e) = self.store.retire_worker(&lease, self.clock.now()).await {
            warn!(error = %e, "retiring the worker failed");
        }
        Ok(())
    }

    /// Claims up to `max` runs. When a claim attempt failed with a transient error it may have
    /// landed (an ambiguous commit) and left runs owned by this worker that nobody activates;
    /// those are found by listing the deployment's running runs and adopted.
    async fn claim(
        &self,
        max: usize,
        active: &HashSet<RunId>,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let lease = self.lease();
        let now = self.clock.now();
        let mut ambiguous = false;
        let mut tries = 0;
        let mut claimed = loop {
            match self.store.claim(&lease, max, now).await {
                Err(e) if e.is_retryable() && tries < self.config.store_retries => {
                    ambiguous = true;
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(10 << tries.min(6))).await;
                }
                other => break other?,
            }
        };
        if ambiguous {
            let me = Some((lease.worker.clone(), lease.epoch));
            let query = RunQuery {
                status: Some(RunStatus::Running),
                deployment: Some(lease.deployment.clone()),
                ..RunQuery::default()
            };
            let orphans = self.retrying(|| self.store.list_runs(&query)).await?;
            for rec in orphans {
                if rec.owner == me
                    && !active.contains(&rec.run_id)
                    && !claimed.iter().any(|c| c.run_id == rec.run_id)
                {
                    claimed.push(rec);
                }
            }
        }
        Ok(claimed)
    }

    /// Retries `op` on transient errors.
    async fn retrying<T, F, Fut>(&self, mut op: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let mut tries = 0;
        loop {
            match op().await {
                Err(e) if e.is_retryable() && tries < self.config.store_retries => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(10 << tries.min(6))).await;
                }
                other => return other,
            }
        }
    }

    /// Runs one activation of a claimed run; `journal` is its journal when the caller already
    /// has it (an eager start: the `RunStarted` just written), else it is read.
    async fn activate(
        self: Arc<Self>,
        rec: RunRecord,
        journal: Option<Vec<StoredEvent>>,
    ) -> ActivationEnd {
        let span = info_span!("activation", run_id = %rec.run_id, activations = rec.activations);
        let run = rec.run_id.clone();
        let end = self.activate_inner(&rec, journal).instrument(span).await;
        match end {
            Ok(end) => end,
            Err(e) => {
                // Give the run back so another activation can take it; without this, a live
                // worker would hold it until its lease lapsed. Processed seq 0 changes
                // nothing but the owner. If the store is down this fails too, and the lease
                // expiry (or a restart, which fences this epoch) frees the run instead.
                if !matches!(e, StoreError::Fenced { .. } | StoreError::RunEnded { .. }) {
                    let lease = self.lease();
                    let _ = self
                        .retrying(|| self.store.release(&lease, &run, 0, self.clock.now()))
                        .await;
                }
                ActivationEnd::Dropped(e.to_string())
            }
        }
    }

    /// Appends `events` at the executor's next seq; on success delivers them to the body, on a
    /// conflict reads and delivers the events that got in first.
    async fn append_deliver(
        &self,
        run: &RunId,
        exec: &mut Executor,
        events: Vec<Event>,
    ) -> Result<Result<Appendix, Stop>, StoreError> {
        let now = self.clock.now();
        let a = Append {
            run: run.clone(),
            expected_seq: exec.next_seq,
            lease: self.lease(),
            append_id: AppendId::random(),
            events,
            now,
        };
        match self.retrying(|| self.store.append(a.clone())).await {
            Ok(done) => {
                for (i, event) in a.events.into_iter().enumerate() {
                    let ev = StoredEvent {
                        seq: done.first_seq + i as u64,
                        at: now,
                        event,
                    };
                    if let Err(stop) = exec.deliver(&ev) {
                        return Ok(Err(stop));
                    }
                }
                Ok(Ok(Appendix::Done))
            }
            Err(StoreError::Conflict { .. }) => {
                Ok(self.catch_up(run, exec).await?.map(|()| Appendix::Conflict))
            }
            Err(e) => Err(e),
        }
    }

    /// Reads and delivers events past the executor's position.
    async fn catch_up(
        &self,
        run: &RunId,
        exec: &mut Executor,
    ) -> Result<Result<(), Stop>, StoreError> {
        let from = exec.next_seq;
        let events = self.retrying(|| self.store.read_all(run, from)).await?;
        for ev in &events {
            if let Err(stop) = exec.deliver(ev) {
                return Ok(Err(stop));
            }
        }
        Ok(Ok(()))
    }

    /// Appends a run-level event (end or park) at the journal's end. The outcome is decided, so
    /// deliveries that got in first (a conflict) are skipped over, not delivered.
    async fn append_final(
        &self,
        run: &RunId,
        mut expected_seq: u64,
        event: Event,
    ) -> Result<(), StoreError> {
        loop {
            let a = Append {
                run: run.clone(),
                expected_seq,
                lease: self.lease(),
                append_id: AppendId::random(),
                events: vec![event.clone()],
                now: self.clock.now(),
            };
            match self.retrying(|| self.store.append(a.clone())).await {
                Ok(_) => return Ok(()),
                Err(StoreError::Conflict { actual, .. }) => expected_seq = actual,
                Err(e) => return Err(e),
            }
        }
    }

    async fn block(
        &self,
        run: &RunId,
        next_seq: u64,
        reason: String,
    ) -> Result<ActivationEnd, StoreError> {
        warn!(run_id = %run, %reason, "parking run as blocked");
        self.append_final(
            run,
            next_seq,
            Event::RunBlocked {
                reason: reason.clone(),
            },
        )
        .await?;
        // Blocked runs are not claimable; release it so that once resumed any worker can.
        let lease = self.lease();
        let _ = self
            .retrying(|| self.store.release(&lease, run, 0, self.clock.now()))
            .await;
        Ok(ActivationEnd::Blocked(reason))
    }

    /// One page of the journal from `from`.
    async fn read_page(&self, run: &RunId, from: u64) -> Result<Vec<StoredEvent>, StoreError> {
        self.retrying(|| self.store.read(run, from, READ_PAGE))
            .await
    }

    async fn activate_inner(
        &self,
        rec: &RunRecord,
        journal: Option<Vec<StoredEvent>>,
    ) -> Result<ActivationEnd, StoreError> {
        let run = &rec.run_id;
        if rec.status != RunStatus::Running {
            return Ok(ActivationEnd::Dropped(format!(
                "run is {}",
                rec.status.as_str()
            )));
        }
        if rec.activations > self.config.max_activations {
            return self
                .block(
                    run,
                    rec.next_seq,
                    format!(
                        "[{CODE_POISON}] run {run} was claimed {} times without progress (its activations keep failing or crashing the worker); inspect it, deploy a fix, and resume it",
                        rec.activations
                    ),
                )
                .await;
        }
        let Some(tool) = self.registry.get(&rec.workflow_id) else {
            let error = format!(
                "[{CODE_MISSING_WORKFLOW}] workflow {} is not in the registry of deployment {}; the run was started by deployment {} and can only run where its workflow exists",
                rec.workflow_id,
                self.registry.deployment(),
                rec.deployment_id
            );
            self.append_final(
                run,
                rec.next_seq,
                Event::RunFailed {
                    error: error.clone(),
                },
            )
            .await?;
            return Ok(ActivationEnd::Failed(error));
        };
        // A body this worker still holds from an earlier activation goes on from where it
        // stopped: only the events written since are read and delivered. The journal is
        // append-only, so whoever wrote them, this is what a replay from seq 0 would reach.
        let cached = self.sticky.take(run).filter(|e| e.next_seq <= rec.next_seq);
        let from = cached.as_ref().map_or(0, |e| e.next_seq);
        let mut page = match journal {
            Some(events) if cached.is_none() => events,
            _ => self.read_page(run, from).await?,
        };
        let mut exec = match cached {
            Some(exec) => exec,
            None => {
                let Some(first) = page.first() else {
                    return Ok(ActivationEnd::Dropped("empty journal".into()));
                };
                match Executor::new(run.clone(), tool, first) {
                    Ok(e) => e,
                    Err(error) => {
                        self.append_final(
                            run,
                            rec.next_seq,
                            Event::RunFailed {
                                error: error.clone(),
                            },
                        )
                        .await?;
                        return Ok(ActivationEnd::Failed(error));
                    }
                }
            }
        };
        // Page by page up to the end the claim's record names (no round trip to find the
        // end), one page read ahead for what the body must get back at the call (webhook
        // tokens); events past that end arrive in the live part like any delivery.
        exec.prescan(&page);
        loop {
            let end = page.last().map_or(from, |e| e.seq + 1);
            let ahead = if !page.is_empty() && end < rec.next_seq {
                self.read_page(run, end).await?
            } else {
                Vec::new()
            };
            exec.prescan(&ahead);
            for ev in &page {
                if let Err(stop) = exec.deliver(ev) {
                    return self
                        .block(run, rec.next_seq.max(exec.next_seq), stop.reason())
                        .await;
                }
            }
            if ahead.is_empty() {
                break;
            }
            page = ahead;
        }
        if exec.ended {
            return Ok(ActivationEnd::Dropped("run has ended".into()));
        }
        debug!(events = exec.next_seq - from, warm = from > 0, "replayed");
        let end = self.live(run, &mut exec, tool.grace_period()).await?;
        if end == ActivationEnd::Suspended {
            self.sticky.put(run.clone(), exec);
        } else if exec.commands() > 10_000 {
            // Freeing a long run's body takes time in proportion to it: not on this task.
            tokio::task::spawn_blocking(move || drop(exec));
        }
        Ok(end)
    }

    /// Renews the lease when it is past half-life and, when it had lapsed (a long step, a
    /// stalled process, a jump of the clock), checks that no other worker took the run over,
    /// so a step attempt another worker may have recorded is never started here.
    async fn still_owns(&self, run: &RunId) -> Result<bool, StoreError> {
        let lapsed = self.lease().expires_at <= self.clock.now();
        self.retrying(|| self.keep_lease()).await?;
        if !lapsed {
            return Ok(true);
        }
        let rec = self.retrying(|| self.store.get_run(run)).await?;
        let me = self.lease();
        Ok(rec.owner == Some((me.worker, me.epoch)))
    }

    /// Ends the run with `terminal` (`RunCompleted`, `RunFailed` or `RunCancelled`): the one
    /// cleanup for every end. The same append records the body's unrecorded progress and
    /// messages and withdraws every pending request (the store disposes hooks and drops timers
    /// when the run ends). Deliveries that got in first are read and folded in; the outcome is
    /// decided and does not change.
    async fn finish(
        &self,
        run: &RunId,
        exec: &mut Executor,
        terminal: Event,
    ) -> Result<(), StoreError> {
        loop {
            let mut events = exec.unrecorded_commands(self.clock.now(), false);
            events.extend(
                exec.pending_requests()
                    .into_iter()
                    .map(|request_id| Event::InputWithdrawn { request_id }),
            );
            let last = events.len() < crate::store::MAX_EVENTS_PER_APPEND;
            if last {
                events.push(terminal.clone());
            } else {
                events.truncate(crate::store::MAX_EVENTS_PER_APPEND);
            }
            match self.append_deliver(run, exec, events).await? {
                Ok(Appendix::Done) if last => return Ok(()),
                // A delivery that cannot be replayed any more changes nothing: the body is done.
                Ok(_) | Err(_) => {}
            }
        }
    }

    /// The live part of an activation, once the journal is exhausted.
    async fn live(
        &self,
        run: &RunId,
        exec: &mut Executor,
        grace: Duration,
    ) -> Result<ActivationEnd, StoreError> {
        let (tx, mut rx) = mpsc::unbounded_channel::<StepResult>();
        let (agent_tx, mut agent_rx) = mpsc::unbounded_channel::<(u64, Result<String, String>)>();
        let (abort_tx, abort_rx) = watch::channel(false);
        let mut running: HashMap<u64, Running> = HashMap::new();
        let mut starting: HashMap<u64, (AgentStart, tokio::task::AbortHandle)> = HashMap::new();
        let mut outbox: Vec<Event> = Vec::new();
        // Deliveries to this run (an answer, a hook payload, a cancel) while its steps run.
        let mut deliveries = self.watch(WatchKey::Run(run.clone())).await;
        let abort_all = |running: &HashMap<u64, Running>| {
            for r in running.values() {
                r.abort.abort();
            }
        };
        loop {
            let now = self.clock.now();
            let cancelling = exec.cancel_seq().is_some();
            if cancelling {
                abort_tx.send_replace(true);
            }
            let past_grace = exec.grace_at.is_some_and(|at| at <= now);
            if exec.finished.is_some() || past_grace {
                abort_all(&running);
                for (_, h) in starting.values() {
                    h.abort();
                }
                let out = exec.finished.take();
                let (event, end) = match out {
                    _ if cancelling => (Event::RunCancelled, ActivationEnd::Cancelled),
                    Some(Ok(output)) => (Event::RunCompleted { output }, ActivationEnd::Completed),
                    Some(Err(error)) => (
                        Event::RunFailed {
                            error: error.clone(),
                        },
                        ActivationEnd::Failed(error),
                    ),
                    None => unreachable!("past the grace period only when cancelling"),
                };
                self.finish(run, exec, event).await?;
                return Ok(end);
            }
            let mut batch = exec.unrecorded_commands(now, !cancelling);
            if cancelling && exec.grace_at.is_none() {
                // The cancel request is seen for the first time: withdraw pending requests at
                // once, journal the grace deadline as a durable timer, cancel child agents.
                batch.extend(
                    exec.pending_requests()
                        .into_iter()
                        .map(|request_id| Event::InputWithdrawn { request_id }),
                );
                batch.push(Event::SleepScheduled {
                    cmd: GRACE_CMD,
                    wake_at: now.plus(grace),
                });
                if let Some(host) = self.registry.agent_host() {
                    for key in exec.pending_agents() {
                        host.cancel(run, &key).await;
                    }
                }
            }
            batch.extend(outbox.iter().cloned());
            if !cancelling {
                for (cmd, at) in exec.pending_sleeps() {
                    if at <= now {
                        batch.push(Event::SleepFired { cmd });
                    }
                }
            }
            let running_keys: Vec<u64> = running.keys().copied().collect();
            let runnable = exec.runnable_steps(now, &running_keys);
            let starting_keys: Vec<u64> = starting.keys().copied().collect();
            let to_start = if cancelling {
                Vec::new()
            } else {
                exec.agents_to_start(&starting_keys)
            };
            if !batch.is_empty() {
                batch.truncate(crate::store::MAX_EVENTS_PER_APPEND);
                match self.append_deliver(run, exec, batch).await {
                    Ok(Ok(Appendix::Done)) => {
                        // Drop what was written (a full batch may have left some).
                        outbox.retain(|e| !outbox_recorded(exec, e));
                        continue;
                    }
                    Ok(Ok(Appendix::Conflict)) => continue,
                    Ok(Err(stop)) => {
                        abort_all(&running);
                        return self.block(run, exec.next_seq, stop.reason()).await;
                    }
                    Err(e) => {
                        abort_all(&running);
                        return Err(e);
                    }
                }
            }
            for (cmd, call) in to_start {
                let start = AgentStart {
                    run_id: run.clone(),
                    session_id: exec.session_id(),
                    key: call.key.clone(),
                    target: call.target.clone(),
                    message: call.message.clone(),
                    agent_id: call.agent_id.clone(),
                };
                let Some(host) = self.registry.agent_host().cloned() else {
                    outbox.push(Event::HookReceived {
                        cmd,
                        payload: result_payload(Err(format!(
                            "no AgentHost is configured in the registry of deployment {}; add one with Registry::with_agent_host",
                            self.registry.deployment()
                        ))),
                    });
                    continue;
                };
                let tx = agent_tx.clone();
                let req = start.clone();
                let task = tokio::spawn(async move {
                    let r = host.start(req).await;
                    let _ = tx.send((cmd, r));
                });
                starting.insert(cmd, (start, task.abort_handle()));
            }
            if !outbox.is_empty() {
                continue;
            }
            if !runnable.is_empty() && !self.still_owns(run).await? {
                abort_all(&running);
                return Ok(ActivationEnd::Dropped(
                    "the worker's lease lapsed and another worker took the run over".into(),
                ));
            }
            for s in runnable {
                let sc = StepCtx {
                    run_id: run.clone(),
                    cmd: s.cmd,
                    name: s.name.clone(),
                    attempt: s.attempt,
                    abort: abort_rx.clone(),
                };
                let tx = tx.clone();
                let runner = s.runner.clone();
                let cmd = s.cmd;
                let span =
                    info_span!("step", run_id = %run, cmd, name = %s.name, attempt = s.attempt);
                let task = tokio::spawn(
                    async move {
                        let result = match std::panic::catch_unwind(AssertUnwindSafe(|| runner(sc)))
                        {
                            Err(p) => Err(StepError::retryable(format!(
                                "step panicked: {}",
                                panic_message(&*p)
                            ))),
                            Ok(fut) => match AssertUnwindSafe(fut).catch_unwind().await {
                                Ok(r) => r,
                                Err(p) => Err(StepError::retryable(format!(
                                    "step panicked: {}",
                                    panic_message(&*p)
                                ))),
                            },
                        };
                        let _ = tx.send((cmd, result));
                    }
                    .instrument(span),
                );
                running.insert(
                    s.cmd,
                    Running {
                        name: s.name,
                        attempt: s.attempt,
                        policy: s.policy,
                        abort: task.abort_handle(),
                    },
                );
            }
            if running.is_empty() && starting.is_empty() {
                // A cancelled body with no step to run before its deadline can do nothing more:
                // it is abandoned now rather than at the end of the grace period.
                let grace_at = exec.grace_at.unwrap_or(now);
                if cancelling && exec.next_retry().is_none_or(|at| at >= grace_at) {
                    self.finish(run, exec, Event::RunCancelled).await?;
                    return Ok(ActivationEnd::Cancelled);
                }
                if exec.guard_set {
                    // A journal written before guard timers were dropped: fire its guard, or its
                    // timer would keep the run claimable forever.
                    match self
                        .append_deliver(run, exec, vec![Event::SleepFired { cmd: GUARD_CMD }])
                        .await?
                    {
                        Ok(_) => continue,
                        Err(stop) => return self.block(run, exec.next_seq, stop.reason()).await,
                    }
                }
                let lease = self.lease();
                self.retrying(|| {
                    self.store
                        .release(&lease, run, exec.next_seq, self.clock.now())
                })
                .await?;
                return Ok(ActivationEnd::Suspended);
            }
            let sleeps = if cancelling {
                Vec::new()
            } else {
                exec.pending_sleeps()
            };
            let next_timer = sleeps
                .into_iter()
                .map(|(_, at)| at)
                .chain(exec.next_retry())
                .chain(exec.grace_at)
                .min();
            let timer = async {
                match next_timer {
                    Some(at) => self.clock.sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some((cmd, result)) = rx.recv() => {
                    let now = self.clock.now();
                    if let Some(r) = running.remove(&cmd) {
                        outbox.push(outcome_event(cmd, r, result, now));
                    }
                    // Outcomes that finished meanwhile go into the same append.
                    while let Ok((cmd, result)) = rx.try_recv() {
                        if let Some(r) = running.remove(&cmd) {
                            outbox.push(outcome_event(cmd, r, result, now));
                        }
                    }
                }
                Some((cmd, result)) = agent_rx.recv() => {
                    if let Some((start, _)) = starting.remove(&cmd) {
                        outbox.push(match result {
                            Ok(agent_id) => Event::AgentStarted {
                                cmd,
                                key: start.key,
                                target: start.target,
                                agent_id: Some(agent_id),
                            },
                            Err(e) => Event::HookReceived {
                                cmd,
                                payload: result_payload(Err(format!("the agent host could not start the child: {e}"))),
                            },
                        });
                    }
                }
                _ = timer => {}
                _ = deliveries.wait() => {
                    let rec = self.retrying(|| self.store.get_run(run)).await?;
                    if rec.next_seq > exec.next_seq {
                        if let Err(stop) = self.catch_up(run, exec).await? {
                            abort_all(&running);
                            return self.block(run, exec.next_seq, stop.reason()).await;
                        }
                    }
                }
            }
        }
    }
}

/// Whether the journal (as delivered to `exec`) holds the outbox event `e`: a step outcome,
/// an agent's start acknowledgement or its start failure.
fn outbox_recorded(exec: &Executor, e: &Event) -> bool {
    let core = super::ctx::lock(&exec.core);
    let cmd = |cmd: &u64| core.cmds.get(*cmd as usize);
    match e {
        Event::StepCompleted {
            cmd: c, attempt, ..
        }
        | Event::StepFailed {
            cmd: c, attempt, ..
        } => cmd(c).is_none_or(|c| c.attempts >= *attempt),
        Event::AgentStarted { cmd: c, .. } => cmd(c).is_none_or(|c| c.started),
        Event::HookReceived { cmd: c, .. } => cmd(c).is_none_or(|c| !c.payloads.is_empty()),
        _ => true,
    }
}

fn outcome_event(
    cmd: u64,
    r: Running,
    result: Result<Payload, StepError>,
    now: Timestamp,
) -> Event {
    match result {
        Ok(output) => Event::StepCompleted {
            cmd,
            name: r.name,
            attempt: r.attempt,
            output,
        },
        Err(StepError::Fatal(error)) => Event::StepFailed {
            cmd,
            name: r.name,
            attempt: r.attempt,
            error,
            fatal: true,
            retry_at: None,
        },
        Err(StepError::Retryable {
            message,
            retry_after,
        }) => {
            let retry_at = (r.attempt <= r.policy.max_retries)
                .then(|| now.plus(retry_after.unwrap_or_else(|| r.policy.backoff(r.attempt))));
            Event::StepFailed {
                cmd,
                name: r.name,
                attempt: r.attempt,
                error: message,
                fatal: false,
                retry_at,
            }
        }
    }
}
