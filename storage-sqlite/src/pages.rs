//! Journal page reads ([`eve_core::JournalStore::read`]) on rusqlite connections of their own,
//! run on tokio's blocking threads. A page is one statement whose rows are stepped through one
//! by one, each body borrowed from SQLite's buffer and decoded in place: nothing copies the
//! page as a whole, so a read costs SQLite's row steps and the decoding, and no more.

use crate::error::{map_rusqlite, other};
use crate::seq_arg;
use eve_core::codec::decode_batch_each;
use eve_core::{RunId, StoreError, StoredEvent, Timestamp};
use rusqlite::Connection;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

/// The run's next seq and the rows covering `[?2, ?3)`: one statement, so both come from one
/// snapshot. The rows come in primary-key order (no sorter: the plan searches
/// `(run_id, first_seq)`), starting at the row that holds `?2`.
const PAGE: &str = "SELECT r.next_seq, e.first_seq, e.count, e.at, e.version, e.body FROM runs r \
     LEFT JOIN events e ON e.run_id = r.run_id \
       AND e.first_seq >= (SELECT max(first_seq) FROM events \
                           WHERE run_id = ?1 AND first_seq <= ?2) \
       AND e.first_seq < ?3 \
     WHERE r.run_id = ?1 \
     ORDER BY e.first_seq";

/// A pool of read connections to one database file, opened on first use and kept for reuse;
/// at most `size` reads run at once (the others wait their turn), so a burst of activations
/// neither opens a connection (three file descriptors) each nor takes a blocking thread each.
#[derive(Debug)]
pub(crate) struct PageReads {
    filename: String,
    busy_timeout: Duration,
    idle: Mutex<Vec<Connection>>,
    permits: Arc<Semaphore>,
}

impl PageReads {
    pub(crate) fn new(filename: String, busy_timeout: Duration, size: usize) -> Self {
        Self {
            filename,
            busy_timeout,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(size.max(1))),
        }
    }

    /// The events `[from_seq, from_seq + max)` of `run` that exist; see
    /// [`eve_core::JournalStore::read`].
    pub(crate) async fn read(
        self: &Arc<Self>,
        run: &RunId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| other(format!("the journal read pool is closed: {e}")))?;
        let this = self.clone();
        let run = run.clone();
        tokio::task::spawn_blocking(move || {
            // Held until the read is done, even when the caller stops waiting for it.
            let _permit = permit;
            let conn = this.take()?;
            let page = read_page(&conn, &run, from_seq, max);
            // A connection whose statement failed for a backend reason is not kept: the next
            // read opens a fresh one.
            if !matches!(
                page,
                Err(StoreError::Unavailable { .. } | StoreError::Other { .. })
            ) {
                this.put(conn);
            }
            page
        })
        .await
        .map_err(|e| other(format!("a journal read task failed: {e}")))?
    }

    fn take(&self) -> Result<Connection, StoreError> {
        if let Some(conn) = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(conn);
        }
        use rusqlite::OpenFlags as F;
        // Read-write without CREATE, then query_only: a read-only open of a WAL file fails
        // where its `-shm` cannot be written.
        let flags = F::SQLITE_OPEN_READ_WRITE | F::SQLITE_OPEN_URI | F::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&self.filename, flags).map_err(map_rusqlite)?;
        conn.busy_timeout(self.busy_timeout).map_err(map_rusqlite)?;
        conn.execute_batch("PRAGMA query_only = ON;")
            .map_err(map_rusqlite)?;
        Ok(conn)
    }

    fn put(&self, conn: Connection) {
        // At most one connection per permit is ever open, so every one is kept.
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(conn);
    }
}

fn read_page(
    conn: &Connection,
    run: &RunId,
    from_seq: u64,
    max: usize,
) -> Result<Vec<StoredEvent>, StoreError> {
    let window_end = from_seq.saturating_add(max as u64);
    let mut stmt = conn.prepare_cached(PAGE).map_err(map_rusqlite)?;
    let mut rows = stmt
        .query((run.as_str(), seq_arg(from_seq), seq_arg(window_end)))
        .map_err(map_rusqlite)?;
    let mut page: Option<Page> = None;
    while let Some(row) = rows.next().map_err(map_rusqlite)? {
        let page = match &mut page {
            Some(page) => page,
            None => {
                let next = u64_of(row.get(0).map_err(map_rusqlite)?);
                if from_seq > next {
                    return Err(StoreError::InvalidInput(format!(
                        "read from seq {from_seq} is past the end of run {run} (next seq {next})"
                    )));
                }
                page.insert(Page::new(run, from_seq, window_end, next))
            }
        };
        // The LEFT JOIN's one row of NULLs: the window holds no rows.
        let Some(first) = row.get::<_, Option<i64>>(1).map_err(map_rusqlite)? else {
            continue;
        };
        let head = Head {
            first: u64_of(first),
            count: u64_of(row.get(2).map_err(map_rusqlite)?),
            at: row.get(3).map_err(map_rusqlite)?,
            version: row.get(4).map_err(map_rusqlite)?,
        };
        let body = row
            .get_ref(5)
            .map_err(map_rusqlite)?
            .as_bytes()
            .map_err(|e| other(format!("events.body of run {run}: {e}")))?;
        page.push(head, body)?;
    }
    match page {
        Some(page) => page.finish(),
        None => Err(StoreError::not_found("run", run)),
    }
}

