//! eve-storage-postgres: a [`JournalStore`] on PostgreSQL (sqlx), with exactly the semantics of
//! [`eve_core::MemoryStore`], proved by the `eve-conformance` suite against a real server.
//!
//! ```no_run
//! # async fn demo() -> Result<(), eve_core::StoreError> {
//! use eve_storage_postgres::{PostgresOptions, PostgresStore};
//! let store = PostgresStore::connect_with(
//!     "postgres://postgres@127.0.0.1:5432/test",
//!     PostgresOptions { schema: "eve_prod".into(), pool_size: 16, ..Default::default() },
//! )
//! .await?;
//! let mut wake = store.subscribe().await?; // LISTEN-fed wake-ups for idle workers
//! // Wakes when the session's log grows, whichever process wrote it.
//! use eve_core::{JournalStore, SessionId, WatchKey};
//! let log = store.watch(&WatchKey::Session(SessionId::new("session-1"))).await;
//! # let _ = (wake.notified(), log); Ok(()) }
//! ```
//!
//! # Schema
//!
//! Every table lives in the configured schema (default `eve`), so several deployments share one
//! database. The schema name is validated (`[a-z_][a-z0-9_]*`, at most 58 bytes) and
//! double-quoted in every statement. Migrations are versioned in `<schema>.eve_migrations`,
//! applied on connect under an advisory lock, and re-runnable (a rerun is a no-op).
//!
//! | table | key | holds |
//! |---|---|---|
//! | `runs` | `run_id`; unique `idempotency_key`, `ord` | the [`RunRecord`], plus `pending_at` (time of the first unprocessed event) |
//! | `events` | `(run_id, first_seq)`; unique `(run_id, append_id)` | one row per append: `count`, `at`, `version`, `body` = [`eve_core::codec::encode_batch`] |
//! | `timers` | `(run_id, cmd)` | due times of sleeps and step retries |
//! | `hooks` | `token` | live hook tokens (deleted when the run ends) |
//! | `hook_dedupe` | `(run_id, cmd, key)` | accepted deliveries by dedupe key |
//! | `requests` | `request_id` | input requests: pending, answered (with the response), withdrawn |
//! | `session_heads`, `session_log` | `session_id`; `(session_id, seq)` | the session log |
//! | `workers` | `worker_id` | leases: deployment, epoch, expiry, retired |
//!
//! Undecodable rows (unknown format version, truncated body, wrong count) read back as
//! [`StoreError::Corrupt`] naming the run and the row's first seq.
//!
//! # Commit protocol
//!
//! Every write is one transaction (read committed) that first locks the run's row
//! (`SELECT … FOR UPDATE`) and then checks its preconditions against what it locked: the
//! append id (a retry of a landed append answers `duplicate: true`), the run's status, owner and
//! the owner worker's epoch (fencing), the expected seq. Index changes are derived from
//! [`eve_core::Effects::of`], as `MemoryStore` derives them: hook tokens
//! (`INSERT … ON CONFLICT DO NOTHING`, a lost token fails the append with `AlreadyExists`),
//! requests, timers, status, session log; on run end every hook of the run is released, every
//! pending request withdrawn, every timer dropped and the owner cleared.
//!
//! Worker appends go through a **group commit**: [`PostgresOptions::writers`] writer tasks each
//! take every append queued (up to [`PostgresOptions::max_batch`]) and apply them in one
//! transaction. Fast path (distinct runs): one statement locks every run of the batch in run id
//! order (writers never deadlock on each other), a second reads them with a fresh snapshot, the
//! checks run in memory (a failed check writes nothing, so it needs no savepoint) and each passing
//! append is one statement (journal row, run row, cleared timers) plus its rarer effects. If any
//! statement fails after writing began, the transaction is rolled back and the batch is redone
//! with a `SAVEPOINT` per append, so one append's failure (a lost hook token, a deadlock) never
//! rolls back another's. If the commit itself fails, every append of the batch that had passed
//! gets `Unavailable`: retry it with the same append id to learn whether it landed. Deliveries,
//! starts, claims and releases are their own transactions.
//!
//! Row locks are always taken by a statement of their own, and what the checks need is read by a
//! later statement: under read committed a statement that waited for a lock re-checks only the
//! locked row and keeps joined rows of its old snapshot.
//!
//! A running run is claimable (contract clause 5) when no valid lease holds it (its owner
//! worker is not retired, at the run's owner epoch, and unexpired at `now`) and its *claim key*
//! is at or before `now`: the earliest of its first unprocessed event (`pending_at`), its
//! earliest timer and, for an orphaned run (one that still names an owner whose lease is no
//! longer valid), its `updated_at`, so an orphaned run is claimable at once. `retire_worker`
//! only marks the worker retired, and a re-registration only bumps the epoch: the runs they held
//! keep their owner and are orphaned. Claims take runs in claim key order, ties by creation
//! order (`ord`); [`JournalStore::next_wake`] is the smallest claim key of the deployment's
//! running runs that no valid lease holds.
//!
//! Claims lock candidate runs with `FOR UPDATE SKIP LOCKED`, so claimers never queue behind each
//! other. When that leaves a claim short, the candidates it skipped (runs locked by a delivery
//! or append in flight) are locked, waiting for that write, and re-checked, so a claim never
//! misses a run that was claimable before the write began (the conformance model checks this).
//!
//! Errors: connection loss, pool timeouts, serialization failures (40001), deadlocks (40P01),
//! server shutdown (57P…) are [`StoreError::Unavailable`] (retryable); concurrent starts with one
//! idempotency key meet on the unique key (`ON CONFLICT DO NOTHING`) and re-read the winner.
//!
//! # Wake-ups (LISTEN/NOTIFY)
//!
//! Each store opens one dedicated listener connection (on first use of
//! [`PostgresStore::subscribe`], [`JournalStore::wakeups`] or [`JournalStore::watch`]) that
//! `LISTEN`s on channel `eve_<schema>`. Writers send `NOTIFY` on that channel in the writing
//! transaction, so Postgres delivers it only at commit (a rolled-back write or savepoint sends
//! nothing) and folds identical ones of a transaction into one. Payloads say what to wake:
//!
//! | payload | sent by | wakes |
//! |---|---|---|
//! | `d:<deployment>` | a new run; a delivery (answer, hook, cancel, resume) to a running run that had no unprocessed event; a release that leaves pending work or timers; a retirement; a re-registration that supersedes an epoch | idle workers ([`Wakeups`], [`JournalStore::wakeups`]) |
//! | `s:<session>` | every transaction that writes session-log rows (worker appends and deliveries alike) | [`JournalStore::watch`] of [`WatchKey::Session`] |
//! | `r:<run>` | every external delivery to the run (answer, hook, cancel, resolve) | [`JournalStore::watch`] of [`WatchKey::Run`] |
//! | `*` | instead of any of the above whose id makes the payload 8000 bytes or more | everything |
//!
//! Worker appends never wake workers; they notify only session watchers. The listener dispatches
//! `d:` to the idle-worker signal (every deployment's: the payload names it for humans), `s:` and
//! `r:` to a [`WatchHub`], and anything else (`*`, or a bare deployment id from an older version)
//! to everyone. Subscribers coalesce further (a receiver is a counter: many notifications
//! before a wait wake it once). After every listener reconnect, every subscriber and watcher is
//! woken too, meaning "re-read everything": notifications sent while the connection was down
//! are lost. Timers and lease expiries are not notified: an idle worker sleeps until
//! [`JournalStore::next_wake`].
//!
//! # Limits
//!
//! The contract's limits ([`eve_core::store::MAX_EVENTS_PER_APPEND`], 4 MiB per payload and per
//! append) are checked before any SQL runs. Seqs, epochs and times are stored as `BIGINT`
//! (values above `i64::MAX` are refused). A hook token, id or key is `TEXT` (Postgres caps a
//! value at 1 GB). NOTIFY payloads (a prefix and a deployment, session or run id) must be
//! shorter than 8000 bytes; ids are not limited, so a longer payload is replaced by `*` (wake
//! everything) instead of failing the write.
//!
//! # Capability checklist
//!
//! - [x] linearizable, fenced, idempotent appends (row lock + append id), group commit
//! - [x] exactly-once deliveries (answer, hook dedupe key, cancel), refused after run end
//! - [x] idempotent starts under concurrency (unique key)
//! - [x] store-wide hook token uniqueness, released at run end
//! - [x] leases with epochs; runs of expired, superseded or retired leases orphaned and
//!   claimable at once; claims with `SKIP LOCKED` in claim key order, `next_wake`
//! - [x] faithful paged reads (one row per append, decoded in batches), `Corrupt` on bad rows
//! - [x] queries: runs by id/session/status/deployment, pending requests, session log
//! - [x] LISTEN/NOTIFY wake-ups for idle workers, session-log and run-delivery watches
//!   ([`JournalStore::watch`]), with a wake-everything signal after a reconnect
//! - [x] a stable [`JournalStore::store_id`]: `postgres://host:port/database#schema`
//! - [x] multi-process safe: every check runs in the database

