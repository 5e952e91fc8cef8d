//! Workers and leases: registration, heartbeats, claims (in claim key order, orphaned runs
//! included), releases, retirement and `next_wake` (contract clause 5).

use crate::error::{bad_row, fenced, i64_of, map_err};
use crate::reads::{run_from_row, RUN_COLS};
use crate::Db;
use eve_core::{DeploymentId, Lease, RunId, RunRecord, StoreError, Timestamp, WorkerId};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use std::time::Duration;

/// The claim key of a run `r` that no valid lease holds (contract clause 5): when its work is
/// due (its first unprocessed event or its earliest timer), and for an orphaned run (it still
/// names an owner) the earlier of that and its `updated_at`. NULL: no work and no owner.
/// (`LEAST` ignores NULLs.)
macro_rules! claim_key {
    () => {
        "LEAST(r.pending_at, (SELECT min(t.due) FROM {s}.timers t WHERE t.run_id = r.run_id), \
         CASE WHEN r.owner_worker IS NOT NULL THEN r.updated_at END)"
    };
}

/// See [`claim_key!`].
const CLAIM_KEY: &str = claim_key!();

/// Whether a valid lease holds run `r` at `$2` (`w` its owner's worker row).
macro_rules! held {
    () => {
        "coalesce(NOT w.retired AND w.epoch = r.owner_epoch AND w.expires_at > $2, FALSE)"
    };
}

/// The runs whose owner no longer holds them at `$2` (retired, expired, or at another epoch),
/// as `(run_id, updated_at, deployment_id, status)`: driven from the few workers rows through
/// `runs_owner` (each lateral is fenced with `OFFSET 0`, so the planner cannot turn it around),
/// the runs live workers hold are not read. The epoch test is two branches, `<` and `>`, so each
/// is a range on `runs_owner (owner_worker, owner_epoch)`; with `<>` (or the retired/expired
/// test in the same branch) every run the worker holds would be read. Every owner has a workers
/// row: claims need one, and rows are never deleted (retirement marks them).
macro_rules! orphans {
    () => {
        "SELECT o.* FROM {s}.workers ow CROSS JOIN LATERAL ( \
           SELECT run_id, updated_at, deployment_id, status FROM {s}.runs \
           WHERE owner_worker = ow.worker_id OFFSET 0) o \
         WHERE ow.retired OR ow.expires_at <= $2 \
         UNION ALL SELECT o.* FROM {s}.workers ow CROSS JOIN LATERAL ( \
           SELECT run_id, updated_at, deployment_id, status FROM {s}.runs \
           WHERE owner_worker = ow.worker_id AND owner_epoch < ow.epoch OFFSET 0) o \
         UNION ALL SELECT o.* FROM {s}.workers ow CROSS JOIN LATERAL ( \
           SELECT run_id, updated_at, deployment_id, status FROM {s}.runs \
           WHERE owner_worker = ow.worker_id AND owner_epoch > ow.epoch OFFSET 0) o"
    };
}

/// The ids of the runs of deployment `$1` that may be claimable at `$2`, as one array computed
/// once (so `r.run_id = ANY(…)` is a primary-key probe per candidate), found through indexes
/// (migration 10): an event not processed since `pending_at` (`runs_pending`), a timer due
/// (`timers_due`), or an orphan ([`orphans!`]). A claim's cost thus does not grow with the runs
/// parked on a wait. A superset: [`CLAIMABLE`] decides.
macro_rules! due_ids {
    () => {
        concat!(
            "ARRAY(SELECT run_id FROM {s}.runs WHERE deployment_id = $1 AND status = 'running' \
               AND pending_at <= $2 \
             UNION ALL SELECT run_id FROM {s}.timers WHERE due <= $2 \
             UNION ALL SELECT run_id FROM (",
            orphans!(),
            ") o)"
        )
    };
}

/// See [`due_ids!`].
const DUE_IDS: &str = due_ids!();

