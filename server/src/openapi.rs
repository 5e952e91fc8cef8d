//! The OpenAPI 3.1 description of the HTTP API, served at `GET /v1/openapi.json` (no key
//! needed).
//!
//! Nothing in it is written by hand: utoipa builds it from each handler's `#[utoipa::path]`
//! (route, parameters, statuses, the key's scope as the `bearer` security requirement's role)
//! and from the request and response types (`ToSchema`, following their serde attributes, so
//! the schemas name fields as the wire does). [`Describe`] then adds what every route shares:
//! the security schemes, the page's cookie as an alternative to the bearer key, a sentence
//! about the scope in each description, and the error answers any route may give.
//!
//! `tests/openapi.rs` checks that every route the router serves is described, and that each
//! documented scope is the one the router enforces; `tests/python/openapi_check.py` validates
//! the document with `openapi-spec-validator` and every live answer with `openapi-core`.

use axum::Json;
use std::sync::LazyLock;
use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::{Schema, SchemaType, Type};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder};
use utoipa::openapi::security::{SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi};

/// The name of the bearer-key security scheme.
const BEARER: &str = "bearer";
/// The name of the page's cookie security scheme.
const COOKIE: &str = "cookie";

/// The whole description: every route's path attribute, the schemas they reach (collected by
/// utoipa from the bodies), and [`Describe`].
#[derive(OpenApi)]
#[openapi(
    info(
        title = "eve-server",
        description = "The HTTP surface of eve: webhooks, the session channel (SSE, pending requests, answers, tasks), the runs API, tool calls, API keys, health and a page for a person.\n\nEvery route but webhooks (their token is the credential), the page, the health routes, signing in and this document needs an API key, sent as `Authorization: Bearer eve_…` (or the page's `eve_key` cookie). Scopes are ordered read < answer < operate < admin: a key allows its scope's routes and those of every scope below it. Each route's security requirement names the scope it needs as its role.\n\nErrors are `{\"code\", \"message\"}` (schema `Error`) with a status that says the kind; `code` is stable."
    ),
    paths(
        crate::webhook::receive,
        crate::session::events,
        crate::session::events_many,
        crate::session::requests,
        crate::requests::list,
        crate::session::tasks,
        crate::session::record,
        crate::runs::list,
        crate::runs::show,
        crate::runs::cancel,
        crate::runs::resume,
        crate::runs::fail,
        crate::session::answer,
        crate::session::cancel,
        crate::session::end,
        crate::calls::list,
        crate::calls::start,
        crate::auth::list,
        crate::auth::create,
        crate::auth::revoke,
        crate::auth::sign_in,
        crate::auth::sign_out,
        crate::page::index,
        crate::metrics::scrape,
        crate::health::alive,
        crate::health::ready,
        document,
    ),
    // `SessionEntry` is the `data:` of each SSE event, which OpenAPI 3.1 cannot type in a response.
    components(schemas(crate::error::ErrorBody, eve_core::SessionEntry)),
    modifiers(&Describe),
    tags(
        (name = "webhooks", description = "Deliveries to the webhooks workflows mint"),
        (name = "sessions", description = "The session channel: events, requests, tasks"),
        (name = "requests", description = "Pending input requests and answers"),
        (name = "runs", description = "Runs, their journals and operator actions"),
        (name = "tools", description = "The tools this server starts, and starting calls"),
        (name = "keys", description = "API keys (admin)"),
        (name = "auth", description = "The page's sign-in cookie"),
        (name = "page", description = "The page for a person"),
        (name = "metrics", description = "Prometheus metrics"),
        (name = "health", description = "Liveness and readiness"),
        (name = "openapi", description = "This description"),
    ),
)]
struct ApiDoc;

/// The description as JSON, built once.
static DOCUMENT: LazyLock<serde_json::Value> = LazyLock::new(|| {
    serde_json::to_value(ApiDoc::openapi()).expect("the OpenAPI description serializes")
});

