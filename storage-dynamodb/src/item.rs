//! Keys, attribute helpers and the run header's stored form.

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use eve_core::{RunId, RunRecord, RunStatus, StoreError, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

pub(crate) type Item = HashMap<String, AttributeValue>;

/// Sort key of the run header: after every `EV#` batch key.
pub(crate) const HDR_SK: &str = "EV~";
/// Sort key of single-item partitions.
pub(crate) const ONE: &str = "-";
/// Largest body kept inline in an item (the item limit is 400 KB, names included).
pub(crate) const INLINE_MAX: usize = 350_000;
/// Bytes per chunk item.
pub(crate) const CHUNK: usize = 350_000;

pub(crate) fn run_pk(run: &RunId) -> String {
    format!("RUN#{run}")
}
/// Sort key of a run's attribute item (in the run's partition, so a purge deletes it).
pub(crate) fn attr_sk(key: &str) -> String {
    format!("AT#{key}")
}
/// `gsi1` partition key of the runs whose attribute `key` has index value `value`
/// ([`eve_core::search::index_value`]); keys hold no `#`, so the pair is unambiguous.
pub(crate) fn attr_g1pk(key: &str, value: &str) -> String {
    format!("ATTR#{key}#{value}")
}
pub(crate) fn ev_sk(last_seq: u64) -> String {
    format!("EV#{last_seq:020}")
}
pub(crate) fn aid_sk(append_id: &str) -> String {
    format!("AID#{append_id}")
}
pub(crate) fn dedupe_sk(cmd: u64, key: &str) -> String {
    format!("HD#{cmd:020}#{key}")
}
/// Partition key of a keyed webhook delivery by token, kept after the run ended (the hook item
/// is gone then) so a retry is answered as a duplicate; the token's length keeps a `#` in a
/// token from making two pairs one key.
pub(crate) fn hook_key_pk(token: &str, key: &str) -> String {
    format!("HOOKKEY#{}#{token}#{key}", token.len())
}
pub(crate) fn idem_pk(key: &str) -> String {
    format!("IDEM#{key}")
}
pub(crate) fn hook_pk(token: &str) -> String {
    format!("HOOK#{token}")
}
pub(crate) fn req_pk(req: &str) -> String {
    format!("REQ#{req}")
}
pub(crate) fn sess_pk(session: &str) -> String {
    format!("SESS#{session}")
}
pub(crate) const SESS_CTR_SK: &str = "CTR";
/// A session's record (contract clause 10): `end` (ended at), `msgs` (next message seq).
pub(crate) const SESS_META_SK: &str = "META";
/// A session's run, written with the run: the end lists the session's runs consistently.
pub(crate) fn sess_run_sk(run: &RunId) -> String {
    format!("RUN#{run}")
}
/// A queued user message of a session.
pub(crate) fn msg_sk(seq: u64) -> String {
    format!("MSG#{seq:020}")
}
pub(crate) fn log_sk(last_seq: u64) -> String {
    format!("LOG#{last_seq:020}")
}
pub(crate) fn worker_pk(worker: &str) -> String {
    format!("WORKER#{worker}")
}
/// Sort key of a superseded epoch's lapse item, beside its worker item: the epoch and the time
/// (ms) it was superseded.
pub(crate) fn old_sk(epoch: u64, superseded_at: i64) -> String {
    format!("OLD#{epoch:020}#{}", enc_time(superseded_at))
}
/// Parses [`old_sk`] into the epoch and the time it was superseded.
pub(crate) fn parse_old_sk(sk: &str) -> Option<(u64, i64)> {
    let (epoch, at) = sk.strip_prefix("OLD#")?.split_once('#')?;
    Some((epoch.parse().ok()?, dec_time(at)?))
}
/// `gsi4` partition of a deployment's lapse entries (worker items and superseded epochs).
pub(crate) fn lapse_pk(deployment: &str) -> String {
    format!("LAPSE#{deployment}")
}
/// `gsi4` sort key of a lapse entry: from `lapse` (ms) on, the runs it names may be orphaned.
pub(crate) fn lapse_sk(lapse: i64, worker: &str) -> String {
    format!("{}#{worker}", enc_time(lapse))
}
/// `gsi4` partition of the running runs one epoch of a worker holds.
pub(crate) fn own_pk(worker: &str, epoch: u64) -> String {
    format!("OWN#{worker}#{epoch}")
}

/// A time as a sortable string: the sign bit flipped, zero-padded.
pub(crate) fn enc_time(t: i64) -> String {
    format!("{:020}", (t as u64) ^ (1u64 << 63))
}
/// Parses [`enc_time`].
pub(crate) fn dec_time(s: &str) -> Option<i64> {
    s.parse::<u64>().ok().map(|v| (v ^ (1u64 << 63)) as i64)
}

pub(crate) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}
pub(crate) fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}
pub(crate) fn b(v: Vec<u8>) -> AttributeValue {
    AttributeValue::B(Blob::new(v))
}

