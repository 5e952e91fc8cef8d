//! The driver: runs one program on a store under one fault schedule, with simulated time.
//!
//! It starts the run with `start_tool_call`, then alternates worker drains with what the
//! outside world does when the run parks: it delivers the scripted hook payload the run parks
//! on, or moves the [`ManualClock`] to the store's next wake-up (sleeps, retry backoffs), or,
//! when the run is held by a worker that is gone, past the lease. No wall-clock sleeps: time
//! moves only when the driver moves it.

use super::checks;
use super::faults::{Fault as StoreFault, Faults};
use super::interp::{self, Instance, TOOL};
use super::program::{Node, Output, Program, StepSpec};
use super::recorder::Recorder;
use super::reference::{self, Answer, AnswerMode, Await, Command, DeliveryMode, Expected};
use crate::StoreFactory;
use eve_core::engine::{
    start_tool_call, Clock, ManualClock, Registry, Worker, WorkerConfig, CODE_NON_DETERMINISM,
};
use eve_core::{
    CallId, CancelOutcome, Delivered, DeploymentId, Event, InputResponse, JournalStore,
    JournalStoreExt, Payload, RequestId, Resolution, RunId, RunStatus, SessionId, StoreError,
    StoredEvent, Timestamp,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The workers' lease length.
pub const LEASE: Duration = Duration::from_secs(30);
/// Rounds of the driver in a row, without progress, that a body parked ahead of its journal
/// gets before the park check fails (see `Case::park_seen`): after a crash the run comes
/// back only once its dead worker's lease lapsed and a claim sees it, and a lagging wake index
/// answers each of its queries stale twice.
pub const PARK_ROUNDS: u32 = 6;
/// Real time any one drain may take before the case fails as hung (a safety net, not a
/// sleep: drains finish in milliseconds).
pub const HANG: Duration = Duration::from_secs(120);

/// A fault schedule: what goes wrong while a program runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Nothing.
    None,
    /// The first worker crashes (drops everything in memory; every later store call of it
    /// fails) after `after` store calls; with `ambiguous`, call `after + 1` lands first and
    /// only its answer is lost. A new worker takes over once the lease expired.
    Crash {
        /// Store calls that go through (taken modulo a bound that fits the program).
        after: u16,
        /// The last call lands (an ambiguous commit) before the crash.
        ambiguous: bool,
    },
    /// Store call `at + 1` of the worker lands but answers `Unavailable` (the connection
    /// dropped after the commit); the worker retries and goes on.
    Ambiguous {
        /// Which call (taken modulo a bound that fits the program).
        at: u16,
    },
    /// The tool call is dispatched twice (one after the other, or concurrently), and once
    /// more after the run ended: one run, created once.
    DuplicateDispatch {
        /// Both dispatches at once.
        concurrent: bool,
    },
    /// Two workers drain the store at the same time throughout.
    RacingWorkers,
    /// A step's first execution is held while its worker's lease expires; a second worker
    /// takes the run over (and, with `concurrent`, the first goes on at the same time).
    LeaseExpiry {
        /// Which executed step (modulo their number).
        step: u16,
        /// Let the first worker go on while the second runs.
        concurrent: bool,
    },
    /// A cancel request reaches the run while it is parked; a body with a cleanup step runs it
    /// in the grace period, one without is abandoned; the run ends cancelled with every
    /// pending request withdrawn.
    Cancel {
        /// At which park point (modulo their number).
        park: u16,
        /// Request the cancel twice (the second changes nothing).
        twice: bool,
    },
    /// The first worker crashes inside a batch of local steps: a local step's first execution
    /// is held, the worker's store is made to fail (with `landed`, its next write — the batch's
    /// append — lands first, then everything fails), the step is let go, and a new worker
    /// takes over once the lease expired. Without `landed` the batch's outcomes were delivered
    /// to the body but never committed: the steps run again (at least once); with it they were
    /// committed: none runs again (recorded exactly once).
    LocalBatchCrash {
        /// Which executed local step (modulo their number).
        step: u16,
        /// The batch's append lands before the crash.
        landed: bool,
    },
    /// The program is changed (a recorded command renamed, replaced or removed) while the run
    /// is parked; the run must be blocked with `[EVE-ND-001]`, and resume once the original
    /// program is deployed again.
    NonDeterminism {
        /// At which park point (modulo their number).
        park: u16,
        /// Which recorded command (modulo their number).
        target: u16,
        /// Remove the command instead of renaming it (steps only).
        remove: bool,
    },
}

/// A fault and how hook payloads are delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// The fault.
    pub fault: Fault,
    /// Delivery modes, used in turn for the scripted deliveries (`Once` if empty).
    pub deliveries: Vec<DeliveryMode>,
}

/// A store and clock shared by the cases of one family.
#[derive(Debug)]
pub struct Bench {
    /// The store under test, wrapped in the [`Recorder`].
    pub store: Arc<dyn JournalStore>,
    /// The recorder.
    pub recorder: Arc<Recorder>,
    /// Simulated time; it only moves forward, across cases too.
    pub clock: Arc<ManualClock>,
    /// Family name (case ids start with it).
    pub family: String,
    next: AtomicU64,
}

