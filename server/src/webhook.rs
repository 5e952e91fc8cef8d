//! `POST /.well-known/workflow/v1/webhook/{token}`: delivers an HTTP request to the run waiting
//! on the webhook.
//!
//! Delivery is exactly once per `Idempotency-Key`: a caller that retries with the same key gets
//! the same answer and the run sees one payload. The same key with another method or body is
//! refused 409 `idempotency_mismatch` (while the run waits and after it ended), never dropped
//! silently. Without the header, delivery is at-least-once (a retry after a lost response is a
//! second payload). Everything is checked before the store is touched: the token's shape (else
//! 404), the body's size (else 413), the headers, the idempotency key and a JSON body's syntax
//! (else 400).
//!
//! Credentials are not journaled: a header is left out of the recorded payload when its name is
//! one of [`SENSITIVE_HEADERS`], or ends in one of [`SENSITIVE_SUFFIXES`] (or is that word
//! alone), or is configured in [`crate::ServerConfig::webhook_drop_headers`]; unless it is
//! configured in [`crate::ServerConfig::webhook_keep_headers`].

use crate::error::ApiError;
use crate::Inner;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use eve_core::store::READ_PAGE;
use eve_core::{Delivered, Event, Payload, RunId, StoreError, WebhookRequest, WebhookResponse};
use serde::Serialize;
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use subtle::ConstantTimeEq;

/// The longest `Idempotency-Key` accepted, in bytes.
pub const IDEMPOTENCY_KEY_MAX: usize = 255;

/// The deepest nesting of arrays and objects a webhook's JSON body may have; a deeper body is
/// refused 400 before anything is delivered (the run could not decode it).
pub const MAX_JSON_DEPTH: usize = 64;

/// Request headers not journaled by name (credentials of the sender or of a proxy);
/// [`crate::ServerConfig::webhook_drop_headers`] adds more and
/// [`crate::ServerConfig::webhook_keep_headers`] keeps some back.
pub const SENSITIVE_HEADERS: [&str; 4] = [
    "authorization",
    "cookie",
    "proxy-authorization",
    "x-api-key",
];

/// Request headers whose name ends in `-` and one of these words (or is the word alone) are not
/// journaled either: `X-Auth-Token`, `X-Gitlab-Token`, `X-Client-Secret`, `X-Goog-Api-Key`….
/// Signatures (`X-Hub-Signature-256`) are kept: they are no credential, and a tool checks them.
pub const SENSITIVE_SUFFIXES: [&str; 8] = [
    "token",
    "secret",
    "password",
    "passwd",
    "api-key",
    "apikey",
    "credential",
    "credentials",
];

const TOKEN_PREFIX: &str = "wh_";

/// Whether `token` has the shape of a webhook token minted by `ctx.create_webhook`: `wh_`
/// followed by 32 to 128 lower-case hex digits (128 to 512 random bits). Anything else is
/// answered 404 without asking the store.
pub fn is_webhook_token(token: &str) -> bool {
    token.strip_prefix(TOKEN_PREFIX).is_some_and(|hex| {
        (32..=128).contains(&hex.len())
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn unknown_webhook() -> ApiError {
    // One answer for a token that never existed, one whose run ended and one of the wrong
    // shape, so the answer tells nothing about which tokens exist.
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_webhook",
        "no live webhook has this URL: it was never created, or its run has ended",
    )
}

/// The payload of `HookReceived`: [`eve_core::WebhookRequest`] with the body kept as the raw
/// JSON text that was posted.
#[derive(Serialize)]
struct WireRequest<'a> {
    method: &'a str,
    headers: &'a BTreeMap<String, String>,
    body: &'a RawValue,
}

/// The default answer to a delivery.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Accepted {
    /// Always true.
    accepted: bool,
}

