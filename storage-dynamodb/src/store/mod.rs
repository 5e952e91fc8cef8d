//! [`DynamoStore`]: the [`JournalStore`] contract on one DynamoDB table. The design and the
//! commit protocol are in the crate docs.
//!
//! This module holds the handle, the table's administration, the header cache and the
//! `JournalStore` impl, which delegates to the modules by concern: `tx` (transactions and
//! conditional writes), `reads` (items, queries, journals, runs, pending requests), `commit`
//! (the shared write path, `create_run`, `append`), `deliveries` (answers, hook payloads,
//! cancel requests, resolving blocked runs), `leases` (workers, claims, orphaned runs) and
//! `sessions` (session logs).

mod commit;
mod deliveries;
mod keys;
mod leases;
mod reads;
mod retention;
mod sessions;
mod tx;
mod worker_lock;

use crate::client::{unexpected, CallCounts, CallError, Caller, DynamoConfig, BACKEND};
use crate::item::*;
use async_trait::async_trait;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TableStatus,
};
use aws_sdk_dynamodb::Client;
use eve_core::{
    ApiKey, Append, Appended, CancelOutcome, CreatedRun, Delivered, DeploymentId, InputResponse,
    JournalStore, Lease, NewRun, Payload, PendingRequest, QueuedMessage, RequestId, Resolution,
    RunId, RunQuery, RunRecord, SessionEnd, SessionEntry, SessionId, SessionRecord, StoreError,
    StoredEvent, Timestamp, WorkerId,
};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Rounds of read-check-commit an operation tries when other writers keep changing the run
/// before it gives up with `Unavailable`.
pub(super) const MAX_ROUNDS: usize = 200;
/// Headers cached per handle before the cache is cleared.
const CACHE_MAX: usize = 10_000;

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
    /// Test hook: stale index answers.
    index_lag: Option<crate::IndexLag>,
    /// The capacity units DynamoDB reported for this handle's requests.
    meter: crate::capacity::CapacityMeter,
}

impl std::fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoStore")
            .field("table", &self.table)
            .field("wake_shards", &self.shards)
            .finish_non_exhaustive()
    }
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

pub(super) fn build_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Other {
        backend: BACKEND,
        source: format!("could not build a DynamoDB request: {e}").into(),
    }
}

pub(super) fn fenced(lease: &Lease, run: &str) -> StoreError {
    StoreError::Fenced {
        run: run.to_owned(),
        worker: lease.worker.to_string(),
        epoch: lease.epoch,
    }
}

