//! Every seed example called through a `Session` on a SQLite file, with a manual clock and a
//! worker driven by `drain`: each test asserts the example's channel events (the session log)
//! and its one result. `session_bin` runs the `session` binary end to end as a user would.

use eve_core::engine::{
    resume_hook, ActivationEnd, Clock, ManualClock, Registry, ScriptedAgentHost, Session,
    ToolCallStart, TurnOutcome, TurnPolicy, Worker, WorkerConfig, GRACE_CMD, WEBHOOK_PATH,
};
use eve_core::{
    Event, InputResponse, JournalStore, JournalStoreExt, Payload, RequestId, RunId, RunStatus,
    SessionEntry, SessionEvent, SessionId, Timestamp, ToolResult, WebhookRequest,
};
use eve_examples::channel::kind;
use eve_examples::registry;
use eve_examples::render_cleanup::farm::{self, JobState};
use eve_examples::security_review;
use eve_storage_sqlite::SqliteStore;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);

struct Env {
    store: Arc<dyn JournalStore>,
    /// A second handle on the file: answers and callbacks come from "another process".
    other: Arc<dyn JournalStore>,
    clock: Arc<ManualClock>,
    worker: Worker,
    session: Session,
    _dir: tempfile::TempDir,
}

impl Env {
    async fn new() -> Self {
        Self::with_registry(|_, _| registry()).await
    }

    /// An env whose worker runs `make(store, clock)`'s registry (e.g. with an agent host on the
    /// store).
    async fn with_registry(
        make: impl FnOnce(Arc<dyn JournalStore>, Arc<ManualClock>) -> Registry,
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("examples.db");
        let store: Arc<dyn JournalStore> =
            Arc::new(SqliteStore::open(&path).await.expect("open sqlite"));
        let other: Arc<dyn JournalStore> =
            Arc::new(SqliteStore::open(&path).await.expect("open sqlite"));
        let clock = ManualClock::new(Timestamp(1_700_000_000_000));
        let worker = Worker::new(
            store.clone(),
            make(store.clone(), clock.clone()),
            clock.clone(),
            WorkerConfig {
                lease_ttl: Duration::from_secs(30),
                store_retries: 0,
                ..WorkerConfig::default()
            },
        )
        .await
        .expect("register worker");
        let session = Session::new(
            store.clone(),
            Arc::new(registry()),
            clock.clone(),
            SessionId::new("examples"),
        );
        Self {
            store,
            other,
            clock,
            worker,
            session,
            _dir: dir,
        }
    }

    /// The same session seen from the second store handle.
    fn other_session(&self) -> Session {
        Session::new(
            self.other.clone(),
            Arc::new(registry()),
            self.clock.clone(),
            SessionId::new("examples"),
        )
    }

    async fn drain(&self) {
        self.worker.drain().await.expect("drain");
    }

    async fn call(&self, tool: &str, input: Value) -> ToolCallStart {
        let start = self
            .session
            .call_tool("call-1", tool, input)
            .await
            .expect("call the tool");
        self.drain().await;
        start
    }

    async fn log(&self) -> Vec<SessionEntry> {
        self.session.events(0, 1000).await.expect("session log")
    }

    async fn kinds(&self) -> Vec<String> {
        self.log().await.iter().map(|e| kind(&e.event)).collect()
    }

    async fn the_request(&self) -> RequestId {
        let pending = self.session.pending_requests().await.unwrap();
        assert_eq!(pending.len(), 1, "{pending:?}");
        pending[0].request_id.clone()
    }

    async fn answer(&self, option: &str) {
        let request = self.the_request().await;
        self.other_session()
            .answer(&request, InputResponse::option(option))
            .await
            .expect("answer");
        self.drain().await;
    }

    async fn settled(&self) -> ToolResult {
        self.session
            .settlement(&"call-1".into())
            .await
            .unwrap()
            .expect("the call is settled")
    }

    async fn steps(&self, run: &RunId) -> Vec<String> {
        self.store
            .read_all(run, 0)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|e| match e.event {
                Event::StepCompleted { name, .. } => Some(name),
                _ => None,
            })
            .collect()
    }
}

fn completed(v: Value) -> ToolResult {
    ToolResult::Completed {
        output: Payload::from(v),
    }
}

fn task_completed(v: Value) -> SessionEvent {
    SessionEvent::TaskCompleted {
        output: Payload::from(v),
    }
}

