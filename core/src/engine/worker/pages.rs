//! Journal pages read ahead of a replay: while the body re-executes one page, the next
//! [`AHEAD`] pages are read and decoded by tasks of their own, so a long cold replay uses both
//! the store's time and the decoding's in parallel rather than one after the other.

use crate::error::StoreError;
use crate::event::StoredEvent;
use crate::ids::RunId;
use crate::store::{JournalStore, READ_PAGE};
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::task::JoinHandle;

/// A read of one page under way, by the seq it starts at.
type PageRead = (u64, JoinHandle<Result<Vec<StoredEvent>, StoreError>>);

/// Reads under way at once. Each is one page of [`READ_PAGE`] events.
const AHEAD: usize = 2;

/// The pages of one run's journal from a seq up to an end, in order, each read on a task of its
/// own up to [`AHEAD`] pages before it is asked for. Reads are started at whole pages from the
/// first seq; a page that comes back short (a backend may return fewer events than asked) makes
/// the reads started after it restart where it ended.
pub(super) struct ReadAhead {
    store: Arc<dyn JournalStore>,
    run: RunId,
    retries: u32,
    /// Nothing at or past this seq is read.
    end: u64,
    /// Where the next read starts.
    next: u64,
    reads: VecDeque<PageRead>,
}

impl ReadAhead {
    /// Starts reading `run` from `from` up to `end` (exclusive), retrying transient errors up to
    /// `retries` times as the worker does.
    pub(super) fn start(
        store: &Arc<dyn JournalStore>,
        run: &RunId,
        from: u64,
        end: u64,
        retries: u32,
    ) -> Self {
        let mut ahead = Self {
            store: store.clone(),
            run: run.clone(),
            retries,
            end,
            next: from,
            reads: VecDeque::with_capacity(AHEAD),
        };
        ahead.fill();
        ahead
    }

    /// The next page, in seq order; empty once everything up to the end was returned.
    ///
    /// # Errors
    /// The store's error; `Unavailable` if a reading task panicked.
    pub(super) async fn next_page(&mut self) -> Result<Vec<StoredEvent>, StoreError> {
        let Some((from, read)) = self.reads.pop_front() else {
            return Ok(Vec::new());
        };
        let page = read.await.unwrap_or_else(|e| {
            Err(StoreError::Unavailable {
                backend: "engine",
                message: format!("the task reading a journal page failed: {e}"),
            })
        })?;
        let reached = page.last().map_or(from, |e| e.seq + 1);
        if reached != from + READ_PAGE as u64 {
            // Short (or empty): what was started after it starts at the wrong seq.
            for (_, read) in self.reads.drain(..) {
                read.abort();
            }
            self.next = if page.is_empty() { self.end } else { reached };
        }
        self.fill();
        Ok(page)
    }

    fn fill(&mut self) {
        while self.reads.len() < AHEAD && self.next < self.end {
            let (store, run, from, retries) = (
                self.store.clone(),
                self.run.clone(),
                self.next,
                self.retries,
            );
            let read = tokio::spawn(async move {
                super::retrying(retries, || store.read(&run, from, READ_PAGE)).await
            });
            self.reads.push_back((from, read));
            self.next = from.saturating_add(READ_PAGE as u64);
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        for (_, read) in self.reads.drain(..) {
            read.abort();
        }
    }
}
