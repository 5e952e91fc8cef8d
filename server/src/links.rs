//! Answer links: a capability to answer one request, for a person who has no key.
//!
//! A link is `{base_url}/answer/evl_<id>_<secret>`: `id` 12 hex digits, `secret` 64 hex digits
//! (256 bits from the operating system's random source). The store keeps it as an
//! [`ApiKey`] record like any key (only the SHA-256 of the token, never the token): scope
//! answer, [`ApiKey::request`] = the one request, [`ApiKey::sessions`] = that request's
//! session, an expiry, and the name `link:<id>`, which the journal records as `answeredBy`.
//! So a link works on every server process that shares the store and survives restarts, and an
//! admin sees and can revoke it in `GET /v1/keys`.
//!
//! A link opens only its own routes — `GET /answer/{token}` (the page of that one request),
//! `GET /v1/links/{token}` (the request as JSON) and `POST /v1/links/{token}/answer` — never an
//! API route ([`crate::auth`] refuses a link's token). It is single use: once an answer through
//! it is recorded the server revokes it, and a replay is 410 `link_used` with nothing written.
//! Two answers racing through one link are settled by the store's answer-once rule: the
//! second is a duplicate (the same answer, nothing written) or 409. An expired link is 410
//! `link_expired`, an unknown or forged one 404, and a link whose request was answered or
//! withdrawn otherwise 410 `not_pending`. Minting needs scope operate on the request's
//! session (`POST /v1/requests/{id}/links`) or the in-process [`create_answer_link`].

use crate::auth::{key_hash, random_hex};
use crate::camel::Camel;
use crate::error::ApiError;
use crate::metrics::Surface;
use crate::Inner;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use eve_core::{
    ApiKey, InputResponse, JournalStore, KeyScope, PendingRequest, RequestId, RunId, StoreError,
    Timestamp,
};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use subtle::ConstantTimeEq;

/// The prefix of an answer link's token (an API key's is [`crate::KEY_PREFIX`]).
pub const LINK_PREFIX: &str = "evl_";

/// The path an answer link's page lives under: `/answer/{token}`.
pub const LINK_PATH: &str = "/answer/";

/// How long a link lasts when its minter names no expiry: one day.
pub const DEFAULT_LINK_TTL: Duration = Duration::from_secs(24 * 3600);

/// The longest a link may last: 30 days.
pub const MAX_LINK_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// An answer link just minted: its URL (holding the token, shown once, never stored) and its
/// record.
#[derive(Clone, Debug)]
pub struct AnswerLink {
    /// `{base_url}/answer/evl_…`: what to show the person who answers.
    pub url: String,
    /// The token alone, `evl_<id>_<secret>` (the last segment of `url`).
    pub token: String,
    /// From then on the link opens nothing.
    pub expires_at: Timestamp,
    /// What the store keeps: scope answer, limited to the request and its session.
    pub record: ApiKey,
}

/// The id part of a link's token, if it has the shape `evl_<12 hex>_<64 hex>`.
fn link_id(token: &str) -> Option<&str> {
    let (id, secret) = token.strip_prefix(LINK_PREFIX)?.split_once('_')?;
    let is_hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    (is_hex(id, 12) && is_hex(secret, 64)).then_some(id)
}

/// The pending request `request` names, or `NotFound` when it is unknown or no longer pending
/// (answered, withdrawn, its run ended).
async fn pending(
    store: &dyn JournalStore,
    request: &RequestId,
) -> Result<(PendingRequest, String), StoreError> {
    let not_pending = || StoreError::not_found("pending request", request);
    let (run, _) = request.as_str().rsplit_once(':').ok_or_else(not_pending)?;
    let run = match store.get_run(&RunId::new(run)).await {
        Ok(r) => r,
        Err(StoreError::NotFound { .. }) => return Err(not_pending()),
        Err(e) => return Err(e),
    };
    let p = store
        .pending_requests(&run.session_id)
        .await?
        .into_iter()
        .find(|p| &p.request_id == request)
        .ok_or_else(not_pending)?;
    Ok((p, run.tool))
}

