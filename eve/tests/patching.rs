//! Changing a body under runs in flight with `ctx.patched`: a run recorded on v1 and parked on
//! an ask resumes on v2's old branch while new runs take the new one; v2 without the patch
//! blocks the old run with `[EVE-ND-001]` naming the step, and adding the patch resumes it;
//! `eve replay`'s check (`Worker::replay_journal`) says the same before a deploy; and
//! `deprecate_patch` keeps replaying the runs that recorded the patch. On memory and SQLite.

use eve::engine::{start_tool_call, Clock, ManualClock, ReplayError, Worker, WorkerConfig};
use eve::prelude::*;
use eve::{CallId, Event, JournalStoreExt, Resolution, RunId, RunStatus, SessionId, Timestamp};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct Input {
    service: String,
}

#[step]
async fn plan(service: String) -> Result<String, StepError> {
    Ok(format!("roll out {service}"))
}

#[step]
async fn audit(plan: String) -> Result<String, StepError> {
    Ok(format!("audited: {plan}"))
}

#[step]
async fn apply(plan: String) -> Result<String, StepError> {
    Ok(format!("done: {plan}"))
}

mod v1 {
    use super::*;
    /// Deploy a service.
    #[workflow(name = "deploy", id = "patching::deploy")]
    pub(super) async fn deploy(ctx: WorkflowCtx, input: Input) -> Result<Value, WorkflowError> {
        let plan = plan(&ctx, input.service).await?;
        ctx.ask(InputRequest::confirmation(format!("{plan}?")))
            .await;
        let done = apply(&ctx, plan).await?;
        Ok(json!({ "done": done, "audited": false }))
    }
}

/// v2 as it should be written: the audit step only for runs that reach it under v2.
mod v2 {
    use super::*;
    /// Deploy a service.
    #[workflow(name = "deploy", id = "patching::deploy")]
    pub(super) async fn deploy(ctx: WorkflowCtx, input: Input) -> Result<Value, WorkflowError> {
        let plan = plan(&ctx, input.service).await?;
        let audited = if ctx.patched("audit") {
            audit(&ctx, plan.clone()).await?;
            true
        } else {
            false
        };
        ctx.ask(InputRequest::confirmation(format!("{plan}?")))
            .await;
        let done = apply(&ctx, plan).await?;
        Ok(json!({ "done": done, "audited": audited }))
    }
}

/// v2 written without a patch: the audit step inserted where v1 runs recorded their ask.
mod v2_unpatched {
    use super::*;
    /// Deploy a service.
    #[workflow(name = "deploy", id = "patching::deploy")]
    pub(super) async fn deploy(ctx: WorkflowCtx, input: Input) -> Result<Value, WorkflowError> {
        let plan = plan(&ctx, input.service).await?;
        audit(&ctx, plan.clone()).await?;
        ctx.ask(InputRequest::confirmation(format!("{plan}?")))
            .await;
        let done = apply(&ctx, plan).await?;
        Ok(json!({ "done": done, "audited": true }))
    }
}

/// v3, once no run from before the patch is left: only the new branch.
mod v3 {
    use super::*;
    /// Deploy a service.
    #[workflow(name = "deploy", id = "patching::deploy")]
    pub(super) async fn deploy(ctx: WorkflowCtx, input: Input) -> Result<Value, WorkflowError> {
        let plan = plan(&ctx, input.service).await?;
        ctx.deprecate_patch("audit");
        audit(&ctx, plan.clone()).await?;
        ctx.ask(InputRequest::confirmation(format!("{plan}?")))
            .await;
        let done = apply(&ctx, plan).await?;
        Ok(json!({ "done": done, "audited": true }))
    }
}

const DEPLOYMENT: &str = "patching-tests";

fn registry(tool: impl IntoWorkflowTool) -> Registry {
    Registry::new(DEPLOYMENT).with(tool)
}

struct Scene {
    store: Arc<dyn JournalStore>,
    clock: Arc<ManualClock>,
}

