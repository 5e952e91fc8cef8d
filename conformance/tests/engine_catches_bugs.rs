//! The engine suite must catch broken stores: each test wraps [`MemoryStore`] with one
//! deliberate bug and checks that an engine family fails on it (and passes without it).

use async_trait::async_trait;
use eve_conformance::engine::driver::Bench;
use eve_conformance::engine::{check_family_on, Family};
use eve_core::*;
use std::sync::Arc;

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
impl StoreWrapper for Buggy {
    fn wrapped(&self) -> &dyn JournalStore {
        &self.inner
    }
    fn backend(&self) -> &'static str {
        "buggy"
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