/// Mints an answer link for the pending request `request`, valid for `expires_in` from `now`
/// (at most [`MAX_LINK_TTL`]), and stores its record; the URL is `base_url` (without a
/// trailing slash, e.g. [`crate::ServerConfig::base_url`]) + `/answer/` + the token. Show the
/// URL to the person who should answer: it opens that request's page, answers it once, and
/// the journal records `link:<id>` as who answered.
///
/// # Errors
/// `NotFound` when `request` is unknown or no longer pending; `InvalidInput` for a subagent
/// call (the host answers those, `POST /v1/agents/{id}/result`) or an expiry of zero or over
/// [`MAX_LINK_TTL`]; the store's errors.
pub async fn create_answer_link(
    store: &dyn JournalStore,
    base_url: &str,
    request: &RequestId,
    expires_in: Duration,
    now: Timestamp,
) -> Result<AnswerLink, StoreError> {
    if expires_in.is_zero() || expires_in > MAX_LINK_TTL {
        return Err(StoreError::InvalidInput(format!(
            "an answer link lasts from 1 ms to {} days; give an expiry in that range, e.g. 1h",
            MAX_LINK_TTL.as_secs() / 86_400
        )));
    }
    let (p, _) = pending(store, request).await?;
    if p.request.agent.is_some() {
        return Err(StoreError::InvalidInput(format!(
            "request {request} is a subagent call, answered by the host (POST /v1/agents/{request}/result), not by a person through a link"
        )));
    }
    let id = random_hex(6)?;
    let token = format!("{LINK_PREFIX}{id}_{}", random_hex(32)?);
    let expires_at = now.plus(expires_in);
    let record = ApiKey {
        name: format!("link:{id}"),
        id,
        scope: KeyScope::Answer,
        hash: key_hash(&token),
        created_at: now,
        revoked_at: None,
        expires_at: Some(expires_at),
        sessions: Some(vec![p.session_id.clone()]),
        request: Some(request.clone()),
    };
    store.create_key(record.clone()).await?;
    Ok(AnswerLink {
        url: format!("{}{LINK_PATH}{token}", base_url.trim_end_matches('/')),
        token,
        expires_at,
        record,
    })
}

/// The link record `token` opens at `now`: 404 unknown or forged, 410 used (revoked) or
/// expired.
async fn open(inner: &Inner, token: &str) -> Result<ApiKey, ApiError> {
    let unknown = || {
        ApiError::not_found(
            "this answer link is not valid (mistyped, cut short or never made); ask whoever sent it for a new one",
        )
    };
    let id = link_id(token).ok_or_else(unknown)?;
    let hash = key_hash(token);
    let Some(k) = inner.store.key_by_hash(&hash).await? else {
        return Err(unknown());
    };
    if !(bool::from(k.hash.as_bytes().ct_eq(hash.as_bytes()))
        && bool::from(k.id.as_bytes().ct_eq(id.as_bytes())))
        || k.request.is_none()
    {
        return Err(unknown());
    }
    if k.revoked_at.is_some() {
        return Err(ApiError::new(
            StatusCode::GONE,
            "link_used",
            "this answer link was used (or revoked) and opens nothing any more; ask for a new one if the request still waits",
        ));
    }
    if !k.is_active(inner.clock.now()) {
        return Err(ApiError::new(
            StatusCode::GONE,
            "link_expired",
            "this answer link has expired; ask whoever sent it for a new one",
        ));
    }
    Ok(k)
}

/// The link's pending request: 410 `not_pending` when it was answered or withdrawn.
async fn request_of(inner: &Inner, link: &ApiKey) -> Result<(PendingRequest, String), ApiError> {
    let request = link.request.clone().unwrap_or_else(|| RequestId::new(""));
    match pending(&*inner.store, &request).await {
        Ok(p) => Ok(p),
        Err(StoreError::NotFound { .. }) => Err(ApiError::new(
            StatusCode::GONE,
            "not_pending",
            format!("request {request} no longer waits for an answer (answered, withdrawn or its run ended); nothing to do"),
        )),
        Err(e) => Err(e.into()),
    }
}

/// The body of `POST /v1/requests/{id}/links`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct CreateLink {
    /// How long the link lasts: a duration such as `"30m"`, `"4h"`, `"7d"` (default one day,
    /// at most 30 days).
    #[serde(default)]
    expires_in: Option<String>,
}

