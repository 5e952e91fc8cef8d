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
//! | `hook_dedupe` | `(run_id, cmd, key)`; indexed by `(token, key)` | accepted deliveries by dedupe key, kept after the run ended (a retry is answered as a duplicate) until it is purged |
//! | `requests` | `request_id` | input requests: pending, answered (with the response), withdrawn |
//! | `session_heads`, `session_log` | `session_id`; `(session_id, seq)` | the session log |
//! | `workers` | `worker_id` | leases: deployment, epoch, expiry, retired |
//! | `api_keys` | `id`; unique `hash` | API keys: name, scope, created_at, revoked_at, expires_at (contract clause 8) |
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
//! The hot path runs in the server, as two PL/pgSQL functions (migration 5), so that a write
//! costs one round trip instead of one per statement:
//!
//! - `eve_write(run, …, fx jsonb, channel)` writes events with their effects (the client
//!   encodes the [`eve_core::Effects`] as `fx`) and sends their NOTIFYs (a delivery's too:
//!   see "Wake-ups"). Cancels and
//!   resolutions call it inside their own transaction, after their own locks and checks.
//! - `eve_deliver_hook` and `eve_answer` are a hook delivery and an answer after the one read
//!   that finds the token's run (or the request, whose answer is checked in the client): they
//!   lock the run, re-check what that read found (the token still the run's hook and the dedupe
//!   key unused; the request still pending and the run not ended) and write through
//!   `eve_write`. From a delivery to the next step's result recorded, a resume therefore costs
//!   two committed round trips (the delivery's statement and the step's append) and two reads
//!   (the delivery's lookup and the worker's read of the new event).
//! - `eve_append(run, append_id, expected_seq, worker, epoch, …)` is one worker append: it locks
//!   and reads the run row in one statement (a single-table `SELECT … FOR UPDATE` that waited
//!   for the lock returns the row as its holder left it), then reads the landed-append lookup
//!   and the worker's lease in one more (a fresh snapshot: each statement of a function takes
//!   one), runs the checks in `MemoryStore`'s order and writes through `eve_write`, which runs
//!   a statement only for the effects an append has (migration 8). A failed check writes
//!   nothing and comes back as an outcome row, not an error.
//!
//! Worker appends go through a **group commit**: [`PostgresOptions::writers`] writer tasks each
//! take every append queued (up to [`PostgresOptions::max_batch`]), sort them by run id (so
//! writers lock rows in one order and never deadlock on each other) and apply them in **one
//! statement**: one round trip and one commit for the whole batch, with no `BEGIN`/`COMMIT` of
//! its own. That statement calls `eve_append_batch`
//! (migration 9), which locks the batch's runs in run id order and applies its **plain**
//! appends set-based: one append per run, effects limited to the count, status, cancel and
//! timers (the common step result) — one read checks them all in `eve_append`'s order and one
//! statement per table writes them. The other appends (hooks, requests, session events,
//! attributes, a run's end, a run appearing twice) go through `eve_append`, in order; one that
//! creates a hook token twice does too, in a subtransaction undone when its checks pass, and is
//! refused with that token (`AlreadyExists`), so its other refusals come first. A step
//! thus costs the server a share of a handful of statements instead of about five of its own.
//! A run's start is likewise one statement
//! (session row, run row, eager claim, journal row, wake-up). If a batch's statement fails (a
//! deadlock with a delivery, a lost connection), each of its appends is retried alone, so one
//! append's failure never fails another, and an append that had landed after all is answered as
//! a duplicate by its append id. Deliveries, claims and releases are their own transactions.
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
//! running runs that no valid lease holds. Neither reads every running run: the candidates come
//! through indexes (migration 10) — runs with an event pending, due timers, and the runs of
//! workers whose lease is gone — so their cost does not grow with the runs parked on a wait.
//!
//! A claim is one statement in the common case: it checks the lease (locking the worker row `FOR
//! SHARE`, so a re-registration or retirement waits for it), locks candidate runs with `FOR
//! UPDATE SKIP LOCKED` (claimers never queue behind each other) and lists the claimable runs it
//! skipped. Only when that left the claim short are the skipped ones (runs locked by a delivery
//! or append in flight) locked in a second transaction, waiting for that write, and re-checked,
//! so a claim never misses a run that was claimable before the write began (a Postgres test
//! holds a run's row to check this).
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
//! # Code layout
//!
//! `config` (options, connecting, migrations via `schema`, the store id), `schema` (migrations,
//! with the `eve_write` and `eve_append` functions), `commit` (starts, the group-commit writers,
//! run locks, the effects encoded for `eve_write`, append outcomes), `claims` (workers, leases, claims, releases, retirement, `next_wake`), `deliveries`
//! (answers, hooks, cancels, resolutions), `reads` (journals, records, queries, pending
//! requests, the session log) and `wake` (LISTEN/NOTIFY); the [`JournalStore`] impl in this file
//! only delegates to them.
//!
//! # Capability checklist
//!
//! - [x] linearizable, fenced, idempotent appends (row lock + append id), group commit in one
//!   statement per batch
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
//! - [x] one live holder per worker id (clause 11): `pg_try_advisory_lock` of a hash of schema
//!   and id, on a connection of its own per worker (its `application_name` names the process:
//!   pid, host), checked every 5 s and taken again after a lost connection; the server frees it
//!   when the process dies, so a restart after a crash gets it at once. A refusal reads the
//!   holder from `pg_locks` and `pg_stat_activity`. One more connection per worker.

