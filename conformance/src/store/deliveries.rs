//! Guarantee 2: external deliveries (answers, hook payloads, cancel requests), exactly once.

use crate::fixtures::*;
use crate::{assert_err, StoreFactory};
use eve_core::{CancelOutcome, Event, InputResponse, RunStatus, StoreError};
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
/// request stays pending after a refused answer; `answered_by` is journaled but not part of
/// the answer ([`eve_core::InputResponse::same_answer`]).
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
        .answer(&req, InputResponse::text("free text").by("alice"), at(3))
        .await
        .expect("free text is allowed");
    assert_eq!((d.seq, d.duplicate), (2, false));
    // Who answered is not part of the answer: the same text sent by someone else (or by
    // nobody named) is a duplicate, and the journal keeps the first answer's name.
    for again in [
        InputResponse::text("free text").by("bob"),
        InputResponse::text("free text"),
    ] {
        let d = s
            .store
            .answer(&req, again.clone(), at(4))
            .await
            .unwrap_or_else(|e| panic!("the same answer by another ({again:?}): {e:?}"));
        assert_eq!((d.seq, d.duplicate), (2, true), "{again:?}");
    }
    assert_err!(
        s.store
            .answer(&req, InputResponse::text("other text").by("alice"), at(4))
            .await,
        StoreError::AlreadyAnswered { .. },
        "another answer by the same person"
    );
    let j = journal(&*s.store, &run.run_id).await;
    assert_eq!(j.len(), 3, "refused and duplicate answers wrote nothing");
    assert!(
        matches!(
            &j[2].event,
            Event::InputAnswered { response, .. }
                if response.answered_by.as_deref() == Some("alice")
                    && response.text.as_deref() == Some("free text")
        ),
        "the journal records who answered: {:?}",
        j[2].event
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

/// A cancel request withdraws the run's pending requests in the same append: an answer that
/// landed before it is kept, an answer after it is `Withdrawn` and writes nothing. Once the run
/// ended, a cancel answers `AlreadyEnded` even though a cancel had been requested before.
pub async fn cancel_withdraws_pending_requests_atomically(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let (run, lease) = started(st, new_run("cancel-withdraw"), at(0)).await;
    let id = &run.run_id;
    let (r1, a1) = ask(id, 1);
    let (r2, a2) = ask(id, 2);
    must_append(st, append(id, 1, &lease, vec![a1, a2], at(1))).await;
    st.answer(&r1, InputResponse::option("yes"), at(2))
        .await
        .expect("answer before the cancel");
    let outcome = st
        .request_cancel(id, "steer", at(3))
        .await
        .expect("request_cancel");
    assert_eq!(outcome, CancelOutcome::Requested { seq: 4 });
    let j = journal(st, id).await;
    assert_eq!(
        j[4..].iter().map(|e| e.event.clone()).collect::<Vec<_>>(),
        vec![
            Event::CancelRequested {
                reason: "steer".into()
            },
            Event::InputWithdrawn {
                request_id: r2.clone()
            },
        ],
        "the cancel withdraws the pending request (not the answered one) in its own append"
    );
    let rec = record(st, id).await;
    assert_eq!((rec.next_seq, rec.status), (6, RunStatus::Running));
    assert_err!(
        st.answer(&r2, InputResponse::option("yes"), at(4)).await,
        StoreError::Withdrawn { .. },
        "an answer after the cancel request, while the run still runs"
    );
    let dup = st
        .answer(&r1, InputResponse::option("yes"), at(4))
        .await
        .expect("the kept answer again");
    assert!(dup.duplicate && dup.seq == 3, "{dup:?}");
    assert_eq!(
        journal(st, id).await.len(),
        6,
        "refused and duplicate answers write nothing"
    );
    assert!(
        st.pending_requests(&run.session_id)
            .await
            .expect("pending_requests")
            .is_empty(),
        "nothing pending after the cancel"
    );
    must_append(st, append(id, 6, &lease, vec![Event::RunCancelled], at(5))).await;
    assert_eq!(
        st.request_cancel(id, "again", at(6)).await.expect("cancel"),
        CancelOutcome::AlreadyEnded {
            status: RunStatus::Cancelled
        },
        "an ended run answers AlreadyEnded, though a cancel was requested before it ended"
    );
}

/// An answer racing a cancel request either lands first and is kept, or is refused as
/// `Withdrawn`: never accepted and withdrawn both.
pub async fn answer_racing_cancel_kept_or_withdrawn(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    for round in 0..6 {
        let (run, lease) = started(&*s.store, new_run("race-cancel"), at(0)).await;
        let id = run.run_id.clone();
        let (req, a) = ask(&id, 1);
        must_append(&*s.store, append(&id, 1, &lease, vec![a], at(1))).await;
        let (st1, st2) = (Arc::clone(&s.store), Arc::clone(&s.store));
        let (req1, id2) = (req.clone(), id.clone());
        let answer = tokio::spawn(async move {
            retrying(|| st1.answer(&req1, InputResponse::option("no"), at(2))).await
        });
        let cancel =
            tokio::spawn(async move { retrying(|| st2.request_cancel(&id2, "race", at(2))).await });
        let answered = answer.await.expect("answer task");
        cancel.await.expect("cancel task").expect("request_cancel");
        let events: Vec<Event> = journal(&*s.store, &id)
            .await
            .into_iter()
            .map(|e| e.event)
            .collect();
        let withdrawn = events
            .iter()
            .any(|e| matches!(e, Event::InputWithdrawn { .. }));
        let kept = events
            .iter()
            .any(|e| matches!(e, Event::InputAnswered { .. }));
        match answered {
            Ok(_) => assert!(
                kept && !withdrawn,
                "round {round}: an accepted answer must be kept, not withdrawn: {events:?}"
            ),
            Err(StoreError::Withdrawn { .. }) => assert!(
                withdrawn && !kept,
                "round {round}: a refused answer writes nothing and the cancel withdrew the request: {events:?}"
            ),
            Err(e) => panic!("round {round}: answer racing a cancel: unexpected {e:?}"),
        }
    }
}

/// An approval answer is final (contract clause 2, for the approval gate of a gated tool call:
/// an [`InputRequest::approval`](eve_core::InputRequest::approval) at command 0). Four gates,
/// on a default and a background run, are answered `approve`, `deny`, `deny` with a reason and
/// `approve` with a note. Then every *different* answer (the other option, the same option
/// with another text or none, an option not offered) is refused with `AlreadyAnswered` (an
/// option not offered may be `InvalidAnswer` instead), through each handle the factory gives,
/// also after the run ended `RunDenied`; each refusal changes nothing: journals, records,
/// pending requests and the session log read the same before and after. An identical retry
/// (also signed by someone else) is a duplicate success naming the first answer's seq.
pub async fn approval_answer_is_final(factory: &dyn StoreFactory) {
    use eve_core::event::{APPROVE, DENY};
    use eve_core::{Execution, InputRequest, JournalStore, RequestId, RunId, SessionId};
    let s = fresh(factory).await;
    let st = &*s.store;
    let mut handles: Vec<Arc<dyn JournalStore>> = vec![Arc::clone(&s.store)];
    if let Some(second) = factory
        .open(&s.location)
        .await
        .unwrap_or_else(|e| panic!("StoreFactory::open failed: {e}"))
    {
        handles.push(second);
    }
    let session = SessionId::new(unique("approval-session"));
    let with = |option: &str, text: Option<&str>| InputResponse {
        option_id: Some(option.into()),
        text: text.map(str::to_owned),
        ..InputResponse::default()
    };
    // (the recorded answer, the different answers that must be refused)
    let gates: Vec<(InputResponse, Vec<InputResponse>)> = vec![
        (
            with(APPROVE, None),
            vec![
                with(DENY, None),
                with(DENY, Some("changed my mind")),
                with(APPROVE, Some("and a note")),
            ],
        ),
        (
            with(DENY, None),
            vec![
                with(APPROVE, None),
                with(DENY, Some("now with a reason")),
                with(APPROVE, Some("")),
            ],
        ),
        (
            with(DENY, Some("too risky")),
            vec![
                with(DENY, None),
                with(DENY, Some("another reason")),
                with(APPROVE, None),
                with(APPROVE, Some("too risky")),
            ],
        ),
        (
            with(APPROVE, Some("looks fine")),
            vec![
                with(APPROVE, None),
                with(DENY, Some("looks fine")),
                with(APPROVE, Some("looks fine!")),
            ],
        ),
    ];
    let mut runs: Vec<(RunId, eve_core::Lease, RequestId, InputRequest)> = Vec::new();
    for (i, _) in gates.iter().enumerate() {
        let mut new = new_run(&format!("gate{i}"));
        new.session_id = session.clone();
        if i % 2 == 1 {
            new.execution = Execution::Background;
        }
        let (run, lease) = started(st, new, at(0)).await;
        let request = InputRequest::approval(
            "conformance_tool",
            serde_json::json!({"tag": "input", "gate": i}),
        );
        let req = RequestId::for_command(&run.run_id, 0);
        must_append(
            st,
            append(
                &run.run_id,
                1,
                &lease,
                vec![Event::InputRequested {
                    cmd: 0,
                    request_id: req.clone(),
                    request: request.clone(),
                }],
                at(1),
            ),
        )
        .await;
        runs.push((run.run_id, lease, req, request));
    }
    // A plain ask stays pending throughout: refusals must not close it either.
    let (bystander, bl) = {
        let mut new = new_run("gate-bystander");
        new.session_id = session.clone();
        started(st, new, at(0)).await
    };
    let (other_req, other_ask) = ask(&bystander.run_id, 1);
    must_append(
        st,
        append(&bystander.run_id, 1, &bl, vec![other_ask], at(1)),
    )
    .await;

    for ((answer, _), (run, _, req, request)) in gates.iter().zip(&runs) {
        assert!(
            request.accepts(answer).is_ok(),
            "the gate accepts {answer:?}"
        );
        let d = st
            .answer(req, answer.clone().by("alice"), at(2))
            .await
            .unwrap_or_else(|e| panic!("answering {req} with {answer:?}: {e}"));
        assert_eq!((&d.run, d.seq, d.duplicate), (run, 2, false), "{answer:?}");
    }

    // What must not change, read through every handle.
    let snapshot = |store: Arc<dyn JournalStore>| {
        let runs: Vec<RunId> = runs
            .iter()
            .map(|r| r.0.clone())
            .chain([bystander.run_id.clone()])
            .collect();
        let session = session.clone();
        async move {
            let mut journals = Vec::new();
            let mut records = Vec::new();
            for run in &runs {
                journals.push(journal(&*store, run).await);
                records.push(crate::model::comparable(&record(&*store, run).await));
            }
            let pending = store
                .pending_requests(&session)
                .await
                .expect("pending_requests");
            let log = store
                .read_session(&session, 0, 1000)
                .await
                .expect("read_session");
            (journals, records, pending, log)
        }
    };
    let refuse_all = |phase: &'static str| {
        let handles = handles.clone();
        let gates = &gates;
        let runs = &runs;
        async move {
            for (h, store) in handles.iter().enumerate() {
                for ((answer, different), (_, _, req, _)) in gates.iter().zip(runs) {
                    let before = snapshot(Arc::clone(store)).await;
                    let not_offered = with("maybe", None);
                    for other in different.iter().chain([&not_offered]) {
                        let r = retrying(|| store.answer(req, other.clone().by("mallory"), at(3)))
                            .await;
                        let refused = match &r {
                            Err(StoreError::AlreadyAnswered { request }) => request == req,
                            Err(StoreError::InvalidAnswer { .. }) => other == &not_offered,
                            _ => false,
                        };
                        assert!(
                            refused,
                            "{phase}, handle {h}: {req} was answered {answer:?}; the different \
                             answer {other:?} must be AlreadyAnswered, got {r:?}"
                        );
                    }
                    assert!(
                        snapshot(Arc::clone(store)).await == before,
                        "{phase}, handle {h}: refused answers to {req} changed the journals, \
                         records, pending requests or session log"
                    );
                    for again in [
                        answer.clone().by("alice"),
                        answer.clone().by("bob"),
                        answer.clone(),
                    ] {
                        let d = retrying(|| store.answer(req, again.clone(), at(4)))
                            .await
                            .unwrap_or_else(|e| {
                                panic!(
                                    "{phase}, handle {h}: the same answer {again:?} again: {e:?}"
                                )
                            });
                        assert_eq!(
                            (d.seq, d.duplicate),
                            (2, true),
                            "{phase}, handle {h}: an identical retry is a duplicate of seq 2"
                        );
                    }
                    assert!(
                        snapshot(Arc::clone(store)).await == before,
                        "{phase}, handle {h}: identical retries to {req} wrote something"
                    );
                }
            }
        }
    };
    refuse_all("while the runs live").await;

    // The journal keeps the first answer, signed by its first answerer.
    for ((answer, _), (run, _, req, _)) in gates.iter().zip(&runs) {
        let j = journal(st, run).await;
        assert_eq!(j.len(), 3, "{run}: RunStarted, the request, one answer");
        match &j[2].event {
            Event::InputAnswered {
                request_id,
                response,
            } => {
                assert_eq!(request_id, req);
                assert!(
                    response.same_answer(answer)
                        && response.answered_by.as_deref() == Some("alice"),
                    "{run}: the journal keeps the first answer {answer:?}, got {response:?}"
                );
            }
            other => panic!("{run}: seq 2 is {other:?}, not the answer"),
        }
    }

    // The denied gates end their runs (RunDenied), the approved ones run on and complete: the
    // answers stay final after every end.
    for ((answer, _), (run, lease, _, _)) in gates.iter().zip(&runs) {
        let end = if answer.option_id.as_deref() == Some(DENY) {
            Event::RunDenied {
                reason: answer.text.clone().unwrap_or_default(),
            }
        } else {
            completed("null")
        };
        must_append(st, append(run, 3, lease, vec![end], at(5))).await;
        assert!(record(st, run).await.status.is_terminal());
    }
    refuse_all("after the runs ended").await;
    let pending: Vec<RequestId> = st
        .pending_requests(&session)
        .await
        .expect("pending")
        .into_iter()
        .map(|p| p.request_id)
        .collect();
    assert_eq!(
        pending,
        vec![other_req],
        "only the bystander's ask is pending"
    );
}
