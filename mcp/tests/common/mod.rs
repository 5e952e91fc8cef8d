//! What the MCP client tests share: a server on a temp SQLite store, rmcp clients, polling.
#![allow(dead_code, unreachable_pub)]

use eve_core::engine::{Registry, SystemClock, Worker, WorkerConfig, WorkerHandle};
use eve_core::JournalStore;
use eve_mcp::McpServer;
use eve_storage_sqlite::SqliteStore;
use rmcp::model::{
    ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction,
    GetTaskParams, Implementation, ProgressNotificationParam, TaskPayload, TaskStatus,
};
use rmcp::service::{NotificationContext, RequestContext, RoleClient};
use rmcp::{ClientHandler, ErrorData};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod nap {
    use eve_core::engine::{
        define_workflow_tool, Either, WorkflowCtx, WorkflowError, WorkflowTool,
    };
    use eve_core::workflow;

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    pub struct Input {}

    /// Reports "napping" and sleeps an hour; cancelled, it runs a `cleanup` step in its grace period.
    pub async fn execute(ctx: WorkflowCtx, _: Input) -> Result<String, WorkflowError> {
        ctx.progress("napping");
        match ctx.race(ctx.sleep("1h"), ctx.abort_signal()).await {
            Either::Left(()) => Ok("slept".into()),
            Either::Right(()) => Ok(ctx
                .step("cleanup", |_| async { Ok("cleaned".to_owned()) })
                .await?),
        }
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool(
            "Sleep an hour; clean up when cancelled.",
            workflow!(execute),
        )
        .named("nap")
    }
}

mod weigh {
    use eve_core::engine::{define_workflow_tool, WorkflowCtx, WorkflowError, WorkflowTool};
    use eve_core::workflow;

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    pub struct Input {
        pub grams: u32,
    }

    /// A typed output, declared as the tool's output schema.
    #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
    pub struct Weight {
        pub kilograms: f64,
    }

    /// Converts grams to kilograms.
    pub async fn execute(_ctx: WorkflowCtx, input: Input) -> Result<Weight, WorkflowError> {
        Ok(Weight {
            kilograms: f64::from(input.grams) / 1000.0,
        })
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Convert grams to kilograms.", workflow!(execute))
            .named("weigh")
            .output_schema_of::<Weight>()
    }
}

mod survey {
    use eve_core::engine::{define_workflow_tool, WorkflowCtx, WorkflowError, WorkflowTool};
    use eve_core::{workflow, InputOption, InputRequest};

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    pub struct Input {}

    /// Asks two questions at once (two requests pending together) and returns the choices.
    pub async fn execute(ctx: WorkflowCtx, _: Input) -> Result<Vec<String>, WorkflowError> {
        let question = |prompt: &str| {
            InputRequest::select(
                prompt,
                vec![InputOption::new("yes", "Yes"), InputOption::new("no", "No")],
            )
        };
        let answers = ctx
            .join_all(vec![ctx.ask(question("Tea?")), ctx.ask(question("Milk?"))])
            .await;
        Ok(answers
            .into_iter()
            .map(|a| a.option_id.unwrap_or_default())
            .collect())
    }

    pub fn tool() -> WorkflowTool {
        // Declared: the body's `ctx.ask` is not visible to `define_workflow_tool`.
        define_workflow_tool("Ask two questions at once.", workflow!(execute))
            .named("survey")
            .waits_for_input()
    }
}

mod delegate {
    use eve_core::engine::{
        define_workflow_tool, AgentCall, AgentError, WorkflowCtx, WorkflowError, WorkflowTool,
    };
    use eve_core::workflow;
    use serde_json::{json, Value};

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    pub struct Input {
        /// What the reviewer looks at.
        pub topic: String,
    }

    /// The output schema of the review: `{"verdict": "pass" | "fail", "notes"?: string}`.
    pub fn verdict_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "verdict": { "type": "string", "enum": ["pass", "fail"] },
                "notes": { "type": "string" },
            },
            "required": ["verdict"],
        })
    }

    /// Delegates a review of `topic` to the subagent `security-reviewer` through `ctx.agent`
    /// (key `review`, output schema [`verdict_schema`]; the registry has no `AgentHost`, so the
    /// call is served over the wire) and returns `{"review": output}`, or `{"failed": why}`
    /// when the child failed.
    pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<Value, WorkflowError> {
        let call = AgentCall::new(
            "review",
            "security-reviewer",
            json!({ "topic": input.topic }),
        )
        .schema(verdict_schema());
        Ok(match ctx.agent(call)?.await {
            Ok(v) => json!({ "review": v }),
            Err(AgentError::Failed { message, .. }) => json!({ "failed": message }),
            Err(e) => return Err(e.into()),
        })
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool(
            "Ask the security-reviewer subagent for a verdict on a topic.",
            workflow!(execute),
        )
        .named("delegate")
        .waits_for_input()
    }
}

