//! Limits and bad input: typed errors, and nothing stored is changed.

use crate::fixtures::*;
use crate::{assert_err, StoreFactory};
use eve_core::store::{MAX_EVENTS_PER_APPEND, MAX_PAYLOAD_BYTES};
use eve_core::{Event, RunId, StoreError};

/// 101 events, an empty list, a `RunStarted`, an oversized payload: typed errors, nothing written.
pub async fn append_limits_are_typed_errors(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let new = new_run("limits");
    let (run, lease) = started(&*s.store, new.clone(), at(0)).await;
    let id = &run.run_id;
    let many: Vec<Event> = (0..=MAX_EVENTS_PER_APPEND as u64)
        .map(|i| step(i, "0"))
        .collect();
    assert_err!(
        s.store.append(append(id, 1, &lease, many, at(1))).await,
        StoreError::LimitExceeded {
            actual: 101,
            limit: 100,
            ..
        },
        "an append of 101 events"
    );
    assert_err!(
        s.store.append(append(id, 1, &lease, vec![], at(1))).await,
        StoreError::InvalidInput(_),
        "an empty append"
    );
    assert_err!(
        s.store
            .append(append(id, 1, &lease, vec![new.started_event()], at(1)))
            .await,
        StoreError::InvalidInput(_),
        "appending RunStarted"
    );
    let big = format!("\"{}\"", "x".repeat(MAX_PAYLOAD_BYTES - 1));
    assert_err!(
        s.store
            .append(append(id, 1, &lease, vec![step(1, &big)], at(1)))
            .await,
        StoreError::LimitExceeded { .. },
        "a payload of 4 MiB + 1 bytes"
    );
    let half = format!("\"{}\"", "y".repeat(MAX_PAYLOAD_BYTES / 2));
    assert_err!(
        s.store
            .append(append(
                id,
                1,
                &lease,
                vec![step(1, &half), step(2, &half)],
                at(1)
            ))
            .await,
        StoreError::LimitExceeded { .. },
        "two payloads totalling over 4 MiB in one append"
    );
    let full: Vec<Event> = (0..MAX_EVENTS_PER_APPEND as u64)
        .map(|i| step(i, "0"))
        .collect();
    let ok = must_append(&*s.store, append(id, 1, &lease, full, at(2))).await;
    assert_eq!(ok.next_seq, 101, "exactly 100 events are allowed");
    assert_eq!(
        journal(&*s.store, id).await.len(),
        101,
        "the refused appends wrote nothing"
    );
    assert_err!(
        s.store
            .append(append(
                &RunId::new(unique("nope")),
                1,
                &lease,
                vec![step(1, "1")],
                at(3)
            ))
            .await,
        StoreError::NotFound { .. },
        "an append to an unknown run"
    );
}

/// Reads past the end, of an unknown run, or with max = 0 are typed errors.
pub async fn read_limits_are_typed_errors(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let (run, _) = started(&*s.store, new_run("reads"), at(0)).await;
    let page = s
        .store
        .read(&run.run_id, 1, 10)
        .await
        .expect("a read at the end gives an empty page");
    assert!(
        page.is_empty(),
        "a read at next_seq gives an empty page, got {page:?}"
    );
    assert_err!(
        s.store.read(&run.run_id, 2, 10).await,
        StoreError::InvalidInput(_),
        "a read past the end"
    );
    assert_err!(
        s.store.read(&run.run_id, 0, 0).await,
        StoreError::InvalidInput(_),
        "a read with max = 0"
    );
    assert_err!(
        s.store.read(&RunId::new(unique("nope")), 0, 10).await,
        StoreError::NotFound { .. },
        "a read of an unknown run"
    );
    assert_err!(
        s.store.get_run(&RunId::new(unique("nope"))).await,
        StoreError::NotFound { .. },
        "get_run of an unknown run"
    );
    assert_err!(
        s.store.read_session(&run.session_id, 0, 0).await,
        StoreError::InvalidInput(_),
        "read_session with max = 0"
    );
    let empty = s
        .store
        .read_session(&eve_core::SessionId::new(unique("no-session")), 0, 10)
        .await
        .expect("read_session");
    assert!(empty.is_empty(), "an unknown session has an empty log");
}

