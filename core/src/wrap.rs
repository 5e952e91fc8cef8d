//! [`StoreWrapper`]: the one way to wrap a [`JournalStore`] — a fault injector, a recorder, a
//! store with a planted bug — changing only the methods the wrapper cares about.
//!
//! A wrapper names the store it wraps ([`StoreWrapper::wrapped`]) and is a [`JournalStore`]
//! through the blanket impl below, which forwards every method of the trait to the wrapper's
//! method of the same name. Each of those has a default that forwards to the wrapped store
//! through the [`around`](StoreWrapper::around) hook (every method whose answer is a
//! `Result`), so a wrapper overrides `around` to act on every call (count, fail, log) and
//! overrides a method by name to change just that method:
//!
//! ```
//! use eve_core::wrap::StoreWrapper;
//! use eve_core::{JournalStore, MemoryStore, RunQuery, RunRecord, StoreError};
//!
//! /// Lists runs newest first (a planted bug).
//! #[derive(Debug)]
//! struct Reversed(MemoryStore);
//!
//! #[async_trait::async_trait]
//! impl StoreWrapper for Reversed {
//!     fn wrapped(&self) -> &dyn JournalStore {
//!         &self.0
//!     }
//!     async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
//!         let mut runs = self.0.list_runs(query).await?;
//!         runs.reverse();
//!         Ok(runs)
//!     }
//! }
//! ```
//!
//! The list of the trait's methods lives in one place, the `wrapper_methods!` invocation at
//! the end of this file: a method added to [`JournalStore`] is added there once, and every
//! wrapper forwards it.
//!
//! A method called on a concrete wrapper type with both traits in scope is ambiguous; call it
//! through `JournalStore::method(&store, …)` or on an `Arc<dyn JournalStore>`.

use crate::error::StoreError;
use crate::event::{InputResponse, Payload, StoredEvent};
use crate::ids::{DeploymentId, RequestId, RunId, SessionId, WorkerId};
use crate::keys::ApiKey;
use crate::session::{QueuedMessage, SessionEnd, SessionEntry, SessionRecord};
use crate::store::{
    Append, Appended, CancelOutcome, CreatedRun, Delivered, JournalStore, Lease, NewRun,
    PendingRequest, Resolution, RunQuery, RunRecord,
};
use crate::time::Timestamp;
use crate::wake::WatchKey;
use crate::worker_lock::WorkerLock;
use async_trait::async_trait;
use futures::future::BoxFuture;
use std::fmt::Debug;
use std::time::Duration;

/// One forwarded call of a [`StoreWrapper`], as [`StoreWrapper::around`] sees it.
pub type Call<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

/// The hooked methods a fault injector lets pass outside its fault schedule and call log: the
/// process lock (a simulated crash does not end the process that holds it), the API keys and
/// `get_session`, which are no journal calls.
pub const OUTSIDE_FAULTS: &[&str] = &[
    "lock_worker",
    "create_key",
    "list_keys",
    "revoke_key",
    "key_by_hash",
    "get_session",
];

/// Generates [`StoreWrapper`] and the blanket `impl<W: StoreWrapper> JournalStore for W` from
/// one list of the trait's methods. `hooked` methods answer a `Result` and pass through
/// [`StoreWrapper::around`]; `plain` ones are forwarded as they are.
macro_rules! wrapper_methods {
    (
        hooked {
            $( async fn $name:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> Result<$ok:ty>; )*
        }
        plain {
            $( async fn $pname:ident(&self $(, $parg:ident: $pty:ty)* $(,)?) -> $pret:ty; )*
        }
    ) => {
        /// A [`JournalStore`] that wraps another and changes only some of its methods; see the
        /// [module docs](self). Implementing it makes the type a `JournalStore`.
        #[async_trait]
        pub trait StoreWrapper: Debug + Send + Sync + 'static {
            /// The store every method not overridden forwards to.
            fn wrapped(&self) -> &dyn JournalStore;

            /// Wraps every forwarded call whose answer is a `Result` (all but `backend`,
            /// `store_id`, `wakeups` and `watch`): `method` is the trait method's name, `call`
            /// the call to the wrapped store, not yet started. The default runs it as it is; a
            /// fault injector fails it, runs it and then fails, or counts it.
            fn around<'a, T: Send + 'a>(&'a self, method: &'static str, call: Call<'a, T>) -> Call<'a, T> {
                let _ = method;
                call
            }

            /// Forwards [`JournalStore::backend`].
            fn backend(&self) -> &'static str {
                self.wrapped().backend()
            }

            /// Forwards [`JournalStore::store_id`]: a wrapper is the store it wraps, so worker
            /// ids and their locks (contract clause 11) stay the wrapped store's.
            fn store_id(&self) -> String {
                self.wrapped().store_id()
            }

            $(
                #[doc = concat!("Forwards [`JournalStore::", stringify!($name), "`] through [`around`](Self::around).")]
                async fn $name(&self $(, $arg: $ty)*) -> Result<$ok, StoreError> {
                    self.around(stringify!($name), self.wrapped().$name($($arg),*)).await
                }
            )*

            $(
                #[doc = concat!("Forwards [`JournalStore::", stringify!($pname), "`].")]
                async fn $pname(&self $(, $parg: $pty)*) -> $pret {
                    self.wrapped().$pname($($parg),*).await
                }
            )*
        }

        #[async_trait]
        impl<W: StoreWrapper> JournalStore for W {
            fn backend(&self) -> &'static str {
                StoreWrapper::backend(self)
            }

            fn store_id(&self) -> String {
                StoreWrapper::store_id(self)
            }

            $(
                async fn $name(&self $(, $arg: $ty)*) -> Result<$ok, StoreError> {
                    StoreWrapper::$name(self $(, $arg)*).await
                }
            )*

            $(
                async fn $pname(&self $(, $parg: $pty)*) -> $pret {
                    StoreWrapper::$pname(self $(, $parg)*).await
                }
            )*
        }
    };
}