mod transfer {
    use eve_core::engine::{define_workflow_tool, WorkflowCtx, WorkflowError, WorkflowTool};
    use eve_core::workflow;

    #[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
    pub struct Input {
        /// Cents.
        pub cents: u64,
    }

    /// Sends the cents in a `send` step, once approved.
    pub async fn execute(
        ctx: WorkflowCtx,
        input: Input,
    ) -> Result<serde_json::Value, WorkflowError> {
        let sent = ctx
            .step("send", move |_| async move { Ok(input.cents) })
            .await?;
        Ok(serde_json::json!({ "sent": sent }))
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Transfer cents after approval.", workflow!(execute))
            .named("transfer")
            .needs_approval()
    }
}

mod explain {
    use eve_core::engine::{define_workflow_tool, WorkflowCtx, WorkflowError, WorkflowTool};
    use eve_core::{workflow, InputRequest};

    #[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
    pub struct Input {}

    /// Asks for free text: no option to choose for a person who declines.
    pub async fn execute(ctx: WorkflowCtx, _: Input) -> Result<String, WorkflowError> {
        let answer = ctx.ask(InputRequest::text("Why ship on Friday?")).await;
        Ok(answer.text.unwrap_or_default())
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool("Ask why.", workflow!(execute))
            .named("explain")
            .waits_for_input()
    }
}

#[allow(unused_imports)]
pub use delegate::verdict_schema;

/// The tools the tests call: the examples', `nap` (sleeps; cleans up when cancelled), `weigh`
/// (declares its output schema), `survey` (two requests pending at once) and `delegate` (a
/// subagent call with an output schema), `transfer` (gated by an approval) and `explain` (asks
/// for free text).
pub fn registry() -> Registry {
    eve_examples::registry()
        .with(nap::tool())
        .with(weigh::tool())
        .with(survey::tool())
        .with(delegate::tool())
        .with(transfer::tool())
        .with(explain::tool())
}

/// A SQLite store, [`registry`], a worker, and the MCP server over them.
pub async fn server(db: &Path) -> (McpServer, Arc<dyn JournalStore>, WorkerHandle) {
    server_with(db, registry()).await
}

/// A SQLite store, `registry`, a worker polling every 50 ms, and the MCP server over them.
pub async fn server_with(
    db: &Path,
    registry: Registry,
) -> (McpServer, Arc<dyn JournalStore>, WorkerHandle) {
    let store: Arc<dyn JournalStore> = Arc::new(SqliteStore::open(db).await.expect("open store"));
    let worker = Worker::new(
        store.clone(),
        registry.clone(),
        Arc::new(SystemClock),
        WorkerConfig {
            poll_interval: Duration::from_millis(50),
            ..WorkerConfig::default()
        },
    )
    .await
    .expect("register worker");
    let mcp = McpServer::new(store.clone(), Arc::new(registry)).with_worker(worker.clone());
    (mcp, store, worker.spawn())
}

/// An MCP server over streamable HTTP on a loopback port (`url` ends in `/mcp`), its store and
/// the temporary directory of its SQLite file.
pub struct HttpFixture {
    pub _dir: tempfile::TempDir,
    pub url: String,
    pub store: Arc<dyn JournalStore>,
}

/// [`registry`] served over HTTP (see [`HttpFixture`]).
pub async fn http_fixture() -> HttpFixture {
    http_fixture_with(registry()).await
}

/// `registry` served over HTTP on a fresh SQLite file; the worker lives as long as the server.
pub async fn http_fixture_with(registry: Registry) -> HttpFixture {
    let dir = tempfile::tempdir().unwrap();
    let (mcp, store, worker) = server_with(&dir.path().join("eve.db"), registry).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().nest_service("/mcp", eve_mcp::router(mcp));
    tokio::spawn(async move {
        let _worker = worker;
        axum::serve(listener, app).await.unwrap();
    });
    HttpFixture {
        _dir: dir,
        url: format!("http://{addr}/mcp"),
        store,
    }
}

/// `client` connected to the fixture's server over streamable HTTP.
pub async fn connect(
    f: &HttpFixture,
    client: TestClient,
) -> rmcp::service::RunningService<RoleClient, TestClient> {
    use rmcp::ServiceExt;
    client
        .serve(rmcp::transport::StreamableHttpClientTransport::from_uri(
            f.url.clone(),
        ))
        .await
        .expect("connect")
}

