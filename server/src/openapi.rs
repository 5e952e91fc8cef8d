//! The OpenAPI 3.1 description of the HTTP API, served at `GET /v1/openapi.json` (no key
//! needed).
//!
//! Nothing in it is written by hand: utoipa builds it from each handler's `#[utoipa::path]`
//! (route, parameters, statuses, the key's scope as the `bearer` security requirement's role)
//! and from the request and response types (`ToSchema`, following their serde attributes, so
//! the schemas name fields as the wire does). [`Describe`] then renames the properties of
//! eve-core's schemas to camelCase, as [`Camel`](crate::camel::Camel) renames their fields on
//! the wire (their serde form is the stores' snake_case), and adds what every route shares: the
//! security schemes, the page's cookie as an alternative to the bearer key, a sentence about the
//! scope in each description, and the error answers any route may give (`invalid_id` on the
//! routes that take a session).
//!
//! `tests/openapi.rs` checks that every route the router serves is described, and that each
//! documented scope is the one the router enforces; `tests/python/openapi_check.py` validates
//! the document with `openapi-spec-validator` and every live answer with `openapi-core`.

use crate::camel::to_camel;
use axum::Json;
use std::sync::LazyLock;
use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::{AdditionalProperties, ArrayItems, Schema, SchemaType, Type};
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
        crate::runs::terminate,
        crate::runs::retry,
        crate::runs::reset,
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
        crate::auth::whoami,
        crate::page::index,
        crate::page::requests,
        crate::page::runs,
        crate::page::run,
        crate::page::sessions,
        crate::page::session,
        crate::page::keys,
        crate::metrics::scrape,
        crate::health::alive,
        crate::health::ready,
        document,
        crate::turns::message,
        crate::turns::turn,
        crate::turns::cancel_task,
        crate::requests::list_agents,
        crate::requests::complete_agent,
        crate::links::create,
        crate::links::show,
        crate::links::answer,
        crate::links::page,
        crate::hooks::resume,
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
        (name = "agents", description = "Subagent calls the host serves (`ctx.agent` without an in-process AgentHost)"),
        (name = "hooks", description = "Deliveries to the hooks workflows create with a token of their choosing"),
    ),
)]
struct ApiDoc;

