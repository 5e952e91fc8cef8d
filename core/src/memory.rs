//! [`MemoryStore`]: the reference implementation of the [`JournalStore`] contract, kept in one
//! process's memory. The conformance suite's model agrees with it; tests and benches use it as
//! the baseline.

use crate::error::StoreError;
use crate::event::{Event, InputResponse, Payload, StoredEvent};
use crate::ids::{AppendId, DeploymentId, RequestId, RunId, SessionId, WorkerId};
use crate::keys::ApiKey;
use crate::session::{QueuedMessage, SessionEnd, SessionEntry, SessionRecord};
use crate::store::{
    check_limits, check_message, check_session_id, Append, Appended, CancelOutcome, CreatedRun,
    Delivered, Effects, JournalStore, Lease, NewRun, PendingRequest, Resolution, RunQuery,
    RunRecord, RunStatus,
};
use crate::time::Timestamp;
use crate::wake::{WakeSignal, WatchHub, WatchKey};
use async_trait::async_trait;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

/// The in-memory reference store. Cheap to create; everything is lost when it is dropped.
#[derive(Debug)]
pub struct MemoryStore {
    state: Mutex<State>,
    wake: WakeSignal,
    /// Names this store in [`JournalStore::store_id`]: stores are per process, so any unique
    /// value will do.
    id: String,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            wake: WakeSignal::default(),
            id: uuid::Uuid::new_v4().simple().to_string(),
        }
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// `create_run`, claiming the new run under `lease` when it is valid.
    fn create(
        &self,
        new: NewRun,
        lease: Option<&Lease>,
        now: Timestamp,
    ) -> Result<CreatedRun, StoreError> {
        new.validate()?;
        let key = new.key();
        let mut st = self.state.lock().expect("memory store lock");
        if let Some(existing) = st.keys.get(&key) {
            let run = st.run(existing)?;
            if !new.matches(&run.events[0].event) {
                return Err(StoreError::IdempotencyMismatch {
                    key,
                    existing: existing.clone(),
                });
            }
            return Ok(CreatedRun {
                run: run.record.clone(),
                created: false,
            });
        }
        if st.ended(&new.session_id) {
            return Err(StoreError::SessionEnded {
                session: new.session_id,
            });
        }
        if st.runs.contains_key(&new.run_id) {
            return Err(StoreError::AlreadyExists {
                what: "run",
                id: new.run_id.to_string(),
                hint: "run ids are unique; use a fresh id",
            });
        }
        let mut record = new.record(now);
        if let Some(l) = lease.filter(|l| st.lease_valid(l, now)) {
            record.owner = Some((l.worker.clone(), l.epoch));
            record.activations = 1;
        }
        let run = MemRun {
            record: record.clone(),
            events: vec![StoredEvent {
                seq: 0,
                at: now,
                event: new.started_event(),
            }],
            append_ids: HashMap::new(),
            timers: BTreeMap::new(),
        };
        st.runs.insert(new.run_id.clone(), run);
        st.order.push(new.run_id.clone());
        st.keys.insert(key, new.run_id);
        if record.owner.is_none() {
            self.wake.wake();
        }
        Ok(CreatedRun {
            run: record,
            created: true,
        })
    }

    /// An external delivery reached `run`: wake idle workers and the run's own worker.
    fn delivered(&self, st: &State, run: &RunId) {
        self.wake.wake();
        st.hub.wake(&WatchKey::Run(run.clone()));
    }
}

#[derive(Debug, Default)]
struct State {
    runs: HashMap<RunId, MemRun>,
    /// Insertion order, so scans are deterministic.
    order: Vec<RunId>,
    keys: HashMap<String, RunId>,
    /// Live hook tokens: token → (run, cmd).
    hooks: HashMap<String, (RunId, u64)>,
    /// (token, dedupe key) → (run, seq) of the latest accepted delivery. A live token names
    /// one hook, so while it is live the entry of its run is that hook's; after the run ended
    /// (until it is purged) a retry is still answered as a duplicate.
    hook_dedupe: HashMap<(String, String), (RunId, u64)>,
    requests: HashMap<RequestId, MemRequest>,
    /// Session logs, each in seq order; purged entries leave gaps.
    sessions: HashMap<SessionId, Vec<SessionEntry>>,
    /// Each session log's next seq, kept apart from the log so a purge never frees a seq.
    session_next: HashMap<SessionId, u64>,
    workers: HashMap<WorkerId, MemWorker>,
    /// Session-log and run watchers.
    hub: WatchHub,
    /// API keys in creation order.
    api_keys: Vec<ApiKey>,
    /// Session records (contract clause 10): ended sessions and queued messages.
    session_records: HashMap<SessionId, MemSession>,
}