use async_trait::async_trait;
use eve_core::{
    ApiKey, Append, Appended, CancelOutcome, CreatedRun, Delivered, DeploymentId, InputResponse,
    JournalStore, Lease, NewRun, Payload, PendingRequest, QueuedMessage, RequestId, Resolution,
    RunId, RunQuery, RunRecord, SessionEnd, SessionEntry, SessionId, SessionRecord, StoreError,
    StoredEvent, Timestamp, WatchHub, WatchKey, WorkerId,
};
use sqlx::{AssertSqlSafe, PgPool};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, OnceCell};

mod claims;
mod commit;
mod config;
mod deliveries;
mod error;
mod keys;
mod reads;
mod retention;
mod schema;
mod sessions;
mod wake;
mod worker_lock;

use commit::Job;
pub use config::PostgresOptions;
use error::{map_err, BACKEND};
pub use schema::{drop_schema, SCHEMA_VERSION};
use wake::Listener;
pub use wake::Wakeups;

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

impl PostgresStore {
    /// The schema this store lives in.
    pub fn schema(&self) -> &str {
        &self.inner.db.schema
    }

    /// The NOTIFY channel of this schema (`eve_<schema>`).
    pub fn channel(&self) -> &str {
        &self.inner.db.channel
    }

    fn db(&self) -> &Db {
        &self.inner.db
    }
}

impl Db {
    /// The statement with `{s}` replaced by the quoted schema.
    fn sql(&self, template: &str) -> AssertSqlSafe<String> {
        AssertSqlSafe(template.replace("{s}", &self.quoted))
    }

