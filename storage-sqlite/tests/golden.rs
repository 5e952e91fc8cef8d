//! Golden stores (README, "Compatibility"): every SQLite file under `fixtures/golden/v*/`, made
//! by an earlier eve, opens with today's code (which migrates it forward), holds everything it
//! was made with, and its parked runs finish with today's engine. The exported journals beside
//! it decode with today's types and replay against today's bodies.
//!
//! `cargo test -p eve-storage-sqlite --test golden -- --ignored make_golden` writes this
//! version's fixture (run it once per release, and commit the files).

use eve_conformance::golden;
use eve_core::JournalStore;
use eve_storage_sqlite::SqliteStore;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `fixtures/golden/` at the workspace root.
fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/golden")
}

/// Every fixture version directory, oldest first.
fn versions() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .expect("fixtures/golden exists")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "at least one golden version");
    dirs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_sqlite_files_open_migrate_and_finish() {
    for dir in versions() {
        let fixture = dir.join("sqlite/eve.sqlite");
        let tmp = tempfile::tempdir().expect("a temp dir");
        let path = tmp.path().join("eve.db");
        std::fs::copy(&fixture, &path)
            .unwrap_or_else(|e| panic!("copy {}: {e}", fixture.display()));
        let store: Arc<dyn JournalStore> = Arc::new(
            SqliteStore::open(&path)
                .await
                .unwrap_or_else(|e| panic!("open {} with today's code: {e}", fixture.display())),
        );
        golden::check(store).await;
        println!(
            "{}: opened, checked, parked runs finished",
            fixture.display()
        );
    }
}

#[test]
fn golden_exported_journals_decode_and_replay() {
    for dir in versions() {
        let mut n = 0;
        for entry in std::fs::read_dir(dir.join("journals")).expect("a journals directory") {
            let file = entry.expect("a directory entry").path();
            let run = file
                .file_stem()
                .and_then(|s| s.to_str())
                .expect("<run id>.jsonl");
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
            golden::check_exported_journal(&eve_core::RunId::new(run), &text);
            n += 1;
        }
        assert_eq!(
            n,
            golden::CALLS.len(),
            "{}: one journal per golden call",
            dir.display()
        );
    }
}

/// Writes `fixtures/golden/v<this version>/sqlite/eve.sqlite` and `journals/<run>.jsonl`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes this version's golden fixture; run by hand at a release"]
async fn make_golden() {
    let out = golden_dir().join(format!("v{}", env!("CARGO_PKG_VERSION")));
    std::fs::create_dir_all(out.join("sqlite")).expect("create the fixture directory");
    let tmp = tempfile::tempdir().expect("a temp dir");
    let path = tmp.path().join("eve.db");
    {
        let store: Arc<dyn JournalStore> =
            Arc::new(SqliteStore::open(&path).await.expect("open a fresh file"));
        golden::populate(Arc::clone(&store)).await;
        let journals = out.join("journals");
        let _ = std::fs::remove_dir_all(&journals);
        std::fs::create_dir_all(&journals).expect("create the journals directory");
        for (run, text) in golden::export_journals(&*store).await {
            std::fs::write(journals.join(format!("{run}.jsonl")), text)
                .expect("write an exported journal");
        }
    }
    let dest = out.join("sqlite/eve.sqlite");
    let _ = std::fs::remove_file(&dest);
    // One self-contained, compact file (the WAL folded in).
    rusqlite::Connection::open(&path)
        .expect("open the made file")
        .execute("VACUUM INTO ?1", [dest.to_str().expect("a UTF-8 path")])
        .expect("VACUUM INTO the fixture");
    println!("wrote {}", out.display());
}
