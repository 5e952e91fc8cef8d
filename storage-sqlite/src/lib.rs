//! eve-storage-sqlite: [`SqliteStore`], the embedded [`JournalStore`] on one SQLite file (WAL;
//! writes on one rusqlite connection in a thread of its own, journal pages on rusqlite
//! connections of their own, other reads on a sqlx pool).
//!
//! ```no_run
//! # async fn demo() -> Result<(), eve_core::StoreError> {
//! use eve_storage_sqlite::{SqliteOptions, SqliteStore, Synchronous};
//! // Durable by default: synchronous = FULL.
//! let store = SqliteStore::open("journal.db").await?;
//! // Opt in to NORMAL for throughput (see "Durability" below).
//! let fast = SqliteStore::open_with(
//!     "fast.db",
//!     SqliteOptions { synchronous: Synchronous::Normal, ..SqliteOptions::default() },
//! )
//! .await?;
//! # let _ = (store, fast);
//! # Ok(()) }
//! ```
//!
//! # Schema
//!
//! Embedded migrations, applied on open inside `BEGIN IMMEDIATE` and recorded in `eve_schema`
//! (a file written by a newer build is refused with a message, never misread).
//!
//! | table | key | holds |
//! | --- | --- | --- |
//! | `runs` | `run_id`; unique `idempotency_key` | the [`RunRecord`] columns, `owner_worker`/`owner_epoch`, `pending_at` (time of the first unprocessed event), `timer_due` (earliest timer) and the generated `wake_at` (when a running run has work), indexed by `(deployment_id, wake_at)`, `session_id`, `status`, owner |
//! | `events` | `(run_id, first_seq)`; unique `(run_id, append_id)` | **one row per append**: `count`, `at`, codec `version`, `body` = the events as one JSON array ([`eve_core::codec`]) |
//! | `timers` | `(run_id, cmd)` | `due` |
//! | `hooks` | `token` | live hooks: `run_id`, `cmd`, `webhook` |
//! | `hook_dedupe` | `(run_id, cmd, key)`; indexed by `(token, key)` | `seq` of the accepted delivery and the hook's `token`, kept after the run ended (a retry is answered as a duplicate) until it is purged |
//! | `requests` | `request_id` | `state` pending / answered / withdrawn, the request, the response and its seq |
//! | `session_log` | `(session_id, seq)` | session channel entries |
//! | `session_heads` | `session_id` | `next_seq` floor of a log whose tail [`purge`](eve_core::JournalStore::purge) deleted |
//! | `workers` | `worker_id` | `deployment`, `epoch`, `expires_at`, `retired` |
//! | `api_keys` | `id`; unique `hash` | `name`, `scope`, `created_at`, `revoked_at`, `expires_at` (contract clause 8) |
//!
//! Every index change is derived from [`eve_core::Effects::of`], as `MemoryStore` does; when
//! events end a run its hooks are released, its pending requests withdrawn, its timers dropped
//! and its owner cleared, in the same transaction. No foreign keys: every write goes through
//! the writer, which keeps the tables consistent, and a key check per insert would cost time.
//!
//! A page read is one statement on a rusqlite connection, run on tokio's blocking threads: its
//! rows are stepped through one by one and each body is decoded where SQLite holds it, straight
//! into the page ([`eve_core::codec::decode_batch_each`]), with no copy of the page as a whole.
//! Reading from a seq inside a row decodes the row and skips the events before it. A row that
//! does not decode (unknown codec version, bytes that are not the events its header counts) or
//! a gap between rows is [`StoreError::Corrupt`] naming the run and seq; nothing is changed.
//!
//! # Commit protocol
//!
//! Each handle runs one **writer thread** owning one connection (rusqlite). Every write
//! (create_run, append, answer, deliver_hook, request_cancel, resolve_blocked,
//! register/heartbeat/retire, claim, release) is sent to it over a channel. The
//! writer takes everything queued (up to [`SqliteOptions::max_batch`] ops), opens one
//! `BEGIN IMMEDIATE` transaction, and runs the ops in arrival order, in place: no channel hop per
//! statement. Each op first checks all its preconditions with reads inside that transaction and
//! writes nothing when one fails (Conflict, Fenced, a live hook token), so one run's conflict
//! never undoes another's append; then it runs its writes. Then one `COMMIT` (one fsync under
//! FULL) and every op is answered; an op is never acknowledged before its commit. A failed
//! commit answers every op of the batch with that error (`Unavailable` when transient): none of
//! them was applied. An op whose statement fails (a backend fault, not a contract answer such
//! as Conflict) abandons its batch the same way, since SQLite may have rolled the transaction
//! back on its own (full disk, I/O error). This is group commit: under load, many appends of
//! many runs share one transaction and one sync. The checks of a batch's appends are read in
//! one statement up front (an append's row is re-read when an earlier op of the batch may have
//! changed it), so a batched append costs its two or three write statements.
//!
//! Reads (read, get_run, list_runs, pending_requests, read_session, next_wake) go to separate
//! connections and see the last committed state (WAL readers do not block the writer): journal
//! pages to at most [`SqliteOptions::read_connections`] kept rusqlite connections at once, the
//! rest to a sqlx pool of that size.
//!
//! Several handles on one file — in one process or several — are safe: `BEGIN IMMEDIATE` takes
//! the file's write lock, so their batches serialize, and every precondition (expected seq,
//! lease epoch, idempotency key, hook token, dedupe key, request state) is checked inside the
//! transaction. Waiting for another handle's lock is bounded by
//! [`SqliteOptions::busy_timeout`]; past it the call fails `Unavailable` (retryable).
//!
//! # Durability: FULL vs NORMAL
//!
//! [`Synchronous::Full`] (the default) syncs the WAL at every commit: an acknowledged write (an
//! answered request, a step result) survives power loss and OS crashes. [`Synchronous::Normal`]
//! syncs only at checkpoints: still atomic and consistent, and it survives a crash of the
//! process, but the last commits before a power loss or OS crash may be lost — a step may run
//! again, an answered request may need answering again. Choose NORMAL only where that is
//! acceptable.
//!
//! Checkpoints (copying the WAL back into the database file) run on a second connection beside
//! the writer, every 100 of its commits, instead of inside one of its commits as SQLite would do
//! by itself; the writer then copies the frames it added meanwhile, so the WAL starts over and
//! stays small.
//!
//! # Limits and figures
//!
//! Measured with `cargo run --release -p eve-storage-sqlite --example throughput` on a 2-core
//! machine: 16 runs appending batches of 16 events concurrently, about 75,000–100,000 events/s
//! under NORMAL and 58,000–66,000 under FULL, and a 10,000-event journal read and decoded from a
//! fresh handle at about 1,100,000–1,300,000 events/s, with other builds running (load 5–7); on
//! the same machine idle, one run gave 452,000 and 307,000 events/s and reads at 3,000,000
//! events/s (row-by-row page reads, December 2026).
//!
//! The contract's limits (≤ 100 events and ≤ 4 MiB of payload per append, 4 MiB per payload),
//! checked before anything is queued. One writer per handle: write throughput is bounded by one
//! connection's statements (two or three per batched append) and one sync per batch. Reads of a
//! page fetch the rows that cover it. Times are milliseconds since the epoch in `i64`; seqs are
//! stored as `i64`.
//!
//! # Capability checklist
//!
//! - [x] linearizable, fenced appends with append-id retries (guarantee 1)
//! - [x] answers, keyed hook deliveries, cancels, exactly once (2)
//! - [x] idempotent starts, also across handles (3)
//! - [x] hook tokens unique store-wide, released at run end (4)
//! - [x] claims with per-worker leases and epochs, earliest work first, across handles (5)
//! - [x] byte-for-byte paged reads, 4 MiB payloads (6)
//! - [x] queries by id, session, status, deployment; pending requests; session log (7)
//! - [x] several handles / processes on one file
//! - [x] one live holder per worker id (clause 11): an exclusive `flock` on
//!   `<db>.worker-<hash of the id>.lock` beside the file, holding the id and its holder (pid,
//!   host, since when) for a refused process to name; the OS frees it when the process dies,
//!   so a restart after a crash gets it at once; the holder deletes the file when it lets go.
//!   An in-memory database (one process) and non-Unix systems hold ids within the process.
//! - [x] notifications of other processes' writes (`PRAGMA data_version` read every 100 ms)

