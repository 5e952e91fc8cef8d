//! Credentials and host safety: every route × no key, a key of too small a scope, a revoked
//! key and the right key; the page's cookie sign-in; the DNS-rebinding request of issue 15
//! refused; the security headers on every response.

mod common;

use common::*;
use eve_core::{KeyScope, Timestamp};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

/// A route, the scope it needs, a body, and what the right key gets.
struct Route {
    method: Method,
    path: &'static str,
    scope: KeyScope,
    body: Option<Value>,
    ok: u16,
}

fn routes() -> Vec<Route> {
    let r = |method: Method, path, scope, body: Option<Value>, ok| Route {
        method,
        path,
        scope,
        body,
        ok,
    };
    vec![
        r(Method::GET, "/v1/runs", KeyScope::Read, None, 200),
        r(Method::GET, "/v1/runs/run-none", KeyScope::Read, None, 404),
        r(
            Method::GET,
            "/v1/sessions/s/requests",
            KeyScope::Read,
            None,
            200,
        ),
        r(Method::GET, "/v1/requests", KeyScope::Read, None, 200),
        r(
            Method::GET,
            "/v1/sessions/s/tasks",
            KeyScope::Read,
            None,
            200,
        ),
        r(
            Method::GET,
            "/v1/sessions/s/events",
            KeyScope::Read,
            None,
            200,
        ),
        r(
            Method::POST,
            "/v1/requests/req-none/answer",
            KeyScope::Answer,
            Some(json!({ "optionId": "approve" })),
            404,
        ),
        r(
            Method::POST,
            "/v1/tasks/run-none/cancel",
            KeyScope::Operate,
            None,
            404,
        ),
        r(
            Method::GET,
            "/v1/events?session=s&session=t",
            KeyScope::Read,
            None,
            200,
        ),
        r(Method::GET, "/v1/tools", KeyScope::Read, None, 200),
        r(Method::GET, "/v1/sessions/s", KeyScope::Read, None, 200),
        r(
            Method::POST,
            "/v1/sessions/s-end/end",
            KeyScope::Operate,
            None,
            200,
        ),
        // The MCP endpoint (a stand-in router here; `eve serve` mounts eve-mcp's).
        r(
            Method::POST,
            "/mcp",
            KeyScope::Operate,
            Some(json!({ "jsonrpc": "2.0", "id": 1, "method": "ping" })),
            200,
        ),
        r(Method::GET, "/metrics", KeyScope::Read, None, 200),
        r(
            Method::POST,
            "/v1/tools/deploy/calls",
            KeyScope::Operate,
            Some(json!({ "session": "s", "callId": "c", "input": {} })),
            404,
        ),
        r(
            Method::POST,
            "/v1/runs/run-none/cancel",
            KeyScope::Operate,
            None,
            404,
        ),
        r(
            Method::POST,
            "/v1/runs/run-none/resume",
            KeyScope::Operate,
            None,
            404,
        ),
        r(
            Method::POST,
            "/v1/runs/run-none/terminate",
            KeyScope::Operate,
            Some(json!({ "reason": "stuck" })),
            404,
        ),
        r(
            Method::POST,
            "/v1/runs/run-none/retry",
            KeyScope::Operate,
            None,
            404,
        ),
        r(
            Method::POST,
            "/v1/runs/run-none/reset",
            KeyScope::Operate,
            Some(json!({ "to": 1 })),
            404,
        ),
        r(
            Method::POST,
            "/v1/runs/run-none/fail",
            KeyScope::Operate,
            Some(json!({ "error": "x" })),
            404,
        ),
        r(Method::GET, "/v1/keys", KeyScope::Admin, None, 200),
        r(
            Method::POST,
            "/v1/keys",
            KeyScope::Admin,
            Some(json!({ "name": "made over http", "scope": "read" })),
            201,
        ),
        r(
            Method::POST,
            "/v1/keys/000000000000/revoke",
            KeyScope::Admin,
            None,
            404,
        ),
    ]
}

async fn call(server: &TestServer, route: &Route, key: Option<&str>) -> (StatusCode, String) {
    let (status, _, body) = call_full(server, route, key).await;
    (status, body)
}

