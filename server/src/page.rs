//! The page for a person at `/`: one static HTML file with its script and style inline,
//! embedded at build time (no build step), talking to the JSON routes and the SSE channel.
//!
//! The page routes itself in the browser (`history.pushState`): `/` and `/requests` show the
//! requests waiting for an answer, `/runs` the runs, `/runs/{id}` one run with its waterfall,
//! `/sessions` and `/sessions/{id}` sessions, `/keys` the API keys. Each of those paths serves
//! the same HTML, so a deep link or a reload opens the right view.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("../static/index.html");

fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
            ),
        ],
        INDEX,
    )
        .into_response()
}

/// The page for a person.
///
/// `GET /`: the page, opened at the requests waiting for an answer. It reads `?session=` to
/// follow one session; without it, it follows every session that has a run not yet ended.
#[utoipa::path(
    get,
    path = "/",
    operation_id = "page",
    tag = "page",
    params(("session" = Option<Vec<String>>, Query, description = "Sessions to pin (repeatable)", explode = true)),
    responses((status = 200, description = "The page: one HTML file; it signs in with a key, then uses the JSON routes", content_type = "text/html", body = String)),
    security(()),
)]
pub(crate) async fn index() -> Response {
    page()
}

/// The page, at the requests.
///
/// `GET /requests`: the page opened at the requests waiting for an answer (as `/`).
#[utoipa::path(
    get,
    path = "/requests",
    operation_id = "pageRequests",
    tag = "page",
    responses((status = 200, description = "The page", content_type = "text/html", body = String)),
    security(()),
)]
pub(crate) async fn requests() -> Response {
    page()
}

/// The page, at the runs.
///
/// `GET /runs`: the page opened at the runs, one page at a time.
#[utoipa::path(
    get,
    path = "/runs",
    operation_id = "pageRuns",
    tag = "page",
    responses((status = 200, description = "The page", content_type = "text/html", body = String)),
    security(()),
)]
pub(crate) async fn runs() -> Response {
    page()
}

/// The page, at one run.
///
/// `GET /runs/{id}`: the page opened at the run: its status, actions, waterfall and events.
#[utoipa::path(
    get,
    path = "/runs/{id}",
    operation_id = "pageRun",
    tag = "page",
    params(("id" = String, Path, description = "The run")),
    responses((status = 200, description = "The page (an unknown run is said so by the page)", content_type = "text/html", body = String)),
    security(()),
)]
pub(crate) async fn run() -> Response {
    page()
}

/// The page, at the sessions.
///
/// `GET /sessions`: the page opened at the sessions of the latest runs.
#[utoipa::path(
    get,
    path = "/sessions",
    operation_id = "pageSessions",
    tag = "page",
    responses((status = 200, description = "The page", content_type = "text/html", body = String)),
    security(()),
)]
pub(crate) async fn sessions() -> Response {
    page()
}

/// The page, at one session.
///
/// `GET /sessions/{id}`: the page opened at the session: its runs and pending requests.
#[utoipa::path(
    get,
    path = "/sessions/{id}",
    operation_id = "pageSession",
    tag = "page",
    params(("id" = String, Path, description = "The session")),
    responses((status = 200, description = "The page", content_type = "text/html", body = String)),
    security(()),
)]
pub(crate) async fn session() -> Response {
    page()
}

/// The page, at the API keys.
///
/// `GET /keys`: the page opened at the API keys (the page shows them to admin keys only).
#[utoipa::path(
    get,
    path = "/keys",
    operation_id = "pageKeys",
    tag = "page",
    responses((status = 200, description = "The page", content_type = "text/html", body = String)),
    security(()),
)]
pub(crate) async fn keys() -> Response {
    page()
}
