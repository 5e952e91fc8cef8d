//! MCP over stdio with real clients: rmcp's client and the official Python SDK drive eve-mcp in
//! a child process on a temp SQLite file; the server is killed with SIGKILL while a task waits
//! for input, restarted, and the task is answered and completes.
//!
//! This target has no libtest harness: `main` is both the test and, when [`SERVE_VAR`] is set,
//! the server process the test spawns (it re-invokes its own executable), so stdout carries
//! nothing but MCP. The Python client runs when `EVE_TEST_MCP_PYTHON` names a Python with the
//! `mcp` package (scripts/test-all.sh sets it up); otherwise that part prints that it skipped.

mod common;

use common::*;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, GetTaskParams, TaskStatus, UpdateTaskParams,
};
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::json;
use std::path::Path;
use std::process::Stdio;

/// Set in the server process: the SQLite file to serve over stdio.
const SERVE_VAR: &str = "EVE_MCP_TEST_SERVE";
/// Set in the stdio server process: a file it writes its pid to (the Python client kills it).
const PID_FILE_VAR: &str = "EVE_MCP_TEST_PID_FILE";
/// Set in the server process: the SQLite file to serve over streamable HTTP on 127.0.0.1:0 (the
/// process prints its URL, then serves until stdin closes).
const SERVE_HTTP_VAR: &str = "EVE_MCP_TEST_SERVE_HTTP";
/// Set in the server process: its notice interval in milliseconds (default 15 s).
const NOTICE_MS_VAR: &str = "EVE_MCP_TEST_NOTICE_MS";

/// The test server over `db`, with the notice interval of [`NOTICE_MS_VAR`] when it is set.
async fn test_server(
    db: &Path,
) -> (
    eve_mcp::McpServer,
    std::sync::Arc<dyn eve_core::JournalStore>,
    eve_core::engine::WorkerHandle,
) {
    // Each process its own worker id, as `eve mcp` does: a host may launch several at once.
    let store: std::sync::Arc<dyn eve_core::JournalStore> = std::sync::Arc::new(
        eve_storage_sqlite::SqliteStore::open(db)
            .await
            .expect("open store"),
    );
    let worker = eve_core::engine::Worker::new(
        store.clone(),
        registry(),
        std::sync::Arc::new(eve_core::engine::SystemClock),
        eve_core::engine::WorkerConfig {
            id: Some(eve_core::WorkerId::new(format!(
                "mcp-test-{}",
                std::process::id()
            ))),
            poll_interval: std::time::Duration::from_millis(50),
            ..eve_core::engine::WorkerConfig::default()
        },
    )
    .await
    .expect("register worker");
    let mcp = eve_mcp::McpServer::new(store.clone(), std::sync::Arc::new(registry()))
        .with_worker(worker.clone());
    let worker = worker.spawn();
    let mcp = match std::env::var(NOTICE_MS_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(ms) => mcp.with_config(eve_mcp::McpConfig {
            notice_interval: std::time::Duration::from_millis(ms),
            ..eve_mcp::McpConfig::default()
        }),
        None => mcp,
    };
    (mcp, store, worker)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if let Ok(db) = std::env::var(SERVE_VAR) {
        if let Ok(file) = std::env::var(PID_FILE_VAR) {
            std::fs::write(file, std::process::id().to_string()).expect("write the pid file");
        }
        rt.block_on(async {
            let (mcp, _store, worker) = test_server(Path::new(&db)).await;
            eve_mcp::serve_stdio(mcp).await.expect("serve stdio");
            worker.shutdown().await;
        });
        return;
    }
    if let Ok(db) = std::env::var(SERVE_HTTP_VAR) {
        rt.block_on(async {
            let (mcp, _store, worker) = test_server(Path::new(&db)).await;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            println!("http://{}/mcp", listener.local_addr().unwrap());
            let app = axum::Router::new().nest_service("/mcp", eve_mcp::router(mcp));
            let stdin_closed = async {
                use tokio::io::AsyncReadExt;
                let _ = tokio::io::stdin().read_to_end(&mut Vec::new()).await;
            };
            axum::serve(listener, app)
                .with_graceful_shutdown(stdin_closed)
                .await
                .unwrap();
            worker.shutdown().await;
        });
        return;
    }
    rt.block_on(async {
        sigkill_while_a_task_waits_then_answer_after_restart().await;
        println!("ok: stdio, rmcp client: list, task, SIGKILL while input_required, restart, answer, completed");
        raw_json_rpc_over_stdio().await;
        println!("ok: stdio, raw JSON-RPC: -32700/-32600 with id null, -32602 naming the field, too deep and too long answered, second initialize refused, nothing started");
        sigkill_while_sampling_then_the_same_call_after_restart().await;
        println!("ok: stdio, rmcp client: a subagent call pending as sampling/createMessage (a blocking call's request; a task's inputRequests), SIGKILL, restart, the same call (same key) and the next tasks/get get the same request, one agent result recorded per run");
        python_sdk_over_stdio_and_http().await;
        python_sdk_serves_subagents_through_sampling().await;
        python_sdk_host_declines_stops_and_closes().await;
        typescript_sdk_host_declines_stops_and_closes().await;
    });
}

