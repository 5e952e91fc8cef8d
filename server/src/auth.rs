//! API keys: minting, hashing, checking a request's credential against the store, signing the
//! page in with a cookie, and the admin routes that create, list and revoke keys.
//!
//! A key's text is `eve_<id>_<secret>`: `id` is 12 hex digits (shown in listings, names the key
//! for revocation), `secret` 64 hex digits (256 random bits). The store keeps only the SHA-256
//! of the whole text ([`key_hash`]); the text is shown once, when the key is created. A request
//! carries it as `Authorization: Bearer <key>` or, from the page, in the HttpOnly cookie
//! [`COOKIE`] set by `POST /v1/auth/session`. The looked-up hash is compared with the computed
//! one in constant time.

use crate::camel::Camel;
use crate::error::ApiError;
use crate::Inner;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use eve_core::{ApiKey, JournalStore, KeyScope, SessionId, StoreError, Timestamp};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The prefix of every key's text.
pub const KEY_PREFIX: &str = "eve_";

/// The name of the cookie the page signs in with.
pub const COOKIE: &str = "eve_key";

/// A key just created: its text (shown once, never stored) and its record.
#[derive(Clone, Debug)]
pub struct NewKey {
    /// `eve_<id>_<secret>`: what a client sends as `Authorization: Bearer`.
    pub text: String,
    /// What the store keeps.
    pub record: ApiKey,
}

/// The lowercase hex SHA-256 of a key's text: what the store keeps and looks keys up by.
pub fn key_hash(text: &str) -> String {
    hex(&Sha256::digest(text.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `n` bytes from the operating system's random source, as lowercase hex.
pub(crate) fn random_hex(n: usize) -> Result<String, StoreError> {
    let mut buf = vec![0u8; n];
    getrandom::fill(&mut buf).map_err(|e| StoreError::Other {
        backend: "eve-server",
        source: format!("the operating system gave no random bytes: {e}").into(),
    })?;
    Ok(hex(&buf))
}

/// The id part of a key's text, if it has the shape `eve_<12 hex>_<64 hex>`.
fn key_id(text: &str) -> Option<&str> {
    let (id, secret) = text.strip_prefix(KEY_PREFIX)?.split_once('_')?;
    let is_hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    (is_hex(id, 12) && is_hex(secret, 64)).then_some(id)
}

/// Mints a key named `name` with `scope` and stores it; it never expires.
///
/// # Errors
/// `InvalidInput` for a name that breaks [`eve_core::check_client_id`]'s limits (empty, longer
/// than [`eve_core::MAX_CLIENT_ID_BYTES`] bytes, not printable); the store's errors.
pub async fn create_key(
    store: &dyn JournalStore,
    name: &str,
    scope: KeyScope,
    now: Timestamp,
) -> Result<NewKey, StoreError> {
    create_key_expiring(store, name, scope, None, now).await
}

/// Mints a key as [`create_key`] does that opens nothing from `expires_at` on (401 `unauthorized`
/// saying it expired); `None` never expires.
///
/// # Errors
/// `InvalidInput` for an empty name or an expiry not after `now`; the store's errors.
pub async fn create_key_expiring(
    store: &dyn JournalStore,
    name: &str,
    scope: KeyScope,
    expires_at: Option<Timestamp>,
    now: Timestamp,
) -> Result<NewKey, StoreError> {
    create_key_limited(store, name, scope, None, expires_at, now).await
}

/// Mints a key as [`create_key_expiring`] does, limited to `sessions` when given (`None`:
/// every session): the server lets it act only on runs, requests and tasks of those sessions,
/// within its scope (see the crate docs, "Session-limited keys").
///
/// # Errors
/// `InvalidInput` for an empty name, an empty session list, a session id that breaks
/// [`eve_core::check_client_id`]'s limits or an expiry not after `now`; the store's errors.
pub async fn create_key_limited(
    store: &dyn JournalStore,
    name: &str,
    scope: KeyScope,
    sessions: Option<Vec<SessionId>>,
    expires_at: Option<Timestamp>,
    now: Timestamp,
) -> Result<NewKey, StoreError> {
    eve_core::check_client_id("key name", name)?;
    let id = random_hex(6)?;
    let text = format!("{KEY_PREFIX}{id}_{}", random_hex(32)?);
    let record = ApiKey {
        id,
        name: name.to_owned(),
        scope,
        hash: key_hash(&text),
        created_at: now,
        revoked_at: None,
        expires_at,
        sessions,
        request: None,
    };
    store.create_key(record.clone()).await?;
    Ok(NewKey { text, record })
}

/// The key `text` names, if it is a live key of the store at `now`: found by hash, hashes
/// compared in constant time, not revoked, not expired.
///
/// # Errors
/// 401 `unauthorized` (malformed, unknown, revoked or expired), or the store's error.
pub(crate) async fn check_key(
    store: &dyn JournalStore,
    text: &str,
    now: Timestamp,
) -> Result<ApiKey, ApiError> {
    let Some(id) = key_id(text) else {
        return Err(invalid_token(
            "the key is not an eve key (eve_<id>_<secret>); create one with `eve keys create`",
        ));
    };
    let hash = key_hash(text);
    let key = store.key_by_hash(&hash).await?;
    match key {
        Some(k)
            if bool::from(k.hash.as_bytes().ct_eq(hash.as_bytes()))
                && bool::from(k.id.as_bytes().ct_eq(id.as_bytes())) =>
        {
            if k.revoked_at.is_some() {
                Err(invalid_token(
                    "this key was revoked; ask an admin for a new one",
                ))
            } else if k.request.is_some() {
                Err(invalid_token(
                    "this is an answer link, not an API key; open it as a link (/answer/…)",
                ))
            } else if !k.is_active(now) {
                Err(unauthorized(
                    "this key has expired; ask an admin for a new one (`eve keys create --expires-in 30d`)",
                ))
            } else {
                Ok(k)
            }
        }
        _ => Err(invalid_token(
            "unknown key; check it, or create one with `eve keys create`",
        )),
    }
}

/// The realm every challenge names (RFC 6750 section 3).
const REALM: &str = "eve";

/// 401 for a request that sent no key (or not as a bearer token): `WWW-Authenticate: Bearer
/// realm="eve"`, without an error code, as RFC 6750 section 3.1 asks when a request carries no
/// credential.
fn unauthorized(message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
        .with_challenge(format!("Bearer realm=\"{REALM}\""))
}

/// 401 for a key that was sent but opens nothing (malformed, unknown, revoked):
/// `WWW-Authenticate: Bearer realm="eve", error="invalid_token", error_description="…"`.
fn invalid_token(message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).with_challenge(format!(
        "Bearer realm=\"{REALM}\", error=\"invalid_token\", error_description=\"{}\"",
        description(message)
    ))
}

/// 403 for a live key of too small a scope: `WWW-Authenticate: Bearer realm="eve",
/// error="insufficient_scope", scope="<needed>"` (RFC 6750 section 3.1).
fn insufficient_scope(key: &ApiKey, needed: KeyScope) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!(
            "key {} has scope {}; this route needs {needed} or higher",
            key.id, key.scope
        ),
    )
    .with_challenge(format!(
        "Bearer realm=\"{REALM}\", error=\"insufficient_scope\", scope=\"{needed}\""
    ))
}

