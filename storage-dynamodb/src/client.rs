//! Connecting: configuration, the HTTP client (rustls with ring), the retry wrapper that counts
//! calls, and the fault injector that tests throttling (DynamoDB Local never throttles).

use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region, SharedHttpClient};
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use eve_core::StoreError;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) const BACKEND: &str = "dynamodb";

/// How to reach a DynamoDB table with [`crate::DynamoStore::connect`].
///
/// Credentials are always static: `connect` never consults the environment, profile files or
/// the instance-metadata service. DynamoDB Local accepts any key made of letters and digits.
#[derive(Clone, Debug)]
pub struct DynamoConfig {
    /// The endpoint, e.g. `http://127.0.0.1:8000` for DynamoDB Local; `None` uses AWS's regional
    /// endpoint.
    pub endpoint_url: Option<String>,
    /// The region to sign for.
    pub region: String,
    /// The table (see the crate docs for its definition).
    pub table: String,
    /// Static access key id.
    pub access_key_id: String,
    /// Static secret access key.
    pub secret_access_key: String,
    /// How many partitions a deployment's wake-up index is spread over (≥ 1). Claims and
    /// `next_wake` query each shard, so keep it small; raise it for deployments with thousands
    /// of wake-ups per second.
    pub wake_shards: u32,
    /// Attempts per DynamoDB call before a throttled or transient fault surfaces as
    /// `StoreError::Unavailable` (≥ 1).
    pub max_attempts: u32,
    /// First backoff; doubles per attempt (with jitter), capped at one second.
    pub base_backoff: Duration,
    /// How long one attempt of a call may take before the SDK abandons it as timed out (and
    /// the store retries it, as any transient fault). Default 20 s.
    pub attempt_timeout: Duration,
    /// Test hook: answers some requests with injected faults before they reach DynamoDB.
    pub faults: Option<FaultInjector>,
    /// Test hook: global secondary index queries lag behind the table (see [`IndexLag`]).
    pub index_lag: Option<IndexLag>,
}

impl DynamoConfig {
    /// A configuration for DynamoDB Local (or any endpoint URL) with dummy static credentials.
    pub fn local(endpoint_url: impl Into<String>, table: impl Into<String>) -> Self {
        Self {
            endpoint_url: Some(endpoint_url.into()),
            region: "us-east-1".into(),
            table: table.into(),
            access_key_id: "evelocal".into(),
            secret_access_key: "evelocalsecret".into(),
            wake_shards: 4,
            max_attempts: 8,
            base_backoff: Duration::from_millis(10),
            attempt_timeout: Duration::from_secs(20),
            faults: None,
            index_lag: None,
        }
    }

    /// The SDK client [`crate::DynamoStore::connect`] uses: rustls (ring) HTTPS, the static
    /// credentials of this config, the SDK's own retries off (the store retries and counts).
    pub fn sdk_client(&self) -> aws_sdk_dynamodb::Client {
        use aws_smithy_http_client::tls;
        let https: SharedHttpClient = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let http = match &self.faults {
            Some(f) => SharedHttpClient::new(FaultClient {
                inner: https,
                faults: f.clone(),
            }),
            None => https,
        };
        let mut b = aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(self.region.clone()))
            .credentials_provider(Credentials::new(
                self.access_key_id.clone(),
                self.secret_access_key.clone(),
                None,
                None,
                "eve-static",
            ))
            .http_client(http)
            // The store retries itself (and counts every attempt), so the SDK does not.
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(3))
                    .operation_attempt_timeout(self.attempt_timeout)
                    .build(),
            );
        if let Some(url) = &self.endpoint_url {
            b = b.endpoint_url(url.clone());
        }
        aws_sdk_dynamodb::Client::from_conf(b.build())
    }
}