fn server_command(db: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(std::env::current_exe().unwrap());
    cmd.env(SERVE_VAR, db);
    cmd
}

async fn spawn(db: &Path) -> (RunningService<RoleClient, TestClient>, u32) {
    let (transport, _) = TokioChildProcess::builder(server_command(db))
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the server");
    let pid = transport.id().expect("server pid");
    let client = TestClient::tasks().serve(transport).await.expect("connect");
    (client, pid)
}

async fn sigkill_while_a_task_waits_then_answer_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("eve.db");
    let (c, pid) = spawn(&db).await;
    let tools = c.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "deploy_approval"));
    let args = json!({"service": "api"}).as_object().unwrap().clone();
    let id = match c
        .call_tool_once(CallToolRequestParams::new("deploy_approval").with_arguments(args))
        .await
        .unwrap()
    {
        CallToolResponse::Task(t) => t.task.task_id,
        other => panic!("expected a task, got {other:?}"),
    };
    let parked = wait_status(c.peer(), &id, TaskStatus::InputRequired).await;
    let (key, request) = only_request(&parked);
    assert_approval_form(&request);

    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert!(
        c.get_task(GetTaskParams::new(id.clone())).await.is_err(),
        "the server is dead"
    );
    drop(c);

    let (c, _) = spawn(&db).await;
    let again = wait_status(c.peer(), &id, TaskStatus::InputRequired).await;
    let (key_again, request_again) = only_request(&again);
    assert_eq!(
        (key_again.as_str(), &request_again),
        (key.as_str(), &request)
    );
    c.update_task(UpdateTaskParams::new(id.clone(), choose(&key, "approve")))
        .await
        .unwrap();
    let done = wait_status(c.peer(), &id, TaskStatus::Completed).await;
    assert_eq!(
        completed_output(&done),
        json!({"deployed": true, "url": "https://deploy.example/api/1"})
    );
    c.cancel().await.unwrap();
}

/// The server in a child process, spoken to line by line.
struct Raw {
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Raw {
    async fn send(&mut self, line: &str) {
        use tokio::io::AsyncWriteExt;
        self.stdin.write_all(line.as_bytes()).await.unwrap();
        self.stdin.write_all(b"\n").await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// Sends `line` and reads the next message (a silent server fails the test after 20 s).
    async fn ask(&mut self, line: &str) -> serde_json::Value {
        self.send(line).await;
        let next = tokio::time::timeout(std::time::Duration::from_secs(20), self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("no reply to {}", &line[..line.len().min(200)]))
            .unwrap()
            .expect("the server closed stdout");
        serde_json::from_str(&next)
            .unwrap_or_else(|e| panic!("{e}: not JSON-RPC on stdout: {next}"))
    }
}

/// `(id, error code)` of an error reply; the id is always present (`null` when unknown).
fn id_and_code(reply: &serde_json::Value) -> (serde_json::Value, serde_json::Value) {
    assert!(reply.as_object().unwrap().contains_key("id"), "{reply}");
    (reply["id"].clone(), reply["error"]["code"].clone())
}

async fn raw_json_rpc_over_stdio() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("raw.db");
    let mut child = server_command(&db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut raw = Raw {
        stdin: child.stdin.take().unwrap(),
        lines: tokio::io::BufReader::new(child.stdout.take().unwrap()).lines(),
    };
    let init = |caps: serde_json::Value| {
        json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": { "protocolVersion": "2025-11-25", "capabilities": caps, "clientInfo": { "name": "raw", "version": "0" } },
        })
        .to_string()
    };
    let first = raw.ask(&init(json!({}))).await;
    assert_eq!(first["result"]["serverInfo"]["name"], "eve", "{first}");
    raw.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .await;

