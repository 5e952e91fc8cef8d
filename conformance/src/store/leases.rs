//! Guarantee 5 (leases): one holder, expiry and takeover, fencing of superseded holders.

use crate::fixtures::*;
use crate::{assert_err, StoreFactory};
use eve_core::{DeploymentId, JournalStore, Lease, RunId, StoreError, Timestamp, WorkerId};
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

/// Heartbeats extend the lease; retiring leaves the worker's runs to others at once; a retired or
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

/// The claim clause for orphaned runs: a run that still names an owner whose lease is no longer
/// valid — superseded by a re-registration of the same worker id, retired, or expired — is
/// claimable at once, with no timer and no new event (no guard timer is ever needed), earliest
/// claim key first; `next_wake` reports it. Before the owner's lease expires it is not.
pub async fn orphaned_runs_are_claimable_at_once(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;

    // Superseded: a restarted process re-registers its worker id and takes its run back at once.
    let (run, old) = started(st, new_run("orphan-epoch"), at(0)).await;
    let id = &run.run_id;
    must_append(st, append(id, 1, &old, vec![step(1, "1")], at(1_000))).await;
    let other = worker(st, at(1_000)).await;
    assert!(
        st.claim(&other, 10, at(2_000))
            .await
            .expect("claim")
            .iter()
            .all(|r| &r.run_id != id),
        "a run held under a valid lease, with no work, is not claimable"
    );
    assert_eq!(
        st.next_wake(&old.deployment, at(2_000))
            .await
            .expect("next_wake"),
        None,
        "a held run with nothing due gives no wake-up"
    );
    let new = st
        .register_worker(&old.worker, &old.deployment, TTL, at(2_000))
        .await
        .expect("re-register");
    assert_eq!(
        st.next_wake(&old.deployment, at(2_000))
            .await
            .expect("next_wake"),
        Some(at(1_000)),
        "an orphaned run is due at once; its key is its updated_at (the last append)"
    );
    let got = st.claim(&new, 10, at(2_000)).await.expect("claim");
    assert_eq!(
        got.iter().map(|r| &r.run_id).collect::<Vec<_>>(),
        vec![id],
        "the new epoch takes the old epoch's run back at once, long before its lease expires"
    );
    assert_eq!(got[0].owner, Some((new.worker.clone(), new.epoch)));
    assert_err!(
        st.append(append(id, 2, &old, vec![step(2, "2")], at(2_500)))
            .await,
        StoreError::Fenced { .. },
        "the dead incarnation's append"
    );
    must_append(st, append(id, 2, &new, vec![step(2, "2")], at(3_000))).await;
    st.release(&new, id, 3, at(3_000)).await.expect("release");
    assert!(
        st.claim(&new, 10, at(3_000))
            .await
            .expect("claim")
            .is_empty(),
        "a released run with nothing due is not claimable"
    );

    // Retired: a graceful shutdown that abandoned an activation leaves its run to others at once.
    let (run2, w1) = started(st, new_run("orphan-retired"), at(4_000)).await;
    let id2 = &run2.run_id;
    st.retire_worker(&w1, at(4_500)).await.expect("retire");
    assert_eq!(
        record(st, id2).await.owner,
        Some((w1.worker.clone(), w1.epoch)),
        "retiring leaves the run naming its dead owner (orphaned)"
    );
    claim_run(st, &new, id2, at(4_600)).await;

    // Expired: claimable once the owner's lease has expired, not a millisecond before.
    let (run3, w3) = started(st, new_run("orphan-expired"), at(10_000)).await;
    let id3 = &run3.run_id;
    let expires = w3.expires_at;
    let new = st
        .heartbeat(&new, TTL, at(30_000))
        .await
        .expect("heartbeat");
    let before = Timestamp(expires.0 - 1);
    assert!(
        st.claim(&new, 10, before)
            .await
            .expect("claim")
            .iter()
            .all(|r| &r.run_id != id3),
        "not claimable while the owner's lease is valid"
    );
    let got = st.claim(&new, 10, expires).await.expect("claim");
    assert!(
        got.iter().any(|r| &r.run_id == id3),
        "claimable once the owner's lease expired"
    );
}

/// Orphaned runs and runs with due work share one queue, ordered by claim key: an orphaned
/// run's key is the earlier of its due work and its `updated_at`.
pub async fn orphans_and_due_work_in_claim_key_order(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    // Due work at 5 000 (a fresh run's RunStarted).
    let late = st
        .create_run(new_run("key-late"), at(5_000))
        .await
        .expect("create_run")
        .run
        .run_id;
    // An orphan last updated at 3 000.
    let (orphan, w1) = started(st, new_run("key-orphan"), at(0)).await;
    must_append(
        st,
        append(&orphan.run_id, 1, &w1, vec![step(1, "1")], at(3_000)),
    )
    .await;
    // Due work at 1 000.
    let early = st
        .create_run(new_run("key-early"), at(1_000))
        .await
        .expect("create_run")
        .run
        .run_id;
    let w2 = st
        .register_worker(&w1.worker, &w1.deployment, TTL, at(6_000))
        .await
        .expect("re-register");
    assert_eq!(
        st.next_wake(&w2.deployment, at(6_000))
            .await
            .expect("next_wake"),
        Some(at(1_000))
    );
    let mut order = Vec::new();
    for _ in 0..3 {
        let got = st.claim(&w2, 1, at(6_000)).await.expect("claim");
        assert_eq!(got.len(), 1, "one claimable run per claim of max 1");
        order.push(got[0].run_id.clone());
    }
    assert_eq!(order, vec![early, orphan.run_id, late], "claim key order");
}