/// Injects faults for tests, below the SDK (at its HTTP connector), so the SDK parses and
/// times out exactly as against the real service:
///
/// * [`FaultInjector::fail_next`]: DynamoDB error responses (throttling, 500s), the request
///   never reaching the server;
/// * [`FaultInjector::time_out_next`]: requests that never get an answer, until the SDK's
///   attempt timeout ([`DynamoConfig::attempt_timeout`]) gives up on them;
/// * [`FaultInjector::lose_reply_next`]: requests that reach DynamoDB and are carried out, but
///   whose reply is lost (the connection drops): the ambiguous outcome.
#[derive(Clone, Debug, Default)]
pub struct FaultInjector {
    inner: Arc<FaultState>,
}

/// What the next requests get.
#[derive(Clone, Debug, Default)]
enum Injected {
    /// Nothing: requests pass.
    #[default]
    Pass,
    /// An error response with this `__type`.
    Error(String),
    /// No answer at all.
    Silence,
    /// The request is sent; its reply is dropped.
    LostReply,
}

#[derive(Debug, Default)]
struct FaultState {
    remaining: AtomicU32,
    what: Mutex<(Injected, Option<String>)>,
    injected: AtomicU32,
}

impl FaultInjector {
    /// An injector that injects nothing until told.
    pub fn new() -> Self {
        Self::default()
    }

    /// Answers the next `n` requests with `code` (for example
    /// `ProvisionedThroughputExceededException`, `ThrottlingException`,
    /// `TransactionConflictException`, `InternalServerError` (HTTP 500)).
    pub fn fail_next(&self, n: u32, code: &str) {
        self.set(n, Injected::Error(code.to_owned()), None);
    }

    /// The next `n` requests get no answer: each attempt times out after
    /// [`DynamoConfig::attempt_timeout`]. Nothing reaches DynamoDB.
    pub fn time_out_next(&self, n: u32) {
        self.set(n, Injected::Silence, None);
    }

    /// The next `n` requests of `operation` (e.g. `TransactWriteItems`; other operations pass)
    /// reach DynamoDB and are carried out, then their reply is lost as if the connection
    /// dropped: the caller cannot know whether the write happened.
    pub fn lose_reply_next(&self, n: u32, operation: &str) {
        self.set(n, Injected::LostReply, Some(operation.to_owned()));
    }

    fn set(&self, n: u32, what: Injected, operation: Option<String>) {
        *self.inner.what.lock().expect("fault lock") = (what, operation);
        self.inner.remaining.store(n, Ordering::SeqCst);
    }

    /// How many faults were injected so far.
    pub fn injected(&self) -> u32 {
        self.inner.injected.load(Ordering::SeqCst)
    }

    /// The fault for a request of `operation` (the `X-Amz-Target`'s action), if one is due.
    fn take(&self, operation: &str) -> Option<Injected> {
        let (what, only) = self.inner.what.lock().expect("fault lock").clone();
        if only.is_some_and(|o| o != operation) {
            return None;
        }
        self.inner
            .remaining
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .ok()
            .map(|_| {
                self.inner.injected.fetch_add(1, Ordering::SeqCst);
                what
            })
    }
}

/// Injects the eventual consistency of global secondary indexes, which DynamoDB Local does
/// not show: an index query is answered with the answer the same query got earlier, up to
/// `stale_answers` times in a row, before the index is read again. A run that became due, or
/// a lease that lapsed, is then missed by that many claims or `next_wake` calls; an item the
/// table already changed (a claimed, parked or ended run) is still listed. Base-table reads
/// are never stale.
#[derive(Clone, Debug, Default)]
pub struct IndexLag {
    stale_answers: u32,
    answers: Arc<Mutex<HashMap<String, (u32, LaggedAnswer)>>>,
    served: Arc<AtomicU32>,
}

/// One index query page: items and the next page's start.
pub(crate) type LaggedAnswer = (
    Vec<HashMap<String, aws_sdk_dynamodb::types::AttributeValue>>,
    Option<HashMap<String, aws_sdk_dynamodb::types::AttributeValue>>,
);

impl IndexLag {
    /// Index queries answered from the previous answer up to `stale_answers` times in a row.
    pub fn new(stale_answers: u32) -> Self {
        Self {
            stale_answers,
            ..Self::default()
        }
    }

    /// How many index queries were answered stale so far.
    pub fn served_stale(&self) -> u32 {
        self.served.load(Ordering::SeqCst)
    }

