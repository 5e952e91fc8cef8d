//! Postgres goes away under a running server and worker, in the middle of a burst of calls:
//! restarts (fast and immediate), `pg_terminate_backend` of eve's connections, a partition
//! longer than the pool's acquire timeout, and connections cut right after a `COMMIT` was sent,
//! before its reply (the ambiguous commit). The clients retry what they are told to retry (503s,
//! dropped connections) with the same keys; afterwards every call settled exactly once — one
//! run per call, each step, answer and webhook payload once in the journals — the worker and
//! the LISTEN connection came back, and the server process was never restarted.
//!
//! The cluster is private (made with `initdb`, driven with `pg_ctl`, from `EVE_TEST_PG_BIN` or
//! `/usr/lib/postgresql/*/bin`); eve reaches it through a TCP proxy in this test that cuts,
//! stalls and watches connections. Without the binaries the test prints why it was skipped.

mod common;

use common::*;
use eve_core::{Event, JournalStore, RunQuery, RunStatus, SessionId};
use eve_storage_postgres::{PostgresOptions, PostgresStore};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The `application_name` of eve's connections in this test (what `pg_terminate_backend`
/// picks).
const APP: &str = "eve-faults";

/// Calls of each kind in one burst: this many tool calls of `deploy` (a step, a question, a
/// step) and of `collect` (a webhook), with an answer and a webhook delivery each.
const UNITS: usize = 12;

/// The pool's acquire timeout: the partition lasts longer.
const ACQUIRE: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------------
// The private cluster.

fn pg_bin() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("EVE_TEST_PG_BIN") {
        return Some(PathBuf::from(dir)).filter(|d| d.join("initdb").exists());
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|d| d.join("initdb").exists() && d.join("pg_ctl").exists())
        .collect();
    found.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found.pop()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// A PostgreSQL server of its own: started by `initdb` + `pg_ctl` in a temp dir (as the
/// `postgres` user when the test runs as root, since Postgres refuses to run as root).
struct Cluster {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Cluster {
    fn command(&self, tool: &str) -> Command {
        command(&self.bin.join(tool))
    }

    fn start(bin: PathBuf) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        if is_root() {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(ok.success(), "chown the cluster's dir to postgres");
        }
        let data = dir.path().join("data");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let c = Self {
            bin,
            data,
            port,
            _dir: dir,
        };
        run(c
            .command("initdb")
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "-D"])
            .arg(&c.data));
        let opts = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -k {} -c max_connections=60",
            c._dir.path().display()
        );
        run(c
            .command("pg_ctl")
            .arg("-D")
            .arg(&c.data)
            .arg("-l")
            .arg(c._dir.path().join("log"))
            .args(["-o", &opts, "-w", "start"]));
        c
    }

    /// `pg_ctl restart -m {mode}` (`fast` or `immediate`), waiting until it accepts again.
    fn restart(&self, mode: &str) {
        // With a log file: a postmaster started without one would hold this command's output
        // pipe open for its whole life.
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(self._dir.path().join("log"))
            .args(["-m", mode, "-w", "restart"]));
    }

    /// Terminates every backend of eve's connections; returns how many.
    fn terminate_eve(&self) -> u32 {
        let out = Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-Atc"])
            .arg(format!(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '{APP}'"
            ))
            .output()
            .expect("psql");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }

    fn url(&self, port: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/postgres")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "stop"])
            .output();
    }
}

fn command(tool: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(tool);
        c
    } else {
        Command::new(tool)
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run a PostgreSQL tool");
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------------------------------------
// The fault-injecting TCP proxy between eve and the cluster.

#[derive(Default)]
struct ProxyState {
    /// While set, no byte moves either way on any connection (a partition).
    stalled: tokio::sync::watch::Sender<bool>,
    /// How many connections to cut right after a `COMMIT` was sent and carried out, before its
    /// reply reaches eve.
    commit_cuts: AtomicU32,
    /// How many were cut so.
    cut_after_commit: AtomicU32,
    /// The tasks of the live connections (aborted to cut them).
    conns: Mutex<Vec<tokio::task::AbortHandle>>,
}

struct Proxy {
    addr: SocketAddr,
    state: Arc<ProxyState>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(ProxyState::default());
        let st = state.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let st2 = st.clone();
                let task = tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    pump(st2, client, server).await;
                });
                let mut conns = st.conns.lock().unwrap();
                conns.retain(|c| !c.is_finished());
                conns.push(task.abort_handle());
            }
        });
        Self { addr, state }
    }

    fn stall(&self, on: bool) {
        self.state.stalled.send_replace(on);
    }

    fn cut_next_commits(&self, n: u32) {
        self.state.commit_cuts.store(n, Ordering::SeqCst);
    }

    /// Drops every connection (eve opens new ones, which prepare their statements anew).
    fn cut_all(&self) {
        for c in self.state.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    fn commits_cut(&self) -> u32 {
        self.state.cut_after_commit.load(Ordering::SeqCst)
    }
}

