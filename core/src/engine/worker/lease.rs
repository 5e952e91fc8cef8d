//! The worker's lease: renewal at a third of it, fencing, and the ownership check before a
//! step attempt starts after a lapse.

use super::*;

impl Inner {
    /// When the lease is due for renewal: a third of the way through it.
    pub(super) fn renew_at(&self) -> Timestamp {
        let lease = self.lease();
        Timestamp(lease.expires_at.0 - (self.config.lease_ttl * 2 / 3).as_millis() as i64)
    }

    /// Heartbeats once a third of the lease has passed. Re-registers when the store lost the
    /// worker (`NotFound`); a superseded epoch is `Fenced`: another process registered this
    /// worker id, and this one must stop.
    pub(super) async fn keep_lease(&self) -> Result<(), StoreError> {
        if self.clock.now() < self.renew_at() {
            return Ok(());
        }
        self.renew().await
    }

    /// Heartbeats now; see [`Inner::keep_lease`].
    pub(super) async fn renew(&self) -> Result<(), StoreError> {
        let lease = self.lease();
        let now = self.clock.now();
        let renewed = match self
            .store
            .heartbeat(&lease, self.config.lease_ttl, now)
            .await
        {
            Ok(l) => l,
            Err(StoreError::NotFound { .. }) => {
                warn!(worker = %lease.worker, "the store does not know this worker any more; registering it again");
                self.store
                    .register_worker(&lease.worker, &lease.deployment, self.config.lease_ttl, now)
                    .await?
            }
            Err(e) => return Err(e),
        };
        *self.lease.lock().unwrap_or_else(|e| e.into_inner()) = renewed;
        Ok(())
    }

    /// Renews the lease when it is past half-life and, when it had lapsed (a long step, a
    /// stalled process, a jump of the clock), checks that no other worker took the run over,
    /// so a step attempt another worker may have recorded is never started here.
    pub(super) async fn still_owns(&self, run: &RunId) -> Result<bool, StoreError> {
        let lapsed = self.lease().expires_at <= self.clock.now();
        self.retrying(|| self.keep_lease()).await?;
        if !lapsed {
            return Ok(true);
        }
        let rec = self.retrying(|| self.store.get_run(run)).await?;
        let me = self.lease();
        Ok(rec.owner == Some((me.worker, me.epoch)))
    }
}
