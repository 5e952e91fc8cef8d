//! Directed cases, one per contract clause that the other families only touch in passing
//! (issue 17): each states its clause and checks it call by call on a fresh store.

use crate::fixtures::*;
use crate::{assert_err, StoreFactory};
use eve_core::{
    Append, CancelOutcome, DeploymentId, Event, Execution, InputResponse, JournalStore, Lease,
    Resolution, RunId, RunStatus, SessionEvent, StoreError, Timestamp,
};

/// The session log of `run`'s session, panicking on error.
async fn session_log(store: &dyn JournalStore, run: &RunId) -> Vec<SessionEvent> {
    let session = record(store, run).await.session_id;
    store
        .read_session(&session, 0, 1000)
        .await
        .unwrap_or_else(|e| panic!("read_session failed: {e}"))
        .into_iter()
        .map(|e| e.event)
        .collect()
}

/// Contract clause 2: an answer to a request the run withdrew (an `InputWithdrawn` the worker
/// appended, the run still running) is refused as `Withdrawn`, and writes nothing.
///
/// Issue 17, item 1.
pub async fn answer_to_withdrawn_request_of_running_run(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let (run, lease) = started(st, new_run("withdrawn-running"), at(0)).await;
    let id = &run.run_id;
    let (req, a) = ask(id, 1);
    must_append(st, append(id, 1, &lease, vec![a], at(1))).await;
    must_append(
        st,
        append(
            id,
            2,
            &lease,
            vec![Event::InputWithdrawn {
                request_id: req.clone(),
            }],
            at(2),
        ),
    )
    .await;
    assert_eq!(record(st, id).await.status, RunStatus::Running);
    let before = journal(st, id).await;
    assert_err!(
        st.answer(&req, InputResponse::option("yes"), at(3)).await,
        StoreError::Withdrawn { .. },
        "an answer to a request withdrawn while its run keeps running"
    );
    assert_eq!(
        journal(st, id).await,
        before,
        "a refused answer leaves the journal unchanged"
    );
    assert_eq!(record(st, id).await.next_seq, 3, "nothing was written");
}

/// Contract clause 2: a hook dedupe key belongs to one hook. The same key sent to two live hooks
/// writes to both, and a token released by an ended run and registered by a later run does not
/// inherit the earlier hook's keys.
///
/// Issue 17, item 2.
pub async fn hook_dedupe_key_belongs_to_one_hook(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let (run, lease) = started(st, new_run("dedupe-owner"), at(0)).await;
    let id = &run.run_id;
    let (t1, t2) = (unique("token"), unique("token"));
    must_append(
        st,
        append(id, 1, &lease, vec![hook(1, &t1), hook(2, &t2)], at(1)),
    )
    .await;
    let d1 = st
        .deliver_hook(&t1, json("1"), Some("key"), at(2))
        .await
        .expect("first hook");
    let d2 = st
        .deliver_hook(&t2, json("2"), Some("key"), at(2))
        .await
        .expect("second hook");
    assert!(
        !d1.duplicate && !d2.duplicate,
        "one key sent to two hooks writes to both: {d1:?}, {d2:?}"
    );
    assert_ne!(d1.seq, d2.seq, "two events");
    let dup = st
        .deliver_hook(&t1, json("1"), Some("key"), at(3))
        .await
        .expect("retry");
    assert_eq!(
        (dup.seq, dup.duplicate),
        (d1.seq, true),
        "a retry is a duplicate"
    );
    let next = record(st, id).await.next_seq;
    must_append(st, append(id, next, &lease, vec![completed("1")], at(4))).await;

    // The token, released, is registered by a later run: the old key is not this hook's.
    let (later, lease2) = started(st, new_run("dedupe-reuse"), at(5)).await;
    let lid = &later.run_id;
    must_append(st, append(lid, 1, &lease2, vec![hook(1, &t1)], at(6))).await;
    let d = st
        .deliver_hook(&t1, json("3"), Some("key"), at(7))
        .await
        .expect("delivery to the reused token");
    assert_eq!(
        (&d.run, d.seq, d.duplicate),
        (lid, 2, false),
        "a token reused by a later run does not inherit the earlier hook's dedupe keys"
    );
    let j = journal(st, lid).await;
    assert_eq!(j.len(), 3);
    assert!(
        matches!(&j[2].event, Event::HookReceived { payload, .. } if payload == &json("3")),
        "the later run received the payload: {:?}",
        j[2].event
    );
}