    let null = serde_json::Value::Null;
    let r = raw.ask("{not json").await;
    assert_eq!(id_and_code(&r), (null.clone(), json!(-32700)), "{r}");
    for invalid in [
        "[]".to_owned(),
        r#"{"jsonrpc":"2.0","id":{"no":1},"method":"ping"}"#.to_owned(),
        format!(
            r#"{{"jsonrpc":"2.0","id":"{}","method":"ping"}}"#,
            "i".repeat(300)
        ),
        format!("{}{}", "[".repeat(300), "]".repeat(300)),
        format!(
            r#"{{"jsonrpc":"2.0","id":2,"method":"ping","params":{{"x":"{}"}}}}"#,
            "x".repeat(4 * 1024 * 1024 + 1)
        ),
    ] {
        let r = raw.ask(&invalid).await;
        assert_eq!(id_and_code(&r), (null.clone(), json!(-32600)), "{r}");
    }
    for (params, method, field) in malformed_params() {
        let msg = json!({ "jsonrpc": "2.0", "id": 3, "method": method, "params": params });
        let r = raw.ask(&msg.to_string()).await;
        assert_eq!(id_and_code(&r), (json!(3), json!(-32602)), "{r}");
        assert_eq!(r["error"]["data"]["field"], field, "{r}");
    }
    // A long name is cut in the error that echoes it.
    let long = json!({ "jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": { "name": "n".repeat(10_000), "arguments": {} } });
    let r = raw.ask(&long.to_string()).await;
    assert_eq!(id_and_code(&r), (json!(4), json!(-32602)), "{r}");
    assert!(r["error"]["message"].as_str().unwrap().len() < 500, "{r}");
    // A second initialize (declaring the tasks extension this time) is refused...
    let again = init(json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } }));
    let r = raw.ask(&again).await;
    assert_eq!(r["id"], 1, "{r}");
    assert!(r["error"]["code"].is_i64(), "{r}");
    // ...and changed nothing: without the tasks extension a call still blocks for its result.
    let call = json!({ "jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": { "name": "weigh", "arguments": { "grams": 1500 } } });
    let r = raw.ask(&call.to_string()).await;
    assert_eq!(
        r["result"]["structuredContent"],
        json!({ "kilograms": 1.5 }),
        "{r}"
    );
    let r = raw.ask(r#"{"jsonrpc":"2.0","id":6,"method":"ping"}"#).await;
    assert_eq!(r["result"], json!({}), "{r}");
    drop(raw);
    assert!(child.wait().await.unwrap().success());
    // Only the one good call started a run.
    let store = eve_storage_sqlite::SqliteStore::open(&db).await.unwrap();
    let runs = eve_core::JournalStore::list_runs(&store, &eve_core::RunQuery::default())
        .await
        .unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].tool, "weigh");
}

