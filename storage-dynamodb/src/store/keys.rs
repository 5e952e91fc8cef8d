//! API keys (contract clause 8): one item per key in the `APIKEYS` partition (sk `KEY#{id}`) and
//! one `KEYHASH#{hash}` item naming the key's id, written together so ids and hashes stay
//! unique.

use super::tx::{names, values, Role, Tx};
use super::DynamoStore;
use crate::client::{CallError, BACKEND};
use crate::item::*;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use eve_core::{ApiKey, KeyScope, RequestId, SessionId, StoreError, Timestamp};

const KEYS_PK: &str = "APIKEYS";

fn key_sk(id: &str) -> String {
    format!("KEY#{id}")
}

fn hash_pk(hash: &str) -> String {
    format!("KEYHASH#{hash}")
}

fn from_item(it: &Item) -> Result<ApiKey, StoreError> {
    let bad = |what: &str| StoreError::Other {
        backend: BACKEND,
        source: format!("api key item without a valid {what}").into(),
    };
    Ok(ApiKey {
        id: get_s(it, "id").ok_or_else(|| bad("id"))?.to_owned(),
        name: get_s(it, "name").ok_or_else(|| bad("name"))?.to_owned(),
        scope: get_s(it, "scope")
            .and_then(KeyScope::parse)
            .ok_or_else(|| bad("scope"))?,
        hash: get_s(it, "hash").ok_or_else(|| bad("hash"))?.to_owned(),
        created_at: Timestamp(get_n(it, "cat").ok_or_else(|| bad("cat"))?),
        revoked_at: get_n(it, "rat").map(Timestamp),
        expires_at: get_n(it, "eat").map(Timestamp),
        sessions: match it.get("ses") {
            None => None,
            Some(AttributeValue::L(list)) => Some(
                list.iter()
                    .map(|v| v.as_s().map(|s| SessionId::new(s.as_str())))
                    .collect::<Result<_, _>>()
                    .map_err(|_| bad("ses"))?,
            ),
            Some(_) => return Err(bad("ses")),
        },
        request: get_s(it, "req").map(RequestId::new),
    })
}

impl DynamoStore {
    pub(super) async fn create_key(&self, k: ApiKey) -> Result<(), StoreError> {
        k.validate()?;
        let mut item = key(KEYS_PK, key_sk(&k.id));
        item.insert("id".into(), s(&k.id));
        item.insert("name".into(), s(&k.name));
        item.insert("scope".into(), s(k.scope.as_str()));
        item.insert("hash".into(), s(&k.hash));
        item.insert("cat".into(), n(k.created_at.0));
        if let Some(t) = k.expires_at {
            item.insert("eat".into(), n(t.0));
        }
        if let Some(sessions) = &k.sessions {
            // A list of strings, in the order given.
            let list = sessions.iter().map(|v| s(v.as_str())).collect();
            item.insert("ses".into(), AttributeValue::L(list));
        }
        if let Some(r) = &k.request {
            item.insert("req".into(), s(r.as_str()));
        }
        let mut by_hash = key(hash_pk(&k.hash), ONE);
        by_hash.insert("id".into(), s(&k.id));
        let mut tx = Tx::new();
        tx.push(self.tx_put_new(item)?, Role::Other);
        tx.push(self.tx_put_new(by_hash)?, Role::Other);
        match self.transact(tx).await? {
            Ok(()) => Ok(()),
            Err(_) => Err(k.exists()),
        }
    }

    pub(super) async fn list_keys(&self) -> Result<Vec<ApiKey>, StoreError> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let (items, next) = self
                .query_page(
                    None,
                    "#pk = :pk AND begins_with(#sk, :p)",
                    &[("#pk", "pk"), ("#sk", "sk")],
                    vec![(":pk", s(KEYS_PK)), (":p", s("KEY#"))],
                    1000,
                    start,
                )
                .await?;
            for it in &items {
                out.push(from_item(it)?);
            }
            match next {
                Some(k) => start = Some(k),
                None => break,
            }
        }
        out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(out)
    }

    pub(super) async fn revoke_key(&self, id: &str, now: Timestamp) -> Result<ApiKey, StoreError> {
        let req = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(KEYS_PK, key_sk(id))))
            .update_expression("SET #rat = if_not_exists(#rat, :now)")
            .condition_expression("attribute_exists(#pk)")
            .set_expression_attribute_names(names(&[("#rat", "rat"), ("#pk", "pk")]))
            .set_expression_attribute_values(values(vec![(":now", n(now.0))]))
            .return_values(ReturnValue::AllNew);
        match self
            .caller
            .call("UpdateItem", |_| false, || req.clone().send())
            .await
        {
            Ok(out) => from_item(out.attributes().ok_or_else(|| StoreError::Other {
                backend: BACKEND,
                source: "UpdateItem returned no attributes".into(),
            })?),
            Err(CallError::Service(e)) if e.is_conditional_check_failed_exception() => {
                Err(StoreError::not_found("api key", id))
            }
            Err(e) => Err(self.map("UpdateItem", e)),
        }
    }

    pub(super) async fn key_by_hash(&self, hash: &str) -> Result<Option<ApiKey>, StoreError> {
        let Some(it) = self.get(hash_pk(hash), ONE).await? else {
            return Ok(None);
        };
        let Some(id) = get_s(&it, "id") else {
            return Ok(None);
        };
        self.get(KEYS_PK.to_owned(), &key_sk(id))
            .await?
            .as_ref()
            .map(from_item)
            .transpose()
    }
}
