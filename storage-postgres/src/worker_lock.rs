//! The process lock of a worker id (contract clause 11): a session-level advisory lock
//! (`pg_try_advisory_lock`) on a connection of its own, held for the worker's life. The server
//! frees it when that session ends, as it does when the process dies (the socket closes), so a
//! restart after a crash gets it at once. The connection's `application_name` names the
//! holder's process (pid, host); a refused process reads it with the session's start from
//! `pg_stat_activity`. A lost connection is re-opened and the lock taken again.

use crate::error::{map_err, BACKEND};
use crate::Db;
use eve_core::worker_lock::this_process;
use eve_core::{StoreError, Timestamp, WorkerId, WorkerLock};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long a refused lock is tried again: a holder dropped a moment ago may still be ending
/// its session.
const RELEASE_GRACE: Duration = Duration::from_millis(500);
/// How often the holder checks its connection.
const CHECK_EVERY: Duration = Duration::from_secs(5);
/// Postgres keeps 63 bytes of an `application_name`.
const MAX_APP_NAME: usize = 63;

/// The advisory lock key of `worker` in `schema`: FNV-1a of both, so the same id in two
/// schemas (two stores of one database) are two locks.
fn key(schema: &str, worker: &WorkerId) -> i64 {
    let h = schema
        .bytes()
        .chain([0])
        .chain(worker.as_str().bytes())
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    h as i64
}

/// `eve: pid 4242 on host build-1`, cut to what Postgres keeps.
fn app_name() -> String {
    let mut s = format!(
        "eve: {}",
        this_process(Timestamp::now())
            .split(", since")
            .next()
            .unwrap_or_default()
    );
    while s.len() > MAX_APP_NAME {
        s.pop();
    }
    s
}

/// A connection holding the advisory lock `key`, or `None` when another session holds it.
async fn try_lock(opts: &PgConnectOptions, key: i64) -> Result<Option<PgConnection>, StoreError> {
    let mut conn = PgConnection::connect_with(opts).await.map_err(map_err)?;
    let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(key)
        .fetch_one(&mut conn)
        .await
        .map_err(map_err)?;
    if got {
        return Ok(Some(conn));
    }
    let _ = conn.close().await;
    Ok(None)
}

/// A holder's session: backend pid, `application_name`, `backend_start`.
type HolderRow = (i32, Option<String>, Option<String>);

/// Who holds the advisory lock `key`, as `pg_stat_activity` tells.
async fn holder(db: &Db, key: i64) -> String {
    let row: Result<Option<HolderRow>, _> = sqlx::query_as(
        "SELECT a.pid, a.application_name, a.backend_start::text \
         FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
           AND l.classid::bigint = $1 AND l.objid::bigint = $2",
    )
    .bind((key as u64 >> 32) as i64)
    .bind((key as u64 & 0xffff_ffff) as i64)
    .fetch_optional(&db.pool)
    .await;
    match row {
        Ok(Some((pid, app, start))) => {
            let who = app
                .as_deref()
                .and_then(|a| a.strip_prefix("eve: "))
                .unwrap_or("a process that is not eve");
            let since = start.map(|s| format!(", since {s}")).unwrap_or_default();
            format!("{who}; Postgres session {pid}{since}")
        }
        _ => "another Postgres session (it could not be looked up)".into(),
    }
}

impl Db {
    /// [`eve_core::JournalStore::lock_worker`]: see the module docs.
    pub(crate) async fn lock_worker(&self, worker: &WorkerId) -> Result<WorkerLock, StoreError> {
        eve_core::store::check_worker_id(worker)?;
        let key = key(&self.schema, worker);
        let opts = self
            .pool
            .connect_options()
            .as_ref()
            .clone()
            .application_name(&app_name());
        let started = Instant::now();
        let conn = loop {
            if let Some(conn) = try_lock(&opts, key).await? {
                break conn;
            }
            if started.elapsed() >= RELEASE_GRACE {
                return Err(StoreError::WorkerIdInUse {
                    worker: worker.to_string(),
                    holder: holder(self, key).await,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(keep(conn, opts, key, worker.clone(), stopped));
        Ok(WorkerLock::new(
            worker.clone(),
            this_process(Timestamp::now()),
            stop,
        ))
    }
}

/// Holds the lock until the [`WorkerLock`] is dropped (its sender closes `stopped`), then
/// unlocks and closes. Checks the connection every [`CHECK_EVERY`]; when it was lost (the
/// server freed the lock) it reconnects and takes the lock again.
async fn keep(
    mut conn: PgConnection,
    opts: PgConnectOptions,
    key: i64,
    worker: WorkerId,
    mut stopped: oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            _ = &mut stopped => {
                let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
                    .bind(key)
                    .execute(&mut conn)
                    .await;
                let _ = conn.close().await;
                return;
            }
            () = tokio::time::sleep(CHECK_EVERY) => {}
        }
        if sqlx::query("SELECT 1").execute(&mut conn).await.is_ok() {
            continue;
        }
        tracing::warn!(%worker, "eve postgres: the worker lock's connection was lost; taking the lock again");
        conn = loop {
            let again = tokio::select! {
                _ = &mut stopped => return,
                r = try_lock(&opts, key) => r,
            };
            match again {
                Ok(Some(c)) => break c,
                Ok(None) => {
                    tracing::error!(%worker, backend = BACKEND, "eve postgres: another process took this worker id while the lock's connection was down; this worker will be fenced by its registration");
                    return;
                }
                Err(e) => {
                    tracing::warn!(%worker, error = %e, "eve postgres: cannot take the worker lock again yet");
                    tokio::select! {
                        _ = &mut stopped => return,
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        };
    }
}
