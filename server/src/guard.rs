//! Host and browser safety, for every route: the `Host` a request names must be this server's
//! (the configured base URL's host or a loopback name), a browser request that changes
//! something must come from this server's origin, and every response carries headers that keep
//! browsers from framing, sniffing or leaking it.

use crate::error::ApiError;
use crate::Inner;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;

/// Host names always accepted: a DNS-rebinding page cannot make a browser send them.
const LOOPBACK: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// The content security policy of the JSON routes (the page sets its own).
pub(crate) const API_CSP: &str = "default-src 'none'; frame-ancestors 'none'";

/// What the guards compare against, derived once from the configured base URL.
#[derive(Clone, Debug)]
pub(crate) struct Origins {
    /// The base URL's host, lowercase.
    host: String,
    /// `scheme://host[:port]` of the base URL, lowercase.
    origin: String,
    /// The base URL's port (explicit or the scheme's default).
    port: u16,
    scheme: String,
}

impl Origins {
    pub(crate) fn of(base_url: &str) -> Self {
        let uri: Uri = base_url.parse().unwrap_or_default();
        let scheme = uri.scheme_str().unwrap_or("http").to_ascii_lowercase();
        let port = uri
            .port_u16()
            .unwrap_or(if scheme == "https" { 443 } else { 80 });
        let host = uri.host().unwrap_or("127.0.0.1").to_ascii_lowercase();
        let origin = match uri.authority() {
            Some(a) => format!("{scheme}://{}", a.as_str().to_ascii_lowercase()),
            None => format!("{scheme}://{host}"),
        };
        Self {
            host,
            origin,
            port,
            scheme,
        }
    }

    fn host_ok(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        host == self.host || LOOPBACK.contains(&host.as_str())
    }

    /// The configured origin, or a loopback origin on the configured port (the same server
    /// opened as localhost instead of 127.0.0.1).
    fn origin_ok(&self, origin: &str) -> bool {
        let origin = origin.to_ascii_lowercase();
        if origin == self.origin {
            return true;
        }
        LOOPBACK.iter().any(|h| {
            origin == format!("{}://{h}:{}", self.scheme, self.port)
                || (origin == format!("{}://{h}", self.scheme)
                    && self.port == if self.scheme == "https" { 443 } else { 80 })
        })
    }
}

/// The host part of a request's `Host` header (or its URI authority), without the port.
fn request_host(req: &Request) -> Option<String> {
    let authority = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()))?;
    let uri: Uri = format!("http://{authority}/").parse().ok()?;
    uri.host().map(str::to_owned)
}

/// 421 for a request whose `Host` is neither the base URL's host nor a loopback name: a page
/// that rebound its own DNS name to this server's address cannot reach it.
pub(crate) async fn host(
    State(inner): State<Arc<Inner>>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    match request_host(&req) {
        Some(h) if inner.origins.host_ok(&h) => Ok(next.run(req).await),
        h => Err(ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            "misdirected",
            format!(
                "this server answers for {} and loopback names, not {}; use its URL, or set the base URL it is reached at",
                inner.origins.host,
                h.as_deref().unwrap_or("a request without Host"),
            ),
        )),
    }
}

/// Refuses a request whose `Origin` (sent by browsers) is not this server's configured origin,
/// so a page on another site — or one that rebound its DNS name to this server — cannot act
/// through a person's browser. Requests without `Origin` (non-browser clients) pass.
pub(crate) async fn same_origin(
    State(inner): State<Arc<Inner>>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let ok = origin
            .to_str()
            .is_ok_and(|o| inner.origins.origin_ok(o.trim_end_matches('/')));
        if !ok {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "cross_origin",
                "this request came from a page of another origin; answer from the eve page or a client that sends no Origin header",
            ));
        }
    }
    Ok(next.run(req).await)
}

/// Adds `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer`,
/// `X-Frame-Options: DENY` and, unless the route set its own, a content security policy that
/// forbids framing and loading anything.
pub(crate) async fn headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(HeaderValue::from_static(API_CSP));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_origins() {
        let o = Origins::of("http://127.0.0.1:8787");
        assert!(o.host_ok("127.0.0.1") && o.host_ok("LOCALHOST") && o.host_ok("[::1]"));
        assert!(!o.host_ok("attacker.example"));
        assert!(o.origin_ok("http://127.0.0.1:8787") && o.origin_ok("http://localhost:8787"));
        assert!(!o.origin_ok("http://attacker.example:8787"));
        assert!(!o.origin_ok("http://localhost:3000"));
        assert!(!o.origin_ok("null"));
        let o = Origins::of("https://eve.example.com");
        assert!(o.host_ok("eve.example.com") && !o.host_ok("evil.example.com"));
        assert!(o.origin_ok("https://eve.example.com"));
        assert!(!o.origin_ok("http://eve.example.com"));
    }
}