impl Bench {
    /// A fresh store from `factory`.
    ///
    /// # Errors
    /// The factory's error.
    pub async fn new(factory: &dyn StoreFactory, family: &str) -> Result<Self, StoreError> {
        let opened = factory.create().await?;
        Ok(Self::on(opened.store, family))
    }

    /// The bench on an existing store.
    pub fn on(store: Arc<dyn JournalStore>, family: &str) -> Self {
        let recorder = Recorder::new(store);
        Self {
            store: recorder.clone(),
            recorder,
            clock: ManualClock::new(Timestamp(1_700_000_000_000)),
            family: family.to_owned(),
            next: AtomicU64::new(0),
        }
    }

    /// The clock's time.
    pub fn now(&self) -> Timestamp {
        Clock::now(&*self.clock)
    }
}

/// What one case did, for the family's summary.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// The fault fired (a crash, an ambiguous commit, a takeover, a detected change).
    pub fired: bool,
    /// Park points observed.
    pub parks: usize,
    /// Step executions.
    pub executions: u32,
    /// Steps the reference records.
    pub steps: usize,
    /// Step executions by a worker whose lease expired that started after the step's outcome
    /// was recorded by the worker that took over, each refused by its fencing token.
    pub stale: usize,
    /// The run's final status.
    pub status: Option<RunStatus>,
    /// The run.
    pub run: Option<RunId>,
}

/// Runs `program` under `schedule` on `bench` and checks every property; `Err` says what
/// broke, with the journal.
///
/// # Errors
/// The first property that does not hold.
pub async fn run_case(
    bench: &Bench,
    program: &Program,
    schedule: &Schedule,
) -> Result<Outcome, String> {
    let n = bench.next.fetch_add(1, Ordering::SeqCst);
    let salt = &RunId::random().to_string()[..8];
    let id = format!("{}-{n}-{salt}", bench.family);
    run_case_as(bench, &id, program, schedule).await
}

/// [`run_case`] with a chosen instance id (the differential check gives both stores the same).
///
/// # Errors
/// The first property that does not hold.
pub async fn run_case_as(
    bench: &Bench,
    id: &str,
    program: &Program,
    schedule: &Schedule,
) -> Result<Outcome, String> {
    let inst = Instance::register(id, Some(bench.recorder.clone()));
    let exp = reference::expect(program, &schedule.deliveries);
    let host: Arc<dyn eve_core::engine::AgentHost> =
        Arc::new(interp::agent_host(bench.store.clone(), bench.clock.clone()));
    let mut case = Case {
        b: bench,
        program,
        sched: schedule,
        delivered: vec![None; exp.deliveries.len()],
        answered: vec![false; exp.answers.len()],
        exp,
        reg: Registry::new(DeploymentId::new(id))
            .with(interp::tool())
            .with(interp::background_tool())
            .with_agent_host(host.clone()),
        host: host.clone(),
        deployment: DeploymentId::new(id),
        session: SessionId::new(format!("session-{id}")),
        inst: inst.clone(),
        run: None,
        late: Vec::new(),
        observed: Vec::new(),
        log: Vec::new(),
        fired: false,
        stalls: 0,
        park_misses: 0,
        progress: 0,
        stale: 0,
        local_crash: None,
    };
    let result = case.run().await;
    inst.unregister();
    match result {
        Ok(()) => Ok(Outcome {
            fired: case.fired,
            parks: case.observed.len(),
            executions: inst.executions().values().sum(),
            steps: case.exp.steps.len(),
            stale: case.stale,
            status: match &case.run {
                Some(r) => Some(
                    bench
                        .store
                        .get_run(r)
                        .await
                        .map_err(|e| e.to_string())?
                        .status,
                ),
                None => None,
            },
            run: case.run.clone(),
        }),
        Err(why) => Err(case.explain(why).await),
    }
}

struct Case<'a> {
    b: &'a Bench,
    host: Arc<dyn eve_core::engine::AgentHost>,
    program: &'a Program,
    sched: &'a Schedule,
    exp: Expected,
    reg: Registry,
    deployment: DeploymentId,
    session: SessionId,
    inst: Arc<Instance>,
    run: Option<RunId>,
    /// The first answer of each scripted delivery.
    delivered: Vec<Option<Delivered>>,
    /// Which scripted answers were given.
    answered: Vec<bool>,
    /// Keyed deliveries to send again later.
    late: Vec<usize>,
    /// Park positions observed, in order.
    observed: Vec<usize>,
    log: Vec<String>,
    fired: bool,
    stalls: u32,
    /// The journal length when the driver last saw the run move on.
    progress: u64,
    /// Rounds in a row the run looked parked but its journal did not (yet) show the wait.
    park_misses: u32,
    /// Step executions by the worker whose lease expired that started after the result was
    /// recorded.
    stale: usize,
    /// The local step held when the worker crashed inside its batch, and whether the batch's
    /// append landed.
    local_crash: Option<(String, bool)>,
}

