//! The remote CLI (`eve --url URL --key KEY …`, issue 26 item 1): every command that reads or
//! acts prints the same through a server's HTTP API as on the store itself, text and `--json`;
//! a key of too small a scope is one line and exit code 1, a server that cannot be reached one
//! line naming its URL and exit code 2, and neither changes anything.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// `v` as the `&str`s a command line takes.
fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn every_command_prints_the_same_through_the_server_as_on_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let key = |name: &str, scope: &str| -> String {
        let out = ok(
            d,
            &["keys", "create", "--name", name, "--scope", scope, "--json"],
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["key"].as_str().unwrap().to_owned()
    };
    let admin = key("admin", "admin");
    let reader = key("reader", "read");
    let served = Served::start(d);
    let url = served.base.clone();
    let remote = |args: &[&str]| -> String {
        ok(
            d,
            &[&["--url", url.as_str(), "--key", admin.as_str()], args].concat(),
        )
    };

    // call: the same line for a new call (run ids aside).
    let call = |session: &str, call: &str| {
        vec![
            "call".to_owned(),
            "progress_then_ask".into(),
            "--input".into(),
            "{}".into(),
            "--session".into(),
            session.into(),
            "--call-id".into(),
            call.into(),
        ]
    };
    let local_call = ok(d, &refs(&call("s1", "c1")));
    let remote_call = remote(&refs(&call("s1", "c2")));
    let (l1, r1) = (
        first_field(&local_call, "run"),
        first_field(&remote_call, "run"),
    );
    assert_eq!(
        as_local(&remote_call, &[(&r1, &l1), ("\"c2\"", "\"c1\"")]),
        local_call
    );
    settle(d, 2);

    // Every read, text and --json: byte for byte the same.
    for read in [
        vec!["runs", "list"],
        vec!["runs", "list", "--json"],
        vec!["runs", "list", "--session", "s1", "--limit", "1"],
        vec!["runs", "show", &l1],
        vec!["runs", "show", &l1, "--json"],
        vec!["journal", &r1],
        vec!["journal", &r1, "--json"],
        vec!["requests"],
        vec!["requests", "--json"],
        vec!["requests", "--session", "s1"],
        vec!["agents", "list"],
        vec!["keys", "list"],
        vec!["keys", "list", "--json"],
    ] {
        assert_eq!(remote(&read), ok(d, &read), "eve {read:?}");
    }

    // A named profile holds the URL and the key; a missing one is one line naming the file.
    std::fs::write(
        d.join("profiles.toml"),
        format!("[profiles.ops]\nurl = \"{url}\"\nkey = \"{admin}\"\n"),
    )
    .unwrap();
    assert_eq!(
        ok(d, &["--profile", "ops", "runs", "show", &r1]),
        ok(d, &["runs", "show", &r1])
    );
    fails(
        d,
        &["--profile", "prod", "runs", "list"],
        2,
        "no profile \"prod\"",
    );

    // A read key cannot answer: one line saying which scope it takes, exit code 1, the request
    // still pending. An unreachable server: one line naming its URL, exit code 2.
    let req_r1 = format!("{r1}:1");
    let req_l1 = format!("{l1}:1");
    let pending_before = ok(d, &["requests", "--json"]);
    assert!(pending_before.contains(&req_r1), "{pending_before}");
    let err = fails(
        d,
        &[
            "--url", &url, "--key", &reader, "answer", &req_r1, "approve",
        ],
        1,
        "needs answer",
    );
    assert!(
        err.contains("forbidden") && err.contains("scope read"),
        "{err}"
    );
    let down = "http://127.0.0.1:9";
    fails(
        d,
        &["--url", down, "--key", &admin, "answer", &req_r1, "approve"],
        2,
        down,
    );
    fails(d, &["--url", down, "runs", "list"], 2, down);
    assert_eq!(ok(d, &["requests", "--json"]), pending_before);

    // answer: the same line for each mode's own request.
    let remote_answer = remote(&["answer", &req_r1, "approve"]);
    let local_answer = ok(d, &["answer", &req_l1, "approve"]);
    assert_eq!(as_local(&remote_answer, &[(&r1, &l1)]), local_answer);
    // The same answer again: a duplicate, the same line in both.
    assert_eq!(
        as_local(&remote(&["answer", &req_r1, "approve"]), &[(&r1, &l1)]),
        ok(d, &["answer", &req_l1, "approve"])
    );

    // cancel: requested, then already requested / already ended, the same in both modes.
    let l2 = first_field(&ok(d, &refs(&call("s2", "c3"))), "run");
    let r2 = first_field(&remote(&refs(&call("s2", "c4"))), "run");
    settle(d, 2);
    for _ in 0..2 {
        let r = remote(&["cancel", &r2, "--reason", "test"]);
        let l = ok(d, &["cancel", &l2, "--reason", "test"]);
        assert_eq!(as_local(&r, &[(&r2, &l2)]), l);
    }

    // sessions show, then end (s1's runs have ended: ending again keeps the first time).
    for read in [
        vec!["sessions", "show", "s1"],
        vec!["sessions", "show", "s1", "--json"],
    ] {
        assert_eq!(remote(&read), ok(d, &read), "eve {read:?}");
    }
    let ended = ok(d, &["sessions", "end", "s1"]);
    assert!(ended.contains("cancel requested for 0 run(s)"), "{ended}");
    assert_eq!(remote(&["sessions", "end", "s1"]), ended);
    assert_eq!(
        remote(&["sessions", "show", "s1"]),
        ok(d, &["sessions", "show", "s1"])
    );

    // call --wait: the run's line and its result, the server's worker running both.
    let wait_call = |call_id: &str| {
        vec![
            "call",
            "deploy",
            "--input",
            r#"{"service": "api", "first_deadline": "1ms", "second_deadline": "1ms"}"#,
            "--session",
            "s3",
            "--call-id",
        ]
        .into_iter()
        .map(str::to_owned)
        .chain([call_id.to_owned(), "--wait".into(), "60s".into()])
        .collect::<Vec<_>>()
    };
    let local_wait = ok(d, &refs(&wait_call("w1")));
    let remote_wait = remote(&refs(&wait_call("w2")));
    let (l3, r3) = (
        first_field(&local_wait, "run"),
        first_field(&remote_wait, "run"),
    );
    assert!(local_wait.contains("timed out"), "{local_wait}");
    assert_eq!(
        as_local(&remote_wait, &[(&r3, &l3), ("\"w2\"", "\"w1\"")]),
        local_wait
    );

    // keys create and revoke: the same lines but for the key's own text and id.
    let local_key = ok(d, &["keys", "create", "--name", "ci", "--scope", "read"]);
    let remote_key = remote(&["keys", "create", "--name", "ci", "--scope", "read"]);
    let id_of = |out: &str| {
        out.split("(key ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .to_owned()
    };
    let (lk, rk) = (id_of(&local_key), id_of(&remote_key));
    let text_of = |out: &str| out.lines().next().unwrap().to_owned();
    assert_eq!(
        as_local(
            &remote_key,
            &[(&text_of(&remote_key), &text_of(&local_key)), (&rk, &lk)]
        ),
        local_key
    );
    let revoked_local = ok(d, &["keys", "revoke", &lk]);
    let revoked_remote = remote(&["keys", "revoke", &rk]);
    // The revocation times differ by the moment each was made; the rest is the same.
    let shape = |s: &str| s.split("revoked").next().unwrap().to_owned();
    assert_eq!(
        as_local(&shape(&revoked_remote), &[(&rk, &lk)]),
        shape(&revoked_local)
    );

    // runs show --follow: both modes tail the run live and stop at its end, printing the same.
    let l4 = first_field(&ok(d, &refs(&call("s4", "c5"))), "run");
    settle(d, 1);
    let follower = |remote: bool| {
        let mut c = Command::new(EVE);
        if remote {
            c.args(["--url", url.as_str(), "--key", admin.as_str()]);
        }
        c.args(["runs", "show", &l4, "--follow"])
            .current_dir(d)
            .env_remove("EVE_STORE_URL")
            .env_remove("EVE_URL")
            .env_remove("EVE_KEY")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn eve runs show --follow")
    };
    let (mut local_f, mut remote_f) = (follower(false), follower(true));
    std::thread::sleep(Duration::from_millis(500));
    // The run waits for its answer: neither follower may have stopped.
    assert!(
        local_f.try_wait().unwrap().is_none(),
        "the local follower stopped early"
    );
    assert!(
        remote_f.try_wait().unwrap().is_none(),
        "the remote follower stopped early"
    );
    ok(d, &["answer", &format!("{l4}:1"), "approve"]);
    let (local_out, remote_out) = (
        local_f.wait_with_output().unwrap(),
        remote_f.wait_with_output().unwrap(),
    );
    assert!(local_out.status.success() && remote_out.status.success());
    let (lo, ro) = (
        String::from_utf8_lossy(&local_out.stdout),
        String::from_utf8_lossy(&remote_out.stdout),
    );
    assert!(lo.contains("InputAnswered"), "{lo}");
    assert!(lo.lines().last().unwrap().contains("RunCompleted"), "{lo}");
    assert_eq!(ro, lo);
    drop(served);
}

#[test]
fn hook_resume_prints_the_same_through_the_server_as_on_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let key = |name: &str, scope: &str| -> String {
        let out = ok(
            d,
            &["keys", "create", "--name", name, "--scope", scope, "--json"],
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["key"].as_str().unwrap().to_owned()
    };
    let operate = key("ops", "operate");
    let person = key("person", "answer");
    let served = Served::start(d);
    let url = served.base.clone();
    let remote = |key: &str, args: &[&str]| -> Vec<String> {
        [&["--url", url.as_str(), "--key", key], args]
            .concat()
            .into_iter()
            .map(str::to_owned)
            .collect()
    };

    // Two renders wait on the hooks render-p1 and render-p2 (`ctx.create_hook`).
    let run_of = |project: &str| {
        let input = format!(r#"{{"project_id": "{project}"}}"#);
        first_field(
            &ok(
                d,
                &[
                    "call",
                    "render_hook",
                    "--input",
                    &input,
                    "--session",
                    "hooks",
                    "--call-id",
                    project,
                ],
            ),
            "run",
        )
    };
    let (r1, r2) = (run_of("p1"), run_of("p2"));
    // The server's worker (another process, which this one cannot be notified by) creates the
    // hooks: read the journals until both hold their HookCreated and their submit step.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for run in [&r1, &r2] {
        while !ok(d, &["journal", run]).contains("StepCompleted") {
            assert!(
                std::time::Instant::now() < deadline,
                "run {run} never created its hook"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let payload = r#"{"status": "ok", "url": "https://cdn.example/render.mp4"}"#;
    let resume = |token: &str| {
        ["hook", "resume", token, payload, "--dedupe-key", "farm-1"]
            .map(str::to_owned)
            .to_vec()
    };
    let same = |remote: &str| as_local(remote, &[(&r2, &r1), ("render-p2", "render-p1")]);

    // The first delivery, then a retry with the same dedupe key: the same lines.
    let local = ok(d, &refs(&resume("render-p1")));
    let remote_out = ok(d, &refs(&remote(&operate, &refs(&resume("render-p2")))));
    assert!(
        local.starts_with(&format!("delivered to hook \"render-p1\" (run {r1}, seq ")),
        "{local}"
    );
    assert_eq!(same(&remote_out), local);
    let local_again = ok(d, &refs(&resume("render-p1")));
    let remote_again = ok(d, &refs(&remote(&operate, &refs(&resume("render-p2")))));
    assert!(local_again.contains("already received"), "{local_again}");
    assert_eq!(same(&remote_again), local_again);

    // A key of too small a scope is refused; an unknown token fails in both modes alike.
    let forbidden = remote(&person, &refs(&resume("render-p2")));
    fails(d, &refs(&forbidden), 1, "forbidden");
    let none = ["hook", "resume", "render-none", "1"].map(str::to_owned);
    fails(d, &refs(&none), 1, "render-none");
    fails(d, &refs(&remote(&operate, &refs(&none))), 1, "render-none");
    // A payload that is not JSON is a usage error before anything is sent.
    let bad = ["hook", "resume", "render-p2", "{nope"].map(str::to_owned);
    fails(d, &refs(&remote(&operate, &refs(&bad))), 2, "not JSON");
    drop(served);
}
