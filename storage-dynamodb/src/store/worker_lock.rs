//! The process lock of a worker id (contract clause 11). DynamoDB has no sessions that end
//! with a process, so the lock is a short heartbeat: an item `WLOCK#{worker}` naming its holder
//! (a random token and the process: pid, host, since when) and a freshness `exp`, renewed every
//! [`RENEW_EVERY`] for [`FRESH_FOR`] by a task of the holder. A lock is taken only where no
//! item is or its `exp` has passed (wall clock), and given back by deleting the item. So a
//! process killed without a clean-up frees its id [`FRESH_FOR`] later, not at once: a restart
//! in that window is refused, naming the dead holder, and succeeds when tried again. Hosts
//! sharing a table need clocks within a second of each other.

use super::tx::{names, values};
use super::DynamoStore;
use crate::client::CallError;
use crate::item::*;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use eve_core::worker_lock::this_process;
use eve_core::{AppendId, StoreError, Timestamp, WorkerId, WorkerLock};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long a lock stays fresh without renewal: how long a crashed holder keeps its id.
pub(crate) const FRESH_FOR: Duration = Duration::from_secs(3);
/// How often the holder renews it.
const RENEW_EVERY: Duration = Duration::from_secs(1);
/// How long a refused lock is tried again: a holder dropped a moment ago may still be deleting
/// its item.
const RELEASE_GRACE: Duration = Duration::from_millis(500);

fn lock_key(worker: &WorkerId) -> Item {
    key(format!("WLOCK#{}", worker.as_str()), ONE)
}

impl DynamoStore {
    /// [`eve_core::JournalStore::lock_worker`]: see the module docs.
    pub(super) async fn lock_worker_item(
        &self,
        worker: &WorkerId,
    ) -> Result<WorkerLock, StoreError> {
        eve_core::store::check_worker_id(worker)?;
        let token = AppendId::random().to_string();
        let started = Instant::now();
        loop {
            let now = Timestamp::now();
            let holder = this_process(now);
            let mut item = lock_key(worker);
            item.insert("tok".into(), s(token.as_str()));
            item.insert("who".into(), s(holder.as_str()));
            item.insert("exp".into(), n(now.plus(FRESH_FOR).millis()));
            let req = self
                .client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(item))
                .condition_expression("attribute_not_exists(#pk) OR #exp < :now")
                .set_expression_attribute_names(names(&[("#pk", "pk"), ("#exp", "exp")]))
                .set_expression_attribute_values(values(vec![(":now", n(now.millis()))]));
            match self
                .caller
                .call("PutItem", |_| false, || req.clone().send())
                .await
            {
                Ok(_) => {
                    let (stop, stopped) = oneshot::channel::<()>();
                    tokio::spawn(keep(
                        self.client.clone(),
                        self.table.clone(),
                        worker.clone(),
                        token,
                        stopped,
                    ));
                    return Ok(WorkerLock::new(worker.clone(), holder, stop));
                }
                Err(CallError::Service(e)) if e.is_conditional_check_failed_exception() => {
                    if started.elapsed() < RELEASE_GRACE {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    let it = self.get(format!("WLOCK#{}", worker.as_str()), ONE).await?;
                    let who = it
                        .as_ref()
                        .and_then(|i| get_s(i, "who"))
                        .unwrap_or("another process")
                        .to_owned();
                    return Err(StoreError::WorkerIdInUse {
                        worker: worker.to_string(),
                        holder: format!(
                            "{who}; on DynamoDB a holder that died frees the id {} s after its last heartbeat",
                            FRESH_FOR.as_secs()
                        ),
                    });
                }
                Err(e) => return Err(self.map("PutItem", e)),
            }
        }
    }
}

/// Renews the lock every [`RENEW_EVERY`] until the [`WorkerLock`] is dropped (its sender closes
/// `stopped`), then deletes the item. A renewal refused because another token holds the item
/// (this process stalled past [`FRESH_FOR`] and another took the id) ends the task.
async fn keep(
    client: Client,
    table: String,
    worker: WorkerId,
    token: String,
    mut stopped: oneshot::Receiver<()>,
) {
    let mine = || AttributeValue::S(token.clone());
    loop {
        tokio::select! {
            _ = &mut stopped => {
                let _ = client
                    .delete_item()
                    .table_name(&table)
                    .set_key(Some(lock_key(&worker)))
                    .condition_expression("#tok = :t")
                    .set_expression_attribute_names(names(&[("#tok", "tok")]))
                    .set_expression_attribute_values(values(vec![(":t", mine())]))
                    .send()
                    .await;
                return;
            }
            () = tokio::time::sleep(RENEW_EVERY) => {}
        }
        let vals = vec![
            (":t", mine()),
            (":x", n(Timestamp::now().plus(FRESH_FOR).millis())),
        ];
        let renewed = client
            .update_item()
            .table_name(&table)
            .set_key(Some(lock_key(&worker)))
            .update_expression("SET #exp = :x")
            .condition_expression("#tok = :t")
            .set_expression_attribute_names(names(&[("#tok", "tok"), ("#exp", "exp")]))
            .set_expression_attribute_values(values(vals))
            .send()
            .await;
        match renewed {
            Ok(_) => {}
            Err(aws_sdk_dynamodb::error::SdkError::ServiceError(e))
                if e.err().is_conditional_check_failed_exception() =>
            {
                tracing::error!(%worker, "eve dynamodb: another process took this worker id while this one did not renew its lock (a stall longer than {} s); this worker will be fenced by its registration", FRESH_FOR.as_secs());
                return;
            }
            Err(e) => {
                tracing::warn!(%worker, error = %e, "eve dynamodb: renewing the worker lock failed; trying again");
            }
        }
    }
}
