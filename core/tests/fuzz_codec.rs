//! The journal codec fuzzed (README, "Fuzzing"): arbitrary bytes, and arbitrary mutations of
//! valid event rows, decoded as a stored row. Never a panic; what decodes is usable: it
//! re-encodes to rows that decode to the same events, every payload parses as JSON, and every
//! event round-trips through its exported form (`StoredEvent` JSON).
//!
//! `EVE_FUZZ_CASES=N` sets the cases per test (default 2,000), `EVE_FUZZ_DEEP=1` runs a million.

use eve_core::codec::{decode_batch, encode_batch, FORMAT_VERSION};
use eve_core::{
    AgentReply, Event, Execution, InputRequest, InputResponse, Payload, RequestId, RunId,
    StoreError, StoredEvent, Timestamp, WebhookResponse,
};
use proptest::prelude::*;
use proptest::test_runner::Config;

/// Cases per test: `EVE_FUZZ_CASES`, else a million with `EVE_FUZZ_DEEP=1`, else `default`.
use eve_core::testing::fuzz_cases as cases;

fn config() -> Config {
    Config {
        cases: cases(2_000),
        failure_persistence: None,
        ..Config::default()
    }
}

fn p(json: &str) -> Payload {
    Payload::from_json(json).expect("sample JSON")
}

