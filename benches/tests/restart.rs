//! Recovery across real processes (the `workloads` binary's `child` and `recover`):
//!
//! - a worker process killed with SIGKILL in the middle of a run and started again takes the
//!   run back at once — its stable worker id fences the dead incarnation — and the run finishes
//!   long before the dead process's lease (60 s here) would have expired;
//! - two live processes given one worker id do not both run: the second is refused (exit 4,
//!   naming the first process) while the first keeps running and finishes the run, and no step
//!   result is recorded twice.
//!
//! On SQLite files always, and on Postgres when `EVE_TEST_POSTGRES_URL` is set.

use eve_core::{Event, JournalStore, JournalStoreExt, RunId, Timestamp};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const EXE: &str = env!("CARGO_BIN_EXE_workloads");

/// Targets to run on: a SQLite file in `dir`, and a fresh Postgres schema when configured.
fn targets(dir: &std::path::Path, tag: &str) -> Vec<String> {
    let mut out = vec![format!(
        "sqlite-full:{}",
        dir.join(format!("{tag}.db")).display()
    )];
    if std::env::var("EVE_TEST_POSTGRES_URL").is_ok() {
        let schema = format!("restart_{tag}_{}", &RunId::random().as_str()[4..14]);
        out.push(format!("postgres:{schema}"));
    } else {
        eprintln!("skipped on Postgres: EVE_TEST_POSTGRES_URL is unset");
    }
    out
}

/// Starts `workloads child …` and reads lines from its stdout until `until` matches one;
/// returns the run id it printed.
fn spawn_child(args: &[&str], until: &str) -> (Child, RunId) {
    let mut child = Command::new(EXE)
        .arg("child")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the child");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut run = None;
    for line in lines.by_ref() {
        let line = line.expect("child stdout");
        if let Some(id) = line.strip_prefix("run ") {
            run = Some(RunId::new(id));
        }
        if line.starts_with(until) {
            break;
        }
    }
    (child, run.expect("the child printed its run id"))
}

/// Each of `steps` steps recorded exactly once, and the run completed.
async fn recorded_once(store: &dyn JournalStore, run: &RunId, steps: u32) -> Timestamp {
    let events = store.read_all(run, 0).await.expect("journal");
    let mut names: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.event {
            Event::StepCompleted { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    let n = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(n, names.len(), "a step result was recorded twice");
    assert_eq!(n, steps as usize, "every step recorded");
    let last = events.last().expect("events");
    assert!(
        matches!(last.event, Event::RunCompleted { .. }),
        "{:?}",
        last.event
    );
    last.at
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_run_then_restart_takes_the_run_back_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    for target in targets(dir.path(), "kill") {
        // Lease 60 s: a restart that waited for it would take a minute.
        let (mut child, run) = spawn_child(
            &[
                "--target",
                &target,
                "--steps",
                "20",
                "--hang-at",
                "10",
                "--lease-secs",
                "60",
            ],
            "hanging at step 10",
        );
        child.kill().expect("SIGKILL"); // SIGKILL on Unix
        child.wait().expect("reap");
        let killed_at = Timestamp::now();
        let out = Command::new(EXE)
            .args(["recover", "--target", &target, "--run", run.as_str()])
            .args(["--lease-secs", "60"])
            .output()
            .expect("run the recovery");
        assert!(
            out.status.success(),
            "{target}: recovery failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let store = eve_benches::open_target(&target).await;
        let done_at = recorded_once(&*store, &run, 20).await;
        let took = done_at.since(killed_at);
        assert!(
            took < Duration::from_secs(30),
            "{target}: the restarted process waited {took:?}: it must take the run back at once, \
             not when the dead process's 60 s lease expires"
        );
        eve_benches::drop_target(&target).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_with_one_worker_id_the_second_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    for target in targets(dir.path(), "twins") {
        let id = "twin-worker";
        let common = ["--target", &target, "--worker-id", id, "--lease-secs", "3"];
        // A runs 100 steps of 20 ms; B, given the same id, starts while A is in the middle.
        let (a, run) = spawn_child(
            &[&common[..], &["--steps", "100", "--delay-ms", "20"]].concat(),
            "run ",
        );
        let store = eve_benches::open_target(&target).await;
        // Wait until A has recorded a few steps.
        for _ in 0..500 {
            if store.get_run(&run).await.expect("run").next_seq > 5 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let b = Command::new(EXE)
            .arg("recover")
            .args(common)
            .args(["--run", run.as_str(), "--delay-ms", "20"])
            .output()
            .expect("run B");
        let b_err = String::from_utf8_lossy(&b.stderr);
        assert_eq!(
            b.status.code(),
            Some(4),
            "{target}: B must be refused (exit 4); stderr: {b_err}"
        );
        let a_pid = a.id().to_string();
        assert!(
            b_err.contains("in use by another live process") && b_err.contains(&a_pid),
            "{target}: B names the live holder (pid {a_pid}): {b_err}"
        );
        let a = a.wait_with_output().expect("A");
        assert!(
            a.status.success(),
            "{target}: A must keep running and finish; stderr: {}",
            String::from_utf8_lossy(&a.stderr)
        );
        recorded_once(&*store, &run, 100).await;
        eve_benches::drop_target(&target).await;
    }
}
