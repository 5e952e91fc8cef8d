#![allow(unreachable_pub)]
//! The approval policy on MemoryStore and SQLite: a person approves (the body runs) or denies
//! (the run ends `RunDenied`, the call settles `denied`, the body never runs); a policy that
//! denies or approves decides without asking; a pending approval survives a restart; the gate
//! composes with `ctx.ask` inside the body; and a gated call costs one worker append more than
//! the same call ungated.

mod common;

use common::Env;
use eve_core::engine::{
    define_workflow_tool, ActivationEnd, Approval, Registry, WorkflowCtx, WorkflowError,
    WorkflowTool,
};
use eve_core::testing::FaultyStore;
use eve_core::{
    workflow, Display, Event, InputRequest, InputResponse, MemoryStore, RequestId, RunId,
    RunStatus, SessionEvent, SessionId, StoreError, ToolResult,
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// How many times each body ran, by run.
static RAN: Mutex<Option<HashMap<RunId, usize>>> = Mutex::new(None);

fn ran(run: &RunId) -> usize {
    RAN.lock()
        .unwrap()
        .as_ref()
        .and_then(|m| m.get(run).copied())
        .unwrap_or(0)
}

fn count(ctx: &WorkflowCtx) {
    *RAN.lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .entry(ctx.run_id())
        .or_default() += 1;
}

/// A deployment.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Deploy {
    /// Which call.
    pub id: String,
    /// How much it costs.
    pub amount: i64,
}

mod deploy {
    use super::*;

    pub async fn execute(ctx: WorkflowCtx, input: Deploy) -> Result<String, WorkflowError> {
        count(&ctx);
        let id = input.id.clone();
        let done: String = ctx
            .step("deploy", move |_| {
                let id = id.clone();
                async move { Ok(format!("deployed {id}")) }
            })
            .await?;
        Ok(done)
    }

    /// Asks a person on every call.
    pub fn gated() -> WorkflowTool {
        define_workflow_tool("Deploy after approval.", workflow!(execute)).needs_approval()
    }

    /// The same body without a gate.
    pub fn ungated() -> WorkflowTool {
        define_workflow_tool("Deploy.", workflow!(execute).with_id("deploy::ungated"))
            .named("deploy_ungated")
    }

    /// Negative amounts are denied, small ones approved, large ones asked.
    pub fn by_amount(d: &Deploy) -> Approval {
        if d.amount < 0 {
            Approval::deny("a negative amount is never deployed")
        } else if d.amount <= 100 {
            Approval::Approve
        } else {
            Approval::Ask
        }
    }

    pub fn policed() -> WorkflowTool {
        define_workflow_tool(
            "Deploy, asking for large amounts.",
            workflow!(execute).with_id("deploy::policed"),
        )
        .named("deploy_policed")
        .approval(by_amount)
    }
}

mod confirm {
    use super::*;

    /// Gated, and asks again inside the body.
    pub async fn execute(ctx: WorkflowCtx, _input: Deploy) -> Result<String, WorkflowError> {
        count(&ctx);
        let answer = ctx
            .ask(InputRequest::confirmation("Really deploy now?"))
            .await;
        Ok(answer.option_id.unwrap_or_default())
    }

    pub fn tool() -> WorkflowTool {
        define_workflow_tool(
            "Deploy after approval and a confirmation.",
            workflow!(execute),
        )
        .needs_approval()
    }
}

fn registry() -> Registry {
    Registry::new("v1")
        .with(deploy::gated())
        .with(deploy::ungated())
        .with(deploy::policed())
        .with(confirm::tool())
}

async fn session_log(env: &Env) -> Vec<SessionEvent> {
    env.store
        .read_session(&SessionId::new("session-1"), 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event)
        .collect()
}

fn gate_id(run: &RunId) -> RequestId {
    RequestId::for_command(run, 0)
}

async fn answer(env: &Env, request: &RequestId, response: InputResponse) {
    env.store
        .answer(request, response, eve_core::engine::Clock::now(&*env.clock))
        .await
        .expect("answer");
}

async fn approved_runs_the_body(env: Env) {
    let reg = registry();
    let run = env
        .start(
            &reg,
            "c1",
            "deploy",
            json!({"id": "approve-1", "amount": 5}),
        )
        .await;
    let w = env.worker(&reg).await;
    assert_eq!(w.drain().await.unwrap()[0].1, ActivationEnd::Suspended);
    assert_eq!(ran(&run), 0, "the body waits for the approval");

    // The request shows the tool and the model's input, with approve / deny.
    let pending = env
        .store
        .pending_requests(&SessionId::new("session-1"))
        .await
        .unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].request_id, gate_id(&run));
    let request = &pending[0].request;
    assert_eq!(request.display, Display::Approval);
    let gate = request.approval.as_ref().expect("an approval request");
    assert_eq!(gate.tool, "deploy");
    assert_eq!(gate.input, json!({"id": "approve-1", "amount": 5}));
    let offered: Vec<&str> = request.options.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(offered, ["approve", "deny"]);
    assert!(matches!(
        &session_log(&env).await[0],
        SessionEvent::InputRequested { request, .. } if request.display == Display::Approval
    ));

    // An option not offered is refused and changes nothing.
    let err = env
        .store
        .answer(
            &gate_id(&run),
            InputResponse::option("maybe"),
            eve_core::engine::Clock::now(&*env.clock),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidAnswer { .. }), "{err}");

    answer(
        &env,
        &gate_id(&run),
        InputResponse::option("approve").by("ops"),
    )
    .await;
    w.drain().await.unwrap();
    assert_eq!(env.output(&run).await, json!("deployed approve-1"));
    assert_eq!(ran(&run), 1);
}

