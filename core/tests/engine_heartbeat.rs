//! The worker renews its lease on a task of its own: a claim that takes longer than the lease
//! (a long queue on a slow store) never lets it lapse, so live runs are not taken over and
//! their steps are not run again by another worker.

use async_trait::async_trait;
use eve_core::engine::{Registry, SystemClock, Worker, WorkerConfig};
use eve_core::wrap::StoreWrapper;
use eve_core::{JournalStore, Lease, MemoryStore, RunRecord, StoreError, Timestamp};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const LEASE: Duration = Duration::from_secs(1);
const SLOW_CLAIM: Duration = Duration::from_secs(3);

/// A store whose claims take [`SLOW_CLAIM`] and which records when each heartbeat came.
#[derive(Debug)]
struct SlowClaims {
    inner: MemoryStore,
    beats: Mutex<Vec<Instant>>,
}

#[async_trait]
impl StoreWrapper for SlowClaims {
    fn wrapped(&self) -> &dyn JournalStore {
        &self.inner
    }

    async fn heartbeat(
        &self,
        lease: &Lease,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        self.beats.lock().unwrap().push(Instant::now());
        self.inner.heartbeat(lease, ttl, now).await
    }

    async fn claim(
        &self,
        lease: &Lease,
        max: usize,
        now: Timestamp,
    ) -> Result<Vec<RunRecord>, StoreError> {
        tokio::time::sleep(SLOW_CLAIM).await;
        self.inner.claim(lease, max, now).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_claim_does_not_let_the_lease_lapse() {
    let store = Arc::new(SlowClaims {
        inner: MemoryStore::new(),
        beats: Mutex::new(Vec::new()),
    });
    let config = WorkerConfig {
        lease_ttl: LEASE,
        ..WorkerConfig::default()
    };
    let started = Instant::now();
    let worker = Worker::new(
        store.clone(),
        Registry::new("heartbeat"),
        Arc::new(SystemClock),
        config,
    )
    .await
    .unwrap();
    let handle = worker.spawn();
    // The first claim is under way for all of this: the loop that claims cannot heartbeat.
    tokio::time::sleep(SLOW_CLAIM - Duration::from_millis(500)).await;
    handle.shutdown().await;
    let beats = store.beats.lock().unwrap().clone();
    let mut last = started;
    for at in &beats {
        assert!(
            *at - last < LEASE,
            "the lease went {:?} without renewal (lease {LEASE:?}); heartbeats at {:?}",
            *at - last,
            beats.iter().map(|b| *b - started).collect::<Vec<_>>()
        );
        last = *at;
    }
    assert!(
        beats.len() >= 3,
        "renewed {} times in {:?} with a {LEASE:?} lease",
        beats.len(),
        SLOW_CLAIM - Duration::from_millis(500)
    );
}