mod error;
mod keys;
mod lock;
mod pages;
mod retention;
mod rows;
mod schema;
mod sessions;
mod watch;
mod writer;

use crate::error::{map_sqlx, writer_gone, BACKEND};
use crate::rows::{run_cols, run_record, text, u64_col};
use async_trait::async_trait;
use eve_core::{
    check_limits, ApiKey, Append, Appended, CancelOutcome, CreatedRun, Delivered, DeploymentId,
    Event, InputRequest, InputResponse, JournalStore, Lease, NewRun, Payload, PendingRequest,
    QueuedMessage, RequestId, Resolution, RunId, RunQuery, RunRecord, SessionEnd, SessionEntry,
    SessionEvent, SessionId, SessionRecord, StoreError, StoredEvent, Timestamp, WatchHub, WatchKey,
    WorkerId,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Connection, Row, SqliteConnection};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use writer::{Op, Reply};

/// When SQLite syncs the write-ahead log to disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Synchronous {
    /// Sync at every commit: acknowledged writes survive power loss. The default.
    #[default]
    Full,
    /// Sync at checkpoints only: faster; the last commits may be lost on power loss or an OS
    /// crash (not on a process crash). See the crate docs.
    Normal,
}

impl Synchronous {
    /// The value of `PRAGMA synchronous`.
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }
}

