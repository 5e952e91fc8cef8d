//! The HTTP client of the remote CLI: `eve --url URL [--key KEY] …` acts through a server's API,
//! so keys and scopes apply (see [`crate::target::Target`]).

use reqwest::{Method, StatusCode};
use serde_json::Value;
use std::time::Duration;

/// Why a request to the server failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The server could not be reached (no route, refused, a timeout, a name that does not
    /// resolve): nothing was done.
    #[error("cannot reach the eve server at {url}: {reason}; check --url / EVE_URL and that `eve serve` runs there")]
    Unreachable {
        /// The server's URL as given.
        url: String,
        /// What the HTTP client said, on one line.
        reason: String,
    },
    /// The key's scope is too small for the route (403). Nothing was done.
    #[error("forbidden: {message}; use a key with a larger scope (--key / EVE_KEY)")]
    Forbidden {
        /// The server's message, which names the key's scope and the scope needed.
        message: String,
    },
    /// No usable key (401): none sent, unknown, revoked or expired.
    #[error("unauthorized: {message}; pass a key with --key / EVE_KEY (eve keys create)")]
    Unauthorized {
        /// The server's message.
        message: String,
    },
    /// Any other refusal of the server: its status, stable code and message.
    #[error("{message} ({status} {code})")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The server's stable code (`not_found`, `already_answered`, …).
        code: String,
        /// The server's message.
        message: String,
    },
    /// The server answered something that is not what this CLI expects (another version?).
    #[error("unexpected answer from {url}: {reason}")]
    Unexpected {
        /// The request's URL.
        url: String,
        /// What did not fit.
        reason: String,
    },
}

impl RemoteError {
    /// The HTTP status of an API refusal, if this is one.
    pub fn status(&self) -> Option<u16> {
        match self {
            RemoteError::Forbidden { .. } => Some(403),
            RemoteError::Unauthorized { .. } => Some(401),
            RemoteError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A server's API, reached at one base URL with an optional key.
#[derive(Clone, Debug)]
pub struct Remote {
    base: String,
    key: Option<String>,
    http: reqwest::Client,
}

/// How long one request may take before the server counts as unreachable, beside any
/// long-poll wait the request asks for.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

impl Remote {
    /// A client of the server at `base` (e.g. `http://127.0.0.1:8787`), sending `key` as
    /// `Authorization: Bearer` when given.
    ///
    /// # Errors
    /// [`RemoteError::Unreachable`] for a URL that is not http:// (this build speaks plain
    /// HTTP; put TLS in front with a proxy on the same host).
    pub fn new(base: &str, key: Option<String>) -> Result<Self, RemoteError> {
        let parsed = url::Url::parse(base).map_err(|e| RemoteError::Unreachable {
            url: base.to_owned(),
            reason: format!("not a URL ({e})"),
        })?;
        if parsed.scheme() != "http" {
            return Err(RemoteError::Unreachable {
                url: base.to_owned(),
                reason: format!(
                    "scheme {}:// is not supported; give http://HOST:PORT",
                    parsed.scheme()
                ),
            });
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| RemoteError::Unreachable {
                url: base.to_owned(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            key: key.filter(|k| !k.is_empty()),
            http,
        })
    }

    /// The server's base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// `GET path?query`: the JSON answer.
    ///
    /// # Errors
    /// See [`RemoteError`].
    pub async fn get(&self, path: &str, query: &[(&str, String)]) -> Result<Value, RemoteError> {
        self.send(Method::GET, path, query, None, None, &[])
            .await
            .map(|(_, v)| v)
    }

    /// `POST path?query` with a JSON `body`: the status and the JSON answer. `wait` is how
    /// long the server may hold the request (a long poll) beside the usual timeout.
    ///
    /// # Errors
    /// See [`RemoteError`].
    pub async fn post(
        &self,
        path: &str,
        query: &[(&str, String)],
        body: &Value,
        wait: Option<Duration>,
    ) -> Result<(StatusCode, Value), RemoteError> {
        self.send(Method::POST, path, query, Some(body), wait, &[])
            .await
    }

    /// `POST path` with a JSON `body` and extra request `headers` (e.g. `Idempotency-Key`):
    /// the status and the JSON answer.
    ///
    /// # Errors
    /// See [`RemoteError`].
    pub async fn post_with_headers(
        &self,
        path: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> Result<(StatusCode, Value), RemoteError> {
        self.send(Method::POST, path, &[], Some(body), None, headers)
            .await
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
        wait: Option<Duration>,
        headers: &[(&str, &str)],
    ) -> Result<(StatusCode, Value), RemoteError> {
        let url = format!("{}{path}", self.base);
        let mut req = self
            .http
            .request(method, &url)
            .query(query)
            .timeout(REQUEST_TIMEOUT + wait.unwrap_or_default());
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(key) = &self.key {
            req = req.bearer_auth(key);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        let unreachable = |e: reqwest::Error| RemoteError::Unreachable {
            url: self.base.clone(),
            reason: one_line(&e),
        };
        let resp = req.send().await.map_err(unreachable)?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(unreachable)?;
        let value: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).map_err(|e| RemoteError::Unexpected {
                url: url.clone(),
                reason: format!("{status} with a body that is not JSON ({e})"),
            })?
        };
        if status.is_success() {
            return Ok((status, value));
        }
        let text = |k: &str| {
            value
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        let message = text("message");
        Err(match status {
            StatusCode::FORBIDDEN => RemoteError::Forbidden { message },
            StatusCode::UNAUTHORIZED => RemoteError::Unauthorized { message },
            _ => RemoteError::Api {
                status: status.as_u16(),
                code: text("code"),
                message,
            },
        })
    }
}

/// An error and its sources on one line (reqwest's own message says little: "error sending
/// request").
fn one_line(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

/// `path`'s segment `id`, percent-encoded (an id may hold `:` or `/`, as request ids do).
pub fn segment(id: &str) -> String {
    url::form_urlencoded::byte_serialize(id.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}
