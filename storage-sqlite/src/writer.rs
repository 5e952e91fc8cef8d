//! The writer thread: one connection, group commit.
//!
//! Every write op of a handle is sent here. The thread takes what is queued (up to a batch
//! limit), opens one `BEGIN IMMEDIATE` transaction, runs the ops in arrival order — each op
//! reads what it must check (inside the transaction, so another handle on the file cannot
//! interleave), and only once every check passed applies its writes — commits, and only then
//! answers each op. A failed commit answers every op of the batch with that failure (none was
//! applied).

use crate::error::{batch_failed, map_rusqlite, other};
use crate::rows::{
    execution_str, i64_col, opt_i64, run_cols, run_cols_r, run_record, text, u64_col,
};
use crate::rows::{Cols, RUN_COLS};
use eve_core::codec::{decode_batch, encode_batch, FORMAT_VERSION};
use eve_core::store::cancel_events;
use eve_core::{
    check_limits, Append, AppendId, Appended, CancelOutcome, CreatedRun, Delivered, DeploymentId,
    Effects, Event, InputRequest, InputResponse, Lease, NewRun, Payload, RequestId, Resolution,
    RunId, RunRecord, RunStatus, StoreError, Timestamp, WorkerId,
};
use eve_core::{WatchHub, WatchKey};
use rusqlite::types::Value;
use rusqlite::Connection as Conn;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
        Err(
            e @ (StoreError::Unavailable { .. }
            | StoreError::Other { .. }
            | StoreError::StorageFull { .. }),
        ) => Some(copy(e)),
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
        StoreError::StorageFull { .. } => batch_failed(e),
        StoreError::Unavailable { backend, message } => StoreError::Unavailable {
            backend,
            message: message.clone(),
        },
        other => crate::error::other(other.to_string()),
    }
}

/// How the writer opens its connection (the same file and settings as the read pool's).
#[derive(Debug, Clone)]
pub(crate) struct WriterConfig {
    /// The database file's path.
    pub(crate) filename: String,
    /// `FULL` or `NORMAL`.
    pub(crate) synchronous: &'static str,
    pub(crate) busy_timeout: Duration,
    /// `PRAGMA max_page_count`, if the store was given a size limit.
    pub(crate) max_page_count: Option<u64>,
}

/// Opens the writer's connection and starts its thread, which ends when every handle (sender)
/// is dropped. Once a batch commits, the thread wakes the watchers its ops touched in `hub`.
///
/// The writer is a plain thread on a plain connection: an op's statements run in place, with no
/// channel hop per statement (as a connection with its own worker thread would need), so a
/// batched append costs one hop in and one answer out.
pub(crate) fn spawn(
    config: &WriterConfig,
    rx: mpsc::Receiver<Op>,
    max_batch: usize,
    hub: WatchHub,
    commits: Arc<AtomicU64>,
) -> Result<(), StoreError> {
    let conn = open(config)?;
    conn.set_prepared_statement_cache_capacity(512);
    // SQLite's automatic checkpoint would run inside a commit of this connection and stall
    // every op of that batch; a second connection checkpoints beside the writer instead.
    conn.execute_batch("PRAGMA wal_autocheckpoint = 0")
        .map_err(map_rusqlite)?;
    let ck = open(config)?;
    let (tx, rx_ck) = std::sync::mpsc::sync_channel::<()>(1);
    let done = Arc::new(AtomicBool::new(false));
    let copied = done.clone();
    thread("eve-sqlite-checkpoint", move || {
        while rx_ck.recv().is_ok() {
            checkpoint(&ck);
            copied.store(true, Ordering::Release);
        }
    })?;
    let checkpoints = Checkpoints { start: tx, done };
    thread("eve-sqlite-writer", move || {
        batches(&conn, rx, max_batch, &hub, &commits, checkpoints)
    })
}

/// The writer's side of the checkpointing thread.
struct Checkpoints {
    /// Asks for a checkpoint.
    start: std::sync::mpsc::SyncSender<()>,
    /// Set when one finished.
    done: Arc<AtomicBool>,
}

/// Commits of the writer between two checkpoints (at roughly ten pages a commit, about the
/// 1000 pages at which SQLite would checkpoint by itself).
const CHECKPOINT_EVERY: u64 = 100;

