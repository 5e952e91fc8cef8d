//! Other processes' writes. SQLite cannot notify another process, so a task per store polls
//! `PRAGMA data_version` on its own connection (a read of the WAL index in shared memory, no
//! I/O) every [`INTERVAL`]; when the version moved and this process's writer committed nothing
//! meanwhile, another process wrote, and every idle worker and every watcher of this handle is
//! woken to re-read. A change that coincides with a local commit is left to the waiters'
//! fallback poll.

use crate::error::map_sqlx;
use eve_core::{StoreError, WakeSignal, WatchHub};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{Connection, SqliteConnection};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the data version is read.
pub(crate) const INTERVAL: Duration = Duration::from_millis(100);

/// The polling task; stopped when the last handle of the store is dropped.
#[derive(Debug)]
pub(crate) struct DataWatch(tokio::task::AbortHandle);

impl Drop for DataWatch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts the task. `commits` counts this process's commits (the writer bumps it).
pub(crate) async fn spawn(
    connect: &SqliteConnectOptions,
    commits: Arc<AtomicU64>,
    wake: WakeSignal,
    hub: WatchHub,
) -> Result<DataWatch, StoreError> {
    let mut conn = SqliteConnection::connect_with(connect)
        .await
        .map_err(map_sqlx)?;
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last: Option<(i64, u64)> = None;
        loop {
            tick.tick().await;
            let local = commits.load(Ordering::SeqCst);
            let Ok(version) = sqlx::query_scalar::<_, i64>("PRAGMA data_version")
                .fetch_one(&mut conn)
                .await
            else {
                continue;
            };
            if let Some((v, c)) = last {
                if version != v && local == c {
                    wake.wake();
                    hub.wake_all();
                }
            }
            last = Some((version, local));
        }
    });
    Ok(DataWatch(task.abort_handle()))
}
