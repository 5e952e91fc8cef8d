//! eve-storage-dynamodb: [`DynamoStore`], the DynamoDB backend of eve's
//! [`JournalStore`](eve_core::JournalStore) contract, on `aws-sdk-dynamodb`.
//!
//! DynamoDB has no multi-row SQL transactions; every guarantee of the contract is built from
//! conditional writes and `TransactWriteItems` on **one table**, never grouping two runs in one
//! transaction.
//!
//! # Connecting
//!
//! ```no_run
//! # async fn demo() -> Result<(), eve_core::StoreError> {
//! use eve_storage_dynamodb::{DynamoConfig, DynamoStore};
//! // DynamoDB Local (or any endpoint URL) with static dummy credentials: the SDK never probes
//! // the instance-metadata service or the environment for credentials.
//! let store = DynamoStore::connect(DynamoConfig::local("http://127.0.0.1:8000", "eve")).await?;
//! store.create_table().await?; // tests and first deployments
//! # Ok(()) }
//! ```
//!
//! Against AWS, build an `aws_sdk_dynamodb::Client` yourself and use
//! [`DynamoStore::from_client`], or enable the `sdk-config` feature for
//! `DynamoStore::from_sdk_config` (the AWS credential chain; off by default because it doubles a
//! cold build).
//!
//! [`store_id`](eve_core::JournalStore::store_id) is `dynamodb://{endpoint}/{table}` (the
//! endpoint without its scheme) or, without an endpoint, `dynamodb://{region}/{table}`: the
//! same in every process that opens the table the same way.
//!
//! DynamoDB has no notifications: [`wakeups`](eve_core::JournalStore::wakeups) and
//! [`watch`](eve_core::JournalStore::watch) are `None`, so workers and waiters poll
//! ([`next_wake`](eve_core::JournalStore::next_wake) tells an idle worker how long it may sleep).
//!
//! # Table definition
//!
//! [`DynamoStore::create_table`] creates it (on-demand billing). For operators, the same table:
//!
//! ```text
//! aws dynamodb create-table --table-name eve \
//!   --billing-mode PAY_PER_REQUEST \
//!   --attribute-definitions \
//!     AttributeName=pk,AttributeType=S AttributeName=sk,AttributeType=S \
//!     AttributeName=g1pk,AttributeType=S AttributeName=g1sk,AttributeType=S \
//!     AttributeName=g2pk,AttributeType=S AttributeName=g2sk,AttributeType=S \
//!     AttributeName=g3pk,AttributeType=S AttributeName=g3sk,AttributeType=S \
//!     AttributeName=g4pk,AttributeType=S AttributeName=g4sk,AttributeType=S \
//!   --key-schema AttributeName=pk,KeyType=HASH AttributeName=sk,KeyType=RANGE \
//!   --global-secondary-indexes \
//!     'IndexName=gsi1,KeySchema=[{AttributeName=g1pk,KeyType=HASH},{AttributeName=g1sk,KeyType=RANGE}],Projection={ProjectionType=ALL}' \
//!     'IndexName=gsi2,KeySchema=[{AttributeName=g2pk,KeyType=HASH},{AttributeName=g2sk,KeyType=RANGE}],Projection={ProjectionType=ALL}' \
//!     'IndexName=gsi3,KeySchema=[{AttributeName=g3pk,KeyType=HASH},{AttributeName=g3sk,KeyType=RANGE}],Projection={ProjectionType=ALL}' \
//!     'IndexName=gsi4,KeySchema=[{AttributeName=g4pk,KeyType=HASH},{AttributeName=g4sk,KeyType=RANGE}],Projection={ProjectionType=KEYS_ONLY}'
//! ```
//!
//! # Single-table design
//!
//! Key schema: `pk` (S, partition) and `sk` (S, sort). Seqs in sort keys are zero-padded to 20
//! digits; times are `i64` milliseconds with the sign bit flipped, zero-padded, so they sort.
//!
//! | item | `pk` | `sk` | holds |
//! | --- | --- | --- | --- |
//! | run header | `RUN#{run}` | `EV~` | `h`: the [`RunRecord`](eve_core::RunRecord) plus timers, live hook tokens, pending requests and the time of the first unprocessed event, as JSON; `ver`: a version bumped by every write; `next_seq`; the GSI keys below |
//! | event batch (one per append) | `RUN#{run}` | `EV#{last_seq}` | `f` first seq, `n` count, `v` format version, `at`, `b` the batch of [`eve_core::codec::encode_batch`] (or a chunk pointer) |
//! | payload chunk | same `pk` as its owner | `CH#{nonce}#{i}` | `d`: ≤ 350,000 bytes of a large body |
//! | append id | `RUN#{run}` | `AID#{append_id}` | `f`, `x`: the answer a retried append gets |
//! | hook dedupe | `RUN#{run}` | `HD#{cmd}#{key}` | `seq` of the accepted delivery, `tok` the hook's token |
//! | delivery by token | `HOOKKEY#{len(token)}#{token}#{key}` | `-` | `run`, `seq`: a keyed delivery, kept after the run ended (a retry is a duplicate) until it is purged |
//! | idempotency key | `IDEM#{key}` | `-` | `run` |
//! | hook token | `HOOK#{token}` | `-` | `run`, `cmd` (exists only while the hook is live) |
//! | input request | `REQ#{request}` | `-` | run, session, cmd, the request, `st` pending/answered/withdrawn, the answer and its seq |
//! | session counter | `SESS#{session}` | `CTR` | `next`: the session log's next seq |
//! | session log batch | `SESS#{session}` | `LOG#{last_seq}` | `f`, `n`, `b`: the [`SessionEntry`](eve_core::SessionEntry)s one write made |
//! | session record | `SESS#{session}` | `META` | `end` (when it ended), `msgs` (the next message seq): contract clause 10; every start checks `end` is absent in its transaction |
//! | session's run | `SESS#{session}` | `RUN#{run}` | `cat`: written with the run, so an end lists the session's runs with a consistent query (not the lagging `gsi2`) |
//! | queued message | `SESS#{session}` | `MSG#{seq}` | `seq`, `at`, `b` (or chunks): a user message until a take deletes it |
//! | worker | `WORKER#{worker}` | `-` | `epoch`, `dep`, `exp` (lease expiry), `ret` (retired), `rat` (when), `cln` (the epoch whose lapse entry was dropped); its lapse entry (`g4` keys) |
//! | api key | `APIKEYS` | `KEY#{id}` | `id`, `name`, `scope`, `hash`, `cat`, `rat` (revoked at), `eat` (expires at, absent: never): contract clause 8 |
//! | api key hash | `KEYHASH#{hash}` | `-` | `id`: finds a key by hash; written with the key, so hashes are unique |
//! | worker lock | `WLOCK#{worker}` | `-` | `tok` (the holder's random token), `who` (pid, host, since when), `exp` (fresh until, wall-clock ms): contract clause 11 |
//! | superseded epoch | `WORKER#{worker}` | `OLD#{epoch}#{superseded_at}` | only its lapse entry, until the runs that epoch held are taken |
//!
//! Event and session batches are keyed by their **last** seq, so one `Query` with
//! `sk >= EV#{from_seq}` starts at the batch holding `from_seq`; the run header's `EV~` sorts
//! after every batch, so the page that reaches the end of the journal also returns the header
//! (no extra call to tell "past the end" from "unknown run").
//!
//! Global secondary indexes (all sparse: an item is in an index only while it has its keys):
//!
//! | GSI | `g*pk` | `g*sk` | used by |
//! | --- | --- | --- | --- |
//! | `gsi1` | `WAKE#{deployment}#{shard}` on run headers that have work (an undelivered event or a timer) | `{work_at}#{created_at}#{run}` | [`claim`](eve_core::JournalStore::claim), [`next_wake`](eve_core::JournalStore::next_wake): due runs by time, no table scan; `shard` = hash(run) mod [`DynamoConfig::wake_shards`] spreads a deployment's wake-ups over partitions |
//! | `gsi1` | `PREQ#{session}` on pending request items | `{requested_at}#{request}` | [`pending_requests`](eve_core::JournalStore::pending_requests) |
//! | `gsi2` | `SRUNS#{session}` on run headers | `{created_at}#{run}` | [`list_runs`](eve_core::JournalStore::list_runs) by session (the task index) |
//! | `gsi3` | `RUNS#{status}` on run headers | `{created_at}#{run}` | `list_runs` by status (and all runs: one query per status) |
//! | `gsi4` | `OWN#{worker}#{epoch}` on headers of running runs with an owner | `{run}` | finding the runs one lease holds once it lapsed (orphaned runs) |
//! | `gsi4` | `LAPSE#{deployment}` on worker items and superseded-epoch items (*lapse entries*) | `{lapse}#{worker}`: the lease's expiry; the lowest time for a retired worker or a superseded epoch | [`claim`](eve_core::JournalStore::claim), `next_wake`: the leases of the deployment that are not valid at `now`, one range query |
//!
//! # Commit protocol
//!
//! Every write to a run is a read-modify-write of its header guarded by `ver`:
//!
//! * **Appends (guarantee 1)** are one `TransactWriteItems`: `Put` of the header (condition
//!   `ver = :read AND next_seq = :expected`), `Put` of the event batch
//!   (`attribute_not_exists`), a `ConditionCheck` on the worker item (`epoch = :epoch AND ret =
//!   false`: fencing), `Put` of the append-id item, and the effects (hook token puts with
//!   `attribute_not_exists`, request items, session log batch and counter, hook deletions and
//!   request withdrawals at run end). The header a handle last wrote is cached, so a worker's
//!   steady-state append is **one call**; a stale cache only costs a failed condition and a
//!   re-read. A cancelled transaction is decoded from its cancellation reasons: the header's
//!   condition → re-read and decide `Conflict { expected, actual }` / `Fenced` / `RunEnded`
//!   (or, when the append id item exists, a duplicate success); the worker check → `Fenced`; a
//!   hook token → `AlreadyExists`.
//! * **Deliveries (guarantee 2)** read the header (strongly consistent) and commit the same way;
//!   `answer` adds an `Update` of the request item conditioned on `st = pending`, `deliver_hook`
//!   with a key adds a `Put` of the dedupe item with `attribute_not_exists`. Losing a race
//!   re-reads and retries, so each delivery lands once at the next seq.
//! * **Idempotent starts (guarantee 3)**: one transaction puts the idempotency item, the header
//!   and the `RunStarted` batch, each with `attribute_not_exists`; a lost race reads the winner.
//! * **Hooks (guarantee 4)**: the token item is put with `attribute_not_exists` in the append
//!   that creates it and deleted in the write that ends the run.
//! * **Wake-ups and leases (guarantee 5)**: the header's `g1` keys are recomputed at every write
//!   (earliest of the first unprocessed event's time and the timers). A claim gathers two kinds
//!   of candidates, computes each one's *claim key* from its header and the owner's worker item
//!   (strongly consistent): the time its work is due, and for an orphaned run the earlier of
//!   that and its `updated_at`; runs a valid lease holds have none. It takes them in claim-key
//!   order (ties by creation time, then run id), each with a `Put` conditioned on `ver`:
//!   * runs with work due: the head of the due part of `g1`, merged across the wake shards
//!     earliest first and read lazily (a page of about twice the claim's size over the shards
//!     from each, more only from the shard whose next entry is the earliest), until twice the
//!     runs wanted are found: a claim costs the same with 10 or 10,000 runs queued;
//!   * **orphaned runs**, whose owner's lease is no longer valid, with or without work. Expiry
//!     happens without a write, so every worker item carries a *lapse entry* in `gsi4`
//!     (`LAPSE#{deployment}`) sorted by its lease's expiry; one range query up to `now` returns
//!     the deployment's expired workers, its retired ones (retiring moves the entry to the
//!     front), and its superseded epochs (re-registering a worker id writes an `OLD#` item whose
//!     entry sorts first, in the same transaction that bumps the epoch). Each lapsed lease leads
//!     through `OWN#{worker}#{epoch}` to the running runs it still holds. Live workers' entries
//!     lie past `now`, and parked runs (released, no work) are in neither index, so a claim pays
//!     nothing per parked run: one query more than the wake shards, plus a worker read and a
//!     query per lapsed lease and a read per run it holds.
//!
//!   Registering reads the worker item and writes the next epoch conditioned on the one it
//!   read (two calls); a heartbeat is one conditional update that also checks the lease's
//!   deployment (a lease naming another deployment is `Fenced`), and moves the lapse entry.
//!   Tables written before lapse entries existed: a worker item gets its entry at its next
//!   registration or heartbeat, so runs of a lease that lapsed before the upgrade and never
//!   comes back are claimed only when they have work, as before.
//!
//!   A lapse entry under which no run is indexed any more is dropped by a claim (a superseded
//!   epoch's item deleted, a worker item's `g4` keys removed, conditioned on the item being
//!   unchanged), but only once the lease lapsed at least a minute ago in the callers' time, so
//!   that `OWN` entries of claims committed just before the lapse have reached the index. A
//!   heartbeat rewrites the entry at the new expiry (and brings a dropped one back). Blocked
//!   runs stay out of `OWN`: a blocked run is not claimable, and the delivery that makes it
//!   running again gives it work.
//!
//!   GSIs are eventually consistent on AWS: a stale entry can only be skipped (the header read
//!   or the `ver` condition says the run moved on), never double-claimed; a late one is found at
//!   a later claim. [`next_wake`](eve_core::JournalStore::next_wake) is the least claim key over
//!   the first unheld run of each wake shard and the orphaned runs.
//!   [`retire_worker`](eve_core::JournalStore::retire_worker) only marks the worker retired: the
//!   runs it held keep naming it and are claimable at once.
//! * **Retention (guarantee 9)**: a purge finds ended runs through `gsi3` and deletes each
//!   run's items one by one (requests, session-log batches, idempotency item, journal), its
//!   header last and conditionally, so an interrupted purge is finished by the next one and a
//!   run is counted once. The session counter stays, so no session seq is reused.
//! * **Reads (guarantee 6)** are strongly consistent queries, at least 100 items a page.
//! * **One live holder per worker id (clause 11)**: DynamoDB has no session that ends with a
//!   process, so the lock is a heartbeat: a `Put` of `WLOCK#{worker}` conditioned on the item
//!   being absent or stale (`exp` in the past, wall clock), renewed every second for 3 s by a
//!   task of the holder (conditioned on its token), deleted when the lock is dropped. **A
//!   process killed without a clean-up keeps its id for up to 3 s**: a restart in that window is
//!   refused, naming the dead holder, and succeeds when started again (a clean shutdown frees
//!   it at once). Hosts sharing a table need clocks within a second of each other; a holder
//!   stalled past 3 s may lose the id to another process, which then fences it, as before.
//!
//! # Consumed capacity
//!
//! Every data-plane request the store makes asks `ReturnConsumedCapacity: TOTAL` (an SDK
//! interceptor sets it, so no call site can forget), and the read and write capacity units in
//! the answers add up per handle: [`DynamoStore::consumed_capacity`] returns the totals
//! ([`ConsumedCapacity`]); take it before and after some work and subtract. Requests that fail
//! (a condition that did not hold, a cancelled transaction) carry no figure and are not
//! counted, although AWS bills the write units of a failed conditional write. `eve bench`
//! reports capacity units per step, per call and per resume, and the cost of a million steps
//! at on-demand prices, from these totals.
//!
//! # Limits
//!
//! * Bodies (event batches, session log batches, requests, answers) over 350,000 bytes, or
//!   that would push one transaction past 3 MB, are written first as chunk items
//!   (`BatchWriteItem`) and committed by a pointer in the transaction; reads reassemble them byte
//!   for byte. Chunks of a write that did not commit are deleted (best effort) or stay
//!   unreferenced.
//! * A transaction holds at most 100 items. An append whose effects need more (say 60 hooks and
//!   50 requests in one batch) is **refused** with `LimitExceeded { what: "DynamoDB transaction
//!   items of one write" }`, never split: split the events over several appends.
//! * Throttling (`ProvisionedThroughputExceededException`, `ThrottlingException`,
//!   `RequestLimitExceeded`), `TransactionConflictException`, transaction cancellations for
//!   conflict or throttling, 5xx, timeouts ([`DynamoConfig::attempt_timeout`]) and network faults
//!   are retried with exponential backoff and jitter ([`DynamoConfig::max_attempts`]), then
//!   surface as `StoreError::Unavailable`. A transaction whose reply was lost (it may have
//!   committed) is retried with the same client token, and an append is resolved by its append
//!   id: a retry of one that landed is answered as a duplicate, never applied twice.
//!   [`FaultInjector`] injects all of these below the SDK in tests (`tests/faults.rs`).
//! * Ordering ties: runs created at the same millisecond are listed and claimed in run id order
//!   (the contract's "creation time, then run id").

mod capacity;
mod client;
mod item;
mod store;

pub use capacity::ConsumedCapacity;
pub use client::{CallCounts, DynamoConfig, FaultInjector, IndexLag};
pub use store::DynamoStore;

/// Re-exported so callers can build a client for [`DynamoStore::from_client`] without naming the
/// crate themselves.
pub use aws_sdk_dynamodb;

#[cfg(feature = "sdk-config")]
pub use aws_config;