/// Empty idempotency keys, dedupe keys, tokens and ids are `InvalidInput`.
pub async fn empty_keys_are_invalid(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let mut new = new_run("empty-key");
    new.idempotency_key = Some(String::new());
    assert_err!(
        s.store.create_run(new.clone(), at(0)).await,
        StoreError::InvalidInput(_),
        "an empty idempotency key"
    );
    new.idempotency_key = None;
    new.session_id = eve_core::SessionId::new("");
    assert_err!(
        s.store.create_run(new, at(0)).await,
        StoreError::InvalidInput(_),
        "an empty session id"
    );
    let (run, lease) = started(&*s.store, new_run("hook"), at(0)).await;
    let token = unique("token");
    must_append(
        &*s.store,
        append(&run.run_id, 1, &lease, vec![hook(1, &token)], at(1)),
    )
    .await;
    assert_err!(
        s.store
            .deliver_hook(&token, json("1"), Some(""), at(2))
            .await,
        StoreError::InvalidInput(_),
        "an empty dedupe key"
    );
    assert_err!(
        s.store.deliver_hook("", json("1"), None, at(2)).await,
        StoreError::InvalidInput(_),
        "an empty hook token"
    );
    assert_err!(
        s.store
            .deliver_hook(&unique("unknown"), json("1"), None, at(2))
            .await,
        StoreError::NotFound { .. },
        "a delivery to an unknown token"
    );
    assert_err!(
        s.store
            .register_worker(
                &eve_core::WorkerId::new(""),
                &eve_core::DeploymentId::new(DEPLOYMENT),
                TTL,
                at(2)
            )
            .await,
        StoreError::InvalidInput(_),
        "an empty worker id"
    );
    assert_eq!(
        journal(&*s.store, &run.run_id).await.len(),
        2,
        "refused deliveries wrote nothing"
    );
}

/// A damaged row (truncated, garbage) reads as `Corrupt`, a row of a newer format version as
/// `FormatTooNew`, each naming the run and the row's first seq, never a panic; the events before it and other runs stay readable.
/// Needs [`StoreFactory::corrupt`] (see [`crate::Skip`]).
pub async fn corrupt_rows_are_typed_errors(factory: &dyn StoreFactory) {
    use crate::Corruption;
    for how in [
        Corruption::Truncated,
        Corruption::Garbage,
        Corruption::UnknownVersion,
    ] {
        let s = fresh(factory).await;
        let (run, lease) = started(&*s.store, new_run("corrupt"), at(0)).await;
        let (other, ol) = started(&*s.store, new_run("intact"), at(0)).await;
        must_append(
            &*s.store,
            append(&run.run_id, 1, &lease, vec![step(1, "1")], at(1)),
        )
        .await;
        must_append(
            &*s.store,
            append(
                &run.run_id,
                2,
                &lease,
                vec![step(2, "2"), step(3, "3")],
                at(2),
            ),
        )
        .await;
        must_append(
            &*s.store,
            append(&other.run_id, 1, &ol, vec![step(1, "1")], at(2)),
        )
        .await;
        let done = factory
            .corrupt(&s.location, &run.run_id, how)
            .await
            .unwrap_or_else(|e| panic!("StoreFactory::corrupt failed: {e}"));
        if !done {
            crate::skip(match factory.corrupt_not_applicable() {
                Some(why) => crate::Skip::NotApplicable(why.to_owned()),
                None => crate::Skip::Missing(
                    "this factory cannot damage rows (StoreFactory::corrupt gave false); implement it"
                        .to_owned(),
                ),
            });
        }
        match s.store.read(&run.run_id, 0, 100).await {
            Err(StoreError::FormatTooNew {
                run: r,
                seq,
                version,
                supported,
            }) if how == Corruption::UnknownVersion => {
                assert_eq!(r, run.run_id, "FormatTooNew names the run");
                assert_eq!(seq, 2, "FormatTooNew names the row's first seq");
                assert!(
                    version > supported && supported == eve_core::codec::FORMAT_VERSION,
                    "FormatTooNew names the row's version {version} and this build's {supported}"
                );
            }
            Err(StoreError::Corrupt {
                run: r,
                seq,
                reason,
            }) => {
                assert_eq!(r, run.run_id, "{how:?}: Corrupt names the run");
                assert_eq!(seq, 2, "{how:?}: Corrupt names the damaged row's first seq");
                assert!(!reason.is_empty(), "{how:?}: Corrupt says what was wrong");
            }
            other => panic!(
                "{how:?}: reading a damaged row must be Corrupt (FormatTooNew for a newer version), got {:?}",
                other.map(|p| p.len())
            ),
        }
        let before = s
            .store
            .read(&run.run_id, 0, 2)
            .await
            .expect("the events before the damaged row stay readable");
        assert_eq!(before.len(), 2, "{how:?}: seqs 0 and 1 are intact");
        assert_eq!(
            journal(&*s.store, &other.run_id).await.len(),
            2,
            "{how:?}: other runs are untouched"
        );
        assert!(
            s.store.get_run(&run.run_id).await.is_ok(),
            "{how:?}: the run's record stays readable"
        );
    }
}