/// How [`SqliteStore::open_with`] opens a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqliteOptions {
    /// WAL sync mode; [`Synchronous::Full`] by default.
    pub synchronous: Synchronous,
    /// How long a write waits for another handle's lock before failing `Unavailable`
    /// (default 5 s).
    pub busy_timeout: Duration,
    /// Connections for reads (default 4): the sqlx pool's size, and the journal-page reads
    /// that run at once (each on a connection kept open between reads).
    pub read_connections: u32,
    /// Most write ops folded into one transaction (default 256).
    pub max_batch: usize,
    /// The largest the database file may grow, in bytes (`PRAGMA max_page_count`, rounded
    /// down to whole pages, never below the file's current size). A write that needs more
    /// fails with [`StoreError::StorageFull`] naming the file, exactly as on a full disk, and
    /// succeeds again once space is freed (a [`JournalStore::purge`] frees pages for reuse).
    /// Default `None`: only the disk limits the file.
    pub max_size_bytes: Option<u64>,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(5),
            read_connections: 4,
            max_batch: 256,
            max_size_bytes: None,
        }
    }
}

/// A [`JournalStore`] on a SQLite file. Cheap to clone: clones share the writer thread and the
/// read pool. Open several handles on one file (or one per process) freely; see the crate docs
/// for the commit protocol that keeps them consistent.
///
/// Must be opened inside a tokio runtime (the read pool is sqlx's); the writer thread stops
/// when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    writer: mpsc::Sender<Op>,
    reads: SqlitePool,
    /// Journal pages ([`JournalStore::read`]), on rusqlite connections of their own.
    pages: Arc<pages::PageReads>,
    /// Wakes this process's idle workers after a delivery through any clone of this handle
    /// (other processes' writes are seen by the data-version watch).
    wake: eve_core::WakeSignal,
    /// Session-log and run watchers, woken by the writer after each commit (this process's
    /// writes; other processes' wake every watcher through the data-version watch).
    hub: WatchHub,
    /// [`JournalStore::store_id`]: the file's canonical path.
    id: Arc<str>,
    /// The database file's canonical path: worker lock files go beside it.
    path: Arc<Path>,
    /// Sees other processes' writes; see the `watch` module.
    _data_watch: Arc<watch::DataWatch>,
    /// The directory of an [`SqliteStore::in_memory`] store, removed with the last handle.
    _temp: Option<Arc<tempfile::TempDir>>,
}

