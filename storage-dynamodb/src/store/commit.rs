//! The commit protocol: the shared write path that turns events and their effects into one
//! transaction on a header read (`prepare`), deliveries' commit (`deliver`), and the contract's
//! `create_run` and `append`.

use super::tx::{Role, Tx};
use super::{contention, fenced, hook_exists, DynamoStore, MAX_ROUNDS};
use crate::item::*;
use aws_sdk_dynamodb::types::TransactWriteItem;
use eve_core::codec::{encode_batch, FORMAT_VERSION};
use eve_core::{
    check_limits, Append, Appended, CreatedRun, Effects, Event, InputRequest, InputResponse,
    JournalStore, Lease, NewRun, RequestId, RunId, SessionEntry, StoreError, Timestamp,
};

impl DynamoStore {
    /// Builds the transaction writing `events` at the run's next seq with their effects, from
    /// header `h` as read. Returns the new header (not yet in the transaction: the caller adds
    /// it, after adjusting it), the transaction, and the first and next seq.
    pub(super) fn prepare(
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
        eve_core::search::apply_patch(&mut nh.rec.attributes, &fx.attributes);

        let mut tx = Tx::new();
        // Attributes: one item per key in the run's partition, on gsi1 under (key, value).
        let changed: std::collections::BTreeSet<&str> =
            fx.attributes.iter().map(|(k, _)| k.as_str()).collect();
        for k in changed {
            let ak = key(&pk, attr_sk(k));
            match nh.rec.attributes.get(k) {
                Some(v) => {
                    let mut it = ak;
                    it.insert("run".into(), s(run.as_str()));
                    it.insert(
                        "g1pk".into(),
                        s(attr_g1pk(k, &eve_core::search::index_value(v))),
                    );
                    it.insert("g1sk".into(), s(run.as_str()));
                    tx.push(self.tx_put(it, None, &[], vec![])?, Role::Other);
                }
                None => tx.push(self.tx_delete(ak)?, Role::Other),
            }
        }
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
    pub(super) async fn deliver(
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

    pub(super) async fn session_next_if_needed(
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

    pub(super) async fn append_done(
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
}

/// [`JournalStore::create_run`].
pub(super) async fn create_run(
    store: &DynamoStore,
    new: NewRun,
    lease: Option<&Lease>,
    now: Timestamp,
) -> Result<CreatedRun, StoreError> {
    new.validate()?;
    let key_s = new.key();
    // Eager start: the new run names the lease as its owner when the lease is valid now. A
    // lease that lapses between this read and the commit only leaves the run orphaned, which
    // makes it claimable at once (contract clause 5), as a lapse after the commit would.
    let owner = match lease {
        Some(l) => store
            .worker(l.worker.as_str())
            .await?
            .filter(|w| w.valid(l.epoch, now))
            .map(|_| (l.worker.clone(), l.epoch)),
        None => None,
    };
    for _ in 0..MAX_ROUNDS {
        let mut record = new.record(now);
        if owner.is_some() {
            record.owner = owner.clone();
            record.activations = 1;
        }
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
        tx.push(store.tx_put_new(idem)?, Role::Idem);
        tx.push(store.header_put(&h, None)?, Role::Header);
        let mut ev = key(&pk, ev_sk(0));
        ev.insert("f".into(), n(0));
        ev.insert("n".into(), n(1));
        ev.insert("v".into(), n(FORMAT_VERSION));
        ev.insert("at".into(), n(now.millis()));
        let body = encode_batch(std::slice::from_ref(&new.started_event()))?;
        ev.extend(tx.blob(&pk, "", body));
        tx.push(store.tx_put_new(ev)?, Role::Other);
        // Contract clause 10: the session has not ended (an end updates this item, so the two
        // serialize), and the run is listed under its session for the end's consistent query.
        let spk = sess_pk(new.session_id.as_str());
        tx.push(
            store.tx_check(
                key(&spk, SESS_META_SK),
                "attribute_not_exists(#end)",
                &[("#end", "end")],
                vec![],
            )?,
            Role::Session,
        );
        let mut listed = key(&spk, sess_run_sk(&new.run_id));
        listed.insert("cat".into(), n(now.millis()));
        tx.push(store.tx_put(listed, None, &[], vec![])?, Role::Other);
        match store.transact(tx).await? {
            Ok(()) => {
                store.cache_put(&h);
                return Ok(CreatedRun {
                    run: record,
                    created: true,
                });
            }
            Err(roles) if roles.contains(&Role::Idem) => {
                let Some(it) = store.get(idem_pk(&key_s), ONE).await? else {
                    continue;
                };
                let existing = RunId::new(get_s(&it, "run").unwrap_or(""));
                let started = store.read(&existing, 0, 1).await?;
                if !started.first().is_some_and(|e| new.matches(&e.event)) {
                    return Err(StoreError::IdempotencyMismatch {
                        key: key_s,
                        existing,
                    });
                }
                return Ok(CreatedRun {
                    run: store.header(&existing).await?.rec,
                    created: false,
                });
            }
            Err(roles) if roles.contains(&Role::Session) => {
                return Err(StoreError::SessionEnded {
                    session: new.session_id,
                })
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

/// [`JournalStore::append`].
pub(super) async fn append(store: &DynamoStore, a: Append) -> Result<Appended, StoreError> {
    check_limits(&a.events)?;
    if a.events
        .iter()
        .any(|e| matches!(e, Event::RunStarted { .. }))
    {
        return Err(StoreError::InvalidInput(
            "RunStarted is written by create_run, never appended".into(),
        ));
    }
    let mut cached = store.cache_get(&a.run);
    for _ in 0..MAX_ROUNDS {
        let (h, fresh) = match cached.take() {
            Some(h) => (h, false),
            None => (store.header(&a.run).await?, true),
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
            if let Some(done) = store.append_done(&a.run, a.append_id.as_str()).await? {
                return Ok(done);
            }
            return Err(err);
        }
        let sn = store.session_next_if_needed(&h, &a.events).await?;
        let (mut nh, mut tx, first, next) = match store.prepare(&h, &a.events, a.now, None, sn) {
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
            store.tx_put(
                nh.to_item(store.shards),
                Some("#ver = :ver AND #ns = :exp"),
                &[("#ver", "ver"), ("#ns", "next_seq")],
                vec![(":ver", n(h.ver)), (":exp", n(a.expected_seq))],
            )?,
        );
        tx.roles.insert(0, Role::Header);
        tx.push(
            store.tx_check(
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
        tx.push(store.tx_put_new(aid)?, Role::Other);
        match store.transact(tx).await? {
            Ok(()) => {
                store.cache_put(&nh);
                return Ok(Appended {
                    first_seq: first,
                    next_seq: next,
                    duplicate: false,
                });
            }
            Err(roles) => {
                store.cache_drop(&a.run);
                if roles.contains(&Role::Header) || roles.contains(&Role::Other) {
                    continue;
                }
                if let Some(done) = store.append_done(&a.run, a.append_id.as_str()).await? {
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
