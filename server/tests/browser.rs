//! The page in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`)
//! driven over WebDriver opens the page, sees the deploy request rendered with its styled
//! buttons, rides out a server restart, clicks Approve and sees the run complete, with its
//! journal.
//!
//! Skipped, loudly, when /usr/bin/chromium or /usr/bin/chromedriver is missing (CI installs
//! both). Screenshots of the main views go to `$CARGO_TARGET_DIR/tmp/eve-page-screenshots/`
//! (or `EVE_BROWSER_SCREENSHOTS=DIR`).

mod common;

use common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, BufReader};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A WebDriver session on a chromedriver this test started (killed when dropped).
struct Browser {
    http: reqwest::Client,
    session: String,
    _driver: tokio::process::Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn start() -> Self {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
            l.local_addr().unwrap().port()
        };
        let mut driver = tokio::process::Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromedriver");
        // chromedriver says on stdout when it listens.
        let mut lines = BufReader::new(driver.stdout.take().unwrap()).lines();
        tokio::time::timeout(WAIT, async {
            while let Some(line) = lines.next_line().await.expect("chromedriver stdout") {
                if line.contains("started successfully") {
                    return;
                }
            }
            panic!("chromedriver exited before it was ready");
        })
        .await
        .expect("chromedriver ready in time");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

        let profile = tempfile::tempdir().expect("profile dir");
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--window-size=1200,900",
                    format!("--user-data-dir={}", profile.path().display()),
                ]
            }
        }}});
        let resp: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .expect("new WebDriver session")
            .json()
            .await
            .unwrap();
        let id = resp["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {resp}"))
            .to_owned();
        let browser = Self {
            http,
            session: format!("{base}/session/{id}"),
            _driver: driver,
            _profile: profile,
        };
        // Element look-ups wait (in the browser) until the element appears.
        browser
            .cmd(
                "POST",
                "/timeouts",
                json!({ "implicit": WAIT.as_millis() as u64 }),
            )
            .await;
        browser
    }

    async fn cmd(&self, method: &str, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.session);
        let req = match method {
            "GET" => self.http.get(url),
            "DELETE" => self.http.delete(url),
            _ => self.http.post(url).json(&body),
        };
        let resp = req.send().await.expect("WebDriver call");
        let ok = resp.status().is_success();
        let v: Value = resp.json().await.expect("WebDriver JSON");
        assert!(ok, "WebDriver {method} {path} failed: {v}");
        v["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.cmd("POST", "/url", json!({ "url": url })).await;
    }

    /// Waits for the first element matching the CSS selector.
    async fn find(&self, css: &str) -> String {
        self.find_by("css selector", css).await
    }

    async fn find_by(&self, using: &str, value: &str) -> String {
        let v = self
            .cmd(
                "POST",
                "/element",
                json!({ "using": using, "value": value }),
            )
            .await;
        v[ELEMENT].as_str().expect("element id").to_owned()
    }

    async fn click(&self, element: &str) {
        self.cmd("POST", &format!("/element/{element}/click"), json!({}))
            .await;
    }

    async fn type_into(&self, element: &str, text: &str) {
        self.cmd(
            "POST",
            &format!("/element/{element}/value"),
            json!({ "text": text }),
        )
        .await;
    }

    async fn text(&self, element: &str) -> String {
        self.cmd("GET", &format!("/element/{element}/text"), Value::Null)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    async fn attr(&self, element: &str, name: &str) -> String {
        self.cmd(
            "GET",
            &format!("/element/{element}/attribute/{name}"),
            Value::Null,
        )
        .await
        .as_str()
        .unwrap_or_default()
        .to_owned()
    }

    async fn screenshot(&self, name: &str) {
        // Under the target directory unless EVE_BROWSER_SCREENSHOTS names another.
        let dir = std::env::var("EVE_BROWSER_SCREENSHOTS").unwrap_or_else(|_| {
            concat!(env!("CARGO_TARGET_TMPDIR"), "/eve-page-screenshots").to_owned()
        });
        std::fs::create_dir_all(&dir).expect("screenshot directory");
        let png = self.cmd("GET", "/screenshot", Value::Null).await;
        let bytes = base64_decode(png.as_str().unwrap());
        std::fs::write(Path::new(&dir).join(name), bytes).expect("write screenshot");
    }

    async fn quit(self) {
        self.cmd("DELETE", "", Value::Null).await;
    }
}

