//! Guarantee 9: retention. `purge` deletes runs that ended before a cutoff with everything kept
//! for them, never touches a live run or a run that ended later, and is idempotent.

use crate::fixtures::*;
use crate::{assert_err, StoreFactory};
use eve_core::{
    Event, InputResponse, JournalStore, Lease, NewRun, PendingRequest, RunId, RunQuery, RunRecord,
    SessionEntry, SessionId, StoreError, StoredEvent, Timestamp,
};

/// Everything a store shows of one run, to compare before and after a purge.
#[derive(Debug, PartialEq)]
struct Snapshot {
    record: RunRecord,
    journal: Vec<StoredEvent>,
    session: Vec<SessionEntry>,
    pending: Vec<PendingRequest>,
}

async fn snapshot(store: &dyn JournalStore, run: &RunId) -> Snapshot {
    let record = record(store, run).await;
    let session = session_log(store, &record.session_id).await;
    let pending = store
        .pending_requests(&record.session_id)
        .await
        .expect("pending_requests");
    Snapshot {
        journal: journal(store, run).await,
        session: session.into_iter().filter(|e| &e.run_id == run).collect(),
        pending: pending.into_iter().filter(|p| &p.run_id == run).collect(),
        record,
    }
}

async fn session_log(store: &dyn JournalStore, session: &SessionId) -> Vec<SessionEntry> {
    store
        .read_session(session, 0, 10_000)
        .await
        .expect("read_session")
}

async fn purge(store: &dyn JournalStore, cutoff: Timestamp, limit: usize) -> usize {
    store
        .purge(cutoff, limit)
        .await
        .unwrap_or_else(|e| panic!("purge({cutoff}, {limit}) failed: {e}"))
}

/// Ends `run` (held by `lease`, next seq `seq`) at `now` with `event`.
async fn end(store: &dyn JournalStore, run: &RunId, lease: &Lease, event: Event, now: Timestamp) {
    let seq = record(store, run).await.next_seq;
    must_append(store, append(run, seq, lease, vec![event], now)).await;
}

fn in_session(tag: &str, session: &SessionId) -> NewRun {
    let mut n = new_run(tag);
    n.session_id = session.clone();
    n
}

