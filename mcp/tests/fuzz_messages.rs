//! Every MCP message, fuzzed (README, "Fuzzing"): JSON-RPC requests and notifications built
//! from the protocol's own methods, field names and edge values, and token mutations of valid
//! messages, posted in an initialized session to eve-mcp's streamable HTTP router (SQLite, a
//! worker, the example tools). Never a 5xx, a dropped connection or a reply that is not
//! JSON-RPC; a request with an id gets its response (or, for a `tools/call` of a tool that
//! legitimately waits, keeps its stream open); and nothing accepted fails later: afterwards
//! every run's journal and session read back and rmcp's own client still lists the tools.
//!
//! `EVE_FUZZ_CASES=N` sets the messages (default 300), `EVE_FUZZ_DEEP=1` runs a million.

mod common;

use std::time::Duration;

use common::*;
use eve_core::testing::fuzz_cases as cases;
use eve_core::{JournalStoreExt, RunQuery};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Map, Value};

/// Methods of the protocol (those eve serves, those rmcp answers, and some it does not know).
const METHODS: &[&str] = &[
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "tasks/get",
    "tasks/list",
    "tasks/cancel",
    "tasks/update",
    "tasks/result",
    "resources/list",
    "prompts/list",
    "logging/setLevel",
    "completion/complete",
    "notifications/initialized",
    "notifications/cancelled",
    "notifications/progress",
    "notifications/roots/list_changed",
    "eve/nope",
    "",
];

/// Field names the methods read, so fuzzed params reach past "missing field".
const FIELDS: &[&str] = &[
    "name",
    "arguments",
    "taskId",
    "inputResponses",
    "requestId",
    "cursor",
    "task",
    "ttl",
    "_meta",
    "traceparent",
    "progressToken",
    "reason",
    "level",
    "protocolVersion",
    "capabilities",
    "clientInfo",
    "service",
    "grams",
    "action",
    "content",
    "option",
    "eve/callKey",
    "eve/execution",
];

/// Edge strings: the fixture's tool names, ids of the wrong shape, odd text.
const STRINGS: &[&str] = &[
    "",
    "weigh",
    "remind",
    "deploy_approval",
    "survey",
    "nap",
    "nope",
    "run_x",
    "accept",
    "decline",
    "approve",
    "2025-11-25",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-zz",
    "\u{0}",
    "\u{feff}",
    "😀",
    "\\",
    "\"",
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
            object(inner),
        ]
    })
}

fn object(inner: impl Strategy<Value = Value>) -> impl Strategy<Value = Value> {
    proptest::collection::vec((0..FIELDS.len(), inner), 0..5).prop_map(|kv| {
        Value::Object(
            kv.into_iter()
                .map(|(k, v)| (FIELDS[k].to_owned(), v))
                .collect::<Map<_, _>>(),
        )
    })
}

/// A JSON-RPC message: `jsonrpc`, an id of any JSON type (or none: a notification), a method
/// and params made of the fields above.
fn message() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            4 => Just(json!("2.0")),
            1 => json_value(),
        ],
        prop_oneof![
            4 => (1..1_000_000i64).prop_map(|n| Some(json!(n))),
            1 => Just(None),
            1 => json_value().prop_map(Some),
        ],
        (0..METHODS.len()),
        prop_oneof![
            4 => object(json_value()).prop_map(Some),
            1 => json_value().prop_map(Some),
            1 => Just(None),
        ],
    )
        .prop_map(|(version, id, method, params)| {
            let mut m = Map::new();
            m.insert("jsonrpc".into(), version);
            if let Some(id) = id {
                m.insert("id".into(), id);
            }
            m.insert("method".into(), json!(METHODS[method]));
            if let Some(p) = params {
                m.insert("params".into(), p);
            }
            Value::Object(m)
        })
}

/// Bits spliced into valid messages: raw JSON that is not data, duplicate keys, broken structure.
const TOKENS: &[&str] = &[
    "1e999",
    r#""\ud800""#,
    r#","id":2"#,
    r#","method":"ping""#,
    "null",
    "{",
    "}",
    "[",
    "\"",
    ",",
    "\u{0}",
    "\u{ff}",
];

