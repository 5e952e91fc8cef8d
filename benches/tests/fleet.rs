//! A fleet of 3 worker processes (the `fleet` binary) on one store, one of them SIGKILLed while
//! it holds runs: on Postgres (`EVE_TEST_POSTGRES_URL`) and on DynamoDB Local
//! (`EVE_TEST_DYNAMODB_ENDPOINT`), each skipped with a printed reason when its variable is unset.
//!
//! 30 runs of 5 steps (100 ms each), 10 runs active per process (so each process claims its
//! 10 at once and nothing stays queued), leases of 2 s; the process holding the most runs (of
//! those that recorded a step in them) is killed once half of all steps were recorded. The
//! survivors' own runs end before the lease lapses, so they have free slots for the orphaned
//! runs (claims take runs in claim-key order: with a queue of older runs, orphans would wait
//! behind it; and a DynamoDB claim takes its runs one conditional write after another, so it
//! is kept to 10). Checked here from the journals and the processes' execution logs (one line
//! per step execution, written before the step's work):
//!
//! - every run completed, with one `RunCompleted`, and each step recorded exactly once, by a
//!   process that executed it;
//! - every step executed exactly once, except what at-least-once allows: a step the killed
//!   process executed and never recorded (in flight at the kill) may have been executed once
//!   more, by the process that recorded it; at most one such step per run; never a step the
//!   killed process recorded;
//! - every run the killed process held was moved: another process started executing its steps
//!   within the lease + 1 s (3 s) of the kill.

use eve_core::{Event, JournalStoreExt, RunId, RunStatus};
use std::collections::HashMap;
use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_fleet");
const RUNS: usize = 30;
const STEPS: u32 = 5;
const LEASE_MS: i64 = 2000;

