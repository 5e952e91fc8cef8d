//! Starts and the append commit protocol: the group-commit writers, run row locks, the
//! checks of an append and the write of events with their [`Effects`] (see the crate docs,
//! "Commit protocol").

use crate::error::{fenced, i64_of, map_err, unavailable};
use crate::reads::{run_from_row, RUN_COLS};
use crate::wake::{deployment_payload, key_payload};
use crate::Db;
use eve_core::codec::{encode_batch, FORMAT_VERSION};
use eve_core::{
    check_limits, Append, Appended, CreatedRun, Effects, Event, Execution, Lease, NewRun, RunId,
    RunRecord, RunStatus, StoreError, Timestamp, WatchKey,
};
use sqlx::{PgConnection, Row};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, Mutex};

pub(crate) type Job = (Append, oneshot::Sender<Result<Appended, StoreError>>);

/// The group-commit writer: folds queued appends into one transaction, a savepoint each.
pub(crate) async fn writer(db: Arc<Db>, rx: Arc<Mutex<mpsc::Receiver<Job>>>, max_batch: usize) {
    loop {
        let mut batch = Vec::new();
        {
            let mut rx = rx.lock().await;
            match rx.recv().await {
                Some(job) => batch.push(job),
                None => return,
            }
            while batch.len() < max_batch {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
        }
        batch.sort_by(|a, b| a.0.run.as_str().cmp(b.0.run.as_str()));
        let results = db.commit_batch(&batch).await;
        for ((_, reply), r) in batch.into_iter().zip(results) {
            let _ = reply.send(r);
        }
    }
}

fn execution_str(e: Execution) -> &'static str {
    match e {
        Execution::Default => "default",
        Execution::Background => "background",
    }
}

/// A run row locked for a write, with its owner worker's lease state.
pub(crate) struct Locked {
    pub(crate) run: RunRecord,
    /// `(epoch, retired)` of the owner worker's current registration.
    pub(crate) owner_lease: Option<(u64, bool)>,
    /// A landed append with the asked append id: `(first_seq, count)`.
    pub(crate) landed: Option<(u64, u64)>,
}

/// Starts, run row locks and the append protocol (`JournalStore::create_run` delegates here;
/// appends go through [`submit`] and the writers).
impl Db {
    /// `create_run`; with `lease` (eager start) the new run is claimed under it in the same
    /// statement when the lease is valid at `now`.
    pub(crate) async fn create_run(
        &self,
        new: NewRun,
        lease: Option<&Lease>,
        now: Timestamp,
    ) -> Result<CreatedRun, StoreError> {
        new.validate()?;
        let key = new.key();
        let started = new.started_event();
        let body = encode_batch(std::slice::from_ref(&started))?;
        let mut tx = self.begin().await?;
        // Contract clause 10: the upsert locks the session's row until this commit, so an end
        // (which updates the row) either committed before — `ended_at` is set and no run is
        // inserted — or waits, then lists this run as live.
        let inserted: Option<(i64, bool)> = sqlx::query_as(self.sql(
            "WITH sess AS ( \
               INSERT INTO {s}.session_records (session_id) VALUES ($6) \
               ON CONFLICT (session_id) DO UPDATE SET session_id = EXCLUDED.session_id \
               RETURNING ended_at) \
             INSERT INTO {s}.runs (run_id, idempotency_key, workflow_id, deployment_id, tool, \
               session_id, call_id, execution, status, next_seq, processed_seq, pending_at, \
               created_at, updated_at, owner_worker, owner_epoch, activations) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, 'running', 1, 0, $9, $9, $9, \
               w.worker_id, w.epoch, CASE WHEN w.worker_id IS NULL THEN 0 ELSE 1 END \
             FROM (SELECT 1) one LEFT JOIN {s}.workers w ON w.worker_id = $10 \
               AND w.epoch = $11 AND NOT w.retired AND w.expires_at > $9 \
             WHERE NOT EXISTS (SELECT 1 FROM sess WHERE ended_at IS NOT NULL) \
             ON CONFLICT DO NOTHING RETURNING ord, owner_worker IS NOT NULL",
        ))
        .bind(new.run_id.as_str())
        .bind(&key)
        .bind(new.workflow_id.as_str())
        .bind(new.deployment_id.as_str())
        .bind(&new.tool)
        .bind(new.session_id.as_str())
        .bind(new.call_id.as_str())
        .bind(execution_str(new.execution))
        .bind(now.0)
        .bind(lease.map(|l| l.worker.as_str()))
        .bind(lease.map(|l| i64_of(l.epoch, "epoch")).transpose()?)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        if let Some((_, claimed)) = inserted {
            sqlx::query(self.sql(
                "INSERT INTO {s}.events (run_id, first_seq, count, at, version, body) \
                 VALUES ($1, 0, 1, $2, $3, $4)",
            ))
            .bind(new.run_id.as_str())
            .bind(now.0)
            .bind(FORMAT_VERSION as i16)
            .bind(&body)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
            let mut run = new.record(now);
            match lease.filter(|_| claimed) {
                Some(l) => {
                    run.owner = Some((l.worker.clone(), l.epoch));
                    run.activations = 1;
                }
                None => self.notify(&mut tx, &new.deployment_id).await?,
            }
            tx.commit().await.map_err(map_err)?;
            return Ok(CreatedRun { run, created: true });
        }
        tx.rollback().await.map_err(map_err)?;
        // Lost to an existing row: the key's run (re-read after the winner committed), or the
        // run id under another key.
        let row = sqlx::query(self.sql(&format!(
            "SELECT {RUN_COLS} FROM {{s}}.runs r WHERE r.idempotency_key = $1"
        )))
        .bind(&key)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        if let Some(row) = row {
            let run = run_from_row(&row)?;
            let first = self.read(&run.run_id, 0, 1).await?;
            let matches = first.first().is_some_and(|e| new.matches(&e.event));
            if !matches {
                return Err(StoreError::IdempotencyMismatch {
                    key,
                    existing: run.run_id,
                });
            }
            return Ok(CreatedRun {
                run,
                created: false,
            });
        }
        if self.session_ended(&new.session_id).await? {
            return Err(StoreError::SessionEnded {
                session: new.session_id,
            });
        }
        Err(StoreError::AlreadyExists {
            what: "run",
            id: new.run_id.to_string(),
            hint: "run ids are unique; use a fresh id",
        })
    }