/// Why [`Case::drive`] returned.
enum Stop {
    /// The run is no longer running.
    Ended,
    /// Parked at this await position (only when asked to stop there).
    Parked(usize),
}

fn err(what: &str) -> impl Fn(StoreError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

impl Case<'_> {
    fn run_id(&self) -> &RunId {
        self.run.as_ref().expect("the run was started")
    }

    fn note(&mut self, s: impl Into<String>) {
        self.log.push(s.into());
    }

    async fn worker(&self, store: Arc<dyn JournalStore>, retries: u32) -> Result<Worker, String> {
        self.worker_with(store, retries, self.reg.clone()).await
    }

    async fn worker_with(
        &self,
        store: Arc<dyn JournalStore>,
        retries: u32,
        reg: Registry,
    ) -> Result<Worker, String> {
        Worker::new(
            store,
            reg,
            self.b.clock.clone(),
            WorkerConfig {
                lease_ttl: LEASE,
                store_retries: retries,
                ..WorkerConfig::default()
            },
        )
        .await
        .map_err(err("register a worker"))
    }

    async fn events(&self) -> Result<Vec<StoredEvent>, String> {
        self.b
            .store
            .read_all(self.run_id(), 0)
            .await
            .map_err(err("read the journal"))
    }

    async fn run(&mut self) -> Result<(), String> {
        self.start().await?;
        let nd = match self.sched.fault {
            Fault::NonDeterminism {
                park,
                target,
                remove,
            } if !self.exp.parks.is_empty() => Some((park, target, remove)),
            _ => None,
        };
        if let Fault::Cancel { park, twice } = self.sched.fault {
            if !self.exp.parks.is_empty() {
                let k = usize::from(park) % self.exp.parks.len();
                if let Stop::Parked(_) = self.drive(Some(k)).await? {
                    self.cancel(k, twice).await?;
                }
                return self.finish().await;
            }
        }
        match nd {
            None => {
                self.drive(None).await?;
                self.finish().await
            }
            Some((park, target, remove)) => {
                let k = usize::from(park) % self.exp.parks.len();
                match self.drive(Some(k)).await? {
                    Stop::Parked(pos) => self.change_program(pos, target, remove).await?,
                    Stop::Ended => {}
                }
                self.finish().await
            }
        }
    }

    fn tool(&self) -> &'static str {
        if self.program.background {
            interp::BACKGROUND_TOOL
        } else {
            TOOL
        }
    }

    async fn start(&mut self) -> Result<(), String> {
        let input = serde_json::json!({ "instance": self.inst.id, "program": self.program });
        let call = CallId::new("call-1");
        let now = self.b.now();
        let start = || {
            start_tool_call(
                &*self.b.store,
                &self.reg,
                &self.session,
                &call,
                self.tool(),
                input.clone(),
                now,
            )
        };
        let first = start()
            .await
            .map_err(|e| format!("start the tool call: {e}"))?;
        let first = match self.sched.fault {
            Fault::DuplicateDispatch { concurrent } => {
                let (a, b) = if concurrent {
                    // `first` made the run; two more race each other.
                    let (a, b) = futures::join!(start(), start());
                    (a, b)
                } else {
                    (start().await, start().await)
                };
                for again in [a, b] {
                    let again = again.map_err(|e| format!("dispatch the call again: {e}"))?;
                    if again.created || again.run.run_id != first.run.run_id {
                        return Err(format!(
                            "a repeated dispatch of one tool call made a second run: {:?} then {:?}",
                            first.run.run_id, again
                        ));
                    }
                }
                self.fired = true;
                first
            }
            _ => first,
        };
        if !first.created {
            return Err("a fresh tool call did not create a run".into());
        }
        self.note(format!("started run {}", first.run.run_id));
        self.run = Some(first.run.run_id);
        Ok(())
    }

    /// About the number of store calls a worker makes for the program (measured on memory:
    /// most runs make between half and all of it), to aim call-count faults at the run.
    fn call_bound(&self) -> u64 {
        let attempts = self
            .exp
            .steps
            .iter()
            .map(|s| s.attempts.len())
            .sum::<usize>() as u64;
        (12 + 5 * attempts + 4 * self.exp.awaits.len() as u64) * 2 / 3
    }

    async fn drive(&mut self, stop_at: Option<usize>) -> Result<Stop, String> {
        let store = self.b.store.clone();
        let mut primary = self.worker(store.clone(), 2).await?;
        let mut second = None;
        let mut faulty: Option<(Worker, Arc<Faults>, bool)> = None;
        let mut hold = None;
        let mut local_hold = None;
        match self.sched.fault.clone() {
            Fault::Crash { after, ambiguous } if stop_at.is_none() => {
                let n = u64::from(after) % self.call_bound();
                let fault = if ambiguous {
                    StoreFault::AmbiguousThenCrash(n)
                } else {
                    StoreFault::CrashAfter(n)
                };
                let f = Faults::new(store.clone());
                let w = self.worker(f.clone(), 0).await?;
                f.arm(fault);
                faulty = Some((w, f, true));
            }
            Fault::Ambiguous { at } => {
                let fault = StoreFault::AmbiguousAt(u64::from(at) % self.call_bound());
                let f = Faults::new(store.clone());
                let w = self.worker(f.clone(), 3).await?;
                f.arm(fault);
                faulty = Some((w, f, false));
            }
            Fault::RacingWorkers => second = Some(self.worker(store.clone(), 2).await?),
            Fault::LeaseExpiry { step, concurrent } if !self.exp.steps.is_empty() => {
                let s = &self.exp.steps[usize::from(step) % self.exp.steps.len()];
                let (reached, release) = self.inst.hold(&s.name);
                // Worker A (whose lease will expire) runs the tagged body.
                let stale = Registry::new(self.deployment.clone())
                    .with(interp::stale_tool())
                    .with(interp::stale_background_tool())
                    .with_agent_host(self.host.clone());
                primary = self.worker_with(store.clone(), 2, stale).await?;
                hold = Some((reached, release, concurrent, s.name.clone()));
            }
            Fault::LocalBatchCrash { step, landed } if stop_at.is_none() => {
                let batched = self.program.batched_local_steps();
                let locals: Vec<String> = self
                    .exp
                    .steps
                    .iter()
                    .filter(|s| batched.contains(&s.name))
                    .map(|s| s.name.clone())
                    .collect();
                if !locals.is_empty() {
                    let name = locals[usize::from(step) % locals.len()].clone();
                    let (reached, release) = self.inst.hold(&name);
                    let f = Faults::new(store.clone());
                    let w = self.worker(f.clone(), 0).await?;
                    local_hold = Some((w, f, reached, release, landed, name));
                }
            }
            _ => {}
        }
        let attempts: usize = self.exp.steps.iter().map(|s| s.attempts.len()).sum();
        let limit = 40 + 4 * (self.exp.awaits.len() + attempts);
        for _ in 0..limit {
            if let Some((w, f, crash)) = faulty.take() {
                let r = hang(w.drain()).await?;
                if f.tripped() && !self.fired {
                    self.fired = true;
                    self.note(format!(
                        "{} at store call {:?}",
                        if crash { "crash" } else { "ambiguous commit" },
                        f.fired_at(),
                    ));
                }
                if crash && f.tripped() {
                    // The process is gone; a new one starts once the old lease has expired.
                    drop(w);
                    self.b.clock.advance(LEASE + Duration::from_secs(1));
                    continue;
                }
                if let Err(e) = r {
                    // The injected `Unavailable` may surface from a call the worker does not
                    // retry (a heartbeat); a caller drains again.
                    self.note(format!("drain failed ({e}); drain again"));
                }
                faulty = Some((w, f, crash));
            } else if let Some((w, f, mut reached, release, landed, name)) = local_hold.take() {
                let a = w.clone();
                let mut task = tokio::spawn(async move { a.drain().await });
                tokio::select! {
                    r = &mut task => {
                        // Drained (parked, say) before the step ran: drain again later.
                        r.map_err(|e| format!("drain task: {e}"))?.map_err(err("drain"))?;
                        local_hold = Some((w, f, reached, release, landed, name));
                    }
                    _ = &mut reached => {
                        self.fired = true;
                        f.arm(if landed {
                            StoreFault::AmbiguousThenCrash(0)
                        } else {
                            StoreFault::CrashAfter(0)
                        });
                        let _ = release.send(());
                        // The batch goes on to its end and its append (which fails, or lands
                        // and then the process dies).
                        let r = hang(task).await?.map_err(|e| format!("drain task: {e}"))?;
                        self.note(format!(
                            "crash inside the batch of local step {name} at store call {:?} (the batch's append {}); the worker ended with {r:?}",
                            f.fired_at(),
                            if landed { "landed" } else { "failed" },
                        ));
                        self.local_crash = Some((name, landed));
                        drop(w);
                        self.b.clock.advance(LEASE + Duration::from_secs(1));
                        continue;
                    }
                }
            } else if let Some((mut reached, release, concurrent, name)) = hold.take() {
                let a = primary.clone();
                let mut task = tokio::spawn(async move { a.drain().await });
                tokio::select! {
                    r = &mut task => {
                        r.map_err(|e| format!("drain task: {e}"))?.map_err(err("drain"))?;
                        hold = Some((reached, release, concurrent, name));
                    }
                    _ = &mut reached => {
                        self.fired = true;
                        self.note(format!("step {name} held while the lease of worker A expires"));
                        self.b.clock.advance(LEASE + Duration::from_secs(1));
                        let b = self.worker(store.clone(), 2).await?;
                        if concurrent {
                            let bt = b.clone();
                            let bt = tokio::spawn(async move { bt.drain().await });
                            let _ = release.send(());
                            let rb = hang(bt).await?.map_err(|e| format!("drain task: {e}"))?;
                            rb.map_err(err("drain (worker B)"))?;
                        } else {
                            hang(b.drain()).await?.map_err(err("drain (worker B)"))?;
                            let _ = release.send(());
                        }
                        // Worker A may be fenced or find the run moved on: any end is fine,
                        // as long as it ends and the journal stays right.
                        let ra = hang(task).await?.map_err(|e| format!("drain task: {e}"))?;
                        self.note(format!("worker A ended with {ra:?}"));
                        primary = b;
                    }
                }
            } else if let Some(w2) = &second {
                let (r1, r2) = futures::join!(hang(primary.drain()), hang(w2.drain()));
                r1?.map_err(err("drain (worker 1)"))?;
                r2?.map_err(err("drain (worker 2)"))?;
            } else {
                hang(primary.drain()).await?.map_err(err("drain"))?;
            }
            let rec = store.get_run(self.run_id()).await.map_err(err("get_run"))?;
            if rec.next_seq > self.progress {
                // The run moved on: only rounds without progress count as stalls (a store
                // whose wake index lags may need a few).
                self.progress = rec.next_seq;
                self.stalls = 0;
                self.park_misses = 0;
            }
            if rec.status != RunStatus::Running {
                self.note(format!("run is {}", rec.status.as_str()));
                return Ok(Stop::Ended);
            }
            let pos = self.inst.position();
            let mut aw = pos.and_then(|p| self.exp.awaits.get(p).cloned());
            if let (Some(p), Some(a)) = (pos, aw.clone()) {
                if a.parks() {
                    if !self.park_seen(p, &a).await? {
                        // The wait is not recorded yet, so nothing acts on it (an ask has no
                        // request to answer): the clock moves as for a run held elsewhere.
                        aw = None;
                    } else if stop_at.is_some_and(|k| self.exp.parks.get(k) == Some(&p)) {
                        return Ok(Stop::Parked(p));
                    }
                }
            }
            self.act(aw).await?;
        }
        Err(format!(
            "the run neither ended nor stopped within {limit} rounds of the driver"
        ))
    }

    /// Notes a park at `pos` (once) and checks that what the body waits on is durable; true
    /// once the park is seen. The body's position may run ahead of the journal while its
    /// activation died before the append that records the wait and no worker has taken the run
    /// back yet (a store whose wake index lags shows it to a later claim): up to
    /// [`PARK_ROUNDS`] rounds in a row without progress are given to the engine to catch up
    /// before the check fails.
    async fn park_seen(&mut self, pos: usize, a: &Await) -> Result<bool, String> {
        if self.observed.last() == Some(&pos) {
            return Ok(true);
        }
        let events = self.events().await?;
        if let Err(e) = checks::waits_recorded(a, &events, &self.inst) {
            if self.park_misses < PARK_ROUNDS {
                self.park_misses += 1;
                self.note(format!(
                    "at await {pos} the journal does not show the wait yet ({e}): drain again"
                ));
                return Ok(false);
            }
            return Err(format!("parked at await {pos} ({a:?}): {e}"));
        }
        self.note(format!("parked at await {pos}: {a:?}"));
        self.observed.push(pos);
        Ok(true)
    }

    /// What the outside world does while the run waits at `aw`.
    async fn act(&mut self, aw: Option<Await>) -> Result<(), String> {
        for d in std::mem::take(&mut self.late) {
            self.redeliver(d).await?;
        }
        let due = match &aw {
            Some(Await::Hook {
                delivery: Some(d), ..
            })
            | Some(Await::Race {
                delivery: Some(d), ..
            }) if self.delivered[*d].is_none() => Some(*d),
            _ => None,
        };
        if let Some(d) = due {
            return self.deliver(d).await;
        }
        let ask = match &aw {
            Some(Await::Ask { answer, .. })
            | Some(Await::RaceAsk {
                answer: Some(answer),
                ..
            }) if !self.answered[*answer] => Some(*answer),
            _ => None,
        };
        if let Some(a) = ask {
            return self.answer(a).await;
        }
        let now = self.b.now();
        match self
            .b
            .store
            .next_wake(&self.deployment, now)
            .await
            .map_err(err("next_wake"))?
        {
            Some(at) if at > now => {
                self.note(format!("clock to the next wake-up, +{}ms", at.0 - now.0));
                self.b.clock.set(at);
            }
            Some(_) if self.stalls < 3 => {
                // Due now but not claimed: a store whose wake index lags may show it only to a
                // later claim. Drain again before moving the clock.
                self.stalls += 1;
                self.note("work is due now: drain again");
            }
            other => {
                // Held by a worker that is gone (or nothing is due at all): let its lease run out.
                self.stalls += 1;
                if self.stalls > 12 {
                    return Err(format!(
                        "the run is stuck: for 12 rounds it waits at {aw:?}, nothing is scripted to deliver and the next wake-up is {other:?}"
                    ));
                }
                self.note("clock past the lease (the run is held or nothing is due)");
                self.b.clock.advance(LEASE + Duration::from_secs(1));
            }
        }
        Ok(())
    }

    /// The request id of the ask at `cmd`, from its `InputRequested`.
    async fn request_id(&self, cmd: u64) -> Result<RequestId, String> {
        self.events()
            .await?
            .into_iter()
            .find_map(|e| match e.event {
                Event::InputRequested {
                    cmd: c, request_id, ..
                } if c == cmd => Some(request_id),
                _ => None,
            })
            .ok_or_else(|| format!("the run parks on the ask of command {cmd} but its InputRequested is not in the journal"))
    }

    async fn answer(&mut self, a: usize) -> Result<(), String> {
        let Answer { cmd, text, mode } = self.exp.answers[a].clone();
        let request = self.request_id(cmd).await?;
        self.note(format!("answer the ask of command {cmd} ({mode:?})"));
        let response = |t: &str| InputResponse::text(t);
        let store = &self.b.store;
        let first = store
            .answer(&request, response(&text), self.b.now())
            .await
            .map_err(err(&format!("answer the ask of command {cmd}")))?;
        if first.duplicate {
            return Err(format!(
                "the first answer to {request} was answered as a duplicate"
            ));
        }
        match mode {
            AnswerMode::Once => {}
            AnswerMode::SameTwice => {
                let again = store
                    .answer(&request, response(&text), self.b.now())
                    .await
                    .map_err(err("repeat the same answer"))?;
                if !again.duplicate || again.seq != first.seq {
                    return Err(format!(
                        "an identical retry of the accepted answer must be a duplicate success: {first:?} then {again:?}"
                    ));
                }
            }
            AnswerMode::OtherSecond => {
                match store
                    .answer(&request, response(&format!("{text} (another answer)")), self.b.now())
                    .await
                {
                    Err(StoreError::AlreadyAnswered { .. }) => {}
                    other => {
                        return Err(format!(
                            "a second, different answer to {request} must be refused with AlreadyAnswered; got {other:?}"
                        ))
                    }
                }
            }
        }
        self.answered[a] = true;
        self.fired |= mode != AnswerMode::Once;
        Ok(())
    }

    fn key(&self, d: usize) -> String {
        format!("{}:delivery-{d}", self.inst.id)
    }

    async fn deliver_one(&self, d: usize, key: Option<&str>) -> Result<Delivered, String> {
        let del = &self.exp.deliveries[d];
        let payload = Payload::from_value(&del.payload).map_err(|e| e.to_string())?;
        self.b
            .store
            .deliver_hook(&self.inst.token(&del.token), payload, key, self.b.now())
            .await
            .map_err(err(&format!("deliver payload {d} to hook {}", del.token)))
    }

    async fn deliver(&mut self, d: usize) -> Result<(), String> {
        let mode = self.exp.deliveries[d].mode;
        let key = self.key(d);
        self.note(format!(
            "deliver payload {d} to hook {} ({mode:?})",
            self.exp.deliveries[d].token
        ));
        let first = match mode {
            DeliveryMode::Once | DeliveryMode::UnkeyedTwice => self.deliver_one(d, None).await?,
            _ => self.deliver_one(d, Some(&key)).await?,
        };
        if first.duplicate {
            return Err(format!(
                "the first delivery of payload {d} was answered as a duplicate: {first:?}"
            ));
        }
        match mode {
            DeliveryMode::KeyedTwice => {
                let again = self.deliver_one(d, Some(&key)).await?;
                same_delivery(&first, &again, d)?;
            }
            DeliveryMode::UnkeyedTwice => {
                let again = self.deliver_one(d, None).await?;
                if again.duplicate || again.seq <= first.seq {
                    return Err(format!(
                        "a delivery without a key must be written again (at-least-once): {first:?} then {again:?}"
                    ));
                }
            }
            DeliveryMode::KeyedRetryLater => self.late.push(d),
            DeliveryMode::Once | DeliveryMode::Keyed => {}
        }
        self.delivered[d] = Some(first);
        self.fired |= mode != DeliveryMode::Once && mode != DeliveryMode::Keyed;
        Ok(())
    }

    /// A late retry of keyed delivery `d`: a duplicate success while the hook lives; after the
    /// run ended its token is released (`NotFound`/`RunEnded`) or it is still a duplicate.
    async fn redeliver(&mut self, d: usize) -> Result<(), String> {
        let first = self.delivered[d].clone().expect("delivered before");
        let del = &self.exp.deliveries[d];
        let payload = Payload::from_value(&del.payload).map_err(|e| e.to_string())?;
        let r = self
            .b
            .store
            .deliver_hook(
                &self.inst.token(&del.token),
                payload,
                Some(&self.key(d)),
                self.b.now(),
            )
            .await;
        self.note(format!("late retry of delivery {d}: {r:?}"));
        match r {
            Ok(again) => same_delivery(&first, &again, d),
            Err(StoreError::NotFound { .. } | StoreError::RunEnded { .. }) => {
                let rec = self
                    .b
                    .store
                    .get_run(self.run_id())
                    .await
                    .map_err(err("get_run"))?;
                if rec.status.is_terminal() {
                    Ok(())
                } else {
                    Err(format!(
                        "a late retry of keyed delivery {d} was refused while the run is {}",
                        rec.status.as_str()
                    ))
                }
            }
            Err(e) => Err(format!("a late retry of keyed delivery {d} failed: {e}")),
        }
    }

    /// Requests the cancel while the run is parked at its `k`-th park point, then lets it end.
    async fn cancel(&mut self, k: usize, twice: bool) -> Result<(), String> {
        let store = &self.b.store;
        let run = self.run_id().clone();
        let first = store
            .request_cancel(&run, "conformance: cancel", self.b.now())
            .await
            .map_err(err("request_cancel"))?;
        if !matches!(first, CancelOutcome::Requested { .. }) {
            return Err(format!(
                "the first cancel request of a running run gave {first:?}"
            ));
        }
        if twice {
            let again = store
                .request_cancel(&run, "conformance: cancel again", self.b.now())
                .await
                .map_err(err("request_cancel"))?;
            if again != CancelOutcome::AlreadyRequested {
                return Err(format!(
                    "a second cancel request gave {again:?}, not AlreadyRequested"
                ));
            }
        }
        self.fired = true;
        self.note(format!("cancel requested at park {k}"));
        self.exp = reference::cancelled_at(self.program, &self.exp, k);
        self.drive(None).await.map(|_| ())
    }

    /// Deploys a changed program while the run is parked at `pos`, lets the run go on, and
    /// expects it blocked for non-determinism; then deploys the original again and resumes.
    async fn change_program(
        &mut self,
        pos: usize,
        target: u16,
        remove: bool,
    ) -> Result<(), String> {
        let events = self.events().await?;
        let recorded = checks::recorded_commands(&events);
        let cmd = recorded[usize::from(target) % recorded.len()];
        let (changed, at) = mutate(self.program, &self.exp, cmd, remove);
        self.note(format!(
            "parked at await {pos}: deploy a changed program ({} command {cmd} {:?})",
            if remove { "remove" } else { "change" },
            self.exp.commands[cmd as usize]
        ));
        self.inst.override_program(changed);
        self.fired = true;
        let aw = self.exp.awaits.get(pos).cloned();
        self.act(aw).await?;
        self.drive(None).await?;
        let rec = self
            .b
            .store
            .get_run(self.run_id())
            .await
            .map_err(err("get_run"))?;
        let events = self.events().await?;
        let reason = events.iter().rev().find_map(|e| match &e.event {
            Event::RunBlocked { reason } => Some(reason.clone()),
            _ => None,
        });
        if rec.status != RunStatus::Blocked {
            return Err(format!(
                "the program changed at recorded command {cmd}, yet the run became {} (the change was silently accepted)",
                rec.status.as_str()
            ));
        }
        let reason = reason.unwrap_or_default();
        if !reason.contains(CODE_NON_DETERMINISM)
            || at.is_some_and(|c| !reason.contains(&format!("command {c}")))
        {
            return Err(format!(
                "blocked, but not for non-determinism at command {at:?}: {reason}"
            ));
        }
        checks::nothing_changed_ran(&events, &self.inst)?;
        // The fix is deployed (the original program) and an operator resumes the run.
        self.inst.clear_override();
        self.b
            .store
            .resolve_blocked(self.run_id(), Resolution::Resume, self.b.now())
            .await
            .map_err(err("resume the blocked run"))?;
        self.note("original program deployed again; run resumed");
        self.drive(None).await.map(|_| ())
    }

    /// The checks once the run ended.
    async fn finish(&mut self) -> Result<(), String> {
        for d in std::mem::take(&mut self.late) {
            self.redeliver(d).await?;
        }
        let rec = self
            .b
            .store
            .get_run(self.run_id())
            .await
            .map_err(err("get_run"))?;
        let events = self.events().await?;
        checks::end(&self.exp, &rec, &events)?;
        checks::journal(&self.exp, &events, &self.inst)?;
        let exact = matches!(
            self.sched.fault,
            Fault::None | Fault::DuplicateDispatch { .. }
        );
        self.stale = checks::executions(&self.exp, &self.inst, exact)?;
        // Faults that move the clock past a lease may fire a short sleep before the run parks
        // on it; without them the run parks at every park point of the reference.
        let exact_parks = matches!(
            self.sched.fault,
            Fault::None | Fault::DuplicateDispatch { .. } | Fault::RacingWorkers
        );
        checks::parks(&self.exp, &self.observed, exact_parks)?;
        if let Some((name, landed)) = &self.local_crash {
            checks::local_batch_crash(&events, &self.inst, name, *landed)?;
        }
        let returns = self.exp.end != reference::End::Cancelled || self.program.cleanup.is_some();
        checks::replay(
            &self.b.store,
            &self.reg,
            self.run_id(),
            &self.exp,
            &self.inst,
            returns,
        )
        .await?;
        checks::hooks_released(&*self.b.store, &self.exp, &self.inst, self.b.now()).await?;
        checks::requests_closed(&*self.b.store, &self.session, &events, self.b.now()).await?;
        if let Fault::DuplicateDispatch { .. } = self.sched.fault {
            let again = start_tool_call(
                &*self.b.store,
                &self.reg,
                &self.session,
                &CallId::new("call-1"),
                self.tool(),
                serde_json::json!({ "instance": self.inst.id, "program": self.program }),
                self.b.now(),
            )
            .await
            .map_err(|e| format!("dispatch the call after the run ended: {e}"))?;
            if again.created || &again.run.run_id != self.run_id() {
                return Err(format!(
                    "dispatching the call after its run ended made another run: {again:?}"
                ));
            }
            let w = self.worker(self.b.store.clone(), 2).await?;
            let ends = hang(w.drain()).await?.map_err(err("drain"))?;
            if !ends.is_empty() {
                return Err(format!(
                    "a repeated dispatch after the end activated the run again: {ends:?}"
                ));
            }
        }
        Ok(())
    }

    async fn explain(&self, why: String) -> String {
        let journal = match &self.run {
            Some(r) => match self.b.store.read_all(r, 0).await {
                Ok(evs) => evs
                    .iter()
                    .map(|e| format!("    {:>3} {:?}", e.seq, e.event))
                    .collect::<Vec<_>>()
                    .join("\n"),
                Err(e) => format!("    (unreadable: {e})"),
            },
            None => "    (no run)".into(),
        };
        format!(
            "{why}\n  backend: {}\n  schedule: {:?}\n  expected end: {:?}\n  driver: {}\n  journal:\n{journal}",
            self.b.store.backend(),
            self.sched,
            self.exp.end,
            self.log.join("; "),
        )
    }
}

