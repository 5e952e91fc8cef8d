//! The writer task: one connection, group commit, one savepoint per op.
//!
//! Every write op of a handle is sent here. The task takes what is queued (up to a batch limit),
//! opens one `BEGIN IMMEDIATE` transaction, runs the ops in arrival order — each op reads what
//! it must check (inside the transaction, so another handle on the file cannot interleave), then
//! applies its writes as one multi-statement round trip wrapped in `SAVEPOINT op … RELEASE op`,
//! rolled back to the savepoint alone if a statement fails — commits, and only then answers
//! each op. A failed commit answers every op of the batch with that failure (none was applied).

use crate::error::{batch_failed, map_sqlx};
use crate::rows::RUN_COLS;
use crate::rows::{execution_str, opt_i64, run_cols, run_cols_r, run_record, text, u64_col};
use eve_core::codec::{decode_batch, encode_batch, FORMAT_VERSION};
use eve_core::store::cancel_events;
use eve_core::{
    check_limits, Append, AppendId, Appended, CancelOutcome, CreatedRun, Delivered, DeploymentId,
    Effects, Event, InputRequest, InputResponse, Lease, NewRun, Payload, RequestId, Resolution,
    RunId, RunRecord, RunStatus, StoreError, Timestamp, WorkerId,
};
use eve_core::{WatchHub, WatchKey};
use sqlx::sqlite::SqliteRow;
use sqlx::{AssertSqlSafe, Row, SqliteConnection};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Where an op's answer goes.
pub(crate) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// One write op, with where to send its answer.
#[derive(Debug)]
pub(crate) enum Op {
    CreateRun(Box<NewRun>, Option<Lease>, Timestamp, Reply<CreatedRun>),
    Append(Box<Append>, Reply<Appended>),
    Answer(RequestId, InputResponse, Timestamp, Reply<Delivered>),
    DeliverHook {
        token: String,
        payload: Payload,
        dedupe_key: Option<String>,
        now: Timestamp,
        reply: Reply<Delivered>,
    },
    Cancel(RunId, String, Timestamp, Reply<CancelOutcome>),
    Resolve(RunId, Resolution, Timestamp, Reply<u64>),
    Register(WorkerId, DeploymentId, Duration, Timestamp, Reply<Lease>),
    Heartbeat(Lease, Duration, Timestamp, Reply<Lease>),
    Claim(Lease, usize, Timestamp, Reply<Vec<RunRecord>>),
    Release(Lease, RunId, u64, Timestamp, Reply<()>),
    Retire(Lease, Reply<()>),
}

impl Op {
    /// Answers the op with `err` without running it.
    fn reject(self, err: StoreError) {
        match self {
            Op::CreateRun(_, _, _, r) => drop(r.send(Err(err))),
            Op::Append(_, r) => drop(r.send(Err(err))),
            Op::Answer(_, _, _, r) => drop(r.send(Err(err))),
            Op::DeliverHook { reply, .. } => drop(reply.send(Err(err))),
            Op::Cancel(_, _, _, r) => drop(r.send(Err(err))),
            Op::Resolve(_, _, _, r) => drop(r.send(Err(err))),
            Op::Register(_, _, _, _, r) => drop(r.send(Err(err))),
            Op::Heartbeat(_, _, _, r) => drop(r.send(Err(err))),
            Op::Claim(_, _, _, r) => drop(r.send(Err(err))),
            Op::Release(_, _, _, _, r) => drop(r.send(Err(err))),
            Op::Retire(_, r) => drop(r.send(Err(err))),
        }
    }
}

/// An op's outcome, held until the batch commits: called with the commit's error, if any.
type Answer = Box<dyn FnOnce(Option<&StoreError>) + Send>;

/// The held answer, and a copy of the op's error when it is a backend fault (`Unavailable`,
/// `Other`): SQLite may then have rolled back the whole transaction on its own (a full disk, an
/// I/O error), so the batch is abandoned rather than trusted.
fn answer<T: Send + 'static>(
    reply: Reply<T>,
    result: Result<T, StoreError>,
) -> (Answer, Option<StoreError>) {
    let fault = match &result {
        Err(e @ (StoreError::Unavailable { .. } | StoreError::Other { .. })) => Some(copy(e)),
        _ => None,
    };
    let answer: Answer = Box::new(move |commit_err| {
        let _ = reply.send(match commit_err {
            None => result,
            Some(e) => Err(batch_failed(e)),
        });
    });
    (answer, fault)
}

/// The same kind of backend fault with the same message.
fn copy(e: &StoreError) -> StoreError {
    match e {
        StoreError::Unavailable { backend, message } => StoreError::Unavailable {
            backend,
            message: message.clone(),
        },
        other => crate::error::other(other.to_string()),
    }
}

/// The writer loop; ends when every handle (sender) is dropped. Once a batch commits, wakes the
/// watchers its ops touched in `hub`.
pub(crate) async fn run(
    conn: SqliteConnection,
    rx: mpsc::Receiver<Op>,
    max_batch: usize,
    hub: WatchHub,
    commits: Arc<AtomicU64>,
) {
    BATCH_WAKES
        .scope(
            RefCell::new(Vec::new()),
            batches(conn, rx, max_batch, hub, commits),
        )
        .await;
}