/// Contract clause 6: reads are in seq order whatever the writers' clocks say. Appends and
/// deliveries whose `now` goes backwards keep their seqs and their `at`; no page reorders or
/// repeats an event, and the session log stays in seq order too.
///
/// Issue 17, item 3.
pub async fn reads_in_seq_order_when_clocks_go_back(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let (run, lease) = started(st, new_run("clock-back"), at(10_000)).await;
    let id = &run.run_id;
    let token = unique("token");
    let (req, a) = ask(id, 2);
    must_append(
        st,
        append(id, 1, &lease, vec![hook(1, &token), a], at(9_000)),
    )
    .await;
    st.deliver_hook(&token, json("1"), None, at(8_000))
        .await
        .expect("hook");
    st.answer(&req, InputResponse::option("yes"), at(7_000))
        .await
        .expect("answer");
    let mut next = 5;
    let mut when = 6_000;
    for cmd in 3..9u64 {
        must_append(
            st,
            append(
                id,
                next,
                &lease,
                vec![step(cmd, &cmd.to_string())],
                at(when),
            ),
        )
        .await;
        next += 1;
        when -= 500;
    }
    st.deliver_hook(&token, json("2"), None, at(1))
        .await
        .expect("hook");
    next += 1;
    let all = journal(st, id).await;
    assert_eq!(
        all.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (0..next).collect::<Vec<_>>(),
        "the journal in seq order"
    );
    assert_eq!(all[1].at, at(9_000), "each event keeps its writer's time");
    assert_eq!(all[3].at, at(8_000));
    assert_eq!(all[4].at, at(7_000));
    assert_eq!(all[next as usize - 1].at, at(1));
    for size in [1usize, 2, 3, 5] {
        let mut got = Vec::new();
        let mut from = 0;
        while from < next {
            let page = st.read(id, from, size).await.expect("read");
            assert!(
                !page.is_empty() && page.len() <= size,
                "a page of at most {size} from {from}: {} events",
                page.len()
            );
            from += page.len() as u64;
            got.extend(page);
        }
        assert_eq!(got, all, "pages of {size} give the journal, once, in order");
    }
    let session = record(st, id).await.session_id;
    let log = st
        .read_session(&session, 0, 1000)
        .await
        .expect("read_session");
    assert!(
        log.windows(2).all(|w| w[0].seq < w[1].seq),
        "the session log in seq order: {:?}",
        log.iter().map(|e| e.seq).collect::<Vec<_>>()
    );
    assert!(log.len() >= 2, "the request and its answer are logged");
    // A second run of the session, its writer's clock further back: the log stays in seq order,
    // and pages of it give the same entries once.
    let mut second = new_run("clock-back-2");
    second.session_id = session.clone();
    let (run2, lease2) = started(st, second, at(500)).await;
    let (_, a2) = ask(&run2.run_id, 1);
    must_append(st, append(&run2.run_id, 1, &lease2, vec![a2], at(100))).await;
    let full = st
        .read_session(&session, 0, 1000)
        .await
        .expect("read_session");
    assert_eq!(full.len(), log.len() + 1, "the new request is logged once");
    assert!(
        full.windows(2).all(|w| w[0].seq < w[1].seq),
        "the session log in seq order: {:?}",
        full.iter().map(|e| e.seq).collect::<Vec<_>>()
    );
    for size in [1usize, 2] {
        let mut got = Vec::new();
        let mut from = full[0].seq;
        loop {
            let page = st
                .read_session(&session, from, size)
                .await
                .expect("read_session");
            let Some(last) = page.last() else { break };
            assert!(page.len() <= size);
            from = last.seq + 1;
            got.extend(page);
        }
        assert_eq!(
            got, full,
            "session log pages of {size} give the log once, in order"
        );
    }
}

