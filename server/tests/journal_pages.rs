//! `GET /v1/runs/{id}` pages a long journal: up to 10,000 events come whole (the output of a
//! short journal is unchanged, with no `nextSeq`); a longer journal comes in pages, each naming
//! where the next starts (`nextSeq`), and `?from=&limit=` reads one window. Bad windows are
//! 400s that say what to ask for.

mod common;

use common::*;
use eve_core::{
    Append, AppendId, CallId, DeploymentId, Event, Execution, JournalStore, MemoryStore, NewRun,
    Payload, RunId, SessionId, Timestamp, WorkerId, WorkflowId,
};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// A run whose journal holds `RunStarted` and `steps` step results.
async fn long_run(store: &Arc<dyn JournalStore>, name: &str, steps: u64) -> RunId {
    let now = Timestamp::now();
    let dep = DeploymentId::new("pages-tests");
    let run = RunId::new(format!("run-{name}"));
    store
        .create_run(
            NewRun {
                run_id: run.clone(),
                idempotency_key: None,
                workflow_id: WorkflowId::new("tests::long"),
                deployment_id: dep.clone(),
                tool: "long".into(),
                input: Payload::from(serde_json::json!({})),
                session_id: SessionId::new("s-pages"),
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
    store.claim(&lease, 1, now).await.expect("claim");
    let events: Vec<Event> = (0..steps)
        .map(|cmd| Event::StepCompleted {
            cmd,
            name: "s".into(),
            attempt: 1,
            output: Payload::from(serde_json::json!(cmd)),
        })
        .collect();
    let mut seq = 1;
    for chunk in events.chunks(eve_core::store::MAX_EVENTS_PER_APPEND) {
        seq = store
            .append(Append {
                run: run.clone(),
                expected_seq: seq,
                lease: lease.clone(),
                append_id: AppendId::random(),
                events: chunk.to_vec(),
                now,
            })
            .await
            .expect("append")
            .next_seq;
    }
    run
}

async fn get(client: &reqwest::Client, url: String) -> (u16, Value) {
    let resp = client.get(url).send().await.expect("get");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn seqs(page: &Value) -> Vec<u64> {
    page["events"]
        .as_array()
        .unwrap_or_else(|| panic!("no events in {page}"))
        .iter()
        .map(|e| e["seq"].as_u64().expect("seq"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_journal_comes_in_pages() {
    let store: Arc<dyn JournalStore> = Arc::new(MemoryStore::new());
    let short = long_run(&store, "short", 3).await;
    let long = long_run(&store, "long", 25_000).await;
    let server = TestServer::start(store.clone(), |_| {}).await;
    let client = reqwest::Client::new();
    let run_url = |run: &RunId, q: &str| server.url(&format!("/v1/runs/{run}{q}"));

    // A short journal: whole, and no nextSeq.
    let (status, page) = get(&client, run_url(&short, "")).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(seqs(&page), vec![0, 1, 2, 3]);
    assert!(page.get("nextSeq").is_none(), "{page}");
    assert_eq!(page["run"]["runId"], short.as_str());

    // A long one: pages of 10,000 followed by nextSeq, every event once, in order.
    let mut all = Vec::new();
    let mut from = Some(0);
    let mut pages = 0;
    while let Some(f) = from {
        let (status, page) = get(&client, run_url(&long, &format!("?from={f}"))).await;
        assert_eq!(status, 200, "{page}");
        let got = seqs(&page);
        assert!(got.len() <= 10_000, "a page of {}", got.len());
        all.extend(got);
        from = page.get("nextSeq").and_then(Value::as_u64);
        pages += 1;
    }
    assert_eq!(pages, 3);
    assert_eq!(all, (0..25_001).collect::<Vec<_>>());
    let (_, first) = get(&client, run_url(&long, "")).await;
    assert_eq!(first["nextSeq"], 10_000);
    assert_eq!(seqs(&first).len(), 10_000);

    // One window.
    let (status, page) = get(&client, run_url(&long, "?from=24990&limit=5")).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(seqs(&page), (24_990..24_995).collect::<Vec<_>>());
    assert_eq!(page["nextSeq"], 24_995);
    let (_, page) = get(&client, run_url(&long, "?from=25001")).await;
    assert_eq!(seqs(&page), Vec::<u64>::new());
    assert!(page.get("nextSeq").is_none(), "{page}");

    // Windows that cannot be served.
    for q in ["?limit=0", "?limit=10001", "?from=25002", "?page=2"] {
        let (status, body) = get(&client, run_url(&long, q)).await;
        assert_eq!(status, 400, "{q}: {body}");
    }
    let (_, body) = get(&client, run_url(&long, "?limit=10001")).await;
    assert!(
        body.to_string().contains("follow nextSeq"),
        "the error says what to do: {body}"
    );
    server.stop().await;
}
