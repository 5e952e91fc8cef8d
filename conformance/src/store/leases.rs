//! Guarantee 5 (leases): one holder, expiry and takeover, fencing of superseded holders.

use crate::fixtures::*;
use crate::{assert_err, StoreFactory};
use eve_core::{DeploymentId, JournalStore, Lease, RunId, StoreError, WorkerId};
use std::sync::Arc;
use std::time::Duration;

async fn claimable_run(store: &dyn JournalStore, tag: &str) -> RunId {
    let c = store
        .create_run(new_run(tag), at(0))
        .await
        .expect("create_run");
    c.run.run_id
}

/// Two workers claiming at once: the run goes to exactly one of them.
pub async fn two_claimers_one_holder(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    for round in 0..5 {
        let run = claimable_run(&*s.store, &format!("claim{round}")).await;
        let w1 = worker(&*s.store, at(0)).await;
        let w2 = worker(&*s.store, at(0)).await;
        let (s1, s2) = (Arc::clone(&s.store), Arc::clone(&s.store));
        let (l1, l2) = (w1.clone(), w2.clone());
        let t1 = tokio::spawn(async move { retrying(|| s1.claim(&l1, 10, at(1))).await });
        let t2 = tokio::spawn(async move { retrying(|| s2.claim(&l2, 10, at(1))).await });
        let c1 = t1.await.expect("claim task").expect("claim");
        let c2 = t2.await.expect("claim task").expect("claim");
        let n1 = c1.iter().filter(|r| r.run_id == run).count();
        let n2 = c2.iter().filter(|r| r.run_id == run).count();
        assert_eq!(
            n1 + n2,
            1,
            "round {round}: exactly one claimer gets the run (got {n1} and {n2})"
        );
        let holder = if n1 == 1 { &w1 } else { &w2 };
        let rec = record(&*s.store, &run).await;
        assert_eq!(
            rec.owner,
            Some((holder.worker.clone(), holder.epoch)),
            "the record names the holder"
        );
        assert!(rec.activations >= 1, "a claim counts an activation");
        let again = s.store.claim(&w1, 10, at(2)).await.expect("claim");
        assert!(
            again.iter().all(|r| r.run_id != run),
            "a held run is not claimable again"
        );
        let other = if n1 == 1 { &w2 } else { &w1 };
        assert_err!(
            s.store
                .append(append(&run, 1, other, vec![step(1, "1")], at(2)))
                .await,
            StoreError::Fenced { .. },
            "the non-holder's append"
        );
        must_append(
            &*s.store,
            append(&run, 1, holder, vec![completed("1")], at(2)),
        )
        .await;
    }
}

/// After the holder's lease expires another worker takes the run over; the old holder's append
/// and release are `Fenced`, write nothing (no fork), and stay fenced after it heartbeats.
pub async fn expired_lease_is_fenced_and_forks_nothing(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let (run, old) = started(&*s.store, new_run("expiry"), at(0)).await;
    let id = &run.run_id;
    must_append(
        &*s.store,
        append(id, 1, &old, vec![step(1, "1")], at(1_000)),
    )
    .await;
    // Give it work (a delivery), but while the lease is valid nobody else can take it.
    s.store
        .request_cancel(id, "work", at(20_000))
        .await
        .expect("cancel");
    let w2 = worker(&*s.store, at(1_000)).await;
    assert!(
        s.store
            .claim(&w2, 10, at(29_000))
            .await
            .expect("claim")
            .is_empty(),
        "a run under a valid lease is not claimable"
    );
    // The old lease (TTL 30 s from T0) lapses; w2 takes the run over.
    let w2 = s
        .store
        .heartbeat(&w2, TTL, at(29_000))
        .await
        .expect("heartbeat");
    claim_run(&*s.store, &w2, id, at(31_000)).await;
    assert_eq!(
        record(&*s.store, id).await.owner,
        Some((w2.worker.clone(), w2.epoch))
    );
    let before = journal(&*s.store, id).await;
    assert_err!(
        s.store
            .append(append(id, 3, &old, vec![step(2, "\"fork\"")], at(31_500)))
            .await,
        StoreError::Fenced { .. },
        "the superseded holder's append"
    );
    assert_err!(
        s.store.release(&old, id, 3, at(31_500)).await,
        StoreError::Fenced { .. },
        "the superseded holder's release"
    );
    assert_err!(
        s.store.claim(&old, 10, at(31_500)).await,
        StoreError::Fenced { .. },
        "a claim under an expired lease"
    );
    assert_eq!(
        journal(&*s.store, id).await,
        before,
        "a fenced append forks nothing"
    );
    // Stays fenced: the old worker renews its worker lease, yet the run is w2's.
    if let Ok(renewed) = s.store.heartbeat(&old, TTL, at(32_000)).await {
        assert_err!(
            s.store
                .append(append(
                    id,
                    3,
                    &renewed,
                    vec![step(2, "\"fork\"")],
                    at(32_000)
                ))
                .await,
            StoreError::Fenced { .. },
            "the old holder after renewing its lease"
        );
        assert!(s
            .store
            .claim(&renewed, 10, at(32_000))
            .await
            .expect("claim")
            .iter()
            .all(|r| &r.run_id != id));
    }
    let ok = must_append(
        &*s.store,
        append(id, 3, &w2, vec![step(2, "\"new holder\"")], at(33_000)),
    )
    .await;
    assert_eq!(
        ok.first_seq, 3,
        "the new holder continues the journal where it was"
    );
    assert_eq!(journal(&*s.store, id).await.len(), 4);
}

