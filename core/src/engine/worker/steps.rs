//! The live part of an activation: steps on tokio, agent starts, timers, deliveries, grace.

use super::*;

pub(super) type StepResult = (u64, Result<Payload, StepError>);

pub(super) struct Running {
    name: String,
    attempt: u32,
    policy: RetryPolicy,
    abort: tokio::task::AbortHandle,
}

/// Something in flight that can be aborted.
pub(super) trait Abortable {
    fn abort_handle(&self) -> &tokio::task::AbortHandle;
}

impl Abortable for Running {
    fn abort_handle(&self) -> &tokio::task::AbortHandle {
        &self.abort
    }
}

impl Abortable for (AgentStart, tokio::task::AbortHandle) {
    fn abort_handle(&self) -> &tokio::task::AbortHandle {
        &self.1
    }
}

/// An activation's in-flight step attempts (or agent starts) by command, aborted when the
/// activation ends in any way, an early return on a store error included: as after a real
/// crash, a dead activation starts and finishes nothing (dropping a tokio `JoinHandle` would
/// let the task run on, and start a step attempt another worker may already have recorded).
pub(super) struct Inflight<T: Abortable>(HashMap<u64, T>);

impl<T: Abortable> Inflight<T> {
    fn new() -> Self {
        Self(HashMap::new())
    }
}

impl<T: Abortable> std::ops::Deref for Inflight<T> {
    type Target = HashMap<u64, T>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<T: Abortable> std::ops::DerefMut for Inflight<T> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl<T: Abortable> Drop for Inflight<T> {
    fn drop(&mut self) {
        for t in self.0.values() {
            t.abort_handle().abort();
        }
    }
}

pub(super) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".into())
}

