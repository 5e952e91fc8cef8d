//! [`DynamoStore`]: the [`JournalStore`] contract on one DynamoDB table. The design and the
//! commit protocol are in the crate docs.

use crate::client::{
    transient_reason, unexpected, CallCounts, CallError, Caller, DynamoConfig, BACKEND,
};
use crate::item::*;
use async_trait::async_trait;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, ConditionCheck, Delete, DeleteRequest, GlobalSecondaryIndex,
    KeySchemaElement, KeyType, Projection, ProjectionType, Put, PutRequest, ReturnValue,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType, TableStatus, TransactWriteItem,
    Update, WriteRequest,
};
use aws_sdk_dynamodb::Client;
use eve_core::codec::{decode_batch, encode_batch, FORMAT_VERSION};
use eve_core::{
    check_limits, Append, Appended, CancelOutcome, CreatedRun, Delivered, DeploymentId, Effects,
    Event, InputRequest, InputResponse, JournalStore, Lease, NewRun, Payload, PendingRequest,
    RequestId, Resolution, RunId, RunQuery, RunRecord, RunStatus, SessionEntry, SessionId,
    StoreError, StoredEvent, Timestamp, WorkerId,
};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Rounds of read-check-commit an operation tries when other writers keep changing the run
/// before it gives up with `Unavailable`.
const MAX_ROUNDS: usize = 200;
/// Most items one transaction may hold.
const MAX_TX_ITEMS: usize = 100;
/// Inline bytes one transaction may carry before bodies are chunked instead (the limit is 4 MB).
const TX_INLINE_BUDGET: usize = 3_000_000;
/// Headers cached per handle before the cache is cleared.
const CACHE_MAX: usize = 10_000;
/// How long after a lease became invalid (its expiry, retirement or supersession, in the
/// callers' time) a claim may drop its lapse entry once no run is indexed under it: a margin for
/// `gsi4` to catch up with claims that committed just before the lease lapsed, so a late index
/// entry is never lost with the lapse entry that leads to it.
const LAPSE_SETTLE_MS: i64 = 60_000;

/// A [`JournalStore`] on one DynamoDB table (see the crate docs for the design).
///
/// Cheap to share (`Arc<dyn JournalStore>`); several handles, in one process or many, may use
/// one table at once.
pub struct DynamoStore {
    client: Client,
    table: String,
    shards: u32,
    caller: Caller,
    /// The header this handle last wrote or read for a run: the optimistic base of the next
    /// append (a stale one only costs a failed condition and a re-read).
    cache: Mutex<HashMap<RunId, Header>>,
    /// Where the table lives for [`JournalStore::store_id`]: the endpoint, else the region.
    location: String,
}

impl std::fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoStore")
            .field("table", &self.table)
            .field("wake_shards", &self.shards)
            .finish_non_exhaustive()
    }
}

/// What an item of a transaction is there for, to decode cancellation reasons.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Role {
    Header,
    Worker,
    Hook(String),
    Idem,
    Dedupe,
    Other,
}

#[derive(Debug, Default)]
struct Tx {
    items: Vec<TransactWriteItem>,
    roles: Vec<Role>,
    chunks: Vec<Item>,
    budget: usize,
}

impl Tx {
    fn new() -> Self {
        Self {
            budget: TX_INLINE_BUDGET,
            ..Self::default()
        }
    }

    fn push(&mut self, item: TransactWriteItem, role: Role) {
        self.items.push(item);
        self.roles.push(role);
    }

    /// Attributes holding `body` under `prefix`: inline when small and the transaction has room,
    /// else a pointer to chunk items (in partition `pk`) written before the transaction.
    fn blob(
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

fn names(pairs: &[(&str, &str)]) -> Option<HashMap<String, String>> {
    (!pairs.is_empty()).then(|| {
        pairs
            .iter()
            .map(|(a, r)| ((*a).to_owned(), (*r).to_owned()))
            .collect()
    })
}

fn values(
    pairs: Vec<(&str, aws_sdk_dynamodb::types::AttributeValue)>,
) -> Option<HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
    (!pairs.is_empty()).then(|| pairs.into_iter().map(|(a, v)| (a.to_owned(), v)).collect())
}

/// An endpoint URL as [`JournalStore::store_id`] names it: without scheme and trailing slash,
/// the host in lower case.
fn normalize_endpoint(url: &str) -> String {
    let rest = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .trim_end_matches('/');
    match rest.split_once('/') {
        Some((host, path)) => format!("{}/{path}", host.to_ascii_lowercase()),
        None => rest.to_ascii_lowercase(),
    }
}

fn build_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Other {
        backend: BACKEND,
        source: format!("could not build a DynamoDB request: {e}").into(),
    }
}

fn fenced(lease: &Lease, run: &str) -> StoreError {
    StoreError::Fenced {
        run: run.to_owned(),
        worker: lease.worker.to_string(),
        epoch: lease.epoch,
    }
}

fn corrupt(run: &RunId, seq: u64, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        run: run.clone(),
        seq,
        reason: reason.into(),
    }
}

/// A worker item as claims see it.
#[derive(Clone, Debug)]
struct WorkerInfo {
    epoch: u64,
    retired: bool,
    expires_at: i64,
    deployment: String,
    /// When it was retired (ms), if it was.
    retired_at: Option<i64>,
    /// The epoch whose lapse entry a claim dropped (no run was indexed under it any more).
    clean: Option<u64>,
}

impl WorkerInfo {
    /// Whether the lease of `epoch` is valid at `now` (contract: not retired, the current
    /// epoch, not expired).
    fn valid(&self, epoch: u64, now: Timestamp) -> bool {
        !self.retired && self.epoch == epoch && self.expires_at > now.millis()
    }

    /// When the current epoch's lease stopped being valid: its retirement or its expiry.
    fn lapsed_at(&self) -> i64 {
        match (self.retired, self.retired_at) {
            (true, Some(at)) => at,
            _ => self.expires_at,
        }
    }
}

/// The worker item of `worker` as written by a registration: its lapse entry sorts at the
/// lease's expiry.
fn worker_item(worker: &WorkerId, deployment: &DeploymentId, epoch: u64, expires_at: i64) -> Item {
    let mut it = key(worker_pk(worker.as_str()), ONE);
    it.insert("epoch".into(), n(epoch));
    it.insert("dep".into(), s(deployment.as_str()));
    it.insert("exp".into(), n(expires_at));
    it.insert(
        "ret".into(),
        aws_sdk_dynamodb::types::AttributeValue::Bool(false),
    );
    it.insert("g4pk".into(), s(lapse_pk(deployment.as_str())));
    it.insert("g4sk".into(), s(lapse_sk(expires_at, worker.as_str())));
    it
}

impl DynamoStore {
    /// A store on `config.table` at `config.endpoint_url`, with the static credentials of the
    /// config (never the environment or instance metadata). Makes no call: use
    /// [`create_table`](Self::create_table) or any operation to reach the server.
    ///
    /// # Errors
    /// `InvalidInput` for an empty table name or region.
    pub async fn connect(config: DynamoConfig) -> Result<Self, StoreError> {
        if config.table.is_empty() || config.region.is_empty() {
            return Err(StoreError::InvalidInput(
                "DynamoConfig needs a table name and a region".into(),
            ));
        }
        let client = config.sdk_client();
        let mut store = Self::from_client(client, config.table.clone());
        store.shards = config.wake_shards.max(1);
        store.location = match &config.endpoint_url {
            Some(url) => normalize_endpoint(url),
            None => config.region.clone(),
        };
        store.caller = Caller::new(config.max_attempts, config.base_backoff);
        Ok(store)
    }

