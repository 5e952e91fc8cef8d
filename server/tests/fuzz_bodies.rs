//! Every HTTP route that takes a JSON body, fuzzed (README, "Fuzzing"): arbitrary JSON built from
//! the routes' own field names and edge values, and byte mutations of valid bodies, sent to a
//! live server (SQLite, a worker, calls parked on an ask). Never a 500 or a dropped connection;
//! and nothing a route accepted fails later: afterwards every run's journal reads, every session
//! reads, and the server is ready.
//!
//! `EVE_FUZZ_CASES=N` sets the requests (default 400), `EVE_FUZZ_DEEP=1` runs a million.

mod common;

use common::*;
use eve_core::{JournalStoreExt, RunQuery, SessionId};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Map, Value};

use eve_core::testing::fuzz_cases as cases;

/// Field names the routes read, so that fuzzed objects reach past "missing field".
const FIELDS: &[&str] = &[
    "optionId",
    "text",
    "answeredBy",
    "agent",
    "output",
    "error",
    "reason",
    "by",
    "to",
    "deployment",
    "input",
    "sessionId",
    "callId",
    "idempotencyKey",
    "execution",
    "message",
    "name",
    "scope",
    "expiresAt",
    "service",
    "order_id",
    "key",
    "wait",
    "dedupeKey",
    "payload",
    "status",
    "headers",
    "body",
    "extra",
];

/// Edge strings.
const STRINGS: &[&str] = &[
    "",
    "approve",
    "deny",
    "cancel",
    "admin",
    "read",
    "background",
    "default",
    "deploy",
    "s-fuzz",
    "\u{0}",
    "\u{feff}",
    "é",
    "😀",
    "\\",
    "\"",
    "1h",
    "-1",
    "99999999999999999999",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        (0..STRINGS.len()).prop_map(|i| json!(STRINGS[i])),
        "[ -~]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec((0..FIELDS.len(), inner), 0..5).prop_map(|kv| {
                Value::Object(
                    kv.into_iter()
                        .map(|(k, v)| (FIELDS[k].to_owned(), v))
                        .collect::<Map<_, _>>(),
                )
            }),
        ]
    })
}

/// Bits spliced into valid bodies: raw JSON that is not data, unknown fields, broken structure.
const TOKENS: &[&str] = &[
    "1e999",
    r#""\ud800""#,
    r#","x":1"#,
    "null",
    "{",
    "}",
    "[",
    "\"",
    ",",
    "\u{0}",
    "\u{ff}",
];

#[derive(Debug, Clone)]
enum Body {
    Json(Value),
    Mutated(usize, Vec<(usize, usize)>),
}

/// Valid bodies, one per route family, to mutate.
fn valid_bodies() -> Vec<Value> {
    vec![
        json!({"optionId": "approve"}),
        json!({"text": "ok"}),
        json!({"output": {"facts": ["a"]}}),
        json!({"reason": "stop"}),
        json!({"reason": "stuck", "by": "ops"}),
        json!({"to": 2}),
        json!({"error": "no"}),
        json!({"input": {"service": "api"}, "sessionId": "s-fuzz", "callId": "c"}),
        json!({"message": {"text": "hi"}}),
        json!({"name": "k", "scope": "read"}),
        json!({"any": [1, 2, {"x": "y"}]}),
    ]
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        json_value().prop_map(Body::Json),
        (
            0..valid_bodies().len(),
            proptest::collection::vec((any::<usize>(), 0..TOKENS.len()), 1..4)
        )
            .prop_map(|(i, m)| Body::Mutated(i, m)),
    ]
}

