//! A 100,000-event journal is read in pages with bounded memory, on the memory store and on
//! SQLite: the cold replay (`Worker::replay_cold`), a worker's cold activation and
//! `eve journal` (`inspect::journal_range`) each read it in pages and never run ahead of what
//! they delivered or printed by more than four pages. A counting wrapper around the store
//! records every read (its size, and how far the journal has been read), and the body (or the
//! output) checks at each event it gets how far behind the reads it is.

use eve_cli::inspect;
use eve_cli::target::Target;
use eve_core::engine::{
    define_workflow_tool, resume_hook, tool_call_run, ActivationEnd, Clock, ManualClock, Registry,
    Worker, WorkerConfig, WorkflowCtx, WorkflowError,
};
use eve_core::store::READ_PAGE;
use eve_core::wrap::StoreWrapper;
use eve_core::{
    workflow, Append, AppendId, CallId, DeploymentId, Event, JournalStore, MemoryStore, Payload,
    RunId, SessionId, StoreError, StoredEvent, Timestamp, WorkerId,
};
use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Steps in the journal: with `RunStarted` and the hook, 100,002 events.
const STEPS: u64 = 100_000;

/// How far the journal has been read (one past the last seq any read returned), the largest
/// page asked for, and the reads made: shared by the wrapper and the checks.
#[derive(Debug, Default)]
struct Reads {
    end: AtomicU64,
    largest: AtomicUsize,
    calls: AtomicU64,
}

impl Reads {
    fn reset(&self) {
        self.end.store(0, Ordering::SeqCst);
        self.largest.store(0, Ordering::SeqCst);
        self.calls.store(0, Ordering::SeqCst);
    }
}

/// Counts the reads of the store it wraps.
#[derive(Debug)]
struct Counting {
    store: Arc<dyn JournalStore>,
    reads: Arc<Reads>,
}

#[async_trait::async_trait]
impl StoreWrapper for Counting {
    fn wrapped(&self) -> &dyn JournalStore {
        &*self.store
    }
    async fn read(
        &self,
        run: &RunId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let page = self.store.read(run, from_seq, max).await?;
        self.reads.calls.fetch_add(1, Ordering::SeqCst);
        self.reads.largest.fetch_max(page.len(), Ordering::SeqCst);
        if let Some(last) = page.last() {
            self.reads.end.fetch_max(last.seq + 1, Ordering::SeqCst);
        }
        Ok(page)
    }
}

/// The reads of the store under test, seen by the body (a workflow body cannot capture).
static READS: std::sync::OnceLock<std::sync::Mutex<Option<Arc<Reads>>>> =
    std::sync::OnceLock::new();
/// The most events the journal had been read past the one being delivered.
static LAG: AtomicU64 = AtomicU64::new(0);

