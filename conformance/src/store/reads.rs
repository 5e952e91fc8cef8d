//! Guarantee 6: faithful, ordered, paged reads, byte for byte.

use crate::fixtures::*;
use crate::StoreFactory;
use eve_core::store::MAX_PAYLOAD_BYTES;
use eve_core::{Event, JournalStoreExt};

/// A JSON text of exactly `len` bytes with escapes and multi-byte characters in it.
fn payload_of_len(len: usize) -> String {
    let head = "{\"data\":\"é\\n\\u00e9\\\"💡";
    let tail = "\"}";
    let fill = len - head.len() - tail.len();
    let mut s = String::with_capacity(len);
    s.push_str(head);
    s.extend(std::iter::repeat_n('x', fill));
    s.push_str(tail);
    assert_eq!(s.len(), len);
    s
}

/// A 4 MiB payload (the limit) round-trips byte for byte; one byte more is `LimitExceeded`.
pub async fn large_payload_round_trips(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let (run, lease) = started(&*s.store, new_run("big"), at(0)).await;
    let big = payload_of_len(MAX_PAYLOAD_BYTES);
    must_append(
        &*s.store,
        append(&run.run_id, 1, &lease, vec![step(1, &big)], at(1)),
    )
    .await;
    let over = payload_of_len(MAX_PAYLOAD_BYTES + 1);
    match s
        .store
        .append(append(&run.run_id, 2, &lease, vec![step(2, &over)], at(2)))
        .await
    {
        Err(eve_core::StoreError::LimitExceeded { actual, limit, .. }) => {
            assert_eq!((actual, limit), (MAX_PAYLOAD_BYTES + 1, MAX_PAYLOAD_BYTES))
        }
        r => panic!(
            "a 4 MiB + 1 payload must be LimitExceeded, got {:?}",
            r.map(|_| ())
        ),
    }
    let page = s.store.read(&run.run_id, 1, 10).await.expect("read");
    assert_eq!(page.len(), 1, "one event after seq 0");
    match &page[0].event {
        Event::StepCompleted { output, .. } => {
            assert!(
                output.get().as_bytes() == big.as_bytes(),
                "the 4 MiB payload must come back byte for byte ({} bytes read)",
                output.len()
            )
        }
        e => panic!("expected the StepCompleted, got {}", e.kind()),
    }
    // Also as the hook payload and the final output.
    let token = unique("token");
    must_append(
        &*s.store,
        append(&run.run_id, 2, &lease, vec![hook(2, &token)], at(3)),
    )
    .await;
    let d = s
        .store
        .deliver_hook(&token, json(&big), None, at(4))
        .await
        .expect("a 4 MiB hook payload");
    let e = s.store.read(&run.run_id, d.seq, 1).await.expect("read");
    assert_eq!(
        e[0].event,
        Event::HookReceived {
            cmd: 2,
            payload: json(&big)
        },
        "a 4 MiB delivery round-trips"
    );
}

/// A 10,000-event journal written as 100-event appends reads back in order, across pages of any
/// size.
pub async fn ten_thousand_events_page_in_order(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let (run, lease) = started(&*s.store, new_run("long"), at(0)).await;
    let mut next = 1;
    for batch in 0..100u64 {
        let events: Vec<Event> = (0..100)
            .map(|i| step(batch * 100 + i, &format!("{{\"n\":{}}}", batch * 100 + i)))
            .collect();
        let ok = must_append(
            &*s.store,
            append(&run.run_id, next, &lease, events, at(batch as i64)),
        )
        .await;
        next = ok.next_seq;
    }
    assert_eq!(next, 10_001);
    let check = |events: &[eve_core::StoredEvent], what: &str| {
        assert_eq!(events.len(), 10_001, "{what}: every event");
        for (i, e) in events.iter().enumerate().skip(1) {
            let n = i as u64 - 1;
            assert_eq!(e.seq, i as u64, "{what}: seqs in order");
            assert_eq!(
                e.event,
                step(n, &format!("{{\"n\":{n}}}")),
                "{what}: event at seq {i}"
            );
            assert_eq!(
                e.at,
                at((n / 100) as i64),
                "{what}: the writer's timestamp at seq {i}"
            );
        }
    };
    check(
        &s.store.read_all(&run.run_id, 0).await.expect("read_all"),
        "read_all",
    );
    for page_size in [1_000, 777] {
        let mut out = Vec::new();
        let mut from = 0;
        loop {
            let page = s
                .store
                .read(&run.run_id, from, page_size)
                .await
                .expect("read");
            assert!(page.len() <= page_size, "a page holds at most max events");
            let Some(last) = page.last() else { break };
            assert_eq!(page[0].seq, from, "a page starts at from_seq");
            from = last.seq + 1;
            out.extend(page);
        }
        check(&out, &format!("pages of {page_size}"));
    }
    let tail = s
        .store
        .read(&run.run_id, 9_990, 100)
        .await
        .expect("read the tail");
    assert_eq!(
        tail.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (9_990..10_001).collect::<Vec<_>>()
    );
}

/// Payloads keep their exact text: whitespace, key order, number spelling, escapes.
pub async fn payload_bytes_are_kept_exactly(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let texts = [
        r#"{ "b" : 1,   "a" : [ 1.0 , 1e3, -0, 12345678901234567890123 ] }"#,
        "\"\\u00e9 é \\ud83d\\ude00 😀 \\/ \\\"\"",
        "null",
        "[\n\t{}\r\n]",
        "0.1000000000000000055511151231257827",
    ];
    let mut new = new_run("bytes");
    new.input = json(texts[0]);
    let (run, lease) = started(&*s.store, new, at(0)).await;
    let events: Vec<Event> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| step(i as u64, t))
        .collect();
    must_append(&*s.store, append(&run.run_id, 1, &lease, events, at(1))).await;
    let j = journal(&*s.store, &run.run_id).await;
    match &j[0].event {
        Event::RunStarted { input, .. } => {
            assert_eq!(input.get(), texts[0], "the run input keeps its bytes")
        }
        e => panic!("seq 0 must be RunStarted, got {}", e.kind()),
    }
    for (i, t) in texts.iter().enumerate() {
        match &j[i + 1].event {
            Event::StepCompleted { output, .. } => {
                assert_eq!(output.get(), *t, "payload {i} keeps its bytes")
            }
            e => panic!("expected StepCompleted, got {}", e.kind()),
        }
    }
}
