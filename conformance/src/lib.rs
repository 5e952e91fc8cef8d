//! eve-conformance: the suite every [`JournalStore`] must pass.
//!
//! A backend crate implements [`StoreFactory`] in its tests and calls the suite's macro once; the
//! suite owns the list of cases, so a new case reaches every backend and none is skipped by
//! omission.

use async_trait::async_trait;
use eve_core::{JournalStore, StoreError};
use std::sync::Arc;

/// A store the factory made, with where its storage lives.
#[derive(Debug, Clone)]
pub struct Opened {
    /// The handle under test.
    pub store: Arc<dyn JournalStore>,
    /// Where its storage lives (a file path, a schema name, a table name), for
    /// [`StoreFactory::open`].
    pub location: String,
}

/// Makes fresh, isolated stores for the suite.
#[async_trait]
pub trait StoreFactory: Send + Sync + 'static {
    /// Fresh, empty storage isolated from every other store this factory made (a new file, a
    /// random schema, a random table), and a handle on it.
    async fn create(&self) -> Result<Opened, StoreError>;

    /// A new, independent handle on existing storage, as a second process (or the same process
    /// after a restart) would open it. `Ok(None)` when the backend is not persistent (memory):
    /// the cases that need it are then skipped for that backend, and say so.
    async fn open(&self, location: &str) -> Result<Option<Arc<dyn JournalStore>>, StoreError>;
}
