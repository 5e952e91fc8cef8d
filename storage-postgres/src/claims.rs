//! Workers and leases: registration, heartbeats, claims (in claim key order, orphaned runs
//! included), releases, retirement and `next_wake` (contract clause 5).

use crate::error::{fenced, i64_of, map_err};
use crate::reads::{run_from_row, RUN_COLS};
use crate::Db;
use eve_core::{DeploymentId, Lease, RunId, RunRecord, StoreError, Timestamp, WorkerId};
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

/// A run of deployment `$1` that is claimable at `$2` (`r` the run, `w` its owner's worker):
/// running, held by no valid lease, and its claim key is due.
///
/// `r.owner_worker IS NOT DISTINCT FROM w.worker_id` guards the re-check Postgres makes when a
/// row changed under a locking statement: it re-reads `r` but keeps the joined `w` of the old
/// snapshot, so a run claimed meanwhile by another worker must not pass as unowned or orphaned.
const CLAIMABLE: &str = concat!(
    "r.deployment_id = $1 AND r.status = 'running' \
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

    pub(crate) async fn claim(
        &self,
        lease: &Lease,
        max: usize,
        now: Timestamp,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let mut tx = self.begin().await?;
        let w: Option<(i64, bool, i64)> = sqlx::query_as(self.sql(
            "SELECT epoch, retired, expires_at FROM {s}.workers WHERE worker_id = $1 FOR SHARE",
        ))
        .bind(lease.worker.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        match w {
            Some((epoch, false, expires)) if epoch as u64 == lease.epoch && expires > now.0 => {}
            _ => return Err(fenced(lease, "")),
        }
        if max == 0 {
            return Ok(Vec::new());
        }
        // Runs locked by a write in flight are skipped (SKIP LOCKED) so claimers never queue
        // behind each other; if that left the claim short, the skipped candidates are locked
        // (waiting for those writes) and re-checked with a fresh snapshot, so a claim never
        // misses a run that was claimable before the write that held it.
        let mut out = self.claim_rows(&mut tx, lease, max, now, None, &[]).await?;
        if out.len() < max {
            let taken: Vec<String> = out.iter().map(|(_, r)| r.run_id.to_string()).collect();
            let skipped: Vec<String> = sqlx::query_scalar(self.sql(&format!(
                "SELECT r.run_id FROM {{s}}.runs r LEFT JOIN {{s}}.workers w ON w.worker_id = r.owner_worker \
                 WHERE {CLAIMABLE} AND NOT (r.run_id = ANY($4)) \
                 ORDER BY {CLAIM_KEY}, r.ord LIMIT $3"
            )))
            .bind(lease.deployment.as_str())
            .bind(now.0)
            .bind(i64::try_from(max - out.len()).unwrap_or(i64::MAX))
            .bind(&taken)
            .fetch_all(&mut *tx)
            .await
            .map_err(map_err)?;
            if !skipped.is_empty() {
                sqlx::query(self.sql(
                    "SELECT 1 FROM {s}.runs WHERE run_id = ANY($1) ORDER BY run_id FOR UPDATE",
                ))
                .bind(&skipped)
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
                let more = self
                    .claim_rows(&mut tx, lease, max - out.len(), now, Some(&skipped), &taken)
                    .await?;
                out.extend(more);
            }
        }
        tx.commit().await.map_err(map_err)?;
        out.sort_by_key(|(k, _)| *k);
        Ok(out.into_iter().map(|(_, r)| r).collect())
    }

    pub(crate) async fn release(
        &self,
        lease: &Lease,
        run: &RunId,
        processed_seq: u64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let locked = self
            .lock_run(&mut tx, run)
            .await?
            .ok_or_else(|| StoreError::not_found("run", run))?;
        let r = &locked.run;
        if r.owner.as_ref() != Some(&(lease.worker.clone(), lease.epoch))
            || locked.owner_lease != Some((lease.epoch, false))
        {
            return Err(fenced(lease, run.as_str()));
        }
        let processed = r.processed_seq.max(processed_seq.min(r.next_seq));
        let set_pending = processed != r.processed_seq;
        sqlx::query(self.sql(
            "UPDATE {s}.runs SET owner_worker = NULL, owner_epoch = NULL, updated_at = $2, \
               processed_seq = $3, \
               pending_at = CASE WHEN NOT $4 THEN pending_at WHEN $3 >= next_seq THEN NULL \
                 ELSE (SELECT e.at FROM {s}.events e WHERE e.run_id = $1 AND e.first_seq <= $3 \
                       ORDER BY e.first_seq DESC LIMIT 1) END \
             WHERE run_id = $1",
        ))
        .bind(run.as_str())
        .bind(now.0)
        .bind(processed as i64)
        .bind(set_pending)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        if self.has_work(&mut tx, run).await? {
            self.notify(&mut tx, &r.deployment_id).await?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(())
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
        let at: Option<i64> = sqlx::query_scalar(self.sql(concat!(
            "SELECT min(",
            claim_key!(),
            ") FROM {s}.runs r LEFT JOIN {s}.workers w ON w.worker_id = r.owner_worker \
             WHERE r.deployment_id = $1 AND r.status = 'running' AND NOT ",
            held!()
        )))
        .bind(deployment.as_str())
        .bind(now.0)
        .fetch_one(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(at.map(Timestamp))
    }

    /// Claims up to `max` claimable runs (`only`: among these ids; `skip`: not these) in the
    /// caller's transaction; `only = None` skips rows locked by others.
    pub(crate) async fn claim_rows(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        max: usize,
        now: Timestamp,
        only: Option<&[String]>,
        skip: &[String],
    ) -> Result<Vec<((i64, i64), RunRecord)>, StoreError> {
        let lock = if only.is_some() { "" } else { "SKIP LOCKED" };
        let rows = sqlx::query(self.sql(&format!(
            "WITH c AS ( \
               SELECT r.run_id, r.ord, {CLAIM_KEY} AS claim_key \
               FROM {{s}}.runs r LEFT JOIN {{s}}.workers w ON w.worker_id = r.owner_worker \
               WHERE {CLAIMABLE} AND NOT (r.run_id = ANY($7)) \
                 AND ($6::text[] IS NULL OR r.run_id = ANY($6)) \
               ORDER BY claim_key, r.ord LIMIT $3 \
               FOR UPDATE OF r {lock}) \
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
        .bind(skip)
        .fetch_all(&mut *conn)
        .await
        .map_err(map_err)?;
        rows.iter()
            .map(|row| {
                let at: i64 = row.try_get("claim_key").map_err(map_err)?;
                let ord: i64 = row.try_get("c_ord").map_err(map_err)?;
                Ok(((at, ord), run_from_row(row)?))
            })
            .collect()
    }

    /// Whether the run has work now or later (pending events or a timer) and is running.
    pub(crate) async fn has_work(
        &self,
        conn: &mut PgConnection,
        run: &RunId,
    ) -> Result<bool, StoreError> {
        sqlx::query_scalar(self.sql(
            "SELECT r.status = 'running' AND (r.pending_at IS NOT NULL \
               OR EXISTS (SELECT 1 FROM {s}.timers t WHERE t.run_id = r.run_id)) \
             FROM {s}.runs r WHERE r.run_id = $1",
        ))
        .bind(run.as_str())
        .fetch_one(&mut *conn)
        .await
        .map_err(map_err)
    }
}
