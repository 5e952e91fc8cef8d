//! Decoding rows into contract records, and the column lists the queries share.

use crate::error::{map_rusqlite, map_sqlx};
use eve_core::{
    DeploymentId, Execution, RunId, RunRecord, RunStatus, SessionId, StoreError, Timestamp,
    WorkerId,
};
use sqlx::sqlite::SqliteRow;
use sqlx::Row;

/// The columns [`run_record`] decodes, in its order.
macro_rules! run_cols {
    () => {
        "run_id, idempotency_key, workflow_id, deployment_id, tool, session_id, call_id, \
         execution, status, next_seq, processed_seq, cancel_requested, activations, \
         owner_worker, owner_epoch, created_at, updated_at, \
         (SELECT json_group_object(a.key, json(a.value)) FROM run_attributes a \
          WHERE a.run_id = runs.run_id)"
    };
}

/// [`run_cols`] qualified with the alias `r`, for joins.
macro_rules! run_cols_r {
    () => {
        "r.run_id, r.idempotency_key, r.workflow_id, r.deployment_id, r.tool, r.session_id, \
         r.call_id, r.execution, r.status, r.next_seq, r.processed_seq, r.cancel_requested, \
         r.activations, r.owner_worker, r.owner_epoch, r.created_at, r.updated_at, \
         (SELECT json_group_object(a.key, json(a.value)) FROM run_attributes a \
          WHERE a.run_id = r.run_id)"
    };
}

pub(crate) use {run_cols, run_cols_r};

/// Number of columns in [`run_cols`]; extra columns of a query follow them.
pub(crate) const RUN_COLS: usize = 18;

pub(crate) fn execution_str(e: Execution) -> &'static str {
    match e {
        Execution::Default => "default",
        Execution::Background => "background",
    }
}

/// A result row of either connection kind: the sqlx pool's reads or the writer's rusqlite
/// connection, so both decode records with the same functions.
pub(crate) trait Cols {
    /// Column `i` as an optional integer.
    fn opt_int(&self, i: usize) -> Result<Option<i64>, StoreError>;
    /// Column `i` as optional text.
    fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError>;
}

impl Cols for SqliteRow {
    fn opt_int(&self, i: usize) -> Result<Option<i64>, StoreError> {
        self.try_get(i).map_err(map_sqlx)
    }
    fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError> {
        self.try_get(i).map_err(map_sqlx)
    }
}

impl Cols for rusqlite::Row<'_> {
    fn opt_int(&self, i: usize) -> Result<Option<i64>, StoreError> {
        self.get(i).map_err(map_rusqlite)
    }
    fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError> {
        self.get(i).map_err(map_rusqlite)
    }
}

fn null(i: usize) -> StoreError {
    crate::error::other(format!("unexpected NULL in column {i}"))
}

pub(crate) fn i64_col(row: &(impl Cols + ?Sized), i: usize) -> Result<i64, StoreError> {
    row.opt_int(i)?.ok_or_else(|| null(i))
}

pub(crate) fn u64_col(row: &(impl Cols + ?Sized), i: usize) -> Result<u64, StoreError> {
    Ok(i64_col(row, i)? as u64)
}

pub(crate) fn opt_i64(row: &(impl Cols + ?Sized), i: usize) -> Result<Option<i64>, StoreError> {
    row.opt_int(i)
}

pub(crate) fn text(row: &(impl Cols + ?Sized), i: usize) -> Result<String, StoreError> {
    row.opt_text(i)?.ok_or_else(|| null(i))
}

/// Decodes the first [`RUN_COLS`] columns.
pub(crate) fn run_record(row: &(impl Cols + ?Sized)) -> Result<RunRecord, StoreError> {
    let run_id = RunId::new(text(row, 0)?);
    let corrupt = |reason: String| StoreError::Corrupt {
        run: run_id.clone(),
        seq: 0,
        reason,
    };
    let execution = match text(row, 7)?.as_str() {
        "default" => Execution::Default,
        "background" => Execution::Background,
        other => return Err(corrupt(format!("unknown execution {other:?} in runs row"))),
    };
    let status_s = text(row, 8)?;
    let status = RunStatus::parse(&status_s)
        .ok_or_else(|| corrupt(format!("unknown status {status_s:?} in runs row")))?;
    let owner_worker = row.opt_text(13)?;
    let owner_epoch = opt_i64(row, 14)?;
    let activations = i64_col(row, 12)?;
    let cancel = i64_col(row, 11)?;
    Ok(RunRecord {
        idempotency_key: text(row, 1)?,
        workflow_id: text(row, 2)?.into(),
        deployment_id: DeploymentId::new(text(row, 3)?),
        tool: text(row, 4)?,
        session_id: SessionId::new(text(row, 5)?),
        call_id: text(row, 6)?.into(),
        execution,
        status,
        next_seq: u64_col(row, 9)?,
        processed_seq: u64_col(row, 10)?,
        cancel_requested: cancel != 0,
        activations: u32::try_from(activations).unwrap_or(u32::MAX),
        owner: match (owner_worker, owner_epoch) {
            (Some(w), Some(e)) => Some((WorkerId::new(w), e as u64)),
            _ => None,
        },
        created_at: Timestamp(i64_col(row, 15)?),
        updated_at: Timestamp(i64_col(row, 16)?),
        attributes: match row.opt_text(17)? {
            Some(json) => serde_json::from_str(&json)
                .map_err(|e| corrupt(format!("run attributes {json:?}: {e}")))?,
            None => Default::default(),
        },
        run_id,
    })
}
