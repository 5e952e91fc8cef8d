//! Retention (contract clause 9): [`purge`] deletes runs that ended before a cutoff.
//!
//! DynamoDB cannot delete a run's items in one transaction (a journal may hold thousands of
//! items), so a run is deleted item by item in an order that keeps every step safe: its
//! requests, its session-log batches, its idempotency key, its journal, append ids, dedupe
//! records and chunks, and its **header last**, with a condition that it still exists. Until
//! the header goes the run is still listed, so a purge that stopped halfway (a crash, a fault)
//! is finished by the next one; only the call that deletes the header counts the run, so two
//! purges racing never count it twice. Live hook tokens need nothing (the write that ended the
//! run deleted them); a keyed delivery's by-token item goes with its dedupe record. The session
//! counter item stays, so no session seq is ever reused.

use super::DynamoStore;
use crate::client::CallError;
use crate::item::*;
use aws_sdk_dynamodb::types::{DeleteRequest, WriteRequest};
use eve_core::{Event, JournalStoreExt, RunRecord, RunStatus, SessionEntry, StoreError, Timestamp};

/// [`JournalStore::purge`](eve_core::JournalStore::purge): finds candidates through `gsi3`
/// (runs by status), re-reads each header strongly consistent before deleting it.
pub(super) async fn purge(
    store: &DynamoStore,
    ended_before: Timestamp,
    limit: usize,
) -> Result<usize, StoreError> {
    let mut candidates: Vec<RunRecord> = Vec::new();
    for st in [
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ] {
        let items = store
            .query_all(
                Some("gsi3"),
                "#p = :p",
                &[("#p", "g3pk")],
                vec![(":p", s(format!("RUNS#{}", st.as_str())))],
            )
            .await?;
        for it in &items {
            let rec = Header::from_item(it)?.rec;
            if rec.updated_at < ended_before {
                candidates.push(rec);
            }
        }
    }
    candidates.sort_by(|a, b| (a.updated_at, &a.run_id).cmp(&(b.updated_at, &b.run_id)));
    if limit != 0 {
        candidates.truncate(limit);
    }
    let mut purged = 0;
    for rec in candidates {
        // The index is eventually consistent: the header decides.
        let h = match store.header(&rec.run_id).await {
            Ok(h) => h,
            Err(StoreError::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        };
        if !h.rec.status.is_terminal() || h.rec.updated_at >= ended_before {
            continue;
        }
        if purge_run(store, &h.rec).await? {
            purged += 1;
        }
    }
    Ok(purged)
}

/// Deletes one ended run; true when this call deleted its header.
async fn purge_run(store: &DynamoStore, rec: &RunRecord) -> Result<bool, StoreError> {
    let run = &rec.run_id;
    let events = match store.read_all(run, 0).await {
        Ok(events) => events,
        // Another purge got there first.
        Err(StoreError::NotFound { .. }) => return Ok(false),
        Err(e) => return Err(e),
    };
    let mut keys = Vec::new();
    for e in &events {
        if let Event::InputRequested { request_id, .. } = &e.event {
            keys.extend(partition_keys(store, req_pk(request_id.as_str())).await?);
        }
    }
    // The run's session-log batches (one write of one run each) and their chunks, and its
    // entry in the session's list of runs.
    let spk = sess_pk(rec.session_id.as_str());
    keys.push(key(&spk, sess_run_sk(run)));
    let logs = store
        .query_all(
            None,
            "#pk = :pk AND begins_with(#sk, :pre)",
            &[("#pk", "pk"), ("#sk", "sk")],
            vec![(":pk", s(spk.clone())), (":pre", s("LOG#"))],
        )
        .await?;
    for it in &logs {
        let Ok(body) = store.read_blob(it, &spk, "").await? else {
            continue;
        };
        let Ok(entries) = serde_json::from_slice::<Vec<SessionEntry>>(&body) else {
            continue;
        };
        if entries.is_empty() || entries.iter().any(|e| &e.run_id != run) {
            continue;
        }
        keys.push(key_of(it));
        if let Some(nonce) = get_s(it, "ck") {
            keys.extend(store.chunk_keys(&spk, nonce).await?);
        }
    }
    if let Some(idem) = store.get(idem_pk(&rec.idempotency_key), ONE).await? {
        if get_s(&idem, "run") == Some(run.as_str()) {
            keys.push(key_of(&idem));
        }
    }
    let items = store
        .query_all(
            None,
            "#pk = :pk",
            &[("#pk", "pk")],
            vec![(":pk", s(run_pk(run)))],
        )
        .await?;
    for it in &items {
        // A keyed webhook delivery's by-token item, unless a later run reusing the token owns
        // it now.
        let sk = get_s(it, "sk").unwrap_or("");
        if let (Some(tok), Some((_, dedupe_key))) = (
            get_s(it, "tok"),
            sk.strip_prefix("HD#").and_then(|rest| rest.split_once('#')),
        ) {
            if let Some(by_token) = store.get(hook_key_pk(tok, dedupe_key), ONE).await? {
                if get_s(&by_token, "run") == Some(run.as_str()) {
                    keys.push(key_of(&by_token));
                }
            }
        }
        if sk != HDR_SK {
            keys.push(key_of(it));
        }
    }
    store.delete_items(keys).await?;
    store.cache_drop(run);
    let req = store
        .client
        .delete_item()
        .table_name(&store.table)
        .set_key(Some(key(run_pk(run), HDR_SK)))
        .condition_expression("attribute_exists(#pk)")
        .expression_attribute_names("#pk", "pk");
    match store
        .caller
        .call("DeleteItem", |_| false, || req.clone().send())
        .await
    {
        Ok(_) => Ok(true),
        Err(CallError::Service(e)) if e.is_conditional_check_failed_exception() => Ok(false),
        Err(e) => Err(store.map("DeleteItem", e)),
    }
}

fn key_of(it: &Item) -> Item {
    it.iter()
        .filter(|(k, _)| *k == "pk" || *k == "sk")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

async fn partition_keys(store: &DynamoStore, pk: String) -> Result<Vec<Item>, StoreError> {
    Ok(store
        .query_all(None, "#pk = :pk", &[("#pk", "pk")], vec![(":pk", s(pk))])
        .await?
        .iter()
        .map(key_of)
        .collect())
}

impl DynamoStore {
    /// The keys of the chunk items of body `nonce` in partition `pk` (see [`Tx::blob`]).
    ///
    /// [`Tx::blob`]: super::tx::Tx::blob
    pub(super) async fn chunk_keys(&self, pk: &str, nonce: &str) -> Result<Vec<Item>, StoreError> {
        Ok(self
            .query_all(
                None,
                "#pk = :pk AND begins_with(#sk, :pre)",
                &[("#pk", "pk"), ("#sk", "sk")],
                vec![(":pk", s(pk)), (":pre", s(format!("CH#{nonce}#")))],
            )
            .await?
            .iter()
            .map(key_of)
            .collect())
    }

    /// Deletes items by key, 25 a call, retrying what the service left unprocessed.
    pub(super) async fn delete_items(&self, keys: Vec<Item>) -> Result<(), StoreError> {
        let deletes = keys
            .into_iter()
            .map(|k| {
                Ok(WriteRequest::builder()
                    .delete_request(
                        DeleteRequest::builder()
                            .set_key(Some(k))
                            .build()
                            .map_err(super::build_err)?,
                    )
                    .build())
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        self.batch_write(deletes, "items of a purge (purge again)")
            .await
    }
}