/// Contract clause 4: a hook's token is released at every end of its run: completed, failed,
/// cancelled (by the worker after a cancel request) and failed by an operator (`resolve_blocked`
/// with `Fail`). After each, a delivery is `NotFound` and another run may register the token.
///
/// Issue 17, item 4.
pub async fn hook_token_released_at_every_end(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    for end in ["completed", "failed", "cancelled", "operator-failed"] {
        let (run, lease) = started(st, new_run(end), at(0)).await;
        let id = &run.run_id;
        let token = unique("token");
        must_append(st, append(id, 1, &lease, vec![hook(1, &token)], at(1))).await;
        match end {
            "completed" => {
                must_append(st, append(id, 2, &lease, vec![completed("1")], at(2))).await;
            }
            "failed" => {
                let failed = Event::RunFailed {
                    error: "boom".into(),
                };
                must_append(st, append(id, 2, &lease, vec![failed], at(2))).await;
            }
            "cancelled" => {
                assert_eq!(
                    st.request_cancel(id, "stop", at(2)).await.expect("cancel"),
                    CancelOutcome::Requested { seq: 2 }
                );
                must_append(st, append(id, 3, &lease, vec![Event::RunCancelled], at(3))).await;
            }
            _ => {
                let blocked = Event::RunBlocked {
                    reason: "stuck".into(),
                };
                let ok = must_append(st, append(id, 2, &lease, vec![blocked], at(2))).await;
                st.release(&lease, id, ok.next_seq, at(2))
                    .await
                    .expect("release");
                st.resolve_blocked(
                    id,
                    Resolution::Fail {
                        error: "operator".into(),
                    },
                    at(3),
                )
                .await
                .expect("resolve_blocked Fail");
            }
        }
        assert!(
            record(st, id).await.status.is_terminal(),
            "the run ended ({end})"
        );
        assert_err!(
            st.deliver_hook(&token, json("1"), None, at(4)).await,
            StoreError::NotFound { .. },
            "a delivery to the hook of a run that ended {end}"
        );
        let (other, lease2) = started(st, new_run("reuse"), at(5)).await;
        must_append(
            st,
            append(&other.run_id, 1, &lease2, vec![hook(1, &token)], at(6)),
        )
        .await;
        let d = st
            .deliver_hook(&token, json("2"), None, at(7))
            .await
            .unwrap_or_else(|e| panic!("the token released at the end ({end}) is reusable: {e}"));
        assert_eq!(d.run, other.run_id);
    }
}

/// Contract clause 5: after a worker re-registers (a new epoch) and re-claims its run, appends and
/// releases under the older epoch are `Fenced`, write nothing and leave the new epoch's claim.
///
/// Issue 17, item 5.
pub async fn older_epoch_fenced_after_reclaim(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let (run, old) = started(st, new_run("reclaim"), at(0)).await;
    let id = &run.run_id;
    must_append(st, append(id, 1, &old, vec![step(1, "1")], at(1))).await;
    let new = st
        .register_worker(&old.worker, &old.deployment, TTL, at(2))
        .await
        .expect("re-register");
    claim_run(st, &new, id, at(3)).await;
    must_append(st, append(id, 2, &new, vec![step(2, "2")], at(4))).await;
    assert_err!(
        st.append(append(id, 3, &old, vec![step(3, "\"old\"")], at(5)))
            .await,
        StoreError::Fenced { .. },
        "an append under the older epoch at the right seq"
    );
    assert_err!(
        st.release(&old, id, 3, at(5)).await,
        StoreError::Fenced { .. },
        "a release under the older epoch"
    );
    assert_err!(
        st.retire_worker(&old, at(5)).await,
        StoreError::Fenced { .. },
        "retiring the older epoch"
    );
    assert_err!(
        st.claim(&old, 10, at(5)).await,
        StoreError::Fenced { .. },
        "a claim under the older epoch"
    );
    let other = worker(st, at(5)).await;
    assert!(
        st.claim(&other, 10, at(5))
            .await
            .expect("claim")
            .iter()
            .all(|r| &r.run_id != id),
        "the older epoch's refused release and retire left the run held by the new epoch"
    );
    assert_eq!(
        journal(st, id).await.len(),
        3,
        "the fenced append wrote nothing"
    );
    let rec = record(st, id).await;
    assert_eq!(
        rec.owner,
        Some((new.worker.clone(), new.epoch)),
        "the new epoch still holds the run"
    );
    must_append(st, append(id, 3, &new, vec![step(3, "3")], at(6))).await;
}