use async_trait::async_trait;
use eve_core::codec::{decode_batch, encode_batch, FORMAT_VERSION};
use eve_core::{
    check_limits, Append, Appended, CancelOutcome, CreatedRun, Delivered, DeploymentId, Effects,
    Event, Execution, InputRequest, InputResponse, JournalStore, Lease, NewRun, Payload,
    PendingRequest, RequestId, Resolution, RunId, RunQuery, RunRecord, RunStatus, SessionEntry,
    SessionEvent, SessionId, StoreError, StoredEvent, Timestamp, WatchHub, WatchKey, WorkerId,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row};
use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch, Mutex, OnceCell};

mod error;
mod schema;

use error::{bad_row, map_err, BACKEND};
pub use schema::SCHEMA_VERSION;

/// How [`PostgresStore::connect_with`] sets up the store.
#[derive(Clone, Debug)]
pub struct PostgresOptions {
    /// The schema holding every table (created if missing). Default `eve`.
    pub schema: String,
    /// Most connections in the pool (the listener connection comes on top). Default 8.
    pub pool_size: u32,
    /// How long to wait for a connection (at connect and later). Default 10 s.
    pub connect_timeout: Duration,
    /// Group-commit writer tasks, each with its own transaction in flight. Default 2.
    pub writers: usize,
    /// Most appends folded into one group-commit transaction. Default 64.
    pub max_batch: usize,
    /// `application_name` of the store's connections (visible in `pg_stat_activity`).
    /// Default `eve-workflow`.
    pub application_name: String,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            schema: "eve".into(),
            pool_size: 8,
            connect_timeout: Duration::from_secs(10),
            writers: 2,
            max_batch: 64,
            application_name: "eve-workflow".into(),
        }
    }
}

/// The PostgreSQL journal store. Cheap to clone (one pool, shared).
#[derive(Clone, Debug)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    db: Arc<Db>,
    jobs: mpsc::Sender<Job>,
    /// Watchers of session logs and run deliveries, woken by the listener.
    hub: WatchHub,
    /// The listener, opened on first use.
    listener: OnceCell<Listener>,
}

/// The dedicated LISTEN connection's task and the idle-worker signal it feeds.
#[derive(Debug)]
struct Listener {
    workers: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(l) = self.listener.get() {
            l.task.abort();
        }
    }
}

/// What the writer tasks and the store share.
#[derive(Debug)]
struct Db {
    pool: PgPool,
    schema: String,
    quoted: String,
    channel: String,
    /// [`JournalStore::store_id`].
    id: String,
}

type Job = (Append, oneshot::Sender<Result<Appended, StoreError>>);

/// A subscription to wake-ups (see the crate docs, "Wake-ups"). Each subscriber sees every
/// wake-up after it subscribed, coalesced.
#[derive(Debug)]
pub struct Wakeups {
    rx: watch::Receiver<u64>,
}

impl Wakeups {
    /// Waits for the next wake-up: a run of this schema became claimable, or the listener
    /// reconnected (poll everything).
    ///
    /// # Errors
    /// `Unavailable` when the store was dropped.
    pub async fn notified(&mut self) -> Result<(), StoreError> {
        self.rx
            .changed()
            .await
            .map_err(|_| StoreError::Unavailable {
                backend: BACKEND,
                message: "the store's wake-up listener stopped (the store was dropped)".into(),
            })
    }
}