impl SqliteStore {
    /// Opens (creating if missing) the database file at `path` with default options
    /// (synchronous = FULL) and applies migrations.
    ///
    /// # Errors
    /// `Unavailable` when the file is locked past the busy timeout; `Other` when it cannot be
    /// opened or its schema is newer than this build.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, SqliteOptions::default()).await
    }

    /// Opens the file at `path` with `options`; see [`SqliteOptions`].
    ///
    /// # Errors
    /// As [`SqliteStore::open`].
    pub async fn open_with(
        path: impl AsRef<Path>,
        options: SqliteOptions,
    ) -> Result<Self, StoreError> {
        let path = path.as_ref();
        // The same file opened from any directory or through a link gets one id; a file not
        // created yet gets its directory's canonical path.
        let id = std::fs::canonicalize(path)
            .or_else(|_| {
                let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
                std::fs::canonicalize(dir.unwrap_or(Path::new(".")))
                    .map(|d| d.join(path.file_name().unwrap_or_default()))
            })
            .unwrap_or_else(|_| path.to_path_buf());
        let file = Arc::<Path>::from(id.as_path());
        let id = format!("sqlite://{}", id.display());
        let connect = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match options.synchronous {
                Synchronous::Full => SqliteSynchronous::Full,
                Synchronous::Normal => SqliteSynchronous::Normal,
            })
            .busy_timeout(options.busy_timeout)
            .foreign_keys(false)
            .statement_cache_capacity(512);
        Self::start(connect, &options, id, file).await
    }

    /// A private database in a fresh temporary directory, deleted when the last clone of this
    /// handle is dropped: for quick tests. It is a file like any other (WAL, busy timeout), not
    /// SQLite's shared-cache memory mode, whose table locks fail a writer that meets a reader
    /// with `SQLITE_LOCKED` at once instead of waiting.
    ///
    /// # Errors
    /// `Other` if the directory cannot be created or SQLite cannot be initialised.
    pub async fn in_memory() -> Result<Self, StoreError> {
        let dir = tempfile::Builder::new()
            .prefix("eve-sqlite-")
            .tempdir()
            .map_err(|e| error::other(format!("cannot create a temporary directory: {e}")))?;
        let mut store =
            Self::open_with(dir.path().join("journal.db"), SqliteOptions::default()).await?;
        store._temp = Some(Arc::new(dir));
        Ok(store)
    }

    /// Opens the store on `connect` (the file at `path`): the migrations, the read pool, the
    /// writer thread on the same file, the data watch.
    async fn start(
        connect: SqliteConnectOptions,
        options: &SqliteOptions,
        id: String,
        path: Arc<Path>,
    ) -> Result<Self, StoreError> {
        let mut conn = SqliteConnection::connect_with(&connect)
            .await
            .map_err(map_sqlx)?;
        schema::migrate(&mut conn).await?;
        let max_page_count = match options.max_size_bytes {
            None => None,
            Some(bytes) => {
                let page: i64 = sqlx::query_scalar("PRAGMA page_size")
                    .fetch_one(&mut conn)
                    .await
                    .map_err(map_sqlx)?;
                Some((bytes / u64::try_from(page.max(512)).unwrap_or(4096)).max(1))
            }
        };
        let connect = match max_page_count {
            Some(pages) => connect.pragma("max_page_count", pages.to_string()),
            None => connect,
        };
        let reads = SqlitePoolOptions::new()
            .max_connections(options.read_connections.max(1))
            .min_connections(1)
            .connect_with(connect.clone())
            .await
            .map_err(map_sqlx)?;
        let max_batch = options.max_batch.max(1);
        let (tx, rx) = mpsc::channel(max_batch.saturating_mul(4));
        let hub = WatchHub::default();
        let wake = eve_core::WakeSignal::default();
        let commits = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let data_watch =
            Arc::new(watch::spawn(&connect, commits.clone(), wake.clone(), hub.clone()).await?);
        let writer = writer::WriterConfig {
            filename: connect.get_filename().to_string_lossy().into_owned(),
            synchronous: options.synchronous.pragma(),
            busy_timeout: options.busy_timeout,
            max_page_count,
        };
        let pages = Arc::new(pages::PageReads::new(
            writer.filename.clone(),
            options.busy_timeout,
            options.read_connections as usize,
        ));
        writer::spawn(&writer, rx, max_batch, hub.clone(), commits)?;
        let _ = sqlx::Connection::close(conn).await;
        Ok(Self {
            writer: tx,
            reads,
            pages,
            wake,
            hub,
            id: id.into(),
            path,
            _data_watch: data_watch,
            _temp: None,
        })
    }

    /// Sends an op to the writer and waits for its answer (after its batch committed).
    async fn call<T>(&self, op: impl FnOnce(Reply<T>) -> Op) -> Result<T, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.writer.send(op(tx)).await.map_err(|_| writer_gone())?;
        rx.await
            .map_err(|_| writer_gone())?
            .map_err(|e| self.located(e))
    }

    /// `e`, naming this store's file when it is a [`StoreError::StorageFull`].
    fn located(&self, e: StoreError) -> StoreError {
        error::locate(e, &self.path)
    }
}