pub(super) fn corrupt(run: &RunId, seq: u64, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        run: run.clone(),
        seq,
        reason: reason.into(),
    }
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
        store.index_lag = config.index_lag;
        Ok(store)
    }

    /// A store on `table` through a client you configured (credentials, endpoint, retries).
    /// Consider disabling the SDK's own retries: the store retries throttling and transient
    /// faults itself. Its [`store_id`](JournalStore::store_id) names the client's region (the
    /// client does not show its endpoint).
    pub fn from_client(client: Client, table: impl Into<String>) -> Self {
        let meter = crate::capacity::CapacityMeter::default();
        // Every request asks for its consumed capacity (see `consumed_capacity`).
        let client = Client::from_conf(
            client
                .config()
                .to_builder()
                .interceptor(meter.clone())
                .build(),
        );
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
            index_lag: None,
            meter,
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

    /// The read and write capacity units DynamoDB reported for this handle's successful
    /// requests so far (every request asks `ReturnConsumedCapacity: TOTAL`), and how many
    /// answers carried no figure. Take it before and after some work and subtract
    /// ([`ConsumedCapacity::since`](crate::ConsumedCapacity::since)) to price that work.
    /// Failed requests (a condition that did not hold) are not counted; see
    /// [`ConsumedCapacity`](crate::ConsumedCapacity).
    pub fn consumed_capacity(&self) -> crate::ConsumedCapacity {
        self.meter.totals()
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

    pub(super) fn map<E>(&self, op: &'static str, e: CallError<E>) -> StoreError
    where
        E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::fmt::Display,
    {
        match e {
            CallError::Service(e) => unexpected(op, &self.table, e),
            CallError::Store(e) => e,
        }
    }

    pub(super) fn cache_put(&self, h: &Header) {
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

    pub(super) fn cache_get(&self, run: &RunId) -> Option<Header> {
        self.cache.lock().expect("cache lock").get(run).cloned()
    }

    pub(super) fn cache_drop(&self, run: &RunId) {
        self.cache.lock().expect("cache lock").remove(run);
    }
}

pub(super) fn hook_exists(token: &str) -> StoreError {
    StoreError::AlreadyExists {
        what: "hook token",
        id: token.to_owned(),
        hint: "a live hook already has this token; choose another token or wait for its run to end",
    }
}

pub(super) fn contention(op: &str) -> StoreError {
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
        commit::create_run(self, new, None, now).await
    }

    async fn create_run_claimed(
        &self,
        new: NewRun,
        lease: &Lease,
        now: Timestamp,
    ) -> Result<CreatedRun, StoreError> {
        commit::create_run(self, new, Some(lease), now).await
    }

    async fn end_session(
        &self,
        session: &SessionId,
        now: Timestamp,
    ) -> Result<SessionEnd, StoreError> {
        sessions::end_session(self, session, now).await
    }

    async fn get_session(&self, session: &SessionId) -> Result<SessionRecord, StoreError> {
        sessions::get_session(self, session).await
    }

    async fn queue_message(
        &self,
        session: &SessionId,
        message: Payload,
        now: Timestamp,
    ) -> Result<QueuedMessage, StoreError> {
        sessions::queue_message(self, session, message, now).await
    }

    async fn take_messages(&self, session: &SessionId) -> Result<Vec<QueuedMessage>, StoreError> {
        sessions::take_messages(self, session).await
    }

    async fn create_key(&self, key: ApiKey) -> Result<(), StoreError> {
        DynamoStore::create_key(self, key).await
    }

    async fn list_keys(&self) -> Result<Vec<ApiKey>, StoreError> {
        DynamoStore::list_keys(self).await
    }

    async fn revoke_key(&self, id: &str, now: Timestamp) -> Result<ApiKey, StoreError> {
        DynamoStore::revoke_key(self, id, now).await
    }

    async fn key_by_hash(&self, hash: &str) -> Result<Option<ApiKey>, StoreError> {
        DynamoStore::key_by_hash(self, hash).await
    }

    async fn purge(&self, ended_before: Timestamp, limit: usize) -> Result<usize, StoreError> {
        retention::purge(self, ended_before, limit).await
    }

    async fn append(&self, a: Append) -> Result<Appended, StoreError> {
        commit::append(self, a).await
    }

    async fn read(
        &self,
        run: &RunId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        reads::read(self, run, from_seq, max).await
    }

    async fn get_run(&self, run: &RunId) -> Result<RunRecord, StoreError> {
        Ok(self.header(run).await?.rec)
    }

    async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        reads::list_runs(self, query).await
    }

    async fn answer(
        &self,
        request: &RequestId,
        response: InputResponse,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        deliveries::answer(self, request, response, now).await
    }

    async fn deliver_hook(
        &self,
        token: &str,
        payload: Payload,
        dedupe_key: Option<&str>,
        now: Timestamp,
    ) -> Result<Delivered, StoreError> {
        deliveries::deliver_hook(self, token, payload, dedupe_key, now).await
    }

    async fn request_cancel(
        &self,
        run: &RunId,
        reason: &str,
        now: Timestamp,
    ) -> Result<CancelOutcome, StoreError> {
        deliveries::request_cancel(self, run, reason, now).await
    }

    async fn resolve_blocked(
        &self,
        run: &RunId,
        resolution: Resolution,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        deliveries::resolve_blocked(self, run, resolution, now).await
    }

    async fn pending_requests(
        &self,
        session: &SessionId,
    ) -> Result<Vec<PendingRequest>, StoreError> {
        reads::pending_requests(self, session).await
    }

    async fn read_session(
        &self,
        session: &SessionId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<SessionEntry>, StoreError> {
        sessions::read_session(self, session, from_seq, max).await
    }

    async fn register_worker(
        &self,
        worker: &WorkerId,
        deployment: &DeploymentId,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        leases::register_worker(self, worker, deployment, ttl, now).await
    }

    async fn heartbeat(
        &self,
        lease: &Lease,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        leases::heartbeat(self, lease, ttl, now).await
    }

    async fn claim(
        &self,
        lease: &Lease,
        max: usize,
        now: Timestamp,
    ) -> Result<Vec<RunRecord>, StoreError> {
        leases::claim(self, lease, max, now).await
    }

    async fn release(
        &self,
        lease: &Lease,
        run: &RunId,
        processed_seq: u64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        leases::release(self, lease, run, processed_seq, now).await
    }

    async fn retire_worker(&self, lease: &Lease, now: Timestamp) -> Result<(), StoreError> {
        leases::retire_worker(self, lease, now).await
    }

    async fn next_wake(
        &self,
        deployment: &DeploymentId,
        now: Timestamp,
    ) -> Result<Option<Timestamp>, StoreError> {
        leases::next_wake(self, deployment, now).await
    }

    fn store_id(&self) -> String {
        format!("dynamodb://{}/{}", self.location, self.table)
    }

    async fn lock_worker(&self, worker: &WorkerId) -> Result<eve_core::WorkerLock, StoreError> {
        self.lock_worker_item(worker).await
    }
}
