//! Guarantee 4: hook tokens are unique among live hooks, released when the run ends.

use crate::fixtures::*;
use crate::{assert_err, StoreFactory};
use eve_core::{Event, RunId, StoreError};
use std::sync::Arc;

/// A live token cannot be registered by another run; it is released at run end and reusable
/// after, and deliveries then reach the new hook.
pub async fn hook_token_unique_and_released(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let token = unique("token");
    let (a, la) = started(&*s.store, new_run("a"), at(0)).await;
    let (b, lb) = started(&*s.store, new_run("b"), at(0)).await;
    must_append(
        &*s.store,
        append(&a.run_id, 1, &la, vec![hook(1, &token)], at(1)),
    )
    .await;
    assert_err!(
        s.store
            .append(append(&b.run_id, 1, &lb, vec![hook(1, &token)], at(1)))
            .await,
        StoreError::AlreadyExists { .. },
        "a second registration of a live token"
    );
    let d = s
        .store
        .deliver_hook(&token, json("\"to a\""), None, at(2))
        .await
        .expect("deliver to a");
    assert_eq!((d.run.clone(), d.seq), (a.run_id.clone(), 2));
    must_append(
        &*s.store,
        append(
            &a.run_id,
            3,
            &la,
            vec![Event::RunFailed {
                error: "boom".into(),
            }],
            at(3),
        ),
    )
    .await;
    assert_err!(
        s.store.deliver_hook(&token, json("1"), None, at(4)).await,
        StoreError::NotFound { .. },
        "a released token"
    );
    must_append(
        &*s.store,
        append(&b.run_id, 1, &lb, vec![hook(1, &token)], at(5)),
    )
    .await;
    let d = s
        .store
        .deliver_hook(&token, json("\"to b\""), Some("k"), at(6))
        .await
        .expect("deliver to b");
    assert_eq!(
        (d.run, d.seq, d.duplicate),
        (b.run_id.clone(), 2, false),
        "the reused token reaches the new run"
    );
    let j = journal(&*s.store, &b.run_id).await;
    assert_eq!(
        j[2].event,
        Event::HookReceived {
            cmd: 1,
            payload: json("\"to b\"")
        }
    );
}

/// An append that creates one token twice is refused with `AlreadyExists` naming it and writes
/// nothing (its first hook is not left live), but only once the run's own checks pass: on an
/// unknown run it is `NotFound`, at a stale seq a `Conflict`, as any append.
pub async fn token_repeated_in_one_append(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let token = unique("token");
    let (a, la) = started(&*s.store, new_run("a"), at(0)).await;
    let twice = |run: &RunId, seq| {
        let events = vec![hook(1, &token), step(2, "2"), hook(3, &token)];
        append(run, seq, &la, events, at(1))
    };
    let missing = RunId::new(unique("missing"));
    assert_err!(
        s.store.append(twice(&missing, 1)).await,
        StoreError::NotFound { .. },
        "an unknown run comes before the repeated token"
    );
    assert_err!(
        s.store.append(twice(&a.run_id, 5)).await,
        StoreError::Conflict { .. },
        "a stale seq comes before the repeated token"
    );
    match s.store.append(twice(&a.run_id, 1)).await {
        Err(StoreError::AlreadyExists { id, .. }) => assert_eq!(id, token),
        other => panic!("the repeated token: expected AlreadyExists, got {other:?}"),
    }
    assert_eq!(
        journal(&*s.store, &a.run_id).await.len(),
        1,
        "nothing written"
    );
    must_append(
        &*s.store,
        append(&a.run_id, 1, &la, vec![hook(1, &token)], at(2)),
    )
    .await;
}

/// Runs racing to register one token: exactly one append wins.
pub async fn concurrent_hook_registration_one_winner(factory: &dyn StoreFactory) {
    const N: usize = 6;
    let s = fresh(factory).await;
    let token = unique("token");
    let mut runs = Vec::new();
    for i in 0..N {
        runs.push(started(&*s.store, new_run(&format!("h{i}")), at(0)).await);
    }
    let mut tasks = Vec::new();
    for (run, lease) in &runs {
        let store = Arc::clone(&s.store);
        let a = append(&run.run_id, 1, lease, vec![hook(1, &token)], at(1));
        tasks.push(tokio::spawn(async move {
            retrying(|| store.append(a.clone())).await
        }));
    }
    let mut wins = 0;
    for t in tasks {
        match t.await.expect("task panicked") {
            Ok(_) => wins += 1,
            Err(StoreError::AlreadyExists { .. }) => {}
            Err(e) => panic!("a losing registration must be AlreadyExists, got {e:?}"),
        }
    }
    assert_eq!(wins, 1, "one live hook per token");
    let mut with_hook = 0;
    for (run, _) in &runs {
        with_hook += usize::from(journal(&*s.store, &run.run_id).await.len() == 2);
    }
    assert_eq!(with_hook, 1, "only the winner's journal holds HookCreated");
}