/// Whether the journal (as delivered to `exec`) holds the outbox event `e`: a step outcome,
/// an agent's start acknowledgement or its start failure.
pub(super) fn outbox_recorded(exec: &Executor, e: &Event) -> bool {
    let core = crate::engine::ctx::lock(&exec.core);
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

/// The command an outbox event (a step outcome, an agent's start or start failure) is about.
fn outbox_cmd(e: &Event) -> u64 {
    match e {
        Event::StepCompleted { cmd, .. }
        | Event::StepFailed { cmd, .. }
        | Event::AgentStarted { cmd, .. }
        | Event::HookReceived { cmd, .. } => *cmd,
        _ => u64::MAX,
    }
}

/// The end event of a body's outcome, and how the activation ends; `denied` is the reason
/// when the approval gate denied the call (the outcome is then its error).
pub(super) fn terminal(
    out: crate::engine::tool::BodyOutcome,
    denied: Option<String>,
) -> (Event, ActivationEnd) {
    if let Some(reason) = denied {
        return (
            Event::RunDenied {
                reason: reason.clone(),
            },
            ActivationEnd::Denied(reason),
        );
    }
    match out {
        Ok(output) => (Event::RunCompleted { output }, ActivationEnd::Completed),
        Err(error) => (
            Event::RunFailed {
                error: error.clone(),
            },
            ActivationEnd::Failed(error),
        ),
    }
}

/// The journal event of a finished attempt `attempt` of step `cmd` (named `name`, retried by
/// `policy`); a retry waits from `now`.
pub(super) fn outcome_event(
    cmd: u64,
    name: String,
    attempt: u32,
    policy: &RetryPolicy,
    result: Result<Payload, StepError>,
    now: Timestamp,
) -> Event {
    match result {
        Ok(output) => Event::StepCompleted {
            cmd,
            name,
            attempt,
            output,
        },
        Err(StepError::Fatal(error)) => Event::StepFailed {
            cmd,
            name,
            attempt,
            error,
            fatal: true,
            retry_at: None,
        },
        Err(StepError::Retryable {
            message,
            retry_after,
        }) => {
            let retry_at = (attempt <= policy.max_retries)
                .then(|| now.plus(retry_after.unwrap_or_else(|| policy.backoff(attempt))));
            Event::StepFailed {
                cmd,
                name,
                attempt,
                error: message,
                fatal: false,
                retry_at,
            }
        }
    }
}

/// Runs one step attempt; a panic (in the closure or its future) is a retryable failure.
async fn run_attempt(
    runner: &crate::engine::ctx::StepRunner,
    sc: StepCtx,
) -> Result<Payload, StepError> {
    let panicked = |p: Box<dyn std::any::Any + Send>| {
        StepError::retryable(format!("step panicked: {}", panic_message(&*p)))
    };
    match std::panic::catch_unwind(AssertUnwindSafe(|| runner(sc))) {
        Err(p) => Err(panicked(p)),
        Ok(fut) => AssertUnwindSafe(fut)
            .catch_unwind()
            .await
            .unwrap_or_else(|p| Err(panicked(p))),
    }
}

impl Inner {
    /// The live part of an activation, once the journal is exhausted.
    pub(super) async fn live(
        &self,
        run: &RunId,
        exec: &mut Executor,
        grace: Duration,
        fence: crate::FencingToken,
    ) -> Result<ActivationEnd, StoreError> {
        let (tx, mut rx) = mpsc::unbounded_channel::<StepResult>();
        let (agent_tx, mut agent_rx) = mpsc::unbounded_channel::<(u64, Result<String, String>)>();
        let (abort_tx, abort_rx) = watch::channel(false);
        let mut running: Inflight<Running> = Inflight::new();
        let mut starting: Inflight<(AgentStart, tokio::task::AbortHandle)> = Inflight::new();
        let mut outbox: Vec<Event> = Vec::new();
        // Deliveries to this run (an answer, a hook payload, a cancel) while its steps run.
        let mut deliveries = self.watch(WatchKey::Run(run.clone())).await;
        // What the steps of this activation may reach (StepCtx::start_call, resume_hook).
        let step_env = Arc::new(crate::engine::step::StepEnv {
            store: self.store.clone(),
            registry: self.registry.clone(),
            clock: self.clock.clone(),
            session_id: exec.session_id(),
        });
        let abort_all = |running: &HashMap<u64, Running>| {
            for r in running.values() {
                r.abort.abort();
            }
        };
        loop {
            // Spans ended by events now in the journal (delivered after their append, or read).
            self.report_spans(exec);
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
                let (event, end) = match exec.finished.take() {
                    _ if cancelling => (Event::RunCancelled, ActivationEnd::Cancelled),
                    Some(out) => terminal(out, exec.denied()),
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
            if batch.is_empty()
                && to_start.is_empty()
                && running.is_empty()
                && starting.is_empty()
                && !cancelling
                && !runnable.is_empty()
                && runnable.iter().all(|s| s.local)
            {
                // Only local steps to run and nothing else to journal: a batch of them.
                let batch_env = BatchEnv {
                    fence,
                    abort: &abort_rx,
                    step_env: &step_env,
                };
                match self.local_batch(run, exec, runnable, batch_env).await? {
                    Ok(Some(end)) => return Ok(end),
                    Ok(None) => continue,
                    Err(stop) => return self.block(run, exec.next_seq, stop.reason()).await,
                }
            }
            let only_outcomes = batch.len() == outbox.len() && !batch.is_empty();
            if only_outcomes && !cancelling && running.is_empty() && starting.is_empty() {
                // Nothing else runs, no cancel is under way and the body issued nothing new:
                // these outcomes may end it, and then one append records them with the end.
                batch.truncate(crate::store::MAX_EVENTS_PER_APPEND);
                match self.deliver_ahead(run, exec, batch).await? {
                    Ok(Some(end)) => return Ok(end),
                    Ok(None) => {
                        outbox.retain(|e| !outbox_recorded(exec, e));
                        continue;
                    }
                    Err(stop) => return self.block(run, exec.next_seq, stop.reason()).await,
                }
            }
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
                    fence,
                    abort: abort_rx.clone(),
                    env: step_env.clone(),
                    starts: Default::default(),
                    resumes: Default::default(),
                    trace: exec.trace.step_context(s.cmd, s.attempt),
                };
                exec.trace.step_started(s.cmd, s.attempt, self.clock.now());
                let tx = tx.clone();
                let runner = s.runner.clone();
                let cmd = s.cmd;
                let span = info_span!(
                    "step",
                    run_id = %run,
                    cmd,
                    name = %s.name,
                    attempt = s.attempt,
                    trace_id = %sc.trace.trace_id,
                    span_id = %sc.trace.span_id
                );
                let task = tokio::spawn(
                    async move {
                        let result = run_attempt(&runner, sc).await;
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
            // Outcomes are taken in a fixed order (steps, then agent starts) and everything
            // that finished meanwhile joins the same append, ordered by command: on a
            // deterministic scheduler the journal does not depend on which task won a race.
            let agent_outcome =
                |cmd: u64,
                 result: Result<String, String>,
                 starting: &mut HashMap<u64, (AgentStart, tokio::task::AbortHandle)>|
                 -> Option<Event> {
                    let (start, _) = starting.remove(&cmd)?;
                    Some(match result {
                        Ok(agent_id) => Event::AgentStarted {
                            cmd,
                            key: start.key,
                            target: start.target,
                            agent_id: Some(agent_id),
                        },
                        Err(e) => Event::HookReceived {
                            cmd,
                            payload: result_payload(Err(format!(
                                "the agent host could not start the child: {e}"
                            ))),
                        },
                    })
                };
            let before = outbox.len();
            tokio::select! {
                biased;
                Some((cmd, result)) = rx.recv() => {
                    let now = self.clock.now();
                    if let Some(r) = running.remove(&cmd) {
                        outbox.push(outcome_event(cmd, r.name, r.attempt, &r.policy, result, now));
                    }
                }
                Some((cmd, result)) = agent_rx.recv() => {
                    outbox.extend(agent_outcome(cmd, result, &mut starting));
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
            if outbox.len() > before {
                let now = self.clock.now();
                while let Ok((cmd, result)) = rx.try_recv() {
                    if let Some(r) = running.remove(&cmd) {
                        outbox.push(outcome_event(
                            cmd, r.name, r.attempt, &r.policy, result, now,
                        ));
                    }
                }
                while let Ok((cmd, result)) = agent_rx.try_recv() {
                    outbox.extend(agent_outcome(cmd, result, &mut starting));
                }
                outbox[before..].sort_by_key(outbox_cmd);
            }
        }
    }
}

/// What the attempts of a batch of local steps get from their activation.
pub(super) struct BatchEnv<'a> {
    fence: crate::FencingToken,
    abort: &'a watch::Receiver<bool>,
    step_env: &'a Arc<crate::engine::step::StepEnv>,
}

impl Inner {
    /// Runs a batch of local steps, `first` (runnable, all local) and those the body issues
    /// next, back to back on this task: each outcome is delivered to the body at once, at the
    /// seq it will get, and all of them are committed in one append at the batch's end. The
    /// batch ends when the body issues anything but local steps (a wait, progress, a normal
    /// step, ...), returns, or an attempt fails (its `StepFailed` commits with the batch), or
    /// one append is full. Every event of the batch is stamped with the batch's start time, so
    /// the body sees the same `ctx.now()` live and on replay. When the body returned, its end
    /// commits in the same append (`Some`). A delivery that gets into the journal first (a
    /// conflict) fails the append: the activation is given up, and the next one replays the
    /// journal and runs the uncommitted local steps again.
    async fn local_batch(
        &self,
        run: &RunId,
        exec: &mut Executor,
        first: Vec<crate::engine::replay::StepToRun>,
        env: BatchEnv<'_>,
    ) -> Result<Result<Option<ActivationEnd>, Stop>, StoreError> {
        let at = self.clock.now();
        let first_seq = exec.next_seq;
        let mut events: Vec<Event> = Vec::new();
        let mut stop = None;
        let mut todo = first;
        'batch: loop {
            for s in todo {
                if events.len() >= crate::store::MAX_EVENTS_PER_APPEND {
                    break 'batch;
                }
                if !self.still_owns(run).await? {
                    // Another worker runs the batch again; nothing of this one is committed.
                    return Ok(Ok(Some(ActivationEnd::Dropped(
                        "the worker's lease lapsed and another worker took the run over".into(),
                    ))));
                }
                let sc = StepCtx {
                    run_id: run.clone(),
                    cmd: s.cmd,
                    name: s.name.clone(),
                    attempt: s.attempt,
                    fence: env.fence,
                    abort: env.abort.clone(),
                    env: env.step_env.clone(),
                    starts: Default::default(),
                    resumes: Default::default(),
                    trace: exec.trace.step_context(s.cmd, s.attempt),
                };
                exec.trace.step_started(s.cmd, s.attempt, self.clock.now());
                let span = info_span!(
                    "step",
                    run_id = %run,
                    cmd = s.cmd,
                    name = %s.name,
                    attempt = s.attempt,
                    local = true,
                    trace_id = %sc.trace.trace_id,
                    span_id = %sc.trace.span_id
                );
                let result = run_attempt(&s.runner, sc).instrument(span).await;
                let failed = result.is_err();
                let event = outcome_event(s.cmd, s.name, s.attempt, &s.policy, result, at);
                let ev = StoredEvent {
                    seq: first_seq + events.len() as u64,
                    at,
                    event,
                };
                let delivered = exec.deliver(&ev);
                events.push(ev.event);
                if let Err(s) = delivered {
                    stop = Some(s);
                    break 'batch;
                }
                if failed || exec.finished.is_some() {
                    break 'batch;
                }
            }
            if exec.has_unrecorded() {
                break;
            }
            todo = exec.runnable_steps(at, &[]);
            if todo.is_empty() || !todo.iter().all(|s| s.local) {
                break;
            }
        }
        debug!(
            steps = events.len(),
            "local steps ran; committing them in one append"
        );
        self.commit_ahead(run, exec, first_seq, at, events, stop)
            .await
    }
}
