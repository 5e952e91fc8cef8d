//! Webhooks over HTTP on SQLite with a real worker: the seed's render-farm example end to end
//! against a fake render farm, exactly-once delivery under retries, custom responses, and the
//! 404 / 413 / 400 cases that must never touch a run.

mod common;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use common::*;
use eve_core::{Event, WebhookRequest};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// A fake render farm: `POST /jobs {project_id, callback_url}` answers `{job_id}` at once and,
/// later, posts the result to the callback URL — twice with the same `Idempotency-Key`, as a
/// provider does when it did not see the first answer. Each callback's HTTP status goes to
/// `statuses`.
async fn render_farm(statuses: mpsc::UnboundedSender<(u16, Value)>) -> String {
    async fn submit(
        State(statuses): State<mpsc::UnboundedSender<(u16, Value)>>,
        Json(job): Json<Value>,
    ) -> Json<Value> {
        let project = job["project_id"].as_str().unwrap_or_default().to_owned();
        let callback = job["callback_url"].as_str().unwrap_or_default().to_owned();
        let job_id = format!("job-{project}");
        let id = job_id.clone();
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            for _ in 0..2 {
                let resp = client
                    .post(&callback)
                    .header("idempotency-key", format!("{id}-done"))
                    .json(
                        &json!({ "status": "ok", "url": format!("https://cdn.example/{id}.mp4") }),
                    )
                    .send()
                    .await
                    .expect("callback reaches the server");
                let status = resp.status().as_u16();
                let body = resp.json::<Value>().await.unwrap_or(Value::Null);
                let _ = statuses.send((status, body));
            }
        });
        Json(json!({ "job_id": job_id }))
    }
    let app = Router::new()
        .route("/jobs", post(submit))
        .with_state(statuses);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_farm_end_to_end_delivers_the_callback_once() {
    let (_dir, store) = sqlite().await;
    let server = TestServer::start(store.clone(), |_| {}).await;
    let (tx, mut statuses) = mpsc::unbounded_channel();
    let farm = render_farm(tx).await;
    configure_render("p1", &server.base, &farm);
    let worker = worker(store.clone()).await;

    let mut events = SseClient::connect(&server.url("/v1/sessions/s-render/events"), None).await;
    let run = start(
        &store,
        "s-render",
        "call-1",
        "render_video",
        json!({ "project_id": "p1" }),
    )
    .await;

    let frames = events.until("tool.settled").await;
    let settled = frames.last().unwrap().json();
    assert_eq!(settled["runId"], run.as_str());
    let result = &settled["event"]["data"]["result"];
    assert_eq!(result["status"], "completed", "{settled}");
    assert_eq!(
        result["data"]["output"],
        json!({ "job": "job-p1", "url": "https://cdn.example/job-p1.mp4" })
    );

    // The farm sent the callback twice with one key; the run saw it once. Both tries are
    // answered 202, the retry also when the run had already finished.
    let (status, body) = statuses.recv().await.expect("callback answered");
    assert_eq!((status, body), (202, json!({ "accepted": true })));
    let (status, body) = statuses.recv().await.expect("retry answered");
    assert_eq!((status, body), (202, json!({ "accepted": true })));
    let j = journal(&store, &run).await;
    assert_eq!(count(&j, |e| matches!(e, Event::HookReceived { .. })), 1);
    let payload = j
        .iter()
        .find_map(|e| match &e.event {
            Event::HookReceived { payload, .. } => {
                Some(payload.to_value::<WebhookRequest>().unwrap())
            }
            _ => None,
        })
        .unwrap();
    assert_eq!(payload.method, "POST");
    assert_eq!(payload.headers["idempotency-key"], "job-p1-done");
    assert_eq!(payload.headers["content-type"], "application/json");
    assert_eq!(payload.body["status"], "ok");

    // Its run ended, so the webhook is disposed: a late retry with the delivered key gets the
    // recorded answer, the same key with another body is refused 409, a new delivery is 404;
    // none changes anything.
    let token = j
        .iter()
        .find_map(|e| match &e.event {
            Event::HookCreated { token, .. } => Some(token.clone()),
            _ => None,
        })
        .unwrap();
    let url = server.url(&format!("/.well-known/workflow/v1/webhook/{token}"));
    let retry = reqwest::Client::new()
        .post(&url)
        .header("idempotency-key", "job-p1-done")
        // The same JSON, spaced and ordered differently.
        .header("content-type", "application/json")
        .body(r#"{ "url": "https://cdn.example/job-p1.mp4", "status": "ok" }"#)
        .send()
        .await
        .unwrap();
    assert_eq!(retry.status(), 202, "the recorded answer to a late retry");
    let changed = reqwest::Client::new()
        .post(&url)
        .header("idempotency-key", "job-p1-done")
        .json(&json!({ "status": "failed" }))
        .send()
        .await
        .unwrap();
    assert_eq!(changed.status(), 409, "a late retry with another body");
    assert_eq!(
        changed.json::<Value>().await.unwrap()["code"],
        "idempotency_mismatch"
    );
    let late = reqwest::Client::new()
        .post(&url)
        .header("idempotency-key", "job-p1-again")
        .json(&json!({ "status": "ok" }))
        .send()
        .await
        .unwrap();
    assert_eq!(late.status(), 404);
    assert_eq!(
        late.json::<Value>().await.unwrap()["code"],
        "unknown_webhook"
    );
    assert_eq!(journal(&store, &run).await.len(), j.len());

    // The runs API shows the journal with the webhook token redacted (it is a capability).
    let shown: Value = reqwest::get(server.url(&format!("/v1/runs/{run}")))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let created = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|e| e["event"].get("HookCreated"))
        .expect("HookCreated shown");
    assert_eq!(created["token"], format!("{}…", &token[..7]));
    assert!(!shown.to_string().contains(&token));

    worker.shutdown().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_with_one_idempotency_key_are_delivered_once_and_get_respond_with() {
    let (_dir, store) = sqlite().await;
    let server = TestServer::start(store.clone(), |_| {}).await;
    let worker = worker(store.clone()).await;
    let announced = expect_url("retry");
    let mut events = SseClient::connect(&server.url("/v1/sessions/s-retry/events"), None).await;
    let respond_with = json!({
        "status": 200,
        "headers": { "x-eve": "thanks" },
        "body": { "received": true }
    });
    let run = start(
        &store,
        "s-retry",
        "call-1",
        "collect",
        json!({ "key": "retry", "count": 2, "respond_with": respond_with }),
    )
    .await;
    let url = server.url(&announced.await.expect("webhook announced"));
    let client = reqwest::Client::new();
    static ATTEMPT: AtomicU32 = AtomicU32::new(0);
    let send = |method: reqwest::Method, key: &'static str, body: String| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            client
                .request(method, &url)
                .header("idempotency-key", key)
                .header("content-type", "text/plain")
                // A sender's retry may change its headers; only the method and body count.
                .header(
                    "x-attempt",
                    ATTEMPT.fetch_add(1, Ordering::Relaxed).to_string(),
                )
                .body(body)
                .send()
                .await
                .expect("the request reaches the server")
        }
    };
    let post = |key: &'static str| send(reqwest::Method::POST, key, format!("delivery {key}"));
    let code = |resp: reqwest::Response| async move {
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.expect("JSON error body");
        (status, body["code"].as_str().unwrap_or_default().to_owned())
    };
    let mismatch = (409, "idempotency_mismatch".to_owned());
    // Five concurrent tries with key A; the same key with another body or method is refused
    // (and delivers nothing: the run still waits for its second payload); then three tries
    // with key B: two payloads in all.
    let a = futures::future::join_all((0..5).map(|_| post("key-a"))).await;
    let other_body = send(reqwest::Method::POST, "key-a", "another body".into()).await;
    assert_eq!(code(other_body).await, mismatch);
    let other_method = send(reqwest::Method::PUT, "key-a", "delivery key-a".into()).await;
    assert_eq!(code(other_method).await, mismatch);
    let b = futures::future::join_all((0..3).map(|_| post("key-b"))).await;
    for resp in a.into_iter().chain(b) {
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-eve"], "thanks");
        assert_eq!(
            resp.json::<Value>().await.unwrap(),
            json!({ "received": true })
        );
    }

    let settled = events.until("tool.settled").await.pop().unwrap().json();
    let output = &settled["event"]["data"]["result"]["data"]["output"];
    let bodies: Vec<&str> = output
        .as_array()
        .expect("two deliveries")
        .iter()
        .map(|r| r["body"].as_str().unwrap())
        .collect();
    assert_eq!(bodies, ["delivery key-a", "delivery key-b"], "{output}");
    let j = journal(&store, &run).await;
    assert_eq!(count(&j, |e| matches!(e, Event::HookReceived { .. })), 2);

    // The run has ended: a retry with a delivered key still gets the recorded response (the
    // sender who only saw a disconnect learns it was delivered); a new key is unknown.
    let late = post("key-a").await;
    assert_eq!(late.status(), 200, "a retry after the run ended");
    assert_eq!(late.headers()["x-eve"], "thanks");
    assert_eq!(
        late.json::<Value>().await.unwrap(),
        json!({ "received": true })
    );
    let late_other = send(reqwest::Method::POST, "key-b", "changed".into()).await;
    assert_eq!(code(late_other).await, mismatch, "after the run ended too");
    let unknown = post("key-c").await;
    assert_eq!(unknown.status(), 404, "a new key after the run ended");
    assert_eq!(
        unknown.json::<Value>().await.unwrap()["code"],
        "unknown_webhook"
    );
    assert_eq!(journal(&store, &run).await, j, "nothing was written");

    worker.shutdown().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_without_touching_the_run() {
    let (_dir, store) = sqlite().await;
    let limit = 64 * 1024;
    let server = TestServer::start(store.clone(), |c| c.body_limit = limit).await;
    let worker = worker(store.clone()).await;
    let announced = expect_url("bad");
    let run = start(
        &store,
        "s-bad",
        "call-1",
        "collect",
        json!({ "key": "bad", "count": 1 }),
    )
    .await;
    let path = announced.await.expect("webhook announced");
    let url = server.url(&path);
    let client = reqwest::Client::new();
    let code = |resp: reqwest::Response| async move {
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.expect("JSON error body");
        (status, body["code"].as_str().unwrap_or_default().to_owned())
    };

    // 404: unknown tokens of the right shape, tokens of the wrong shape, an empty token.
    let unknown = format!("/.well-known/workflow/v1/webhook/wh_{}", "0".repeat(64));
    for p in [
        unknown.as_str(),
        "/.well-known/workflow/v1/webhook/render-p1",
        "/.well-known/workflow/v1/webhook/WH_ABC",
    ] {
        let resp = client
            .post(server.url(p))
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(code(resp).await, (404, "unknown_webhook".into()), "{p}");
    }
    let resp = client
        .post(server.url("/.well-known/workflow/v1/webhook/"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);

    // 413: a body over the limit, with a Content-Length and streamed without one.
    let big = vec![b'x'; limit + 1];
    let resp = client.post(&url).body(big.clone()).send().await.unwrap();
    assert_eq!(code(resp).await, (413, "too_large".into()));
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        big.chunks(8 * 1024).map(|c| Ok(c.to_vec())).collect();
    let resp = client
        .post(&url)
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(code(resp).await, (413, "too_large".into()));

    // 400: JSON that does not parse under a JSON content type, a body that is not UTF-8,
    // header values that are not text, bad idempotency keys.
    let resp = client
        .post(&url)
        .header("content-type", "application/json")
        .body("{\"status\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(code(resp).await, (400, "malformed".into()));
    let resp = client
        .post(&url)
        .body(vec![0xff, 0xfe, 0x00])
        .send()
        .await
        .unwrap();
    assert_eq!(code(resp).await, (400, "malformed".into()));
    let resp = client
        .post(&url)
        .header(
            "x-binary",
            reqwest::header::HeaderValue::from_bytes(&[0xe9]).unwrap(),
        )
        .body("hi")
        .send()
        .await
        .unwrap();
    assert_eq!(code(resp).await, (400, "malformed".into()));
    let resp = client
        .post(&url)
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .body("hi")
        .send()
        .await
        .unwrap();
    assert_eq!(code(resp).await, (400, "malformed".into()));
    let resp = client
        .post(&url)
        .header(
            "idempotency-key",
            "x".repeat(eve_server::IDEMPOTENCY_KEY_MAX + 1),
        )
        .body("hi")
        .send()
        .await
        .unwrap();
    assert_eq!(code(resp).await, (400, "malformed".into()));
    // JSON nested deeper than the limit (the issue's 200 levels, and just past the limit),
    // under a JSON content type or none: refused before any ack.
    for depth in [eve_server::MAX_JSON_DEPTH + 1, 100, 200] {
        let deep = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        let resp = client
            .post(&url)
            .header("content-type", "application/json")
            .body(deep.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(code(resp).await, (400, "malformed".into()), "depth {depth}");
    }
    let deep = format!("{}1{}", "{\"a\":".repeat(100), "}".repeat(100));
    let resp = client.post(&url).body(deep).send().await.unwrap();
    assert_eq!(
        code(resp).await,
        (400, "malformed".into()),
        "deep objects, no content type"
    );
    // GET is not a delivery.
    let resp = client.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 405);

    // None of that reached the run (no delivery; the run did not end); it still waits and
    // takes a good request.
    let after = journal(&store, &run).await;
    assert_eq!(
        count(&after, |e| matches!(e, Event::HookReceived { .. })),
        0,
        "{after:?}"
    );
    assert_eq!(count(&after, Event::is_terminal), 0, "{after:?}");
    let mut events = SseClient::connect(&server.url("/v1/sessions/s-bad/events"), None).await;
    let resp = client
        .post(&url)
        .body(vec![b'y'; limit])
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        202,
        "a body of exactly the limit is accepted"
    );
    let settled = events.until("tool.settled").await.pop().unwrap().json();
    assert_eq!(settled["event"]["data"]["result"]["status"], "completed");

    worker.shutdown().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_in_webhook_headers_are_never_journaled() {
    let (_dir, store) = sqlite().await;
    let server = TestServer::start(store.clone(), |c| {
        c.webhook_drop_headers = vec!["X-Vendor-Sig".into()];
        c.webhook_keep_headers = vec!["X-Checked-Token".into()];
    })
    .await;
    let worker = worker(store.clone()).await;
    let announced = expect_url("redact");
    let mut events = SseClient::connect(&server.url("/v1/sessions/s-redact/events"), None).await;
    let run = start(
        &store,
        "s-redact",
        "call-1",
        "collect",
        json!({ "key": "redact", "count": 1 }),
    )
    .await;
    let url = server.url(&announced.await.expect("webhook announced"));
    let resp = reqwest::Client::new()
        .post(&url)
        .header("authorization", "Bearer sekret-1")
        .header("cookie", "session=sekret-2")
        .header("proxy-authorization", "Basic sekret-3")
        .header("x-api-key", "sekret-4")
        .header("x-vendor-sig", "sekret-5")
        .header("x-auth-token", "sekret-6")
        .header("x-gitlab-token", "sekret-7")
        .header("x-client-secret", "sekret-8")
        .header("x-db-password", "sekret-9")
        .header("x-checked-token", "kept-1")
        .header("x-hub-signature-256", "sha256=abc")
        .header("x-request-id", "req-77")
        .json(&json!({ "status": "ok" }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let settled = events.until("tool.settled").await.pop().unwrap().json();
    let headers = &settled["event"]["data"]["result"]["data"]["output"][0]["headers"];
    assert_eq!(headers["x-request-id"], "req-77", "{headers}");
    assert_eq!(headers["x-hub-signature-256"], "sha256=abc", "{headers}");
    assert_eq!(
        headers["x-checked-token"], "kept-1",
        "kept by the configuration"
    );
    for name in [
        "authorization",
        "cookie",
        "proxy-authorization",
        "x-api-key",
        "x-vendor-sig",
        "x-auth-token",
        "x-gitlab-token",
        "x-client-secret",
        "x-db-password",
    ] {
        assert!(
            headers.get(name).is_none(),
            "{name} reached the run: {headers}"
        );
    }
    // Not in the journal, not in the runs API, not on the channel.
    let journal = serde_json::to_string(&journal(&store, &run).await).unwrap();
    let api = reqwest::get(server.url(&format!("/v1/runs/{run}")))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for text in [&journal, &api, &settled.to_string()] {
        assert!(
            !text.contains("sekret"),
            "a credential was journaled: {text}"
        );
        assert!(text.contains("req-77"));
    }
    worker.shutdown().await;
    server.stop().await;
}

#[tokio::test]
async fn router_nests_in_another_app() {
    // The router is an ordinary axum Router: a host may merge it with its own routes.
    let (_dir, store) = sqlite().await;
    let state = eve_server::AppState::new(store, Arc::new(eve_core::engine::SystemClock))
        .with_config(eve_server::ServerConfig {
            insecure_no_auth: true,
            ..eve_server::ServerConfig::default()
        });
    let app = Router::new()
        .route("/health", axum::routing::get(|| async { "ok" }))
        .merge(eve_server::router(state));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::new();
    let health = client
        .get(format!("http://{addr}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.text().await.unwrap(), "ok");
    let runs: Value = client
        .get(format!("http://{addr}/v1/runs"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(runs["runs"], json!([]));
    assert_eq!(runs["next"], Value::Null);
}
