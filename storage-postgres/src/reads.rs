//! Reads: journals (paged, decoded in batches), run records and queries, pending requests and
//! the session log.

use crate::error::{bad_row, map_err};
use crate::Db;
use eve_core::codec::decode_batch;
use eve_core::{
    Execution, PendingRequest, RequestId, RunId, RunQuery, RunRecord, RunStatus, SessionEntry,
    SessionEvent, SessionId, StoreError, StoredEvent, Timestamp, WorkerId,
};
use sqlx::postgres::PgRow;
use sqlx::Row;

pub(crate) const RUN_COLS: &str =
    "r.run_id, r.idempotency_key, r.workflow_id, r.deployment_id, r.tool, \
    r.session_id, r.call_id, r.execution, r.status, r.next_seq, r.processed_seq, \
    r.cancel_requested, r.activations, r.owner_worker, r.owner_epoch, r.created_at, r.updated_at, \
    r.pending_at, \
    (SELECT json_object_agg(a.key, a.value::json)::text FROM {s}.run_attributes a \
     WHERE a.run_id = r.run_id) AS attributes";

pub(crate) fn run_from_row(row: &PgRow) -> Result<RunRecord, StoreError> {
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
        attributes: match row.try_get::<Option<String>, _>("attributes").map_err(g)? {
            Some(json) => decode_json("run attributes", json.as_bytes())?,
            None => Default::default(),
        },
    })
}

pub(crate) fn decode_json<T: serde::de::DeserializeOwned>(
    what: &str,
    bytes: &[u8],
) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| bad_row(what, e))
}

/// The read operations of [`eve_core::JournalStore`] (the impl delegates here).
impl Db {
    pub(crate) async fn read(
        &self,
        run: &RunId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        if max == 0 {
            return Err(StoreError::InvalidInput("read needs max > 0".into()));
        }
        // One statement, so the journal's end and its rows come from one snapshot: the rows
        // from the one holding `from_seq` up to `from_seq + max`, cut at the run's next seq.
        // A run without rows in that range gives one row of NULLs beside its next seq.
        let wanted_end = from_seq.saturating_add(max as u64).min(i64::MAX as u64);
        let rows = sqlx::query(self.sql(
            "SELECT r.next_seq, e.first_seq, e.count, e.at, e.version, e.body \
             FROM {s}.runs r LEFT JOIN LATERAL ( \
               SELECT first_seq, count, at, version, body FROM {s}.events \
               WHERE run_id = r.run_id AND first_seq < least(r.next_seq, $3) \
                 AND first_seq >= (SELECT coalesce(max(first_seq), 0) FROM {s}.events \
                                   WHERE run_id = r.run_id AND first_seq <= $2) \
               ORDER BY first_seq) e ON $2 < r.next_seq \
             WHERE r.run_id = $1 ORDER BY e.first_seq",
        ))
        .bind(run.as_str())
        .bind(from_seq.min(i64::MAX as u64) as i64)
        .bind(wanted_end as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        let next: i64 = match rows.first() {
            Some(row) => row.try_get(0).map_err(map_err)?,
            None => return Err(StoreError::not_found("run", run)),
        };
        let len = next as u64;
        if from_seq > len {
            return Err(StoreError::InvalidInput(format!(
                "read from seq {from_seq} is past the end of run {run} (next seq {len})"
            )));
        }
        if from_seq == len {
            return Ok(Vec::new());
        }
        let end = wanted_end.min(len);
        let mut out = Vec::with_capacity((end - from_seq) as usize);
        for row in rows {
            let Some(first) = row.try_get::<Option<i64>, _>(1).map_err(map_err)? else {
                continue; // no rows in range: the contiguity check below reports it
            };
            let count: i32 = row.try_get(2).map_err(map_err)?;
            let at: i64 = row.try_get(3).map_err(map_err)?;
            let version: i16 = row.try_get(4).map_err(map_err)?;
            let body: &[u8] = row.try_get(5).map_err(map_err)?;
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

    pub(crate) async fn get_run(&self, run: &RunId) -> Result<RunRecord, StoreError> {
        let row = sqlx::query(self.sql(&format!(
            "SELECT {RUN_COLS} FROM {{s}}.runs r WHERE r.run_id = $1"
        )))
        .bind(run.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?
        .ok_or_else(|| StoreError::not_found("run", run))?;
        run_from_row(&row)
    }

    pub(crate) async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        let limit = (query.limit > 0).then(|| i64::try_from(query.limit).unwrap_or(i64::MAX));
        let rows = sqlx::query(self.sql(&format!(
            "SELECT {RUN_COLS} FROM {{s}}.runs r \
             WHERE ($1::text IS NULL OR r.session_id = $1) \
               AND ($2::text IS NULL OR r.status = $2) \
               AND ($3::text IS NULL OR r.deployment_id = $3) \
               AND ($5::text IS NULL OR r.run_id IN \
                    (SELECT a.run_id FROM {{s}}.run_attributes a WHERE a.key = $5 AND a.value = $6)) \
             ORDER BY r.created_at, r.run_id COLLATE \"C\" LIMIT $4"
        )))
        .bind(query.session.as_ref().map(|s| s.as_str()))
        .bind(query.status.map(RunStatus::as_str))
        .bind(query.deployment.as_ref().map(|d| d.as_str()))
        .bind(limit)
        .bind(query.attribute.as_ref().map(|(k, _)| k.as_str()))
        .bind(
            query
                .attribute
                .as_ref()
                .map(|(_, v)| eve_core::search::index_value(v)),
        )
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(run_from_row).collect()
    }

    pub(crate) async fn pending_requests(
        &self,
        session: &SessionId,
    ) -> Result<Vec<PendingRequest>, StoreError> {
        let rows = sqlx::query(self.sql(
            "SELECT request_id, run_id, session_id, cmd, request, requested_at FROM {s}.requests \
             WHERE session_id = $1 AND state = 'pending' ORDER BY requested_at, request_id COLLATE \"C\"",
        ))
        .bind(session.as_str())
        .fetch_all(&self.pool)
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

    pub(crate) async fn read_session(
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
        let rows = sqlx::query(self.sql(
            "SELECT seq, at, run_id, call_id, body FROM {s}.session_log \
             WHERE session_id = $1 AND seq >= $2 ORDER BY seq LIMIT $3",
        ))
        .bind(session.as_str())
        .bind(i64::try_from(from_seq).unwrap_or(i64::MAX))
        .bind(i64::try_from(max).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
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
}