impl PostgresStore {
    /// Connects with default [`PostgresOptions`] (schema `eve`) and applies migrations.
    ///
    /// # Errors
    /// `InvalidInput` for a malformed URL; `Unavailable` when the server does not answer.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, PostgresOptions::default()).await
    }

    /// Connects with `options` and applies migrations.
    ///
    /// # Errors
    /// `InvalidInput` for a malformed URL or schema name; `Unavailable` when the server does not
    /// answer within `connect_timeout`.
    pub async fn connect_with(url: &str, options: PostgresOptions) -> Result<Self, StoreError> {
        schema::validate_schema(&options.schema)?;
        let connect = PgConnectOptions::from_str(url)
            .map_err(|e| {
                StoreError::InvalidInput(format!(
                    "PostgreSQL URL is malformed: {e}; expected postgres://user@host:port/database"
                ))
            })?
            .application_name(&options.application_name);
        let (host, port) = (connect.get_host().to_owned(), connect.get_port());
        let refused = |e: String| {
            StoreError::Unavailable {
            backend: BACKEND,
            message: format!(
                "cannot connect to PostgreSQL at {host}:{port}: {e}; check that the server runs and the URL is right"
            ),
        }
        };
        // One direct attempt first: the pool retries refused connections until its acquire
        // timeout, but a server that is not there should be reported at once.
        {
            use sqlx::Connection;
            match tokio::time::timeout(
                options.connect_timeout,
                PgConnection::connect_with(&connect),
            )
            .await
            {
                Ok(Ok(conn)) => {
                    let _ = conn.close().await;
                }
                Ok(Err(e)) => return Err(refused(e.to_string())),
                Err(_) => {
                    return Err(refused(format!(
                        "no answer within {:?}",
                        options.connect_timeout
                    )))
                }
            }
        }
        let pool = PgPoolOptions::new()
            .max_connections(options.pool_size.max(1))
            .acquire_timeout(options.connect_timeout)
            .connect_with(connect)
            .await
            .map_err(|e| refused(e.to_string()))?;
        Self::start(pool, &options.schema, options.writers, options.max_batch).await
    }

    /// A store on an existing pool, in `schema`, with 2 writers of batches up to 64; applies
    /// migrations. (The one sqlx type in this API: bring your own pool.)
    ///
    /// # Errors
    /// `InvalidInput` for a bad schema name; `Unavailable` when the server does not answer.
    pub async fn from_pool(pool: PgPool, schema: &str) -> Result<Self, StoreError> {
        Self::start(pool, schema, 2, 64).await
    }

    async fn start(
        pool: PgPool,
        schema: &str,
        writers: usize,
        max_batch: usize,
    ) -> Result<Self, StoreError> {
        schema::validate_schema(schema)?;
        let quoted = format!("\"{schema}\"");
        schema::migrate(&pool, schema, &quoted).await?;
        let id = store_id(pool.connect_options().as_ref(), schema);
        let db = Arc::new(Db {
            pool,
            schema: schema.to_owned(),
            quoted,
            channel: format!("eve_{schema}"),
            id,
        });
        let (tx, rx) = mpsc::channel::<Job>(1024);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..writers.max(1) {
            tokio::spawn(writer(db.clone(), rx.clone(), max_batch.max(1)));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                db,
                jobs: tx,
                hub: WatchHub::default(),
                listener: OnceCell::new(),
            }),
        })
    }

    /// The schema this store lives in.
    pub fn schema(&self) -> &str {
        &self.inner.db.schema
    }

    /// The NOTIFY channel of this schema (`eve_<schema>`).
    pub fn channel(&self) -> &str {
        &self.inner.db.channel
    }

    /// Subscribes to wake-ups for idle workers. The first call opens the dedicated listener
    /// connection and returns once `LISTEN` is in place, so any run made claimable after this
    /// returns wakes the subscription.
    ///
    /// # Errors
    /// `Unavailable` when the listener cannot connect.
    pub async fn subscribe(&self) -> Result<Wakeups, StoreError> {
        Ok(Wakeups {
            rx: self.listener().await?.workers.subscribe(),
        })
    }

    /// The listener, opened (and `LISTEN` in place) on first use.
    async fn listener(&self) -> Result<&Listener, StoreError> {
        let db = self.inner.db.clone();
        let hub = self.inner.hub.clone();
        self.inner
            .listener
            .get_or_try_init(|| async move {
                let opts = db.pool.connect_options().as_ref().clone();
                let lpool = PgPoolOptions::new()
                    .max_connections(1)
                    .max_lifetime(None)
                    .idle_timeout(None)
                    .connect_lazy_with(opts);
                let mut listener = sqlx::postgres::PgListener::connect_with(&lpool)
                    .await
                    .map_err(map_err)?;
                listener.listen(&db.channel).await.map_err(map_err)?;
                let (workers, _) = watch::channel(0u64);
                let task = tokio::spawn(listen_loop(listener, workers.clone(), hub));
                Ok::<_, StoreError>(Listener { workers, task })
            })
            .await
    }

    fn db(&self) -> &Db {
        &self.inner.db
    }
}

async fn listen_loop(
    mut listener: sqlx::postgres::PgListener,
    workers: watch::Sender<u64>,
    hub: WatchHub,
) {
    let wake_workers = || workers.send_modify(|n| *n = n.wrapping_add(1));
    // Notifications sent while the connection was down are lost: every subscriber and watcher
    // re-reads the store.
    let wake_all = || {
        wake_workers();
        hub.wake_all();
    };
    let mut backoff = Duration::from_millis(50);
    loop {
        match listener.try_recv().await {
            Ok(Some(n)) => {
                backoff = Duration::from_millis(50);
                match Wake::parse(n.payload()) {
                    Wake::Workers => wake_workers(),
                    Wake::Key(key) => hub.wake(&key),
                    Wake::All => wake_all(),
                }
            }
            // The connection was lost and re-established (LISTEN re-issued).
            Ok(None) => wake_all(),
            Err(e) => {
                tracing::warn!(error = %e, "eve postgres listener: reconnecting");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                wake_all();
            }
        }
    }
}

/// NOTIFY payloads must be shorter than this (a Postgres limit).
const MAX_PAYLOAD: usize = 8000;

/// The payload that wakes everything: sent instead of a key too long for a NOTIFY payload.
const WAKE_ALL: &str = "*";

/// What a NOTIFY payload on the store's channel wakes.
#[derive(Debug, PartialEq, Eq)]
enum Wake {
    /// `d:<deployment>`: idle workers (a run may have become claimable).
    Workers,
    /// `s:<session>` or `r:<run>`: the watchers of that [`WatchKey`].
    Key(WatchKey),
    /// [`WAKE_ALL`], or a payload this version does not know: everyone.
    All,
}

impl Wake {
    fn parse(payload: &str) -> Self {
        if payload.starts_with("d:") {
            Wake::Workers
        } else {
            WatchKey::decode(payload).map_or(Wake::All, Wake::Key)
        }
    }
}

/// `payload`, or [`WAKE_ALL`] when it is too long for a NOTIFY (ids are unbounded).
fn fit(payload: String) -> String {
    if payload.len() < MAX_PAYLOAD {
        payload
    } else {
        WAKE_ALL.to_owned()
    }
}

/// The NOTIFY payload that wakes idle workers of `deployment`.
fn deployment_payload(deployment: &DeploymentId) -> String {
    fit(format!("d:{deployment}"))
}

/// The NOTIFY payload that wakes the watchers of `key`.
fn key_payload(key: &WatchKey) -> String {
    fit(key.encode())
}

/// `postgres://host:port/database#schema`: the same in every process that opens the store,
/// whatever user or password it connects with.
fn store_id(o: &PgConnectOptions, schema: &str) -> String {
    let host = match o.get_socket() {
        Some(socket) => socket.display().to_string(),
        None if o.get_host().contains(':') => format!("[{}]", o.get_host()),
        None => o.get_host().to_owned(),
    };
    // Without a database name Postgres uses the user's name.
    let database = o.get_database().unwrap_or(o.get_username());
    format!("postgres://{host}:{}/{database}#{schema}", o.get_port())
}

/// The group-commit writer: folds queued appends into one transaction, a savepoint each.
async fn writer(db: Arc<Db>, rx: Arc<Mutex<mpsc::Receiver<Job>>>, max_batch: usize) {
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

fn unavailable(message: String) -> StoreError {
    StoreError::Unavailable {
        backend: BACKEND,
        message,
    }
}

fn i64_of(v: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| {
        StoreError::InvalidInput(format!("{what} {v} is too large for this store (max i64)"))
    })
}

