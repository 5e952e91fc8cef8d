//! Starts and the append commit protocol: the group-commit writers, run row locks, the
//! [`Effects`] of events encoded for the `eve_write` and `eve_append` functions (migration 5) and
//! the answers of appends (see the crate docs, "Commit protocol").

use crate::error::{bad_row, fenced, i64_of, map_err, unavailable};
use crate::reads::{run_from_row, RUN_COLS};
use crate::wake::deployment_payload;
use crate::Db;
use eve_core::codec::{encode_batch, FORMAT_VERSION};
use eve_core::{
    check_limits, Append, Appended, CreatedRun, Effects, Event, Execution, Lease, NewRun,
    RequestId, RunId, RunRecord, RunStatus, SessionEvent, StoreError, Timestamp,
};
use sqlx::PgConnection;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, Mutex};

pub(crate) type Job = (Append, oneshot::Sender<Result<Appended, StoreError>>);

/// The group-commit writer: folds queued appends into one statement (see `commit_batch`).
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
        // One statement, so one transaction without BEGIN/COMMIT round trips. Contract clause
        // 10: the upsert locks the session's row until this commit, so an end (which updates
        // the row) either committed before — `ended_at` is set and no run is inserted — or
        // waits, then lists this run as live. A run left unclaimed wakes idle workers.
        let inserted: Option<(i64, bool)> = sqlx::query_as(self.sql(
            "WITH sess AS ( \
               INSERT INTO {s}.session_records (session_id) VALUES ($6) \
               ON CONFLICT (session_id) DO UPDATE SET session_id = EXCLUDED.session_id \
               RETURNING ended_at), \
             run AS ( \
               INSERT INTO {s}.runs (run_id, idempotency_key, workflow_id, deployment_id, tool, \
                 session_id, call_id, execution, status, next_seq, processed_seq, pending_at, \
                 created_at, updated_at, owner_worker, owner_epoch, activations) \
               SELECT $1, $2, $3, $4, $5, $6, $7, $8, 'running', 1, 0, $9, $9, $9, \
                 w.worker_id, w.epoch, CASE WHEN w.worker_id IS NULL THEN 0 ELSE 1 END \
               FROM (SELECT 1) one LEFT JOIN {s}.workers w ON w.worker_id = $10 \
                 AND w.epoch = $11 AND NOT w.retired AND w.expires_at > $9 \
               WHERE NOT EXISTS (SELECT 1 FROM sess WHERE ended_at IS NOT NULL) \
               ON CONFLICT DO NOTHING RETURNING ord, owner_worker IS NOT NULL AS claimed), \
             ev AS ( \
               INSERT INTO {s}.events (run_id, first_seq, count, at, version, body) \
               SELECT $1, 0, 1, $9, $12, $13 FROM run), \
             woken AS (SELECT pg_notify($14, $15) FROM run WHERE NOT claimed) \
             SELECT ord, claimed FROM run WHERE (SELECT count(*) FROM woken) >= 0",
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
        .bind(FORMAT_VERSION as i16)
        .bind(&body)
        .bind(&self.channel)
        .bind(deployment_payload(&new.deployment_id))
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        if let Some((_, claimed)) = inserted {
            let mut run = new.record(now);
            if let Some(l) = lease.filter(|_| claimed) {
                run.owner = Some((l.worker.clone(), l.epoch));
                run.activations = 1;
            }
            return Ok(CreatedRun { run, created: true });
        }
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

    /// Locks the run row (`FOR UPDATE`) and reads it.
    pub(crate) async fn lock_run(
        &self,
        conn: &mut PgConnection,
        run: &RunId,
    ) -> Result<Option<RunRecord>, StoreError> {
        // Lock first, then read in a new statement: under read committed a statement that waited
        // for a row lock re-checks only the locked row, so the read must start after the lock
        // is held to see the rows written by the transaction it waited for.
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
            "SELECT {RUN_COLS} FROM {{s}}.runs r WHERE r.run_id = $1"
        )))
        .bind(run.as_str())
        .fetch_optional(&mut *conn)
        .await
        .map_err(map_err)?;
        row.as_ref().map(run_from_row).transpose()
    }

    /// Writes a delivery's `events` at the run's next seq with their [`Effects`] and wake-ups
    /// (the `eve_write` function of migration 5, one statement). The caller locked the run and
    /// checked preconditions; its transaction is rolled back on error.
    pub(crate) async fn write(
        &self,
        conn: &mut PgConnection,
        run: &RunRecord,
        events: Vec<Event>,
        now: Timestamp,
    ) -> Result<(u64, u64), StoreError> {
        let first = run.next_seq;
        let next = first + events.len() as u64;
        let fx = effects_json(&events)?;
        // The caller checked the run: a repeated token is refused at once.
        if let Some(token) = fx.repeated_token {
            return Err(token_taken(&token));
        }
        let fx = fx.json;
        let taken: Option<String> = sqlx::query_scalar(
            self.sql("SELECT {s}.eve_write($1, $2, $3, $4, $5, $6, $7, $8, NULL, $9::jsonb, $10)"),
        )
        .bind(run.run_id.as_str())
        .bind(run.session_id.as_str())
        .bind(run.call_id.as_str())
        .bind(run.execution == Execution::Background)
        .bind(i64_of(first, "seq")?)
        .bind(now.0)
        .bind(FORMAT_VERSION as i16)
        .bind(encode_batch(&events)?)
        .bind(fx)
        .bind(&self.channel)
        .fetch_one(&mut *conn)
        .await
        .map_err(map_err)?;
        match taken {
            Some(token) => Err(token_taken(&token)),
            None => Ok((first, next)),
        }
    }

    /// Applies a batch of worker appends (sorted by run id, so writers lock rows in one order
    /// and never deadlock on each other) in one statement, hence one transaction: one call of
    /// `eve_append_batch`, whose failed checks write nothing. If the statement fails (a
    /// deadlock with a delivery, a lost connection), each append is retried alone, so one
    /// append's failure never fails another; an append that did land is then answered as a
    /// duplicate by its append id.
    async fn commit_batch(&self, batch: &[Job]) -> Vec<Result<Appended, StoreError>> {
        let appends: Vec<&Append> = batch.iter().map(|(a, _)| a).collect();
        match self.append_all(&appends).await {
            Ok(results) => results,
            Err(e) if batch.len() == 1 => vec![Err(e)],
            Err(_) => {
                let mut results = Vec::with_capacity(batch.len());
                for a in appends {
                    results.push(match self.append_all(&[a]).await {
                        Ok(mut r) => r
                            .pop()
                            .unwrap_or_else(|| Err(bad_row("append outcome", "missing row"))),
                        Err(e) => Err(e),
                    });
                }
                results
            }
        }
    }

    /// One statement calling `eve_append_batch` for the appends in order; the error is the
    /// statement's (every append of it rolled back, or its outcome unknown if the connection
    /// was lost while it committed).
    async fn append_all(
        &self,
        appends: &[&Append],
    ) -> Result<Vec<Result<Appended, StoreError>>, StoreError> {
        let n = appends.len();
        let mut runs = Vec::with_capacity(n);
        let mut ids = Vec::with_capacity(n);
        let mut expected = Vec::with_capacity(n);
        let mut workers = Vec::with_capacity(n);
        let mut epochs = Vec::with_capacity(n);
        let mut nows = Vec::with_capacity(n);
        let mut bodies = Vec::with_capacity(n);
        let mut fxs = Vec::with_capacity(n);
        let mut plain = Vec::with_capacity(n);
        let mut repeated = Vec::with_capacity(n);
        // An append refused before any SQL (a command id or a value too large) answers
        // on its own.
        let mut refused: Vec<Option<StoreError>> = Vec::with_capacity(n);
        for a in appends {
            let prepared = (|| {
                Ok::<_, StoreError>((
                    effects_json(&a.events)?,
                    encode_batch(&a.events)?,
                    i64_of(a.expected_seq, "expected seq")?,
                    i64_of(a.lease.epoch, "epoch")?,
                ))
            })();
            match prepared {
                Ok((fx, body, expected_seq, epoch)) => {
                    refused.push(None);
                    runs.push(a.run.as_str());
                    ids.push(a.append_id.as_str());
                    expected.push(expected_seq);
                    workers.push(a.lease.worker.as_str());
                    epochs.push(epoch);
                    nows.push(a.now.0);
                    bodies.push(body);
                    fxs.push(fx.json);
                    plain.push(fx.plain);
                    repeated.push(fx.repeated_token);
                }
                Err(e) => refused.push(Some(e)),
            }
        }
        // Set-based writes need one append per run: a run's later appends depend on its
        // earlier ones, so every append of a run that repeats goes through eve_append in order.
        for i in 0..runs.len() {
            if runs.iter().filter(|r| **r == runs[i]).nth(1).is_some() {
                plain[i] = false;
            }
        }
        let rows: Vec<OutcomeRow> = if runs.is_empty() {
            Vec::new()
        } else {
            sqlx::query_as(self.sql(
                "SELECT outcome, o_first, o_next, o_detail FROM {s}.eve_append_batch( \
                 $1::text[], $2::text[], $3::bigint[], $4::text[], $5::bigint[], $6::bigint[], \
                 $7::smallint, $8::bytea[], $9::text[]::jsonb[], $10::boolean[], $11, \
                 $12::text[])",
            ))
            .bind(&runs)
            .bind(&ids)
            .bind(&expected)
            .bind(&workers)
            .bind(&epochs)
            .bind(&nows)
            .bind(FORMAT_VERSION as i16)
            .bind(&bodies)
            .bind(&fxs)
            .bind(&plain)
            .bind(&self.channel)
            .bind(&repeated)
            .fetch_all(&self.pool)
            .await
            .map_err(map_err)?
        };
        let mut rows = rows.into_iter();
        let results = appends
            .iter()
            .zip(refused)
            .map(|(a, refused)| match refused {
                Some(e) => Err(e),
                None => match rows.next() {
                    Some((outcome, first, next, detail)) => {
                        append_outcome(a, &outcome, first, next, detail)
                    }
                    None => Err(bad_row("append outcome", "missing row")),
                },
            })
            .collect();
        Ok(results)
    }
}

