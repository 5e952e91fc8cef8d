//! Store outages, made visible: the first request that finds the store unreachable starts an
//! outage; the server then probes the store every [`PROBE_EVERY`] until it answers, and logs one
//! `warn` line when the outage starts and one `info` line, with its length, when it ends.
//!
//! Requests made during the outage are answered 503 `unavailable` with `Retry-After` by the
//! error mapping ([`crate::error`]); this module only watches and tells the operator.

use crate::Inner;
use eve_core::{JournalStore, RunQuery, StoreError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// How often the store is probed while it is unreachable.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(500);

/// How long one probe (and `/readyz`) waits for the store before counting it unreachable.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Marks a response caused by an unreachable store, with the store's own description of the
/// fault (for the log only: the caller's message is written for the caller).
#[derive(Clone, Debug)]
pub(crate) struct StoreFault(pub(crate) String);

/// The outage in progress, if any (one per server).
#[derive(Debug, Default)]
pub(crate) struct Outage {
    since: Mutex<Option<Instant>>,
}

impl Outage {
    /// Records that a call found the store unreachable (`detail` says how). The first such call
    /// starts the outage: one `warn` line, and a task that probes the store until it answers,
    /// then logs the end. Later calls during the same outage do nothing.
    pub(crate) fn store_failed(self: &Arc<Self>, store: &Arc<dyn JournalStore>, detail: &str) {
        {
            let mut since = self.since.lock().expect("outage lock");
            if since.is_some() {
                return;
            }
            *since = Some(Instant::now());
        }
        tracing::warn!(
            error = detail,
            "store unreachable since {}: answering 503 with Retry-After until it answers again",
            humantime::format_rfc3339_seconds(SystemTime::now()),
        );
        let (outage, store) = (self.clone(), store.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(PROBE_EVERY).await;
                if probe(&store).await.is_ok() {
                    break;
                }
            }
            let started = outage.since.lock().expect("outage lock").take();
            let length = started.map(|s| s.elapsed()).unwrap_or_default();
            let rounded = Duration::from_millis(u64::try_from(length.as_millis()).unwrap_or(0));
            tracing::info!(
                outage_ms = rounded.as_millis() as u64,
                "store reachable again; outage of {}",
                humantime::format_duration(rounded),
            );
        });
    }
}

/// Asks the store one small question, waiting at most [`PROBE_TIMEOUT`]: `Unavailable` when it
/// does not answer in time.
pub(crate) async fn probe(store: &Arc<dyn JournalStore>) -> Result<(), StoreError> {
    let query = RunQuery {
        limit: 1,
        ..RunQuery::default()
    };
    match tokio::time::timeout(PROBE_TIMEOUT, store.list_runs(&query)).await {
        Ok(r) => r.map(drop),
        Err(_) => Err(StoreError::Unavailable {
            backend: store.backend(),
            message: format!("no answer within {PROBE_TIMEOUT:?}"),
        }),
    }
}

/// Middleware: a response marked [`StoreFault`] reports the fault to the server's [`Outage`].
pub(crate) async fn watch(
    axum::extract::State(inner): axum::extract::State<Arc<Inner>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let resp = next.run(req).await;
    if let Some(StoreFault(detail)) = resp.extensions().get::<StoreFault>() {
        inner.outage.store_failed(&inner.store, detail);
    }
    resp
}