async fn python_sdk_over_stdio_and_http() {
    let Ok(python) = std::env::var("EVE_TEST_MCP_PYTHON") else {
        println!("SKIPPED: the official MCP Python SDK client test: EVE_TEST_MCP_PYTHON is not set (scripts/test-all.sh sets it to a venv's python with the pinned `mcp` package)");
        return;
    };
    let version = python_sdk_version(&python).await;
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/client.py");
    // stdio: the client spawns the server.
    let out = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(std::env::current_exe().unwrap())
        .env(SERVE_VAR, dir.path().join("stdio.db"))
        .stderr(Stdio::inherit())
        .output()
        .await
        .expect("run the Python client");
    assert_python_session(&out);
    println!("ok: stdio, official Python SDK (mcp {version}) client: list, blocking call answered through elicitation, a call whose steps print (nothing but MCP on stdout), unknown tool");
    // Streamable HTTP: the server runs until its stdin closes.
    let (mut server, url) = http_server(&dir.path().join("http.db"), &[]).await;
    let out = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(&url)
        .stderr(Stdio::inherit())
        .output()
        .await
        .expect("run the Python client");
    assert_python_session(&out);
    drop(server.stdin.take());
    assert!(server.wait().await.unwrap().success());
    println!("ok: streamable HTTP, official Python SDK (mcp {version}) client: list, blocking call answered through elicitation, a call whose steps print (nothing but MCP on stdout), unknown tool");
}

/// The official Python SDK as a host whose person declines, cancels, presses stop and closes
/// (tests/python/host.py), over stdio and streamable HTTP: afterwards the journal holds exactly
/// what the person chose.
async fn python_sdk_host_declines_stops_and_closes() {
    let Ok(python) = std::env::var("EVE_TEST_MCP_PYTHON") else {
        println!("SKIPPED: the official MCP Python SDK host test: EVE_TEST_MCP_PYTHON is not set");
        return;
    };
    let version = python_sdk_version(&python).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/host.py");
    sdk_host(
        &format!("Python SDK (mcp {version})"),
        &python,
        &script,
        &[],
    )
    .await;
}

/// The official TypeScript SDK as the same host (tests/ts/host.mjs), plus a host without
/// elicitation whose 1 s request timeout is kept from firing by eve's notices while a person
/// has yet to answer.
async fn typescript_sdk_host_declines_stops_and_closes() {
    let Ok(modules) = std::env::var("EVE_TEST_MCP_NODE_MODULES") else {
        println!("SKIPPED: the official MCP TypeScript SDK host test: EVE_TEST_MCP_NODE_MODULES is not set (scripts/test-all.sh installs @modelcontextprotocol/sdk and sets it)");
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ts/host.mjs");
    let steps = sdk_host(
        "TypeScript SDK (@modelcontextprotocol/sdk)",
        "node",
        &script,
        &[("NODE_PATH", modules.as_str()), (NOTICE_MS_VAR, "200")],
    )
    .await;
    for steps in steps {
        let bare = &steps["no_elicitation"];
        assert_eq!(bare["is_error"], false, "{bare}");
        assert_eq!(bare["structured"]["deployed"], true, "{bare}");
        assert!(
            bare["notice"].as_str().unwrap().contains("eve answer"),
            "{bare}"
        );
        assert!(bare["notices"].as_u64().unwrap() >= 2, "{bare}");
        assert!(bare["waited_ms"].as_u64().unwrap() > 1000, "{bare}");
        assert!(
            steps["stopped"]["call"].as_str().unwrap().contains("stop"),
            "{steps:?}"
        );
    }
}

/// Runs a host script (`program script TARGET`) over stdio and over streamable HTTP, checks
/// what it did to the journal, and returns its steps of both runs.
async fn sdk_host(
    label: &str,
    program: &str,
    script: &Path,
    env: &[(&str, &str)],
) -> Vec<serde_json::Map<String, serde_json::Value>> {
    let dir = tempfile::tempdir().unwrap();
    let stdio_db = dir.path().join("stdio.db");
    let out = tokio::process::Command::new(program)
        .arg(script)
        .arg(std::env::current_exe().unwrap())
        .env(SERVE_VAR, &stdio_db)
        .envs(env.iter().copied())
        .stderr(Stdio::inherit())
        .output()
        .await
        .expect("run the host script");
    let over_stdio = assert_host(&out, &stdio_db).await;
    println!("ok: stdio, official {label} host: decline denies an approval, cancel chooses cancel, stop cancels the run (its first cancel reason is the stop), a background tool answers its receipt, EOF ends the session and cancels its runs");
    let http_db = dir.path().join("http.db");
    let (mut server, url) = http_server(&http_db, env).await;
    let out = tokio::process::Command::new(program)
        .arg(script)
        .arg(&url)
        .envs(env.iter().copied())
        .stderr(Stdio::inherit())
        .output()
        .await
        .expect("run the host script");
    let over_http = assert_host(&out, &http_db).await;
    drop(server.stdin.take());
    assert!(server.wait().await.unwrap().success());
    println!("ok: streamable HTTP, official {label} host: decline, cancel, stop, receipt, DELETE /mcp ends the session and cancels its runs");
    vec![over_stdio, over_http]
}

/// Starts this binary as an MCP server over streamable HTTP on `db` (with `env`); returns the
/// process (it serves until its stdin closes) and its URL. What the server prints after the URL
/// (steps that print) is read and dropped.
async fn http_server(db: &Path, env: &[(&str, &str)]) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt;
    let mut server = tokio::process::Command::new(std::env::current_exe().unwrap())
        .env(SERVE_HTTP_VAR, db)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut url = String::new();
    let mut lines = tokio::io::BufReader::new(server.stdout.take().unwrap());
    lines.read_line(&mut url).await.unwrap();
    tokio::spawn(async move { tokio::io::copy(&mut lines, &mut tokio::io::sink()).await });
    (server, url.trim().to_owned())
}