/// `message` with only the characters RFC 6750 allows in `error_description` (printable ASCII
/// but `"` and backslash).
fn description(message: &str) -> String {
    message
        .chars()
        .filter(|&c| matches!(c, ' '..='~') && c != '"' && c != '\\')
        .collect()
}

/// The credential a request carries: `Authorization: Bearer`, else the page's cookie.
fn credential(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    if let Some(v) = headers.get(header::AUTHORIZATION) {
        let v = v.to_str().unwrap_or("");
        let token = v
            .strip_prefix("Bearer ")
            .or_else(|| v.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| unauthorized("send the key as `Authorization: Bearer <key>`"))?;
        return Ok(Some(token.to_owned()));
    }
    Ok(headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned()))
}

/// Lets the request through when it carries a live key whose scope allows `needed` (or when the
/// server runs with `insecure_no_auth`): 401 without a usable key, 403 `forbidden` when the
/// key's scope is too small or, for a key limited to sessions, when the route acts outside
/// them ([`crate::limits`]). The key's record goes into the request's extensions, so a
/// handler knows who acts (the answer route records its name); with `insecure_no_auth` there
/// is none.
pub(crate) async fn require(
    State((inner, needed)): State<(Arc<Inner>, KeyScope)>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if inner.config.insecure_no_auth {
        return Ok(next.run(req).await);
    }
    let Some(text) = credential(req.headers())? else {
        return Err(unauthorized(
            "this route needs an API key: send `Authorization: Bearer <key>` (create one with `eve keys create`)",
        ));
    };
    let key = check_key(&*inner.store, &text, inner.clock.now()).await?;
    if !key.scope.allows(needed) {
        return Err(insufficient_scope(&key, needed));
    }
    let mut req = crate::limits::check(&inner, &key, req).await?;
    req.extensions_mut().insert(key);
    Ok(next.run(req).await)
}

/// The body of `POST /v1/auth/session`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SignIn {
    /// The key's text, `eve_…`.
    key: String,
}