impl Scene {
    async fn start(&self, call: &str) -> RunId {
        start_tool_call(
            &*self.store,
            &registry(v1::deploy),
            &SessionId::new("s"),
            &CallId::new(call),
            "deploy",
            json!({ "service": call }),
            self.clock.now(),
        )
        .await
        .unwrap()
        .run
        .run_id
    }

    /// Runs everything due with `tool`'s code, as a worker of that deployment would.
    async fn drain(&self, id: &str, tool: impl IntoWorkflowTool) {
        let worker = Worker::new(
            self.store.clone(),
            registry(tool),
            self.clock.clone(),
            WorkerConfig {
                id: Some(eve::WorkerId::new(id)),
                ..WorkerConfig::default()
            },
        )
        .await
        .unwrap();
        worker.drain().await.unwrap();
    }

    async fn approve(&self, run: &RunId) {
        let pending = self
            .store
            .pending_requests(&SessionId::new("s"))
            .await
            .unwrap();
        let request = pending
            .iter()
            .find(|p| &p.run_id == run)
            .unwrap_or_else(|| panic!("{run} asks nothing: {pending:?}"));
        self.store
            .answer(
                &request.request_id,
                InputResponse::option("approve"),
                self.clock.now(),
            )
            .await
            .unwrap();
    }

    async fn journal(&self, run: &RunId) -> Vec<eve::StoredEvent> {
        self.store.read_all(run, 0).await.unwrap()
    }

    async fn status(&self, run: &RunId) -> RunStatus {
        self.store.get_run(run).await.unwrap().status
    }

    async fn output(&self, run: &RunId) -> Value {
        match &self.journal(run).await.last().unwrap().event {
            Event::RunCompleted { output } => serde_json::from_str(output.get()).unwrap(),
            other => panic!("{run} did not complete: {other:?}"),
        }
    }
}

