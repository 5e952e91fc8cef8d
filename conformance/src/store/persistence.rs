//! Dedupe, idempotency, answers, leases and epochs survive reopening the store; two handles on
//! one storage behave as one store. Not applicable to non-persistent backends (see [`crate::Skip`]).

use crate::fixtures::*;
use crate::{assert_err, StoreFactory};
use eve_core::{InputResponse, JournalStore, RunId, RunQuery, StoreError};
use std::sync::Arc;

async fn reopen(factory: &dyn StoreFactory, location: &str) -> Arc<dyn JournalStore> {
    match factory.open(location).await {
        Ok(Some(h)) => h,
        Ok(None) => crate::skip(crate::Skip::NotApplicable(
            "the store is not persistent (StoreFactory::open gave None)".into(),
        )),
        Err(e) => panic!("StoreFactory::open({location:?}) failed: {e}"),
    }
}

/// Everything written through one handle is there, with the same dedupe and idempotency
/// answers, through a handle opened afterwards.
pub async fn everything_survives_reopen(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let mut new = new_run("persist");
    new.idempotency_key = Some(unique("key"));
    let (run, lease) = started(st, new.clone(), at(0)).await;
    let id = &run.run_id;
    let token = unique("token");
    let (req, ask_ev) = ask(id, 2);
    let landed = append(
        id,
        1,
        &lease,
        vec![hook(1, &token), ask_ev, sleep(3, at(60_000))],
        at(1),
    );
    must_append(st, landed.clone()).await;
    let hooked = st
        .deliver_hook(&token, json("{\"p\": 1}"), Some("dedupe-1"), at(2))
        .await
        .expect("deliver");
    let answered = st
        .answer(&req, InputResponse::option("yes"), at(3))
        .await
        .expect("answer");
    st.request_cancel(id, "persisted", at(4))
        .await
        .expect("cancel");
    let before = journal(st, id).await;
    let session_before = st
        .read_session(&run.session_id, 0, 1000)
        .await
        .expect("read_session");
    let h = reopen(factory, &s.location).await;
    let h = &*h;
    assert_eq!(
        journal(h, id).await,
        before,
        "the journal survives reopening"
    );
    assert_eq!(
        h.read_session(&run.session_id, 0, 1000)
            .await
            .expect("read_session"),
        session_before,
        "the session log survives"
    );
    let rec = record(h, id).await;
    assert_eq!(
        (rec.next_seq, rec.cancel_requested, rec.owner.clone()),
        (7, true, Some((lease.worker.clone(), lease.epoch)))
    );
    let mut again = new.clone();
    again.run_id = RunId::new(unique("run-again"));
    let c = h.create_run(again, at(5)).await.expect("create_run");
    assert_eq!(
        (c.created, c.run.run_id),
        (false, id.clone()),
        "the idempotency key survives"
    );
    let d = h
        .deliver_hook(&token, json("{\"p\": 2}"), Some("dedupe-1"), at(5))
        .await
        .expect("deliver");
    assert_eq!(
        (d.seq, d.duplicate),
        (hooked.seq, true),
        "the hook dedupe key survives"
    );
    let a = h
        .answer(&req, InputResponse::option("yes"), at(5))
        .await
        .expect("answer");
    assert_eq!(
        (a.seq, a.duplicate),
        (answered.seq, true),
        "the accepted answer survives"
    );
    assert_err!(
        h.answer(&req, InputResponse::option("no"), at(5)).await,
        StoreError::AlreadyAnswered { .. },
        "another answer after reopening"
    );
    let dup = h
        .append(landed)
        .await
        .expect("retry of a landed append after reopening");
    assert!(dup.duplicate, "append ids survive reopening");
    // The lease and its epoch survive: the holder may still write, a re-registration fences it.
    must_append(h, append(id, 7, &lease, vec![step(4, "1")], at(6))).await;
    let newer = h
        .register_worker(&lease.worker, &lease.deployment, TTL, at(7))
        .await
        .expect("re-register");
    assert!(
        newer.epoch > lease.epoch,
        "the epoch counter survives reopening"
    );
    assert_err!(
        h.append(append(id, 8, &lease, vec![step(5, "1")], at(8)))
            .await,
        StoreError::Fenced { .. },
        "the old epoch after reopening"
    );
    // The live token survives too: another run cannot take it.
    let (other, ol) = started(h, new_run("persist-other"), at(9)).await;
    assert_err!(
        h.append(append(&other.run_id, 1, &ol, vec![hook(1, &token)], at(9)))
            .await,
        StoreError::AlreadyExists { .. },
        "a live token after reopening"
    );
    let listed = h
        .list_runs(&RunQuery {
            session: Some(run.session_id.clone()),
            ..Default::default()
        })
        .await
        .expect("list_runs");
    assert_eq!(listed.len(), 1);
}