/// A session's record: when it ended, its message seq counter and queue.
#[derive(Debug, Default)]
struct MemSession {
    ended_at: Option<Timestamp>,
    next_message: u64,
    queued: VecDeque<QueuedMessage>,
}

#[derive(Debug)]
struct MemRun {
    record: RunRecord,
    events: Vec<StoredEvent>,
    append_ids: HashMap<AppendId, Appended>,
    timers: BTreeMap<u64, Timestamp>,
}

#[derive(Debug)]
struct MemRequest {
    pending: PendingRequest,
    state: RequestState,
}

#[derive(Debug)]
enum RequestState {
    Pending,
    Answered { response: InputResponse, seq: u64 },
    Withdrawn,
}

#[derive(Debug)]
struct MemWorker {
    lease: Lease,
    retired: bool,
}

impl State {
    /// Whether `session` was ended (contract clause 10).
    fn ended(&self, session: &SessionId) -> bool {
        self.session_records
            .get(session)
            .is_some_and(|r| r.ended_at.is_some())
    }

    fn run(&self, id: &RunId) -> Result<&MemRun, StoreError> {
        self.runs
            .get(id)
            .ok_or_else(|| StoreError::not_found("run", id))
    }

    /// Whether a valid lease holds the run at `now`.
    fn held(&self, rec: &RunRecord, now: Timestamp) -> bool {
        rec.owner
            .as_ref()
            .is_some_and(|(w, e)| self.valid(w, *e, now))
    }

    /// Whether `worker` at `epoch` holds a valid lease at `now`: its current, unretired,
    /// unexpired registration.
    fn valid(&self, worker: &WorkerId, epoch: u64, now: Timestamp) -> bool {
        self.workers
            .get(worker)
            .is_some_and(|w| !w.retired && w.lease.epoch == epoch && w.lease.expires_at > now)
    }

    /// The run's claim key if no valid lease holds it (contract clause 5): when its work is
    /// due, and for an orphaned run (its owner's lease is no longer valid) the earlier of that
    /// and its `updated_at`. `None`: not claimable at any time without a new event.
    fn claim_key(&self, run: &MemRun, now: Timestamp) -> Option<Timestamp> {
        if run.record.status != RunStatus::Running || self.held(&run.record, now) {
            return None;
        }
        let work = State::work_at(run);
        if run.record.owner.is_some() {
            Some(work.map_or(run.record.updated_at, |w| w.min(run.record.updated_at)))
        } else {
            work
        }
    }

