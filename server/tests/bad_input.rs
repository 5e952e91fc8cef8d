//! The bad-input suite: malformed, oversized, out-of-scope and misdirected requests against a
//! live server (keys on, a worker, a call parked on its ask). Each gets its documented 4xx with
//! a JSON `{code, message}` body; afterwards nothing changed: no run started, the parked run's
//! journal and pending request as they were, no key made or revoked.

mod common;

use common::*;
use eve_core::{KeyScope, RunQuery, SessionId, Timestamp};
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One raw HTTP/1.1 exchange (so that any bytes can be sent); (status, body).
async fn raw(
    addr: std::net::SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!("{method} {target} HTTP/1.1\r\nConnection: close\r\n").into_bytes();
    let has_host = headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host"));
    if !has_host {
        req.extend_from_slice(format!("Host: {addr}\r\n").as_bytes());
    }
    for (k, v) in headers {
        req.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    req.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    req.extend_from_slice(body);
    s.write_all(&req).await.unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).await.unwrap();
    let text = String::from_utf8_lossy(&resp).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 || tail.len() < n {
                break;
            }
            out.push_str(&tail[..n]);
            rest = tail[n..].trim_start_matches("\r\n");
        }
        out
    } else {
        body.to_owned()
    };
    (status, body)
}

struct Case {
    what: &'static str,
    method: &'static str,
    target: String,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    status: u16,
    code: Option<&'static str>,
}