fn same_delivery(first: &Delivered, again: &Delivered, d: usize) -> Result<(), String> {
    if !again.duplicate || again.seq != first.seq || again.run != first.run {
        return Err(format!(
            "a repeated delivery of payload {d} with the same key must be the same delivery, answered as a duplicate: {first:?} then {again:?}"
        ));
    }
    Ok(())
}

async fn hang<F: std::future::Future>(f: F) -> Result<F::Output, String> {
    tokio::time::timeout(HANG, f)
        .await
        .map_err(|_| format!("a drain did not finish within {HANG:?} of real time"))
}

/// `program` with recorded command `cmd` changed (or removed, for a step with `remove`), and
/// the command where the engine must report the mismatch when that is exactly known.
pub fn mutate(program: &Program, exp: &Expected, cmd: u64, remove: bool) -> (Program, Option<u64>) {
    let mut p = program.clone();
    let path = &exp.paths[cmd as usize];
    let command = &exp.commands[cmd as usize];
    let (nodes, last) = parent_of(&mut p.body, path);
    let mut at = Some(cmd);
    match (command, &mut nodes[last]) {
        (Command::Step(_), Node::Step(_)) if remove => {
            nodes.remove(last);
            at = None;
        }
        (Command::Step(_), Node::Join(specs)) if remove => {
            let j = *path.last().expect("a join step's path ends with its index");
            specs.remove(j);
            if specs.is_empty() {
                nodes.remove(last);
            }
            at = None;
        }
        (Command::Step(_), Node::Step(s)) => s.name.push('~'),
        (Command::Step(_), Node::Join(specs)) => {
            let j = *path.last().expect("a join step's path ends with its index");
            specs[j].name.push('~');
        }
        (Command::Hook(_), Node::Hook { token, .. } | Node::Race { token, .. }) => token.push('~'),
        (Command::Agent(_), Node::Agent { key, .. }) => key.push('~'),
        (Command::Sleep, Node::Race { token, .. }) => {
            // The race's hook comes first: the mismatch shows there.
            token.push('~');
            at = Some(cmd - 1);
        }
        (Command::Sleep, n @ Node::RaceAsk { .. }) => {
            // The race's ask comes first: the mismatch shows there.
            *n = inserted();
            at = Some(cmd - 1);
        }
        (
            Command::Ask | Command::Progress(_) | Command::Message(_),
            n @ (Node::Ask { .. }
            | Node::RaceAsk { .. }
            | Node::Progress { .. }
            | Node::Message { .. }),
        ) => {
            *n = inserted();
        }
        (Command::Sleep, n @ Node::Sleep { .. }) => {
            *n = Node::Step(StepSpec {
                name: "inserted~".into(),
                failures: 0,
                retries: 0,
                fatal: false,
                output: Output::Json(serde_json::Value::Null),
                local: false,
            });
        }
        (c, n) => panic!("command {cmd} {c:?} does not come from {n:?}"),
    }
    (p, at)
}

fn inserted() -> Node {
    Node::Step(StepSpec {
        name: "inserted~".into(),
        failures: 0,
        retries: 0,
        fatal: false,
        output: Output::Json(serde_json::Value::Null),
        local: false,
    })
}

/// The vector holding the node at `path` and its index there (a join's step index is left at
/// the end of the path).
fn parent_of<'p>(nodes: &'p mut Vec<Node>, path: &[usize]) -> (&'p mut Vec<Node>, usize) {
    let i = path[0];
    if path.len() > 1 {
        if let Node::Catch(_) = &nodes[i] {
            let Node::Catch(inner) = &mut nodes[i] else {
                unreachable!()
            };
            return parent_of(inner, &path[1..]);
        }
    }
    (nodes, i)
}