/// One event of every kind, with every optional field both set and unset somewhere.
fn samples() -> Vec<Event> {
    let run = RunId::new("run_1");
    vec![
        Event::RunStarted {
            workflow_id: "golden::ask".into(),
            deployment_id: "v1".into(),
            tool: "ask".into(),
            input: p(r#"{"label": "x", "n": [1, 2.5, -3e2, true, null]}"#),
            session_id: "s".into(),
            call_id: "c".into(),
            execution: Execution::Background,
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            reset_from: Some(eve_core::ResetFrom {
                run: RunId::new("run_0"),
                seq: 4,
            }),
        },
        Event::StepCompleted {
            cmd: 1,
            name: "step".into(),
            attempt: 1,
            output: p(r#""caf\u00e9 \ud83d\ude00""#),
        },
        Event::StepFailed {
            cmd: 2,
            name: "step".into(),
            attempt: 2,
            error: "boom".into(),
            fatal: false,
            retry_at: Some(Timestamp(5)),
        },
        Event::SleepScheduled {
            cmd: 3,
            wake_at: Timestamp(1_000),
        },
        Event::SleepFired { cmd: 3 },
        Event::HookCreated {
            cmd: 4,
            token: "wh_abc".into(),
            webhook: true,
            respond_with: Some(WebhookResponse::json(serde_json::json!({"ok": true}))),
        },
        Event::HookReceived {
            cmd: 4,
            payload: p("{}"),
        },
        Event::InputRequested {
            cmd: 5,
            request_id: RequestId::for_command(&run, 5),
            request: InputRequest::confirmation("Ship?"),
        },
        Event::InputAnswered {
            request_id: RequestId::for_command(&run, 5),
            response: InputResponse::option("approve").by("ops"),
        },
        Event::InputAnswered {
            request_id: RequestId::for_command(&run, 6),
            response: InputResponse {
                agent: Some(AgentReply::Output(serde_json::json!({"a": 1}))),
                ..InputResponse::default()
            },
        },
        Event::InputWithdrawn {
            request_id: RequestId::for_command(&run, 7),
        },
        Event::AgentStarted {
            cmd: 8,
            key: "k".into(),
            target: "helper".into(),
            agent_id: None,
        },
        Event::AgentCompleted {
            key: "k".into(),
            output: p("[1]"),
        },
        Event::AgentFailed {
            key: "k".into(),
            error: "no".into(),
        },
        Event::Progress {
            cmd: 9,
            value: p("0.5"),
        },
        Event::MessagePosted {
            cmd: 10,
            message: p(r#"{"text": "hi"}"#),
        },
        Event::Patched {
            cmd: 11,
            id: "fix".into(),
        },
        Event::CancelRequested {
            reason: "stop".into(),
        },
        Event::RunBlocked {
            reason: "[EVE0001]".into(),
        },
        Event::RunResumed,
        Event::RunCompleted { output: p("null") },
        Event::RunFailed {
            error: "failed".into(),
        },
        Event::RunCancelled,
        Event::RunDenied {
            reason: "no".into(),
        },
    ]
}

fn payloads(e: &Event) -> Vec<&Payload> {
    match e {
        Event::RunStarted { input: p, .. }
        | Event::StepCompleted { output: p, .. }
        | Event::HookReceived { payload: p, .. }
        | Event::AgentCompleted { output: p, .. }
        | Event::Progress { value: p, .. }
        | Event::MessagePosted { message: p, .. }
        | Event::RunCompleted { output: p } => vec![p],
        _ => Vec::new(),
    }
}

/// What a decoded row must be: usable everywhere later.
fn check_accepted(events: &[Event]) -> Result<(), TestCaseError> {
    let again = encode_batch(events).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let back =
        decode_batch(&RunId::new("r"), 0, FORMAT_VERSION, &again, events.len()).map_err(|e| {
            TestCaseError::fail(format!(
                "an accepted row re-encodes to one that does not decode: {e}"
            ))
        })?;
    prop_assert_eq!(&back, events);
    for (i, e) in events.iter().enumerate() {
        for p in payloads(e) {
            p.to_value::<serde_json::Value>().map_err(|err| {
                TestCaseError::fail(format!("an accepted payload {p:?} does not parse: {err}"))
            })?;
        }
        let stored = StoredEvent {
            seq: i as u64,
            at: Timestamp(0),
            event: e.clone(),
        };
        let line =
            serde_json::to_string(&stored).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let read: StoredEvent = serde_json::from_str(&line).map_err(|err| {
            TestCaseError::fail(format!(
                "an accepted event does not round-trip as exported: {err}: {line}"
            ))
        })?;
        prop_assert_eq!(read, stored);
    }
    Ok(())
}

/// Bits of JSON a mutation splices in: values that parse as raw JSON but not as data (a number
/// out of range, a lone surrogate), unknown fields and events, structure.
const TOKENS: &[&str] = &[
    "e999",
    r"\ud800",
    r"\udfff",
    "1e999",
    "-1e999",
    r#""\ud800""#,
    r#""\udc00x""#,
    r#","extra":1"#,
    r#"{"Unknown":{}}"#,
    "null",
    "{}",
    "[]",
    "\"",
    "\\",
    ",",
    ":",
    "0",
    "-",
    "\u{0}",
    "\u{ff}",
];

#[derive(Debug, Clone)]
enum Mutation {
    Set(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Splice(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => any::<usize>().prop_map(Mutation::Delete),
        4 => (any::<usize>(), 0..TOKENS.len()).prop_map(|(i, t)| Mutation::Splice(i, t)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let at = |i: usize, len: usize| if len == 0 { 0 } else { i % (len + 1) };
    match *m {
        Mutation::Set(i, b) if !bytes.is_empty() => {
            let n = bytes.len();
            bytes[i % n] = b;
        }
        Mutation::Insert(i, b) => {
            let i = at(i, bytes.len());
            bytes.insert(i, b);
        }
        Mutation::Delete(i) if !bytes.is_empty() => {
            let n = bytes.len();
            bytes.remove(i % n);
        }
        Mutation::Splice(i, t) => {
            let i = at(i, bytes.len());
            bytes.splice(i..i, TOKENS[t].bytes());
        }
        _ => {}
    }
}

/// Decodes a row: never a panic; an error is `Corrupt` or `FormatTooNew`; a success is usable.
fn decode(version: u16, bytes: &[u8], count: usize) -> Result<(), TestCaseError> {
    match decode_batch(&RunId::new("r"), 7, version, bytes, count) {
        Ok(events) => check_accepted(&events),
        Err(StoreError::Corrupt { seq: 7, .. }) => Ok(()),
        Err(StoreError::FormatTooNew { seq: 7, .. }) if version > FORMAT_VERSION => Ok(()),
        Err(other) => Err(TestCaseError::fail(format!(
            "unexpected error kind: {other:?}"
        ))),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_decode_or_are_refused(
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
        version in 0u16..4,
        count in 0usize..4,
    ) {
        decode(version, &bytes, count)?;
    }

    #[test]
    fn mutated_rows_decode_or_are_refused(
        picks in proptest::collection::vec(any::<prop::sample::Index>(), 1..6),
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        let all = samples();
        let events: Vec<Event> = picks.iter().map(|i| i.get(&all).clone()).collect();
        let mut bytes = encode_batch(&events).expect("samples encode");
        decode(FORMAT_VERSION, &bytes, events.len())?;
        // Each step's row is decoded: a mutation that keeps the row valid JSON is rarely
        // followed by another that does too.
        for m in &mutations {
            apply(&mut bytes, m);
            decode(FORMAT_VERSION, &bytes, events.len())?;
        }
    }
}

/// The two values the fuzzer found accepted by the raw codec and failing later are refused
/// where a payload is made and where a row is decoded.
#[test]
fn out_of_range_numbers_and_lone_surrogates_are_refused() {
    // Decoding skips the second parse of a payload with no escape, no exponent and no run of
    // 300 digits: each kind of refusal must still reach it.
    let digits = "9".repeat(400);
    for bad in [
        "1e999",
        "[-1e400]",
        "2.5E+999",
        r#""\ud800""#,
        r#"{"a": "x\udfff"}"#,
        &digits,
    ] {
        assert!(
            Payload::from_json(bad).is_err(),
            "Payload::from_json({bad}) must refuse it"
        );
        let row = format!(r#"[{{"Progress":{{"cmd":1,"value":{bad}}}}}]"#);
        match decode_batch(&RunId::new("r"), 0, FORMAT_VERSION, row.as_bytes(), 1) {
            Err(StoreError::Corrupt { .. }) => {}
            other => panic!("a row holding {bad} must be Corrupt, got {other:?}"),
        }
    }
    for good in [
        "1e300",
        r#""\ud83d\ude00""#,
        "-0.0",
        "123456789012345678901234567890",
    ] {
        Payload::from_json(good).unwrap_or_else(|e| panic!("{good} is a payload: {e}"));
    }
    // What the scan lets through decodes and parses: exponents only ever follow digits, and an
    // `e` inside a string or a keyword is none.
    for good in [
        "true",
        "[false, 1.5, -2]",
        r#"{"e": "1e999", "E9": 7}"#,
        r#""ude800""#,
        "1e300",
        &"9".repeat(299),
    ] {
        let row = format!(r#"[{{"Progress":{{"cmd":1,"value":{good}}}}}]"#);
        let events = decode_batch(&RunId::new("r"), 0, FORMAT_VERSION, row.as_bytes(), 1)
            .unwrap_or_else(|e| panic!("a row holding {good} decodes: {e}"));
        let Event::Progress { value, .. } = &events[0] else {
            panic!("a Progress event")
        };
        assert_eq!(value.get(), good);
        value
            .to_value::<serde_json::Value>()
            .unwrap_or_else(|e| panic!("{good} parses: {e}"));
    }
}