/// A run of deployment `$1` that is claimable at `$2` (`r` the run, `w` its owner's worker):
/// running, held by no valid lease, and its claim key is due.
///
/// `r.owner_worker IS NOT DISTINCT FROM w.worker_id` guards the re-check Postgres makes when a
/// row changed under a locking statement: it re-reads `r` but keeps the joined `w` of the old
/// snapshot, so a run claimed meanwhile by another worker must not pass as unowned or orphaned.
/// The deployment and status tests are wrapped in `IS TRUE` (the same, on NOT NULL columns) so
/// the planner reaches the candidates by primary key, not through `runs_deployment_status`,
/// even before the table has statistics.
const CLAIMABLE: &str = concat!(
    "(r.deployment_id = $1) IS TRUE AND (r.status = 'running') IS TRUE \
     AND r.owner_worker IS NOT DISTINCT FROM w.worker_id AND NOT ",
    held!(),
    " AND ",
    claim_key!(),
    " <= $2"
);

/// The lease and claim operations of [`eve_core::JournalStore`] (the impl delegates here).
impl Db {
    pub(crate) async fn register_worker(
        &self,
        worker: &WorkerId,
        deployment: &DeploymentId,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        eve_core::store::check_worker_ids(worker, deployment)?;
        let expires_at = now.plus(ttl);
        let mut tx = self.begin().await?;
        let epoch: i64 = sqlx::query_scalar(self.sql(
            "INSERT INTO {s}.workers (worker_id, deployment_id, epoch, expires_at, retired) \
             VALUES ($1, $2, 1, $3, FALSE) \
             ON CONFLICT (worker_id) DO UPDATE SET deployment_id = excluded.deployment_id, \
               epoch = {s}.workers.epoch + 1, expires_at = excluded.expires_at, retired = FALSE \
             RETURNING epoch",
        ))
        .bind(worker.as_str())
        .bind(deployment.as_str())
        .bind(expires_at.0)
        .fetch_one(&mut *tx)
        .await
        .map_err(map_err)?;
        // An earlier epoch's runs are orphaned now: wake idle workers to take them.
        if epoch > 1 {
            self.notify(&mut tx, deployment).await?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(Lease {
            worker: worker.clone(),
            deployment: deployment.clone(),
            epoch: epoch as u64,
            expires_at,
        })
    }

    pub(crate) async fn heartbeat(
        &self,
        lease: &Lease,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        let expires_at = now.plus(ttl);
        let row: Option<(String, i64)> = sqlx::query_as(self.sql(
            "UPDATE {s}.workers SET expires_at = $3 \
             WHERE worker_id = $1 AND epoch = $2 AND NOT retired RETURNING deployment_id, epoch",
        ))
        .bind(lease.worker.as_str())
        .bind(i64_of(lease.epoch, "epoch")?)
        .bind(expires_at.0)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        match row {
            Some((deployment, epoch)) => Ok(Lease {
                worker: lease.worker.clone(),
                deployment: deployment.into(),
                epoch: epoch as u64,
                expires_at,
            }),
            None => {
                let exists: bool = sqlx::query_scalar(
                    self.sql("SELECT EXISTS (SELECT 1 FROM {s}.workers WHERE worker_id = $1)"),
                )
                .bind(lease.worker.as_str())
                .fetch_one(&self.pool)
                .await
                .map_err(map_err)?;
                Err(if exists {
                    fenced(lease, "")
                } else {
                    StoreError::not_found("worker", &lease.worker)
                })
            }
        }
    }

    /// One statement in the common case: it checks the lease (locking the worker row `FOR
    /// SHARE`, so a re-registration or retirement waits for the claim), claims runs with `SKIP
    /// LOCKED`, and lists the claimable runs it skipped because a write held them. Only when
    /// that left the claim short are the skipped ones locked (waiting for those writes) and
    /// re-checked, in a transaction of their own, so a claim never misses a run that was
    /// claimable before the write that held it, and claimers never queue behind each other.
    pub(crate) async fn claim(
        &self,
        lease: &Lease,
        max: usize,
        now: Timestamp,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let rows = sqlx::query(self.sql(&format!(
            "WITH me AS ( \
               SELECT 1 FROM {{s}}.workers WHERE worker_id = $4 AND epoch = $5 AND NOT retired \
                 AND expires_at > $2 FOR SHARE), \
             due AS MATERIALIZED (SELECT {DUE_IDS} AS ids), \
             cand AS ( \
               SELECT r.run_id FROM {{s}}.runs r \
                 LEFT JOIN {{s}}.workers w ON w.worker_id = r.owner_worker \
               WHERE r.run_id = ANY((SELECT ids FROM due)::text[]) AND {CLAIMABLE} AND EXISTS (SELECT 1 FROM me) \
               ORDER BY {CLAIM_KEY}, r.ord LIMIT $3), \
             c AS ( \
               SELECT r.run_id, r.ord, {CLAIM_KEY} AS claim_key FROM {{s}}.runs r \
                 LEFT JOIN {{s}}.workers w ON w.worker_id = r.owner_worker \
               WHERE r.run_id = ANY((SELECT ids FROM due)::text[]) AND {CLAIMABLE} AND EXISTS (SELECT 1 FROM me) \
               ORDER BY claim_key, r.ord LIMIT $3 FOR UPDATE OF r SKIP LOCKED), \
             upd AS ( \
               UPDATE {{s}}.runs r SET owner_worker = $4, owner_epoch = $5, \
                 activations = r.activations + 1, updated_at = $2 \
               FROM c WHERE r.run_id = c.run_id \
               RETURNING {RUN_COLS}, c.claim_key AS claim_key, c.ord AS c_ord) \
             SELECT EXISTS (SELECT 1 FROM me) AS valid, \
               ARRAY(SELECT run_id FROM cand WHERE run_id NOT IN (SELECT run_id FROM c)) AS skipped, \
               upd.* \
             FROM (SELECT 1) one LEFT JOIN upd ON TRUE"
        )))
        .bind(lease.deployment.as_str())
        .bind(now.0)
        .bind(i64::try_from(max).unwrap_or(i64::MAX))
        .bind(lease.worker.as_str())
        .bind(i64_of(lease.epoch, "epoch")?)
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        let Some(first) = rows.first() else {
            return Err(bad_row("claim", "no row"));
        };
        if !first.try_get::<bool, _>("valid").map_err(map_err)? {
            return Err(fenced(lease, ""));
        }
        let skipped: Vec<String> = first.try_get("skipped").map_err(map_err)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            if row
                .try_get::<Option<String>, _>("run_id")
                .map_err(map_err)?
                .is_some()
            {
                out.push(claimed(row)?);
            }
        }
        if out.len() < max && !skipped.is_empty() {
            let more = self
                .claim_skipped(lease, max - out.len(), now, &skipped)
                .await?;
            out.extend(more);
        }
        out.sort_by_key(|(k, _)| *k);
        Ok(out.into_iter().map(|(_, r)| r).collect())
    }