async fn denied_by_a_person_never_runs_the_body(env: Env) {
    let reg = registry();
    let run = env
        .start(&reg, "c1", "deploy", json!({"id": "deny-1", "amount": 5}))
        .await;
    let w = env.worker(&reg).await;
    w.drain().await.unwrap();
    answer(
        &env,
        &gate_id(&run),
        InputResponse {
            option_id: Some("deny".into()),
            text: Some("not on a Friday".into()),
            ..InputResponse::default()
        },
    )
    .await;
    let ends = w.drain().await.unwrap();
    assert_eq!(ends[0].1, ActivationEnd::Denied("not on a Friday".into()));
    let events = env.events(&run).await;
    assert_eq!(
        events.last(),
        Some(&Event::RunDenied {
            reason: "not on a Friday".into()
        })
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::StepCompleted { .. })),
        "{events:#?}"
    );
    assert_eq!(ran(&run), 0, "the body never ran");
    assert_eq!(env.status(&run).await, RunStatus::Failed);
    assert_eq!(
        session_log(&env).await.last(),
        Some(&SessionEvent::ToolSettled {
            result: ToolResult::Denied {
                reason: "not on a Friday".into()
            }
        })
    );

    // A denial without text names who denied.
    let run = env
        .start(&reg, "c2", "deploy", json!({"id": "deny-2", "amount": 5}))
        .await;
    w.drain().await.unwrap();
    answer(
        &env,
        &gate_id(&run),
        InputResponse::option("deny").by("alice"),
    )
    .await;
    w.drain().await.unwrap();
    assert_eq!(
        env.events(&run).await.last(),
        Some(&Event::RunDenied {
            reason: "denied by alice".into()
        })
    );
    assert_eq!(ran(&run), 0);
}

async fn a_policy_denies_without_asking(env: Env) {
    let reg = registry();
    let run = env
        .start(
            &reg,
            "c1",
            "deploy_policed",
            json!({"id": "policy-deny", "amount": -1}),
        )
        .await;
    let w = env.worker(&reg).await;
    let ends = w.drain().await.unwrap();
    assert_eq!(
        ends[0].1,
        ActivationEnd::Denied("a negative amount is never deployed".into())
    );
    // Journaled, nothing asked: the start and the denial.
    let events = env.events(&run).await;
    assert_eq!(events.len(), 2, "{events:#?}");
    assert_eq!(
        events[1],
        Event::RunDenied {
            reason: "a negative amount is never deployed".into()
        }
    );
    assert!(env
        .store
        .pending_requests(&SessionId::new("session-1"))
        .await
        .unwrap()
        .is_empty());
    assert!(!session_log(&env)
        .await
        .iter()
        .any(|e| matches!(e, SessionEvent::InputRequested { .. })));
    assert_eq!(ran(&run), 0);
}

async fn a_policy_approves_without_asking(env: Env) {
    let reg = registry();
    let small = env
        .start(
            &reg,
            "c1",
            "deploy_policed",
            json!({"id": "policy-ok", "amount": 7}),
        )
        .await;
    let w = env.worker(&reg).await;
    w.drain().await.unwrap();
    assert_eq!(env.output(&small).await, json!("deployed policy-ok"));
    assert!(!env
        .events(&small)
        .await
        .iter()
        .any(|e| matches!(e, Event::InputRequested { .. })));
    assert_eq!(ran(&small), 1);

    // A large amount asks a person.
    let large = env
        .start(
            &reg,
            "c2",
            "deploy_policed",
            json!({"id": "policy-ask", "amount": 1000}),
        )
        .await;
    w.drain().await.unwrap();
    assert_eq!(env.status(&large).await, RunStatus::Running);
    answer(&env, &gate_id(&large), InputResponse::option("approve")).await;
    w.drain().await.unwrap();
    assert_eq!(env.output(&large).await, json!("deployed policy-ask"));
}

