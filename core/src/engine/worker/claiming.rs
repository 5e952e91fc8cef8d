//! The run loop: claiming runs as they become due, eager starts, sleeping until the next
//! wake-up, retiring or stopping fenced.

use super::*;

impl Inner {
    /// Spawns the activation of a claimed run in the run loop's task set.
    pub(super) fn spawn_activation(
        self: &Arc<Self>,
        tasks: &mut tokio::task::JoinSet<(RunId, ActivationEnd)>,
        active: &mut HashSet<RunId>,
        rec: RunRecord,
        journal: Option<Vec<StoredEvent>>,
    ) {
        let inner = self.clone();
        active.insert(rec.run_id.clone());
        self.running.fetch_add(1, Ordering::SeqCst);
        tasks.spawn(async move {
            let id = rec.run_id.clone();
            let end = inner.clone().activate(rec, journal).await;
            inner.running.fetch_sub(1, Ordering::SeqCst);
            (id, end)
        });
    }

    /// Claims, activates and heartbeats until stopped; see [`Worker::spawn`]. Ends with
    /// `Fenced` when another process registered this worker id.
    pub(super) async fn run_loop(
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
        // The lease is renewed on a task of its own, so a slow claim or wake-up query (a long
        // queue on a slow store) never lets it lapse under live runs, whose steps another
        // worker would then run again.
        let mut heartbeat = tokio::spawn(self.clone().heartbeat_loop(stop.clone()));
        let fenced = loop {
            if *stop.borrow() {
                break None;
            }
            while let Some(done) = tasks.try_join_next() {
                if let Ok((id, _)) = done {
                    active.remove(&id);
                }
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
                ended = &mut heartbeat => match ended {
                    Ok(Some(e)) => break Some(e),
                    // Stopped, or the task panicked: the loop's next round sees the stop; a
                    // worker whose heartbeat died must not go on claiming.
                    Ok(None) => {}
                    Err(e) => {
                        error!(error = %e, "the heartbeat task died; the worker stops");
                        break None;
                    }
                },
                Some((rec, first)) = eager.recv() => {
                    self.spawn_activation(&mut tasks, &mut active, rec, Some(vec![first]));
                    look = false;
                }
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    // A run that ended leaves nothing due behind it: look for work only after
                    // a suspension (it may have set a timer), a dropped activation, or when
                    // the worker was full (runs may be waiting for the freed slot).
                    let full = tasks.len() + 1 >= self.config.max_active_runs;
                    if let Ok((id, end)) = done {
                        active.remove(&id);
                        look = full
                            || !matches!(
                                end,
                                ActivationEnd::Completed
                                    | ActivationEnd::Failed(_)
                                    | ActivationEnd::Cancelled
                                    | ActivationEnd::Blocked(_)
                                    | ActivationEnd::Denied(_)
                            );
                    }
                }
            }
        };
        heartbeat.abort();
        // Runs started eagerly from now on are left to the store's claims.
        self.eager.lock().unwrap_or_else(|e| e.into_inner()).take();
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        self.running.store(0, Ordering::SeqCst);
        if let Some(e) = fenced {
            let lease = self.lease();
            error!(worker = %lease.worker, epoch = lease.epoch, error = %e, "worker fenced: its id was registered again without its lock (a direct register_worker, or a lock that lapsed while this process stalled), so this one stops; give each live process its own worker id (WorkerConfig::id)");
            return Err(e);
        }
        let lease = self.lease();
        if let Err(e) = self.store.retire_worker(&lease, self.clock.now()).await {
            warn!(error = %e, "retiring the worker failed");
        }
        Ok(())
    }

    /// Renews the lease a third of the way through it until `stop`; ends with the `Fenced`
    /// error when another process registered this worker id. A failed renewal is retried at
    /// the poll interval.
    async fn heartbeat_loop(
        self: Arc<Self>,
        mut stop: watch::Receiver<bool>,
    ) -> Option<StoreError> {
        loop {
            if *stop.borrow() {
                return None;
            }
            match self.keep_lease().await {
                Ok(()) => {
                    let at = self.renew_at();
                    tokio::select! {
                        _ = self.clock.sleep_until(at) => {}
                        _ = stop.changed() => {}
                    }
                }
                Err(e @ StoreError::Fenced { .. }) => return Some(e),
                Err(e) => {
                    warn!(error = %e, "heartbeat failed");
                    tokio::select! {
                        _ = tokio::time::sleep(self.config.poll_interval) => {}
                        _ = stop.changed() => {}
                    }
                }
            }
        }
    }

    /// Claims up to `max` runs. When a claim attempt failed with a transient error it may have
    /// landed (an ambiguous commit) and left runs owned by this worker that nobody activates;
    /// those are found by listing the deployment's running runs and adopted.
    pub(super) async fn claim(
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
}