/// The schemas of eve-core's types that responses carry, and every schema they reach (utoipa
/// collects those): [`Describe`] camelCases their properties. A type of eve-core a response
/// starts carrying belongs here; the test `no_property_is_snake_case` fails until it is.
#[derive(OpenApi)]
#[openapi(components(schemas(
    eve_core::ApiKey,
    eve_core::RunRecord,
    eve_core::ResetFrom,
    eve_core::StoredEvent,
    eve_core::PendingRequest,
    eve_core::SessionEntry,
    eve_core::SessionRecord,
)))]
struct CoreSchemas;

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
        let core = CoreSchemas::openapi()
            .components
            .unwrap_or_default()
            .schemas;
        for (name, schema) in &mut components.schemas {
            if let (true, RefOr::T(schema)) = (core.contains_key(name), schema) {
                camel_properties(schema);
            }
        }
        for (path, item) in &mut openapi.paths.paths {
            // A session in the path is an id the client chose, checked as one.
            let session_path = path.starts_with("/v1/sessions/{id}");
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
                describe(op, session_path);
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

/// Renames the properties and `required` entries of `schema`, and of every schema written out
/// inside it, to camelCase with [`to_camel`], the renaming [`Camel`](crate::camel::Camel)
/// applies to struct fields on the wire. References are left alone: each referenced component
/// is renamed (or not) on its own.
fn camel_properties(schema: &mut Schema) {
    let inline = |s: &mut RefOr<Schema>| {
        if let RefOr::T(s) = s {
            camel_properties(s);
        }
    };
    match schema {
        Schema::Object(obj) => {
            obj.properties = std::mem::take(&mut obj.properties)
                .into_iter()
                .map(|(name, mut property)| {
                    inline(&mut property);
                    (to_camel(&name), property)
                })
                .collect();
            for name in &mut obj.required {
                *name = to_camel(name);
            }
            if let Some(AdditionalProperties::RefOr(values)) =
                obj.additional_properties.as_deref_mut()
            {
                inline(values);
            }
        }
        Schema::Array(array) => {
            if let ArrayItems::RefOrSchema(items) = &mut array.items {
                inline(items);
            }
            array.prefix_items.iter_mut().for_each(camel_properties);
        }
        Schema::OneOf(one) => one.items.iter_mut().for_each(inline),
        Schema::AllOf(all) => all.items.iter_mut().for_each(inline),
        Schema::AnyOf(any) => any.items.iter_mut().for_each(inline),
        _ => {}
    }
}

/// Adds the cookie alternative, the scope sentence and the shared error answers to `op`, and
/// makes its optional parameters non-nullable. `session_path`: the route's path holds a session
/// id, so it answers `invalid_id` as a `session` query parameter does.
fn describe(op: &mut Operation, session_path: bool) {
    let takes_session = session_path || op.parameters.iter().flatten().any(|p| p.name == "session");
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
            "`unauthorized`: no key, or one that is unknown, revoked, expired or malformed; `WWW-Authenticate` carries the challenge (`Bearer realm=\"eve\"`, with `error=\"invalid_token\"` when a key came)",
        );
        add(
            "403",
            "`forbidden`: the key's scope is too small (`WWW-Authenticate` names the scope needed: `error=\"insufficient_scope\"`); `cross_origin`: a browser request from another origin",
        );
    }
    if takes_session {
        add(
            "400",
            "`malformed`: a path, query, header or body this route cannot read; `invalid_id`: a session that breaks the limits of ids a client chooses (empty, over 256 bytes, not printable)",
        );
    } else {
        add(
            "400",
            "`malformed`: a path, query, header or body this route cannot read",
        );
    }
    add(
        "421",
        "`misdirected`: a `Host` this server does not answer for",
    );
    add(
        "5XX",
        "`internal`, or `unavailable` (503: a transient store fault; retry)",
    );
}

#[cfg(test)]
mod tests {
    use super::DOCUMENT;
    use serde_json::Value;

    /// Every property name and `required` entry in `v` that is not camelCase.
    fn snake_properties(v: &Value, path: &str, found: &mut Vec<String>) {
        match v {
            Value::Object(obj) => {
                if let Some(Value::Object(props)) = obj.get("properties") {
                    found.extend(
                        props
                            .keys()
                            .filter(|k| k.contains('_'))
                            .map(|k| format!("{path}: {k}")),
                    );
                }
                if let Some(Value::Array(required)) = obj.get("required") {
                    found.extend(
                        required
                            .iter()
                            .filter_map(Value::as_str)
                            .filter(|k| k.contains('_'))
                            .map(|k| format!("{path}: required {k}")),
                    );
                }
                for (k, v) in obj {
                    snake_properties(v, &format!("{path}/{k}"), found);
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    snake_properties(v, &format!("{path}/{i}"), found);
                }
            }
            _ => {}
        }
    }

    /// The wire names every field in camelCase (eve-core's records through `Camel`), so the
    /// description must too: eve-core's snake_case serde names (`run_id`, `created_at`, the
    /// fields of journal events) are renamed, and the key's expiry is `expiresAt`.
    #[test]
    fn no_property_is_snake_case() {
        let mut found = Vec::new();
        snake_properties(&DOCUMENT, "", &mut found);
        assert!(found.is_empty(), "snake_case properties: {found:#?}");
        let key = &DOCUMENT["components"]["schemas"]["ApiKey"]["properties"];
        for name in ["createdAt", "revokedAt", "expiresAt"] {
            assert!(key.get(name).is_some(), "ApiKey has no {name}: {key}");
        }
        assert!(DOCUMENT["components"]["schemas"]["RunRecord"]["properties"]
            .get("runId")
            .is_some());
    }
}
