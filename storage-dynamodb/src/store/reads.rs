//! Reads and queries: items and pages (strongly consistent on the table), bodies reassembled
//! from chunks, run headers, and the contract's reads (`read`, `get_run`, `list_runs`,
//! `pending_requests`).

use super::tx::{names, values};
use super::{corrupt, DynamoStore};
use crate::item::*;
use eve_core::codec::decode_batch;
use eve_core::{
    InputRequest, PendingRequest, RequestId, RunId, RunQuery, RunRecord, RunStatus, SessionId,
    StoreError, StoredEvent, Timestamp,
};

impl DynamoStore {
    pub(super) async fn get(&self, pk: String, sk: &str) -> Result<Option<Item>, StoreError> {
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
    pub(super) async fn query_page(
        &self,
        index: Option<&str>,
        cond: &str,
        nm: &[(&str, &str)],
        vals: Vec<(&str, aws_sdk_dynamodb::types::AttributeValue)>,
        limit: i32,
        start: Option<Item>,
    ) -> Result<(Vec<Item>, Option<Item>), StoreError> {
        let lagged = match (&self.index_lag, index) {
            (Some(lag), Some(index)) => {
                // The index as an earlier query of the same partition saw it, under this
                // query's upper bound: what became due since is missed, what changed since is
                // still listed.
                let val = |name: &str| vals.iter().find(|(k, _)| *k == name).map(|(_, v)| v);
                let query = format!("{index}|{:?}|{limit}|{start:?}", val(":p"));
                if let Some((mut items, next)) = lag.stale(&query) {
                    let hi = val(":hi").and_then(|v| v.as_s().ok());
                    let sk = nm.iter().find(|(k, _)| *k == "#s").map(|(_, v)| *v);
                    if let (Some(hi), Some(sk)) = (hi, sk) {
                        items.retain(|it| get_s(it, sk).is_some_and(|v| v < hi.as_str()));
                    }
                    return Ok((items, next));
                }
                Some((lag, query))
            }
            _ => None,
        };
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
        let answer = (out.items().to_vec(), out.last_evaluated_key().cloned());
        if let Some((lag, query)) = lagged {
            lag.fresh(query, answer.clone());
        }
        Ok(answer)
    }

    /// Every item of a query (all pages).
    pub(super) async fn query_all(
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
    pub(super) async fn read_blob(
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
    pub(super) async fn header(&self, run: &RunId) -> Result<Header, StoreError> {
        let item = self
            .get(run_pk(run), HDR_SK)
            .await?
            .ok_or_else(|| StoreError::not_found("run", run))?;
        let h = Header::from_item(&item)?;
        self.cache_put(&h);
        Ok(h)
    }

    /// The time stamped on the event at `seq` of `run`.
    pub(super) async fn event_time(
        &self,
        run: &RunId,
        seq: u64,
    ) -> Result<Option<i64>, StoreError> {
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

    /// Decodes an event batch item into the events at or after `from_seq`.
    pub(super) async fn decode_events(
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
}

/// [`JournalStore::read`](eve_core::JournalStore::read).
pub(super) async fn read(
    store: &DynamoStore,
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
        let (items, next) = store
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
                store
                    .decode_events(run, &pk, it, from_seq, &mut out)
                    .await?;
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

/// [`JournalStore::list_runs`](eve_core::JournalStore::list_runs).
pub(super) async fn list_runs(
    store: &DynamoStore,
    query: &RunQuery,
) -> Result<Vec<RunRecord>, StoreError> {
    let mut items = Vec::new();
    if let Some((k, v)) = &query.attribute {
        // The attribute index (gsi1, eventually consistent like the status listing), then
        // each matching run's header.
        let refs = store
            .query_all(
                Some("gsi1"),
                "#p = :p",
                &[("#p", "g1pk")],
                vec![(":p", s(attr_g1pk(k, &eve_core::search::index_value(v))))],
            )
            .await?;
        for r in refs {
            if let Some(run) = get_s(&r, "run") {
                if let Some(h) = store.get(run_pk(&RunId::new(run)), HDR_SK).await? {
                    items.push(h);
                }
            }
        }
    } else if let Some(session) = &query.session {
        items = store
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
                store
                    .query_all(
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

/// [`JournalStore::pending_requests`](eve_core::JournalStore::pending_requests).
pub(super) async fn pending_requests(
    store: &DynamoStore,
    session: &SessionId,
) -> Result<Vec<PendingRequest>, StoreError> {
    let items = store
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
        let body = store
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