/// Contract clause 2: cancelling an ended run answers `AlreadyEnded` with how it ended, even when a
/// cancel had been requested before it ended; nothing is written.
///
/// Issue 17, item 6.
pub async fn cancel_after_end_is_already_ended(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    for (tag, end, status) in [
        ("cancel-then-complete", completed("1"), RunStatus::Completed),
        (
            "cancel-then-cancelled",
            Event::RunCancelled,
            RunStatus::Cancelled,
        ),
    ] {
        let (run, lease) = started(st, new_run(tag), at(0)).await;
        let id = &run.run_id;
        assert_eq!(
            st.request_cancel(id, "stop", at(1)).await.expect("cancel"),
            CancelOutcome::Requested { seq: 1 }
        );
        must_append(st, append(id, 2, &lease, vec![end], at(2))).await;
        assert_eq!(
            st.request_cancel(id, "again", at(3)).await.expect("cancel"),
            CancelOutcome::AlreadyEnded { status },
            "cancelling a run that ended {status:?} after a cancel request"
        );
        assert_eq!(journal(st, id).await.len(), 3, "nothing written");
    }
    // Cancel requested, then the run blocked and an operator failed it.
    let (run, lease) = started(st, new_run("cancel-then-operator-fail"), at(0)).await;
    let id = &run.run_id;
    assert_eq!(
        st.request_cancel(id, "stop", at(1)).await.expect("cancel"),
        CancelOutcome::Requested { seq: 1 }
    );
    let blocked = Event::RunBlocked {
        reason: "stuck".into(),
    };
    let ok = must_append(st, append(id, 2, &lease, vec![blocked], at(2))).await;
    st.release(&lease, id, ok.next_seq, at(2))
        .await
        .expect("release");
    st.resolve_blocked(
        id,
        Resolution::Fail {
            error: "operator".into(),
        },
        at(3),
    )
    .await
    .expect("resolve_blocked Fail");
    let len = journal(st, id).await.len();
    assert_eq!(
        st.request_cancel(id, "again", at(4)).await.expect("cancel"),
        CancelOutcome::AlreadyEnded {
            status: RunStatus::Failed
        },
        "cancelling a run an operator failed after a cancel request"
    );
    assert_eq!(journal(st, id).await.len(), len, "nothing written");
}

/// Contract clause 1: a retry of an older landed append (not the latest) is a duplicate success
/// with its original seqs, and writes nothing.
///
/// Issue 17, item 7.
pub async fn retry_of_older_append_is_duplicate(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let (run, lease) = started(st, new_run("older-retry"), at(0)).await;
    let id = &run.run_id;
    let first = append(id, 1, &lease, vec![step(1, "1"), step(2, "2")], at(1));
    let first_id = first.append_id.clone();
    must_append(st, first.clone()).await;
    let second = append(id, 3, &lease, vec![step(3, "3")], at(2));
    must_append(st, second.clone()).await;
    must_append(st, append(id, 4, &lease, vec![step(4, "4")], at(3))).await;
    let again = st
        .append(first)
        .await
        .expect("the retry of an older append must not fail (Conflict)");
    assert_eq!(
        (again.first_seq, again.next_seq, again.duplicate),
        (1, 3, true),
        "the retry of an older append answers its original seqs as a duplicate"
    );
    let again = st.append(second).await.expect("retry");
    assert_eq!(
        (again.first_seq, again.next_seq, again.duplicate),
        (3, 4, true)
    );
    assert_eq!(journal(st, id).await.len(), 5, "a duplicate writes nothing");
    let end = append(id, 5, &lease, vec![completed("1")], at(4));
    must_append(st, end).await;
    let late = append(id, 1, &lease, vec![step(1, "1"), step(2, "2")], at(1));
    let late = Append {
        append_id: first_id,
        ..late
    };
    let again = st
        .append(late)
        .await
        .expect("the retry of an older append after the run ended is a duplicate, not RunEnded");
    assert_eq!((again.first_seq, again.duplicate), (1, true));
    assert_eq!(journal(st, id).await.len(), 6, "a duplicate writes nothing");
}

