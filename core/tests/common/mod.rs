//! Shared helpers for the engine tests: stores (memory and a SQLite file), a manual clock,
//! workers, and journal inspection.
#![allow(dead_code, unreachable_pub)]

use eve_core::engine::{start_tool_call, ManualClock, Registry, Worker, WorkerConfig};
use eve_core::{
    CallId, Event, JournalStore, JournalStoreExt, MemoryStore, RunId, RunStatus, SessionId,
    Timestamp,
};
use eve_storage_sqlite::SqliteStore;
use std::sync::Arc;
use std::time::Duration;

/// A store under test with its clock; keeps the SQLite file's directory alive.
pub struct Env {
    pub store: Arc<dyn JournalStore>,
    pub clock: Arc<ManualClock>,
    _dir: Option<tempfile::TempDir>,
}

pub const START: Timestamp = Timestamp(1_700_000_000_000);
pub const LEASE: Duration = Duration::from_secs(30);

pub async fn memory() -> Env {
    Env {
        store: Arc::new(MemoryStore::new()),
        clock: ManualClock::new(START),
        _dir: None,
    }
}

pub async fn sqlite() -> Env {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path().join("eve.db"))
        .await
        .expect("open sqlite");
    Env {
        store: Arc::new(store),
        clock: ManualClock::new(START),
        _dir: Some(dir),
    }
}

/// Expands `async fn name(env: Env)` into a test module with a MemoryStore and a SQLite test.
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test]
                async fn memory() {
                    super::$name($crate::common::memory().await).await
                }
                #[tokio::test]
                async fn sqlite() {
                    super::$name($crate::common::sqlite().await).await
                }
            }
        )*
    };
}

impl Env {
    /// The same clock over another store (a wrapper of this one, say).
    pub fn with_store(self, store: Arc<dyn JournalStore>) -> Self {
        Self { store, ..self }
    }

    pub fn config(&self) -> WorkerConfig {
        WorkerConfig {
            lease_ttl: LEASE,
            store_retries: 0,
            ..WorkerConfig::default()
        }
    }

    pub async fn worker(&self, registry: &Registry) -> Worker {
        self.worker_on(self.store.clone(), registry).await
    }

    pub async fn worker_on(&self, store: Arc<dyn JournalStore>, registry: &Registry) -> Worker {
        Worker::new(store, registry.clone(), self.clock.clone(), self.config())
            .await
            .expect("register worker")
    }

    pub async fn start(
        &self,
        registry: &Registry,
        call: &str,
        tool: &str,
        input: serde_json::Value,
    ) -> RunId {
        let created = start_tool_call(
            &*self.store,
            registry,
            &SessionId::new("session-1"),
            &CallId::new(call),
            tool,
            input,
            self.clock.now(),
        )
        .await
        .expect("start tool call");
        assert!(created.created, "a fresh call creates a run");
        created.run.run_id
    }

    pub async fn events(&self, run: &RunId) -> Vec<Event> {
        self.store
            .read_all(run, 0)
            .await
            .expect("read journal")
            .into_iter()
            .map(|e| e.event)
            .collect()
    }

    pub async fn status(&self, run: &RunId) -> RunStatus {
        self.store.get_run(run).await.expect("get run").status
    }

    /// The run's output, asserting it completed.
    pub async fn output(&self, run: &RunId) -> serde_json::Value {
        let events = self.events(run).await;
        match events.last() {
            Some(Event::RunCompleted { output }) => output.to_value().expect("json output"),
            other => {
                panic!("run {run} did not complete; last event {other:?}; journal {events:#?}")
            }
        }
    }

    /// The run's error, asserting it failed.
    pub async fn error(&self, run: &RunId) -> String {
        let events = self.events(run).await;
        match events.last() {
            Some(Event::RunFailed { error }) => error.clone(),
            other => panic!("run {run} did not fail; last event {other:?}"),
        }
    }

    /// The reason of the run's last RunBlocked, asserting it is blocked.
    pub async fn blocked_reason(&self, run: &RunId) -> String {
        assert_eq!(self.status(run).await, RunStatus::Blocked);
        self.events(run)
            .await
            .into_iter()
            .rev()
            .find_map(|e| match e {
                Event::RunBlocked { reason } => Some(reason),
                _ => None,
            })
            .expect("a RunBlocked event")
    }
}

use eve_core::engine::Clock as _;

/// Names of the completed steps in journal order.
pub fn completed_steps(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::StepCompleted { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect()
}
