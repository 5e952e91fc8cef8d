//! One live process per worker id (contract clause 11): the lock a worker holds for its whole
//! life, which the OS or the database frees when the process dies.
//!
//! [`JournalStore::lock_worker`](crate::JournalStore::lock_worker) takes it before a worker
//! registers; a second live holder of the same id is refused with
//! [`StoreError::WorkerIdInUse`], which names the holder (see [`this_process`]). Each backend
//! uses what frees the lock when its holder dies: a file lock beside a SQLite file, a session
//! advisory lock on Postgres, a short heartbeat on DynamoDB, and within one process (the memory
//! store, the default) [`lock_in_process`].

use crate::error::StoreError;
use crate::ids::WorkerId;
use crate::time::Timestamp;
use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, UNIX_EPOCH};

/// A worker id held by this process: while this value lives, no other holder (another process,
/// another store handle, another worker of this process) gets a lock on the same id of the same
/// store. Dropping it frees the id; so does the death of the process, whatever the backend.
#[must_use = "the worker id is free again as soon as the lock is dropped"]
pub struct WorkerLock {
    worker: WorkerId,
    holder: String,
    _guard: Box<dyn Any + Send + Sync>,
}

impl WorkerLock {
    /// A lock on `worker` held by `holder` (see [`this_process`]); `guard` keeps it: dropping
    /// the guard must free the id (unlock a file, end a database session, stop a heartbeat).
    pub fn new(worker: WorkerId, holder: String, guard: impl Any + Send + Sync) -> Self {
        Self {
            worker,
            holder,
            _guard: Box::new(guard),
        }
    }

    /// The worker id held.
    pub fn worker(&self) -> &WorkerId {
        &self.worker
    }

    /// Who holds it, as another process trying the same id is told.
    pub fn holder(&self) -> &str {
        &self.holder
    }
}

impl fmt::Debug for WorkerLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerLock")
            .field("worker", &self.worker)
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

/// This process as a lock holder is named to others: `pid 4242 on host build-1, since
/// 2026-05-01T10:00:00Z` (`now` is when the lock was taken).
pub fn this_process(now: Timestamp) -> String {
    let since = UNIX_EPOCH + Duration::from_millis(u64::try_from(now.millis()).unwrap_or(0));
    format!(
        "pid {} on host {}, since {}",
        std::process::id(),
        crate::engine::host_name(),
        humantime::format_rfc3339_seconds(since)
    )
}

/// The ids held through [`lock_in_process`]: (store id, worker id) → holder.
static IN_PROCESS: Mutex<Option<HashMap<(String, String), String>>> = Mutex::new(None);

/// Frees an id of [`IN_PROCESS`] when dropped.
struct InProcess((String, String));

impl Drop for InProcess {
    fn drop(&mut self) {
        let mut held = IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = held.as_mut() {
            held.remove(&self.0);
        }
    }
}

/// A lock on `worker` of the store `store_id` that holds within this process only: the
/// [`JournalStore::lock_worker`](crate::JournalStore::lock_worker) of the memory store (whose
/// data lives in one process anyway) and the default for backends that have no lock of their
/// own.
///
/// # Errors
/// `WorkerIdInUse` while another lock of this process holds the id.
pub fn lock_in_process(store_id: &str, worker: &WorkerId) -> Result<WorkerLock, StoreError> {
    let key = (store_id.to_owned(), worker.as_str().to_owned());
    let mut held = IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    let held = held.get_or_insert_with(HashMap::new);
    if let Some(holder) = held.get(&key) {
        return Err(StoreError::WorkerIdInUse {
            worker: worker.to_string(),
            holder: format!("{holder}, in this process"),
        });
    }
    let holder = this_process(Timestamp::now());
    held.insert(key.clone(), holder.clone());
    Ok(WorkerLock::new(worker.clone(), holder, InProcess(key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_held_in_process_is_refused_until_dropped() {
        let w = WorkerId::new("w");
        let first = lock_in_process("store-a", &w).unwrap();
        let e = lock_in_process("store-a", &w).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, StoreError::WorkerIdInUse { .. }) && msg.contains(first.holder()),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        // Another store, or the same id once dropped: free.
        let other = lock_in_process("store-b", &w).unwrap();
        drop(first);
        let again = lock_in_process("store-a", &w).unwrap();
        drop((other, again));
    }
}
