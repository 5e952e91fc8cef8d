//! DynamoDB's faults, injected below the SDK (at its HTTP connector, see [`FaultInjector`]):
//! throttling, 500s and timeouts are retried with backoff; a `TransactWriteItems` that reached
//! DynamoDB but whose reply was lost is resolved by its append id (no double effect, a retry is
//! a duplicate); and the contract's answers (`Conflict`, `AlreadyAnswered`) stay the same under
//! faults. Against DynamoDB Local, checked from the journals and the call counts.
//!
//! Needs `EVE_TEST_DYNAMODB_ENDPOINT` (see `.ci/dynamodb-local.sh`); without it each test prints
//! that it was skipped and why, and passes.

use eve_conformance::fixtures::*;
use eve_core::{Event, InputResponse, JournalStore, StoreError};
use eve_storage_dynamodb::{DynamoConfig, DynamoStore, FaultInjector};
use std::time::Duration;

/// A store on a fresh table with `faults` injected, at most `attempts` attempts a call, short
/// backoffs and a 300 ms attempt timeout.
async fn store(test: &str, faults: &FaultInjector, attempts: u32) -> Option<DynamoStore> {
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    let Ok(endpoint) = std::env::var("EVE_TEST_DYNAMODB_ENDPOINT") else {
        println!(
            "skipped: {test}: EVE_TEST_DYNAMODB_ENDPOINT is unset, so the DynamoDB fault tests did \
             not run; start DynamoDB Local with `bash .ci/dynamodb-local.sh` and set \
             EVE_TEST_DYNAMODB_ENDPOINT=http://127.0.0.1:8000"
        );
        return None;
    };
    let mut cfg = DynamoConfig::local(
        endpoint,
        format!("eve_faults_{}", uuid::Uuid::new_v4().simple()),
    );
    cfg.faults = Some(faults.clone());
    cfg.max_attempts = attempts;
    cfg.base_backoff = Duration::from_millis(2);
    cfg.attempt_timeout = Duration::from_millis(300);
    let s = DynamoStore::connect(cfg).await.expect("connect");
    s.create_table().await.expect("create_table");
    Some(s)
}