/// Who signed in (`POST /v1/auth/session`) or the key revoked (`POST /v1/keys/{id}/revoke`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct KeyRecord {
    /// The key's record (never its text or hash).
    #[schema(value_type = ApiKey)]
    key: Camel<ApiKey>,
}

/// A key just created.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct CreatedKey {
    /// The key's text, `eve_…`: shown in this answer only, never stored.
    key: String,
    /// Its record.
    #[schema(value_type = ApiKey)]
    record: Camel<ApiKey>,
}

/// Every key.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Keys {
    /// Oldest first, without hashes.
    #[schema(value_type = Vec<ApiKey>)]
    keys: Camel<Vec<ApiKey>>,
}

/// Sign the page in with a key.
///
/// `POST /v1/auth/session` with `{"key": "eve_…"}`: checks the key and sets it as an HttpOnly,
/// SameSite=Strict cookie (Secure when the base URL is https), so the page's requests and its
/// event stream carry it. 200 `{"key": ApiKey}` (who signed in); 401 for a key that opens
/// nothing.
#[utoipa::path(
    post,
    path = "/v1/auth/session",
    operation_id = "signIn",
    tag = "auth",
    request_body = SignIn,
    responses(
        (status = 200, description = "Signed in: the cookie `eve_key` is set", body = KeyRecord,
            headers(("set-cookie" = String, description = "`eve_key=…; HttpOnly; SameSite=Strict; Path=/`"))),
        (status = 400, description = "A body that is not `{\"key\": …}`", body = crate::error::ErrorBody),
        (status = 401, description = "A key that opens nothing (unknown, revoked or malformed)", body = crate::error::ErrorBody),
        (status = 403, description = "`cross_origin`: a browser request from another origin", body = crate::error::ErrorBody),
    ),
    security(()),
)]
pub(crate) async fn sign_in(
    State(inner): State<Arc<Inner>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = crate::error::body(&inner, body)?;
    let SignIn { key } = crate::error::json_object(&body, "{\"key\": \"eve_…\"}")?;
    let record = check_key(&*inner.store, key.trim(), inner.clock.now()).await?;
    let secure = if inner.config.base_url.starts_with("https://") {
        "; Secure"
    } else {
        ""
    };
    let cookie = format!(
        "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/{secure}",
        key.trim()
    );
    let cookie = HeaderValue::from_str(&cookie)
        .map_err(|_| ApiError::malformed("the key cannot be sent as a cookie"))?;
    Ok((
        StatusCode::OK,
        [(header::SET_COOKIE, cookie)],
        Json(KeyRecord { key: Camel(record) }),
    )
        .into_response())
}

/// Sign the page out.
///
/// `DELETE /v1/auth/session`: clears the page's cookie. 204.
#[utoipa::path(
    delete,
    path = "/v1/auth/session",
    operation_id = "signOut",
    tag = "auth",
    responses(
        (status = 204, description = "Signed out: the cookie is cleared"),
        (status = 403, description = "`cross_origin`: a browser request from another origin", body = crate::error::ErrorBody),
    ),
    security(()),
)]
pub(crate) async fn sign_out() -> Response {
    (
        StatusCode::NO_CONTENT,
        [(
            header::SET_COOKIE,
            format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
        )],
    )
        .into_response()
}

/// Who the page is signed in as: `GET /v1/auth/session`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Whoami {
    /// The key's name; null when the server runs without keys (`insecure_no_auth`).
    name: Option<String>,
    /// The key's id (the 12 hex digits after `eve_`); null without keys.
    key_id: Option<String>,
    /// What the key may do (`admin` when the server runs without keys).
    #[schema(value_type = KeyScope)]
    scope: KeyScope,
    /// The sessions the key is limited to; absent when it is not limited.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<String>>)]
    sessions: Option<Vec<SessionId>>,
}

/// Who is signed in.
///
/// `GET /v1/auth/session` (read): the name, id, scope and session limit (`sessions`, absent for
/// an unlimited key) of the key the request carries (the page's cookie or a bearer key), so the
/// page can say who is signed in and offer only what the scope allows; 401 without a usable key. Without keys (`insecure_no_auth`) the name and id are
/// null and the scope is `admin`.
#[utoipa::path(
    get,
    path = "/v1/auth/session",
    operation_id = "whoami",
    tag = "auth",
    responses(
        (status = 200, description = "The signed-in key's name, id and scope", body = Whoami),
    ),
    security(("bearer" = ["read"])),
)]
pub(crate) async fn whoami(key: Option<axum::Extension<ApiKey>>) -> Json<Whoami> {
    Json(match key {
        Some(axum::Extension(k)) => Whoami {
            name: Some(k.name),
            key_id: Some(k.id),
            scope: k.scope,
            sessions: k.sessions,
        },
        None => Whoami {
            name: None,
            key_id: None,
            scope: KeyScope::Admin,
            sessions: None,
        },
    })
}

