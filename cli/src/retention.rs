//! Retention: `eve runs purge --ended-before AGE`, `eve serve --retain AGE` and `eve mcp --retain AGE`, all over
//! [`JournalStore::purge`].

use crate::error::CliError;
use crate::format::utc;
use eve_core::{JournalStore, Timestamp};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

/// Runs a purge deletes per store call; [`purge_ended`] calls again while a call fills it.
pub const PURGE_BATCH: usize = 1000;

/// How often `eve serve --retain` purges (and once at start).
pub const PURGE_EVERY: Duration = Duration::from_secs(3600);

/// The cutoff `age` before `now` (saturating at the epoch's far past).
pub fn cutoff(now: Timestamp, age: Duration) -> Timestamp {
    let ms = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
    Timestamp(now.0.saturating_sub(ms))
}

/// Purges every run that ended before `cutoff`, [`PURGE_BATCH`] runs per store call, and
/// returns how many. Live runs are never touched (see [`JournalStore::purge`]).
///
/// # Errors
/// The store's error; runs purged by earlier batches stay purged.
pub async fn purge_ended(store: &dyn JournalStore, cutoff: Timestamp) -> Result<usize, CliError> {
    let mut total = 0;
    loop {
        let n = store
            .purge(cutoff, PURGE_BATCH)
            .await
            .map_err(CliError::store(format!(
                "cannot purge runs that ended before {}",
                utc(cutoff)
            )))?;
        total += n;
        if n < PURGE_BATCH {
            return Ok(total);
        }
    }
}

/// `eve runs purge --ended-before AGE`: purges runs that ended more than `age` ago and prints
/// how many.
///
/// # Errors
/// The store's error.
pub async fn runs_purge(
    store: &dyn JournalStore,
    age: Duration,
    now: Timestamp,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let before = cutoff(now, age);
    let n = purge_ended(store, before).await?;
    let _ = writeln!(
        out,
        "purged {n} run(s) that ended before {} ({} ago)",
        utc(before),
        humantime::format_duration(age)
    );
    Ok(())
}

/// `eve serve --retain AGE` and `eve mcp --retain AGE` (`command` names which): purges once
/// now (printing how many on `out`), then every [`PURGE_EVERY`] in a task (logging how many),
/// until the returned handle is aborted. A failed purge is logged and retried at the next
/// tick; it never stops the server.
pub async fn spawn_retention(
    store: Arc<dyn JournalStore>,
    age: Duration,
    command: &'static str,
    out: &mut dyn Write,
) -> tokio::task::JoinHandle<()> {
    if let Some(n) = purge_once(&*store, age, command).await {
        let _ = writeln!(
            out,
            "{command}: retention {}: purged {n} run(s) that ended before {}; purging again every {}",
            humantime::format_duration(age),
            utc(cutoff(Timestamp::now(), age)),
            humantime::format_duration(PURGE_EVERY)
        );
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PURGE_EVERY);
        tick.tick().await;
        loop {
            tick.tick().await;
            purge_once(&*store, age, command).await;
        }
    })
}

/// One purge of `--retain`, logged; `None` when it failed.
async fn purge_once(store: &dyn JournalStore, age: Duration, command: &str) -> Option<usize> {
    let before = cutoff(Timestamp::now(), age);
    match purge_ended(store, before).await {
        Ok(n) => {
            tracing::info!(purged = n, ended_before = %utc(before), "{command}: retention purge");
            Some(n)
        }
        Err(e) => {
            tracing::warn!(error = %e.one_line(), "{command}: retention purge failed; retrying at the next tick");
            None
        }
    }
}