/// A link just minted.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CreatedLink {
    /// The link to show the person who answers: `{base}/answer/evl_…`. In this answer only.
    url: String,
    /// When it stops opening anything.
    #[schema(value_type = i64)]
    expires_at: Timestamp,
    /// The link's record id (`link:<id>` is recorded as who answered; revoke it with
    /// `POST /v1/keys/{id}/revoke`).
    link_id: String,
    /// The request it answers.
    #[schema(value_type = String)]
    request_id: RequestId,
}

/// Mint an answer link for a request.
///
/// `POST /v1/requests/{id}/links` with `{"expiresIn"?: "4h"}` (operate): 201 `{"url",
/// "expiresAt", "linkId", "requestId"}`. The URL opens a page of that one request for a person
/// with no key; it answers once, expires (default one day, at most 30 days), and the journal
/// records `link:<linkId>` as who answered. 404 when the request is unknown or no longer
/// pending; 400 for a subagent call or a bad `expiresIn`.
#[utoipa::path(
    post,
    path = "/v1/requests/{id}/links",
    operation_id = "createAnswerLink",
    tag = "requests",
    params(("id" = String, Path, description = "The request id, `{runId}:{cmd}`")),
    request_body(content = CreateLink, description = "Optional; `{}` or no body for a link of one day"),
    responses(
        (status = 201, description = "Minted", body = CreatedLink),
        (status = 400, description = "`malformed`: a bad body or `expiresIn`; `invalid_input`: a subagent call, or an expiry over 30 days", body = crate::error::ErrorBody),
        (status = 404, description = "No pending request has this id", body = crate::error::ErrorBody),
    ),
    security(("bearer" = ["operate"])),
)]
pub(crate) async fn create(
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = crate::error::body(&inner, body)?;
    let req: CreateLink = if body.iter().all(u8::is_ascii_whitespace) {
        CreateLink::default()
    } else {
        crate::error::json_object(&body, "{\"expiresIn\": \"4h\"} (or no body)")?
    };
    let ttl = match req.expires_in.as_deref().map(str::trim) {
        None | Some("") => DEFAULT_LINK_TTL,
        Some(s) => eve_core::engine::parse_duration(s).map_err(|e| {
            ApiError::malformed(format!(
                "expiresIn: {e}; give a duration such as \"4h\" or \"7d\""
            ))
        })?,
    };
    let link = create_answer_link(
        &*inner.store,
        &inner.config.base_url,
        &RequestId::new(id),
        ttl,
        inner.clock.now(),
    )
    .await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedLink {
            url: link.url,
            expires_at: link.expires_at,
            link_id: link.record.id,
            request_id: link.record.request.unwrap_or_else(|| RequestId::new("")),
        }),
    )
        .into_response())
}

/// What a link opens.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LinkView {
    /// The one request the link answers.
    #[schema(value_type = PendingRequest)]
    request: Camel<PendingRequest>,
    /// The tool of its run.
    tool: String,
    /// When the link stops opening anything.
    #[schema(value_type = i64)]
    expires_at: Timestamp,
}

/// The request an answer link opens.
///
/// `GET /v1/links/{token}` (the link's token is the credential; no key): 200 `{"request":
/// PendingRequest, "tool", "expiresAt"}`; 404 an unknown or forged link; 410 `link_used` (it
/// answered already), `link_expired`, or `not_pending` (the request was answered or withdrawn
/// otherwise).
#[utoipa::path(
    get,
    path = "/v1/links/{token}",
    operation_id = "showAnswerLink",
    tag = "requests",
    params(("token" = String, Path, description = "The link's token, `evl_…` (the last segment of its URL)")),
    responses(
        (status = 200, description = "The request", body = LinkView),
        (status = 404, description = "An unknown or forged link", body = crate::error::ErrorBody),
        (status = 410, description = "`link_used`, `link_expired` or `not_pending`", body = crate::error::ErrorBody),
    ),
    security(()),
)]
pub(crate) async fn show(
    State(inner): State<Arc<Inner>>,
    Path(token): Path<String>,
) -> Result<Json<LinkView>, ApiError> {
    let link = open(&inner, &token).await?;
    let (request, tool) = request_of(&inner, &link).await?;
    Ok(Json(LinkView {
        request: Camel(request),
        tool,
        expires_at: link.expires_at.unwrap_or(Timestamp(i64::MAX)),
    }))
}

