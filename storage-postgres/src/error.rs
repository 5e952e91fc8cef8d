//! Mapping sqlx errors to [`StoreError`] kinds: no sqlx type leaves this crate.

use eve_core::{Lease, StoreError};

pub(crate) const BACKEND: &str = "postgres";

/// Maps a sqlx error: connection loss, pool exhaustion, serialization failures, deadlocks and
/// server shutdowns are `Unavailable` (retry the call); anything else is `Other`.
pub(crate) fn map_err(e: sqlx::Error) -> StoreError {
    let transient = match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(d) => d.code().is_some_and(|c| {
            // 40001 serialization failure, 40P01 deadlock, 08xxx connection exceptions,
            // 57P01..03 admin/crash shutdown and cannot-connect-now, 53xxx resources.
            c == "40001"
                || c == "40P01"
                || c.starts_with("08")
                || c.starts_with("57P")
                || c.starts_with("53")
        }),
        _ => false,
    };
    if transient {
        StoreError::Unavailable {
            backend: BACKEND,
            message: format!("{e} (the connection or transaction was lost; the call may be retried, appends with the same append id)"),
        }
    } else {
        StoreError::Other {
            backend: BACKEND,
            source: Box::new(e),
        }
    }
}

/// A stored value that does not parse (a status, an execution mode, a request body).
pub(crate) fn bad_row(what: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Other {
        backend: BACKEND,
        source: format!("stored {what} does not parse: {detail}; the row was written by another program or edited by hand").into(),
    }
}

pub(crate) fn unavailable(message: String) -> StoreError {
    StoreError::Unavailable {
        backend: BACKEND,
        message,
    }
}

pub(crate) fn i64_of(v: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| {
        StoreError::InvalidInput(format!("{what} {v} is too large for this store (max i64)"))
    })
}

pub(crate) fn fenced(lease: &Lease, run: &str) -> StoreError {
    StoreError::Fenced {
        run: run.to_owned(),
        worker: lease.worker.to_string(),
        epoch: lease.epoch,
    }
}
