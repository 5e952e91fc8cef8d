//! `eve runs retry` and `eve runs reset` (issue 26, operator actions), on the store and
//! through the server: a live run is refused (terminate or cancel it first) in both modes; a
//! terminated run retried starts a new run linked to it (`--json`: the new run, `created`,
//! `from`, `copied`), parked on its own copy of the ask; the same retry again prints the same
//! run ("already made"); a bad cut is refused naming the range; `eve runs show` names where a
//! reset run came from.

mod common;

use std::path::Path;

use common::*;

/// Starts a `progress_then_ask` call (it parks on its ask); its run id.
fn call(d: &Path, pre: &[&str], session: &str, call: &str) -> String {
    let out = ok(
        d,
        &[
            pre,
            &[
                "call",
                "progress_then_ask",
                "--input",
                "{}",
                "--session",
                session,
                "--call-id",
                call,
            ],
        ]
        .concat(),
    );
    first_field(&out, "run")
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn retry_and_reset_locally_and_remotely() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = ok(
        d,
        &[
            "keys", "create", "--name", "ops", "--scope", "operate", "--json",
        ],
    );
    let key = json(&out)["key"].as_str().unwrap().to_owned();
    let served = Served::start(d);
    let url = served.base.clone();
    let rem = ["--url", url.as_str(), "--key", key.as_str()];

    let l1 = call(d, &[], "t1", "c1");
    let r1 = call(d, &rem, "t1", "c2");
    settle(d, 2);
    // Live: refused in both modes.
    fails(
        d,
        &["runs", "reset", &l1, "--to", "1"],
        1,
        "terminate or cancel it first",
    );
    fails(
        d,
        &[&rem[..], &["runs", "retry", &r1]].concat(),
        1,
        "terminate or cancel it first",
    );
    for run in [&l1, &r1] {
        ok(d, &["runs", "terminate", run, "--reason", "wrong question"]);
    }

    // Retried: a new run of each, from the end's first event (the ask's withdrawal, seq 3).
    let local = json(&ok(d, &["runs", "retry", &l1, "--json"]));
    let remote = json(&ok(
        d,
        &[&rem[..], &["runs", "retry", &r1, "--json"]].concat(),
    ));
    for (v, old) in [(&local, &l1), (&remote, &r1)] {
        assert_eq!(v["created"], true, "{v}");
        assert_eq!(v["from"], serde_json::json!({"run": old, "seq": 3}), "{v}");
        assert_eq!(v["copied"], 2, "{v}");
        assert_eq!(v["status"], "running", "{v}");
        assert_eq!(v["deployment"], "examples-v1", "{v}");
    }
    let (n1, n2) = (
        local["run"].as_str().unwrap().to_owned(),
        remote["run"].as_str().unwrap().to_owned(),
    );
    // Each new run is parked on its own copy of the ask.
    settle(d, 2);
    let pending: Vec<serde_json::Value> = json(&ok(d, &["requests", "--json"]))
        .as_array()
        .unwrap()
        .clone();
    let mut ids: Vec<&str> = pending
        .iter()
        .map(|p| {
            p["request_id"]
                .as_str()
                .unwrap_or_else(|| p["requestId"].as_str().unwrap())
        })
        .collect();
    ids.sort_unstable();
    let mut want = vec![format!("{n1}:1"), format!("{n2}:1")];
    want.sort_unstable();
    assert_eq!(ids, want, "{pending:?}");

    // Again: the same run, nothing new; the text says so, the same in both modes.
    let l = ok(d, &["runs", "reset", &l1, "--to", "3"]);
    let r = ok(d, &[&rem[..], &["runs", "retry", &r1]].concat());
    assert!(l.starts_with(&n1) && l.contains("already made"), "{l}");
    assert_eq!(as_local(&r, &[(&r1, &l1), (&n2, &n1)]), l);

    // A bad cut, an unknown run.
    fails(d, &["runs", "reset", &l1, "--to", "9"], 1, "between 1");
    fails(
        d,
        &[&rem[..], &["runs", "reset", &r1, "--to", "0"]].concat(),
        1,
        "between 1",
    );
    fails(d, &["runs", "retry", "run-none"], 1, "run-none");
    fails(
        d,
        &[&rem[..], &["runs", "retry", "run-none"]].concat(),
        1,
        "run-none",
    );

    // Where it came from.
    let shown = ok(d, &["runs", "show", &n1]);
    assert!(
        shown.contains(&format!("reset from  {l1} at seq 3")),
        "{shown}"
    );
    let shown = json(&ok(d, &["runs", "show", &n2, "--json"]));
    assert_eq!(
        shown["reset_from"],
        serde_json::json!({"run": r1, "seq": 3}),
        "{shown}"
    );
    drop(served);
}
