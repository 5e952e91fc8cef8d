//! The engine suite must catch broken stores: each test wraps [`MemoryStore`] with one
//! deliberate bug and checks that an engine family fails on it (and passes without it).

use async_trait::async_trait;
use eve_conformance::engine::driver::Bench;
use eve_conformance::engine::{check_family_on, Family};
use eve_core::session::SessionEntry;
use eve_core::*;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Bug {
    None,
    /// Hook deliveries forget their dedupe key: a retried webhook is written twice.
    HookDedupeIgnored,
    /// Reads hand back step outputs as `null`: replay feeds the body a wrong result.
    ReadLosesOutputs,
    /// Due timers are never handed out: sleeps and retries never wake the run.
    ClaimIgnoresTimers,
}

#[derive(Debug)]
struct Buggy {
    inner: MemoryStore,
    bug: Bug,
}

#[async_trait]
impl JournalStore for Buggy {
    fn backend(&self) -> &'static str {
        "buggy"
    }
    fn store_id(&self) -> String {
        self.inner.store_id()
    }
    async fn create_run(&self, run: NewRun, now: Timestamp) -> Result<CreatedRun, StoreError> {
        self.inner.create_run(run, now).await
    }
    async fn append(&self, a: Append) -> Result<Appended, StoreError> {
        self.inner.append(a).await
    }
    async fn read(
        &self,
        run: &RunId,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let mut page = self.inner.read(run, from, max).await?;
        if self.bug == Bug::ReadLosesOutputs {
            for e in &mut page {
                if let Event::StepCompleted { output, .. } = &mut e.event {
                    *output = Payload::null();
                }
            }
        }
        Ok(page)
    }
    async fn get_run(&self, run: &RunId) -> Result<RunRecord, StoreError> {
        self.inner.get_run(run).await
    }
    async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.list_runs(query).await
    }
    async fn answer(
        &self,
        r: &RequestId,
        resp: InputResponse,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        self.inner.answer(r, resp, now).await
    }
    async fn deliver_hook(
        &self,
        token: &str,
        payload: Payload,
        key: Option<&str>,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        let key = if self.bug == Bug::HookDedupeIgnored {
            None
        } else {
            key
        };
        self.inner.deliver_hook(token, payload, key, now).await
    }
    async fn request_cancel(
        &self,
        run: &RunId,
        reason: &str,
        now: Timestamp,
    ) -> Result<CancelOutcome, StoreError> {
        self.inner.request_cancel(run, reason, now).await
    }
    async fn resolve_blocked(
        &self,
        run: &RunId,
        r: Resolution,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        self.inner.resolve_blocked(run, r, now).await
    }
    async fn create_key(&self, key: eve_core::ApiKey) -> Result<(), StoreError> {
        self.inner.create_key(key).await
    }
    async fn list_keys(&self) -> Result<Vec<eve_core::ApiKey>, StoreError> {
        self.inner.list_keys().await
    }
    async fn revoke_key(&self, id: &str, now: Timestamp) -> Result<eve_core::ApiKey, StoreError> {
        self.inner.revoke_key(id, now).await
    }
    async fn key_by_hash(&self, hash: &str) -> Result<Option<eve_core::ApiKey>, StoreError> {
        self.inner.key_by_hash(hash).await
    }
    async fn end_session(
        &self,
        session: &SessionId,
        now: Timestamp,
    ) -> Result<SessionEnd, StoreError> {
        self.inner.end_session(session, now).await
    }
    async fn get_session(&self, session: &SessionId) -> Result<SessionRecord, StoreError> {
        self.inner.get_session(session).await
    }
    async fn queue_message(
        &self,
        session: &SessionId,
        message: Payload,
        now: Timestamp,
    ) -> Result<QueuedMessage, StoreError> {
        self.inner.queue_message(session, message, now).await
    }
    async fn take_messages(&self, session: &SessionId) -> Result<Vec<QueuedMessage>, StoreError> {
        self.inner.take_messages(session).await
    }
    async fn purge(&self, ended_before: Timestamp, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge(ended_before, limit).await
    }
    async fn pending_requests(&self, s: &SessionId) -> Result<Vec<PendingRequest>, StoreError> {
        self.inner.pending_requests(s).await
    }
    async fn read_session(
        &self,
        s: &SessionId,
        from: u64,
        max: usize,
    ) -> Result<Vec<SessionEntry>, StoreError> {
        self.inner.read_session(s, from, max).await
    }
    async fn register_worker(
        &self,
        w: &WorkerId,
        d: &DeploymentId,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        self.inner.register_worker(w, d, ttl, now).await
    }
    async fn heartbeat(
        &self,
        lease: &Lease,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        self.inner.heartbeat(lease, ttl, now).await
    }
    async fn claim(
        &self,
        lease: &Lease,
        max: usize,
        now: Timestamp,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let runs = self.inner.claim(lease, max, now).await?;
        if self.bug == Bug::ClaimIgnoresTimers {
            let mut kept = Vec::new();
            for r in runs {
                if r.processed_seq < r.next_seq {
                    kept.push(r);
                } else {
                    // Hand it back unclaimed, as if its due timer were not there.
                    self.inner
                        .release(lease, &r.run_id, r.next_seq, now)
                        .await?;
                }
            }
            return Ok(kept);
        }
        Ok(runs)
    }
    async fn release(
        &self,
        lease: &Lease,
        run: &RunId,
        seq: u64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.inner.release(lease, run, seq, now).await
    }
    async fn retire_worker(&self, lease: &Lease, now: Timestamp) -> Result<(), StoreError> {
        self.inner.retire_worker(lease, now).await
    }
    async fn next_wake(
        &self,
        d: &DeploymentId,
        now: Timestamp,
    ) -> Result<Option<Timestamp>, StoreError> {
        self.inner.next_wake(d, now).await
    }
}

async fn check(bug: Bug, family: Family) -> Result<String, String> {
    let bench = Bench::on(
        Arc::new(Buggy {
            inner: MemoryStore::new(),
            bug,
        }),
        "buggy",
    );
    check_family_on(&bench, family, 20, 7).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_families_catch_broken_stores() {
    for (bug, family) in [
        (Bug::HookDedupeIgnored, Family::DuplicateDeliveries),
        (Bug::ReadLosesOutputs, Family::NoFaults),
        (Bug::ClaimIgnoresTimers, Family::NoFaults),
    ] {
        let why = check(bug, family)
            .await
            .expect_err(&format!("engine family {family:?} must catch {bug:?}"));
        assert!(
            why.contains("EVE_CONFORMANCE_SEED=7") && why.contains("program as JSON"),
            "{bug:?}: the failure names the seed and the shrunk program: {why}"
        );
        let what = why
            .lines()
            .skip_while(|l| !l.contains("program as JSON"))
            .nth(1)
            .unwrap_or_default();
        println!("{bug:?} caught by {family:?}: {}", what.trim());
        check(Bug::None, family)
            .await
            .unwrap_or_else(|why| panic!("the same family passes on a correct store: {why}"));
    }
}
