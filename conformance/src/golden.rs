//! Golden stores: data made by one version of eve that every later version must open, migrate
//! forward and finish (the compatibility promise of the README).
//!
//! [`populate`] fills a fresh store with what a real deployment holds: runs parked on an ask, a
//! hook, a webhook and a sleep; runs that completed, failed and were cancelled; a pending
//! request, live hooks, API keys (one revoked), and sessions (a live one with queued messages, an
//! ended one with a queued message). Each backend's `make_golden` test (ignored; run by hand at
//! a release) saves what it made under `fixtures/golden/v<version>/`, and its `golden` test
//! opens that fixture with today's code and runs [`check`]: the contents are all there, and the
//! parked runs finish with today's engine.
//!
//! The workflow bodies and ids here are frozen: a later version may add new ones, never change
//! these (a changed body would be a non-determinism, not a compatibility break).

use eve_core::engine::{
    define_workflow_tool, start_tool_call, Clock, ManualClock, Registry, Worker, WorkerConfig,
    WorkflowCtx, WorkflowError, WorkflowTool,
};
use eve_core::{
    ApiKey, CallId, Event, InputRequest, InputResponse, JournalStore, JournalStoreExt, KeyScope,
    Payload, RunId, RunQuery, RunRecord, RunStatus, SessionId, StoredEvent, Timestamp,
    WebhookResponse,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The deployment of every golden run.
pub const DEPLOYMENT: &str = "golden-v1";
/// The session of the golden runs (live, with two queued messages).
pub const SESSION: &str = "golden-session";
/// A session that was ended with one message still queued.
pub const ENDED_SESSION: &str = "golden-ended-session";
/// The token of the parked hook.
pub const HOOK_TOKEN: &str = "golden-hook-token";
/// When the golden data was made (2026-01-01T00:00:00Z); the checker's clock starts later.
pub const MADE_AT: Timestamp = Timestamp(1_767_225_600_000);

/// The tool calls of [`SESSION`], by call id, and how each stands in the fixture.
pub const CALLS: &[(&str, RunStatus)] = &[
    ("ask", RunStatus::Running),
    ("hook", RunStatus::Running),
    ("webhook", RunStatus::Running),
    ("sleep", RunStatus::Running),
    ("done", RunStatus::Completed),
    ("failed", RunStatus::Failed),
    ("cancelled", RunStatus::Cancelled),
];

/// Input of the golden tools: a label, echoed in outputs.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct Label {
    /// Echoed.
    pub label: String,
}

async fn ask(ctx: WorkflowCtx, input: Label) -> Result<String, WorkflowError> {
    let before = ctx
        .step("before", |_| async { Ok("before".to_owned()) })
        .await?;
    let answer = ctx
        .ask(InputRequest::confirmation(format!("Ship {}?", input.label)))
        .await;
    let chosen = answer.option_id.unwrap_or_default();
    Ok(format!("{before}/{}/{chosen}", input.label))
}

async fn hook(ctx: WorkflowCtx, input: Label) -> Result<serde_json::Value, WorkflowError> {
    let hook = ctx.create_hook::<serde_json::Value>(HOOK_TOKEN);
    let got = hook.next().await?;
    Ok(serde_json::json!({ "label": input.label, "got": got }))
}

async fn webhook(ctx: WorkflowCtx, input: Label) -> Result<serde_json::Value, WorkflowError> {
    let mut headers = BTreeMap::new();
    headers.insert("x-golden".to_owned(), "yes".to_owned());
    let hook = ctx.create_webhook_with::<serde_json::Value>(WebhookResponse {
        status: 201,
        headers,
        body: serde_json::json!({ "thanks": input.label }),
    });
    let got = hook.next().await?;
    Ok(serde_json::json!({ "got": got }))
}

async fn sleep(ctx: WorkflowCtx, input: Label) -> Result<String, WorkflowError> {
    ctx.progress(&serde_json::json!({ "sleeping": true }));
    ctx.sleep("1h").await;
    let after = ctx
        .step("after", |_| async { Ok("woke".to_owned()) })
        .await?;
    Ok(format!("{after}/{}", input.label))
}