/// Valid messages, one per method family, to mutate.
fn valid_messages() -> Vec<Value> {
    vec![
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "weigh", "arguments": {"grams": 1500}}}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
               "params": {"name": "remind", "arguments": {"message": "m", "delay": "1h"},
                          "task": {"ttl": 60000}}}),
        json!({"jsonrpc": "2.0", "id": 4, "method": "tasks/get", "params": {"taskId": "run_x"}}),
        json!({"jsonrpc": "2.0", "id": 5, "method": "tasks/update",
               "params": {"taskId": "run_x", "inputResponses": {"r": {"action": "accept"}}}}),
        json!({"jsonrpc": "2.0", "id": 6, "method": "tasks/cancel", "params": {"taskId": "run_x"}}),
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}}),
    ]
}

#[derive(Debug, Clone)]
enum Msg {
    Json(Value),
    Mutated(usize, Vec<(usize, usize)>),
}

/// A well-formed `tools/call` of a tool the server may not have, with fuzzed arguments, as a
/// task or not: what reaches the engine.
fn tool_call() -> impl Strategy<Value = Value> {
    (
        1..1_000_000i64,
        prop_oneof![
            Just("weigh"),
            Just("remind"),
            Just("deploy_approval"),
            Just("nope")
        ],
        prop_oneof![
            object(json_value()),
            json_value().prop_map(|grams| json!({ "grams": grams })),
        ],
        any::<bool>(),
    )
        .prop_map(|(id, name, arguments, task)| {
            let mut params = json!({ "name": name, "arguments": arguments });
            if task {
                params["task"] = json!({ "ttl": 60_000 });
            }
            json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params })
        })
}

fn msg() -> impl Strategy<Value = Msg> {
    prop_oneof![
        3 => message().prop_map(Msg::Json),
        1 => tool_call().prop_map(Msg::Json),
        1 => (0..valid_messages().len()).prop_map(|i| Msg::Mutated(i, vec![])),
        1 => (
            0..valid_messages().len(),
            proptest::collection::vec((any::<usize>(), 0..TOKENS.len()), 1..4)
        )
            .prop_map(|(i, m)| Msg::Mutated(i, m)),
    ]
}

fn bytes(m: &Msg) -> Vec<u8> {
    match m {
        Msg::Json(v) => serde_json::to_vec(v).expect("a value serializes"),
        Msg::Mutated(i, muts) => {
            let mut text = serde_json::to_vec(&valid_messages()[*i]).expect("serializes");
            for (at, t) in muts {
                let at = at % (text.len() + 1);
                text.splice(at..at, TOKENS[*t].bytes());
            }
            text
        }
    }
}

/// How long a request's response may take before the stream counts as waiting.
const REPLY_WITHIN: Duration = Duration::from_secs(3);

/// What a POST got back.
enum Reply {
    /// The JSON-RPC messages of the body (a JSON body, or an SSE stream that ended or carried
    /// the response).
    Messages(u16, Vec<Value>),
    /// The SSE stream stayed open with no response (a call that waits).
    Waiting(Vec<Value>),
}

fn sse_messages(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            serde_json::from_str(d).unwrap_or_else(|e| panic!("an SSE event is JSON ({e}): {d}"))
        })
        .collect()
}

