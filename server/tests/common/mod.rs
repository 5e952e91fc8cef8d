//! Shared by the server's integration tests: a SQLite store in a temp dir, a server and a
//! worker on it, the workflows the tests run, an SSE client and small HTTP helpers.
#![allow(dead_code, unreachable_pub)]

use eve_core::engine::{
    define_workflow_tool, start_tool_call, Registry, StepError, SystemClock, Worker, WorkerConfig,
    WorkerHandle, WorkflowCtx, WorkflowError, WorkflowTool,
};
use eve_core::{
    workflow, CallId, Event, InputOption, InputRequest, JournalStore, JournalStoreExt, OptionStyle,
    RunId, SessionId, StoredEvent, Timestamp, WebhookRequest, WebhookResponse,
};
use eve_server::{AppState, ServerConfig};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// How long a test waits for anything before it fails.
pub const WAIT: Duration = Duration::from_secs(60);

pub const DEPLOYMENT: &str = "server-tests";

/// A fresh SQLite store in a temp dir (kept alive by the returned guard).
pub async fn sqlite() -> (tempfile::TempDir, Arc<dyn JournalStore>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = eve_storage_sqlite::SqliteStore::open(dir.path().join("eve.db"))
        .await
        .expect("open sqlite");
    (dir, Arc::new(store))
}