/// Deliver a request to the run waiting on a webhook.
///
/// The URL `ctx.create_webhook()` minted: the token is the credential, so no API key is needed.
/// The run receives `{method, headers, body}` (the body as its own JSON when it parses, else a
/// JSON string; an empty body is `null`; sensitive headers are left out). With an
/// `Idempotency-Key` a retry gets the same answer and the run sees one payload (for as long as
/// the run is kept); without one, delivery is at least once.
#[utoipa::path(
    method(post, put, patch),
    path = "/.well-known/workflow/v1/webhook/{token}",
    operation_id = "deliverWebhook",
    tag = "webhooks",
    params(
        ("token" = String, Path, description = "The webhook's token: `wh_` and 32 to 128 lower-case hex digits"),
        ("Idempotency-Key" = Option<String>, Header, description = "1 to 255 visible ASCII characters: retries with the same key are delivered once"),
    ),
    request_body(description = "Any body; JSON (`application/json`) is kept as JSON", content(("application/json"), ("*/*"))),
    responses(
        (status = 202, description = "Delivered (or a retry of a delivered key), when the webhook sets no response of its own", body = Accepted),
        (status = 400, description = "`malformed`: a JSON body that does not parse or nests too deep, a non-UTF-8 body or header, several or a bad `Idempotency-Key`", body = crate::error::ErrorBody),
        (status = 404, description = "`unknown_webhook`: never created, its run ended, or not a token", body = crate::error::ErrorBody),
        (status = 409, description = "`idempotency_mismatch`: this `Idempotency-Key` was delivered before with another method or body; nothing was delivered (send the new payload under a new key)", body = crate::error::ErrorBody),
        (status = 413, description = "`too_large`: over the body limit", body = crate::error::ErrorBody),
        (status = 503, description = "`unavailable`: the store cannot be reached; retry after `Retry-After` seconds with the same `Idempotency-Key` (the payload may be recorded already: the retry then gets the webhook's response)", body = crate::error::ErrorBody),
        (status = "default", description = "The webhook's own response (`respond_with`: its status, headers and JSON body)", body = serde_json::Value),
    ),
    security(()),
)]
pub(crate) async fn receive(
    State(inner): State<Arc<Inner>>,
    Path(token): Path<String>,
    method: Method,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let result = deliver(&inner, &token, method, headers, body).await;
    inner.metrics.webhook(match &result {
        Ok((_, true)) => "duplicate",
        Ok((_, false)) => "delivered",
        Err(e) if e.code() == "unknown_webhook" => "unknown",
        Err(e) if e.status().is_client_error() => "refused",
        Err(_) => "failed",
    });
    result.map(|(resp, _)| resp)
}

/// The delivery, and whether it was a duplicate.
async fn deliver(
    inner: &Arc<Inner>,
    token: &str,
    method: Method,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(Response, bool), ApiError> {
    let (inner, token) = (inner.clone(), token.to_owned());
    if !is_webhook_token(&token) {
        return Err(unknown_webhook());
    }
    let body = crate::error::body(&inner, body)?;
    let key = idempotency_key(&headers)?;
    let recorded = record_headers(&inner.config, &headers)?;
    let body = body_json(&headers, &body)?;
    check_depth(body.get())?;
    let request = WireRequest {
        method: method.as_str(),
        headers: &recorded,
        body: &body,
    };
    let payload = Payload::from_value(&request)
        .map_err(|e| ApiError::malformed(format!("the request cannot be recorded as JSON: {e}")))?;

    let delivered = match inner
        .store
        .deliver_hook(&token, payload, key.as_deref(), inner.clock.now())
        .await
    {
        Ok(d) => d,
        Err(StoreError::NotFound { .. } | StoreError::RunEnded { .. }) => {
            return Err(unknown_webhook())
        }
        Err(e) => return Err(e.into()),
    };
    if delivered.duplicate {
        check_same_request(&inner, &delivered, &request).await?;
    } else {
        inner.wrote();
    }
    let respond_with = respond_with_retried(&inner, &token, &delivered).await?;
    let resp = match respond_with {
        Some(r) => custom_response(&r),
        None => accepted(),
    };
    Ok((resp, delivered.duplicate))
}

/// A retry with a delivered `Idempotency-Key` must be that request again: the same method and
/// the same body (as JSON, so whitespace and key order aside; headers may differ, a sender's
/// retry often changes a date or a trace id). Anything else is 409 `idempotency_mismatch`, so
/// the sender learns its new payload was not delivered. The recorded request is the
/// `HookReceived` at the duplicate's seq, which the store keeps until the run is purged.
async fn check_same_request(
    inner: &Inner,
    delivered: &Delivered,
    request: &WireRequest<'_>,
) -> Result<(), ApiError> {
    let page = inner.store.read(&delivered.run, delivered.seq, 1).await?;
    let Some(Event::HookReceived { payload, .. }) = page.into_iter().next().map(|e| e.event) else {
        tracing::warn!(run = %delivered.run, seq = delivered.seq, "a duplicate webhook delivery names no HookReceived; not compared");
        return Ok(());
    };
    let recorded: WebhookRequest = payload.to_value().map_err(|e| StoreError::Corrupt {
        run: delivered.run.clone(),
        seq: delivered.seq,
        reason: format!("a HookReceived payload that is no webhook request: {e}"),
    })?;
    let body: serde_json::Value = serde_json::from_str(request.body.get())
        .map_err(|e| ApiError::malformed(format!("the body is not JSON: {e}")))?;
    if recorded.method == request.method && recorded.body == body {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "idempotency_mismatch",
        "this Idempotency-Key was already used for a delivery with another method or body; \
         nothing was delivered: send a new payload under a new key",
    ))
}

