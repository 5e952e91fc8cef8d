//! The app end to end through its binary: create a key, serve, list the tools and start a call
//! over HTTP, answer its approval from the command line, and get the settled result.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const APP: &str = env!("CARGO_BIN_EXE_my-eve");

fn app(store: &str, args: &[&str]) -> String {
    let out = Command::new(APP)
        .args(args)
        .args(["--store", store])
        .output()
        .expect("run my-eve");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "my-eve {args:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// One HTTP/1.1 request on loopback with a bearer key; (status, JSON body).
fn http(base: &str, key: &str, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let host = base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(host).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp.split_whitespace().nth(1).unwrap().parse().unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, serde_json::from_str(&body).unwrap_or_default())
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = &rest[n + 2..];
    }
    out
}

struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn serve_call_answer_settle() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("app.db").display());
    let key = app(
        &store,
        &["keys", "create", "--name", "agent", "--scope", "operate"],
    );
    let key = key.lines().next().unwrap().trim().to_owned();
    assert!(key.starts_with("eve_"), "{key}");

    let mut child = Command::new(APP)
        .args(["serve", "--listen", "127.0.0.1:0", "--store", &store])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let _served = Served(child);
    let base = loop {
        let line = lines
            .next()
            .expect("my-eve serve printed no address")
            .unwrap();
        if let Some(url) = line.split("listening on ").nth(1) {
            break url.split('/').take(3).collect::<Vec<_>>().join("/");
        }
    };

    let (status, tools) = http(&base, &key, "GET", "/v1/tools", "");
    assert_eq!(status, 200, "{tools}");
    assert_eq!(tools["tools"][0]["name"], "refund");
    assert!(tools["tools"][0]["description"]
        .as_str()
        .unwrap()
        .starts_with("Refund an order."));

    let call = r#"{"session":"s1","callId":"c1","input":{"order":"A-17","amount_cents":1250}}"#;
    let (status, started) = http(&base, &key, "POST", "/v1/tools/refund/calls", call);
    assert_eq!(status, 201, "{started}");
    let run = started["run"]["runId"].as_str().unwrap().to_owned();

    // The body asks; a person answers from the command line.
    let deadline = Instant::now() + Duration::from_secs(60);
    let request = loop {
        let (_, pending) = http(&base, &key, "GET", "/v1/sessions/s1/requests", "");
        if let Some(id) = pending["requests"][0]["requestId"].as_str() {
            assert!(pending["requests"][0]["request"]["prompt"]
                .as_str()
                .unwrap()
                .contains("12.50 USD"));
            break id.to_owned();
        }
        assert!(Instant::now() < deadline, "nothing was asked: {pending}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(app(&store, &["answer", &request, "approve"]).contains("answered"));

    // A retry of the same call waits for and returns the settled result.
    let (status, settled) = http(&base, &key, "POST", "/v1/tools/refund/calls?wait=60s", call);
    assert_eq!(status, 200, "{settled}");
    assert_eq!(settled["run"]["runId"], run.as_str());
    assert_eq!(settled["settled"]["status"], "completed", "{settled}");
    assert_eq!(settled["settled"]["output"]["refunded"], true);
    assert_eq!(settled["settled"]["output"]["receipt"], "rf_A-17_1250");
    let journal = app(&store, &["journal", &run]);
    assert_eq!(journal.matches("StepCompleted").count(), 2, "{journal}");
}