/// Copies what the WAL holds into the database file without blocking the writer or readers
/// (`PASSIVE`). The writer then copies the few frames it appended meanwhile the same way, so
/// that all of the WAL is copied and its next transaction starts the WAL over from the
/// beginning: the file stays small and its blocks are reused (a sync of a growing file costs
/// more than one of blocks it already has).
fn checkpoint(conn: &Conn) {
    let r = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
    });
    match r {
        Ok((wal, copied)) => tracing::trace!(wal, copied, "sqlite checkpoint"),
        Err(e) => tracing::debug!(error = %e, "sqlite checkpoint failed; the next one retries"),
    }
}

/// A connection to the configured database with the writer's settings.
fn open(config: &WriterConfig) -> Result<Conn, StoreError> {
    use rusqlite::OpenFlags as F;
    let flags = F::SQLITE_OPEN_READ_WRITE
        | F::SQLITE_OPEN_CREATE
        | F::SQLITE_OPEN_URI
        | F::SQLITE_OPEN_NO_MUTEX;
    let conn = Conn::open_with_flags(&config.filename, flags).map_err(map_rusqlite)?;
    conn.busy_timeout(config.busy_timeout)
        .map_err(map_rusqlite)?;
    conn.execute_batch(&format!(
        "PRAGMA synchronous = {}; PRAGMA foreign_keys = OFF;",
        config.synchronous
    ))
    .map_err(map_rusqlite)?;
    if let Some(pages) = config.max_page_count {
        conn.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |r| {
            r.get::<_, i64>(0)
        })
        .map_err(map_rusqlite)?;
    }
    Ok(conn)
}

fn thread(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), StoreError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(drop)
        .map_err(|e| other(format!("cannot start the thread {name}: {e}")))
}

fn batches(
    conn: &Conn,
    mut rx: mpsc::Receiver<Op>,
    max_batch: usize,
    hub: &WatchHub,
    commits: &AtomicU64,
    checkpoints: Checkpoints,
) {
    let mut committed = 0u64;
    let mut ops = Vec::with_capacity(max_batch);
    while let Some(op) = rx.blocking_recv() {
        ops.push(op);
        while ops.len() < max_batch {
            match rx.try_recv() {
                Ok(op) => ops.push(op),
                Err(_) => break,
            }
        }
        if let Err(e) = exec(conn, "BEGIN IMMEDIATE", &[]) {
            for op in ops.drain(..) {
                op.reject(batch_failed(&e));
            }
            continue;
        }
        let mut answers = Vec::with_capacity(ops.len());
        let mut fault = None;
        // The appends' checks, read for the whole batch in one statement. An op's prefetched
        // row is used only while nothing earlier in the batch can have changed it: no earlier
        // append to its run, and no earlier op of another kind.
        let mut prefetched = prefetch_appends(conn, &ops);
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
            let (answer, f) = run_op(conn, op, pre);
            answers.push(answer);
            if f.is_some() {
                fault = f;
                break;
            }
        }
        let rest: Vec<Op> = queued.map(|(_, op)| op).collect();
        let outcome = match fault {
            Some(err) => Err(err),
            None => exec(conn, "COMMIT", &[]).map(|_| ()),
        };
        let wakes = BATCH_WAKES.with(|w| std::mem::take(&mut *w.borrow_mut()));
        match outcome {
            Ok(()) => {
                commits.fetch_add(1, Ordering::SeqCst);
                answers.into_iter().for_each(|a| a(None));
                for key in &wakes {
                    hub.wake(key);
                }
                committed += 1;
                if checkpoints.done.swap(false, Ordering::Acquire) {
                    checkpoint(conn);
                }
                if committed % CHECKPOINT_EVERY == 0 {
                    // Full: a checkpoint is under way and will copy this batch too.
                    let _ = checkpoints.start.try_send(());
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "sqlite batch abandoned; rolling it back");
                // Fails harmlessly when SQLite already rolled back.
                if let Err(e) = exec(conn, "ROLLBACK", &[]) {
                    tracing::debug!(error = %e, "sqlite rollback of an abandoned batch");
                }
                answers.into_iter().for_each(|a| a(Some(&err)));
                rest.into_iter()
                    .for_each(|op| op.reject(batch_failed(&err)));
            }
        }
    }
}

