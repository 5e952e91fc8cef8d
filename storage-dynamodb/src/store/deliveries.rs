//! External deliveries (contract clause 2), each committed through `deliver` at the run's next
//! seq: `answer`, `deliver_hook`, `request_cancel`, `resolve_blocked`.

use super::tx::Role;
use super::{contention, corrupt, DynamoStore, MAX_ROUNDS};
use crate::item::*;
use eve_core::store::cancel_events;
use eve_core::{
    check_limits, CancelOutcome, Delivered, Event, InputRequest, InputResponse, Payload, RequestId,
    Resolution, RunId, RunStatus, StoreError, Timestamp,
};

/// [`JournalStore::answer`](eve_core::JournalStore::answer).
pub(super) async fn answer(
    store: &DynamoStore,
    request: &RequestId,
    response: InputResponse,
    now: Timestamp,
) -> Result<Delivered, StoreError> {
    let rpk = req_pk(request.as_str());
    // Marks the request item with this call, so a write of ours whose answer was lost is
    // still reported as ours (not as a duplicate) when a retry finds it.
    let tok = uuid::Uuid::new_v4().simple().to_string();
    for _ in 0..MAX_ROUNDS {
        let it = store
            .get(rpk.clone(), ONE)
            .await?
            .ok_or_else(|| StoreError::not_found("request", request))?;
        let run_id = RunId::new(get_s(&it, "run").unwrap_or(""));
        let bad = |reason: String| corrupt(&run_id, 0, format!("request {request}: {reason}"));
        match get_s(&it, "st") {
            Some("answered") => {
                let body = store.read_blob(&it, &rpk, "rs").await?.map_err(bad)?;
                let prev: InputResponse = serde_json::from_slice(&body)
                    .map_err(|e| bad(format!("undecodable answer: {e}")))?;
                return if prev.same_answer(&response) {
                    Ok(Delivered {
                        run: run_id.clone(),
                        seq: get_n(&it, "seq").unwrap_or(0),
                        duplicate: get_s(&it, "tok") != Some(tok.as_str()),
                    })
                } else {
                    Err(StoreError::AlreadyAnswered {
                        request: request.clone(),
                    })
                };
            }
            Some("withdrawn") => {
                return Err(StoreError::Withdrawn {
                    request: request.clone(),
                })
            }
            _ => {}
        }
        let body = store.read_blob(&it, &rpk, "rq").await?.map_err(bad)?;
        let req: InputRequest =
            serde_json::from_slice(&body).map_err(|e| bad(format!("undecodable request: {e}")))?;
        req.accepts(&response)
            .map_err(|reason| StoreError::InvalidAnswer {
                request: request.clone(),
                reason,
            })?;
        let h = store.header(&run_id).await?;
        if h.rec.status.is_terminal() {
            return Err(StoreError::Withdrawn {
                request: request.clone(),
            });
        }
        if !h.reqs.iter().any(|p| p.id == request.as_str()) {
            // Answered or withdrawn since the request item was read: the header (which the
            // commit is conditioned on) no longer lists it as pending. Read it again.
            continue;
        }
        let event = Event::InputAnswered {
            request_id: request.clone(),
            response: response.clone(),
        };
        check_limits(std::slice::from_ref(&event))?;
        if let Ok(seq) = store
            .deliver(&h, &[event], now, Some((request, &response, &tok)), vec![])
            .await?
        {
            return Ok(Delivered {
                run: run_id,
                seq,
                duplicate: false,
            });
        }
    }
    Err(contention("answer"))
}