async fn batches(
    mut conn: SqliteConnection,
    mut rx: mpsc::Receiver<Op>,
    max_batch: usize,
    hub: WatchHub,
    commits: Arc<AtomicU64>,
) {
    let mut ops = Vec::with_capacity(max_batch);
    while rx.recv_many(&mut ops, max_batch).await > 0 {
        if let Err(e) = sqlx::query("BEGIN IMMEDIATE").execute(&mut conn).await {
            let err = map_sqlx(e);
            for op in ops.drain(..) {
                op.reject(batch_failed(&err));
            }
            continue;
        }
        let mut answers = Vec::with_capacity(ops.len());
        let mut fault = None;
        // The appends' checks, read for the whole batch in one statement. An op's prefetched
        // row is used only while nothing earlier in the batch can have changed it: no earlier
        // append to its run, and no earlier op of another kind.
        let mut prefetched = prefetch_appends(&mut conn, &ops).await;
        let mut touched: HashSet<RunId> = HashSet::new();
        let mut queued = ops.drain(..).enumerate();
        for (i, op) in queued.by_ref() {
            let pre = match &op {
                Op::Append(a, _) => {
                    let fresh = touched.insert(a.run.clone());
                    prefetched.remove(&i).filter(|_| fresh)
                }
                _ => {
                    prefetched.clear();
                    None
                }
            };
            let (answer, f) = run_op(&mut conn, op, pre).await;
            answers.push(answer);
            if f.is_some() {
                fault = f;
                break;
            }
        }
        let rest: Vec<Op> = queued.map(|(_, op)| op).collect();
        let outcome = match fault {
            Some(err) => Err(err),
            None => sqlx::query("COMMIT")
                .execute(&mut conn)
                .await
                .map(|_| ())
                .map_err(map_sqlx),
        };
        let wakes = BATCH_WAKES.with(|w| std::mem::take(&mut *w.borrow_mut()));
        match outcome {
            Ok(()) => {
                commits.fetch_add(1, Ordering::SeqCst);
                answers.into_iter().for_each(|a| a(None));
                for key in &wakes {
                    hub.wake(key);
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "sqlite batch abandoned; rolling it back");
                // Fails harmlessly when SQLite already rolled back.
                if let Err(e) = sqlx::query("ROLLBACK").execute(&mut conn).await {
                    tracing::debug!(error = %e, "sqlite rollback of an abandoned batch");
                }
                answers.into_iter().for_each(|a| a(Some(&err)));
                rest.into_iter()
                    .for_each(|op| op.reject(batch_failed(&err)));
            }
        }
    }
    let _ = sqlx::Connection::close(conn).await;
}

/// Reads, in one statement, what each append of the batch checks (its run, a landed append
/// id, its worker's current epoch), keyed by the op's index. Best effort: on any error the ops
/// read their own rows.
async fn prefetch_appends(conn: &mut SqliteConnection, ops: &[Op]) -> HashMap<usize, SqliteRow> {
    let appends: Vec<(usize, &Append)> = ops
        .iter()
        .enumerate()
        .filter_map(|(i, op)| match op {
            Op::Append(a, _) => Some((i, &**a)),
            _ => None,
        })
        .collect();
    if appends.len() < 2 {
        return HashMap::new();
    }
    let sql = format!(
        concat!(
            "WITH q (i, run_id, append_id, worker) AS (VALUES {}) SELECT ",
            run_cols_r!(),
            ", (SELECT first_seq FROM events e WHERE e.run_id = q.run_id AND e.append_id = q.append_id), \
             (SELECT count FROM events e WHERE e.run_id = q.run_id AND e.append_id = q.append_id), \
             (SELECT epoch FROM workers w WHERE w.worker_id = q.worker AND w.retired = 0), \
             q.i FROM q JOIN runs r ON r.run_id = q.run_id"
        ),
        tuples(appends.len(), 4)
    );
    let mut q = sqlx::query(AssertSqlSafe(sql));
    for (i, a) in &appends {
        q = q
            .bind(*i as i64)
            .bind(a.run.as_str())
            .bind(a.append_id.as_str())
            .bind(a.lease.worker.as_str());
    }
    match q.fetch_all(&mut *conn).await {
        Ok(rows) => rows
            .into_iter()
            .filter_map(|row| {
                let i: i64 = row.try_get(RUN_COLS + 3).ok()?;
                Some((i as usize, row))
            })
            .collect(),
        Err(e) => {
            tracing::debug!(error = %e, "sqlite append prefetch failed; checking one by one");
            HashMap::new()
        }
    }
}

async fn run_op(
    conn: &mut SqliteConnection,
    op: Op,
    pre: Option<SqliteRow>,
) -> (Answer, Option<StoreError>) {
    match op {
        Op::CreateRun(new, lease, now, r) => answer(r, create_run(conn, *new, lease, now).await),
        Op::Append(a, r) => answer(r, append(conn, *a, pre).await),
        Op::Answer(req, resp, now, r) => answer(r, answer_request(conn, &req, resp, now).await),
        Op::DeliverHook {
            token,
            payload,
            dedupe_key,
            now,
            reply,
        } => answer(
            reply,
            deliver_hook(conn, &token, payload, dedupe_key, now).await,
        ),
        Op::Cancel(run, reason, now, r) => answer(r, request_cancel(conn, &run, reason, now).await),
        Op::Resolve(run, res, now, r) => answer(r, resolve_blocked(conn, &run, res, now).await),
        Op::Register(w, d, ttl, now, r) => answer(r, register_worker(conn, w, d, ttl, now).await),
        Op::Heartbeat(lease, ttl, now, r) => answer(r, heartbeat(conn, &lease, ttl, now).await),
        Op::Claim(lease, max, now, r) => answer(r, claim(conn, &lease, max, now).await),
        Op::Release(lease, run, p, now, r) => answer(r, release(conn, &lease, &run, p, now).await),
        Op::Retire(lease, r) => answer(r, retire_worker(conn, &lease).await),
    }
}

// ---------------------------------------------------------------------------------------------
// Write plans: an op's writes, sent as one multi-statement round trip.

#[derive(Debug)]
enum Arg {
    Int(i64),
    Text(String),
    Blob(Vec<u8>),
    Null,
}

