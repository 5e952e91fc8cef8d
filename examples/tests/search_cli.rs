//! `eve runs list --query` (issue 26, search): runs labelled with attributes are listed by
//! attribute and input predicates, printing the same on the store and through the server
//! (`--url`), as text and as JSON; `runs show` names the attributes; the batch commands take
//! the same filter (`--dry-run`); a query that does not parse is a usage error naming the token.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use eve_core::{
    Append, AppendId, CallId, DeploymentId, Event, Execution, JournalStore, NewRun, Payload, RunId,
    SessionId, Timestamp, WorkerId, WorkflowId,
};
use serde_json::{json, Value};

/// Runs on `d`'s store under a deployment no worker serves, each labelled by one append.
fn seed(d: &Path, runs: &[(&str, Value, Value)]) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = eve_storage_sqlite::SqliteStore::open(d.join("eve.db"))
            .await
            .expect("open the store");
        let dep = DeploymentId::new("search-cli");
        for (i, (name, input, attributes)) in runs.iter().enumerate() {
            let now = Timestamp(1_700_000_000_000 + i as i64);
            let run = RunId::new(format!("run-{name}"));
            store
                .create_run(
                    NewRun {
                        run_id: run.clone(),
                        idempotency_key: None,
                        workflow_id: WorkflowId::new("tests::label"),
                        deployment_id: dep.clone(),
                        tool: "label".into(),
                        input: Payload::from(input.clone()),
                        session_id: SessionId::new("search"),
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
                    Duration::from_secs(3600),
                    now,
                )
                .await
                .expect("register");
            assert_eq!(store.claim(&lease, 1, now).await.expect("claim").len(), 1);
            store
                .append(Append {
                    run,
                    expected_seq: 1,
                    lease,
                    append_id: AppendId::random(),
                    events: vec![Event::AttributesSet {
                        cmd: 1,
                        attributes: Payload::from(attributes.clone()),
                    }],
                    now,
                })
                .await
                .expect("append");
        }
    });
}

#[test]
fn runs_list_query_locally_and_remotely() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    seed(
        d,
        &[
            (
                "a",
                json!({"service": "api"}),
                json!({"region": "eu", "cost": 10}),
            ),
            (
                "b",
                json!({"service": "web"}),
                json!({"region": "eu", "cost": 25.5}),
            ),
            (
                "c",
                json!({"service": "api"}),
                json!({"region": "us", "cost": 40}),
            ),
        ],
    );
    let out = ok(
        d,
        &[
            "keys", "create", "--name", "ops", "--scope", "operate", "--json",
        ],
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    let key = v["key"].as_str().unwrap().to_owned();
    let served = Served::start(d);
    let rem = ["--url", served.base.as_str(), "--key", key.as_str()];

    for (q, want) in [
        (r#"attr.region = "eu""#, &["run-a", "run-b"][..]),
        ("attr.cost >= 25", &["run-b", "run-c"][..]),
        (
            r#"input.service = "api" and attr.cost < 40"#,
            &["run-a"][..],
        ),
        (r#"attr.cost = "10""#, &[][..]),
    ] {
        let local = ok(d, &["runs", "list", "--oldest-first", "--query", q]);
        let remote = ok(
            d,
            &[&rem[..], &["runs", "list", "--oldest-first", "--query", q]].concat(),
        );
        assert_eq!(remote, local, "{q}: the same in both modes");
        for run in ["run-a", "run-b", "run-c"] {
            assert_eq!(
                local.contains(run),
                want.contains(&run),
                "{q}: {run} in\n{local}"
            );
        }
        let local = ok(d, &["runs", "list", "--json", "--query", q]);
        let remote = ok(
            d,
            &[&rem[..], &["runs", "list", "--json", "--query", q]].concat(),
        );
        let ids = |out: &str| -> Vec<String> {
            let v: Value = serde_json::from_str(out).unwrap();
            v["runs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["run_id"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(ids(&remote), ids(&local), "{q}");
    }
    // With the other filters: one session, newest first.
    let local = ok(
        d,
        &[
            "runs",
            "list",
            "--session",
            "search",
            "--query",
            r#"attr.region = "eu""#,
        ],
    );
    assert!(local.find("run-b") < local.find("run-a"), "{local}");

    let shown = ok(d, &["runs", "show", "run-b"]);
    assert!(
        shown.contains(r#"attributes  cost=25.5 region="eu""#),
        "{shown}"
    );

    // The batch commands take the same filter.
    for pre in [&[][..], &rem[..]] {
        let dry = ok(
            d,
            &[
                pre,
                &[
                    "runs",
                    "cancel",
                    "--query",
                    "input.service = \"api\"",
                    "--dry-run",
                ],
            ]
            .concat(),
        );
        assert!(
            dry.contains("run-a") && dry.contains("run-c") && !dry.contains("run-b"),
            "{dry}"
        );
    }

    // A query that does not parse: a usage error naming the token, in both modes.
    fails(
        d,
        &["runs", "list", "--query", "region = \"eu\""],
        2,
        "unknown path `region`",
    );
    fails(
        d,
        &[&rem[..], &["runs", "list", "--query", "attr.cost >"]].concat(),
        2,
        "expected a value",
    );
}
