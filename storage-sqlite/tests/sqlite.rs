//! SQLite-specific behaviour: corrupted rows, several handles on one file, group commit.

use eve_core::{
    Append, AppendId, CallId, DeploymentId, Event, Execution, JournalStore, JournalStoreExt, Lease,
    NewRun, Payload, RunId, SessionId, StoreError, Timestamp, WorkerId, WorkflowId,
};
use eve_storage_sqlite::{SqliteOptions, SqliteStore, Synchronous};
use sqlx::{Connection, SqliteConnection};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const T: Timestamp = Timestamp(1_700_000_000_000);
const TTL: Duration = Duration::from_secs(60);

fn new_run(id: &str) -> NewRun {
    NewRun {
        run_id: RunId::new(id),
        idempotency_key: None,
        workflow_id: WorkflowId::new("sqlite::test"),
        deployment_id: DeploymentId::new("dep"),
        tool: "tool".into(),
        input: Payload::from_json("{}").expect("json"),
        session_id: SessionId::new("s"),
        call_id: CallId::new(format!("call-{id}")),
        execution: Execution::Default,
        traceparent: None,
        reset_from: None,
    }
}

fn progress(cmd: u64) -> Event {
    Event::Progress {
        cmd,
        value: Payload::from_json(format!("{{\"n\":{cmd}}}")).expect("json"),
    }
}

fn append(run: &RunId, expected_seq: u64, lease: &Lease, events: Vec<Event>) -> Append {
    Append {
        run: run.clone(),
        expected_seq,
        lease: lease.clone(),
        append_id: AppendId::random(),
        events,
        now: T,
    }
}

/// A run with three appends (rows at seqs 0, 1..3, 3..6), claimed by a worker.
async fn seeded(store: &SqliteStore, id: &str) -> (RunId, Lease) {
    let run = RunId::new(id);
    store.create_run(new_run(id), T).await.expect("create");
    let lease = store
        .register_worker(
            &WorkerId::new(format!("w-{id}")),
            &DeploymentId::new("dep"),
            TTL,
            T,
        )
        .await
        .expect("register");
    let claimed = store.claim(&lease, 1, T).await.expect("claim");
    assert_eq!(claimed.len(), 1);
    store
        .append(append(&run, 1, &lease, (0..2).map(progress).collect()))
        .await
        .expect("append");
    store
        .append(append(&run, 3, &lease, (2..5).map(progress).collect()))
        .await
        .expect("append");
    (run, lease)
}

async fn raw(path: &Path, sql: &'static str, run: &str, first_seq: i64) {
    let mut conn = SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .expect("raw connection");
    let done = sqlx::query(sql)
        .bind(run)
        .bind(first_seq)
        .execute(&mut conn)
        .await
        .expect("raw sql");
    assert_eq!(done.rows_affected(), 1, "{sql} changed no row");
}

