//! Every command of the `eve` binary (the examples' app, built with `eve::App`) once against
//! SQLite: inspection, answers, hook deliveries, cancellation, operator decisions, conformance,
//! bench, `eve serve` (HTTP, worker, MCP at /mcp, the demo surviving a restart while its ask is
//! pending) and `eve mcp` on stdio.

use eve_core::engine::{start_tool_call, ManualClock, Worker, WorkerConfig};
use eve_core::{CallId, JournalStore, JournalStoreExt, RunId, RunStatus, SessionId, Timestamp};
use eve_examples::registry;
use eve_storage_sqlite::SqliteStore;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

const EVE: &str = env!("CARGO_BIN_EXE_eve");

/// Runs `eve args…` in `dir` with no `EVE_STORE_URL`, so the default `sqlite://eve.db` applies.
fn eve(dir: &Path, args: &[&str]) -> Output {
    Command::new(EVE)
        .args(args)
        .current_dir(dir)
        .env_remove("EVE_STORE_URL")
        .output()
        .expect("run eve")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts success and returns stdout.
fn ok(dir: &Path, args: &[&str]) -> String {
    let o = eve(dir, args);
    assert!(
        o.status.success(),
        "eve {args:?} failed ({}): {}{}",
        o.status,
        stdout(&o),
        stderr(&o)
    );
    stdout(&o)
}

/// Asserts failure with `code` and one line on stderr containing `needle`; returns that line.
fn fails(dir: &Path, args: &[&str], code: i32, needle: &str) -> String {
    let o = eve(dir, args);
    let err = stderr(&o);
    assert_eq!(
        o.status.code(),
        Some(code),
        "eve {args:?}: {err}{}",
        stdout(&o)
    );
    assert_eq!(
        err.lines().count(),
        1,
        "eve {args:?}: not one line: {err:?}"
    );
    assert!(err.starts_with("error: "), "eve {args:?}: {err}");
    assert!(
        err.contains(needle),
        "eve {args:?}: {err:?} lacks {needle:?}"
    );
    err
}

async fn start(
    store: &dyn JournalStore,
    call: &str,
    tool: &str,
    input: serde_json::Value,
) -> RunId {
    start_tool_call(
        store,
        &registry(),
        &SessionId::new("s1"),
        &CallId::new(call),
        tool,
        input,
        Timestamp::now(),
    )
    .await
    .expect("start")
    .run
    .run_id
}

/// Runs everything due on `store` with the examples' tools, on a manual clock (timers stay
/// pending), and returns that worker and clock.
async fn drain(store: &Arc<dyn JournalStore>) -> (Worker, Arc<ManualClock>) {
    let clock = ManualClock::new(Timestamp::now());
    let worker = Worker::new(
        store.clone(),
        registry(),
        clock.clone(),
        WorkerConfig::default(),
    )
    .await
    .unwrap();
    worker.drain().await.unwrap();
    (worker, clock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_answer_hook_cancel_resolve_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let store: Arc<dyn JournalStore> = Arc::new(SqliteStore::open(d.join("eve.db")).await.unwrap());
    let deploy = start(
        &*store,
        "c1",
        "deploy_approval",
        serde_json::json!({"service": "api"}),
    )
    .await;
    let render = start(
        &*store,
        "c2",
        "render_hook",
        serde_json::json!({"project_id": "p9"}),
    )
    .await;
    let remind = start(
        &*store,
        "c3",
        "remind",
        serde_json::json!({"note": "stand up", "delay": "1h"}),
    )
    .await;
    let (worker, clock) = drain(&store).await;

    // runs list, with and without filters.
    let all = ok(d, &["runs", "list"]);
    for id in [&deploy, &render, &remind] {
        assert!(all.contains(id.as_str()), "{all}");
    }
    assert!(all.contains("3 run(s)") && all.contains("running"), "{all}");
    assert!(ok(d, &["runs", "list", "--status", "completed"]).contains("0 run(s)"));
    assert!(ok(d, &["runs", "list", "--session", "s1", "--limit", "2"]).contains("2 run(s)"));
    assert!(ok(d, &["runs", "list", "--session", "other"]).contains("0 run(s)"));
    // Newest first by default, pages chained by the cursor printed at the end, filters, JSON.
    let listed = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["runs", "list", "--json"];
        all.extend_from_slice(args);
        let page: serde_json::Value = serde_json::from_str(&ok(d, &all)).unwrap();
        page["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["run_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let newest = listed(&[]);
    let mut oldest = listed(&["--oldest-first"]);
    assert_eq!(oldest.len(), 3);
    oldest.reverse();
    assert_eq!(newest, oldest, "newest first is the store's order reversed");
    let first = ok(d, &["runs", "list", "--limit", "2"]);
    assert!(
        first.contains(&format!("the next page: --before {}", newest[1])),
        "{first}"
    );
    assert_eq!(
        listed(&["--limit", "2", "--before", &newest[1]]),
        newest[2..]
    );
    assert_eq!(
        listed(&["--oldest-first", "--limit", "1"]),
        [newest[2].clone()]
    );
    // Oldest first, the cursor is named for its direction.
    let first = ok(d, &["runs", "list", "--oldest-first", "--limit", "1"]);
    assert!(
        first.contains(&format!("the next page: --after {}", newest[2])),
        "{first}"
    );
    assert_eq!(
        listed(&["--oldest-first", "--limit", "1", "--after", &newest[2]]),
        [newest[1].clone()]
    );
    let o = eve(
        d,
        &["runs", "list", "--oldest-first", "--before", &newest[2]],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = eve(d, &["runs", "list", "--after", &newest[2]]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    fails(
        d,
        &["runs", "list", "--oldest-first", "--after", "run_nope"],
        2,
        "--after",
    );
    let help = ok(d, &["runs", "--help"]);
    assert!(help.contains("List runs, newest first"), "{help}");
    assert_eq!(listed(&["--tool", "render_hook"]), [render.to_string()]);
    assert_eq!(listed(&["--since", "1h"]).len(), 3);
    assert!(listed(&["--until", "1h"]).is_empty());
    fails(d, &["runs", "list", "--before", "run_nope"], 2, "--before");
    fails(d, &["runs", "list", "--since", "soon"], 2, "--since");
    let shown: serde_json::Value =
        serde_json::from_str(&ok(d, &["runs", "show", deploy.as_str(), "--json"])).unwrap();
    assert_eq!(shown["run"]["tool"], "deploy_approval");
    assert_eq!(shown["pending"].as_array().unwrap().len(), 1, "{shown}");
    let pending: serde_json::Value = serde_json::from_str(&ok(d, &["requests", "--json"])).unwrap();
    assert_eq!(pending[0]["run_id"], deploy.as_str(), "{pending}");
    let completions = ok(d, &["completions", "bash"]);
    assert!(completions.contains("complete") && completions.contains("runs"));
    fails(
        d,
        &["runs", "list", "--status", "bogus"],
        2,
        "unknown run status \"bogus\"",
    );

    // The pending request, from `requests` and from `runs show`.
    let pending = store.pending_requests(&SessionId::new("s1")).await.unwrap();
    assert_eq!(pending.len(), 1);
    let request = pending[0].request_id.to_string();
    let listed = ok(d, &["requests"]);
    assert!(
        listed.contains(&request) && listed.contains("approve|cancel"),
        "{listed}"
    );
    assert!(ok(d, &["requests", "--session", "s1"]).contains("1 pending request(s)"));
    let show = ok(d, &["runs", "show", deploy.as_str()]);
    assert!(
        show.contains("status      running") && show.contains(&request),
        "{show}"
    );

    // Answers: once, a retry is a duplicate, another answer is refused, a bad option too.
    fails(d, &["answer", &request, "maybe"], 1, "not offered");
    fails(d, &["answer", &request], 2, "give an option id");
    assert!(
        ok(d, &["answer", &request, "approve", "--as", "ops-oncall"]).contains("answered request")
    );
    // The same answer from someone else is the same answer; the journal keeps who gave it.
    assert!(
        ok(d, &["answer", &request, "approve", "--as", "someone-else"])
            .contains("already had this answer")
    );
    assert!(ok(d, &["answer", &request, "approve"]).contains("already had this answer"));
    fails(d, &["answer", &request, "cancel"], 1, "already answered");
    let answered_by: Vec<Option<String>> = store
        .read_all(&deploy, 0)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.event {
            eve_core::Event::InputAnswered { response, .. } => Some(response.answered_by),
            _ => None,
        })
        .collect();
    assert_eq!(answered_by, [Some("ops-oncall".to_owned())]);
    fails(d, &["answer", "run_nope.1", "approve"], 1, "not found");

    // Hook deliveries: bad JSON, unknown token, then the render callback (deduped by key).
    fails(
        d,
        &["hook", "resume", "render-p9", "{not json"],
        2,
        "not JSON",
    );
    fails(d, &["hook", "resume", "render-none", "{}"], 1, "not found");
    let body = r#"{"status":"ok","url":"https://videos.example/p9.mp4"}"#;
    assert!(ok(
        d,
        &["hook", "resume", "render-p9", body, "--dedupe-key", "k1"]
    )
    .contains("delivered"));
    assert!(ok(
        d,
        &["hook", "resume", "render-p9", body, "--dedupe-key", "k1"]
    )
    .contains("already received"));

    // Cancel the sleeping reminder; again is a no-op.
    assert!(ok(d, &["cancel", remind.as_str()]).contains("cancel requested"));
    assert!(ok(d, &["cancel", remind.as_str()]).contains("already requested"));
    fails(d, &["cancel", "run_nope"], 1, "not found");

    // The worker takes every delivery; the grace period passes on the manual clock.
    clock.advance(Duration::from_secs(3600));
    worker.drain().await.unwrap();
    clock.advance(Duration::from_secs(3600));
    worker.drain().await.unwrap();
    for (id, status) in [
        (&deploy, RunStatus::Completed),
        (&render, RunStatus::Completed),
        (&remind, RunStatus::Cancelled),
    ] {
        assert_eq!(store.get_run(id).await.unwrap().status, status, "{id}");
    }
    assert!(ok(d, &["cancel", remind.as_str()]).contains("already ended (cancelled)"));

    // The journal, readable and as JSON, and the outcome in `runs show`.
    let journal = ok(d, &["journal", deploy.as_str()]);
    let kinds: Vec<&str> = journal
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    for k in [
        "RunStarted",
        "StepCompleted",
        "InputRequested",
        "InputAnswered",
        "RunCompleted",
    ] {
        assert!(kinds.contains(&k), "{k} missing from {journal}");
    }
    let events = store.read_all(&deploy, 0).await.unwrap();
    assert_eq!(journal.lines().count(), events.len(), "{journal}");
    let json = ok(d, &["journal", deploy.as_str(), "--json"]);
    for (line, e) in json.lines().zip(&events) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["seq"], e.seq);
    }
    let show = ok(d, &["runs", "show", deploy.as_str()]);
    assert!(
        show.contains("outcome     RunCompleted") && show.contains("\"deployed\":true"),
        "{show}"
    );
    fails(d, &["journal", "run_nope"], 1, "not found");
    fails(d, &["runs", "show", "run_nope"], 1, "not found");

    // Operator decisions apply to blocked runs only.
    fails(d, &["runs", "resume", deploy.as_str()], 1, "blocked");
    fails(
        d,
        &["runs", "fail", deploy.as_str(), "--error", "x"],
        1,
        "blocked",
    );

    // Backend choice: a bad URL is a usage error; EVE_STORE_URL and --store pick another file.
    fails(
        d,
        &["--store", "redis://x", "runs", "list"],
        2,
        "unknown scheme \"redis\"",
    );
    // A command that reads a SQLite file that does not exist is refused with its absolute path
    // (a relative URL run from another directory), and creates nothing.
    let other = Command::new(EVE)
        .args(["runs", "list"])
        .current_dir(d)
        .env("EVE_STORE_URL", "sqlite://other.db")
        .output()
        .unwrap();
    assert_eq!(other.status.code(), Some(1), "{}", stdout(&other));
    let missing = d.join("other.db");
    assert!(
        stderr(&other).contains(&format!("no store at {}", missing.display())),
        "{}",
        stderr(&other)
    );
    assert!(!missing.exists());
    // A not-found names the store it looked in.
    fails(
        d,
        &["runs", "show", "run_nope"],
        1,
        "in store sqlite://eve.db",
    );
    let abs = format!("sqlite://{}", d.join("eve.db").display());
    assert!(ok(Path::new("/"), &["runs", "list", "--store", &abs]).contains("3 run(s)"));
}

#[test]
fn conformance_and_bench_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = ok(d, &["conformance", "--cases", "4"]);
    assert!(out.contains("ok     appends::"), "{out}");
    assert!(
        out.contains("ok     sequences::random_sequences_match_model"),
        "{out}"
    );
    let summary = out.lines().last().unwrap();
    assert!(summary.ends_with("1 skipped, 0 failed"), "{out}");
    // `eve conformance`'s factory cannot damage rows: the case says so, never counted as passed.
    assert!(
        out.contains("skip   limits::corrupt_rows_are_typed_errors: MISSING"),
        "{out}"
    );
    fails(
        d,
        &["conformance", "--filter", "no_such_case"],
        2,
        "no conformance case",
    );
    // The suite works on fresh temp files: the default store file was never created.
    assert!(!d.join("eve.db").exists());

    // `eve bench` on the default store (`sqlite://eve.db`), at the smallest sizes: one column.
    let out = ok(
        d,
        &["bench", "--quick", "--calls", "3", "--parked-runs", "20"],
    );
    let header = out
        .lines()
        .find(|l| l.starts_with("MEASURE"))
        .unwrap_or_else(|| panic!("no table header in {out}"));
    assert!(header.contains("sqlite"), "{out}");
    for what in [
        "W1 10-step call, 1 caller: calls/s",
        "W2 cold replay after SIGKILL: ms",
        "storage bytes per step",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(what)),
            "no {what:?} row in {out}"
        );
    }
    // The bench's files went to a temp directory beside eve.db, removed afterwards.
    let left: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn logs_are_plain_off_a_terminal_and_serving_every_address_warns() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // stderr is a pipe here: log lines carry no ANSI colour codes.
    ok(
        d,
        &["keys", "create", "--name", "first", "--scope", "admin"],
    );
    let o = Command::new(EVE)
        .args(["runs", "list"])
        .current_dir(d)
        .env_remove("EVE_STORE_URL")
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "debug")
        .output()
        .expect("run eve");
    assert!(o.status.success(), "{}", stderr(&o));
    let logs = stderr(&o);
    assert!(logs.contains("DEBUG"), "no log lines to check: {logs}");
    assert!(!logs.contains('\x1b'), "ANSI codes in a pipe: {logs:?}");

    // --listen 0.0.0.0 without --base-url: a warning on stdout and stderr naming the fix;
    // the server serves all the same.
    let mut served = Served::start_on(d, "0.0.0.0:0", &[]);
    let base = served.base().replace("0.0.0.0", "127.0.0.1");
    let warning = served.wait_for("WARNING: --listen 0.0.0.0:0 without --base-url");
    assert!(
        warning.contains("421") && warning.contains("Give --base-url http://HOST:"),
        "{warning}"
    );
    let (status, _) = http(&base, "", "GET", "/healthz", "");
    assert_eq!(status, 200, "loopback is served");
    drop(served);
    // With --base-url: no warning.
    let mut served = Served::start_on(d, "0.0.0.0:0", &["--base-url", "http://eve.example:8787"]);
    served.wait_for("routes need an API key");
    assert!(
        !served.seen.iter().any(|l| l.contains("WARNING")),
        "{:#?}",
        served.seen
    );
}