/// `eve_append`'s result: outcome, first seq, next seq, detail.
type OutcomeRow = (String, Option<i64>, Option<i64>, Option<String>);

/// The answer of an append from `eve_append`'s outcome row.
fn append_outcome(
    a: &Append,
    outcome: &str,
    first: Option<i64>,
    next: Option<i64>,
    detail: Option<String>,
) -> Result<Appended, StoreError> {
    let seqs = |duplicate| match (first, next) {
        (Some(f), Some(n)) => Ok(Appended {
            first_seq: f as u64,
            next_seq: n as u64,
            duplicate,
        }),
        _ => Err(bad_row("append outcome", format!("{outcome} without seqs"))),
    };
    match outcome {
        "ok" => seqs(false),
        "duplicate" => seqs(true),
        "not_found" => Err(StoreError::not_found("run", &a.run)),
        "ended" => Err(StoreError::RunEnded { run: a.run.clone() }),
        "fenced" => Err(fenced(&a.lease, a.run.as_str())),
        "conflict" => Err(StoreError::Conflict {
            run: a.run.clone(),
            expected: a.expected_seq,
            actual: next.unwrap_or_default() as u64,
        }),
        "token_taken" => Err(token_taken(detail.as_deref().unwrap_or_default())),
        other => Err(bad_row("append outcome", other)),
    }
}