/// [`call`] with the `WWW-Authenticate` header of the answer.
async fn call_full(
    server: &TestServer,
    route: &Route,
    key: Option<&str>,
) -> (StatusCode, Option<String>, String) {
    let mut req = reqwest::Client::new().request(route.method.clone(), server.url(route.path));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    if let Some(b) = &route.body {
        req = req.json(b);
    }
    let resp = req.send().await.expect("request reaches the server");
    let status = resp.status();
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned());
    // An open event stream never ends: its headers are enough.
    let body = if route.path.contains("/events") && status == 200 {
        String::new()
    } else {
        resp.text().await.expect("body")
    };
    (status, challenge, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_needs_a_live_key_of_its_scope() {
    let (_dir, store) = sqlite().await;
    let server = TestServer::start_with(
        store.clone(),
        |c| c.insecure_no_auth = false,
        |state| {
            state.with_mcp(axum::Router::new().route(
                "/",
                axum::routing::post(|| async {
                    axum::Json(json!({ "jsonrpc": "2.0", "id": 1, "result": {} }))
                }),
            ))
        },
    )
    .await;
    let now = Timestamp::now();
    let mut keys = Vec::new();
    for scope in KeyScope::ALL {
        let key = eve_server::create_key(&*store, &format!("{scope} key"), scope, now)
            .await
            .expect("create key");
        assert!(key.text.starts_with("eve_"));
        keys.push((scope, key.text));
    }
    let revoked = eve_server::create_key(&*store, "revoked admin", KeyScope::Admin, now)
        .await
        .unwrap();
    store.revoke_key(&revoked.record.id, now).await.unwrap();
    // The admin key with its last character changed (to one it is not, or the "forgery" would
    // be the key itself).
    let admin = &keys[3].1;
    let last = if admin.ends_with('0') { '1' } else { '0' };
    let forged = format!("{}{last}", &admin[..admin.len() - 1]);

    for route in routes() {
        let what = format!("{} {}", route.method, route.path);
        // No key: a bare challenge (RFC 6750 3.1: no error code when no credential came).
        let (status, challenge, body) = call_full(&server, &route, None).await;
        assert_eq!(status, 401, "{what} without a key: {body}");
        assert_eq!(
            challenge.as_deref(),
            Some(r#"Bearer realm="eve""#),
            "{what} without a key"
        );
        let err: Value = serde_json::from_str(&body).expect("a JSON error");
        assert_eq!(err["code"], "unauthorized", "{what}");
        for bad in [revoked.text.as_str(), forged.as_str(), "eve_nonsense"] {
            let (status, challenge, body) = call_full(&server, &route, Some(bad)).await;
            assert_eq!(status, 401, "{what} with a revoked or unknown key: {body}");
            let challenge = challenge.unwrap_or_default();
            assert!(
                challenge.starts_with(
                    r#"Bearer realm="eve", error="invalid_token", error_description=""#
                ),
                "{what} with a bad key: {challenge}"
            );
        }
        for (scope, key) in &keys {
            let (status, challenge, body) = call_full(&server, &route, Some(key)).await;
            if scope.allows(route.scope) {
                assert_eq!(
                    status.as_u16(),
                    route.ok,
                    "{what} with a {scope} key: {body}"
                );
                assert_eq!(challenge, None, "{what} with a {scope} key");
            } else {
                assert_eq!(status, 403, "{what} with a {scope} key: {body}");
                let err: Value = serde_json::from_str(&body).unwrap();
                assert_eq!(err["code"], "forbidden");
                assert_eq!(
                    challenge,
                    Some(format!(
                        r#"Bearer realm="eve", error="insufficient_scope", scope="{}""#,
                        route.scope
                    )),
                    "{what} with a {scope} key"
                );
            }
        }
        // A key sent another way than as a bearer token counts as no key.
        let resp = reqwest::Client::new()
            .request(route.method.clone(), server.url(route.path))
            .basic_auth("admin", Some(&keys[3].1))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401, "{what} with Basic");
        assert_eq!(resp.headers()["www-authenticate"], r#"Bearer realm="eve""#);
    }

    // eve keys are not OAuth tokens: no protected resource metadata is served (see
    // server/README.md), so no challenge points at one.
    let resp = reqwest::get(server.url("/.well-known/oauth-protected-resource"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);

    // The public routes need nothing.
    for path in ["/", "/healthz", "/readyz"] {
        let resp = reqwest::get(server.url(path)).await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
    }
    // A webhook's token is its credential: an unknown one is 404, not 401.
    let resp = reqwest::Client::new()
        .post(server.url(&format!(
            "/.well-known/workflow/v1/webhook/wh_{}",
            "0".repeat(32)
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);

    // A key created over HTTP is shown once and works; listings never show hashes or texts.
    let admin = &keys[3].1;
    let created: Value = reqwest::Client::new()
        .post(server.url("/v1/keys"))
        .bearer_auth(admin)
        .json(&json!({ "name": "ci", "scope": "answer" }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let text = created["key"].as_str().unwrap().to_owned();
    let id = created["record"]["id"].as_str().unwrap().to_owned();
    assert!(text.starts_with(&format!("eve_{id}_")));
    let list = reqwest::Client::new()
        .get(server.url("/v1/keys"))
        .bearer_auth(admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        list.contains(&id) && !list.contains(&text) && !list.contains("hash"),
        "{list}"
    );
    let (status, _) = call(&server, &routes()[0], Some(&text)).await;
    assert_eq!(status, 200);
    let revoke = reqwest::Client::new()
        .post(server.url(&format!("/v1/keys/{id}/revoke")))
        .bearer_auth(admin)
        .send()
        .await
        .unwrap();
    assert_eq!(revoke.status(), 200);
    let (status, _) = call(&server, &routes()[0], Some(&text)).await;
    assert_eq!(status, 401, "a key revoked over HTTP opens nothing");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_signs_in_with_an_http_only_strict_cookie() {
    let (_dir, store) = sqlite().await;
    let server = TestServer::start(store.clone(), |c| c.insecure_no_auth = false).await;
    let key = eve_server::create_key(&*store, "page", KeyScope::Answer, Timestamp::now())
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let bad = client
        .post(server.url("/v1/auth/session"))
        .json(&json!({ "key": "eve_wrong" }))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 401);
    assert!(
        bad.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .contains(r#"error="invalid_token""#),
        "a 401 always names its challenge"
    );
    let cross = client
        .post(server.url("/v1/auth/session"))
        .header("origin", "http://attacker.example")
        .json(&json!({ "key": key.text }))
        .send()
        .await
        .unwrap();
    assert_eq!(cross.status(), 403, "sign-in from another origin");
    let resp = client
        .post(server.url("/v1/auth/session"))
        .header("origin", server.base.clone())
        .json(&json!({ "key": key.text }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let cookie = resp.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_owned();
    let runs = client
        .get(server.url("/v1/runs"))
        .header("cookie", &pair)
        .send()
        .await
        .unwrap();
    assert_eq!(runs.status(), 200, "the cookie opens what its key opens");
    let keys = client
        .get(server.url("/v1/keys"))
        .header("cookie", &pair)
        .send()
        .await
        .unwrap();
    assert_eq!(keys.status(), 403, "and no more");
    let out = client
        .delete(server.url("/v1/auth/session"))
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), 204);
    assert!(out.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .contains("Max-Age=0"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_rebinding_request_is_refused_and_answers_nothing() {
    // Even with auth off, the request of issue 15 (Host and Origin of the attacker's name
    // resolving to this server) cannot answer: 421 for its Host; and with this server's Host
    // but the attacker's Origin, 403.
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let server = TestServer::start(store.clone(), |_| {}).await;
    let mut events = SseClient::connect(&server.url("/v1/sessions/s-rebind/events"), None).await;
    start(
        &store,
        "s-rebind",
        "call-1",
        "deploy",
        json!({ "service": "api" }),
    )
    .await;
    let asked = events.until("input.requested").await.pop().unwrap().json();
    let request = asked["event"]["data"]["requestId"]
        .as_str()
        .unwrap()
        .to_owned();
    let port = server.addr.port();
    let evil = format!("attacker.example:{port}");
    let url = server.url(&format!("/v1/requests/{request}/answer"));
    let client = reqwest::Client::new();
    let rebound = client
        .post(&url)
        .header("host", &evil)
        .header("origin", format!("http://{evil}"))
        .json(&json!({ "optionId": "approve" }))
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), 421);
    let err: Value = rebound.json().await.unwrap();
    assert_eq!(err["code"], "misdirected");
    let cross = client
        .post(&url)
        .header("origin", format!("http://{evil}"))
        .json(&json!({ "optionId": "approve" }))
        .send()
        .await
        .unwrap();
    assert_eq!(cross.status(), 403);
    // A GET with a foreign Host is refused too; localhost on this port is accepted.
    let get = client
        .get(server.url("/v1/runs"))
        .header("host", &evil)
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 421);
    let local = client
        .get(server.url("/v1/runs"))
        .header("host", format!("localhost:{port}"))
        .send()
        .await
        .unwrap();
    assert_eq!(local.status(), 200);
    let pending: Value = client
        .get(server.url("/v1/sessions/s-rebind/requests"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        pending["requests"][0]["requestId"], request,
        "the request is still pending"
    );
    worker.shutdown().await;
    server.stop().await;
}

#[tokio::test]
async fn every_response_carries_the_browser_safety_headers() {
    let (_dir, store) = sqlite().await;
    let server = TestServer::start(store, |c| c.insecure_no_auth = false).await;
    for path in ["/", "/v1/runs", "/nowhere", "/healthz"] {
        let resp = reqwest::get(server.url(path)).await.unwrap();
        let h = resp.headers();
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(h["referrer-policy"], "no-referrer", "{path}");
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_records_which_key_answered_and_another_keys_retry_is_a_duplicate() {
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let server = TestServer::start(store.clone(), |c| c.insecure_no_auth = false).await;
    let now = Timestamp::now();
    let alice = eve_server::create_key(&*store, "alice", KeyScope::Answer, now)
        .await
        .unwrap();
    let bob = eve_server::create_key(&*store, "bob's laptop", KeyScope::Operate, now)
        .await
        .unwrap();
    let mut events = SseClient::connect_with(
        &server.url("/v1/sessions/s-who/events"),
        None,
        Some(&alice.text),
    )
    .await;
    let run = start(
        &store,
        "s-who",
        "call-1",
        "deploy",
        json!({ "service": "api" }),
    )
    .await;
    let asked = events.until("input.requested").await.pop().unwrap().json();
    let request = asked["event"]["data"]["requestId"]
        .as_str()
        .unwrap()
        .to_owned();
    let answer = |key: &str, body: Value| {
        let req = reqwest::Client::new()
            .post(server.url(&format!("/v1/requests/{request}/answer")))
            .bearer_auth(key)
            .json(&body);
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap())
        }
    };

    // A body cannot say who answered: the server records the key's name.
    let (status, body) = answer(
        &alice.text,
        json!({ "optionId": "approve", "answeredBy": "mallory" }),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, first) = answer(&alice.text, json!({ "optionId": "approve" })).await;
    assert_eq!(
        (status, &first["duplicate"]),
        (200, &json!(false)),
        "{first}"
    );
    // The same answer retried by another key is the same answer: a 200 duplicate at the same
    // seq; a different one is refused.
    let (status, again) = answer(&bob.text, json!({ "optionId": "approve" })).await;
    assert_eq!(
        (status, &again["duplicate"]),
        (200, &json!(true)),
        "{again}"
    );
    assert_eq!(again["seq"], first["seq"]);
    let (status, other) = answer(&bob.text, json!({ "optionId": "cancel" })).await;
    assert_eq!((status, &other["code"]), (409, &json!("already_answered")));

    let answered: Vec<_> = journal(&store, &run)
        .await
        .into_iter()
        .filter_map(|e| match e.event {
            eve_core::Event::InputAnswered { response, .. } => Some((e.seq, response)),
            _ => None,
        })
        .collect();
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert_eq!(answered[0].0, first["seq"].as_u64().unwrap());
    assert_eq!(answered[0].1.answered_by.as_deref(), Some("alice"));
    assert_eq!(answered[0].1.option_id.as_deref(), Some("approve"));
    // The runs API shows it as journaled (`answeredBy`), for the page.
    let shown: Value = reqwest::Client::new()
        .get(server.url(&format!("/v1/runs/{run}")))
        .bearer_auth(&alice.text)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let event = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|e| e["event"].get("InputAnswered"))
        .expect("InputAnswered in the runs API");
    assert_eq!(event["response"]["answeredBy"], "alice", "{event}");
    worker.shutdown().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_key_opens_nothing_and_says_so() {
    let (_dir, store) = sqlite().await;
    let server = TestServer::start(store.clone(), |c| c.insecure_no_auth = false).await;
    let now = Timestamp::now();
    let hour = 3_600_000;
    let live = eve_server::create_key_expiring(
        &*store,
        "for an hour",
        KeyScope::Read,
        Some(Timestamp(now.millis() + hour)),
        now,
    )
    .await
    .expect("create an expiring key");
    let expired = eve_server::create_key_expiring(
        &*store,
        "yesterday's",
        KeyScope::Admin,
        Some(Timestamp(now.millis() - hour)),
        Timestamp(now.millis() - 24 * hour),
    )
    .await
    .expect("create a key that has expired since");
    let keys_before = store.list_keys().await.unwrap();
    let client = reqwest::Client::new();
    let get = |key: String| {
        let (client, url) = (client.clone(), server.url("/v1/runs"));
        async move {
            let resp = client.get(url).bearer_auth(key).send().await.unwrap();
            let status = resp.status();
            (status, resp.json::<Value>().await.unwrap())
        }
    };
    let (status, body) = get(live.text.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = get(expired.text.clone()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["code"], "unauthorized");
    assert!(
        body["message"].as_str().unwrap().contains("expired"),
        "{body}"
    );
    // Nor does it sign in on the page.
    let resp = client
        .post(server.url("/v1/auth/session"))
        .json(&json!({ "key": expired.text }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    // A key cannot be created expired.
    let err = eve_server::create_key_expiring(&*store, "never", KeyScope::Read, Some(now), now)
        .await
        .expect_err("an expiry not after creation");
    assert!(err.to_string().contains("expire"), "{err}");
    // The refusals changed no key, and the server still serves.
    assert_eq!(store.list_keys().await.unwrap(), keys_before);
    let (status, _) = get(live.text).await;
    assert_eq!(status, StatusCode::OK);
    server.stop().await;
}
