//! Retention (contract clause 9): [`purge`] deletes runs that ended before a cutoff.
//!
//! A purge is rare, operator-driven work, so like key writes it runs on a read-pool connection,
//! in its own `BEGIN IMMEDIATE` transaction (it waits for the writer's lock like any other
//! handle), not through the group-commit writer. The whole batch commits or nothing does.

use crate::error::map_sqlx;
use eve_core::{StoreError, Timestamp};
use sqlx::pool::PoolConnection;
use sqlx::{Row, Sqlite, SqliteConnection, SqlitePool};

/// Deletes up to `limit` runs (0: no limit) that ended before `ended_before`, oldest end first,
/// with their events, timers, hooks, dedupe records, requests and session-log entries; records
/// each touched session's next seq in `session_heads` first, so a deleted tail's seqs are never
/// reused.
pub(crate) async fn purge(
    pool: &SqlitePool,
    ended_before: Timestamp,
    limit: usize,
) -> Result<usize, StoreError> {
    let mut tx = Immediate::begin(pool).await?;
    let result = purge_in(tx.conn(), ended_before, limit).await;
    tx.finish(result).await
}

/// A `BEGIN IMMEDIATE` transaction on a read-pool connection, for rare multi-statement writes
/// outside the group-commit writer (purges, session records): it takes the database's write
/// lock at once, waiting for the writer like any other handle.
pub(crate) struct Immediate(PoolConnection<Sqlite>);

impl Immediate {
    /// Begins the transaction.
    pub(crate) async fn begin(pool: &SqlitePool) -> Result<Self, StoreError> {
        let mut conn = pool.acquire().await.map_err(map_sqlx)?;
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *conn)
            .await
            .map_err(map_sqlx)?;
        Ok(Self(conn))
    }

    /// The transaction's connection.
    pub(crate) fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.0
    }

    /// Commits when `result` is a success, rolls back otherwise, and returns `result` (or the
    /// commit's error).
    pub(crate) async fn finish<T>(
        mut self,
        result: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
        let ended = sqlx::query(end)
            .execute(&mut *self.0)
            .await
            .map_err(map_sqlx);
        let value = result?;
        ended?;
        Ok(value)
    }
}

async fn purge_in(
    conn: &mut SqliteConnection,
    ended_before: Timestamp,
    limit: usize,
) -> Result<usize, StoreError> {
    let limit = if limit == 0 {
        -1
    } else {
        i64::try_from(limit).unwrap_or(i64::MAX)
    };
    let rows = sqlx::query(
        "SELECT run_id, session_id FROM runs \
         WHERE status IN ('completed', 'failed', 'cancelled') AND updated_at < ? \
         ORDER BY updated_at, run_id LIMIT ?",
    )
    .bind(ended_before.0)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await
    .map_err(map_sqlx)?;
    let mut doomed = Vec::with_capacity(rows.len());
    for row in &rows {
        let run: String = row.try_get(0).map_err(map_sqlx)?;
        let session: String = row.try_get(1).map_err(map_sqlx)?;
        doomed.push((run, session));
    }
    let mut sessions: Vec<&str> = doomed.iter().map(|(_, s)| s.as_str()).collect();
    sessions.sort_unstable();
    sessions.dedup();
    for session in sessions {
        sqlx::query(
            "INSERT INTO session_heads (session_id, next_seq) \
             SELECT session_id, max(seq) + 1 FROM session_log WHERE session_id = ? \
             GROUP BY session_id \
             ON CONFLICT (session_id) DO UPDATE SET next_seq = max(next_seq, excluded.next_seq)",
        )
        .bind(session)
        .execute(&mut *conn)
        .await
        .map_err(map_sqlx)?;
    }
    for (run, session) in &doomed {
        sqlx::query("DELETE FROM session_log WHERE session_id = ? AND run_id = ?")
            .bind(session)
            .bind(run)
            .execute(&mut *conn)
            .await
            .map_err(map_sqlx)?;
        for table in [
            "events",
            "timers",
            "hooks",
            "hook_dedupe",
            "requests",
            "run_attributes",
            "runs",
        ] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM {table} WHERE run_id = ?"
            )))
            .bind(run)
            .execute(&mut *conn)
            .await
            .map_err(map_sqlx)?;
        }
    }
    Ok(doomed.len())
}