/// The effects of `events` as `eve_write`'s `p_fx` argument: the counts and flags, hooks,
/// timers (one set per cmd, the last), requests and session events (with `session_background`
/// only where a background run's differ); and whether they are plain (no hooks, requests,
/// session events or attributes, and the run does not end), which `eve_append_batch` applies
/// set-based.
///
/// # Errors
/// `InvalidInput` for a command id above `i64::MAX`. (A hook token created twice is not an
/// error here: see [`EncodedEffects::repeated_token`].)
pub(crate) fn effects_json(events: &[Event]) -> Result<EncodedEffects, StoreError> {
    let mut fx = Effects::of(Execution::Default, events);
    // A token created twice: the SQL would insert it once and see no conflict, so the hooks
    // from the repeat on are left out and the caller refuses the append once the run's own
    // checks pass (MemoryStore's order).
    let repeat = (0..fx.hooks_created.len()).find(|&i| {
        let token = &fx.hooks_created[i].0;
        fx.hooks_created[..i].iter().any(|(t, _, _)| t == token)
    });
    let repeated_token = repeat.map(|i| {
        let token = fx.hooks_created[i].0.clone();
        fx.hooks_created.truncate(i);
        token
    });
    // Commands are stored as BIGINT: refuse what would not fit before any SQL runs.
    let cmds = fx.hooks_created.iter().map(|h| h.1);
    let cmds = cmds.chain(fx.timers_set.iter().map(|t| t.0));
    let cmds = cmds.chain(fx.timers_cleared.iter().copied());
    for cmd in cmds.chain(fx.requests_opened.iter().map(|r| r.1)) {
        i64_of(cmd, "command id")?;
    }
    let to_text = |v: Result<String, serde_json::Error>, what: &str| {
        v.map_err(|e| StoreError::InvalidInput(format!("{what} does not serialize: {e}")))
    };
    let session = |events: &[SessionEvent]| -> Result<Vec<String>, StoreError> {
        events
            .iter()
            .map(|e| to_text(serde_json::to_string(e), "session event"))
            .collect()
    };
    let sets: BTreeMap<u64, Timestamp> = fx.timers_set.iter().copied().collect();
    let mut requests = Vec::with_capacity(fx.requests_opened.len());
    for (id, cmd, request) in &fx.requests_opened {
        let body = to_text(serde_json::to_string(request), "request")?;
        requests.push(serde_json::json!([id.as_str(), cmd, body]));
    }
    // The last change of each key: [key, index value] sets, [key, null] removes.
    let attributes: BTreeMap<&str, Option<String>> = fx
        .attributes
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_ref().map(eve_core::search::index_value)))
        .collect();
    let mut json = serde_json::json!({
        "count": events.len(),
        "ended": fx.ends_run(),
        "status": fx.status.map(RunStatus::as_str),
        "cancel": fx.cancel_requested,
        "hooks": fx.hooks_created,
        "timers_set": sets.iter().map(|(c, d)| [*c as i64, d.0]).collect::<Vec<_>>(),
        "timers_cleared": fx.timers_cleared,
        "requests_opened": requests,
        "requests_closed": fx.requests_closed.iter().map(RequestId::as_str).collect::<Vec<_>>(),
        "session": session(&fx.session_events)?,
    });
    if !attributes.is_empty() {
        json["attributes"] = attributes
            .iter()
            .map(|(k, v)| serde_json::json!([k, v]))
            .collect::<Vec<_>>()
            .into();
    }
    let background = Effects::of(Execution::Background, events).session_events;
    if background != fx.session_events {
        json["session_background"] = session(&background)?.into();
    }
    let plain = fx.hooks_created.is_empty()
        && fx.requests_opened.is_empty()
        && fx.requests_closed.is_empty()
        && fx.session_events.is_empty()
        && background.is_empty()
        && attributes.is_empty()
        && !fx.ends_run();
    Ok(EncodedEffects {
        json: json.to_string(),
        plain,
        repeated_token,
    })
}

