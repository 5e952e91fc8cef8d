//! Mapping sqlx and rusqlite errors to [`StoreError`] kinds: no driver type reaches the public
//! API.

use eve_core::StoreError;

pub(crate) const BACKEND: &str = "sqlite";

/// Busy and locked databases, lost workers and pool timeouts are transient (`Unavailable`);
/// everything else is `Other`.
pub(crate) fn map_sqlx(e: sqlx::Error) -> StoreError {
    if let sqlx::Error::Database(db) = &e {
        if db
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .is_some_and(|c| c & 0xff == SQLITE_FULL)
        {
            return full();
        }
    }
    let transient = match &e {
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            // The primary result code is the low byte of the extended one.
            .is_some_and(|c| matches!(c & 0xff, 5 | 6)),
        sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::WorkerCrashed => true,
        _ => false,
    };
    kinded(transient, e)
}

/// The writer connection's errors, kinded as [`map_sqlx`] does: a busy or locked database is
/// `Unavailable` (retryable), everything else `Other`.
pub(crate) fn map_rusqlite(e: rusqlite::Error) -> StoreError {
    if matches!(&e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DiskFull)
    {
        return full();
    }
    let transient = matches!(
        &e,
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(f.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    );
    kinded(transient, e)
}

/// `SQLITE_FULL`: the disk is full, or the database reached `PRAGMA max_page_count`.
const SQLITE_FULL: i32 = 13;

/// `StorageFull` without its file yet: [`crate::SqliteStore`] names it ([`locate`]) before the
/// error leaves the crate.
fn full() -> StoreError {
    StoreError::StorageFull {
        backend: BACKEND,
        path: String::new(),
    }
}

/// `e` with the database file named when it is a `StorageFull` that names none.
pub(crate) fn locate(e: StoreError, file: &std::path::Path) -> StoreError {
    match e {
        StoreError::StorageFull { backend, path } if path.is_empty() => StoreError::StorageFull {
            backend,
            path: file.display().to_string(),
        },
        e => e,
    }
}

/// `e` as `Unavailable` (its message) when `transient`, else as `Other` (its source).
fn kinded(transient: bool, e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    if transient {
        StoreError::Unavailable {
            backend: BACKEND,
            message: e.to_string(),
        }
    } else {
        StoreError::Other {
            backend: BACKEND,
            source: Box::new(e),
        }
    }
}

/// A backend failure described by a message.
pub(crate) fn other(message: String) -> StoreError {
    StoreError::Other {
        backend: BACKEND,
        source: message.into(),
    }
}

/// The error every op of a batch gets when the batch's transaction could not be committed: the
/// same kind as `e` (transient stays retryable), with its message.
pub(crate) fn batch_failed(e: &StoreError) -> StoreError {
    if let StoreError::StorageFull { backend, path } = e {
        return StoreError::StorageFull {
            backend,
            path: path.clone(),
        };
    }
    if e.is_retryable() {
        StoreError::Unavailable {
            backend: BACKEND,
            message: format!("the transaction was not committed: {e}"),
        }
    } else {
        other(format!("the transaction was not committed: {e}"))
    }
}

/// The writer thread is gone (it panicked).
pub(crate) fn writer_gone() -> StoreError {
    StoreError::Unavailable {
        backend: BACKEND,
        message: "the store's writer thread has stopped; open the store again".into(),
    }
}
