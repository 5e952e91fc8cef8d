//! API key records: what a store keeps of the credentials that open the HTTP surface.
//!
//! A store never sees a key's secret, only its hash (the server hashes, see `eve-server`); it
//! keeps one [`ApiKey`] per key (with its optional expiry and the sessions it is limited to),
//! finds it by hash, and marks it revoked. An answer link (`eve-server`'s `create_answer_link`)
//! is such a record too, of scope answer, limited to one [`request`](ApiKey::request).

use crate::error::StoreError;
use crate::ids::{RequestId, SessionId};
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};

/// What a key may do. Scopes are ordered: each includes everything the ones before it allow.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyScope {
    /// Read runs, journals, requests, tasks and the session channel.
    Read,
    /// Also answer input requests.
    Answer,
    /// Also start calls, cancel tasks and resume hooks.
    Operate,
    /// Also create, list and revoke keys.
    Admin,
}

impl KeyScope {
    /// Every scope, least to most.
    pub const ALL: [KeyScope; 4] = [
        KeyScope::Read,
        KeyScope::Answer,
        KeyScope::Operate,
        KeyScope::Admin,
    ];

    /// The lowercase name, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyScope::Read => "read",
            KeyScope::Answer => "answer",
            KeyScope::Operate => "operate",
            KeyScope::Admin => "admin",
        }
    }

    /// Parses [`KeyScope::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Whether a key of this scope may do what `needed` allows.
    pub fn allows(self, needed: KeyScope) -> bool {
        self >= needed
    }
}

impl std::fmt::Display for KeyScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stored API key: everything but its secret.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKey {
    /// Unique, shown in listings and part of the key's text; names the key for revocation.
    pub id: String,
    /// What a person called it.
    pub name: String,
    /// What it may do.
    pub scope: KeyScope,
    /// The lowercase hex SHA-256 of the key's text; unique store-wide. Never shown.
    #[serde(skip_serializing)]
    pub hash: String,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it was revoked; a revoked key opens nothing.
    pub revoked_at: Option<Timestamp>,
    /// When it expires (`None`: never); from then on it opens nothing, as if revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
    /// The sessions it is limited to (`None`: every session; never an empty list). A limited
    /// key acts only on runs, requests and tasks of these sessions, within its scope; records
    /// written before limits existed read as `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<String>>))]
    pub sessions: Option<Vec<SessionId>>,
    /// The one request it answers, for an answer link (`None` for an API key). A link opens
    /// only that request's page and answer, never another route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub request: Option<RequestId>,
}

impl ApiKey {
    /// Checks the contract's rules for a new key: non-empty id, name and hash, not revoked.
    ///
    /// # Errors
    /// `InvalidInput` saying which field.
    pub fn validate(&self) -> Result<(), StoreError> {
        for (what, v) in [
            ("key id", &self.id),
            ("key name", &self.name),
            ("key hash", &self.hash),
        ] {
            if v.is_empty() {
                return Err(StoreError::InvalidInput(format!(
                    "{what} must not be empty"
                )));
            }
        }
        if self.revoked_at.is_some() {
            return Err(StoreError::InvalidInput(
                "a new key cannot be revoked already; create it, then revoke it".into(),
            ));
        }
        if let Some(sessions) = &self.sessions {
            if sessions.is_empty() {
                return Err(StoreError::InvalidInput(
                    "a key limited to no session would open nothing; name at least one session, or none for every session".into(),
                ));
            }
            for s in sessions {
                crate::check_client_id("key session", s.as_str())?;
            }
        }
        if let Some(r) = &self.request {
            if r.as_str().is_empty() {
                return Err(StoreError::InvalidInput(
                    "an answer link's request must not be empty".into(),
                ));
            }
            if self.scope != KeyScope::Answer {
                return Err(StoreError::InvalidInput(
                    "an answer link has scope answer; mint it with create_answer_link".into(),
                ));
            }
        }
        if self.expires_at.is_some_and(|t| t <= self.created_at) {
            return Err(StoreError::InvalidInput(
                "a new key cannot expire before it is created; give a later expiry".into(),
            ));
        }
        Ok(())
    }

    /// Whether it opens anything at `now`: neither revoked nor expired.
    pub fn is_active(&self, now: Timestamp) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|t| now < t)
    }

    /// Whether it may act in `session`: it is limited to no sessions, or to some including
    /// this one.
    pub fn allows_session(&self, session: &SessionId) -> bool {
        self.sessions.as_ref().is_none_or(|s| s.contains(session))
    }

    /// Whether it is limited to sessions (see [`ApiKey::sessions`]).
    pub fn is_limited(&self) -> bool {
        self.sessions.is_some()
    }

    /// The `AlreadyExists` answer for a key whose id or hash is taken.
    pub fn exists(&self) -> StoreError {
        StoreError::AlreadyExists {
            what: "api key",
            id: self.id.clone(),
            hint: "key ids and hashes are unique; generate a new key",
        }
    }
}