/// Two handles on one storage (two processes): one winner per seq, one holder per run, deliveries
/// deduped across them.
pub async fn two_handles_share_one_store(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let h2 = reopen(factory, &s.location).await;
    let h1 = Arc::clone(&s.store);
    for round in 0..4 {
        let c = h1
            .create_run(new_run(&format!("two{round}")), at(0))
            .await
            .expect("create_run");
        let id = c.run.run_id;
        let w1 = worker(&*h1, at(0)).await;
        let w2 = worker(&*h2, at(0)).await;
        let (a, b) = (Arc::clone(&h1), Arc::clone(&h2));
        let (l1, l2) = (w1.clone(), w2.clone());
        let t1 = tokio::spawn(async move { retrying(|| a.claim(&l1, 10, at(1))).await });
        let t2 = tokio::spawn(async move { retrying(|| b.claim(&l2, 10, at(1))).await });
        let n1 = t1
            .await
            .expect("task")
            .expect("claim")
            .iter()
            .filter(|r| r.run_id == id)
            .count();
        let n2 = t2
            .await
            .expect("task")
            .expect("claim")
            .iter()
            .filter(|r| r.run_id == id)
            .count();
        assert_eq!(n1 + n2, 1, "round {round}: one holder across two handles");
        let (holder, lease) = if n1 == 1 { (&h1, &w1) } else { (&h2, &w2) };
        let token = unique("token");
        must_append(
            &**holder,
            append(&id, 1, lease, vec![hook(1, &token)], at(2)),
        )
        .await;
        // Appends at one seq through both handles: one winner.
        let x = append(&id, 2, lease, vec![step(2, "\"h1\"")], at(3));
        let y = append(&id, 2, lease, vec![step(2, "\"h2\"")], at(3));
        let (a, b) = (Arc::clone(&h1), Arc::clone(&h2));
        let t1 = tokio::spawn(async move { retrying(|| a.append(x.clone())).await });
        let t2 = tokio::spawn(async move { retrying(|| b.append(y.clone())).await });
        let r = [t1.await.expect("task"), t2.await.expect("task")];
        assert_eq!(
            r.iter().filter(|r| r.is_ok()).count(),
            1,
            "round {round}: one append wins across handles: {r:?}"
        );
        assert!(
            r.iter().any(|r| matches!(
                r,
                Err(StoreError::Conflict {
                    expected: 2,
                    actual: 3,
                    ..
                })
            )),
            "the loser gets Conflict"
        );
        // Keyed deliveries through both handles: one event.
        let (a, b) = (Arc::clone(&h1), Arc::clone(&h2));
        let (t1k, t2k) = (token.clone(), token.clone());
        let d1 = tokio::spawn(async move {
            retrying(|| a.deliver_hook(&t1k, json("1"), Some("k"), at(4))).await
        });
        let d2 = tokio::spawn(async move {
            retrying(|| b.deliver_hook(&t2k, json("2"), Some("k"), at(4))).await
        });
        let d = [
            d1.await.expect("task").expect("deliver"),
            d2.await.expect("task").expect("deliver"),
        ];
        assert_eq!(
            d.iter().filter(|d| !d.duplicate).count(),
            1,
            "one keyed delivery across handles"
        );
        assert_eq!(d[0].seq, d[1].seq);
        assert_eq!(
            journal(&*h1, &id).await,
            journal(&*h2, &id).await,
            "both handles read the same journal"
        );
        assert_eq!(journal(&*h1, &id).await.len(), 4);
    }
}