    /// Locks the run row (`FOR UPDATE`); with `append_id`, also finds a landed append.
    pub(crate) async fn lock_run(
        &self,
        conn: &mut PgConnection,
        run: &RunId,
        append_id: Option<&str>,
    ) -> Result<Option<Locked>, StoreError> {
        // Lock first, then read in a new statement: under read committed a statement that waited
        // for a row lock re-checks only the locked row, so joined rows (the owner's lease, a
        // landed append) must be read by a statement that starts after the lock is held.
        let found: Option<i32> =
            sqlx::query_scalar(self.sql("SELECT 1 FROM {s}.runs WHERE run_id = $1 FOR UPDATE"))
                .bind(run.as_str())
                .fetch_optional(&mut *conn)
                .await
                .map_err(map_err)?;
        if found.is_none() {
            return Ok(None);
        }
        let row = sqlx::query(self.sql(&format!(
            "SELECT {RUN_COLS}, w.epoch AS w_epoch, w.retired AS w_retired, \
               (SELECT e.first_seq FROM {{s}}.events e WHERE e.run_id = r.run_id AND e.append_id = $2) AS landed_first, \
               (SELECT e.count FROM {{s}}.events e WHERE e.run_id = r.run_id AND e.append_id = $2) AS landed_count \
             FROM {{s}}.runs r LEFT JOIN {{s}}.workers w ON w.worker_id = r.owner_worker \
             WHERE r.run_id = $1"
        )))
        .bind(run.as_str())
        .bind(append_id)
        .fetch_optional(&mut *conn)
        .await
        .map_err(map_err)?;
        let Some(row) = row else { return Ok(None) };
        let w_epoch: Option<i64> = row.try_get("w_epoch").map_err(map_err)?;
        let w_retired: Option<bool> = row.try_get("w_retired").map_err(map_err)?;
        let lf: Option<i64> = row.try_get("landed_first").map_err(map_err)?;
        let lc: Option<i32> = row.try_get("landed_count").map_err(map_err)?;
        Ok(Some(Locked {
            run: run_from_row(&row)?,
            owner_lease: w_epoch.map(|e| (e as u64, w_retired.unwrap_or(true))),
            landed: lf.zip(lc).map(|(f, c)| (f as u64, c as u64)),
        }))
    }