    /// When the run next has work, ignoring leases: the time of its first unprocessed event, or
    /// its earliest timer.
    fn work_at(run: &MemRun) -> Option<Timestamp> {
        if run.record.status != RunStatus::Running {
            return None;
        }
        let pending = run
            .events
            .get(usize::try_from(run.record.processed_seq).unwrap_or(usize::MAX))
            .map(|e| e.at);
        let timer = run.timers.values().min().copied();
        match (pending, timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Writes `events` at the run's next seq with their effects. The caller has checked
    /// preconditions; this checks hook tokens, the one failure that depends on other runs.
    fn write(
        &mut self,
        run_id: &RunId,
        events: Vec<Event>,
        now: Timestamp,
    ) -> Result<(u64, u64), StoreError> {
        let run = self.runs.get(run_id).expect("caller checked the run");
        let fx = Effects::of(run.record.execution, &events);
        for (i, (token, _, _)) in fx.hooks_created.iter().enumerate() {
            if self.hooks.contains_key(token)
                || fx.hooks_created[..i].iter().any(|(t, _, _)| t == token)
            {
                return Err(StoreError::AlreadyExists {
                    what: "hook token",
                    id: token.clone(),
                    hint: "a live hook already has this token; choose another token or wait for its run to end",
                });
            }
        }
        let run = self.runs.get_mut(run_id).expect("caller checked the run");
        let first = run.record.next_seq;
        for (i, event) in events.into_iter().enumerate() {
            run.events.push(StoredEvent {
                seq: first + i as u64,
                at: now,
                event,
            });
        }
        run.record.next_seq = run.events.len() as u64;
        run.record.updated_at = now;
        for (cmd, due) in &fx.timers_set {
            run.timers.insert(*cmd, *due);
        }
        for cmd in &fx.timers_cleared {
            run.timers.remove(cmd);
        }
        if fx.cancel_requested {
            run.record.cancel_requested = true;
        }
        crate::search::apply_patch(&mut run.record.attributes, &fx.attributes);
        if let Some(status) = fx.status {
            run.record.status = status;
        }
        let ended = fx.ends_run();
        if ended {
            run.timers.clear();
            run.record.owner = None;
        }
        let (session, call) = (run.record.session_id.clone(), run.record.call_id.clone());
        let next = run.record.next_seq;
        for (token, cmd, _) in fx.hooks_created {
            self.hooks.insert(token, (run_id.clone(), cmd));
        }
        for (request_id, cmd, request) in fx.requests_opened {
            let pending = PendingRequest {
                request_id: request_id.clone(),
                run_id: run_id.clone(),
                session_id: session.clone(),
                cmd,
                request,
                requested_at: now,
            };
            self.requests.insert(
                request_id,
                MemRequest {
                    pending,
                    state: RequestState::Pending,
                },
            );
        }
        for request_id in fx.requests_closed {
            if let Some(r) = self.requests.get_mut(&request_id) {
                if matches!(r.state, RequestState::Pending) {
                    r.state = RequestState::Withdrawn;
                }
            }
        }
        if ended {
            self.hooks.retain(|_, (r, _)| r != run_id);
            for r in self.requests.values_mut() {
                if &r.pending.run_id == run_id && matches!(r.state, RequestState::Pending) {
                    r.state = RequestState::Withdrawn;
                }
            }
        }
        if !fx.session_events.is_empty() {
            self.hub.wake(&WatchKey::Session(session.clone()));
        }
        let log = self.sessions.entry(session.clone()).or_default();
        let next_seq = self.session_next.entry(session.clone()).or_default();
        for event in fx.session_events {
            let seq = *next_seq;
            *next_seq += 1;
            log.push(SessionEntry {
                session_id: session.clone(),
                seq,
                at: now,
                run_id: run_id.clone(),
                call_id: call.clone(),
                event,
            });
        }
        Ok((first, next))
    }

    /// The pending requests of a run, ordered by cmd.
    fn pending_of(&self, run: &RunId) -> Vec<RequestId> {
        let mut pending: Vec<&MemRequest> = self
            .requests
            .values()
            .filter(|r| &r.pending.run_id == run && matches!(r.state, RequestState::Pending))
            .collect();
        pending.sort_by_key(|r| r.pending.cmd);
        pending
            .into_iter()
            .map(|r| r.pending.request_id.clone())
            .collect()
    }

    /// Whether `lease` is valid at `now`.
    fn lease_valid(&self, lease: &Lease, now: Timestamp) -> bool {
        self.valid(&lease.worker, lease.epoch, now)
    }

    fn check_lease_current(&self, lease: &Lease, run: &str) -> Result<(), StoreError> {
        match self.workers.get(&lease.worker) {
            Some(w) if !w.retired && w.lease.epoch == lease.epoch => Ok(()),
            _ => Err(fenced(lease, run)),
        }
    }
}

fn fenced(lease: &Lease, run: &str) -> StoreError {
    StoreError::Fenced {
        run: run.to_owned(),
        worker: lease.worker.to_string(),
        epoch: lease.epoch,
    }
}

#[async_trait]
impl JournalStore for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn create_run(&self, new: NewRun, now: Timestamp) -> Result<CreatedRun, StoreError> {
        self.create(new, None, now)
    }

    async fn create_run_claimed(
        &self,
        new: NewRun,
        lease: &Lease,
        now: Timestamp,
    ) -> Result<CreatedRun, StoreError> {
        self.create(new, Some(lease), now)
    }

    async fn append(&self, a: Append) -> Result<Appended, StoreError> {
        check_limits(&a.events)?;
        if a.events
            .iter()
            .any(|e| matches!(e, Event::RunStarted { .. }))
        {
            return Err(StoreError::InvalidInput(
                "RunStarted is written by create_run, never appended".into(),
            ));
        }
        let mut st = self.state.lock().expect("memory store lock");
        let run = st.run(&a.run)?;
        if let Some(done) = run.append_ids.get(&a.append_id) {
            return Ok(Appended {
                duplicate: true,
                ..*done
            });
        }
        if run.record.status.is_terminal() {
            return Err(StoreError::RunEnded { run: a.run.clone() });
        }
        if run.record.owner.as_ref() != Some(&(a.lease.worker.clone(), a.lease.epoch)) {
            return Err(fenced(&a.lease, a.run.as_str()));
        }
        st.check_lease_current(&a.lease, a.run.as_str())?;
        let run = st.run(&a.run)?;
        if run.record.next_seq != a.expected_seq {
            return Err(StoreError::Conflict {
                run: a.run.clone(),
                expected: a.expected_seq,
                actual: run.record.next_seq,
            });
        }
        let (first_seq, next_seq) = st.write(&a.run, a.events, a.now)?;
        let run = st.runs.get_mut(&a.run).expect("checked");
        run.record.processed_seq = next_seq;
        run.record.activations = 0;
        let out = Appended {
            first_seq,
            next_seq,
            duplicate: false,
        };
        run.append_ids.insert(a.append_id, out);
        Ok(out)
    }

    async fn read(
        &self,
        run: &RunId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        if max == 0 {
            return Err(StoreError::InvalidInput("read needs max > 0".into()));
        }
        let st = self.state.lock().expect("memory store lock");
        let r = st.run(run)?;
        let len = r.events.len() as u64;
        if from_seq > len {
            return Err(StoreError::InvalidInput(format!(
                "read from seq {from_seq} is past the end of run {run} (next seq {len})"
            )));
        }
        let start = from_seq as usize;
        let end = start.saturating_add(max).min(r.events.len());
        Ok(r.events[start..end].to_vec())
    }

    async fn get_run(&self, run: &RunId) -> Result<RunRecord, StoreError> {
        let st = self.state.lock().expect("memory store lock");
        Ok(st.run(run)?.record.clone())
    }

    async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        let st = self.state.lock().expect("memory store lock");
        let mut runs: Vec<RunRecord> = st
            .order
            .iter()
            .map(|id| &st.runs[id].record)
            .filter(|r| query.matches(r))
            .cloned()
            .collect();
        // Creation time comes from the caller's clock, so insertion order is not time order.
        runs.sort_by(|a, b| (a.created_at, &a.run_id).cmp(&(b.created_at, &b.run_id)));
        if query.limit != 0 {
            runs.truncate(query.limit);
        }
        Ok(runs)
    }