/// A running `eve serve`, its stdout lines arriving on a channel; killed on drop.
struct Served {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Served {
    fn start(dir: &Path, extra: &[&str]) -> Self {
        Self::start_on(dir, "127.0.0.1:0", extra)
    }

    /// `eve serve --listen LISTEN extra…`.
    fn start_on(dir: &Path, listen: &str, extra: &[&str]) -> Self {
        Self::start_env(dir, listen, extra, &[])
    }

    /// [`Served::start_on`] with these environment variables (and no `EVE_BASE_URL` but one
    /// given here).
    fn start_env(dir: &Path, listen: &str, extra: &[&str], envs: &[(&str, &str)]) -> Self {
        let mut child = Command::new(EVE)
            .args(["serve", "--listen", listen])
            .args(extra)
            .current_dir(dir)
            .env_remove("EVE_STORE_URL")
            .env_remove("EVE_BASE_URL")
            .envs(envs.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn eve serve");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The first line (from now on) containing `needle`, within a minute.
    fn wait_for(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(e) => panic!("no line with {needle:?} ({e}); saw {:#?}", self.seen),
            }
        }
    }

    /// The `http://127.0.0.1:PORT` the server printed.
    fn base(&mut self) -> String {
        let line = self.wait_for("listening on ");
        let url = line.split("listening on ").nth(1).unwrap();
        url.split('/').take(3).collect::<Vec<_>>().join("/")
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.1 request on loopback with an API key; returns (status, body).
fn http(base: &str, key: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let (status, _, body) = exchange(base, key, method, path, body);
    (status, body)
}

/// [`http`] with the response's head (status line and headers) too.
fn exchange(base: &str, key: &str, method: &str, path: &str, body: &str) -> (u16, String, String) {
    let host = base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(host).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let auth = if key.is_empty() {
        String::new()
    } else {
        format!("Authorization: Bearer {key}\r\n")
    };
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    (status, head.to_owned(), body.to_owned())
}

/// Waits (polling the shared file: the run is another process's) until `run` has ended.
async fn until_ended(store: &dyn JournalStore, run: &RunId) -> RunStatus {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = store.get_run(run).await.unwrap().status;
        if status.is_terminal() {
            return status;
        }
        assert!(Instant::now() < deadline, "run {run} still {status:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_the_tools_and_answers_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut served = Served::start(d, &[]);
    let base = served.base();
    served.wait_for("runs deployment");
    // Secure by default: the first start creates an admin key and prints it once.
    let line = served.wait_for("eve serve:   eve_");
    let key = line.trim_start_matches("eve serve:").trim().to_owned();
    let (status, page) = http(&base, "", "GET", "/", "");
    assert_eq!(status, 200);
    assert!(
        page.contains("<html") || page.contains("<!doctype"),
        "{page}"
    );

    let store: Arc<dyn JournalStore> = Arc::new(SqliteStore::open(d.join("eve.db")).await.unwrap());
    let run = start(
        &*store,
        "c1",
        "deploy_approval",
        serde_json::json!({"service": "web"}),
    )
    .await;
    // The served worker runs it up to the ask.
    let deadline = Instant::now() + Duration::from_secs(60);
    let request = loop {
        let pending = store.pending_requests(&SessionId::new("s1")).await.unwrap();
        if let Some(p) = pending.first() {
            break p.request_id.to_string();
        }
        assert!(Instant::now() < deadline, "no request was asked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (status, _) = http(&base, "", "GET", "/v1/sessions/s1/requests", "");
    assert_eq!(status, 401, "no key, no requests");
    let (status, body) = http(&base, &key, "GET", "/v1/sessions/s1/requests", "");
    assert_eq!(status, 200);
    assert!(body.contains(&request), "{body}");
    // Answered by the CLI, in another process; the served worker finishes the run.
    assert!(ok(d, &["answer", &request, "approve"]).contains("answered"));
    assert_eq!(until_ended(&*store, &run).await, RunStatus::Completed);
    let (status, body) = http(&base, &key, "GET", &format!("/v1/runs/{run}"), "");
    assert_eq!(status, 200);
    assert!(body.contains("RunCompleted"), "{body}");

    // A second server on the same address is refused with one line (with its own worker id:
    // the default one is this server's, see `a_second_serve_with_the_same_worker_id_refuses`).
    let addr = base.trim_start_matches("http://").to_owned();
    fails(
        d,
        &["serve", "--listen", &addr, "--worker-id", "second"],
        1,
        "cannot listen on",
    );

    // Keys from the command line: created (shown once), listed (never shown), revoked.
    let listed = ok(d, &["keys", "list"]);
    assert!(
        listed.contains("admin") && !listed.contains(&key),
        "{listed}"
    );
    let created = listed
        .rsplit(", created ")
        .next()
        .and_then(|t| t.get(..24))
        .unwrap_or_else(|| panic!("no creation time: {listed}"));
    assert!(
        created.as_bytes()[10] == b'T' && created.ends_with('Z') && created.starts_with("20"),
        "an ISO time in UTC: {listed}"
    );
    // A name past the limits of every client-chosen id is a usage error; no key is made.
    let long = "n".repeat(eve_core::MAX_CLIENT_ID_BYTES + 1);
    fails(
        d,
        &["keys", "create", "--name", &long, "--scope", "read"],
        2,
        "--name is 257 bytes long; send at most 256 bytes",
    );
    fails(
        d,
        &[
            "keys",
            "create",
            "--name",
            "ci\u{1b}[31m",
            "--scope",
            "read",
        ],
        2,
        "non-printable character",
    );
    assert_eq!(ok(d, &["keys", "list"]), listed, "no key was made");
    let made = ok(d, &["keys", "create", "--name", "ci", "--scope", "read"]);
    let read_key = made.lines().next().unwrap().to_owned();
    assert!(read_key.starts_with("eve_"), "{made}");
    let (status, _) = http(&base, &read_key, "GET", "/v1/runs", "");
    assert_eq!(status, 200);
    let (status, _) = http(
        &base,
        &read_key,
        "POST",
        &format!("/v1/requests/{request}/answer"),
        r#"{"optionId":"approve"}"#,
    );
    assert_eq!(status, 403, "a read key cannot answer");
    let id = read_key.split('_').nth(1).unwrap();
    let revoked = ok(d, &["keys", "revoke", id]);
    assert!(revoked.contains("(revoked 20"), "{revoked}");
    // A key with an expiry: shown at creation and in the list, and it opens the routes.
    let made = ok(
        d,
        &[
            "keys",
            "create",
            "--name",
            "temp",
            "--scope",
            "read",
            "--expires-in",
            "30d",
        ],
    );
    assert!(made.contains(", expires 20"), "{made}");
    let temp_key = made.lines().next().unwrap().to_owned();
    let (status, _) = http(&base, &temp_key, "GET", "/v1/runs", "");
    assert_eq!(status, 200, "a key before its expiry");
    let listed = ok(d, &["keys", "list"]);
    let temp = listed.lines().find(|l| l.contains("temp")).unwrap();
    assert!(
        temp.contains("(active, created 20") && temp.contains(", expires 20"),
        "{temp}"
    );
    fails(
        d,
        &[
            "keys",
            "create",
            "--name",
            "n",
            "--scope",
            "read",
            "--expires-in",
            "0s",
        ],
        2,
        "--expires-in",
    );
    let (status, _) = http(&base, &read_key, "GET", "/v1/runs", "");
    assert_eq!(status, 401, "a revoked key opens nothing");
}

/// The journal's events of `run`, once `pred` holds for one of them (within a minute).
async fn until_event(
    store: &dyn JournalStore,
    run: &RunId,
    pred: impl Fn(&eve_core::Event) -> bool,
) -> Vec<eve_core::Event> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let events: Vec<_> = store
            .read_all(run, 0)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.event)
            .collect();
        if events.iter().any(&pred) {
            return events;
        }
        assert!(Instant::now() < deadline, "run {run}: {events:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The names of the completed steps of `run`.
async fn completed_steps(store: &dyn JournalStore, run: &RunId) -> Vec<String> {
    store
        .read_all(run, 0)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.event {
            eve_core::Event::StepCompleted { name, .. } => Some(name),
            _ => None,
        })
        .collect()
}

/// The output of `run`, which completed.
async fn output_of(store: &dyn JournalStore, run: &RunId) -> serde_json::Value {
    match store.read_all(run, 0).await.unwrap().pop().map(|e| e.event) {
        Some(eve_core::Event::RunCompleted { output }) => output.to_value().unwrap(),
        other => panic!("run {run} did not complete: {other:?}"),
    }
}

/// Three of the seed's examples through `eve serve`: `render_video` hands its render farm a
/// webhook URL built in a step from `EVE_BASE_URL`, which `--base-url` sets (over the
/// environment's value), and the farm's POST to it completes the render; `render_cleanup`,
/// cancelled with `eve cancel`, runs its cleanup step; `progress_then_ask` records its progress
/// and is answered with `eve answer`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_the_webhook_render_the_cleanup_and_the_progress_ask() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let public = format!("http://localhost:{port}");
    let mut served = Served::start_env(
        d,
        &format!("127.0.0.1:{port}"),
        &["--base-url", &public],
        &[
            ("EVE_BASE_URL", "http://not-this.example"),
            ("RENDER_FARM_DIR", d.to_str().unwrap()),
        ],
    );
    served.wait_for("runs deployment");
    let local = format!("http://127.0.0.1:{port}");
    let store: Arc<dyn JournalStore> = Arc::new(SqliteStore::open(d.join("eve.db")).await.unwrap());

    // The webhook render: the farm is handed the URL, and POSTs to it (no key: the token is
    // the credential).
    let render = start(
        &*store,
        "w1",
        "render_video",
        serde_json::json!({"project_id": "w9"}),
    )
    .await;
    // The farm (another process: the served one writes the job's callback URL to our dir).
    let farm_file = d.join("job-w9.url");
    let deadline = Instant::now() + Duration::from_secs(60);
    let callback_url = loop {
        if let Ok(url) = std::fs::read_to_string(&farm_file) {
            break url;
        }
        assert!(Instant::now() < deadline, "the render was not submitted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let prefix = format!("{public}{}", eve_core::engine::WEBHOOK_PATH);
    assert!(
        callback_url.starts_with(&prefix),
        "{callback_url} is not under {prefix}"
    );
    let path = callback_url.trim_start_matches(&public);
    let (status, body) = http(
        &local,
        "",
        "POST",
        path,
        r#"{"status":"ok","url":"https://cdn.example/w9.mp4"}"#,
    );
    assert_eq!(status, 202, "{body}");
    assert_eq!(until_ended(&*store, &render).await, RunStatus::Completed);
    assert_eq!(
        output_of(&*store, &render).await,
        serde_json::json!({"url": "https://cdn.example/w9.mp4"})
    );

    // The abort-cleanup render, cancelled from another process while it waits for the farm.
    let cleanup = start(
        &*store,
        "w2",
        "render_cleanup",
        serde_json::json!({"project_id": "k9"}),
    )
    .await;
    until_event(
        &*store,
        &cleanup,
        |e| matches!(e, eve_core::Event::StepCompleted { name, .. } if name == "submit_render"),
    )
    .await;
    assert!(ok(d, &["cancel", cleanup.as_str()]).contains("cancel requested"));
    assert_eq!(until_ended(&*store, &cleanup).await, RunStatus::Cancelled);
    assert_eq!(
        completed_steps(&*store, &cleanup).await,
        ["submit_render", "abort_render"]
    );

    // Progress, then an ask answered by `eve answer`.
    let ask = start(&*store, "w3", "progress_then_ask", serde_json::json!({})).await;
    let request = first_request(&*store).await;
    let events = until_event(&*store, &ask, |e| e.kind() == "Progress").await;
    assert!(
        events.iter().any(|e| e.kind() == "InputRequested"),
        "{events:?}"
    );
    assert!(ok(d, &["answer", &request, "approve"]).contains("answered"));
    assert_eq!(until_ended(&*store, &ask).await, RunStatus::Completed);
    assert_eq!(
        output_of(&*store, &ask).await["answer"]["optionId"],
        "approve"
    );
}

/// The first pending request of session `s1`, within a minute.
async fn first_request(store: &dyn JournalStore) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pending = store.pending_requests(&SessionId::new("s1")).await.unwrap();
        if let Some(p) = pending.first() {
            return p.request_id.to_string();
        }
        assert!(Instant::now() < deadline, "no request was asked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One live process per worker id (contract clause 11), on SQLite: see
/// [`second_serve_refuses`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_serve_with_the_same_worker_id_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("eve.db").display());
    second_serve_refuses(dir.path(), &url).await;
}

/// The same on Postgres (a fresh schema at `EVE_TEST_POSTGRES_URL`); skipped loudly when the
/// variable is unset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_serve_with_the_same_worker_id_refuses_on_postgres() {
    let Ok(base) = std::env::var("EVE_TEST_POSTGRES_URL") else {
        eprintln!("skipped: EVE_TEST_POSTGRES_URL is unset; set it to run this test against a real server");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let schema = format!("lock_{}", &RunId::random().as_str()[4..16]);
    let sep = if base.contains('?') { '&' } else { '?' };
    second_serve_refuses(dir.path(), &format!("{base}{sep}schema={schema}")).await;
    eve_storage_postgres::drop_schema(&base, &schema)
        .await
        .expect("drop the test's schema");
}

/// A second `eve serve` on the store at `url` with the same (default) worker id refuses to
/// start, with one line naming the first process, and the first keeps serving. Killed
/// (SIGKILL) with a run parked on an ask, the first leaves the id free at once: a restart
/// starts, and runs the answered run to its end.
async fn second_serve_refuses(d: &Path, url: &str) {
    let serve = ["--store", url, "--insecure-no-auth"];
    let mut first = Served::start(d, &serve);
    let base = first.base();
    first.wait_for("runs deployment");
    let pid = first.child.id();
    // Without the lock the second would serve on (fencing the first): give it a minute.
    let mut second = Command::new(EVE)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(serve)
        .current_dir(d)
        .env_remove("EVE_STORE_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the second eve serve");
    let deadline = Instant::now() + Duration::from_secs(60);
    let code = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = second.kill();
            panic!("the second eve serve with the same worker id did not refuse to start");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    second
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(
        err.starts_with("error: cannot start the worker: worker id ")
            && err.contains("is in use by another live process")
            && err.contains(&format!("pid {pid} on host"))
            && err.contains("--worker-id"),
        "{err}"
    );

    // The first keeps serving: its worker runs a new call up to the ask, its HTTP answers.
    let store = eve_cli::store_url::open_store(url).await.unwrap();
    let run = start(
        &*store,
        "c1",
        "deploy_approval",
        serde_json::json!({"service": "web"}),
    )
    .await;
    let request = first_request(&*store).await;
    assert!(
        first.child.try_wait().unwrap().is_none(),
        "the first runs on"
    );
    let (status, body) = http(&base, "", "GET", &format!("/v1/runs/{run}"), "");
    assert_eq!(status, 200, "{body}");

    drop(first);
    let mut restarted = Served::start(d, &serve);
    restarted.wait_for("runs deployment");
    assert!(ok(d, &["answer", &request, "approve", "--store", url]).contains("answered"));
    assert_eq!(until_ended(&*store, &run).await, RunStatus::Completed);
    assert!(restarted.child.try_wait().unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_survives_a_restart_while_the_ask_is_pending() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut first = Served::start(d, &["--demo"]);
    let base = first.base();
    let page = first.wait_for("answer it on the page: ");
    assert!(page.ends_with(&format!("{base}/")), "{page}");
    let command = first.wait_for("or run: eve answer ");
    // Killed (SIGKILL) while the ask is pending.
    drop(first);

    let mut second = Served::start(d, &["--demo"]);
    second.base();
    let again = second.wait_for("or run: eve answer ");
    assert_eq!(
        again, command,
        "the restarted demo must show the same request"
    );
    let args: Vec<&str> = command
        .split("or run: eve ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(args[0], "answer");
    assert!(ok(d, &args).contains("answered request"));
    let done = second.wait_for("finished");
    assert!(done.contains("\"deployed\":true"), "{done}");
    second.wait_for("eve serve: stopped");
    let status = second.child.wait().unwrap();
    assert!(status.success(), "{status}");

    // One run, one plan step and one deploy step, whatever the restart did.
    let store: Arc<dyn JournalStore> = Arc::new(SqliteStore::open(d.join("eve.db")).await.unwrap());
    let runs = ok(d, &["runs", "list", "--session", "demo"]);
    assert!(
        runs.contains("1 run(s)") && runs.contains("completed"),
        "{runs}"
    );
    let run = runs
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    let events = store.read_all(&RunId::new(run), 0).await.unwrap();
    let steps = events
        .iter()
        .filter(|e| e.event.kind() == "StepCompleted")
        .count();
    assert_eq!(steps, 2);
}

/// The official MCP Python SDK's session against `server` (`http://…/mcp`, or the `eve` binary
/// and its arguments for stdio): the tools are listed, a blocking `deploy_approval` call is
/// answered through elicitation and settles deployed, an unknown tool is -32602.
fn python_mcp_session(python: &str, server: &[&str], bearer: Option<&str>, store: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../mcp/tests/python/client.py");
    let mut cmd = Command::new(python);
    cmd.arg(&script).args(server).env("EVE_STORE_URL", store);
    if let Some(key) = bearer {
        cmd.env("EVE_MCP_BEARER", key);
    }
    let out = cmd.output().expect("run the Python client");
    let text = stdout(&out);
    assert!(
        out.status.success(),
        "the Python client failed: {text}{}",
        stderr(&out)
    );
    let steps: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let step = |name: &str| {
        steps
            .iter()
            .find(|s| s["step"] == name)
            .unwrap_or_else(|| panic!("no step {name}: {text}"))
            .clone()
    };
    assert_eq!(step("initialized")["server"], "eve");
    assert!(
        step("tools")["names"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("refund_order")),
        "{text}"
    );
    let called = step("called");
    assert_eq!(called["is_error"], false, "{called}");
    assert_eq!(called["structured"]["deployed"], true, "{called}");
    assert_eq!(called["asked"][0]["options"][0], "approve", "{called}");
    assert_eq!(step("unknown_tool")["code"], -32602);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_on_stdio_and_at_serve_slash_mcp() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut served = Served::start(d, &[]);
    let base = served.base();
    assert!(served
        .wait_for("MCP (streamable HTTP) at")
        .ends_with(&format!("{base}/mcp")));
    let line = served.wait_for("eve serve:   eve_");
    let key = line.trim_start_matches("eve serve:").trim().to_owned();
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let (status, head, body) = exchange(&base, "", "POST", "/mcp", ping);
    assert_eq!(status, 401, "MCP over HTTP needs a key: {body}");
    assert!(
        head.to_ascii_lowercase()
            .contains("\r\nwww-authenticate: bearer realm=\"eve\""),
        "a 401 names its challenge (RFC 6750): {head}"
    );
    let (status, head, _) = exchange(&base, "eve_wrong", "POST", "/mcp", ping);
    assert_eq!(status, 401);
    assert!(head.contains(r#"error="invalid_token""#), "{head}");
    let made = ok(
        d,
        &["keys", "create", "--name", "reader", "--scope", "read"],
    );
    let read_key = made.lines().next().unwrap().to_owned();
    let (status, _) = http(&base, &read_key, "POST", "/mcp", ping);
    assert_eq!(status, 403, "starting calls over MCP needs an operate key");

    let Ok(python) = std::env::var("EVE_TEST_MCP_PYTHON") else {
        println!("SKIPPED: the MCP Python SDK sessions against `eve mcp` and /mcp: EVE_TEST_MCP_PYTHON is not set (scripts/test-all.sh sets it)");
        return;
    };
    let store = format!("sqlite://{}", d.join("eve.db").display());
    python_mcp_session(&python, &[&format!("{base}/mcp")], Some(&key), &store);
    // stdio: the client launches `eve mcp`, as an agent host does; a store of its own.
    let stdio_store = format!("sqlite://{}", d.join("mcp.db").display());
    python_mcp_session(&python, &[EVE, "mcp"], None, &stdio_store);
    // The client's calls (deploy_approval, and remind, whose steps print) are durable runs in
    // their stores, completed.
    for db in ["eve.db", "mcp.db"] {
        let url = format!("sqlite://{}", d.join(db).display());
        let runs = ok(
            d,
            &["runs", "list", "--status", "completed", "--store", &url],
        );
        assert!(
            runs.contains("2 run(s)")
                && runs.contains("deploy_approval")
                && runs.contains("remind"),
            "{db}: {runs}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_checks_exported_journals_against_the_tools() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let store: Arc<dyn JournalStore> = Arc::new(SqliteStore::open(d.join("eve.db")).await.unwrap());
    let deploy = start(
        &*store,
        "r1",
        "deploy_approval",
        serde_json::json!({"service": "api"}),
    )
    .await;
    let remind = start(
        &*store,
        "r2",
        "remind",
        serde_json::json!({"note": "stand up", "delay": "1h"}),
    )
    .await;
    drain(&store).await;

    // Exported as a user would, one RUN.jsonl per run: both replay cleanly.
    let good = d.join("good");
    std::fs::create_dir(&good).unwrap();
    for run in [&deploy, &remind] {
        let lines = ok(d, &["journal", run.as_str(), "--json"]);
        std::fs::write(good.join(format!("{run}.jsonl")), lines).unwrap();
    }
    let out = ok(d, &["replay", "--journal", good.to_str().unwrap()]);
    assert_eq!(
        out.matches("\nok ").count() + usize::from(out.starts_with("ok ")),
        2,
        "{out}"
    );
    assert!(out.contains("tool deploy_approval"), "{out}");
    assert!(
        out.ends_with("2 journal(s): 2 replay cleanly, 0 do not\n"),
        "{out}"
    );

    // The journals as code changed under them would see them: a renamed step, a removed
    // workflow, a damaged line. Each is named; the others are still checked; exit code 1.
    let bad = d.join("bad");
    std::fs::create_dir(&bad).unwrap();
    let recorded = std::fs::read_to_string(good.join(format!("{deploy}.jsonl"))).unwrap();
    assert!(recorded.contains("\"plan_deploy\""), "{recorded}");
    std::fs::write(
        bad.join(format!("{deploy}.jsonl")),
        recorded.replace("\"plan_deploy\"", "\"plan_rollout\""),
    )
    .unwrap();
    let reminded = std::fs::read_to_string(good.join(format!("{remind}.jsonl"))).unwrap();
    let workflow = reminded
        .split("\"workflow_id\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no workflow_id in {reminded}"))
        .to_owned();
    std::fs::write(
        bad.join("missing.jsonl"),
        reminded.replace(&workflow, "gone::remind"),
    )
    .unwrap();
    std::fs::write(
        bad.join("torn.jsonl"),
        format!("{}\n{{\"seq\": 1,", reminded.lines().next().unwrap()),
    )
    .unwrap();
    std::fs::write(bad.join(format!("{remind}.jsonl")), &reminded).unwrap();
    let o = eve(d, &["replay", "--journal", bad.to_str().unwrap()]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{}", stderr(&o));
    assert!(
        stderr(&o).contains("replay: 3 of 4 journal(s) do not replay"),
        "{}",
        stderr(&o)
    );
    let line = |needle: &str| {
        out.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle}: {out}"))
            .to_owned()
    };
    let diverged = line(&format!("{deploy}.jsonl"));
    assert!(
        diverged.starts_with("FAILED")
            && diverged.contains("[EVE-ND-001] non-determinism at command 0"),
        "{diverged}"
    );
    assert!(
        diverged.contains("plan_rollout") && diverged.contains("plan_deploy"),
        "{diverged}"
    );
    let missing = line("missing.jsonl");
    assert!(
        missing.starts_with("MISSING") && missing.contains("gone::remind"),
        "{missing}"
    );
    assert!(line("torn.jsonl:2:").starts_with("INVALID"), "{out}");
    assert!(line(&format!("{remind}.jsonl")).starts_with("ok "), "{out}");

    fails(
        d,
        &["replay", "--journal", "nowhere.jsonl"],
        2,
        "does not exist",
    );
}

/// The last line of `out`, parsed as JSON.
fn last_json(out: &str) -> serde_json::Value {
    let line = out.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {out}"))
}

#[test]
fn call_purge_and_serve_retain_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Clear errors before anything starts.
    fails(
        d,
        &["call", "nope", "--input", "{}"],
        2,
        "unknown tool \"nope\"",
    );
    fails(
        d,
        &["call", "deploy", "--input", "{not json"],
        2,
        "--input is not JSON",
    );
    fails(d, &["call", "deploy", "--input", "[1]"], 2, "JSON object");
    fails(
        d,
        &["call", "deploy", "--input", r#"{"service": 7}"#],
        2,
        "cannot call deploy",
    );

    // A default-execution call, run by a worker in the same process, awaited to its result.
    let input = r#"{"service": "api", "first_deadline": "1s", "second_deadline": "1s"}"#;
    let args = [
        "call",
        "deploy",
        "--input",
        input,
        "--session",
        "s9",
        "--call-id",
        "c1",
    ];
    let waited = ok(d, &[&args[..], &["--wait", "60s", "--worker"]].concat());
    let first: serde_json::Value = serde_json::from_str(waited.lines().next().unwrap()).unwrap();
    assert_eq!(first["created"], true, "{waited}");
    let run = first["run"].as_str().unwrap().to_owned();
    let result = last_json(&waited);
    assert_eq!(result["run"], run.as_str(), "{waited}");
    assert_eq!(result["status"], "completed", "{waited}");
    assert_eq!(
        result["output"],
        serde_json::json!({"deployed": false, "reason": "timed out"}),
        "{waited}"
    );
    // The same session and call id again: the same run, not a new one.
    let again = last_json(&ok(d, &args));
    assert_eq!(
        (again["run"].as_str(), &again["created"]),
        (Some(run.as_str()), &serde_json::json!(false))
    );
    // A background call nobody runs: --wait gives up with one line; the run keeps going.
    let remind = ok(
        d,
        &[
            "call",
            "remind",
            "--input",
            r#"{"note": "n", "delay": "1h"}"#,
        ],
    );
    let live = last_json(&remind)["run"].as_str().unwrap().to_owned();
    fails(
        d,
        &[
            "call",
            "remind",
            "--input",
            r#"{"note": "n", "delay": "1h"}"#,
            "--call-id",
            "c2",
            "--wait",
            "300ms",
        ],
        1,
        "has not ended after 300ms",
    );

    // Purge: nothing ended an hour ago; everything that ended before now goes, live runs stay.
    assert!(ok(d, &["runs", "purge", "--ended-before", "1h"]).contains("purged 0 run(s)"));
    let purged = ok(d, &["runs", "purge", "--ended-before", "0s"]);
    assert!(purged.contains("purged 1 run(s)"), "{purged}");
    fails(d, &["runs", "show", &run], 1, "not found");
    let listed = ok(d, &["runs", "list"]);
    assert!(
        listed.contains(&live) && !listed.contains(&run) && listed.contains("2 run(s)"),
        "{listed}"
    );
    assert!(ok(d, &["runs", "purge", "--ended-before", "0s"]).contains("purged 0 run(s)"));
    let bad = eve(d, &["runs", "purge", "--ended-before", "soon"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));

    // eve serve --retain purges at start and says how many.
    ok(
        d,
        &[&args[..2], &["--input", input, "--wait", "--worker"]].concat(),
    );
    std::thread::sleep(Duration::from_millis(20));
    let mut served = Served::start(d, &["--retain", "10ms", "--insecure-no-auth"]);
    let line = served.wait_for("retention");
    assert!(line.contains("purged 1 run(s)"), "{line}");
    drop(served);
    assert!(ok(d, &["runs", "show", &live]).contains("running"));

    // eve mcp --retain too, reporting on stderr: stdout stays the protocol's (stdin is closed,
    // so after the purge it stops: no client ever said hello).
    ok(
        d,
        &[&args[..2], &["--input", input, "--wait", "--worker"]].concat(),
    );
    std::thread::sleep(Duration::from_millis(20));
    let mcp = eve(d, &["mcp", "--retain", "10ms"]);
    assert!(
        stderr(&mcp).contains("eve mcp: retention 10ms: purged 1 run(s)"),
        "{}",
        stderr(&mcp)
    );
    assert!(stdout(&mcp).is_empty(), "stdout: {}", stdout(&mcp));
    assert!(ok(d, &["runs", "show", &live]).contains("running"));
}

/// Three of the seed's examples driven end to end by the official MCP Python SDK against
/// `eve serve` (see `tests/python/seed_examples.py`): `progress_then_ask` answered through
/// elicitation, `render_video` completed by the farm's POST to its webhook URL, and
/// `render_cleanup` cancelled over HTTP while the call blocks, its cleanup step run, and
/// `security_review`'s `reviewer` subagent served by the client's sampling callback (one
/// recorded agent result; the review's findings in the call's result).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_examples_through_the_python_mcp_sdk() {
    let Ok(python) = std::env::var("EVE_TEST_MCP_PYTHON") else {
        println!("SKIPPED: the seed's examples through the MCP Python SDK: EVE_TEST_MCP_PYTHON is not set (scripts/test-all.sh sets it)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let farm = d.to_str().unwrap().to_owned();
    let mut served = Served::start_env(d, "127.0.0.1:0", &[], &[("RENDER_FARM_DIR", &farm)]);
    let base = served.base();
    let line = served.wait_for("eve serve:   eve_");
    let key = line.trim_start_matches("eve serve:").trim().to_owned();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/seed_examples.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(&base)
        .env("EVE_MCP_BEARER", &key)
        .env("RENDER_FARM_DIR", &farm)
        .output()
        .expect("run the Python client");
    let text = stdout(&out);
    assert!(
        out.status.success(),
        "the Python client failed: {text}{}",
        stderr(&out)
    );
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let example = |name: &str| {
        lines
            .iter()
            .find(|s| s["example"] == name)
            .unwrap_or_else(|| panic!("no {name}: {text}"))
            .clone()
    };
    let names = example("tools")["names"].clone();
    for tool in [
        "progress_then_ask",
        "security_review",
        "render_cleanup",
        "render_video",
    ] {
        assert!(
            names.as_array().unwrap().contains(&serde_json::json!(tool)),
            "{names}"
        );
    }
    let ask = example("progress_then_ask");
    assert_eq!(ask["is_error"], false, "{ask}");
    assert_eq!(
        ask["asked"][0]["options"],
        serde_json::json!(["approve", "cancel"])
    );
    assert!(
        ask["asked"][0]["message"]
            .as_str()
            .unwrap()
            .contains("Continue?"),
        "{ask}"
    );
    assert_eq!(ask["structured"]["answer"]["optionId"], "approve", "{ask}");
    let render = example("render_video");
    assert_eq!(render["farm_status"], 202, "{render}");
    assert_eq!(render["is_error"], false, "{render}");
    assert_eq!(
        render["structured"],
        serde_json::json!({"url": "https://cdn.example/py1.mp4"}),
        "{render}"
    );
    let cleanup = example("render_cleanup");
    assert_eq!(cleanup["cancel_status"], 202, "{cleanup}");
    assert_eq!(cleanup["is_error"], true, "{cleanup}");
    assert_eq!(cleanup["status"], "cancelled", "{cleanup}");
    assert_eq!(
        cleanup["steps"],
        serde_json::json!(["submit_render", "abort_render"]),
        "{cleanup}"
    );
    // security_review: the `reviewer` subagent served by the client's sampling callback.
    let review = example("security_review");
    assert_eq!(review["is_error"], false, "{review}");
    let sampled = review["sampled"].as_array().unwrap();
    assert_eq!(sampled.len(), 1, "one sampling request: {review}");
    assert_eq!(sampled[0]["target"], "reviewer", "{review}");
    assert_eq!(sampled[0]["key"], "security-review", "{review}");
    assert_eq!(
        sampled[0]["schema"],
        eve_examples::security_review::review_schema(),
        "{review}"
    );
    assert!(
        sampled[0]["message"]
            .as_str()
            .unwrap()
            .contains("roll out billing to 3 regions"),
        "{review}"
    );
    assert_eq!(review["asked"], serde_json::json!([]), "{review}");
    // The review approved, so the deploy ran, and its finding is the call's.
    let finding = "reviewed: roll out billing to 3 regions, 10% at a time";
    assert_eq!(
        review["structured"],
        serde_json::json!({
            "deployed": true,
            "url": "https://deploy.example/billing/1",
            "findings": [finding],
        }),
        "{review}"
    );
    assert_eq!(review["status"], "completed", "{review}");
    assert_eq!(
        review["steps"],
        serde_json::json!(["plan_deploy", "apply_deploy"]),
        "{review}"
    );
    // Wire mode: the call is journalled as one input request, answered once with the review.
    let requests = review["agent_requests"].as_array().unwrap();
    assert_eq!(requests.len(), 1, "one agent request: {review}");
    assert_eq!(requests[0]["key"], "security-review", "{review}");
    assert_eq!(requests[0]["target"], "reviewer", "{review}");
    let results = review["agent_results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "one recorded agent result: {review}");
    assert_eq!(
        results[0],
        serde_json::json!({"output": {"approved": true, "findings": [finding]}}),
        "{review}"
    );
    assert_eq!(
        review["host_agent_events"],
        serde_json::json!([]),
        "no Rust agent host: {review}"
    );
}

/// The other seven examples of the registry through `eve serve`'s MCP endpoint, driven by the
/// official MCP Python SDK (`tests/python/seed_examples_more.py`): each blocking (asks answered
/// through elicitation, one of them after its deadline paged on-call; hooks delivered by `eve
/// hook resume`), the background ones and the deadline versions also in task mode (`tasks/get`,
/// `tasks/update`), timers shortened by the examples' own inputs (`delay`, `first_deadline`,
/// `second_deadline`).
#[test]
fn seed_examples_more_through_the_python_mcp_sdk() {
    let Ok(python) = std::env::var("EVE_TEST_MCP_PYTHON") else {
        println!("SKIPPED: the seed's other examples through the MCP Python SDK: EVE_TEST_MCP_PYTHON is not set (scripts/test-all.sh sets it)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut served = Served::start(d, &[]);
    let base = served.base();
    let line = served.wait_for("eve serve:   eve_");
    let key = line.trim_start_matches("eve serve:").trim().to_owned();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/seed_examples_more.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(&base)
        .env("EVE_MCP_BEARER", &key)
        .env("EVE_BIN", EVE)
        .env("EVE_DIR", d)
        .env_remove("EVE_STORE_URL")
        .output()
        .expect("run the Python client");
    let text = stdout(&out);
    assert!(
        out.status.success(),
        "the Python client failed: {text}{}",
        stderr(&out)
    );
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let example = |name: &str, mode: &str| {
        let found = lines
            .iter()
            .find(|s| s["example"] == name && s["mode"] == mode)
            .unwrap_or_else(|| panic!("no {name} ({mode}): {text}"))
            .clone();
        assert_eq!(found["is_error"], false, "{found}");
        found
    };
    use serde_json::json;

    // Blocking calls. A background tool answers its receipt at once; its end is pushed.
    let remind = example("remind", "blocking");
    assert_eq!(remind["structured"]["status"], "working", "{remind}");
    let ended = remind["ended"]["message"].as_str().unwrap();
    assert!(ended.contains("Reminder: tea"), "{remind}");
    let progress = example("remind_with_progress", "blocking");
    assert_eq!(progress["structured"]["status"], "working", "{progress}");
    let ended = progress["ended"]["message"].as_str().unwrap();
    assert!(ended.contains("stretch"), "{progress}");
    let approval = example("deploy_approval", "blocking");
    assert_eq!(
        approval["asked"],
        json!([{"message": "Deploy api?\n\nroll out api to 3 regions, 10% at a time", "options": ["approve", "cancel"]}])
    );
    assert_eq!(
        approval["structured"],
        json!({"deployed": true, "url": "https://deploy.example/api/1"})
    );
    let deadline = example("deploy_deadline", "blocking");
    assert_eq!(
        deadline["asked"],
        json!([{"message": "Deploy db?", "options": ["approve", "cancel"]}])
    );
    assert_eq!(
        deadline["structured"],
        json!({"deployed": true, "url": "https://deploy.example/db/1"})
    );
    let escalated = example("deploy_deadline", "escalated");
    assert_eq!(
        escalated["asked"],
        json!([{"message": "Deploy esc?", "options": ["approve", "cancel"]}])
    );
    assert_eq!(
        escalated["steps"],
        json!(["plan_deploy", "page_on_call", "apply_deploy"])
    );
    assert_eq!(
        escalated["structured"],
        json!({"deployed": true, "url": "https://deploy.example/esc/1"})
    );
    // A background tool's ask: pushed as a notice saying where to answer (answered over HTTP).
    let refund = example("refund_order", "blocking");
    assert_eq!(refund["structured"]["status"], "working", "{refund}");
    let notice = refund["notice"].as_str().unwrap();
    assert!(
        notice.contains("Refund $12.5 on order o1?") && notice.contains("/answer/"),
        "the notice names the ask and an answer link: {notice}"
    );
    let ended = refund["ended"]["message"].as_str().unwrap();
    assert!(
        ended.contains(r#""refunded":true"#) && ended.contains("rf-o1-1250"),
        "{refund}"
    );
    let deploy = example("deploy", "blocking");
    assert_eq!(deploy["hook_rc"], 0, "{deploy}");
    assert!(
        deploy["hook_out"]
            .as_str()
            .unwrap()
            .contains("delivered to hook \"approve-web\""),
        "{deploy}"
    );
    assert_eq!(deploy["steps"], json!(["plan_deploy", "apply_deploy"]));
    assert_eq!(
        deploy["structured"],
        json!({"deployed": true, "url": "https://deploy.example/123"})
    );
    let render = example("render_hook", "blocking");
    assert_eq!(render["hook_rc"], 0, "{render}");
    assert_eq!(
        render["structured"],
        json!({"job": "job-py3", "url": "https://cdn.example/py3.mp4"})
    );

    // Task mode: a receipt at once, then `tasks/get` until the task ends.
    for name in [
        "remind",
        "remind_with_progress",
        "deploy_deadline",
        "deploy",
        "refund_order",
    ] {
        let task = example(name, "task");
        assert_eq!(task["receipt_type"], "task", "{task}");
        assert_eq!(task["receipt_status"], "working", "{task}");
        assert_eq!(task["status"], "completed", "{task}");
    }
    let remind = example("remind", "task");
    assert_eq!(remind["structured"], json!({"reminder": "Reminder: tea"}));
    let progress = example("remind_with_progress", "task");
    assert_eq!(progress["messages"], json!(["Reminder scheduled for 1s."]));
    assert_eq!(progress["structured"], json!({"reminder": "stretch"}));
    let deadline = example("deploy_deadline", "task");
    assert_eq!(deadline["steps"], json!(["plan_deploy", "page_on_call"]));
    assert_eq!(deadline["withdrawn"], 1, "{deadline}");
    assert_eq!(
        deadline["structured"],
        json!({"deployed": false, "reason": "timed out"})
    );
    let deploy = example("deploy", "task");
    assert_eq!(deploy["steps"], json!(["plan_deploy", "page_on_call"]));
    assert_eq!(
        deploy["structured"],
        json!({"deployed": false, "reason": "timed out"})
    );
    let refund = example("refund_order", "task");
    assert_eq!(
        refund["asked"],
        json!({"message": "Refund $3 on order o2?", "options": ["approve", "deny"]})
    );
    assert_eq!(refund["structured"], json!({"refunded": false}));
}