    /// The earlier answer to `query` if it is to be served again.
    pub(crate) fn stale(&self, query: &str) -> Option<LaggedAnswer> {
        let mut answers = self.answers.lock().expect("index lag lock");
        let (times, answer) = answers.get_mut(query)?;
        if *times >= self.stale_answers {
            return None;
        }
        *times += 1;
        self.served.fetch_add(1, Ordering::SeqCst);
        Some(answer.clone())
    }

    /// Records the index's fresh answer to `query`.
    pub(crate) fn fresh(&self, query: String, answer: LaggedAnswer) {
        self.answers
            .lock()
            .expect("index lag lock")
            .insert(query, (0, answer));
    }
}

#[derive(Debug)]
struct FaultClient {
    inner: SharedHttpClient,
    faults: FaultInjector,
}

impl HttpClient for FaultClient {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(FaultConnector {
            inner: self.inner.http_connector(settings, components),
            faults: self.faults.clone(),
        })
    }
}

#[derive(Debug)]
struct FaultConnector {
    inner: SharedHttpConnector,
    faults: FaultInjector,
}

impl HttpConnector for FaultConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let operation = request
            .headers()
            .get("x-amz-target")
            .and_then(|t| t.rsplit('.').next())
            .unwrap_or("")
            .to_owned();
        match self.faults.take(&operation) {
            None | Some(Injected::Pass) => self.inner.call(request),
            Some(Injected::Error(code)) => {
                let status = if code.starts_with("InternalServer") || code == "ServiceUnavailable" {
                    500
                } else {
                    400
                };
                let body = format!(
                    r#"{{"__type":"com.amazonaws.dynamodb.v20120810#{code}","message":"injected by eve's FaultInjector"}}"#
                );
                let mut resp = HttpResponse::new(
                    StatusCode::try_from(status).expect("valid status"),
                    SdkBody::from(body),
                );
                resp.headers_mut()
                    .insert("content-type", "application/x-amz-json-1.0");
                HttpConnectorFuture::ready(Ok(resp))
            }
            Some(Injected::Silence) => HttpConnectorFuture::new(std::future::pending()),
            Some(Injected::LostReply) => {
                let sent = self.inner.call(request);
                HttpConnectorFuture::new(async move {
                    // The request is carried out; whatever DynamoDB answered is dropped.
                    let _ = sent.await;
                    Err(ConnectorError::io(
                        "the connection dropped after the request was sent (injected by eve's FaultInjector)"
                            .into(),
                    ))
                })
            }
        }
    }
}

/// DynamoDB calls (attempts, retries included) made by a store handle, by operation name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallCounts(pub BTreeMap<&'static str, u64>);

impl CallCounts {
    /// All calls together.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// The calls made since `earlier` was taken.
    pub fn since(&self, earlier: &CallCounts) -> CallCounts {
        CallCounts(
            self.0
                .iter()
                .map(|(k, v)| (*k, v - earlier.0.get(k).copied().unwrap_or(0)))
                .filter(|(_, v)| *v > 0)
                .collect(),
        )
    }
}

/// What went wrong with one call, once retries are done.
#[derive(Debug)]
pub(crate) enum CallError<E> {
    /// The service answered with this modeled error (a condition failed, a transaction was
    /// cancelled, …): the caller decides.
    Service(E),
    /// Anything else, already mapped.
    Store(StoreError),
}

/// Error codes that mean "try again later".
fn transient_code(code: &str) -> bool {
    matches!(
        code,
        "ProvisionedThroughputExceededException"
            | "ThrottlingException"
            | "RequestLimitExceeded"
            | "TransactionConflictException"
            | "TransactionInProgressException"
            | "InternalServerError"
            | "ServiceUnavailable"
            | "LimitExceededException"
    )
}

/// Cancellation reason codes that mean "try again later".
pub(crate) fn transient_reason(code: &str) -> bool {
    matches!(
        code,
        "TransactionConflict" | "ThrottlingError" | "ProvisionedThroughputExceeded"
    )
}