/// Eager start: `create_run_claimed` creates the run and claims it for a valid lease in one
/// commit (owner set, one activation, not claimable by others, appendable at once); a repeated
/// key returns the existing run and claims nothing; an expired lease claims nothing. A store
/// that keeps the trait's default (no eager start) must leave the run claimable instead.
pub async fn eager_start_claims_the_new_run(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let w = worker(st, at(0)).await;
    let new = new_run("eager");
    let created = st
        .create_run_claimed(new.clone(), &w, at(10))
        .await
        .expect("create_run_claimed");
    assert!(created.created);
    let id = created.run.run_id.clone();
    if created.run.owner.is_none() {
        eprintln!(
            "{}: no eager start (the trait's default); the run must be claimable",
            st.backend()
        );
        claim_run(st, &w, &id, at(10)).await;
        return;
    }
    let own = Some((w.worker.clone(), w.epoch));
    assert_eq!(created.run.owner, own, "the answer names the claimer");
    assert_eq!(created.run.activations, 1);
    let rec = record(st, &id).await;
    assert_eq!((rec.owner.clone(), rec.activations), (own.clone(), 1));
    let other = worker(st, at(20)).await;
    assert!(
        st.claim(&other, 10, at(20))
            .await
            .expect("claim")
            .is_empty(),
        "an eagerly claimed run is held"
    );
    must_append(st, append(&id, 1, &w, vec![step(1, "1")], at(30))).await;
    let again = st
        .create_run_claimed(new, &other, at(40))
        .await
        .expect("repeated key");
    assert!(!again.created);
    assert_eq!(again.run.run_id, id);
    assert_eq!(
        record(st, &id).await.owner,
        own,
        "a repeated key claims nothing"
    );

    // An expired lease claims nothing: the run is created for any worker to claim.
    let late = st
        .create_run_claimed(new_run("eager-expired"), &w, w.expires_at)
        .await
        .expect("create_run_claimed");
    assert!(late.created);
    assert_eq!(late.run.owner, None);
    assert_eq!(record(st, &late.run.run_id).await.owner, None);
    let fresh_worker = worker(st, w.expires_at).await;
    claim_run(st, &fresh_worker, &late.run.run_id, w.expires_at).await;
}

/// Clause 11: one live holder per worker id. A second lock of a held id, from the same handle
/// or from another handle on the same storage (as another process opens it), is refused with
/// `WorkerIdInUse` naming the holder's process; other ids and other stores are unaffected, and
/// registering the id (a restart's lease) does not need the lock. Once the holder is dropped,
/// the id is free again, from the other handle too.
pub async fn one_live_holder_per_worker_id(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let id = WorkerId::new(unique("proc"));
    let first = s.store.lock_worker(&id).await.expect("lock a free id");
    assert_eq!(first.worker(), &id);
    let pid = format!("pid {}", std::process::id());
    assert!(
        first.holder().contains(&pid),
        "the holder names this process: {}",
        first.holder()
    );
    let refused = |what: &str, r: Result<eve_core::WorkerLock, StoreError>| match r {
        Err(e @ StoreError::WorkerIdInUse { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains(id.as_str()) && msg.contains(&pid),
                "{what}: the refusal names the id and the holder's process: {msg}"
            );
        }
        other => panic!("{what}: expected WorkerIdInUse, got {other:?}"),
    };
    refused(
        "a second lock from the same handle",
        s.store.lock_worker(&id).await,
    );
    let second = factory
        .open(&s.location)
        .await
        .expect("StoreFactory::open failed");
    if let Some(second) = &second {
        refused("a lock from another handle", second.lock_worker(&id).await);
    }
    let other = s
        .store
        .lock_worker(&WorkerId::new(unique("proc")))
        .await
        .expect("another id is free");
    let elsewhere = fresh(factory).await;
    let apart = elsewhere
        .store
        .lock_worker(&id)
        .await
        .expect("the same id of another store is free");
    s.store
        .register_worker(&id, &DeploymentId::new(DEPLOYMENT), TTL, at(0))
        .await
        .expect("registering does not take the lock");
    assert_err!(
        s.store.lock_worker(&WorkerId::new("")).await,
        StoreError::InvalidInput(_),
        "an empty worker id"
    );
    drop(first);
    let taker = second.unwrap_or_else(|| s.store.clone());
    let again = taker
        .lock_worker(&id)
        .await
        .expect("a dropped holder's id is free again");
    refused(
        "a lock while the new holder lives",
        s.store.lock_worker(&id).await,
    );
    drop((again, other, apart));
}