#[tokio::test]
async fn deploy_with_approval() {
    for (option, expected) in [
        (
            "approve",
            json!({"deployed": true, "url": "https://deploy.example/api/1"}),
        ),
        ("cancel", json!({"deployed": false, "reason": "rejected"})),
    ] {
        let env = Env::new().await;
        let start = env.call("deploy_approval", json!({"service": "api"})).await;
        assert!(matches!(start, ToolCallStart::Parked { .. }));
        let log = env.log().await;
        let SessionEvent::InputRequested { request, .. } = &log[0].event else {
            panic!("{log:?}")
        };
        assert_eq!(
            request.prompt,
            "Deploy api?\n\nroll out api to 3 regions, 10% at a time"
        );
        assert_eq!(
            request
                .options
                .iter()
                .map(|o| &o.id[..])
                .collect::<Vec<_>>(),
            ["approve", "cancel"]
        );
        // The turn is parked on the call until the person answers.
        assert_eq!(
            env.session
                .user_message(TurnPolicy::Queue, json!("a user message"))
                .await
                .unwrap(),
            TurnOutcome::Queued {
                waiting_on: vec!["call-1".into()]
            }
        );
        env.clock.advance(2 * HOUR);
        env.answer(option).await;
        assert_eq!(
            env.kinds().await,
            ["input.requested", "input.answered", "tool.settled"]
        );
        assert_eq!(env.settled().await, completed(expected));
        let steps = env.steps(start.run_id()).await;
        if option == "approve" {
            assert_eq!(steps, ["plan_deploy", "apply_deploy"]);
        } else {
            assert_eq!(steps, ["plan_deploy"]);
        }
    }
}

#[tokio::test]
async fn approve_with_a_deadline_and_an_escalation() {
    // (answer after how long, expected result, whether on-call was paged)
    let deployed = json!({"deployed": true, "url": "https://deploy.example/api/1"});
    let cases = [
        (Some(HOUR), deployed.clone(), false),
        (Some(10 * HOUR), deployed, true),
        (
            None,
            json!({"deployed": false, "reason": "timed out"}),
            true,
        ),
    ];
    for (answer_after, expected, paged) in cases {
        let env = Env::new().await;
        let start = env.call("deploy_deadline", json!({"service": "api"})).await;
        match answer_after {
            Some(after) => {
                // Move the clock in steps so each due deadline fires on its own.
                let mut left = after;
                while left > Duration::ZERO {
                    let step = left.min(HOUR);
                    env.clock.advance(step);
                    env.drain().await;
                    left -= step;
                }
                env.answer("approve").await;
                assert_eq!(
                    env.kinds().await,
                    ["input.requested", "input.answered", "tool.settled"],
                    "one request on the channel the whole time"
                );
            }
            None => {
                let request = env.the_request().await;
                env.clock.advance(4 * HOUR);
                env.drain().await;
                assert_eq!(
                    env.the_request().await,
                    request,
                    "after paging, the same request is still pending"
                );
                env.clock.advance(20 * HOUR);
                env.drain().await;
                // Returning withdrew the request.
                assert_eq!(
                    env.kinds().await,
                    ["input.requested", "input.withdrawn", "tool.settled"]
                );
                assert!(env.session.pending_requests().await.unwrap().is_empty());
            }
        }
        assert_eq!(env.settled().await, completed(expected));
        let steps = env.steps(start.run_id()).await;
        assert_eq!(
            steps.contains(&"page_on_call".to_owned()),
            paged,
            "{steps:?}"
        );
    }
}

#[tokio::test]
async fn wait_for_a_callback_hook_version() {
    for (status, ok) in [("ok", true), ("failed", false)] {
        let env = Env::new().await;
        let start = env
            .call("render_hook", json!({"project_id": format!("p-{status}")}))
            .await;
        assert!(
            env.kinds().await.is_empty(),
            "nothing on the channel while waiting"
        );
        resume_hook(
            &*env.other,
            &eve_examples::render_hook::token(&format!("p-{status}")),
            &json!({"status": status, "url": "https://cdn.example/p.mp4"}),
            Some("delivery-1"),
            env.clock.now(),
        )
        .await
        .expect("the render farm calls back");
        env.drain().await;
        assert_eq!(env.kinds().await, ["tool.settled"]);
        if ok {
            assert_eq!(
                env.settled().await,
                completed(json!({"job": "job-p-ok", "url": "https://cdn.example/p.mp4"}))
            );
        } else {
            assert!(matches!(
                env.settled().await,
                ToolResult::Failed { error } if error.contains("Render job-p-failed failed: failed")
            ));
            assert_eq!(
                env.store.get_run(start.run_id()).await.unwrap().status,
                RunStatus::Failed
            );
        }
    }
}

