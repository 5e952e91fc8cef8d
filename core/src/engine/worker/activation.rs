//! One activation: from a claimed run to its body replayed (or resumed from the sticky cache),
//! the appends that record what it does, and the one cleanup for every end.

use super::*;

/// A bounded cache of suspended bodies: the least recently suspended is evicted first.
pub(super) struct Sticky {
    cap: usize,
    bodies: Mutex<StickyBodies>,
}

/// A tick counter, and each cached body with the tick it was put at.
pub(super) type StickyBodies = (u64, HashMap<RunId, (u64, Executor)>);

impl Sticky {
    /// A cache of at most `cap` bodies (0: none).
    pub(super) fn new(cap: usize) -> Self {
        Self {
            cap,
            bodies: Mutex::new((0, HashMap::new())),
        }
    }

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

/// Outcome of one append attempt inside an activation.
pub(super) enum Appendix {
    Done,
    /// New events arrived first; they were delivered.
    Conflict,
}

impl Inner {
    /// Runs one activation of a claimed run; `journal` is its journal when the caller already
    /// has it (an eager start: the `RunStarted` just written), else it is read.
    pub(super) async fn activate(
        self: Arc<Self>,
        rec: RunRecord,
        journal: Option<Vec<StoredEvent>>,
    ) -> ActivationEnd {
        if rec.processed_seq == 0 {
            info!(run_id = %rec.run_id, tool = %rec.tool, session_id = %rec.session_id, "run started");
        } else if rec.activations > 1 {
            info!(run_id = %rec.run_id, activations = rec.activations, "run retried: an earlier activation died");
        }
        // `tool` and `created_at` (epoch ms) let a subscriber measure call-to-settle latency per tool
        // at the run's end event (`outcome` field, see `log_end`).
        let span = info_span!(
            "activation",
            run_id = %rec.run_id,
            activations = rec.activations,
            tool = %rec.tool,
            created_at = rec.created_at.millis(),
            trace_id = tracing::field::Empty,
            span_id = tracing::field::Empty
        );
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

    /// One page of the journal from `from`.
    pub(super) async fn read_page(
        &self,
        run: &RunId,
        from: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.retrying(|| self.store.read(run, from, READ_PAGE))
            .await
    }

    pub(super) async fn activate_inner(
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
        exec.host_agents = self.registry.agent_host().is_some();
        let started = self.clock.now();
        exec.trace.on = self.trace_sink.get().is_some();
        // What was in the journal when the run was last processed was reported then.
        exec.trace.report_from = rec.processed_seq;
        if exec.trace.on {
            let ctx = exec.trace.context();
            let span = tracing::Span::current();
            span.record("trace_id", tracing::field::display(ctx.trace_id));
            span.record("span_id", tracing::field::display(ctx.span_id));
        }
        // Page by page up to the end the claim's record names (no round trip to find the
        // end), one page read ahead for what the body must get back at the call (webhook
        // tokens) and the pages after it being read while this one is delivered; events past
        // that end arrive in the live part like any delivery.
        exec.prescan(&page);
        exec.journal_ends_at(rec.next_seq);
        let after = page.last().map_or(rec.next_seq, |e| e.seq + 1);
        let mut pages = ReadAhead::start(
            &self.store,
            run,
            after,
            rec.next_seq,
            self.config.store_retries,
        );
        loop {
            let ahead = pages.next_page().await?;
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
        let end = self
            .live(run, &mut exec, tool.grace_period(), rec.fencing_token())
            .await?;
        if exec.trace.on {
            exec.trace.activation(
                rec.next_seq,
                rec.activations,
                started,
                self.clock.now(),
                end.kind(),
            );
            self.report_spans(&mut exec);
        }
        if end == ActivationEnd::Suspended {
            self.sticky.put(run.clone(), exec);
        } else if exec.commands() > 10_000 {
            // Freeing a long run's body takes time in proportion to it: not on this task.
            tokio::task::spawn_blocking(move || drop(exec));
        }
        Ok(end)
    }

    /// Appends `events` at the executor's next seq; on success delivers them to the body, on a
    /// conflict reads and delivers the events that got in first.
    pub(super) async fn append_deliver(
        &self,
        run: &RunId,
        exec: &mut Executor,
        events: Vec<Event>,
    ) -> Result<Result<Appendix, Stop>, StoreError> {
        let now = self.clock.now();
        let a = self.new_append(run, exec.next_seq, events, now);
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

    /// Reports the spans of `exec` whose events are in the journal to the trace sink.
    pub(super) fn report_spans(&self, exec: &mut Executor) {
        if exec.trace.done.is_empty() {
            return;
        }
        if let Some(sink) = self.trace_sink.get() {
            for span in exec.trace.done.drain(..) {
                sink.export(span);
            }
        }
    }

    /// An append of `events` at `expected_seq` under this worker's lease, with a fresh append id.
    fn new_append(
        &self,
        run: &RunId,
        expected_seq: u64,
        events: Vec<Event>,
        now: Timestamp,
    ) -> Append {
        Append {
            run: run.clone(),
            expected_seq,
            lease: self.lease(),
            append_id: AppendId::random(),
            events,
            now,
        }
    }

    /// Delivers `outcomes` (step results or agent starts, when nothing else runs and the body
    /// issued nothing unrecorded) to the body before they are recorded. When that ends the
    /// body, one append records them with the end — a commit less per run — and the activation
    /// ends (`Some`); otherwise they are appended alone (`None`). Nothing outside the body has
    /// seen them before their append: the next step starts only after it. A conflict (a
    /// delivery got in first) leaves the body ahead of the journal: the activation is given up
    /// with that error, and the next one replays the journal.
    pub(super) async fn deliver_ahead(
        &self,
        run: &RunId,
        exec: &mut Executor,
        outcomes: Vec<Event>,
    ) -> Result<Result<Option<ActivationEnd>, Stop>, StoreError> {
        let now = self.clock.now();
        let expected_seq = exec.next_seq;
        let mut stop = None;
        for (i, event) in outcomes.iter().enumerate() {
            let ev = StoredEvent {
                seq: expected_seq + i as u64,
                at: now,
                event: event.clone(),
            };
            if let Err(s) = exec.deliver(&ev) {
                stop = Some(s);
                break;
            }
        }
        self.commit_ahead(run, exec, expected_seq, now, outcomes, stop)
            .await
    }

    /// Appends `delivered`, events already delivered to the body at seqs from `expected_seq`
    /// stamped `now`; when the body returned (and `stop` is `None`), its end (with what
    /// [`finish`](Self::finish) records before it) joins the same append if it fits, and the
    /// activation ends (`Some`). A conflict is returned as the store's error: the body is
    /// ahead of the journal and cannot go on.
    pub(super) async fn commit_ahead(
        &self,
        run: &RunId,
        exec: &mut Executor,
        expected_seq: u64,
        now: Timestamp,
        delivered: Vec<Event>,
        stop: Option<Stop>,
    ) -> Result<Result<Option<ActivationEnd>, Stop>, StoreError> {
        let count = delivered.len();
        let mut events = delivered;
        let mut end = None;
        if stop.is_none() && exec.finished.is_some() {
            let mut more = before_end(exec, now);
            // Past one append's limit, the usual end follows this append.
            if events.len() + more.len() < crate::store::MAX_EVENTS_PER_APPEND {
                if let Some(out) = exec.finished.take() {
                    let (event, e) = super::steps::terminal(out, exec.denied());
                    more.push(event);
                    events.extend(more);
                    end = Some(e);
                }
            }
        }
        let a = self.new_append(run, expected_seq, events, now);
        self.retrying(|| self.store.append(a.clone())).await?;
        if exec.trace.on {
            // The end and what came with it were appended without a delivery to the body.
            for (i, event) in a.events.iter().enumerate().skip(count) {
                exec.trace.observe_at(expected_seq + i as u64, now, event);
            }
        }
        if let Some(stop) = stop {
            return Ok(Err(stop));
        }
        if end.is_some() {
            log_end(run, a.events.last().expect("the end was appended last"));
        }
        Ok(Ok(end))
    }

    /// Reads and delivers events past the executor's position.
    pub(super) async fn catch_up(
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
    pub(super) async fn append_final(
        &self,
        run: &RunId,
        mut expected_seq: u64,
        event: Event,
    ) -> Result<(), StoreError> {
        loop {
            let a = self.new_append(run, expected_seq, vec![event.clone()], self.clock.now());
            match self.retrying(|| self.store.append(a.clone())).await {
                Ok(_) => return Ok(()),
                Err(StoreError::Conflict { actual, .. }) => expected_seq = actual,
                Err(e) => return Err(e),
            }
        }
    }

    /// Parks the run as blocked with `reason`, or, when a cancel was requested before it
    /// blocked, ends it cancelled: the caller asked to stop, and a blocked run would otherwise
    /// keep its call pending until an operator resolved it (a second cancel is
    /// `AlreadyRequested`). The cancel flag is read again after every conflict, so a cancel
    /// that races the block is never left behind it.
    pub(super) async fn block(
        &self,
        run: &RunId,
        next_seq: u64,
        reason: String,
    ) -> Result<ActivationEnd, StoreError> {
        let mut expected = next_seq;
        let cancelled = loop {
            let rec = self.retrying(|| self.store.get_run(run)).await?;
            expected = expected.max(rec.next_seq);
            let cancelled = rec.cancel_requested;
            let event = if cancelled {
                Event::RunCancelled
            } else {
                Event::RunBlocked {
                    reason: reason.clone(),
                }
            };
            let a = self.new_append(run, expected, vec![event], self.clock.now());
            match self.retrying(|| self.store.append(a.clone())).await {
                Ok(_) => break cancelled,
                Err(StoreError::Conflict { actual, .. }) => expected = actual,
                Err(e) => return Err(e),
            }
        };
        if cancelled {
            info!(run_id = %run, %reason, "run cancelled: its cancel was requested before it blocked");
            return Ok(ActivationEnd::Cancelled);
        }
        warn!(run_id = %run, %reason, "parking run as blocked");
        // Blocked runs are not claimable; release it so that once resumed any worker can.
        let lease = self.lease();
        let _ = self
            .retrying(|| self.store.release(&lease, run, 0, self.clock.now()))
            .await;
        Ok(ActivationEnd::Blocked(reason))
    }

    /// Ends the run with `terminal` (`RunCompleted`, `RunFailed` or `RunCancelled`): the one
    /// cleanup for every end. The same append records the body's unrecorded progress and
    /// messages and withdraws every pending request (the store disposes hooks and drops timers
    /// when the run ends). Deliveries that got in first are read and folded in; the outcome is
    /// decided and does not change.
    pub(super) async fn finish(
        &self,
        run: &RunId,
        exec: &mut Executor,
        terminal: Event,
    ) -> Result<(), StoreError> {
        loop {
            let mut events = before_end(exec, self.clock.now());
            let last = events.len() < crate::store::MAX_EVENTS_PER_APPEND;
            if last {
                events.push(terminal.clone());
            } else {
                events.truncate(crate::store::MAX_EVENTS_PER_APPEND);
            }
            match self.append_deliver(run, exec, events).await? {
                Ok(Appendix::Done) if last => {
                    log_end(run, &terminal);
                    return Ok(());
                }
                // A delivery that cannot be replayed any more changes nothing: the body is done.
                Ok(_) | Err(_) => {}
            }
        }
    }
}

/// What an end's append records before the end event: the body's unrecorded progress and
/// messages, and a withdrawal of every pending request.
fn before_end(exec: &Executor, now: Timestamp) -> Vec<Event> {
    let mut events = exec.unrecorded_commands(now, false);
    events.extend(
        exec.pending_requests()
            .into_iter()
            .map(|request_id| Event::InputWithdrawn { request_id }),
    );
    events
}

/// Logs a recorded end event, with an `outcome` field (completed, failed, cancelled, denied)
/// that marks it as the run's end for subscribers (eve-server's metrics).
fn log_end(run: &RunId, terminal: &Event) {
    match terminal {
        Event::RunFailed { error } => {
            warn!(run_id = %run, outcome = "failed", %error, "run failed")
        }
        Event::RunCancelled => info!(run_id = %run, outcome = "cancelled", "run cancelled"),
        Event::RunDenied { reason } => {
            info!(run_id = %run, outcome = "denied", %reason, "run denied")
        }
        _ => info!(run_id = %run, outcome = "completed", "run completed"),
    }
}