/// Checks a host script's steps and what they did to the journal in `db`; returns the steps.
async fn assert_host(
    out: &std::process::Output,
    db: &Path,
) -> serde_json::Map<String, serde_json::Value> {
    use eve_core::{Event, JournalStore, JournalStoreExt};
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the host script failed: {stdout}");
    let steps = python_steps(out);
    let declined = &steps["declined"];
    assert_eq!(declined["is_error"], true, "{declined}");
    assert!(
        declined["meta"]["eve/denied"]["reason"].is_string(),
        "{declined}"
    );
    let receipt = &steps["receipt"]["structured"];
    assert_eq!(receipt["status"], "working", "{receipt}");
    let store = eve_storage_sqlite::SqliteStore::open(db).await.unwrap();
    let runs = store
        .list_runs(&eve_core::RunQuery::default())
        .await
        .unwrap();
    let run_of = |tool: &str| {
        runs.iter()
            .find(|r| r.tool == tool)
            .unwrap_or_else(|| panic!("no {tool} run: {runs:?}"))
            .clone()
    };
    let journal = |run: &eve_core::RunRecord| {
        let id = run.run_id.clone();
        let store = &store;
        async move {
            store
                .read_all(&id, 0)
                .await
                .unwrap()
                .into_iter()
                .map(|e| e.event)
                .collect::<Vec<_>>()
        }
    };
    let transfer = journal(&run_of("transfer")).await;
    let deploys: Vec<_> = runs
        .iter()
        .filter(|r| r.tool == "deploy_approval")
        .collect();
    let deploy_answers = {
        let mut answers = Vec::new();
        for run in deploys {
            for e in journal(run).await {
                if let Event::InputAnswered { response, .. } = e {
                    answers.extend(response.option_id);
                }
            }
        }
        answers
    };
    assert!(
        transfer
            .iter()
            .any(|e| matches!(e, Event::RunDenied { .. })),
        "{transfer:?}"
    );
    assert!(
        !transfer
            .iter()
            .any(|e| matches!(e, Event::StepCompleted { .. })),
        "{transfer:?}"
    );
    assert!(
        deploy_answers.contains(&"cancel".to_owned()),
        "{deploy_answers:?}"
    );
    let nap = run_of("nap");
    let reasons: Vec<String> = journal(&nap)
        .await
        .into_iter()
        .filter_map(|e| match e {
            Event::CancelRequested { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(
        reasons.first().map(String::as_str),
        Some(eve_mcp::REASON_STOP),
        "{reasons:?}"
    );
    // The session's end (EOF / DELETE /mcp) ended it and cancelled its background task.
    let start = std::time::Instant::now();
    loop {
        let ended = store
            .get_session(&nap.session_id)
            .await
            .unwrap()
            .ended_at
            .is_some();
        let refund = store.get_run(&run_of("refund_order").run_id).await.unwrap();
        if ended && refund.cancel_requested {
            break;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "session {} not ended or refund_order not cancelled",
            nap.session_id
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    steps
}

fn assert_python_session(out: &std::process::Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the Python client failed: {stdout}");
    let steps: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let step = |name: &str| {
        steps
            .iter()
            .find(|s| s["step"] == name)
            .unwrap_or_else(|| panic!("no step {name}: {stdout}"))
            .clone()
    };
    assert_eq!(step("initialized")["server"], "eve");
    let tools = step("tools");
    assert!(tools["names"]
        .as_array()
        .unwrap()
        .contains(&json!("deploy_approval")));
    assert_eq!(
        tools["deploy_schema"]["properties"]["service"]["type"],
        "string"
    );
    assert_eq!(tools["deploy_meta"][eve_mcp::META_MAY_ASK], true);
    let called = step("called");
    assert_eq!(called["is_error"], false, "{called}");
    assert_eq!(
        called["structured"],
        json!({"deployed": true, "url": "https://deploy.example/api/1"})
    );
    assert_eq!(called["asked"][0]["options"], json!(["approve", "cancel"]));
    assert_eq!(called["asked"][0]["labels"], json!(["Deploy", "Cancel"]));
    // remind's steps print to stdout; over stdio none of it reached the protocol.
    let printed = step("printed");
    assert_eq!(printed["is_error"], false, "{printed}");
    // remind is a background tool: the call answers its receipt, and its end is pushed.
    assert_eq!(printed["structured"]["status"], "working", "{printed}");
    assert_eq!(printed["ended"]["kind"], "task.completed", "{printed}");
    assert!(
        printed["ended"]["message"]
            .as_str()
            .unwrap()
            .contains("Reminder: tea"),
        "{printed}"
    );
    assert_eq!(printed["stream_errors"], json!([]), "{printed}");
    let unknown = step("unknown_tool");
    assert!(
        unknown["error"].as_str().unwrap().contains("unknown tool"),
        "{unknown}"
    );
    assert_eq!(unknown["code"], -32602);
}

async fn python_sdk_version(python: &str) -> String {
    let out = tokio::process::Command::new(python)
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('mcp'))",
        ])
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A call of `delegate` about `topic` keyed `key`.
fn keyed_delegate(topic: &str, key: &str) -> CallToolRequestParams {
    let mut meta = rmcp::model::RequestMetaObject::new();
    meta.insert(eve_mcp::META_CALL_KEY.into(), json!(key));
    let mut p = CallToolRequestParams::new("delegate")
        .with_arguments(json!({ "topic": topic }).as_object().unwrap().clone());
    p.meta = Some(meta);
    p
}

/// The agent replies recorded in the journal of every run of the store at `db`, by run.
async fn recorded_replies(db: &Path) -> Vec<(String, Vec<eve_core::AgentReply>)> {
    use eve_core::{JournalStore, JournalStoreExt};
    let store = eve_storage_sqlite::SqliteStore::open(db).await.unwrap();
    let mut out = Vec::new();
    for run in store
        .list_runs(&eve_core::RunQuery::default())
        .await
        .unwrap()
    {
        let replies = store
            .read_all(&run.run_id, 0)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|e| match e.event {
                eve_core::Event::InputAnswered { response, .. } => response.agent,
                _ => None,
            })
            .collect();
        out.push((run.run_id.as_str().to_owned(), replies));
    }
    out
}

async fn sigkill_while_sampling_then_the_same_call_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("sampling.db");
    let connect = |client: TestClient| {
        let db = db.clone();
        async move {
            let (transport, _) = TokioChildProcess::builder(server_command(&db))
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn the server");
            let pid = transport.id().expect("server pid");
            (client.serve(transport).await.expect("connect"), pid)
        }
    };
    // The client takes the sampling request and never answers it.
    let hanging = TestClient {
        hang: true,
        ..TestClient::default()
    };
    let (c, pid) = connect(hanging.clone()).await;
    let call = tokio::spawn({
        let peer = c.peer().clone();
        async move {
            peer.call_tool(keyed_delegate("restart", "rs-restart"))
                .await
        }
    });
    let start = std::time::Instant::now();
    while hanging.sampled.lock().unwrap().is_empty() {
        assert!(start.elapsed().as_secs() < 20, "no sampling request");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert!(call.await.unwrap().is_err(), "the server is dead");
    drop(c);

    let serving = TestClient::sampling(r#"{"verdict": "pass"}"#);
    let (c, serving_pid) = connect(serving.clone()).await;
    let result = c
        .call_tool(keyed_delegate("restart", "rs-restart"))
        .await
        .unwrap();
    assert_eq!(
        result.structured_content,
        Some(json!({ "review": { "verdict": "pass" } }))
    );
    let (first, again) = (
        hanging.sampled.lock().unwrap()[0].clone(),
        serving.sampled.lock().unwrap().clone(),
    );
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(first, again[0], "the same request after the restart");
    c.cancel().await.unwrap();
    // One server process at a time (a worker id is one live process): wait for this one to exit.
    let start = std::time::Instant::now();
    while std::process::Command::new("kill")
        .args(["-0", &serving_pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
    {
        assert!(start.elapsed().as_secs() < 20, "the server did not exit");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // In task mode the task shows the sampling request in inputRequests.
    let (t, task_pid) = connect(TestClient::tasks()).await;
    let task = match t
        .call_tool_once(keyed_delegate("task restart", "rs-task"))
        .await
        .unwrap()
    {
        CallToolResponse::Task(task) => task.task.task_id,
        other => panic!("expected a task, got {other:?}"),
    };
    let parked = wait_status(t.peer(), &task, TaskStatus::InputRequired).await;
    let (task_key, task_request) = only_request(&parked);
    assert_eq!(task_request["method"], "sampling/createMessage");
    let killed = std::process::Command::new("kill")
        .args(["-9", &task_pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    drop(t);
    // The next client that polls gets the same request, answers it, and the task completes.
    let (t, _) = connect(TestClient::tasks()).await;
    let again = wait_status(t.peer(), &task, TaskStatus::InputRequired).await;
    assert_eq!(only_request(&again), (task_key.clone(), task_request));
    let answer = json!({ "role": "assistant", "model": "m", "content": { "type": "text", "text": "{\"verdict\": \"fail\"}" } });
    t.update_task(UpdateTaskParams::new(
        task.clone(),
        [(task_key, answer)].into_iter().collect(),
    ))
    .await
    .unwrap();
    let done = wait_status(t.peer(), &task, TaskStatus::Completed).await;
    assert_eq!(
        completed_output(&done),
        json!({ "review": { "verdict": "fail" } })
    );
    t.cancel().await.unwrap();
    // One agent result recorded per run.
    let mut replies: Vec<_> = recorded_replies(&db)
        .await
        .into_iter()
        .map(|(run, replies)| (run == task, replies))
        .collect();
    replies.sort_by_key(|(is_task, _)| *is_task);
    assert_eq!(
        replies,
        [
            (
                false,
                vec![eve_core::AgentReply::Output(json!({ "verdict": "pass" }))]
            ),
            (
                true,
                vec![eve_core::AgentReply::Output(json!({ "verdict": "fail" }))]
            ),
        ]
    );
}

async fn python_sdk_serves_subagents_through_sampling() {
    let Ok(python) = std::env::var("EVE_TEST_MCP_PYTHON") else {
        println!(
            "SKIPPED: the official MCP Python SDK sampling test: EVE_TEST_MCP_PYTHON is not set"
        );
        return;
    };
    let version = python_sdk_version(&python).await;
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/sampling.py");
    let db = dir.path().join("stdio.db");
    let out = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(std::env::current_exe().unwrap())
        .env(SERVE_VAR, &db)
        .env(PID_FILE_VAR, dir.path().join("server.pid"))
        .stderr(Stdio::inherit())
        .output()
        .await
        .expect("run the Python client");
    let steps = python_steps(&out);
    assert_python_sampling(&steps);
    let killed = &steps["killed"];
    let restarted = &steps["restarted"];
    assert!(killed["error"].is_string(), "{killed}");
    assert_eq!(restarted["is_error"], false, "{restarted}");
    assert_eq!(
        restarted["structured"],
        json!({ "review": { "verdict": "pass", "notes": "after restart" } })
    );
    let (before, after) = (
        &killed["sampled"][0]["meta"],
        &restarted["sampled"][0]["meta"],
    );
    assert_eq!(
        restarted["sampled"].as_array().unwrap().len(),
        1,
        "{restarted}"
    );
    for field in [
        eve_mcp::META_RUN,
        eve_mcp::META_REQUEST,
        eve_mcp::META_AGENT_KEY,
    ] {
        assert!(before[field].is_string(), "{killed}");
        assert_eq!(
            before[field], after[field],
            "{field}: the same request after the restart"
        );
    }
    // One recorded agent result per run: the restarted call's run has exactly one.
    let replies = recorded_replies(&db).await;
    let restarted_run = after[eve_mcp::META_RUN].as_str().unwrap();
    for (run, replies) in &replies {
        let expected = usize::from(steps_run_completed(&steps, run));
        assert_eq!(replies.len(), expected, "{run}: {replies:?}");
    }
    let (_, once) = replies.iter().find(|(r, _)| r == restarted_run).unwrap();
    assert_eq!(
        once,
        &[eve_core::AgentReply::Output(
            json!({ "verdict": "pass", "notes": "after restart" })
        )]
    );
    println!("ok: stdio, official Python SDK (mcp {version}): subagent served by sampling_callback, schema mismatch refused (nothing recorded), no sampling capability named, SIGKILL while sampling, restart, the same request, one recorded agent result");

    // Streamable HTTP: the same, without the SIGKILL part.
    let (mut server, url) = http_server(&dir.path().join("http.db"), &[]).await;
    let out = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(&url)
        .stderr(Stdio::inherit())
        .output()
        .await
        .expect("run the Python client");
    assert_python_sampling(&python_steps(&out));
    drop(server.stdin.take());
    assert!(server.wait().await.unwrap().success());
    println!("ok: streamable HTTP, official Python SDK (mcp {version}): subagent served by sampling_callback, schema mismatch refused, no sampling capability named");
}

/// Whether the Python session saw `run` complete (the served and restarted calls).
fn steps_run_completed(steps: &serde_json::Map<String, serde_json::Value>, run: &str) -> bool {
    ["served", "restarted"]
        .iter()
        .any(|s| steps[*s]["sampled"][0]["meta"][eve_mcp::META_RUN] == run)
}

/// The Python client's steps by name (it must have exited 0).
fn python_steps(out: &std::process::Output) -> serde_json::Map<String, serde_json::Value> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the Python client failed: {stdout}");
    stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            (v["step"].as_str().unwrap().to_owned(), v)
        })
        .collect()
}

fn assert_python_sampling(steps: &serde_json::Map<String, serde_json::Value>) {
    let served = &steps["served"];
    assert_eq!(served["is_error"], false, "{served}");
    assert_eq!(
        served["structured"],
        json!({ "review": { "verdict": "pass", "notes": "python" } }),
        "{served}"
    );
    let request = &served["sampled"][0];
    assert_eq!(
        request["meta"][eve_mcp::META_TARGET],
        "security-reviewer",
        "{served}"
    );
    assert_eq!(
        request["meta"][eve_mcp::META_AGENT_KEY],
        "review",
        "{served}"
    );
    assert_eq!(
        request["meta"][eve_mcp::META_OUTPUT_SCHEMA],
        verdict_schema(),
        "{served}"
    );
    assert_eq!(request["maxTokens"], 4096, "{served}");
    assert!(
        request["message"].as_str().unwrap().contains("login"),
        "{served}"
    );
    let mismatch = &steps["mismatch"];
    assert_eq!(mismatch["code"], -32602, "{mismatch}");
    assert_eq!(mismatch["data"]["code"], "invalid_answer", "{mismatch}");
    assert!(
        mismatch["error"].as_str().unwrap().contains("outputSchema"),
        "{mismatch}"
    );
    let no_sampling = &steps["no_sampling"];
    assert_eq!(no_sampling["code"], -32600, "{no_sampling}");
    assert_eq!(
        no_sampling["data"]["capability"], "sampling",
        "{no_sampling}"
    );
    assert!(
        no_sampling["error"]
            .as_str()
            .unwrap()
            .contains("`sampling`"),
        "{no_sampling}"
    );
}