fn assert_corrupt(
    result: Result<Vec<eve_core::StoredEvent>, StoreError>,
    run: &str,
    seq: u64,
    says: &str,
) {
    match result {
        Err(StoreError::Corrupt {
            run: r,
            seq: s,
            reason,
        }) => {
            assert_eq!(r.as_str(), run);
            assert_eq!(s, seq, "{reason}");
            assert!(reason.contains(says), "{reason:?} should mention {says:?}");
        }
        other => panic!("expected Corrupt at {run}/{seq}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_rows_are_typed_errors_and_lose_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("j.db");
    let store = SqliteStore::open(&path).await.expect("open");
    let (bad_body, _) = seeded(&store, "bad-body").await;
    let (bad_version, _) = seeded(&store, "bad-version").await;
    let (missing, _) = seeded(&store, "missing-row").await;
    let (control_byte, _) = seeded(&store, "control-byte").await;
    let (intact, lease) = seeded(&store, "intact").await;

    raw(
        &path,
        "UPDATE events SET body = substr(body, 1, 10) WHERE run_id = ? AND first_seq = ?",
        "bad-body",
        3,
    )
    .await;
    raw(
        &path,
        "UPDATE events SET version = 99 WHERE run_id = ? AND first_seq = ?",
        "bad-version",
        1,
    )
    .await;
    raw(
        &path,
        "DELETE FROM events WHERE run_id = ? AND first_seq = ?",
        "missing-row",
        1,
    )
    .await;

    raw(
        &path,
        "UPDATE events SET body = X'5B015D' WHERE run_id = ? AND first_seq = ?",
        "control-byte",
        1,
    )
    .await;

    // A raw control byte in a body (never written by the codec) is found row by row.
    assert_corrupt(
        store.read_all(&control_byte, 0).await,
        "control-byte",
        1,
        "undecodable",
    );
    // Truncated bytes: the row at seq 3; reading from inside it (seq 4) names the row's seq.
    assert_corrupt(
        store.read(&bad_body, 4, 10).await,
        "bad-body",
        3,
        "undecodable",
    );
    assert_corrupt(
        store.read_all(&bad_body, 0).await,
        "bad-body",
        3,
        "undecodable",
    );
    // Rows before the corrupt one still read.
    assert_eq!(
        store
            .read(&bad_body, 0, 3)
            .await
            .expect("intact prefix")
            .len(),
        3
    );
    // A codec version past this build's is a newer eve's row: FormatTooNew, naming it.
    match store.read(&bad_version, 0, 10).await {
        Err(StoreError::FormatTooNew {
            run, seq, version, ..
        }) => assert_eq!((run.as_str(), seq, version), ("bad-version", 1, 99)),
        other => panic!("expected FormatTooNew at bad-version/1, got {other:?}"),
    }
    // A missing row is a gap, not a short read.
    assert_corrupt(
        store.read(&missing, 0, 10).await,
        "missing-row",
        1,
        "missing",
    );
    assert_corrupt(
        store.read(&missing, 2, 10).await,
        "missing-row",
        1,
        "1..3 are missing",
    );
    // Other runs are untouched and still take appends.
    assert_eq!(store.read_all(&intact, 0).await.expect("intact").len(), 6);
    store
        .append(append(&intact, 6, &lease, vec![progress(9)]))
        .await
        .expect("append after corruption elsewhere");
    assert_eq!(store.read_all(&intact, 0).await.expect("intact").len(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_with_a_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("j.db");
    drop(SqliteStore::open(&path).await.expect("open"));
    let mut conn = SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .expect("raw connection");
    sqlx::query("INSERT INTO eve_schema (version) VALUES (99)")
        .execute(&mut conn)
        .await
        .expect("bump version");
    conn.close().await.expect("close");
    let err = SqliteStore::open(&path).await.expect_err("newer schema");
    assert!(
        matches!(
            err,
            StoreError::Other {
                backend: "sqlite",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("schema version 99"), "{err}");
}

/// Two handles (two pools, two writer tasks) on one file race appends and claims on the same
/// runs: each round has exactly one winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_on_one_file_have_one_winner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("j.db");
    let options = SqliteOptions {
        synchronous: Synchronous::Normal,
        ..SqliteOptions::default()
    };
    let h1 = Arc::new(
        SqliteStore::open_with(&path, options.clone())
            .await
            .expect("h1"),
    );
    let h2 = Arc::new(SqliteStore::open_with(&path, options).await.expect("h2"));
    let dep = DeploymentId::new("dep");

    // Claims: each round makes fresh runs, and one worker per handle claims them all at once.
    for round in 0..20 {
        let runs: Vec<RunId> = (0..4)
            .map(|i| RunId::new(format!("c-{round}-{i}")))
            .collect();
        for (i, run) in runs.iter().enumerate() {
            let h = if i % 2 == 0 { &h1 } else { &h2 };
            h.create_run(new_run(run.as_str()), T)
                .await
                .expect("create");
        }
        let l1 = h1
            .register_worker(&WorkerId::new(format!("a-{round}")), &dep, TTL, T)
            .await
            .expect("l1");
        let l2 = h2
            .register_worker(&WorkerId::new(format!("b-{round}")), &dep, TTL, T)
            .await
            .expect("l2");
        let (c1, c2) = tokio::join!(h1.claim(&l1, 100, T), h2.claim(&l2, 100, T));
        let (c1, c2) = (c1.expect("claim 1"), c2.expect("claim 2"));
        let mut all: Vec<&str> = c1.iter().chain(&c2).map(|r| r.run_id.as_str()).collect();
        all.sort_unstable();
        let mut want: Vec<&str> = runs.iter().map(RunId::as_str).collect();
        want.sort_unstable();
        assert_eq!(all, want, "round {round}: every run claimed exactly once");
        // Whoever won a run owns it, as both handles see it.
        for r in c1.iter() {
            assert_eq!(
                h2.get_run(&r.run_id).await.expect("get").owner,
                Some((l1.worker.clone(), l1.epoch))
            );
        }
    }

    // Appends: one run, one lease, both handles append at the same seq each round.
    let run = RunId::new("race");
    h1.create_run(new_run("race"), T).await.expect("create");
    let lease = h2
        .register_worker(&WorkerId::new("racer"), &dep, TTL, T)
        .await
        .expect("register");
    assert_eq!(h1.claim(&lease, 100, T).await.expect("claim").len(), 1);
    let mut seq = 1;
    let (mut wins1, mut wins2) = (0, 0);
    for round in 0..50 {
        let (a, b) = tokio::join!(
            h1.append(append(&run, seq, &lease, vec![progress(round)])),
            h2.append(append(
                &run,
                seq,
                &lease,
                vec![progress(round), progress(round)]
            )),
        );
        let (won, lost) = match (&a, &b) {
            (Ok(w), Err(l)) => {
                wins1 += 1;
                (w, l)
            }
            (Err(l), Ok(w)) => {
                wins2 += 1;
                (w, l)
            }
            other => panic!("round {round}: expected one winner, got {other:?}"),
        };
        assert_eq!(won.first_seq, seq);
        match lost {
            StoreError::Conflict {
                expected, actual, ..
            } => {
                assert_eq!((*expected, *actual), (seq, won.next_seq));
            }
            other => panic!("round {round}: the loser should get Conflict, got {other:?}"),
        }
        seq = won.next_seq;
    }
    assert_eq!(wins1 + wins2, 50);
    // Both handles read the same journal, with no gap and no fork.
    let j1 = h1.read_all(&run, 0).await.expect("read 1");
    let j2 = h2.read_all(&run, 0).await.expect("read 2");
    assert_eq!(j1, j2);
    assert_eq!(j1.len() as u64, seq);
    assert!(j1.iter().enumerate().all(|(i, e)| e.seq == i as u64));
}

/// Many concurrent appends to different runs share transactions, yet one run's conflict rolls
/// back only its own append.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_keeps_each_append_own_outcome() {
    let store = Arc::new(SqliteStore::in_memory().await.expect("store"));
    let dep = DeploymentId::new("dep");
    let lease = store
        .register_worker(&WorkerId::new("w"), &dep, TTL, T)
        .await
        .expect("register");
    let runs: Vec<RunId> = (0..32).map(|i| RunId::new(format!("g-{i}"))).collect();
    for r in &runs {
        store
            .create_run(new_run(r.as_str()), T)
            .await
            .expect("create");
    }
    assert_eq!(
        store.claim(&lease, 100, T).await.expect("claim").len(),
        runs.len()
    );
    let mut tasks = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let (store, r, lease) = (store.clone(), r.clone(), lease.clone());
        // Odd runs name a wrong seq: they must fail alone.
        let expected = if i % 2 == 0 { 1 } else { 7 };
        tasks.push(tokio::spawn(async move {
            store
                .append(append(&r, expected, &lease, vec![progress(0), progress(1)]))
                .await
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        let result = t.await.expect("task");
        if i % 2 == 0 {
            assert_eq!(result.expect("even run appends").next_seq, 3);
        } else {
            assert!(
                matches!(
                    result,
                    Err(StoreError::Conflict {
                        expected: 7,
                        actual: 1,
                        ..
                    })
                ),
                "{result:?}"
            );
        }
        let next = store.get_run(&runs[i]).await.expect("get").next_seq;
        assert_eq!(next, if i % 2 == 0 { 3 } else { 1 });
    }
}

/// A file locked by another writer past the busy timeout is `Unavailable` (retryable), and the
/// same call succeeds once the lock is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_file_is_unavailable_then_works() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("j.db");
    let store = SqliteStore::open_with(
        &path,
        SqliteOptions {
            busy_timeout: Duration::from_millis(50),
            ..SqliteOptions::default()
        },
    )
    .await
    .expect("open");
    let mut other = SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .expect("raw connection");
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .expect("lock");
    let err = store
        .create_run(new_run("locked"), T)
        .await
        .expect_err("the file is locked");
    assert!(err.is_retryable(), "{err:?}");
    assert!(
        matches!(
            err,
            StoreError::Unavailable {
                backend: "sqlite",
                ..
            }
        ),
        "{err:?}"
    );
    sqlx::query("COMMIT")
        .execute(&mut other)
        .await
        .expect("unlock");
    let created = store.create_run(new_run("locked"), T).await.expect("retry");
    assert!(created.created);
    assert_eq!(
        store
            .read_all(&RunId::new("locked"), 0)
            .await
            .expect("read")
            .len(),
        1
    );
}

/// Another handle on the file (another process, as far as SQLite can tell) cannot notify this
/// one, yet its writes wake this handle's idle workers and watchers within the data-version
/// watch's interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_handles_writes_wake_this_handles_waiters() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("eve.db");
    let here = SqliteStore::open(&path).await.unwrap();
    let there = SqliteStore::open(&path).await.unwrap();
    let mut idle = here.wakeups().await.expect("wake-ups");
    let mut watcher = here
        .watch(&eve_core::WatchKey::Session(SessionId::new("elsewhere")))
        .await
        .expect("watch");
    // Let the watch read its first version.
    tokio::time::sleep(Duration::from_millis(250)).await;
    idle.borrow_and_update();
    watcher.borrow_and_update();
    there
        .create_run(new_run("from-there"), Timestamp(1))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), idle.changed())
        .await
        .expect("an idle worker here is woken by a write there")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), watcher.changed())
        .await
        .expect("a watcher here is woken by a write there")
        .unwrap();
}

/// The worker lock (contract clause 11) is a file beside the database that names its holder
/// while held and is gone once dropped; a lock file a killed process left behind (present,
/// but locked by nobody) does not stand in the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_lock_file_names_the_holder_and_a_left_file_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("w.db")).await.unwrap();
    let lock_files = || {
        std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(".lock"))
            .collect::<Vec<_>>()
    };
    let id = eve_core::WorkerId::new("host/dep");
    let lock = store.lock_worker(&id).await.unwrap();
    let files = lock_files();
    assert_eq!(files.len(), 1, "{files:?}");
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(
        text.starts_with("host/dep\n") && text.contains(lock.holder()),
        "{text}"
    );
    drop(lock);
    assert!(lock_files().is_empty(), "the holder deletes its file");
    // What a SIGKILLed holder leaves: the file, unlocked.
    std::fs::write(&files[0], "host/dep\npid 1 on host gone, since long ago\n").unwrap();
    let lock = store.lock_worker(&id).await.expect("a left file is taken");
    assert!(std::fs::read_to_string(&files[0])
        .unwrap()
        .contains(lock.holder()));
}