/// A `tools/call` of `tool` with `args` (a JSON object).
pub fn call(tool: &str, args: serde_json::Value) -> rmcp::model::CallToolRequestParams {
    rmcp::model::CallToolRequestParams::new(tool.to_owned())
        .with_arguments(args.as_object().unwrap().clone())
}

/// An rmcp client handler: declares the tasks extension and/or elicitation, answers every
/// elicitation with `answer` (accept `{"option": answer}`), and records what it was asked and
/// the progress it was sent.
#[derive(Clone, Debug, Default)]
pub struct TestClient {
    pub tasks: bool,
    pub answer: Option<String>,
    pub asked: Arc<Mutex<Vec<serde_json::Value>>>,
    pub progress: Arc<Mutex<Vec<String>>>,
    /// Declares `sampling` and answers every `sampling/createMessage` with this text
    /// (`Ok`), or with a JSON-RPC error of this message (`Err`).
    pub sample: Option<Result<String, String>>,
    /// The params of every sampling request received.
    pub sampled: Arc<Mutex<Vec<serde_json::Value>>>,
    /// Declares `sampling` and never answers a sampling request (it stays pending).
    pub hang: bool,
    /// Declares elicitation and answers every elicitation with this action and no content
    /// (`decline` or `cancel`: what a person's "no" or closed dialog sends).
    pub refuse: Option<ElicitationAction>,
    /// Every `notifications/message` received (its `data`).
    pub logs: Arc<Mutex<Vec<serde_json::Value>>>,
    /// Every `notifications/tasks` received (its params).
    pub statuses: Arc<Mutex<Vec<serde_json::Value>>>,
    /// Names the eve session at `initialize` (`_meta["eve/session"]`).
    pub session: Option<String>,
}

impl TestClient {
    pub fn tasks() -> Self {
        Self {
            tasks: true,
            ..Self::default()
        }
    }

    pub fn eliciting(answer: &str) -> Self {
        Self {
            answer: Some(answer.to_owned()),
            ..Self::default()
        }
    }

    /// Declares elicitation and answers each elicitation with `action` (no content).
    pub fn refusing(action: ElicitationAction) -> Self {
        Self {
            refuse: Some(action),
            ..Self::default()
        }
    }

    /// Declares `sampling` and answers each sampling request with the text `reply`.
    pub fn sampling(reply: &str) -> Self {
        Self {
            sample: Some(Ok(reply.to_owned())),
            ..Self::default()
        }
    }
}

impl ClientHandler for TestClient {
    fn get_info(&self) -> ClientConfig {
        let caps = match (self.tasks, self.answer.is_some() || self.refuse.is_some()) {
            (true, true) => ClientCapabilities::builder()
                .enable_tasks()
                .enable_elicitation()
                .build(),
            (true, false) => ClientCapabilities::builder().enable_tasks().build(),
            (false, true) => ClientCapabilities::builder().enable_elicitation().build(),
            (false, false) => ClientCapabilities::default(),
        };
        let mut caps = caps;
        if self.sample.is_some() || self.hang {
            caps.sampling = Some(Default::default());
        }
        let mut config = ClientConfig::new(caps, Implementation::new("eve-mcp-test", "0"));
        if let Some(session) = &self.session {
            let mut meta = rmcp::model::RequestMetaObject::new();
            meta.0
                .insert(eve_mcp::META_SESSION.into(), session.clone().into());
            config.meta = Some(meta);
        }
        config
    }

    #[allow(deprecated)]
    async fn create_message(
        &self,
        params: rmcp::model::CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<rmcp::model::CreateMessageResult, ErrorData> {
        // rmcp moves the request's `_meta` into the context: put it back.
        let mut seen = serde_json::to_value(&params).unwrap();
        let mut meta = serde_json::to_value(&context.meta).unwrap();
        if let Some(m) = meta.as_object_mut() {
            m.remove("progressToken");
        }
        seen["_meta"] = meta;
        self.sampled.lock().unwrap().push(seen);
        if self.hang {
            std::future::pending::<()>().await;
        }
        match self.sample.clone() {
            Some(Ok(text)) => Ok(rmcp::model::CreateMessageResult::new(
                rmcp::model::SamplingMessage::assistant_text(text),
                "test-model".into(),
            )),
            Some(Err(message)) => Err(ErrorData::new(rmcp::model::ErrorCode(-1), message, None)),
            None => Err(ErrorData::method_not_found::<
                rmcp::model::CreateMessageRequestMethod,
            >()),
        }
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        self.asked
            .lock()
            .unwrap()
            .push(serde_json::to_value(&request).unwrap());
        if let Some(action) = &self.refuse {
            return Ok(ElicitResult::new(action.clone()));
        }
        let mut result = ElicitResult::new(ElicitationAction::Accept);
        result.content =
            Some(serde_json::json!({ "option": self.answer.clone().unwrap_or_default() }));
        Ok(result)
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress
            .lock()
            .unwrap()
            .push(params.message.unwrap_or_default());
    }

    #[allow(deprecated)] // logging: eve's notices use it.
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.logs.lock().unwrap().push(params.data);
    }

