//! Identifiers. All are opaque strings; constructors reject empty ones where the contract needs a
//! non-empty key.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wraps a string as this id. No validation: stores check what their contract needs.
            pub fn new(s: impl Into<String>) -> Self {
                Self(s.into())
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s)
            }
        }
    };
}

string_id!(
    /// One workflow run: one call of a workflow tool.
    RunId
);
string_id!(
    /// The agent conversation a tool call belongs to.
    SessionId
);
string_id!(
    /// The model's tool call id within a session.
    CallId
);
string_id!(
    /// A user-supplied, stable version string; runs are pinned to the deployment that started them.
    DeploymentId
);
string_id!(
    /// A workflow's identity: its module path and function name.
    WorkflowId
);
string_id!(
    /// An input request made by `ctx.ask`; unique across the store.
    RequestId
);
string_id!(
    /// A worker process (or task) that claims runs.
    WorkerId
);
string_id!(
    /// Identifies one append attempt, so a retry of an append that did land is recognised.
    AppendId
);

impl RunId {
    /// A fresh random run id.
    pub fn random() -> Self {
        Self(format!("run_{}", uuid::Uuid::new_v4().simple()))
    }
}

impl AppendId {
    /// A fresh unique append id. Time-ordered (a UUID v7: milliseconds, then random bits), so a
    /// run's appends land at the end of a store's `(run, append id)` index rather than at random
    /// places in it: an index that outgrows the cache then costs no random page reads or writes
    /// per append.
    pub fn random() -> Self {
        Self(uuid::Uuid::now_v7().simple().to_string())
    }
}

impl WorkerId {
    /// A fresh random worker id.
    pub fn random() -> Self {
        Self(format!("worker_{}", uuid::Uuid::new_v4().simple()))
    }
}

impl RequestId {
    /// The request id of the `ask` issued at command `cmd` of `run`: deterministic, so replay
    /// re-derives the same id.
    pub fn for_command(run: &RunId, cmd: u64) -> Self {
        Self(format!("{run}:{cmd}"))
    }
}

/// The most bytes an id a client chooses may have: a session id, a call id, a hook token, a
/// key's name. Ids go into URLs (`/v1/sessions/{id}/events`, one `/v1/events?session=…` URL for
/// hundreds of sessions), log lines and index keys; 256 bytes keeps each of them bounded.
pub const MAX_CLIENT_ID_BYTES: usize = 256;

/// Why an id a client chose was refused (see [`check_client_id`]). Its message names the field
/// and the limit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidId {
    /// The id is empty.
    #[error("{field} is empty; send a non-empty {field}")]
    Empty {
        /// What the id is (`session`, `callId`, …).
        field: &'static str,
    },
    /// The id is longer than [`MAX_CLIENT_ID_BYTES`].
    #[error("{field} is {len} bytes long; send at most {MAX_CLIENT_ID_BYTES} bytes (UTF-8)")]
    TooLong {
        /// What the id is.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// The id holds a character that does not print (a control, line-separator, zero-width or
    /// bidirectional-override character).
    #[error("{field} holds the non-printable character {ch:?} at byte {at}; send printable characters only")]
    NotPrintable {
        /// What the id is.
        field: &'static str,
        /// The character.
        ch: char,
        /// Its byte offset in the id.
        at: usize,
    },
}

impl InvalidId {
    /// What the refused id is (`session`, `callId`, `name`, …).
    pub fn field(&self) -> &'static str {
        match self {
            Self::Empty { field }
            | Self::TooLong { field, .. }
            | Self::NotPrintable { field, .. } => field,
        }
    }
}

impl From<InvalidId> for crate::StoreError {
    fn from(e: InvalidId) -> Self {
        Self::InvalidInput(e.to_string())
    }
}

/// Checks an id a client chose — a session id, a call id, a hook token, a key's name — against
/// the limits every surface applies: non-empty, at most [`MAX_CLIENT_ID_BYTES`] bytes, printable
/// (no control, line-separator, zero-width or bidirectional-override characters; spaces and
/// any other printable Unicode are fine). `field` names the id in the error, as the client
/// spelled it (`session`, `callId`).
///
/// # Errors
/// [`InvalidId`] saying which rule the id breaks.
pub fn check_client_id(field: &'static str, id: &str) -> Result<(), InvalidId> {
    if id.is_empty() {
        return Err(InvalidId::Empty { field });
    }
    if id.len() > MAX_CLIENT_ID_BYTES {
        return Err(InvalidId::TooLong {
            field,
            len: id.len(),
        });
    }
    let hidden = |c: char| {
        c.is_control()
            || matches!(c,
                '\u{2028}' | '\u{2029}' // line and paragraph separators
                | '\u{200B}'..='\u{200F}' // zero-width characters, direction marks
                | '\u{202A}'..='\u{202E}' // bidirectional embeddings and overrides
                | '\u{2066}'..='\u{2069}' // bidirectional isolates
                | '\u{FEFF}') // zero-width no-break space
    };
    match id.char_indices().find(|&(_, c)| hidden(c)) {
        Some((at, ch)) => Err(InvalidId::NotPrintable { field, ch, at }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod client_id_tests {
    use super::*;

    #[test]
    fn client_ids() {
        assert_eq!(check_client_id("session", "s-1 ünï 🦀"), Ok(()));
        assert_eq!(check_client_id("session", &"a".repeat(256)), Ok(()));
        let long = check_client_id("session", &"a".repeat(257)).unwrap_err();
        assert_eq!(
            long,
            InvalidId::TooLong {
                field: "session",
                len: 257
            }
        );
        assert!(long.to_string().contains("at most 256 bytes"), "{long}");
        // 129 two-byte characters: 258 bytes.
        assert!(check_client_id("callId", &"é".repeat(129)).is_err());
        assert_eq!(
            check_client_id("callId", ""),
            Err(InvalidId::Empty { field: "callId" })
        );
        for bad in [
            "a\nb",
            "a\u{0}",
            "a\u{7f}",
            "a\u{202e}b",
            "\u{200b}",
            "a\u{2028}",
        ] {
            let e = check_client_id("name", bad).unwrap_err();
            assert!(matches!(e, InvalidId::NotPrintable { .. }), "{bad:?}");
            assert_eq!(e.field(), "name");
        }
    }
}