#[tokio::test]
async fn refund_ask_now_act_when_answered() {
    for (option, expected) in [
        (
            "approve",
            json!({"refunded": true, "receipt": "rf-o-1-2500"}),
        ),
        ("deny", json!({"refunded": false})),
    ] {
        let env = Env::new().await;
        let start = env
            .call("refund_order", json!({"order_id": "o-1", "amount": 25.0}))
            .await;
        let ToolCallStart::Working { task_id } = &start else {
            panic!("a background receipt: {start:?}")
        };
        assert_eq!(
            serde_json::to_value(&start).unwrap(),
            json!({"status": "working", "taskId": task_id.as_str()})
        );
        // The conversation continues: the turn holds nothing, even a steer leaves the task.
        assert!(matches!(
            env.session
                .user_message(TurnPolicy::Steer, json!("a user message"))
                .await
                .unwrap(),
            TurnOutcome::Delivered { .. }
        ));
        assert_eq!(
            env.session.tasks().await.unwrap()[0].status,
            RunStatus::Running
        );
        assert_eq!(env.kinds().await, ["input.requested"]);
        env.clock.advance(26 * HOUR);
        env.answer(option).await;
        let log = env.log().await;
        assert_eq!(
            log.iter().map(|e| kind(&e.event)).collect::<Vec<_>>(),
            ["input.requested", "input.answered", "task.completed"]
        );
        assert_eq!(log[2].event, task_completed(expected));
        assert_eq!(
            env.session.tasks().await.unwrap()[0].status,
            RunStatus::Completed
        );
    }
}

#[tokio::test]
async fn remind_me_later() {
    let env = Env::new().await;
    let start = env
        .call("remind", json!({"note": "stretch", "delay": "4h"}))
        .await;
    assert!(matches!(start, ToolCallStart::Working { .. }));
    assert!(
        env.kinds().await.is_empty(),
        "the session parks between receipt and wake"
    );
    env.clock.advance(4 * HOUR);
    env.drain().await;
    assert_eq!(
        env.log()
            .await
            .iter()
            .map(|e| e.event.clone())
            .collect::<Vec<_>>(),
        [task_completed(json!({"reminder": "Reminder: stretch"}))]
    );
    assert_eq!(
        env.steps(start.run_id()).await,
        ["prepare", "compose", "deliver"]
    );
}

#[tokio::test]
async fn remind_with_progress() {
    let env = Env::new().await;
    let start = env
        .call(
            "remind_with_progress",
            json!({"note": "stretch", "delay": "4h"}),
        )
        .await;
    assert!(matches!(start, ToolCallStart::Working { .. }));
    let before = env.log().await;
    assert_eq!(
        before.iter().map(|e| e.event.clone()).collect::<Vec<_>>(),
        [
            SessionEvent::TaskProgress {
                value: Payload::from(json!({"status": "preparing reminder"}))
            },
            SessionEvent::TaskMessage {
                message: Payload::from(json!("Reminder scheduled for 4h."))
            },
        ],
        "progress (stream-only) and one message before the durable sleep"
    );
    env.clock.advance(4 * HOUR);
    env.drain().await;
    assert_eq!(
        env.kinds().await,
        ["task.progress", "task.message", "task.completed"]
    );
    assert_eq!(
        env.log().await[2].event,
        task_completed(json!({"reminder": "stretch"}))
    );
}

#[tokio::test]
async fn progress_then_ask() {
    let env = Env::new().await;
    let start = env.call("progress_then_ask", json!({})).await;
    assert!(matches!(start, ToolCallStart::Parked { .. }));
    // The yield reports a snapshot, then the ask is the durable wait: the call stays pending.
    let log = env.log().await;
    assert_eq!(
        log.iter().map(|e| kind(&e.event)).collect::<Vec<_>>(),
        ["action.partial", "input.requested"]
    );
    assert_eq!(
        log[0].event,
        SessionEvent::ActionPartial {
            value: Payload::from(json!({"status": "awaiting approval"}))
        }
    );
    let SessionEvent::InputRequested { request, .. } = &log[1].event else {
        panic!("{log:?}")
    };
    assert_eq!(request.prompt, "Continue?");
    assert!(env
        .session
        .settlement(&"call-1".into())
        .await
        .unwrap()
        .is_none());
    env.clock.advance(3 * HOUR);
    env.answer("approve").await;
    assert_eq!(
        env.kinds().await,
        [
            "action.partial",
            "input.requested",
            "input.answered",
            "tool.settled"
        ]
    );
    assert_eq!(
        env.settled().await,
        completed(json!({"answer": {"optionId": "approve"}}))
    );
}

