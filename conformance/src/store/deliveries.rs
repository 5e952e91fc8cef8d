//! Guarantee 2: external deliveries (answers, hook payloads, cancel requests), exactly once.

use crate::fixtures::*;
use crate::{assert_err, StoreFactory};
use eve_core::{CancelOutcome, Event, InputResponse, StoreError};
use std::sync::Arc;

/// Concurrent deliveries with one dedupe key write one `HookReceived`; all callers succeed and
/// name the same seq.
pub async fn concurrent_hook_dedupe_one_event(factory: &dyn StoreFactory) {
    const N: usize = 8;
    let s = fresh(factory).await;
    let (run, lease) = started(&*s.store, new_run("dedupe"), at(0)).await;
    let token = unique("token");
    must_append(
        &*s.store,
        append(&run.run_id, 1, &lease, vec![hook(1, &token)], at(1)),
    )
    .await;
    let mut tasks = Vec::new();
    for i in 0..N {
        let store = Arc::clone(&s.store);
        let token = token.clone();
        tasks.push(tokio::spawn(async move {
            let payload = json(&format!("{{\"n\": {i}}}"));
            retrying(|| store.deliver_hook(&token, payload.clone(), Some("delivery-1"), at(2)))
                .await
        }));
    }
    let mut seqs = Vec::new();
    let mut fresh_writes = 0;
    for t in tasks {
        let d = t
            .await
            .expect("delivery task panicked")
            .expect("a keyed delivery must succeed");
        fresh_writes += usize::from(!d.duplicate);
        seqs.push(d.seq);
    }
    assert_eq!(
        fresh_writes, 1,
        "one delivery writes, the rest are duplicates"
    );
    assert!(
        seqs.iter().all(|s| *s == 2),
        "every caller must learn seq 2, got {seqs:?}"
    );
    let j = journal(&*s.store, &run.run_id).await;
    let received: Vec<_> = j
        .iter()
        .filter(|e| matches!(e.event, Event::HookReceived { .. }))
        .collect();
    assert_eq!(received.len(), 1, "one dedupe key, one HookReceived: {j:?}");
    // Without a key, deliveries are at-least-once: each writes.
    let a = s
        .store
        .deliver_hook(&token, json("1"), None, at(3))
        .await
        .expect("unkeyed");
    let b = s
        .store
        .deliver_hook(&token, json("1"), None, at(3))
        .await
        .expect("unkeyed");
    assert_eq!(
        (a.seq, b.seq, a.duplicate, b.duplicate),
        (3, 4, false, false)
    );
    // Another key is another delivery; the first key stays deduped.
    let c = s
        .store
        .deliver_hook(&token, json("2"), Some("delivery-2"), at(4))
        .await
        .expect("keyed");
    assert_eq!((c.seq, c.duplicate), (5, false));
    let d = s
        .store
        .deliver_hook(&token, json("3"), Some("delivery-1"), at(4))
        .await
        .expect("keyed");
    assert_eq!(
        (d.seq, d.duplicate),
        (2, true),
        "a repeated key names the first delivery's seq"
    );
}

/// Concurrent answers to one request, the same or different: one `InputAnswered`; identical
/// answers are duplicates, different ones `AlreadyAnswered`.
pub async fn concurrent_answers_one_answered(factory: &dyn StoreFactory) {
    const N: usize = 8;
    let s = fresh(factory).await;
    let (run, lease) = started(&*s.store, new_run("answers"), at(0)).await;
    let (req, ev) = ask(&run.run_id, 1);
    must_append(&*s.store, append(&run.run_id, 1, &lease, vec![ev], at(1))).await;
    let mut tasks = Vec::new();
    for i in 0..N {
        let store = Arc::clone(&s.store);
        let req = req.clone();
        let resp = if i % 2 == 0 {
            InputResponse::option("yes")
        } else {
            InputResponse::option("no")
        };
        tasks.push(tokio::spawn(async move {
            let r = retrying(|| store.answer(&req, resp.clone(), at(2))).await;
            (resp, r)
        }));
    }
    let mut accepted = Vec::new();
    let mut outcomes = Vec::new();
    for t in tasks {
        let (resp, r) = t.await.expect("answer task panicked");
        match &r {
            Ok(d) => accepted.push((resp.clone(), d.clone())),
            Err(StoreError::AlreadyAnswered { .. }) => {}
            Err(e) => panic!("a concurrent answer must succeed or be AlreadyAnswered, got {e:?}"),
        }
        outcomes.push((resp, r.map(|d| d.duplicate).map_err(|e| e.to_string())));
    }
    let writes: Vec<_> = accepted.iter().filter(|(_, d)| !d.duplicate).collect();
    assert_eq!(writes.len(), 1, "exactly one answer writes: {outcomes:?}");
    let winner = writes[0].0.clone();
    for (resp, d) in &accepted {
        assert_eq!(
            resp, &winner,
            "only the winning response may succeed (as a duplicate): {outcomes:?}"
        );
        assert_eq!(d.seq, 2);
    }
    let j = journal(&*s.store, &run.run_id).await;
    let answered: Vec<_> = j
        .iter()
        .filter(|e| matches!(e.event, Event::InputAnswered { .. }))
        .collect();
    assert_eq!(answered.len(), 1, "one InputAnswered: {j:?}");
    assert_eq!(
        answered[0].event,
        Event::InputAnswered {
            request_id: req.clone(),
            response: winner
        }
    );
    assert!(
        s.store
            .pending_requests(&run.session_id)
            .await
            .expect("pending")
            .is_empty(),
        "an answered request is not pending"
    );
}

