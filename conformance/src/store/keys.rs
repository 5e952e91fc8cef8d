//! Guarantee 8: API keys — unique ids and hashes, lookup by hash, revocation once, listing,
//! expiry, session limits and answer links, and persistence across handles.

use crate::fixtures::*;
use crate::{assert_err, StoreFactory};
use eve_core::{ApiKey, KeyScope, RequestId, SessionId, StoreError, Timestamp};

fn key(id: &str, scope: KeyScope, created: Timestamp) -> ApiKey {
    ApiKey {
        id: id.to_owned(),
        name: format!("name of {id}"),
        scope,
        hash: format!("hash-of-{id}"),
        created_at: created,
        revoked_at: None,
        expires_at: None,
        sessions: None,
        request: None,
    }
}

/// Keys are stored as given, found by hash (an unknown hash is `None`), listed oldest first
/// (ties by id); a taken id or hash is `AlreadyExists`; empty fields and a revoked new key are
/// `InvalidInput`.
pub async fn keys_create_find_list(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let store = &*s.store;
    assert!(
        store.list_keys().await.expect("list_keys").is_empty(),
        "a fresh store has no keys"
    );
    let a = key(&unique("ka"), KeyScope::Admin, at(20));
    let b = key(&unique("kb"), KeyScope::Read, at(10));
    // Created at the same time as a, sorting after it by id.
    let c = key(&format!("{}~", a.id), KeyScope::Answer, at(20));
    for k in [&a, &b, &c] {
        store.create_key(k.clone()).await.expect("create_key");
    }
    let found = store.key_by_hash(&b.hash).await.expect("key_by_hash");
    assert_eq!(
        found.as_ref(),
        Some(&b),
        "a key is found by its hash, as stored"
    );
    assert_eq!(
        store
            .key_by_hash(&"f".repeat(64))
            .await
            .expect("key_by_hash"),
        None,
        "an unknown hash finds nothing"
    );
    let ids: Vec<String> = store
        .list_keys()
        .await
        .expect("list_keys")
        .into_iter()
        .map(|k| k.id)
        .collect();
    assert_eq!(
        ids,
        vec![b.id.clone(), a.id.clone(), c.id.clone()],
        "keys are listed by creation time, then id"
    );
    let mut same_id = key(&a.id, KeyScope::Read, at(30));
    same_id.hash = "e".repeat(64);
    assert_err!(
        store.create_key(same_id).await,
        StoreError::AlreadyExists { .. },
        "a key id reused"
    );
    let mut same_hash = key(&unique("kd"), KeyScope::Read, at(30));
    same_hash.hash = a.hash.clone();
    assert_err!(
        store.create_key(same_hash.clone()).await,
        StoreError::AlreadyExists { .. },
        "a key hash reused"
    );
    assert_eq!(
        store.list_keys().await.expect("list_keys").len(),
        3,
        "refused keys leave nothing behind"
    );
    for bad in [
        ApiKey {
            id: String::new(),
            ..key("x", KeyScope::Read, at(0))
        },
        ApiKey {
            name: String::new(),
            ..key(&unique("ke"), KeyScope::Read, at(0))
        },
        ApiKey {
            hash: String::new(),
            ..key(&unique("kf"), KeyScope::Read, at(0))
        },
        ApiKey {
            revoked_at: Some(at(0)),
            ..key(&unique("kg"), KeyScope::Read, at(0))
        },
        ApiKey {
            expires_at: Some(at(3)),
            ..key(&unique("kh"), KeyScope::Read, at(3))
        },
    ] {
        assert_err!(
            store.create_key(bad.clone()).await,
            StoreError::InvalidInput(_),
            "an invalid new key {bad:?}"
        );
    }
}

/// Revocation marks the key once (the first time stays), is seen by lookups and listings, and
/// survives a reopen; an unknown id is `NotFound`.
pub async fn keys_revoke_once_and_persist(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let store = &*s.store;
    let k = key(&unique("kr"), KeyScope::Operate, at(0));
    let other = key(&unique("ko"), KeyScope::Read, at(1));
    store.create_key(k.clone()).await.expect("create_key");
    store.create_key(other.clone()).await.expect("create_key");
    let revoked = store.revoke_key(&k.id, at(5)).await.expect("revoke_key");
    assert_eq!(
        revoked.revoked_at,
        Some(at(5)),
        "revoke_key returns the revoked record"
    );
    let again = store.revoke_key(&k.id, at(9)).await.expect("revoke again");
    assert_eq!(
        again.revoked_at,
        Some(at(5)),
        "revoking twice keeps the first revocation time"
    );
    assert_eq!(
        store
            .key_by_hash(&k.hash)
            .await
            .expect("key_by_hash")
            .and_then(|k| k.revoked_at),
        Some(at(5)),
        "a lookup sees the revocation"
    );
    assert_eq!(
        store
            .key_by_hash(&other.hash)
            .await
            .expect("key_by_hash")
            .and_then(|k| k.revoked_at),
        None,
        "revoking one key leaves the others alone"
    );
    assert_err!(
        store.revoke_key("no-such-key", at(5)).await,
        StoreError::NotFound { .. },
        "revoking an unknown key"
    );
    let Some(reopened) = factory.open(&s.location).await.expect("open") else {
        crate::__private::skipped(
            "keys::keys_revoke_once_and_persist (reopen)",
            "the backend is not persistent",
        );
        return;
    };
    let listed = reopened.list_keys().await.expect("list_keys after reopen");
    assert_eq!(
        listed,
        vec![revoked, other],
        "keys and revocations survive a reopen"
    );
}

