//! The server's one error type: an HTTP status, a stable code and a message, sent as JSON.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use eve_core::StoreError;

/// An error answer: `{"code": "...", "message": "..."}` with its HTTP status.
///
/// Codes are stable (match on them); messages say what to do.
///
/// | status | codes |
/// | --- | --- |
/// | 400 | `malformed` (bad JSON, header, query or id), `invalid_input`, `invalid_query` (a `query=` the run search language refuses; the message names the offending token), `invalid_id` (an id the client chose breaks [`eve_core::check_client_id`]'s limits) |
/// | 401 | `unauthorized` (with `WWW-Authenticate: Bearer realm="eve"`) |
/// | 403 | `cross_origin`, `forbidden` |
/// | 404 | `not_found`, `unknown_webhook` |
/// | 409 | `already_answered`, `not_live`, `not_a_task`, `session_ended`, `idempotency_mismatch`, `background_call` |
/// | 410 | `withdrawn` |
/// | 413 | `too_large` |
/// | 422 | `invalid_answer` |
/// | 500 | `internal` |
/// | 503 | `unavailable` (the store is unreachable for now: retry after `Retry-After` seconds), `storage_full` (a write found the store's disk full: nothing was written, reads still work; `Retry-After: 30`) |
///
/// Every 503 carries `Retry-After`. Messages are written for the caller: a store's own wording
/// (a driver's message, an SQL position) goes to the server's log, never into an answer.
#[derive(Debug, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// The `WWW-Authenticate` challenge sent with the answer (RFC 6750), if any.
    challenge: Option<String>,
    /// The `Retry-After` sent with the answer, in seconds (every 503 has one: 1 by default).
    retry_after: Option<u32>,
    /// The store's description of an unreachable store, for the outage log (never sent).
    store_fault: Option<String>,
}

/// The caller's message for a store that cannot be reached.
pub(crate) const UNAVAILABLE_MESSAGE: &str = "the store cannot be reached right now (it may be \
     restarting); retry the same call after Retry-After seconds: a call the store recorded \
     already is answered as recorded, never applied twice";

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            challenge: None,
            retry_after: None,
            store_fault: None,
        }
    }

    /// 503 `unavailable`: the store did not answer (`detail`, the store's own words, is
    /// logged once per outage and never sent); `Retry-After: 1`.
    pub(crate) fn unavailable(detail: impl Into<String>) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            UNAVAILABLE_MESSAGE,
        );
        e.retry_after = Some(1);
        e.store_fault = Some(detail.into());
        e
    }

    /// Replaces the message (the kind, status and headers stay).
    pub(crate) fn set_message(&mut self, message: impl Into<String>) {
        self.message = message.into();
    }

    /// The same error sent with `WWW-Authenticate: {challenge}`.
    pub(crate) fn with_challenge(mut self, challenge: String) -> Self {
        self.challenge = Some(challenge);
        self
    }

    /// 400 `malformed`.
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "malformed", message)
    }

    /// 400 `invalid_query`: a run search ([`eve_core::RunSearch`]) that does not parse.
    pub fn invalid_query(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_query", message)
    }

    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 413 `too_large`.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the request body is larger than the server's limit of {limit} bytes; send a smaller body"),
        )
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable code.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let mut message = e.to_string();
        let (status, code) = match &e {
            StoreError::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
            StoreError::AlreadyAnswered { .. } => (StatusCode::CONFLICT, "already_answered"),
            StoreError::SessionEnded { .. } => (StatusCode::CONFLICT, "session_ended"),
            StoreError::RunNotEnded { .. } => (StatusCode::CONFLICT, "not_ended"),
            StoreError::Withdrawn { .. } | StoreError::RunEnded { .. } => {
                (StatusCode::GONE, "withdrawn")
            }
            StoreError::InvalidAnswer { .. } => {
                (StatusCode::UNPROCESSABLE_ENTITY, "invalid_answer")
            }
            StoreError::InvalidInput(_) => (StatusCode::BAD_REQUEST, "invalid_input"),
            StoreError::LimitExceeded { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            StoreError::Unavailable { .. } => {
                tracing::debug!(error = %e, "store unavailable");
                return Self::unavailable(message);
            }
            StoreError::StorageFull { .. } => {
                tracing::error!(error = %e, "a write was refused: the store's storage is full");
                let mut full = Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "storage_full",
                    "the server's storage is full, so nothing of this call was recorded; reads \
                     still work: retry after Retry-After seconds, once an operator has freed space",
                );
                full.retry_after = Some(30);
                return full;
            }
            StoreError::Other { .. } => {
                tracing::error!(error = %e, "store error");
                message = "the store failed unexpectedly; the server's log has the details".into();
                (StatusCode::INTERNAL_SERVER_ERROR, "internal")
            }
            _ => {
                tracing::error!(error = %e, "store error");
                (StatusCode::INTERNAL_SERVER_ERROR, "internal")
            }
        };
        Self::new(status, code, message)
    }
}

