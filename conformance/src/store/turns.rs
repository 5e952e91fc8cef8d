//! Guarantee 10, sessions and turns: an ended session starts no run from any handle, and the
//! end lists every run it must cancel; queued user messages are persisted and taken exactly
//! once, in order.

use crate::fixtures::*;
use crate::{assert_err, StoreFactory};
use eve_core::store::MAX_PAYLOAD_BYTES;
use eve_core::{Event, Execution, JournalStore, RunId, RunStatus, SessionId, StoreError};
use std::collections::BTreeSet;
use std::sync::Arc;

/// A second handle on the same storage where the factory can open one (the store itself
/// otherwise): what one handle ends or queues, the other must see.
async fn other_handle(factory: &dyn StoreFactory, s: &crate::Opened) -> Arc<dyn JournalStore> {
    match factory.open(&s.location).await {
        Ok(Some(h)) => h,
        Ok(None) => Arc::clone(&s.store),
        Err(e) => panic!("StoreFactory::open({:?}) failed: {e}", s.location),
    }
}

/// An ended session refuses new runs through every handle (plain and eager starts) and new
/// messages; a retried start of a run created before the end returns that run; the end keeps
/// its first time and lists, oldest first, exactly the session's runs that had not ended.
pub async fn ended_session_refuses_new_runs(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let other = other_handle(factory, &s).await;
    let session = SessionId::new(unique("session"));
    let in_session = |tag: &str, execution: Execution| {
        let mut n = new_run(tag);
        n.session_id = session.clone();
        n.execution = execution;
        n
    };
    let parked = in_session("parked", Execution::Default);
    let (parked_run, _) = started(st, parked.clone(), at(0)).await;
    let (done_run, lease) = started(st, in_session("done", Execution::Default), at(1)).await;
    must_append(
        st,
        append(&done_run.run_id, 1, &lease, vec![completed("1")], at(2)),
    )
    .await;
    let task = st
        .create_run(in_session("task", Execution::Background), at(3))
        .await
        .expect("create_run")
        .run;
    let elsewhere = st
        .create_run(new_run("elsewhere"), at(4))
        .await
        .expect("create_run");

    let end = st.end_session(&session, at(10)).await.expect("end_session");
    assert_eq!(end.ended_at, at(10));
    assert_eq!(
        end.live,
        vec![parked_run.run_id.clone(), task.run_id.clone()],
        "the end lists the session's runs that had not ended, oldest first (not the completed \
         one, not another session's)"
    );
    let again = other
        .end_session(&session, at(20))
        .await
        .expect("end_session again");
    assert_eq!(
        again.ended_at,
        at(10),
        "a repeated end keeps the first time"
    );
    assert_eq!(again.live, end.live);

    for (name, h) in [("the ending handle", st), ("another handle", &*other)] {
        assert_err!(
            h.create_run(in_session("late", Execution::Default), at(30))
                .await,
            StoreError::SessionEnded { .. },
            "create_run in an ended session through {name}"
        );
        let w = worker(h, at(30)).await;
        assert_err!(
            h.create_run_claimed(in_session("late-eager", Execution::Default), &w, at(30))
                .await,
            StoreError::SessionEnded { .. },
            "an eager start in an ended session through {name}"
        );
        assert_err!(
            h.queue_message(&session, json("\"too late\""), at(30))
                .await,
            StoreError::SessionEnded { .. },
            "queue_message in an ended session through {name}"
        );
        let retry = h
            .create_run(parked.clone(), at(30))
            .await
            .expect("a retried start of a run created before the end");
        assert!(!retry.created, "{name}: the retry creates nothing");
        assert_eq!(retry.run.run_id, parked_run.run_id);
        let rec = h.get_session(&session).await.expect("get_session");
        assert_eq!(rec.ended_at, Some(at(10)), "{name} sees the end");
    }
    let runs = st
        .list_runs(&eve_core::RunQuery {
            session: Some(session.clone()),
            ..Default::default()
        })
        .await
        .expect("list_runs");
    assert_eq!(
        runs.len(),
        3,
        "no refused start left a run behind: {runs:?}"
    );
    other
        .create_run(
            {
                let mut n = new_run("other-session");
                n.session_id = elsewhere.run.session_id.clone();
                n
            },
            at(40),
        )
        .await
        .expect("another session still starts runs");
    let fresh_session = st
        .get_session(&SessionId::new(unique("never-seen")))
        .await
        .expect("get_session of an unknown session");
    assert_eq!(fresh_session.ended_at, None);
    assert!(fresh_session.queued.is_empty());
    assert_err!(
        st.end_session(&SessionId::new(""), at(50)).await,
        StoreError::InvalidInput(_),
        "end_session with an empty id"
    );
}

