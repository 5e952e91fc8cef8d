//! The page for a person at `/`: one static HTML file with its script and style inline,
//! embedded at build time (no build step), talking to the JSON routes and the SSE channel.

use axum::http::header;
use axum::response::IntoResponse;

const INDEX: &str = include_str!("../static/index.html");

/// The page for a person.
///
/// `GET /`: the page. It reads `?session=` to follow one session; without it, it follows every
/// session that has a run not yet ended.
#[utoipa::path(
    get,
    path = "/",
    operation_id = "page",
    tag = "page",
    params(("session" = Option<Vec<String>>, Query, description = "Sessions to pin (repeatable)", explode = true)),
    responses((status = 200, description = "The page: one HTML file; it signs in with a key, then uses the JSON routes", content_type = "text/html", body = String)),
    security(()),
)]
pub(crate) async fn index() -> impl IntoResponse {
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
}