impl From<eve_core::InvalidId> for ApiError {
    fn from(e: eve_core::InvalidId) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_id", e.to_string())
    }
}

/// The body of every error answer (the schema `Error` of the OpenAPI description).
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
#[schema(as = Error)]
pub(crate) struct ErrorBody<'a> {
    /// Stable: match on it (`malformed`, `not_found`, `forbidden`, …; see the crate docs).
    #[schema(example = "not_found")]
    code: &'a str,
    /// What went wrong and what to do about it, for a person.
    message: &'a str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (
            self.status,
            Json(ErrorBody {
                code: self.code,
                message: &self.message,
            }),
        )
            .into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE || self.retry_after.is_some() {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(self.retry_after.unwrap_or(1)),
            );
        }
        if let Some(detail) = self.store_fault {
            resp.extensions_mut()
                .insert(crate::outage::StoreFault(detail));
        }
        if let Some(c) = self
            .challenge
            .and_then(|c| axum::http::HeaderValue::from_str(&c).ok())
        {
            resp.headers_mut()
                .insert(axum::http::header::WWW_AUTHENTICATE, c);
        }
        resp
    }
}

/// The fallback for unknown paths: a JSON 404.
pub(crate) async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!(
        "no route for {}; see the eve-server docs for the routes",
        uri.path()
    ))
}

/// The body of a request, or 413 (over the body limit) / 400 (unreadable) as JSON errors.
pub(crate) fn body(
    inner: &crate::Inner,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<axum::body::Bytes, ApiError> {
    match body {
        Ok(b) => Ok(b),
        Err(r) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            Err(ApiError::too_large(inner.config.body_limit))
        }
        Err(r) => Err(ApiError::malformed(format!(
            "the request body could not be read: {}",
            r.body_text()
        ))),
    }
}

/// Marks a response whose body is the workflow's own (a webhook's `respond_with`), which
/// [`json_errors`] leaves as it is.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OwnBody;

/// Turns every error answer that is not JSON yet (a 405 for a wrong method, a path or query
/// the router could not decode, …) into the `{"code", "message"}` body every route uses.
pub(crate) async fn json_errors(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if status.as_u16() < 400 || is_json || resp.extensions().get::<OwnBody>().is_some() {
        return resp;
    }
    let allow = resp.headers().get(axum::http::header::ALLOW).cloned();
    let text = match axum::body::to_bytes(resp.into_body(), 4096).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_owned(),
        Err(_) => String::new(),
    };
    let code = match status {
        StatusCode::BAD_REQUEST => "malformed",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::URI_TOO_LONG => "uri_too_long",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        s if s.is_server_error() => "internal",
        _ => "error",
    };
    let message = if text.is_empty() {
        match status {
            StatusCode::METHOD_NOT_ALLOWED => format!(
                "this route does not take this method; it takes {}",
                allow
                    .as_ref()
                    .and_then(|a| a.to_str().ok())
                    .unwrap_or("another")
            ),
            s => s.canonical_reason().unwrap_or("error").to_owned(),
        }
    } else {
        text
    };
    let mut out = ApiError::new(status, code, message).into_response();
    if let Some(a) = allow {
        out.headers_mut().insert(axum::http::header::ALLOW, a);
    }
    out
}

/// A request body that must be one JSON object of type `T` (serde alone would also take a
/// struct from an array of its fields in order): 400 `malformed` naming `expected` otherwise.
pub(crate) fn json_object<T: serde::de::DeserializeOwned>(
    body: &[u8],
    expected: &str,
) -> Result<T, ApiError> {
    let malformed = |why: String| ApiError::malformed(format!("send {expected}: {why}"));
    match serde_json::from_slice(body).map_err(|e| malformed(e.to_string()))? {
        serde_json::Value::Object(o) => {
            serde_json::from_value(o.into()).map_err(|e| malformed(e.to_string()))
        }
        other => Err(malformed(format!("got {}", json_kind(&other)))),
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}