    /// A store on `table` through a client you configured (credentials, endpoint, retries).
    /// Consider disabling the SDK's own retries: the store retries throttling and transient
    /// faults itself. Its [`store_id`](JournalStore::store_id) names the client's region (the
    /// client does not show its endpoint).
    pub fn from_client(client: Client, table: impl Into<String>) -> Self {
        let location = client
            .config()
            .region()
            .map_or_else(|| "aws".to_owned(), |r| r.as_ref().to_owned());
        Self {
            location,
            client,
            table: table.into(),
            shards: 4,
            caller: Caller::new(8, Duration::from_millis(10)),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// A store on `table` with a client built from an `aws_config::SdkConfig` (the AWS
    /// credential chain and region).
    #[cfg(feature = "sdk-config")]
    pub fn from_sdk_config(config: &aws_config::SdkConfig, table: impl Into<String>) -> Self {
        Self::from_client(Client::new(config), table)
    }

    /// The table this store uses.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// DynamoDB calls this handle made so far (every attempt counts), by operation.
    pub fn call_counts(&self) -> CallCounts {
        self.caller.counts()
    }

    /// Creates the table with its four GSIs (on-demand billing) and waits until it is active.
    /// An existing table is left as it is.
    ///
    /// # Errors
    /// `Unavailable` when DynamoDB does not answer; `Other` when it refuses.
    pub async fn create_table(&self) -> Result<(), StoreError> {
        let attr = |name: &str| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .map_err(build_err)
        };
        let ks = |name: &str, kt: KeyType| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(kt)
                .build()
                .map_err(build_err)
        };
        let mut defs = vec![attr("pk")?, attr("sk")?];
        let mut gsis = Vec::new();
        for (i, projection) in [
            (1, ProjectionType::All),
            (2, ProjectionType::All),
            (3, ProjectionType::All),
            (4, ProjectionType::KeysOnly),
        ] {
            let (p, s_) = (format!("g{i}pk"), format!("g{i}sk"));
            defs.push(attr(&p)?);
            defs.push(attr(&s_)?);
            gsis.push(
                GlobalSecondaryIndex::builder()
                    .index_name(format!("gsi{i}"))
                    .key_schema(ks(&p, KeyType::Hash)?)
                    .key_schema(ks(&s_, KeyType::Range)?)
                    .projection(Projection::builder().projection_type(projection).build())
                    .build()
                    .map_err(build_err)?,
            );
        }
        let req = self
            .client
            .create_table()
            .table_name(&self.table)
            .billing_mode(BillingMode::PayPerRequest)
            .set_attribute_definitions(Some(defs))
            .key_schema(ks("pk", KeyType::Hash)?)
            .key_schema(ks("sk", KeyType::Range)?)
            .set_global_secondary_indexes(Some(gsis));
        match self
            .caller
            .call("CreateTable", |_| false, || req.clone().send())
            .await
        {
            Ok(_) => {}
            Err(CallError::Service(e))
                if aws_sdk_dynamodb::error::ProvideErrorMetadata::code(&e)
                    == Some("ResourceInUseException") => {}
            Err(CallError::Service(e)) => return Err(unexpected("CreateTable", &self.table, e)),
            Err(CallError::Store(e)) => return Err(e),
        }
        for _ in 0..600 {
            let d = self.client.describe_table().table_name(&self.table);
            let out = self
                .caller
                .call("DescribeTable", |_| false, || d.clone().send())
                .await
                .map_err(|e| self.map("DescribeTable", e))?;
            if out.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(StoreError::Unavailable {
            backend: BACKEND,
            message: format!("table {:?} did not become ACTIVE within 60 s", self.table),
        })
    }

    /// Deletes the table and everything in it (tests).
    ///
    /// # Errors
    /// `Unavailable` when DynamoDB does not answer; `Other` when it refuses.
    pub async fn delete_table(&self) -> Result<(), StoreError> {
        let req = self.client.delete_table().table_name(&self.table);
        self.caller
            .call("DeleteTable", |_| false, || req.clone().send())
            .await
            .map_err(|e| self.map("DeleteTable", e))?;
        Ok(())
    }

    fn map<E>(&self, op: &'static str, e: CallError<E>) -> StoreError
    where
        E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::fmt::Display,
    {
        match e {
            CallError::Service(e) => unexpected(op, &self.table, e),
            CallError::Store(e) => e,
        }
    }

    fn cache_put(&self, h: &Header) {
        let mut c = self.cache.lock().expect("cache lock");
        if h.rec.status.is_terminal() {
            c.remove(&h.rec.run_id);
            return;
        }
        if c.len() >= CACHE_MAX {
            c.clear();
        }
        c.insert(h.rec.run_id.clone(), h.clone());
    }

    fn cache_get(&self, run: &RunId) -> Option<Header> {
        self.cache.lock().expect("cache lock").get(run).cloned()
    }

    fn cache_drop(&self, run: &RunId) {
        self.cache.lock().expect("cache lock").remove(run);
    }

    // ---- building transaction items -------------------------------------------------------

    fn tx_put(
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

    fn tx_put_new(&self, item: Item) -> Result<TransactWriteItem, StoreError> {
        self.tx_put(
            item,
            Some("attribute_not_exists(#pk)"),
            &[("#pk", "pk")],
            vec![],
        )
    }

    fn tx_check(
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

    fn tx_delete(&self, k: Item) -> Result<TransactWriteItem, StoreError> {
        let d = Delete::builder()
            .table_name(&self.table)
            .set_key(Some(k))
            .build()
            .map_err(build_err)?;
        Ok(TransactWriteItem::builder().delete(d).build())
    }

    fn tx_update(
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

    fn header_put(
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

    // ---- calls ----------------------------------------------------------------------------

    /// Writes chunk items (before the transaction that points at them).
    async fn write_chunks(&self, chunks: &[Item]) -> Result<(), StoreError> {
        for group in chunks.chunks(25) {
            let mut pending: Vec<WriteRequest> = group
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
                .collect::<Result<_, StoreError>>()?;
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
                                "BatchWriteItem left {} chunk items unprocessed after {attempt} attempts (throttled)",
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
    async fn drop_chunks(&self, chunks: &[Item]) {
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
    async fn transact(&self, tx: Tx) -> Result<Result<(), Vec<Role>>, StoreError> {
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

    async fn get(&self, pk: String, sk: &str) -> Result<Option<Item>, StoreError> {
        let req = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key(pk, sk)))
            .consistent_read(true);
        let out = self
            .caller
            .call("GetItem", |_| false, || req.clone().send())
            .await
            .map_err(|e| self.map("GetItem", e))?;
        Ok(out.item().cloned())
    }

    /// One page of a query; `index` None queries the table (strongly consistent).
    #[allow(clippy::too_many_arguments)]
    async fn query_page(
        &self,
        index: Option<&str>,
        cond: &str,
        nm: &[(&str, &str)],
        vals: Vec<(&str, aws_sdk_dynamodb::types::AttributeValue)>,
        limit: i32,
        start: Option<Item>,
    ) -> Result<(Vec<Item>, Option<Item>), StoreError> {
        let req = self
            .client
            .query()
            .table_name(&self.table)
            .set_index_name(index.map(str::to_owned))
            .key_condition_expression(cond)
            .set_expression_attribute_names(names(nm))
            .set_expression_attribute_values(values(vals))
            .consistent_read(index.is_none())
            .limit(limit)
            .set_exclusive_start_key(start);
        let out = self
            .caller
            .call("Query", |_| false, || req.clone().send())
            .await
            .map_err(|e| self.map("Query", e))?;
        Ok((out.items().to_vec(), out.last_evaluated_key().cloned()))
    }

    /// Every item of a query (all pages).
    async fn query_all(
        &self,
        index: Option<&str>,
        cond: &str,
        nm: &[(&str, &str)],
        vals: Vec<(&str, aws_sdk_dynamodb::types::AttributeValue)>,
    ) -> Result<Vec<Item>, StoreError> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let (items, next) = self
                .query_page(index, cond, nm, vals.clone(), 1000, start)
                .await?;
            out.extend(items);
            match next {
                Some(k) => start = Some(k),
                None => return Ok(out),
            }
        }
    }

    /// The body stored under `prefix` in `item` (inline or chunked in partition `pk`).
    async fn read_blob(
        &self,
        item: &Item,
        pk: &str,
        prefix: &str,
    ) -> Result<Result<Vec<u8>, String>, StoreError> {
        if let Some(bytes) = get_b(item, &format!("{prefix}b")) {
            return Ok(Ok(bytes.to_vec()));
        }
        let (Some(nonce), Some(count), Some(len)) = (
            get_s(item, &format!("{prefix}ck")),
            get_n::<usize>(item, &format!("{prefix}cn")),
            get_n::<usize>(item, &format!("{prefix}cl")),
        ) else {
            return Ok(Err("no body attribute (neither inline nor chunked)".into()));
        };
        let parts = self
            .query_all(
                None,
                "#pk = :pk AND begins_with(#sk, :pre)",
                &[("#pk", "pk"), ("#sk", "sk")],
                vec![(":pk", s(pk)), (":pre", s(format!("CH#{nonce}#")))],
            )
            .await?;
        if parts.len() != count {
            return Ok(Err(format!(
                "{} of {count} chunks of body {nonce} found",
                parts.len()
            )));
        }
        let mut body = Vec::with_capacity(len);
        for p in &parts {
            match get_b(p, "d") {
                Some(d) => body.extend_from_slice(d),
                None => return Ok(Err(format!("chunk of body {nonce} has no data"))),
            }
        }
        if body.len() != len {
            return Ok(Err(format!(
                "chunks of body {nonce} hold {} bytes, the pointer says {len}",
                body.len()
            )));
        }
        Ok(Ok(body))
    }

    /// The run header, strongly consistent.
    async fn header(&self, run: &RunId) -> Result<Header, StoreError> {
        let item = self
            .get(run_pk(run), HDR_SK)
            .await?
            .ok_or_else(|| StoreError::not_found("run", run))?;
        let h = Header::from_item(&item)?;
        self.cache_put(&h);
        Ok(h)
    }

    /// The worker item, strongly consistent.
    async fn worker(&self, worker: &str) -> Result<Option<WorkerInfo>, StoreError> {
        Ok(self
            .get(worker_pk(worker), ONE)
            .await?
            .map(|it| WorkerInfo {
                epoch: get_n(&it, "epoch").unwrap_or(0),
                retired: matches!(
                    it.get("ret"),
                    Some(aws_sdk_dynamodb::types::AttributeValue::Bool(true))
                ),
                expires_at: get_n(&it, "exp").unwrap_or(i64::MIN),
                deployment: get_s(&it, "dep").unwrap_or("").to_owned(),
                retired_at: get_n(&it, "rat"),
                clean: get_n(&it, "cln"),
            }))
    }

    /// The worker item through a per-call cache (one read per worker per claim).
    async fn worker_cached(
        &self,
        worker: &str,
        workers: &mut HashMap<String, Option<WorkerInfo>>,
    ) -> Result<Option<WorkerInfo>, StoreError> {
        if !workers.contains_key(worker) {
            let info = self.worker(worker).await?;
            workers.insert(worker.to_owned(), info);
        }
        Ok(workers[worker].clone())
    }

    /// Whether a valid lease holds the run at `now` (as MemoryStore's `held`), with a per-call
    /// cache of worker items.
    async fn held(
        &self,
        h: &Header,
        now: Timestamp,
        workers: &mut HashMap<String, Option<WorkerInfo>>,
    ) -> Result<bool, StoreError> {
        let Some((w, e)) = &h.rec.owner else {
            return Ok(false);
        };
        Ok(self
            .worker_cached(w.as_str(), workers)
            .await?
            .is_some_and(|i| i.valid(*e, now)))
    }

    /// The run's claim key (ms) if no valid lease holds it at `now`, as MemoryStore's
    /// `claim_key` (contract clause 5): when its work is due, and for an orphaned run (it names
    /// an owner whose lease is not valid) the earlier of that and its `updated_at`. `None`: not
    /// claimable at any time without a new event.
    async fn claim_key(
        &self,
        h: &Header,
        now: Timestamp,
        workers: &mut HashMap<String, Option<WorkerInfo>>,
    ) -> Result<Option<i64>, StoreError> {
        if h.rec.status != RunStatus::Running || self.held(h, now, workers).await? {
            return Ok(None);
        }
        let work = h.work_at();
        let updated = h.rec.updated_at.millis();
        Ok(if h.rec.owner.is_some() {
            Some(work.map_or(updated, |w| w.min(updated)))
        } else {
            work
        })
    }

    /// The orphaned runs of `deployment` at `now`, headers strongly consistent: the deployment's
    /// lapse entries due by `now` (`gsi4`) name the workers whose current lease is not valid and
    /// the superseded epochs; each leads to the runs it still holds (`gsi4` again). Costs one
    /// query, plus a worker read and a query per lapsed lease and a read per run it holds, never
    /// anything per parked run. With `clean`, drops lapse entries under which no run is indexed
    /// any more, once the index had [`LAPSE_SETTLE_MS`] to catch up.
    async fn orphans(
        &self,
        deployment: &DeploymentId,
        now: Timestamp,
        workers: &mut HashMap<String, Option<WorkerInfo>>,
        clean: bool,
    ) -> Result<Vec<Header>, StoreError> {
        let entries = self
            .query_all(
                Some("gsi4"),
                "#p = :p AND #s < :hi",
                &[("#p", "g4pk"), ("#s", "g4sk")],
                vec![
                    (":p", s(lapse_pk(deployment.as_str()))),
                    (":hi", s(format!("{}$", enc_time(now.millis())))),
                ],
            )
            .await?;
        let mut out = Vec::new();
        for entry in entries {
            let (Some(w), Some(sk)) = (
                get_s(&entry, "pk").and_then(|p| p.strip_prefix("WORKER#")),
                get_s(&entry, "sk"),
            ) else {
                continue;
            };
            let Some(info) = self.worker_cached(w, workers).await? else {
                continue;
            };
            // The epoch whose runs are orphaned, and since when (for dropping the entry).
            let (epoch, lapsed_at) = if sk == ONE {
                if info.valid(info.epoch, now) {
                    continue; // renewed since the index entry was written
                }
                (info.epoch, info.lapsed_at())
            } else {
                match parse_old_sk(sk) {
                    Some(found) => found,
                    None => continue,
                }
            };
            let owned = self
                .query_all(
                    Some("gsi4"),
                    "#p = :p",
                    &[("#p", "g4pk")],
                    vec![(":p", s(own_pk(w, epoch)))],
                )
                .await?;
            if owned.is_empty() {
                if clean && now.millis() >= lapsed_at.saturating_add(LAPSE_SETTLE_MS) {
                    self.drop_lapse(w, sk, &info).await;
                }
                continue;
            }
            let owner = Some((WorkerId::new(w), epoch));
            for it in owned {
                let run = RunId::new(get_s(&it, "g4sk").unwrap_or(""));
                let h = match self.header(&run).await {
                    Ok(h) => h,
                    Err(StoreError::NotFound { .. }) => continue,
                    Err(e) => return Err(e),
                };
                // A stale index entry (the run was released or taken since) is skipped.
                if h.rec.owner == owner && &h.rec.deployment_id == deployment {
                    out.push(h);
                }
            }
        }
        Ok(out)
    }

    /// Drops a lapse entry no run is indexed under (best effort: a failure only leaves it for
    /// the next claim). A worker item keeps its lease and loses only its index keys, on the
    /// condition that it did not change since it was read; a superseded epoch's item goes.
    async fn drop_lapse(&self, worker: &str, sk: &str, info: &WorkerInfo) {
        let res = if sk == ONE {
            let req = self
                .client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(key(worker_pk(worker), ONE)))
                .update_expression("SET #cln = :e REMOVE #g4pk, #g4sk")
                .condition_expression("#epoch = :e AND #exp = :x AND #ret = :r")
                .set_expression_attribute_names(names(&[
                    ("#cln", "cln"),
                    ("#g4pk", "g4pk"),
                    ("#g4sk", "g4sk"),
                    ("#epoch", "epoch"),
                    ("#exp", "exp"),
                    ("#ret", "ret"),
                ]))
                .set_expression_attribute_values(values(vec![
                    (":e", n(info.epoch)),
                    (":x", n(info.expires_at)),
                    (
                        ":r",
                        aws_sdk_dynamodb::types::AttributeValue::Bool(info.retired),
                    ),
                ]));
            match self
                .caller
                .call("UpdateItem", |_| false, || req.clone().send())
                .await
            {
                Ok(_) => Ok(()),
                Err(CallError::Service(e)) if e.is_conditional_check_failed_exception() => Ok(()),
                Err(e) => Err(self.map("UpdateItem", e)),
            }
        } else {
            let req = self
                .client
                .delete_item()
                .table_name(&self.table)
                .set_key(Some(key(worker_pk(worker), sk)));
            self.caller
                .call("DeleteItem", |_| false, || req.clone().send())
                .await
                .map(|_| ())
                .map_err(|e| self.map("DeleteItem", e))
        };
        if let Err(error) = res {
            tracing::warn!(%error, worker, sk, "could not drop a lapse entry; the next claim retries");
        }
    }

    /// The session log's next seq (0 when the session has none).
    async fn session_next(&self, session: &SessionId) -> Result<Option<u64>, StoreError> {
        Ok(self
            .get(sess_pk(session.as_str()), SESS_CTR_SK)
            .await?
            .and_then(|it| get_n(&it, "next")))
    }

    /// The time stamped on the event at `seq` of `run`.
    async fn event_time(&self, run: &RunId, seq: u64) -> Result<Option<i64>, StoreError> {
        let (items, _) = self
            .query_page(
                None,
                "#pk = :pk AND #sk BETWEEN :lo AND :hi",
                &[("#pk", "pk"), ("#sk", "sk")],
                vec![
                    (":pk", s(run_pk(run))),
                    (":lo", s(ev_sk(seq))),
                    (":hi", s(HDR_SK)),
                ],
                1,
                None,
            )
            .await?;
        Ok(items
            .first()
            .filter(|it| get_s(it, "sk") != Some(HDR_SK))
            .and_then(|it| get_n(it, "at")))
    }

    // ---- the shared write path ------------------------------------------------------------

    /// Builds the transaction writing `events` at the run's next seq with their effects, from
    /// header `h` as read. Returns the new header (not yet in the transaction: the caller adds
    /// it, after adjusting it), the transaction, and the first and next seq.
    fn prepare(
        &self,
        h: &Header,
        events: &[Event],
        now: Timestamp,
        answered: Option<(&RequestId, &InputResponse, &str)>,
        session_next: Option<u64>,
    ) -> Result<(Header, Tx, u64, u64), StoreError> {
        let run = &h.rec.run_id;
        let pk = run_pk(run);
        let fx = Effects::of(h.rec.execution, events);
        for (i, (token, _, _)) in fx.hooks_created.iter().enumerate() {
            if h.hooks.contains(token) || fx.hooks_created[..i].iter().any(|(t, _, _)| t == token) {
                return Err(hook_exists(token));
            }
        }
        let first = h.rec.next_seq;
        let next = first + events.len() as u64;
        let mut nh = h.clone();
        nh.ver = h.ver + 1;
        nh.rec.next_seq = next;
        nh.touch(now);
        if h.rec.processed_seq >= h.rec.next_seq {
            nh.unproc_at = Some(now.millis());
        }
        for (cmd, due) in &fx.timers_set {
            nh.timers.insert(*cmd, due.millis());
        }
        for cmd in &fx.timers_cleared {
            nh.timers.remove(cmd);
        }
        if fx.cancel_requested {
            nh.rec.cancel_requested = true;
        }
        if let Some(st) = fx.status {
            nh.rec.status = st;
        }
        let ended = fx.ends_run();
        if ended {
            nh.timers.clear();
            nh.rec.owner = None;
        }

        let mut tx = Tx::new();
        // The event batch: one item per append, keyed by its last seq.
        let mut ev = key(&pk, ev_sk(next - 1));
        ev.insert("f".into(), n(first));
        ev.insert("n".into(), n(events.len()));
        ev.insert("v".into(), n(FORMAT_VERSION));
        ev.insert("at".into(), n(now.millis()));
        let body = encode_batch(events)?;
        ev.extend(tx.blob(&pk, "", body));
        tx.push(self.tx_put_new(ev)?, Role::Other);

        // Hooks.
        for (token, cmd, webhook) in &fx.hooks_created {
            if ended {
                // Registered and released in one write: only the liveness check remains.
                tx.push(
                    self.tx_check(
                        key(hook_pk(token), ONE),
                        "attribute_not_exists(#pk)",
                        &[("#pk", "pk")],
                        vec![],
                    )?,
                    Role::Hook(token.clone()),
                );
            } else {
                let mut it = key(hook_pk(token), ONE);
                it.insert("run".into(), s(run.as_str()));
                it.insert("cmd".into(), n(cmd));
                it.insert(
                    "webhook".into(),
                    aws_sdk_dynamodb::types::AttributeValue::Bool(*webhook),
                );
                tx.push(self.tx_put_new(it)?, Role::Hook(token.clone()));
                nh.hooks.push(token.clone());
            }
        }
        if ended {
            for token in &h.hooks {
                tx.push(self.tx_delete(key(hook_pk(token), ONE))?, Role::Other);
            }
            nh.hooks.clear();
        }

        // Requests: new ones as whole items, existing ones by a conditional update.
        let mut opened: Vec<(RequestId, u64, InputRequest, &'static str)> = fx
            .requests_opened
            .iter()
            .map(|(id, cmd, r)| (id.clone(), *cmd, r.clone(), "pending"))
            .collect();
        let mut closing: Vec<(String, &'static str)> = Vec::new();
        for id in &fx.requests_closed {
            if let Some(o) = opened.iter_mut().find(|o| &o.0 == id) {
                o.3 = "withdrawn";
            } else if let Some(pos) = nh.reqs.iter().position(|p| p.id == id.as_str()) {
                let state = if answered.is_some_and(|(a, _, _)| a == id) {
                    "answered"
                } else {
                    "withdrawn"
                };
                closing.push((nh.reqs.remove(pos).id, state));
            }
        }
        if ended {
            for o in &mut opened {
                o.3 = "withdrawn";
            }
            for p in nh.reqs.drain(..) {
                closing.push((p.id, "withdrawn"));
            }
        }
        for (id, cmd, request, state) in opened {
            let rpk = req_pk(id.as_str());
            let mut it = key(&rpk, ONE);
            it.insert("run".into(), s(run.as_str()));
            it.insert("sess".into(), s(h.rec.session_id.as_str()));
            it.insert("cmd".into(), n(cmd));
            it.insert("at".into(), n(now.millis()));
            it.insert("st".into(), s(state));
            let body = serde_json::to_vec(&request).map_err(|e| {
                StoreError::InvalidInput(format!("request {id} does not serialize: {e}"))
            })?;
            it.extend(tx.blob(&rpk, "rq", body));
            if state == "pending" {
                it.insert("g1pk".into(), s(format!("PREQ#{}", h.rec.session_id)));
                it.insert("g1sk".into(), s(format!("{}#{id}", enc_time(now.millis()))));
                nh.reqs.push(PendingRef {
                    cmd,
                    id: id.to_string(),
                });
            }
            tx.push(self.tx_put(it, None, &[], vec![])?, Role::Other);
        }
        for (id, state) in closing {
            let rpk = req_pk(&id);
            if state == "answered" {
                let (_, response, tok) = answered.expect("answered state comes from an answer");
                let body = serde_json::to_vec(response).map_err(|e| {
                    StoreError::InvalidInput(format!("answer does not serialize: {e}"))
                })?;
                let attrs = tx.blob(&rpk, "rs", body);
                let mut set = vec![
                    "#st = :st".to_owned(),
                    "#seq = :seq".to_owned(),
                    "#tok = :tok".to_owned(),
                ];
                let mut nm: Vec<(String, String)> = vec![
                    ("#st".into(), "st".into()),
                    ("#tok".into(), "tok".into()),
                    ("#seq".into(), "seq".into()),
                    ("#g1pk".into(), "g1pk".into()),
                    ("#g1sk".into(), "g1sk".into()),
                ];
                let mut vals: Vec<(String, aws_sdk_dynamodb::types::AttributeValue)> = vec![
                    (":st".into(), s("answered")),
                    (":tok".into(), s(tok)),
                    (":seq".into(), n(first)),
                    (":pending".into(), s("pending")),
                ];
                for (i, (name, v)) in attrs.into_iter().enumerate() {
                    set.push(format!("#a{i} = :a{i}"));
                    nm.push((format!("#a{i}"), name));
                    vals.push((format!(":a{i}"), v));
                }
                let expr = format!("SET {} REMOVE #g1pk, #g1sk", set.join(", "));
                let nm_ref: Vec<(&str, &str)> =
                    nm.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
                let vals_ref: Vec<(&str, aws_sdk_dynamodb::types::AttributeValue)> =
                    vals.iter().map(|(a, v)| (a.as_str(), v.clone())).collect();
                tx.push(
                    self.tx_update(
                        key(&rpk, ONE),
                        &expr,
                        Some("#st = :pending"),
                        &nm_ref,
                        vals_ref,
                    )?,
                    Role::Other,
                );
            } else {
                tx.push(
                    self.tx_update(
                        key(&rpk, ONE),
                        "SET #st = :st REMOVE #g1pk, #g1sk",
                        Some("#st = :pending"),
                        &[("#st", "st"), ("#g1pk", "g1pk"), ("#g1sk", "g1sk")],
                        vec![(":st", s("withdrawn")), (":pending", s("pending"))],
                    )?,
                    Role::Other,
                );
            }
        }

        // The session log: one batch item per write, and the per-session counter.
        if !fx.session_events.is_empty() {
            let session = &h.rec.session_id;
            let spk = sess_pk(session.as_str());
            let c = session_next.unwrap_or(0);
            let k = fx.session_events.len() as u64;
            let entries: Vec<SessionEntry> = fx
                .session_events
                .into_iter()
                .enumerate()
                .map(|(i, event)| SessionEntry {
                    session_id: session.clone(),
                    seq: c + i as u64,
                    at: now,
                    run_id: run.clone(),
                    call_id: h.rec.call_id.clone(),
                    event,
                })
                .collect();
            let body = serde_json::to_vec(&entries).map_err(|e| {
                StoreError::InvalidInput(format!("session entries do not serialize: {e}"))
            })?;
            let mut it = key(&spk, log_sk(c + k - 1));
            it.insert("f".into(), n(c));
            it.insert("n".into(), n(k));
            it.extend(tx.blob(&spk, "", body));
            tx.push(self.tx_put_new(it)?, Role::Other);
            let mut ctr = key(&spk, SESS_CTR_SK);
            ctr.insert("next".into(), n(c + k));
            let put = match session_next {
                None => self.tx_put_new(ctr)?,
                Some(c) => self.tx_put(
                    ctr,
                    Some("#next = :c"),
                    &[("#next", "next")],
                    vec![(":c", n(c))],
                )?,
            };
            tx.push(put, Role::Other);
        }
        Ok((nh, tx, first, next))
    }

    /// A delivery (a write that needs no lease): commits `events` on header `h` with `extra`
    /// items. `Ok(Err(()))`: someone else changed the run or an item first; re-read and retry.
    async fn deliver(
        &self,
        h: &Header,
        events: &[Event],
        now: Timestamp,
        answered: Option<(&RequestId, &InputResponse, &str)>,
        extra: Vec<(TransactWriteItem, Role)>,
    ) -> Result<Result<u64, Vec<Role>>, StoreError> {
        let sn = self.session_next_if_needed(h, events).await?;
        let (nh, mut tx, first, _) = self.prepare(h, events, now, answered, sn)?;
        tx.items.insert(0, self.header_put(&nh, Some(h.ver))?);
        tx.roles.insert(0, Role::Header);
        for (it, role) in extra {
            tx.push(it, role);
        }
        match self.transact(tx).await? {
            Ok(()) => {
                self.cache_put(&nh);
                Ok(Ok(first))
            }
            Err(roles) => {
                self.cache_drop(&h.rec.run_id);
                if let Some(Role::Hook(t)) = roles.iter().find(|r| matches!(r, Role::Hook(_))) {
                    if !roles.contains(&Role::Header) {
                        return Err(hook_exists(t));
                    }
                }
                Ok(Err(roles))
            }
        }
    }

    async fn session_next_if_needed(
        &self,
        h: &Header,
        events: &[Event],
    ) -> Result<Option<u64>, StoreError> {
        if Effects::of(h.rec.execution, events)
            .session_events
            .is_empty()
        {
            Ok(None)
        } else {
            self.session_next(&h.rec.session_id).await
        }
    }

    async fn append_done(
        &self,
        run: &RunId,
        append_id: &str,
    ) -> Result<Option<Appended>, StoreError> {
        Ok(self
            .get(run_pk(run), &aid_sk(append_id))
            .await?
            .and_then(|it| {
                Some(Appended {
                    first_seq: get_n(&it, "f")?,
                    next_seq: get_n(&it, "x")?,
                    duplicate: true,
                })
            }))
    }

    /// Decodes an event batch item into the events at or after `from_seq`.
    async fn decode_events(
        &self,
        run: &RunId,
        pk: &str,
        it: &Item,
        from_seq: u64,
        out: &mut Vec<StoredEvent>,
    ) -> Result<(), StoreError> {
        let first: u64 = get_n(it, "f").ok_or_else(|| corrupt(run, 0, "event item without f"))?;
        let count: usize =
            get_n(it, "n").ok_or_else(|| corrupt(run, first, "event item without n"))?;
        let version: u16 =
            get_n(it, "v").ok_or_else(|| corrupt(run, first, "event item without a version"))?;
        let at =
            Timestamp(get_n(it, "at").ok_or_else(|| corrupt(run, first, "event item without at"))?);
        let body = self
            .read_blob(it, pk, "")
            .await?
            .map_err(|reason| corrupt(run, first, reason))?;
        let events = decode_batch(run, first, version, &body, count)?;
        for (i, event) in events.into_iter().enumerate() {
            let seq = first + i as u64;
            if seq >= from_seq {
                out.push(StoredEvent { seq, at, event });
            }
        }
        Ok(())
    }

    /// Claims one candidate run (its header from an index, possibly stale) for `lease`: only
    /// while it is claimable at `now`, and only by a `Put` conditioned on the `ver` it read, so
    /// a stale candidate is skipped, never claimed twice.
    async fn try_claim(
        &self,
        mut h: Header,
        lease: &Lease,
        now: Timestamp,
        workers: &mut HashMap<String, Option<WorkerInfo>>,
    ) -> Result<Option<RunRecord>, StoreError> {
        let mut written: Option<Header> = None;
        for fresh in [false, true] {
            if fresh {
                h = match self.header(&h.rec.run_id).await {
                    Ok(h) => h,
                    Err(StoreError::NotFound { .. }) => return Ok(None),
                    Err(e) => return Err(e),
                };
                // Our put landed though its answer was lost (the retry then failed its
                // condition): the header is exactly what we wrote, so the claim is ours.
                if let Some(w) = &written {
                    if h.ver == w.ver && h.rec == w.rec && h.claim_nonce == w.claim_nonce {
                        return Ok(Some(h.rec));
                    }
                }
            }
            if h.rec.deployment_id != lease.deployment
                || self
                    .claim_key(&h, now, workers)
                    .await?
                    .is_none_or(|at| at > now.millis())
            {
                return Ok(None);
            }
            let mut nh = h.clone();
            nh.ver += 1;
            nh.rec.owner = Some((lease.worker.clone(), lease.epoch));
            nh.rec.activations += 1;
            nh.claim_nonce = Some(uuid::Uuid::new_v4().simple().to_string());
            nh.touch(now);
            let mut tx = Tx::new();
            tx.push(self.header_put(&nh, Some(h.ver))?, Role::Header);
            if self.transact_one(tx).await? {
                self.cache_put(&nh);
                return Ok(Some(nh.rec));
            }
            written = Some(nh);
        }
        Ok(None)
    }

    /// A one-item write as a plain conditional `PutItem` (cheaper than a transaction):
    /// `Ok(false)` when its condition failed.
    async fn transact_one(&self, tx: Tx) -> Result<bool, StoreError> {
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

    /// The runs of `deployment` whose work is due by `now` (`gsi1`, every shard), headers as
    /// the index holds them.
    async fn due_runs(
        &self,
        deployment: &DeploymentId,
        now: Timestamp,
    ) -> Result<Vec<Header>, StoreError> {
        let mut all = Vec::new();
        for shard in 0..self.shards {
            let items = self
                .query_all(
                    Some("gsi1"),
                    "#p = :p AND #s < :hi",
                    &[("#p", "g1pk"), ("#s", "g1sk")],
                    vec![
                        (":p", s(format!("WAKE#{deployment}#{shard}"))),
                        (":hi", s(format!("{}$", enc_time(now.millis())))),
                    ],
                )
                .await?;
            for it in &items {
                all.push(Header::from_item(it)?);
            }
        }
        Ok(all)
    }
}

fn hook_exists(token: &str) -> StoreError {
    StoreError::AlreadyExists {
        what: "hook token",
        id: token.to_owned(),
        hint: "a live hook already has this token; choose another token or wait for its run to end",
    }
}

fn contention(op: &str) -> StoreError {
    StoreError::Unavailable {
        backend: BACKEND,
        message: format!(
            "{op} lost the race for the run {MAX_ROUNDS} times in a row (heavy contention)"
        ),
    }
}

#[async_trait]
impl JournalStore for DynamoStore {
    fn backend(&self) -> &'static str {
        "dynamodb"
    }

    async fn create_run(&self, new: NewRun, now: Timestamp) -> Result<CreatedRun, StoreError> {
        new.validate()?;
        let key_s = new.key();
        for _ in 0..MAX_ROUNDS {
            let record = new.record(now);
            let h = Header {
                rec: record.clone(),
                ver: 1,
                timers: Default::default(),
                hooks: vec![],
                reqs: vec![],
                unproc_at: Some(now.millis()),
                claim_nonce: None,
            };
            let pk = run_pk(&new.run_id);
            let mut tx = Tx::new();
            let mut idem = key(idem_pk(&key_s), ONE);
            idem.insert("run".into(), s(new.run_id.as_str()));
            tx.push(self.tx_put_new(idem)?, Role::Idem);
            tx.push(self.header_put(&h, None)?, Role::Header);
            let mut ev = key(&pk, ev_sk(0));
            ev.insert("f".into(), n(0));
            ev.insert("n".into(), n(1));
            ev.insert("v".into(), n(FORMAT_VERSION));
            ev.insert("at".into(), n(now.millis()));
            let body = encode_batch(std::slice::from_ref(&new.started_event()))?;
            ev.extend(tx.blob(&pk, "", body));
            tx.push(self.tx_put_new(ev)?, Role::Other);
            match self.transact(tx).await? {
                Ok(()) => {
                    self.cache_put(&h);
                    return Ok(CreatedRun {
                        run: record,
                        created: true,
                    });
                }
                Err(roles) if roles.contains(&Role::Idem) => {
                    let Some(it) = self.get(idem_pk(&key_s), ONE).await? else {
                        continue;
                    };
                    let existing = RunId::new(get_s(&it, "run").unwrap_or(""));
                    let started = self.read(&existing, 0, 1).await?;
                    if !started.first().is_some_and(|e| new.matches(&e.event)) {
                        return Err(StoreError::IdempotencyMismatch {
                            key: key_s,
                            existing,
                        });
                    }
                    return Ok(CreatedRun {
                        run: self.header(&existing).await?.rec,
                        created: false,
                    });
                }
                Err(_) => {
                    return Err(StoreError::AlreadyExists {
                        what: "run",
                        id: new.run_id.to_string(),
                        hint: "run ids are unique; use a fresh id",
                    })
                }
            }
        }
        Err(contention("create_run"))
    }

    async fn append(&self, a: Append) -> Result<Appended, StoreError> {
        check_limits(&a.events)?;
        if a.events
            .iter()
            .any(|e| matches!(e, Event::RunStarted { .. }))
        {
            return Err(StoreError::InvalidInput(
                "RunStarted is written by create_run, never appended".into(),
            ));
        }
        let mut cached = self.cache_get(&a.run);
        for _ in 0..MAX_ROUNDS {
            let (h, fresh) = match cached.take() {
                Some(h) => (h, false),
                None => (self.header(&a.run).await?, true),
            };
            let refused = if h.rec.status.is_terminal() {
                Some(StoreError::RunEnded { run: a.run.clone() })
            } else if h.rec.owner.as_ref() != Some(&(a.lease.worker.clone(), a.lease.epoch)) {
                Some(fenced(&a.lease, a.run.as_str()))
            } else if h.rec.next_seq != a.expected_seq {
                Some(StoreError::Conflict {
                    run: a.run.clone(),
                    expected: a.expected_seq,
                    actual: h.rec.next_seq,
                })
            } else {
                None
            };
            if let Some(err) = refused {
                if !fresh {
                    continue;
                }
                if let Some(done) = self.append_done(&a.run, a.append_id.as_str()).await? {
                    return Ok(done);
                }
                return Err(err);
            }
            let sn = self.session_next_if_needed(&h, &a.events).await?;
            let (mut nh, mut tx, first, next) = match self.prepare(&h, &a.events, a.now, None, sn) {
                Ok(p) => p,
                Err(e @ StoreError::AlreadyExists { .. }) if !fresh => {
                    let _ = e;
                    continue;
                }
                Err(e) => return Err(e),
            };
            nh.rec.processed_seq = next;
            nh.unproc_at = None;
            nh.rec.activations = 0;
            tx.items.insert(
                0,
                self.tx_put(
                    nh.to_item(self.shards),
                    Some("#ver = :ver AND #ns = :exp"),
                    &[("#ver", "ver"), ("#ns", "next_seq")],
                    vec![(":ver", n(h.ver)), (":exp", n(a.expected_seq))],
                )?,
            );
            tx.roles.insert(0, Role::Header);
            tx.push(
                self.tx_check(
                    key(worker_pk(a.lease.worker.as_str()), ONE),
                    "#epoch = :e AND #ret = :f",
                    &[("#epoch", "epoch"), ("#ret", "ret")],
                    vec![
                        (":e", n(a.lease.epoch)),
                        (":f", aws_sdk_dynamodb::types::AttributeValue::Bool(false)),
                    ],
                )?,
                Role::Worker,
            );
            let mut aid = key(run_pk(&a.run), aid_sk(a.append_id.as_str()));
            aid.insert("f".into(), n(first));
            aid.insert("x".into(), n(next));
            tx.push(self.tx_put_new(aid)?, Role::Other);
            match self.transact(tx).await? {
                Ok(()) => {
                    self.cache_put(&nh);
                    return Ok(Appended {
                        first_seq: first,
                        next_seq: next,
                        duplicate: false,
                    });
                }
                Err(roles) => {
                    self.cache_drop(&a.run);
                    if roles.contains(&Role::Header) || roles.contains(&Role::Other) {
                        continue;
                    }
                    if let Some(done) = self.append_done(&a.run, a.append_id.as_str()).await? {
                        return Ok(done);
                    }
                    if roles.contains(&Role::Worker) {
                        return Err(fenced(&a.lease, a.run.as_str()));
                    }
                    if let Some(Role::Hook(t)) = roles.iter().find(|r| matches!(r, Role::Hook(_))) {
                        return Err(hook_exists(t));
                    }
                }
            }
        }
        Err(contention("append"))
    }

    async fn read(
        &self,
        run: &RunId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        if max == 0 {
            return Err(StoreError::InvalidInput("read needs max > 0".into()));
        }
        let pk = run_pk(run);
        let mut out = Vec::new();
        let mut start = None;
        let mut header: Option<Header> = None;
        // At least 100 items a page, so replay pays one round trip per ≥ 100 batches.
        let limit = i32::try_from(max.saturating_add(1).clamp(100, 1000)).unwrap_or(1000);
        loop {
            let (items, next) = self
                .query_page(
                    None,
                    "#pk = :pk AND #sk BETWEEN :lo AND :hi",
                    &[("#pk", "pk"), ("#sk", "sk")],
                    vec![
                        (":pk", s(pk.clone())),
                        (":lo", s(ev_sk(from_seq))),
                        (":hi", s(HDR_SK)),
                    ],
                    limit,
                    start,
                )
                .await?;
            for it in &items {
                if get_s(it, "sk") == Some(HDR_SK) {
                    header = Some(Header::from_item(it)?);
                } else if out.len() < max {
                    self.decode_events(run, &pk, it, from_seq, &mut out).await?;
                }
            }
            if out.len() >= max || header.is_some() {
                break;
            }
            match next {
                Some(k) => start = Some(k),
                None => break,
            }
        }
        if out.is_empty() {
            match header {
                None => return Err(StoreError::not_found("run", run)),
                Some(h) if from_seq > h.rec.next_seq => {
                    return Err(StoreError::InvalidInput(format!(
                        "read from seq {from_seq} is past the end of run {run} (next seq {})",
                        h.rec.next_seq
                    )))
                }
                Some(_) => {}
            }
        }
        out.truncate(max);
        Ok(out)
    }

    async fn get_run(&self, run: &RunId) -> Result<RunRecord, StoreError> {
        Ok(self.header(run).await?.rec)
    }

    async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        let mut items = Vec::new();
        if let Some(session) = &query.session {
            items = self
                .query_all(
                    Some("gsi2"),
                    "#p = :p",
                    &[("#p", "g2pk")],
                    vec![(":p", s(format!("SRUNS#{session}")))],
                )
                .await?;
        } else {
            let statuses: Vec<RunStatus> = match query.status {
                Some(st) => vec![st],
                None => vec![
                    RunStatus::Running,
                    RunStatus::Blocked,
                    RunStatus::Completed,
                    RunStatus::Failed,
                    RunStatus::Cancelled,
                ],
            };
            for st in statuses {
                items.extend(
                    self.query_all(
                        Some("gsi3"),
                        "#p = :p",
                        &[("#p", "g3pk")],
                        vec![(":p", s(format!("RUNS#{}", st.as_str())))],
                    )
                    .await?,
                );
            }
        }
        let mut runs: Vec<RunRecord> = items
            .iter()
            .map(|it| Header::from_item(it).map(|h| h.rec))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .filter(|r| query.matches(r))
            .collect();
        runs.sort_by(|a, b| (a.created_at, &a.run_id).cmp(&(b.created_at, &b.run_id)));
        if query.limit > 0 {
            runs.truncate(query.limit);
        }
        Ok(runs)
    }

    async fn answer(
        &self,
        request: &RequestId,
        response: InputResponse,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        let rpk = req_pk(request.as_str());
        // Marks the request item with this call, so a write of ours whose answer was lost is
        // still reported as ours (not as a duplicate) when a retry finds it.
        let tok = uuid::Uuid::new_v4().simple().to_string();
        for _ in 0..MAX_ROUNDS {
            let it = self
                .get(rpk.clone(), ONE)
                .await?
                .ok_or_else(|| StoreError::not_found("request", request))?;
            let run_id = RunId::new(get_s(&it, "run").unwrap_or(""));
            let bad = |reason: String| corrupt(&run_id, 0, format!("request {request}: {reason}"));
            match get_s(&it, "st") {
                Some("answered") => {
                    let body = self.read_blob(&it, &rpk, "rs").await?.map_err(bad)?;
                    let prev: InputResponse = serde_json::from_slice(&body)
                        .map_err(|e| bad(format!("undecodable answer: {e}")))?;
                    return if prev == response {
                        Ok(Delivered {
                            run: run_id.clone(),
                            seq: get_n(&it, "seq").unwrap_or(0),
                            duplicate: get_s(&it, "tok") != Some(tok.as_str()),
                        })
                    } else {
                        Err(StoreError::AlreadyAnswered {
                            request: request.clone(),
                        })
                    };
                }
                Some("withdrawn") => {
                    return Err(StoreError::Withdrawn {
                        request: request.clone(),
                    })
                }
                _ => {}
            }
            let body = self.read_blob(&it, &rpk, "rq").await?.map_err(bad)?;
            let req: InputRequest = serde_json::from_slice(&body)
                .map_err(|e| bad(format!("undecodable request: {e}")))?;
            req.accepts(&response)
                .map_err(|reason| StoreError::InvalidAnswer {
                    request: request.clone(),
                    reason,
                })?;
            let h = self.header(&run_id).await?;
            if h.rec.status.is_terminal() {
                return Err(StoreError::Withdrawn {
                    request: request.clone(),
                });
            }
            if !h.reqs.iter().any(|p| p.id == request.as_str()) {
                // Answered or withdrawn since the request item was read: the header (which the
                // commit is conditioned on) no longer lists it as pending. Read it again.
                continue;
            }
            let event = Event::InputAnswered {
                request_id: request.clone(),
                response: response.clone(),
            };
            check_limits(std::slice::from_ref(&event))?;
            if let Ok(seq) = self
                .deliver(&h, &[event], now, Some((request, &response, &tok)), vec![])
                .await?
            {
                return Ok(Delivered {
                    run: run_id,
                    seq,
                    duplicate: false,
                });
            }
        }
        Err(contention("answer"))
    }

    async fn deliver_hook(
        &self,
        token: &str,
        payload: Payload,
        dedupe_key: Option<&str>,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        eve_core::store::check_hook_delivery(token, dedupe_key)?;
        for _ in 0..MAX_ROUNDS {
            let hook = self
                .get(hook_pk(token), ONE)
                .await?
                .ok_or_else(|| StoreError::not_found("hook token", token))?;
            let run_id = RunId::new(get_s(&hook, "run").unwrap_or(""));
            let cmd: u64 = get_n(&hook, "cmd").unwrap_or(0);
            let event = Event::HookReceived {
                cmd,
                payload: payload.clone(),
            };
            check_limits(std::slice::from_ref(&event))?;
            let h = match self.header(&run_id).await {
                Ok(h) => h,
                Err(StoreError::NotFound { .. }) => continue,
                Err(e) => return Err(e),
            };
            if !h.hooks.iter().any(|t| t == token) {
                // Released (or re-registered) since the token was read: read it again.
                continue;
            }
            let mut extra = Vec::new();
            if let Some(k) = dedupe_key {
                let mut d = key(run_pk(&run_id), dedupe_sk(cmd, k));
                d.insert("seq".into(), n(h.rec.next_seq));
                extra.push((self.tx_put_new(d)?, Role::Dedupe));
            }
            match self.deliver(&h, &[event], now, None, extra).await? {
                Ok(seq) => {
                    return Ok(Delivered {
                        run: run_id,
                        seq,
                        duplicate: false,
                    })
                }
                // The key was accepted before: no pre-read on the common path, one read here.
                Err(roles) if roles.contains(&Role::Dedupe) => {
                    let k = dedupe_key.expect("a dedupe item implies a key");
                    if let Some(d) = self.get(run_pk(&run_id), &dedupe_sk(cmd, k)).await? {
                        return Ok(Delivered {
                            run: run_id,
                            seq: get_n(&d, "seq").unwrap_or(0),
                            duplicate: true,
                        });
                    }
                }
                Err(_) => {}
            }
        }
        Err(contention("deliver_hook"))
    }

    async fn request_cancel(
        &self,
        run: &RunId,
        reason: &str,
        now: Timestamp,
    ) -> Result<CancelOutcome, StoreError> {
        for _ in 0..MAX_ROUNDS {
            let h = self.header(run).await?;
            if h.rec.status.is_terminal() {
                return Ok(CancelOutcome::AlreadyEnded {
                    status: h.rec.status,
                });
            }
            if h.rec.cancel_requested {
                return Ok(CancelOutcome::AlreadyRequested);
            }
            let event = Event::CancelRequested {
                reason: reason.to_owned(),
            };
            check_limits(std::slice::from_ref(&event))?;
            if let Ok(seq) = self.deliver(&h, &[event], now, None, vec![]).await? {
                return Ok(CancelOutcome::Requested { seq });
            }
        }
        Err(contention("request_cancel"))
    }

    async fn resolve_blocked(
        &self,
        run: &RunId,
        resolution: Resolution,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        for _ in 0..MAX_ROUNDS {
            let h = self.header(run).await?;
            if h.rec.status != RunStatus::Blocked {
                return Err(StoreError::InvalidInput(format!(
                    "run {run} is {}, not blocked; only a blocked run can be resumed or failed this way",
                    h.rec.status.as_str()
                )));
            }
            let events = match &resolution {
                Resolution::Resume => vec![Event::RunResumed],
                Resolution::Fail { error } => {
                    let mut pending = h.reqs.clone();
                    pending.sort_by_key(|p| p.cmd);
                    let mut events: Vec<Event> = pending
                        .into_iter()
                        .map(|p| Event::InputWithdrawn {
                            request_id: RequestId::new(p.id),
                        })
                        .collect();
                    events.push(Event::RunFailed {
                        error: error.clone(),
                    });
                    events
                }
            };
            if let Ok(seq) = self.deliver(&h, &events, now, None, vec![]).await? {
                return Ok(seq);
            }
        }
        Err(contention("resolve_blocked"))
    }

    async fn pending_requests(
        &self,
        session: &SessionId,
    ) -> Result<Vec<PendingRequest>, StoreError> {
        let items = self
            .query_all(
                Some("gsi1"),
                "#p = :p",
                &[("#p", "g1pk")],
                vec![(":p", s(format!("PREQ#{session}")))],
            )
            .await?;
        let mut out = Vec::with_capacity(items.len());
        for it in items {
            let id = get_s(&it, "pk")
                .and_then(|p| p.strip_prefix("REQ#"))
                .unwrap_or("")
                .to_owned();
            let run_id = RunId::new(get_s(&it, "run").unwrap_or(""));
            let body = self
                .read_blob(&it, &req_pk(&id), "rq")
                .await?
                .map_err(|r| corrupt(&run_id, 0, format!("request {id}: {r}")))?;
            let request: InputRequest = serde_json::from_slice(&body)
                .map_err(|e| corrupt(&run_id, 0, format!("request {id}: {e}")))?;
            out.push(PendingRequest {
                request_id: RequestId::new(id),
                session_id: SessionId::new(get_s(&it, "sess").unwrap_or("")),
                cmd: get_n(&it, "cmd").unwrap_or(0),
                requested_at: Timestamp(get_n(&it, "at").unwrap_or(0)),
                run_id,
                request,
            });
        }
        out.sort_by(|a, b| (a.requested_at, &a.request_id).cmp(&(b.requested_at, &b.request_id)));
        Ok(out)
    }

    async fn read_session(
        &self,
        session: &SessionId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<SessionEntry>, StoreError> {
        if max == 0 {
            return Err(StoreError::InvalidInput(
                "read_session needs max > 0".into(),
            ));
        }
        let spk = sess_pk(session.as_str());
        let mut out = Vec::new();
        let mut start = None;
        let limit = i32::try_from(max.clamp(100, 1000)).unwrap_or(1000);
        loop {
            let (items, next) = self
                .query_page(
                    None,
                    "#pk = :pk AND #sk BETWEEN :lo AND :hi",
                    &[("#pk", "pk"), ("#sk", "sk")],
                    vec![
                        (":pk", s(spk.clone())),
                        (":lo", s(log_sk(from_seq))),
                        (":hi", s("LOG#~")),
                    ],
                    limit,
                    start,
                )
                .await?;
            for it in &items {
                if out.len() >= max {
                    break;
                }
                let first: u64 = get_n(it, "f").unwrap_or(0);
                let run = RunId::new(format!("session {session}"));
                let body = self
                    .read_blob(it, &spk, "")
                    .await?
                    .map_err(|r| corrupt(&run, first, format!("session log: {r}")))?;
                let entries: Vec<SessionEntry> = serde_json::from_slice(&body)
                    .map_err(|e| corrupt(&run, first, format!("undecodable session log: {e}")))?;
                out.extend(entries.into_iter().filter(|e| e.seq >= from_seq));
            }
            if out.len() >= max {
                break;
            }
            match next {
                Some(k) => start = Some(k),
                None => break,
            }
        }
        out.truncate(max);
        Ok(out)
    }

    async fn register_worker(
        &self,
        worker: &WorkerId,
        deployment: &DeploymentId,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        eve_core::store::check_worker_ids(worker, deployment)?;
        let expires_at = now.plus(ttl);
        for _ in 0..MAX_ROUNDS {
            let old = self.worker(worker.as_str()).await?;
            let epoch = old.as_ref().map_or(1, |o| o.epoch + 1);
            let item = worker_item(worker, deployment, epoch, expires_at.millis());
            let mut tx = Tx::new();
            match &old {
                None => tx.push(self.tx_put_new(item)?, Role::Worker),
                Some(o) => {
                    tx.push(
                        self.tx_put(
                            item,
                            Some("#epoch = :e"),
                            &[("#epoch", "epoch")],
                            vec![(":e", n(o.epoch))],
                        )?,
                        Role::Worker,
                    );
                    // The superseded epoch's runs are orphaned at once: its lapse entry sorts
                    // first. Skipped when a claim found it holding nothing and dropped it.
                    if o.clean != Some(o.epoch) {
                        let mut it = key(worker_pk(worker.as_str()), old_sk(o.epoch, now.millis()));
                        let dep = match o.deployment.as_str() {
                            "" => deployment.as_str(),
                            dep => dep,
                        };
                        it.insert("g4pk".into(), s(lapse_pk(dep)));
                        it.insert("g4sk".into(), s(lapse_sk(i64::MIN, worker.as_str())));
                        tx.push(self.tx_put(it, None, &[], vec![])?, Role::Other);
                    }
                }
            }
            let done = if tx.items.len() == 1 {
                self.transact_one(tx).await?
            } else {
                self.transact(tx).await?.is_ok()
            };
            if done {
                return Ok(Lease {
                    worker: worker.clone(),
                    deployment: deployment.clone(),
                    epoch,
                    expires_at,
                });
            }
        }
        Err(contention("register_worker"))
    }

    async fn heartbeat(
        &self,
        lease: &Lease,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        let expires_at = now.plus(ttl);
        let req = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(worker_pk(lease.worker.as_str()), ONE)))
            // The lapse entry moves to the new expiry (and comes back if a claim dropped it
            // while the lease was expired).
            .update_expression("SET #exp = :x, #g4pk = :gp, #g4sk = :gs REMOVE #cln")
            .condition_expression(
                "attribute_exists(#pk) AND #epoch = :e AND #ret = :f AND #dep = :d",
            )
            .set_expression_attribute_names(names(&[
                ("#exp", "exp"),
                ("#pk", "pk"),
                ("#epoch", "epoch"),
                ("#ret", "ret"),
                ("#dep", "dep"),
                ("#g4pk", "g4pk"),
                ("#g4sk", "g4sk"),
                ("#cln", "cln"),
            ]))
            .set_expression_attribute_values(values(vec![
                (":x", n(expires_at.millis())),
                (":e", n(lease.epoch)),
                (":f", aws_sdk_dynamodb::types::AttributeValue::Bool(false)),
                (":d", s(lease.deployment.as_str())),
                (":gp", s(lapse_pk(lease.deployment.as_str()))),
                (
                    ":gs",
                    s(lapse_sk(expires_at.millis(), lease.worker.as_str())),
                ),
            ]))
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        match self
            .caller
            .call("UpdateItem", |_| false, || req.clone().send())
            .await
        {
            Ok(out) => Ok(Lease {
                worker: lease.worker.clone(),
                deployment: DeploymentId::new(
                    out.attributes()
                        .and_then(|a| get_s(a, "dep"))
                        .unwrap_or(lease.deployment.as_str()),
                ),
                epoch: lease.epoch,
                expires_at,
            }),
            Err(CallError::Service(e)) if e.is_conditional_check_failed_exception() => {
                let existed = match &e {
                    aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(c) => {
                        c.item().is_some_and(|i| !i.is_empty())
                    }
                    _ => true,
                };
                if existed {
                    Err(fenced(lease, ""))
                } else {
                    Err(StoreError::not_found("worker", &lease.worker))
                }
            }
            Err(e) => Err(self.map("UpdateItem", e)),
        }
    }

    async fn claim(
        &self,
        lease: &Lease,
        max: usize,
        now: Timestamp,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let me = self.worker(lease.worker.as_str()).await?;
        if !me.as_ref().is_some_and(|w| w.valid(lease.epoch, now)) {
            return Err(fenced(lease, ""));
        }
        let mut out = Vec::new();
        if max == 0 {
            return Ok(out);
        }
        let mut workers = HashMap::from([(lease.worker.to_string(), me)]);
        // Candidates: runs with work due (`gsi1`) and orphaned runs (the lapse entries), each
        // run once, the fresher header winning; then in claim-key order.
        let mut found: HashMap<RunId, Header> = HashMap::new();
        for h in self.due_runs(&lease.deployment, now).await? {
            found.entry(h.rec.run_id.clone()).or_insert(h);
        }
        for h in self
            .orphans(&lease.deployment, now, &mut workers, true)
            .await?
        {
            found.insert(h.rec.run_id.clone(), h);
        }
        let mut ready = Vec::new();
        for h in found.into_values() {
            if let Some(at) = self.claim_key(&h, now, &mut workers).await? {
                if at <= now.millis() {
                    ready.push((at, h));
                }
            }
        }
        ready.sort_by(|(a, x), (b, y)| {
            (a, x.rec.created_at, &x.rec.run_id).cmp(&(b, y.rec.created_at, &y.rec.run_id))
        });
        for (_, h) in ready {
            if out.len() >= max {
                break;
            }
            if let Some(rec) = self.try_claim(h, lease, now, &mut workers).await? {
                out.push(rec);
            }
        }
        Ok(out)
    }

    async fn release(
        &self,
        lease: &Lease,
        run: &RunId,
        processed_seq: u64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        for _ in 0..MAX_ROUNDS {
            let h = self.header(run).await?;
            if h.rec.owner.as_ref() != Some(&(lease.worker.clone(), lease.epoch)) {
                return Err(fenced(lease, run.as_str()));
            }
            let mut nh = h.clone();
            nh.ver += 1;
            nh.rec.owner = None;
            let new_processed = h.rec.processed_seq.max(processed_seq.min(h.rec.next_seq));
            nh.rec.processed_seq = new_processed;
            if new_processed >= h.rec.next_seq {
                nh.unproc_at = None;
            } else if new_processed != h.rec.processed_seq {
                nh.unproc_at = self.event_time(run, new_processed).await?;
            }
            nh.touch(now);
            let mut tx = Tx::new();
            tx.push(self.header_put(&nh, Some(h.ver))?, Role::Header);
            tx.push(
                self.tx_check(
                    key(worker_pk(lease.worker.as_str()), ONE),
                    "#epoch = :e AND #ret = :f",
                    &[("#epoch", "epoch"), ("#ret", "ret")],
                    vec![
                        (":e", n(lease.epoch)),
                        (":f", aws_sdk_dynamodb::types::AttributeValue::Bool(false)),
                    ],
                )?,
                Role::Worker,
            );
            match self.transact(tx).await? {
                Ok(()) => {
                    self.cache_put(&nh);
                    return Ok(());
                }
                Err(roles) if roles.contains(&Role::Header) => continue,
                Err(_) => return Err(fenced(lease, run.as_str())),
            }
        }
        Err(contention("release"))
    }

    async fn retire_worker(&self, lease: &Lease, now: Timestamp) -> Result<(), StoreError> {
        // The runs it still holds keep naming it: orphaned, they are claimable at once, found
        // through its lapse entry, which now sorts first.
        let req = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(worker_pk(lease.worker.as_str()), ONE)))
            .update_expression("SET #ret = :t, #rat = :now, #g4sk = :gs")
            .condition_expression("#epoch = :e AND #ret = :f")
            .set_expression_attribute_names(names(&[
                ("#ret", "ret"),
                ("#rat", "rat"),
                ("#g4sk", "g4sk"),
                ("#epoch", "epoch"),
            ]))
            .set_expression_attribute_values(values(vec![
                (":t", aws_sdk_dynamodb::types::AttributeValue::Bool(true)),
                (":f", aws_sdk_dynamodb::types::AttributeValue::Bool(false)),
                (":e", n(lease.epoch)),
                (":now", n(now.millis())),
                (":gs", s(lapse_sk(i64::MIN, lease.worker.as_str()))),
            ]));
        match self
            .caller
            .call("UpdateItem", |_| false, || req.clone().send())
            .await
        {
            Ok(_) => Ok(()),
            Err(CallError::Service(e)) if e.is_conditional_check_failed_exception() => {
                Err(fenced(lease, ""))
            }
            Err(e) => Err(self.map("UpdateItem", e)),
        }
    }

    async fn next_wake(
        &self,
        deployment: &DeploymentId,
        now: Timestamp,
    ) -> Result<Option<Timestamp>, StoreError> {
        let mut workers = HashMap::new();
        let mut best: Option<i64> = None;
        // Each wake shard in work order, up to its first run no valid lease holds: a later one
        // without an owner has no earlier key, and orphaned runs come from the lapse entries.
        for shard in 0..self.shards {
            let mut start = None;
            'shard: loop {
                let (items, next) = self
                    .query_page(
                        Some("gsi1"),
                        "#p = :p",
                        &[("#p", "g1pk")],
                        vec![(":p", s(format!("WAKE#{deployment}#{shard}")))],
                        100,
                        start,
                    )
                    .await?;
                for it in &items {
                    let h = Header::from_item(it)?;
                    if let Some(at) = self.claim_key(&h, now, &mut workers).await? {
                        best = Some(best.map_or(at, |b| b.min(at)));
                        break 'shard;
                    }
                }
                match next {
                    Some(k) => start = Some(k),
                    None => break,
                }
            }
        }
        for h in self.orphans(deployment, now, &mut workers, false).await? {
            if let Some(at) = self.claim_key(&h, now, &mut workers).await? {
                best = Some(best.map_or(at, |b| b.min(at)));
            }
        }
        Ok(best.map(Timestamp))
    }

    fn store_id(&self) -> String {
        format!("dynamodb://{}/{}", self.location, self.table)
    }
}
