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
/// Set in the server process: the SQLite file to serve over streamable HTTP on 127.0.0.1:0 (the
/// process prints its URL, then serves until stdin closes).
const SERVE_HTTP_VAR: &str = "EVE_MCP_TEST_SERVE_HTTP";

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if let Ok(db) = std::env::var(SERVE_VAR) {
        rt.block_on(async {
            let (mcp, _store, worker) = server(Path::new(&db)).await;
            eve_mcp::serve_stdio(mcp).await.expect("serve stdio");
            worker.shutdown().await;
        });
        return;
    }
    if let Ok(db) = std::env::var(SERVE_HTTP_VAR) {
        rt.block_on(async {
            let (mcp, _store, worker) = server(Path::new(&db)).await;
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
        python_sdk_over_stdio_and_http().await;
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
    println!("ok: stdio, official Python SDK (mcp {version}) client: list, blocking call answered through elicitation, unknown tool");
    // Streamable HTTP: the server runs until its stdin closes.
    let mut server = tokio::process::Command::new(std::env::current_exe().unwrap())
        .env(SERVE_HTTP_VAR, dir.path().join("http.db"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut url = String::new();
    {
        use tokio::io::AsyncBufReadExt;
        let mut lines = tokio::io::BufReader::new(server.stdout.take().unwrap());
        lines.read_line(&mut url).await.unwrap();
    }
    let out = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(url.trim())
        .stderr(Stdio::inherit())
        .output()
        .await
        .expect("run the Python client");
    assert_python_session(&out);
    drop(server.stdin.take());
    assert!(server.wait().await.unwrap().success());
    println!("ok: streamable HTTP, official Python SDK (mcp {version}) client: list, blocking call answered through elicitation, unknown tool");
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
