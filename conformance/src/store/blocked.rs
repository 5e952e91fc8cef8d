//! Blocked runs: not claimable, still take deliveries, resumed or failed by an operator.

use crate::fixtures::*;
use crate::{assert_err, StoreFactory};
use eve_core::{Event, InputResponse, Resolution, RunStatus, SessionEvent, StoreError, ToolResult};

/// `RunBlocked` parks a run (not claimable, deliveries accepted); `Resume` writes `RunResumed`
/// and makes it claimable; `Fail` withdraws its pending requests and writes `RunFailed`, settling
/// the call once.
pub async fn resolve_blocked_resume_and_fail(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let (run, lease) = started(st, new_run("blocked"), at(0)).await;
    let id = &run.run_id;
    assert_err!(
        st.resolve_blocked(id, Resolution::Resume, at(1)).await,
        StoreError::InvalidInput(_),
        "resolving a running run"
    );
    assert_err!(
        st.resolve_blocked(
            &eve_core::RunId::new(unique("nope")),
            Resolution::Resume,
            at(1)
        )
        .await,
        StoreError::NotFound { .. },
        "resolving an unknown run"
    );
    let token = unique("token");
    let (r1, a1) = ask(id, 2);
    let (r2, a2) = ask(id, 3);
    let blocked = Event::RunBlocked {
        reason: "[EVE0001] non-determinism at cmd 4".into(),
    };
    let ok = must_append(
        st,
        append(
            id,
            1,
            &lease,
            vec![hook(1, &token), a1, a2, blocked.clone()],
            at(1),
        ),
    )
    .await;
    assert_eq!(record(st, id).await.status, RunStatus::Blocked);
    st.release(&lease, id, ok.next_seq, at(2))
        .await
        .expect("release");
    st.deliver_hook(&token, json("1"), None, at(3))
        .await
        .expect("a blocked run takes deliveries");
    st.answer(&r1, InputResponse::option("no"), at(3))
        .await
        .expect("a blocked run's request is answerable");
    let w = worker(st, at(4)).await;
    assert!(
        st.claim(&w, 10, at(4)).await.expect("claim").is_empty(),
        "a blocked run is not claimable, even with new events"
    );
    let seq = st
        .resolve_blocked(id, Resolution::Resume, at(5))
        .await
        .expect("resume");
    assert_eq!(seq, 7, "RunResumed at the next seq");
    assert_eq!(journal(st, id).await[7].event, Event::RunResumed);
    assert_eq!(record(st, id).await.status, RunStatus::Running);
    claim_run(st, &w, id, at(6)).await;
    must_append(st, append(id, 8, &w, vec![blocked], at(7))).await;
    let seq = st
        .resolve_blocked(
            id,
            Resolution::Fail {
                error: "operator gave up".into(),
            },
            at(8),
        )
        .await
        .expect("fail");
    assert_eq!(seq, 9, "the resolution's first event is at the next seq");
    let j = journal(st, id).await;
    assert_eq!(
        j[9..].iter().map(|e| e.event.clone()).collect::<Vec<_>>(),
        vec![
            Event::InputWithdrawn {
                request_id: r2.clone()
            },
            Event::RunFailed {
                error: "operator gave up".into()
            }
        ],
        "Fail withdraws the pending request (not the answered one) and fails the run"
    );
    let rec = record(st, id).await;
    assert_eq!((rec.status, rec.owner), (RunStatus::Failed, None));
    assert_err!(
        st.answer(&r2, InputResponse::option("yes"), at(9)).await,
        StoreError::Withdrawn { .. },
        "answer after Fail"
    );
    assert_err!(
        st.deliver_hook(&token, json("1"), None, at(9)).await,
        StoreError::NotFound { .. },
        "hook after Fail"
    );
    assert_err!(
        st.resolve_blocked(id, Resolution::Resume, at(9)).await,
        StoreError::InvalidInput(_),
        "resolving a failed run"
    );
    let log = st
        .read_session(&run.session_id, 0, 100)
        .await
        .expect("read_session");
    let settled: Vec<_> = log
        .iter()
        .filter(|e| matches!(e.event, SessionEvent::ToolSettled { .. }))
        .collect();
    assert_eq!(settled.len(), 1, "one call, one result");
    assert_eq!(
        settled[0].event,
        SessionEvent::ToolSettled {
            result: ToolResult::Failed {
                error: "operator gave up".into()
            }
        }
    );
}