/// The body of `POST /v1/keys`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateKey {
    /// What to call it (shown in listings and recorded as who answered).
    name: String,
    /// `read`, `answer`, `operate` or `admin`.
    #[schema(value_type = KeyScope)]
    scope: String,
    /// The sessions the key is limited to (at least one); leave it out for every session. A
    /// limited key acts, within its scope, only on those sessions' runs, requests and tasks.
    #[serde(default)]
    sessions: Option<Vec<String>>,
}

/// Create an API key.
///
/// `POST /v1/keys` with `{"name", "scope", "sessions"?}` (admin): 201 `{"key": "eve_…", "record":
/// ApiKey}`. The key's text is in this answer only. With `sessions` the key is limited to those
/// sessions (see `ApiKey.sessions`).
#[utoipa::path(
    post,
    path = "/v1/keys",
    operation_id = "createKey",
    tag = "keys",
    request_body = CreateKey,
    responses(
        (status = 201, description = "Created", body = CreatedKey),
        (status = 400, description = "`malformed`: a bad body, an unknown scope or an empty `sessions`; `invalid_id`: a name or session that breaks the limits of ids a client chooses (empty, over 256 bytes, not printable)", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["admin"])),
)]
pub(crate) async fn create(
    State(inner): State<Arc<Inner>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = crate::error::body(&inner, body)?;
    let req: CreateKey = crate::error::json_object(
        &body,
        "{\"name\": …, \"scope\": \"read|answer|operate|admin\", \"sessions\"?: [\"…\"]}",
    )?;
    eve_core::check_client_id("name", &req.name)?;
    let scope = KeyScope::parse(&req.scope).ok_or_else(|| {
        ApiError::malformed(format!(
            "unknown scope {:?}; use read, answer, operate or admin",
            req.scope
        ))
    })?;
    let sessions = match req.sessions {
        None => None,
        Some(list) if list.is_empty() => {
            return Err(ApiError::malformed(
                "sessions is empty: name at least one session, or leave sessions out for a key of every session",
            ))
        }
        Some(list) => {
            for s in &list {
                eve_core::check_client_id("sessions", s)?;
            }
            Some(list.into_iter().map(SessionId::new).collect())
        }
    };
    let new = create_key_limited(
        &*inner.store,
        &req.name,
        scope,
        sessions,
        None,
        inner.clock.now(),
    )
    .await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedKey {
            key: new.text,
            record: Camel(new.record),
        }),
    )
        .into_response())
}

/// List the API keys.
///
/// `GET /v1/keys` (admin): `{"keys": [ApiKey…]}`, oldest first, without hashes.
#[utoipa::path(
    get,
    path = "/v1/keys",
    operation_id = "listKeys",
    tag = "keys",
    responses((status = 200, description = "Every key, revoked ones included", body = Keys)),
    security(("bearer" = ["admin"])),
)]
pub(crate) async fn list(State(inner): State<Arc<Inner>>) -> Result<Json<Keys>, ApiError> {
    let keys = inner.store.list_keys().await?;
    Ok(Json(Keys { keys: Camel(keys) }))
}

/// Revoke an API key.
///
/// `POST /v1/keys/{id}/revoke` (admin): the revoked record; 404 for an unknown id.
#[utoipa::path(
    post,
    path = "/v1/keys/{id}/revoke",
    operation_id = "revokeKey",
    tag = "keys",
    params(("id" = String, Path, description = "The key's id (the 12 hex digits after `eve_`)")),
    responses(
        (status = 200, description = "Revoked (again: the first revocation's time)", body = KeyRecord),
        (status = 404, description = "No such key", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["admin"])),
)]
pub(crate) async fn revoke(
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
) -> Result<Json<KeyRecord>, ApiError> {
    let key = inner.store.revoke_key(&id, inner.clock.now()).await?;
    Ok(Json(KeyRecord { key: Camel(key) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_shape() {
        let id = "0123456789ab";
        let secret = "f".repeat(64);
        assert_eq!(key_id(&format!("eve_{id}_{secret}")), Some(id));
        assert_eq!(key_id(&format!("eve_{id}_{}", &secret[1..])), None);
        assert_eq!(key_id(&format!("eve_{}_{secret}", id.to_uppercase())), None);
        assert_eq!(key_id(&format!("xyz_{id}_{secret}")), None);
        assert_eq!(key_hash("abc").len(), 64);
        assert_eq!(
            key_hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