/// A server on 127.0.0.1:0, stopped by [`TestServer::stop`].
pub struct TestServer {
    pub addr: SocketAddr,
    pub base: String,
    stop: Option<oneshot::Sender<()>>,
    join: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl TestServer {
    pub async fn start(store: Arc<dyn JournalStore>, tune: impl FnOnce(&mut ServerConfig)) -> Self {
        Self::start_on("127.0.0.1:0".parse().unwrap(), store, tune).await
    }

    /// A server on `addr` (e.g. the address of a server that was stopped: a restart).
    pub async fn start_on(
        addr: SocketAddr,
        store: Arc<dyn JournalStore>,
        tune: impl FnOnce(&mut ServerConfig),
    ) -> Self {
        Self::start_full(addr, store, tune, |s| s).await
    }

    /// [`TestServer::start`] with the state changed by `state` (e.g. an MCP router mounted).
    pub async fn start_with(
        store: Arc<dyn JournalStore>,
        tune: impl FnOnce(&mut ServerConfig),
        state: impl FnOnce(AppState) -> AppState,
    ) -> Self {
        Self::start_full("127.0.0.1:0".parse().unwrap(), store, tune, state).await
    }

    /// [`TestServer::start_with`] on `addr` (a restart with another state).
    pub async fn start_with_on(
        addr: SocketAddr,
        store: Arc<dyn JournalStore>,
        state: impl FnOnce(AppState) -> AppState,
    ) -> Self {
        Self::start_full(addr, store, |_| {}, state).await
    }

    async fn start_full(
        addr: SocketAddr,
        store: Arc<dyn JournalStore>,
        tune: impl FnOnce(&mut ServerConfig),
        with: impl FnOnce(AppState) -> AppState,
    ) -> Self {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let base = format!("http://{addr}");
        let mut config = ServerConfig {
            base_url: base.clone(),
            poll_interval: Duration::from_millis(20),
            // The tests of what routes do run without keys; tests/auth.rs turns keys on.
            insecure_no_auth: true,
            ..ServerConfig::default()
        };
        tune(&mut config);
        let state = with(AppState::new(store, Arc::new(SystemClock)).with_config(config));
        let (tx, rx) = oneshot::channel::<()>();
        let join = tokio::spawn(eve_server::serve_with_shutdown(listener, state, async {
            let _ = rx.await;
        }));
        Self {
            addr,
            base,
            stop: Some(tx),
            join,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Graceful shutdown: ends SSE streams and waits for the server task.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(WAIT, &mut self.join)
            .await
            .expect("server stops in time")
            .expect("server task")
            .expect("server io");
    }
}

/// Who is waiting for a webhook URL announced by a run (keyed by the run's input `key`).
static ANNOUNCED: Mutex<BTreeMap<String, oneshot::Sender<String>>> = Mutex::new(BTreeMap::new());
/// The server base URL and the fake render farm, as a deployment's configuration would give
/// them to a step.
static BASE_URLS: Mutex<BTreeMap<String, (String, String)>> = Mutex::new(BTreeMap::new());

/// Registers interest in the webhook URL the run with input key `key` announces.
pub fn expect_url(key: &str) -> oneshot::Receiver<String> {
    let (tx, rx) = oneshot::channel();
    ANNOUNCED.lock().unwrap().insert(key.to_owned(), tx);
    rx
}

/// Tells render runs with input key `key` where the server and the farm are.
pub fn configure_render(key: &str, server_base: &str, farm_base: &str) {
    BASE_URLS.lock().unwrap().insert(
        key.to_owned(),
        (server_base.to_owned(), farm_base.to_owned()),
    );
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RenderInput {
    pub project_id: String,
}

/// The seed's render-farm example: mint a webhook, submit the job with its URL (a step), wait
/// for the callback, read its JSON.
pub async fn render_video(ctx: WorkflowCtx, input: RenderInput) -> Result<Value, WorkflowError> {
    let done = ctx.create_webhook::<WebhookRequest>();
    let path = done.path();
    let project = input.project_id.clone();
    let job: String = ctx
        .step("submit_render", move |_| {
            let (path, project) = (path.clone(), project.clone());
            async move {
                let (server, farm) = BASE_URLS
                    .lock()
                    .unwrap()
                    .get(&project)
                    .cloned()
                    .ok_or_else(|| StepError::fatal("render farm not configured"))?;
                let resp = reqwest::Client::new()
                    .post(format!("{farm}/jobs"))
                    .json(&json!({ "project_id": project, "callback_url": format!("{server}{path}") }))
                    .send()
                    .await
                    .map_err(StepError::retryable)?;
                let job: Value = resp.json().await.map_err(StepError::retryable)?;
                Ok(job["job_id"].as_str().unwrap_or_default().to_owned())
            }
        })
        .await?;
    let callback = done.next().await?;
    let status = callback.body["status"].as_str().unwrap_or_default();
    if status != "ok" {
        return Err(WorkflowError::new(format!("Render {job} failed: {status}")));
    }
    Ok(json!({ "job": job, "url": callback.body["url"] }))
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct CollectInput {
    /// Names the run for [`expect_url`].
    pub key: String,
    /// How many deliveries to wait for.
    pub count: usize,
    /// Answer each delivery with this response (else 202).
    #[serde(default)]
    pub respond_with: Option<Value>,
}

/// Mints a webhook, announces its path (a step), then collects `count` deliveries.
pub async fn collect(ctx: WorkflowCtx, input: CollectInput) -> Result<Value, WorkflowError> {
    let hook = match input.respond_with {
        Some(r) => ctx.create_webhook_with::<WebhookRequest>(
            serde_json::from_value::<WebhookResponse>(r).map_err(WorkflowError::new)?,
        ),
        None => ctx.create_webhook::<WebhookRequest>(),
    };
    let path = hook.path();
    let key = input.key.clone();
    ctx.step("announce", move |_| {
        let (path, key) = (path.clone(), key.clone());
        async move {
            if let Some(tx) = ANNOUNCED.lock().unwrap().remove(&key) {
                let _ = tx.send(path);
            }
            Ok(())
        }
    })
    .await?;
    let mut got = Vec::new();
    for _ in 0..input.count {
        got.push(hook.next().await?);
    }
    Ok(serde_json::to_value(got)?)
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct AwaitHookInput {
    /// The hook's token (`POST /v1/hooks/{token}` delivers to it).
    pub token: String,
    /// How many payloads to wait for.
    pub count: usize,
}

/// Creates a hook with the caller's token and returns the `count` payloads it receives.
pub async fn await_hook(ctx: WorkflowCtx, input: AwaitHookInput) -> Result<Value, WorkflowError> {
    let hook = ctx.create_hook::<Value>(input.token);
    let mut got = Vec::new();
    for _ in 0..input.count {
        got.push(hook.next().await?);
    }
    Ok(Value::Array(got))
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct DeployInput {
    pub service: String,
}

/// A body with a bug: it panics after its first step, which parks the run as blocked (for
/// the operator actions: resume, fail).
pub async fn broken(ctx: WorkflowCtx, input: DeployInput) -> Result<Value, WorkflowError> {
    let service = input.service.clone();
    let _: String = ctx
        .step("check", move |_| {
            let s = service.clone();
            async move { Ok(s) }
        })
        .await?;
    panic!("the body of broken has a bug (service {})", input.service)
}

/// The seed's deploy tool: plan (a step), ask for approval, deploy (a step) when approved.
pub async fn deploy(ctx: WorkflowCtx, input: DeployInput) -> Result<Value, WorkflowError> {
    let service = input.service.clone();
    let plan: String = ctx
        .step("plan_deploy", move |_| {
            let s = service.clone();
            async move { Ok(format!("roll out {s} to 3 regions")) }
        })
        .await?;
    let answer = ctx
        .ask(InputRequest {
            prompt: format!("Deploy {}?\n\n{plan}", input.service),
            display: eve_core::Display::Confirmation,
            options: vec![
                InputOption {
                    id: "approve".into(),
                    label: "Deploy".into(),
                    description: None,
                    style: Some(OptionStyle::Primary),
                },
                InputOption {
                    id: "cancel".into(),
                    label: "Cancel".into(),
                    description: Some("Leave production as it is".into()),
                    style: Some(OptionStyle::Danger),
                },
            ],
            allow_freeform: false,
            agent: None,
            approval: None,
        })
        .await;
    if answer.option_id.as_deref() != Some("approve") {
        return Ok(json!({ "deployed": false, "reason": "rejected" }));
    }
    let url: String = ctx
        .step("apply_deploy", |_| async {
            Ok("https://deploy.example/123".to_owned())
        })
        .await?;
    Ok(json!({ "deployed": true, "url": url }))
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RefundInput {
    pub order_id: String,
}

/// The seed's refund tool (background): ask, then refund when approved.
pub async fn refund(ctx: WorkflowCtx, input: RefundInput) -> Result<Value, WorkflowError> {
    let decision = ctx
        .ask(InputRequest {
            prompt: format!("Refund order {}?", input.order_id),
            display: eve_core::Display::Select,
            options: vec![
                InputOption {
                    id: "approve".into(),
                    label: "Refund".into(),
                    description: None,
                    style: Some(OptionStyle::Primary),
                },
                InputOption {
                    id: "deny".into(),
                    label: "Deny".into(),
                    description: None,
                    style: None,
                },
            ],
            allow_freeform: true,
            agent: None,
            approval: None,
        })
        .await;
    Ok(
        json!({ "refunded": decision.option_id.as_deref() == Some("approve"), "note": decision.text }),
    )
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ReportInput {
    pub steps: u32,
}

/// Reports progress `steps` times, then asks for a free-text note and returns it.
pub async fn report(ctx: WorkflowCtx, input: ReportInput) -> Result<Value, WorkflowError> {
    for n in 1..=input.steps {
        ctx.progress(&json!({ "done": n, "of": input.steps }));
    }
    let note = ctx
        .ask(InputRequest {
            prompt: "Anything to add?".into(),
            display: eve_core::Display::Text,
            options: vec![],
            allow_freeform: true,
            agent: None,
            approval: None,
        })
        .await;
    Ok(json!({ "note": note.text }))
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct DelegateInput {
    pub topic: String,
}

/// Delegates to a subagent that the host serves over HTTP (the registry has no AgentHost):
/// `{facts: [string…]}` on the topic, returned as the output.
pub async fn delegate(ctx: WorkflowCtx, input: DelegateInput) -> Result<Value, WorkflowError> {
    let facts = ctx
        .agent(
            eve_core::engine::AgentCall::new(
                "facts",
                "researcher",
                json!({ "topic": input.topic }),
            )
            .schema(json!({
                "type": "object",
                "required": ["facts"],
                "properties": {"facts": {"type": "array", "items": {"type": "string"}}}
            })),
        )?
        .await?;
    Ok(json!({ "facts": facts }))
}

/// The test tools.
pub fn registry() -> Registry {
    let tools: Vec<WorkflowTool> = vec![
        define_workflow_tool("Render a video.", workflow!(render_video)).named("render_video"),
        define_workflow_tool("Collect webhook deliveries.", workflow!(collect)).named("collect"),
        define_workflow_tool("Collect payloads on a hook.", workflow!(await_hook))
            .named("await_hook"),
        define_workflow_tool("Deploy a service.", workflow!(deploy)).named("deploy"),
        define_workflow_tool("A body that panics.", workflow!(broken)).named("broken"),
        define_workflow_tool("Report progress, then ask.", workflow!(report)).named("report"),
        define_workflow_tool("Delegate to a subagent.", workflow!(delegate)).named("delegate"),
        define_workflow_tool("Refund an order.", workflow!(refund))
            .named("refund_order")
            .background()
            .grace(Duration::from_millis(200)),
    ];
    tools
        .into_iter()
        .fold(Registry::new(DEPLOYMENT), Registry::with)
        .with(lookup_order())
}

/// The input of [`lookup_order`].
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct LookupInput {
    pub order_id: String,
}

/// An ordinary tool of default execution (it runs inline in the call): looks an order up;
/// the order `missing` is an error.
pub fn lookup_order() -> eve_core::engine::Tool {
    eve_core::engine::define_tool(
        "lookup_order",
        "Look an order up.",
        |_ctx: eve_core::engine::ToolCtx, input: LookupInput| async move {
            if input.order_id == "missing" {
                return Err(WorkflowError::new("no order missing in the shop"));
            }
            Ok(json!({ "order": input.order_id, "status": "shipped" }))
        },
    )
}

/// A worker for [`registry`] on `store`, polling often.
pub async fn worker(store: Arc<dyn JournalStore>) -> WorkerHandle {
    let config = WorkerConfig {
        poll_interval: Duration::from_millis(20),
        ..WorkerConfig::default()
    };
    Worker::new(store, registry(), Arc::new(SystemClock), config)
        .await
        .expect("register worker")
        .spawn()
}

/// Starts a tool call; returns its run id.
pub async fn start(
    store: &Arc<dyn JournalStore>,
    session: &str,
    call: &str,
    tool: &str,
    input: Value,
) -> RunId {
    start_tool_call(
        store.as_ref(),
        &registry(),
        &SessionId::new(session),
        &CallId::new(call),
        tool,
        input,
        Timestamp::now(),
    )
    .await
    .expect("start tool call")
    .run
    .run_id
}

/// The run's journal.
pub async fn journal(store: &Arc<dyn JournalStore>, run: &RunId) -> Vec<StoredEvent> {
    store.read_all(run, 0).await.expect("read journal")
}

/// How many events of the journal match `pred`.
pub fn count(events: &[StoredEvent], pred: impl Fn(&Event) -> bool) -> usize {
    events.iter().filter(|e| pred(&e.event)).count()
}

/// One Server-Sent Event.
#[derive(Debug, Clone)]
pub struct Frame {
    /// The `id:` as a number (a per-session stream's seq).
    pub id: Option<u64>,
    /// The `id:` as sent (a multiplexed stream's cursor).
    pub raw_id: Option<String>,
    pub event: Option<String>,
    pub data: String,
}

impl Frame {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).expect("SSE data is JSON")
    }
}

type ByteStream = Pin<Box<dyn futures::Stream<Item = reqwest::Result<axum::body::Bytes>> + Send>>;

/// A minimal SSE client over reqwest.
pub struct SseClient {
    stream: ByteStream,
    buf: String,
}

impl SseClient {
    pub async fn connect(url: &str, last_event_id: Option<u64>) -> Self {
        Self::connect_with(url, last_event_id, None).await
    }

    /// [`SseClient::connect`] with an API key.
    pub async fn connect_with(url: &str, last_event_id: Option<u64>, key: Option<&str>) -> Self {
        Self::connect_cursor(url, last_event_id.map(|n| n.to_string()).as_deref(), key).await
    }

    /// [`SseClient::connect_with`] with any `Last-Event-ID` (a multiplexed stream's cursor).
    pub async fn connect_cursor(url: &str, last_event_id: Option<&str>, key: Option<&str>) -> Self {
        let mut req = reqwest::Client::new()
            .get(url)
            .header("accept", "text/event-stream");
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        let resp = req.send().await.expect("connect SSE");
        assert_eq!(resp.status(), 200, "SSE status");
        assert!(resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        Self {
            stream: Box::pin(resp.bytes_stream()),
            buf: String::new(),
        }
    }

    /// The next event with data, or `None` when the server closed the stream.
    pub async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut frame = Frame {
                    id: None,
                    raw_id: None,
                    event: None,
                    data: String::new(),
                };
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        frame.id = v.trim().parse().ok();
                        frame.raw_id = Some(v.trim().to_owned());
                    } else if let Some(v) = line.strip_prefix("event:") {
                        frame.event = Some(v.trim().to_owned());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        frame.data.push_str(v.strip_prefix(' ').unwrap_or(v));
                    }
                }
                if !frame.data.is_empty() {
                    return Some(frame);
                }
                continue;
            }
            match tokio::time::timeout(WAIT, self.stream.next())
                .await
                .expect("SSE event in time")
            {
                Some(Ok(chunk)) => self.buf.push_str(&String::from_utf8_lossy(&chunk)),
                Some(Err(_)) | None => return None,
            }
        }
    }

    /// Events up to and including the first of type `event`.
    pub async fn until(&mut self, event: &str) -> Vec<Frame> {
        let mut seen = Vec::new();
        loop {
            let f = self
                .next()
                .await
                .unwrap_or_else(|| panic!("stream ended before {event}; saw {seen:?}"));
            let done = f.event.as_deref() == Some(event);
            seen.push(f);
            if done {
                return seen;
            }
        }
    }
}
