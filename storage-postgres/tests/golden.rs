//! Golden stores (README, "Compatibility"): every Postgres dump under `fixtures/golden/v*/`,
//! made by an earlier eve, loads into a fresh schema, opens with today's code (which migrates
//! it forward), holds everything it was made with, and its parked runs finish with today's
//! engine.
//!
//! `cargo test -p eve-storage-postgres --test golden -- --ignored make_golden` writes this
//! version's dump (needs `pg_dump` of the server's major version; run it once per release and
//! commit the file).

mod common;

use common::{options, random_schema, url_or_skip};
use eve_conformance::golden;
use eve_core::JournalStore;
use eve_storage_postgres::PostgresStore;
use sqlx::Connection;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The schema the dumps are made in; loading renames it to a fresh one.
const DUMP_SCHEMA: &str = "eve_golden_dump";

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/golden")
}

async fn execute(url: &str, sql: &str) {
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("run SQL on {url}: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_postgres_dumps_load_migrate_and_finish() {
    let Some(url) = url_or_skip("golden_postgres_dumps_load_migrate_and_finish") else {
        return;
    };
    let mut versions: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .expect("fixtures/golden exists")
        .map(|e| {
            e.expect("a directory entry")
                .path()
                .join("postgres/dump.sql")
        })
        .collect();
    versions.sort();
    assert!(!versions.is_empty(), "at least one golden version");
    for dump in versions {
        let text = std::fs::read_to_string(&dump)
            .unwrap_or_else(|e| panic!("read {}: {e}", dump.display()));
        let schema = random_schema();
        execute(&url, &text.replace(DUMP_SCHEMA, &schema)).await;
        let opened = PostgresStore::connect_with(&url, options(&schema)).await;
        let result = match opened {
            Ok(store) => {
                let store: Arc<dyn JournalStore> = Arc::new(store);
                futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(golden::check(store)))
                    .await
                    .map_err(|p| {
                        p.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                            .unwrap_or_default()
                    })
            }
            Err(e) => Err(format!("open with today's code: {e}")),
        };
        execute(&url, &format!("DROP SCHEMA \"{schema}\" CASCADE")).await;
        if let Err(why) = result {
            panic!("{}: {why}", dump.display());
        }
        println!(
            "{}: loaded, opened, checked, parked runs finished",
            dump.display()
        );
    }
}

/// Writes `fixtures/golden/v<this version>/postgres/dump.sql`: the golden data made in schema
/// [`DUMP_SCHEMA`], dumped as plain SQL with INSERTs (loadable without psql).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes this version's golden fixture; run by hand at a release"]
async fn make_golden() {
    let url = url_or_skip("make_golden").expect("EVE_TEST_POSTGRES_URL names the server");
    execute(
        &url,
        &format!("DROP SCHEMA IF EXISTS \"{DUMP_SCHEMA}\" CASCADE"),
    )
    .await;
    {
        let store: Arc<dyn JournalStore> = Arc::new(
            PostgresStore::connect_with(&url, options(DUMP_SCHEMA))
                .await
                .expect("open the dump schema"),
        );
        golden::populate(store).await;
    }
    let out = std::process::Command::new("pg_dump")
        .args([
            "--schema",
            DUMP_SCHEMA,
            "--inserts",
            "--no-owner",
            "--no-privileges",
            "--no-comments",
            &url,
        ])
        .output()
        .expect("run pg_dump");
    assert!(
        out.status.success(),
        "pg_dump failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // psql meta-commands (`\restrict` in newer pg_dumps) are not SQL.
    let sql: String = String::from_utf8(out.stdout)
        .expect("a UTF-8 dump")
        .lines()
        .filter(|l| !l.starts_with('\\'))
        .map(|l| format!("{l}\n"))
        .collect();
    let dir = golden_dir()
        .join(format!("v{}", env!("CARGO_PKG_VERSION")))
        .join("postgres");
    std::fs::create_dir_all(&dir).expect("create the fixture directory");
    std::fs::write(dir.join("dump.sql"), sql).expect("write dump.sql");
    execute(&url, &format!("DROP SCHEMA \"{DUMP_SCHEMA}\" CASCADE")).await;
    println!("wrote {}", dir.display());
}
