//! Guarantee 3: idempotent starts.

use crate::fixtures::*;
use crate::{assert_err, StoreFactory};
use eve_core::{RunId, StoreError};
use std::sync::Arc;

/// A repeated key returns the existing run (`created: false`), with its current record.
pub async fn create_run_is_idempotent(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let new = new_run("idem");
    let first = s
        .store
        .create_run(new.clone(), at(0))
        .await
        .expect("create_run");
    assert!(first.created);
    assert_eq!(first.run.next_seq, 1, "a new run holds RunStarted at seq 0");
    assert_eq!(
        first.run.idempotency_key,
        format!("{}/{}", new.session_id, new.call_id),
        "default key is session/call"
    );
    let mut again = new.clone();
    again.run_id = RunId::new(unique("run-other"));
    let second = s
        .store
        .create_run(again, at(5))
        .await
        .expect("repeated create_run");
    assert!(!second.created, "a repeated key must not create a run");
    assert_eq!(
        second.run.run_id, new.run_id,
        "a repeated key returns the existing run"
    );
    let j = journal(&*s.store, &new.run_id).await;
    assert_eq!(j.len(), 1);
    assert_eq!(
        j[0].event,
        new.started_event(),
        "RunStarted is written from the start request"
    );
    assert_eq!(j[0].at, at(0));
    // An explicit key works the same, and another key with the same run id is AlreadyExists.
    let mut keyed = new_run("keyed");
    keyed.idempotency_key = Some(unique("key"));
    assert!(
        s.store
            .create_run(keyed.clone(), at(1))
            .await
            .expect("keyed")
            .created
    );
    let mut clash = new_run("clash");
    clash.run_id = keyed.run_id.clone();
    assert_err!(
        s.store.create_run(clash, at(2)).await,
        StoreError::AlreadyExists { .. },
        "a run id reused under another key"
    );
}

/// Concurrent starts with one key make one run; every caller gets that run.
pub async fn concurrent_create_run_one_run(factory: &dyn StoreFactory) {
    const N: usize = 8;
    let s = fresh(factory).await;
    let base = new_run("concurrent");
    let mut tasks = Vec::new();
    for i in 0..N {
        let store = Arc::clone(&s.store);
        let mut new = base.clone();
        new.run_id = RunId::new(format!("{}-{i}", base.run_id));
        tasks.push(tokio::spawn(async move {
            retrying(|| store.create_run(new.clone(), at(0))).await
        }));
    }
    let mut ids = Vec::new();
    let mut created = 0;
    for t in tasks {
        let r = t
            .await
            .expect("create task panicked")
            .expect("concurrent create_run with one key must succeed");
        created += usize::from(r.created);
        ids.push(r.run.run_id);
    }
    assert_eq!(
        created, 1,
        "exactly one concurrent start may create the run"
    );
    assert!(
        ids.windows(2).all(|w| w[0] == w[1]),
        "every caller must get the same run: {ids:?}"
    );
    let listed = s
        .store
        .list_runs(&eve_core::RunQuery {
            session: Some(base.session_id.clone()),
            ..Default::default()
        })
        .await
        .expect("list_runs");
    assert_eq!(
        listed.len(),
        1,
        "one key, one run in the session's task index"
    );
}

/// The same key with a different input is `IdempotencyMismatch` naming the existing run.
pub async fn same_key_different_input_mismatch(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let new = new_run("mismatch");
    s.store
        .create_run(new.clone(), at(0))
        .await
        .expect("create_run");
    let mut other = new.clone();
    other.run_id = RunId::new(unique("run-mismatch"));
    other.input = json(r#"{"tag": "different"}"#);
    match s.store.create_run(other, at(1)).await {
        Err(StoreError::IdempotencyMismatch { existing, .. }) => assert_eq!(existing, new.run_id),
        r => panic!("same key, different input: expected IdempotencyMismatch, got {r:?}"),
    }
}