    async fn answer(
        &self,
        request: &RequestId,
        response: InputResponse,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        let mut st = self.state.lock().expect("memory store lock");
        let r = st
            .requests
            .get(request)
            .ok_or_else(|| StoreError::not_found("request", request))?;
        let run_id = r.pending.run_id.clone();
        match &r.state {
            RequestState::Answered {
                response: prev,
                seq,
            } => {
                return if prev.same_answer(&response) {
                    Ok(Delivered {
                        run: run_id,
                        seq: *seq,
                        duplicate: true,
                    })
                } else {
                    Err(StoreError::AlreadyAnswered {
                        request: request.clone(),
                    })
                };
            }
            RequestState::Withdrawn => {
                return Err(StoreError::Withdrawn {
                    request: request.clone(),
                })
            }
            RequestState::Pending => {}
        }
        r.pending
            .request
            .accepts(&response)
            .map_err(|reason| StoreError::InvalidAnswer {
                request: request.clone(),
                reason,
            })?;
        if st.run(&run_id)?.record.status.is_terminal() {
            return Err(StoreError::Withdrawn {
                request: request.clone(),
            });
        }
        let event = Event::InputAnswered {
            request_id: request.clone(),
            response: response.clone(),
        };
        check_limits(std::slice::from_ref(&event))?;
        let (seq, _) = st.write(&run_id, vec![event], now)?;
        self.delivered(&st, &run_id);
        st.requests.get_mut(request).expect("checked").state =
            RequestState::Answered { response, seq };
        Ok(Delivered {
            run: run_id,
            seq,
            duplicate: false,
        })
    }

