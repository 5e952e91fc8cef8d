//! Sessions and turns (contract clause 10) in `session_records` and `session_messages`.
//!
//! Ends and queued messages are rare, small writes: each runs in its own [`Immediate`]
//! transaction on a read-pool connection; a take is one `DELETE … RETURNING`. `create_run` (in the writer) checks
//! `session_records` under the same database lock, so a start either commits before an end
//! (and the end lists its run) or sees the end and is refused.

use crate::error::{map_sqlx, other};
use crate::retention::Immediate;
use crate::rows::text;
use eve_core::store::{check_message, check_session_id};
use eve_core::{
    Payload, QueuedMessage, RunId, SessionEnd, SessionId, SessionRecord, StoreError, Timestamp,
};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection, SqlitePool};

pub(crate) async fn end(
    pool: &SqlitePool,
    session: &SessionId,
    now: Timestamp,
) -> Result<SessionEnd, StoreError> {
    check_session_id(session)?;
    let mut tx = Immediate::begin(pool).await?;
    let result = end_in(tx.conn(), session, now).await;
    tx.finish(result).await
}

async fn end_in(
    conn: &mut SqliteConnection,
    session: &SessionId,
    now: Timestamp,
) -> Result<SessionEnd, StoreError> {
    let ended_at: i64 = sqlx::query_scalar(
        "INSERT INTO session_records (session_id, ended_at) VALUES (?, ?) \
         ON CONFLICT (session_id) DO UPDATE SET ended_at = coalesce(ended_at, excluded.ended_at) \
         RETURNING ended_at",
    )
    .bind(session.as_str())
    .bind(now.0)
    .fetch_one(&mut *conn)
    .await
    .map_err(map_sqlx)?;
    let live: Vec<String> = sqlx::query_scalar(
        "SELECT run_id FROM runs WHERE session_id = ? AND status IN ('running', 'blocked') \
         ORDER BY created_at, run_id",
    )
    .bind(session.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(map_sqlx)?;
    Ok(SessionEnd {
        ended_at: Timestamp(ended_at),
        live: live.into_iter().map(RunId::new).collect(),
    })
}

fn message(session: &SessionId, row: &SqliteRow) -> Result<QueuedMessage, StoreError> {
    let seq: i64 = row.try_get(0).map_err(map_sqlx)?;
    let json = text(row, 2)?;
    Ok(QueuedMessage {
        session_id: session.clone(),
        seq: u64::try_from(seq).map_err(|_| other(format!("negative message seq {seq}")))?,
        at: Timestamp(row.try_get(1).map_err(map_sqlx)?),
        message: Payload::from_json(json).map_err(|e| {
            other(format!(
                "queued message {seq} of session {session} is not JSON: {e}"
            ))
        })?,
    })
}

async fn queued(
    conn: &mut SqliteConnection,
    session: &SessionId,
) -> Result<Vec<QueuedMessage>, StoreError> {
    sqlx::query("SELECT seq, at, message FROM session_messages WHERE session_id = ? ORDER BY seq")
        .bind(session.as_str())
        .fetch_all(&mut *conn)
        .await
        .map_err(map_sqlx)?
        .iter()
        .map(|row| message(session, row))
        .collect()
}

pub(crate) async fn get(
    pool: &SqlitePool,
    session: &SessionId,
) -> Result<SessionRecord, StoreError> {
    check_session_id(session)?;
    // One read transaction, so the end and the queue are of one moment.
    let mut conn = pool.acquire().await.map_err(map_sqlx)?;
    sqlx::query("BEGIN")
        .execute(&mut *conn)
        .await
        .map_err(map_sqlx)?;
    let result = async {
        let ended_at: Option<Option<i64>> =
            sqlx::query_scalar("SELECT ended_at FROM session_records WHERE session_id = ?")
                .bind(session.as_str())
                .fetch_optional(&mut *conn)
                .await
                .map_err(map_sqlx)?;
        Ok(SessionRecord {
            session_id: session.clone(),
            ended_at: ended_at.flatten().map(Timestamp),
            queued: queued(&mut conn, session).await?,
        })
    }
    .await;
    sqlx::query("COMMIT")
        .execute(&mut *conn)
        .await
        .map_err(map_sqlx)?;
    result
}

pub(crate) async fn queue(
    pool: &SqlitePool,
    session: &SessionId,
    payload: Payload,
    now: Timestamp,
) -> Result<QueuedMessage, StoreError> {
    check_message(session, &payload)?;
    let mut tx = Immediate::begin(pool).await?;
    let result = queue_in(tx.conn(), session, payload, now).await;
    tx.finish(result).await
}

async fn queue_in(
    conn: &mut SqliteConnection,
    session: &SessionId,
    payload: Payload,
    now: Timestamp,
) -> Result<QueuedMessage, StoreError> {
    // The counter moves only while the session has not ended: no row back means it ended.
    let seq: Option<i64> = sqlx::query_scalar(
        "INSERT INTO session_records (session_id, next_message) VALUES (?, 1) \
         ON CONFLICT (session_id) DO UPDATE SET next_message = next_message + 1 \
         WHERE ended_at IS NULL \
         RETURNING next_message - 1",
    )
    .bind(session.as_str())
    .fetch_optional(&mut *conn)
    .await
    .map_err(map_sqlx)?;
    let Some(seq) = seq else {
        return Err(StoreError::SessionEnded {
            session: session.clone(),
        });
    };
    sqlx::query("INSERT INTO session_messages (session_id, seq, at, message) VALUES (?, ?, ?, ?)")
        .bind(session.as_str())
        .bind(seq)
        .bind(now.0)
        .bind(payload.get())
        .execute(&mut *conn)
        .await
        .map_err(map_sqlx)?;
    Ok(QueuedMessage {
        session_id: session.clone(),
        seq: seq as u64,
        at: now,
        message: payload,
    })
}

pub(crate) async fn take(
    pool: &SqlitePool,
    session: &SessionId,
) -> Result<Vec<QueuedMessage>, StoreError> {
    check_session_id(session)?;
    // One statement: each row is deleted, and so returned, by one taker only.
    let mut taken =
        sqlx::query("DELETE FROM session_messages WHERE session_id = ? RETURNING seq, at, message")
            .bind(session.as_str())
            .fetch_all(pool)
            .await
            .map_err(map_sqlx)?
            .iter()
            .map(|row| message(session, row))
            .collect::<Result<Vec<_>, _>>()?;
    // RETURNING gives no order.
    taken.sort_by_key(|m| m.seq);
    Ok(taken)
}
