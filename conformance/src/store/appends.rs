//! Guarantee 1: linearizable, atomic, fenced appends with idempotent retries.

use crate::fixtures::*;
use crate::{assert_err, StoreFactory};
use eve_core::{Event, StoreError};
use std::sync::Arc;

/// N tasks append at one seq: exactly one wins, every other gets `Conflict { expected, actual }`.
pub async fn concurrent_appends_one_winner(factory: &dyn StoreFactory) {
    const N: usize = 8;
    let s = fresh(factory).await;
    let (run, lease) = started(&*s.store, new_run("race"), at(0)).await;
    let mut tasks = Vec::new();
    for i in 0..N {
        let store = Arc::clone(&s.store);
        let a = append(
            &run.run_id,
            1,
            &lease,
            vec![step(1, &format!("{i}"))],
            at(1),
        );
        tasks.push(tokio::spawn(async move {
            (i, retrying(|| store.append(a.clone())).await)
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        let (i, r) = t.await.expect("append task panicked");
        match r {
            Ok(ok) => {
                assert_eq!(
                    (ok.first_seq, ok.next_seq, ok.duplicate),
                    (1, 2, false),
                    "winner's answer"
                );
                winners.push(i);
            }
            Err(StoreError::Conflict {
                expected, actual, ..
            }) => {
                assert_eq!(
                    (expected, actual),
                    (1, 2),
                    "a losing append must report expected 1, actual 2"
                );
            }
            Err(e) => panic!("a losing append must be Conflict, got {e:?}"),
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one of {N} concurrent appends at seq 1 must win, winners: {winners:?}"
    );
    let j = journal(&*s.store, &run.run_id).await;
    assert_eq!(
        j.len(),
        2,
        "journal must hold RunStarted and the one winning event"
    );
    assert_eq!(
        j[1].event,
        step(1, &format!("{}", winners[0])),
        "the stored event is the winner's"
    );
}

/// An append whose events cannot all be written (a live hook token among them) writes none.
pub async fn append_is_all_or_nothing(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let token = unique("token");
    let (a, la) = started(&*s.store, new_run("a"), at(0)).await;
    let (b, lb) = started(&*s.store, new_run("b"), at(0)).await;
    must_append(
        &*s.store,
        append(&a.run_id, 1, &la, vec![hook(1, &token)], at(1)),
    )
    .await;
    let (req, ask_ev) = ask(&b.run_id, 1);
    let r = s
        .store
        .append(append(
            &b.run_id,
            1,
            &lb,
            vec![step(1, "1"), ask_ev, hook(2, &token), sleep(3, at(5))],
            at(2),
        ))
        .await;
    assert_err!(
        r,
        StoreError::AlreadyExists { .. },
        "an append registering a live hook token"
    );
    let j = journal(&*s.store, &b.run_id).await;
    assert_eq!(
        j.len(),
        1,
        "a failed append must write none of its events: {j:?}"
    );
    let rec = record(&*s.store, &b.run_id).await;
    assert_eq!(rec.next_seq, 1, "next_seq unchanged after a failed append");
    let pending = s
        .store
        .pending_requests(&b.session_id)
        .await
        .expect("pending_requests");
    assert!(
        pending.iter().all(|p| p.request_id != req),
        "a failed append must open no request"
    );
    // The same events without the clashing token land at the same seq.
    let ok = must_append(
        &*s.store,
        append(
            &b.run_id,
            1,
            &lb,
            vec![step(1, "1"), hook(2, &unique("other"))],
            at(3),
        ),
    )
    .await;
    assert_eq!((ok.first_seq, ok.next_seq), (1, 3));
}

/// A retry of an append that landed (same append id, an ambiguous commit) is a duplicate
/// success, not a conflict, and writes nothing new; also after the run ended.
pub async fn retry_of_landed_append_is_duplicate(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let (run, lease) = started(&*s.store, new_run("retry"), at(0)).await;
    let a = append(
        &run.run_id,
        1,
        &lease,
        vec![step(1, "\"x\""), step(2, "\"y\"")],
        at(1),
    );
    let first = must_append(&*s.store, a.clone()).await;
    assert_eq!(
        (first.first_seq, first.next_seq, first.duplicate),
        (1, 3, false)
    );
    let again = must_append(&*s.store, a.clone()).await;
    assert_eq!(
        (again.first_seq, again.next_seq, again.duplicate),
        (1, 3, true),
        "a retry of a landed append must answer its original seqs with duplicate: true"
    );
    assert_eq!(
        journal(&*s.store, &run.run_id).await.len(),
        3,
        "a duplicate writes nothing"
    );
    let end = append(&run.run_id, 3, &lease, vec![completed("1")], at(2));
    must_append(&*s.store, end.clone()).await;
    let dup = must_append(&*s.store, end).await;
    assert!(
        dup.duplicate,
        "the retry of the ending append must be a duplicate success, not RunEnded"
    );
    assert_eq!(journal(&*s.store, &run.run_id).await.len(), 4);
}

/// Appends to an ended run are refused with `RunEnded`, and nothing is written.
pub async fn append_to_ended_run_refused(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let (run, lease) = started(&*s.store, new_run("ended"), at(0)).await;
    must_append(
        &*s.store,
        append(&run.run_id, 1, &lease, vec![Event::RunCancelled], at(1)),
    )
    .await;
    let r = s
        .store
        .append(append(&run.run_id, 2, &lease, vec![step(1, "1")], at(2)))
        .await;
    assert_err!(r, StoreError::RunEnded { .. }, "append to an ended run");
    assert_eq!(journal(&*s.store, &run.run_id).await.len(), 2);
    assert_eq!(
        record(&*s.store, &run.run_id).await.status,
        eve_core::RunStatus::Cancelled
    );
}