/// The body of `POST /v1/links/{token}/answer`: as `POST /v1/requests/{id}/answer`'s.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct LinkAnswer {
    /// The chosen option's id.
    #[serde(default)]
    option_id: Option<String>,
    /// Free text, where the request allows it.
    #[serde(default)]
    text: Option<String>,
}

/// Answer through an answer link.
///
/// `POST /v1/links/{token}/answer` with `{"optionId": …}` or `{"text": …}` (the link's token is
/// the credential; no key): answers the link's one request, recording `link:<id>` as
/// `answeredBy`, then the link is used up. 200 as `POST /v1/requests/{id}/answer`; 404 an
/// unknown or forged link; 410 `link_used` (a replay: nothing written), `link_expired`,
/// `not_pending`; 409 answered otherwise; 422 not an answer the request accepts (the link stays
/// usable).
#[utoipa::path(
    post,
    path = "/v1/links/{token}/answer",
    operation_id = "answerByLink",
    tag = "requests",
    params(("token" = String, Path, description = "The link's token, `evl_…`")),
    request_body = LinkAnswer,
    responses(
        (status = 200, description = "Recorded", body = crate::session::Answered),
        (status = 400, description = "A body that is not one answer object", body = crate::error::ErrorBody),
        (status = 403, description = "`cross_origin`: a browser request from another origin", body = crate::error::ErrorBody),
        (status = 404, description = "An unknown or forged link", body = crate::error::ErrorBody),
        (status = 409, description = "The request was answered with another response", body = crate::error::ErrorBody),
        (status = 410, description = "`link_used`, `link_expired`, `not_pending` or `withdrawn`", body = crate::error::ErrorBody),
        (status = 422, description = "Not an answer the request accepts", body = crate::error::ErrorBody),
    ),
    security(()),
)]
pub(crate) async fn answer(
    State(inner): State<Arc<Inner>>,
    Path(token): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let link = open(&inner, &token).await?;
    let body = crate::error::body(&inner, body)?;
    let body: LinkAnswer = crate::error::json_object(
        &body,
        "the answer as a JSON object {\"optionId\": …} or {\"text\": …}",
    )?;
    let (request, _) = request_of(&inner, &link).await?;
    let response = InputResponse {
        option_id: body.option_id,
        text: body.text,
        answered_by: Some(link.name.clone()),
        agent: None,
    };
    let answered =
        crate::session::record_answer(&inner, request.request_id, response, Surface::Page).await?;
    // Used up: a replay opens nothing. Were this revocation lost (the store went away), a
    // replay could only repeat the same answer (a duplicate) or be refused (409).
    inner.store.revoke_key(&link.id, inner.clock.now()).await?;
    Ok(answered.into_response())
}

/// The page of an answer link.
///
/// `GET /answer/{token}` (the link's token is the credential; no key): a page showing the one
/// request the link answers (its prompt and options, a text box when it takes free text) that
/// answers it through `POST /v1/links/{token}/answer`. 404 (an unknown link) or 410 (used,
/// expired, no longer pending) with a page saying so.
#[utoipa::path(
    get,
    path = "/answer/{token}",
    operation_id = "pageAnswerLink",
    tag = "page",
    params(("token" = String, Path, description = "The link's token, `evl_…`")),
    responses(
        (status = 200, description = "The page of the one request", content_type = "text/html", body = String),
        (status = 404, description = "An unknown or forged link: a page saying so", content_type = "text/html", body = String),
        (status = 410, description = "A used, expired or answered link: a page saying so", content_type = "text/html", body = String),
    ),
    security(()),
)]
pub(crate) async fn page(State(inner): State<Arc<Inner>>, Path(token): Path<String>) -> Response {
    let opened = match open(&inner, &token).await {
        Ok(link) => request_of(&inner, &link).await,
        Err(e) => Err(e),
    };
    match opened {
        Ok((p, tool)) => html(StatusCode::OK, &request_page(&p, &tool, &token)),
        Err(e) => html(
            e.status(),
            &format!(
                "<main><h1>Nothing to answer here</h1><p>{}</p></main>",
                escape(e.message())
            ),
        ),
    }
}

fn html(status: StatusCode, main: &str) -> Response {
    let doc = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>eve: answer a request</title><style>{STYLE}</style></head><body>{main}</body></html>"
    );
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
            ),
        ],
        doc,
    )
        .into_response()
}