/// This description.
///
/// `GET /v1/openapi.json`: the OpenAPI 3.1 description of every route of this server, generated
/// from the route handlers and their request and response types. It needs no key.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    operation_id = "openapi",
    tag = "openapi",
    responses((status = 200, description = "The OpenAPI 3.1 document", body = Object)),
    security(()),
)]
pub(crate) async fn document() -> Json<serde_json::Value> {
    Json(DOCUMENT.clone())
}

/// What every operation shares, added after utoipa built the paths.
struct Describe;

impl Modify for Describe {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("eve_<id>_<secret>")
                    .description(Some(
                        "An API key (`eve keys create`, or `POST /v1/keys`). The role of a requirement is the scope the route needs: read < answer < operate < admin.",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            COOKIE,
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
                crate::COOKIE,
                "The page's HttpOnly cookie, set by `POST /v1/auth/session`; it stands for the same key.",
            ))),
        );
        for item in openapi.paths.paths.values_mut() {
            for op in [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ]
            .into_iter()
            .flatten()
            {
                describe(op);
            }
        }
        // `method(post, put, patch)` shares one operation between methods; operation ids must be
        // unique, so each method after the first gets its own.
        for item in openapi.paths.paths.values_mut() {
            let mut seen = false;
            for (method, op) in [
                ("post", &mut item.post),
                ("put", &mut item.put),
                ("patch", &mut item.patch),
            ] {
                let Some(op) = op else { continue };
                if seen {
                    if let Some(id) = &mut op.operation_id {
                        id.push('_');
                        id.push_str(method);
                    }
                }
                seen = true;
            }
        }
    }
}

/// The scope `op` needs (the role of its bearer requirement), or `None` for a route without a key.
fn scope_of(op: &Operation) -> Option<String> {
    op.security.iter().flatten().find_map(|req| {
        let v = serde_json::to_value(req).ok()?;
        v.get(BEARER)?.get(0)?.as_str().map(str::to_owned)
    })
}

/// Adds the cookie alternative, the scope sentence and the shared error answers to `op`, and
/// makes its optional parameters non-nullable.
fn describe(op: &mut Operation) {
    // An optional parameter is absent or has a value, never null: utoipa types an `Option<T>`
    // parameter as `[T, "null"]`, which tools that read a parameter's type as one name
    // (openapi-core) cannot use.
    for param in op.parameters.iter_mut().flatten() {
        if let Some(RefOr::T(Schema::Object(obj))) = &mut param.schema {
            if let SchemaType::Array(types) = &obj.schema_type {
                let mut types: Vec<Type> = types
                    .iter()
                    .filter(|t| **t != Type::Null)
                    .cloned()
                    .collect();
                if types.len() == 1 {
                    obj.schema_type = SchemaType::Type(types.remove(0));
                }
            }
        }
    }
    let scope = scope_of(op);
    let sentence = match &scope {
        Some(s) => {
            op.security
                .get_or_insert_with(Vec::new)
                .push(SecurityRequirement::new(COOKIE, [s.as_str()]));
            format!(
                "**Key:** an API key of scope `{s}` or higher (read < answer < operate < admin), as `Authorization: Bearer eve_…` or the page's cookie."
            )
        }
        None => "**Key:** none needed.".to_owned(),
    };
    op.description = Some(match op.description.take() {
        Some(d) if !d.is_empty() => format!("{d}\n\n{sentence}"),
        _ => sentence,
    });
    let error = |description: &str| -> RefOr<utoipa::openapi::Response> {
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Error")))
                    .build(),
            )
            .build()
            .into()
    };
    let responses = &mut op.responses.responses;
    let mut add = |status: &str, description: &str| {
        responses
            .entry(status.to_owned())
            .or_insert_with(|| error(description));
    };
    if scope.is_some() {
        add(
            "401",
            "`unauthorized`: no key, or one that is unknown, revoked or malformed",
        );
        add(
            "403",
            "`forbidden`: the key's scope is too small; `cross_origin`: a browser request from another origin",
        );
    }
    add(
        "400",
        "`malformed`: a path, query, header or body this route cannot read",
    );
    add(
        "421",
        "`misdirected`: a `Host` this server does not answer for",
    );
    add(
        "5XX",
        "`internal`, or `unavailable` (503: a transient store fault; retry)",
    );
}