/// Runs `sql` (a cached statement) with `args`; returns the number of rows it changed.
fn exec(conn: &Conn, sql: &str, args: &[Value]) -> Result<usize, StoreError> {
    conn.prepare_cached(sql)
        .and_then(|mut st| st.execute(rusqlite::params_from_iter(args)))
        .map_err(map_rusqlite)
}

/// Runs the query `sql` with `args` and decodes each row with `f`.
fn query<T>(
    conn: &Conn,
    sql: &str,
    args: &[Value],
    mut f: impl FnMut(&rusqlite::Row<'_>) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let mut st = conn.prepare_cached(sql).map_err(map_rusqlite)?;
    let mut rows = st
        .query(rusqlite::params_from_iter(args))
        .map_err(map_rusqlite)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(map_rusqlite)? {
        out.push(f(row)?);
    }
    Ok(out)
}

/// [`query`]'s first row, if any.
fn query_opt<T>(
    conn: &Conn,
    sql: &str,
    args: &[Value],
    f: impl FnOnce(&rusqlite::Row<'_>) -> Result<T, StoreError>,
) -> Result<Option<T>, StoreError> {
    let mut st = conn.prepare_cached(sql).map_err(map_rusqlite)?;
    let mut rows = st
        .query(rusqlite::params_from_iter(args))
        .map_err(map_rusqlite)?;
    match rows.next().map_err(map_rusqlite)? {
        Some(row) => f(row).map(Some),
        None => Ok(None),
    }
}

/// What an append checks: its run, a landed append id's first seq and count, and its worker's
/// current epoch (read by [`fetch_append_check`] or, for a batch, [`prefetch_appends`]).
#[derive(Debug)]
struct AppendCheck {
    rec: RunRecord,
    landed: Option<(i64, i64)>,
    worker_epoch: Option<i64>,
}

impl AppendCheck {
    fn decode(row: &rusqlite::Row<'_>) -> Result<Self, StoreError> {
        Ok(Self {
            rec: run_record(row)?,
            landed: match (opt_i64(row, RUN_COLS)?, opt_i64(row, RUN_COLS + 1)?) {
                (Some(first), Some(count)) => Some((first, count)),
                _ => None,
            },
            worker_epoch: opt_i64(row, RUN_COLS + 2)?,
        })
    }
}

/// Reads, in one statement, what each append of the batch checks, keyed by the op's index.
/// Best effort: on any error the ops read their own rows.
fn prefetch_appends(conn: &Conn, ops: &[Op]) -> HashMap<usize, AppendCheck> {
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
    let args: Vec<Value> = appends
        .iter()
        .flat_map(|(i, a)| {
            [
                Value::Integer(*i as i64),
                txt(a.run.as_str()),
                txt(a.append_id.as_str()),
                txt(a.lease.worker.as_str()),
            ]
        })
        .collect();
    let rows = query(conn, &sql, &args, |row| {
        Ok((
            i64_col(row, RUN_COLS + 3)? as usize,
            AppendCheck::decode(row)?,
        ))
    });
    match rows {
        Ok(rows) => rows.into_iter().collect(),
        Err(e) => {
            tracing::debug!(error = %e, "sqlite append prefetch failed; checking one by one");
            HashMap::new()
        }
    }
}

fn run_op(conn: &Conn, op: Op, pre: Option<AppendCheck>) -> (Answer, Option<StoreError>) {
    match op {
        Op::CreateRun(new, lease, now, r) => answer(r, create_run(conn, *new, lease, now)),
        Op::Append(a, r) => answer(r, append(conn, *a, pre)),
        Op::Answer(req, resp, now, r) => answer(r, answer_request(conn, &req, resp, now)),
        Op::DeliverHook {
            token,
            payload,
            dedupe_key,
            now,
            reply,
        } => answer(reply, deliver_hook(conn, &token, payload, dedupe_key, now)),
        Op::Cancel(run, reason, now, r) => answer(r, request_cancel(conn, &run, reason, now)),
        Op::Resolve(run, res, now, r) => answer(r, resolve_blocked(conn, &run, res, now)),
        Op::Register(w, d, ttl, now, r) => answer(r, register_worker(conn, w, d, ttl, now)),
        Op::Heartbeat(lease, ttl, now, r) => answer(r, heartbeat(conn, &lease, ttl, now)),
        Op::Claim(lease, max, now, r) => answer(r, claim(conn, &lease, max, now)),
        Op::Release(lease, run, p, now, r) => answer(r, release(conn, &lease, &run, p, now)),
        Op::Retire(lease, r) => answer(r, retire_worker(conn, &lease)),
    }
}

// ---------------------------------------------------------------------------------------------
// Write plans: an op's writes, applied once its checks passed.

fn int(v: u64) -> Value {
    Value::Integer(i64::try_from(v).unwrap_or(i64::MAX))
}

fn txt(s: &str) -> Value {
    Value::Text(s.to_owned())
}

/// An op's write statements with their arguments.
#[derive(Debug, Default)]
struct Plan {
    statements: Vec<(String, Vec<Value>)>,
    /// Watchers to wake once the batch holding this plan commits.
    wakes: Vec<WatchKey>,
}

impl Plan {
    fn push(&mut self, sql: &str, args: impl IntoIterator<Item = Value>) {
        self.statements
            .push((sql.to_owned(), args.into_iter().collect()));
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

/// Runs `plan`'s statements. The op's checks were all read before, so a statement fails only
/// on a backend fault (an I/O error, a full disk, a violated constraint), and a fault abandons
/// the whole batch (see [`answer`]): an op is never left half applied, with no savepoint per op
/// (which would copy every page the op touches a second time into a sub-journal).
fn apply(conn: &Conn, plan: Plan) -> Result<(), StoreError> {
    for (sql, args) in &plan.statements {
        exec(conn, sql, args)?;
    }
    if !plan.wakes.is_empty() {
        BATCH_WAKES.with(|w| w.borrow_mut().extend(plan.wakes));
    }
    Ok(())
}

thread_local! {
    /// The watchers the applied ops of the writer's current batch wake once it commits.
    static BATCH_WAKES: RefCell<Vec<WatchKey>> = const { RefCell::new(Vec::new()) };
}

fn fenced(lease: &Lease, run: &str) -> StoreError {
    StoreError::Fenced {
        run: run.to_owned(),
        worker: lease.worker.to_string(),
        epoch: lease.epoch,
    }
}

fn fetch_run(conn: &Conn, run: &RunId) -> Result<Option<RunRecord>, StoreError> {
    query_opt(
        conn,
        concat!("SELECT ", run_cols!(), " FROM runs WHERE run_id = ?"),
        &[txt(run.as_str())],
        |row| run_record(row),
    )
}

/// Adds to `plan` the writes of `events` appended at the run's next seq with their
/// [`Effects`], exactly as `MemoryStore::write` applies them. `append_id` is set for a worker's
/// append, which also marks the journal processed and resets activations. Checks hook tokens
/// (the one failure that depends on other runs) before adding anything.
fn write(
    conn: &Conn,
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
        let args: Vec<Value> = fx.hooks_created.iter().map(|(t, _, _)| txt(t)).collect();
        let live: HashSet<String> = query(conn, &sql, &args, |r| text(r, 0))?
            .into_iter()
            .collect();
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
            Value::Integer(now.0),
            Value::Integer(i64::from(FORMAT_VERSION)),
            Value::Blob(body),
            append_id.map_or(Value::Null, |a| txt(a.as_str())),
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
            Value::Integer(now.0),
            fx.status.map_or(Value::Null, |s| txt(s.as_str())),
            Value::Integer(i64::from(fx.cancel_requested)),
            Value::Integer(i64::from(worker)),
            int(next),
            Value::Integer(i64::from(worker)),
            Value::Integer(i64::from(worker)),
            Value::Integer(now.0),
            Value::Integer(i64::from(ended)),
            Value::Integer(i64::from(ended)),
            txt(run),
        ],
    );
    for (key, value) in &fx.attributes {
        match value {
            Some(v) => plan.push(
                "INSERT OR REPLACE INTO run_attributes (run_id, key, value) VALUES (?, ?, ?)",
                [txt(run), txt(key), txt(&eve_core::search::index_value(v))],
            ),
            None => plan.push(
                "DELETE FROM run_attributes WHERE run_id = ? AND key = ?",
                [txt(run), txt(key)],
            ),
        }
    }
    if !fx.timers_set.is_empty() {
        let sql = format!(
            "INSERT OR REPLACE INTO timers (run_id, cmd, due) VALUES {}",
            tuples(fx.timers_set.len(), 3)
        );
        let args = fx
            .timers_set
            .iter()
            .flat_map(|(cmd, due)| [txt(run), int(*cmd), Value::Integer(due.0)]);
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
                Value::Integer(i64::from(*webhook)),
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
                Value::Text(json),
                Value::Integer(now.0),
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
                Value::Integer(now.0),
                txt(run),
                txt(rec.call_id.as_str()),
                Value::Text(json),
                txt(rec.session_id.as_str()),
            ],
        );
    }
    Ok((first, next))
}