    async fn on_task_status(
        &self,
        params: rmcp::model::TaskStatusNotificationParams,
        _context: NotificationContext<RoleClient>,
    ) {
        self.statuses
            .lock()
            .unwrap()
            .push(serde_json::to_value(&params).unwrap());
    }
}

/// Waits until `check` holds (panics after 20 s naming `what`), re-checking every 20 ms.
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < Duration::from_secs(20), "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `tasks/get` until the task has `status` (panics after 20 s).
pub async fn wait_status(
    peer: &rmcp::Peer<RoleClient>,
    task_id: &str,
    status: TaskStatus,
) -> rmcp::model::GetTaskResult {
    let start = Instant::now();
    loop {
        let got = peer
            .get_task(GetTaskParams::new(task_id))
            .await
            .expect("tasks/get");
        if got.task.status() == status {
            return got;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "task {task_id} never reached {status:?}: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The one input request key of an `input_required` task, with the request as JSON.
pub fn only_request(task: &rmcp::model::GetTaskResult) -> (String, serde_json::Value) {
    match &task.task.payload {
        TaskPayload::InputRequired { input_requests } => {
            assert_eq!(input_requests.len(), 1, "{input_requests:?}");
            let (k, v) = input_requests.iter().next().unwrap();
            (k.clone(), serde_json::to_value(v).unwrap())
        }
        other => panic!("not input_required: {other:?}"),
    }
}

/// Checks the approval form of deploy_approval: an enum of the option ids titled with labels.
pub fn assert_approval_form(request: &serde_json::Value) {
    assert_eq!(request["method"], "elicitation/create", "{request}");
    let params = &request["params"];
    assert!(
        params["message"]
            .as_str()
            .unwrap()
            .starts_with("Deploy api?"),
        "{request}"
    );
    let option = &params["requestedSchema"]["properties"]["option"];
    assert_eq!(
        option["oneOf"],
        serde_json::json!([
            {"const": "approve", "title": "Deploy"},
            {"const": "cancel", "title": "Cancel"}
        ]),
        "{request}"
    );
    assert_eq!(
        params["requestedSchema"]["required"],
        serde_json::json!(["option"])
    );
}

/// The answer `{"action": "accept", "content": {"option": id}}` under `key`.
pub fn choose(key: &str, id: &str) -> rmcp::model::InputResponses {
    [(
        key.to_owned(),
        serde_json::json!({ "action": "accept", "content": { "option": id } }),
    )]
    .into_iter()
    .collect()
}

/// The output of a completed task.
pub fn completed_output(task: &rmcp::model::GetTaskResult) -> serde_json::Value {
    match &task.task.payload {
        TaskPayload::Completed { result } => result["structuredContent"].clone(),
        other => panic!("not completed: {other:?}"),
    }
}

/// Known methods with malformed params, each with the field its -32602 must name: the same
/// cases on every transport.
#[allow(dead_code)]
pub fn malformed_params() -> [(serde_json::Value, &'static str, &'static str); 4] {
    use serde_json::json;
    [
        (json!({}), "tasks/get", "taskId"),
        (
            json!({ "taskId": "run_x" }),
            "tasks/update",
            "inputResponses",
        ),
        (
            json!({ "name": "weigh", "arguments": "x" }),
            "tools/call",
            "arguments",
        ),
        (json!({ "name": 5 }), "tools/call", "name"),
    ]
}

/// Starts `p` as a task (the client declared the tasks extension) and returns its id; the
/// receipt carries a poll interval.
pub async fn start_task(
    c: &rmcp::service::RunningService<RoleClient, TestClient>,
    p: rmcp::model::CallToolRequestParams,
) -> String {
    match c.call_tool_once(p).await.expect("tools/call") {
        rmcp::model::CallToolResponse::Task(t) => {
            assert!(t.task.poll_interval_ms.is_some());
            t.task.task_id
        }
        other => panic!("expected a task, got {other:?}"),
    }
}

/// The JSON-RPC error `r` must be.
pub fn rpc_error(r: Result<impl std::fmt::Debug, rmcp::ServiceError>) -> rmcp::ErrorData {
    match r {
        Err(rmcp::ServiceError::McpError(e)) => e,
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

/// How many runs the store holds.
pub async fn runs(store: &dyn JournalStore) -> usize {
    store
        .list_runs(&eve_core::RunQuery::default())
        .await
        .unwrap()
        .len()
}