async fn post(http: &reqwest::Client, url: &str, session: &str, body: Vec<u8>) -> Reply {
    let shown = String::from_utf8_lossy(&body).into_owned();
    let mut r = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
        .body(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{shown}: the server dropped the connection: {e}"));
    let status = r.status().as_u16();
    let sse = r.headers().get("content-type").is_some_and(|v| {
        v.to_str()
            .unwrap_or_default()
            .starts_with("text/event-stream")
    });
    if !sse {
        let text = r.text().await.expect("a JSON body reads");
        if text.trim().is_empty() {
            return Reply::Messages(status, vec![]);
        }
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{shown}: {status}, not JSON ({e}): {text}"));
        return Reply::Messages(status, vec![v]);
    }
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + REPLY_WITHIN;
    loop {
        match tokio::time::timeout_at(deadline, r.chunk()).await {
            Err(_) => return Reply::Waiting(sse_messages(&text)),
            Ok(Ok(Some(c))) => {
                text.push_str(&String::from_utf8_lossy(&c));
                // Only whole lines: a chunk may end inside an event.
                let got = sse_messages(&text[..text.rfind('\n').map_or(0, |i| i + 1)]);
                if got
                    .iter()
                    .any(|m| m.get("result").is_some() || m.get("error").is_some())
                {
                    return Reply::Messages(status, got);
                }
            }
            Ok(Ok(None)) => return Reply::Messages(status, sse_messages(&text)),
            Ok(Err(e)) => panic!("{shown}: the stream broke: {e}"),
        }
    }
}

/// Opens a session the way a client does: `initialize`, then `notifications/initialized`.
async fn initialized(http: &reqwest::Client, url: &str) -> String {
    let init = json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": { "protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": { "name": "fuzz", "version": "0" } },
    });
    let r = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(init.to_string())
        .send()
        .await
        .expect("initialize");
    assert_eq!(r.status().as_u16(), 200);
    let session = r.headers()["mcp-session-id"]
        .to_str()
        .expect("a session id")
        .to_owned();
    drop(r);
    let done = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    match post(http, url, &session, done.to_string().into_bytes()).await {
        Reply::Messages(s, _) => assert!(s < 300, "notifications/initialized answered {s}"),
        Reply::Waiting(_) => panic!("a notification got a stream"),
    }
    session
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzzed_mcp_messages_never_break_the_server_and_accepted_ones_stay_usable() {
    let f = http_fixture().await;
    let http = reqwest::Client::new();
    let session = initialized(&http, &f.url).await;
    let mut runner = TestRunner::new(Config {
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = msg();
    let n = cases(300);
    let (mut answered, mut errors, mut waiting) = (0, 0, 0);
    for i in 0..n {
        let m = strategy.new_tree(&mut runner).expect("a case").current();
        let sent = bytes(&m);
        let shown = String::from_utf8_lossy(&sent).into_owned();
        let parsed: Option<Value> = serde_json::from_slice(&sent).ok();
        let method = parsed
            .as_ref()
            .and_then(|p| p.get("method"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        match post(&http, &f.url, &session, sent).await {
            Reply::Messages(status, msgs) => {
                assert!(
                    status < 500,
                    "case {i}: {shown} answered {status}: {msgs:?}"
                );
                for m in &msgs {
                    assert_eq!(m["jsonrpc"], "2.0", "case {i}: {shown} got {m}");
                    if let Some(e) = m.get("error") {
                        assert!(
                            e["code"].is_i64() && e["message"].is_string(),
                            "case {i}: {shown}: an error has a code and a message: {m}"
                        );
                        errors += 1;
                    } else if m.get("result").is_some() {
                        answered += 1;
                    }
                }
                if status >= 400 {
                    assert!(
                        !msgs.is_empty() || status == 404 || status == 405 || status == 406,
                        "case {i}: {shown}: a {status} says why"
                    );
                }
            }
            Reply::Waiting(msgs) => {
                // Only a tool call may wait (its body asks, or sleeps, and the call blocks).
                assert_eq!(
                    method, "tools/call",
                    "case {i}: {shown} left its stream open with no response: {msgs:?}"
                );
                waiting += 1;
            }
        }
    }
    // Nothing accepted fails later: every run and session reads back.
    let all = f
        .store
        .list_runs(&RunQuery::default())
        .await
        .expect("list_runs");
    for r in &all {
        f.store
            .read_all(&r.run_id, 0)
            .await
            .unwrap_or_else(|e| panic!("the journal of {} reads after the fuzzing: {e}", r.run_id));
        f.store
            .get_session(&r.session_id)
            .await
            .unwrap_or_else(|e| panic!("session {} reads after the fuzzing: {e}", r.session_id));
    }
    // The fuzzed session still serves, and so does a new one with rmcp's own client.
    let ping = json!({"jsonrpc": "2.0", "id": "after", "method": "ping"});
    match post(&http, &f.url, &session, ping.to_string().into_bytes()).await {
        Reply::Messages(200, msgs) => assert!(
            msgs.iter()
                .any(|m| m["id"] == "after" && m.get("result").is_some()),
            "ping after the fuzzing: {msgs:?}"
        ),
        Reply::Messages(s, msgs) => panic!("ping after the fuzzing answered {s}: {msgs:?}"),
        Reply::Waiting(_) => panic!("ping after the fuzzing got no answer"),
    }
    let c = connect(&f, TestClient::default()).await;
    assert!(!c.list_all_tools().await.expect("tools/list").is_empty());
    c.cancel().await.expect("close");
    println!(
        "{n} fuzzed messages: {answered} results, {errors} errors, {waiting} calls waiting, {} runs read back",
        all.len()
    );
}