/// No worker claims a blocked run, so a cancel request ends it in the same append:
/// `CancelRequested`, the withdrawal of its pending requests and `RunCancelled`; its hooks are
/// released and its call settles once, as cancelled.
pub async fn cancel_ends_a_blocked_run(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let (run, lease) = started(st, new_run("blocked-cancel"), at(0)).await;
    let id = &run.run_id;
    let token = unique("token");
    let (req, a) = ask(id, 2);
    let blocked = Event::RunBlocked {
        reason: "[EVE0001] panicked".into(),
    };
    let ok = must_append(
        st,
        append(id, 1, &lease, vec![hook(1, &token), a, blocked], at(1)),
    )
    .await;
    st.release(&lease, id, ok.next_seq, at(2))
        .await
        .expect("release");
    assert_eq!(
        st.request_cancel(id, "steer", at(3)).await.expect("cancel"),
        eve_core::CancelOutcome::Requested { seq: 4 }
    );
    let j = journal(st, id).await;
    assert_eq!(
        j[4..].iter().map(|e| e.event.clone()).collect::<Vec<_>>(),
        vec![
            Event::CancelRequested {
                reason: "steer".into()
            },
            Event::InputWithdrawn {
                request_id: req.clone()
            },
            Event::RunCancelled,
        ]
    );
    let rec = record(st, id).await;
    assert_eq!((rec.status, rec.owner), (RunStatus::Cancelled, None));
    assert_err!(
        st.deliver_hook(&token, json("1"), None, at(4)).await,
        StoreError::NotFound { .. },
        "the hook of a blocked run cancelled"
    );
    assert_err!(
        st.answer(&req, InputResponse::option("yes"), at(4)).await,
        StoreError::Withdrawn { .. },
        "an answer to a blocked run cancelled"
    );
    assert_eq!(
        st.request_cancel(id, "again", at(5)).await.expect("cancel"),
        eve_core::CancelOutcome::AlreadyEnded {
            status: RunStatus::Cancelled
        }
    );
    let log = st
        .read_session(&run.session_id, 0, 100)
        .await
        .expect("read_session");
    let settled: Vec<_> = log
        .iter()
        .filter(|e| matches!(e.event, SessionEvent::ToolSettled { .. }))
        .map(|e| e.event.clone())
        .collect();
    assert_eq!(
        settled,
        vec![SessionEvent::ToolSettled {
            result: ToolResult::Cancelled
        }],
        "one call, one result"
    );
}