/// [`JournalStore::deliver_hook`](eve_core::JournalStore::deliver_hook).
pub(super) async fn deliver_hook(
    store: &DynamoStore,
    token: &str,
    payload: Payload,
    dedupe_key: Option<&str>,
    now: Timestamp,
) -> Result<Delivered, StoreError> {
    eve_core::store::check_hook_delivery(token, dedupe_key)?;
    for _ in 0..MAX_ROUNDS {
        let Some(hook) = store.get(hook_pk(token), ONE).await? else {
            return retained_delivery(store, token, dedupe_key).await;
        };
        let run_id = RunId::new(get_s(&hook, "run").unwrap_or(""));
        let cmd: u64 = get_n(&hook, "cmd").unwrap_or(0);
        let event = Event::HookReceived {
            cmd,
            payload: payload.clone(),
        };
        check_limits(std::slice::from_ref(&event))?;
        let h = match store.header(&run_id).await {
            Ok(h) => h,
            Err(StoreError::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        };
        if !h.hooks.iter().any(|t| t == token) {
            // Released (or re-registered) since the token was read: read it again.
            continue;
        }
        let mut extra = Vec::new();
        if let Some(k) = dedupe_key {
            let mut d = key(run_pk(&run_id), dedupe_sk(cmd, k));
            d.insert("seq".into(), n(h.rec.next_seq));
            d.insert("tok".into(), s(token));
            extra.push((store.tx_put_new(d)?, Role::Dedupe));
            let mut by_token = key(hook_key_pk(token, k), ONE);
            by_token.insert("run".into(), s(run_id.as_str()));
            by_token.insert("seq".into(), n(h.rec.next_seq));
            extra.push((store.tx_put(by_token, None, &[], vec![])?, Role::Other));
        }
        match store.deliver(&h, &[event], now, None, extra).await? {
            Ok(seq) => {
                return Ok(Delivered {
                    run: run_id,
                    seq,
                    duplicate: false,
                })
            }
            // The key was accepted before: no pre-read on the common path, one read here.
            Err(roles) if roles.contains(&Role::Dedupe) => {
                let k = dedupe_key.expect("a dedupe item implies a key");
                if let Some(d) = store.get(run_pk(&run_id), &dedupe_sk(cmd, k)).await? {
                    return Ok(Delivered {
                        run: run_id,
                        seq: get_n(&d, "seq").unwrap_or(0),
                        duplicate: true,
                    });
                }
            }
            Err(_) => {}
        }
    }
    Err(contention("deliver_hook"))
}

/// No live hook has `token`: a keyed delivery accepted before its run ended is a duplicate
/// (kept until the run is purged); anything else is `NotFound`.
async fn retained_delivery(
    store: &DynamoStore,
    token: &str,
    dedupe_key: Option<&str>,
) -> Result<Delivered, StoreError> {
    let not_found = || StoreError::not_found("hook token", token);
    let Some(k) = dedupe_key else {
        return Err(not_found());
    };
    let it = store
        .get(hook_key_pk(token, k), ONE)
        .await?
        .ok_or_else(not_found)?;
    Ok(Delivered {
        run: RunId::new(get_s(&it, "run").unwrap_or("")),
        seq: get_n(&it, "seq").unwrap_or(0),
        duplicate: true,
    })
}

/// [`JournalStore::request_cancel`](eve_core::JournalStore::request_cancel).
pub(super) async fn request_cancel(
    store: &DynamoStore,
    run: &RunId,
    reason: &str,
    now: Timestamp,
) -> Result<CancelOutcome, StoreError> {
    for _ in 0..MAX_ROUNDS {
        let h = store.header(run).await?;
        if h.rec.status.is_terminal() {
            return Ok(CancelOutcome::AlreadyEnded {
                status: h.rec.status,
            });
        }
        if h.rec.cancel_requested {
            return Ok(CancelOutcome::AlreadyRequested);
        }
        let blocked = h.rec.status == RunStatus::Blocked;
        let events = cancel_events(reason, blocked, pending_of(&h));
        check_limits(&events[..1])?;
        if let Ok(seq) = store.deliver(&h, &events, now, None, vec![]).await? {
            return Ok(CancelOutcome::Requested { seq });
        }
    }
    Err(contention("request_cancel"))
}

/// [`JournalStore::resolve_blocked`](eve_core::JournalStore::resolve_blocked).
pub(super) async fn resolve_blocked(
    store: &DynamoStore,
    run: &RunId,
    resolution: Resolution,
    now: Timestamp,
) -> Result<u64, StoreError> {
    for _ in 0..MAX_ROUNDS {
        let h = store.header(run).await?;
        resolution.check(run, h.rec.status)?;
        let pending = if resolution.withdraws() {
            pending_of(&h)
        } else {
            Vec::new()
        };
        let events = resolution.clone().events(pending);
        if let Ok(seq) = store.deliver(&h, &events, now, None, vec![]).await? {
            return Ok(seq);
        }
    }
    Err(contention("resolve_blocked"))
}

/// The pending requests the header lists, ordered by cmd (the commit is conditioned on the
/// header, so the list is current when it lands).
fn pending_of(h: &Header) -> Vec<RequestId> {
    let mut pending = h.reqs.clone();
    pending.sort_by_key(|p| p.cmd);
    pending.into_iter().map(|p| RequestId::new(p.id)).collect()
}