/// Starts racing an end: every start either is refused `SessionEnded` or created a run the
/// end lists as live (the end's list is consistent, so cancelling it leaves no live run behind).
pub async fn end_racing_starts_lists_every_run(factory: &dyn StoreFactory) {
    const N: usize = 12;
    let s = fresh(factory).await;
    let other = other_handle(factory, &s).await;
    let session = SessionId::new(unique("session"));
    let mut tasks = Vec::new();
    for i in 0..N {
        let store = if i % 2 == 0 {
            Arc::clone(&s.store)
        } else {
            Arc::clone(&other)
        };
        let mut n = new_run(&format!("race{i}"));
        n.session_id = session.clone();
        tasks.push(tokio::spawn(async move {
            retrying(|| store.create_run(n.clone(), at(i as i64))).await
        }));
        if i == N / 2 {
            let store = Arc::clone(&s.store);
            let session = session.clone();
            tasks.push(tokio::spawn(async move {
                let end = retrying(|| store.end_session(&session, at(100)))
                    .await
                    .expect("end_session");
                Err(StoreError::InvalidInput(
                    serde_json::to_string(&end.live).expect("ids"),
                ))
            }));
        }
    }
    let mut created = BTreeSet::new();
    let mut live = None;
    for t in tasks {
        match t.await.expect("task panicked") {
            Ok(c) => {
                created.insert(c.run.run_id);
            }
            Err(StoreError::SessionEnded { .. }) => {}
            Err(StoreError::InvalidInput(ids)) => {
                let ids: Vec<RunId> = serde_json::from_str(&ids).expect("ids");
                live = Some(ids.into_iter().collect::<BTreeSet<_>>());
            }
            Err(e) => panic!("a start racing an end failed otherwise: {e}"),
        }
    }
    let live = live.expect("the end ran");
    assert_eq!(
        live, created,
        "every run that started is listed live by the end, and nothing else"
    );
    let after = s
        .store
        .end_session(&session, at(200))
        .await
        .expect("end_session");
    assert_eq!(after.live.into_iter().collect::<BTreeSet<_>>(), created);
}

/// Queued messages get seqs 0, 1, 2, … (never reused), read back byte for byte through any
/// handle, and are taken once, oldest first.
pub async fn queued_messages_taken_once_in_order(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let other = other_handle(factory, &s).await;
    let session = SessionId::new(unique("session"));
    assert!(
        st.take_messages(&session).await.expect("take").is_empty(),
        "an unknown session has nothing queued"
    );
    let bodies = ["{\"text\":  \"first\"}", "\"second\"", "[3, {\"x\": null}]"];
    for (i, b) in bodies.iter().enumerate() {
        let q = st
            .queue_message(&session, json(b), at(i as i64))
            .await
            .expect("queue_message");
        assert_eq!((q.seq, q.at), (i as u64, at(i as i64)));
        assert_eq!(q.session_id, session);
    }
    let rec = other.get_session(&session).await.expect("get_session");
    assert_eq!(rec.ended_at, None);
    let seen: Vec<(u64, &str)> = rec
        .queued
        .iter()
        .map(|m| (m.seq, m.message.get()))
        .collect();
    assert_eq!(
        seen,
        vec![(0, bodies[0]), (1, bodies[1]), (2, bodies[2])],
        "another handle reads the queue in order, payloads byte for byte"
    );
    let taken = other.take_messages(&session).await.expect("take");
    assert_eq!(taken, rec.queued, "take hands over the whole queue");
    assert!(
        st.take_messages(&session).await.expect("take").is_empty(),
        "a message is taken once"
    );
    assert!(st
        .get_session(&session)
        .await
        .expect("get_session")
        .queued
        .is_empty());
    let next = st
        .queue_message(&session, json("4"), at(10))
        .await
        .expect("queue_message");
    assert_eq!(next.seq, 3, "message seqs are never reused");
    assert_eq!(st.take_messages(&session).await.expect("take"), vec![next]);
    let big = format!("\"{}\"", "x".repeat(MAX_PAYLOAD_BYTES));
    assert_err!(
        st.queue_message(&session, json(&big), at(11)).await,
        StoreError::LimitExceeded { .. },
        "a message over MAX_PAYLOAD_BYTES"
    );
    assert_err!(
        st.queue_message(&SessionId::new(""), json("1"), at(11))
            .await,
        StoreError::InvalidInput(_),
        "queue_message with an empty session id"
    );
}

/// Takers racing each other and a writer that keeps queuing: every message is taken by exactly
/// one taker, and each take returns its messages oldest first.
pub async fn concurrent_takes_split_messages(factory: &dyn StoreFactory) {
    const MESSAGES: u64 = 30;
    const TAKERS: usize = 3;
    let s = fresh(factory).await;
    let other = other_handle(factory, &s).await;
    let session = SessionId::new(unique("session"));
    let writer = {
        let store = Arc::clone(&s.store);
        let session = session.clone();
        tokio::spawn(async move {
            for i in 0..MESSAGES {
                retrying(|| store.queue_message(&session, json(&i.to_string()), at(i as i64)))
                    .await
                    .expect("queue_message");
                tokio::task::yield_now().await;
            }
        })
    };
    let mut takers = Vec::new();
    for t in 0..TAKERS {
        let store = if t % 2 == 0 {
            Arc::clone(&s.store)
        } else {
            Arc::clone(&other)
        };
        let session = session.clone();
        takers.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..40 {
                let batch = retrying(|| store.take_messages(&session))
                    .await
                    .expect("take_messages");
                let seqs: Vec<u64> = batch.iter().map(|m| m.seq).collect();
                assert!(
                    seqs.windows(2).all(|w| w[0] < w[1]),
                    "a take returns its messages oldest first: {seqs:?}"
                );
                for m in &batch {
                    assert_eq!(
                        m.message.get(),
                        m.seq.to_string(),
                        "message {} intact",
                        m.seq
                    );
                }
                got.extend(seqs);
                tokio::task::yield_now().await;
            }
            got
        }));
    }
    writer.await.expect("writer panicked");
    let mut all = Vec::new();
    for t in takers {
        all.extend(t.await.expect("taker panicked"));
    }
    all.extend(
        s.store
            .take_messages(&session)
            .await
            .expect("take the rest")
            .iter()
            .map(|m| m.seq),
    );
    all.sort_unstable();
    assert_eq!(
        all,
        (0..MESSAGES).collect::<Vec<_>>(),
        "every message taken exactly once"
    );
}