fn bytes(b: &Body) -> Vec<u8> {
    match b {
        Body::Json(v) => serde_json::to_vec(v).expect("a value serializes"),
        Body::Mutated(i, muts) => {
            let mut text = serde_json::to_vec(&valid_bodies()[*i]).expect("serializes");
            for (at, t) in muts {
                let at = at % (text.len() + 1);
                text.splice(at..at, TOKENS[*t].bytes());
            }
            text
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzzed_json_bodies_never_500_and_accepted_ones_stay_usable() {
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let server = TestServer::start(store.clone(), |_| {}).await;
    let client = reqwest::Client::new();
    // Calls parked on their asks, so ids in the routes name live things.
    let mut runs = Vec::new();
    for i in 0..4 {
        runs.push(
            start(
                &store,
                "s-fuzz",
                &format!("parked-{i}"),
                "deploy",
                json!({"service": "api"}),
            )
            .await,
        );
    }
    let mut requests = Vec::new();
    while requests.len() < runs.len() {
        requests = store
            .pending_requests(&SessionId::new("s-fuzz"))
            .await
            .expect("pending");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let request = requests[0].request_id.to_string();
    let run = runs[1].to_string();
    let routes: Vec<String> = vec![
        format!("/v1/requests/{request}/answer"),
        format!("/v1/requests/{}/answer", requests[2].request_id),
        format!("/v1/agents/{request}/result"),
        format!("/v1/tasks/{run}/cancel"),
        "/v1/sessions/s-fuzz-other/end".into(),
        "/v1/tools/deploy/calls".into(),
        "/v1/tools/lookup_order/calls".into(),
        "/v1/tools/refund_order/calls".into(),
        format!("/v1/runs/{run}/cancel"),
        format!("/v1/runs/{run}/resume"),
        format!("/v1/runs/{}/fail", runs[2]),
        // Terminated by the first accepted body; then retried and reset from.
        format!("/v1/runs/{}/terminate", runs[3]),
        format!("/v1/runs/{}/retry", runs[3]),
        format!("/v1/runs/{}/reset", runs[3]),
        "/v1/sessions/s-fuzz/messages".into(),
        "/v1/keys".into(),
        "/v1/keys/nope/revoke".into(),
        "/.well-known/workflow/v1/webhook/wh_nope".into(),
    ];
    let mut runner = TestRunner::new(Config {
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (0..routes.len(), body());
    let n = cases(400);
    let mut accepted = 0;
    for i in 0..n {
        let (route, b) = strategy.new_tree(&mut runner).expect("a case").current();
        let sent = bytes(&b);
        let resp = client
            .post(server.url(&routes[route]))
            .header("content-type", "application/json")
            .body(sent.clone())
            .send()
            .await
            .unwrap_or_else(|e| panic!("case {i}: {} dropped the connection: {e}", routes[route]));
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        assert!(
            status < 500 || status == 503,
            "case {i}: POST {} with {} answered {status}: {text}",
            routes[route],
            String::from_utf8_lossy(&sent)
        );
        if status < 300 {
            accepted += 1;
        } else if status >= 400 {
            let e: Value = serde_json::from_str(&text)
                .unwrap_or_else(|_| panic!("case {i}: a {status} has a JSON body: {text}"));
            assert!(
                e.get("code").is_some(),
                "case {i}: a {status} names its code: {text}"
            );
        }
    }
    // Nothing accepted fails later: every run and session reads back, the server is ready.
    let all = store
        .list_runs(&RunQuery::default())
        .await
        .expect("list_runs");
    for r in &all {
        store
            .read_all(&r.run_id, 0)
            .await
            .unwrap_or_else(|e| panic!("the journal of {} reads after the fuzzing: {e}", r.run_id));
        store
            .get_session(&r.session_id)
            .await
            .unwrap_or_else(|e| panic!("session {} reads after the fuzzing: {e}", r.session_id));
        store
            .read_session(&r.session_id, 0, 10_000)
            .await
            .unwrap_or_else(|e| panic!("the log of {} reads after the fuzzing: {e}", r.session_id));
    }
    store
        .get_session(&SessionId::new("s-fuzz"))
        .await
        .expect("the fuzzed session reads");
    let ready = client
        .get(server.url("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert!(ready.status().is_success(), "the server stays ready");
    println!(
        "{n} fuzzed bodies, {accepted} accepted, {} runs read back",
        all.len()
    );
    server.stop().await;
    worker.shutdown().await;
}