/// Standard base64 (what WebDriver screenshots use), decoded without another dependency.
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            b'/' => 63,
            _ => 0,
        }
    };
    let clean: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    let mut out = Vec::with_capacity(clean.len() / 4 * 3);
    // WebDriver's base64 is padded, so every chunk has four characters.
    for chunk in clean.chunks(4) {
        let n = chunk.iter().fold(0u32, |acc, &c| (acc << 6) | val(c));
        let pad = chunk.iter().filter(|&&c| c == b'=').count();
        out.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8][..3 - pad]);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clicking_approve_in_chromium_completes_the_run() {
    for bin in [CHROMIUM, CHROMEDRIVER] {
        if !Path::new(bin).exists() {
            eprintln!(
                "SKIPPED clicking_approve_in_chromium_completes_the_run: {bin} is missing; \
                 install Debian's chromium and chromium-driver (CI does: see .ci/run)"
            );
            return;
        }
    }
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let keys_on = |c: &mut eve_server::ServerConfig| c.insecure_no_auth = false;
    let server = TestServer::start(store.clone(), keys_on).await;
    let key = eve_server::create_key(
        &*store,
        "browser",
        eve_core::KeyScope::Answer,
        eve_core::Timestamp::now(),
    )
    .await
    .expect("create key");
    let run = start(
        &store,
        "s-browser",
        "call-1",
        "deploy",
        json!({ "service": "web" }),
    )
    .await;
    // A background refund in the same session renders as a select with free text.
    let refund = start(
        &store,
        "s-browser",
        "call-2",
        "refund_order",
        json!({ "order_id": "o-9" }),
    )
    .await;

    let browser = Browser::start().await;
    browser.goto(&server.url("/?session=s-browser")).await;
    // The page asks for a key first, and signs in with it (an HttpOnly cookie).
    let input = browser.find("#signin:not([hidden]) #key").await;
    browser.type_into(&input, &key.text).await;
    let submit = browser.find("#signin-submit").await;
    browser.click(&submit).await;

    let approve = browser.find(r#"button[data-option="approve"]"#).await;
    let cancel = browser.find(r#"button[data-option="cancel"]"#).await;
    assert_eq!(browser.text(&approve).await, "Deploy");
    assert!(browser
        .attr(&approve, "class")
        .await
        .contains("style-primary"));
    assert!(browser
        .attr(&cancel, "class")
        .await
        .contains("style-danger"));
    let prompt = browser
        .find(&format!(r#".card[data-request^="{run}"] .prompt"#))
        .await;
    let prompt = browser.text(&prompt).await;
    assert!(prompt.starts_with("Deploy web?"), "{prompt:?}");
    // The select request shows its options as choices and a free-text field.
    browser
        .find(r#"input[type="radio"][data-option="deny"]"#)
        .await;
    browser.find(r#"input[data-text="freeform"]"#).await;
    browser.screenshot("page-before.png").await;

    // The server restarts while the page is open: the page reconnects its channel (with
    // Last-Event-ID) and the click goes to the new server.
    let addr = server.addr;
    server.stop().await;
    let server = TestServer::start_on(addr, store.clone(), keys_on).await;
    browser.find("#conn.live").await;

    browser.click(&approve).await;

    // The answer comes back on the reconnected channel, which resumed after the last event it
    // had: the requests asked before the restart are not replayed.
    browser
        .find_by(
            "xpath",
            r#"//div[@id="log"]/div[contains(., " input.answered ")]"#,
        )
        .await;
    let asked = browser
        .cmd(
            "POST",
            "/execute/sync",
            json!({
                "script": "return [...document.querySelectorAll('#log div')].filter(d => d.textContent.includes(' input.requested ')).length",
                "args": []
            }),
        )
        .await;
    assert_eq!(
        asked,
        json!(2),
        "each request logged once across the restart"
    );

    // The run list shows the run completed, live.
    browser
        .find(&format!(r#"tr[data-run="{run}"] td.status-completed"#))
        .await;
    // Its journal opens on a click and ends with RunCompleted.
    let row = browser.find(&format!(r#"tr[data-run="{run}"]"#)).await;
    browser.click(&row).await;
    browser
        .find_by(
            "xpath",
            &format!(
                r#"//tr[@data-journal="{run}"]//li[starts-with(., "RunCompleted") and contains(., "deploy.example")]"#
            ),
        )
        .await;
    browser.screenshot("page-after.png").await;

    let record = store.get_run(&run).await.unwrap();
    assert_eq!(record.status, eve_core::RunStatus::Completed);
    let output = journal(&store, &run)
        .await
        .into_iter()
        .find_map(|e| match e.event {
            eve_core::Event::RunCompleted { output } => Some(output.to_value::<Value>().unwrap()),
            _ => None,
        })
        .unwrap();
    assert_eq!(output["deployed"], true);
    assert_eq!(
        store.get_run(&refund).await.unwrap().status,
        eve_core::RunStatus::Running,
        "the other request is untouched"
    );

    browser.quit().await;
    worker.shutdown().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tab_answers_the_7th_and_8th_of_eight_sessions() {
    for bin in [CHROMIUM, CHROMEDRIVER] {
        if !Path::new(bin).exists() {
            eprintln!(
                "SKIPPED one_tab_answers_the_7th_and_8th_of_eight_sessions: {bin} is missing; \
                 install Debian's chromium and chromium-driver (CI does: see .ci/run)"
            );
            return;
        }
    }
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let server = TestServer::start(store.clone(), |_| {}).await;
    let mut runs = Vec::new();
    for i in 1..=8 {
        let run = start(
            &store,
            &format!("s-tab-{i}"),
            "call-1",
            "deploy",
            json!({ "service": format!("svc-{i}") }),
        )
        .await;
        runs.push(run);
    }
    let browser = Browser::start().await;
    // No ?session=: the page follows every session with a live run, all on one connection.
    browser.goto(&server.url("/")).await;
    for run in &runs {
        browser
            .find(&format!(
                r#".card[data-request^="{run}"] button[data-option="approve"]"#
            ))
            .await;
    }
    browser.find("#conn.live").await;
    // Grouped by session; the search narrows the cards to one session's.
    browser
        .find(r#"#requests .group[data-session="s-tab-8"] .card"#)
        .await;
    let search = browser.find("#req-q").await;
    browser.type_into(&search, "svc-3").await;
    let visible = browser
        .cmd(
            "POST",
            "/execute/sync",
            json!({
                "script": "return [...document.querySelectorAll('#requests .card')].filter(c => !c.hidden).map(c => c.closest('.group').dataset.session)",
                "args": []
            }),
        )
        .await;
    assert_eq!(visible, json!(["s-tab-3"]), "the search finds one card");
    browser
        .cmd("POST", &format!("/element/{search}/clear"), json!({}))
        .await;
    browser
        .cmd(
            "POST",
            "/execute/sync",
            json!({ "script": "filterRequests(); return true", "args": [] }),
        )
        .await;
    // The channel log is fed only by the stream: every session's ask arrived on it.
    for i in 1..=8 {
        browser
            .find_by(
                "xpath",
                &format!(r#"//div[@id="log"]/div[starts-with(., "s-tab-{i} ") and contains(., " input.requested ")]"#),
            )
            .await;
    }
    browser.screenshot("page-eight-sessions.png").await;
    for run in &runs[6..] {
        let approve = browser
            .find(&format!(
                r#".card[data-request^="{run}"] button[data-option="approve"]"#
            ))
            .await;
        browser.click(&approve).await;
    }
    // The answers land and both runs complete, seen live on the page and on the stream.
    for i in 7..=8 {
        browser
            .find_by(
                "xpath",
                &format!(r#"//div[@id="log"]/div[starts-with(., "s-tab-{i} ") and contains(., " tool.settled ")]"#),
            )
            .await;
    }
    for run in &runs[6..] {
        browser
            .find(&format!(r#"tr[data-run="{run}"] td.status-completed"#))
            .await;
        assert_eq!(
            store.get_run(run).await.unwrap().status,
            eve_core::RunStatus::Completed
        );
    }
    for run in &runs[..6] {
        assert_eq!(
            store.get_run(run).await.unwrap().status,
            eve_core::RunStatus::Running,
            "the other sessions' requests are untouched"
        );
    }
    // Filters narrow the runs table in the server; the chips count by status.
    browser
        .find(r#"#counts span[data-count="completed"]"#)
        .await;
    let option = browser
        .find_by(
            "xpath",
            r#"//select[@id="f-status"]/option[text()="completed"]"#,
        )
        .await;
    browser.click(&option).await;
    let rows = browser
        .cmd(
            "POST",
            "/execute/async",
            json!({
                "script": "const done = arguments[0]; const t = Date.now(); (function poll() { const n = document.querySelectorAll('#runs tr.run').length; if (n === 2 || Date.now() - t > 10000) done(n); else setTimeout(poll, 50); })();",
                "args": []
            }),
        )
        .await;
    assert_eq!(rows, json!(2), "only the two completed runs are listed");
    let chip = browser
        .find(r#"#counts span[data-count="completed"]"#)
        .await;
    assert_eq!(browser.text(&chip).await, "completed 2");
    browser.screenshot("page-filtered.png").await;
    let sources = browser
        .cmd(
            "POST",
            "/execute/sync",
            json!({
                "script": "return performance.getEntriesByType('resource').filter(e => e.name.includes('/events')).map(e => e.name)",
                "args": []
            }),
        )
        .await;
    assert!(
        sources
            .as_array()
            .unwrap()
            .iter()
            .all(|u| u.as_str().unwrap().contains("/v1/events?")),
        "only the multiplexed stream is used: {sources}"
    );
    browser.quit().await;
    worker.shutdown().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeline_and_operator_actions_from_the_page() {
    for bin in [CHROMIUM, CHROMEDRIVER] {
        if !Path::new(bin).exists() {
            eprintln!(
                "SKIPPED timeline_and_operator_actions_from_the_page: {bin} is missing; \
                 install Debian's chromium and chromium-driver (CI does: see .ci/run)"
            );
            return;
        }
    }
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let server = TestServer::start(store.clone(), |_| {}).await;
    let broken = start(
        &store,
        "s-ops",
        "call-1",
        "broken",
        json!({ "service": "db" }),
    )
    .await;
    let deploy = start(
        &store,
        "s-ops",
        "call-2",
        "deploy",
        json!({ "service": "web" }),
    )
    .await;
    let browser = Browser::start().await;
    browser.goto(&server.url("/")).await;
    let accept = |text: Option<&'static str>| {
        let browser = &browser;
        async move {
            if let Some(t) = text {
                browser
                    .cmd("POST", "/alert/text", json!({ "text": t }))
                    .await;
            }
            browser.cmd("POST", "/alert/accept", json!({})).await;
        }
    };

    // The broken run is parked as blocked; its timeline names the step and the panic's code.
    let row = browser
        .find(&format!(r#"tr[data-run="{broken}"] td.status-blocked"#))
        .await;
    let outcome = browser
        .find(&format!(r#"tr[data-run="{broken}"] td.outcome.has-error"#))
        .await;
    assert_eq!(browser.text(&outcome).await, "EVE-PANIC-001");
    browser.click(&row).await;
    let timeline = format!(r#"//tr[@data-journal="{broken}"]"#);
    browser
        .find_by(
            "xpath",
            &format!(r#"{timeline}//li[@data-kind="StepCompleted" and contains(., "step check done, attempt 1")]"#),
        )
        .await;
    browser
        .find_by(
            "xpath",
            &format!(r#"{timeline}//li[@data-kind="RunBlocked" and contains(@class, "has-error") and contains(., "EVE-")]"#),
        )
        .await;
    browser.screenshot("page-timeline.png").await;
    // Resume (confirmed): it runs again and blocks again; then Fail with a reason.
    let resume = browser
        .find_by(
            "xpath",
            &format!(r#"{timeline}//button[@data-action="resume"]"#),
        )
        .await;
    browser.click(&resume).await;
    accept(None).await;
    browser
        .find_by(
            "xpath",
            &format!(r#"{timeline}//li[@data-kind="RunResumed"]"#),
        )
        .await;
    browser
        .find_by(
            "xpath",
            &format!(r#"({timeline}//li[@data-kind="RunBlocked"])[2]"#),
        )
        .await;
    let fail = browser
        .find_by(
            "xpath",
            &format!(r#"{timeline}//button[@data-action="fail"]"#),
        )
        .await;
    browser.click(&fail).await;
    accept(Some("given up from the page")).await;
    browser
        .find(&format!(r#"tr[data-run="{broken}"] td.status-failed"#))
        .await;
    // The runs table says how it came out.
    let outcome = browser
        .find(&format!(r#"tr[data-run="{broken}"] td.outcome"#))
        .await;
    assert_eq!(browser.text(&outcome).await, "given up from the page");
    // Cancel the deploy call parked on its ask.
    let row = browser
        .find(&format!(r#"tr[data-run="{deploy}"] td.status-running"#))
        .await;
    browser.click(&row).await;
    let cancel = browser
        .find_by(
            "xpath",
            &format!(r#"//tr[@data-journal="{deploy}"]//button[@data-action="cancel"]"#),
        )
        .await;
    browser.click(&cancel).await;
    accept(None).await;
    browser
        .find(&format!(r#"tr[data-run="{deploy}"] td.status-cancelled"#))
        .await;
    browser.screenshot("page-actions.png").await;

    let failed = journal(&store, &broken).await;
    assert!(failed.iter().any(|e| matches!(
        &e.event,
        eve_core::Event::RunFailed { error } if error == "given up from the page"
    )));
    assert_eq!(
        store.get_run(&deploy).await.unwrap().status,
        eve_core::RunStatus::Cancelled
    );
    browser.quit().await;
    worker.shutdown().await;
    server.stop().await;
}
