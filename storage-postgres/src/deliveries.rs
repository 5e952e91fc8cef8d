//! External deliveries: answers, hook payloads, cancel requests and resolutions of blocked
//! runs, each its own transaction that locks the run and writes one delivery.

use crate::error::{bad_row, map_err};
use crate::reads::decode_json;
use crate::Db;
use eve_core::store::cancel_events;
use eve_core::{
    check_limits, CancelOutcome, Delivered, Event, InputRequest, InputResponse, Payload, RequestId,
    Resolution, RunId, RunStatus, StoreError, Timestamp,
};
use eve_core::codec::{encode_batch, FORMAT_VERSION};
use sqlx::Row;

/// The delivery operations of [`eve_core::JournalStore`] (the impl delegates here).
impl Db {
    pub(crate) async fn answer(
        &self,
        request: &RequestId,
        response: InputResponse,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        let run_id: Option<String> =
            sqlx::query_scalar(self.sql("SELECT run_id FROM {s}.requests WHERE request_id = $1"))
                .bind(request.as_str())
                .fetch_optional(&self.pool)
                .await
                .map_err(map_err)?;
        let run_id = RunId::new(run_id.ok_or_else(|| StoreError::not_found("request", request))?);
        let mut tx = self.begin().await?;
        // Lock order everywhere: the run row first, then the request row.
        let locked = self
            .lock_run(&mut tx, &run_id)
            .await?
            .ok_or_else(|| StoreError::not_found("run", &run_id))?;
        let row = sqlx::query(self.sql(
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
                return if prev.same_answer(&response) {
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
        let (seq, _) = self.write(&mut tx, &locked.run, vec![event], now).await?;
        let resp = serde_json::to_vec(&response)
            .map_err(|e| StoreError::InvalidInput(format!("response does not serialize: {e}")))?;
        sqlx::query(self.sql(
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
        if locked.run.status.is_terminal() {
            return Ok(CancelOutcome::AlreadyEnded {
                status: locked.run.status,
            });
        }
        if locked.run.cancel_requested {
            return Ok(CancelOutcome::AlreadyRequested);
        }
        let pending = self.pending_of(&mut tx, run).await?;
        let blocked = locked.run.status == RunStatus::Blocked;
        let events = cancel_events(reason, blocked, pending);
        check_limits(&events[..1])?;
        let (seq, _) = self.write(&mut tx, &locked.run, events, now).await?;
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
                let mut events: Vec<Event> = self
                    .pending_of(&mut tx, run)
                    .await?
                    .into_iter()
                    .map(|request_id| Event::InputWithdrawn { request_id })
                    .collect();
                events.push(Event::RunFailed { error });
                events
            }
        };
        let (seq, _) = self.write(&mut tx, &locked.run, events, now).await?;
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