/// `Resolution::Terminate` ends any live run at once, in one append: the withdrawal of its
/// pending requests and `RunTerminated` (status `failed`, lease released, hooks released, the
/// call settled failed once, naming who and why). It works on a running run whose holder then
/// finds its next append refused (`RunEnded`, nothing written), on a parked run with a pending
/// request (withdrawn: a later answer is `Withdrawn`) and on a blocked run. An ended run is
/// refused with `RunEnded` and nothing changes; `JournalStoreExt::terminate` names its status.
pub async fn terminate_ends_any_live_run(factory: &dyn StoreFactory) {
    use eve_core::{JournalStoreExt, TerminateOutcome};
    let s = fresh(factory).await;
    let st = &*s.store;
    let terminate = |reason: &str| Resolution::Terminate {
        reason: reason.into(),
        by: "alice".into(),
    };
    let settled_once = |log: Vec<eve_core::SessionEntry>, reason: &str| {
        let settled: Vec<_> = log
            .into_iter()
            .filter(|e| matches!(e.event, SessionEvent::ToolSettled { .. }))
            .map(|e| e.event)
            .collect();
        assert_eq!(
            settled,
            vec![SessionEvent::ToolSettled {
                result: ToolResult::Failed {
                    error: format!("terminated by alice: {reason}")
                }
            }],
            "one call, one result: failed, naming who and why"
        );
    };

    // A running run, held by a worker that goes on running its body.
    let (run, lease) = started(st, new_run("term-running"), at(0)).await;
    let id = &run.run_id;
    must_append(st, append(id, 1, &lease, vec![step(1, "1")], at(1))).await;
    let seq = st
        .resolve_blocked(id, terminate("runaway"), at(2))
        .await
        .expect("terminate a running run");
    assert_eq!(seq, 2, "RunTerminated at the next seq");
    assert_eq!(
        journal(st, id).await[2].event,
        Event::RunTerminated {
            reason: "runaway".into(),
            by: "alice".into()
        }
    );
    let rec = record(st, id).await;
    assert_eq!(
        (rec.status, rec.owner, rec.next_seq),
        (RunStatus::Failed, None, 3),
        "terminated: failed, the lease released"
    );
    assert_err!(
        st.append(append(id, 3, &lease, vec![step(2, "2")], at(3)))
            .await,
        StoreError::RunEnded { .. },
        "the old holder's next append"
    );
    assert_err!(
        st.append(append(id, 2, &lease, vec![step(2, "2")], at(3)))
            .await,
        StoreError::RunEnded { .. },
        "the old holder's append at the seq it last saw"
    );
    assert_eq!(
        journal(st, id).await.len(),
        3,
        "a refused append writes nothing"
    );
    let w = worker(st, at(4)).await;
    assert!(
        st.claim(&w, 10, at(4))
            .await
            .expect("claim")
            .iter()
            .all(|c| &c.run_id != id),
        "a terminated run is not claimable"
    );
    settled_once(
        st.read_session(&run.session_id, 0, 100)
            .await
            .expect("read_session"),
        "runaway",
    );

    // A parked run with a pending request and a live hook.
    let (run, lease) = started(st, new_run("term-parked"), at(0)).await;
    let id = &run.run_id;
    let token = unique("token");
    let (req, a) = ask(id, 2);
    let ok = must_append(st, append(id, 1, &lease, vec![hook(1, &token), a], at(1))).await;
    st.release(&lease, id, ok.next_seq, at(2))
        .await
        .expect("release");
    assert_eq!(
        st.terminate(id, "stuck", "alice", at(3))
            .await
            .expect("terminate a parked run"),
        TerminateOutcome::Terminated { seq: 3 }
    );
    assert_eq!(
        journal(st, id).await[3..]
            .iter()
            .map(|e| e.event.clone())
            .collect::<Vec<_>>(),
        vec![
            Event::InputWithdrawn {
                request_id: req.clone()
            },
            Event::RunTerminated {
                reason: "stuck".into(),
                by: "alice".into()
            }
        ],
        "the pending request withdrawn, then the run ended, in one append"
    );
    assert_eq!(record(st, id).await.status, RunStatus::Failed);
    assert_err!(
        st.answer(&req, InputResponse::option("yes"), at(4)).await,
        StoreError::Withdrawn { .. },
        "an answer after terminate"
    );
    assert_err!(
        st.deliver_hook(&token, json("1"), None, at(4)).await,
        StoreError::NotFound { .. },
        "the hook of a terminated run"
    );
    assert!(
        st.pending_requests(&run.session_id)
            .await
            .expect("pending_requests")
            .is_empty(),
        "nothing pending after terminate"
    );
    settled_once(
        st.read_session(&run.session_id, 0, 100)
            .await
            .expect("read_session"),
        "stuck",
    );

    // A blocked run.
    let (run, lease) = started(st, new_run("term-blocked"), at(0)).await;
    let id = &run.run_id;
    let blocked = Event::RunBlocked {
        reason: "[EVE0001] panicked".into(),
    };
    let ok = must_append(st, append(id, 1, &lease, vec![blocked], at(1))).await;
    st.release(&lease, id, ok.next_seq, at(2))
        .await
        .expect("release");
    assert_eq!(
        st.terminate(id, "give up", "alice", at(3))
            .await
            .expect("terminate a blocked run"),
        TerminateOutcome::Terminated { seq: 2 }
    );
    let rec = record(st, id).await;
    assert_eq!((rec.status, rec.owner), (RunStatus::Failed, None));
    settled_once(
        st.read_session(&run.session_id, 0, 100)
            .await
            .expect("read_session"),
        "give up",
    );

    // Ended runs: refused, nothing written; the ext names the status.
    assert_err!(
        st.resolve_blocked(id, terminate("again"), at(4)).await,
        StoreError::RunEnded { .. },
        "terminating a terminated run"
    );
    assert_eq!(
        st.terminate(id, "again", "bob", at(4))
            .await
            .expect("terminate an ended run"),
        TerminateOutcome::NotLive {
            status: RunStatus::Failed
        }
    );
    assert_eq!(journal(st, id).await.len(), 3, "nothing written");
    let (done, lease) = started(st, new_run("term-completed"), at(0)).await;
    must_append(
        st,
        append(&done.run_id, 1, &lease, vec![completed("1")], at(1)),
    )
    .await;
    assert_eq!(
        st.terminate(&done.run_id, "late", "alice", at(2))
            .await
            .expect("terminate a completed run"),
        TerminateOutcome::NotLive {
            status: RunStatus::Completed
        }
    );
    let rec = record(st, &done.run_id).await;
    assert_eq!((rec.status, rec.next_seq), (RunStatus::Completed, 2));
    let log = st
        .read_session(&done.session_id, 0, 100)
        .await
        .expect("read_session");
    assert_eq!(
        log.iter()
            .filter(|e| matches!(e.event, SessionEvent::ToolSettled { .. }))
            .count(),
        1,
        "a refused terminate settles nothing again"
    );
    assert_err!(
        st.terminate(&eve_core::RunId::new(unique("nope")), "x", "alice", at(5))
            .await,
        StoreError::NotFound { .. },
        "terminating an unknown run"
    );
}