fn int(v: u64) -> Arg {
    Arg::Int(i64::try_from(v).unwrap_or(i64::MAX))
}

fn txt(s: &str) -> Arg {
    Arg::Text(s.to_owned())
}

/// Statements using only anonymous `?` parameters, so their arguments concatenate in order.
#[derive(Debug, Default)]
struct Plan {
    sql: String,
    args: Vec<Arg>,
    /// Watchers to wake once the batch holding this plan commits.
    wakes: Vec<WatchKey>,
}

impl Plan {
    fn push(&mut self, sql: &str, args: impl IntoIterator<Item = Arg>) {
        self.sql.push_str(sql);
        self.sql.push_str(";\n");
        self.args.extend(args);
    }
}

/// `?, ?, ?` (n of them).
fn marks(n: usize) -> String {
    let mut s = String::with_capacity(n * 3);
    for i in 0..n {
        if i > 0 {
            s.push_str(", ");
        }
        s.push('?');
    }
    s
}

/// `(?, ?), (?, ?)`: `rows` tuples of `width` marks.
fn tuples(rows: usize, width: usize) -> String {
    let one = format!("({})", marks(width));
    vec![one; rows].join(", ")
}

/// Runs `plan` inside its own savepoint: all of it or none of it.
async fn apply(conn: &mut SqliteConnection, mut plan: Plan) -> Result<(), StoreError> {
    let sql = format!("SAVEPOINT op;\n{}RELEASE op", plan.sql);
    let mut q = sqlx::query(AssertSqlSafe(sql));
    for a in std::mem::take(&mut plan.args) {
        q = match a {
            Arg::Int(v) => q.bind(v),
            Arg::Text(s) => q.bind(s),
            Arg::Blob(b) => q.bind(b),
            Arg::Null => q.bind(Option::<i64>::None),
        };
    }
    if let Err(e) = q.execute(&mut *conn).await {
        let err = map_sqlx(e);
        if let Err(e) = sqlx::query("ROLLBACK TO op; RELEASE op")
            .execute(&mut *conn)
            .await
        {
            tracing::warn!(error = %e, "sqlite rollback to savepoint failed");
        }
        return Err(err);
    }
    if !plan.wakes.is_empty() {
        let _ = BATCH_WAKES.try_with(|w| w.borrow_mut().extend(plan.wakes));
    }
    Ok(())
}

tokio::task_local! {
    /// The watchers the applied ops of the writer's current batch wake once it commits.
    static BATCH_WAKES: RefCell<Vec<WatchKey>>;
}

fn fenced(lease: &Lease, run: &str) -> StoreError {
    StoreError::Fenced {
        run: run.to_owned(),
        worker: lease.worker.to_string(),
        epoch: lease.epoch,
    }
}

async fn fetch_run(
    conn: &mut SqliteConnection,
    run: &RunId,
) -> Result<Option<RunRecord>, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        run_cols!(),
        " FROM runs WHERE run_id = ?"
    ))
    .bind(run.as_str())
    .fetch_optional(&mut *conn)
    .await
    .map_err(map_sqlx)?;
    row.as_ref().map(run_record).transpose()
}