fn execution_str(e: Execution) -> &'static str {
    match e {
        Execution::Default => "default",
        Execution::Background => "background",
    }
}

/// The claim key of a run `r` that no valid lease holds (contract clause 5): when its work is
/// due (its first unprocessed event or its earliest timer), and for an orphaned run (it still
/// names an owner) the earlier of that and its `updated_at`. NULL: no work and no owner.
/// (`LEAST` ignores NULLs.)
macro_rules! claim_key {
    () => {
        "LEAST(r.pending_at, (SELECT min(t.due) FROM {s}.timers t WHERE t.run_id = r.run_id), \
         CASE WHEN r.owner_worker IS NOT NULL THEN r.updated_at END)"
    };
}

/// See [`claim_key!`].
const CLAIM_KEY: &str = claim_key!();

/// Whether a valid lease holds run `r` at `$2` (`w` its owner's worker row).
macro_rules! held {
    () => {
        "coalesce(NOT w.retired AND w.epoch = r.owner_epoch AND w.expires_at > $2, FALSE)"
    };
}

/// A run of deployment `$1` that is claimable at `$2` (`r` the run, `w` its owner's worker):
/// running, held by no valid lease, and its claim key is due.
///
/// `r.owner_worker IS NOT DISTINCT FROM w.worker_id` guards the re-check Postgres makes when a
/// row changed under a locking statement: it re-reads `r` but keeps the joined `w` of the old
/// snapshot, so a run claimed meanwhile by another worker must not pass as unowned or orphaned.
const CLAIMABLE: &str = concat!(
    "r.deployment_id = $1 AND r.status = 'running' \
     AND r.owner_worker IS NOT DISTINCT FROM w.worker_id AND NOT ",
    held!(),
    " AND ",
    claim_key!(),
    " <= $2"
);

const RUN_COLS: &str = "r.run_id, r.idempotency_key, r.workflow_id, r.deployment_id, r.tool, \
    r.session_id, r.call_id, r.execution, r.status, r.next_seq, r.processed_seq, \
    r.cancel_requested, r.activations, r.owner_worker, r.owner_epoch, r.created_at, r.updated_at, \
    r.pending_at";

fn run_from_row(row: &PgRow) -> Result<RunRecord, StoreError> {
    let g = |e: sqlx::Error| map_err(e);
    let execution: String = row.try_get("execution").map_err(g)?;
    let status: String = row.try_get("status").map_err(g)?;
    let owner_worker: Option<String> = row.try_get("owner_worker").map_err(g)?;
    let owner_epoch: Option<i64> = row.try_get("owner_epoch").map_err(g)?;
    Ok(RunRecord {
        run_id: RunId::new(row.try_get::<String, _>("run_id").map_err(g)?),
        idempotency_key: row.try_get("idempotency_key").map_err(g)?,
        workflow_id: row.try_get::<String, _>("workflow_id").map_err(g)?.into(),
        deployment_id: row.try_get::<String, _>("deployment_id").map_err(g)?.into(),
        tool: row.try_get("tool").map_err(g)?,
        session_id: row.try_get::<String, _>("session_id").map_err(g)?.into(),
        call_id: row.try_get::<String, _>("call_id").map_err(g)?.into(),
        execution: match execution.as_str() {
            "default" => Execution::Default,
            "background" => Execution::Background,
            other => return Err(bad_row("execution", other)),
        },
        status: RunStatus::parse(&status).ok_or_else(|| bad_row("status", &status))?,
        next_seq: row.try_get::<i64, _>("next_seq").map_err(g)? as u64,
        processed_seq: row.try_get::<i64, _>("processed_seq").map_err(g)? as u64,
        cancel_requested: row.try_get("cancel_requested").map_err(g)?,
        activations: row.try_get::<i32, _>("activations").map_err(g)? as u32,
        owner: match (owner_worker, owner_epoch) {
            (Some(w), Some(e)) => Some((WorkerId::new(w), e as u64)),
            _ => None,
        },
        created_at: Timestamp(row.try_get("created_at").map_err(g)?),
        updated_at: Timestamp(row.try_get("updated_at").map_err(g)?),
    })
}

/// A run row locked for a write, with its owner worker's lease state.
struct Locked {
    run: RunRecord,
    /// `(epoch, retired)` of the owner worker's current registration.
    owner_lease: Option<(u64, bool)>,
    /// A landed append with the asked append id: `(first_seq, count)`.
    landed: Option<(u64, u64)>,
}

impl Db {
    /// The statement with `{s}` replaced by the quoted schema.
    fn sql(&self, template: &str) -> AssertSqlSafe<String> {
        AssertSqlSafe(template.replace("{s}", &self.quoted))
    }