    /// The rare second part of [`Db::claim`]: locks the `skipped` runs (waiting for the writes
    /// that held them) and claims those still claimable, under the lease if it is still valid.
    async fn claim_skipped(
        &self,
        lease: &Lease,
        max: usize,
        now: Timestamp,
        skipped: &[String],
    ) -> Result<Vec<((i64, i64), RunRecord)>, StoreError> {
        let mut tx = self.begin().await?;
        let valid: Option<i32> = sqlx::query_scalar(self.sql(
            "SELECT 1 FROM {s}.workers WHERE worker_id = $1 AND epoch = $2 AND NOT retired \
             AND expires_at > $3 FOR SHARE",
        ))
        .bind(lease.worker.as_str())
        .bind(i64_of(lease.epoch, "epoch")?)
        .bind(now.0)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        if valid.is_none() {
            return Ok(Vec::new());
        }
        sqlx::query(
            self.sql("SELECT 1 FROM {s}.runs WHERE run_id = ANY($1) ORDER BY run_id FOR UPDATE"),
        )
        .bind(skipped)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let out = self.claim_rows(&mut tx, lease, max, now, skipped).await?;
        tx.commit().await.map_err(map_err)?;
        Ok(out)
    }

    pub(crate) async fn release(
        &self,
        lease: &Lease,
        run: &RunId,
        processed_seq: u64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let outcome: String =
            sqlx::query_scalar(self.sql("SELECT {s}.eve_release($1, $2, $3, $4, $5, $6)"))
                .bind(run.as_str())
                .bind(lease.worker.as_str())
                .bind(i64_of(lease.epoch, "epoch")?)
                .bind(processed_seq.min(i64::MAX as u64) as i64)
                .bind(now.0)
                .bind(&self.channel)
                .fetch_one(&self.pool)
                .await
                .map_err(map_err)?;
        match outcome.as_str() {
            "ok" => Ok(()),
            "not_found" => Err(StoreError::not_found("run", run)),
            "fenced" => Err(fenced(lease, run.as_str())),
            other => Err(bad_row("release outcome", other)),
        }
    }

