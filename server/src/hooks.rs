//! `POST /v1/hooks/{token}`: delivers a JSON payload to the live hook a workflow created with a
//! caller-chosen token (`ctx.create_hook(token)`), as [`eve_core::engine::resume_hook`] and
//! `eve hook resume` do.
//!
//! The route needs a key of scope operate: unlike a webhook's token, a hook's token is chosen
//! by the workflow (`render-p1`), often guessable, so it is no credential; resuming a hook acts
//! on a run as cancelling or resuming one does.
//!
//! Delivery is exactly once per `Idempotency-Key`, as for webhooks: a retry with the same key
//! gets the first delivery's answer (`duplicate: true`, also after the run ended, until it is
//! purged) and the run sees one payload; the same key with another payload is refused 409
//! `idempotency_mismatch`. Without the header, delivery is at least once. The body is the
//! payload, as JSON (`null` for none); the token, the key and the body are checked before the
//! store is touched.

use crate::error::ApiError;
use crate::Inner;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use eve_core::{Delivered, Event, Payload, RunId, StoreError};
use serde::Serialize;
use std::sync::Arc;

/// What a delivery to a hook answers.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct HookDelivered {
    /// The hook's token, as sent.
    token: String,
    /// The run waiting on the hook.
    run_id: RunId,
    /// The seq of the `HookReceived` event in the run's journal.
    seq: u64,
    /// Whether this `Idempotency-Key` was delivered before (nothing was written this time).
    duplicate: bool,
}

/// At most this many characters of a token are echoed in an error message.
const TOKEN_ECHO: usize = 80;

fn shown(token: &str) -> String {
    if token.chars().count() <= TOKEN_ECHO {
        format!("{token:?}")
    } else {
        let cut: String = token.chars().take(TOKEN_ECHO).collect();
        format!("{cut:?}…")
    }
}

/// Deliver a payload to a hook.
///
/// `POST /v1/hooks/{token}` (operate) with the payload as a JSON body: the run waiting on the
/// hook `ctx.create_hook(token)` made receives it, as with `eve hook resume`. 200
/// `{token, runId, seq, duplicate}`; with an `Idempotency-Key` a retry is answered the same
/// (`duplicate: true`) and delivers nothing again, also after the run ended. 404 when no live
/// hook has the token (never created, or its run ended: a hook's token is released with its
/// run) and for a webhook's or an agent call's token (they have routes of their own), 400 for
/// a body that is not JSON or a bad `Idempotency-Key`, 409 `idempotency_mismatch` for a key
/// delivered before with another payload, 410 `withdrawn` when the run ended as the payload
/// arrived, 413 for a payload over the limits.
#[utoipa::path(
    post,
    path = "/v1/hooks/{token}",
    operation_id = "resumeHook",
    tag = "hooks",
    params(
        ("token" = String, Path, description = "The hook's token, as the workflow chose it (`ctx.create_hook(token)`)"),
        ("Idempotency-Key" = Option<String>, Header, description = "1 to 255 visible ASCII characters: retries with the same key are delivered once"),
    ),
    request_body(content = serde_json::Value, description = "The payload, any JSON value (`null` for none)", content_type = "application/json"),
    responses(
        (status = 200, description = "Delivered, or a retry of a delivered `Idempotency-Key` with the same payload (`duplicate: true`)", body = HookDelivered),
        (status = 400, description = "`malformed`: a body that is not JSON (or nests too deep), several or a bad `Idempotency-Key`", body = crate::error::ErrorBody),
        (status = 404, description = "`not_found`: no live hook has this token (never created, or its run ended), or it is a webhook's or an agent call's token", body = crate::error::ErrorBody),
        (status = 409, description = "`idempotency_mismatch`: this `Idempotency-Key` was delivered before with another payload; nothing was delivered (send the new payload under a new key)", body = crate::error::ErrorBody),
        (status = 410, description = "`withdrawn`: the hook's run ended as the payload arrived; nothing was delivered", body = crate::error::ErrorBody),
        (status = 413, description = "`too_large`: over the body limit or the store's payload limit", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["operate"])),
)]
pub(crate) async fn resume(
    State(inner): State<Arc<Inner>>,
    Path(token): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<HookDelivered>, ApiError> {
    if crate::webhook::is_webhook_token(&token) {
        return Err(ApiError::not_found(format!(
            "{} is a webhook's token: deliver the request to its URL, POST {}/{{token}} (the token is its credential, no key needed)",
            shown(&token),
            crate::WEBHOOK_PATH
        )));
    }
    if token.starts_with("agent:") {
        return Err(ApiError::not_found(format!(
            "{} is the token of a subagent call: report its result with POST /v1/agents/{{id}}/result (GET /v1/agents lists the calls)",
            shown(&token)
        )));
    }
    let body = crate::error::body(&inner, body)?;
    let key = crate::webhook::idempotency_key(&headers)?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::malformed(
            "send the hook's payload as a JSON body (`null` for no payload)",
        ));
    }
    let value: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::malformed(format!(
            "the body is not JSON ({e}); send the hook's payload as a JSON value"
        ))
    })?;
    if let Ok(text) = std::str::from_utf8(&body) {
        crate::webhook::check_depth(text)?;
    }
    let payload = Payload::from_value(&value)
        .map_err(|e| ApiError::malformed(format!("the payload cannot be recorded: {e}")))?;
    let delivered = match inner
        .store
        .deliver_hook(&token, payload, key.as_deref(), inner.clock.now())
        .await
    {
        Ok(d) => d,
        Err(StoreError::NotFound { .. }) => {
            return Err(ApiError::not_found(format!(
                "no live hook has the token {}: it was never created, or its run ended (a hook's token is released when its run ends); `GET /v1/runs/{{id}}` shows a run's hooks",
                shown(&token)
            )))
        }
        Err(StoreError::RunEnded { run }) => {
            return Err(ApiError::new(
                StatusCode::GONE,
                "withdrawn",
                format!(
                    "run {run}, which waited on hook {}, has ended; the hook takes no more payloads",
                    shown(&token)
                ),
            ))
        }
        Err(e) => return Err(e.into()),
    };
    if delivered.duplicate {
        check_same_payload(&inner, &delivered, &value).await?;
    } else {
        inner.wrote();
    }
    Ok(Json(HookDelivered {
        token,
        run_id: delivered.run,
        seq: delivered.seq,
        duplicate: delivered.duplicate,
    }))
}

/// A retry with a delivered `Idempotency-Key` must carry the same payload (as JSON: whitespace
/// and key order aside); anything else is 409 `idempotency_mismatch`, so the caller learns its
/// new payload was not delivered. The recorded payload is the `HookReceived` at the duplicate's
/// seq, which the store keeps until the run is purged.
async fn check_same_payload(
    inner: &Inner,
    delivered: &Delivered,
    value: &serde_json::Value,
) -> Result<(), ApiError> {
    let page = inner.store.read(&delivered.run, delivered.seq, 1).await?;
    let Some(Event::HookReceived { payload, .. }) = page.into_iter().next().map(|e| e.event) else {
        tracing::warn!(run = %delivered.run, seq = delivered.seq, "a duplicate hook delivery names no HookReceived; not compared");
        return Ok(());
    };
    let recorded: serde_json::Value = payload.to_value().map_err(|e| StoreError::Corrupt {
        run: delivered.run.clone(),
        seq: delivered.seq,
        reason: format!("a HookReceived payload that is not JSON: {e}"),
    })?;
    if &recorded == value {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "idempotency_mismatch",
        "this Idempotency-Key was already used for a delivery with another payload; nothing \
         was delivered: send a new payload under a new key",
    ))
}
