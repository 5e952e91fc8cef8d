//! Journal pages read ahead of a replay: the next page is read (and decoded) on a task of its
//! own while the body re-executes the current one, so a long cold replay costs about the larger
//! of the two rather than their sum.

use crate::error::StoreError;
use crate::event::StoredEvent;
use crate::ids::RunId;
use crate::store::{JournalStore, READ_PAGE};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// A read of one page of [`READ_PAGE`] events, under way or none.
pub(super) struct PageRead(Option<JoinHandle<Result<Vec<StoredEvent>, StoreError>>>);

impl PageRead {
    /// No read: its page is empty (the journal, or the part of it wanted, ends before it).
    pub(super) fn none() -> Self {
        Self(None)
    }

    /// Starts reading the page of `run` at `from`, retrying transient errors up to `retries`
    /// times as the worker does.
    pub(super) fn start(
        store: &Arc<dyn JournalStore>,
        run: &RunId,
        from: u64,
        retries: u32,
    ) -> Self {
        let (store, run) = (store.clone(), run.clone());
        Self(Some(tokio::spawn(async move {
            let mut tries = 0;
            loop {
                match store.read(&run, from, READ_PAGE).await {
                    Err(e) if e.is_retryable() && tries < retries => {
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(10 << tries.min(6))).await;
                    }
                    other => return other,
                }
            }
        })))
    }

    /// The page, once read (empty for [`PageRead::none`]).
    ///
    /// # Errors
    /// The store's error; `Unavailable` if the reading task panicked.
    pub(super) async fn page(self) -> Result<Vec<StoredEvent>, StoreError> {
        match self.0 {
            None => Ok(Vec::new()),
            Some(task) => task.await.unwrap_or_else(|e| {
                Err(StoreError::Unavailable {
                    backend: "engine",
                    message: format!("the task reading a journal page failed: {e}"),
                })
            }),
        }
    }
}