/// The retry policy and the call counter of one store handle.
#[derive(Debug)]
pub(crate) struct Caller {
    pub(crate) max_attempts: u32,
    pub(crate) base_backoff: Duration,
    counts: Mutex<BTreeMap<&'static str, u64>>,
}

impl Caller {
    pub(crate) fn new(max_attempts: u32, base_backoff: Duration) -> Self {
        Self {
            max_attempts: max_attempts.max(1),
            base_backoff,
            counts: Mutex::new(BTreeMap::new()),
        }
    }

    pub(crate) fn counts(&self) -> CallCounts {
        CallCounts(self.counts.lock().expect("counter lock").clone())
    }

    pub(crate) fn count(&self, op: &'static str) {
        *self
            .counts
            .lock()
            .expect("counter lock")
            .entry(op)
            .or_default() += 1;
    }

    pub(crate) async fn backoff(&self, attempt: u32) {
        let exp = self
            .base_backoff
            .saturating_mul(1u32 << attempt.min(10))
            .min(Duration::from_secs(1));
        // Full jitter, from a cheap random source: contention backs off apart.
        let jitter = uuid::Uuid::new_v4().as_u128() as u64 % (exp.as_micros() as u64 + 1);
        tokio::time::sleep(Duration::from_micros(jitter)).await;
    }

    /// Runs `f` until it succeeds, fails for good, or `max_attempts` transient faults in a row;
    /// `is_transient_service` says which modeled service errors are contention to retry (for
    /// transactions: cancellations whose reasons are all conflicts or throttling).
    pub(crate) async fn call<T, E, F, Fut>(
        &self,
        op: &'static str,
        is_transient_service: impl Fn(&E) -> bool,
        f: F,
    ) -> Result<T, CallError<E>>
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
    {
        let mut attempt = 0;
        loop {
            self.count(op);
            let err = match f().await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let (transient, message) = match &err {
                SdkError::ServiceError(se) => {
                    let e = se.err();
                    let code = e.code().unwrap_or("");
                    // The classifier sees every service answer (it may act on it, e.g. rotate
                    // a transaction's client token), so it is called first.
                    let service_says_retry = is_transient_service(e);
                    if service_says_retry || transient_code(code) {
                        (true, format!("{code}: {}", e.message().unwrap_or("")))
                    } else {
                        match err {
                            SdkError::ServiceError(se) => {
                                return Err(CallError::Service(se.into_err()))
                            }
                            _ => unreachable!("matched above"),
                        }
                    }
                }
                SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) => (
                    true,
                    aws_smithy_types::error::display::DisplayErrorContext(&err).to_string(),
                ),
                SdkError::ResponseError(_) => (
                    true,
                    aws_smithy_types::error::display::DisplayErrorContext(&err).to_string(),
                ),
                _ => {
                    return Err(CallError::Store(StoreError::Other {
                        backend: BACKEND,
                        source: format!(
                            "{op} failed: {}",
                            aws_smithy_types::error::display::DisplayErrorContext(&err)
                        )
                        .into(),
                    }))
                }
            };
            attempt += 1;
            if !transient || attempt >= self.max_attempts {
                return Err(CallError::Store(StoreError::Unavailable {
                    backend: BACKEND,
                    message: format!(
                        "{op} still failing after {attempt} attempts (throttled, contended or unreachable): {message}"
                    ),
                }));
            }
            tracing::debug!(op, attempt, %message, "transient DynamoDB fault; backing off");
            self.backoff(attempt).await;
        }
    }
}

/// Maps a modeled service error that the caller did not handle.
pub(crate) fn unexpected<E: ProvideErrorMetadata + std::fmt::Display>(
    op: &'static str,
    table: &str,
    e: E,
) -> StoreError {
    let code = e.code().unwrap_or("unknown");
    let hint = if code == "ResourceNotFoundException" {
        format!("; does table {table:?} exist? create it with DynamoStore::create_table() or the command in the crate docs")
    } else {
        String::new()
    };
    StoreError::Other {
        backend: BACKEND,
        source: format!(
            "{op} failed with {code}: {}{hint}",
            e.message().unwrap_or("")
        )
        .into(),
    }
}
