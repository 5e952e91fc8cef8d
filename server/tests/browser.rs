//! The page in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`)
//! driven over WebDriver opens the page, sees the deploy request rendered with its styled
//! buttons, rides out a server restart on a new handle of the same SQLite file (an answer given
//! meanwhile arrives once, nothing is logged twice), clicks Approve and sees the run complete,
//! with its journal and who answered. At scale: 3,000 pending requests among 10,000 runs load
//! one page at a time, and the figures (time to usable, time to answer) are printed.
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
                    "--window-size=1400,900",
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

    /// The page's path (`location.pathname`).
    async fn current_path(&self) -> String {
        self.js("return location.pathname")
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
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
    let (dir, store) = sqlite().await;
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

    // The tool filter offers the live runs' tools and narrows the requests in the server.
    browser
        .find(r#"#requests .card button[data-option="approve"]"#)
        .await;
    let only_refunds = browser
        .find(r#"#req-tool option[value="refund_order"]"#)
        .await;
    browser.click(&only_refunds).await;
    let tools = browser
        .js_async(
            "const done = arguments[0]; const t = Date.now();
             const tools = () => [...document.querySelectorAll('#requests .card')].map(c => c.closest('.tool-group').dataset.tool);
             (function poll() { const now = tools();
               if ((now.length === 1 && now[0] === 'refund_order') || Date.now() - t > 20000) done(now);
               else setTimeout(poll, 50); })();",
        )
        .await;
    assert_eq!(tools, json!(["refund_order"]), "only the refund is shown");
    let any_tool = browser.find(r#"#req-tool option[value=""]"#).await;
    browser.click(&any_tool).await;

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

    // Both requests are in the session's group, each under its tool.
    browser
        .find(r#".group[data-session="s-browser"] .tool-group[data-tool="refund_order"] .card"#)
        .await;
    browser
        .find(r#".group[data-session="s-browser"] .tool-group[data-tool="deploy"] .card"#)
        .await;

    // The server restarts while the page is open, on a new handle of the same SQLite file;
    // while it is down, someone answers the refund from elsewhere (`eve answer --as cli`).
    let addr = server.addr;
    server.stop().await;
    let refund_request = store
        .pending_requests(&eve_core::SessionId::new("s-browser"))
        .await
        .unwrap()
        .into_iter()
        .find(|p| p.run_id == refund)
        .unwrap()
        .request_id;
    store
        .answer(
            &refund_request,
            eve_core::InputResponse::option("deny").by("cli"),
            eve_core::Timestamp::now(),
        )
        .await
        .unwrap();
    let reopened: std::sync::Arc<dyn eve_core::JournalStore> = std::sync::Arc::new(
        eve_storage_sqlite::SqliteStore::open(dir.path().join("eve.db"))
            .await
            .unwrap(),
    );
    let server = TestServer::start_on(addr, reopened, keys_on).await;
    // The page reconnects its channel with Last-Event-ID: the answer given while the server
    // was down arrives once, the refund card goes, and it shows who answered.
    browser.find("#conn.live").await;
    browser
        .find(&format!(
            r#"#answered li[data-request="{refund_request}"][data-answered-by="cli"]"#
        ))
        .await;
    browser
        .find_by(
            "xpath",
            r#"//div[@id="log"]/div[contains(., " input.answered ")]"#,
        )
        .await;

    browser.click(&approve).await;

    // The approval comes back on the reconnected channel, which resumed after the last event
    // it had: the requests asked before the restart are not replayed, and nothing is twice.
    browser
        .find(r#"#answered li[data-answered-by="browser"]"#)
        .await;
    let logged = browser
        .js_async(
            "const done = arguments[0]; const t = Date.now();
             const count = kind => [...document.querySelectorAll('#log div')].filter(d => d.textContent.includes(' ' + kind + ' ')).length;
             (function poll() { if (count('input.answered') >= 2 || Date.now() - t > 20000)
               done({ asked: count('input.requested'), answered: count('input.answered'),
                      lines: [...document.querySelectorAll('#log div')].map(d => d.textContent.split(' ').slice(0, 3).join(' ')) });
               else setTimeout(poll, 50); })();",
        )
        .await;
    assert_eq!(
        (logged["asked"].clone(), logged["answered"].clone()),
        (json!(2), json!(2)),
        "each request and each answer logged once across the restart: {logged}"
    );
    let lines: Vec<&str> = logged["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    let mut unique = lines.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), lines.len(), "no session seq twice: {lines:?}");
    assert!(
        browser
            .js(&format!(
                "return !document.querySelector('#requests .card[data-request=\"{refund_request}\"]')"
            ))
            .await
            == json!(true),
        "the refund answered elsewhere left the page"
    );

    // The run list shows the run completed, live.
    browser
        .find(&format!(r#"tr[data-run="{run}"] td.status-completed"#))
        .await;
    // Runs in the navigation, then the run's link: its page, whose journal ends with
    // RunCompleted and whose waterfall has a bar per step attempt and one for the ask.
    let nav = browser.find(r#"header nav a[data-nav="runs"]"#).await;
    browser.click(&nav).await;
    browser.find(r#"body[data-view="runs"]"#).await;
    let link = browser
        .find(&format!(r#"#runs a[data-run-link="{run}"]"#))
        .await;
    browser.click(&link).await;
    let page = format!(r#"//div[@id="run-page" and @data-run="{run}"]"#);
    browser
        .find_by(
            "xpath",
            &format!(
                r#"{page}//li[starts-with(., "RunCompleted") and contains(., "deploy.example")]"#
            ),
        )
        .await;
    let asked = browser
        .find(&format!(
            r#"#run-page[data-run="{run}"] li[data-kind="InputRequested"][data-answered-by="browser"]"#
        ))
        .await;
    let asked = browser.text(&asked).await;
    assert!(asked.contains("answered by browser at "), "{asked}");
    browser
        .find_by(
            "xpath",
            &format!(
                r#"{page}//li[@data-kind="InputAnswered" and contains(., "approve by browser")]"#
            ),
        )
        .await;
    let bars = browser
        .js(&format!(
            "return [...document.querySelectorAll('#run-page[data-run=\"{run}\"] .wf-row')].map(r => r.dataset.bar + (r.dataset.bar === 'ask' ? '' : ' ' + r.dataset.barName))"
        ))
        .await;
    assert_eq!(
        bars,
        json!([
            format!("run {run}"),
            "step plan_deploy",
            "ask",
            "step apply_deploy"
        ]),
        "the waterfall: the run, each step attempt and the ask"
    );
    assert_eq!(
        browser.current_path().await,
        format!("/runs/{run}"),
        "the run page has its own address"
    );
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
        eve_core::RunStatus::Completed,
        "the refund answered during the restart ran on"
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
    let nav = browser.find(r#"header nav a[data-nav="runs"]"#).await;
    browser.click(&nav).await;
    browser.find(r#"body[data-view="runs"]"#).await;
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
    // The search query (`GET /v1/runs?query=`) narrows further; while it is not yet a query,
    // the page says what is wrong in place of the rows.
    let query = browser.find("#f-query").await;
    browser.type_into(&query, r#"input.service ="#).await;
    let error = browser.find("#runs p.query-error").await;
    assert!(
        browser.text(&error).await.contains("query"),
        "a half-typed query is explained"
    );
    browser.type_into(&query, r#" "svc-8""#).await;
    let row = browser
        .cmd(
            "POST",
            "/execute/async",
            json!({
                "script": "const done = arguments[0]; const t = Date.now(); (function poll() { const r = [...document.querySelectorAll('#runs tr.run')].map(e => e.dataset.run); if (r.length === 1 || Date.now() - t > 10000) done(r); else setTimeout(poll, 50); })();",
                "args": []
            }),
        )
        .await;
    assert_eq!(
        row,
        json!([runs[7].to_string()]),
        "only the completed run of svc-8 matches"
    );
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
    let page = |run: &eve_core::RunId| format!(r#"//div[@id="run-page" and @data-run="{run}"]"#);

    // The broken run's page, by deep link: blocked, its journal names the step and the panic's
    // code, its waterfall has the run and its one step attempt.
    browser.goto(&server.url(&format!("/runs/{broken}"))).await;
    browser
        .find(&format!(
            r#"#run-page[data-run="{broken}"][data-status="blocked"]"#
        ))
        .await;
    let p = page(&broken);
    browser
        .find_by(
            "xpath",
            &format!(r#"{p}//li[@data-kind="StepCompleted" and contains(., "step check done, attempt 1")]"#),
        )
        .await;
    browser
        .find_by(
            "xpath",
            &format!(r#"{p}//li[@data-kind="RunBlocked" and contains(@class, "has-error") and contains(., "EVE-")]"#),
        )
        .await;
    assert_eq!(bar_types(&browser).await, json!(["run", "step"]));
    browser.screenshot("view-run-blocked.png").await;

    // Resume, confirmed in the dialog: it runs again and blocks again.
    confirm(&browser, "resume", None).await;
    browser
        .find_by("xpath", &format!(r#"{p}//li[@data-kind="RunResumed"]"#))
        .await;
    browser
        .find_by(
            "xpath",
            &format!(r#"({p}//li[@data-kind="RunBlocked"])[2]"#),
        )
        .await;
    // Fail with an error typed into the dialog.
    confirm(&browser, "fail", Some("given up from the page")).await;
    browser
        .find(&format!(
            r#"#run-page[data-run="{broken}"][data-status="failed"]"#
        ))
        .await;
    let failed = journal(&store, &broken).await;
    assert!(failed.iter().any(|e| matches!(
        &e.event,
        eve_core::Event::RunFailed { error } if error == "given up from the page"
    )));
    // Retry: a new run from the failed one's journal, and the page goes to it.
    confirm(&browser, "retry", None).await;
    let retried = browser
        .js_async(&format!(
            "const done = arguments[0]; const t = Date.now();
             (function poll() {{ const p = document.getElementById('run-page');
               if ((p.dataset.run && p.dataset.run !== '{broken}' && location.pathname.startsWith('/runs/')) || Date.now() - t > 20000) done(p.dataset.run);
               else setTimeout(poll, 50); }})();"
        ))
        .await;
    let retried = eve_core::RunId::new(retried.as_str().unwrap());
    assert_ne!(retried, broken);
    assert_eq!(browser.current_path().await, format!("/runs/{retried}"));
    assert!(
        matches!(
            &journal(&store, &retried).await[0].event,
            eve_core::Event::RunStarted { reset_from: Some(from), .. } if from.run == broken
        ),
        "the new run names the run it retries"
    );
    // The retry blocks as its original did; terminate it. The dialog wants a reason.
    browser
        .find(&format!(
            r#"#run-page[data-run="{retried}"][data-status="blocked"]"#
        ))
        .await;
    let button = browser
        .find(r#"#run-page button[data-action="terminate"]"#)
        .await;
    browser.click(&button).await;
    browser.find("dialog#confirm[open]").await;
    let yes = browser.find("#confirm-yes").await;
    browser.click(&yes).await;
    let error = browser.find("#confirm-error").await;
    assert_eq!(browser.text(&error).await, "Reason is needed.");
    let input = browser.find("#confirm-input").await;
    browser.type_into(&input, "stuck in a loop").await;
    browser.click(&yes).await;
    browser
        .find(&format!(
            r#"#run-page[data-run="{retried}"][data-status="failed"]"#
        ))
        .await;
    assert!(journal(&store, &retried).await.iter().any(|e| matches!(
        &e.event,
        eve_core::Event::RunTerminated { reason, .. } if reason == "stuck in a loop"
    )));
    // Terminating it again is refused by the route: the page shows the route's words.
    browser
        .js(&format!("act('{retried}', 'terminate'); return true"))
        .await;
    let input = browser.find("dialog#confirm[open] #confirm-input").await;
    browser.type_into(&input, "again").await;
    browser.click(&yes).await;
    let error = browser
        .js_async(
            "const done = arguments[0]; const t = Date.now();
             (function poll() { const e = document.getElementById('run-error');
               const text = e ? e.textContent : '';
               if (text || Date.now() - t > 20000) done(text); else setTimeout(poll, 50); })();",
        )
        .await;
    assert!(
        error.as_str().unwrap().contains("not live"),
        "the route's error is shown: {error}"
    );

    // Cancel the deploy call parked on its ask: backing out of the dialog changes nothing,
    // confirming cancels it.
    browser.goto(&server.url(&format!("/runs/{deploy}"))).await;
    browser
        .find(&format!(
            r#"#run-page[data-run="{deploy}"][data-status="running"]"#
        ))
        .await;
    assert_eq!(bar_types(&browser).await, json!(["run", "step", "ask"]));
    browser.screenshot("view-run-waiting.png").await;
    let cancel = browser
        .find(r#"#run-page button[data-action="cancel"]"#)
        .await;
    browser.click(&cancel).await;
    let back = browser.find("dialog#confirm[open] #confirm-no").await;
    browser.screenshot("view-run-confirm.png").await;
    browser.click(&back).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        store.get_run(&deploy).await.unwrap().status,
        eve_core::RunStatus::Running,
        "backing out of the dialog does nothing"
    );
    confirm(&browser, "cancel", Some("not today")).await;
    browser
        .find(&format!(
            r#"#run-page[data-run="{deploy}"][data-status="cancelled"]"#
        ))
        .await;
    assert_eq!(
        store.get_run(&deploy).await.unwrap().status,
        eve_core::RunStatus::Cancelled
    );
    // The runs list says how each came out.
    browser.goto(&server.url("/runs")).await;
    let outcome = browser
        .find(&format!(r#"tr[data-run="{broken}"] td.outcome"#))
        .await;
    assert_eq!(browser.text(&outcome).await, "given up from the page");
    browser
        .find(&format!(r#"tr[data-run="{deploy}"] td.status-cancelled"#))
        .await;
    browser.screenshot("view-runs-after-actions.png").await;
    browser.quit().await;
    worker.shutdown().await;
    server.stop().await;
}

/// The types of the waterfall's bars on the run page, top to bottom.
async fn bar_types(browser: &Browser) -> Value {
    browser
        .js("return [...document.querySelectorAll('#run-page .wf-row')].map(r => r.dataset.bar)")
        .await
}

/// Clicks the run page's `action` button, checks the dialog asks, types `text` into its field
/// (replacing what is there) and confirms.
async fn confirm(browser: &Browser, action: &str, text: Option<&str>) {
    let button = browser
        .find(&format!(
            r#"#run-page button[data-action="{action}"]:not([disabled])"#
        ))
        .await;
    browser.click(&button).await;
    browser.find("dialog#confirm[open]").await;
    if let Some(t) = text {
        let input = browser.find("#confirm-input").await;
        browser
            .cmd("POST", &format!("/element/{input}/clear"), json!({}))
            .await;
        browser.type_into(&input, t).await;
    }
    let yes = browser.find("#confirm-yes").await;
    browser.click(&yes).await;
    // The dialog closes.
    let closed = browser
        .js_async(
            "const done = arguments[0]; const t = Date.now();
             (function poll() { if (!document.getElementById('confirm').open || Date.now() - t > 10000) done(!document.getElementById('confirm').open);
               else setTimeout(poll, 50); })();",
        )
        .await;
    assert_eq!(closed, json!(true), "the dialog closes after {action}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagent_result_is_submitted_from_the_page() {
    for bin in [CHROMIUM, CHROMEDRIVER] {
        if !Path::new(bin).exists() {
            eprintln!(
                "SKIPPED a_subagent_result_is_submitted_from_the_page: {bin} is missing; \
                 install Debian's chromium and chromium-driver (CI does: see .ci/run)"
            );
            return;
        }
    }
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let server = TestServer::start(store.clone(), |_| {}).await;
    let run = start(
        &store,
        "s-agent-page",
        "call-1",
        "delegate",
        json!({ "topic": "tides" }),
    )
    .await;
    let browser = Browser::start().await;
    browser.goto(&server.url("/?session=s-agent-page")).await;
    let card = format!(r#"#agents .card[data-agent^="{run}"]"#);
    let prompt = browser.find(&format!("{card} .prompt")).await;
    assert_eq!(
        browser.text(&prompt).await,
        "Subagent researcher (call facts)"
    );
    // An output that does not match the call's schema is refused; the card says where.
    let output = browser
        .find(&format!(r#"{card} textarea[data-text="output"]"#))
        .await;
    browser.type_into(&output, r#"{"facts": [7]}"#).await;
    let submit = browser
        .find(&format!(r#"{card} button[data-submit="output"]"#))
        .await;
    browser.click(&submit).await;
    let error = browser
        .js_async(&format!(
            "const done = arguments[0]; const t = Date.now();
             (function poll() {{ const e = document.querySelector('{card} .error');
               const text = e ? e.textContent : '';
               if (text || Date.now() - t > 20000) done(text); else setTimeout(poll, 50); }})();",
            card = card.replace('\'', "\\'")
        ))
        .await;
    assert!(error.as_str().unwrap().contains("/facts/0"), "{error}");
    browser
        .js(&format!(
            "document.querySelector('{}').value = '';",
            format!(r#"{card} textarea[data-text="output"]"#).replace('\'', "\\'")
        ))
        .await;
    browser
        .type_into(&output, r#"{"facts": ["two a day"]}"#)
        .await;
    browser.click(&submit).await;
    // The card goes and the run completes with the output.
    browser
        .find(&format!(r#"#answered li[data-request^="{run}"]"#))
        .await;
    let mut events =
        SseClient::connect(&server.url("/v1/sessions/s-agent-page/events"), None).await;
    let settled = events.until("tool.settled").await.pop().unwrap().json();
    assert_eq!(
        settled["event"]["data"]["result"]["data"]["output"],
        json!({"facts": {"facts": ["two a day"]}}),
        "the run completes with the submitted output"
    );
    browser.quit().await;
    worker.shutdown().await;
    server.stop().await;
}

impl Browser {
    /// Runs `script` in the page and returns its value.
    async fn js(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            json!({ "script": script, "args": [] }),
        )
        .await
    }

    /// Runs `script` in the page; it calls `arguments[0]` with its value when done.
    async fn js_async(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "/execute/async",
            json!({ "script": script, "args": [] }),
        )
        .await
    }
}

/// How many parked runs the scale test has (the template included) and how many runs in all.
const PENDING: usize = 3_000;
const RUNS: usize = 10_000;
/// The sessions the pending requests are spread over.
const WAIT_SESSIONS: usize = 600;

/// `events` (a parked `deploy` run's journal after `RunStarted`) as run `run` for `service`
/// would have written them: its own request id, the prompt and plan of its service.
fn as_run(
    events: &[eve_core::StoredEvent],
    run: &eve_core::RunId,
    service: &str,
) -> Vec<eve_core::Event> {
    use eve_core::{Event, Payload, RequestId};
    let plan = format!("roll out {service} to 3 regions");
    events
        .iter()
        .map(|e| match e.event.clone() {
            Event::StepCompleted {
                cmd, name, attempt, ..
            } if name == "plan_deploy" => Event::StepCompleted {
                cmd,
                name,
                attempt,
                output: Payload::from_value(&plan).unwrap(),
            },
            Event::InputRequested {
                cmd, mut request, ..
            } => {
                request.prompt = format!("Deploy {service}?\n\n{plan}");
                Event::InputRequested {
                    cmd,
                    request_id: RequestId::for_command(run, cmd),
                    request,
                }
            }
            other => other,
        })
        .collect()
}

/// Writes `RUNS - PENDING` ended runs and `PENDING - 1` runs parked on `deploy`'s ask (copies of
/// `template`'s journal) straight into the store, as a worker would have: created claimed by
/// a seeding lease, appended, released with nothing left to do. Creation times are spread
/// over the last 20 minutes, the ended runs first.
async fn seed(store: &std::sync::Arc<dyn eve_core::JournalStore>, template: &eve_core::RunId) {
    use eve_core::{
        Append, AppendId, CallId, Event, Execution, NewRun, Payload, RunId, SessionId, Timestamp,
        WorkerId,
    };
    use futures::StreamExt;
    let record = store.get_run(template).await.unwrap();
    let events = journal(store, template).await;
    assert!(
        matches!(events.last().unwrap().event, Event::InputRequested { .. }),
        "the template is parked on its ask: {events:?}"
    );
    let lease = store
        .register_worker(
            &WorkerId::new("scale-seeder"),
            &record.deployment_id,
            std::time::Duration::from_secs(600),
            Timestamp::now(),
        )
        .await
        .unwrap();
    let base = Timestamp::now().0 - 20 * 60_000;
    let ended = RUNS - PENDING;
    let jobs = (0..RUNS - 1).map(|i| {
        let (store, lease, record, events) = (store.clone(), lease.clone(), &record, &events);
        async move {
            let parked = i >= ended;
            let service = format!("svc-{i}");
            let run_id = RunId::new(format!(
                "run-{}-{i:05}",
                if parked { "wait" } else { "done" }
            ));
            let session = if parked {
                format!("s-wait-{:03}", i % WAIT_SESSIONS)
            } else {
                format!("s-done-{:04}", i % 1400)
            };
            let at = Timestamp(base + i as i64 * 100);
            let created = store
                .create_run_claimed(
                    NewRun {
                        run_id: run_id.clone(),
                        idempotency_key: None,
                        workflow_id: record.workflow_id.clone(),
                        deployment_id: record.deployment_id.clone(),
                        tool: record.tool.clone(),
                        input: Payload::from_value(&json!({ "service": service })).unwrap(),
                        session_id: SessionId::new(session),
                        call_id: CallId::new(format!("call-{i}")),
                        execution: Execution::Default,
                        traceparent: None,
                        reset_from: None,
                    },
                    &lease,
                    at,
                )
                .await
                .unwrap();
            assert!(
                created.created && created.run.owner.is_some(),
                "{created:?}"
            );
            let body = if parked {
                as_run(&events[1..], &run_id, &service)
            } else if i % 10 == 9 {
                vec![Event::RunFailed {
                    error: format!("the deploy of {service} failed"),
                }]
            } else {
                vec![Event::RunCompleted {
                    output: Payload::from_value(&json!({ "deployed": true })).unwrap(),
                }]
            };
            let appended = store
                .append(Append {
                    run: run_id.clone(),
                    expected_seq: 1,
                    lease: lease.clone(),
                    append_id: AppendId::random(),
                    events: body,
                    now: at,
                })
                .await
                .unwrap();
            if parked {
                store
                    .release(&lease, &run_id, appended.next_seq, at)
                    .await
                    .unwrap();
            }
        }
    });
    futures::stream::iter(jobs)
        .buffer_unordered(256)
        .collect::<Vec<()>>()
        .await;
    store.retire_worker(&lease, Timestamp::now()).await.unwrap();
}

/// Waits (on the store's notifications) until `run` has a pending request.
async fn parked(store: &std::sync::Arc<dyn eve_core::JournalStore>, run: &eve_core::RunId) {
    let session = store.get_run(run).await.unwrap().session_id;
    let mut watch = eve_core::wake::Waiter::new(
        &**store,
        &eve_core::wake::WatchKey::Session(session.clone()),
        std::time::Duration::from_secs(2),
        std::time::Duration::from_millis(50),
    )
    .await;
    tokio::time::timeout(WAIT, async {
        while !store
            .pending_requests(&session)
            .await
            .unwrap()
            .iter()
            .any(|p| &p.run_id == run)
        {
            watch.wait().await;
        }
    })
    .await
    .expect("the run parks on its ask in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_thousand_pending_requests_among_ten_thousand_runs_load_and_answer_quickly() {
    for bin in [CHROMIUM, CHROMEDRIVER] {
        if !Path::new(bin).exists() {
            eprintln!(
                "SKIPPED three_thousand_pending_requests_among_ten_thousand_runs_load_and_answer_quickly: \
                 {bin} is missing; install Debian's chromium and chromium-driver (CI does: see .ci/run)"
            );
            return;
        }
    }
    let began = std::time::Instant::now();
    let dir = tempfile::tempdir().unwrap();
    // NORMAL sync: the seeding is the test's set-up, not what it measures.
    let store: std::sync::Arc<dyn eve_core::JournalStore> = std::sync::Arc::new(
        eve_storage_sqlite::SqliteStore::open_with(
            dir.path().join("eve.db"),
            eve_storage_sqlite::SqliteOptions {
                synchronous: eve_storage_sqlite::Synchronous::Normal,
                ..eve_storage_sqlite::SqliteOptions::default()
            },
        )
        .await
        .unwrap(),
    );
    let worker = worker(store.clone()).await;
    let server = TestServer::start(store.clone(), |c| c.insecure_no_auth = false).await;
    let key = eve_server::create_key(
        &*store,
        "scale-tester",
        eve_core::KeyScope::Answer,
        eve_core::Timestamp::now(),
    )
    .await
    .unwrap();
    let template = start(
        &store,
        "s-wait-template",
        "call-template",
        "deploy",
        json!({ "service": "svc-template" }),
    )
    .await;
    parked(&store, &template).await;
    let seeding = std::time::Instant::now();
    seed(&store, &template).await;
    let seeded_in = seeding.elapsed();
    let all = store
        .list_runs(&eve_core::RunQuery::default())
        .await
        .unwrap();
    assert_eq!(all.len(), RUNS);
    assert_eq!(
        all.iter()
            .filter(|r| r.status == eve_core::RunStatus::Running)
            .count(),
        PENDING
    );

    // What the two list routes cost in the server, seen from a client.
    let http = reqwest::Client::new();
    let mut api_ms = Vec::new();
    for path in ["/v1/requests?limit=100", "/v1/runs?order=newest&limit=100"] {
        let t = std::time::Instant::now();
        let resp = http
            .get(server.url(path))
            .bearer_auth(&key.text)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let body: Value = resp.json().await.unwrap();
        api_ms.push((path, t.elapsed().as_millis()));
        if path.starts_with("/v1/requests") {
            assert_eq!(body["requests"].as_array().unwrap().len(), 100);
            assert_eq!(body["requests"][0]["runId"], template.as_str());
        }
    }

    let browser = Browser::start().await;
    browser.goto(&server.url("/")).await;
    let input = browser.find("#signin:not([hidden]) #key").await;
    browser.type_into(&input, &key.text).await;
    let submit = browser.find("#signin-submit").await;
    browser.click(&submit).await;
    browser.find(r#"body[data-ready="1"]"#).await;

    // The measured load: a signed-in person opens the page.
    browser.goto(&server.url("/")).await;
    browser.find(r#"body[data-ready="1"]"#).await;
    browser.find("#conn.live").await;
    let load = browser
        .js("const nav = performance.getEntriesByType('navigation')[0];
             return { ready: window.eveReady, live: window.eveLive,
                      dom: nav.domContentLoadedEventEnd, response: nav.responseEnd,
                      cards: document.querySelectorAll('#requests .card').length,
                      rows: document.querySelectorAll('#runs tr.run').length,
                      running: document.querySelector('#counts [data-count=running]').textContent,
                      followed: followed.size }")
        .await;
    assert_eq!(load["cards"], 100, "one page of requests: {load}");
    assert_eq!(load["rows"], 50, "one page of runs: {load}");
    assert_eq!(load["running"], format!("running {PENDING}"), "{load}");
    assert!(
        load["followed"].as_u64().unwrap() <= eve_server::MAX_STREAM_SESSIONS as u64,
        "{load}"
    );
    // Nothing unbounded was fetched: no listing without a limit, no request list per session.
    let fetched = browser
        .js("return performance.getEntriesByType('resource').map(e => e.name)")
        .await;
    for url in fetched.as_array().unwrap() {
        let url = url.as_str().unwrap();
        assert!(!url.contains("/v1/sessions/"), "{url}");
        if url.contains("/v1/runs?") || url.contains("/v1/requests?") {
            assert!(url.contains("limit="), "an unbounded listing: {url}");
        }
    }
    browser.screenshot("page-scale.png").await;
    // Sessions with long ids (up to the server's 256 bytes each) cannot push the one stream's
    // URL past what a server takes: the page stops following before that.
    let url = browser
        .js_async(
            "const done = arguments[0];
             for (let i = 0; i < 300; i++) follow('x'.repeat(250) + i);
             setTimeout(() => done({ url: source.url.length, bytes: followBytes, max: MAX_FOLLOW_URL }), 0); // after the reconnect follow() scheduled",
        )
        .await;
    assert!(
        url["url"].as_u64().unwrap() < 48 * 1024 && url["bytes"].as_u64() <= url["max"].as_u64(),
        "the stream's URL: {url}"
    );

    // Answer the first (newest) request and time it until its card is gone.
    let answered = browser
        .js_async(
            "const done = arguments[0];
             const card = document.querySelector('#requests .card');
             const id = card.dataset.request;
             const t0 = performance.now();
             window.eveAnswerT0 = t0;
             const gone = () => !document.querySelector(`#requests .card[data-request=\"${CSS.escape(id)}\"]`);
             const obs = new MutationObserver(() => {
               if (gone()) { obs.disconnect(); done({ id, ms: performance.now() - t0 }); }
             });
             obs.observe(document.getElementById('requests'), { childList: true, subtree: true });
             card.querySelector('button[data-option=approve]').click();",
        )
        .await;
    let request_id = answered["id"].as_str().unwrap().to_owned();
    let run = request_id.rsplit_once(':').unwrap().0.to_owned();
    assert_eq!(run, template.as_str(), "the newest request is first");
    // Who answered shows on the page and in the run's timeline.
    browser
        .find(&format!(
            r#"#answered li[data-request="{request_id}"][data-answered-by="scale-tester"]"#
        ))
        .await;
    // The worker resumes the run and the page shows it completed: the whole round trip.
    let completed = browser
        .js_async(&format!(
            "const done = arguments[0];
             (function poll() {{
               if (document.querySelector('tr[data-run=\"{run}\"] td.status-completed')) done(performance.now() - window.eveAnswerT0);
               else setTimeout(poll, 10); }})();"
        ))
        .await;
    browser
        .find(&format!(r#"tr[data-run="{run}"] td.status-completed"#))
        .await;
    browser.js(&format!("navigate('/runs/{run}')")).await;
    let line = browser
        .find(&format!(
            r#"#run-page[data-run="{run}"] li[data-kind="InputRequested"][data-answered-by="scale-tester"]"#
        ))
        .await;
    let text = browser.text(&line).await;
    assert!(text.contains("answered by scale-tester at "), "{text}");
    browser.js("history.back()").await;
    browser.find(r#"body[data-view="requests"]"#).await;

    // "Load more requests" adds the next page.
    let more = browser.find("#req-more").await;
    browser.click(&more).await;
    let cards = browser
        .js_async(
            "const done = arguments[0]; const t = Date.now();
             (function poll() { const n = document.querySelectorAll('#requests .card').length;
               if (n >= 200 || Date.now() - t > 20000) done(n); else setTimeout(poll, 50); })();",
        )
        .await;
    assert_eq!(cards, 200, "a second page of requests");

    // The runs, 50 a page: Older shows the next 50, Newer the first again.
    browser.js("navigate('/runs'); return true").await;
    browser.find(r#"body[data-view="runs"]"#).await;
    let first = browser
        .js("return document.querySelector('#runs tr.run').dataset.run")
        .await;
    browser.screenshot("page-scale-runs.png").await;
    let older = browser.find("#more:not([hidden])").await;
    browser.click(&older).await;
    let second = browser
        .js_async(
            "const done = arguments[0]; const t = Date.now();
             (function poll() { const rows = [...document.querySelectorAll('#runs tr.run')].map(r => r.dataset.run);
               if (document.getElementById('page-no').textContent === 'page 2' || Date.now() - t > 20000)
                 done({ rows: rows.length, first: rows[0], page: document.getElementById('page-no').textContent });
               else setTimeout(poll, 50); })();",
        )
        .await;
    assert_eq!(second["page"], "page 2", "{second}");
    assert_eq!(second["rows"], 50, "{second}");
    assert_ne!(
        second["first"], first,
        "the second page has other runs: {second}"
    );
    let newer = browser.find("#newer:not([disabled])").await;
    browser.click(&newer).await;
    browser
        .find_by("xpath", r#"//span[@id="page-no" and text()="page 1"]"#)
        .await;

    let ready_ms = load["ready"].as_f64().unwrap();
    let answer_ms = answered["ms"].as_f64().unwrap();
    let completed_ms = completed.as_f64().unwrap();
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!(
        "SCALE: {RUNS} runs, {PENDING} pending requests in {WAIT_SESSIONS} sessions (seeded in {:.1} s); \
         page: response {:.0} ms, DOMContentLoaded {:.0} ms, first requests and runs usable {ready_ms:.0} ms, \
         stream live {:.0} ms (following {} sessions); answer to card gone {answer_ms:.0} ms, \
         to the run shown completed {completed_ms:.0} ms; \
         server: {api_ms:?}; test {:.1} s; loadavg {}",
        seeded_in.as_secs_f64(),
        load["response"].as_f64().unwrap_or(0.0),
        load["dom"].as_f64().unwrap_or(0.0),
        load["live"].as_f64().unwrap_or(0.0),
        load["followed"],
        began.elapsed().as_secs_f64(),
        loadavg.trim()
    );
    // Generous budgets, so a busy CI machine does not flake; the figures above are the news.
    assert!(
        ready_ms < 5_000.0,
        "the page took {ready_ms} ms to be usable"
    );
    assert!(answer_ms < 5_000.0, "answering took {answer_ms} ms");
    assert!(
        completed_ms < 10_000.0,
        "the answered run showed completed after {completed_ms} ms"
    );

    browser.quit().await;
    worker.shutdown().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_view_by_deep_link_navigation_sign_in_and_scopes() {
    for bin in [CHROMIUM, CHROMEDRIVER] {
        if !Path::new(bin).exists() {
            eprintln!(
                "SKIPPED every_view_by_deep_link_navigation_sign_in_and_scopes: {bin} is missing; \
                 install Debian's chromium and chromium-driver (CI does: see .ci/run)"
            );
            return;
        }
    }
    let (_dir, store) = sqlite().await;
    let worker = worker(store.clone()).await;
    let server = TestServer::start(store.clone(), |c| c.insecure_no_auth = false).await;
    let now = eve_core::Timestamp::now();
    let reader = eve_server::create_key(&*store, "reader", eve_core::KeyScope::Read, now)
        .await
        .unwrap();
    let admin = eve_server::create_key(&*store, "ops-admin", eve_core::KeyScope::Admin, now)
        .await
        .unwrap();
    let done = start(
        &store,
        "s-nav",
        "call-1",
        "deploy",
        json!({ "service": "api" }),
    )
    .await;
    parked(&store, &done).await;
    let request = store
        .pending_requests(&eve_core::SessionId::new("s-nav"))
        .await
        .unwrap()
        .pop()
        .unwrap()
        .request_id;
    store
        .answer(
            &request,
            eve_core::InputResponse::option("approve").by("cli"),
            eve_core::Timestamp::now(),
        )
        .await
        .unwrap();
    let waiting = start(
        &store,
        "s-nav",
        "call-2",
        "deploy",
        json!({ "service": "web" }),
    )
    .await;
    parked(&store, &waiting).await;
    let _other = start(&store, "s-other", "call-1", "report", json!({ "steps": 2 })).await;

    let browser = Browser::start().await;
    // Not signed in: every view says to sign in, and nothing pretends to be empty.
    for path in ["/", "/runs", &format!("/runs/{done}")] {
        browser.goto(&server.url(path)).await;
        let lead = browser.find("#signin:not([hidden]) #signin-lead").await;
        assert!(browser
            .text(&lead)
            .await
            .starts_with("Sign in with an API key"));
        let body = browser.js("return document.body.innerText").await;
        let body = body.as_str().unwrap();
        assert!(!body.contains("No runs yet"), "{path}: {body}");
        assert!(!body.contains("Loading"), "{path}: {body}");
    }
    browser.screenshot("view-signin.png").await;
    // A wrong key is refused in words for a person.
    let input = browser.find("#key").await;
    browser
        .type_into(&input, &format!("eve_000000000000_{}", "0".repeat(64)))
        .await;
    let submit = browser.find("#signin-submit").await;
    browser.click(&submit).await;
    let error = browser
        .js_async(
            "const done = arguments[0]; const t = Date.now();
             (function poll() { const text = document.getElementById('signin-error').textContent;
               if (text || Date.now() - t > 20000) done(text); else setTimeout(poll, 50); })();",
        )
        .await;
    assert_eq!(
        error,
        "No key matches what you entered. Check that you pasted the whole key, or ask an admin for a new one."
    );
    browser.screenshot("view-signin-error.png").await;

    // A read key: who and which scope are shown; no act button is usable, and each says why.
    browser
        .cmd("POST", &format!("/element/{input}/clear"), json!({}))
        .await;
    browser.type_into(&input, &reader.text).await;
    browser.click(&submit).await;
    browser
        .find(r#"#who[data-scope="read"]:not([hidden])"#)
        .await;
    browser.goto(&server.url("/requests")).await;
    browser
        .find(r#"#who[data-scope="read"]:not([hidden])"#)
        .await;
    let name = browser.find("#who-name").await;
    assert_eq!(browser.text(&name).await, "reader");
    let keys_link = browser.find("#nav-keys").await;
    assert_eq!(
        browser.attr(&keys_link, "hidden").await,
        "true",
        "no Keys for a read key"
    );
    let approve = browser
        .find(&format!(
            r#".card[data-request^="{waiting}"] button[data-option="approve"]"#
        ))
        .await;
    assert_eq!(browser.attr(&approve, "disabled").await, "true");
    assert!(browser
        .attr(&approve, "title")
        .await
        .contains("scope answer"));
    browser.find("#req-scope-note:not([hidden])").await;
    browser.screenshot("view-requests-read-key.png").await;
    browser.goto(&server.url(&format!("/runs/{waiting}"))).await;
    browser
        .find(&format!(r#"#run-page[data-run="{waiting}"] .waterfall"#))
        .await;
    let buttons = browser
        .js("return [...document.querySelectorAll('#run-page button[data-action]')].map(b => [b.dataset.action, b.disabled, b.title])")
        .await;
    let buttons = buttons.as_array().unwrap();
    assert!(!buttons.is_empty());
    for b in buttons {
        assert_eq!(b[1], true, "a read key cannot act: {b}");
        assert!(b[2].as_str().unwrap().contains("scope operate"), "{b}");
    }
    browser.screenshot("view-run-read-key.png").await;
    // Signing out forgets the key.
    let out = browser.find("#signout").await;
    browser.click(&out).await;
    let error = browser.find("#signin:not([hidden]) #signin-error").await;
    assert_eq!(browser.text(&error).await, "You are signed out.");
    browser.goto(&server.url("/runs")).await;
    browser.find("#signin:not([hidden])").await;

    // An admin key: every view by its deep link.
    let input = browser.find("#key").await;
    browser.type_into(&input, &admin.text).await;
    let submit = browser.find("#signin-submit").await;
    browser.click(&submit).await;
    browser
        .find(r#"#who[data-scope="admin"]:not([hidden])"#)
        .await;
    let views = [
        (
            "/",
            "requests",
            format!(r#"#requests .card[data-request^="{waiting}"]"#),
            "view-requests.png",
        ),
        (
            "/requests",
            "requests",
            "#requests .card".to_owned(),
            "view-requests-deep.png",
        ),
        (
            "/runs",
            "runs",
            format!(r#"#runs tr[data-run="{done}"] td.status-completed"#),
            "view-runs.png",
        ),
        (
            &format!("/runs/{done}"),
            "run",
            format!(r#"#run-page[data-run="{done}"][data-status="completed"] .waterfall"#),
            "view-run.png",
        ),
        (
            "/sessions",
            "sessions",
            r#"#sessions-list tr[data-session="s-nav"]"#.to_owned(),
            "view-sessions.png",
        ),
        (
            "/sessions/s-nav",
            "session",
            format!(r#"#session-page[data-session="s-nav"] #session-runs tr[data-run="{done}"]"#),
            "view-session.png",
        ),
        (
            "/keys",
            "keys",
            format!(r#"#keys-list tr[data-key="{}"]"#, reader.record.id),
            "view-keys.png",
        ),
    ];
    for (path, view, css, shot) in &views {
        browser.goto(&server.url(path)).await;
        browser.find(&format!(r#"body[data-view="{view}"]"#)).await;
        browser.find(css).await;
        if *view == "session" {
            browser
                .find(&format!(
                    r#"#session-requests .card[data-request^="{waiting}"]"#
                ))
                .await;
        }
        // Nothing is wider than the window: no horizontal scroll.
        let wide = browser
            .js("return document.documentElement.scrollWidth - document.documentElement.clientWidth")
            .await;
        assert_eq!(wide, json!(0), "{path} scrolls sideways");
        // Timestamps stay on one line.
        let wrapped = browser
            .js("return [...document.querySelectorAll('time.ts')].filter(t => t.offsetParent && t.getClientRects().length > 1).length")
            .await;
        assert_eq!(wrapped, json!(0), "{path}: a timestamp wraps");
        browser.screenshot(shot).await;
    }
    // The completed run's waterfall: the run, its two step attempts and the answered ask.
    browser.goto(&server.url(&format!("/runs/{done}"))).await;
    browser
        .find(&format!(r#"#run-page[data-run="{done}"] .waterfall"#))
        .await;
    assert_eq!(
        bar_types(&browser).await,
        json!(["run", "step", "ask", "step"])
    );
    // A run whose first step failed and was retried, and that slept: the failed attempt, the
    // wait before its retry, the attempt that passed, the sleep and the last step.
    let retried = seed_retried_run(&store, &done).await;
    browser.goto(&server.url(&format!("/runs/{retried}"))).await;
    browser
        .find(&format!(r#"#run-page[data-run="{retried}"] .waterfall"#))
        .await;
    assert_eq!(
        bar_types(&browser).await,
        json!(["run", "step-failed", "retry", "step", "sleep", "step"])
    );
    let widths = browser
        .js("return [...document.querySelectorAll('#run-page .wf-row')].map(r => r.querySelector('.wf-dur').textContent.split(' ')[0] + ' ' + r.querySelector('.wf-dur').textContent.split(' ')[1])")
        .await;
    assert_eq!(
        widths,
        json!(["3.3 s", "100 ms", "500 ms", "300 ms", "2.0 s", "200 ms"]),
        "each bar says its duration"
    );
    browser.screenshot("view-run-retries.png").await;
    browser.goto(&server.url(&format!("/runs/{done}"))).await;
    browser
        .find(&format!(r#"#run-page[data-run="{done}"] .waterfall"#))
        .await;
    let raw = browser.find("#raw-events summary").await;
    browser.click(&raw).await;
    browser.find(r#"#raw-events[open] tr[data-seq="0"]"#).await;
    browser.screenshot("view-run-raw.png").await;

    // Navigation: Requests → Runs → a run → its session → back → Keys, without reloading.
    browser.goto(&server.url("/requests")).await;
    browser.js("window.eveSamePage = 1; return true").await;
    for (css, view) in [
        (r#"header nav a[data-nav="runs"]"#.to_owned(), "runs"),
        (format!(r#"#runs a[data-run-link="{done}"]"#), "run"),
        (
            r#"#run-page .run-meta a[href="/sessions/s-nav"]"#.to_owned(),
            "session",
        ),
    ] {
        let link = browser.find(&css).await;
        browser.click(&link).await;
        browser.find(&format!(r#"body[data-view="{view}"]"#)).await;
    }
    assert_eq!(browser.current_path().await, "/sessions/s-nav");
    browser.cmd("POST", "/back", json!({})).await;
    browser.find(r#"body[data-view="run"]"#).await;
    assert_eq!(browser.current_path().await, format!("/runs/{done}"));
    let keys = browser.find("#nav-keys").await;
    browser.click(&keys).await;
    browser.find(r#"body[data-view="keys"]"#).await;
    assert_eq!(
        browser.js("return window.eveSamePage").await,
        json!(1),
        "navigation stays in the page"
    );
    // An admin creates a key from the page; it is shown once.
    let name = browser.find("#key-name").await;
    browser.type_into(&name, "from-the-page").await;
    let create = browser.find("#key-create").await;
    browser.click(&create).await;
    browser.find("#key-new code[data-new-key]").await;
    assert!(store
        .list_keys()
        .await
        .unwrap()
        .iter()
        .any(|k| k.name == "from-the-page" && k.scope == eve_core::KeyScope::Answer));
    // … and one limited to sessions (comma-separated in the form).
    let name = browser.find("#key-name").await;
    browser.type_into(&name, "limited-from-the-page").await;
    let sessions = browser.find("#key-sessions").await;
    browser.type_into(&sessions, "s-a, s-b").await;
    let create = browser.find("#key-create").await;
    browser.click(&create).await;
    browser.find(r#"#keys-list td[data-sessions]"#).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let keys = store.list_keys().await.unwrap();
        if let Some(k) = keys.iter().find(|k| k.name == "limited-from-the-page") {
            assert_eq!(
                k.sessions,
                Some(vec![
                    eve_core::SessionId::new("s-a"),
                    eve_core::SessionId::new("s-b")
                ])
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the limited key was not created"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    browser.quit().await;
    worker.shutdown().await;
    server.stop().await;
}

/// Writes a run of `template`'s workflow straight into the store, as a worker would have: its
/// step `fetch` fails at +100 ms and is retried at +600 ms, passing at +900 ms; it sleeps from
/// +1 s to +3 s, runs `store` until +3.2 s and completes at +3.3 s.
async fn seed_retried_run(
    store: &std::sync::Arc<dyn eve_core::JournalStore>,
    template: &eve_core::RunId,
) -> eve_core::RunId {
    use eve_core::{
        Append, AppendId, CallId, Event, Execution, NewRun, Payload, RunId, SessionId, Timestamp,
        WorkerId,
    };
    let record = store.get_run(template).await.unwrap();
    let base = Timestamp::now().0 - 60_000;
    let lease = store
        .register_worker(
            &WorkerId::new("retry-seeder"),
            &record.deployment_id,
            std::time::Duration::from_secs(600),
            Timestamp(base),
        )
        .await
        .unwrap();
    let run = RunId::new("run-retried-by-hand");
    store
        .create_run_claimed(
            NewRun {
                run_id: run.clone(),
                idempotency_key: None,
                workflow_id: record.workflow_id.clone(),
                deployment_id: record.deployment_id.clone(),
                tool: "deploy".into(),
                input: Payload::from_value(&json!({ "service": "search" })).unwrap(),
                session_id: SessionId::new("s-nav"),
                call_id: CallId::new("call-retried"),
                execution: Execution::Default,
                traceparent: None,
                reset_from: None,
            },
            &lease,
            Timestamp(base),
        )
        .await
        .unwrap();
    let out = |v: Value| Payload::from_value(&v).unwrap();
    let steps = vec![
        (
            100,
            Event::StepFailed {
                cmd: 0,
                name: "fetch".into(),
                attempt: 1,
                error: "timed out".into(),
                fatal: false,
                retry_at: Some(Timestamp(base + 600)),
            },
        ),
        (
            900,
            Event::StepCompleted {
                cmd: 0,
                name: "fetch".into(),
                attempt: 2,
                output: out(json!("fetched")),
            },
        ),
        (
            1000,
            Event::SleepScheduled {
                cmd: 1,
                wake_at: Timestamp(base + 3000),
            },
        ),
        (3000, Event::SleepFired { cmd: 1 }),
        (
            3200,
            Event::StepCompleted {
                cmd: 2,
                name: "store".into(),
                attempt: 1,
                output: out(json!("stored")),
            },
        ),
        (
            3300,
            Event::RunCompleted {
                output: out(json!({ "deployed": true })),
            },
        ),
    ];
    for (seq, (at, event)) in steps.into_iter().enumerate() {
        store
            .append(Append {
                run: run.clone(),
                expected_seq: seq as u64 + 1,
                lease: lease.clone(),
                append_id: AppendId::random(),
                events: vec![event],
                now: Timestamp(base + at),
            })
            .await
            .unwrap();
    }
    store.retire_worker(&lease, Timestamp::now()).await.unwrap();
    run
}
