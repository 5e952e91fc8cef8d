//! Isolation: two stores from one factory never see each other's runs, keys, tokens, sessions
//! or workers.

use crate::fixtures::*;
use crate::{assert_err, StoreFactory};
use eve_core::{RunQuery, StoreError};

/// Everything written to one fresh store is invisible in another.
pub async fn stores_never_see_each_other(factory: &dyn StoreFactory) {
    let a = fresh(factory).await;
    let b = fresh(factory).await;
    let mut new = new_run("iso");
    new.idempotency_key = Some(unique("key"));
    let (run, lease) = started(&*a.store, new.clone(), at(0)).await;
    let token = unique("token");
    let (req, ask_ev) = ask(&run.run_id, 2);
    must_append(
        &*a.store,
        append(
            &run.run_id,
            1,
            &lease,
            vec![hook(1, &token), ask_ev, completed("1")],
            at(1),
        ),
    )
    .await;
    // (completed: the token is released in a; b must not know it either way.)
    assert_err!(
        b.store.get_run(&run.run_id).await,
        StoreError::NotFound { .. },
        "a's run in b"
    );
    assert_err!(
        b.store.read(&run.run_id, 0, 10).await,
        StoreError::NotFound { .. },
        "a's journal in b"
    );
    assert!(
        b.store
            .list_runs(&RunQuery::default())
            .await
            .expect("list_runs")
            .is_empty(),
        "b lists none of a's runs"
    );
    assert!(
        b.store
            .read_session(&run.session_id, 0, 100)
            .await
            .expect("read_session")
            .is_empty(),
        "a's session log in b"
    );
    assert_err!(
        b.store
            .answer(&req, eve_core::InputResponse::option("yes"), at(2))
            .await,
        StoreError::NotFound { .. },
        "a's request in b"
    );
    assert_err!(
        b.store.heartbeat(&lease, TTL, at(2)).await,
        StoreError::NotFound { .. },
        "a's worker in b"
    );
    let c = b
        .store
        .create_run(new.clone(), at(2))
        .await
        .expect("a's key in b");
    assert!(c.created, "a's idempotency key names nothing in b");
    // A live token in b does not clash with a, and vice versa.
    let (brun, blease) = started(&*b.store, new_run("iso-b"), at(3)).await;
    must_append(
        &*b.store,
        append(&brun.run_id, 1, &blease, vec![hook(1, &token)], at(3)),
    )
    .await;
    let (arun, alease) = started(&*a.store, new_run("iso-a"), at(3)).await;
    must_append(
        &*a.store,
        append(&arun.run_id, 1, &alease, vec![hook(1, &token)], at(4)),
    )
    .await;
    let d = b
        .store
        .deliver_hook(&token, json("1"), None, at(5))
        .await
        .expect("deliver in b");
    assert_eq!(d.run, brun.run_id, "b's token reaches b's run");
    let wa = worker(&*a.store, at(6)).await;
    let claimed = a.store.claim(&wa, 100, at(6)).await.expect("claim in a");
    assert!(
        claimed.iter().all(|r| r.run_id != brun.run_id),
        "a never claims b's runs"
    );
    assert_eq!(
        journal(&*a.store, &run.run_id).await.len(),
        4,
        "a's journal is untouched by b"
    );
}
