//! What an operator sees: `/metrics` scraped after a run (steps, their latency, runs by status,
//! answers, webhook outcomes, requests by route), the health routes, and JSON error bodies for
//! the errors axum answers by itself (405, undecodable paths).

mod common;

use common::*;
use eve_server::Metrics;
use serde_json::{json, Value};
use tracing_subscriber::layer::SubscriberExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_after_a_run_and_json_errors_everywhere() {
    // The engine's spans feed the metrics through the layer, as in `eve serve`.
    let metrics = Metrics::new();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(metrics.layer()))
        .expect("the only subscriber of this test binary");
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let state = eve_server::AppState::new(
        store.clone(),
        std::sync::Arc::new(eve_core::engine::SystemClock),
    )
    .with_config(eve_server::ServerConfig {
        base_url: base.clone(),
        ..eve_server::ServerConfig::default()
    })
    .with_metrics(metrics);
    tokio::spawn(eve_server::serve(listener, state));
    let key = eve_server::create_key(
        &*store,
        "scraper",
        eve_core::KeyScope::Answer,
        eve_core::Timestamp::now(),
    )
    .await
    .unwrap()
    .text;
    let client = reqwest::Client::new();

    let mut events =
        SseClient::connect_with(&format!("{base}/v1/sessions/s-m/events"), None, Some(&key)).await;
    start(
        &store,
        "s-m",
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
    let resp = client
        .post(format!("{base}/v1/requests/{request}/answer"))
        .bearer_auth(&key)
        .json(&json!({ "optionId": "approve" }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    events.until("tool.settled").await;
    // A second call answered from the page (its cookie, no Authorization header): counted
    // under surface="page".
    let signed_in = client
        .post(format!("{base}/v1/auth/session"))
        .json(&json!({ "key": key }))
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status(), 200);
    let cookie = signed_in.headers()[reqwest::header::SET_COOKIE]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    start(
        &store,
        "s-m",
        "call-2",
        "deploy",
        json!({ "service": "web" }),
    )
    .await;
    let asked = events.until("input.requested").await.pop().unwrap().json();
    let second = asked["event"]["data"]["requestId"]
        .as_str()
        .unwrap()
        .to_owned();
    let resp = client
        .post(format!("{base}/v1/requests/{second}/answer"))
        .header(reqwest::header::COOKIE, &cookie)
        .json(&json!({ "optionId": "approve" }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    events.until("tool.settled").await;
    let resp = client
        .post(format!(
            "{base}/.well-known/workflow/v1/webhook/wh_{}",
            "0".repeat(32)
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);

    let resp = client.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), 401, "metrics need a key");
    let text = client
        .get(format!("{base}/metrics"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "eve_runs{status=\"completed\"} 2",
        "eve_runs{status=\"running\"} 0",
        "eve_pending_requests 0",
        "eve_steps_total{name=\"plan_deploy\"} 2",
        "eve_steps_total{name=\"apply_deploy\"} 2",
        "eve_step_duration_seconds_count 4",
        "eve_answers_total{outcome=\"accepted\",surface=\"http\"} 1",
        "eve_answers_total{outcome=\"accepted\",surface=\"page\"} 1",
        "eve_call_settle_seconds_count{tool=\"deploy\",outcome=\"completed\"} 2",
        "eve_webhook_deliveries_total{outcome=\"unknown\"} 1",
        "eve_http_requests_total{method=\"POST\",route=\"/v1/requests/{id}/answer\",status=\"200\"} 2",
    ] {
        assert!(text.contains(line), "no {line:?} in\n{text}");
    }
    assert!(
        text.contains("eve_activation_duration_seconds_count"),
        "{text}"
    );
    assert!(!text.contains(&request), "metrics name routes, never ids");

    // Health: no key needed.
    for (path, status) in [("/healthz", "ok"), ("/readyz", "ready")] {
        let v: Value = client
            .get(format!("{base}{path}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["status"], status);
    }
    // Errors axum answers by itself are JSON {code, message} too.
    for (method, path, status, code) in [
        (
            reqwest::Method::GET,
            format!("/.well-known/workflow/v1/webhook/wh_{}", "0".repeat(32)),
            405,
            "method_not_allowed",
        ),
        (
            reqwest::Method::DELETE,
            "/v1/runs".to_owned(),
            405,
            "method_not_allowed",
        ),
        (
            reqwest::Method::GET,
            "/v1/runs/%FF%FE".to_owned(),
            400,
            "malformed",
        ),
        (
            reqwest::Method::GET,
            "/no/such/route".to_owned(),
            404,
            "not_found",
        ),
    ] {
        let resp = client
            .request(method.clone(), format!("{base}{path}"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), status, "{method} {path}");
        let v: Value = resp
            .json()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        assert_eq!(v["code"], code, "{method} {path}: {v}");
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    }
    worker.shutdown().await;
}