    async fn deliver_hook(
        &self,
        token: &str,
        payload: Payload,
        dedupe_key: Option<&str>,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        crate::store::check_hook_delivery(token, dedupe_key)?;
        let mut st = self.state.lock().expect("memory store lock");
        let live = st.hooks.get(token).cloned();
        let key = dedupe_key.map(|k| (token.to_owned(), k.to_owned()));
        // A retry: of a delivery to the live hook, or of one whose run has ended since (a
        // token reused by a later run does not inherit the earlier run's keys).
        let recorded = key
            .as_ref()
            .and_then(|k| st.hook_dedupe.get(k))
            .filter(|(r, _)| live.as_ref().is_none_or(|(live_run, _)| live_run == r));
        if let Some((run, seq)) = recorded.cloned() {
            return Ok(Delivered {
                run,
                seq,
                duplicate: true,
            });
        }
        let Some((run_id, cmd)) = live else {
            return Err(StoreError::not_found("hook token", token));
        };
        let event = Event::HookReceived { cmd, payload };
        check_limits(std::slice::from_ref(&event))?;
        let (seq, _) = st.write(&run_id, vec![event], now)?;
        self.delivered(&st, &run_id);
        if let Some(k) = key {
            st.hook_dedupe.insert(k, (run_id.clone(), seq));
        }
        Ok(Delivered {
            run: run_id,
            seq,
            duplicate: false,
        })
    }

    async fn request_cancel(
        &self,
        run: &RunId,
        reason: &str,
        now: Timestamp,
    ) -> Result<CancelOutcome, StoreError> {
        let mut st = self.state.lock().expect("memory store lock");
        let r = &st.run(run)?.record;
        if r.status.is_terminal() {
            return Ok(CancelOutcome::AlreadyEnded { status: r.status });
        }
        if r.cancel_requested {
            return Ok(CancelOutcome::AlreadyRequested);
        }
        let blocked = r.status == RunStatus::Blocked;
        let events = crate::store::cancel_events(reason, blocked, st.pending_of(run));
        check_limits(&events[..1])?;
        let (seq, _) = st.write(run, events, now)?;
        self.delivered(&st, run);
        Ok(CancelOutcome::Requested { seq })
    }

    async fn resolve_blocked(
        &self,
        run: &RunId,
        resolution: Resolution,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        let mut st = self.state.lock().expect("memory store lock");
        let status = st.run(run)?.record.status;
        resolution.check(run, status)?;
        let pending = if resolution.withdraws() {
            st.pending_of(run)
        } else {
            Vec::new()
        };
        let events = resolution.events(pending);
        let (seq, _) = st.write(run, events, now)?;
        self.delivered(&st, run);
        Ok(seq)
    }

    async fn pending_requests(
        &self,
        session: &SessionId,
    ) -> Result<Vec<PendingRequest>, StoreError> {
        let st = self.state.lock().expect("memory store lock");
        let mut out: Vec<PendingRequest> = st
            .requests
            .values()
            .filter(|r| {
                &r.pending.session_id == session && matches!(r.state, RequestState::Pending)
            })
            .map(|r| r.pending.clone())
            .collect();
        out.sort_by(|a, b| (a.requested_at, &a.request_id).cmp(&(b.requested_at, &b.request_id)));
        Ok(out)
    }