/// [`effects_json`]'s answer.
pub(crate) struct EncodedEffects {
    /// The `p_fx` argument.
    pub(crate) json: String,
    /// Whether `eve_append_batch` may apply the append set-based.
    pub(crate) plain: bool,
    /// A hook token the append creates twice: the append must be refused with it
    /// (`AlreadyExists`) once the run's checks pass; `json` holds the hooks before the repeat.
    pub(crate) repeated_token: Option<String>,
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

#[cfg(test)]
mod tests {
    use crate::{PostgresOptions, PostgresStore};
    use eve_conformance::fixtures::{
        append, completed, hook, journal, must_append, new_run, sleep, started, step, unique,
    };
    use eve_core::{Append, Appended, JournalStore, RunId, StoreError, Timestamp};

    /// One batch, deterministically (`append_all` called directly), holding every outcome of
    /// the set-based path next to appends that go through `eve_append` one by one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_batch_mixes_set_based_and_single_appends() {
        let Some(url) = std::env::var("EVE_TEST_POSTGRES_URL")
            .ok()
            .filter(|u| !u.is_empty())
        else {
            println!("skipped: EVE_TEST_POSTGRES_URL is unset");
            return;
        };
        let schema = format!("eve_t_{}", uuid::Uuid::new_v4().simple());
        let options = PostgresOptions {
            schema: schema.clone(),
            ..PostgresOptions::default()
        };
        let store = PostgresStore::connect_with(&url, options)
            .await
            .expect("store");
        let t = Timestamp;
        let mut runs = Vec::new();
        for tag in [
            "ok", "dup", "conflict", "fenced", "ended", "twice", "hook", "set", "clear",
        ] {
            runs.push(started(&store, new_run(tag), t(0)).await);
        }
        let run = |i: usize| &runs[i].0.run_id;
        let lease = |i: usize| &runs[i].1;
        // Before the batch: an append that landed (resent in it), an ended run, a timer.
        let landed = append(run(1), 1, lease(1), vec![step(1, "1")], t(1));
        must_append(&store, landed.clone()).await;
        must_append(
            &store,
            append(run(4), 1, lease(4), vec![completed("0")], t(1)),
        )
        .await;
        must_append(
            &store,
            append(run(8), 1, lease(8), vec![sleep(1, t(40))], t(1)),
        )
        .await;
        let token = unique("token");
        let batch: Vec<Append> = vec![
            append(run(0), 1, lease(0), vec![step(1, "1")], t(2)),
            landed,
            append(run(2), 5, lease(2), vec![step(1, "1")], t(2)),
            append(run(3), 1, lease(0), vec![step(1, "1")], t(2)),
            append(run(4), 2, lease(4), vec![step(1, "1")], t(2)),
            append(run(5), 1, lease(5), vec![step(1, "1")], t(2)),
            append(run(5), 2, lease(5), vec![step(2, "2")], t(2)),
            append(run(6), 1, lease(6), vec![hook(1, &token)], t(2)),
            append(run(7), 1, lease(7), vec![sleep(2, t(50))], t(2)),
            append(
                &RunId::new(unique("missing")),
                1,
                lease(0),
                vec![step(1, "1")],
                t(2),
            ),
            append(run(8), 2, lease(8), vec![step(1, "1")], t(2)),
        ];
        let refs: Vec<&Append> = batch.iter().collect();
        let out = store.inner.db.append_all(&refs).await.expect("batch");
        let seqs = |r: &Result<Appended, StoreError>| match r {
            Ok(a) => Some((a.first_seq, a.next_seq, a.duplicate)),
            Err(_) => None,
        };
        assert_eq!(seqs(&out[0]), Some((1, 2, false)), "plain: {:?}", out[0]);
        assert_eq!(seqs(&out[1]), Some((1, 2, true)), "resent: {:?}", out[1]);
        assert!(
            matches!(
                out[2],
                Err(StoreError::Conflict {
                    expected: 5,
                    actual: 1,
                    ..
                })
            ),
            "{:?}",
            out[2]
        );
        assert!(
            matches!(out[3], Err(StoreError::Fenced { .. })),
            "{:?}",
            out[3]
        );
        assert!(
            matches!(out[4], Err(StoreError::RunEnded { .. })),
            "{:?}",
            out[4]
        );
        assert_eq!(seqs(&out[5]), Some((1, 2, false)), "{:?}", out[5]);
        assert_eq!(seqs(&out[6]), Some((2, 3, false)), "{:?}", out[6]);
        assert_eq!(seqs(&out[7]), Some((1, 2, false)), "hook: {:?}", out[7]);
        assert_eq!(seqs(&out[8]), Some((1, 2, false)), "timer: {:?}", out[8]);
        assert!(
            matches!(out[9], Err(StoreError::NotFound { .. })),
            "{:?}",
            out[9]
        );
        assert_eq!(seqs(&out[10]), Some((2, 3, false)), "{:?}", out[10]);
        // What landed: journals, run rows, timers.
        let lens = [2, 2, 1, 1, 2, 3, 2, 2, 3];
        for (i, want) in lens.into_iter().enumerate() {
            assert_eq!(
                journal(&store, run(i)).await.len(),
                want,
                "journal of run {i}"
            );
            let rec = store.get_run(run(i)).await.expect("run");
            assert_eq!(rec.next_seq, want as u64, "next seq of run {i}");
            if ![2, 3, 4].contains(&i) {
                assert_eq!(rec.processed_seq, want as u64, "processed seq of run {i}");
            }
        }
        let timers: Vec<(String, i64, i64)> =
            sqlx::query_as(store.inner.db.sql(
                "SELECT run_id, cmd, due FROM {s}.timers WHERE run_id = ANY($1) ORDER BY run_id",
            ))
            .bind([run(7).as_str(), run(8).as_str()])
            .fetch_all(&store.inner.db.pool)
            .await
            .expect("timers");
        assert_eq!(
            timers,
            vec![(run(7).to_string(), 2, 50)],
            "set, and cleared"
        );
        let held: Option<String> = sqlx::query_scalar(
            store
                .inner
                .db
                .sql("SELECT run_id FROM {s}.hooks WHERE token = $1"),
        )
        .bind(&token)
        .fetch_optional(&store.inner.db.pool)
        .await
        .expect("hooks");
        assert_eq!(held.as_deref(), Some(run(6).as_str()));
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA \"{schema}\" CASCADE"
        )))
        .execute(&store.inner.db.pool)
        .await
        .expect("drop schema");
    }
}
