//! How the CLI shows times, events and runs: one readable line per thing.

use eve_core::engine::GUARD_CMD;
use eve_core::{Event, RunRecord, StoredEvent, Timestamp};
use serde_json::Value;

/// `2026-12-03T16:23:26.123Z` (UTC, millisecond precision).
pub fn utc(t: Timestamp) -> String {
    let ms = t.millis();
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    let (h, rest) = (in_day / 3_600_000, in_day % 3_600_000);
    let (min, rest) = (rest / 60_000, rest % 60_000);
    let (s, milli) = (rest / 1000, rest % 1000);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{milli:03}Z")
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// One line for a journal event: `seq  time  Kind  field=value …`, values as compact JSON
/// (strings quoted). Fields come in a fixed order (the identifying ones — `cmd`, `name`, `key`,
/// `request_id`, `token` — first, the rest by name). Works for every variant, including ones
/// added after this was written, because it goes through the event's serde form.
pub fn event_line(e: &StoredEvent) -> String {
    format!("{:>5}  {}  {}", e.seq, utc(e.at), describe(&e.event))
}

/// The event without seq and time: `Kind  field=value …`. The engine's activation guard (a sleep
/// at [`GUARD_CMD`]) is shown as such rather than as a user sleep.
pub fn describe(event: &Event) -> String {
    match event {
        Event::SleepScheduled { cmd, wake_at } if *cmd == GUARD_CMD => {
            return format!(
                "{:<15} (activation guard until {})",
                event.kind(),
                utc(*wake_at)
            )
        }
        Event::SleepFired { cmd } if *cmd == GUARD_CMD => {
            return format!("{:<15} (activation guard cleared)", event.kind())
        }
        _ => {}
    }
    let kind = event.kind();
    let fields = match serde_json::to_value(event) {
        Ok(Value::Object(mut outer)) => outer.remove(kind).unwrap_or(Value::Null),
        _ => Value::Null,
    };
    let mut line = format!("{kind:<15}");
    if let Value::Object(map) = fields {
        let mut fields: Vec<(String, Value)> = map.into_iter().collect();
        fields.sort_by_key(|(k, _)| {
            (
                FIRST.iter().position(|f| f == k).unwrap_or(FIRST.len()),
                k.clone(),
            )
        });
        for (k, v) in fields {
            let shown = match (k.as_str(), &v) {
                ("wake_at" | "retry_at", Value::Number(n)) => n
                    .as_i64()
                    .map_or_else(|| v.to_string(), |ms| utc(Timestamp(ms))),
                _ => v.to_string(),
            };
            line.push(' ');
            line.push_str(&k);
            line.push('=');
            line.push_str(&shown);
        }
    }
    line.trim_end().to_owned()
}

/// Fields shown before the others, in this order.
const FIRST: [&str; 5] = ["cmd", "name", "key", "request_id", "token"];

/// Column headers for [`run_row`].
pub fn run_header() -> String {
    let header = format!(
        "{:<36}  {:<9}  {:<14}  {:<16}  {:>6}  {:<24}",
        "RUN", "STATUS", "TOOL", "SESSION", "EVENTS", "CREATED"
    );
    header.trim_end().to_owned()
}

/// One run as a table row.
pub fn run_row(r: &RunRecord) -> String {
    format!(
        "{:<36}  {:<9}  {:<14}  {:<16}  {:>6}  {:<24}",
        r.run_id.as_str(),
        r.status.as_str(),
        r.tool,
        r.session_id.as_str(),
        r.next_seq,
        utc(r.created_at)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use eve_core::{Payload, RequestId};

    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(utc(Timestamp(0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(Timestamp(951_782_400_000)), "2000-02-29T00:00:00.000Z");
        assert_eq!(
            utc(Timestamp(1_796_315_006_123)),
            "2026-12-03T16:23:26.123Z"
        );
        assert_eq!(utc(Timestamp(-1)), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn events_are_one_line_with_their_fields() {
        let e = StoredEvent {
            seq: 3,
            at: Timestamp(0),
            event: Event::StepCompleted {
                cmd: 1,
                name: "plan".into(),
                attempt: 1,
                output: Payload::from_json(r#"{"a": [1, 2]}"#).unwrap(),
            },
        };
        assert_eq!(
            event_line(&e),
            r#"    3  1970-01-01T00:00:00.000Z  StepCompleted   cmd=1 name="plan" attempt=1 output={"a":[1,2]}"#
        );
        assert_eq!(describe(&Event::RunCancelled), "RunCancelled");
        assert_eq!(
            describe(&Event::InputWithdrawn {
                request_id: RequestId::new("r:1")
            }),
            r#"InputWithdrawn  request_id="r:1""#
        );
        assert_eq!(
            describe(&Event::SleepScheduled {
                cmd: 2,
                wake_at: Timestamp(1000)
            }),
            "SleepScheduled  cmd=2 wake_at=1970-01-01T00:00:01.000Z"
        );
        assert_eq!(
            describe(&Event::SleepFired { cmd: GUARD_CMD }),
            "SleepFired      (activation guard cleared)"
        );
        let multi = describe(&Event::RunFailed {
            error: "line one\nline two".into(),
        });
        assert!(!multi.contains('\n'), "{multi}");
    }
}
