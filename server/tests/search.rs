//! `GET /v1/runs?query=`: runs labelled through `AttributesSet` appends are found by attribute
//! and input predicates (equality and ranges), alone and with the other filters; each listed run
//! carries its attributes, and so does `GET /v1/runs/{id}`; a query that does not parse is a
//! 400 `invalid_query` naming the offending token.

mod common;

use common::*;
use eve_core::{
    Append, AppendId, CallId, DeploymentId, Event, Execution, JournalStore, NewRun, Payload, RunId,
    SessionId, Timestamp, WorkerId, WorkflowId,
};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

async fn labelled(
    store: &Arc<dyn JournalStore>,
    name: &str,
    tool: &str,
    input: Value,
    attributes: Value,
) -> RunId {
    let now = Timestamp::now();
    let dep = DeploymentId::new("search-tests");
    let run = RunId::new(format!("run-{name}"));
    store
        .create_run(
            NewRun {
                run_id: run.clone(),
                idempotency_key: None,
                workflow_id: WorkflowId::new("tests::label"),
                deployment_id: dep.clone(),
                tool: tool.into(),
                input: Payload::from(input),
                session_id: SessionId::new("s-search"),
                call_id: CallId::new(format!("call-{name}")),
                execution: Execution::Default,
                traceparent: None,
                reset_from: None,
            },
            now,
        )
        .await
        .expect("create run");
    let lease = store
        .register_worker(
            &WorkerId::new(format!("w-{name}")),
            &dep,
            Duration::from_secs(60),
            now,
        )
        .await
        .expect("register");
    let claimed = store.claim(&lease, 1, now).await.expect("claim");
    assert_eq!(claimed.len(), 1);
    store
        .append(Append {
            run: run.clone(),
            expected_seq: 1,
            lease,
            append_id: AppendId::random(),
            events: vec![Event::AttributesSet {
                cmd: 1,
                attributes: Payload::from(attributes),
            }],
            now,
        })
        .await
        .expect("append");
    run
}

async fn get(client: &reqwest::Client, url: String) -> (u16, Value) {
    let resp = client.get(url).send().await.expect("get");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn ids(page: &Value) -> Vec<String> {
    page["runs"]
        .as_array()
        .unwrap_or_else(|| panic!("no runs in {page}"))
        .iter()
        .map(|r| r["runId"].as_str().expect("runId").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_runs_by_query() {
    let (_dir, store) = sqlite().await;
    let a = labelled(
        &store,
        "a",
        "deploy",
        json!({"service": "api", "n": 1}),
        json!({"region": "eu", "cost": 10}),
    )
    .await;
    let b = labelled(
        &store,
        "b",
        "deploy",
        json!({"service": "web", "n": 2}),
        json!({"region": "eu", "cost": 25.5}),
    )
    .await;
    let c = labelled(
        &store,
        "c",
        "report",
        json!({"service": "api", "n": 3}),
        json!({"region": "us", "cost": 40}),
    )
    .await;
    let server = TestServer::start(store.clone(), |_| {}).await;
    let client = reqwest::Client::new();
    let list = |q: &str, extra: &str| {
        let mut url = reqwest::Url::parse(&server.url("/v1/runs")).unwrap();
        url.query_pairs_mut().append_pair("query", q);
        for kv in extra.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap();
            url.query_pairs_mut().append_pair(k, v);
        }
        url.to_string()
    };
    for (q, extra, want) in [
        (r#"attr.region = "eu""#, "", vec![&a, &b]),
        ("attr.cost >= 25", "", vec![&b, &c]),
        (r#"input.service = "api""#, "", vec![&a, &c]),
        (r#"input.service = "api" and attr.cost < 40"#, "", vec![&a]),
        (
            r#"attr.region = "eu""#,
            "tool=deploy&order=newest",
            vec![&b, &a],
        ),
        ("attr.cost >= 10", "limit=1", vec![&a]),
        (r#"attr.cost = "10""#, "", vec![]),
    ] {
        let (status, page) = get(&client, list(q, extra)).await;
        assert_eq!(status, 200, "{q}: {page}");
        let want: Vec<String> = want.iter().map(|r| r.to_string()).collect();
        assert_eq!(ids(&page), want, "{q} {extra}");
    }
    let (_, page) = get(&client, list(r#"attr.region = "us""#, "")).await;
    assert_eq!(
        page["runs"][0]["attributes"],
        json!({"region": "us", "cost": 40})
    );
    assert_eq!(page["counts"]["running"], json!(1));
    let (status, one) = get(&client, server.url(&format!("/v1/runs/{a}"))).await;
    assert_eq!(status, 200);
    assert_eq!(
        one["run"]["attributes"],
        json!({"region": "eu", "cost": 10})
    );

    for (q, needle) in [
        (r#"region = "eu""#, "unknown path `region`"),
        (r#"attr.region = "eu" or attr.cost = 1"#, "expected `and`"),
        ("attr.cost >", "expected a value"),
    ] {
        let (status, body) = get(&client, list(q, "")).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("invalid_query")),
            "{q}: {body}"
        );
        assert!(
            body["message"]
                .as_str()
                .unwrap_or_default()
                .contains(needle),
            "{q}: {body}"
        );
    }
    server.stop().await;
}