    async fn read_session(
        &self,
        session: &SessionId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<SessionEntry>, StoreError> {
        if max == 0 {
            return Err(StoreError::InvalidInput(
                "read_session needs max > 0".into(),
            ));
        }
        let st = self.state.lock().expect("memory store lock");
        Ok(st
            .sessions
            .get(session)
            .map(|log| {
                let start = log.partition_point(|e| e.seq < from_seq);
                log[start..].iter().take(max).cloned().collect()
            })
            .unwrap_or_default())
    }

    async fn register_worker(
        &self,
        worker: &WorkerId,
        deployment: &DeploymentId,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        crate::store::check_worker_ids(worker, deployment)?;
        let mut st = self.state.lock().expect("memory store lock");
        let epoch = st.workers.get(worker).map_or(1, |w| w.lease.epoch + 1);
        let lease = Lease {
            worker: worker.clone(),
            deployment: deployment.clone(),
            epoch,
            expires_at: now.plus(ttl),
        };
        st.workers.insert(
            worker.clone(),
            MemWorker {
                lease: lease.clone(),
                retired: false,
            },
        );
        // An earlier epoch's runs are orphaned now: wake idle workers to take them.
        if epoch > 1 {
            self.wake.wake();
        }
        Ok(lease)
    }

    async fn heartbeat(
        &self,
        lease: &Lease,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        let mut st = self.state.lock().expect("memory store lock");
        let w = st
            .workers
            .get_mut(&lease.worker)
            .ok_or_else(|| StoreError::not_found("worker", &lease.worker))?;
        if w.retired || w.lease.epoch != lease.epoch {
            return Err(fenced(lease, ""));
        }
        w.lease.expires_at = now.plus(ttl);
        Ok(w.lease.clone())
    }

    async fn claim(
        &self,
        lease: &Lease,
        max: usize,
        now: Timestamp,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let mut st = self.state.lock().expect("memory store lock");
        if !st.lease_valid(lease, now) {
            return Err(fenced(lease, ""));
        }
        let mut ready: Vec<(Timestamp, usize, RunId)> = st
            .order
            .iter()
            .enumerate()
            .filter_map(|(i, id)| {
                let run = &st.runs[id];
                if run.record.deployment_id != lease.deployment {
                    return None;
                }
                st.claim_key(run, now)
                    .filter(|at| *at <= now)
                    .map(|at| (at, i, id.clone()))
            })
            .collect();
        ready.sort();
        let mut out = Vec::new();
        for (_, _, id) in ready.into_iter().take(max) {
            let run = st.runs.get_mut(&id).expect("listed");
            run.record.owner = Some((lease.worker.clone(), lease.epoch));
            run.record.activations += 1;
            run.record.updated_at = now;
            out.push(run.record.clone());
        }
        Ok(out)
    }

    async fn release(
        &self,
        lease: &Lease,
        run: &RunId,
        processed_seq: u64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let mut st = self.state.lock().expect("memory store lock");
        let owner = st.run(run)?.record.owner.clone();
        if owner.as_ref() != Some(&(lease.worker.clone(), lease.epoch)) {
            return Err(fenced(lease, run.as_str()));
        }
        st.check_lease_current(lease, run.as_str())?;
        let r = &mut st.runs.get_mut(run).expect("checked").record;
        r.owner = None;
        r.processed_seq = r.processed_seq.max(processed_seq.min(r.next_seq));
        r.updated_at = now;
        Ok(())
    }

    async fn retire_worker(&self, lease: &Lease, _now: Timestamp) -> Result<(), StoreError> {
        let mut st = self.state.lock().expect("memory store lock");
        st.check_lease_current(lease, "")?;
        // The runs it still holds keep naming it: orphaned, they are claimable at once.
        if let Some(w) = st.workers.get_mut(&lease.worker) {
            w.retired = true;
        }
        self.wake.wake();
        Ok(())
    }

    async fn wakeups(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.wake.subscribe())
    }