fn seq_arg(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[async_trait]
impl JournalStore for SqliteStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn wakeups(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.wake.subscribe())
    }

    async fn watch(&self, key: &WatchKey) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.hub.subscribe(key))
    }

    fn store_id(&self) -> String {
        self.id.to_string()
    }

    async fn lock_worker(&self, worker: &WorkerId) -> Result<eve_core::WorkerLock, StoreError> {
        lock::lock_worker(&self.path, &self.id, worker)
    }

    async fn create_key(&self, key: ApiKey) -> Result<(), StoreError> {
        keys::create(&self.reads, key)
            .await
            .map_err(|e| self.located(e))
    }

    async fn list_keys(&self) -> Result<Vec<ApiKey>, StoreError> {
        keys::list(&self.reads).await
    }

    async fn revoke_key(&self, id: &str, now: Timestamp) -> Result<ApiKey, StoreError> {
        keys::revoke(&self.reads, id, now)
            .await
            .map_err(|e| self.located(e))
    }

    async fn key_by_hash(&self, hash: &str) -> Result<Option<ApiKey>, StoreError> {
        keys::by_hash(&self.reads, hash).await
    }

    async fn purge(&self, ended_before: Timestamp, limit: usize) -> Result<usize, StoreError> {
        retention::purge(&self.reads, ended_before, limit)
            .await
            .map_err(|e| self.located(e))
    }

    async fn end_session(
        &self,
        session: &SessionId,
        now: Timestamp,
    ) -> Result<SessionEnd, StoreError> {
        sessions::end(&self.reads, session, now)
            .await
            .map_err(|e| self.located(e))
    }

    async fn get_session(&self, session: &SessionId) -> Result<SessionRecord, StoreError> {
        sessions::get(&self.reads, session).await
    }

    async fn queue_message(
        &self,
        session: &SessionId,
        message: Payload,
        now: Timestamp,
    ) -> Result<QueuedMessage, StoreError> {
        sessions::queue(&self.reads, session, message, now)
            .await
            .map_err(|e| self.located(e))
    }

    async fn take_messages(&self, session: &SessionId) -> Result<Vec<QueuedMessage>, StoreError> {
        sessions::take(&self.reads, session)
            .await
            .map_err(|e| self.located(e))
    }

    async fn create_run(&self, run: NewRun, now: Timestamp) -> Result<CreatedRun, StoreError> {
        run.validate()?;
        let created = self
            .call(|r| Op::CreateRun(Box::new(run), None, now, r))
            .await?;
        self.wake.wake();
        Ok(created)
    }

    async fn create_run_claimed(
        &self,
        run: NewRun,
        lease: &Lease,
        now: Timestamp,
    ) -> Result<CreatedRun, StoreError> {
        run.validate()?;
        let lease = lease.clone();
        let created = self
            .call(|r| Op::CreateRun(Box::new(run), Some(lease), now, r))
            .await?;
        if created.run.owner.is_none() {
            self.wake.wake();
        }
        Ok(created)
    }

    async fn append(&self, append: Append) -> Result<Appended, StoreError> {
        check_limits(&append.events)?;
        if append
            .events
            .iter()
            .any(|e| matches!(e, Event::RunStarted { .. }))
        {
            return Err(StoreError::InvalidInput(
                "RunStarted is written by create_run, never appended".into(),
            ));
        }
        self.call(|r| Op::Append(Box::new(append), r)).await
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
        self.pages.read(run, from_seq, max).await
    }

    async fn get_run(&self, run: &RunId) -> Result<RunRecord, StoreError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            run_cols!(),
            " FROM runs WHERE run_id = ?"
        ))
        .bind(run.as_str())
        .fetch_optional(&self.reads)
        .await
        .map_err(map_sqlx)?
        .ok_or_else(|| StoreError::not_found("run", run))?;
        run_record(&row)
    }

    async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        let mut sql = String::from(concat!("SELECT ", run_cols!(), " FROM runs WHERE 1 = 1"));
        if query.session.is_some() {
            sql.push_str(" AND session_id = ?");
        }
        if query.status.is_some() {
            sql.push_str(" AND status = ?");
        }
        if query.deployment.is_some() {
            sql.push_str(" AND deployment_id = ?");
        }
        if query.attribute.is_some() {
            // The (key, value) index answers it.
            sql.push_str(
                " AND run_id IN (SELECT run_id FROM run_attributes WHERE key = ? AND value = ?)",
            );
        }
        sql.push_str(" ORDER BY created_at, run_id LIMIT ?");
        let mut q = sqlx::query(AssertSqlSafe(sql));
        if let Some(s) = &query.session {
            q = q.bind(s.as_str());
        }
        if let Some(s) = query.status {
            q = q.bind(s.as_str());
        }
        if let Some(d) = &query.deployment {
            q = q.bind(d.as_str());
        }
        if let Some((k, v)) = &query.attribute {
            q = q.bind(k.as_str()).bind(eve_core::search::index_value(v));
        }
        let limit = if query.limit == 0 {
            -1
        } else {
            i64::try_from(query.limit).unwrap_or(i64::MAX)
        };
        q.bind(limit)
            .fetch_all(&self.reads)
            .await
            .map_err(map_sqlx)?
            .iter()
            .map(run_record)
            .collect()
    }

    async fn answer(
        &self,
        request: &RequestId,
        response: InputResponse,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        let request = request.clone();
        let delivered = self.call(|r| Op::Answer(request, response, now, r)).await?;
        self.wake.wake();
        Ok(delivered)
    }

    async fn deliver_hook(
        &self,
        token: &str,
        payload: Payload,
        dedupe_key: Option<&str>,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        eve_core::store::check_hook_delivery(token, dedupe_key)?;
        let delivered = self
            .call(|reply| Op::DeliverHook {
                token: token.to_owned(),
                payload,
                dedupe_key: dedupe_key.map(str::to_owned),
                now,
                reply,
            })
            .await?;
        self.wake.wake();
        Ok(delivered)
    }

    async fn request_cancel(
        &self,
        run: &RunId,
        reason: &str,
        now: Timestamp,
    ) -> Result<CancelOutcome, StoreError> {
        let (run, reason) = (run.clone(), reason.to_owned());
        let outcome = self.call(|r| Op::Cancel(run, reason, now, r)).await?;
        self.wake.wake();
        Ok(outcome)
    }

    async fn resolve_blocked(
        &self,
        run: &RunId,
        resolution: Resolution,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        let run = run.clone();
        let seq = self.call(|r| Op::Resolve(run, resolution, now, r)).await?;
        self.wake.wake();
        Ok(seq)
    }

    async fn pending_requests(
        &self,
        session: &SessionId,
    ) -> Result<Vec<PendingRequest>, StoreError> {
        let rows = sqlx::query(
            "SELECT request_id, run_id, cmd, request, requested_at FROM requests \
             WHERE session_id = ? AND state = 'pending' ORDER BY requested_at, request_id",
        )
        .bind(session.as_str())
        .fetch_all(&self.reads)
        .await
        .map_err(map_sqlx)?;
        rows.iter()
            .map(|row| {
                let run_id = RunId::new(text(row, 1)?);
                let request: InputRequest =
                    serde_json::from_str(&text(row, 3)?).map_err(|e| StoreError::Corrupt {
                        run: run_id.clone(),
                        seq: 0,
                        reason: format!("undecodable input request row: {e}"),
                    })?;
                Ok(PendingRequest {
                    request_id: RequestId::new(text(row, 0)?),
                    run_id,
                    session_id: session.clone(),
                    cmd: u64_col(row, 2)?,
                    request,
                    requested_at: Timestamp(row.try_get(4).map_err(map_sqlx)?),
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
        let rows = sqlx::query(
            "SELECT seq, at, run_id, call_id, event FROM session_log \
             WHERE session_id = ? AND seq >= ? ORDER BY seq LIMIT ?",
        )
        .bind(session.as_str())
        .bind(seq_arg(from_seq))
        .bind(i64::try_from(max).unwrap_or(i64::MAX))
        .fetch_all(&self.reads)
        .await
        .map_err(map_sqlx)?;
        rows.iter()
            .map(|row| {
                let seq = u64_col(row, 0)?;
                let run_id = RunId::new(text(row, 2)?);
                let event: SessionEvent =
                    serde_json::from_str(&text(row, 4)?).map_err(|e| StoreError::Corrupt {
                        run: run_id.clone(),
                        seq,
                        reason: format!(
                            "undecodable session log entry {seq} of session {session}: {e}"
                        ),
                    })?;
                Ok(SessionEntry {
                    session_id: session.clone(),
                    seq,
                    at: Timestamp(row.try_get(1).map_err(map_sqlx)?),
                    run_id,
                    call_id: text(row, 3)?.into(),
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
        let (worker, deployment) = (worker.clone(), deployment.clone());
        let lease = self
            .call(|r| Op::Register(worker, deployment, ttl, now, r))
            .await?;
        if lease.epoch > 1 {
            // The older epoch's runs are orphaned: idle workers may take them at once.
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
        let lease = lease.clone();
        self.call(|r| Op::Heartbeat(lease, ttl, now, r)).await
    }

    async fn claim(
        &self,
        lease: &Lease,
        max: usize,
        now: Timestamp,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let lease = lease.clone();
        self.call(|r| Op::Claim(lease, max, now, r)).await
    }

    async fn release(
        &self,
        lease: &Lease,
        run: &RunId,
        processed_seq: u64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let (lease, run) = (lease.clone(), run.clone());
        self.call(|r| Op::Release(lease, run, processed_seq, now, r))
            .await
    }

    async fn retire_worker(&self, lease: &Lease, _now: Timestamp) -> Result<(), StoreError> {
        let lease = lease.clone();
        self.call(|r| Op::Retire(lease, r)).await?;
        // Its runs are orphaned: idle workers may take them at once.
        self.wake.wake();
        Ok(())
    }

    async fn next_wake(
        &self,
        deployment: &DeploymentId,
        now: Timestamp,
    ) -> Result<Option<Timestamp>, StoreError> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT min(k) FROM ({})",
            writer::claim_keys_sql(false)
        )))
        .bind(deployment.as_str())
        .bind(now.0)
        .fetch_one(&self.reads)
        .await
        .map_err(map_sqlx)?;
        Ok(row
            .try_get::<Option<i64>, _>(0)
            .map_err(map_sqlx)?
            .map(Timestamp))
    }
}
