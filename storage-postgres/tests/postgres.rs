//! Postgres-specific tests: corrupt rows, migrations, schema names, wake-ups and watches over
//! LISTEN/NOTIFY, orphaned runs (superseded, retired, expired leases), group commit isolation
//! and faults (terminated connections, refused connections). Each skips, loudly, when
//! `EVE_TEST_POSTGRES_URL` is unset.

mod common;

use common::{options, random_schema, url_or_skip, PgFactory};
use eve_conformance::fixtures::{
    append, ask, completed, hook, journal, json, must_append, new_run, record, started, step,
    unique, worker, DEPLOYMENT, TTL,
};
use eve_core::{
    DeploymentId, Event, InputResponse, JournalStore, Lease, RunId, SessionId, StoreError,
    Timestamp, WatchKey, WorkerId,
};
use eve_storage_postgres::{drop_schema, PostgresOptions, PostgresStore, SCHEMA_VERSION};
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn at(ms: i64) -> Timestamp {
    Timestamp(ms)
}

async fn raw(url: &str) -> PgConnection {
    PgConnection::connect(url).await.expect("raw connection")
}

async fn exec(conn: &mut PgConnection, sql: String) {
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(conn)
        .await
        .expect("raw SQL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_rows_are_typed_errors_naming_run_and_seq() {
    let Some(url) = url_or_skip("corrupt_rows_are_typed_errors_naming_run_and_seq") else {
        return;
    };
    let f = PgFactory::from_env().expect("url");
    let store = f.store().await;
    let s = store.schema().to_owned();
    let (run, lease) = started(&store, new_run("corrupt"), at(0)).await;
    let id = &run.run_id;
    must_append(
        &store,
        append(id, 1, &lease, vec![step(1, "1"), step(2, "2")], at(1)),
    )
    .await;
    must_append(&store, append(id, 3, &lease, vec![step(3, "3")], at(2))).await;
    let mut conn = raw(&url).await;
    let cases = [
        ("SET body = '\\x5b7b'::bytea", "truncated body"),
        ("SET version = 99", "unknown version"),
        ("SET count = 3", "wrong count"),
        (
            "SET body = convert_to('[{\"Nope\":{}}, {\"Nope\":{}}]', 'UTF8')",
            "unknown event",
        ),
    ];
    let good: (Vec<u8>, i16, i32) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT body, version, count FROM \"{s}\".events WHERE run_id = $1 AND first_seq = 1"
    )))
    .bind(id.as_str())
    .fetch_one(&mut conn)
    .await
    .expect("row");
    for (set, what) in cases {
        exec(
            &mut conn,
            format!("UPDATE \"{s}\".events {set} WHERE run_id = '{id}' AND first_seq = 1"),
        )
        .await;
        match store.read(id, 0, 100).await {
            Err(StoreError::Corrupt { run, seq, reason }) => {
                assert_eq!((&run, seq), (id, 1), "{what}: names run and seq ({reason})");
            }
            // A version past this build's is a newer eve's row, not damage.
            Err(StoreError::FormatTooNew {
                run, seq, version, ..
            }) if what == "unknown version" => {
                assert_eq!(
                    (&run, seq, version),
                    (id, 1, 99),
                    "{what}: names run, seq, version"
                );
            }
            other => panic!("{what}: expected Corrupt, got {other:?}"),
        }
        // Rows around it still read.
        assert_eq!(
            store.read(id, 0, 1).await.expect("seq 0").len(),
            1,
            "{what}"
        );
        assert_eq!(
            store.read(id, 3, 10).await.expect("seq 3").len(),
            1,
            "{what}"
        );
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE \"{s}\".events SET body = $2, version = $3, count = $4 WHERE run_id = $1 AND first_seq = 1"
        )))
        .bind(id.as_str())
        .bind(&good.0)
        .bind(good.1)
        .bind(good.2)
        .execute(&mut conn)
        .await
        .expect("restore");
        assert_eq!(
            journal(&store, id).await.len(),
            4,
            "{what}: restored row reads"
        );
    }
    // A missing row (a gap) is Corrupt too, never a silently short journal.
    exec(
        &mut conn,
        format!("DELETE FROM \"{s}\".events WHERE run_id = '{id}' AND first_seq = 1"),
    )
    .await;
    assert!(matches!(
        store.read(id, 0, 100).await,
        Err(StoreError::Corrupt { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_rerun_and_schema_names_are_checked() {
    let Some(url) = url_or_skip("migrations_rerun_and_schema_names_are_checked") else {
        return;
    };
    let f = PgFactory::from_env().expect("url");
    let store = f.store().await;
    let s = store.schema().to_owned();
    // Re-running the migrations (a second connect, concurrently) is a no-op.
    let (a, b) = tokio::join!(
        PostgresStore::connect_with(&url, options(&s)),
        PostgresStore::connect_with(&url, options(&s))
    );
    a.expect("reconnect a");
    b.expect("reconnect b");
    let mut conn = raw(&url).await;
    let versions: Vec<i32> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT version FROM \"{s}\".eve_migrations ORDER BY version"
    )))
    .fetch_all(&mut conn)
    .await
    .expect("versions");
    assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    // from_pool shares the schema.
    let pool = sqlx::PgPool::connect(&url).await.expect("pool");
    let shared = PostgresStore::from_pool(pool, &s).await.expect("from_pool");
    let c = store.create_run(new_run("m"), at(0)).await.expect("create");
    assert_eq!(
        shared.get_run(&c.run.run_id).await.expect("get").run_id,
        c.run.run_id
    );
    for bad in ["", "Eve", "eve-x", "x\"; DROP SCHEMA public; --", "pg_temp"] {
        let opts = PostgresOptions {
            schema: bad.into(),
            ..PostgresOptions::default()
        };
        match PostgresStore::connect_with(&url, opts).await {
            Err(StoreError::InvalidInput(m)) => assert!(m.contains("schema"), "{m}"),
            other => panic!("schema {bad:?}: expected InvalidInput, got {other:?}"),
        }
    }
    match PostgresStore::connect("not a url").await {
        Err(StoreError::InvalidInput(m)) => assert!(m.contains("URL"), "{m}"),
        other => panic!("expected InvalidInput for a bad URL, got {other:?}"),
    }
}

async fn schema_exists(conn: &mut PgConnection, schema: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
        .bind(schema)
        .fetch_one(conn)
        .await
        .expect("pg_namespace")
}

/// `drop_schema` removes a store's schema with its runs, is a no-op the second time, and
/// refuses a name a store would refuse without touching the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_schema_removes_a_schema_and_everything_in_it() {
    let Some(url) = url_or_skip("drop_schema_removes_a_schema_and_everything_in_it") else {
        return;
    };
    let s = random_schema();
    let store = PostgresStore::connect_with(&url, options(&s))
        .await
        .expect("connect");
    store.create_run(new_run("d"), at(0)).await.expect("create");
    let mut conn = raw(&url).await;
    assert!(
        schema_exists(&mut conn, &s).await,
        "the store made its schema"
    );
    drop_schema(&url, &s).await.expect("drop");
    assert!(!schema_exists(&mut conn, &s).await, "the schema is gone");
    drop_schema(&url, &s)
        .await
        .expect("a second drop is a no-op");
    match store.create_run(new_run("e"), at(1)).await {
        Err(StoreError::Other { .. }) => {}
        other => panic!("a store on a dropped schema must fail its next call, got {other:?}"),
    }
    match drop_schema(&url, "public; DROP TABLE x").await {
        Err(StoreError::InvalidInput(m)) => assert!(m.contains("schema"), "{m}"),
        other => panic!("expected InvalidInput for a bad name, got {other:?}"),
    }
    match drop_schema("not a url", &s).await {
        Err(StoreError::InvalidInput(m)) => assert!(m.contains("URL"), "{m}"),
        other => panic!("expected InvalidInput for a bad URL, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connection_is_a_quick_clear_error() {
    if url_or_skip("refused_connection_is_a_quick_clear_error").is_none() {
        return;
    }
    let start = Instant::now();
    match PostgresStore::connect("postgres://postgres@127.0.0.1:1/test").await {
        Err(e @ StoreError::Unavailable { .. }) => {
            let m = e.to_string();
            assert!(
                m.contains("127.0.0.1:1") && m.contains("cannot connect"),
                "{m}"
            );
            assert!(e.is_retryable());
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
}

/// Notifications on the schema's channel, in commit order, through a test-owned listener.
async fn listener(url: &str, channel: &str) -> sqlx::postgres::PgListener {
    let mut l = sqlx::postgres::PgListener::connect(url)
        .await
        .expect("listener");
    l.listen(channel).await.expect("listen");
    l
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_wake_subscribers_and_step_appends_do_not_notify() {
    let Some(url) = url_or_skip("deliveries_wake_subscribers_and_step_appends_do_not_notify")
    else {
        return;
    };
    let f = PgFactory::from_env().expect("url");
    let store = f.store().await;
    // A second handle (another process) does the writes.
    let other = PostgresStore::connect_with(&url, options(store.schema()))
        .await
        .expect("open");
    let mut wake = store.subscribe().await.expect("subscribe");
    let mut probe = listener(&url, store.channel()).await;
    let limit = Duration::from_secs(10);

    // A new run wakes the subscriber.
    let (run, lease) = started(&other, new_run("wake"), at(0)).await;
    tokio::time::timeout(limit, wake.notified())
        .await
        .expect("new run wakes")
        .expect("alive");
    // Step appends and a release with nothing pending do not notify.
    let token = unique("token");
    must_append(
        &other,
        append(&run.run_id, 1, &lease, vec![hook(1, &token)], at(1)),
    )
    .await;
    must_append(
        &other,
        append(&run.run_id, 2, &lease, vec![step(2, "2")], at(2)),
    )
    .await;
    other
        .release(&lease, &run.run_id, 3, at(3))
        .await
        .expect("release");
    // A hook delivery to the idle run wakes the subscriber.
    other
        .deliver_hook(&token, json("{}"), None, at(4))
        .await
        .expect("deliver");
    tokio::time::timeout(limit, wake.notified())
        .await
        .expect("delivery wakes")
        .expect("alive");
    // A second delivery while the first is unprocessed is coalesced: no NOTIFY.
    other
        .deliver_hook(&token, json("{}"), None, at(5))
        .await
        .expect("deliver again");
    let mut conn = raw(&url).await;
    sqlx::query("SELECT pg_notify($1, 'marker')")
        .bind(store.channel())
        .execute(&mut conn)
        .await
        .expect("marker");
    let got: Vec<String> = {
        let mut v = Vec::new();
        loop {
            let n = tokio::time::timeout(limit, probe.recv())
                .await
                .expect("probe")
                .expect("recv");
            v.push(n.payload().to_owned());
            if n.payload() == "marker" {
                break v;
            }
        }
    };
    let (d, r) = (format!("d:{DEPLOYMENT}"), format!("r:{}", run.run_id));
    assert_eq!(got, vec![d.clone(), r.clone(), d, r, "marker".to_owned()],
        "a worker NOTIFY for the new run and for the first delivery, none for appends, the release \
         or the coalesced delivery; a run NOTIFY for each delivery");
}

async fn terminate(conn: &mut PgConnection, app: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = $1 AND pid <> pg_backend_pid()",
    )
    .bind(app)
    .fetch_one(conn)
    .await
    .expect("terminate")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_connections_lose_and_double_nothing() {
    let Some(url) = url_or_skip("terminated_connections_lose_and_double_nothing") else {
        return;
    };
    let f = PgFactory::from_env().expect("url");
    let store = Arc::new(f.store().await);
    let app = store.schema().to_owned();
    let mut wake = store.subscribe().await.expect("subscribe");
    let mut watch = store
        .watch(&WatchKey::Session(SessionId::new("nobody-writes-here")))
        .await
        .expect("watch");
    const RUNS: usize = 8;
    const STEPS: u64 = 40;
    let mut runs = Vec::new();
    for i in 0..RUNS {
        runs.push(started(&*store, new_run(&format!("fault{i}")), at(0)).await);
    }
    let (progress_tx, mut progress) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let mut tasks = Vec::new();
    for (run, lease) in runs.clone() {
        let store = store.clone();
        let progress_tx = progress_tx.clone();
        tasks.push(tokio::spawn(async move {
            let mut unavailable = 0u32;
            for seq in 1..=STEPS {
                let a = append(
                    &run.run_id,
                    seq,
                    &lease,
                    vec![step(seq, &seq.to_string())],
                    at(seq as i64),
                );
                let mut tries = 0;
                loop {
                    match store.append(a.clone()).await {
                        Ok(r) => {
                            assert_eq!(r.first_seq, seq);
                            break;
                        }
                        Err(e) if e.is_retryable() && tries < 50 => {
                            unavailable += 1;
                            tries += 1;
                            tokio::task::yield_now().await;
                        }
                        Err(e) => panic!("append {seq} to {}: {e}", run.run_id),
                    }
                }
                let _ = progress_tx.send(seq);
            }
            unavailable
        }));
    }
    drop(progress_tx);
    // Kill every connection of the store three times while the appends run.
    let mut killer = raw(&url).await;
    let mut done = 0u64;
    let mut kills = Vec::new();
    while let Some(_seq) = progress.recv().await {
        done += 1;
        if [20, 120, 240].contains(&done) {
            kills.push(terminate(&mut killer, &app).await);
        }
    }
    let mut unavailable = 0;
    for t in tasks {
        unavailable += t.await.expect("append task");
    }
    println!("terminated {kills:?} backends; {unavailable} appends answered Unavailable and were retried");
    assert!(
        kills.iter().sum::<i64>() > 0,
        "the test killed no connection"
    );
    for (run, _) in &runs {
        let j = journal(&*store, &run.run_id).await;
        assert_eq!(
            j.len() as u64,
            STEPS + 1,
            "nothing lost or doubled on {}",
            run.run_id
        );
        for (i, e) in j.iter().enumerate().skip(1) {
            assert_eq!(e.seq, i as u64);
            match &e.event {
                Event::StepCompleted { cmd, .. } => assert_eq!(*cmd, i as u64),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    // The listener was killed too: it reconnects and tells subscribers to poll.
    tokio::time::timeout(Duration::from_secs(10), wake.notified())
        .await
        .expect("a wake-up after the listener reconnects")
        .expect("alive");
    tokio::time::timeout(Duration::from_secs(10), watch.changed())
        .await
        .expect("watchers are woken after the listener reconnects")
        .expect("alive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_gives_each_append_its_own_outcome() {
    if url_or_skip("group_commit_gives_each_append_its_own_outcome").is_none() {
        return;
    }
    let f = PgFactory::from_env().expect("url");
    let store = Arc::new(f.store().await);
    let mut runs = Vec::new();
    for i in 0..16 {
        runs.push(started(&*store, new_run(&format!("gc{i}")), at(0)).await);
    }
    let token = unique("shared-token");
    // Concurrently: even runs append correctly, odd runs at a wrong seq; runs 0 and 2 race for
    // one hook token. Whatever batches form, each append gets its own outcome.
    let mut tasks = Vec::new();
    for (i, (run, lease)) in runs.iter().enumerate() {
        let store = store.clone();
        let mut events = vec![step(1, "1")];
        if i == 0 || i == 2 {
            events.push(hook(2, &token));
        }
        let a = append(
            &run.run_id,
            if i % 2 == 0 { 1 } else { 7 },
            lease,
            events,
            at(1),
        );
        tasks.push(tokio::spawn(async move { store.append(a).await }));
    }
    let mut token_winners = 0;
    for (i, t) in tasks.into_iter().enumerate() {
        let r = t.await.expect("task");
        match (i, r) {
            (0 | 2, Ok(_)) => token_winners += 1,
            (0 | 2, Err(StoreError::AlreadyExists { .. })) => {}
            (i, Ok(a)) if i % 2 == 0 => assert_eq!((a.first_seq, a.next_seq), (1, 2)),
            (
                i,
                Err(StoreError::Conflict {
                    expected: 7,
                    actual: 1,
                    ..
                }),
            ) if i % 2 == 1 => {}
            (i, other) => panic!("run {i}: unexpected {other:?}"),
        }
    }
    assert_eq!(token_winners, 1, "one run gets the token");
    // A command id a BIGINT cannot hold is refused before any SQL, and writes nothing.
    let (run, lease) = &runs[1];
    let too_big = Event::SleepScheduled {
        cmd: u64::MAX,
        wake_at: at(5),
    };
    assert!(
        matches!(
            store
                .append(append(&run.run_id, 1, lease, vec![too_big], at(2)))
                .await,
            Err(StoreError::InvalidInput(_))
        ),
        "a command id above i64::MAX is InvalidInput"
    );
    for (i, (run, _)) in runs.iter().enumerate() {
        let len = journal(&*store, &run.run_id).await.len();
        let want = match i {
            0 | 2 => len, // checked by the winner count
            i if i % 2 == 0 => 2,
            _ => 1,
        };
        assert_eq!(len, want, "run {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_isolate_deployments_in_one_database() {
    let Some(url) = url_or_skip("schemas_isolate_deployments_in_one_database") else {
        return;
    };
    let f = PgFactory::from_env().expect("url");
    let a = f.store().await;
    let b = f.store().await;
    assert_ne!(a.schema(), b.schema());
    let c = a.create_run(new_run("iso"), at(0)).await.expect("create");
    assert!(matches!(
        b.get_run(&c.run.run_id).await,
        Err(StoreError::NotFound { .. })
    ));
    let _ = (url, random_schema());
}

/// The limit on waiting for something that must happen; never a sleep.
const LIMIT: Duration = Duration::from_secs(10);

async fn claim_ids(
    store: &dyn JournalStore,
    lease: &Lease,
    max: usize,
    now: Timestamp,
) -> Vec<RunId> {
    store
        .claim(lease, max, now)
        .await
        .expect("claim")
        .into_iter()
        .map(|r| r.run_id)
        .collect()
}

/// A run claimed by a fresh worker (lease valid until `at(30_000)`) that has no work: its
/// `RunStarted` processed by a step append at `at(1)`, no timer.
async fn held_without_work(store: &dyn JournalStore, tag: &str) -> (RunId, Lease) {
    let (run, lease) = started(store, new_run(tag), at(0)).await;
    must_append(
        store,
        append(&run.run_id, 1, &lease, vec![step(1, "1")], at(1)),
    )
    .await;
    (run.run_id, lease)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_epochs_run_is_claimable_at_once_by_the_new_epoch() {
    let Some(url) = url_or_skip("a_superseded_epochs_run_is_claimable_at_once_by_the_new_epoch")
    else {
        return;
    };
    let f = PgFactory::from_env().expect("url");
    let store = f.store().await;
    let other = PostgresStore::connect_with(&url, options(store.schema()))
        .await
        .expect("open");
    let (run, old) = held_without_work(&store, "superseded").await;
    // Subscribed after the start committed: its NOTIFY does not reach this listener.
    let mut wake = store.subscribe().await.expect("subscribe");
    let dep = DeploymentId::new(DEPLOYMENT);
    assert_eq!(
        store.next_wake(&dep, at(2)).await.expect("next_wake"),
        None,
        "a held run without work has no wake time"
    );
    // The process restarts: the same worker id registers again (from another instance), long
    // before the old lease (valid until 30 s) expires.
    let new = other
        .register_worker(&old.worker, &old.deployment, TTL, at(2))
        .await
        .expect("re-register");
    assert_eq!(new.epoch, old.epoch + 1);
    tokio::time::timeout(LIMIT, wake.notified())
        .await
        .expect("a re-registration that supersedes an epoch wakes idle workers")
        .expect("alive");
    assert_eq!(
        store.next_wake(&dep, at(3)).await.expect("next_wake"),
        Some(at(1)),
        "an orphaned run without work wakes at its updated_at"
    );
    assert_eq!(
        claim_ids(&store, &new, 10, at(3)).await,
        vec![run.clone()],
        "the new epoch takes the old epoch's run at once, with no timer or event"
    );
    assert_eq!(
        record(&store, &run).await.owner,
        Some((new.worker.clone(), new.epoch))
    );
    assert!(matches!(
        store
            .append(append(&run, 2, &old, vec![step(2, "2")], at(4)))
            .await,
        Err(StoreError::Fenced { .. })
    ));
    must_append(&store, append(&run, 2, &new, vec![step(2, "2")], at(4))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_workers_run_is_claimable_at_once() {
    let Some(url) = url_or_skip("a_retired_workers_run_is_claimable_at_once") else {
        return;
    };
    let f = PgFactory::from_env().expect("url");
    let store = f.store().await;
    let other = PostgresStore::connect_with(&url, options(store.schema()))
        .await
        .expect("open");
    let (run, old) = held_without_work(&store, "retired").await;
    let w2 = store
        .register_worker(&WorkerId::new(unique("w2")), &old.deployment, TTL, at(1))
        .await
        .expect("register");
    assert!(
        claim_ids(&store, &w2, 10, at(2)).await.is_empty(),
        "held under a valid lease"
    );
    let mut wake = store.subscribe().await.expect("subscribe");
    other.retire_worker(&old, at(3)).await.expect("retire");
    tokio::time::timeout(LIMIT, wake.notified())
        .await
        .expect("a retirement wakes idle workers")
        .expect("alive");
    assert_eq!(
        record(&store, &run).await.owner,
        Some((old.worker.clone(), old.epoch)),
        "retiring leaves the run naming its owner (orphaned)"
    );
    assert_eq!(
        claim_ids(&store, &w2, 10, at(3)).await,
        vec![run.clone()],
        "another worker takes the retired worker's run at once"
    );
    assert!(matches!(
        store.release(&old, &run, 2, at(4)).await,
        Err(StoreError::Fenced { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_owners_run_is_claimable_from_its_expiry_and_not_before() {
    if url_or_skip("an_expired_owners_run_is_claimable_from_its_expiry_and_not_before").is_none() {
        return;
    }
    let f = PgFactory::from_env().expect("url");
    let store = f.store().await;
    let (run, old) = held_without_work(&store, "expired").await;
    assert_eq!(old.expires_at, at(30_000));
    let w2 = store
        .register_worker(
            &WorkerId::new(unique("w2")),
            &old.deployment,
            TTL,
            at(1_000),
        )
        .await
        .expect("register");
    let dep = DeploymentId::new(DEPLOYMENT);
    assert!(
        claim_ids(&store, &w2, 10, at(29_999)).await.is_empty(),
        "not claimable while the owner's lease is valid"
    );
    assert_eq!(
        store.next_wake(&dep, at(29_999)).await.expect("next_wake"),
        None,
        "a held run has no wake time"
    );
    assert_eq!(
        store.next_wake(&dep, at(30_000)).await.expect("next_wake"),
        Some(at(1)),
        "from the expiry on, the orphaned run's key is its updated_at"
    );
    assert_eq!(
        claim_ids(&store, &w2, 10, at(30_000)).await,
        vec![run],
        "claimable at now == expires_at"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphaned_runs_are_claimed_and_reported_by_claim_key() {
    if url_or_skip("orphaned_runs_are_claimed_and_reported_by_claim_key").is_none() {
        return;
    }
    let f = PgFactory::from_env().expect("url");
    let store = f.store().await;
    let dep = DeploymentId::new(DEPLOYMENT);
    // x: a retry due at 500, appended at 1000: key min(500, 1000) = 500.
    let (x, wx) = started(&store, new_run("x"), at(0)).await;
    let retry = Event::StepFailed {
        cmd: 1,
        name: "s".into(),
        attempt: 1,
        error: "flaky".into(),
        fatal: false,
        retry_at: Some(at(500)),
    };
    must_append(&store, append(&x.run_id, 1, &wx, vec![retry], at(1_000))).await;
    // y: no work, last written at 300: key 300.
    let (y, wy) = started(&store, new_run("y"), at(0)).await;
    must_append(
        &store,
        append(&y.run_id, 1, &wy, vec![step(1, "1")], at(300)),
    )
    .await;
    // z: a sleep due far later, last written at 700: key 700.
    let (z, wz) = started(&store, new_run("z"), at(0)).await;
    must_append(
        &store,
        append(
            &z.run_id,
            1,
            &wz,
            vec![eve_conformance::fixtures::sleep(1, at(90_000))],
            at(700),
        ),
    )
    .await;
    assert_eq!(
        store.next_wake(&dep, at(2_000)).await.expect("next_wake"),
        None,
        "every run is held"
    );
    store.retire_worker(&wz, at(2_000)).await.expect("retire z");
    assert_eq!(
        store.next_wake(&dep, at(2_000)).await.expect("next_wake"),
        Some(at(700)),
        "an orphaned run with a later timer: its updated_at"
    );
    store.retire_worker(&wx, at(2_000)).await.expect("retire x");
    store.retire_worker(&wy, at(2_000)).await.expect("retire y");
    assert_eq!(
        store.next_wake(&dep, at(2_000)).await.expect("next_wake"),
        Some(at(300)),
        "the smallest claim key"
    );
    let w = store
        .register_worker(&WorkerId::new(unique("w")), &dep, TTL, at(2_000))
        .await
        .expect("register");
    let mut order = Vec::new();
    for _ in 0..3 {
        order.extend(claim_ids(&store, &w, 1, at(2_000)).await);
    }
    assert_eq!(
        order,
        vec![y.run_id, x.run_id, z.run_id],
        "claimed by claim key: 300 (updated_at), 500 (timer), 700 (updated_at)"
    );
    assert_eq!(
        store.next_wake(&dep, at(2_000)).await.expect("next_wake"),
        None,
        "all held again"
    );
}

/// Waits until `rx` changes, at most [`LIMIT`].
async fn fired(rx: &mut tokio::sync::watch::Receiver<u64>, what: &str) {
    tokio::time::timeout(LIMIT, rx.changed())
        .await
        .unwrap_or_else(|_| panic!("{what}: no wake-up within {LIMIT:?}"))
        .expect("alive");
    rx.borrow_and_update();
}

/// Sends a NOTIFY for `marker` from `conn` and waits for it on `rx`: every notification
/// committed before has then been dispatched too (one listener, in commit order).
async fn barrier(
    conn: &mut PgConnection,
    channel: &str,
    rx: &mut tokio::sync::watch::Receiver<u64>,
    marker: &WatchKey,
) {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(channel)
        .bind(marker.encode())
        .execute(conn)
        .await
        .expect("marker");
    fired(rx, "the marker").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_fire_on_writes_from_another_instance() {
    let Some(url) = url_or_skip("watches_fire_on_writes_from_another_instance") else {
        return;
    };
    let f = PgFactory::from_env().expect("url");
    let store = f.store().await;
    // Another instance on the same schema (another process) writes: every wake-up comes over
    // NOTIFY.
    let other = PostgresStore::connect_with(&url, options(store.schema()))
        .await
        .expect("open");
    assert_eq!(store.store_id(), other.store_id(), "one store, one id");
    let id = store.store_id();
    assert!(
        id.starts_with("postgres://")
            && id.ends_with(&format!("#{}", store.schema()))
            && !id.contains('@'),
        "postgres://host:port/database#schema, no user: {id}"
    );
    let mut conn = raw(&url).await;
    let marker = WatchKey::Run(RunId::new("marker"));
    let mut mrx = store.watch(&marker).await.expect("watch");

    // Session: a RunCompleted writes a session-log entry.
    let (run, lease) = started(&other, new_run("watch-s"), at(0)).await;
    let session = WatchKey::Session(run.session_id.clone());
    let mut srx = store.watch(&session).await.expect("watch");
    must_append(
        &other,
        append(&run.run_id, 1, &lease, vec![step(1, "1")], at(1)),
    )
    .await;
    barrier(&mut conn, store.channel(), &mut mrx, &marker).await;
    assert!(
        !srx.has_changed().expect("alive"),
        "an append that writes no session-log entry does not fire the session"
    );
    must_append(
        &other,
        append(&run.run_id, 2, &lease, vec![completed("2")], at(2)),
    )
    .await;
    fired(&mut srx, "an append of RunCompleted (session log)").await;
    assert_eq!(
        store
            .read_session(&run.session_id, 0, 10)
            .await
            .expect("read_session")
            .len(),
        1,
        "the woken watcher reads the new entry"
    );

    // A session id too long for a NOTIFY payload: the write still commits and wakes everyone.
    let mut long = new_run("watch-long");
    long.session_id = SessionId::new("s".repeat(8_000));
    let (run, lease) = started(&other, long, at(0)).await;
    let mut lrx = store
        .watch(&WatchKey::Session(run.session_id.clone()))
        .await
        .expect("watch");
    must_append(
        &other,
        append(&run.run_id, 1, &lease, vec![completed("1")], at(1)),
    )
    .await;
    fired(&mut lrx, "RunCompleted in a session with an 8000-byte id").await;

    // Run: deliveries fire it; the worker's own appends do not.
    let (run, lease) = started(&other, new_run("watch-r"), at(0)).await;
    let token = unique("token");
    let (request, asked) = ask(&run.run_id, 2);
    must_append(
        &other,
        append(&run.run_id, 1, &lease, vec![hook(1, &token), asked], at(1)),
    )
    .await;
    let mut rrx = store
        .watch(&WatchKey::Run(run.run_id.clone()))
        .await
        .expect("watch");
    let mut srx = store
        .watch(&WatchKey::Session(run.session_id.clone()))
        .await
        .expect("watch");
    must_append(
        &other,
        append(&run.run_id, 3, &lease, vec![step(3, "3")], at(2)),
    )
    .await;
    barrier(&mut conn, store.channel(), &mut mrx, &marker).await;
    assert!(
        !rrx.has_changed().expect("alive"),
        "the worker's own append does not fire the run"
    );
    other
        .deliver_hook(&token, json("{}"), None, at(3))
        .await
        .expect("deliver");
    fired(&mut rrx, "a hook delivery").await;
    other
        .answer(&request, InputResponse::option("yes"), at(4))
        .await
        .expect("answer");
    fired(&mut rrx, "an answer").await;
    fired(&mut srx, "an answer (InputAnswered in the session log)").await;
    other
        .request_cancel(&run.run_id, "stop", at(5))
        .await
        .expect("cancel");
    fired(&mut rrx, "a cancel request").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_waits_for_a_write_holding_a_claimable_run() {
    let Some(url) = url_or_skip("a_claim_waits_for_a_write_holding_a_claimable_run") else {
        return;
    };
    let f = PgFactory::from_env().expect("url");
    let store = f.store().await;
    let created = store
        .create_run(new_run("held-by-write"), at(0))
        .await
        .expect("create_run");
    let run = created.run.run_id;
    let lease = worker(&store, at(0)).await;
    // Another transaction holds the claimable run's row, as a delivery in flight does.
    let mut conn = raw(&url).await;
    exec(&mut conn, "BEGIN".into()).await;
    exec(
        &mut conn,
        format!(
            "SELECT 1 FROM \"{}\".runs WHERE run_id = '{run}' FOR UPDATE",
            store.schema()
        ),
    )
    .await;
    let claimer = {
        let store = store.clone();
        let lease = lease.clone();
        tokio::spawn(async move { claim_ids(&store, &lease, 8, at(1)).await })
    };
    // The claim skipped the row, found itself short, and now waits for the row's lock. (Watched
    // from another connection: inside a transaction pg_stat_activity is a frozen snapshot.)
    let holder: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .expect("pid");
    let mut watcher = raw(&url).await;
    let deadline = Instant::now() + LIMIT;
    loop {
        let blocked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
        )
        .bind(holder)
        .fetch_one(&mut watcher)
        .await
        .expect("pg_blocking_pids");
        if blocked > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline && !claimer.is_finished(),
            "the claim never waited for the held row (finished: {})",
            claimer.is_finished()
        );
        tokio::task::yield_now().await;
    }
    exec(&mut conn, "COMMIT".into()).await;
    let claimed = tokio::time::timeout(LIMIT, claimer)
        .await
        .expect("the claim finishes once the write commits")
        .expect("claim task");
    assert_eq!(
        claimed,
        vec![run],
        "a run claimable before the write that held it is claimed, not missed"
    );
}
