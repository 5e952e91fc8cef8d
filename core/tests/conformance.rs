//! The store conformance suite on [`MemoryStore`], the reference implementation.

use async_trait::async_trait;
use eve_conformance::{Opened, StoreFactory};
use eve_core::{JournalStore, MemoryStore, StoreError};
use std::sync::Arc;

/// Fresh in-memory stores; not persistent, so `open` gives `None`.
#[derive(Debug)]
struct MemoryFactory;

#[async_trait]
impl StoreFactory for MemoryFactory {
    async fn create(&self) -> Result<Opened, StoreError> {
        Ok(Opened {
            store: Arc::new(MemoryStore::new()),
            location: "memory".into(),
        })
    }

    async fn open(&self, _location: &str) -> Result<Option<Arc<dyn JournalStore>>, StoreError> {
        Ok(None)
    }

    fn corrupt_not_applicable(&self) -> Option<&'static str> {
        Some("the memory store keeps decoded events, it has no stored rows to damage")
    }
}

eve_conformance::store_suite!(MemoryFactory);