    /// Locks the run row (`FOR UPDATE`); with `append_id`, also finds a landed append.
    async fn lock_run(
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

    /// Wakes idle workers of `deployment` when the caller's transaction commits.
    async fn notify(
        &self,
        conn: &mut PgConnection,
        deployment: &DeploymentId,
    ) -> Result<(), StoreError> {
        self.notify_all(conn, &[deployment_payload(deployment)])
            .await
    }

    /// Sends NOTIFYs with `payloads` on the schema's channel (delivered at commit).
    async fn notify_all(
        &self,
        conn: &mut PgConnection,
        payloads: &[String],
    ) -> Result<(), StoreError> {
        sqlx::query("SELECT pg_notify($1, p) FROM unnest($2::text[]) AS u(p)")
            .bind(&self.channel)
            .bind(payloads)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    /// Writes `events` at the run's next seq with their [`Effects`], as `MemoryStore::write`.
    /// Session-log rows notify the session's watchers. `append_id` marks a worker append (sets
    /// `processed_seq`, resets `activations`, wakes no worker); otherwise a delivery, which
    /// notifies the run's watchers, and idle workers when the run was idle. The caller locked
    /// the run and checked preconditions; the caller's transaction (or savepoint) is rolled back
    /// on error.
    async fn write(
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

    /// Claims up to `max` claimable runs (`only`: among these ids; `skip`: not these) in the
    /// caller's transaction; `only = None` skips rows locked by others.
    async fn claim_rows(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        max: usize,
        now: Timestamp,
        only: Option<&[String]>,
        skip: &[String],
    ) -> Result<Vec<((i64, i64), RunRecord)>, StoreError> {
        let lock = if only.is_some() { "" } else { "SKIP LOCKED" };
        let rows = sqlx::query(self.sql(&format!(
            "WITH c AS ( \
               SELECT r.run_id, r.ord, {CLAIM_KEY} AS claim_key \
               FROM {{s}}.runs r LEFT JOIN {{s}}.workers w ON w.worker_id = r.owner_worker \
               WHERE {CLAIMABLE} AND NOT (r.run_id = ANY($7)) \
                 AND ($6::text[] IS NULL OR r.run_id = ANY($6)) \
               ORDER BY claim_key, r.ord LIMIT $3 \
               FOR UPDATE OF r {lock}) \
             UPDATE {{s}}.runs r SET owner_worker = $4, owner_epoch = $5, \
               activations = r.activations + 1, updated_at = $2 \
             FROM c WHERE r.run_id = c.run_id \
             RETURNING {RUN_COLS}, c.claim_key AS claim_key, c.ord AS c_ord"
        )))
        .bind(lease.deployment.as_str())
        .bind(now.0)
        .bind(i64::try_from(max).unwrap_or(i64::MAX))
        .bind(lease.worker.as_str())
        .bind(i64_of(lease.epoch, "epoch")?)
        .bind(only)
        .bind(skip)
        .fetch_all(&mut *conn)
        .await
        .map_err(map_err)?;
        rows.iter()
            .map(|row| {
                let at: i64 = row.try_get("claim_key").map_err(map_err)?;
                let ord: i64 = row.try_get("c_ord").map_err(map_err)?;
                Ok(((at, ord), run_from_row(row)?))
            })
            .collect()
    }

    async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
        self.pool.begin().await.map_err(map_err)
    }

    /// Whether the run has work now or later (pending events or a timer) and is running.
    async fn has_work(&self, conn: &mut PgConnection, run: &RunId) -> Result<bool, StoreError> {
        sqlx::query_scalar(self.sql(
            "SELECT r.status = 'running' AND (r.pending_at IS NOT NULL \
               OR EXISTS (SELECT 1 FROM {s}.timers t WHERE t.run_id = r.run_id)) \
             FROM {s}.runs r WHERE r.run_id = $1",
        ))
        .bind(run.as_str())
        .fetch_one(&mut *conn)
        .await
        .map_err(map_err)
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

fn fenced(lease: &Lease, run: &str) -> StoreError {
    StoreError::Fenced {
        run: run.to_owned(),
        worker: lease.worker.to_string(),
        epoch: lease.epoch,
    }
}

fn decode_json<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| bad_row(what, e))
}

#[async_trait]
impl JournalStore for PostgresStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// LISTEN/NOTIFY wake-ups from every process on this schema (see
    /// [`PostgresStore::subscribe`]); `None` when the listener cannot connect.
    async fn wakeups(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.subscribe().await.ok().map(|w| w.rx)
    }

    /// LISTEN/NOTIFY-fed: session-log writes and deliveries from every process on this schema
    /// wake the key's receivers; `None` when the listener cannot connect.
    async fn watch(&self, key: &WatchKey) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.listener().await.ok()?;
        Some(self.inner.hub.subscribe(key))
    }

    /// `postgres://host:port/database#schema`, as the URL names the host.
    fn store_id(&self) -> String {
        self.inner.db.id.clone()
    }

