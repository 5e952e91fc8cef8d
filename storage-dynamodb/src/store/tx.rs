//! Transactions and conditional writes: the items of a `TransactWriteItems` and what each is
//! there for, bodies inline or chunked, and running a transaction (or a one-item conditional
//! `PutItem`) so that a cancellation says which conditions failed.

use super::{build_err, DynamoStore};
use crate::client::{transient_reason, CallError, BACKEND};
use crate::item::*;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    ConditionCheck, Delete, DeleteRequest, Put, PutRequest, TransactWriteItem, Update, WriteRequest,
};
use eve_core::StoreError;
use std::collections::HashMap;
use std::sync::Mutex;

/// Most items one transaction may hold.
pub(super) const MAX_TX_ITEMS: usize = 100;

/// Inline bytes one transaction may carry before bodies are chunked instead (the limit is 4 MB).
pub(super) const TX_INLINE_BUDGET: usize = 3_000_000;

/// What an item of a transaction is there for, to decode cancellation reasons.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Role {
    Header,
    Worker,
    Hook(String),
    Idem,
    Dedupe,
    /// The session record's check (not ended) or update (message counter).
    Session,
    Other,
}

#[derive(Debug, Default)]
pub(super) struct Tx {
    pub(super) items: Vec<TransactWriteItem>,
    pub(super) roles: Vec<Role>,
    chunks: Vec<Item>,
    budget: usize,
}

impl Tx {
    pub(super) fn new() -> Self {
        Self {
            budget: TX_INLINE_BUDGET,
            ..Self::default()
        }
    }

    pub(super) fn push(&mut self, item: TransactWriteItem, role: Role) {
        self.items.push(item);
        self.roles.push(role);
    }

    /// Attributes holding `body` under `prefix`: inline when small and the transaction has room,
    /// else a pointer to chunk items (in partition `pk`) written before the transaction.
    pub(super) fn blob(
        &mut self,
        pk: &str,
        prefix: &str,
        body: Vec<u8>,
    ) -> Vec<(String, aws_sdk_dynamodb::types::AttributeValue)> {
        if body.len() <= INLINE_MAX && body.len() <= self.budget {
            self.budget -= body.len();
            return vec![(format!("{prefix}b"), b(body))];
        }
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let total = body.len();
        let mut count = 0;
        for (i, part) in body.chunks(CHUNK).enumerate() {
            let mut it = key(pk, format!("CH#{nonce}#{i:05}"));
            it.insert("d".into(), b(part.to_vec()));
            self.chunks.push(it);
            count += 1;
        }
        vec![
            (format!("{prefix}ck"), s(nonce)),
            (format!("{prefix}cn"), n(count)),
            (format!("{prefix}cl"), n(total)),
        ]
    }
}

pub(super) fn names(pairs: &[(&str, &str)]) -> Option<HashMap<String, String>> {
    (!pairs.is_empty()).then(|| {
        pairs
            .iter()
            .map(|(a, r)| ((*a).to_owned(), (*r).to_owned()))
            .collect()
    })
}

pub(super) fn values(
    pairs: Vec<(&str, aws_sdk_dynamodb::types::AttributeValue)>,
) -> Option<HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
    (!pairs.is_empty()).then(|| pairs.into_iter().map(|(a, v)| (a.to_owned(), v)).collect())
}