    /// Writes `events` at the run's next seq with their [`Effects`], as `MemoryStore::write`.
    /// Session-log rows notify the session's watchers. `append_id` marks a worker append (sets
    /// `processed_seq`, resets `activations`, wakes no worker); otherwise a delivery, which
    /// notifies the run's watchers, and idle workers when the run was idle. The caller locked
    /// the run and checked preconditions; the caller's transaction (or savepoint) is rolled back
    /// on error.
    pub(crate) async fn write(
        &self,
        conn: &mut PgConnection,
        run: &RunRecord,
        events: Vec<Event>,
        now: Timestamp,
        append_id: Option<&str>,
    ) -> Result<(u64, u64), StoreError> {
        let run_id = run.run_id.as_str();
        let fx = Effects::of(run.execution, &events);
        if !fx.hooks_created.is_empty() {
            for (i, (token, _, _)) in fx.hooks_created.iter().enumerate() {
                if fx.hooks_created[..i].iter().any(|(t, _, _)| t == token) {
                    return Err(token_taken(token));
                }
            }
            let tokens: Vec<&str> = fx.hooks_created.iter().map(|h| h.0.as_str()).collect();
            let cmds: Vec<i64> = fx.hooks_created.iter().map(|h| h.1 as i64).collect();
            let webhooks: Vec<bool> = fx.hooks_created.iter().map(|h| h.2).collect();
            let inserted: Vec<String> = sqlx::query_scalar(self.sql(
                "INSERT INTO {s}.hooks (token, run_id, cmd, webhook) \
                 SELECT t, $2, c, w FROM unnest($1::text[], $3::bigint[], $4::bool[]) AS u(t, c, w) \
                 ON CONFLICT (token) DO NOTHING RETURNING token",
            ))
            .bind(&tokens)
            .bind(run_id)
            .bind(&cmds)
            .bind(&webhooks)
            .fetch_all(&mut *conn)
            .await
            .map_err(map_err)?;
            if let Some(t) = tokens.iter().find(|t| !inserted.iter().any(|i| i == *t)) {
                return Err(token_taken(t));
            }
        }
        let first = run.next_seq;
        let count = events.len() as u64;
        let next = first + count;
        let body = encode_batch(&events)?;
        let ended = fx.ends_run();
        let worker = append_id.is_some();
        let sets: BTreeMap<u64, Timestamp> = fx.timers_set.iter().copied().collect();
        // Clears fold into the journal statement when no timer is set (sets go first, as in
        // MemoryStore, so with sets the clears run after them).
        let fold_clears = sets.is_empty() && !ended;
        let early_clears: Vec<i64> = if fold_clears {
            fx.timers_cleared.iter().map(|c| *c as i64).collect()
        } else {
            Vec::new()
        };
        sqlx::query(self.sql(
            "WITH ins AS (INSERT INTO {s}.events (run_id, first_seq, count, at, version, body, append_id) \
                          VALUES ($1, $2, $3, $4, $5, $6, $7)), \
                  del AS (DELETE FROM {s}.timers WHERE run_id = $1 AND cmd = ANY($13)) \
             UPDATE {s}.runs SET next_seq = $8, updated_at = $4, \
                 status = coalesce($9, status), \
                 cancel_requested = cancel_requested OR $10, \
                 owner_worker = CASE WHEN $11 THEN NULL ELSE owner_worker END, \
                 owner_epoch = CASE WHEN $11 THEN NULL ELSE owner_epoch END, \
                 processed_seq = CASE WHEN $12 THEN $8 ELSE processed_seq END, \
                 activations = CASE WHEN $12 THEN 0 ELSE activations END, \
                 pending_at = CASE WHEN $12 THEN NULL WHEN processed_seq < $2 THEN pending_at ELSE $4 END \
             WHERE run_id = $1",
        ))
        .bind(run_id)
        .bind(i64_of(first, "seq")?)
        .bind(count as i32)
        .bind(now.0)
        .bind(FORMAT_VERSION as i16)
        .bind(&body)
        .bind(append_id)
        .bind(i64_of(next, "seq")?)
        .bind(fx.status.map(RunStatus::as_str))
        .bind(fx.cancel_requested)
        .bind(ended)
        .bind(worker)
        .bind(&early_clears)
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
        if ended {
            sqlx::query(self.sql("DELETE FROM {s}.timers WHERE run_id = $1; "))
                .bind(run_id)
                .execute(&mut *conn)
                .await
                .map_err(map_err)?;
        } else {
            if !sets.is_empty() {
                let cmds: Vec<i64> = sets.keys().map(|c| *c as i64).collect();
                let dues: Vec<i64> = sets.values().map(|d| d.0).collect();
                sqlx::query(self.sql(
                    "INSERT INTO {s}.timers (run_id, cmd, due) \
                     SELECT $1, c, d FROM unnest($2::bigint[], $3::bigint[]) AS u(c, d) \
                     ON CONFLICT (run_id, cmd) DO UPDATE SET due = excluded.due",
                ))
                .bind(run_id)
                .bind(&cmds)
                .bind(&dues)
                .execute(&mut *conn)
                .await
                .map_err(map_err)?;
            }
            if !fold_clears && !fx.timers_cleared.is_empty() {
                let cmds: Vec<i64> = fx.timers_cleared.iter().map(|c| *c as i64).collect();
                sqlx::query(self.sql("DELETE FROM {s}.timers WHERE run_id = $1 AND cmd = ANY($2)"))
                    .bind(run_id)
                    .bind(&cmds)
                    .execute(&mut *conn)
                    .await
                    .map_err(map_err)?;
            }
        }
        for (request_id, cmd, request) in &fx.requests_opened {
            let body = serde_json::to_vec(request).map_err(|e| {
                StoreError::InvalidInput(format!("request does not serialize: {e}"))
            })?;
            sqlx::query(self.sql(
                "INSERT INTO {s}.requests (request_id, run_id, session_id, cmd, request, requested_at, state) \
                 VALUES ($1, $2, $3, $4, $5, $6, 'pending') \
                 ON CONFLICT (request_id) DO UPDATE SET run_id = excluded.run_id, \
                   session_id = excluded.session_id, cmd = excluded.cmd, request = excluded.request, \
                   requested_at = excluded.requested_at, state = 'pending', response = NULL, answer_seq = NULL",
            ))
            .bind(request_id.as_str())
            .bind(run_id)
            .bind(run.session_id.as_str())
            .bind(*cmd as i64)
            .bind(&body)
            .bind(now.0)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        }
        if !fx.requests_closed.is_empty() {
            let ids: Vec<&str> = fx.requests_closed.iter().map(|r| r.as_str()).collect();
            sqlx::query(self.sql(
                "UPDATE {s}.requests SET state = 'withdrawn' WHERE request_id = ANY($1) AND state = 'pending'",
            ))
            .bind(&ids)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        }
        if ended {
            sqlx::query(self.sql(
                "UPDATE {s}.requests SET state = 'withdrawn' WHERE run_id = $1 AND state = 'pending'",
            ))
            .bind(run_id)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
            sqlx::query(self.sql("DELETE FROM {s}.hooks WHERE run_id = $1"))
                .bind(run_id)
                .execute(&mut *conn)
                .await
                .map_err(map_err)?;
        }
        if !fx.session_events.is_empty() {
            let n = fx.session_events.len() as i64;
            let end: i64 = sqlx::query_scalar(self.sql(
                "INSERT INTO {s}.session_heads (session_id, next_seq) VALUES ($1, $2) \
                 ON CONFLICT (session_id) DO UPDATE SET next_seq = {s}.session_heads.next_seq + $2 \
                 RETURNING next_seq",
            ))
            .bind(run.session_id.as_str())
            .bind(n)
            .fetch_one(&mut *conn)
            .await
            .map_err(map_err)?;
            let seqs: Vec<i64> = (end - n..end).collect();
            let bodies = fx
                .session_events
                .iter()
                .map(serde_json::to_vec)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    StoreError::InvalidInput(format!("session event does not serialize: {e}"))
                })?;
            // The session's watchers are notified in the same statement (at commit).
            sqlx::query(self.sql(
                "WITH ins AS (INSERT INTO {s}.session_log (session_id, seq, at, run_id, call_id, body) \
                   SELECT $1, q, $2, $3, $4, b FROM unnest($5::bigint[], $6::bytea[]) AS u(q, b)) \
                 SELECT pg_notify($7, $8)",
            ))
            .bind(run.session_id.as_str())
            .bind(now.0)
            .bind(run_id)
            .bind(run.call_id.as_str())
            .bind(&seqs)
            .bind(&bodies)
            .bind(&self.channel)
            .bind(key_payload(&WatchKey::Session(run.session_id.clone())))
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        }
        if !worker {
            // A delivery: wake the run's watchers (the worker holding it), and idle workers if
            // the run was idle.
            let mut payloads = vec![key_payload(&WatchKey::Run(run.run_id.clone()))];
            let status = fx.status.unwrap_or(run.status);
            if status == RunStatus::Running && run.processed_seq >= first {
                payloads.push(deployment_payload(&run.deployment_id));
            }
            self.notify_all(conn, &payloads).await?;
        }
        Ok((first, next))
    }

    /// One worker append, inside the caller's transaction or savepoint.
    async fn apply_append(
        &self,
        conn: &mut PgConnection,
        a: &Append,
    ) -> Result<Appended, StoreError> {
        let locked = self
            .lock_run(conn, &a.run, Some(a.append_id.as_str()))
            .await?;
        match check_append(a, locked.as_ref())? {
            Some(dup) => Ok(dup),
            None => {
                let run = &locked.expect("checked").run;
                let (first_seq, next_seq) = self
                    .write(
                        conn,
                        run,
                        a.events.clone(),
                        a.now,
                        Some(a.append_id.as_str()),
                    )
                    .await?;
                Ok(Appended {
                    first_seq,
                    next_seq,
                    duplicate: false,
                })
            }
        }
    }

    /// Locks the rows of several distinct runs in one statement (in run id order, so writers
    /// never deadlock on each other) and finds their landed append ids.
    async fn lock_runs(
        &self,
        conn: &mut PgConnection,
        batch: &[Job],
    ) -> Result<std::collections::HashMap<String, Locked>, StoreError> {
        let runs: Vec<&str> = batch.iter().map(|(a, _)| a.run.as_str()).collect();
        let ids: Vec<&str> = batch.iter().map(|(a, _)| a.append_id.as_str()).collect();
        // Lock in run id order, then read with a fresh snapshot (see `lock_run`).
        sqlx::query(
            self.sql("SELECT 1 FROM {s}.runs WHERE run_id = ANY($1) ORDER BY run_id FOR UPDATE"),
        )
        .bind(&runs)
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
        let rows = sqlx::query(self.sql(&format!(
            "SELECT {RUN_COLS}, w.epoch AS w_epoch, w.retired AS w_retired, \
               e.first_seq AS landed_first, e.count AS landed_count \
             FROM {{s}}.runs r \
             JOIN unnest($1::text[], $2::text[]) AS q(run_id, append_id) ON q.run_id = r.run_id \
             LEFT JOIN {{s}}.workers w ON w.worker_id = r.owner_worker \
             LEFT JOIN {{s}}.events e ON e.run_id = r.run_id AND e.append_id = q.append_id \
             ORDER BY r.run_id"
        )))
        .bind(&runs)
        .bind(&ids)
        .fetch_all(&mut *conn)
        .await
        .map_err(map_err)?;
        let mut out = std::collections::HashMap::new();
        for row in rows {
            let w_epoch: Option<i64> = row.try_get("w_epoch").map_err(map_err)?;
            let w_retired: Option<bool> = row.try_get("w_retired").map_err(map_err)?;
            let lf: Option<i64> = row.try_get("landed_first").map_err(map_err)?;
            let lc: Option<i32> = row.try_get("landed_count").map_err(map_err)?;
            let run = run_from_row(&row)?;
            out.insert(
                run.run_id.as_str().to_owned(),
                Locked {
                    run,
                    owner_lease: w_epoch.map(|e| (e as u64, w_retired.unwrap_or(true))),
                    landed: lf.zip(lc).map(|(f, c)| (f as u64, c as u64)),
                },
            );
        }
        Ok(out)
    }

    /// The fast group commit: one lock statement for the whole batch (distinct runs), checks in
    /// memory, one write per passing append, no savepoints. A check failure modifies nothing,
    /// so it needs no savepoint. `None` when a statement failed after writing began: the caller
    /// then redoes the batch with a savepoint per append.
    async fn fast_batch(&self, batch: &[Job]) -> Option<Vec<Result<Appended, StoreError>>> {
        let mut tx = self.pool.begin().await.ok()?;
        let locked = self.lock_runs(&mut tx, batch).await.ok()?;
        let mut results = Vec::with_capacity(batch.len());
        for (a, _) in batch {
            let l = locked.get(a.run.as_str());
            let r = match check_append(a, l) {
                Err(e) => Err(e),
                Ok(Some(dup)) => Ok(dup),
                Ok(None) => {
                    let run = &l.expect("checked").run;
                    let (first_seq, next_seq) = self
                        .write(
                            &mut tx,
                            run,
                            a.events.clone(),
                            a.now,
                            Some(a.append_id.as_str()),
                        )
                        .await
                        .ok()?;
                    Ok(Appended {
                        first_seq,
                        next_seq,
                        duplicate: false,
                    })
                }
            };
            results.push(r);
        }
        Some(match tx.commit().await {
            Ok(()) => results,
            Err(e) => {
                let msg = format!(
                    "the group commit failed ({}); the append may or may not have landed: retry it with the same append id",
                    map_err(e)
                );
                results
                    .into_iter()
                    .map(|r| r.and_then(|_| Err(unavailable(msg.clone()))))
                    .collect()
            }
        })
    }

    /// Applies a batch of appends in one transaction, a savepoint each when there are several.
    async fn commit_batch(&self, batch: &[Job]) -> Vec<Result<Appended, StoreError>> {
        let lost = |e: StoreError, n: usize| -> Vec<Result<Appended, StoreError>> {
            let msg = e.to_string();
            (0..n).map(|_| Err(unavailable(msg.clone()))).collect()
        };
        let distinct = {
            let mut runs: Vec<&str> = batch.iter().map(|(a, _)| a.run.as_str()).collect();
            runs.dedup();
            runs.len() == batch.len()
        };
        if batch.len() > 1 && distinct {
            if let Some(results) = self.fast_batch(batch).await {
                return results;
            }
        }
        let mut tx = match self.pool.begin().await {
            Ok(tx) => tx,
            Err(e) => return lost(map_err(e), batch.len()),
        };

        let mut results = Vec::with_capacity(batch.len());
        if batch.len() == 1 {
            let r = self.apply_append(&mut tx, &batch[0].0).await;
            if r.is_err() {
                let _ = tx.rollback().await;
                return vec![r];
            }
            results.push(r);
        } else {
            for (a, _) in batch {
                if let Err(e) = sqlx::query("SAVEPOINT eve_op").execute(&mut *tx).await {
                    return lost(map_err(e), batch.len());
                }
                let r = self.apply_append(&mut tx, a).await;
                let end = if r.is_ok() {
                    "RELEASE SAVEPOINT eve_op"
                } else {
                    "ROLLBACK TO SAVEPOINT eve_op"
                };
                if let Err(e) = sqlx::query(end).execute(&mut *tx).await {
                    return lost(map_err(e), batch.len());
                }
                results.push(r);
            }
        }
        match tx.commit().await {
            Ok(()) => results,
            Err(e) => {
                let msg = format!(
                    "the group commit failed ({}); the append may or may not have landed: retry it with the same append id",
                    map_err(e)
                );
                results
                    .into_iter()
                    .map(|r| r.and_then(|_| Err(unavailable(msg.clone()))))
                    .collect()
            }
        }
    }
}