fn steps(journal: &[eve::StoredEvent]) -> Vec<String> {
    journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::StepCompleted { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect()
}

async fn scenario(store: Arc<dyn JournalStore>) {
    let s = Scene {
        store,
        clock: ManualClock::new(Timestamp::now()),
    };
    // v1: two runs park on their ask.
    let (a, b) = (s.start("a").await, s.start("b").await);
    s.drain("v1", v1::deploy).await;
    s.approve(&a).await;
    s.approve(&b).await;

    // v2 without the patch: the old runs diverge at the step inserted before their ask, and
    // are parked, not failed, with the code and the step named.
    s.drain("v2-unpatched", v2_unpatched::deploy).await;
    for run in [&a, &b] {
        assert_eq!(s.status(run).await, RunStatus::Blocked);
        let reason = s
            .journal(run)
            .await
            .iter()
            .find_map(|e| match &e.event {
                Event::RunBlocked { reason } => Some(reason.clone()),
                _ => None,
            })
            .unwrap();
        assert!(
            reason.contains("[EVE-ND-001]") && reason.contains("step \"audit\""),
            "{reason}"
        );
    }

    // v2 with the patch: resumed, the old runs finish on the old branch.
    for run in [&a, &b] {
        s.store
            .resolve_blocked(run, Resolution::Resume, s.clock.now())
            .await
            .unwrap();
    }
    s.drain("v2", v2::deploy).await;
    for run in [&a, &b] {
        assert_eq!(s.status(run).await, RunStatus::Completed);
        assert_eq!(s.output(run).await["audited"], false);
        assert_eq!(steps(&s.journal(run).await), ["plan", "apply"]);
    }

    // A new run under v2 takes the new branch; the decision is journaled.
    let c = s.start("c").await;
    s.drain("v2", v2::deploy).await;
    s.approve(&c).await;
    s.drain("v2", v2::deploy).await;
    assert_eq!(s.output(&c).await["audited"], true);
    let jc = s.journal(&c).await;
    assert_eq!(steps(&jc), ["plan", "audit", "apply"]);
    assert!(jc
        .iter()
        .any(|e| matches!(&e.event, Event::Patched { cmd: 1, id } if id == "audit")));

    // The check `eve replay` runs: both journals replay on v2; on the unpatched v2 the old one
    // diverges at the audit step and the new one at its patch marker.
    let ja = s.journal(&a).await;
    let check = |tool: eve::engine::WorkflowTool, run: &RunId, j: &[eve::StoredEvent]| {
        Worker::replay_journal(&registry(tool), run, j)
    };
    assert!(check(v2::deploy.into_tool(), &a, &ja).unwrap().finished);
    assert!(check(v2::deploy.into_tool(), &c, &jc).unwrap().finished);
    match check(v2_unpatched::deploy.into_tool(), &a, &ja) {
        Err(ReplayError::NonDeterminism(nd)) => {
            assert_eq!((nd.cmd, nd.found.as_str()), (1, "step \"audit\""))
        }
        other => panic!("{other:?}"),
    }
    match check(v2_unpatched::deploy.into_tool(), &c, &jc) {
        Err(ReplayError::NonDeterminism(nd)) => {
            assert_eq!((nd.cmd, nd.expected.as_str()), (1, "patch \"audit\""))
        }
        other => panic!("{other:?}"),
    }
    // v3 (deprecated patch) replays the runs that recorded it; a run from before the patch
    // would now diverge, which is why the deprecation waits for them to end.
    assert!(check(v3::deploy.into_tool(), &c, &jc).unwrap().finished);
    assert!(check(v3::deploy.into_tool(), &a, &ja).is_err());
    // And new runs under v3 record no marker.
    let d = s.start("d").await;
    s.drain("v3", v3::deploy).await;
    s.approve(&d).await;
    s.drain("v3", v3::deploy).await;
    let jd = s.journal(&d).await;
    assert_eq!(steps(&jd), ["plan", "audit", "apply"]);
    assert!(!jd.iter().any(|e| matches!(e.event, Event::Patched { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patched_on_memory() {
    scenario(Arc::new(eve::MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patched_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = eve::sqlite::SqliteStore::open(dir.path().join("p.db"))
        .await
        .unwrap();
    scenario(Arc::new(store)).await;
}

/// A cancel requested while a run waits, then a deploy whose code diverges from the run's
/// journal: the activation that would park the run as blocked ends it cancelled instead, so
/// the call settles (before, it stayed blocked, its call pending, and a second cancel was
/// `AlreadyRequested`). A run nobody cancelled is still parked as blocked.
async fn cancel_before_divergence(store: Arc<dyn JournalStore>) {
    let s = Scene {
        store,
        clock: ManualClock::new(Timestamp::now()),
    };
    let (cancelled, kept) = (s.start("cancelled").await, s.start("kept").await);
    s.drain("v1", v1::deploy).await;
    assert!(matches!(
        s.store
            .request_cancel(&cancelled, "stop", s.clock.now())
            .await
            .unwrap(),
        eve::CancelOutcome::Requested { .. }
    ));
    s.approve(&kept).await;
    s.drain("v2u", v2_unpatched::deploy).await;

    assert_eq!(s.status(&cancelled).await, RunStatus::Cancelled);
    let j = s.journal(&cancelled).await;
    assert!(
        matches!(j.last().unwrap().event, Event::RunCancelled),
        "{:?}",
        j.last()
    );
    assert!(!j
        .iter()
        .any(|e| matches!(e.event, Event::RunBlocked { .. })));
    let settled = s
        .store
        .read_session(&SessionId::new("s"), 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .any(|e| {
            e.run_id == cancelled
                && matches!(
                    e.event,
                    eve::SessionEvent::ToolSettled {
                        result: eve::ToolResult::Cancelled
                    }
                )
        });
    assert!(settled, "the cancelled call settles as cancelled");
    assert_eq!(s.status(&kept).await, RunStatus::Blocked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_before_divergence_on_memory() {
    cancel_before_divergence(Arc::new(eve::MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_before_divergence_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = eve::sqlite::SqliteStore::open(dir.path().join("c.db"))
        .await
        .unwrap();
    cancel_before_divergence(Arc::new(store)).await;
}
