//! Retention (contract clause 9): [`Db::purge`] deletes runs that ended before a cutoff.

use crate::error::map_err;
use crate::Db;
use eve_core::{StoreError, Timestamp};

impl Db {
    /// Deletes up to `limit` runs (0: no limit) that ended before `ended_before`, oldest end
    /// first, with their events, timers, hooks, dedupe records, requests and session-log
    /// entries, in one statement (one transaction). The runs are locked `FOR UPDATE SKIP
    /// LOCKED`, so two purges never wait on each other and never count a run twice. The session
    /// log's counter lives in `session_heads`, which a purge leaves alone, so no seq is reused.
    pub(crate) async fn purge(
        &self,
        ended_before: Timestamp,
        limit: usize,
    ) -> Result<usize, StoreError> {
        let limit = (limit != 0).then(|| i64::try_from(limit).unwrap_or(i64::MAX));
        let n: i64 = sqlx::query_scalar(self.sql(
            "WITH doomed AS ( \
               SELECT run_id, session_id FROM {s}.runs \
               WHERE status IN ('completed', 'failed', 'cancelled') AND updated_at < $1 \
               ORDER BY updated_at, run_id LIMIT $2 FOR UPDATE SKIP LOCKED), \
             e AS (DELETE FROM {s}.events WHERE run_id IN (SELECT run_id FROM doomed)), \
             t AS (DELETE FROM {s}.timers WHERE run_id IN (SELECT run_id FROM doomed)), \
             h AS (DELETE FROM {s}.hooks WHERE run_id IN (SELECT run_id FROM doomed)), \
             d AS (DELETE FROM {s}.hook_dedupe WHERE run_id IN (SELECT run_id FROM doomed)), \
             q AS (DELETE FROM {s}.requests WHERE run_id IN (SELECT run_id FROM doomed)), \
             a AS (DELETE FROM {s}.run_attributes WHERE run_id IN (SELECT run_id FROM doomed)), \
             l AS (DELETE FROM {s}.session_log l USING doomed \
                   WHERE l.session_id = doomed.session_id AND l.run_id = doomed.run_id), \
             r AS (DELETE FROM {s}.runs WHERE run_id IN (SELECT run_id FROM doomed) \
                   RETURNING 1) \
             SELECT count(*) FROM r",
        ))
        .bind(ended_before.0)
        .bind(limit)
        .fetch_one(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(usize::try_from(n).unwrap_or(0))
    }
}
