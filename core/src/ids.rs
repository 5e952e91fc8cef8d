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
    /// A fresh random append id.
    pub fn random() -> Self {
        Self(uuid::Uuid::new_v4().simple().to_string())
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