/// The steps of the journal, by cmd: each must appear once.
fn steps(journal: &[eve_core::StoredEvent]) -> Vec<u64> {
    journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::StepCompleted { cmd, .. } => Some(*cmd),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_500s_and_timeouts_are_retried_with_backoff() {
    let faults = FaultInjector::new();
    let Some(s) = store("throttling_500s_and_timeouts", &faults, 5).await else {
        return;
    };
    let st: &dyn JournalStore = &s;
    let (run, lease) = started(st, new_run("retried"), at(0)).await;
    let run = run.run_id;
    let mut next = 1;
    type Inject = fn(&FaultInjector);
    let kinds: [(&str, Inject); 5] = [
        ("ProvisionedThroughputExceededException", |f| {
            f.fail_next(3, "ProvisionedThroughputExceededException")
        }),
        ("ThrottlingException", |f| {
            f.fail_next(3, "ThrottlingException")
        }),
        ("InternalServerError (500)", |f| {
            f.fail_next(3, "InternalServerError")
        }),
        ("ServiceUnavailable (500)", |f| {
            f.fail_next(3, "ServiceUnavailable")
        }),
        ("timeouts", |f| f.time_out_next(3)),
    ];
    for (what, inject) in kinds {
        // An append (a transaction) and a read, each past three faults.
        let before = (s.call_counts(), faults.injected());
        inject(&faults);
        let done = st
            .append(append(&run, next, &lease, vec![step(next, "1")], at(1)))
            .await
            .unwrap_or_else(|e| panic!("{what}: the append was not retried: {e}"));
        assert_eq!((done.first_seq, done.duplicate), (next, false), "{what}");
        next = done.next_seq;
        assert_eq!(faults.injected() - before.1, 3, "{what}");
        assert_eq!(
            s.call_counts().since(&before.0).0.get("TransactWriteItems"),
            Some(&4),
            "{what}: three failed attempts and one that landed"
        );
        inject(&faults);
        assert_eq!(record(st, &run).await.next_seq, next, "{what}: read");
    }
    assert_eq!(
        steps(&journal(st, &run).await),
        (1..next).collect::<Vec<_>>(),
        "each step once"
    );

    // Past max_attempts: a typed, retryable Unavailable naming the fault, nothing written.
    faults.time_out_next(100);
    let err = st
        .append(append(&run, next, &lease, vec![step(next, "1")], at(1)))
        .await
        .expect_err("timing out past max_attempts");
    assert!(err.is_retryable(), "{err:?}");
    faults.fail_next(0, "");
    assert_eq!(record(st, &run).await.next_seq, next, "nothing was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambiguous_transaction_is_resolved_by_its_append_id() {
    let faults = FaultInjector::new();
    let Some(s) = store("an_ambiguous_transaction", &faults, 4).await else {
        return;
    };
    let st: &dyn JournalStore = &s;
    let (run, lease) = started(st, new_run("ambiguous"), at(0)).await;
    let run = run.run_id;

    // One reply lost: the store's own retry learns that the append landed.
    let first = append(&run, 1, &lease, vec![step(1, "1")], at(1));
    faults.lose_reply_next(1, "TransactWriteItems");
    let done = st.append(first.clone()).await.expect("resolved by a retry");
    assert_eq!(faults.injected(), 1);
    assert_eq!((done.first_seq, done.next_seq), (1, 2));
    // The caller's own retry with the same append id: a duplicate, no second effect.
    let again = st.append(first).await.expect("a retried append");
    assert!(again.duplicate, "{again:?}");
    assert_eq!(again.first_seq, 1);

    // Every reply lost: the append landed but the caller only sees Unavailable; its retry with
    // the same append id reports the duplicate.
    let second = append(&run, 2, &lease, vec![step(2, "2")], at(2));
    faults.lose_reply_next(100, "TransactWriteItems");
    let err = st.append(second.clone()).await.expect_err("ambiguous");
    assert!(
        matches!(err, StoreError::Unavailable { .. }),
        "an ambiguous append is Unavailable (retry it), got {err:?}"
    );
    faults.fail_next(0, "");
    let resolved = st.append(second).await.expect("the retry");
    assert!(resolved.duplicate, "the append had landed: {resolved:?}");
    assert_eq!((resolved.first_seq, resolved.next_seq), (2, 3));

    // An answer whose reply is lost lands once; the same answer again is a duplicate, another
    // one AlreadyAnswered.
    let (request, asked) = ask(&run, 3);
    must_append(st, append(&run, 3, &lease, vec![asked], at(3))).await;
    faults.lose_reply_next(1, "TransactWriteItems");
    let answered = st
        .answer(&request, InputResponse::option("yes"), at(4))
        .await
        .expect("an answer resolved past a lost reply");
    faults.lose_reply_next(100, "TransactWriteItems");
    let err = st
        .answer(&request, InputResponse::option("yes"), at(5))
        .await;
    faults.fail_next(0, "");
    // However the store settles it (a duplicate, or Unavailable when no reply ever came
    // back), nothing is delivered twice.
    if let Ok(d) = &err {
        assert!(d.duplicate && d.seq == answered.seq, "{d:?}");
    }
    let again = st
        .answer(&request, InputResponse::option("yes"), at(6))
        .await
        .expect("the same answer again");
    assert!(again.duplicate && again.seq == answered.seq, "{again:?}");

    let journal = journal(st, &run).await;
    assert_eq!(steps(&journal), [1, 2], "each step once");
    let answers = journal
        .iter()
        .filter(|e| matches!(e.event, Event::InputAnswered { .. }))
        .count();
    assert_eq!(answers, 1, "one answer recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_contracts_errors_are_unchanged_under_faults() {
    let faults = FaultInjector::new();
    let Some(s) = store("the_contracts_errors_are_unchanged", &faults, 5).await else {
        return;
    };
    let st: &dyn JournalStore = &s;
    let (run, lease) = started(st, new_run("contract"), at(0)).await;
    let run = run.run_id;
    must_append(st, append(&run, 1, &lease, vec![step(1, "1")], at(1))).await;
    let (request, asked) = ask(&run, 2);
    must_append(st, append(&run, 2, &lease, vec![asked], at(2))).await;
    st.answer(&request, InputResponse::option("yes"), at(3))
        .await
        .expect("answer");

    for (what, inject) in [
        (
            "throttling",
            Box::new(|f: &FaultInjector| f.fail_next(2, "ThrottlingException"))
                as Box<dyn Fn(&FaultInjector)>,
        ),
        (
            "500s",
            Box::new(|f: &FaultInjector| f.fail_next(2, "InternalServerError")),
        ),
        ("timeouts", Box::new(|f: &FaultInjector| f.time_out_next(2))),
        (
            "lost replies",
            Box::new(|f: &FaultInjector| f.lose_reply_next(2, "TransactWriteItems")),
        ),
    ] {
        inject(&faults);
        let stale = st
            .append(append(&run, 1, &lease, vec![step(9, "9")], at(4)))
            .await;
        assert!(
            matches!(
                stale,
                Err(StoreError::Conflict {
                    expected: 1,
                    actual: 4,
                    ..
                })
            ),
            "{what}: a stale append is still a Conflict: {stale:?}"
        );
        inject(&faults);
        let other = st
            .answer(&request, InputResponse::option("no"), at(5))
            .await;
        assert!(
            matches!(other, Err(StoreError::AlreadyAnswered { .. })),
            "{what}: another answer is still AlreadyAnswered: {other:?}"
        );
        faults.fail_next(0, "");
    }
    let journal = journal(st, &run).await;
    assert_eq!(journal.len(), 4, "nothing more was written");
    assert_eq!(steps(&journal), [1]);
}
