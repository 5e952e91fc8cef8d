//! What the tests that drive the `eve` binary share: running it on a directory's store with
//! nothing from the environment, and a served store to point `--url` at.
#![allow(dead_code)] // each test crate uses its own part

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub(crate) const EVE: &str = env!("CARGO_BIN_EXE_eve");

/// `eve args…` in `dir` on its `eve.db`, with no `EVE_URL` / `EVE_KEY` from outside.
pub(crate) fn eve(dir: &Path, args: &[&str]) -> Output {
    Command::new(EVE)
        .args(args)
        .current_dir(dir)
        .env_remove("EVE_STORE_URL")
        .env_remove("EVE_URL")
        .env_remove("EVE_KEY")
        .env_remove("EVE_PROFILE")
        .env("EVE_CONFIG", dir.join("profiles.toml"))
        .output()
        .expect("run eve")
}

/// Asserts success; stdout.
pub(crate) fn ok(dir: &Path, args: &[&str]) -> String {
    let o = eve(dir, args);
    assert!(
        o.status.success(),
        "eve {args:?} failed ({}): {}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Asserts failure with `code` and one line on stderr containing `needle`.
pub(crate) fn fails(dir: &Path, args: &[&str], code: i32, needle: &str) -> String {
    let o = eve(dir, args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(code), "eve {args:?}: {err}");
    assert_eq!(
        err.lines().count(),
        1,
        "eve {args:?}: not one line: {err:?}"
    );
    assert!(
        err.contains(needle),
        "eve {args:?}: {err:?} lacks {needle:?}"
    );
    err
}

/// A running `eve serve` on `dir`'s store; killed on drop.
pub(crate) struct Served {
    child: Child,
    pub(crate) base: String,
}

impl Served {
    pub(crate) fn start(dir: &Path) -> Self {
        let mut child = Command::new(EVE)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .current_dir(dir)
            .env_remove("EVE_STORE_URL")
            .env_remove("EVE_BASE_URL")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn eve serve");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let line = loop {
            let line = lines
                .recv_timeout(Duration::from_secs(60))
                .expect("eve serve prints where it listens");
            if line.contains("listening on ") {
                break line;
            }
        };
        let url = line.split("listening on ").nth(1).expect("a URL");
        let base = url.split('/').take(3).collect::<Vec<_>>().join("/");
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || while lines.recv().is_ok() {});
        Self { child, base }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `text` with each `(remote, local)` id of `ids` written as the local one.
pub(crate) fn as_local(text: &str, ids: &[(&str, &str)]) -> String {
    ids.iter().fold(text.to_owned(), |t, (remote, local)| {
        t.replace(remote, local)
    })
}

/// The value of `field` in the first JSON line of `out`.
pub(crate) fn first_field(out: &str, field: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(out.lines().next().expect("a line")).unwrap();
    v[field].as_str().expect("a string field").to_owned()
}

/// Waits until the store's runs stop changing and `n` requests are pending: what both modes
/// then read is the same state (the server's worker runs beside them).
pub(crate) fn settle(d: &Path, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    loop {
        let now = ok(d, &["runs", "list", "--json"]);
        let pending: Vec<serde_json::Value> =
            serde_json::from_str(&ok(d, &["requests", "--json"])).unwrap();
        if now == last && pending.len() == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never settled: {now} {pending:?}"
        );
        last = now;
        std::thread::sleep(Duration::from_millis(300));
    }
}