#[tokio::test]
async fn security_review_by_a_subagent() {
    let reviews = [
        (
            json!({"approved": true, "findings": ["no open ports"]}),
            true,
        ),
        (
            json!({"approved": false, "findings": ["port 22 is open"]}),
            false,
        ),
    ];
    for (review, approved) in reviews {
        let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
        let host = Arc::new(std::sync::Mutex::new(None));
        let (seen, slot) = (asked.clone(), host.clone());
        let env = Env::with_registry(move |store, clock| {
            let h = ScriptedAgentHost::new(store).with_clock(clock).reply(
                security_review::TARGET,
                move |start| {
                    seen.lock().unwrap().push(start.message.clone());
                    Ok(review.clone())
                },
            );
            *slot.lock().unwrap() = Some(h.clone());
            registry().with_agent_host(Arc::new(h))
        })
        .await;
        let host = host.lock().unwrap().clone().unwrap();
        let start = env.call("security_review", json!({"service": "api"})).await;
        assert!(matches!(start, ToolCallStart::Parked { .. }));
        // The subagent was started once, with the plan, and its result decided the deploy.
        assert_eq!(
            host.starts(start.run_id(), security_review::KEY)
                .map(|(_, n)| n),
            Some(1)
        );
        assert_eq!(
            *asked.lock().unwrap(),
            [json!(
                "Review the deployment plan for security risks.\n\nroll out api to 3 regions, 10% at a time"
            )]
        );
        let expected = if approved {
            json!({"deployed": true, "url": "https://deploy.example/api/1", "findings": ["no open ports"]})
        } else {
            json!({"deployed": false, "reason": "security review", "findings": ["port 22 is open"]})
        };
        assert_eq!(env.settled().await, completed(expected));
        assert_eq!(env.kinds().await, ["tool.settled"]);
        let steps = env.steps(start.run_id()).await;
        if approved {
            assert_eq!(steps, ["plan_deploy", "apply_deploy"]);
        } else {
            assert_eq!(steps, ["plan_deploy"]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_cleanup_aborts_the_job_on_cancel() {
    let env = Env::new().await;
    let start = env
        .session
        .call_tool(
            "call-1",
            "render_cleanup",
            json!({"project_id": "c-cancel"}),
        )
        .await
        .unwrap();
    let run = start.run_id().clone();
    let worker = env.worker.clone();
    let activation = tokio::spawn(async move { worker.run_once().await });
    // The farm renders (an hour); the user steers, which cancels the turn's waiting call.
    while farm::state("job-c-cancel") != Some(JobState::Rendering) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        env.session
            .user_message(TurnPolicy::Steer, json!("stop"))
            .await
            .unwrap(),
        TurnOutcome::Steered {
            cancelled: vec![run.clone()]
        }
    );
    let ends = activation.await.unwrap().unwrap();
    assert_eq!(ends, [(run.clone(), ActivationEnd::Cancelled)]);
    // The wait observed the abort; the cleanup step ran within the grace period and aborted
    // the job at the farm.
    assert_eq!(farm::state("job-c-cancel"), Some(JobState::Aborted));
    assert_eq!(env.steps(&run).await, ["submit_render", "abort_render"]);
    let events: Vec<Event> = env
        .store
        .read_all(&run, 0)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event)
        .collect();
    let grace = events
        .iter()
        .position(|e| matches!(e, Event::SleepScheduled { cmd, .. } if *cmd == GRACE_CMD))
        .expect("the grace deadline");
    let cleanup = events
        .iter()
        .position(|e| matches!(e, Event::StepCompleted { name, .. } if name == "abort_render"))
        .unwrap();
    assert!(grace < cleanup, "{events:?}");
    assert_eq!(events.last(), Some(&Event::RunCancelled));
    assert_eq!(env.settled().await, ToolResult::Cancelled);
    assert_eq!(env.kinds().await, ["tool.settled"]);

    // Not cancelled, the render finishes and nothing is cleaned up.
    let env = Env::new().await;
    let start = env
        .call(
            "render_cleanup",
            json!({"project_id": "c-ok", "render_for": "0s"}),
        )
        .await;
    assert_eq!(
        env.settled().await,
        completed(json!({"url": "https://cdn.example/job-c-ok.mp4"}))
    );
    assert_eq!(
        env.steps(start.run_id()).await,
        ["submit_render", "wait_for_render"]
    );
    assert_eq!(farm::state("job-c-ok"), Some(JobState::Done));
}

#[tokio::test]
async fn wait_for_a_callback_webhook() {
    for (status, ok) in [("ok", true), ("failed", false)] {
        let env = Env::new().await;
        let project = format!("w-{status}");
        let start = env
            .call("render_video", json!({ "project_id": project }))
            .await;
        let run = start.run_id();
        assert!(
            env.kinds().await.is_empty(),
            "nothing on the channel while waiting"
        );
        // The farm was handed the webhook's absolute URL: EVE_BASE_URL + the webhook's path.
        // The journal records the job id only: the URL's token is the webhook's secret.
        let events = env.store.read_all(run, 0).await.unwrap();
        let token = events
            .iter()
            .find_map(|e| match &e.event {
                Event::HookCreated { token, .. } => Some(token.clone()),
                _ => None,
            })
            .expect("the webhook");
        let job = format!("job-{project}");
        assert!(events.iter().any(|e| matches!(
            &e.event,
            Event::StepCompleted { name, output, .. }
                if name == "submit_render" && output.get() == format!("{job:?}")
        )));
        let base = std::env::var("EVE_BASE_URL")
            .unwrap_or_else(|_| eve_examples::render_video::DEFAULT_BASE_URL.into());
        assert_eq!(
            eve_examples::render_video::farm::callback_url(&job),
            Some(format!(
                "{}{WEBHOOK_PATH}{token}",
                base.trim_end_matches('/')
            ))
        );
        // The farm POSTs to it (what `eve serve` delivers), from another process.
        let request = WebhookRequest {
            method: "POST".into(),
            headers: [("content-type".to_owned(), "application/json".to_owned())].into(),
            body: json!({"status": status, "url": "https://cdn.example/w.mp4"}),
        };
        resume_hook(
            &*env.other,
            &token,
            &request,
            Some("delivery-1"),
            env.clock.now(),
        )
        .await
        .expect("the render farm calls back");
        env.drain().await;
        assert_eq!(env.kinds().await, ["tool.settled"]);
        if ok {
            assert_eq!(
                env.settled().await,
                completed(json!({"url": "https://cdn.example/w.mp4"}))
            );
        } else {
            assert!(matches!(
                env.settled().await,
                ToolResult::Failed { error } if error == "Render job-w-failed failed: failed"
            ));
        }
    }
}

/// Runs the `session` binary on a temp SQLite file and returns its stdout.
fn session_bin(args: &[&str], db: &std::path::Path) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_session"))
        .args(args)
        .args(["--db", db.to_str().unwrap()])
        .output()
        .expect("run the session bin");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "session {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn session_bin_runs_each_example() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("session-bin.db");
    let cases: [(&[&str], &str, &str); 10] = [
        (
            &["deploy", "--answer-after", "0s"],
            r#"["input.requested", "input.answered", "tool.settled"]"#,
            r#""deployed":true"#,
        ),
        (
            &["progress-ask", "--answer-after", "0s"],
            r#"["action.partial", "input.requested", "input.answered", "tool.settled"]"#,
            r#""answer":{"optionId":"approve"}"#,
        ),
        (
            &["security-review"],
            r#"["tool.settled"]"#,
            r#""deployed":true"#,
        ),
        (
            &["security-review", "--verdict", "reject"],
            r#"["tool.settled"]"#,
            r#""reason":"security review""#,
        ),
        (
            &["render-cleanup", "--project", "bin", "--cancel-after", "0s"],
            r#"["tool.settled"]"#,
            "(render farm: job job-bin is Some(Aborted))",
        ),
        (
            &[
                "deadline", "--first", "1s", "--second", "1s", "--answer", "none",
            ],
            r#"["input.requested", "input.withdrawn", "tool.settled"]"#,
            r#""reason":"timed out""#,
        ),
        (
            &["render", "--project", "bin"],
            r#"["tool.settled"]"#,
            r#""url":"https://cdn.example/job-bin.mp4""#,
        ),
        (
            &["render-hook", "--project", "bin"],
            r#"["tool.settled"]"#,
            r#""url":"https://cdn.example/bin.mp4""#,
        ),
        (
            &["refund", "--answer-after", "0s"],
            r#"["input.requested", "input.answered", "task.completed"]"#,
            r#"result: {"receipt":"rf-o-1-2500","refunded":true}"#,
        ),
        (
            &["remind-progress", "--delay", "1s"],
            r#"["task.progress", "task.message", "task.completed"]"#,
            r#"result: {"reminder":"stretch"}"#,
        ),
    ];
    for (args, kinds, result) in cases {
        let out = session_bin(args, &db);
        assert!(
            out.contains(&format!("channel events: {kinds}")),
            "{args:?}:\n{out}"
        );
        assert!(out.contains(result), "{args:?}:\n{out}");
    }
}