/// Adds to `plan` the writes of `events` appended at the run's next seq with their
/// [`Effects`], exactly as `MemoryStore::write` applies them. `append_id` is set for a worker's
/// append, which also marks the journal processed and resets activations. Checks hook tokens
/// (the one failure that depends on other runs) before adding anything.
async fn write(
    conn: &mut SqliteConnection,
    rec: &RunRecord,
    events: &[Event],
    now: Timestamp,
    append_id: Option<&AppendId>,
    plan: &mut Plan,
) -> Result<(u64, u64), StoreError> {
    let fx = Effects::of(rec.execution, events);
    if !fx.hooks_created.is_empty() {
        let sql = format!(
            "SELECT token FROM hooks WHERE token IN ({})",
            marks(fx.hooks_created.len())
        );
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for (t, _, _) in &fx.hooks_created {
            q = q.bind(t.as_str());
        }
        let live: HashSet<String> = q
            .fetch_all(&mut *conn)
            .await
            .map_err(map_sqlx)?
            .iter()
            .map(|r| text(r, 0))
            .collect::<Result<_, _>>()?;
        for (i, (token, _, _)) in fx.hooks_created.iter().enumerate() {
            if live.contains(token) || fx.hooks_created[..i].iter().any(|(t, _, _)| t == token) {
                return Err(StoreError::AlreadyExists {
                    what: "hook token",
                    id: token.clone(),
                    hint: "a live hook already has this token; choose another token or wait for its run to end",
                });
            }
        }
    }
    let run = rec.run_id.as_str();
    let first = rec.next_seq;
    let next = first + events.len() as u64;
    let body = encode_batch(events)?;
    plan.push(
        "INSERT INTO events (run_id, first_seq, count, at, version, body, append_id) \
         VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            txt(run),
            int(first),
            int(events.len() as u64),
            Arg::Int(now.0),
            Arg::Int(i64::from(FORMAT_VERSION)),
            Arg::Blob(body),
            append_id.map_or(Arg::Null, |a| txt(a.as_str())),
        ],
    );
    let ended = fx.ends_run();
    let worker = append_id.is_some();
    if !fx.session_events.is_empty() {
        plan.wakes.push(WatchKey::Session(rec.session_id.clone()));
    }
    if !worker {
        // An external delivery: the worker holding the run waits for it.
        plan.wakes.push(WatchKey::Run(rec.run_id.clone()));
    }
    plan.push(
        "UPDATE runs SET next_seq = ?, updated_at = ?, status = coalesce(?, status), \
         cancel_requested = max(cancel_requested, ?), \
         processed_seq = CASE WHEN ? THEN ? ELSE processed_seq END, \
         activations = CASE WHEN ? THEN 0 ELSE activations END, \
         pending_at = CASE WHEN ? THEN NULL WHEN processed_seq < next_seq THEN pending_at ELSE ? END, \
         owner_worker = CASE WHEN ? THEN NULL ELSE owner_worker END, \
         owner_epoch = CASE WHEN ? THEN NULL ELSE owner_epoch END \
         WHERE run_id = ?",
        [
            int(next),
            Arg::Int(now.0),
            fx.status.map_or(Arg::Null, |s| txt(s.as_str())),
            Arg::Int(i64::from(fx.cancel_requested)),
            Arg::Int(i64::from(worker)),
            int(next),
            Arg::Int(i64::from(worker)),
            Arg::Int(i64::from(worker)),
            Arg::Int(now.0),
            Arg::Int(i64::from(ended)),
            Arg::Int(i64::from(ended)),
            txt(run),
        ],
    );
    if !fx.timers_set.is_empty() {
        let sql = format!(
            "INSERT OR REPLACE INTO timers (run_id, cmd, due) VALUES {}",
            tuples(fx.timers_set.len(), 3)
        );
        let args = fx
            .timers_set
            .iter()
            .flat_map(|(cmd, due)| [txt(run), int(*cmd), Arg::Int(due.0)]);
        plan.push(&sql, args.collect::<Vec<_>>());
    }
    if !fx.timers_cleared.is_empty() {
        let sql = format!(
            "DELETE FROM timers WHERE run_id = ? AND cmd IN ({})",
            marks(fx.timers_cleared.len())
        );
        let args = std::iter::once(txt(run)).chain(fx.timers_cleared.iter().map(|c| int(*c)));
        plan.push(&sql, args.collect::<Vec<_>>());
    }
    if ended {
        plan.push("DELETE FROM timers WHERE run_id = ?", [txt(run)]);
    }
    if !fx.timers_set.is_empty() || !fx.timers_cleared.is_empty() || ended {
        plan.push(
            "UPDATE runs SET timer_due = (SELECT min(due) FROM timers WHERE run_id = ?) \
             WHERE run_id = ?",
            [txt(run), txt(run)],
        );
    }
    if !fx.hooks_created.is_empty() {
        let sql = format!(
            "INSERT INTO hooks (token, run_id, cmd, webhook) VALUES {}",
            tuples(fx.hooks_created.len(), 4)
        );
        let args = fx.hooks_created.iter().flat_map(|(token, cmd, webhook)| {
            [
                txt(token),
                txt(run),
                int(*cmd),
                Arg::Int(i64::from(*webhook)),
            ]
        });
        plan.push(&sql, args.collect::<Vec<_>>());
    }
    for (request_id, cmd, request) in &fx.requests_opened {
        let json = serde_json::to_string(request).map_err(|e| {
            StoreError::InvalidInput(format!("input request does not serialize: {e}"))
        })?;
        plan.push(
            "INSERT OR REPLACE INTO requests (request_id, run_id, session_id, cmd, request, \
             requested_at, state, response, answered_seq) \
             VALUES (?, ?, ?, ?, ?, ?, 'pending', NULL, NULL)",
            [
                txt(request_id.as_str()),
                txt(run),
                txt(rec.session_id.as_str()),
                int(*cmd),
                Arg::Text(json),
                Arg::Int(now.0),
            ],
        );
    }
    if !fx.requests_closed.is_empty() {
        let sql = format!(
            "UPDATE requests SET state = 'withdrawn' WHERE state = 'pending' AND request_id IN ({})",
            marks(fx.requests_closed.len())
        );
        let args = fx.requests_closed.iter().map(|r| txt(r.as_str()));
        plan.push(&sql, args.collect::<Vec<_>>());
    }
    if ended {
        plan.push("DELETE FROM hooks WHERE run_id = ?", [txt(run)]);
        plan.push(
            "UPDATE requests SET state = 'withdrawn' WHERE run_id = ? AND state = 'pending'",
            [txt(run)],
        );
    }
    for event in &fx.session_events {
        let json = serde_json::to_string(event).map_err(|e| {
            StoreError::InvalidInput(format!("session event does not serialize: {e}"))
        })?;
        plan.push(
            // The next seq is past the log's last entry and past `session_heads`, which a
            // purge sets before deleting a log's tail, so no seq is ever used twice.
            "INSERT INTO session_log (session_id, seq, at, run_id, call_id, event) \
             SELECT ?, max(coalesce(max(seq) + 1, 0), \
               coalesce((SELECT next_seq FROM session_heads WHERE session_id = ?), 0)), \
               ?, ?, ?, ? FROM session_log WHERE session_id = ?",
            [
                txt(rec.session_id.as_str()),
                txt(rec.session_id.as_str()),
                Arg::Int(now.0),
                txt(run),
                txt(rec.call_id.as_str()),
                Arg::Text(json),
                txt(rec.session_id.as_str()),
            ],
        );
    }
    Ok((first, next))
}

// ---------------------------------------------------------------------------------------------
// The ops. Each checks its preconditions in the order MemoryStore does, then applies one plan.

