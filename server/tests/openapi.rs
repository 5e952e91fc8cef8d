//! The OpenAPI description at `GET /v1/openapi.json`: it describes every route the router
//! serves (read from the router's source, so a route added without a `#[utoipa::path]` fails
//! here) and nothing it does not serve; each documented scope is the one the router enforces;
//! and, with a Python that has `openapi-spec-validator` and `openapi-core`
//! (`EVE_TEST_OPENAPI_PYTHON`, set by scripts/test-all.sh), the document is valid OpenAPI 3.1
//! and every route's live answers (statuses and bodies) match it.

mod common;

use common::*;
use eve_core::engine::SystemClock;
use eve_core::{JournalStore, KeyScope, Timestamp};
use eve_server::{AppState, ServerConfig};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

/// Every `(method, path)` the router of `src/lib.rs` registers with `.route(PATH, get(…).post(…))`,
/// in OpenAPI's path syntax (axum's is the same for `{param}`).
fn routes_in_router_source() -> BTreeSet<(String, String)> {
    let src = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
        .expect("read src/lib.rs");
    let mut routes = BTreeSet::new();
    let mut rest = src.as_str();
    while let Some(at) = rest.find(".route(") {
        rest = &rest[at + ".route(".len()..];
        // The call's arguments: up to the parenthesis that closes `.route(`.
        let mut depth = 1;
        let end = rest
            .char_indices()
            .find_map(|(i, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                (depth == 0).then_some(i)
            })
            .expect("a closed .route( call");
        let args = &rest[..end];
        let path = args
            .split('"')
            .nth(1)
            .expect("a .route( call starts with its path literal");
        let handlers = &args[args.find(',').expect("a .route( call has a handler")..];
        let mut methods = 0;
        for m in METHODS {
            let mut h = handlers;
            while let Some(i) = h.find(&format!("{m}(")) {
                let before = h[..i].chars().last();
                if matches!(before, Some(c) if c == '.' || c.is_whitespace()) {
                    routes.insert((m.to_owned(), path.to_owned()));
                    methods += 1;
                }
                h = &h[i + m.len()..];
            }
        }
        assert!(methods > 0, "no method found in .route({args})");
    }
    assert!(
        routes.len() > 20,
        "the router source parsed to too few routes: {routes:?}"
    );
    routes
}

/// Every `(method, path)` of the document.
fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for m in METHODS {
            if item.get(m).is_some() {
                out.insert((m.to_owned(), path.clone()));
            }
        }
    }
    out
}

async fn fetch_document(base: &str) -> Value {
    let resp = reqwest::get(format!("{base}/v1/openapi.json"))
        .await
        .expect("GET /v1/openapi.json");
    assert_eq!(resp.status(), 200, "the document needs no key");
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    resp.json().await.expect("the document is JSON")
}

/// A server with keys on (the default outside tests).
async fn keyed_server(store: Arc<dyn JournalStore>) -> TestServer {
    TestServer::start(store, |c| c.insecure_no_auth = false).await
}

