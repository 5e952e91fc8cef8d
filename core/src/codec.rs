//! The versioned codec that every store uses for event rows.
//!
//! A row holds a batch of consecutive events (one append) encoded as one JSON array, beside the
//! format version it was written with. One array per append keeps reads cheap: decoding pays the
//! per-row overhead once per batch, not once per event.

use crate::error::StoreError;
use crate::event::Event;
use crate::ids::RunId;

/// The format version written by this build. Stores keep it beside each row. Every change to
/// the event format (a new event, a new field, even an optional one) takes a new version: this
/// build reads every version up to its own, and refuses a row of a newer one with
/// [`StoreError::FormatTooNew`] (an older eve never misreads a newer one's data); a row of
/// version 0 is [`StoreError::Corrupt`].
///
/// | version | written by | adds |
/// | --- | --- | --- |
/// | 1 | 0.1 | the first format |
/// | 2 | 0.2 | `RunTerminated`, `AttributesSet`, `RunStarted.reset_from` |
pub const FORMAT_VERSION: u16 = 2;

/// The oldest format version this build reads.
pub const OLDEST_FORMAT_VERSION: u16 = 1;

/// Encodes a batch of events as one row body.
///
/// # Errors
/// `InvalidInput` if an event cannot be serialized (never, for events built by this crate).
pub fn encode_batch(events: &[Event]) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(events)
        .map_err(|e| StoreError::InvalidInput(format!("event does not serialize: {e}")))
}

/// Decodes a row body written by [`encode_batch`].
///
/// # Errors
/// `FormatTooNew` when the row was written by a newer eve (its version is past
/// [`FORMAT_VERSION`]); `Corrupt` naming `run` and `first_seq` when the version is older than
/// any eve wrote, the bytes are not a JSON array of events (an unknown event or an unknown field
/// of one included: a field is never silently dropped), or the row holds a different number of
/// events than `expected_count`.
pub fn decode_batch(
    run: &RunId,
    first_seq: u64,
    version: u16,
    bytes: &[u8],
    expected_count: usize,
) -> Result<Vec<Event>, StoreError> {
    check_version(run, first_seq, version)?;
    let mut events = Vec::new();
    decode_each(run, first_seq, bytes, expected_count, |e| events.push(e))?;
    Ok(events)
}

/// [`decode_batch`] without its vector: each event is handed to `each` as it is decoded, so a
/// reader builds its own page without moving every event once more. On an error, `each` may
/// have been handed some of the row's events already: the caller drops what it built.
///
/// # Errors
/// As [`decode_batch`].
pub fn decode_batch_each(
    run: &RunId,
    first_seq: u64,
    version: u16,
    bytes: &[u8],
    expected_count: usize,
    each: impl FnMut(Event),
) -> Result<(), StoreError> {
    check_version(run, first_seq, version)?;
    decode_each(run, first_seq, bytes, expected_count, each)
}

fn corrupt(run: &RunId, seq: u64, reason: String) -> StoreError {
    StoreError::Corrupt {
        run: run.clone(),
        seq,
        reason,
    }
}

fn check_version(run: &RunId, first_seq: u64, version: u16) -> Result<(), StoreError> {
    if version > FORMAT_VERSION {
        return Err(StoreError::FormatTooNew {
            run: run.clone(),
            seq: first_seq,
            version,
            supported: FORMAT_VERSION,
        });
    }
    if version < OLDEST_FORMAT_VERSION {
        return Err(corrupt(run, first_seq, format!(
            "unknown event format version {version}: no eve writes it (this build reads versions {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION})"
        )));
    }
    Ok(())
}

fn decode_each(
    run: &RunId,
    first_seq: u64,
    bytes: &[u8],
    expected_count: usize,
    each: impl FnMut(Event),
) -> Result<(), StoreError> {
    let undecodable =
        |e: &dyn std::fmt::Display| corrupt(run, first_seq, format!("undecodable events: {e}"));
    // One UTF-8 check of the whole row, not one per string: a `str` reader takes it as given.
    let text = std::str::from_utf8(bytes).map_err(|e| undecodable(&e))?;
    let mut de = serde_json::Deserializer::from_str(text);
    let count = serde::de::DeserializeSeed::deserialize(Each(each), &mut de)
        .map_err(|e| undecodable(&e))?;
    de.end().map_err(|e| undecodable(&e))?;
    if count != expected_count {
        return Err(corrupt(
            run,
            first_seq,
            format!("row holds {count} events, its header says {expected_count}"),
        ));
    }
    Ok(())
}