async fn done(ctx: WorkflowCtx, input: Label) -> Result<u32, WorkflowError> {
    let mut sum = 0;
    for i in 0..3u32 {
        sum += ctx.step("add", move |_| async move { Ok(i + 1) }).await?;
    }
    let _ = input;
    Ok(sum)
}

async fn failed(ctx: WorkflowCtx, input: Label) -> Result<(), WorkflowError> {
    ctx.step("check", |_| async { Ok(1u32) }).await?;
    Err(WorkflowError::new(format!(
        "golden failure of {}",
        input.label
    )))
}

/// The golden tools, under frozen names and workflow ids.
pub fn tools() -> Vec<WorkflowTool> {
    let tool = |t: WorkflowTool, name: &str| t.named(name);
    vec![
        tool(
            define_workflow_tool(
                "Asks, then answers.",
                eve_core::workflow!(ask).with_id("golden::ask"),
            ),
            "golden_ask",
        ),
        tool(
            define_workflow_tool(
                "Waits for a hook.",
                eve_core::workflow!(hook).with_id("golden::hook"),
            ),
            "golden_hook",
        ),
        tool(
            define_workflow_tool(
                "Waits for a webhook.",
                eve_core::workflow!(webhook).with_id("golden::webhook"),
            ),
            "golden_webhook",
        ),
        tool(
            define_workflow_tool(
                "Sleeps an hour.",
                eve_core::workflow!(sleep).with_id("golden::sleep"),
            ),
            "golden_sleep",
        ),
        tool(
            define_workflow_tool(
                "Adds in steps.",
                eve_core::workflow!(done).with_id("golden::done"),
            ),
            "golden_done",
        ),
        tool(
            define_workflow_tool(
                "Fails after a step.",
                eve_core::workflow!(failed).with_id("golden::failed"),
            ),
            "golden_failed",
        ),
    ]
}

/// The registry of the golden tools.
pub fn registry() -> Registry {
    tools()
        .into_iter()
        .fold(Registry::new(DEPLOYMENT), |r, t| r.with(t))
}

fn tool_of(call: &str) -> &'static str {
    match call {
        "ask" | "cancelled" => "golden_ask",
        "hook" => "golden_hook",
        "webhook" => "golden_webhook",
        "sleep" => "golden_sleep",
        "done" => "golden_done",
        _ => "golden_failed",
    }
}

async fn worker(store: &Arc<dyn JournalStore>, clock: &Arc<ManualClock>) -> Worker {
    Worker::new(
        Arc::clone(store),
        registry(),
        clock.clone(),
        WorkerConfig {
            lease_ttl: Duration::from_secs(30),
            store_retries: 0,
            ..WorkerConfig::default()
        },
    )
    .await
    .expect("register a golden worker")
}

/// The API keys of the fixture: `(id, name, scope, hash, revoked)`.
pub const KEYS: &[(&str, &str, KeyScope, &str, bool)] = &[
    (
        "golden-admin",
        "ops",
        KeyScope::Admin,
        "sha256:golden-admin",
        false,
    ),
    (
        "golden-old",
        "retired",
        KeyScope::Answer,
        "sha256:golden-old",
        true,
    ),
];