/// Re-registering a worker id gives a newer epoch; everything under the old epoch is fenced, and
/// the new epoch can claim the runs the old one held.
pub async fn reregister_bumps_epoch_and_fences(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let (run, old) = started(&*s.store, new_run("epoch"), at(0)).await;
    let new = s
        .store
        .register_worker(&old.worker, &old.deployment, TTL, at(1))
        .await
        .expect("re-register");
    assert!(
        new.epoch > old.epoch,
        "re-registration must bump the epoch ({} -> {})",
        old.epoch,
        new.epoch
    );
    assert_eq!(new.expires_at, at(1).plus(TTL));
    assert_err!(
        s.store
            .append(append(&run.run_id, 1, &old, vec![step(1, "1")], at(2)))
            .await,
        StoreError::Fenced { .. },
        "an append under the old epoch"
    );
    assert_err!(
        s.store.heartbeat(&old, TTL, at(2)).await,
        StoreError::Fenced { .. },
        "a heartbeat under the old epoch"
    );
    assert_err!(
        s.store.claim(&old, 10, at(2)).await,
        StoreError::Fenced { .. },
        "a claim under the old epoch"
    );
    assert_err!(
        s.store.release(&old, &run.run_id, 1, at(2)).await,
        StoreError::Fenced { .. },
        "a release under the old epoch"
    );
    assert_err!(
        s.store.retire_worker(&old, at(2)).await,
        StoreError::Fenced { .. },
        "retiring the old epoch"
    );
    claim_run(&*s.store, &new, &run.run_id, at(3)).await;
    must_append(
        &*s.store,
        append(&run.run_id, 1, &new, vec![step(1, "1")], at(4)),
    )
    .await;
    assert_eq!(journal(&*s.store, &run.run_id).await.len(), 2);
}

/// Heartbeats extend the lease; retiring releases the worker's runs to others; a retired or
/// unknown worker cannot heartbeat or claim.
pub async fn heartbeat_and_retire(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let (run, lease) = started(&*s.store, new_run("hb"), at(0)).await;
    let renewed = s
        .store
        .heartbeat(&lease, Duration::from_secs(60), at(20_000))
        .await
        .expect("heartbeat");
    assert_eq!(
        (renewed.epoch, renewed.expires_at),
        (lease.epoch, at(80_000)),
        "a heartbeat renews for ttl from now"
    );
    let w2 = worker(&*s.store, at(40_000)).await;
    assert!(
        s.store
            .claim(&w2, 10, at(40_000))
            .await
            .expect("claim")
            .is_empty(),
        "a run held under a renewed lease is not claimable after the original expiry"
    );
    s.store
        .retire_worker(&renewed, at(41_000))
        .await
        .expect("retire");
    claim_run(&*s.store, &w2, &run.run_id, at(41_000)).await;
    assert!(
        matches!(
            s.store.heartbeat(&renewed, TTL, at(42_000)).await,
            Err(StoreError::Fenced { .. } | StoreError::NotFound { .. })
        ),
        "a retired worker's heartbeat must be Fenced or NotFound"
    );
    assert_err!(
        s.store.claim(&renewed, 10, at(42_000)).await,
        StoreError::Fenced { .. },
        "a retired worker's claim"
    );
    let ghost = Lease {
        worker: WorkerId::new(unique("ghost")),
        deployment: DeploymentId::new(DEPLOYMENT),
        epoch: 1,
        expires_at: at(99_000),
    };
    assert_err!(
        s.store.heartbeat(&ghost, TTL, at(42_000)).await,
        StoreError::NotFound { .. },
        "an unknown worker's heartbeat"
    );
    assert_err!(
        s.store.claim(&ghost, 10, at(42_000)).await,
        StoreError::Fenced { .. },
        "an unknown worker's claim"
    );
}