/// An `events` row's header.
#[derive(Clone, Copy)]
struct Head {
    first: u64,
    count: u64,
    at: i64,
    version: i64,
}

/// The events of `[from_seq, window_end)` of a journal whose next seq is `next`, decoded row by
/// row, checking that the rows are contiguous and complete.
struct Page<'a> {
    run: &'a RunId,
    from_seq: u64,
    end: u64,
    next: u64,
    /// The first seq the next row must start at.
    expect: Option<u64>,
    out: Vec<StoredEvent>,
}

impl<'a> Page<'a> {
    fn new(run: &'a RunId, from_seq: u64, window_end: u64, next: u64) -> Self {
        let end = window_end.min(next);
        Self {
            run,
            from_seq,
            end,
            next,
            expect: None,
            out: Vec::with_capacity(usize::try_from(end - from_seq.min(end)).unwrap_or(0)),
        }
    }

    fn push(&mut self, head: Head, body: &[u8]) -> Result<(), StoreError> {
        if let Some(want) = self.expect {
            if head.first != want {
                return Err(StoreError::Corrupt {
                    run: self.run.clone(),
                    seq: want,
                    reason: format!(
                        "events {want}..{} are missing (no row holds them)",
                        head.first
                    ),
                });
            }
        }
        // Saturating: a corrupt header's count must fail the checks, not overflow.
        self.expect = Some(head.first.saturating_add(head.count));
        let version = u16::try_from(head.version).unwrap_or(u16::MAX);
        let (from, end, at) = (self.from_seq, self.end, Timestamp(head.at));
        let mut seq = head.first;
        let out = &mut self.out;
        decode_batch_each(
            self.run,
            head.first,
            version,
            body,
            head.count as usize,
            |event| {
                if seq >= from && seq < end {
                    out.push(StoredEvent { seq, at, event });
                }
                seq = seq.saturating_add(1);
            },
        )?;
        Ok(())
    }

    fn finish(self) -> Result<Vec<StoredEvent>, StoreError> {
        let (from, end) = (self.from_seq, self.end);
        let got = self.out.first().map(|e| e.seq);
        if from < end && (got != Some(from) || self.out.len() as u64 != end - from) {
            return Err(StoreError::Corrupt {
                run: self.run.clone(),
                seq: self.out.last().map_or(from, |e| e.seq + 1),
                reason: format!(
                    "the journal's next seq is {} but its rows hold events only up to {}",
                    self.next,
                    self.expect.unwrap_or(0)
                ),
            });
        }
        Ok(self.out)
    }
}

/// A seq or count column (never negative as written; a negative one fails the checks after).
fn u64_of(v: i64) -> u64 {
    v as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst of reads runs at most `size` at a time, so it never opens more connections: the
    /// pool's idle list is held while 32 reads start, so without the bound each would find it
    /// empty and open a connection of its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    // Held on purpose: only the blocking read threads wait for it, never a runtime thread.
    #[allow(clippy::await_holding_lock)]
    async fn a_burst_of_reads_shares_size_connections() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("journal.db");
        let _store = crate::SqliteStore::open(&path).await.expect("open");
        let reads = Arc::new(PageReads::new(
            path.to_string_lossy().into_owned(),
            Duration::from_secs(5),
            2,
        ));
        let held = reads.idle.lock().expect("idle");
        let burst: Vec<_> = (0..32)
            .map(|_| {
                let reads = reads.clone();
                tokio::spawn(async move { reads.read(&RunId::new("absent"), 0, 10).await })
            })
            .collect();
        // Both permits taken: two reads wait for the idle list, thirty for a permit.
        tokio::time::timeout(Duration::from_secs(10), async {
            while reads.permits.available_permits() > 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the reads take every permit");
        drop(held);
        for read in burst {
            let answer = read.await.expect("read task");
            assert!(
                matches!(answer, Err(StoreError::NotFound { .. })),
                "{answer:?}"
            );
        }
        let open = reads.idle.lock().expect("idle").len();
        assert!((1..=2).contains(&open), "{open} connections kept");
    }
}
