//! Faults below the store, on real SQLite files: the disk fills (a size limit stands in for
//! the disk, so no root is needed), and the process is killed with SIGKILL while the WAL is
//! being checkpointed.

use eve_conformance::fixtures::*;
use eve_core::{JournalStore, RunId, RunQuery, StoreError};
use eve_storage_sqlite::{SqliteOptions, SqliteStore};
use std::collections::BTreeMap;
use std::path::Path;

/// A step output of about `len` bytes of hex that does not compress.
fn bulky(seed: u64, len: usize) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut s = String::with_capacity(len + 2);
    s.push('"');
    while s.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(&format!("{x:016x}"));
    }
    s.push('"');
    s
}

fn integrity_check(file: &Path) -> String {
    let conn = rusqlite::Connection::open(file).expect("open for the integrity check");
    conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_a_typed_error_reads_still_work_and_writes_resume_once_space_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("eve.db");
    let options = SqliteOptions {
        max_size_bytes: Some(2 * 1024 * 1024),
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open_with(&file, options).await.unwrap();
    let s: &dyn JournalStore = &store;

    // Runs that ended long ago: what the operator can purge to make room.
    let mut old = Vec::new();
    for i in 0..4 {
        let (run, lease) = started(s, new_run("old"), at(0)).await;
        let events = vec![step(0, &bulky(i, 60_000)), completed("null")];
        must_append(s, append(&run.run_id, 1, &lease, events, at(1))).await;
        old.push(run.run_id);
    }

    // Live runs, one step after another, until the disk is full.
    let mut committed: BTreeMap<RunId, u64> = BTreeMap::new();
    let (mut run, mut lease) = started(s, new_run("live"), at(10)).await;
    let mut next = 1u64;
    let full = loop {
        let a = append(
            &run.run_id,
            next,
            &lease,
            vec![step(next, &bulky(next, 30_000))],
            at(20),
        );
        match s.append(a).await {
            Ok(_) => {
                committed.insert(run.run_id.clone(), next + 1);
                next += 1;
                if next == 20 {
                    (run, lease) = started(s, new_run("live"), at(10)).await;
                    next = 1;
                }
            }
            Err(e) => break e,
        }
        assert!(committed.len() < 1000, "2 MiB never filled");
    };
    match &full {
        StoreError::StorageFull { backend, path } => {
            assert_eq!(*backend, "sqlite");
            assert!(path.ends_with("eve.db"), "the error names the file: {path}");
        }
        other => panic!("a full disk should be StorageFull, got {other:?}"),
    }
    let message = full.to_string();
    assert!(
        message.contains("eve.db") && message.contains("free"),
        "{message}"
    );
    assert!(
        !full.is_retryable(),
        "retrying at once gives the same answer"
    );
    // Other writes meet the same typed error once the last pages are taken.
    let mut created = 0;
    let refused = loop {
        match s.create_run(new_run("small"), at(30)).await {
            Ok(_) => created += 1,
            Err(e) => break e,
        }
        assert!(created < 10_000, "small runs never filled the last pages");
    };
    assert!(
        matches!(refused, StoreError::StorageFull { .. }),
        "{refused:?}"
    );
    // Reads still work, and show every committed step and nothing of the refused ones.
    for (run, next_seq) in &committed {
        assert_eq!(journal(s, run).await.len() as u64, *next_seq, "run {run}");
        assert_eq!(record(s, run).await.next_seq, *next_seq);
    }
    assert_eq!(
        journal(s, &run.run_id).await.len() as u64,
        next,
        "the refused append left nothing"
    );
    let listed = s.list_runs(&RunQuery::default()).await.unwrap();
    assert!(listed.len() >= committed.len() + old.len() + created);

    // The operator frees space (purges the old runs): writes resume on the same handle.
    assert_eq!(s.purge(at(5), 0).await.unwrap(), old.len());
    must_append(
        s,
        append(
            &run.run_id,
            next,
            &lease,
            vec![step(next, &bulky(next, 30_000))],
            at(40),
        ),
    )
    .await;
    let (_, _) = started(s, new_run("after"), at(41)).await;
    drop(store);
    assert_eq!(integrity_check(&file), "ok");
}

/// Set in the child process: the database file the child writes to.
const CHILD_ENV: &str = "EVE_SQLITE_FAULTS_CHILD";

/// The child of [`sigkill_during_a_wal_checkpoint_loses_nothing_committed`]: appends one step
/// per commit, forever, printing `committed <run> <next seq>` after each append returned, while
/// a second connection checkpoints the WAL in a loop and prints `checkpoint` before each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of sigkill_during_a_wal_checkpoint_loses_nothing_committed"]
async fn checkpoint_child() {
    let Ok(file) = std::env::var(CHILD_ENV) else {
        return;
    };
    let store = SqliteStore::open(&file).await.unwrap();
    let s: &dyn JournalStore = &store;
    let checkpointer = std::thread::spawn({
        let file = file.clone();
        move || {
            let conn = rusqlite::Connection::open(&file).unwrap();
            conn.busy_timeout(std::time::Duration::from_secs(5))
                .unwrap();
            loop {
                println!("checkpoint");
                let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
    });
    let mut n = 0u64;
    loop {
        let (run, lease) = started(s, new_run("crash"), at(0)).await;
        for seq in 1..=50 {
            n += 1;
            let events = vec![step(seq, &bulky(n, 8_000))];
            must_append(s, append(&run.run_id, seq, &lease, events, at(1))).await;
            println!("committed {} {}", run.run_id, seq + 1);
        }
        if checkpointer.is_finished() {
            panic!("the checkpointer stopped");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_a_wal_checkpoint_loses_nothing_committed() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("eve.db");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["checkpoint_child", "--exact", "--ignored", "--nocapture"])
        .env(CHILD_ENV, &file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("re-execute the test binary as the child");
    let stdout = child.stdout.take().unwrap();
    let mut committed: BTreeMap<RunId, u64> = BTreeMap::new();
    let mut commits = 0;
    let mut lines = std::io::BufReader::new(stdout).lines();
    // Kill at the first checkpoint that starts after 300 commits.
    for line in lines.by_ref() {
        let line = line.expect("the child's output");
        if line == "checkpoint" && commits >= 300 {
            child.kill().expect("SIGKILL the child");
            break;
        }
        if let Some(rest) = line.strip_prefix("committed ") {
            let (run, next) = rest.split_once(' ').unwrap();
            committed.insert(RunId::new(run), next.parse().unwrap());
            commits += 1;
        }
    }
    // Lines written before the kill: more commits the child reported.
    for line in lines.map_while(Result::ok) {
        if let Some(rest) = line.strip_prefix("committed ") {
            let (run, next) = rest.split_once(' ').unwrap();
            committed.insert(RunId::new(run), next.parse().unwrap());
            commits += 1;
        }
    }
    let status = child.wait().unwrap();
    assert!(!status.success(), "the child was killed: {status:?}");
    assert!(commits >= 300, "{commits} commits before the kill");

    let store = SqliteStore::open(&file).await.unwrap();
    let s: &dyn JournalStore = &store;
    for (run, next_seq) in &committed {
        let j = journal(s, run).await;
        assert!(
            j.len() as u64 >= *next_seq,
            "run {run}: {next_seq} events were committed, {} survived the kill",
            j.len()
        );
        for e in &j[1..*next_seq as usize] {
            assert!(
                matches!(&e.event, eve_core::Event::StepCompleted { cmd, .. } if *cmd == e.seq),
                "run {run} seq {}: {:?}",
                e.seq,
                e.event
            );
        }
    }
    drop(store);
    assert_eq!(integrity_check(&file), "ok");
}