/// Runs that ended (completed, failed, cancelled) before the cutoff disappear whole: `get_run`
/// and `read` are `NotFound`, the session log, the task index and the pending requests no longer
/// list them, their requests are unknown, their hook token and idempotency key are free. Runs
/// that ended at or after the cutoff, and every live run (running with a pending request,
/// blocked), stay exactly as they were; the session log never reuses a purged entry's seq.
pub async fn purge_removes_only_runs_ended_before_cutoff(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let session = SessionId::new(unique("retention-session"));
    let token = unique("retention-token");

    // A live run that asked first, in the shared session.
    let (live, llive) = started(st, in_session("live", &session), at(0)).await;
    let (live_req, live_ask) = ask(&live.run_id, 1);
    must_append(st, append(&live.run_id, 1, &llive, vec![live_ask], at(1))).await;

    // Ended after the cutoff, in the same session (written before the purged run's entries, so
    // those are the log's tail).
    let (later, llater) = started(st, in_session("later", &session), at(0)).await;
    end(st, &later.run_id, &llater, completed("2"), at(100)).await;

    // Completed before the cutoff, in the same session: a hook with a deduped delivery, an
    // answered ask, progress, then the end.
    let new_done = in_session("done", &session);
    let done_key = new_done.key();
    let (done, ldone) = started(st, new_done.clone(), at(0)).await;
    let (done_req, done_ask) = ask(&done.run_id, 2);
    must_append(
        st,
        append(
            &done.run_id,
            1,
            &ldone,
            vec![hook(1, &token), done_ask],
            at(2),
        ),
    )
    .await;
    st.deliver_hook(&token, json("{\"n\": 1}"), Some("dedupe-1"), at(3))
        .await
        .expect("deliver_hook");
    let yes = InputResponse::option("yes");
    st.answer(&done_req, yes.clone(), at(4))
        .await
        .expect("answer");
    end(
        st,
        &done.run_id,
        &ldone,
        completed("{\"ok\": true}"),
        at(10),
    )
    .await;

    // Failed and cancelled before the cutoff.
    let (failed, lfailed) = started(st, new_run("failed"), at(0)).await;
    end(
        st,
        &failed.run_id,
        &lfailed,
        Event::RunFailed {
            error: "boom".into(),
        },
        at(11),
    )
    .await;
    let (cancelled, lcancelled) = started(st, new_run("cancelled"), at(0)).await;
    st.request_cancel(&cancelled.run_id, "stop", at(12))
        .await
        .expect("request_cancel");
    end(
        st,
        &cancelled.run_id,
        &lcancelled,
        Event::RunCancelled,
        at(12),
    )
    .await;

    // Ended exactly at and after the cutoff: kept.
    let cutoff = at(50);
    let (at_cutoff, lat) = started(st, new_run("at-cutoff"), at(0)).await;
    end(st, &at_cutoff.run_id, &lat, completed("1"), cutoff).await;

    // Live runs, idle since long before the cutoff: a blocked one and a fresh one.
    let (blocked, lblocked) = started(st, new_run("blocked"), at(0)).await;
    end(
        st,
        &blocked.run_id,
        &lblocked,
        Event::RunBlocked {
            reason: "parked".into(),
        },
        at(5),
    )
    .await;
    let idle = st
        .create_run(new_run("idle"), at(0))
        .await
        .expect("create_run")
        .run;

    let kept = [
        &live.run_id,
        &at_cutoff.run_id,
        &later.run_id,
        &blocked.run_id,
        &idle.run_id,
    ];
    let mut before = Vec::new();
    for id in kept {
        before.push(snapshot(st, id).await);
    }
    let log_before = session_log(st, &session).await;
    let max_seq = log_before.last().expect("the shared session has a log").seq;
    assert!(
        log_before.iter().any(|e| e.run_id == done.run_id),
        "the completed run wrote to the shared session"
    );

    let purged = purge(st, cutoff, 0).await;
    assert_eq!(
        purged, 3,
        "the completed, failed and cancelled runs that ended before the cutoff are purged"
    );

    for id in [&done.run_id, &failed.run_id, &cancelled.run_id] {
        assert_err!(
            st.get_run(id).await,
            StoreError::NotFound { .. },
            "get_run of purged run {id}"
        );
        match st.read(id, 0, 100).await {
            Err(StoreError::NotFound { .. }) => {}
            Ok(events) if events.is_empty() => {}
            other => panic!("read of purged run {id}: expected NotFound or nothing, got {other:?}"),
        }
    }
    let log_after = session_log(st, &session).await;
    assert!(
        log_after.iter().all(|e| e.run_id != done.run_id),
        "the session log no longer lists the purged run: {log_after:?}"
    );
    let expected_log: Vec<SessionEntry> = log_before
        .iter()
        .filter(|e| e.run_id != done.run_id)
        .cloned()
        .collect();
    assert_eq!(
        log_after, expected_log,
        "the other runs' session entries are kept with their seqs"
    );
    let indexed: Vec<RunId> = st
        .list_runs(&RunQuery::default())
        .await
        .expect("list_runs")
        .into_iter()
        .map(|r| r.run_id)
        .collect();
    for id in [&done.run_id, &failed.run_id, &cancelled.run_id] {
        assert!(!indexed.contains(id), "list_runs still lists purged {id}");
    }
    for id in kept {
        assert!(indexed.contains(id), "list_runs lost kept run {id}");
    }
    assert_err!(
        st.answer(&done_req, yes, at(60)).await,
        StoreError::NotFound { .. },
        "answering a purged run's request"
    );
    let mut after = Vec::new();
    for id in kept {
        after.push(snapshot(st, id).await);
    }
    assert_eq!(
        after, before,
        "runs that ended at or after the cutoff and live runs are kept byte for byte"
    );
    assert_eq!(
        after[0].pending.len(),
        1,
        "the live run's request is still pending"
    );

    // The purged run's hook token is free: the live run registers it and receives a payload,
    // with the dedupe key the purged run had used.
    must_append(
        st,
        append(&live.run_id, 2, &llive, vec![hook(2, &token)], at(61)),
    )
    .await;
    let d = st
        .deliver_hook(&token, json("2"), Some("dedupe-1"), at(62))
        .await
        .expect("deliver to the reused token");
    assert_eq!(
        (d.run, d.seq, d.duplicate),
        (live.run_id.clone(), 3, false),
        "the reused token reaches the live run"
    );
    // The live run's answer lands and its session entry gets a seq never used before.
    st.answer(&live_req, InputResponse::option("no"), at(63))
        .await
        .expect("answer the live run");
    let newest = session_log(st, &session).await;
    let last = newest.last().expect("log");
    assert!(
        last.run_id == live.run_id && last.seq > max_seq,
        "a new session entry gets a fresh seq (> {max_seq}), never a purged one's: {last:?}"
    );
    // The idempotency key is free: the same start makes a new run.
    let mut again = new_done;
    again.run_id = RunId::new(unique("run-again"));
    assert_eq!(again.key(), done_key);
    let created = st
        .create_run(again.clone(), at(64))
        .await
        .expect("create_run with a purged run's key");
    assert!(
        created.created && created.run.run_id == again.run_id,
        "a purged run's idempotency key starts a new run"
    );
}