    pub(crate) async fn retire_worker(&self, lease: &Lease) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let w: Option<(i64, bool)> = sqlx::query_as(
            self.sql("SELECT epoch, retired FROM {s}.workers WHERE worker_id = $1 FOR UPDATE"),
        )
        .bind(lease.worker.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        match w {
            Some((epoch, false)) if epoch as u64 == lease.epoch => {}
            _ => return Err(fenced(lease, "")),
        }
        // The runs it still holds keep naming it: orphaned, they are claimable at once.
        sqlx::query(self.sql("UPDATE {s}.workers SET retired = TRUE WHERE worker_id = $1"))
            .bind(lease.worker.as_str())
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        self.notify(&mut tx, &lease.deployment).await?;
        tx.commit().await.map_err(map_err)?;
        Ok(())
    }

    pub(crate) async fn next_wake(
        &self,
        deployment: &DeploymentId,
        now: Timestamp,
    ) -> Result<Option<Timestamp>, StoreError> {
        // The least claim key of the deployment's unheld runs (see `claim_key!`), as the least
        // of its three parts, each read through an index: the first pending run, the first
        // timer (in due order, each checked against its run), the oldest orphan.
        let at: Option<i64> = sqlx::query_scalar(self.sql(concat!(
            "SELECT LEAST( \
               (SELECT r.pending_at FROM {s}.runs r \
                  LEFT JOIN {s}.workers w ON w.worker_id = r.owner_worker \
                WHERE r.deployment_id = $1 AND r.status = 'running' \
                  AND r.pending_at IS NOT NULL AND NOT ",
            held!(),
            "   ORDER BY r.pending_at LIMIT 1), \
               (SELECT t.due FROM {s}.timers t CROSS JOIN LATERAL ( \
                  SELECT 1 FROM {s}.runs r LEFT JOIN {s}.workers w ON w.worker_id = r.owner_worker \
                  WHERE r.run_id = t.run_id AND r.deployment_id = $1 AND r.status = 'running' \
                    AND NOT ",
            held!(),
            "     OFFSET 0) x ORDER BY t.due LIMIT 1), \
               (SELECT min(o.updated_at) FROM (",
            orphans!(),
            ") o WHERE o.deployment_id = $1 AND o.status = 'running'))"
        )))
        .bind(deployment.as_str())
        .bind(now.0)
        .fetch_one(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(at.map(Timestamp))
    }

    /// Claims up to `max` claimable runs among `only` (rows the caller locked) in the caller's
    /// transaction, with their claim keys and creation order.
    async fn claim_rows(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        max: usize,
        now: Timestamp,
        only: &[String],
    ) -> Result<Vec<((i64, i64), RunRecord)>, StoreError> {
        let rows = sqlx::query(self.sql(&format!(
            "WITH c AS ( \
               SELECT r.run_id, r.ord, {CLAIM_KEY} AS claim_key \
               FROM {{s}}.runs r LEFT JOIN {{s}}.workers w ON w.worker_id = r.owner_worker \
               WHERE {CLAIMABLE} AND r.run_id = ANY($6) \
               ORDER BY claim_key, r.ord LIMIT $3 \
               FOR UPDATE OF r) \
             UPDATE {{s}}.runs r SET owner_worker = $4, owner_epoch = $5, \
               activations = r.activations + 1, updated_at = $2 \
             FROM c WHERE r.run_id = c.run_id \
             RETURNING {RUN_COLS}, c.claim_key AS claim_key, c.ord AS c_ord"
        )))
        .bind(lease.deployment.as_str())
        .bind(now.0)
        .bind(i64::try_from(max).unwrap_or(i64::MAX))
        .bind(lease.worker.as_str())
        .bind(i64_of(lease.epoch, "epoch")?)
        .bind(only)
        .fetch_all(&mut *conn)
        .await
        .map_err(map_err)?;
        rows.iter().map(claimed).collect()
    }
}

/// A claimed run with its claim key and creation order (the order claims return runs in).
fn claimed(row: &PgRow) -> Result<((i64, i64), RunRecord), StoreError> {
    let at: i64 = row.try_get("claim_key").map_err(map_err)?;
    let ord: i64 = row.try_get("c_ord").map_err(map_err)?;
    Ok(((at, ord), run_from_row(row)?))
}
