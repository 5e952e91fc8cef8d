//! `eve runs terminate` and the batch `eve runs cancel|terminate` (issue 26, operator
//! actions): one run terminated on the store and through the server prints the same, an ended
//! run is refused naming its status in both modes; a batch by filter lists with --dry-run and
//! changes nothing, is refused without a filter (unless --all) and without --yes when stdin is
//! not a terminal, and with --yes acts on exactly the live runs that match, locally and
//! remotely (--json: one result per run).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

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

fn status(d: &Path, run: &str) -> String {
    let v: serde_json::Value =
        serde_json::from_str(&ok(d, &["runs", "show", run, "--json"])).unwrap();
    v["run"]["status"].as_str().unwrap().to_owned()
}

fn journal(d: &Path, run: &str) -> Vec<serde_json::Value> {
    ok(d, &["journal", run, "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn terminate_one_run_and_batches_locally_and_remotely() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = ok(
        d,
        &[
            "keys", "create", "--name", "ops", "--scope", "operate", "--json",
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let key = v["key"].as_str().unwrap().to_owned();
    let served = Served::start(d);
    let url = served.base.clone();
    let rem = ["--url", url.as_str(), "--key", key.as_str()];

    // One run each way, parked on its ask.
    let l1 = call(d, &[], "t1", "c1");
    let r1 = call(d, &rem, "t1", "c2");
    settle(d, 2);
    let local = ok(
        d,
        &[
            "runs",
            "terminate",
            &l1,
            "--reason",
            "stuck",
            "--as",
            "alice",
        ],
    );
    let remote = ok(
        d,
        &[&rem[..], &["runs", "terminate", &r1, "--reason", "stuck"]].concat(),
    );
    assert!(local.contains("terminated (seq"), "{local}");
    assert_eq!(as_local(&remote, &[(&r1, &l1)]), local);
    assert_eq!(
        (status(d, &l1), status(d, &r1)),
        ("failed".into(), "failed".into())
    );
    let last = |run: &str| journal(d, run).last().unwrap()["event"].clone();
    assert_eq!(
        last(&l1),
        serde_json::json!({"RunTerminated": {"reason": "stuck", "by": "alice"}})
    );
    assert_eq!(
        last(&r1),
        serde_json::json!({"RunTerminated": {"reason": "stuck", "by": "ops"}}),
        "over HTTP the key's name"
    );
    for run in [&l1, &r1] {
        let j = journal(d, run);
        assert!(
            j.iter().any(|e| e["event"].get("InputWithdrawn").is_some()),
            "the pending ask withdrawn: {j:?}"
        );
    }
    // Its outcome names who and why.
    let shown = ok(d, &["runs", "show", &l1]);
    let outcome = shown
        .lines()
        .find(|l| l.starts_with("outcome"))
        .unwrap_or_default();
    assert!(
        outcome.contains("RunTerminated") && outcome.contains("alice") && outcome.contains("stuck"),
        "{shown}"
    );
    // Again: refused, naming the status, the same in both modes; nothing written.
    let before = journal(d, &l1).len();
    let l = fails(
        d,
        &["runs", "terminate", &l1, "--reason", "again"],
        1,
        "already ended (failed)",
    );
    let r = fails(
        d,
        &[&rem[..], &["runs", "terminate", &r1, "--reason", "again"]].concat(),
        1,
        "already ended (failed)",
    );
    assert_eq!(as_local(&r, &[(&r1, &l1)]), l);
    assert_eq!(journal(d, &l1).len(), before);
    fails(
        d,
        &["runs", "terminate", "run-none", "--reason", "x"],
        1,
        "run-none",
    );
    fails(
        d,
        &[
            &rem[..],
            &["runs", "terminate", "run-none", "--reason", "x"],
        ]
        .concat(),
        1,
        "run-none",
    );
    fails(
        d,
        &[
            &rem[..],
            &["runs", "terminate", &r1, "--reason", "x", "--as", "bob"],
        ]
        .concat(),
        2,
        "--as works on the store only",
    );

    // Batches: three parked runs in session b1 (one ended by hand first), one in b2.
    let b: Vec<String> = (0..3)
        .map(|i| call(d, &[], "b1", &format!("b{i}")))
        .collect();
    let other = call(d, &[], "b2", "x0");
    settle(d, 4);
    ok(d, &["runs", "terminate", &b[0], "--reason", "early"]);
    let ended_len = journal(d, &b[0]).len();
    let listing = ok(d, &["runs", "list", "--json"]);

    // No filter: refused (unless --all); nothing changes.
    fails(
        d,
        &["runs", "terminate", "--reason", "x", "--yes"],
        2,
        "--all",
    );
    fails(d, &["runs", "cancel", "--yes"], 2, "--all");
    // A run id and a filter: refused.
    fails(
        d,
        &["runs", "cancel", &other, "--session", "b2"],
        2,
        "not both",
    );
    // --dry-run: the count and the ids of the live matching runs, locally and remotely.
    for pre in [&[][..], &rem[..]] {
        let dry = ok(
            d,
            &[
                pre,
                &[
                    "runs",
                    "terminate",
                    "--session",
                    "b1",
                    "--reason",
                    "x",
                    "--dry-run",
                ],
            ]
            .concat(),
        );
        assert_eq!(
            dry,
            format!(
                "would terminate 2 run(s) (dry run: nothing changed)\n{}\n{}\n",
                b[1], b[2]
            ),
        );
    }
    let dry = ok(d, &["runs", "cancel", "--all", "--dry-run", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&dry).unwrap();
    assert_eq!(v["count"], 3, "{dry}");
    // Without --yes, stdin not a terminal: refused.
    fails(
        d,
        &["runs", "terminate", "--session", "b1", "--reason", "x"],
        2,
        "--yes",
    );
    assert_eq!(
        ok(d, &["runs", "list", "--json"]),
        listing,
        "nothing changed"
    );

    // --yes: exactly the matching live runs; the ended one and the other session untouched.
    let done = ok(
        d,
        &[
            "runs",
            "terminate",
            "--session",
            "b1",
            "--reason",
            "cleanup",
            "--yes",
        ],
    );
    let lines: Vec<&str> = done.lines().collect();
    assert_eq!(lines.len(), 3, "{done}");
    assert!(
        lines[0].starts_with(&format!("{}  terminated (seq", b[1])),
        "{done}"
    );
    assert!(
        lines[1].starts_with(&format!("{}  terminated (seq", b[2])),
        "{done}"
    );
    assert_eq!(
        lines[2],
        "terminated 2, skipped 0 (ended meanwhile), failed 0; 2 run(s) in all"
    );
    for run in &b[1..] {
        assert_eq!(status(d, run), "failed");
        assert_eq!(
            last(run),
            serde_json::json!({"RunTerminated": {"reason": "cleanup", "by": std::env::var("USER").ok().filter(|u| !u.is_empty()).unwrap_or_else(|| "operator".into())}})
        );
    }
    assert_eq!(
        journal(d, &b[0]).len(),
        ended_len,
        "an ended run is not touched"
    );
    assert_eq!(status(d, &other), "running");

    // Remote batch cancel with --json: one result per run.
    let out = ok(
        d,
        &[
            &rem[..],
            &[
                "runs",
                "cancel",
                "--session",
                "b2",
                "--reason",
                "done",
                "--yes",
                "--json",
            ],
        ]
        .concat(),
    );
    let results: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(results.as_array().unwrap().len(), 1, "{out}");
    assert_eq!(results[0]["run"], other.as_str());
    assert_eq!(results[0]["outcome"], "cancelRequested", "{out}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while status(d, &other) != "cancelled" {
        assert!(Instant::now() < deadline, "the cancelled run never ended");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Nothing live in b1 or b2 any more: an empty batch does nothing.
    assert_eq!(
        ok(
            d,
            &[
                "runs",
                "terminate",
                "--session",
                "b2",
                "--reason",
                "x",
                "--yes"
            ]
        ),
        "no live run matches; nothing to terminate\n"
    );
    drop(served);
}
