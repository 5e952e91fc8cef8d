//! The session channel over HTTP on SQLite with a real worker: SSE resumed with Last-Event-ID
//! across a server restart, racing answers, the typed answer errors, the task index and task
//! cancellation, and the runs API.

mod common;

use common::*;
use serde_json::{json, Value};

async fn answer(server: &TestServer, request: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(server.url(&format!("/v1/requests/{request}/answer")))
        .json(&body)
        .send()
        .await
        .expect("answer reaches the server");
    (
        resp.status().as_u16(),
        resp.json().await.expect("JSON body"),
    )
}

async fn get(server: &TestServer, path: &str) -> (u16, Value) {
    let resp = reqwest::get(server.url(path)).await.expect("GET");
    (
        resp.status().as_u16(),
        resp.json().await.expect("JSON body"),
    )
}

async fn post(server: &TestServer, path: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(server.url(path))
        .send()
        .await
        .expect("POST");
    (
        resp.status().as_u16(),
        resp.json().await.expect("JSON body"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_resumes_after_a_restart_and_racing_answers_get_one_200() {
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let first = TestServer::start(store.clone(), |_| {}).await;
    let mut events = SseClient::connect(&first.url("/v1/sessions/s-deploy/events"), None).await;
    let run = start(
        &store,
        "s-deploy",
        "call-1",
        "deploy",
        json!({ "service": "api" }),
    )
    .await;

    let asked = events.until("input.requested").await.pop().unwrap();
    let last_id = asked.id.expect("events carry the session seq as id");
    let entry = asked.json();
    assert_eq!(entry["seq"], last_id);
    assert_eq!(entry["runId"], run.as_str());
    let request = &entry["event"]["data"]["request"];
    assert_eq!(request["display"], "confirmation");
    assert_eq!(request["options"][0]["style"], "primary");
    assert_eq!(request["options"][1]["style"], "danger");
    let request_id = entry["event"]["data"]["requestId"]
        .as_str()
        .unwrap()
        .to_owned();

    let (status, pending) = get(&first, "/v1/sessions/s-deploy/requests").await;
    assert_eq!(status, 200);
    assert_eq!(pending["requests"][0]["requestId"], request_id.as_str());
    assert!(pending["requests"][0]["request"]["prompt"]
        .as_str()
        .unwrap()
        .starts_with("Deploy api?"));

    // The server goes away: the stream ends (the client would reconnect).
    first.stop().await;
    assert!(events.next().await.is_none(), "the stream ends at shutdown");

    // A new server on the same store. Two people answer at once: exactly one wins.
    let second = TestServer::start(store.clone(), |_| {}).await;
    let (a, b) = tokio::join!(
        answer(&second, &request_id, json!({ "optionId": "approve" })),
        answer(&second, &request_id, json!({ "optionId": "cancel" })),
    );
    let mut outcomes = [(a.0, a.1.clone(), "approve"), (b.0, b.1.clone(), "cancel")];
    outcomes.sort_by_key(|o| o.0);
    assert_eq!(outcomes[0].0, 200, "{outcomes:?}");
    assert_eq!(outcomes[1].0, 409, "{outcomes:?}");
    assert_eq!(outcomes[1].1["code"], "already_answered");
    assert!(outcomes[1].1["message"]
        .as_str()
        .unwrap()
        .contains("already answered"));
    let winner = outcomes[0].2;
    assert_eq!(outcomes[0].1["duplicate"], false);
    // Retrying the accepted answer is a duplicate success; the other one stays refused.
    let (status, again) = answer(&second, &request_id, json!({ "optionId": winner })).await;
    assert_eq!((status, &again["duplicate"]), (200, &json!(true)));

    // Resume from the last id seen on the first server: nothing missed, nothing twice.
    let mut resumed =
        SseClient::connect(&second.url("/v1/sessions/s-deploy/events"), Some(last_id)).await;
    let frames = resumed.until("tool.settled").await;
    assert_eq!(frames[0].id, Some(last_id + 1), "{frames:?}");
    assert_eq!(frames[0].event.as_deref(), Some("input.answered"));
    let ids: Vec<u64> = frames.iter().map(|f| f.id.unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");
    let output = &frames.last().unwrap().json()["event"]["data"]["result"]["data"]["output"];
    assert_eq!(output["deployed"], winner == "approve", "{output}");

    // From scratch (no Last-Event-ID) the whole log is replayed, from seq 0.
    let mut replay = SseClient::connect(&second.url("/v1/sessions/s-deploy/events"), None).await;
    let all = replay.until("tool.settled").await;
    assert_eq!(all[0].id, Some(0));
    assert_eq!(all.len() as u64, ids.last().unwrap() + 1);
    // `?from=` starts elsewhere; a Last-Event-ID that is not a seq is a 400.
    let mut from = SseClient::connect(
        &second.url(&format!(
            "/v1/sessions/s-deploy/events?from={}",
            last_id + 1
        )),
        None,
    )
    .await;
    assert_eq!(from.next().await.unwrap().id, Some(last_id + 1));
    let bad = reqwest::Client::new()
        .get(second.url("/v1/sessions/s-deploy/events"))
        .header("last-event-id", "yesterday")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);

    let (_, pending) = get(&second, "/v1/sessions/s-deploy/requests").await;
    assert_eq!(pending, json!({ "requests": [] }));
    worker.shutdown().await;
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_tasks_and_runs_over_http() {
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let server = TestServer::start(store.clone(), |_| {}).await;
    let mut events = SseClient::connect(&server.url("/v1/sessions/s2/events"), None).await;
    let deploy = start(
        &store,
        "s2",
        "call-1",
        "deploy",
        json!({ "service": "web" }),
    )
    .await;
    let refund = start(
        &store,
        "s2",
        "call-2",
        "refund_order",
        json!({ "order_id": "o-7" }),
    )
    .await;

    let mut asked = Vec::new();
    while asked.len() < 2 {
        asked.push(events.until("input.requested").await.pop().unwrap().json());
    }
    let request_of = |run: &eve_core::RunId| {
        asked
            .iter()
            .find(|e| e["runId"] == run.as_str())
            .map(|e| e["event"]["data"]["requestId"].as_str().unwrap().to_owned())
            .unwrap()
    };
    let (deploy_req, refund_req) = (request_of(&deploy), request_of(&refund));
    let (_, pending) = get(&server, "/v1/sessions/s2/requests").await;
    assert_eq!(pending["requests"].as_array().unwrap().len(), 2);

    // Answers the request does not accept, bodies that are not answers, unknown requests.
    let (s, e) = answer(&server, &deploy_req, json!({ "optionId": "nope" })).await;
    assert_eq!((s, e["code"].as_str()), (422, Some("invalid_answer")));
    assert!(e["message"].as_str().unwrap().contains("approve"), "{e}");
    let (s, e) = answer(&server, &deploy_req, json!({ "text": "sure" })).await;
    assert_eq!((s, e["code"].as_str()), (422, Some("invalid_answer")));
    let (s, e) = answer(&server, &deploy_req, json!({ "option": "approve" })).await;
    assert_eq!((s, e["code"].as_str()), (400, Some("malformed")));
    // An array is not an answer (serde alone would read it as the struct's fields in order).
    for not_an_object in [
        json!(["approve"]),
        json!(["approve", null]),
        json!("approve"),
        json!(null),
    ] {
        let (s, e) = answer(&server, &deploy_req, not_an_object.clone()).await;
        assert_eq!(
            (s, e["code"].as_str()),
            (400, Some("malformed")),
            "{not_an_object}"
        );
    }
    let resp = reqwest::Client::new()
        .post(server.url(&format!("/v1/requests/{deploy_req}/answer")))
        .body("{\"optionId\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    // Another web site cannot answer through the person's browser.
    let resp = reqwest::Client::new()
        .post(server.url(&format!("/v1/requests/{deploy_req}/answer")))
        .header("origin", "http://evil.example")
        .json(&json!({ "optionId": "approve" }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let resp = reqwest::Client::new()
        .post(server.url(&format!("/v1/tasks/{refund}/cancel")))
        .header("origin", "null")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let (s, e) = answer(&server, "run_nope:3", json!({ "optionId": "approve" })).await;
    assert_eq!((s, e["code"].as_str()), (404, Some("not_found")));

    // The task index holds the background run only.
    let (_, tasks) = get(&server, "/v1/sessions/s2/tasks").await;
    let tasks = tasks["tasks"].as_array().unwrap().clone();
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    assert_eq!(tasks[0]["taskId"], refund.as_str());
    assert_eq!(tasks[0]["tool"], "refund_order");
    assert_eq!(tasks[0]["status"], "running");
    assert_eq!(tasks[0]["cancelRequested"], false);

    // Cancel: not for a default-execution call, not for an unknown id; once for the task.
    let (s, e) = post(&server, &format!("/v1/tasks/{deploy}/cancel")).await;
    assert_eq!((s, e["code"].as_str()), (409, Some("not_a_task")));
    let (s, _) = post(&server, "/v1/tasks/run_nope/cancel").await;
    assert_eq!(s, 404);
    let (s, c) = post(&server, &format!("/v1/tasks/{refund}/cancel")).await;
    assert_eq!((s, c["outcome"].as_str()), (202, Some("requested")));
    let frames = events.until("task.cancelled").await;
    assert!(
        frames
            .iter()
            .any(|f| f.event.as_deref() == Some("input.withdrawn")
                && f.json()["event"]["data"]["requestId"] == refund_req.as_str()),
        "{frames:?}"
    );
    let (s, c) = post(&server, &format!("/v1/tasks/{refund}/cancel")).await;
    assert_eq!((s, c["outcome"].as_str()), (200, Some("already_ended")));
    assert_eq!(c["status"], "cancelled");
    // Its request was withdrawn with it.
    let (s, e) = answer(&server, &refund_req, json!({ "optionId": "approve" })).await;
    assert_eq!((s, e["code"].as_str()), (410, Some("withdrawn")));
    let (_, tasks) = get(&server, "/v1/sessions/s2/tasks").await;
    assert_eq!(tasks["tasks"][0]["status"], "cancelled");
    assert_eq!(tasks["tasks"][0]["cancelRequested"], true);

    // The deploy call still waits; cancel it by its answer.
    let (s, _) = answer(&server, &deploy_req, json!({ "optionId": "cancel" })).await;
    assert_eq!(s, 200);
    let settled = events.until("tool.settled").await.pop().unwrap().json();
    assert_eq!(
        settled["event"]["data"]["result"]["data"]["output"],
        json!({ "deployed": false, "reason": "rejected" })
    );

    // The runs API.
    let (_, runs) = get(&server, "/v1/runs?session=s2").await;
    // Oldest first, ties (two starts in one millisecond) by run id.
    let listed: Vec<(i64, &str)> = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["createdAt"].as_i64().unwrap(),
                r["runId"].as_str().unwrap(),
            )
        })
        .collect();
    let mut in_order = listed.clone();
    in_order.sort();
    assert_eq!(listed, in_order, "runs list by creation time, then id");
    let mut ids: Vec<&str> = listed.iter().map(|(_, id)| *id).collect();
    ids.sort();
    let mut started = vec![deploy.as_str(), refund.as_str()];
    started.sort();
    assert_eq!(ids, started);
    let (_, runs) = get(&server, "/v1/runs?session=s2&status=cancelled").await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 1);
    assert_eq!(runs["runs"][0]["runId"], refund.as_str());
    let (_, runs) = get(&server, "/v1/runs?status=completed&limit=1").await;
    assert_eq!(runs["runs"][0]["runId"], deploy.as_str());
    let (s, e) = get(&server, "/v1/runs?status=sleeping").await;
    assert_eq!((s, e["code"].as_str()), (400, Some("malformed")));
    let (s, e) = get(&server, "/v1/runs?limit=many").await;
    assert_eq!((s, e["code"].as_str()), (400, Some("malformed")));
    let (s, one) = get(&server, &format!("/v1/runs/{deploy}")).await;
    assert_eq!(s, 200);
    assert_eq!(one["run"]["status"], "completed");
    let kinds: Vec<String> = one["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            e["event"]
                .as_object()
                .unwrap()
                .keys()
                .next()
                .unwrap()
                .clone()
        })
        .collect();
    assert_eq!(kinds.first().map(String::as_str), Some("RunStarted"));
    assert!(kinds.iter().any(|k| k == "InputAnswered"), "{kinds:?}");
    assert_eq!(kinds.last().map(String::as_str), Some("RunCompleted"));
    let (s, e) = get(&server, "/v1/runs/run_nope").await;
    assert_eq!((s, e["code"].as_str()), (404, Some("not_found")));
    let (s, e) = get(&server, "/v1/nothing/here").await;
    assert_eq!((s, e["code"].as_str()), (404, Some("not_found")));

    worker.shutdown().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_stream_resends_only_the_latest_progress_snapshot() {
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let server = TestServer::start(store.clone(), |_| {}).await;
    let mut live = SseClient::connect(&server.url("/v1/sessions/s-report/events"), None).await;
    let run = start(
        &store,
        "s-report",
        "call-1",
        "report",
        json!({ "steps": 3 }),
    )
    .await;
    let frames = live.until("input.requested").await;
    let request_id = frames.last().unwrap().json()["event"]["data"]["requestId"]
        .as_str()
        .unwrap()
        .to_owned();

    // A client that reconnects from the start gets the backlog with one action.partial: the
    // latest snapshot of the call (snapshots are last-write-wins per call).
    let mut resumed = SseClient::connect(&server.url("/v1/sessions/s-report/events"), None).await;
    let backlog = resumed.until("input.requested").await;
    let partials: Vec<Value> = backlog
        .iter()
        .filter(|f| f.event.as_deref() == Some("action.partial"))
        .map(|f| f.json()["event"]["data"]["value"].clone())
        .collect();
    assert_eq!(partials, vec![json!({ "done": 3, "of": 3 })], "{backlog:?}");
    assert_eq!(backlog.last().unwrap().json()["runId"], run.as_str());

    // Free text answers a text request; the settled result arrives on both streams.
    let (status, _) = answer(&server, &request_id, json!({ "text": "ship it" })).await;
    assert_eq!(status, 200);
    for stream in [&mut live, &mut resumed] {
        let settled = stream.until("tool.settled").await.pop().unwrap().json();
        assert_eq!(
            settled["event"]["data"]["result"]["data"]["output"],
            json!({ "note": "ship it" })
        );
    }
    worker.shutdown().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_does_not_poll_and_wakes_at_once_on_this_servers_writes() {
    // An idle stream on a bare router() (no shutdown signal) does not read the store in a
    // loop: the store notifies it when the log grows, so it reads about once per fallback
    // poll (2 s), not per poll interval.
    let counted =
        eve_core::testing::FaultyStore::new(std::sync::Arc::new(eve_core::MemoryStore::new()));
    let state = eve_server::AppState::new(
        counted.clone(),
        std::sync::Arc::new(eve_core::engine::SystemClock),
    )
    .with_config(eve_server::ServerConfig {
        poll_interval: std::time::Duration::from_millis(50),
        insecure_no_auth: true,
        ..eve_server::ServerConfig::default()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, eve_server::router(state)).await });
    let resp = reqwest::get(format!("http://{addr}/v1/sessions/idle/events"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    counted.set_fault(eve_core::testing::Fault::None);
    // Measuring a rate needs a stretch of wall time.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let reads = counted.calls();
    assert!(
        reads <= 1,
        "{reads} store calls in 500 ms by an idle stream on a store that notifies"
    );
    drop(resp);

    // A stream whose poll interval is an hour still sees an answer given through its own
    // server at once: the server's writes wake its streams.
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let quick = TestServer::start(store.clone(), |_| {}).await;
    let mut events = SseClient::connect(&quick.url("/v1/sessions/s-wake/events"), None).await;
    start(
        &store,
        "s-wake",
        "call-1",
        "deploy",
        json!({ "service": "db" }),
    )
    .await;
    let asked = events.until("input.requested").await.pop().unwrap();
    let request_id = asked.json()["event"]["data"]["requestId"]
        .as_str()
        .unwrap()
        .to_owned();
    let slow = TestServer::start(store.clone(), |c| {
        c.poll_interval = std::time::Duration::from_secs(3600)
    })
    .await;
    let mut sleepy = SseClient::connect(&slow.url("/v1/sessions/s-wake/events"), asked.id).await;
    let (status, _) = answer(&slow, &request_id, json!({ "optionId": "approve" })).await;
    assert_eq!(status, 200);
    let next = sleepy.next().await.expect("woken by the answer");
    assert_eq!(next.event.as_deref(), Some("input.answered"));
    assert_eq!(next.id, asked.id.map(|i| i + 1));

    worker.shutdown().await;
    quick.stop().await;
    slow.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stream_follows_many_sessions_and_resumes_each_from_its_cursor() {
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let server = TestServer::start(store.clone(), |_| {}).await;
    let sessions: Vec<String> = (1..=8).map(|i| format!("s-many-{i}")).collect();
    let query: String = sessions
        .iter()
        .map(|s| format!("session={s}"))
        .collect::<Vec<_>>()
        .join("&");
    let url = server.url(&format!("/v1/events?{query}"));
    let mut events = SseClient::connect(&url, None).await;
    for s in &sessions {
        start(&store, s, "call-1", "deploy", json!({ "service": s })).await;
    }
    // All eight asks arrive on the one connection, each tagged with its session.
    let mut asked = std::collections::BTreeMap::new();
    let mut last = None;
    while asked.len() < sessions.len() {
        let f = events.until("input.requested").await.pop().unwrap();
        let entry = f.json();
        asked.insert(
            entry["sessionId"].as_str().unwrap().to_owned(),
            entry["event"]["data"]["requestId"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
        last = f.raw_id;
    }
    let cursor = last.expect("a cursor id");
    let positions: Value = serde_json::from_str(&cursor).expect("the cursor is JSON");
    assert_eq!(positions.as_object().unwrap().len(), 8, "{cursor}");
    drop(events);

    // Answer the 7th and 8th: a stream resumed from the cursor sends only what came after.
    for s in &sessions[6..] {
        let (status, _) = answer(&server, &asked[s], json!({ "optionId": "approve" })).await;
        assert_eq!(status, 200);
    }
    let mut resumed = SseClient::connect_cursor(&url, Some(&cursor), None).await;
    let mut settled = Vec::new();
    while settled.len() < 2 {
        let f = resumed.next().await.expect("the resumed stream goes on");
        assert_ne!(
            f.event.as_deref(),
            Some("input.requested"),
            "nothing before the cursor is sent again: {f:?}"
        );
        if f.event.as_deref() == Some("tool.settled") {
            settled.push(f.json()["sessionId"].as_str().unwrap().to_owned());
        }
    }
    settled.sort();
    assert_eq!(settled, sessions[6..]);

    // Bad input: no session, an unknown parameter, a cursor that is not one.
    for (path, what) in [
        ("/v1/events", "no session"),
        ("/v1/events?session=a&nope=1", "unknown parameter"),
        ("/v1/events?session=a&from=7", "numeric cursor"),
    ] {
        let (status, body) = get(&server, path).await;
        assert_eq!(status, 400, "{what}: {body}");
        assert_eq!(body["code"], "malformed", "{what}: {body}");
    }
    worker.shutdown().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_list_newest_first_filtered_paged_and_counted() {
    let (_dir, store) = sqlite().await;
    let server = TestServer::start(store.clone(), |_| {}).await;
    let mut runs = Vec::new();
    for i in 0..5 {
        let session = if i % 2 == 0 { "s-even" } else { "s-odd" };
        let tool = if i < 3 { "deploy" } else { "render_video" };
        let input = if tool == "deploy" {
            json!({ "service": format!("svc-{i}") })
        } else {
            json!({ "project_id": format!("p-{i}") })
        };
        runs.push(start(&store, session, &format!("call-{i}"), tool, input).await);
        // Distinct creation times.
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    let ids = |v: &Value| -> Vec<String> {
        v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["runId"].as_str().unwrap().to_owned())
            .collect()
    };
    let newest: Vec<String> = runs.iter().rev().map(|r| r.to_string()).collect();
    // Newest first, two per page, the cursor chaining the pages.
    let (status, p1) = get(&server, "/v1/runs?order=newest&limit=2").await;
    assert_eq!(status, 200, "{p1}");
    assert_eq!(ids(&p1), newest[..2]);
    assert_eq!(p1["counts"]["running"], 5);
    assert!(
        p1["runs"][0].get("outcome").is_none(),
        "a live run has no outcome: {p1}"
    );
    let next = p1["next"].as_str().unwrap();
    let (_, p2) = get(
        &server,
        &format!("/v1/runs?order=newest&limit=2&before={next}"),
    )
    .await;
    assert_eq!(ids(&p2), newest[2..4]);
    let next = p2["next"].as_str().unwrap();
    let (_, p3) = get(
        &server,
        &format!("/v1/runs?order=newest&limit=2&before={next}"),
    )
    .await;
    assert_eq!(ids(&p3), newest[4..]);
    assert!(p3["next"].is_null());
    // Filters: tool, session, a search by id, a status with none; the default stays oldest first.
    let (_, by_tool) = get(&server, "/v1/runs?tool=render_video").await;
    assert_eq!(ids(&by_tool), [runs[3].to_string(), runs[4].to_string()]);
    let (_, by_session) = get(&server, "/v1/runs?session=s-odd&order=newest").await;
    assert_eq!(ids(&by_session), [runs[3].to_string(), runs[1].to_string()]);
    let (_, found) = get(&server, &format!("/v1/runs?q={}", &runs[2].as_str()[4..])).await;
    assert_eq!(ids(&found), [runs[2].to_string()]);
    let (_, none) = get(&server, "/v1/runs?status=completed").await;
    assert!(ids(&none).is_empty());
    assert_eq!(
        none["counts"]["running"], 5,
        "counts ignore the status filter"
    );
    // Bad input.
    for path in [
        "/v1/runs?order=sideways",
        "/v1/runs?before=run_nope",
        "/v1/runs?status=asleep",
        "/v1/runs?color=red",
    ] {
        let (status, body) = get(&server, path).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("malformed")),
            "{path}: {body}"
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_requests_of_every_session_paged_newest_first_and_filtered() {
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let server = TestServer::start(store.clone(), |_| {}).await;
    let mut events = SseClient::connect(
        &server.url("/v1/events?session=s-a&session=s-b&session=s-c"),
        None,
    )
    .await;
    let calls = [
        ("s-a", "deploy", json!({ "service": "svc-0" })),
        ("s-b", "refund_order", json!({ "order_id": "o-1" })),
        ("s-a", "deploy", json!({ "service": "svc-2" })),
        ("s-c", "report", json!({ "steps": 1 })),
        ("s-b", "deploy", json!({ "service": "svc-4" })),
    ];
    let mut runs = Vec::new();
    for (i, (session, tool, input)) in calls.iter().enumerate() {
        runs.push(start(&store, session, &format!("call-{i}"), tool, input.clone()).await);
        // Distinct creation times.
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    let mut asked = 0;
    while asked < runs.len() {
        events.until("input.requested").await;
        asked += 1;
    }
    let run_ids = |v: &Value| -> Vec<String> {
        v["requests"]
            .as_array()
            .unwrap_or_else(|| panic!("no requests: {v}"))
            .iter()
            .map(|r| r["runId"].as_str().unwrap().to_owned())
            .collect()
    };
    let of = |idx: &[usize]| -> Vec<String> { idx.iter().map(|&i| runs[i].to_string()).collect() };

    let (status, all) = get(&server, "/v1/requests").await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(run_ids(&all), of(&[4, 3, 2, 1, 0]), "newest run first");
    assert!(all["next"].is_null());
    assert_eq!(all["tools"], json!(["deploy", "refund_order", "report"]));
    let first = &all["requests"][0];
    assert_eq!(first["tool"], "deploy");
    assert_eq!(first["sessionId"], "s-b");
    assert_eq!(first["requestId"], format!("{}:1", runs[4]));
    assert!(first["request"]["prompt"]
        .as_str()
        .unwrap()
        .starts_with("Deploy svc-4?"));

    // Pages chain through `next`, each request once, in both orders.
    for (order, expect) in [
        ("newest", of(&[4, 3, 2, 1, 0])),
        ("oldest", of(&[0, 1, 2, 3, 4])),
    ] {
        let mut seen = Vec::new();
        let mut before: Option<String> = None;
        loop {
            let mut path = format!("/v1/requests?order={order}&limit=2");
            if let Some(b) = &before {
                path.push_str(&format!("&before={b}"));
            }
            let (status, page) = get(&server, &path).await;
            assert_eq!(status, 200, "{path}: {page}");
            assert!(run_ids(&page).len() <= 2, "{page}");
            seen.extend(run_ids(&page));
            match page["next"].as_str() {
                Some(n) => before = Some(n.to_owned()),
                None => break,
            }
        }
        assert_eq!(seen, expect, "order={order}");
    }
    // Filters: a tool, a session, a search in the prompt (case-insensitive).
    let (_, deploys) = get(&server, "/v1/requests?tool=deploy").await;
    assert_eq!(run_ids(&deploys), of(&[4, 2, 0]));
    assert_eq!(deploys["tools"].as_array().unwrap().len(), 3, "{deploys}");
    let (_, s_b) = get(&server, "/v1/requests?session=s-b").await;
    assert_eq!(run_ids(&s_b), of(&[4, 1]));
    let (_, found) = get(&server, "/v1/requests?q=REFUND%20ORDER").await;
    assert_eq!(run_ids(&found), of(&[1]));

    // A page's cursor still works after its run ended: answer the request of run 3 (the end
    // of the first page of two) and of run 2, then continue after run 3.
    let (_, p1) = get(&server, "/v1/requests?limit=2").await;
    assert_eq!(run_ids(&p1), of(&[4, 3]));
    let next = p1["next"].as_str().unwrap().to_owned();
    let request_of = |run: usize| -> String {
        all["requests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["runId"] == runs[run].as_str())
            .unwrap()["requestId"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (status, _) = answer(&server, &request_of(3), json!({ "text": "nothing to add" })).await;
    assert_eq!(status, 200);
    let (status, _) = answer(&server, &request_of(2), json!({ "optionId": "approve" })).await;
    assert_eq!(status, 200);
    let (_, p2) = get(&server, &format!("/v1/requests?limit=2&before={next}")).await;
    assert_eq!(run_ids(&p2), of(&[1, 0]), "answered requests are gone");
    let (_, rest) = get(&server, "/v1/requests").await;
    assert_eq!(run_ids(&rest), of(&[4, 1, 0]));

    for path in [
        "/v1/requests?order=sideways",
        "/v1/requests?before=yesterday",
        "/v1/requests?limit=0",
        "/v1/requests?color=red",
    ] {
        let (status, body) = get(&server, path).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("malformed")),
            "{path}: {body}"
        );
    }
    worker.shutdown().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_not_woken_by_this_servers_writes_to_other_sessions() {
    // Where the store notifies per session, a server's own writes wake only the streams of the
    // session written to: a page following hundreds of sessions costs no read per session at
    // each answer.
    let memory: std::sync::Arc<dyn eve_core::JournalStore> =
        std::sync::Arc::new(eve_core::MemoryStore::new());
    let counted = eve_core::testing::FaultyStore::new(memory.clone());
    let worker = worker(memory.clone()).await;
    let watching = TestServer::start(memory.clone(), |_| {}).await;
    let answering = TestServer::start(counted.clone(), |_| {}).await;
    let _quiet = SseClient::connect(&answering.url("/v1/sessions/s-quiet/events"), None).await;
    let mut busy = SseClient::connect(&watching.url("/v1/sessions/s-busy/events"), None).await;
    for i in 0..5 {
        start(
            &memory,
            "s-busy",
            &format!("call-{i}"),
            "deploy",
            json!({ "service": format!("svc-{i}") }),
        )
        .await;
    }
    let mut requests = Vec::new();
    while requests.len() < 5 {
        let f = busy.until("input.requested").await.pop().unwrap();
        requests.push(
            f.json()["event"]["data"]["requestId"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let reads = || {
        counted
            .call_log()
            .iter()
            .filter(|c| **c == "read_session")
            .count()
    };
    let before = reads();
    for r in &requests {
        let (status, _) = answer(&answering, r, json!({ "optionId": "approve" })).await;
        assert_eq!(status, 200);
    }
    let mut settled = 0;
    while settled < 5 {
        busy.until("tool.settled").await;
        settled += 1;
    }
    // At most one fallback poll (every 2 s) may fall in this stretch.
    let woke = reads() - before;
    assert!(
        woke <= 1,
        "the quiet session's stream read its log {woke} times during 5 answers elsewhere"
    );
    assert!(
        counted
            .call_log()
            .iter()
            .filter(|c| **c == "answer")
            .count()
            >= 5
    );
    worker.shutdown().await;
    watching.stop().await;
    answering.stop().await;
}