/// Whether the client's bytes (protocol messages, whole in the chunk as sqlx sends them) run a
/// write: a simple query or a prepared statement (`statements`: names seen parsed on this
/// connection) that inserts, updates, deletes, notifies or commits.
fn writes(statements: &mut std::collections::HashMap<Vec<u8>, bool>, mut buf: &[u8]) -> bool {
    fn is_write(sql: &[u8]) -> bool {
        let sql = String::from_utf8_lossy(sql).to_ascii_uppercase();
        ["INSERT", "UPDATE", "DELETE", "COMMIT", "PG_NOTIFY"]
            .iter()
            .any(|w| sql.contains(w))
    }
    fn cstr(b: &[u8]) -> (&[u8], &[u8]) {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        (&b[..end], b.get(end + 1..).unwrap_or(&[]))
    }
    let mut write = false;
    while buf.len() >= 5 {
        // Startup and SSL requests carry no type byte.
        let (kind, body_at) = if buf[0] == 0 { (0, 0) } else { (buf[0], 1) };
        let len = u32::from_be_bytes(buf[body_at..body_at + 4].try_into().unwrap()) as usize;
        let Some(body) = buf.get(body_at + 4..body_at + len) else {
            break;
        };
        match kind {
            b'Q' => write |= is_write(cstr(body).0),
            b'P' => {
                let (name, rest) = cstr(body);
                statements.insert(name.to_vec(), is_write(cstr(rest).0));
                write |= is_write(cstr(rest).0);
            }
            b'B' => {
                let (_portal, rest) = cstr(body);
                write |= statements.get(cstr(rest).0).copied().unwrap_or(false);
            }
            _ => {}
        }
        buf = &buf[body_at + len..];
    }
    write
}

async fn unstalled(st: &ProxyState) {
    let mut rx = st.stalled.subscribe();
    let _ = rx.wait_for(|s| !*s).await;
}

/// Moves bytes both ways until either side closes; stalls while the proxy is partitioned; when
/// a cut is armed, cuts the connection once the server committed a transaction, before the
/// client learns it (the client's COMMIT was sent; its reply is lost).
async fn pump(st: Arc<ProxyState>, client: TcpStream, server: TcpStream) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    // Whether the client sent a write (or a COMMIT) whose reply has not come back yet.
    let write_sent = Arc::new(AtomicBool::new(false));
    let mut statements = std::collections::HashMap::new();
    let up = {
        let st = st.clone();
        let write_sent = write_sent.clone();
        async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match cr.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                unstalled(&st).await;
                if writes(&mut statements, &buf[..n]) {
                    write_sent.store(true, Ordering::SeqCst);
                }
                if sw.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            unstalled(&st).await;
            // `ReadyForQuery` with the connection idle (`I`: no transaction open) after a write
            // or a COMMIT: the write is committed (outside BEGIN it commits by itself); when a
            // cut is armed, its reply is dropped with the connection.
            let committed = buf[..n].windows(6).any(|w| w == b"Z\0\0\0\x05I");
            if committed
                && write_sent.swap(false, Ordering::SeqCst)
                && st
                    .commit_cuts
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |k| k.checked_sub(1))
                    .is_ok()
            {
                st.cut_after_commit.fetch_add(1, Ordering::SeqCst);
                return;
            }
            if cw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

// ---------------------------------------------------------------------------------------------
// The burst of calls, each retried by its client until it settles.

