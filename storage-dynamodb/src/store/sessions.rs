//! Session logs (the per-session counter and `read_session`) and the session records of
//! contract clause 10: ends, the session's list of runs, queued messages.

use super::tx::{Role, Tx};
use super::{contention, corrupt, DynamoStore, MAX_ROUNDS};
use crate::item::*;
use eve_core::store::{check_message, check_session_id};
use eve_core::{
    Payload, QueuedMessage, RunId, SessionEnd, SessionEntry, SessionId, SessionRecord, StoreError,
    Timestamp,
};

impl DynamoStore {
    /// The session log's next seq (0 when the session has none).
    pub(super) async fn session_next(
        &self,
        session: &SessionId,
    ) -> Result<Option<u64>, StoreError> {
        Ok(self
            .get(sess_pk(session.as_str()), SESS_CTR_SK)
            .await?
            .and_then(|it| get_n(&it, "next")))
    }
}

/// [`JournalStore::read_session`](eve_core::JournalStore::read_session).
pub(super) async fn read_session(
    store: &DynamoStore,
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
        let (items, next) = store
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
            let body = store
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

/// A queued message item's body as a [`QueuedMessage`].
async fn message(
    store: &DynamoStore,
    session: &SessionId,
    spk: &str,
    it: &Item,
) -> Result<QueuedMessage, StoreError> {
    let seq: u64 = get_n(it, "seq").unwrap_or(0);
    let bad = |why: String| {
        corrupt(
            &RunId::new(format!("session {session}")),
            seq,
            format!("queued message: {why}"),
        )
    };
    let body = store.read_blob(it, spk, "").await?.map_err(bad)?;
    let json = String::from_utf8(body).map_err(|e| bad(e.to_string()))?;
    Ok(QueuedMessage {
        session_id: session.clone(),
        seq,
        at: Timestamp(get_n(it, "at").unwrap_or(0)),
        message: Payload::from_json(json).map_err(|e| bad(e.to_string()))?,
    })
}

/// The session's queued message items, oldest first (strongly consistent).
async fn queued_items(store: &DynamoStore, spk: &str) -> Result<Vec<Item>, StoreError> {
    store
        .query_all(
            None,
            "#pk = :pk AND begins_with(#sk, :pre)",
            &[("#pk", "pk"), ("#sk", "sk")],
            vec![(":pk", s(spk)), (":pre", s("MSG#"))],
        )
        .await
}

/// [`JournalStore::end_session`](eve_core::JournalStore::end_session): sets `end` on the
/// session's record once, then lists the session's runs (each start wrote its entry in the
/// transaction that checked the record, so every start that was not refused is listed) and
/// keeps those whose header says they have not ended.
pub(super) async fn end_session(
    store: &DynamoStore,
    session: &SessionId,
    now: Timestamp,
) -> Result<SessionEnd, StoreError> {
    check_session_id(session)?;
    let spk = sess_pk(session.as_str());
    let mut tx = Tx::new();
    tx.push(
        store.tx_update(
            key(&spk, SESS_META_SK),
            "SET #end = if_not_exists(#end, :now)",
            None,
            &[("#end", "end")],
            vec![(":now", n(now.millis()))],
        )?,
        Role::Session,
    );
    if let Err(roles) = store.transact(tx).await? {
        return Err(StoreError::Other {
            backend: crate::client::BACKEND,
            source: format!("ending a session failed a condition it does not have: {roles:?}")
                .into(),
        });
    }
    let meta = store.get(spk.clone(), SESS_META_SK).await?;
    let ended_at = meta
        .as_ref()
        .and_then(|m| get_n::<i64>(m, "end"))
        .unwrap_or(now.millis());
    let mut runs: Vec<(i64, RunId)> = store
        .query_all(
            None,
            "#pk = :pk AND begins_with(#sk, :pre)",
            &[("#pk", "pk"), ("#sk", "sk")],
            vec![(":pk", s(spk.clone())), (":pre", s("RUN#"))],
        )
        .await?
        .iter()
        .filter_map(|it| {
            let run = get_s(it, "sk")?.strip_prefix("RUN#")?;
            Some((get_n(it, "cat").unwrap_or(0), RunId::new(run)))
        })
        .collect();
    runs.sort();
    let mut live = Vec::new();
    for (_, run) in runs {
        match store.header(&run).await {
            Ok(h) if !h.rec.status.is_terminal() => live.push(run),
            Ok(_) => {}
            // Purged (it had ended), or a start refused after its entry was written.
            Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(SessionEnd {
        ended_at: Timestamp(ended_at),
        live,
    })
}

/// [`JournalStore::get_session`](eve_core::JournalStore::get_session).
pub(super) async fn get_session(
    store: &DynamoStore,
    session: &SessionId,
) -> Result<SessionRecord, StoreError> {
    check_session_id(session)?;
    let spk = sess_pk(session.as_str());
    let meta = store.get(spk.clone(), SESS_META_SK).await?;
    let mut queued = Vec::new();
    for it in queued_items(store, &spk).await? {
        queued.push(message(store, session, &spk, &it).await?);
    }
    Ok(SessionRecord {
        session_id: session.clone(),
        ended_at: meta
            .as_ref()
            .and_then(|m| get_n::<i64>(m, "end"))
            .map(Timestamp),
        queued,
    })
}

/// [`JournalStore::queue_message`](eve_core::JournalStore::queue_message): one transaction
/// moves the record's counter from the value read (only while the session has not ended) and
/// puts the message at that seq; a lost race reads again.
pub(super) async fn queue_message(
    store: &DynamoStore,
    session: &SessionId,
    payload: Payload,
    now: Timestamp,
) -> Result<QueuedMessage, StoreError> {
    check_message(session, &payload)?;
    let spk = sess_pk(session.as_str());
    let ended = || StoreError::SessionEnded {
        session: session.clone(),
    };
    for _ in 0..MAX_ROUNDS {
        let meta = store.get(spk.clone(), SESS_META_SK).await?;
        if meta.as_ref().is_some_and(|m| m.contains_key("end")) {
            return Err(ended());
        }
        let seq: u64 = meta.as_ref().and_then(|m| get_n(m, "msgs")).unwrap_or(0);
        let mut tx = Tx::new();
        tx.push(
            store.tx_update(
                key(&spk, SESS_META_SK),
                "SET #m = :next",
                Some("attribute_not_exists(#end) AND (attribute_not_exists(#m) OR #m = :seq)"),
                &[("#m", "msgs"), ("#end", "end")],
                vec![(":next", n(seq + 1)), (":seq", n(seq))],
            )?,
            Role::Session,
        );
        let mut it = key(&spk, msg_sk(seq));
        it.insert("seq".into(), n(seq));
        it.insert("at".into(), n(now.millis()));
        it.extend(tx.blob(&spk, "", payload.get().as_bytes().to_vec()));
        tx.push(store.tx_put_new(it)?, Role::Other);
        if store.transact(tx).await?.is_ok() {
            return Ok(QueuedMessage {
                session_id: session.clone(),
                seq,
                at: now,
                message: payload,
            });
        }
    }
    Err(contention("queue_message"))
}

/// [`JournalStore::take_messages`](eve_core::JournalStore::take_messages): deletes the queued
/// items in transactions of at most [`TAKE_BATCH`], each conditioned on every item still
/// existing; when another taker got some first, the ones still there are tried again. A message
/// is returned only by the transaction that deleted it.
pub(super) async fn take_messages(
    store: &DynamoStore,
    session: &SessionId,
) -> Result<Vec<QueuedMessage>, StoreError> {
    check_session_id(session)?;
    let spk = sess_pk(session.as_str());
    let mut taken = Vec::new();
    let mut chunks = Vec::new();
    let items = queued_items(store, &spk).await?;
    for batch in items.chunks(TAKE_BATCH) {
        let mut batch: Vec<Item> = batch.to_vec();
        for _ in 0..MAX_ROUNDS {
            if batch.is_empty() {
                break;
            }
            let mut tx = Tx::new();
            for it in &batch {
                let sk = get_s(it, "sk").unwrap_or_default().to_owned();
                tx.push(store.tx_delete_existing(key(&spk, sk))?, Role::Other);
            }
            if store.transact(tx).await?.is_ok() {
                for it in &batch {
                    taken.push(message(store, session, &spk, it).await?);
                    if let Some(nonce) = get_s(it, "ck") {
                        chunks.extend(store.chunk_keys(&spk, nonce).await?);
                    }
                }
                break;
            }
            // Another taker deleted some: keep the ones still queued.
            let mut still = Vec::new();
            for it in batch {
                let sk = get_s(&it, "sk").unwrap_or_default().to_owned();
                if store.get(spk.clone(), &sk).await?.is_some() {
                    still.push(it);
                }
            }
            batch = still;
        }
    }
    if !chunks.is_empty() {
        store.delete_items(chunks).await?;
    }
    Ok(taken)
}

/// Messages one take transaction deletes at most (DynamoDB allows 100 items a transaction).
const TAKE_BATCH: usize = 50;