/// Contract clause 5: claims honour due times and lease expiries to the millisecond: a timer due at
/// `t` is not claimable at `t - 1ms` and is at `t`; a run held by a lease expiring at `e` is not
/// claimable by another worker at `e - 1ms` and is (orphaned) at `e`.
///
/// Issue 17, item 8.
pub async fn claims_honour_time_to_the_millisecond(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let (run, lease) = started(st, new_run("due-ms"), at(0)).await;
    let id = &run.run_id;
    let ok = must_append(st, append(id, 1, &lease, vec![sleep(1, at(1_000))], at(1))).await;
    st.release(&lease, id, ok.next_seq, at(1))
        .await
        .expect("release");
    let w = worker(st, at(2)).await;
    assert!(
        st.claim(&w, 10, at(999)).await.expect("claim").is_empty(),
        "a timer due at +1000ms is not claimable at +999ms"
    );
    claim_run(st, &w, id, at(1_000)).await;
    let retry = Event::StepFailed {
        cmd: 2,
        name: "s".into(),
        attempt: 1,
        error: "flaky".into(),
        fatal: false,
        retry_at: Some(at(2_000)),
    };
    let ok = must_append(
        st,
        append(
            id,
            2,
            &w,
            vec![Event::SleepFired { cmd: 1 }, retry],
            at(1_001),
        ),
    )
    .await;
    st.release(&w, id, ok.next_seq, at(1_001))
        .await
        .expect("release");
    assert_eq!(
        st.next_wake(&DeploymentId::new(DEPLOYMENT), at(1_999))
            .await
            .expect("next_wake"),
        Some(at(2_000)),
        "next_wake names the retry's time at 1ms before"
    );
    assert!(
        st.claim(&w, 10, at(1_999)).await.expect("claim").is_empty(),
        "a retry due at +2000ms is not claimable at +1999ms"
    );
    claim_run(st, &w, id, at(2_000)).await;

    let (held, holder) = started(st, new_run("lease-ms"), at(0)).await;
    let expiry = holder.expires_at;
    let other = worker(st, Timestamp(expiry.0 - 10)).await;
    let early = st
        .claim(&other, 10, Timestamp(expiry.0 - 1))
        .await
        .expect("claim");
    assert!(
        early.iter().all(|r| r.run_id != held.run_id),
        "a run whose lease expires at {expiry} is held at 1ms before"
    );
    claim_run(st, &other, &held.run_id, expiry).await;
}

/// Contract clauses 1, 3 and 5: a refused append (`Conflict` or `Fenced`) writes no session-log
/// entry and no pending request; the execution mode is part of the idempotent-start match (the same
/// key in the other mode is `IdempotencyMismatch`); `next_wake` names work that is already due (a
/// time at or before `now`).
///
/// Issue 17, item 9.
pub async fn refused_append_mode_match_and_due_wake(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let (run, lease) = started(st, new_run("refused"), at(0)).await;
    let id = &run.run_id;
    let log_before = session_log(st, id).await;
    let (_, a) = ask(id, 1);
    assert_err!(
        st.append(append(id, 5, &lease, vec![a.clone()], at(1)))
            .await,
        StoreError::Conflict { .. },
        "an append at the wrong seq"
    );
    let stranger = worker(st, at(1)).await;
    assert_err!(
        st.append(append(id, 1, &stranger, vec![a], at(1))).await,
        StoreError::Fenced { .. },
        "an append by a worker that does not own the run"
    );
    let (holder, hl) = started(st, new_run("token-holder"), at(1)).await;
    let taken = unique("token");
    must_append(
        st,
        append(&holder.run_id, 1, &hl, vec![hook(1, &taken)], at(1)),
    )
    .await;
    let (_, a) = ask(id, 1);
    assert_err!(
        st.append(append(id, 1, &lease, vec![a, hook(2, &taken)], at(1)))
            .await,
        StoreError::AlreadyExists { .. },
        "an append registering a live token"
    );
    let (_, a) = ask(id, 1);
    assert_err!(
        st.append(append(id, 5, &lease, vec![a, completed("1")], at(1)))
            .await,
        StoreError::Conflict { .. },
        "an ending append at the wrong seq"
    );
    assert_eq!(
        session_log(st, id).await,
        log_before,
        "a refused append writes no session-log entry"
    );
    assert_eq!(record(st, id).await.status, RunStatus::Running);
    assert!(
        st.pending_requests(&run.session_id)
            .await
            .expect("pending")
            .is_empty(),
        "a refused append leaves no pending request"
    );
    assert_eq!(journal(st, id).await.len(), 1);

    // The execution mode is part of the match.
    let mut bg = new_run("mode");
    bg.idempotency_key = Some(unique("key"));
    bg.execution = Execution::Background;
    st.create_run(bg.clone(), at(2)).await.expect("create_run");
    let mut again = bg.clone();
    again.execution = Execution::Default;
    assert_err!(
        st.create_run(again, at(3)).await,
        StoreError::IdempotencyMismatch { .. },
        "the same key and input in the other execution mode"
    );
    let same = st.create_run(bg.clone(), at(3)).await.expect("repeat");
    assert!(!same.created && same.run.run_id == bg.run_id);
    let mut eager = new_run("mode-eager");
    eager.idempotency_key = Some(unique("key"));
    let w = worker(st, at(3)).await;
    st.create_run_claimed(eager.clone(), &w, at(3))
        .await
        .expect("create_run_claimed");
    let mut again = eager.clone();
    again.execution = Execution::Background;
    assert_err!(
        st.create_run_claimed(again, &w, at(4)).await,
        StoreError::IdempotencyMismatch { .. },
        "an eager start with the same key and input in the other execution mode"
    );

    // next_wake names work already due.
    let s = fresh(factory).await;
    let st = &*s.store;
    let dep = DeploymentId::new(DEPLOYMENT);
    let (run, lease) = started(st, new_run("due-wake"), at(0)).await;
    let id = &run.run_id;
    let token = unique("token");
    let ok = must_append(
        st,
        append(
            id,
            1,
            &lease,
            vec![hook(1, &token), sleep(2, at(50_000))],
            at(1),
        ),
    )
    .await;
    st.release(&lease, id, ok.next_seq, at(2))
        .await
        .expect("release");
    let wake = st.next_wake(&dep, at(3)).await.expect("next_wake");
    assert_eq!(wake, Some(at(50_000)), "only the timer is scheduled");
    st.deliver_hook(&token, json("1"), None, at(10))
        .await
        .expect("hook");
    let wake = st.next_wake(&dep, at(20)).await.expect("next_wake");
    assert!(
        matches!(wake, Some(t) if t <= at(20)),
        "next_wake names an undelivered event as due now, not the later timer: {wake:?}"
    );
    let wake = st.next_wake(&dep, at(60_000)).await.expect("next_wake");
    assert!(
        matches!(wake, Some(t) if t <= at(60_000)),
        "next_wake names due work: {wake:?}"
    );
    // An orphaned run (its owner's lease expired) has work due at once.
    let s = fresh(factory).await;
    let st = &*s.store;
    let (_, held) = started(st, new_run("orphan-wake"), at(0)).await;
    assert_eq!(
        st.next_wake(&dep, at(1)).await.expect("next_wake"),
        None,
        "a run a valid lease holds, with no timer, is no one else's wake-up"
    );
    let late = held.expires_at;
    let wake = st.next_wake(&dep, late).await.expect("next_wake");
    assert!(
        matches!(wake, Some(t) if t <= late),
        "next_wake names an orphaned run as due: {wake:?}"
    );
}