#[tokio::test]
async fn the_document_describes_every_route_the_router_serves_and_no_other() {
    let (_dir, store) = sqlite().await;
    let server = keyed_server(store).await;
    let doc = fetch_document(&server.base).await;
    assert_eq!(doc["openapi"], "3.1.0");

    let served = routes_in_router_source();
    let described = documented(&doc);
    let undocumented: Vec<_> = served.difference(&described).collect();
    let unserved: Vec<_> = described.difference(&served).collect();
    assert!(
        undocumented.is_empty(),
        "routes the router serves without a description (add #[utoipa::path] to the handler and list it in src/openapi.rs): {undocumented:?}"
    );
    assert!(
        unserved.is_empty(),
        "described routes the router does not register: {unserved:?}"
    );

    // And the router really answers each described (method, path): no fallback 404 or 405.
    let client = reqwest::Client::new();
    for (method, path) in &described {
        let url = server.url(
            &path
                .replace("{token}", "wh_x")
                .replace('{', "x")
                .replace('}', ""),
        );
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let resp = client.request(method.clone(), &url).send().await.unwrap();
        let status = resp.status();
        let body: Value = match resp.headers().get("content-type") {
            Some(ct) if ct.to_str().unwrap().starts_with("application/json") => {
                resp.json().await.unwrap()
            }
            _ => Value::Null,
        };
        assert_ne!(
            status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}: {body}"
        );
        assert!(
            !(status == StatusCode::NOT_FOUND
                && body["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("no route for"))),
            "{method} {path} is described but falls through to the router's fallback: {body}"
        );
    }
    server.stop().await;
}

/// The scope a documented operation needs: the role of its `bearer` requirement; `None` when its
/// security is `[{}]` (no key).
fn documented_scope(op: &Value) -> Option<KeyScope> {
    let reqs = op["security"]
        .as_array()
        .expect("every operation states its security");
    let role = reqs
        .iter()
        .find_map(|r| r.get("bearer").and_then(|roles| roles.get(0)))
        .and_then(Value::as_str);
    match role {
        Some(r) => Some(KeyScope::parse(r).unwrap_or_else(|| panic!("unknown scope {r}"))),
        None => {
            assert_eq!(
                reqs,
                &vec![json!({})],
                "a keyless route says so with [{{}}]"
            );
            None
        }
    }
}

#[tokio::test]
async fn each_documented_scope_is_the_one_the_router_enforces() {
    let (_dir, store) = sqlite().await;
    let server = keyed_server(store.clone()).await;
    let doc = fetch_document(&server.base).await;
    let now = Timestamp::now();
    let mut keys = Vec::new();
    for scope in KeyScope::ALL {
        let key = eve_server::create_key(&*store, &format!("{scope}"), scope, now)
            .await
            .unwrap();
        keys.push((scope, key.text));
    }
    let client = reqwest::Client::new();
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for m in METHODS {
            let Some(op) = item.get(m) else { continue };
            let url = server.url(
                &path
                    .replace("{token}", "wh_x")
                    .replace('{', "x")
                    .replace('}', ""),
            );
            let method = Method::from_bytes(m.to_uppercase().as_bytes()).unwrap();
            let send = |key: Option<&str>| {
                let mut req = client
                    .request(method.clone(), &url)
                    .timeout(Duration::from_secs(30));
                if let Some(k) = key {
                    req = req.bearer_auth(k);
                }
                req.send()
            };
            let description = op["description"].as_str().unwrap_or_default();
            match documented_scope(op) {
                None => {
                    let status = send(None).await.unwrap().status();
                    assert!(
                        status != 401 && status != 403,
                        "{m} {path} is documented keyless but answers {status} without a key"
                    );
                    assert!(description.contains("**Key:** none needed."), "{m} {path}");
                }
                Some(scope) => {
                    let status = send(None).await.unwrap().status();
                    assert_eq!(status, 401, "{m} {path} without a key");
                    assert!(
                        description.contains(&format!("scope `{scope}` or higher")),
                        "{m} {path}: {description}"
                    );
                    for (s, key) in &keys {
                        let resp = send(Some(key)).await.unwrap();
                        let status = resp.status();
                        if *s < scope {
                            assert_eq!(status, 403, "{m} {path} with a {s} key (needs {scope})");
                        } else {
                            assert!(
                                status != 401 && status != 403,
                                "{m} {path} with a {s} key (needs {scope}): {status}"
                            );
                        }
                    }
                    // The page's cookie is documented as the alternative.
                    assert!(
                        op["security"]
                            .as_array()
                            .unwrap()
                            .contains(&json!({ "cookie": [scope.as_str()] })),
                        "{m} {path}"
                    );
                }
            }
            checked += 1;
        }
    }
    assert_eq!(checked, documented(&doc).len());
    server.stop().await;
}

/// A server with the test tools and a worker beside it, keys on.
async fn server_with_tools(
    store: Arc<dyn JournalStore>,
) -> (
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let config = ServerConfig {
        base_url: base.clone(),
        poll_interval: Duration::from_millis(20),
        ..ServerConfig::default()
    };
    let state = AppState::new(store, Arc::new(SystemClock))
        .with_config(config)
        .with_registry(registry());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let join = tokio::spawn(eve_server::serve_with_shutdown(listener, state, async {
        let _ = rx.await;
    }));
    (base, tx, join)
}

#[tokio::test]
async fn python_validates_the_document_and_every_live_answer() {
    let Ok(python) = std::env::var("EVE_TEST_OPENAPI_PYTHON") else {
        println!("SKIPPED: the OpenAPI check with openapi-spec-validator and openapi-core: EVE_TEST_OPENAPI_PYTHON is not set (scripts/test-all.sh sets it to a venv's python with both packages, pinned)");
        return;
    };
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let (base, stop, join) = server_with_tools(store.clone()).await;
    let admin = eve_server::create_key(&*store, "python", KeyScope::Admin, Timestamp::now())
        .await
        .unwrap();
    // A key that expires, so the listing the script validates carries `expiresAt`.
    let now = Timestamp::now();
    eve_server::create_key_expiring(
        &*store,
        "expiring",
        KeyScope::Read,
        Some(Timestamp(now.0 + 3_600_000)),
        now,
    )
    .await
    .unwrap();
    // A run waiting on a webhook: its path is announced by a step, for the script to deliver to
    // (the runs API shows tokens redacted).
    let announced = expect_url("openapi-hook");
    start(
        &store,
        "hooks",
        "collect-1",
        "collect",
        json!({ "key": "openapi-hook", "count": 3 }),
    )
    .await;
    let hook = tokio::time::timeout(WAIT, announced)
        .await
        .expect("the webhook is announced in time")
        .unwrap();

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/openapi_check.py");
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new(&python)
            .arg(&script)
            .env("EVE_BASE", &base)
            .env("EVE_KEY", &admin.text)
            .env("EVE_WEBHOOK", &hook)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the Python check ends in time")
    .expect("run the Python check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the Python check failed:\n{stdout}\n{stderr}"
    );
    let last: Value = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no summary line:\n{stdout}\n{stderr}"));
    println!("{last}");
    let doc = fetch_document(&base).await;
    assert_eq!(last["valid"], true, "{last}");
    assert_eq!(
        last["operations"].as_u64().unwrap() as usize,
        documented(&doc).len(),
        "every documented operation was called and its answers validated: {last}"
    );
    assert!(last["responses"].as_u64().unwrap() > 40, "{last}");

    let _ = stop.send(());
    join.await.unwrap().unwrap();
    worker.shutdown().await;
}