/// One fleet at a time: two at once on a small CI machine would starve each other's heartbeats.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn fleet_with_a_kill(backend: &str) {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(EXE)
        .args(["run", "--backend", backend, "--procs", "3"])
        .args(["--runs", &RUNS.to_string(), "--steps", &STEPS.to_string()])
        .args(["--delay-ms", "100", "--max-active", "10"])
        .args([
            "--lease-ms",
            &LEASE_MS.to_string(),
            "--kill-at",
            "0.5",
            "--keep",
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .expect("run the fleet");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| {
            panic!(
                "{backend}: no report; stdout: {stdout}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    println!("{backend}: {report}");
    assert_eq!(
        report["violations"],
        serde_json::json!([]),
        "{backend}: the driver's checks"
    );
    assert!(out.status.success(), "{backend}: {report}");

    let kill = &report["kill"];
    let killed = kill["worker"]
        .as_str()
        .expect("a process was killed")
        .to_owned();
    let kill_at = kill["at_ms"].as_i64().expect("kill time");
    let orphaned: Vec<RunId> = kill["orphaned"]
        .as_array()
        .expect("orphaned runs")
        .iter()
        .map(|r| RunId::new(r.as_str().expect("run id")))
        .collect();
    assert!(
        !orphaned.is_empty(),
        "{backend}: the killed process held runs"
    );

    // Who executed what, when: (run, step) → (worker, start ms).
    let mut ran: HashMap<(String, u32), Vec<(String, i64)>> = HashMap::new();
    for k in 0..3 {
        let log = std::fs::read_to_string(dir.path().join(format!("exec-{k}.log")))
            .expect("an execution log");
        for line in log.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            assert_eq!(f.len(), 4, "{line:?}");
            let step = f[1].parse().expect("step number");
            let at = f[3].parse().expect("start time");
            ran.entry((f[0].to_owned(), step))
                .or_default()
                .push((f[2].to_owned(), at));
        }
    }

    let target = report["target"].as_str().expect("target");
    let store = eve_benches::open_target(target).await;
    let runs = store
        .list_runs(&eve_core::RunQuery::default())
        .await
        .expect("runs");
    assert_eq!(runs.len(), RUNS, "{backend}: every enqueued run, no other");
    let mut reexecuted = 0;
    let mut recorders = std::collections::HashSet::new();
    for rec in &runs {
        let run = rec.run_id.to_string();
        assert_eq!(rec.status, RunStatus::Completed, "{backend}: {run}");
        let events = store.read_all(&rec.run_id, 0).await.expect("journal");
        let ends = events
            .iter()
            .filter(|e| matches!(e.event, Event::RunCompleted { .. }))
            .count();
        assert_eq!(ends, 1, "{backend}: {run} completed exactly once");
        // step → (recorder, at)
        let mut recorded: HashMap<u32, Vec<(String, i64)>> = HashMap::new();
        for e in &events {
            if let Event::StepCompleted { name, output, .. } = &e.event {
                let step: u32 = name[1..].parse().expect("step name s<N>");
                let v: serde_json::Value = serde_json::from_str(output.get()).expect("output");
                let w = v["w"].as_str().expect("the recording worker").to_owned();
                recorded.entry(step).or_default().push((w, e.at.millis()));
            }
        }
        let mut in_flight = 0;
        for step in 1..=STEPS {
            let by = &recorded[&step];
            assert_eq!(by.len(), 1, "{backend}: {run} step {step} recorded once");
            let recorder = &by[0].0;
            recorders.insert(recorder.clone());
            let execs: Vec<String> = ran
                .get(&(run.clone(), step))
                .map(|v| v.iter().map(|(w, _)| w.clone()).collect())
                .unwrap_or_default();
            assert!(
                execs.contains(recorder),
                "{backend}: {run} step {step} recorded by {recorder}, which ran it"
            );
            if execs.len() > 1 {
                // The only second execution allowed: the killed process's unrecorded one.
                assert_eq!(execs.len(), 2, "{backend}: {run} step {step}: {execs:?}");
                assert!(
                    execs.iter().filter(|w| **w == killed).count() == 1 && *recorder != killed,
                    "{backend}: {run} step {step} executed twice, not as the killed \
                     process's in-flight step: {execs:?}, recorded by {recorder}"
                );
                in_flight += 1;
            }
        }
        assert!(
            in_flight <= 1,
            "{backend}: {run}: {in_flight} re-executed steps"
        );
        reexecuted += in_flight;
        if orphaned.contains(&rec.run_id) {
            // Moved: another process started executing its steps.
            let next = (1..=STEPS)
                .filter_map(|step| ran.get(&(run.clone(), step)))
                .flatten()
                .filter(|(w, at)| *w != killed && *at >= kill_at)
                .map(|(_, at)| *at)
                .min();
            let Some(next) = next else {
                // Nothing moved: the killed process's last append (its last step and the end)
                // was in flight at the kill and the server committed it after.
                let last = &recorded[&STEPS][0];
                let end = events.last().expect("events");
                assert!(
                    last.0 == killed && end.at.millis() == last.1,
                    "{backend}: orphaned {run} never moved"
                );
                continue;
            };
            assert!(
                next - kill_at <= LEASE_MS + 1000,
                "{backend}: {run} moved {} ms after the kill; the lease is {LEASE_MS} ms",
                next - kill_at
            );
        }
    }
    assert!(
        recorders.len() == 3,
        "{backend}: all 3 processes recorded steps: {recorders:?}"
    );
    assert_eq!(
        kill["reexecuted"].as_u64(),
        Some(reexecuted as u64),
        "{backend}: the driver counted the same re-executions"
    );
    // Checked: the schema or table goes (a failed check above leaves it to look at).
    eve_benches::drop_target(target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_of_three_with_a_sigkill_on_postgres() {
    if std::env::var("EVE_TEST_POSTGRES_URL").is_err() {
        eprintln!("skipped: EVE_TEST_POSTGRES_URL is unset (CI sets it)");
        return;
    }
    fleet_with_a_kill("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_of_three_with_a_sigkill_on_dynamodb_local() {
    if std::env::var("EVE_TEST_DYNAMODB_ENDPOINT").is_err() {
        eprintln!("skipped: EVE_TEST_DYNAMODB_ENDPOINT is unset (CI sets it)");
        return;
    }
    fleet_with_a_kill("dynamodb").await;
}