/// `create_run`, and with `lease` (eager start) a claim of the new run under it when it is
/// valid, in the same savepoint.
async fn create_run(
    conn: &mut SqliteConnection,
    new: NewRun,
    lease: Option<Lease>,
    now: Timestamp,
) -> Result<CreatedRun, StoreError> {
    let key = new.key();
    let rows = sqlx::query(concat!(
        "SELECT ",
        run_cols_r!(),
        ", e.version, e.body, e.count FROM runs r \
         JOIN events e ON e.run_id = r.run_id AND e.first_seq = 0 \
         WHERE r.idempotency_key = ?1 OR r.run_id = ?2 \
         ORDER BY r.idempotency_key = ?1 DESC"
    ))
    .bind(key.as_str())
    .bind(new.run_id.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(map_sqlx)?;
    if let Some(row) = rows.first() {
        let rec = run_record(row)?;
        if rec.idempotency_key == key {
            let version: i64 = row.try_get(RUN_COLS).map_err(map_sqlx)?;
            let body: Vec<u8> = row.try_get(RUN_COLS + 1).map_err(map_sqlx)?;
            let count = u64_col(row, RUN_COLS + 2)? as usize;
            let version = u16::try_from(version).unwrap_or(u16::MAX);
            let events = decode_batch(&rec.run_id, 0, version, &body, count)?;
            if !events.first().is_some_and(|e| new.matches(e)) {
                return Err(StoreError::IdempotencyMismatch {
                    key,
                    existing: rec.run_id,
                });
            }
            return Ok(CreatedRun {
                run: rec,
                created: false,
            });
        }
        return Err(StoreError::AlreadyExists {
            what: "run",
            id: new.run_id.to_string(),
            hint: "run ids are unique; use a fresh id",
        });
    }
    // Contract clause 10: an ended session starts no run. The end is written under the same
    // database lock, so it either committed before this check or waits for this commit (and
    // then lists the run as live).
    let ended: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM session_records WHERE session_id = ? AND ended_at IS NOT NULL",
    )
    .bind(new.session_id.as_str())
    .fetch_optional(&mut *conn)
    .await
    .map_err(map_sqlx)?;
    if ended.is_some() {
        return Err(StoreError::SessionEnded {
            session: new.session_id,
        });
    }
    let body = encode_batch(std::slice::from_ref(&new.started_event()))?;
    let mut plan = Plan::default();
    plan.push(
        "INSERT INTO runs (run_id, idempotency_key, workflow_id, deployment_id, tool, session_id, \
         call_id, execution, status, next_seq, processed_seq, created_at, updated_at, pending_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'running', 1, 0, ?, ?, ?)",
        [
            txt(new.run_id.as_str()),
            txt(&key),
            txt(new.workflow_id.as_str()),
            txt(new.deployment_id.as_str()),
            txt(&new.tool),
            txt(new.session_id.as_str()),
            txt(new.call_id.as_str()),
            txt(execution_str(new.execution)),
            Arg::Int(now.0),
            Arg::Int(now.0),
            Arg::Int(now.0),
        ],
    );
    plan.push(
        "INSERT INTO events (run_id, first_seq, count, at, version, body, append_id) \
         VALUES (?, 0, 1, ?, ?, ?, NULL)",
        [
            txt(new.run_id.as_str()),
            Arg::Int(now.0),
            Arg::Int(i64::from(FORMAT_VERSION)),
            Arg::Blob(body),
        ],
    );
    let mut record = new.record(now);
    if let Some(lease) = lease {
        if lease_valid(conn, &lease, now).await? {
            plan.push(
                "UPDATE runs SET owner_worker = ?, owner_epoch = ?, activations = 1 \
                 WHERE run_id = ?",
                [
                    txt(lease.worker.as_str()),
                    int(lease.epoch),
                    txt(new.run_id.as_str()),
                ],
            );
            record.owner = Some((lease.worker, lease.epoch));
            record.activations = 1;
        }
    }
    apply(conn, plan).await?;
    Ok(CreatedRun {
        run: record,
        created: true,
    })
}

async fn append(
    conn: &mut SqliteConnection,
    a: Append,
    pre: Option<SqliteRow>,
) -> Result<Appended, StoreError> {
    let row = match pre {
        Some(row) => row,
        None => fetch_append_row(conn, &a).await?,
    };
    append_checked(conn, a, row).await
}

/// The append's check row: its run's columns, then a landed append id's first seq and count,
/// then its worker's current epoch (the layout [`prefetch_appends`] reads too).
async fn fetch_append_row(
    conn: &mut SqliteConnection,
    a: &Append,
) -> Result<SqliteRow, StoreError> {
    sqlx::query(concat!(
        "SELECT ",
        run_cols!(),
        ", (SELECT first_seq FROM events WHERE run_id = ?1 AND append_id = ?2), \
         (SELECT count FROM events WHERE run_id = ?1 AND append_id = ?2), \
         (SELECT epoch FROM workers WHERE worker_id = ?3 AND retired = 0) \
         FROM runs WHERE run_id = ?1"
    ))
    .bind(a.run.as_str())
    .bind(a.append_id.as_str())
    .bind(a.lease.worker.as_str())
    .fetch_optional(&mut *conn)
    .await
    .map_err(map_sqlx)?
    .ok_or_else(|| StoreError::not_found("run", &a.run))
}

async fn append_checked(
    conn: &mut SqliteConnection,
    a: Append,
    row: SqliteRow,
) -> Result<Appended, StoreError> {
    let rec = run_record(&row)?;
    if let (Some(first), Some(count)) = (opt_i64(&row, RUN_COLS)?, opt_i64(&row, RUN_COLS + 1)?) {
        return Ok(Appended {
            first_seq: first as u64,
            next_seq: (first + count) as u64,
            duplicate: true,
        });
    }
    if rec.status.is_terminal() {
        return Err(StoreError::RunEnded { run: a.run });
    }
    if rec.owner.as_ref() != Some(&(a.lease.worker.clone(), a.lease.epoch)) {
        return Err(fenced(&a.lease, a.run.as_str()));
    }
    if opt_i64(&row, RUN_COLS + 2)? != Some(a.lease.epoch as i64) {
        return Err(fenced(&a.lease, a.run.as_str()));
    }
    if rec.next_seq != a.expected_seq {
        return Err(StoreError::Conflict {
            run: a.run,
            expected: a.expected_seq,
            actual: rec.next_seq,
        });
    }
    let mut plan = Plan::default();
    let (first_seq, next_seq) =
        write(conn, &rec, &a.events, a.now, Some(&a.append_id), &mut plan).await?;
    apply(conn, plan).await?;
    Ok(Appended {
        first_seq,
        next_seq,
        duplicate: false,
    })
}