fn accepted() -> Response {
    (
        StatusCode::ACCEPTED,
        axum::Json(Accepted { accepted: true }),
    )
        .into_response()
}

pub(crate) fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all("idempotency-key").iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::malformed(
            "send one Idempotency-Key header, not several",
        ));
    }
    let bytes = v.as_bytes();
    if bytes.is_empty()
        || bytes.len() > IDEMPOTENCY_KEY_MAX
        || !bytes.iter().all(|b| (0x21..=0x7e).contains(b))
    {
        return Err(ApiError::malformed(format!(
            "the Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_MAX} visible ASCII characters"
        )));
    }
    Ok(v.to_str().ok().map(str::to_owned))
}

/// Whether a header name (lower-case) is a credential by the built-in rule:
/// [`SENSITIVE_HEADERS`] and [`SENSITIVE_SUFFIXES`].
pub fn is_sensitive_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SENSITIVE_HEADERS.contains(&name.as_str())
        || SENSITIVE_SUFFIXES.iter().any(|word| {
            name.strip_suffix(word)
                .is_some_and(|rest| rest.is_empty() || rest.ends_with('-'))
        })
}

/// Whether a header is journaled: not a sensitive one (the built-in rule and the configured
/// additions) unless the configuration keeps it.
fn recorded(config: &crate::ServerConfig, name: &str) -> bool {
    let listed = |list: &[String]| list.iter().any(|h| h.eq_ignore_ascii_case(name));
    let sensitive = is_sensitive_header(name) || listed(&config.webhook_drop_headers);
    !sensitive || listed(&config.webhook_keep_headers)
}

/// Lower-case names (as HTTP/1 and 2 give them); repeated headers joined with ", "; sensitive
/// headers left out (see [`recorded`]).
fn record_headers(
    config: &crate::ServerConfig,
    headers: &HeaderMap,
) -> Result<BTreeMap<String, String>, ApiError> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in headers {
        if !recorded(config, name.as_str()) {
            continue;
        }
        let v = value.to_str().map_err(|_| {
            ApiError::malformed(format!(
                "header {name} is not visible ASCII; webhook headers are recorded as text"
            ))
        })?;
        out.entry(name.as_str().to_owned())
            .and_modify(|s| {
                s.push_str(", ");
                s.push_str(v);
            })
            .or_insert_with(|| v.to_owned());
    }
    Ok(out)
}

fn is_json_content_type(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|ct| {
            let essence = ct
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            essence == "application/json" || essence.ends_with("+json")
        })
        .unwrap_or(false)
}

/// The body as JSON: its own JSON when it parses (it must, under a JSON content type), else the
/// text as a JSON string; an empty body is `null`.
fn body_json(headers: &HeaderMap, body: &Bytes) -> Result<Box<RawValue>, ApiError> {
    if body.is_empty() {
        return Ok(RawValue::from_string("null".into()).expect("null is JSON"));
    }
    let text = std::str::from_utf8(body).map_err(|_| {
        ApiError::malformed("the request body is not UTF-8 text; send JSON or text")
    })?;
    match RawValue::from_string(text.to_owned()) {
        Ok(raw) => Ok(raw),
        Err(e) if is_json_content_type(headers) => Err(ApiError::malformed(format!(
            "the body is not valid JSON although the Content-Type says so: {e}"
        ))),
        Err(_) => {
            let quoted = serde_json::to_string(text).expect("a string serializes");
            Ok(RawValue::from_string(quoted).expect("a JSON string is JSON"))
        }
    }
}

