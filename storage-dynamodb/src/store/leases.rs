//! Workers, leases and claims (contract clause 5): worker items and their lapse entries,
//! claim keys, orphaned runs, and the contract's `register_worker`, `heartbeat`, `claim`,
//! `release`, `retire_worker` and `next_wake`.

use super::tx::{names, values, Role, Tx};
use super::{contention, fenced, DynamoStore, MAX_ROUNDS};
use crate::client::CallError;
use crate::item::*;
use aws_sdk_dynamodb::types::{ReturnValue, ReturnValuesOnConditionCheckFailure};
use eve_core::{DeploymentId, Lease, RunId, RunRecord, RunStatus, StoreError, Timestamp, WorkerId};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// How long after a lease became invalid (its expiry, retirement or supersession, in the
/// callers' time) a claim may drop its lapse entry once no run is indexed under it: a margin for
/// `gsi4` to catch up with claims that committed just before the lease lapsed, so a late index
/// entry is never lost with the lapse entry that leads to it.
pub(super) const LAPSE_SETTLE_MS: i64 = 60_000;

/// A worker item as claims see it.
#[derive(Clone, Debug)]
pub(super) struct WorkerInfo {
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
    pub(super) fn valid(&self, epoch: u64, now: Timestamp) -> bool {
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
pub(super) fn worker_item(
    worker: &WorkerId,
    deployment: &DeploymentId,
    epoch: u64,
    expires_at: i64,
) -> Item {
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
    /// The worker item, strongly consistent.
    pub(super) async fn worker(&self, worker: &str) -> Result<Option<WorkerInfo>, StoreError> {
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
    pub(super) async fn worker_cached(
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
    pub(super) async fn held(
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
    pub(super) async fn claim_key(
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
    pub(super) async fn orphans(
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
    pub(super) async fn drop_lapse(&self, worker: &str, sk: &str, info: &WorkerInfo) {
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

    /// Claims one candidate run (its header from an index, possibly stale) for `lease`: only
    /// while it is claimable at `now`, and only by a `Put` conditioned on the `ver` it read, so
    /// a stale candidate is skipped, never claimed twice.
    pub(super) async fn try_claim(
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

    /// Up to `want` runs of `deployment` that are claimable by `now` with work due (`gsi1`),
    /// earliest work first across the wake shards, headers as the index holds them. Each shard
    /// is read lazily in key order, a page of about `want / shards` entries at a time, and only
    /// the shard whose next entry is the earliest is advanced: a claim reads the head of the
    /// due queue, not all of it (with 1,000 runs due, reading every one cost a worker ~12 ms of
    /// CPU per step). Entries a valid lease holds are passed over and do not count.
    pub(super) async fn due_runs(
        &self,
        deployment: &DeploymentId,
        now: Timestamp,
        want: usize,
        workers: &mut HashMap<String, Option<WorkerInfo>>,
    ) -> Result<Vec<Header>, StoreError> {
        let page = (want.div_ceil(self.shards.max(1) as usize) + 4).clamp(8, 1000) as i32;
        let hi = format!("{}$", enc_time(now.millis()));
        let mut shards = Vec::new();
        for shard in 0..self.shards {
            let mut cur = WakeShard {
                partition: format!("WAKE#{deployment}#{shard}"),
                buf: VecDeque::new(),
                next: Some(None),
            };
            self.read_wake_page(&mut cur, page, &hi).await?;
            shards.push(cur);
        }
        let mut out = Vec::new();
        while out.len() < want {
            let Some(at) = shards
                .iter()
                .enumerate()
                .filter_map(|(i, c)| c.buf.front().map(|(sk, _)| (sk, i)))
                .min()
                .map(|(_, i)| i)
            else {
                break;
            };
            let cur = &mut shards[at];
            let (_, h) = cur.buf.pop_front().expect("the shard's head was just seen");
            if cur.buf.is_empty() {
                self.read_wake_page(cur, page, &hi).await?;
            }
            if self
                .claim_key(&h, now, workers)
                .await?
                .is_some_and(|k| k <= now.millis())
            {
                out.push(h);
            }
        }
        Ok(out)
    }

    /// Reads the next page of `limit` due entries (`g1sk` below `hi`) of `shard`, if it has one.
    async fn read_wake_page(
        &self,
        shard: &mut WakeShard,
        limit: i32,
        hi: &str,
    ) -> Result<(), StoreError> {
        let Some(start) = shard.next.take() else {
            return Ok(());
        };
        let (items, next) = self
            .query_page(
                Some("gsi1"),
                "#p = :p AND #s < :hi",
                &[("#p", "g1pk"), ("#s", "g1sk")],
                vec![(":p", s(shard.partition.as_str())), (":hi", s(hi))],
                limit,
                start,
            )
            .await?;
        for it in &items {
            let sk = get_s(it, "g1sk").unwrap_or_default().to_owned();
            shard.buf.push_back((sk, Header::from_item(it)?));
        }
        shard.next = next.map(Some);
        Ok(())
    }
}

/// One wake shard's read position in a claim: the due entries read and not yet taken, in key
/// order, and where its next page starts (`Some(None)`: at the start; `None`: read to its end).
struct WakeShard {
    partition: String,
    buf: VecDeque<(String, Header)>,
    next: Option<Option<Item>>,
}

/// [`JournalStore::register_worker`](eve_core::JournalStore::register_worker).
pub(super) async fn register_worker(
    store: &DynamoStore,
    worker: &WorkerId,
    deployment: &DeploymentId,
    ttl: Duration,
    now: Timestamp,
) -> Result<Lease, StoreError> {
    eve_core::store::check_worker_ids(worker, deployment)?;
    let expires_at = now.plus(ttl);
    for _ in 0..MAX_ROUNDS {
        let old = store.worker(worker.as_str()).await?;
        let epoch = old.as_ref().map_or(1, |o| o.epoch + 1);
        let item = worker_item(worker, deployment, epoch, expires_at.millis());
        let mut tx = Tx::new();
        match &old {
            None => tx.push(store.tx_put_new(item)?, Role::Worker),
            Some(o) => {
                tx.push(
                    store.tx_put(
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
                    tx.push(store.tx_put(it, None, &[], vec![])?, Role::Other);
                }
            }
        }
        let done = if tx.items.len() == 1 {
            store.transact_one(tx).await?
        } else {
            store.transact(tx).await?.is_ok()
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

/// [`JournalStore::heartbeat`](eve_core::JournalStore::heartbeat).
pub(super) async fn heartbeat(
    store: &DynamoStore,
    lease: &Lease,
    ttl: Duration,
    now: Timestamp,
) -> Result<Lease, StoreError> {
    let expires_at = now.plus(ttl);
    let req = store
        .client
        .update_item()
        .table_name(&store.table)
        .set_key(Some(key(worker_pk(lease.worker.as_str()), ONE)))
        // The lapse entry moves to the new expiry (and comes back if a claim dropped it
        // while the lease was expired).
        .update_expression("SET #exp = :x, #g4pk = :gp, #g4sk = :gs REMOVE #cln")
        .condition_expression("attribute_exists(#pk) AND #epoch = :e AND #ret = :f AND #dep = :d")
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
    match store
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
        Err(e) => Err(store.map("UpdateItem", e)),
    }
}

/// [`JournalStore::claim`](eve_core::JournalStore::claim).
pub(super) async fn claim(
    store: &DynamoStore,
    lease: &Lease,
    max: usize,
    now: Timestamp,
) -> Result<Vec<RunRecord>, StoreError> {
    let me = store.worker(lease.worker.as_str()).await?;
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
    // The head of the due queue: twice what is wanted, for the claims other workers win.
    for h in store
        .due_runs(&lease.deployment, now, max.saturating_mul(2), &mut workers)
        .await?
    {
        found.entry(h.rec.run_id.clone()).or_insert(h);
    }
    for h in store
        .orphans(&lease.deployment, now, &mut workers, true)
        .await?
    {
        found.insert(h.rec.run_id.clone(), h);
    }
    let mut ready = Vec::new();
    for h in found.into_values() {
        if let Some(at) = store.claim_key(&h, now, &mut workers).await? {
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
        if let Some(rec) = store.try_claim(h, lease, now, &mut workers).await? {
            out.push(rec);
        }
    }
    Ok(out)
}

/// [`JournalStore::release`](eve_core::JournalStore::release).
pub(super) async fn release(
    store: &DynamoStore,
    lease: &Lease,
    run: &RunId,
    processed_seq: u64,
    now: Timestamp,
) -> Result<(), StoreError> {
    for _ in 0..MAX_ROUNDS {
        let h = store.header(run).await?;
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
            nh.unproc_at = store.event_time(run, new_processed).await?;
        }
        nh.touch(now);
        let mut tx = Tx::new();
        tx.push(store.header_put(&nh, Some(h.ver))?, Role::Header);
        tx.push(
            store.tx_check(
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
        match store.transact(tx).await? {
            Ok(()) => {
                store.cache_put(&nh);
                return Ok(());
            }
            Err(roles) if roles.contains(&Role::Header) => continue,
            Err(_) => return Err(fenced(lease, run.as_str())),
        }
    }
    Err(contention("release"))
}

/// [`JournalStore::retire_worker`](eve_core::JournalStore::retire_worker).
pub(super) async fn retire_worker(
    store: &DynamoStore,
    lease: &Lease,
    now: Timestamp,
) -> Result<(), StoreError> {
    // The runs it still holds keep naming it: orphaned, they are claimable at once, found
    // through its lapse entry, which now sorts first.
    let req = store
        .client
        .update_item()
        .table_name(&store.table)
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
    match store
        .caller
        .call("UpdateItem", |_| false, || req.clone().send())
        .await
    {
        Ok(_) => Ok(()),
        Err(CallError::Service(e)) if e.is_conditional_check_failed_exception() => {
            Err(fenced(lease, ""))
        }
        Err(e) => Err(store.map("UpdateItem", e)),
    }
}

/// [`JournalStore::next_wake`](eve_core::JournalStore::next_wake).
pub(super) async fn next_wake(
    store: &DynamoStore,
    deployment: &DeploymentId,
    now: Timestamp,
) -> Result<Option<Timestamp>, StoreError> {
    let mut workers = HashMap::new();
    let mut best: Option<i64> = None;
    // Each wake shard in work order, up to its first run no valid lease holds: a later one
    // without an owner has no earlier key, and orphaned runs come from the lapse entries.
    for shard in 0..store.shards {
        let mut start = None;
        'shard: loop {
            let (items, next) = store
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
                if let Some(at) = store.claim_key(&h, now, &mut workers).await? {
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
    for h in store.orphans(deployment, now, &mut workers, false).await? {
        if let Some(at) = store.claim_key(&h, now, &mut workers).await? {
            best = Some(best.map_or(at, |b| b.min(at)));
        }
    }
    Ok(best.map(Timestamp))
}