/// Fills a fresh `store` with the golden data (see the module docs).
///
/// # Panics
/// On any store or engine error: the generator must make all of it.
pub async fn populate(store: Arc<dyn JournalStore>) {
    let clock = ManualClock::new(MADE_AT);
    let w = worker(&store, &clock).await;
    let reg = registry();
    let session = SessionId::new(SESSION);
    for (call, _) in CALLS {
        start_tool_call(
            &*store,
            &reg,
            &session,
            &CallId::new(*call),
            tool_of(call),
            serde_json::json!({ "label": call }),
            clock.now(),
        )
        .await
        .unwrap_or_else(|e| panic!("start {call}: {e}"));
    }
    w.drain()
        .await
        .expect("run the golden calls until they park");
    let cancelled = run_of(&*store, "cancelled").await;
    store
        .request_cancel(&cancelled.run_id, "golden cancel", clock.now())
        .await
        .expect("cancel");
    clock.advance(Duration::from_secs(1));
    w.drain().await.expect("run the cancel");

    for (id, name, scope, hash, revoked) in KEYS {
        store
            .create_key(ApiKey {
                id: (*id).into(),
                name: (*name).into(),
                scope: *scope,
                hash: (*hash).into(),
                created_at: clock.now(),
                revoked_at: None,
                expires_at: Some(Timestamp(MADE_AT.0 + 365 * 86_400_000)),
                sessions: None,
                request: None,
            })
            .await
            .expect("create_key");
        if *revoked {
            store.revoke_key(id, clock.now()).await.expect("revoke_key");
        }
    }
    for m in ["first", "second"] {
        store
            .queue_message(&session, json(m), clock.now())
            .await
            .expect("queue_message");
    }
    let ended = SessionId::new(ENDED_SESSION);
    store
        .queue_message(&ended, json("left behind"), clock.now())
        .await
        .expect("queue_message");
    store
        .end_session(&ended, clock.now())
        .await
        .expect("end_session");
    for (call, status) in CALLS {
        assert_eq!(
            run_of(&*store, call).await.status,
            *status,
            "golden call {call}"
        );
    }
}

fn json(text: &str) -> Payload {
    Payload::from_value(&serde_json::json!({ "text": text })).expect("json")
}

/// The run of golden call `call`.
///
/// # Panics
/// When the store has none.
pub async fn run_of(store: &dyn JournalStore, call: &str) -> RunRecord {
    store
        .list_runs(&RunQuery {
            session: Some(SessionId::new(SESSION)),
            ..RunQuery::default()
        })
        .await
        .expect("list_runs")
        .into_iter()
        .find(|r| r.call_id.as_str() == call)
        .unwrap_or_else(|| panic!("no golden run for call {call}"))
}

/// Every run's journal as `eve journal <run> --json` exports it (one [`StoredEvent`] a line),
/// by run id.
///
/// # Panics
/// On a store error.
pub async fn export_journals(store: &dyn JournalStore) -> BTreeMap<RunId, String> {
    let mut out = BTreeMap::new();
    for (call, _) in CALLS {
        let run = run_of(store, call).await;
        let mut text = String::new();
        for e in store.read_all(&run.run_id, 0).await.expect("read_all") {
            text.push_str(&serde_json::to_string(&e).expect("an event serializes"));
            text.push('\n');
        }
        out.insert(run.run_id, text);
    }
    out
}

/// Checks exported journals (see [`export_journals`]) made by an earlier version: every line
/// decodes with today's types, every journal holds seqs 0, 1, 2, … from its `RunStarted`, and
/// each replays against today's golden bodies (what `eve replay` does with an export).
///
/// # Panics
/// On a line that does not decode, a journal out of order, or one that does not replay.
pub fn check_exported_journal(run: &RunId, text: &str) {
    let mut journal: Vec<StoredEvent> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let e: StoredEvent = serde_json::from_str(line)
            .unwrap_or_else(|err| panic!("{run}: line {}: {err}: {line}", i + 1));
        assert_eq!(
            e.seq,
            journal.len() as u64,
            "{run}: line {}: seqs in order",
            i + 1
        );
        journal.push(e);
    }
    assert!(
        matches!(
            journal.first().map(|e| &e.event),
            Some(Event::RunStarted { .. })
        ),
        "{run}: the journal starts with RunStarted"
    );
    Worker::replay_journal(&registry(), run, &journal)
        .unwrap_or_else(|e| panic!("{run}: the exported journal replays with today's code: {e}"));
}