/// Contract clause 5: every claim of a run gets a larger [`eve_core::RunRecord::fencing_token`] than
/// the claim before it, whichever worker makes it: after an append, after a lease expired
/// with no append between, after the claimer's worker id was registered again.
///
/// Issue 17, item 3.
pub async fn fencing_tokens_grow_with_every_claim(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let id = st
        .create_run(new_run("fence"), at(0))
        .await
        .expect("create_run")
        .run
        .run_id;
    let ttl = TTL.as_millis() as i64;
    let claimed = |lease: Lease, now: Timestamp| {
        let id = id.clone();
        async move {
            let runs = st.claim(&lease, 1000, now).await.expect("claim");
            let rec = runs
                .into_iter()
                .find(|r| r.run_id == id)
                .unwrap_or_else(|| panic!("run {id} is claimable at {now} by {}", lease.worker));
            (rec.fencing_token(), lease)
        }
    };
    let mut tokens = Vec::new();
    // A fresh run, claimed; its worker appends.
    let (t, a) = claimed(worker(st, at(0)).await, at(0)).await;
    tokens.push(t);
    must_append(st, append(&id, 1, &a, vec![step(1, "1")], at(1))).await;
    // A's lease expires; b takes the run over.
    let later = at(1 + ttl + 1);
    let (t, b) = claimed(worker(st, later).await, later).await;
    tokens.push(t);
    // b's lease expires with no append; c takes the run over.
    let later = Timestamp(later.0 + ttl + 1);
    let (t, c) = claimed(worker(st, later).await, later).await;
    tokens.push(t);
    // c's worker id is registered again (a restarted process): its new epoch takes the run.
    let again = Timestamp(later.0 + 1);
    let c2 = st
        .register_worker(&c.worker, &c.deployment, TTL, again)
        .await
        .expect("re-register");
    let (t, _) = claimed(c2, again).await;
    tokens.push(t);
    drop(b);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "each claim's fencing token is larger than the one before: {tokens:?}"
    );
    assert_eq!(
        record(st, &id).await.fencing_token(),
        tokens[3],
        "get_run shows the last claim's token"
    );
}