/// `limit` bounds each call; repeated calls purge the rest, then nothing: purge is idempotent.
pub async fn purge_is_bounded_and_idempotent(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let mut ended = Vec::new();
    for i in 0..3 {
        let (run, lease) = started(st, new_run(&format!("ended{i}")), at(0)).await;
        end(st, &run.run_id, &lease, completed("null"), at(10 + i)).await;
        ended.push(run.run_id);
    }
    let (live, _) = started(st, new_run("live"), at(0)).await;
    let cutoff = at(100);
    assert_eq!(purge(st, at(10), 0).await, 0, "nothing ended before at(10)");
    assert_eq!(purge(st, cutoff, 2).await, 2, "limit 2 purges two runs");
    assert_eq!(
        purge(st, cutoff, 2).await,
        1,
        "the next call purges the rest"
    );
    assert_eq!(purge(st, cutoff, 2).await, 0, "then nothing is left");
    assert_eq!(purge(st, cutoff, 0).await, 0, "purge is idempotent");
    for id in &ended {
        assert_err!(
            st.get_run(id).await,
            StoreError::NotFound { .. },
            "get_run of purged run {id}"
        );
    }
    assert_eq!(
        record(st, &live.run_id).await.status,
        eve_core::RunStatus::Running,
        "the live run is kept"
    );
}

/// Purges racing each other (two at once, on one handle and on two when the store can be
/// opened twice) delete each ended run once: their counts add up to the number of ended runs.
/// On a persistent store, a purge survives reopening: the purged run stays gone, and the
/// session log still never reuses its seqs.
pub async fn concurrent_purges_count_each_run_once(factory: &dyn StoreFactory) {
    const N: usize = 6;
    let s = fresh(factory).await;
    let st = &*s.store;
    let session = SessionId::new(unique("retention-session"));
    let (live, llive) = started(st, in_session("live", &session), at(0)).await;
    let (live_req, live_ask) = ask(&live.run_id, 1);
    must_append(st, append(&live.run_id, 1, &llive, vec![live_ask], at(1))).await;
    let mut ended = Vec::new();
    for i in 0..N {
        let (run, lease) = started(st, in_session(&format!("ended{i}"), &session), at(0)).await;
        let (_, a) = ask(&run.run_id, 1);
        must_append(st, append(&run.run_id, 1, &lease, vec![a], at(2))).await;
        end(st, &run.run_id, &lease, completed("{}"), at(10)).await;
        ended.push(run.run_id);
    }
    let max_seq = session_log(st, &session)
        .await
        .last()
        .expect("the session has a log")
        .seq;
    let second: std::sync::Arc<dyn JournalStore> = match factory.open(&s.location).await {
        Ok(Some(h)) => h,
        Ok(None) => s.store.clone(),
        Err(e) => panic!("StoreFactory::open({:?}) failed: {e}", s.location),
    };
    let (a, b) = tokio::join!(
        retrying(|| s.store.purge(at(50), 0)),
        retrying(|| second.purge(at(50), 0))
    );
    let (a, b) = (a.expect("first purge"), b.expect("second purge"));
    assert_eq!(
        a + b,
        N,
        "racing purges count each ended run once ({a} + {b})"
    );
    for h in [&s.store, &second] {
        for id in &ended {
            assert_err!(
                h.get_run(id).await,
                StoreError::NotFound { .. },
                "get_run of purged run {id}"
            );
        }
        assert_eq!(purge(&**h, at(50), 0).await, 0, "nothing is left to purge");
    }
    let log = session_log(&*second, &session).await;
    assert!(
        log.iter().all(|e| e.run_id == live.run_id),
        "only the live run's entries are left: {log:?}"
    );
    // After reopening (when the store persists), the counter still moves past purged seqs.
    if let Ok(Some(third)) = factory.open(&s.location).await {
        third
            .answer(&live_req, InputResponse::option("yes"), at(60))
            .await
            .expect("answer the live run");
        let last = session_log(&*third, &session).await;
        let last = last.last().expect("log");
        assert!(
            last.run_id == live.run_id && last.seq > max_seq,
            "after reopening, a new session entry gets a fresh seq (> {max_seq}): {last:?}"
        );
        assert_err!(
            third.get_run(&ended[0]).await,
            StoreError::NotFound { .. },
            "a purged run after reopening"
        );
    }
}

