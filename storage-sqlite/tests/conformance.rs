//! The store conformance suite on [`SqliteStore`], one fresh file per store.

use async_trait::async_trait;
use eve_conformance::{Opened, StoreFactory};
use eve_core::{JournalStore, StoreError};
use eve_storage_sqlite::SqliteStore;
use std::sync::{Arc, Mutex};
use tempfile::TempDir;

/// Fresh files in temp dirs; the dirs live as long as the factory, so `open` can reopen them.
#[derive(Debug, Default)]
struct SqliteFactory {
    dirs: Mutex<Vec<TempDir>>,
}

#[async_trait]
impl StoreFactory for SqliteFactory {
    async fn create(&self) -> Result<Opened, StoreError> {
        let dir = tempfile::tempdir().map_err(|e| StoreError::Other {
            backend: "sqlite",
            source: Box::new(e),
        })?;
        let path = dir.path().join("journal.db");
        let store = SqliteStore::open(&path).await?;
        self.dirs.lock().expect("factory lock").push(dir);
        Ok(Opened {
            store: Arc::new(store),
            location: path.to_string_lossy().into_owned(),
        })
    }

    async fn open(&self, location: &str) -> Result<Option<Arc<dyn JournalStore>>, StoreError> {
        Ok(Some(Arc::new(SqliteStore::open(location).await?)))
    }
}

eve_conformance::store_suite!(SqliteFactory::default());