    async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
        self.pool.begin().await.map_err(map_err)
    }
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

    async fn lock_worker(&self, worker: &WorkerId) -> Result<eve_core::WorkerLock, StoreError> {
        self.db().lock_worker(worker).await
    }

    async fn create_key(&self, key: ApiKey) -> Result<(), StoreError> {
        self.db().create_key(key).await
    }

    async fn list_keys(&self) -> Result<Vec<ApiKey>, StoreError> {
        self.db().list_keys().await
    }

    async fn revoke_key(&self, id: &str, now: Timestamp) -> Result<ApiKey, StoreError> {
        self.db().revoke_key(id, now).await
    }

    async fn key_by_hash(&self, hash: &str) -> Result<Option<ApiKey>, StoreError> {
        self.db().key_by_hash(hash).await
    }

    async fn purge(&self, ended_before: Timestamp, limit: usize) -> Result<usize, StoreError> {
        self.db().purge(ended_before, limit).await
    }

    async fn end_session(
        &self,
        session: &SessionId,
        now: Timestamp,
    ) -> Result<SessionEnd, StoreError> {
        self.db().end_session(session, now).await
    }

    async fn get_session(&self, session: &SessionId) -> Result<SessionRecord, StoreError> {
        self.db().get_session(session).await
    }

    async fn queue_message(
        &self,
        session: &SessionId,
        message: Payload,
        now: Timestamp,
    ) -> Result<QueuedMessage, StoreError> {
        self.db().queue_message(session, message, now).await
    }

    async fn take_messages(&self, session: &SessionId) -> Result<Vec<QueuedMessage>, StoreError> {
        self.db().take_messages(session).await
    }

    async fn create_run(&self, new: NewRun, now: Timestamp) -> Result<CreatedRun, StoreError> {
        self.db().create_run(new, None, now).await
    }

    async fn create_run_claimed(
        &self,
        new: NewRun,
        lease: &Lease,
        now: Timestamp,
    ) -> Result<CreatedRun, StoreError> {
        self.db().create_run(new, Some(lease), now).await
    }

    async fn append(&self, a: Append) -> Result<Appended, StoreError> {
        commit::submit(&self.inner.jobs, a).await
    }

    async fn read(
        &self,
        run: &RunId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.db().read(run, from_seq, max).await
    }

    async fn get_run(&self, run: &RunId) -> Result<RunRecord, StoreError> {
        self.db().get_run(run).await
    }

    async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        self.db().list_runs(query).await
    }

    async fn answer(
        &self,
        request: &RequestId,
        response: InputResponse,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        self.db().answer(request, response, now).await
    }

    async fn deliver_hook(
        &self,
        token: &str,
        payload: Payload,
        dedupe_key: Option<&str>,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        self.db()
            .deliver_hook(token, payload, dedupe_key, now)
            .await
    }

    async fn request_cancel(
        &self,
        run: &RunId,
        reason: &str,
        now: Timestamp,
    ) -> Result<CancelOutcome, StoreError> {
        self.db().request_cancel(run, reason, now).await
    }

    async fn resolve_blocked(
        &self,
        run: &RunId,
        resolution: Resolution,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        self.db().resolve_blocked(run, resolution, now).await
    }

    async fn pending_requests(
        &self,
        session: &SessionId,
    ) -> Result<Vec<PendingRequest>, StoreError> {
        self.db().pending_requests(session).await
    }

    async fn read_session(
        &self,
        session: &SessionId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<SessionEntry>, StoreError> {
        self.db().read_session(session, from_seq, max).await
    }

    async fn register_worker(
        &self,
        worker: &WorkerId,
        deployment: &DeploymentId,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        self.db()
            .register_worker(worker, deployment, ttl, now)
            .await
    }

    async fn heartbeat(
        &self,
        lease: &Lease,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        self.db().heartbeat(lease, ttl, now).await
    }

    async fn claim(
        &self,
        lease: &Lease,
        max: usize,
        now: Timestamp,
    ) -> Result<Vec<RunRecord>, StoreError> {
        self.db().claim(lease, max, now).await
    }

    async fn release(
        &self,
        lease: &Lease,
        run: &RunId,
        processed_seq: u64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.db().release(lease, run, processed_seq, now).await
    }

    async fn retire_worker(&self, lease: &Lease, _now: Timestamp) -> Result<(), StoreError> {
        self.db().retire_worker(lease).await
    }

    async fn next_wake(
        &self,
        deployment: &DeploymentId,
        now: Timestamp,
    ) -> Result<Option<Timestamp>, StoreError> {
        self.db().next_wake(deployment, now).await
    }
}
