//! Postgres-specific tests: corrupt rows, migrations, schema names, wake-ups, group commit
//! isolation and faults (terminated connections, refused connections). Each skips, loudly, when
//! `EVE_TEST_POSTGRES_URL` is unset.

mod common;

use common::{options, random_schema, url_or_skip, PgFactory};
use eve_conformance::fixtures::{
    append, hook, journal, json, must_append, new_run, started, step, unique, DEPLOYMENT,
};
use eve_core::{Event, JournalStore, StoreError, Timestamp};
use eve_storage_postgres::{PostgresOptions, PostgresStore, SCHEMA_VERSION};
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
    assert_eq!(got, vec![DEPLOYMENT.to_owned(), DEPLOYMENT.to_owned(), "marker".to_owned()],
        "one NOTIFY for the new run, one for the first delivery, none for appends, the release or the coalesced delivery");
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