/// Contract clause 2 with clause 9: a keyed hook delivery stays answerable after its run ended,
/// until the run is purged. A retry with the recorded key gets the recorded run and seq as a
/// duplicate and writes nothing; another key, or no key, is `NotFound` (the token is released);
/// after the purge the key is gone too.
pub async fn keyed_delivery_retained_until_purge(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let token = unique("token");
    let (run, lease) = started(st, new_run("retained"), at(0)).await;
    let id = &run.run_id;
    must_append(st, append(id, 1, &lease, vec![hook(1, &token)], at(1))).await;
    let first = st
        .deliver_hook(&token, json("{\"n\": 1}"), Some("key-1"), at(2))
        .await
        .expect("first delivery");
    assert!(!first.duplicate, "the first delivery is new: {first:?}");
    end(st, id, &lease, completed("1"), at(3)).await;
    let ended = journal(st, id).await;

    let retry = st
        .deliver_hook(&token, json("{\"n\": 1}"), Some("key-1"), at(4))
        .await
        .expect("a retry after the run ended is answered");
    assert_eq!(
        (&retry.run, retry.seq, retry.duplicate),
        (id, first.seq, true),
        "the retry gets the recorded run and seq as a duplicate"
    );
    assert_eq!(journal(st, id).await, ended, "the retry wrote nothing");
    assert_err!(
        st.deliver_hook(&token, json("2"), Some("key-2"), at(4))
            .await,
        StoreError::NotFound { .. },
        "another key after the run ended"
    );
    assert_err!(
        st.deliver_hook(&token, json("2"), None, at(4)).await,
        StoreError::NotFound { .. },
        "no key after the run ended"
    );

    assert_eq!(purge(st, at(10), 0).await, 1, "the run is purged");
    assert_err!(
        st.deliver_hook(&token, json("{\"n\": 1}"), Some("key-1"), at(11))
            .await,
        StoreError::NotFound { .. },
        "the recorded key is gone with its run"
    );
}

/// Sessions outlive `purge` (contract clause 10): purging every run of an ended session keeps
/// the session's end (its time, and the refusal of new runs and messages) and the messages
/// still queued in it; purging every run of a live session keeps its queue, still taken once
/// and in order, and its message seqs never reused.
pub async fn sessions_outlive_purge(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let ended = SessionId::new(unique("purge-ended-session"));
    let live = SessionId::new(unique("purge-live-session"));
    let mut runs = Vec::new();
    for (i, session) in [&ended, &live].into_iter().enumerate() {
        let (run, lease) = started(st, in_session("purged", session), at(0)).await;
        for m in 0..3 {
            st.queue_message(session, json(&format!("{{\"m\": {m}}}")), at(1 + m))
                .await
                .expect("queue_message");
        }
        end(st, &run.run_id, &lease, completed(&i.to_string()), at(5)).await;
        runs.push(run.run_id);
    }
    st.end_session(&ended, at(6)).await.expect("end_session");
    let before = [
        st.get_session(&ended).await.expect("get_session"),
        st.get_session(&live).await.expect("get_session"),
    ];
    assert_eq!(before[0].ended_at, Some(at(6)));
    assert_eq!(before[0].queued.len(), 3);
    assert_eq!(before[1].queued.len(), 3);

    assert_eq!(
        purge(st, at(50), 0).await,
        2,
        "both runs ended before the cutoff"
    );
    for run in &runs {
        assert_err!(
            st.get_run(run).await,
            StoreError::NotFound { .. },
            "get_run of purged run {run}"
        );
    }
    for (session, want) in [&ended, &live].into_iter().zip(&before) {
        let after = st.get_session(session).await.expect("get_session");
        assert_eq!(
            &after, want,
            "purging every run of session {session} keeps its end and its queued messages"
        );
    }
    assert_err!(
        st.create_run(in_session("after-purge", &ended), at(60))
            .await,
        StoreError::SessionEnded { .. },
        "a new run in an ended session whose runs were purged"
    );
    assert_err!(
        st.queue_message(&ended, json("\"late\""), at(60)).await,
        StoreError::SessionEnded { .. },
        "a message to an ended session whose runs were purged"
    );
    let again = st.end_session(&ended, at(70)).await.expect("end_session");
    assert_eq!(
        (again.ended_at, again.live),
        (at(6), Vec::new()),
        "ending it again keeps the first end's time"
    );
    let taken = st.take_messages(&live).await.expect("take_messages");
    assert_eq!(
        taken, before[1].queued,
        "the live session's queue is taken whole"
    );
    let next = st
        .queue_message(&live, json("3"), at(80))
        .await
        .expect("queue_message");
    assert_eq!(next.seq, 3, "message seqs are not reused after a purge");
}