// ---------------------------------------------------------------------------------------------
// The ops. Each checks its preconditions in the order MemoryStore does, then applies one plan.

/// `create_run`, and with `lease` (eager start) a claim of the new run under it when it is
/// valid, in the same plan.
fn create_run(
    conn: &Conn,
    new: NewRun,
    lease: Option<Lease>,
    now: Timestamp,
) -> Result<CreatedRun, StoreError> {
    let key = new.key();
    let existing = query_opt(
        conn,
        concat!(
            "SELECT ",
            run_cols_r!(),
            ", e.version, e.body, e.count FROM runs r \
             JOIN events e ON e.run_id = r.run_id AND e.first_seq = 0 \
             WHERE r.idempotency_key = ?1 OR r.run_id = ?2 \
             ORDER BY r.idempotency_key = ?1 DESC"
        ),
        &[txt(&key), txt(new.run_id.as_str())],
        |row| {
            let body: Vec<u8> = row.get(RUN_COLS + 1).map_err(map_rusqlite)?;
            Ok((
                run_record(row)?,
                i64_col(row, RUN_COLS)?,
                body,
                u64_col(row, RUN_COLS + 2)?,
            ))
        },
    )?;
    if let Some((rec, version, body, count)) = existing {
        if rec.idempotency_key == key {
            let count = count as usize;
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
    let ended = query_opt(
        conn,
        "SELECT 1 FROM session_records WHERE session_id = ? AND ended_at IS NOT NULL",
        &[txt(new.session_id.as_str())],
        |_| Ok(()),
    )?;
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
            Value::Integer(now.0),
            Value::Integer(now.0),
            Value::Integer(now.0),
        ],
    );
    plan.push(
        "INSERT INTO events (run_id, first_seq, count, at, version, body, append_id) \
         VALUES (?, 0, 1, ?, ?, ?, NULL)",
        [
            txt(new.run_id.as_str()),
            Value::Integer(now.0),
            Value::Integer(i64::from(FORMAT_VERSION)),
            Value::Blob(body),
        ],
    );
    let mut record = new.record(now);
    if let Some(lease) = lease {
        if lease_valid(conn, &lease, now)? {
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
    apply(conn, plan)?;
    Ok(CreatedRun {
        run: record,
        created: true,
    })
}

fn append(conn: &Conn, a: Append, pre: Option<AppendCheck>) -> Result<Appended, StoreError> {
    let check = match pre {
        Some(check) => check,
        None => fetch_append_check(conn, &a)?,
    };
    append_checked(conn, a, check)
}

/// The append's checks, read alone (the layout [`prefetch_appends`] reads for a batch).
fn fetch_append_check(conn: &Conn, a: &Append) -> Result<AppendCheck, StoreError> {
    query_opt(
        conn,
        concat!(
            "SELECT ",
            run_cols!(),
            ", (SELECT first_seq FROM events WHERE run_id = ?1 AND append_id = ?2), \
             (SELECT count FROM events WHERE run_id = ?1 AND append_id = ?2), \
             (SELECT epoch FROM workers WHERE worker_id = ?3 AND retired = 0) \
             FROM runs WHERE run_id = ?1"
        ),
        &[
            txt(a.run.as_str()),
            txt(a.append_id.as_str()),
            txt(a.lease.worker.as_str()),
        ],
        AppendCheck::decode,
    )?
    .ok_or_else(|| StoreError::not_found("run", &a.run))
}

fn append_checked(conn: &Conn, a: Append, check: AppendCheck) -> Result<Appended, StoreError> {
    let AppendCheck {
        rec,
        landed,
        worker_epoch,
    } = check;
    if let Some((first, count)) = landed {
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
    if worker_epoch != Some(a.lease.epoch as i64) {
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
    let (first_seq, next_seq) = write(conn, &rec, &a.events, a.now, Some(&a.append_id), &mut plan)?;
    apply(conn, plan)?;
    Ok(Appended {
        first_seq,
        next_seq,
        duplicate: false,
    })
}

fn answer_request(
    conn: &Conn,
    request: &RequestId,
    response: InputResponse,
    now: Timestamp,
) -> Result<Delivered, StoreError> {
    let (rec, state, prev, answered_seq, asked): (
        RunRecord,
        String,
        Option<String>,
        Option<i64>,
        String,
    ) = query_opt(
        conn,
        concat!(
            "SELECT ",
            run_cols_r!(),
            ", q.state, q.response, q.answered_seq, q.request \
             FROM requests q JOIN runs r ON r.run_id = q.run_id WHERE q.request_id = ?"
        ),
        &[txt(request.as_str())],
        |row| {
            Ok((
                run_record(row)?,
                text(row, RUN_COLS)?,
                row.opt_text(RUN_COLS + 1)?,
                opt_i64(row, RUN_COLS + 2)?,
                text(row, RUN_COLS + 3)?,
            ))
        },
    )?
    .ok_or_else(|| StoreError::not_found("request", request))?;
    let corrupt = |what: &str, e: serde_json::Error| StoreError::Corrupt {
        run: rec.run_id.clone(),
        seq: 0,
        reason: format!("undecodable {what} of request {request}: {e}"),
    };
    match state.as_str() {
        "answered" => {
            let prev: InputResponse = serde_json::from_str(prev.as_deref().unwrap_or("null"))
                .map_err(|e| corrupt("response", e))?;
            return if prev.same_answer(&response) {
                Ok(Delivered {
                    run: rec.run_id.clone(),
                    seq: answered_seq.unwrap_or(0) as u64,
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
    let asked: InputRequest = serde_json::from_str(&asked).map_err(|e| corrupt("request", e))?;
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
    )?;
    plan.push(
        "UPDATE requests SET state = 'answered', response = ?, answered_seq = ? WHERE request_id = ?",
        [Value::Text(response_json), int(seq), txt(request.as_str())],
    );
    apply(conn, plan)?;
    Ok(Delivered {
        run: rec.run_id,
        seq,
        duplicate: false,
    })
}

fn deliver_hook(
    conn: &Conn,
    token: &str,
    payload: Payload,
    dedupe_key: Option<String>,
    now: Timestamp,
) -> Result<Delivered, StoreError> {
    let hook = query_opt(
        conn,
        concat!(
            "SELECT ",
            run_cols_r!(),
            ", h.cmd, (SELECT d.seq FROM hook_dedupe d \
                       WHERE d.run_id = h.run_id AND d.cmd = h.cmd AND d.key = ?2) \
             FROM hooks h JOIN runs r ON r.run_id = h.run_id WHERE h.token = ?1"
        ),
        &[txt(token), dedupe_key.as_deref().map_or(Value::Null, txt)],
        |row| {
            Ok((
                run_record(row)?,
                u64_col(row, RUN_COLS)?,
                opt_i64(row, RUN_COLS + 1)?,
            ))
        },
    )?;
    let Some((rec, cmd, landed)) = hook else {
        return retained_delivery(conn, token, dedupe_key.as_deref());
    };
    if let Some(seq) = landed {
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
    )?;
    if let Some(key) = dedupe_key {
        plan.push(
            "INSERT INTO hook_dedupe (run_id, cmd, key, seq, token) VALUES (?, ?, ?, ?, ?)",
            [
                txt(rec.run_id.as_str()),
                int(cmd),
                Value::Text(key),
                int(seq),
                txt(token),
            ],
        );
    }
    apply(conn, plan)?;
    Ok(Delivered {
        run: rec.run_id,
        seq,
        duplicate: false,
    })
}

/// No live hook has `token`: a keyed delivery accepted before its run ended is a duplicate
/// (kept until the run is purged); anything else is `NotFound`.
fn retained_delivery(
    conn: &Conn,
    token: &str,
    dedupe_key: Option<&str>,
) -> Result<Delivered, StoreError> {
    let not_found = || StoreError::not_found("hook token", token);
    let Some(key) = dedupe_key else {
        return Err(not_found());
    };
    query_opt(
        conn,
        "SELECT run_id, seq FROM hook_dedupe WHERE token = ? AND key = ? LIMIT 1",
        &[txt(token), txt(key)],
        |row| {
            Ok(Delivered {
                run: RunId::new(text(row, 0)?),
                seq: u64_col(row, 1)?,
                duplicate: true,
            })
        },
    )?
    .ok_or_else(not_found)
}

fn request_cancel(
    conn: &Conn,
    run: &RunId,
    reason: String,
    now: Timestamp,
) -> Result<CancelOutcome, StoreError> {
    let rec = fetch_run(conn, run)?.ok_or_else(|| StoreError::not_found("run", run))?;
    if rec.status.is_terminal() {
        return Ok(CancelOutcome::AlreadyEnded { status: rec.status });
    }
    if rec.cancel_requested {
        return Ok(CancelOutcome::AlreadyRequested);
    }
    let pending = pending_of(conn, run)?;
    let events = cancel_events(&reason, rec.status == RunStatus::Blocked, pending);
    check_limits(&events[..1])?;
    let mut plan = Plan::default();
    let (seq, _) = write(conn, &rec, &events, now, None, &mut plan)?;
    apply(conn, plan)?;
    Ok(CancelOutcome::Requested { seq })
}

/// The pending requests of a run, ordered by cmd.
fn pending_of(conn: &Conn, run: &RunId) -> Result<Vec<RequestId>, StoreError> {
    query(
        conn,
        "SELECT request_id FROM requests WHERE run_id = ? AND state = 'pending' \
         ORDER BY cmd, request_id",
        &[txt(run.as_str())],
        |r| Ok(RequestId::new(text(r, 0)?)),
    )
}

fn resolve_blocked(
    conn: &Conn,
    run: &RunId,
    resolution: Resolution,
    now: Timestamp,
) -> Result<u64, StoreError> {
    let rec = fetch_run(conn, run)?.ok_or_else(|| StoreError::not_found("run", run))?;
    resolution.check(run, rec.status)?;
    let pending = if resolution.withdraws() {
        pending_of(conn, run)?
    } else {
        Vec::new()
    };
    let events = resolution.events(pending);
    let mut plan = Plan::default();
    let (seq, _) = write(conn, &rec, &events, now, None, &mut plan)?;
    apply(conn, plan)?;
    Ok(seq)
}

/// A worker row: `(deployment, epoch, expires_at, retired)`.
fn fetch_worker(
    conn: &Conn,
    worker: &WorkerId,
) -> Result<Option<(String, u64, i64, bool)>, StoreError> {
    query_opt(
        conn,
        "SELECT deployment, epoch, expires_at, retired FROM workers WHERE worker_id = ?",
        &[txt(worker.as_str())],
        |r| {
            Ok((
                text(r, 0)?,
                u64_col(r, 1)?,
                i64_col(r, 2)?,
                i64_col(r, 3)? != 0,
            ))
        },
    )
}

/// Whether `lease` is valid at `now`: its worker's current, unretired, unexpired epoch.
fn lease_valid(conn: &Conn, lease: &Lease, now: Timestamp) -> Result<bool, StoreError> {
    Ok(matches!(
        fetch_worker(conn, &lease.worker)?,
        Some((_, epoch, expires_at, false)) if epoch == lease.epoch && expires_at > now.0
    ))
}

fn register_worker(
    conn: &Conn,
    worker: WorkerId,
    deployment: DeploymentId,
    ttl: Duration,
    now: Timestamp,
) -> Result<Lease, StoreError> {
    let epoch = fetch_worker(conn, &worker)?.map_or(1, |(_, e, _, _)| e + 1);
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
            Value::Integer(lease.expires_at.0),
        ],
    );
    apply(conn, plan)?;
    Ok(lease)
}

fn heartbeat(
    conn: &Conn,
    lease: &Lease,
    ttl: Duration,
    now: Timestamp,
) -> Result<Lease, StoreError> {
    let (deployment, epoch, _, retired) = fetch_worker(conn, &lease.worker)?
        .ok_or_else(|| StoreError::not_found("worker", &lease.worker))?;
    if retired || epoch != lease.epoch {
        return Err(fenced(lease, ""));
    }
    let expires_at = now.plus(ttl);
    let mut plan = Plan::default();
    plan.push(
        "UPDATE workers SET expires_at = ? WHERE worker_id = ?",
        [Value::Integer(expires_at.0), txt(lease.worker.as_str())],
    );
    apply(conn, plan)?;
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

fn claim(
    conn: &Conn,
    lease: &Lease,
    max: usize,
    now: Timestamp,
) -> Result<Vec<RunRecord>, StoreError> {
    if !lease_valid(conn, lease, now)? {
        return Err(fenced(lease, ""));
    }
    // Inside the writer's transaction: the pick and the update see the same rows.
    let picked: HashMap<i64, i64> = query(
        conn,
        &format!(
            "SELECT rid, k FROM ({}) ORDER BY k, rid LIMIT ?3",
            claim_keys_sql(true)
        ),
        &[
            txt(lease.deployment.as_str()),
            Value::Integer(now.0),
            int(max as u64),
        ],
        |r| Ok((i64_col(r, 0)?, i64_col(r, 1)?)),
    )?
    .into_iter()
    .collect();
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
    let args: Vec<Value> = [
        txt(lease.worker.as_str()),
        int(lease.epoch),
        Value::Integer(now.0),
    ]
    .into_iter()
    .chain(picked.keys().map(|rid| Value::Integer(*rid)))
    .collect();
    let mut claimed = query(conn, &sql, &args, |r| {
        let rid = i64_col(r, RUN_COLS)?;
        Ok(((picked[&rid], rid), run_record(r)?))
    })?;
    claimed.sort_by_key(|(k, _)| *k);
    Ok(claimed.into_iter().map(|(_, r)| r).collect())
}

fn release(
    conn: &Conn,
    lease: &Lease,
    run: &RunId,
    processed_seq: u64,
    now: Timestamp,
) -> Result<(), StoreError> {
    let (rec, worker_epoch) = query_opt(
        conn,
        concat!(
            "SELECT ",
            run_cols!(),
            ", (SELECT epoch FROM workers WHERE worker_id = ?2 AND retired = 0) \
             FROM runs WHERE run_id = ?1"
        ),
        &[txt(run.as_str()), txt(lease.worker.as_str())],
        |row| Ok((run_record(row)?, opt_i64(row, RUN_COLS)?)),
    )?
    .ok_or_else(|| StoreError::not_found("run", run))?;
    if rec.owner.as_ref() != Some(&(lease.worker.clone(), lease.epoch))
        || worker_epoch != Some(lease.epoch as i64)
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
            Value::Integer(now.0),
            int(processed),
            int(processed),
            int(processed),
            txt(run.as_str()),
            int(processed),
            txt(run.as_str()),
        ],
    );
    apply(conn, plan)
}

fn retire_worker(conn: &Conn, lease: &Lease) -> Result<(), StoreError> {
    match fetch_worker(conn, &lease.worker)? {
        Some((_, epoch, _, false)) if epoch == lease.epoch => {}
        _ => return Err(fenced(lease, "")),
    }
    // The runs it still holds keep naming it: orphaned, they are claimable at once.
    let mut plan = Plan::default();
    plan.push(
        "UPDATE workers SET retired = 1 WHERE worker_id = ?",
        [txt(lease.worker.as_str())],
    );
    apply(conn, plan)
}
