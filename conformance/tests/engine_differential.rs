//! The differential check: the same seeded programs run on [`MemoryStore`] (the reference
//! store) and on [`SqliteStore`] yield identical journals, event for event, modulo timestamps
//! and ids (the run id; hook tokens and sessions are the same by construction).
//!
//! The schedule is deterministic: no faults, one worker, simulated time moved only by the
//! driver, and a current-thread runtime, so the steps one activation starts run in the order it
//! started them and their outcomes are appended in that order on both stores.
//!
//! `EVE_CONFORMANCE_CASES` / `EVE_CONFORMANCE_DEEP` set the number of programs,
//! `EVE_CONFORMANCE_SEED` replays a printed seed.

use eve_conformance::engine::driver::{run_case_as, Bench};
use eve_conformance::engine::{engine_case_count, seed, strategy, Family};
use eve_core::{JournalStore, JournalStoreExt, MemoryStore, RunId};
use eve_storage_sqlite::SqliteStore;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::Value;
use std::sync::Arc;

/// The journal as JSON, without timestamps, with the run id replaced by `<run>`.
async fn journal(store: &dyn JournalStore, run: &RunId) -> Vec<Value> {
    fn scrub(v: &mut Value, run: &str) {
        match v {
            Value::String(s) if s.contains(run) => *s = s.replace(run, "<run>"),
            Value::Array(a) => a.iter_mut().for_each(|x| scrub(x, run)),
            Value::Object(o) => o.values_mut().for_each(|x| scrub(x, run)),
            _ => {}
        }
    }
    store
        .read_all(run, 0)
        .await
        .expect("read the journal")
        .into_iter()
        .map(|e| {
            let mut v = serde_json::to_value(&e.event).expect("events serialize");
            scrub(&mut v, run.as_str());
            v
        })
        .collect()
}

#[test]
fn memory_and_sqlite_journals_are_identical() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    rt.block_on(async {
        let seed = seed();
        let cases = engine_case_count();
        println!("engine differential: {cases} programs, seed {seed} (EVE_CONFORMANCE_SEED={seed} replays them)");
        let dir = tempfile::tempdir().expect("a temp dir");
        let sqlite = SqliteStore::open(dir.path().join("journal.db"))
            .await
            .expect("open SQLite");
        let memory = Bench::on(Arc::new(MemoryStore::new()), "diff");
        let sqlite = Bench::on(Arc::new(sqlite), "diff");
        let mut bytes = [0u8; 32];
        for (i, chunk) in bytes.chunks_mut(8).enumerate() {
            chunk.copy_from_slice(&seed.wrapping_add(i as u64).to_le_bytes());
        }
        let mut runner = TestRunner::new_with_rng(
            Config::default(),
            TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
        );
        let strategy = strategy(Family::NoFaults);
        let mut events = 0;
        for case in 0..cases {
            let (program, schedule) = strategy
                .new_tree(&mut runner)
                .expect("generate a program")
                .current();
            let id = format!("diff-{case}");
            let context = || {
                format!(
                    "program {case} (seed {seed}; rerun with EVE_CONFORMANCE_SEED={seed}): {}",
                    serde_json::to_string(&program).unwrap_or_default()
                )
            };
            let on_memory = run_case_as(&memory, &id, &program, &schedule)
                .await
                .unwrap_or_else(|why| panic!("on memory: {why}\n{}", context()));
            let on_sqlite = run_case_as(&sqlite, &id, &program, &schedule)
                .await
                .unwrap_or_else(|why| panic!("on sqlite: {why}\n{}", context()));
            let a = journal(&*memory.store, on_memory.run.as_ref().expect("a run")).await;
            let b = journal(&*sqlite.store, on_sqlite.run.as_ref().expect("a run")).await;
            if a != b {
                let first = a.iter().zip(&b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
                panic!(
                    "the journals differ from event {first} on ({} vs {} events):\n  memory: {}\n  sqlite: {}\n{}",
                    a.len(),
                    b.len(),
                    a.get(first).map(Value::to_string).unwrap_or_default(),
                    b.get(first).map(Value::to_string).unwrap_or_default(),
                    context()
                );
            }
            events += a.len();
        }
        println!("engine differential: {cases} programs, {events} events, identical on memory and sqlite");
    });
}
