//! External deliveries: answers and hook payloads (one read, then one statement calling a
//! server-side function), cancel requests and resolutions of blocked runs (a transaction that
//! locks the run and writes through `eve_write`).

use crate::commit::effects_json;
use crate::error::{bad_row, map_err};
use crate::reads::decode_json;
use crate::Db;
use eve_core::codec::{encode_batch, FORMAT_VERSION};
use eve_core::store::cancel_events;
use eve_core::{
    check_limits, CancelOutcome, Delivered, Event, InputRequest, InputResponse, Payload, RequestId,
    Resolution, RunId, RunStatus, StoreError, Timestamp,
};
use sqlx::Row;

/// The delivery operations of [`eve_core::JournalStore`] (the impl delegates here).
impl Db {
    /// One read of the request, then one statement (`eve_answer`) that locks the run and the
    /// request, re-checks what the read found and writes the answer.
    pub(crate) async fn answer(
        &self,
        request: &RequestId,
        response: InputResponse,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        let row = sqlx::query(self.sql(
            "SELECT run_id, state, response, answer_seq, request FROM {s}.requests \
             WHERE request_id = $1",
        ))
        .bind(request.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?
        .ok_or_else(|| StoreError::not_found("request", request))?;
        let run_id = RunId::new(row.try_get::<String, _>("run_id").map_err(map_err)?);
        // An answer accepted before: a duplicate if it is this one, else refused.
        let answered = |prev: Option<Vec<u8>>, seq: Option<i64>| {
            let prev: InputResponse = decode_json("response", &prev.unwrap_or_default())?;
            if prev.same_answer(&response) {
                Ok(Delivered {
                    run: run_id.clone(),
                    seq: seq.unwrap_or(0) as u64,
                    duplicate: true,
                })
            } else {
                Err(StoreError::AlreadyAnswered {
                    request: request.clone(),
                })
            }
        };
        let withdrawn = || StoreError::Withdrawn {
            request: request.clone(),
        };
        let state: String = row.try_get("state").map_err(map_err)?;
        match state.as_str() {
            "answered" => {
                return answered(
                    row.try_get("response").map_err(map_err)?,
                    row.try_get("answer_seq").map_err(map_err)?,
                )
            }
            "withdrawn" => return Err(withdrawn()),
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
        let event = Event::InputAnswered {
            request_id: request.clone(),
            response: response.clone(),
        };
        let events = std::slice::from_ref(&event);
        check_limits(events)?;
        let resp = serde_json::to_vec(&response)
            .map_err(|e| StoreError::InvalidInput(format!("response does not serialize: {e}")))?;
        let (outcome, seq, prev): (String, Option<i64>, Option<Vec<u8>>) =
            sqlx::query_as(self.sql(
                "SELECT outcome, o_seq, o_response \
                 FROM {s}.eve_answer($1, $2, $3, $4, $5, $6, $7::jsonb, $8)",
            ))
            .bind(request.as_str())
            .bind(run_id.as_str())
            .bind(&resp)
            .bind(now.0)
            .bind(FORMAT_VERSION as i16)
            .bind(encode_batch(events)?)
            .bind(effects_json(events)?.json)
            .bind(&self.channel)
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)?;
        match outcome.as_str() {
            "ok" => Ok(Delivered {
                run: run_id.clone(),
                seq: seq.ok_or_else(|| bad_row("answer outcome", "no seq"))? as u64,
                duplicate: false,
            }),
            "answered" => answered(prev, seq),
            "withdrawn" => Err(withdrawn()),
            "not_found" => Err(StoreError::not_found("request", request)),
            other => Err(bad_row("answer outcome", other)),
        }
    }

    pub(crate) async fn deliver_hook(
        &self,
        token: &str,
        payload: Payload,
        dedupe_key: Option<&str>,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        eve_core::store::check_hook_delivery(token, dedupe_key)?;
        let hook: Option<(String, i64)> =
            sqlx::query_as(self.sql("SELECT run_id, cmd FROM {s}.hooks WHERE token = $1"))
                .bind(token)
                .fetch_optional(&self.pool)
                .await
                .map_err(map_err)?;
        let Some((run_id, cmd)) = hook else {
            return self.retained_delivery(token, dedupe_key).await;
        };
        let run_id = RunId::new(run_id);
        let event = Event::HookReceived {
            cmd: cmd as u64,
            payload,
        };
        check_limits(std::slice::from_ref(&event))?;
        // One statement: the run lock, the re-checks, the write and the dedupe key.
        let (outcome, seq): (String, Option<i64>) = sqlx::query_as(self.sql(
            "SELECT outcome, o_seq FROM {s}.eve_deliver_hook($1, $2, $3, $4, $5, $6, $7, $8)",
        ))
        .bind(token)
        .bind(run_id.as_str())
        .bind(cmd)
        .bind(dedupe_key)
        .bind(now.0)
        .bind(FORMAT_VERSION as i16)
        .bind(encode_batch(std::slice::from_ref(&event))?)
        .bind(&self.channel)
        .fetch_one(&self.pool)
        .await
        .map_err(map_err)?;
        let delivered = |duplicate| match seq {
            Some(seq) => Ok(Delivered {
                run: run_id.clone(),
                seq: seq as u64,
                duplicate,
            }),
            None => Err(bad_row("hook delivery outcome", "no seq")),
        };
        match outcome.as_str() {
            "ok" => delivered(false),
            "duplicate" => delivered(true),
            "not_found" => Err(StoreError::not_found("run", &run_id)),
            // The run ended (its tokens released) after the token was read.
            "released" => self.retained_delivery(token, dedupe_key).await,
            other => Err(bad_row("hook delivery outcome", other)),
        }
    }

    /// No live hook has `token`: a keyed delivery accepted before its run ended is a duplicate
    /// (kept until the run is purged); anything else is `NotFound`.
    async fn retained_delivery(
        &self,
        token: &str,
        dedupe_key: Option<&str>,
    ) -> Result<Delivered, StoreError> {
        let not_found = || StoreError::not_found("hook token", token);
        let Some(key) = dedupe_key else {
            return Err(not_found());
        };
        let row: Option<(String, i64)> =
            sqlx::query_as(self.sql(
                "SELECT run_id, seq FROM {s}.hook_dedupe WHERE token = $1 AND key = $2 LIMIT 1",
            ))
            .bind(token)
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(map_err)?;
        let (run, seq) = row.ok_or_else(not_found)?;
        Ok(Delivered {
            run: RunId::new(run),
            seq: seq as u64,
            duplicate: true,
        })
    }

    pub(crate) async fn request_cancel(
        &self,
        run: &RunId,
        reason: &str,
        now: Timestamp,
    ) -> Result<CancelOutcome, StoreError> {
        let mut tx = self.begin().await?;
        let locked = self
            .lock_run(&mut tx, run)
            .await?
            .ok_or_else(|| StoreError::not_found("run", run))?;
        if locked.status.is_terminal() {
            return Ok(CancelOutcome::AlreadyEnded {
                status: locked.status,
            });
        }
        if locked.cancel_requested {
            return Ok(CancelOutcome::AlreadyRequested);
        }
        let pending = self.pending_of(&mut tx, run).await?;
        let blocked = locked.status == RunStatus::Blocked;
        let events = cancel_events(reason, blocked, pending);
        check_limits(&events[..1])?;
        let (seq, _) = self.write(&mut tx, &locked, events, now).await?;
        tx.commit().await.map_err(map_err)?;
        Ok(CancelOutcome::Requested { seq })
    }

    pub(crate) async fn resolve_blocked(
        &self,
        run: &RunId,
        resolution: Resolution,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        let locked = self
            .lock_run(&mut tx, run)
            .await?
            .ok_or_else(|| StoreError::not_found("run", run))?;
        resolution.check(run, locked.status)?;
        let pending = if resolution.withdraws() {
            self.pending_of(&mut tx, run).await?
        } else {
            Vec::new()
        };
        let events = resolution.events(pending);
        let (seq, _) = self.write(&mut tx, &locked, events, now).await?;
        tx.commit().await.map_err(map_err)?;
        Ok(seq)
    }

    /// The pending requests of a run (whose row `tx` has locked), ordered by cmd.
    async fn pending_of(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        run: &RunId,
    ) -> Result<Vec<RequestId>, StoreError> {
        let pending: Vec<String> = sqlx::query_scalar(self.sql(
            "SELECT request_id FROM {s}.requests WHERE run_id = $1 AND state = 'pending' \
             ORDER BY cmd, request_id COLLATE \"C\"",
        ))
        .bind(run.as_str())
        .fetch_all(&mut **tx)
        .await
        .map_err(map_err)?;
        Ok(pending.into_iter().map(RequestId::new).collect())
    }
}
