//! Operator resets and retries ([`JournalStoreExt::reset`], [`JournalStoreExt::retry`]): a new
//! run whose journal is a rewritten prefix of an ended run's, written without a new store
//! method, so they hold on every backend that keeps the contract.

use crate::fixtures::*;
use crate::{assert_err, StoreFactory};
use eve_core::{
    DeploymentId, Event, InputResponse, JournalStore, JournalStoreExt, NewRun, RequestId,
    ResetFrom, RunId, RunQuery, RunStatus, StoreError, WorkerId,
};

fn events(j: &[eve_core::StoredEvent]) -> Vec<Event> {
    j.iter().map(|e| e.event.clone()).collect()
}

/// A reset of an ended run to seq `to` starts a new run (fresh id, call id `{call}~reset-{to}`,
/// the deployment passed, `reset_from` naming the old run and the cut) whose journal is
/// `RunStarted` then exactly the old events with `0 < seq < to`, request ids rewritten to the
/// new run's; a request answered in the copy is closed, one still open is pending under the
/// new id, a copied hook takes deliveries for the new run. The old run is untouched. The same
/// reset again returns the same run and writes nothing; a retry of a run that failed outside a
/// step cuts where the end begins, so it is that same reset. A live run is refused with
/// `RunNotEnded`; a cut outside `1..=limit` (the end, a cancel or a withdrawal begins at the
/// limit) with `InvalidInput`; an unknown run with `NotFound`. A reset whose copy cannot be
/// written (its hook token is live in the first reset's run) ends its new run failed and
/// returns the error. The new run is claimed by no worker until the reset returns, then at
/// once by a worker of its deployment.
pub async fn reset_copies_prefix_idempotently(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let (run, lease) = started(st, new_run("reset"), at(0)).await;
    let id = &run.run_id;
    let dep = DeploymentId::new(DEPLOYMENT);
    let token = unique("reset-token");
    let (r3, a3) = ask(id, 3);
    let (r4, a4) = ask(id, 4);
    must_append(
        st,
        append(
            id,
            1,
            &lease,
            vec![step(1, "1"), hook(2, &token), a3, a4],
            at(1),
        ),
    )
    .await;
    st.answer(&r3, InputResponse::option("yes"), at(2))
        .await
        .expect("answer"); // seq 5
    st.deliver_hook(&token, json(r#"{"p": 1}"#), None, at(2))
        .await
        .expect("deliver"); // seq 6
    must_append(st, append(id, 7, &lease, vec![step(5, "5")], at(3))).await;
    assert_err!(
        st.reset(id, 7, &dep, at(4)).await,
        StoreError::RunNotEnded { .. },
        "a reset of a running run"
    );
    assert_err!(
        st.retry(id, &dep, at(4)).await,
        StoreError::RunNotEnded { .. },
        "a retry of a running run"
    );
    must_append(
        st,
        append(
            id,
            8,
            &lease,
            vec![
                Event::InputWithdrawn {
                    request_id: r4.clone(),
                },
                Event::RunFailed {
                    error: "boom".into(),
                },
            ],
            at(4),
        ),
    )
    .await;
    let old_journal = journal(st, id).await;
    assert_eq!(old_journal.len(), 10);
    for bad in [0, 9, 10, 99] {
        assert_err!(
            st.reset(id, bad, &dep, at(5)).await,
            StoreError::InvalidInput(_),
            "a reset to a cut outside 1..=8"
        );
    }
    assert_err!(
        st.reset(&RunId::new(unique("nope")), 1, &dep, at(5)).await,
        StoreError::NotFound { .. },
        "a reset of an unknown run"
    );

    let w2 = worker(st, at(5)).await;
    let out = st.reset(id, 8, &dep, at(5)).await.expect("reset");
    assert!(out.created);
    assert_eq!(out.copied, 7);
    assert_eq!(
        out.from,
        ResetFrom {
            run: id.clone(),
            seq: 8
        }
    );
    let new = out.run.run_id.clone();
    assert_ne!(&new, id);
    assert_eq!(out.run.status, RunStatus::Running);
    assert_eq!(out.run.next_seq, 8);
    assert_eq!(out.run.call_id.as_str(), format!("{}~reset-8", run.call_id));
    assert_eq!(out.run.session_id, run.session_id);
    let nj = journal(st, &new).await;
    match &nj[0].event {
        Event::RunStarted {
            reset_from,
            deployment_id,
            input,
            workflow_id,
            ..
        } => {
            assert_eq!(reset_from.as_ref(), Some(&out.from));
            assert_eq!(deployment_id, &dep);
            assert_eq!(input.get(), r#"{"tag": "input"}"#);
            assert_eq!(workflow_id, &run.workflow_id);
        }
        other => panic!("the new run starts with {other:?}"),
    }
    let n3 = RequestId::for_command(&new, 3);
    let n4 = RequestId::for_command(&new, 4);
    let (_, na3) = ask(&new, 3);
    let (_, na4) = ask(&new, 4);
    let copied: Vec<Event> = events(&nj[1..]);
    let Event::InputAnswered { response, .. } = &old_journal[5].event else {
        panic!("seq 5 is the answer: {:?}", old_journal[5].event)
    };
    assert_eq!(
        copied,
        vec![
            step(1, "1"),
            hook(2, &token),
            na3,
            na4,
            Event::InputAnswered {
                request_id: n3.clone(),
                response: response.clone(),
            },
            old_journal[6].event.clone(),
            step(5, "5"),
        ],
        "the prefix, request ids rewritten"
    );
    assert_eq!(
        journal(st, id).await,
        old_journal,
        "the old journal is kept"
    );
    let pending: Vec<RequestId> = st
        .pending_requests(&run.session_id)
        .await
        .expect("pending")
        .into_iter()
        .map(|p| p.request_id)
        .collect();
    assert_eq!(pending, vec![n4.clone()], "only the copy's open request");
    // The worker of the deployment claims it at once; the copied hook takes deliveries.
    claim_run(st, &w2, &new, at(6)).await;
    let d = st
        .deliver_hook(&token, json("2"), None, at(6))
        .await
        .expect("the copied hook is live");
    assert_eq!((d.run, d.seq), (new.clone(), 8));

    // The same reset again, and a retry (no step failed: the cut is where the end begins).
    let again = st.reset(id, 8, &dep, at(7)).await.expect("reset again");
    assert!(!again.created);
    assert_eq!(again.run.run_id, new);
    let retried = st.retry(id, &dep, at(7)).await.expect("retry");
    assert_eq!((retried.run.run_id, retried.created), (new.clone(), false));
    assert_eq!(journal(st, &new).await.len(), 9, "nothing written");

    // A reset whose copy needs a hook token that is live again: its run ends failed.
    assert_err!(
        st.reset(id, 3, &dep, at(8)).await,
        StoreError::AlreadyExists { .. },
        "a reset copying a live hook token"
    );
    let failed: Vec<_> = st
        .list_runs(&RunQuery {
            session: Some(run.session_id.clone()),
            ..RunQuery::default()
        })
        .await
        .expect("list")
        .into_iter()
        .filter(|r| r.call_id.as_str().ends_with("~reset-3"))
        .collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].status, RunStatus::Failed);
    assert!(
        matches!(&st.last_event(&failed[0]).await.expect("read").expect("an end").event,
            Event::RunFailed { error } if error.contains("[reset_failed]")),
        "the failed reset names why"
    );
    // To 1: only RunStarted.
    let bare = st.reset(id, 1, &dep, at(9)).await.expect("reset to 1");
    assert_eq!((bare.copied, bare.run.next_seq), (0, 1));
}

/// A retry of a run that failed because a step's last attempt failed cuts at that step's first
/// attempt: the steps completed before it are copied, its failed attempts are not. A completed
/// run cannot be retried (`InvalidInput`) but can be reset.
pub async fn retry_cuts_at_the_failed_step(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let dep = DeploymentId::new(DEPLOYMENT);
    let (run, lease) = started(st, new_run("retry"), at(0)).await;
    let id = &run.run_id;
    let failed = |attempt: u32, retry_at: Option<eve_core::Timestamp>| Event::StepFailed {
        cmd: 2,
        name: "step2".into(),
        attempt,
        error: "down".into(),
        fatal: false,
        retry_at,
    };
    must_append(
        st,
        append(
            id,
            1,
            &lease,
            vec![
                step(1, "1"),
                failed(1, Some(at(2))),
                failed(2, None),
                Event::RunFailed {
                    error: "step2 failed".into(),
                },
            ],
            at(1),
        ),
    )
    .await;
    let out = st.retry(id, &dep, at(3)).await.expect("retry");
    assert_eq!((out.created, out.from.seq, out.copied), (true, 2, 1));
    assert_eq!(
        events(&journal(st, &out.run.run_id).await[1..]),
        vec![step(1, "1")]
    );

    let (done, lease) = started(st, new_run("retry-done"), at(0)).await;
    must_append(
        st,
        append(
            &done.run_id,
            1,
            &lease,
            vec![step(1, "1"), completed("1")],
            at(1),
        ),
    )
    .await;
    assert_err!(
        st.retry(&done.run_id, &dep, at(2)).await,
        StoreError::InvalidInput(_),
        "a retry of a completed run"
    );
    let out = st.reset(&done.run_id, 2, &dep, at(2)).await.expect("reset");
    assert_eq!(out.copied, 1);
}

/// What a reset relies on to keep workers off its new run until the copy is in: a run created
/// with [`JournalStore::create_run_claimed`] under a valid lease is held by it (no other worker
/// claims it, even though it has work), takes that lease's appends, and is claimable at once
/// when the holder retires.
pub async fn claimed_start_is_held_until_retired(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let dep = DeploymentId::new(DEPLOYMENT);
    let other = worker(st, at(0)).await;
    let op = st
        .register_worker(&WorkerId::new(unique("reset-op")), &dep, TTL, at(0))
        .await
        .expect("register");
    let new: NewRun = new_run("held");
    let id = new.run_id.clone();
    let created = st
        .create_run_claimed(new, &op, at(0))
        .await
        .expect("create_run_claimed");
    assert_eq!(
        created.run.owner,
        Some((op.worker.clone(), op.epoch)),
        "create_run_claimed claims under a valid lease"
    );
    assert!(
        !claims(st, &other, &id).await,
        "another worker does not claim the held run"
    );
    must_append(st, append(&id, 1, &op, vec![step(1, "1")], at(1))).await;
    assert!(!claims(st, &other, &id).await);
    st.retire_worker(&op, at(2)).await.expect("retire");
    claim_run(st, &other, &id, at(2)).await;
}

async fn claims(st: &dyn JournalStore, lease: &eve_core::Lease, run: &RunId) -> bool {
    st.claim(lease, 1000, at(1))
        .await
        .expect("claim")
        .iter()
        .any(|r| &r.run_id == run)
}