async fn answer_request(
    conn: &mut SqliteConnection,
    request: &RequestId,
    response: InputResponse,
    now: Timestamp,
) -> Result<Delivered, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        run_cols_r!(),
        ", q.state, q.response, q.answered_seq, q.request \
         FROM requests q JOIN runs r ON r.run_id = q.run_id WHERE q.request_id = ?"
    ))
    .bind(request.as_str())
    .fetch_optional(&mut *conn)
    .await
    .map_err(map_sqlx)?
    .ok_or_else(|| StoreError::not_found("request", request))?;
    let rec = run_record(&row)?;
    let corrupt = |what: &str, e: serde_json::Error| StoreError::Corrupt {
        run: rec.run_id.clone(),
        seq: 0,
        reason: format!("undecodable {what} of request {request}: {e}"),
    };
    match text(&row, RUN_COLS)?.as_str() {
        "answered" => {
            let prev: Option<String> = row.try_get(RUN_COLS + 1).map_err(map_sqlx)?;
            let prev: InputResponse = serde_json::from_str(prev.as_deref().unwrap_or("null"))
                .map_err(|e| corrupt("response", e))?;
            return if prev.same_answer(&response) {
                Ok(Delivered {
                    run: rec.run_id.clone(),
                    seq: opt_i64(&row, RUN_COLS + 2)?.unwrap_or(0) as u64,
                    duplicate: true,
                })
            } else {
                Err(StoreError::AlreadyAnswered {
                    request: request.clone(),
                })
            };
        }
        "withdrawn" => {
            return Err(StoreError::Withdrawn {
                request: request.clone(),
            })
        }
        _ => {}
    }
    let asked: InputRequest =
        serde_json::from_str(&text(&row, RUN_COLS + 3)?).map_err(|e| corrupt("request", e))?;
    asked
        .accepts(&response)
        .map_err(|reason| StoreError::InvalidAnswer {
            request: request.clone(),
            reason,
        })?;
    if rec.status.is_terminal() {
        return Err(StoreError::Withdrawn {
            request: request.clone(),
        });
    }
    let response_json = serde_json::to_string(&response)
        .map_err(|e| StoreError::InvalidInput(format!("response does not serialize: {e}")))?;
    let event = Event::InputAnswered {
        request_id: request.clone(),
        response,
    };
    check_limits(std::slice::from_ref(&event))?;
    let mut plan = Plan::default();
    let (seq, _) = write(
        conn,
        &rec,
        std::slice::from_ref(&event),
        now,
        None,
        &mut plan,
    )
    .await?;
    plan.push(
        "UPDATE requests SET state = 'answered', response = ?, answered_seq = ? WHERE request_id = ?",
        [Arg::Text(response_json), int(seq), txt(request.as_str())],
    );
    apply(conn, plan).await?;
    Ok(Delivered {
        run: rec.run_id,
        seq,
        duplicate: false,
    })
}

async fn deliver_hook(
    conn: &mut SqliteConnection,
    token: &str,
    payload: Payload,
    dedupe_key: Option<String>,
    now: Timestamp,
) -> Result<Delivered, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        run_cols_r!(),
        ", h.cmd, (SELECT d.seq FROM hook_dedupe d \
                   WHERE d.run_id = h.run_id AND d.cmd = h.cmd AND d.key = ?2) \
         FROM hooks h JOIN runs r ON r.run_id = h.run_id WHERE h.token = ?1"
    ))
    .bind(token)
    .bind(dedupe_key.as_deref())
    .fetch_optional(&mut *conn)
    .await
    .map_err(map_sqlx)?;
    let Some(row) = row else {
        return retained_delivery(conn, token, dedupe_key.as_deref()).await;
    };
    let rec = run_record(&row)?;
    let cmd = u64_col(&row, RUN_COLS)?;
    if let Some(seq) = opt_i64(&row, RUN_COLS + 1)? {
        return Ok(Delivered {
            run: rec.run_id,
            seq: seq as u64,
            duplicate: true,
        });
    }
    let event = Event::HookReceived { cmd, payload };
    check_limits(std::slice::from_ref(&event))?;
    let mut plan = Plan::default();
    let (seq, _) = write(
        conn,
        &rec,
        std::slice::from_ref(&event),
        now,
        None,
        &mut plan,
    )
    .await?;
    if let Some(key) = dedupe_key {
        plan.push(
            "INSERT INTO hook_dedupe (run_id, cmd, key, seq, token) VALUES (?, ?, ?, ?, ?)",
            [
                txt(rec.run_id.as_str()),
                int(cmd),
                Arg::Text(key),
                int(seq),
                txt(token),
            ],
        );
    }
    apply(conn, plan).await?;
    Ok(Delivered {
        run: rec.run_id,
        seq,
        duplicate: false,
    })
}

/// No live hook has `token`: a keyed delivery accepted before its run ended is a duplicate
/// (kept until the run is purged); anything else is `NotFound`.
async fn retained_delivery(
    conn: &mut SqliteConnection,
    token: &str,
    dedupe_key: Option<&str>,
) -> Result<Delivered, StoreError> {
    let not_found = || StoreError::not_found("hook token", token);
    let Some(key) = dedupe_key else {
        return Err(not_found());
    };
    let row =
        sqlx::query("SELECT run_id, seq FROM hook_dedupe WHERE token = ? AND key = ? LIMIT 1")
            .bind(token)
            .bind(key)
            .fetch_optional(&mut *conn)
            .await
            .map_err(map_sqlx)?
            .ok_or_else(not_found)?;
    Ok(Delivered {
        run: RunId::new(text(&row, 0)?),
        seq: u64_col(&row, 1)?,
        duplicate: true,
    })
}

