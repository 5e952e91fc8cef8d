//! Traces: W3C trace context for runs.
//!
//! A run joins its caller's trace when the call carried a W3C `traceparent` (the start route's
//! header, MCP's `_meta.traceparent`), or starts its own. The context is kept as the
//! `traceparent` of [`Event::RunStarted`](crate::Event::RunStarted).

use std::fmt;

/// A 16-byte W3C trace id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceId(pub [u8; 16]);

/// An 8-byte W3C span id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpanId(pub [u8; 8]);

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        hex(f, &self.0)
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        hex(f, &self.0)
    }
}

fn hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    for b in bytes {
        write!(f, "{b:02x}")?;
    }
    Ok(())
}

/// A W3C trace context: which trace a span belongs to and which span is the parent of the
/// next one. [`Display`](fmt::Display) writes the `traceparent` header value
/// (`00-{trace id}-{span id}-{flags}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceContext {
    /// The trace.
    pub trace_id: TraceId,
    /// The span the next one is a child of.
    pub span_id: SpanId,
    /// The trace flags; bit 0 is "sampled".
    pub flags: u8,
}

impl TraceContext {
    /// Parses a `traceparent` header value (W3C Trace Context level 1): version `00` exactly
    /// as specified, a later version by its first four fields; all-zero ids and upper-case hex
    /// are invalid. `None` for anything malformed: a caller's bad header never fails a call,
    /// the run starts its own trace instead.
    pub fn parse(value: &str) -> Option<Self> {
        let v = value.trim().as_bytes();
        if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
            return None;
        }
        let version = unhex::<1>(&v[0..2])?[0];
        if version == 0xff
            || (version == 0 && v.len() != 55)
            || (version != 0 && v.len() > 55 && v[55] != b'-')
        {
            return None;
        }
        let trace_id = TraceId(unhex::<16>(&v[3..35])?);
        let span_id = SpanId(unhex::<8>(&v[36..52])?);
        let flags = unhex::<1>(&v[53..55])?[0];
        if trace_id.0 == [0; 16] || span_id.0 == [0; 8] {
            return None;
        }
        Some(TraceContext {
            trace_id,
            span_id,
            flags,
        })
    }

    /// Whether the caller sampled the trace (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            self.trace_id, self.span_id, self.flags
        )
    }
}

/// Lower-case hex only, as the W3C grammar says.
fn unhex<const N: usize>(s: &[u8]) -> Option<[u8; N]> {
    if s.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = digit(s[2 * i])? << 4 | digit(s[2 * i + 1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_and_bad_values_are_none() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let c = TraceContext::parse(tp).unwrap();
        assert_eq!(c.to_string(), tp);
        assert!(c.sampled());
        assert_eq!(c.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        // A later version may append fields.
        assert!(TraceContext::parse(&format!("01{}-extra", &tp[2..])).is_some());
        for bad in [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad:?}");
        }
    }
}