    async fn watch(&self, key: &WatchKey) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(
            self.state
                .lock()
                .expect("memory store lock")
                .hub
                .subscribe(key),
        )
    }

    fn store_id(&self) -> String {
        format!("memory:{}", self.id)
    }

    async fn create_key(&self, key: ApiKey) -> Result<(), StoreError> {
        key.validate()?;
        let mut st = self.state.lock().expect("memory store lock");
        if st
            .api_keys
            .iter()
            .any(|k| k.id == key.id || k.hash == key.hash)
        {
            return Err(key.exists());
        }
        st.api_keys.push(key);
        Ok(())
    }

    async fn list_keys(&self) -> Result<Vec<ApiKey>, StoreError> {
        let mut keys = self
            .state
            .lock()
            .expect("memory store lock")
            .api_keys
            .clone();
        keys.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(keys)
    }

    async fn revoke_key(&self, id: &str, now: Timestamp) -> Result<ApiKey, StoreError> {
        let mut st = self.state.lock().expect("memory store lock");
        let key = st
            .api_keys
            .iter_mut()
            .find(|k| k.id == id)
            .ok_or_else(|| StoreError::not_found("api key", id))?;
        key.revoked_at.get_or_insert(now);
        Ok(key.clone())
    }

    async fn key_by_hash(&self, hash: &str) -> Result<Option<ApiKey>, StoreError> {
        let st = self.state.lock().expect("memory store lock");
        Ok(st.api_keys.iter().find(|k| k.hash == hash).cloned())
    }

    async fn purge(&self, ended_before: Timestamp, limit: usize) -> Result<usize, StoreError> {
        let mut st = self.state.lock().expect("memory store lock");
        let mut doomed: Vec<RunId> = st
            .order
            .iter()
            .filter(|id| {
                let r = &st.runs[*id].record;
                r.status.is_terminal() && r.updated_at < ended_before
            })
            .cloned()
            .collect();
        if limit != 0 {
            doomed.truncate(limit);
        }
        if doomed.is_empty() {
            return Ok(0);
        }
        let gone: std::collections::HashSet<RunId> = doomed.iter().cloned().collect();
        let mut sessions = std::collections::HashSet::new();
        for id in &doomed {
            let run = st.runs.remove(id).expect("listed");
            st.keys.remove(&run.record.idempotency_key);
            sessions.insert(run.record.session_id);
        }
        st.order.retain(|id| !gone.contains(id));
        st.hooks.retain(|_, (r, _)| !gone.contains(r));
        st.hook_dedupe.retain(|_, (r, _)| !gone.contains(r));
        st.requests.retain(|_, r| !gone.contains(&r.pending.run_id));
        for session in sessions {
            if let Some(log) = st.sessions.get_mut(&session) {
                log.retain(|e| !gone.contains(&e.run_id));
            }
        }
        Ok(doomed.len())
    }

    async fn end_session(
        &self,
        session: &SessionId,
        now: Timestamp,
    ) -> Result<SessionEnd, StoreError> {
        check_session_id(session)?;
        let mut st = self.state.lock().expect("memory store lock");
        let rec = st.session_records.entry(session.clone()).or_default();
        let ended_at = *rec.ended_at.get_or_insert(now);
        let live = st
            .order
            .iter()
            .map(|id| &st.runs[id].record)
            .filter(|r| &r.session_id == session && !r.status.is_terminal())
            .map(|r| r.run_id.clone())
            .collect();
        Ok(SessionEnd { ended_at, live })
    }

    async fn get_session(&self, session: &SessionId) -> Result<SessionRecord, StoreError> {
        check_session_id(session)?;
        let st = self.state.lock().expect("memory store lock");
        let rec = st.session_records.get(session);
        Ok(SessionRecord {
            session_id: session.clone(),
            ended_at: rec.and_then(|r| r.ended_at),
            queued: rec
                .map(|r| r.queued.iter().cloned().collect())
                .unwrap_or_default(),
        })
    }

    async fn queue_message(
        &self,
        session: &SessionId,
        message: Payload,
        now: Timestamp,
    ) -> Result<QueuedMessage, StoreError> {
        check_message(session, &message)?;
        let mut st = self.state.lock().expect("memory store lock");
        let rec = st.session_records.entry(session.clone()).or_default();
        if rec.ended_at.is_some() {
            return Err(StoreError::SessionEnded {
                session: session.clone(),
            });
        }
        let queued = QueuedMessage {
            session_id: session.clone(),
            seq: rec.next_message,
            at: now,
            message,
        };
        rec.next_message += 1;
        rec.queued.push_back(queued.clone());
        Ok(queued)
    }

    async fn take_messages(&self, session: &SessionId) -> Result<Vec<QueuedMessage>, StoreError> {
        check_session_id(session)?;
        let mut st = self.state.lock().expect("memory store lock");
        Ok(st
            .session_records
            .get_mut(session)
            .map(|r| r.queued.drain(..).collect())
            .unwrap_or_default())
    }

    async fn next_wake(
        &self,
        deployment: &DeploymentId,
        now: Timestamp,
    ) -> Result<Option<Timestamp>, StoreError> {
        let st = self.state.lock().expect("memory store lock");
        Ok(st
            .runs
            .values()
            .filter(|r| &r.record.deployment_id == deployment)
            .filter_map(|r| st.claim_key(r, now))
            .min())
    }
}
