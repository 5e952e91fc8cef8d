//! The seed's workflow tools as runnable examples on a SQLite file: a reminder (sleep), a render
//! job that waits for a callback from another process, a deploy approval with a deadline and an
//! escalation (hook version: `deploy`; `ask` version: `deploy_deadline`), a deploy with
//! approval (`deploy_approval`), a background refund that asks now and acts when answered
//! (`refund_order`), and a background reminder that reports progress (`remind_with_progress`);
//! progress then an ask (`progress_then_ask`), a security review by a subagent
//! (`security_review`), a render that cleans up when cancelled (`render_cleanup`), and the
//! render that waits for a webhook (`render_video`; the hook version is `render_hook`).
//!
//! Beside the seed's, one tool of each kind the registry serves, so `eve serve` and `eve mcp`
//! show them all: a workflow tool gated by an approval policy (`rollback`,
//! `#[workflow(approval)]`), an ordinary tool that answers inline (`order_status`, `#[tool]`),
//! a background ordinary tool (`export_report`, `#[tool(background)]`) and a workflow tool that
//! labels its run with search attributes (`triage_ticket`, `ctx.set_attributes`).
//!
//! Each binary opens the SQLite file given by `--db` (default `eve-examples.db`), so several
//! processes can share it: one runs the worker, another delivers the callback or the answer.
//! The `session` binary calls every example through a [`Session`](eve_core::engine::Session).

use eve_core::engine::{Registry, SystemClock, Worker, WorkerConfig, WorkerHandle};
use eve_core::{Event, JournalStore, JournalStoreExt, RunId, RunStatus};
use eve_storage_sqlite::SqliteStore;
use std::sync::Arc;
use std::time::Duration;

pub mod channel;
pub mod deploy;
pub mod deploy_approval;
pub mod deploy_deadline;
pub mod export_report;
pub mod order_status;
pub mod progress_then_ask;
pub mod refund_order;
pub mod remind;
pub mod remind_with_progress;
pub mod render_cleanup;
pub mod render_hook;
pub mod render_video;
pub mod rollback;
pub mod security_review;
pub mod triage_ticket;

/// The deployment id the examples run under.
pub const DEPLOYMENT: &str = "examples-v1";

/// Every example tool: the seed's workflow tools, and `rollback` (approval-gated),
/// `order_status` (ordinary, inline), `export_report` (ordinary, background) and
/// `triage_ticket` (sets search attributes).
pub fn registry() -> Registry {
    Registry::new(DEPLOYMENT)
        .with(remind::execute)
        .with(render_hook::execute)
        .with(deploy::execute)
        .with(deploy_approval::execute)
        .with(deploy_deadline::execute)
        .with(refund_order::execute)
        .with(remind_with_progress::execute)
        .with(progress_then_ask::execute)
        .with(security_review::execute)
        .with(render_cleanup::execute)
        .with(render_video::execute)
        .with(rollback::execute)
        .with(order_status::order_status)
        .with(export_report::export_report)
        .with(triage_ticket::execute)
}

/// `--name value` from the command line.
pub fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Opens the SQLite file named by `--db` (default `eve-examples.db`).
///
/// # Panics
/// When the file cannot be opened: the examples stop with the store's message.
pub async fn open(args: &[String]) -> Arc<dyn JournalStore> {
    let path = arg(args, "--db").unwrap_or_else(|| "eve-examples.db".into());
    match SqliteStore::open(&path).await {
        Ok(s) => Arc::new(s),
        Err(e) => panic!("cannot open {path}: {e}"),
    }
}

/// Starts a background worker for the example tools with a lease of `lease`.
///
/// # Panics
/// When the worker cannot register.
pub async fn worker(store: Arc<dyn JournalStore>, lease: Duration) -> WorkerHandle {
    let config = WorkerConfig {
        lease_ttl: lease,
        poll_interval: Duration::from_millis(50),
        ..WorkerConfig::default()
    };
    Worker::new(store, registry(), Arc::new(SystemClock), config)
        .await
        .expect("register worker")
        .spawn()
}

/// Waits until the run leaves `running`, printing each new journal event as it lands.
///
/// # Panics
/// When the store fails.
pub async fn follow(store: &dyn JournalStore, run: &RunId, prefix: &str) -> RunStatus {
    let mut seen = 0;
    loop {
        let events = store.read_all(run, seen).await.expect("read journal");
        for e in &events {
            println!("{prefix} seq {:>2}  {}", e.seq, describe(&e.event));
        }
        seen += events.len() as u64;
        let status = store.get_run(run).await.expect("get run").status;
        if status != RunStatus::Running {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One line per event, for the examples' output.
pub fn describe(e: &Event) -> String {
    match e {
        Event::RunStarted { tool, input, .. } => format!("RunStarted      {tool} {}", input.get()),
        Event::StepCompleted {
            cmd,
            name,
            attempt,
            output,
        } => format!(
            "StepCompleted   cmd {cmd} {name:?} attempt {attempt} -> {}",
            output.get()
        ),
        Event::StepFailed {
            cmd, name, error, ..
        } => format!("StepFailed      cmd {cmd} {name:?}: {error}"),
        Event::SleepScheduled { cmd, wake_at } if *cmd == eve_core::engine::GUARD_CMD => {
            format!("(activation guard until {wake_at})")
        }
        Event::SleepFired { cmd } if *cmd == eve_core::engine::GUARD_CMD => {
            "(activation guard cleared)".into()
        }
        Event::SleepScheduled { cmd, wake_at } => {
            format!("SleepScheduled  cmd {cmd} until {wake_at}")
        }
        Event::SleepFired { cmd } => format!("SleepFired      cmd {cmd}"),
        Event::HookCreated { cmd, token, .. } => format!("HookCreated     cmd {cmd} {token:?}"),
        Event::HookReceived { cmd, payload } => {
            format!("HookReceived    cmd {cmd} {}", payload.get())
        }
        Event::RunCompleted { output } => format!("RunCompleted    {}", output.get()),
        Event::RunFailed { error } => format!("RunFailed       {error}"),
        Event::RunDenied { reason } => format!("RunDenied       {reason}"),
        Event::RunTerminated { reason, by } => format!("RunTerminated   by {by}: {reason}"),
        other => other.kind().to_owned(),
    }
}