wrapper_methods! {
    hooked {
        async fn create_run(&self, run: NewRun, now: Timestamp) -> Result<CreatedRun>;
        async fn create_run_claimed(&self, run: NewRun, lease: &Lease, now: Timestamp) -> Result<CreatedRun>;
        async fn append(&self, append: Append) -> Result<Appended>;
        async fn read(&self, run: &RunId, from_seq: u64, max: usize) -> Result<Vec<StoredEvent>>;
        async fn get_run(&self, run: &RunId) -> Result<RunRecord>;
        async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>>;
        async fn answer(&self, request: &RequestId, response: InputResponse, now: Timestamp) -> Result<Delivered>;
        async fn deliver_hook(&self, token: &str, payload: Payload, dedupe_key: Option<&str>, now: Timestamp) -> Result<Delivered>;
        async fn request_cancel(&self, run: &RunId, reason: &str, now: Timestamp) -> Result<CancelOutcome>;
        async fn resolve_blocked(&self, run: &RunId, resolution: Resolution, now: Timestamp) -> Result<u64>;
        async fn pending_requests(&self, session: &SessionId) -> Result<Vec<PendingRequest>>;
        async fn read_session(&self, session: &SessionId, from_seq: u64, max: usize) -> Result<Vec<SessionEntry>>;
        async fn register_worker(&self, worker: &WorkerId, deployment: &DeploymentId, ttl: Duration, now: Timestamp) -> Result<Lease>;
        async fn heartbeat(&self, lease: &Lease, ttl: Duration, now: Timestamp) -> Result<Lease>;
        async fn claim(&self, lease: &Lease, max: usize, now: Timestamp) -> Result<Vec<RunRecord>>;
        async fn release(&self, lease: &Lease, run: &RunId, processed_seq: u64, now: Timestamp) -> Result<()>;
        async fn retire_worker(&self, lease: &Lease, now: Timestamp) -> Result<()>;
        async fn lock_worker(&self, worker: &WorkerId) -> Result<WorkerLock>;
        async fn next_wake(&self, deployment: &DeploymentId, now: Timestamp) -> Result<Option<Timestamp>>;
        async fn create_key(&self, key: ApiKey) -> Result<()>;
        async fn list_keys(&self) -> Result<Vec<ApiKey>>;
        async fn revoke_key(&self, id: &str, now: Timestamp) -> Result<ApiKey>;
        async fn key_by_hash(&self, hash: &str) -> Result<Option<ApiKey>>;
        async fn purge(&self, ended_before: Timestamp, limit: usize) -> Result<usize>;
        async fn end_session(&self, session: &SessionId, now: Timestamp) -> Result<SessionEnd>;
        async fn get_session(&self, session: &SessionId) -> Result<SessionRecord>;
        async fn queue_message(&self, session: &SessionId, message: Payload, now: Timestamp) -> Result<QueuedMessage>;
        async fn take_messages(&self, session: &SessionId) -> Result<Vec<QueuedMessage>>;
    }
    plain {
        async fn wakeups(&self) -> Option<tokio::sync::watch::Receiver<u64>>;
        async fn watch(&self, key: &WatchKey) -> Option<tokio::sync::watch::Receiver<u64>>;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;
    use std::sync::Mutex;

    /// Logs the name of every hooked call and reverses `list_runs`.
    #[derive(Debug, Default)]
    struct Logged {
        inner: MemoryStore,
        log: Mutex<Vec<&'static str>>,
    }

    #[async_trait]
    impl StoreWrapper for Logged {
        fn wrapped(&self) -> &dyn JournalStore {
            &self.inner
        }
        fn around<'a, T: Send + 'a>(
            &'a self,
            method: &'static str,
            call: Call<'a, T>,
        ) -> Call<'a, T> {
            self.log.lock().expect("log").push(method);
            call
        }
        fn backend(&self) -> &'static str {
            "logged"
        }
    }

    #[tokio::test]
    async fn forwards_through_the_hook_and_keeps_overrides() {
        let store = Logged::default();
        let s: &dyn JournalStore = &store;
        assert_eq!(s.backend(), "logged");
        assert_eq!(s.store_id(), store.inner.store_id());
        assert!(s
            .list_runs(&RunQuery::default())
            .await
            .expect("list")
            .is_empty());
        let e = s.get_run(&RunId::new("nope")).await.expect_err("no run");
        assert!(matches!(e, StoreError::NotFound { .. }), "{e:?}");
        assert!(s.wakeups().await.is_some() == store.inner.wakeups().await.is_some());
        assert_eq!(*store.log.lock().expect("log"), ["list_runs", "get_run"]);
    }
}