/// Sends the request `make` builds until the answer is neither a dropped connection nor a 503
/// (waiting `Retry-After`, which every 503 must carry); returns the status and body.
async fn settle(what: &str, make: impl Fn() -> reqwest::RequestBuilder) -> (u16, Value) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} never settled"
        );
        match make().timeout(Duration::from_secs(30)).send().await {
            Ok(r) if r.status() == 503 => {
                let wait = r
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("{what}: a 503 without Retry-After"));
                let body: Value = r.json().await.unwrap_or_default();
                let message = body["message"].as_str().unwrap_or_default();
                assert!(
                    !message.contains("postgres") && !message.contains("line "),
                    "{what}: the store's wording reached the caller: {message}"
                );
                tokio::time::sleep(Duration::from_secs(wait.min(1))).await;
            }
            Ok(r) => {
                let status = r.status().as_u16();
                let body = r.json().await.unwrap_or(Value::Null);
                return (status, body);
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

struct Burst {
    base: String,
    client: reqwest::Client,
    /// Calls that have started (a fault is injected once some have).
    started: AtomicUsize,
}

impl Burst {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// One unit: a `deploy` call answered over HTTP, and a `collect` call fed by a webhook.
    async fn unit(&self, tag: &str, i: usize) {
        let session = format!("{tag}-{i}");
        let start = |tool: &str, input: Value| {
            let (url, session) = (
                self.url(&format!("/v1/tools/{tool}/calls")),
                session.clone(),
            );
            let tool = tool.to_owned();
            let client = self.client.clone();
            async move {
                let (status, body) = settle(&format!("start {tool} in {session}"), || {
                    client.post(&url).json(
                        &json!({ "session": session, "callId": tool, "input": input.clone() }),
                    )
                })
                .await;
                assert!(
                    status == 201 || status == 200,
                    "start {tool}: {status} {body}"
                );
            }
        };
        let key = format!("{tag}-hook-{i}");
        let announced = expect_url(&key);
        start("deploy", json!({ "service": format!("svc-{i}") })).await;
        self.started.fetch_add(1, Ordering::SeqCst);
        start("collect", json!({ "key": key, "count": 1 })).await;

        // The question, once the worker asked it: answered (retried with the same answer).
        let deadline = tokio::time::Instant::now() + WAIT;
        let request = loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{session}: no question"
            );
            let (status, body) = settle("pending requests", || {
                self.client
                    .get(self.url(&format!("/v1/sessions/{session}/requests")))
            })
            .await;
            assert_eq!(status, 200, "{body}");
            if let Some(id) = body["requests"][0]["requestId"].as_str() {
                break id.to_owned();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let (status, body) = settle("answer", || {
            self.client
                .post(self.url(&format!("/v1/requests/{request}/answer")))
                .json(&json!({ "optionId": "approve" }))
        })
        .await;
        assert_eq!(status, 200, "answer {request}: {body}");

        // The webhook, once announced: delivered under one Idempotency-Key.
        let path = tokio::time::timeout(WAIT, announced)
            .await
            .expect("the webhook is announced")
            .expect("announced");
        let (status, body) = settle("webhook", || {
            self.client
                .post(self.url(&path))
                .header("idempotency-key", format!("{key}-delivery"))
                .json(&json!({ "unit": i }))
        })
        .await;
        assert_eq!(status, 202, "webhook {path}: {body}");
    }
}

/// Waits until every run of the burst `tag` ended, then checks from the journals that each call
/// made one run and that each step, answer and payload is there exactly once.
async fn check(direct: &PostgresStore, tag: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    for i in 0..UNITS {
        let session = SessionId::new(format!("{tag}-{i}"));
        let query = RunQuery {
            session: Some(session.clone()),
            limit: 100,
            ..RunQuery::default()
        };
        let runs = loop {
            let runs = direct.list_runs(&query).await.expect("list runs");
            if runs.len() == 2 && runs.iter().all(|r| r.status.is_terminal()) {
                break runs;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{session}: runs did not end: {:?}",
                runs.iter().map(|r| (&r.tool, r.status)).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        for run in runs {
            assert_eq!(run.status, RunStatus::Completed, "{session} {}", run.tool);
            let j = journal(
                &(Arc::new(direct.clone()) as Arc<dyn JournalStore>),
                &run.run_id,
            )
            .await;
            let step = |name: &str| {
                count(
                    &j,
                    |e| matches!(e, Event::StepCompleted { name: n, .. } if n.as_str() == name),
                )
            };
            let ended = count(&j, |e| matches!(e, Event::RunCompleted { .. }));
            assert_eq!(ended, 1, "{session} {}: {j:?}", run.tool);
            match run.tool.as_str() {
                "deploy" => {
                    assert_eq!(step("plan_deploy"), 1, "{session}: {j:?}");
                    assert_eq!(step("apply_deploy"), 1, "{session}: {j:?}");
                    let answers = count(&j, |e| matches!(e, Event::InputAnswered { .. }));
                    assert_eq!(answers, 1, "{session}: {j:?}");
                }
                "collect" => {
                    assert_eq!(step("announce"), 1, "{session}: {j:?}");
                    let got = count(&j, |e| matches!(e, Event::HookReceived { .. }));
                    assert_eq!(got, 1, "{session}: {j:?}");
                }
                other => panic!("unexpected tool {other}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_goes_away_in_the_middle_of_a_burst_and_nothing_is_lost() {
    let Some(bin) = pg_bin() else {
        println!(
            "skipped: postgres_goes_away_in_the_middle_of_a_burst_and_nothing_is_lost: no \
             PostgreSQL binaries (initdb, pg_ctl) under EVE_TEST_PG_BIN or /usr/lib/postgresql/*/bin; \
             install the postgresql package to run it"
        );
        return;
    };
    let cluster = tokio::task::spawn_blocking(move || Cluster::start(bin))
        .await
        .unwrap();
    let cluster = Arc::new(cluster);
    let proxy = Proxy::start(format!("127.0.0.1:{}", cluster.port).parse().unwrap()).await;
    let options = PostgresOptions {
        schema: "eve_faults".into(),
        pool_size: 6,
        connect_timeout: ACQUIRE,
        application_name: APP.into(),
        ..PostgresOptions::default()
    };
    let pg = PostgresStore::connect_with(&cluster.url(proxy.addr.port()), options.clone())
        .await
        .expect("connect through the proxy");
    // A second handle straight to the cluster: the test's own eyes (journals, NOTIFY).
    let direct = PostgresStore::connect_with(
        &cluster.url(cluster.port),
        PostgresOptions {
            application_name: "eve-faults-checker".into(),
            ..options
        },
    )
    .await
    .expect("connect directly");
    let store: Arc<dyn JournalStore> = Arc::new(pg.clone());
    let server =
        TestServer::start_with(store.clone(), |_| {}, |s| s.with_registry(registry())).await;
    let worker = worker(store.clone()).await;
    let burst = Arc::new(Burst {
        base: server.base.clone(),
        client: reqwest::Client::new(),
        started: AtomicUsize::new(0),
    });

    let faults = [
        "restart-fast",
        "restart-immediate",
        "terminate",
        "partition",
        "commit-cut",
    ];
    for fault in faults {
        burst.started.store(0, Ordering::SeqCst);
        if fault == "commit-cut" {
            proxy.cut_all();
            proxy.cut_next_commits(6);
        }
        let units: Vec<_> = (0..UNITS)
            .map(|i| {
                let b = burst.clone();
                tokio::spawn(async move { b.unit(fault, i).await })
            })
            .collect();
        // In the middle of the burst: once a third of the calls started.
        let deadline = tokio::time::Instant::now() + WAIT;
        while burst.started.load(Ordering::SeqCst) < UNITS / 3 {
            assert!(tokio::time::Instant::now() < deadline, "{fault}: no start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!("{fault}: injecting");
        let c = cluster.clone();
        match fault {
            "restart-fast" => tokio::task::spawn_blocking(move || c.restart("fast"))
                .await
                .unwrap(),
            "restart-immediate" => tokio::task::spawn_blocking(move || c.restart("immediate"))
                .await
                .unwrap(),
            "terminate" => {
                let n = tokio::task::spawn_blocking(move || c.terminate_eve())
                    .await
                    .unwrap();
                assert!(n > 0, "eve's connections were terminated");
            }
            "partition" => {
                proxy.stall(true);
                // While partitioned, /readyz says so (within its own bound of 1 s).
                let readyz = reqwest::Client::new()
                    .get(server.url("/readyz"))
                    .send()
                    .await
                    .expect("/readyz answers during a partition");
                assert_eq!(readyz.status(), 503);
                tokio::time::sleep(ACQUIRE * 2).await;
                proxy.stall(false);
            }
            "commit-cut" => {}
            _ => unreachable!(),
        }
        println!("{fault}: injected; waiting for the burst");
        for u in units {
            u.await
                .unwrap_or_else(|e| panic!("{fault}: a unit failed: {e}"));
        }
        println!("{fault}: burst done; checking");
        check(&direct, fault).await;
        if fault == "commit-cut" {
            assert!(
                proxy.commits_cut() > 0,
                "at least one connection was cut between its COMMIT and the reply"
            );
        }
        println!(
            "{fault}: {UNITS} deploy and {UNITS} collect calls, their answers and webhook \
             deliveries settled once each ({} commits cut so far)",
            proxy.commits_cut()
        );
    }

    // The server serves, and its LISTEN connection is back: a run another process creates
    // wakes this one.
    let ready = reqwest::get(server.url("/readyz")).await.unwrap();
    assert_eq!(ready.status(), 200);
    let mut wake = pg.subscribe().await.expect("subscribe");
    let notified = Arc::new(AtomicBool::new(false));
    let n2 = notified.clone();
    let waiter = tokio::spawn(async move {
        if wake.notified().await.is_ok() {
            n2.store(true, Ordering::SeqCst);
        }
    });
    start(
        &(Arc::new(direct.clone()) as Arc<dyn JournalStore>),
        "after-faults",
        "c-1",
        "deploy",
        json!({ "service": "late" }),
    )
    .await;
    tokio::time::timeout(WAIT, waiter)
        .await
        .expect("NOTIFY reaches the server's store again")
        .unwrap();
    assert!(notified.load(Ordering::SeqCst));
    worker.shutdown().await;
    server.stop().await;
}
