//! Guarantee 5 (wake-ups): due order, timers not claimable early, nothing due left behind,
//! `processed_seq` and release.

use crate::fixtures::*;
use crate::StoreFactory;
use eve_core::{Event, JournalStore, Lease, RunId};
use std::collections::BTreeSet;

/// Creates a run, claims it, appends `events` and releases it as fully processed.
async fn parked(store: &dyn JournalStore, tag: &str, events: Vec<eve_core::Event>) -> RunId {
    let (run, lease) = started(store, new_run(tag), at(0)).await;
    let ok = must_append(store, append(&run.run_id, 1, &lease, events, at(1))).await;
    store
        .release(&lease, &run.run_id, ok.next_seq, at(1))
        .await
        .expect("release");
    run.run_id
}

async fn claim_ids(store: &dyn JournalStore, lease: &Lease, max: usize, ms: i64) -> Vec<RunId> {
    store
        .claim(lease, max, at(ms))
        .await
        .expect("claim")
        .into_iter()
        .map(|r| r.run_id)
        .collect()
}

/// Timers come due in time order; a timer not yet due is not claimable; `next_wake` names the
/// earliest.
pub async fn due_order_and_not_yet_due(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let a = parked(st, "a", vec![sleep(1, at(3_000))]).await;
    let b = parked(st, "b", vec![sleep(1, at(1_000))]).await;
    let retry = Event::StepFailed {
        cmd: 1,
        name: "s".into(),
        attempt: 1,
        error: "flaky".into(),
        fatal: false,
        retry_at: Some(at(2_000)),
    };
    let c = parked(st, "c", vec![retry]).await;
    let w = worker(st, at(500)).await;
    assert!(
        claim_ids(st, &w, 10, 500).await.is_empty(),
        "no timer is due at +500ms"
    );
    let dep = eve_core::DeploymentId::new(DEPLOYMENT);
    assert_eq!(
        st.next_wake(&dep, at(500)).await.expect("next_wake"),
        Some(at(1_000)),
        "next_wake is the earliest timer"
    );
    assert_eq!(
        claim_ids(st, &w, 1, 2_500).await,
        vec![b.clone()],
        "the earliest due run first"
    );
    assert_eq!(
        claim_ids(st, &w, 1, 2_500).await,
        vec![c.clone()],
        "then the next due (a StepFailed retry)"
    );
    assert!(
        claim_ids(st, &w, 10, 2_500).await.is_empty(),
        "a timer due at +3s is not claimable at +2.5s"
    );
    assert_eq!(
        claim_ids(st, &w, 10, 3_000).await,
        vec![a.clone()],
        "due exactly at its wake time"
    );
    // A fired sleep clears its timer: released as processed, the run has no work left.
    must_append(
        st,
        append(&a, 2, &w, vec![Event::SleepFired { cmd: 1 }], at(3_001)),
    )
    .await;
    st.release(&w, &a, 3, at(3_001)).await.expect("release");
    let w = worker(st, at(99_000)).await;
    assert!(
        claim_ids(st, &w, 10, 99_000).await.iter().all(|r| r != &a),
        "a fired timer does not fire again"
    );
    // A timer of another deployment is not this worker's.
    let mut other = new_run("other-dep");
    other.deployment_id = eve_core::DeploymentId::new(unique("elsewhere"));
    st.create_run(other.clone(), at(0))
        .await
        .expect("create_run");
    assert!(
        claim_ids(st, &w, 10, 99_000)
            .await
            .iter()
            .all(|r| r != &other.run_id),
        "claims only the lease's deployment"
    );
}

/// Many runs with work, claimed in small batches by two workers: every one is claimed exactly once.
pub async fn nothing_due_left_unclaimed(factory: &dyn StoreFactory) {
    const RUNS: usize = 25;
    let s = fresh(factory).await;
    let st = &*s.store;
    let mut all = BTreeSet::new();
    for i in 0..RUNS {
        let c = st
            .create_run(new_run(&format!("q{i}")), at(i as i64))
            .await
            .expect("create_run");
        all.insert(c.run.run_id);
    }
    let w1 = worker(st, at(100)).await;
    let w2 = worker(st, at(100)).await;
    let mut got = BTreeSet::new();
    for round in 0..RUNS {
        let lease = if round % 2 == 0 { &w1 } else { &w2 };
        let batch = claim_ids(st, lease, 3, 100).await;
        if batch.is_empty() {
            break;
        }
        for id in batch {
            assert!(got.insert(id.clone()), "run {id} claimed twice while held");
        }
    }
    assert_eq!(
        got, all,
        "every run with work is claimed; none is left behind"
    );
    assert!(claim_ids(st, &w1, 10, 100).await.is_empty());
}

/// A release records `processed_seq`; a delivery after it makes the run claimable again, a
/// release never moves `processed_seq` backwards, and an append marks its own events processed.
pub async fn processed_seq_and_release(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let token = unique("token");
    let id = parked(st, "rel", vec![hook(1, &token)]).await;
    let rec = record(st, &id).await;
    assert_eq!(
        (rec.processed_seq, rec.owner.clone()),
        (2, None),
        "release records processed_seq and drops the owner"
    );
    let w = worker(st, at(10)).await;
    assert!(
        claim_ids(st, &w, 10, 10).await.is_empty(),
        "a fully processed run has no work"
    );
    st.deliver_hook(&token, json("1"), None, at(20))
        .await
        .expect("deliver");
    assert_eq!(
        claim_ids(st, &w, 10, 20).await,
        vec![id.clone()],
        "a delivery after release makes the run claimable"
    );
    st.release(&w, &id, 1, at(21)).await.expect("release");
    assert_eq!(
        record(st, &id).await.processed_seq,
        2,
        "release never moves processed_seq backwards"
    );
    assert_eq!(
        claim_ids(st, &w, 10, 22).await,
        vec![id.clone()],
        "the delivery at seq 2 is still unprocessed"
    );
    let ok = must_append(st, append(&id, 3, &w, vec![step(2, "1")], at(23))).await;
    let rec = record(st, &id).await;
    assert_eq!(
        (rec.processed_seq, rec.activations),
        (ok.next_seq, 0),
        "an append marks its events processed and resets activations"
    );
    st.release(&w, &id, ok.next_seq, at(24))
        .await
        .expect("release");
    assert!(
        claim_ids(st, &w, 10, 25).await.is_empty(),
        "nothing left to do"
    );
}