/// Deserializes a JSON array of events, handing each to the closure; its value is their count.
struct Each<F>(F);

impl<'de, F: FnMut(Event)> serde::de::DeserializeSeed<'de> for Each<F> {
    type Value = usize;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<usize, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, F: FnMut(Event)> serde::de::Visitor<'de> for Each<F> {
    type Value = usize;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON array of events")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(mut self, mut seq: A) -> Result<usize, A::Error> {
        let mut count = 0;
        while let Some(event) = seq.next_element::<Event>()? {
            (self.0)(event);
            count += 1;
        }
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Payload;

    #[test]
    fn round_trip_and_typed_errors() {
        let run = RunId::new("r");
        let events = vec![
            Event::Progress {
                cmd: 0,
                value: Payload::from_json(r#"{ "a" : 1 }"#).unwrap(),
            },
            Event::RunCancelled,
        ];
        let bytes = encode_batch(&events).unwrap();
        let back = decode_batch(&run, 3, FORMAT_VERSION, &bytes, 2).unwrap();
        assert_eq!(back, events);
        // Payload bytes survive exactly, whitespace included.
        match &back[0] {
            Event::Progress { value, .. } => assert_eq!(value.get(), r#"{ "a" : 1 }"#),
            other => panic!("unexpected {other:?}"),
        }
        match decode_batch(&run, 3, FORMAT_VERSION + 1, &bytes, 2) {
            Err(StoreError::FormatTooNew {
                run: r,
                seq: 3,
                version,
                supported: FORMAT_VERSION,
            }) if r == run && version == FORMAT_VERSION + 1 => {}
            other => panic!("expected FormatTooNew, got {other:?}"),
        }
        for (version, body, count) in [
            (0, &bytes[..], 2),
            (FORMAT_VERSION, &bytes[..bytes.len() - 3], 2),
            (
                FORMAT_VERSION,
                &br#"[{"RunFailed":{"error":"x","hint":"a newer field"}}]"#[..],
                1,
            ),
            (
                FORMAT_VERSION,
                &br#"[{"InputAnswered":{"request_id":"r:1","response":{"optionId":"a","mood":1}}}]"#[..],
                1,
            ),
            (FORMAT_VERSION, &b"[{\"type\":\"Nope\"}]"[..], 1),
            (FORMAT_VERSION, &bytes[..], 3),
        ] {
            match decode_batch(&run, 3, version, body, count) {
                Err(StoreError::Corrupt { run: r, seq, .. }) => {
                    assert_eq!(r, run);
                    assert_eq!(seq, 3);
                }
                other => panic!("expected Corrupt, got {other:?}"),
            }
        }
    }

    /// Optional fields that are skipped when empty decode when absent, and an event written
    /// with every optional field set round-trips.
    #[test]
    fn absent_optional_fields_decode() {
        let run = RunId::new("r");
        let body = br#"[
            {"HookCreated":{"cmd":1,"token":"t","webhook":true}},
            {"InputRequested":{"cmd":2,"request_id":"r:2","request":{"prompt":"q"}}},
            {"InputAnswered":{"request_id":"r:2","response":{}}},
            {"StepFailed":{"cmd":3,"name":"s","attempt":1,"error":"e","fatal":false,"retry_at":null}},
            {"AgentStarted":{"cmd":4,"key":"k","target":"t","agent_id":null}},
            {"HookCreated":{"cmd":5,"token":"u","webhook":true,"respond_with":{}}}
        ]"#;
        let events = decode_batch(&run, 0, FORMAT_VERSION, body, 6).expect("decodes");
        assert!(matches!(
            &events[0],
            Event::HookCreated {
                respond_with: None,
                ..
            }
        ));
        match &events[5] {
            Event::HookCreated {
                respond_with: Some(r),
                ..
            } => assert_eq!((r.status, r.body.is_null()), (200, true)),
            other => panic!("unexpected {other:?}"),
        }
        let again = encode_batch(&events).expect("encodes");
        assert_eq!(
            decode_batch(&run, 0, FORMAT_VERSION, &again, 6).unwrap(),
            events
        );
    }
}