async fn a_pending_approval_survives_a_restart(env: Env) {
    let run = {
        let reg = registry();
        let run = env
            .start(
                &reg,
                "c1",
                "deploy",
                json!({"id": "restart-1", "amount": 5}),
            )
            .await;
        let w = env.worker(&reg).await;
        w.drain().await.unwrap();
        run
        // The worker and its registry are dropped: the process is gone.
    };
    // A new process: a fresh registry and worker, nothing in memory.
    let reg = registry();
    let w = env.worker(&reg).await;
    assert!(
        w.drain().await.unwrap().is_empty(),
        "nothing due before the answer"
    );
    let pending = env
        .store
        .pending_requests(&SessionId::new("session-1"))
        .await
        .unwrap();
    assert_eq!(pending[0].request_id, gate_id(&run));
    answer(&env, &gate_id(&run), InputResponse::option("approve")).await;
    w.drain().await.unwrap();
    assert_eq!(env.output(&run).await, json!("deployed restart-1"));
    assert_eq!(ran(&run), 1);

    // Replaying the ended run from seq 0 matches the journal (the gate is command 0).
    let report = eve_core::engine::Worker::replay_cold(&env.store, &reg, &run)
        .await
        .expect("replay");
    assert!(report.finished, "{report:?}");
}

async fn the_gate_composes_with_ask(env: Env) {
    let reg = registry();
    let run = env
        .start(
            &reg,
            "c1",
            "confirm",
            json!({"id": "compose-1", "amount": 5}),
        )
        .await;
    let w = env.worker(&reg).await;
    w.drain().await.unwrap();
    answer(&env, &gate_id(&run), InputResponse::option("approve")).await;
    w.drain().await.unwrap();
    // The body's own ask is the next command.
    let pending = env
        .store
        .pending_requests(&SessionId::new("session-1"))
        .await
        .unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].request_id, RequestId::for_command(&run, 1));
    assert_eq!(pending[0].request.display, Display::Confirmation);
    assert!(pending[0].request.approval.is_none());
    answer(
        &env,
        &RequestId::for_command(&run, 1),
        InputResponse::option("approve"),
    )
    .await;
    w.drain().await.unwrap();
    assert_eq!(env.output(&run).await, json!("approve"));
    assert_eq!(ran(&run), 1);
}

on_both_stores!(
    approved_runs_the_body,
    denied_by_a_person_never_runs_the_body,
    a_policy_denies_without_asking,
    a_policy_approves_without_asking,
    a_pending_approval_survives_a_restart,
    the_gate_composes_with_ask,
);

/// The cost target: a gated call adds exactly one worker append (the approval request) before
/// the body, against the same call ungated; the answer is the person's one delivery.
#[tokio::test]
async fn a_gated_call_costs_one_append_more() {
    let faulty = FaultyStore::new(Arc::new(MemoryStore::new()));
    let env = common::memory().await.with_store(faulty.clone());
    let reg = registry();
    let w = env.worker(&reg).await;

    faulty.heal();
    let plain = env
        .start(
            &reg,
            "c1",
            "deploy_ungated",
            json!({"id": "cost-plain", "amount": 5}),
        )
        .await;
    w.drain().await.unwrap();
    assert_eq!(env.output(&plain).await, json!("deployed cost-plain"));
    let plain_log = faulty.call_log();
    let plain_events = env.events(&plain).await.len();

    faulty.heal();
    let gated = env
        .start(
            &reg,
            "c2",
            "deploy",
            json!({"id": "cost-gated", "amount": 5}),
        )
        .await;
    w.drain().await.unwrap();
    answer(&env, &gate_id(&gated), InputResponse::option("approve")).await;
    w.drain().await.unwrap();
    assert_eq!(env.output(&gated).await, json!("deployed cost-gated"));
    let gated_log = faulty.call_log();
    let gated_events = env.events(&gated).await.len();

    let appends = |log: &[&str]| log.iter().filter(|c| **c == "append").count();
    let deliveries = |log: &[&str]| log.iter().filter(|c| **c == "answer").count();
    eprintln!(
        "appends: ungated {} gated {}; journal events: ungated {plain_events} gated {gated_events}",
        appends(&plain_log),
        appends(&gated_log)
    );
    assert_eq!(
        appends(&gated_log),
        appends(&plain_log) + 1,
        "ungated {plain_log:?}\ngated {gated_log:?}"
    );
    assert_eq!(deliveries(&gated_log), 1);
    // The journal holds the request and its answer beside the ungated call's events.
    assert_eq!(gated_events, plain_events + 2);
}

/// A background call denied by its policy settles as `task.denied`.
#[tokio::test]
async fn a_denied_background_call_is_a_denied_task() {
    let env = common::memory().await;
    let reg = Registry::new("v1").with(
        define_workflow_tool("Deploy in the background.", workflow!(background_deploy))
            .named("bg")
            .background()
            .approval(|_: &Deploy| Approval::deny("frozen")),
    );
    let run = env
        .start(&reg, "c1", "bg", json!({"id": "bg-1", "amount": 1}))
        .await;
    env.worker(&reg).await.drain().await.unwrap();
    assert_eq!(
        session_log(&env).await.last(),
        Some(&SessionEvent::TaskDenied {
            reason: "frozen".into()
        })
    );
    assert_eq!(ran(&run), 0);
    assert_eq!(env.status(&run).await, RunStatus::Failed);
}

async fn background_deploy(ctx: WorkflowCtx, _input: Deploy) -> Result<String, WorkflowError> {
    count(&ctx);
    Ok("done".into())
}