/// 400 when the JSON text nests arrays and objects deeper than [`MAX_JSON_DEPTH`]. The text is
/// valid JSON, so brackets inside strings are the only ones to skip.
pub(crate) fn check_depth(json: &str) -> Result<(), ApiError> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for b in json.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_JSON_DEPTH {
                    return Err(ApiError::malformed(format!(
                        "the JSON body nests deeper than {MAX_JSON_DEPTH} levels; flatten it"
                    )));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// How long a committed delivery keeps trying to read its webhook's `respond_with` before it
/// answers 503 (the caller's retry with the same `Idempotency-Key` then gets the response).
const RESPOND_WITH_PATIENCE: Duration = Duration::from_secs(3);

/// [`respond_with`], retried with backoff for [`RESPOND_WITH_PATIENCE`] while the store is
/// unreachable. The payload is recorded by now, so a default 202 would be a lie when the
/// webhook configured another answer: when the response still cannot be read, the caller gets
/// 503 asking for a retry with the same `Idempotency-Key` (which is then a duplicate that gets
/// the recorded response, and delivers nothing again).
async fn respond_with_retried(
    inner: &Inner,
    token: &str,
    delivered: &Delivered,
) -> Result<Option<WebhookResponse>, ApiError> {
    let deadline = tokio::time::Instant::now() + RESPOND_WITH_PATIENCE;
    let mut pause = Duration::from_millis(50);
    loop {
        let read = tokio::time::timeout_at(deadline, respond_with(inner, token, delivered)).await;
        let err = match read {
            Ok(Ok(r)) => return Ok(r),
            Ok(Err(e)) if !e.is_retryable() => return Err(e.into()),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {RESPOND_WITH_PATIENCE:?}"),
        };
        if tokio::time::Instant::now() + pause >= deadline {
            tracing::warn!(error = %err, run = %delivered.run, seq = delivered.seq,
                "a webhook delivery is recorded but its respond_with cannot be read; answering 503");
            let mut e = ApiError::unavailable(err);
            e.set_message(
                "the payload was recorded, but the webhook's response cannot be read right now: \
                 retry with the same Idempotency-Key after Retry-After seconds to get it (the \
                 payload is not delivered twice; without an Idempotency-Key a retry is a new \
                 delivery)",
            );
            return Err(e);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// The `respond_with` recorded in the `HookCreated` of the hook that received `delivered`.
async fn respond_with(
    inner: &Inner,
    token: &str,
    delivered: &Delivered,
) -> Result<Option<WebhookResponse>, StoreError> {
    let key: (RunId, String) = (delivered.run.clone(), token.to_owned());
    if let Some(r) = inner.hooks.lock().expect("hook cache lock").get(&key) {
        return Ok(r.clone());
    }
    // The hook's `HookCreated` precedes the delivery: read pages up to it (one read for most
    // journals), never to the journal's end.
    let mut found = None;
    let mut seq = 0;
    while found.is_none() && seq <= delivered.seq {
        let page = inner.store.read(&delivered.run, seq, READ_PAGE).await?;
        let Some(last) = page.last() else { break };
        seq = last.seq + 1;
        found = page.into_iter().find_map(|e| match e.event {
            Event::HookCreated {
                token: t,
                respond_with,
                ..
            } if bool::from(t.as_bytes().ct_eq(token.as_bytes())) => Some(respond_with),
            _ => None,
        });
    }
    let Some(r) = found else {
        return Ok(None);
    };
    let mut cache = inner.hooks.lock().expect("hook cache lock");
    if cache.len() >= crate::HOOK_CACHE_MAX {
        cache.clear();
    }
    cache.insert(key, r.clone());
    Ok(r)
}

/// The recorded response: its status, headers and body. A JSON string body under a non-JSON
/// `content-type` is sent as that text; a `null` body is an empty body; any other body is JSON.
fn custom_response(r: &WebhookResponse) -> Response {
    let Ok(status) = StatusCode::from_u16(r.status) else {
        tracing::warn!(
            status = r.status,
            "respond_with has an invalid status; answering 202"
        );
        return accepted();
    };
    let mut headers = HeaderMap::new();
    for (k, v) in &r.headers {
        match (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            (Ok(k), Ok(v)) => {
                headers.append(k, v);
            }
            _ => tracing::warn!(header = %k, "respond_with has an invalid header; left out"),
        }
    }
    let body = match &r.body {
        serde_json::Value::Null => String::new(),
        serde_json::Value::String(s)
            if headers.contains_key(header::CONTENT_TYPE) && !is_json_content_type(&headers) =>
        {
            s.clone()
        }
        other => {
            headers
                .entry(header::CONTENT_TYPE)
                .or_insert(HeaderValue::from_static("application/json"));
            other.to_string()
        }
    };
    let mut resp = (status, headers, body).into_response();
    resp.extensions_mut().insert(crate::error::OwnBody);
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_shape() {
        let hex64 = "0123456789abcdef".repeat(4);
        assert!(is_webhook_token(&format!("wh_{hex64}")));
        assert!(is_webhook_token(&format!("wh_{}", &hex64[..32])));
        assert!(!is_webhook_token(&format!("wh_{}", &hex64[..31])));
        assert!(!is_webhook_token(&format!("wh_{}", hex64.to_uppercase())));
        assert!(!is_webhook_token(&format!("xx_{hex64}")));
        assert!(!is_webhook_token("render-p1"));
        assert!(!is_webhook_token(&format!("wh_{hex64}/../x")));
    }

    #[test]
    fn bodies_keep_json_and_quote_text() {
        let mut h = HeaderMap::new();
        let raw = body_json(&h, &Bytes::from_static(br#"{"b": 1.50, "a": [1]}"#)).unwrap();
        assert_eq!(
            raw.get(),
            r#"{"b": 1.50, "a": [1]}"#,
            "JSON kept byte for byte"
        );
        let raw = body_json(&h, &Bytes::from_static(b"status=ok")).unwrap();
        assert_eq!(raw.get(), r#""status=ok""#);
        assert_eq!(body_json(&h, &Bytes::new()).unwrap().get(), "null");
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
        let err = body_json(&h, &Bytes::from_static(b"{nope")).unwrap_err();
        assert_eq!(err.status(), StatusCode::BAD_REQUEST);
        let err = body_json(&HeaderMap::new(), &Bytes::from_static(&[0xff, 0xfe])).unwrap_err();
        assert_eq!(err.code(), "malformed");
    }

    #[test]
    fn depth_limit() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(check_depth(&deep(MAX_JSON_DEPTH)).is_ok());
        assert!(check_depth(&deep(MAX_JSON_DEPTH + 1)).is_err());
        let quoted = format!(r#"{{"a": "{}\"[[", "b": [1]}}"#, "[".repeat(500));
        assert!(
            check_depth(&quoted).is_ok(),
            "brackets in strings do not count"
        );
    }

    #[test]
    fn sensitive_headers_are_not_recorded() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("authorization", "Bearer secret"),
            ("cookie", "a=b"),
            ("proxy-authorization", "Basic x"),
            ("x-api-key", "k"),
            ("x-signature", "sig"),
            ("x-custom-secret", "s"),
            ("content-type", "application/json"),
        ] {
            h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let config = crate::ServerConfig {
            webhook_drop_headers: vec!["X-Custom-Secret".into()],
            webhook_keep_headers: vec!["x-api-key".into()],
            ..crate::ServerConfig::default()
        };
        let kept: Vec<String> = record_headers(&config, &h).unwrap().into_keys().collect();
        assert_eq!(kept, ["content-type", "x-api-key", "x-signature"]);
    }

    #[test]
    fn the_suffix_rule() {
        for name in [
            "x-auth-token",
            "x-gitlab-token",
            "X-Shopify-Access-Token",
            "token",
            "x-client-secret",
            "x-db-password",
            "x-goog-api-key",
            "x-apikey",
            "x-aws-credentials",
            "authorization",
        ] {
            assert!(is_sensitive_header(name), "{name}");
        }
        for name in [
            "x-hub-signature-256",
            "idempotency-key",
            "x-tokens-left",
            "x-request-id",
            "content-type",
            "x-secretary",
            "user-agent",
        ] {
            assert!(!is_sensitive_header(name), "{name}");
        }
    }

    #[test]
    fn custom_responses() {
        let r = WebhookResponse {
            status: 201,
            headers: [("content-type".to_owned(), "text/plain".to_owned())].into(),
            body: serde_json::json!("thanks"),
        };
        let resp = custom_response(&r);
        assert_eq!(resp.status(), StatusCode::CREATED);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/plain");
        let resp = custom_response(&WebhookResponse::json(serde_json::json!({"ok": true})));
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
    }
}