/// A key's expiry is stored and returned as given (lookup, listing, revocation, a reopen); a
/// key without one never expires. The store keeps expired keys: refusing them is the caller's
/// check ([`ApiKey::is_active`]).
pub async fn keys_keep_their_expiry(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let store = &*s.store;
    let expiring = ApiKey {
        expires_at: Some(at(1_000)),
        ..key(&unique("kx"), KeyScope::Answer, at(10))
    };
    let forever = key(&unique("kn"), KeyScope::Read, at(20));
    store
        .create_key(expiring.clone())
        .await
        .expect("create_key");
    store.create_key(forever.clone()).await.expect("create_key");
    let found = store
        .key_by_hash(&expiring.hash)
        .await
        .expect("key_by_hash")
        .expect("the key is found");
    assert_eq!(found, expiring, "a key is found with its expiry, as stored");
    assert!(found.is_active(at(999)) && !found.is_active(at(1_000)));
    assert_eq!(
        store.list_keys().await.expect("list_keys"),
        vec![expiring.clone(), forever.clone()],
        "listed with and without an expiry"
    );
    let revoked = store
        .revoke_key(&expiring.id, at(50))
        .await
        .expect("revoke_key");
    assert_eq!(
        (revoked.expires_at, revoked.revoked_at),
        (Some(at(1_000)), Some(at(50))),
        "revocation keeps the expiry"
    );
    let Some(reopened) = factory.open(&s.location).await.expect("open") else {
        crate::__private::skipped(
            "keys::keys_keep_their_expiry (reopen)",
            "the backend is not persistent",
        );
        return;
    };
    assert_eq!(
        reopened.list_keys().await.expect("list_keys after reopen"),
        vec![revoked, forever],
        "expiries survive a reopen"
    );
}

/// A key's session limit and an answer link's request are stored and returned as given
/// (lookup, listing, revocation, a reopen); a key without them is unlimited. An empty session
/// list, and a link of another scope than answer, are `InvalidInput`.
pub async fn keys_keep_their_limits(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let store = &*s.store;
    let limited = ApiKey {
        sessions: Some(vec![SessionId::new("sess-a"), SessionId::new("sess b:2")]),
        ..key(&unique("kl"), KeyScope::Operate, at(10))
    };
    let link = ApiKey {
        sessions: Some(vec![SessionId::new("sess-a")]),
        request: Some(RequestId::new("run-1:3")),
        expires_at: Some(at(5_000)),
        ..key(&unique("kq"), KeyScope::Answer, at(20))
    };
    let open = key(&unique("ko"), KeyScope::Answer, at(30));
    for k in [&limited, &link, &open] {
        store.create_key(k.clone()).await.expect("create_key");
    }
    let found = store
        .key_by_hash(&limited.hash)
        .await
        .expect("key_by_hash")
        .expect("the key is found");
    assert_eq!(
        found, limited,
        "a key is found with its sessions, as stored"
    );
    assert!(found.allows_session(&SessionId::new("sess b:2")));
    assert!(!found.allows_session(&SessionId::new("sess-c")));
    let found = store
        .key_by_hash(&link.hash)
        .await
        .expect("key_by_hash")
        .expect("the link is found");
    assert_eq!(found, link, "a link is found with its request, as stored");
    let found = store
        .key_by_hash(&open.hash)
        .await
        .expect("key_by_hash")
        .expect("the key is found");
    assert_eq!((found.sessions, found.request), (None, None), "unlimited");
    let revoked = store
        .revoke_key(&link.id, at(50))
        .await
        .expect("revoke_key");
    assert_eq!(
        (&revoked.sessions, &revoked.request),
        (&link.sessions, &link.request),
        "revocation keeps the limits"
    );
    for bad in [
        ApiKey {
            sessions: Some(Vec::new()),
            ..key(&unique("km"), KeyScope::Read, at(0))
        },
        ApiKey {
            request: Some(RequestId::new("run-1:3")),
            ..key(&unique("kp"), KeyScope::Operate, at(0))
        },
    ] {
        assert_err!(
            store.create_key(bad.clone()).await,
            StoreError::InvalidInput(_),
            "an invalid new key {bad:?}"
        );
    }
    let listed = vec![limited, revoked, open];
    assert_eq!(
        store.list_keys().await.expect("list_keys"),
        listed,
        "listed with their limits"
    );
    let Some(reopened) = factory.open(&s.location).await.expect("open") else {
        crate::__private::skipped(
            "keys::keys_keep_their_limits (reopen)",
            "the backend is not persistent",
        );
        return;
    };
    assert_eq!(
        reopened.list_keys().await.expect("list_keys after reopen"),
        listed,
        "limits survive a reopen"
    );
}