fn reads() -> Arc<Reads> {
    READS
        .get_or_init(Default::default)
        .lock()
        .expect("reads")
        .clone()
        .expect("the test sets the reads first")
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Long {
    steps: u64,
    token: String,
}

/// `steps` steps, then a hook's payloads. After step `i` (its outcome is at seq `i`) it notes
/// how far past that seq the journal has been read.
async fn long_body(ctx: WorkflowCtx, input: Long) -> Result<u64, WorkflowError> {
    let reads = reads();
    for i in 1..=input.steps {
        ctx.step("s", move |_| async move { Ok(i) }).await?;
        let ahead = reads.end.load(Ordering::SeqCst).saturating_sub(i);
        LAG.fetch_max(ahead, Ordering::SeqCst);
    }
    let hook = ctx.create_hook::<u64>(input.token);
    let a = hook.next().await?;
    let b = hook.next().await?;
    Ok(a + b)
}

fn registry() -> Registry {
    Registry::new("long-journal-tests")
        .with(define_workflow_tool("Many steps, then a hook.", workflow!(long_body)).named("long"))
}

/// Writes the journal a worker would have: `RunStarted`, `STEPS` step results and the hook,
/// in appends of 100 events.
async fn write_journal(store: &dyn JournalStore, now: Timestamp) -> RunId {
    let new = tool_call_run(
        &registry(),
        &SessionId::new("long"),
        &CallId::new("c"),
        "long",
        serde_json::json!({"steps": STEPS, "token": "long-hook"}),
    )
    .expect("start request");
    let run = store.create_run(new, now).await.expect("create").run.run_id;
    let lease = store
        .register_worker(
            &WorkerId::new("writer"),
            &DeploymentId::new("long-journal-tests"),
            std::time::Duration::from_secs(3600),
            now,
        )
        .await
        .expect("register");
    store.claim(&lease, 1, now).await.expect("claim");
    let output = Payload::from_json("1").expect("JSON");
    let mut events: Vec<Event> = (0..STEPS)
        .map(|cmd| Event::StepCompleted {
            cmd,
            name: "s".into(),
            attempt: 1,
            output: output.clone(),
        })
        .collect();
    events.push(Event::HookCreated {
        cmd: STEPS,
        token: "long-hook".into(),
        webhook: false,
        respond_with: None,
    });
    let mut seq = 1;
    for chunk in events.chunks(eve_core::store::MAX_EVENTS_PER_APPEND) {
        seq = store
            .append(Append {
                run: run.clone(),
                expected_seq: seq,
                lease: lease.clone(),
                append_id: AppendId::random(),
                events: chunk.to_vec(),
                now,
            })
            .await
            .expect("append")
            .next_seq;
    }
    store
        .release(&lease, &run, seq, now)
        .await
        .expect("release");
    store.retire_worker(&lease, now).await.expect("retire");
    run
}

/// Output that checks, at every line, how far the journal has been read past it.
struct Lagging {
    reads: Arc<Reads>,
    lines: u64,
    lag: u64,
}

impl Write for Lagging {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for _ in buf.iter().filter(|&&b| b == b'\n') {
            self.lines += 1;
            let ahead = self
                .reads
                .end
                .load(Ordering::SeqCst)
                .saturating_sub(self.lines);
            self.lag = self.lag.max(ahead);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn paged_reads(name: &str, inner: Arc<dyn JournalStore>) {
    let reads = Arc::new(Reads::default());
    *READS.get_or_init(Default::default).lock().expect("reads") = Some(reads.clone());
    let store: Arc<dyn JournalStore> = Arc::new(Counting {
        store: inner,
        reads: reads.clone(),
    });
    let clock = ManualClock::new(Timestamp(1_000));
    let run = write_journal(&*store, clock.now()).await;
    let events = STEPS + 2;

    // The cold replay: reads of one page, never more than four pages past the delivered event
    // (the rest of the page being delivered, the one read ahead, the two being read).
    reads.reset();
    LAG.store(0, Ordering::SeqCst);
    let report = Worker::replay_cold(&store, &registry(), &run)
        .await
        .expect("cold replay");
    assert_eq!(report.events, events, "{name}: every event delivered");
    assert!(!report.finished, "{name}: the body waits for the hook");
    let largest = reads.largest.load(Ordering::SeqCst);
    assert!(largest <= READ_PAGE, "{name}: a read of {largest} events");
    let lag = LAG.load(Ordering::SeqCst);
    assert!(
        lag <= 4 * READ_PAGE as u64,
        "{name}: the replay read {lag} events ahead of the body (at most four pages)"
    );
    let calls = reads.calls.load(Ordering::SeqCst);
    assert!(
        calls > events / READ_PAGE as u64,
        "{name}: {calls} reads for {events} events"
    );

    // A worker's cold activation of the parked run (a hook payload makes it claimable).
    resume_hook(&*store, "long-hook", &5u64, None, clock.now())
        .await
        .expect("hook payload");
    let worker = Worker::new(
        store.clone(),
        registry(),
        clock.clone(),
        WorkerConfig::default(),
    )
    .await
    .expect("worker");
    reads.reset();
    LAG.store(0, Ordering::SeqCst);
    let ends = worker.run_once().await.expect("activation");
    assert_eq!(
        ends.first().map(|e| &e.1),
        Some(&ActivationEnd::Suspended),
        "{name}: {ends:?}"
    );
    assert!(reads.largest.load(Ordering::SeqCst) <= READ_PAGE, "{name}");
    let lag = LAG.load(Ordering::SeqCst);
    assert!(
        lag <= 4 * READ_PAGE as u64,
        "{name}: the activation read {lag} events ahead of the body"
    );

    // `eve journal`: pages of JOURNAL_PRINT_PAGE, printed before the next is read.
    reads.reset();
    let mut out = Lagging {
        reads: reads.clone(),
        lines: 0,
        lag: 0,
    };
    let target = Target::Local(store.clone());
    inspect::journal_range(&target, run.as_str(), 0, None, true, false, &mut out)
        .await
        .expect("eve journal");
    assert_eq!(out.lines, events + 1, "{name}: every event printed");
    let largest = reads.largest.load(Ordering::SeqCst);
    assert!(
        largest <= inspect::JOURNAL_PRINT_PAGE,
        "{name}: eve journal read {largest} events at once"
    );
    assert!(
        out.lag <= inspect::JOURNAL_PRINT_PAGE as u64,
        "{name}: eve journal read {} events ahead of its output",
        out.lag
    );

    // A window: `--from 99990 --limit 5` prints those five events and reads no more.
    reads.reset();
    let mut window = Vec::new();
    inspect::journal_range(
        &target,
        run.as_str(),
        99_990,
        Some(5),
        true,
        false,
        &mut window,
    )
    .await
    .expect("eve journal --from --limit");
    let seqs: Vec<u64> = String::from_utf8(window)
        .expect("UTF-8")
        .lines()
        .map(|l| {
            serde_json::from_str::<StoredEvent>(l)
                .expect("a JSON event")
                .seq
        })
        .collect();
    assert_eq!(seqs, (99_990..99_995).collect::<Vec<_>>(), "{name}");
    assert_eq!(reads.end.load(Ordering::SeqCst), 99_995, "{name}");
}

/// One test for both stores: the body's view of the reads is one process-wide static.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100k_event_journal_is_read_in_pages() {
    paged_reads("memory", Arc::new(MemoryStore::new())).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let sqlite = eve_storage_sqlite::SqliteStore::open_with(
        dir.path().join("long.db"),
        eve_storage_sqlite::SqliteOptions {
            synchronous: eve_storage_sqlite::Synchronous::Normal,
            ..Default::default()
        },
    )
    .await
    .expect("SQLite file");
    paged_reads("sqlite", Arc::new(sqlite)).await;
}
