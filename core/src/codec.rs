//! The versioned codec that every store uses for event rows.
//!
//! A row holds a batch of consecutive events (one append) encoded as one JSON array, beside the
//! format version it was written with. One array per append keeps reads cheap: decoding pays the
//! per-row overhead once per batch, not once per event.

use crate::error::StoreError;
use crate::event::Event;
use crate::ids::RunId;

/// The format version written by this build. Stores keep it beside each row; a row with another
/// version is [`StoreError::Corrupt`], never a panic.
pub const FORMAT_VERSION: u16 = 1;

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
/// `Corrupt` naming `run` and `first_seq` when the version is unknown, the bytes are not a JSON
/// array of events, or the row holds a different number of events than `expected_count`.
pub fn decode_batch(
    run: &RunId,
    first_seq: u64,
    version: u16,
    bytes: &[u8],
    expected_count: usize,
) -> Result<Vec<Event>, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        run: run.clone(),
        seq: first_seq,
        reason,
    };
    if version != FORMAT_VERSION {
        return Err(corrupt(format!(
            "unknown event format version {version} (this build reads version {FORMAT_VERSION}); upgrade eve to read it"
        )));
    }
    let events: Vec<Event> =
        serde_json::from_slice(bytes).map_err(|e| corrupt(format!("undecodable events: {e}")))?;
    if events.len() != expected_count {
        return Err(corrupt(format!(
            "row holds {} events, its header says {expected_count}",
            events.len()
        )));
    }
    Ok(events)
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
        for (version, body, count) in [
            (FORMAT_VERSION + 1, &bytes[..], 2),
            (FORMAT_VERSION, &bytes[..bytes.len() - 3], 2),
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
}