impl DynamoStore {
    pub(super) fn tx_put(
        &self,
        item: Item,
        cond: Option<&str>,
        nm: &[(&str, &str)],
        vals: Vec<(&str, aws_sdk_dynamodb::types::AttributeValue)>,
    ) -> Result<TransactWriteItem, StoreError> {
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(item))
            .set_condition_expression(cond.map(str::to_owned))
            .set_expression_attribute_names(names(nm))
            .set_expression_attribute_values(values(vals))
            .build()
            .map_err(build_err)?;
        Ok(TransactWriteItem::builder().put(put).build())
    }

    pub(super) fn tx_put_new(&self, item: Item) -> Result<TransactWriteItem, StoreError> {
        self.tx_put(
            item,
            Some("attribute_not_exists(#pk)"),
            &[("#pk", "pk")],
            vec![],
        )
    }

    pub(super) fn tx_check(
        &self,
        k: Item,
        cond: &str,
        nm: &[(&str, &str)],
        vals: Vec<(&str, aws_sdk_dynamodb::types::AttributeValue)>,
    ) -> Result<TransactWriteItem, StoreError> {
        let c = ConditionCheck::builder()
            .table_name(&self.table)
            .set_key(Some(k))
            .condition_expression(cond)
            .set_expression_attribute_names(names(nm))
            .set_expression_attribute_values(values(vals))
            .build()
            .map_err(build_err)?;
        Ok(TransactWriteItem::builder().condition_check(c).build())
    }

    pub(super) fn tx_delete(&self, k: Item) -> Result<TransactWriteItem, StoreError> {
        let d = Delete::builder()
            .table_name(&self.table)
            .set_key(Some(k))
            .build()
            .map_err(build_err)?;
        Ok(TransactWriteItem::builder().delete(d).build())
    }

    /// A delete that fails the transaction when the item is gone already.
    pub(super) fn tx_delete_existing(&self, k: Item) -> Result<TransactWriteItem, StoreError> {
        let d = Delete::builder()
            .table_name(&self.table)
            .set_key(Some(k))
            .condition_expression("attribute_exists(#pk)")
            .expression_attribute_names("#pk", "pk")
            .build()
            .map_err(build_err)?;
        Ok(TransactWriteItem::builder().delete(d).build())
    }

    pub(super) fn tx_update(
        &self,
        k: Item,
        update: &str,
        cond: Option<&str>,
        nm: &[(&str, &str)],
        vals: Vec<(&str, aws_sdk_dynamodb::types::AttributeValue)>,
    ) -> Result<TransactWriteItem, StoreError> {
        let u = Update::builder()
            .table_name(&self.table)
            .set_key(Some(k))
            .update_expression(update)
            .set_condition_expression(cond.map(str::to_owned))
            .set_expression_attribute_names(names(nm))
            .set_expression_attribute_values(values(vals))
            .build()
            .map_err(build_err)?;
        Ok(TransactWriteItem::builder().update(u).build())
    }

    pub(super) fn header_put(
        &self,
        h: &Header,
        read_ver: Option<u64>,
    ) -> Result<TransactWriteItem, StoreError> {
        match read_ver {
            Some(v) => self.tx_put(
                h.to_item(self.shards),
                Some("#ver = :ver"),
                &[("#ver", "ver")],
                vec![(":ver", n(v))],
            ),
            None => self.tx_put_new(h.to_item(self.shards)),
        }
    }

    /// Writes chunk items (before the transaction that points at them).
    pub(super) async fn write_chunks(&self, chunks: &[Item]) -> Result<(), StoreError> {
        let puts = chunks
            .iter()
            .map(|it| {
                Ok(WriteRequest::builder()
                    .put_request(
                        PutRequest::builder()
                            .set_item(Some(it.clone()))
                            .build()
                            .map_err(build_err)?,
                    )
                    .build())
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        self.batch_write(puts, "chunk items").await
    }

    /// Sends `requests` with BatchWriteItem, 25 a call, retrying (with backoff) what the
    /// service leaves unprocessed; `Unavailable` naming `what` once the attempts are spent.
    pub(super) async fn batch_write(
        &self,
        requests: Vec<WriteRequest>,
        what: &str,
    ) -> Result<(), StoreError> {
        for group in requests.chunks(25) {
            let mut pending = group.to_vec();
            let mut attempt = 0;
            while !pending.is_empty() {
                let req = self
                    .client
                    .batch_write_item()
                    .request_items(&self.table, pending.clone());
                let out = self
                    .caller
                    .call("BatchWriteItem", |_| false, || req.clone().send())
                    .await
                    .map_err(|e| self.map("BatchWriteItem", e))?;
                pending = out
                    .unprocessed_items()
                    .and_then(|m| m.get(&self.table))
                    .cloned()
                    .unwrap_or_default();
                if !pending.is_empty() {
                    attempt += 1;
                    if attempt >= self.caller.max_attempts {
                        return Err(StoreError::Unavailable {
                            backend: BACKEND,
                            message: format!(
                                "BatchWriteItem left {} {what} unprocessed after {attempt} attempts (throttled)",
                                pending.len()
                            ),
                        });
                    }
                    self.caller.backoff(attempt).await;
                }
            }
        }
        Ok(())
    }

    /// Best-effort removal of chunks a failed transaction left unreferenced.
    pub(super) async fn drop_chunks(&self, chunks: &[Item]) {
        for group in chunks.chunks(25) {
            let reqs: Vec<WriteRequest> = group
                .iter()
                .filter_map(|it| {
                    let k: Item = it
                        .iter()
                        .filter(|(k, _)| *k == "pk" || *k == "sk")
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    DeleteRequest::builder()
                        .set_key(Some(k))
                        .build()
                        .ok()
                        .map(|d| WriteRequest::builder().delete_request(d).build())
                })
                .collect();
            let req = self
                .client
                .batch_write_item()
                .request_items(&self.table, reqs);
            if let Err(e) = self
                .caller
                .call("BatchWriteItem", |_| false, || req.clone().send())
                .await
            {
                tracing::warn!(error = ?self.map("BatchWriteItem", e), "could not delete unreferenced chunk items; they stay as garbage");
            }
        }
    }

    /// Runs a transaction: `Ok(Ok(()))` when committed, `Ok(Err(roles))` with the roles of the
    /// items whose condition failed.
    pub(super) async fn transact(&self, tx: Tx) -> Result<Result<(), Vec<Role>>, StoreError> {
        if tx.items.len() > MAX_TX_ITEMS {
            return Err(StoreError::LimitExceeded {
                what: "DynamoDB transaction items of one write (split the events over several appends)",
                actual: tx.items.len(),
                limit: MAX_TX_ITEMS,
            });
        }
        if !tx.chunks.is_empty() {
            self.write_chunks(&tx.chunks).await?;
        }
        // One client token for the attempts of this transaction that follow an ambiguous fault
        // (a timeout, a reset connection): if such an attempt committed, DynamoDB answers the
        // retry with success instead of running it again. A definite answer from the service
        // (a cancellation, a throttle) rotates the token, so the next attempt is evaluated
        // afresh rather than matched against an attempt that is known not to have committed.
        let token = Mutex::new(uuid::Uuid::new_v4().simple().to_string());
        let items = tx.items;
        let send = || {
            self.client
                .transact_write_items()
                .client_request_token(token.lock().expect("token lock").clone())
                .set_transact_items(Some(items.clone()))
                .send()
        };
        let contention = |e: &TransactWriteItemsError| {
            *token.lock().expect("token lock") = uuid::Uuid::new_v4().simple().to_string();
            match e {
                TransactWriteItemsError::TransactionCanceledException(c) => {
                    let codes: Vec<&str> = c
                        .cancellation_reasons()
                        .iter()
                        .filter_map(|r| r.code())
                        .collect();
                    !codes.contains(&"ConditionalCheckFailed")
                        && codes.iter().any(|c| transient_reason(c))
                }
                _ => false,
            }
        };
        let res = self
            .caller
            .call("TransactWriteItems", contention, send)
            .await;
        match res {
            Ok(_) => Ok(Ok(())),
            Err(CallError::Service(TransactWriteItemsError::TransactionCanceledException(c))) => {
                let failed: Vec<Role> = c
                    .cancellation_reasons()
                    .iter()
                    .zip(&tx.roles)
                    .filter(|(r, _)| r.code() == Some("ConditionalCheckFailed"))
                    .map(|(_, role)| role.clone())
                    .collect();
                if !tx.chunks.is_empty() {
                    self.drop_chunks(&tx.chunks).await;
                }
                if failed.is_empty() {
                    let codes: Vec<String> = c
                        .cancellation_reasons()
                        .iter()
                        .map(|r| format!("{:?}: {:?}", r.code(), r.message()))
                        .collect();
                    return Err(StoreError::Other {
                        backend: BACKEND,
                        source: format!(
                            "transaction cancelled for reasons other than a condition: {codes:?}"
                        )
                        .into(),
                    });
                }
                Ok(Err(failed))
            }
            Err(e) => {
                if !tx.chunks.is_empty() {
                    self.drop_chunks(&tx.chunks).await;
                }
                Err(self.map("TransactWriteItems", e))
            }
        }
    }

    /// A one-item write as a plain conditional `PutItem` (cheaper than a transaction):
    /// `Ok(false)` when its condition failed.
    pub(super) async fn transact_one(&self, tx: Tx) -> Result<bool, StoreError> {
        let item = tx
            .items
            .into_iter()
            .next()
            .and_then(|t| t.put)
            .ok_or_else(|| build_err("transact_one needs exactly one put"))?;
        let req = self
            .client
            .put_item()
            .table_name(item.table_name())
            .set_item(Some(item.item().clone()))
            .set_condition_expression(item.condition_expression().map(str::to_owned))
            .set_expression_attribute_names(item.expression_attribute_names().cloned())
            .set_expression_attribute_values(item.expression_attribute_values().cloned());
        match self
            .caller
            .call("PutItem", |_| false, || req.clone().send())
            .await
        {
            Ok(_) => Ok(true),
            Err(CallError::Service(e)) if e.is_conditional_check_failed_exception() => Ok(false),
            Err(e) => Err(self.map("PutItem", e)),
        }
    }
}