/// The checks of an append against its locked run, in MemoryStore's order; modifies nothing.
/// `Some` for a retry of a landed append.
fn check_append(a: &Append, locked: Option<&Locked>) -> Result<Option<Appended>, StoreError> {
    let locked = locked.ok_or_else(|| StoreError::not_found("run", &a.run))?;
    if let Some((first, count)) = locked.landed {
        return Ok(Some(Appended {
            first_seq: first,
            next_seq: first + count,
            duplicate: true,
        }));
    }
    let run = &locked.run;
    if run.status.is_terminal() {
        return Err(StoreError::RunEnded { run: a.run.clone() });
    }
    if run.owner.as_ref() != Some(&(a.lease.worker.clone(), a.lease.epoch))
        || locked.owner_lease != Some((a.lease.epoch, false))
    {
        return Err(fenced(&a.lease, a.run.as_str()));
    }
    if run.next_seq != a.expected_seq {
        return Err(StoreError::Conflict {
            run: a.run.clone(),
            expected: a.expected_seq,
            actual: run.next_seq,
        });
    }
    Ok(None)
}

fn token_taken(token: &str) -> StoreError {
    StoreError::AlreadyExists {
        what: "hook token",
        id: token.to_owned(),
        hint: "a live hook already has this token; choose another token or wait for its run to end",
    }
}

/// Queues a worker append for the group-commit writers and waits for its outcome.
pub(crate) async fn submit(jobs: &mpsc::Sender<Job>, a: Append) -> Result<Appended, StoreError> {
    check_limits(&a.events)?;
    if a.events
        .iter()
        .any(|e| matches!(e, Event::RunStarted { .. }))
    {
        return Err(StoreError::InvalidInput(
            "RunStarted is written by create_run, never appended".into(),
        ));
    }
    i64_of(a.expected_seq, "expected seq")?;
    let (tx, rx) = oneshot::channel();
    jobs.send((a, tx))
        .await
        .map_err(|_| unavailable("the group-commit writer stopped".into()))?;
    rx.await.map_err(|_| {
        unavailable(
            "the group-commit writer stopped before answering; retry with the same append id"
                .into(),
        )
    })?
}