    async fn create_run(&self, new: NewRun, now: Timestamp) -> Result<CreatedRun, StoreError> {
        new.validate()?;
        let db = self.db();
        let key = new.key();
        let started = new.started_event();
        let body = encode_batch(std::slice::from_ref(&started))?;
        let mut tx = db.begin().await?;
        let inserted: Option<i64> = sqlx::query_scalar(db.sql(
            "INSERT INTO {s}.runs (run_id, idempotency_key, workflow_id, deployment_id, tool, \
               session_id, call_id, execution, status, next_seq, processed_seq, pending_at, \
               created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'running', 1, 0, $9, $9, $9) \
             ON CONFLICT DO NOTHING RETURNING ord",
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
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        if inserted.is_some() {
            sqlx::query(db.sql(
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
            db.notify(&mut tx, &new.deployment_id).await?;
            tx.commit().await.map_err(map_err)?;
            return Ok(CreatedRun {
                run: new.record(now),
                created: true,
            });
        }
        tx.rollback().await.map_err(map_err)?;
        // Lost to an existing row: the key's run (re-read after the winner committed), or the
        // run id under another key.
        let row = sqlx::query(db.sql(&format!(
            "SELECT {RUN_COLS} FROM {{s}}.runs r WHERE r.idempotency_key = $1"
        )))
        .bind(&key)
        .fetch_optional(&db.pool)
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
        Err(StoreError::AlreadyExists {
            what: "run",
            id: new.run_id.to_string(),
            hint: "run ids are unique; use a fresh id",
        })
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
        i64_of(a.expected_seq, "expected seq")?;
        let (tx, rx) = oneshot::channel();
        self.inner
            .jobs
            .send((a, tx))
            .await
            .map_err(|_| unavailable("the group-commit writer stopped".into()))?;
        rx.await.map_err(|_| {
            unavailable(
                "the group-commit writer stopped before answering; retry with the same append id"
                    .into(),
            )
        })?
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
        let db = self.db();
        let next: Option<i64> =
            sqlx::query_scalar(db.sql("SELECT next_seq FROM {s}.runs WHERE run_id = $1"))
                .bind(run.as_str())
                .fetch_optional(&db.pool)
                .await
                .map_err(map_err)?;
        let len = next.ok_or_else(|| StoreError::not_found("run", run))? as u64;
        if from_seq > len {
            return Err(StoreError::InvalidInput(format!(
                "read from seq {from_seq} is past the end of run {run} (next seq {len})"
            )));
        }
        if from_seq == len {
            return Ok(Vec::new());
        }
        let end = from_seq.saturating_add(max as u64).min(len);
        let rows = sqlx::query(db.sql(
            "SELECT first_seq, count, at, version, body FROM {s}.events \
             WHERE run_id = $1 AND first_seq < $3 AND first_seq >= \
               (SELECT coalesce(max(first_seq), 0) FROM {s}.events WHERE run_id = $1 AND first_seq <= $2) \
             ORDER BY first_seq",
        ))
        .bind(run.as_str())
        .bind(from_seq as i64)
        .bind(end as i64)
        .fetch_all(&db.pool)
        .await
        .map_err(map_err)?;
        let mut out = Vec::with_capacity((end - from_seq) as usize);
        for row in rows {
            let first: i64 = row.try_get(0).map_err(map_err)?;
            let count: i32 = row.try_get(1).map_err(map_err)?;
            let at: i64 = row.try_get(2).map_err(map_err)?;
            let version: i16 = row.try_get(3).map_err(map_err)?;
            let body: &[u8] = row.try_get(4).map_err(map_err)?;
            let first = first as u64;
            let version = u16::try_from(version).unwrap_or(u16::MAX);
            let count = usize::try_from(count).map_err(|_| StoreError::Corrupt {
                run: run.clone(),
                seq: first,
                reason: format!("row header says {count} events"),
            })?;
            let events = decode_batch(run, first, version, body, count)?;
            for (i, event) in events.into_iter().enumerate() {
                let seq = first + i as u64;
                if seq >= from_seq && seq < end {
                    out.push(StoredEvent {
                        seq,
                        at: Timestamp(at),
                        event,
                    });
                }
            }
        }
        if out.first().is_some_and(|e| e.seq != from_seq)
            || out.windows(2).any(|w| w[1].seq != w[0].seq + 1)
            || out.len() as u64 != end - from_seq
        {
            return Err(StoreError::Corrupt {
                run: run.clone(),
                seq: from_seq,
                reason: format!(
                    "the journal rows do not cover seqs {from_seq}..{end} contiguously"
                ),
            });
        }
        Ok(out)
    }

    async fn get_run(&self, run: &RunId) -> Result<RunRecord, StoreError> {
        let db = self.db();
        let row = sqlx::query(db.sql(&format!(
            "SELECT {RUN_COLS} FROM {{s}}.runs r WHERE r.run_id = $1"
        )))
        .bind(run.as_str())
        .fetch_optional(&db.pool)
        .await
        .map_err(map_err)?
        .ok_or_else(|| StoreError::not_found("run", run))?;
        run_from_row(&row)
    }

    async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        let db = self.db();
        let limit = (query.limit > 0).then(|| i64::try_from(query.limit).unwrap_or(i64::MAX));
        let rows = sqlx::query(db.sql(&format!(
            "SELECT {RUN_COLS} FROM {{s}}.runs r \
             WHERE ($1::text IS NULL OR r.session_id = $1) \
               AND ($2::text IS NULL OR r.status = $2) \
               AND ($3::text IS NULL OR r.deployment_id = $3) \
             ORDER BY r.created_at, r.run_id COLLATE \"C\" LIMIT $4"
        )))
        .bind(query.session.as_ref().map(|s| s.as_str()))
        .bind(query.status.map(RunStatus::as_str))
        .bind(query.deployment.as_ref().map(|d| d.as_str()))
        .bind(limit)
        .fetch_all(&db.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(run_from_row).collect()
    }

    async fn answer(
        &self,
        request: &RequestId,
        response: InputResponse,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        let db = self.db();
        let run_id: Option<String> =
            sqlx::query_scalar(db.sql("SELECT run_id FROM {s}.requests WHERE request_id = $1"))
                .bind(request.as_str())
                .fetch_optional(&db.pool)
                .await
                .map_err(map_err)?;
        let run_id = RunId::new(run_id.ok_or_else(|| StoreError::not_found("request", request))?);
        let mut tx = db.begin().await?;
        // Lock order everywhere: the run row first, then the request row.
        let locked = db
            .lock_run(&mut tx, &run_id, None)
            .await?
            .ok_or_else(|| StoreError::not_found("run", &run_id))?;
        let row = sqlx::query(db.sql(
            "SELECT run_id, state, response, answer_seq, request FROM {s}.requests \
             WHERE request_id = $1 FOR UPDATE",
        ))
        .bind(request.as_str())
        .fetch_one(&mut *tx)
        .await
        .map_err(map_err)?;
        let state: String = row.try_get("state").map_err(map_err)?;
        match state.as_str() {
            "answered" => {
                let prev: Option<Vec<u8>> = row.try_get("response").map_err(map_err)?;
                let prev: InputResponse = decode_json("response", &prev.unwrap_or_default())?;
                let seq: Option<i64> = row.try_get("answer_seq").map_err(map_err)?;
                return if prev == response {
                    Ok(Delivered {
                        run: run_id,
                        seq: seq.unwrap_or(0) as u64,
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
            "pending" => {}
            other => return Err(bad_row("request state", other)),
        }
        let req_body: Vec<u8> = row.try_get("request").map_err(map_err)?;
        let req: InputRequest = decode_json("request", &req_body)?;
        req.accepts(&response)
            .map_err(|reason| StoreError::InvalidAnswer {
                request: request.clone(),
                reason,
            })?;
        if locked.run.status.is_terminal() {
            return Err(StoreError::Withdrawn {
                request: request.clone(),
            });
        }
        let event = Event::InputAnswered {
            request_id: request.clone(),
            response: response.clone(),
        };
        check_limits(std::slice::from_ref(&event))?;
        let (seq, _) = db
            .write(&mut tx, &locked.run, vec![event], now, None)
            .await?;
        let resp = serde_json::to_vec(&response)
            .map_err(|e| StoreError::InvalidInput(format!("response does not serialize: {e}")))?;
        sqlx::query(db.sql(
            "UPDATE {s}.requests SET state = 'answered', response = $2, answer_seq = $3 WHERE request_id = $1",
        ))
        .bind(request.as_str())
        .bind(&resp)
        .bind(seq as i64)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
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
        eve_core::store::check_hook_delivery(token, dedupe_key)?;
        let db = self.db();
        let hook_q = db.sql("SELECT run_id, cmd FROM {s}.hooks WHERE token = $1");
        let hook: Option<(String, i64)> = sqlx::query_as(AssertSqlSafe(hook_q.0.clone()))
            .bind(token)
            .fetch_optional(&db.pool)
            .await
            .map_err(map_err)?;
        let (run_id, _) = hook.ok_or_else(|| StoreError::not_found("hook token", token))?;
        let run_id = RunId::new(run_id);
        let mut tx = db.begin().await?;
        let locked = db
            .lock_run(&mut tx, &run_id, None)
            .await?
            .ok_or_else(|| StoreError::not_found("run", &run_id))?;
        // Re-read under the run lock: the run may have ended (tokens released) meanwhile.
        let hook: Option<(String, i64)> = sqlx::query_as(AssertSqlSafe(hook_q.0))
            .bind(token)
            .fetch_optional(&mut *tx)
            .await
            .map_err(map_err)?;
        let cmd = match hook {
            Some((r, cmd)) if r == run_id.as_str() => cmd,
            _ => return Err(StoreError::not_found("hook token", token)),
        };
        if let Some(key) = dedupe_key {
            let seq: Option<i64> = sqlx::query_scalar(db.sql(
                "SELECT seq FROM {s}.hook_dedupe WHERE run_id = $1 AND cmd = $2 AND key = $3",
            ))
            .bind(run_id.as_str())
            .bind(cmd)
            .bind(key)
            .fetch_optional(&mut *tx)
            .await
            .map_err(map_err)?;
            if let Some(seq) = seq {
                return Ok(Delivered {
                    run: run_id,
                    seq: seq as u64,
                    duplicate: true,
                });
            }
        }
        let event = Event::HookReceived {
            cmd: cmd as u64,
            payload,
        };
        check_limits(std::slice::from_ref(&event))?;
        let (seq, _) = db
            .write(&mut tx, &locked.run, vec![event], now, None)
            .await?;
        if let Some(key) = dedupe_key {
            sqlx::query(db.sql(
                "INSERT INTO {s}.hook_dedupe (run_id, cmd, key, seq) VALUES ($1, $2, $3, $4)",
            ))
            .bind(run_id.as_str())
            .bind(cmd)
            .bind(key)
            .bind(seq as i64)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
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
        let db = self.db();
        let mut tx = db.begin().await?;
        let locked = db
            .lock_run(&mut tx, run, None)
            .await?
            .ok_or_else(|| StoreError::not_found("run", run))?;
        if locked.run.status.is_terminal() {
            return Ok(CancelOutcome::AlreadyEnded {
                status: locked.run.status,
            });
        }
        if locked.run.cancel_requested {
            return Ok(CancelOutcome::AlreadyRequested);
        }
        let event = Event::CancelRequested {
            reason: reason.to_owned(),
        };
        check_limits(std::slice::from_ref(&event))?;
        let (seq, _) = db
            .write(&mut tx, &locked.run, vec![event], now, None)
            .await?;
        tx.commit().await.map_err(map_err)?;
        Ok(CancelOutcome::Requested { seq })
    }

    async fn resolve_blocked(
        &self,
        run: &RunId,
        resolution: Resolution,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        let db = self.db();
        let mut tx = db.begin().await?;
        let locked = db
            .lock_run(&mut tx, run, None)
            .await?
            .ok_or_else(|| StoreError::not_found("run", run))?;
        let status = locked.run.status;
        if status != RunStatus::Blocked {
            return Err(StoreError::InvalidInput(format!(
                "run {run} is {}, not blocked; only a blocked run can be resumed or failed this way",
                status.as_str()
            )));
        }
        let events = match resolution {
            Resolution::Resume => vec![Event::RunResumed],
            Resolution::Fail { error } => {
                let pending: Vec<String> = sqlx::query_scalar(db.sql(
                    "SELECT request_id FROM {s}.requests WHERE run_id = $1 AND state = 'pending' \
                     ORDER BY cmd, request_id COLLATE \"C\"",
                ))
                .bind(run.as_str())
                .fetch_all(&mut *tx)
                .await
                .map_err(map_err)?;
                let mut events: Vec<Event> = pending
                    .into_iter()
                    .map(|r| Event::InputWithdrawn {
                        request_id: RequestId::new(r),
                    })
                    .collect();
                events.push(Event::RunFailed { error });
                events
            }
        };
        let (seq, _) = db.write(&mut tx, &locked.run, events, now, None).await?;
        tx.commit().await.map_err(map_err)?;
        Ok(seq)
    }

    async fn pending_requests(
        &self,
        session: &SessionId,
    ) -> Result<Vec<PendingRequest>, StoreError> {
        let db = self.db();
        let rows = sqlx::query(db.sql(
            "SELECT request_id, run_id, session_id, cmd, request, requested_at FROM {s}.requests \
             WHERE session_id = $1 AND state = 'pending' ORDER BY requested_at, request_id COLLATE \"C\"",
        ))
        .bind(session.as_str())
        .fetch_all(&db.pool)
        .await
        .map_err(map_err)?;
        rows.iter()
            .map(|row| {
                let body: Vec<u8> = row.try_get("request").map_err(map_err)?;
                Ok(PendingRequest {
                    request_id: RequestId::new(
                        row.try_get::<String, _>("request_id").map_err(map_err)?,
                    ),
                    run_id: RunId::new(row.try_get::<String, _>("run_id").map_err(map_err)?),
                    session_id: row
                        .try_get::<String, _>("session_id")
                        .map_err(map_err)?
                        .into(),
                    cmd: row.try_get::<i64, _>("cmd").map_err(map_err)? as u64,
                    request: decode_json("request", &body)?,
                    requested_at: Timestamp(row.try_get("requested_at").map_err(map_err)?),
                })
            })
            .collect()
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
        let db = self.db();
        let rows = sqlx::query(db.sql(
            "SELECT seq, at, run_id, call_id, body FROM {s}.session_log \
             WHERE session_id = $1 AND seq >= $2 ORDER BY seq LIMIT $3",
        ))
        .bind(session.as_str())
        .bind(i64::try_from(from_seq).unwrap_or(i64::MAX))
        .bind(i64::try_from(max).unwrap_or(i64::MAX))
        .fetch_all(&db.pool)
        .await
        .map_err(map_err)?;
        rows.iter()
            .map(|row| {
                let seq = row.try_get::<i64, _>("seq").map_err(map_err)? as u64;
                let run_id = RunId::new(row.try_get::<String, _>("run_id").map_err(map_err)?);
                let body: &[u8] = row.try_get("body").map_err(map_err)?;
                let event: SessionEvent =
                    serde_json::from_slice(body).map_err(|e| StoreError::Corrupt {
                        run: run_id.clone(),
                        seq,
                        reason: format!(
                            "undecodable session log entry {seq} of session {session}: {e}"
                        ),
                    })?;
                Ok(SessionEntry {
                    session_id: session.clone(),
                    seq,
                    at: Timestamp(row.try_get("at").map_err(map_err)?),
                    run_id,
                    call_id: row.try_get::<String, _>("call_id").map_err(map_err)?.into(),
                    event,
                })
            })
            .collect()
    }

    async fn register_worker(
        &self,
        worker: &WorkerId,
        deployment: &DeploymentId,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        eve_core::store::check_worker_ids(worker, deployment)?;
        let db = self.db();
        let expires_at = now.plus(ttl);
        let mut tx = db.begin().await?;
        let epoch: i64 = sqlx::query_scalar(db.sql(
            "INSERT INTO {s}.workers (worker_id, deployment_id, epoch, expires_at, retired) \
             VALUES ($1, $2, 1, $3, FALSE) \
             ON CONFLICT (worker_id) DO UPDATE SET deployment_id = excluded.deployment_id, \
               epoch = {s}.workers.epoch + 1, expires_at = excluded.expires_at, retired = FALSE \
             RETURNING epoch",
        ))
        .bind(worker.as_str())
        .bind(deployment.as_str())
        .bind(expires_at.0)
        .fetch_one(&mut *tx)
        .await
        .map_err(map_err)?;
        // An earlier epoch's runs are orphaned now: wake idle workers to take them.
        if epoch > 1 {
            db.notify(&mut tx, deployment).await?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(Lease {
            worker: worker.clone(),
            deployment: deployment.clone(),
            epoch: epoch as u64,
            expires_at,
        })
    }

    async fn heartbeat(
        &self,
        lease: &Lease,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        let db = self.db();
        let expires_at = now.plus(ttl);
        let row: Option<(String, i64)> = sqlx::query_as(db.sql(
            "UPDATE {s}.workers SET expires_at = $3 \
             WHERE worker_id = $1 AND epoch = $2 AND NOT retired RETURNING deployment_id, epoch",
        ))
        .bind(lease.worker.as_str())
        .bind(i64_of(lease.epoch, "epoch")?)
        .bind(expires_at.0)
        .fetch_optional(&db.pool)
        .await
        .map_err(map_err)?;
        match row {
            Some((deployment, epoch)) => Ok(Lease {
                worker: lease.worker.clone(),
                deployment: deployment.into(),
                epoch: epoch as u64,
                expires_at,
            }),
            None => {
                let exists: bool = sqlx::query_scalar(
                    db.sql("SELECT EXISTS (SELECT 1 FROM {s}.workers WHERE worker_id = $1)"),
                )
                .bind(lease.worker.as_str())
                .fetch_one(&db.pool)
                .await
                .map_err(map_err)?;
                Err(if exists {
                    fenced(lease, "")
                } else {
                    StoreError::not_found("worker", &lease.worker)
                })
            }
        }
    }

    async fn claim(
        &self,
        lease: &Lease,
        max: usize,
        now: Timestamp,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let db = self.db();
        let mut tx = db.begin().await?;
        let w: Option<(i64, bool, i64)> = sqlx::query_as(db.sql(
            "SELECT epoch, retired, expires_at FROM {s}.workers WHERE worker_id = $1 FOR SHARE",
        ))
        .bind(lease.worker.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        match w {
            Some((epoch, false, expires)) if epoch as u64 == lease.epoch && expires > now.0 => {}
            _ => return Err(fenced(lease, "")),
        }
        if max == 0 {
            return Ok(Vec::new());
        }
        // Runs locked by a write in flight are skipped (SKIP LOCKED) so claimers never queue
        // behind each other; if that left the claim short, the skipped candidates are locked
        // (waiting for those writes) and re-checked with a fresh snapshot, so a claim never
        // misses a run that was claimable before the write that held it.
        let mut out = db.claim_rows(&mut tx, lease, max, now, None, &[]).await?;
        if out.len() < max {
            let taken: Vec<String> = out.iter().map(|(_, r)| r.run_id.to_string()).collect();
            let skipped: Vec<String> = sqlx::query_scalar(db.sql(&format!(
                "SELECT r.run_id FROM {{s}}.runs r LEFT JOIN {{s}}.workers w ON w.worker_id = r.owner_worker \
                 WHERE {CLAIMABLE} AND NOT (r.run_id = ANY($4)) \
                 ORDER BY {CLAIM_KEY}, r.ord LIMIT $3"
            )))
            .bind(lease.deployment.as_str())
            .bind(now.0)
            .bind(i64::try_from(max - out.len()).unwrap_or(i64::MAX))
            .bind(&taken)
            .fetch_all(&mut *tx)
            .await
            .map_err(map_err)?;
            if !skipped.is_empty() {
                sqlx::query(db.sql(
                    "SELECT 1 FROM {s}.runs WHERE run_id = ANY($1) ORDER BY run_id FOR UPDATE",
                ))
                .bind(&skipped)
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
                let more = db
                    .claim_rows(&mut tx, lease, max - out.len(), now, Some(&skipped), &taken)
                    .await?;
                out.extend(more);
            }
        }
        tx.commit().await.map_err(map_err)?;
        out.sort_by_key(|(k, _)| *k);
        Ok(out.into_iter().map(|(_, r)| r).collect())
    }

    async fn release(
        &self,
        lease: &Lease,
        run: &RunId,
        processed_seq: u64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let db = self.db();
        let mut tx = db.begin().await?;
        let locked = db
            .lock_run(&mut tx, run, None)
            .await?
            .ok_or_else(|| StoreError::not_found("run", run))?;
        let r = &locked.run;
        if r.owner.as_ref() != Some(&(lease.worker.clone(), lease.epoch))
            || locked.owner_lease != Some((lease.epoch, false))
        {
            return Err(fenced(lease, run.as_str()));
        }
        let processed = r.processed_seq.max(processed_seq.min(r.next_seq));
        let set_pending = processed != r.processed_seq;
        sqlx::query(db.sql(
            "UPDATE {s}.runs SET owner_worker = NULL, owner_epoch = NULL, updated_at = $2, \
               processed_seq = $3, \
               pending_at = CASE WHEN NOT $4 THEN pending_at WHEN $3 >= next_seq THEN NULL \
                 ELSE (SELECT e.at FROM {s}.events e WHERE e.run_id = $1 AND e.first_seq <= $3 \
                       ORDER BY e.first_seq DESC LIMIT 1) END \
             WHERE run_id = $1",
        ))
        .bind(run.as_str())
        .bind(now.0)
        .bind(processed as i64)
        .bind(set_pending)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        if db.has_work(&mut tx, run).await? {
            db.notify(&mut tx, &r.deployment_id).await?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(())
    }

    async fn retire_worker(&self, lease: &Lease, _now: Timestamp) -> Result<(), StoreError> {
        let db = self.db();
        let mut tx = db.begin().await?;
        let w: Option<(i64, bool)> = sqlx::query_as(
            db.sql("SELECT epoch, retired FROM {s}.workers WHERE worker_id = $1 FOR UPDATE"),
        )
        .bind(lease.worker.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        match w {
            Some((epoch, false)) if epoch as u64 == lease.epoch => {}
            _ => return Err(fenced(lease, "")),
        }
        // The runs it still holds keep naming it: orphaned, they are claimable at once.
        sqlx::query(db.sql("UPDATE {s}.workers SET retired = TRUE WHERE worker_id = $1"))
            .bind(lease.worker.as_str())
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        db.notify(&mut tx, &lease.deployment).await?;
        tx.commit().await.map_err(map_err)?;
        Ok(())
    }

    async fn next_wake(
        &self,
        deployment: &DeploymentId,
        now: Timestamp,
    ) -> Result<Option<Timestamp>, StoreError> {
        let db = self.db();
        let at: Option<i64> = sqlx::query_scalar(db.sql(concat!(
            "SELECT min(",
            claim_key!(),
            ") FROM {s}.runs r LEFT JOIN {s}.workers w ON w.worker_id = r.owner_worker \
             WHERE r.deployment_id = $1 AND r.status = 'running' AND NOT ",
            held!()
        )))
        .bind(deployment.as_str())
        .bind(now.0)
        .fetch_one(&db.pool)
        .await
        .map_err(map_err)?;
        Ok(at.map(Timestamp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_dispatch_unambiguously() {
        let run = WatchKey::Run(RunId::new("d:x"));
        let session = WatchKey::Session(SessionId::new("r:y"));
        let dep = DeploymentId::new("s:z");
        assert_eq!(Wake::parse(&key_payload(&run)), Wake::Key(run));
        assert_eq!(Wake::parse(&key_payload(&session)), Wake::Key(session));
        assert_eq!(Wake::parse(&deployment_payload(&dep)), Wake::Workers);
        // An older version's bare deployment id, and ids too long for a NOTIFY: everyone.
        assert_eq!(Wake::parse("my-deployment"), Wake::All);
        let long = WatchKey::Session(SessionId::new("x".repeat(MAX_PAYLOAD)));
        assert_eq!(key_payload(&long), WAKE_ALL);
        assert_eq!(Wake::parse(WAKE_ALL), Wake::All);
    }

    #[test]
    fn store_id_names_host_port_database_and_schema_only() {
        let o = PgConnectOptions::from_str("postgres://alice:secret@db.example:6543/prod")
            .expect("url");
        assert_eq!(store_id(&o, "eve"), "postgres://db.example:6543/prod#eve");
        let o = PgConnectOptions::from_str("postgres://bob@db.example/prod").expect("url");
        assert_eq!(
            store_id(&o, "eve_b"),
            "postgres://db.example:5432/prod#eve_b"
        );
    }
}
