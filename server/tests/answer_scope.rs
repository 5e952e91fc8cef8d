//! Who may answer: keys limited to sessions, and answer links (one request, single use,
//! expiring, recorded as the answerer). Neither widens what a key's scope allows.

mod common;

use common::*;
use eve_core::engine::{Clock, ManualClock};
use eve_core::{Event, JournalStore, KeyScope, RequestId, RunId, SessionId, Timestamp};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// The first pending request of `session`, waited for (the worker publishes it).
async fn pending(store: &Arc<dyn JournalStore>, session: &str) -> RequestId {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let p = store
            .pending_requests(&SessionId::new(session))
            .await
            .expect("pending requests");
        if let Some(p) = p.into_iter().next() {
            return p.request_id;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no request in {session}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn send(
    method: reqwest::Method,
    url: String,
    key: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new().request(method, url);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.expect("send");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn get(server: &TestServer, path: &str, key: Option<&str>) -> (u16, Value) {
    send(reqwest::Method::GET, server.url(path), key, None).await
}

async fn post(server: &TestServer, path: &str, key: Option<&str>, body: Value) -> (u16, Value) {
    send(reqwest::Method::POST, server.url(path), key, Some(body)).await
}

/// Who answered the run's requests, in journal order.
async fn answers(store: &Arc<dyn JournalStore>, run: &RunId) -> Vec<Option<String>> {
    journal(store, run)
        .await
        .into_iter()
        .filter_map(|e| match e.event {
            Event::InputAnswered { response, .. } => Some(response.answered_by),
            _ => None,
        })
        .collect()
}

fn run_of(request: &RequestId) -> RunId {
    RunId::new(request.as_str().rsplit_once(':').unwrap().0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_limited_key_acts_only_in_its_sessions() {
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let server = TestServer::start_with(
        store.clone(),
        |c| c.insecure_no_auth = false,
        |s| s.with_registry(registry()),
    )
    .await;
    let now = Timestamp::now();
    let mine = vec![SessionId::new("s-mine")];
    let answerer = eve_server::create_key_limited(
        &*store,
        "alice",
        KeyScope::Answer,
        Some(mine.clone()),
        None,
        now,
    )
    .await
    .unwrap();
    let operator = eve_server::create_key_limited(
        &*store,
        "ops",
        KeyScope::Operate,
        Some(mine.clone()),
        None,
        now,
    )
    .await
    .unwrap();
    let admin =
        eve_server::create_key_limited(&*store, "root", KeyScope::Admin, Some(mine), None, now)
            .await
            .unwrap();
    let a = &answerer.text;
    let o = &operator.text;

    start(
        &store,
        "s-mine",
        "c1",
        "deploy",
        json!({ "service": "alpha" }),
    )
    .await;
    start(
        &store,
        "s-other",
        "c2",
        "deploy",
        json!({ "service": "beta" }),
    )
    .await;
    let my_request = pending(&store, "s-mine").await;
    let other_request = pending(&store, "s-other").await;
    let (my_run, other_run) = (run_of(&my_request), run_of(&other_request));
    let other_before = journal(&store, &other_run).await;

    // Reads: listings show only its sessions'; naming another session or its run is 403.
    let (status, body) = get(&server, "/v1/requests", Some(a)).await;
    assert_eq!(status, 200, "{body}");
    let ids: Vec<&str> = body["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["requestId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![my_request.as_str()], "{body}");
    let (status, body) = get(&server, "/v1/runs", Some(a)).await;
    assert_eq!(status, 200, "{body}");
    let runs: Vec<&str> = body["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["runId"].as_str().unwrap())
        .collect();
    assert_eq!(runs, vec![my_run.as_str()], "{body}");
    assert_eq!(body["counts"]["running"], 1, "{body}");
    for path in [
        "/v1/runs?session=s-other".to_owned(),
        "/v1/requests?session=s-other".to_owned(),
        format!("/v1/runs/{other_run}"),
        "/v1/sessions/s-other/requests".to_owned(),
        "/v1/sessions/s-other".to_owned(),
        "/v1/sessions/s-other/events".to_owned(),
        "/v1/events?session=s-mine&session=s-other".to_owned(),
        "/v1/agents?session=s-other".to_owned(),
    ] {
        let (status, body) = get(&server, &path, Some(a)).await;
        assert_eq!(
            (status, &body["code"]),
            (403, &json!("forbidden")),
            "{path}: {body}"
        );
    }
    assert_eq!(
        get(&server, &format!("/v1/runs/{my_run}"), Some(a)).await.0,
        200
    );
    assert_eq!(
        get(&server, "/v1/sessions/s-mine/requests", Some(a))
            .await
            .0,
        200
    );
    let (status, who) = get(&server, "/v1/auth/session", Some(a)).await;
    assert_eq!(
        (status, &who["sessions"]),
        (200, &json!(["s-mine"])),
        "{who}"
    );

    // Answering another session's request: 403, and its journal is unchanged.
    let (status, body) = post(
        &server,
        &format!("/v1/requests/{other_request}/answer"),
        Some(a),
        json!({ "optionId": "cancel" }),
    )
    .await;
    assert_eq!(
        (status, &body["code"]),
        (403, &json!("forbidden")),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("s-mine"),
        "{body}"
    );
    // An operate key limited the same way cannot cancel, end, message or call there either.
    for (path, body) in [
        (format!("/v1/runs/{other_run}/cancel"), json!({})),
        (format!("/v1/tasks/{other_run}/cancel"), json!({})),
        ("/v1/sessions/s-other/end".to_owned(), json!({})),
        (
            "/v1/sessions/s-other/messages".to_owned(),
            json!({ "message": "hi", "policy": "queue" }),
        ),
        (
            "/v1/tools/deploy/calls".to_owned(),
            json!({ "session": "s-other", "callId": "c3", "input": { "service": "gamma" } }),
        ),
        (format!("/v1/requests/{other_request}/links"), json!({})),
    ] {
        let (status, answer) = post(&server, &path, Some(o), body).await;
        assert_eq!(
            (status, &answer["code"]),
            (403, &json!("forbidden")),
            "{path}: {answer}"
        );
    }
    assert_eq!(
        journal(&store, &other_run).await,
        other_before,
        "nothing written"
    );
    assert!(store
        .get_session(&SessionId::new("s-other"))
        .await
        .unwrap()
        .ended_at
        .is_none());
    assert_eq!(
        store
            .list_runs(&eve_core::RunQuery {
                session: Some(SessionId::new("s-other")),
                ..Default::default()
            })
            .await
            .unwrap()
            .len(),
        1,
        "no call started in s-other"
    );

    // The limit never widens the scope: a limited answer key still cannot cancel its own run,
    // and a limited admin key cannot touch keys (a route that names no session).
    let (status, _) = post(
        &server,
        &format!("/v1/runs/{my_run}/cancel"),
        Some(a),
        json!({}),
    )
    .await;
    assert_eq!(status, 403);
    let (status, body) = get(&server, "/v1/keys", Some(&admin.text)).await;
    assert_eq!(
        (status, &body["code"]),
        (403, &json!("forbidden")),
        "{body}"
    );
    let (status, body) = post(
        &server,
        "/v1/keys",
        Some(&admin.text),
        json!({ "name": "wider", "scope": "admin" }),
    )
    .await;
    assert_eq!(status, 403, "{body}");

    // In its session it answers, and the journal names it.
    let (status, body) = post(
        &server,
        &format!("/v1/requests/{my_request}/answer"),
        Some(a),
        json!({ "optionId": "cancel" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        answers(&store, &my_run).await,
        vec![Some("alice".to_owned())]
    );
    assert_eq!(
        answers(&store, &other_run).await,
        Vec::<Option<String>>::new()
    );

    // A limited operate key starts calls in its session.
    let (status, body) = post(
        &server,
        "/v1/tools/deploy/calls",
        Some(o),
        json!({ "session": "s-mine", "callId": "c4", "input": { "service": "delta" } }),
    )
    .await;
    assert_eq!(status, 201, "{body}");

    // POST /v1/keys takes `sessions`; an empty list is refused.
    let unlimited = eve_server::create_key(&*store, "root2", KeyScope::Admin, now)
        .await
        .unwrap();
    let (status, body) = post(
        &server,
        "/v1/keys",
        Some(&unlimited.text),
        json!({ "name": "bob", "scope": "answer", "sessions": ["s-x", "s-y"] }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["record"]["sessions"], json!(["s-x", "s-y"]), "{body}");
    let (status, _) = post(
        &server,
        "/v1/keys",
        Some(&unlimited.text),
        json!({ "name": "bob", "scope": "answer", "sessions": [] }),
    )
    .await;
    assert_eq!(status, 400);

    server.stop().await;
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_link_answers_its_one_request_once_until_it_expires() {
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let clock = ManualClock::new(Timestamp::now());
    let server_clock: Arc<dyn Clock> = clock.clone();
    let with_clock = move |mut s: eve_server::AppState| {
        s.clock = server_clock.clone();
        s
    };
    let server = TestServer::start_with(
        store.clone(),
        |c| c.insecure_no_auth = false,
        with_clock.clone(),
    )
    .await;
    let operator = eve_server::create_key(&*store, "ops", KeyScope::Operate, clock.now())
        .await
        .unwrap();
    let o = &operator.text;
    start(&store, "s-1", "c1", "deploy", json!({ "service": "alpha" })).await;
    start(&store, "s-2", "c2", "deploy", json!({ "service": "beta" })).await;
    let request = pending(&store, "s-1").await;
    let other = pending(&store, "s-2").await;
    let run = run_of(&request);

    // Mint over HTTP (operate); a link for an unknown request is 404, for no key 401.
    let (status, minted) = post(
        &server,
        &format!("/v1/requests/{request}/links"),
        Some(o),
        json!({ "expiresIn": "1h" }),
    )
    .await;
    assert_eq!(status, 201, "{minted}");
    assert_eq!(minted["requestId"], json!(request.as_str()));
    let url = minted["url"].as_str().unwrap().to_owned();
    assert!(url.starts_with(&server.url("/answer/evl_")), "{url}");
    let token = url.rsplit('/').next().unwrap().to_owned();
    assert_eq!(
        minted["expiresAt"].as_i64().unwrap(),
        clock.now().plus(Duration::from_secs(3600)).0
    );
    let (status, _) = post(&server, "/v1/requests/nope:1/links", Some(o), json!({})).await;
    assert_eq!(status, 404);
    let (status, _) = post(
        &server,
        &format!("/v1/requests/{request}/links"),
        None,
        json!({}),
    )
    .await;
    assert_eq!(status, 401);

    // The page shows that one request and its options, with no key.
    let page = reqwest::get(&url).await.unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(html.contains("Deploy alpha?"), "{html}");
    assert!(
        html.contains("data-option=\"approve\"") && html.contains(">Deploy<"),
        "{html}"
    );
    assert!(html.contains(">Cancel<"), "{html}");
    assert!(
        !html.contains("beta") && !html.contains(other.as_str()),
        "{html}"
    );
    let (status, view) = get(&server, &format!("/v1/links/{token}"), None).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(
        view["request"]["requestId"],
        json!(request.as_str()),
        "{view}"
    );
    assert_eq!(view["tool"], "deploy");

    // The link is no key: it opens no API route.
    for path in ["/v1/runs", "/v1/requests"] {
        assert_eq!(get(&server, path, Some(&token)).await.0, 401, "{path}");
    }
    let (status, _) = post(
        &server,
        &format!("/v1/requests/{other}/answer"),
        Some(&token),
        json!({ "optionId": "approve" }),
    )
    .await;
    assert_eq!(status, 401);

    // Forged links (a made-up token; this one with another secret) open nothing.
    let forged_secret = format!("{}{}", &token[..token.len() - 64], "0".repeat(64));
    let made_up = format!("evl_0123456789ab_{}", "a".repeat(64));
    for forged in [forged_secret.as_str(), made_up.as_str(), "evl_x"] {
        let (status, body) = post(
            &server,
            &format!("/v1/links/{forged}/answer"),
            None,
            json!({ "optionId": "approve" }),
        )
        .await;
        assert_eq!(status, 404, "{forged}: {body}");
        assert_eq!(
            reqwest::get(server.url(&format!("/answer/{forged}")))
                .await
                .unwrap()
                .status(),
            404
        );
    }
    assert!(
        answers(&store, &run).await.is_empty(),
        "a forged link wrote nothing"
    );

    // A wrong answer is refused and leaves the link usable; then it answers, named as the link.
    let (status, _) = post(
        &server,
        &format!("/v1/links/{token}/answer"),
        None,
        json!({ "optionId": "maybe" }),
    )
    .await;
    assert_eq!(status, 422);
    let (status, body) = post(
        &server,
        &format!("/v1/links/{token}/answer"),
        None,
        json!({ "optionId": "approve" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let link_name = format!("link:{}", minted["linkId"].as_str().unwrap());
    assert_eq!(answers(&store, &run).await, vec![Some(link_name.clone())]);
    let after = journal(&store, &run).await.len();

    // A replay (same answer or another) is 410 and changes nothing; the page says it is used.
    for option in ["approve", "cancel"] {
        let (status, body) = post(
            &server,
            &format!("/v1/links/{token}/answer"),
            None,
            json!({ "optionId": option }),
        )
        .await;
        assert_eq!(
            (status, &body["code"]),
            (410, &json!("link_used")),
            "{body}"
        );
    }
    assert_eq!(reqwest::get(&url).await.unwrap().status(), 410);
    let answered: Vec<_> = answers(&store, &run).await;
    assert_eq!(answered, vec![Some(link_name)], "one answer");
    assert!(journal(&store, &run).await.len() >= after);

    // Minted in process (eve_server::create_answer_link), the link works on a server started
    // later on the same store; past its expiry (the server's clock) it opens nothing.
    let other_run = run_of(&other);
    let link = eve_server::create_answer_link(
        &*store,
        &server.base,
        &other,
        Duration::from_secs(600),
        clock.now(),
    )
    .await
    .expect("mint");
    assert_eq!(link.record.request.as_ref(), Some(&other));
    server.stop().await;
    let server =
        TestServer::start_with(store.clone(), |c| c.insecure_no_auth = false, with_clock).await;
    let (status, view) = get(&server, &format!("/v1/links/{}", link.token), None).await;
    assert_eq!(status, 200, "{view}");
    clock.advance(Duration::from_secs(601));
    let (status, body) = post(
        &server,
        &format!("/v1/links/{}/answer", link.token),
        None,
        json!({ "optionId": "approve" }),
    )
    .await;
    assert_eq!(
        (status, &body["code"]),
        (410, &json!("link_expired")),
        "{body}"
    );
    assert_eq!(
        get(&server, &format!("/v1/links/{}", link.token), None)
            .await
            .0,
        410
    );
    assert!(
        answers(&store, &other_run).await.is_empty(),
        "an expired link wrote nothing"
    );

    // Links are for people: a bad expiry is refused.
    let (status, _) = post(
        &server,
        &format!("/v1/requests/{other}/links"),
        Some(o),
        json!({ "expiresIn": "90d" }),
    )
    .await;
    assert_eq!(status, 400);

    server.stop().await;
    worker.shutdown().await;
}