pub(crate) fn key(pk: impl Into<String>, sk: impl Into<String>) -> Item {
    HashMap::from([("pk".to_owned(), s(pk)), ("sk".to_owned(), s(sk))])
}

pub(crate) fn get_s<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    item.get(name)
        .and_then(|v| v.as_s().ok())
        .map(String::as_str)
}
pub(crate) fn get_n<T: std::str::FromStr>(item: &Item, name: &str) -> Option<T> {
    item.get(name)
        .and_then(|v| v.as_n().ok())
        .and_then(|v| v.parse().ok())
}
pub(crate) fn get_b<'a>(item: &'a Item, name: &str) -> Option<&'a [u8]> {
    item.get(name)
        .and_then(|v| v.as_b().ok())
        .map(|b| b.as_ref())
}

/// A pending request of a run, as the header tracks it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct PendingRef {
    pub(crate) cmd: u64,
    pub(crate) id: String,
}

/// The run header: the record plus what the store needs to apply effects without reading
/// other items. Stored as JSON in attribute `h`, beside `ver` and the GSI keys.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Header {
    pub(crate) rec: RunRecord,
    /// Bumped by every write; every write is conditioned on the version it read.
    #[serde(skip)]
    pub(crate) ver: u64,
    /// cmd → due time (ms).
    pub(crate) timers: BTreeMap<u64, i64>,
    /// Live hook tokens of the run.
    pub(crate) hooks: Vec<String>,
    /// Pending requests of the run.
    pub(crate) reqs: Vec<PendingRef>,
    /// The time of the event at `processed_seq`, when there is one.
    pub(crate) unproc_at: Option<i64>,
    /// A random id of the last claim, so a claimer recognises its own write after a lost answer
    /// even when a concurrent claim by the same lease would write an otherwise identical header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) claim_nonce: Option<String>,
}

impl Header {
    /// When the run next has work, leases aside (as MemoryStore's `work_at`).
    pub(crate) fn work_at(&self) -> Option<i64> {
        if self.rec.status != RunStatus::Running {
            return None;
        }
        let timer = self.timers.values().min().copied();
        match (self.unproc_at, timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The whole header item, GSI keys included.
    pub(crate) fn to_item(&self, wake_shards: u32) -> Item {
        let rec = &self.rec;
        let mut it = key(run_pk(&rec.run_id), HDR_SK);
        it.insert(
            "h".into(),
            s(serde_json::to_string(self).expect("a header always serializes")),
        );
        it.insert("ver".into(), n(self.ver));
        it.insert("next_seq".into(), n(rec.next_seq));
        let order = format!("{}#{}", enc_time(rec.created_at.millis()), rec.run_id);
        if let Some(at) = self.work_at() {
            it.insert(
                "g1pk".into(),
                s(format!(
                    "WAKE#{}#{}",
                    rec.deployment_id,
                    shard(&rec.run_id, wake_shards)
                )),
            );
            it.insert("g1sk".into(), s(format!("{}#{order}", enc_time(at))));
        }
        it.insert("g2pk".into(), s(format!("SRUNS#{}", rec.session_id)));
        it.insert("g2sk".into(), s(order.clone()));
        it.insert("g3pk".into(), s(format!("RUNS#{}", rec.status.as_str())));
        it.insert("g3sk".into(), s(order));
        // Only running runs: a blocked run is not claimable, and a delivery that makes it
        // running again gives it work (and rewrites this header).
        if let (Some((w, e)), RunStatus::Running) = (&rec.owner, rec.status) {
            it.insert("g4pk".into(), s(own_pk(w.as_str(), *e)));
            it.insert("g4sk".into(), s(rec.run_id.to_string()));
        }
        it
    }

    /// Decodes a header item (from the table or a GSI projecting it).
    pub(crate) fn from_item(item: &Item) -> Result<Self, StoreError> {
        let run = get_s(item, "pk")
            .and_then(|p| p.strip_prefix("RUN#"))
            .unwrap_or("?")
            .to_owned();
        let corrupt = |reason: String| StoreError::Corrupt {
            run: RunId::new(run.clone()),
            seq: 0,
            reason: format!("run header: {reason}"),
        };
        let json = get_s(item, "h").ok_or_else(|| corrupt("no attribute h".into()))?;
        let mut h: Header =
            serde_json::from_str(json).map_err(|e| corrupt(format!("undecodable: {e}")))?;
        h.ver = get_n(item, "ver").ok_or_else(|| corrupt("no attribute ver".into()))?;
        Ok(h)
    }

    pub(crate) fn touch(&mut self, now: Timestamp) {
        self.rec.updated_at = now;
    }
}

/// The wake-index shard of a run: a stable FNV-1a hash of its id.
pub(crate) fn shard(run: &RunId, shards: u32) -> u32 {
    let mut h: u64 = 0xcbf29ce484222325;
    for byte in run.as_str().bytes() {
        h ^= u64::from(byte);
        h = h.wrapping_mul(0x100000001b3);
    }
    (h % u64::from(shards.max(1))) as u32
}