/// Answer validation: unknown request `NotFound`, option not offered `InvalidAnswer`, the
/// request stays pending after a refused answer.
pub async fn answer_semantics(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let (run, lease) = started(&*s.store, new_run("answer"), at(0)).await;
    let (req, ev) = ask(&run.run_id, 1);
    must_append(&*s.store, append(&run.run_id, 1, &lease, vec![ev], at(1))).await;
    let unknown = eve_core::RequestId::new(unique("req"));
    assert_err!(
        s.store
            .answer(&unknown, InputResponse::option("yes"), at(2))
            .await,
        StoreError::NotFound { .. },
        "answer to an unknown request"
    );
    assert_err!(
        s.store
            .answer(&req, InputResponse::option("maybe"), at(2))
            .await,
        StoreError::InvalidAnswer { .. },
        "an option not offered"
    );
    assert_err!(
        s.store.answer(&req, InputResponse::default(), at(2)).await,
        StoreError::InvalidAnswer { .. },
        "an empty answer"
    );
    let pending = s
        .store
        .pending_requests(&run.session_id)
        .await
        .expect("pending");
    assert_eq!(
        pending.len(),
        1,
        "a refused answer leaves the request pending"
    );
    assert_eq!(
        (
            pending[0].request_id.clone(),
            pending[0].cmd,
            pending[0].run_id.clone()
        ),
        (req.clone(), 1, run.run_id.clone())
    );
    let d = s
        .store
        .answer(&req, InputResponse::text("free text"), at(3))
        .await
        .expect("free text is allowed");
    assert_eq!((d.seq, d.duplicate), (2, false));
    assert_eq!(
        journal(&*s.store, &run.run_id).await.len(),
        3,
        "refused answers wrote nothing"
    );
}

/// After the run ended: answers are `Withdrawn`, hook deliveries `NotFound` (the token was
/// released), appends `RunEnded`, cancel `AlreadyEnded`; nothing is written.
pub async fn deliveries_to_ended_run_refused(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let (run, lease) = started(&*s.store, new_run("ended"), at(0)).await;
    let token = unique("token");
    let (req, ev) = ask(&run.run_id, 2);
    must_append(
        &*s.store,
        append(&run.run_id, 1, &lease, vec![hook(1, &token), ev], at(1)),
    )
    .await;
    must_append(
        &*s.store,
        append(&run.run_id, 3, &lease, vec![completed("\"done\"")], at(2)),
    )
    .await;
    assert_err!(
        s.store
            .answer(&req, InputResponse::option("yes"), at(3))
            .await,
        StoreError::Withdrawn { .. },
        "answer after the run ended"
    );
    assert_err!(
        s.store
            .deliver_hook(&token, json("1"), Some("k"), at(3))
            .await,
        StoreError::NotFound { .. },
        "keyed hook delivery after the run ended"
    );
    assert_err!(
        s.store.deliver_hook(&token, json("1"), None, at(3)).await,
        StoreError::NotFound { .. },
        "hook delivery after the run ended"
    );
    assert_err!(
        s.store
            .append(append(&run.run_id, 4, &lease, vec![step(3, "1")], at(3)))
            .await,
        StoreError::RunEnded { .. },
        "append after the run ended"
    );
    assert_eq!(
        s.store
            .request_cancel(&run.run_id, "late", at(3))
            .await
            .expect("request_cancel"),
        CancelOutcome::AlreadyEnded {
            status: eve_core::RunStatus::Completed
        }
    );
    assert_eq!(
        journal(&*s.store, &run.run_id).await.len(),
        4,
        "nothing written after the end"
    );
    assert!(
        s.store
            .pending_requests(&run.session_id)
            .await
            .expect("pending")
            .is_empty(),
        "no request of an ended run is pending"
    );
}

/// `request_cancel` writes `CancelRequested` once, needs no lease, and sets `cancel_requested`.
pub async fn cancel_request_once(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let (run, _lease) = started(&*s.store, new_run("cancel"), at(0)).await;
    let first = s
        .store
        .request_cancel(&run.run_id, "user asked", at(1))
        .await
        .expect("request_cancel");
    assert_eq!(first, CancelOutcome::Requested { seq: 1 });
    let again = s
        .store
        .request_cancel(&run.run_id, "again", at(2))
        .await
        .expect("request_cancel");
    assert_eq!(again, CancelOutcome::AlreadyRequested);
    let rec = record(&*s.store, &run.run_id).await;
    assert!(rec.cancel_requested);
    assert_eq!(rec.next_seq, 2);
    let j = journal(&*s.store, &run.run_id).await;
    assert_eq!(
        j[1].event,
        Event::CancelRequested {
            reason: "user asked".into()
        }
    );
    assert_err!(
        s.store
            .request_cancel(&eve_core::RunId::new(unique("nope")), "x", at(3))
            .await,
        StoreError::NotFound { .. },
        "cancel of an unknown run"
    );
}