const STYLE: &str = "body{font:16px/1.5 system-ui,sans-serif;max-width:40rem;margin:2rem auto;padding:0 1rem;color:#222}\
button{font:inherit;margin:.25rem .5rem .25rem 0;padding:.4rem .9rem;border-radius:.4rem;border:1px solid #888;background:#f4f4f4;cursor:pointer}\
button.primary{background:#1f6feb;color:#fff;border-color:#1f6feb}button.danger{background:#d73a49;color:#fff;border-color:#d73a49}\
textarea{width:100%;min-height:5rem;font:inherit}.meta{color:#666;font-size:.9rem}pre{background:#f6f8fa;padding:.5rem;overflow:auto}";

/// The page's body for one pending request: everything shown is escaped; the script only
/// posts the chosen option or text and shows the outcome.
fn request_page(p: &PendingRequest, tool: &str, token: &str) -> String {
    let mut out = String::from("<main>");
    out.push_str(&format!(
        "<p class=\"meta\">{} asks (request {})</p><h1 id=\"prompt\">{}</h1>",
        escape(tool),
        escape(p.request_id.as_str()),
        escape(&p.request.prompt)
    ));
    if let Some(a) = &p.request.approval {
        out.push_str(&format!(
            "<p>Approve the call of <b>{}</b> with:</p><pre>{}</pre>",
            escape(&a.tool),
            escape(&serde_json::to_string_pretty(&a.input).unwrap_or_default())
        ));
    }
    out.push_str("<form id=\"answer\"><div>");
    for o in &p.request.options {
        let class = match o.style {
            Some(eve_core::OptionStyle::Primary) => "primary",
            Some(eve_core::OptionStyle::Danger) => "danger",
            _ => "",
        };
        out.push_str(&format!(
            "<button type=\"button\" class=\"{class}\" data-option=\"{}\">{}</button>",
            escape(&o.id),
            escape(&o.label)
        ));
        if let Some(d) = &o.description {
            out.push_str(&format!("<span class=\"meta\">{}</span>", escape(d)));
        }
    }
    out.push_str("</div>");
    if p.request.allow_freeform || p.request.options.is_empty() {
        out.push_str(
            "<p><textarea id=\"text\" placeholder=\"Your answer\"></textarea></p>\
             <button type=\"button\" data-option=\"\">Send</button>",
        );
    }
    out.push_str("</form><p id=\"outcome\" role=\"status\"></p></main>");
    // The token is hex and a prefix (checked by `open`), so it is safe inside a script string.
    out.push_str(&format!(
        "<script>(()=>{{const url='/v1/links/{}/answer';\
         const form=document.getElementById('answer'),outcome=document.getElementById('outcome');\
         form.addEventListener('click',async e=>{{const b=e.target.closest('button');if(!b)return;\
         const t=document.getElementById('text'),body={{}};\
         if(b.dataset.option)body.optionId=b.dataset.option;\
         if(t&&t.value.trim())body.text=t.value;\
         for(const x of form.querySelectorAll('button'))x.disabled=true;\
         const r=await fetch(url,{{method:'POST',headers:{{'content-type':'application/json'}},body:JSON.stringify(body)}});\
         const j=await r.json().catch(()=>({{}}));\
         if(r.ok){{outcome.textContent='Answered. Thank you; you can close this page.';form.hidden=true;}}\
         else{{outcome.textContent=j.message||('Not answered ('+r.status+')');\
         if(r.status===422||r.status===400)for(const x of form.querySelectorAll('button'))x.disabled=false;}}}});}})();</script>",
        token
    ));
    out
}

/// `s` with `& < > " '` escaped for HTML text and attribute values.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_shape_and_escape() {
        let id = "0123456789ab";
        let secret = "f".repeat(64);
        assert_eq!(link_id(&format!("evl_{id}_{secret}")), Some(id));
        assert_eq!(link_id(&format!("eve_{id}_{secret}")), None);
        assert_eq!(link_id(&format!("evl_{id}_{}", &secret[1..])), None);
        assert_eq!(link_id("evl_<script>_x"), None);
        assert_eq!(
            escape("<a href='x'>&\"</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;"
        );
    }
}