/// The end lists as live every run of the session that has not ended, whatever its status: a
/// running run, one parked on a request, and a blocked one (parked by the engine until an
/// operator resumes or fails it; it must be cancelled like any other), oldest first; not a
/// completed one.
pub async fn end_lists_blocked_runs_live(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let session = SessionId::new(unique("session"));
    let in_session = |tag: &str| {
        let mut n = new_run(tag);
        n.session_id = session.clone();
        n
    };
    let (blocked, lb) = started(st, in_session("blocked"), at(0)).await;
    must_append(
        st,
        append(
            &blocked.run_id,
            1,
            &lb,
            vec![Event::RunBlocked {
                reason: "[EVE0001] non-determinism at cmd 1".into(),
            }],
            at(1),
        ),
    )
    .await;
    assert_eq!(record(st, &blocked.run_id).await.status, RunStatus::Blocked);
    let (asking, la) = started(st, in_session("asking"), at(2)).await;
    let (_, question) = ask(&asking.run_id, 1);
    must_append(st, append(&asking.run_id, 1, &la, vec![question], at(3))).await;
    let (done, ld) = started(st, in_session("done"), at(4)).await;
    must_append(
        st,
        append(&done.run_id, 1, &ld, vec![completed("1")], at(5)),
    )
    .await;
    let running = st
        .create_run(in_session("running"), at(6))
        .await
        .expect("create_run")
        .run;

    let end = st.end_session(&session, at(10)).await.expect("end_session");
    assert_eq!(
        end.live,
        vec![
            blocked.run_id.clone(),
            asking.run_id.clone(),
            running.run_id.clone()
        ],
        "the end lists the blocked run, the parked one and the running one, oldest first"
    );
    let again = st.end_session(&session, at(20)).await.expect("end_session");
    assert_eq!(again.live, end.live, "a repeated end lists the same runs");
}

/// Many queued messages, several rounds of takers started together on two handles: every
/// message is handed out exactly once (a take that reads the queue and then deletes it in
/// another statement hands the same messages to two takers), and each take returns its
/// messages oldest first.
pub async fn overlapping_takes_hand_each_message_once(factory: &dyn StoreFactory) {
    const ROUNDS: u64 = 6;
    const PER_ROUND: u64 = 40;
    const TAKERS: usize = 4;
    let s = fresh(factory).await;
    let other = other_handle(factory, &s).await;
    let session = SessionId::new(unique("session"));
    let mut handed = Vec::new();
    for round in 0..ROUNDS {
        for i in 0..PER_ROUND {
            let n = round * PER_ROUND + i;
            retrying(|| {
                s.store
                    .queue_message(&session, json(&n.to_string()), at(n as i64))
            })
            .await
            .expect("queue_message");
        }
        let start = Arc::new(tokio::sync::Barrier::new(TAKERS));
        let mut takers = Vec::new();
        for t in 0..TAKERS {
            let store = if t % 2 == 0 {
                Arc::clone(&s.store)
            } else {
                Arc::clone(&other)
            };
            let (session, start) = (session.clone(), Arc::clone(&start));
            takers.push(tokio::spawn(async move {
                start.wait().await;
                retrying(|| store.take_messages(&session))
                    .await
                    .expect("take_messages")
            }));
        }
        for t in takers {
            let batch = t.await.expect("taker panicked");
            let seqs: Vec<u64> = batch.iter().map(|m| m.seq).collect();
            assert!(
                seqs.windows(2).all(|w| w[0] < w[1]),
                "round {round}: a take returns its messages oldest first: {seqs:?}"
            );
            for m in &batch {
                assert_eq!(
                    m.message.get(),
                    m.seq.to_string(),
                    "message {} intact",
                    m.seq
                );
            }
            handed.extend(seqs);
        }
        handed.extend(
            s.store
                .take_messages(&session)
                .await
                .expect("take the rest")
                .iter()
                .map(|m| m.seq),
        );
        let mut sorted = handed.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..(round + 1) * PER_ROUND).collect::<Vec<_>>(),
            "after round {round}, every message was handed out exactly once"
        );
    }
}