/// Checks a store opened on a golden fixture (made by [`populate`], then migrated forward by
/// opening it with today's code): every run, journal, request, key and session is there, and
/// the parked runs finish with today's engine once answered, delivered to and woken.
///
/// # Panics
/// On anything missing or different.
pub async fn check(store: Arc<dyn JournalStore>) {
    let st = &*store;
    let session = SessionId::new(SESSION);
    let mut runs = BTreeMap::new();
    for (call, status) in CALLS {
        let run = run_of(st, call).await;
        assert_eq!(run.status, *status, "golden call {call}");
        assert_eq!(run.deployment_id.as_str(), DEPLOYMENT);
        let journal = st
            .read_all(&run.run_id, 0)
            .await
            .unwrap_or_else(|e| panic!("the journal of {call} reads with today's code: {e}"));
        assert_eq!(
            journal.len() as u64,
            run.next_seq,
            "{call}: the whole journal"
        );
        runs.insert(*call, (run, journal));
    }
    let pending = st.pending_requests(&session).await.expect("pending");
    assert_eq!(pending.len(), 1, "the ask is pending: {pending:?}");
    assert_eq!(pending[0].run_id, runs["ask"].0.run_id);
    let log = st.read_session(&session, 0, 1000).await.expect("log");
    assert!(!log.is_empty(), "the session log is kept");
    let keys = st.list_keys().await.expect("list_keys");
    for (id, name, scope, hash, revoked) in KEYS {
        let k = keys
            .iter()
            .find(|k| k.id == *id)
            .unwrap_or_else(|| panic!("key {id} is kept"));
        assert_eq!(
            (k.name.as_str(), k.scope, k.revoked_at.is_some()),
            (*name, *scope, *revoked)
        );
        let by_hash = st.key_by_hash(hash).await.expect("key_by_hash");
        assert_eq!(by_hash.as_ref().map(|k| k.id.as_str()), Some(*id));
    }
    let live = st.get_session(&session).await.expect("get_session");
    assert_eq!(live.ended_at, None);
    assert_eq!(live.queued.len(), 2, "the live session's queue is kept");
    let ended = st
        .get_session(&SessionId::new(ENDED_SESSION))
        .await
        .expect("get_session");
    assert!(ended.ended_at.is_some(), "the ended session stays ended");
    assert_eq!(ended.queued.len(), 1, "its queued message is kept");

    // Finish the parked runs with today's engine.
    let clock = ManualClock::new(Timestamp(MADE_AT.0 + 60_000));
    let w = worker(&store, &clock).await;
    st.answer(
        &pending[0].request_id,
        InputResponse::option("approve"),
        clock.now(),
    )
    .await
    .expect("answer the golden ask");
    st.deliver_hook(HOOK_TOKEN, json("hooked"), Some("golden-1"), clock.now())
        .await
        .expect("deliver to the golden hook");
    let token = runs["webhook"]
        .1
        .iter()
        .find_map(|e| match &e.event {
            Event::HookCreated {
                token,
                webhook: true,
                respond_with: Some(r),
                ..
            } => {
                assert_eq!(r.status, 201, "the webhook's response is kept");
                Some(token.clone())
            }
            _ => None,
        })
        .expect("the golden webhook's HookCreated");
    st.deliver_hook(&token, json("webhooked"), None, clock.now())
        .await
        .expect("deliver to the golden webhook");
    clock.advance(Duration::from_secs(2 * 3600));
    w.drain().await.expect("finish the golden runs");
    let outputs: BTreeMap<&str, serde_json::Value> = [
        ("ask", serde_json::json!("before/ask/approve")),
        (
            "hook",
            serde_json::json!({ "label": "hook", "got": { "text": "hooked" } }),
        ),
        (
            "webhook",
            serde_json::json!({ "got": { "text": "webhooked" } }),
        ),
        ("sleep", serde_json::json!("woke/sleep")),
    ]
    .into_iter()
    .collect();
    for (call, want) in outputs {
        let run = run_of(st, call).await;
        assert_eq!(
            run.status,
            RunStatus::Completed,
            "parked golden run {call} finishes"
        );
        let last = st
            .last_event(&run)
            .await
            .expect("last event")
            .expect("an event");
        match last.event {
            Event::RunCompleted { output } => {
                let got: serde_json::Value = output.to_value().expect("json");
                assert_eq!(got, want, "the output of golden run {call}");
            }
            other => panic!("{call} ended with {other:?}"),
        }
    }
}
