//! End to end: the real `eve serve` (the examples' app with a `release` tool) exports a run's
//! spans over OTLP/HTTP to a receiver in this test. The run has two steps, one failing once
//! and retried, and an ask answered after the server was killed (SIGKILL) and restarted: the
//! spans received from both processes form one tree under the caller's `traceparent`, with the
//! right parents, names and times, and none twice.

use eve_core::{Event, JournalStore, JournalStoreExt, RunId, RunStatus};
use eve_storage_sqlite::SqliteStore;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const EVE: &str = env!("CARGO_BIN_EXE_eve_traced");
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const WAIT: Duration = Duration::from_secs(90);

/// Spans received, with the `service.name` of the resource that sent them.
type Received = Arc<Mutex<Vec<(String, Span)>>>;

/// An OTLP/HTTP traces receiver on 127.0.0.1:0; returns its base URL.
async fn receiver(spans: Received) -> String {
    use axum::routing::post;
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: axum::body::Bytes| {
            let spans = spans.clone();
            async move {
                let req = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                let mut got = spans.lock().unwrap();
                for rs in req.resource_spans {
                    let service = rs
                        .resource
                        .iter()
                        .flat_map(|r| &r.attributes)
                        .find(|kv| kv.key == "service.name")
                        .and_then(|kv| kv.value.as_ref())
                        .map(|v| format!("{:?}", v.value))
                        .unwrap_or_default();
                    for ss in rs.scope_spans {
                        for s in ss.spans {
                            got.push((service.clone(), s));
                        }
                    }
                }
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// `eve_traced serve` in `dir`, its output lines on a channel; killed (SIGKILL) when dropped.
struct Served {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Served {
    fn start(dir: &Path, otlp: &str) -> Self {
        let mut child = Command::new(EVE)
            .args(["serve", "--listen", "127.0.0.1:0", "--insecure-no-auth"])
            .args(["--otlp", otlp])
            .current_dir(dir)
            .env_remove("EVE_STORE_URL")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            // Export each batch within 50 ms: what the first process ended is received before
            // it is killed.
            .env("OTEL_BSP_SCHEDULE_DELAY", "50")
            .env("OTEL_SERVICE_NAME", "eve-trace-test")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn eve serve");
        let (tx, lines) = mpsc::channel();
        for out in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        Self { child, lines }
    }

    /// The base URL the server printed.
    fn base(&mut self) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let line = self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("eve serve prints where it listens");
            if let Some(url) = line.split("listening on ").nth(1) {
                return url.split('/').take(3).collect::<Vec<_>>().join("/");
            }
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A POST with a JSON body and extra header lines; returns (status, body).
fn post(base: &str, path: &str, headers: &str, body: &str) -> (u16, String) {
    let host = base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(host).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

/// Waits until `ready` holds for the spans received, within [`WAIT`].
async fn received_until(spans: &Received, what: &str, ready: impl Fn(&[Span]) -> bool) {
    let deadline = Instant::now() + WAIT;
    loop {
        let now: Vec<Span> = spans
            .lock()
            .unwrap()
            .iter()
            .map(|(_, s)| s.clone())
            .collect();
        if ready(&now) {
            return;
        }
        let names: Vec<&str> = now.iter().map(|s| s.name.as_str()).collect();
        assert!(Instant::now() < deadline, "{what}: received only {names:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn count(spans: &[Span], name: &str) -> usize {
    spans.iter().filter(|s| s.name == name).count()
}

fn attr<'a>(s: &'a Span, key: &str) -> Option<&'a AnyValue> {
    s.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn nanos(t: eve_core::Timestamp) -> u64 {
    t.millis() as u64 * 1_000_000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_across_a_kill_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let spans: Received = Arc::default();
    let otlp = receiver(spans.clone()).await;

    let mut first = Served::start(d, &otlp);
    let base = first.base();
    let (status, body) = post(
        &base,
        "/v1/tools/release/calls",
        &format!("traceparent: 00-{CALLER_TRACE}-{CALLER_SPAN}-01\r\n"),
        r#"{"session": "s", "callId": "c1", "input": {"service": "api"}}"#,
    );
    assert_eq!(status, 201, "{body}");
    let run: serde_json::Value = serde_json::from_str(&body).unwrap();
    let run = RunId::new(run["run"]["runId"].as_str().unwrap());

    // The first process builds, pushes twice (a retry), asks, suspends: its spans arrive.
    received_until(&spans, "the first process's spans", |s| {
        count(s, "step build") == 1
            && count(s, "step push_image") == 2
            && s.iter().any(|s| {
                s.name == "activation"
                    && matches!(attr(s, "eve.activation.outcome"), Some(AnyValue::StringValue(o)) if o == "suspended")
                    && s.start_time_unix_nano > 0
            })
            && s.iter().filter(|s| s.name == "activation").count() >= 2
    })
    .await;
    let store = SqliteStore::open(d.join("eve.db")).await.unwrap();
    let request = store
        .read_all(&run, 0)
        .await
        .unwrap()
        .into_iter()
        .find_map(|e| match e.event {
            Event::InputRequested { request_id, .. } => Some(request_id),
            _ => None,
        })
        .expect("the run asks");
    // Killed (SIGKILL) while the ask is pending; restarted on the same store.
    drop(first);
    let killed_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let before_restart = spans.lock().unwrap().len();
    let mut second = Served::start(d, &otlp);
    let base = second.base();
    let (status, body) = post(
        &base,
        &format!("/v1/requests/{request}/answer"),
        "",
        r#"{"optionId": "approve"}"#,
    );
    assert!(status == 200 || status == 201, "{status} {body}");
    received_until(&spans, "the root span", |s| {
        count(s, "execute_tool release") == 1
    })
    .await;
    let journal = store.read_all(&run, 0).await.unwrap();
    assert_eq!(
        store.get_run(&run).await.unwrap().status,
        RunStatus::Completed
    );
    drop(second);

    let all: Vec<Span> = spans
        .lock()
        .unwrap()
        .iter()
        .map(|(_, s)| s.clone())
        .collect();
    let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
    assert!(
        spans
            .lock()
            .unwrap()
            .iter()
            .all(|(svc, _)| svc.contains("eve-trace-test")),
        "OTEL_SERVICE_NAME names the resource"
    );
    // None twice, though the second process replayed everything the first had done.
    let ids: HashSet<&[u8]> = all.iter().map(|s| s.span_id.as_slice()).collect();
    assert_eq!(ids.len(), all.len(), "a span twice: {names:?}");
    assert!(
        all.len() > before_restart,
        "the second process reported its part"
    );
    for (name, n) in [
        ("execute_tool release", 1),
        ("step build", 1),
        ("step push_image", 2),
        ("ask", 1),
        ("step roll_out", 1),
    ] {
        assert_eq!(count(&all, name), n, "{name} in {names:?}");
    }
    // One tree: every span in the caller's trace, the root under the caller's span, the rest
    // under the root.
    assert!(
        all.iter().all(|s| hex(&s.trace_id) == CALLER_TRACE),
        "{names:?}"
    );
    let root = all
        .iter()
        .find(|s| s.name == "execute_tool release")
        .unwrap();
    assert_eq!(hex(&root.parent_span_id), CALLER_SPAN);
    for s in all.iter().filter(|s| s.span_id != root.span_id) {
        assert_eq!(
            s.parent_span_id, root.span_id,
            "{} is not under the root",
            s.name
        );
        assert!(
            s.start_time_unix_nano >= root.start_time_unix_nano
                && s.end_time_unix_nano <= root.end_time_unix_nano
                && s.start_time_unix_nano <= s.end_time_unix_nano,
            "{} outside the root",
            s.name
        );
    }
    assert_eq!(root.start_time_unix_nano, nanos(journal[0].at));
    assert_eq!(root.end_time_unix_nano, nanos(journal.last().unwrap().at));
    // The retried attempt says so, with its delay: from the failure's record to the retry's
    // due time, as journaled. The engine sets `retry_at` to 200 ms after the attempt ended and
    // the append stamps the event a moment later, so it is at most 200 ms.
    let failed = all
        .iter()
        .find(|s| s.name == "step push_image" && attr(s, "eve.step.retry_delay_ms").is_some())
        .expect("the failed attempt");
    let journaled = journal
        .iter()
        .find_map(|e| match &e.event {
            Event::StepFailed {
                retry_at: Some(r), ..
            } => Some(r.millis() - e.at.millis()),
            _ => None,
        })
        .expect("the failed attempt in the journal");
    assert!(0 < journaled && journaled <= 200, "{journaled} ms");
    assert_eq!(
        attr(failed, "eve.step.retry_delay_ms"),
        Some(&AnyValue::IntValue(journaled))
    );
    assert_eq!(
        attr(failed, "eve.step.outcome"),
        Some(&AnyValue::StringValue("retry".into()))
    );
    // The ask spans the kill: asked by the first process, answered after the restart.
    let ask = all.iter().find(|s| s.name == "ask").unwrap();
    assert!(ask.start_time_unix_nano < killed_at && ask.end_time_unix_nano > killed_at);
    let asked = journal
        .iter()
        .find(|e| matches!(e.event, Event::InputRequested { .. }))
        .unwrap();
    assert_eq!(ask.start_time_unix_nano, nanos(asked.at));
    assert_eq!(
        attr(root, "gen_ai.tool.name"),
        Some(&AnyValue::StringValue("release".into()))
    );
}
