//! Sessions and turns (contract clause 10) in `session_records` and `session_messages`.
//!
//! A start locks its session's row (`create_run` upserts it in the statement that inserts the
//! run) and an end updates that row, so the two serialize: a start that locked the row first
//! commits before the end's update goes through, and the end's next statement lists its run;
//! a start after the end sees `ended_at` and is refused.

use crate::error::{bad_row, map_err};
use crate::Db;
use eve_core::store::{check_message, check_session_id};
use eve_core::{
    Payload, QueuedMessage, RunId, SessionEnd, SessionId, SessionRecord, StoreError, Timestamp,
};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

const MESSAGE_COLS: &str = "seq, at, message";

fn message(session: &SessionId, row: &PgRow) -> Result<QueuedMessage, StoreError> {
    let seq: i64 = row.try_get(0).map_err(map_err)?;
    let json: String = row.try_get(2).map_err(map_err)?;
    Ok(QueuedMessage {
        session_id: session.clone(),
        seq: u64::try_from(seq).map_err(|_| bad_row("message seq", seq))?,
        at: Timestamp(row.try_get(1).map_err(map_err)?),
        message: Payload::from_json(json).map_err(|e| bad_row("queued message", e))?,
    })
}

impl Db {
    pub(crate) async fn end_session(
        &self,
        session: &SessionId,
        now: Timestamp,
    ) -> Result<SessionEnd, StoreError> {
        check_session_id(session)?;
        let mut tx = self.begin().await?;
        let ended_at: i64 = sqlx::query_scalar(self.sql(
            "INSERT INTO {s}.session_records (session_id, ended_at) VALUES ($1, $2) \
             ON CONFLICT (session_id) DO UPDATE \
               SET ended_at = coalesce({s}.session_records.ended_at, EXCLUDED.ended_at) \
             RETURNING ended_at",
        ))
        .bind(session.as_str())
        .bind(now.0)
        .fetch_one(&mut *tx)
        .await
        .map_err(map_err)?;
        // A new statement: it sees every start that held the row before the update above.
        let live: Vec<String> = sqlx::query_scalar(self.sql(
            "SELECT run_id FROM {s}.runs WHERE session_id = $1 AND status IN ('running', 'blocked') \
             ORDER BY created_at, run_id COLLATE \"C\"",
        ))
        .bind(session.as_str())
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(SessionEnd {
            ended_at: Timestamp(ended_at),
            live: live.into_iter().map(RunId::new).collect(),
        })
    }

    async fn queued(
        &self,
        conn: &mut PgConnection,
        session: &SessionId,
    ) -> Result<Vec<QueuedMessage>, StoreError> {
        sqlx::query(self.sql(&format!(
            "SELECT {MESSAGE_COLS} FROM {{s}}.session_messages WHERE session_id = $1 ORDER BY seq"
        )))
        .bind(session.as_str())
        .fetch_all(&mut *conn)
        .await
        .map_err(map_err)?
        .iter()
        .map(|row| message(session, row))
        .collect()
    }

    pub(crate) async fn get_session(
        &self,
        session: &SessionId,
    ) -> Result<SessionRecord, StoreError> {
        check_session_id(session)?;
        // Repeatable read: the end and the queue of one moment.
        let mut tx = self.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        let ended_at = self.ended_at(&mut *tx, session).await?;
        let queued = self.queued(&mut tx, session).await?;
        tx.commit().await.map_err(map_err)?;
        Ok(SessionRecord {
            session_id: session.clone(),
            ended_at,
            queued,
        })
    }

    pub(crate) async fn queue_message(
        &self,
        session: &SessionId,
        payload: Payload,
        now: Timestamp,
    ) -> Result<QueuedMessage, StoreError> {
        check_message(session, &payload)?;
        // One statement: the counter moves (row-locked) only while the session has not ended,
        // and the message is inserted at the seq it gave.
        let seq: Option<i64> = sqlx::query_scalar(self.sql(
            "WITH c AS ( \
               INSERT INTO {s}.session_records (session_id, next_message) VALUES ($1, 1) \
               ON CONFLICT (session_id) DO UPDATE \
                 SET next_message = {s}.session_records.next_message + 1 \
                 WHERE {s}.session_records.ended_at IS NULL \
               RETURNING next_message - 1 AS seq) \
             INSERT INTO {s}.session_messages (session_id, seq, at, message) \
             SELECT $1, seq, $2, $3 FROM c RETURNING seq",
        ))
        .bind(session.as_str())
        .bind(now.0)
        .bind(payload.get())
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        let Some(seq) = seq else {
            return Err(StoreError::SessionEnded {
                session: session.clone(),
            });
        };
        Ok(QueuedMessage {
            session_id: session.clone(),
            seq: seq as u64,
            at: now,
            message: payload,
        })
    }

    pub(crate) async fn take_messages(
        &self,
        session: &SessionId,
    ) -> Result<Vec<QueuedMessage>, StoreError> {
        check_session_id(session)?;
        // DELETE … RETURNING: each row is deleted by one statement only, so two takers never
        // both return a message.
        let mut taken = sqlx::query(self.sql(&format!(
            "DELETE FROM {{s}}.session_messages WHERE session_id = $1 RETURNING {MESSAGE_COLS}"
        )))
        .bind(session.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?
        .iter()
        .map(|row| message(session, row))
        .collect::<Result<Vec<_>, _>>()?;
        taken.sort_by_key(|m| m.seq);
        Ok(taken)
    }

    /// Whether `session` was ended (for telling a refused start from a lost race).
    pub(crate) async fn session_ended(&self, session: &SessionId) -> Result<bool, StoreError> {
        Ok(self.ended_at(&self.pool, session).await?.is_some())
    }

    /// When `session` was ended, read through `conn`.
    async fn ended_at<'c>(
        &self,
        conn: impl sqlx::PgExecutor<'c>,
        session: &SessionId,
    ) -> Result<Option<Timestamp>, StoreError> {
        let ended: Option<Option<i64>> = sqlx::query_scalar(
            self.sql("SELECT ended_at FROM {s}.session_records WHERE session_id = $1"),
        )
        .bind(session.as_str())
        .fetch_optional(conn)
        .await
        .map_err(map_err)?;
        Ok(ended.flatten().map(Timestamp))
    }
}