async fn request_cancel(
    conn: &mut SqliteConnection,
    run: &RunId,
    reason: String,
    now: Timestamp,
) -> Result<CancelOutcome, StoreError> {
    let rec = fetch_run(conn, run)
        .await?
        .ok_or_else(|| StoreError::not_found("run", run))?;
    if rec.status.is_terminal() {
        return Ok(CancelOutcome::AlreadyEnded { status: rec.status });
    }
    if rec.cancel_requested {
        return Ok(CancelOutcome::AlreadyRequested);
    }
    let pending = pending_of(conn, run).await?;
    let events = cancel_events(&reason, rec.status == RunStatus::Blocked, pending);
    check_limits(&events[..1])?;
    let mut plan = Plan::default();
    let (seq, _) = write(conn, &rec, &events, now, None, &mut plan).await?;
    apply(conn, plan).await?;
    Ok(CancelOutcome::Requested { seq })
}

/// The pending requests of a run, ordered by cmd.
async fn pending_of(
    conn: &mut SqliteConnection,
    run: &RunId,
) -> Result<Vec<RequestId>, StoreError> {
    let rows = sqlx::query(
        "SELECT request_id FROM requests WHERE run_id = ? AND state = 'pending' \
         ORDER BY cmd, request_id",
    )
    .bind(run.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(map_sqlx)?;
    rows.iter()
        .map(|r| Ok(RequestId::new(text(r, 0)?)))
        .collect()
}

async fn resolve_blocked(
    conn: &mut SqliteConnection,
    run: &RunId,
    resolution: Resolution,
    now: Timestamp,
) -> Result<u64, StoreError> {
    let rec = fetch_run(conn, run)
        .await?
        .ok_or_else(|| StoreError::not_found("run", run))?;
    if rec.status != RunStatus::Blocked {
        return Err(StoreError::InvalidInput(format!(
            "run {run} is {}, not blocked; only a blocked run can be resumed or failed this way",
            rec.status.as_str()
        )));
    }
    let events = match resolution {
        Resolution::Resume => vec![Event::RunResumed],
        Resolution::Fail { error } => {
            let mut events: Vec<Event> = pending_of(conn, run)
                .await?
                .into_iter()
                .map(|request_id| Event::InputWithdrawn { request_id })
                .collect();
            events.push(Event::RunFailed { error });
            events
        }
    };
    let mut plan = Plan::default();
    let (seq, _) = write(conn, &rec, &events, now, None, &mut plan).await?;
    apply(conn, plan).await?;
    Ok(seq)
}

/// A worker row: `(deployment, epoch, expires_at, retired)`.
async fn fetch_worker(
    conn: &mut SqliteConnection,
    worker: &WorkerId,
) -> Result<Option<(String, u64, i64, bool)>, StoreError> {
    let row = sqlx::query(
        "SELECT deployment, epoch, expires_at, retired FROM workers WHERE worker_id = ?",
    )
    .bind(worker.as_str())
    .fetch_optional(&mut *conn)
    .await
    .map_err(map_sqlx)?;
    row.map(|r: SqliteRow| {
        Ok((
            text(&r, 0)?,
            u64_col(&r, 1)?,
            r.try_get::<i64, _>(2).map_err(map_sqlx)?,
            r.try_get::<i64, _>(3).map_err(map_sqlx)? != 0,
        ))
    })
    .transpose()
}

/// Whether `lease` is valid at `now`: its worker's current, unretired, unexpired epoch.
async fn lease_valid(
    conn: &mut SqliteConnection,
    lease: &Lease,
    now: Timestamp,
) -> Result<bool, StoreError> {
    Ok(matches!(
        fetch_worker(conn, &lease.worker).await?,
        Some((_, epoch, expires_at, false)) if epoch == lease.epoch && expires_at > now.0
    ))
}

async fn register_worker(
    conn: &mut SqliteConnection,
    worker: WorkerId,
    deployment: DeploymentId,
    ttl: Duration,
    now: Timestamp,
) -> Result<Lease, StoreError> {
    let epoch = fetch_worker(conn, &worker)
        .await?
        .map_or(1, |(_, e, _, _)| e + 1);
    let lease = Lease {
        worker,
        deployment,
        epoch,
        expires_at: now.plus(ttl),
    };
    let mut plan = Plan::default();
    plan.push(
        "INSERT OR REPLACE INTO workers (worker_id, deployment, epoch, expires_at, retired) \
         VALUES (?, ?, ?, ?, 0)",
        [
            txt(lease.worker.as_str()),
            txt(lease.deployment.as_str()),
            int(epoch),
            Arg::Int(lease.expires_at.0),
        ],
    );
    apply(conn, plan).await?;
    Ok(lease)
}

async fn heartbeat(
    conn: &mut SqliteConnection,
    lease: &Lease,
    ttl: Duration,
    now: Timestamp,
) -> Result<Lease, StoreError> {
    let (deployment, epoch, _, retired) = fetch_worker(conn, &lease.worker)
        .await?
        .ok_or_else(|| StoreError::not_found("worker", &lease.worker))?;
    if retired || epoch != lease.epoch {
        return Err(fenced(lease, ""));
    }
    let expires_at = now.plus(ttl);
    let mut plan = Plan::default();
    plan.push(
        "UPDATE workers SET expires_at = ? WHERE worker_id = ?",
        [Arg::Int(expires_at.0), txt(lease.worker.as_str())],
    );
    apply(conn, plan).await?;
    Ok(Lease {
        worker: lease.worker.clone(),
        deployment: DeploymentId::new(deployment),
        epoch,
        expires_at,
    })
}

/// `(rid, k)`: the rowid and claim key of every run of deployment `?1` that no valid lease
/// holds at `?2` and that has work or is orphaned (contract clause 5), only those due at `?2`
/// when `due_only`. Runs without an owner come from the `(deployment_id, wake_at)` index,
/// orphaned ones from the owner index, so neither scans the parked runs.
pub(crate) fn claim_keys_sql(due_only: bool) -> String {
    let (due, orphan_due) = if due_only {
        (
            "r.wake_at <= ?2",
            "AND min(coalesce(r.wake_at, r.updated_at), r.updated_at) <= ?2",
        )
    } else {
        ("r.wake_at IS NOT NULL", "")
    };
    format!(
        "SELECT r.rowid AS rid, r.wake_at AS k FROM runs r \
           WHERE r.deployment_id = ?1 AND r.owner_worker IS NULL AND {due} \
         UNION ALL \
         SELECT r.rowid AS rid, min(coalesce(r.wake_at, r.updated_at), r.updated_at) AS k \
           FROM runs r LEFT JOIN workers w ON w.worker_id = r.owner_worker \
           WHERE r.deployment_id = ?1 AND r.owner_worker IS NOT NULL AND r.status = 'running' \
             AND (w.worker_id IS NULL OR w.epoch != r.owner_epoch OR w.retired != 0 \
                  OR w.expires_at <= ?2) {orphan_due}"
    )
}

async fn claim(
    conn: &mut SqliteConnection,
    lease: &Lease,
    max: usize,
    now: Timestamp,
) -> Result<Vec<RunRecord>, StoreError> {
    if !lease_valid(conn, lease, now).await? {
        return Err(fenced(lease, ""));
    }
    // Inside the writer's transaction: the pick and the update see the same rows.
    let picked = sqlx::query(AssertSqlSafe(format!(
        "SELECT rid, k FROM ({}) ORDER BY k, rid LIMIT ?3",
        claim_keys_sql(true)
    )))
    .bind(lease.deployment.as_str())
    .bind(now.0)
    .bind(i64::try_from(max).unwrap_or(i64::MAX))
    .fetch_all(&mut *conn)
    .await
    .map_err(map_sqlx)?
    .iter()
    .map(|r| Ok((r.try_get::<i64, _>(0)?, r.try_get::<i64, _>(1)?)))
    .collect::<Result<HashMap<i64, i64>, sqlx::Error>>()
    .map_err(map_sqlx)?;
    if picked.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        concat!(
            "UPDATE runs SET owner_worker = ?, owner_epoch = ?, activations = activations + 1, \
             updated_at = ? WHERE rowid IN ({}) RETURNING ",
            run_cols!(),
            ", rowid"
        ),
        marks(picked.len())
    );
    let mut q = sqlx::query(AssertSqlSafe(sql))
        .bind(lease.worker.as_str())
        .bind(lease.epoch as i64)
        .bind(now.0);
    for rid in picked.keys() {
        q = q.bind(*rid);
    }
    let mut claimed = q
        .fetch_all(&mut *conn)
        .await
        .map_err(map_sqlx)?
        .iter()
        .map(|r| {
            let rid: i64 = r.try_get(RUN_COLS).map_err(map_sqlx)?;
            Ok(((picked[&rid], rid), run_record(r)?))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    claimed.sort_by_key(|(k, _)| *k);
    Ok(claimed.into_iter().map(|(_, r)| r).collect())
}

async fn release(
    conn: &mut SqliteConnection,
    lease: &Lease,
    run: &RunId,
    processed_seq: u64,
    now: Timestamp,
) -> Result<(), StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        run_cols!(),
        ", (SELECT epoch FROM workers WHERE worker_id = ?2 AND retired = 0) \
         FROM runs WHERE run_id = ?1"
    ))
    .bind(run.as_str())
    .bind(lease.worker.as_str())
    .fetch_optional(&mut *conn)
    .await
    .map_err(map_sqlx)?
    .ok_or_else(|| StoreError::not_found("run", run))?;
    let rec = run_record(&row)?;
    if rec.owner.as_ref() != Some(&(lease.worker.clone(), lease.epoch))
        || opt_i64(&row, RUN_COLS)? != Some(lease.epoch as i64)
    {
        return Err(fenced(lease, run.as_str()));
    }
    let processed = rec.processed_seq.max(processed_seq.min(rec.next_seq));
    let mut plan = Plan::default();
    // pending_at is the time of the event at processed_seq: all events of one row share it.
    plan.push(
        "UPDATE runs SET owner_worker = NULL, owner_epoch = NULL, updated_at = ?, \
         processed_seq = ?, \
         pending_at = CASE WHEN ? >= next_seq THEN NULL \
                           WHEN ? = processed_seq THEN pending_at \
                           ELSE (SELECT at FROM events WHERE run_id = ? AND first_seq <= ? \
                                 ORDER BY first_seq DESC LIMIT 1) END \
         WHERE run_id = ?",
        [
            Arg::Int(now.0),
            int(processed),
            int(processed),
            int(processed),
            txt(run.as_str()),
            int(processed),
            txt(run.as_str()),
        ],
    );
    apply(conn, plan).await
}

async fn retire_worker(conn: &mut SqliteConnection, lease: &Lease) -> Result<(), StoreError> {
    match fetch_worker(conn, &lease.worker).await? {
        Some((_, epoch, _, false)) if epoch == lease.epoch => {}
        _ => return Err(fenced(lease, "")),
    }
    // The runs it still holds keep naming it: orphaned, they are claimable at once.
    let mut plan = Plan::default();
    plan.push(
        "UPDATE workers SET retired = 1 WHERE worker_id = ?",
        [txt(lease.worker.as_str())],
    );
    apply(conn, plan).await
}