fn nested(depth: usize) -> Vec<u8> {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth)).into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_bad_requests_get_json_4xx_and_change_nothing() {
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = eve_server::AppState::new(store.clone(), Arc::new(eve_core::engine::SystemClock))
        .with_config(eve_server::ServerConfig {
            base_url: format!("http://{addr}"),
            body_limit: 64 * 1024,
            ..eve_server::ServerConfig::default()
        })
        .with_registry(registry());
    tokio::spawn(eve_server::serve(listener, state));
    let key = |scope| {
        let store = store.clone();
        async move {
            eve_server::create_key(&*store, "bad-input", scope, Timestamp::now())
                .await
                .unwrap()
        }
    };
    let admin = key(KeyScope::Admin).await.text;
    let read = key(KeyScope::Read).await.text;
    let revoked = key(KeyScope::Admin).await;
    store
        .revoke_key(&revoked.record.id, Timestamp::now())
        .await
        .unwrap();
    let revoked = revoked.text;

    // A call parked on its ask: what the bad requests must not disturb.
    let run = start(&store, "s-bad", "c1", "deploy", json!({ "service": "api" })).await;
    let request = loop {
        let pending = store
            .pending_requests(&SessionId::new("s-bad"))
            .await
            .unwrap();
        if let Some(p) = pending.first() {
            break p.request_id.to_string();
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let before_journal = journal(&store, &run).await;
    let before_runs = store.list_runs(&RunQuery::default()).await.unwrap().len();
    let before_keys = store.list_keys().await.unwrap();

    let auth = |k: &str| vec![("Authorization", format!("Bearer {k}"))];
    let json_auth = |k: &str| {
        vec![
            ("Authorization", format!("Bearer {k}")),
            ("Content-Type", "application/json".to_owned()),
        ]
    };
    // One byte over the limit on every id a client chooses.
    let long = "s".repeat(eve_core::MAX_CLIENT_ID_BYTES + 1);
    let c = |what, method, target: String, headers, body: &[u8], status, code| Case {
        what,
        method,
        target,
        headers,
        body: body.to_vec(),
        status,
        code,
    };
    let answer = format!("/v1/requests/{request}/answer");
    let calls = "/v1/tools/deploy/calls".to_owned();
    let hook = "/.well-known/workflow/v1/webhook/".to_owned();
    let mut cases = vec![
        // Credentials.
        c(
            "no key",
            "GET",
            "/v1/runs".into(),
            vec![],
            b"",
            401,
            Some("unauthorized"),
        ),
        c(
            "empty bearer",
            "GET",
            "/v1/runs".into(),
            vec![("Authorization", "Bearer ".into())],
            b"",
            401,
            Some("unauthorized"),
        ),
        c(
            "basic auth",
            "GET",
            "/v1/runs".into(),
            vec![("Authorization", "Basic YTpi".into())],
            b"",
            401,
            Some("unauthorized"),
        ),
        c(
            "unknown key",
            "GET",
            "/v1/runs".into(),
            auth("eve_000000000000_nope"),
            b"",
            401,
            Some("unauthorized"),
        ),
        c(
            "not a key",
            "GET",
            "/v1/runs".into(),
            auth("hunter2"),
            b"",
            401,
            Some("unauthorized"),
        ),
        c(
            "revoked key",
            "GET",
            "/v1/runs".into(),
            auth(&revoked),
            b"",
            401,
            Some("unauthorized"),
        ),
        c(
            "read key answers",
            "POST",
            answer.clone(),
            json_auth(&read),
            br#"{"optionId":"approve"}"#,
            403,
            Some("forbidden"),
        ),
        c(
            "read key terminates",
            "POST",
            format!("/v1/runs/{run}/terminate"),
            json_auth(&read),
            br#"{"reason":"x"}"#,
            403,
            Some("forbidden"),
        ),
        c(
            "read key cancels",
            "POST",
            format!("/v1/runs/{run}/cancel"),
            json_auth(&read),
            b"{}",
            403,
            Some("forbidden"),
        ),
        c(
            "read key starts a call",
            "POST",
            calls.clone(),
            json_auth(&read),
            br#"{"session":"s","callId":"x","input":{"service":"a"}}"#,
            403,
            Some("forbidden"),
        ),
        c(
            "read key makes a key",
            "POST",
            "/v1/keys".into(),
            json_auth(&read),
            br#"{"name":"x","scope":"admin"}"#,
            403,
            Some("forbidden"),
        ),
        c(
            "read key revokes",
            "POST",
            "/v1/keys/abc/revoke".into(),
            json_auth(&read),
            b"",
            403,
            Some("forbidden"),
        ),
        // Host and origin.
        c(
            "foreign host",
            "GET",
            "/v1/runs".into(),
            vec![
                ("Host", "attacker.example:8792".into()),
                ("Authorization", format!("Bearer {admin}")),
            ],
            b"",
            421,
            Some("misdirected"),
        ),
        c(
            "rebinding answer",
            "POST",
            answer.clone(),
            vec![
                ("Host", "attacker.example:8792".into()),
                ("Origin", "http://attacker.example:8792".into()),
                ("Authorization", format!("Bearer {admin}")),
                ("Content-Type", "application/json".into()),
            ],
            br#"{"optionId":"approve"}"#,
            421,
            Some("misdirected"),
        ),
        c(
            "cross-origin answer",
            "POST",
            answer.clone(),
            vec![
                ("Origin", "http://evil.example".into()),
                ("Authorization", format!("Bearer {admin}")),
                ("Content-Type", "application/json".into()),
            ],
            br#"{"optionId":"approve"}"#,
            403,
            Some("cross_origin"),
        ),
        // Answers.
        c(
            "answer: empty body",
            "POST",
            answer.clone(),
            json_auth(&admin),
            b"",
            400,
            None,
        ),
        c(
            "answer: not JSON",
            "POST",
            answer.clone(),
            json_auth(&admin),
            b"approve",
            400,
            None,
        ),
        c(
            "answer: truncated JSON",
            "POST",
            answer.clone(),
            json_auth(&admin),
            br#"{"optionId":"#,
            400,
            None,
        ),
        c(
            "answer: array",
            "POST",
            answer.clone(),
            json_auth(&admin),
            br#"["approve"]"#,
            400,
            None,
        ),
        c(
            "answer: string",
            "POST",
            answer.clone(),
            json_auth(&admin),
            br#""approve""#,
            400,
            None,
        ),
        c(
            "answer: number",
            "POST",
            answer.clone(),
            json_auth(&admin),
            b"1",
            400,
            None,
        ),
        c(
            "answer: null",
            "POST",
            answer.clone(),
            json_auth(&admin),
            b"null",
            400,
            None,
        ),
        c(
            "answer: option not a string",
            "POST",
            answer.clone(),
            json_auth(&admin),
            br#"{"optionId":7}"#,
            400,
            None,
        ),
        c(
            "answer: option not offered",
            "POST",
            answer.clone(),
            json_auth(&admin),
            br#"{"optionId":"yolo"}"#,
            422,
            Some("invalid_answer"),
        ),
        c(
            "answer: nothing chosen",
            "POST",
            answer.clone(),
            json_auth(&admin),
            b"{}",
            422,
            Some("invalid_answer"),
        ),
        c(
            "answer: invalid UTF-8",
            "POST",
            answer.clone(),
            json_auth(&admin),
            b"{\"optionId\":\"\xff\xfe\"}",
            400,
            None,
        ),
        c(
            "answer: too deep",
            "POST",
            answer.clone(),
            json_auth(&admin),
            &nested(200),
            400,
            None,
        ),
        c(
            "answer: over the body limit",
            "POST",
            answer.clone(),
            json_auth(&admin),
            format!("{{\"text\":\"{}\"}}", "x".repeat(70 * 1024)).as_bytes(),
            413,
            Some("too_large"),
        ),
        c(
            "answer: unknown request",
            "POST",
            "/v1/requests/run_none:3/answer".into(),
            json_auth(&admin),
            br#"{"optionId":"approve"}"#,
            404,
            Some("not_found"),
        ),
        c(
            "answer: GET",
            "GET",
            answer.clone(),
            auth(&admin),
            b"",
            405,
            Some("method_not_allowed"),
        ),
        // Starting calls.
        c(
            "call: unknown tool",
            "POST",
            "/v1/tools/nope/calls".into(),
            json_auth(&admin),
            br#"{"session":"s","callId":"x","input":{}}"#,
            404,
            Some("not_found"),
        ),
        c(
            "call: input against the schema",
            "POST",
            calls.clone(),
            json_auth(&admin),
            br#"{"session":"s","callId":"x","input":{"service":7}}"#,
            400,
            Some("invalid_input"),
        ),
        c(
            "call: input missing a field",
            "POST",
            calls.clone(),
            json_auth(&admin),
            br#"{"session":"s","callId":"x","input":{}}"#,
            400,
            Some("invalid_input"),
        ),
        c(
            "call: input an array",
            "POST",
            calls.clone(),
            json_auth(&admin),
            br#"{"session":"s","callId":"x","input":[]}"#,
            400,
            Some("invalid_input"),
        ),
        c(
            "call: no session",
            "POST",
            calls.clone(),
            json_auth(&admin),
            br#"{"callId":"x","input":{"service":"a"}}"#,
            400,
            Some("malformed"),
        ),
        c(
            "call: no call id",
            "POST",
            calls.clone(),
            json_auth(&admin),
            br#"{"session":"s","input":{"service":"a"}}"#,
            400,
            Some("malformed"),
        ),
        c(
            "call: unknown field",
            "POST",
            calls.clone(),
            json_auth(&admin),
            br#"{"session":"s","callId":"x","input":{"service":"a"},"priority":9}"#,
            400,
            Some("malformed"),
        ),
        c(
            "call: body an array",
            "POST",
            calls.clone(),
            json_auth(&admin),
            br#"["s","x",{}]"#,
            400,
            Some("malformed"),
        ),
        c(
            "call: bad wait",
            "POST",
            format!("{calls}?wait=soon"),
            json_auth(&admin),
            br#"{"session":"s","callId":"x","input":{"service":"a"}}"#,
            400,
            Some("malformed"),
        ),
        c(
            "call: wait in hours",
            "POST",
            format!("{calls}?wait=5h"),
            json_auth(&admin),
            br#"{"session":"s","callId":"x","input":{"service":"a"}}"#,
            400,
            Some("malformed"),
        ),
        c(
            "call: retry with another input",
            "POST",
            calls.clone(),
            json_auth(&admin),
            br#"{"session":"s-bad","callId":"c1","input":{"service":"web"}}"#,
            409,
            Some("idempotency_mismatch"),
        ),
        // Runs.
        c(
            "runs: unknown status",
            "GET",
            "/v1/runs?status=asleep".into(),
            auth(&admin),
            b"",
            400,
            Some("malformed"),
        ),
        c(
            "runs: unknown order",
            "GET",
            "/v1/runs?order=sideways".into(),
            auth(&admin),
            b"",
            400,
            Some("malformed"),
        ),
        c(
            "runs: limit not a number",
            "GET",
            "/v1/runs?limit=many".into(),
            auth(&admin),
            b"",
            400,
            Some("malformed"),
        ),
        c(
            "runs: negative limit",
            "GET",
            "/v1/runs?limit=-1".into(),
            auth(&admin),
            b"",
            400,
            Some("malformed"),
        ),
        c(
            "runs: since not a number",
            "GET",
            "/v1/runs?since=yesterday".into(),
            auth(&admin),
            b"",
            400,
            Some("malformed"),
        ),
        c(
            "runs: cursor of nothing",
            "GET",
            "/v1/runs?before=run_nope".into(),
            auth(&admin),
            b"",
            400,
            Some("malformed"),
        ),
        c(
            "runs: unknown parameter",
            "GET",
            "/v1/runs?color=red".into(),
            auth(&admin),
            b"",
            400,
            Some("malformed"),
        ),
        // Pending requests across sessions.
        c(
            "requests: unknown order",
            "GET",
            "/v1/requests?order=sideways".into(),
            auth(&admin),
            b"",
            400,
            Some("malformed"),
        ),
        c(
            "requests: limit zero",
            "GET",
            "/v1/requests?limit=0".into(),
            auth(&admin),
            b"",
            400,
            Some("malformed"),
        ),
        c(
            "requests: limit not a number",
            "GET",
            "/v1/requests?limit=many".into(),
            auth(&admin),
            b"",
            400,
            Some("malformed"),
        ),
        c(
            "requests: cursor not one",
            "GET",
            "/v1/requests?before=yesterday".into(),
            auth(&admin),
            b"",
            400,
            Some("malformed"),
        ),
        c(
            "requests: unknown parameter",
            "GET",
            "/v1/requests?color=red".into(),
            auth(&admin),
            b"",
            400,
            Some("malformed"),
        ),
        c(
            "runs: unknown run",
            "GET",
            "/v1/runs/run_nope".into(),
            auth(&admin),
            b"",
            404,
            Some("not_found"),
        ),
        c(
            "resume a running run",
            "POST",
            format!("/v1/runs/{run}/resume"),
            json_auth(&admin),
            b"",
            400,
            Some("invalid_input"),
        ),
        c(
            "fail without an error",
            "POST",
            format!("/v1/runs/{run}/fail"),
            json_auth(&admin),
            b"{}",
            400,
            Some("malformed"),
        ),
        c(
            "fail with an unknown field",
            "POST",
            format!("/v1/runs/{run}/fail"),
            json_auth(&admin),
            br#"{"error":"x","force":true}"#,
            400,
            Some("malformed"),
        ),
        c(
            "terminate without a reason",
            "POST",
            format!("/v1/runs/{run}/terminate"),
            json_auth(&admin),
            b"{}",
            400,
            Some("malformed"),
        ),
        c(
            "terminate with an unknown field",
            "POST",
            format!("/v1/runs/{run}/terminate"),
            json_auth(&admin),
            br#"{"reason":"x","force":true}"#,
            400,
            Some("malformed"),
        ),
        c(
            "reset with a cut that is not a number",
            "POST",
            format!("/v1/runs/{run}/reset"),
            json_auth(&admin),
            br#"{"to":"two"}"#,
            400,
            Some("malformed"),
        ),
        c(
            "reset without a cut",
            "POST",
            format!("/v1/runs/{run}/reset"),
            json_auth(&admin),
            b"{}",
            400,
            Some("malformed"),
        ),
        c(
            "retry an unknown run",
            "POST",
            "/v1/runs/run_nope/retry".into(),
            json_auth(&admin),
            b"",
            404,
            Some("not_found"),
        ),
        c(
            "cancel an unknown run",
            "POST",
            "/v1/runs/run_nope/cancel".into(),
            json_auth(&admin),
            b"",
            404,
            Some("not_found"),
        ),
        c(
            "cancel a call as a task",
            "POST",
            format!("/v1/tasks/{run}/cancel"),
            json_auth(&admin),
            b"",
            409,
            Some("not_a_task"),
        ),
        // Streams.
        c(
            "stream: Last-Event-ID not a seq",
            "GET",
            "/v1/sessions/s-bad/events".into(),
            vec![
                ("Authorization", format!("Bearer {admin}")),
                ("Last-Event-ID", "yesterday".into()),
            ],
            b"",
            400,
            Some("malformed"),
        ),
        c(
            "stream: from not a number",
            "GET",
            "/v1/sessions/s-bad/events?from=x".into(),
            auth(&admin),
            b"",
            400,
            Some("malformed"),
        ),
        c(
            "streams: no session",
            "GET",
            "/v1/events".into(),
            auth(&admin),
            b"",
            400,
            Some("malformed"),
        ),
        c(
            "streams: cursor not JSON",
            "GET",
            "/v1/events?session=s-bad&from=%7B".into(),
            auth(&admin),
            b"",
            400,
            Some("malformed"),
        ),
        c(
            "streams: unknown parameter",
            "GET",
            "/v1/events?session=s-bad&x=1".into(),
            auth(&admin),
            b"",
            400,
            Some("malformed"),
        ),
        // Webhooks.
        c(
            "webhook: unknown token",
            "POST",
            format!("{hook}whk_nope"),
            vec![("Content-Type", "application/json".into())],
            br#"{"ok":true}"#,
            404,
            Some("unknown_webhook"),
        ),
        c(
            "webhook: unknown token, deep body",
            "POST",
            format!("{hook}whk_nope"),
            vec![("Content-Type", "application/json".into())],
            &nested(100),
            404,
            Some("unknown_webhook"),
        ),
        c(
            "webhook: GET",
            "GET",
            format!("{hook}whk_nope"),
            vec![],
            b"",
            405,
            Some("method_not_allowed"),
        ),
        // Ids a client chooses: at most 256 bytes, printable; nothing is read or written.
        c(
            "call: session of 257 bytes",
            "POST",
            calls.clone(),
            json_auth(&admin),
            format!(r#"{{"session":"{long}","callId":"x","input":{{"service":"a"}}}}"#).as_bytes(),
            400,
            Some("invalid_id"),
        ),
        c(
            "call: session with a newline",
            "POST",
            calls.clone(),
            json_auth(&admin),
            br#"{"session":"s\nt","callId":"x","input":{"service":"a"}}"#,
            400,
            Some("invalid_id"),
        ),
        c(
            "call: empty session",
            "POST",
            calls.clone(),
            json_auth(&admin),
            br#"{"session":"","callId":"x","input":{"service":"a"}}"#,
            400,
            Some("invalid_id"),
        ),
        c(
            "call: call id of 257 bytes",
            "POST",
            calls.clone(),
            json_auth(&admin),
            format!(r#"{{"session":"s","callId":"{long}","input":{{"service":"a"}}}}"#).as_bytes(),
            400,
            Some("invalid_id"),
        ),
        c(
            "call: deprecated call_id of 257 bytes",
            "POST",
            calls.clone(),
            json_auth(&admin),
            format!(r#"{{"session":"s","call_id":"{long}","input":{{"service":"a"}}}}"#).as_bytes(),
            400,
            Some("invalid_id"),
        ),
        c(
            "call: call id with a bidi override",
            "POST",
            calls.clone(),
            json_auth(&admin),
            br#"{"session":"s","callId":"x\u202ey","input":{"service":"a"}}"#,
            400,
            Some("invalid_id"),
        ),
        c(
            "call: callId and call_id both",
            "POST",
            calls.clone(),
            json_auth(&admin),
            br#"{"session":"s","callId":"x","call_id":"x","input":{"service":"a"}}"#,
            400,
            Some("malformed"),
        ),
        c(
            "session events: id of 257 bytes",
            "GET",
            format!("/v1/sessions/{long}/events"),
            auth(&admin),
            b"",
            400,
            Some("invalid_id"),
        ),
        c(
            "session requests: id with a tab",
            "GET",
            "/v1/sessions/a%09b/requests".into(),
            auth(&admin),
            b"",
            400,
            Some("invalid_id"),
        ),
        c(
            "session tasks: id of 257 bytes",
            "GET",
            format!("/v1/sessions/{long}/tasks"),
            auth(&admin),
            b"",
            400,
            Some("invalid_id"),
        ),
        c(
            "session record: id with NUL",
            "GET",
            "/v1/sessions/a%00b".into(),
            auth(&admin),
            b"",
            400,
            Some("invalid_id"),
        ),
        c(
            "session end: id of 257 bytes",
            "POST",
            format!("/v1/sessions/{long}/end"),
            auth(&admin),
            b"",
            400,
            Some("invalid_id"),
        ),
        c(
            "events: one session of 257 bytes among good ones",
            "GET",
            format!("/v1/events?session=s-bad&session={long}"),
            auth(&admin),
            b"",
            400,
            Some("invalid_id"),
        ),
        c(
            "runs: session filter of 257 bytes",
            "GET",
            format!("/v1/runs?session={long}"),
            auth(&admin),
            b"",
            400,
            Some("invalid_id"),
        ),
        c(
            "requests: session filter with a newline",
            "GET",
            "/v1/requests?session=a%0Ab".into(),
            auth(&admin),
            b"",
            400,
            Some("invalid_id"),
        ),
        c(
            "key: name of 257 bytes",
            "POST",
            "/v1/keys".into(),
            json_auth(&admin),
            format!(r#"{{"name":"{long}","scope":"read"}}"#).as_bytes(),
            400,
            Some("invalid_id"),
        ),
        c(
            "key: name with an escape character",
            "POST",
            "/v1/keys".into(),
            json_auth(&admin),
            br#"{"name":"ci\u001b[31m","scope":"read"}"#,
            400,
            Some("invalid_id"),
        ),
        c(
            "key: empty name",
            "POST",
            "/v1/keys".into(),
            json_auth(&admin),
            br#"{"name":"","scope":"read"}"#,
            400,
            Some("invalid_id"),
        ),
        // Keys.
        c(
            "key: unknown scope",
            "POST",
            "/v1/keys".into(),
            json_auth(&admin),
            br#"{"name":"x","scope":"root"}"#,
            400,
            Some("malformed"),
        ),
        c(
            "key: no name",
            "POST",
            "/v1/keys".into(),
            json_auth(&admin),
            br#"{"scope":"read"}"#,
            400,
            Some("malformed"),
        ),
        c(
            "key: body an array",
            "POST",
            "/v1/keys".into(),
            json_auth(&admin),
            br#"["x","read"]"#,
            400,
            Some("malformed"),
        ),
        c(
            "key: revoke unknown",
            "POST",
            "/v1/keys/000000000000/revoke".into(),
            json_auth(&admin),
            b"",
            404,
            Some("not_found"),
        ),
        c(
            "sign-in: wrong key",
            "POST",
            "/v1/auth/session".into(),
            vec![("Content-Type", "application/json".into())],
            br#"{"key":"eve_000000000000_nope"}"#,
            401,
            Some("unauthorized"),
        ),
        c(
            "sign-in: not an object",
            "POST",
            "/v1/auth/session".into(),
            vec![("Content-Type", "application/json".into())],
            br#"["eve_x"]"#,
            400,
            Some("malformed"),
        ),
        // Paths and methods.
        c(
            "unknown path",
            "GET",
            "/v2/runs".into(),
            auth(&admin),
            b"",
            404,
            Some("not_found"),
        ),
        c(
            "bad percent-encoding",
            "GET",
            "/v1/runs/%ff%fe".into(),
            auth(&admin),
            b"",
            400,
            None,
        ),
        c(
            "DELETE a run",
            "DELETE",
            format!("/v1/runs/{run}"),
            auth(&admin),
            b"",
            405,
            Some("method_not_allowed"),
        ),
        c(
            "PUT the runs",
            "PUT",
            "/v1/runs".into(),
            json_auth(&admin),
            b"{}",
            405,
            Some("method_not_allowed"),
        ),
    ];
    assert!(cases.len() >= 60, "{} cases", cases.len());
    let mut failures = Vec::new();
    for case in cases.drain(..) {
        let (status, body) = raw(addr, case.method, &case.target, &case.headers, &case.body).await;
        let parsed: Option<Value> = serde_json::from_str(&body).ok();
        let code = parsed
            .as_ref()
            .and_then(|v| v["code"].as_str().map(str::to_owned));
        let has_message = parsed
            .as_ref()
            .is_some_and(|v| v["message"].as_str().is_some_and(|m| !m.is_empty()));
        let code_ok = case.code.is_none_or(|c| code.as_deref() == Some(c));
        if status != case.status || !code_ok || !has_message {
            failures.push(format!(
                "{}: {} {} → {status} {body:.200} (expected {} {:?})",
                case.what, case.method, case.target, case.status, case.code
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} bad answers:\n{}",
        failures.len(),
        failures.join("\n")
    );

    // Nothing changed.
    assert_eq!(journal(&store, &run).await, before_journal);
    assert_eq!(
        store.list_runs(&RunQuery::default()).await.unwrap().len(),
        before_runs,
        "no run started"
    );
    assert_eq!(store.list_keys().await.unwrap(), before_keys);
    let pending = store
        .pending_requests(&SessionId::new("s-bad"))
        .await
        .unwrap();
    assert_eq!(pending.len(), 1, "the request is still pending");
    assert_eq!(
        store
            .get_session(&SessionId::new("s-bad"))
            .await
            .unwrap()
            .ended_at,
        None,
        "no session ended"
    );
    // And the server still serves.
    let (status, body) = raw(addr, "GET", "/v1/runs", &auth(&admin), b"").await;
    assert_eq!(status, 200, "{body}");
    worker.shutdown().await;
}
