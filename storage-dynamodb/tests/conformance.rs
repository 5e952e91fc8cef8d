//! The store conformance suite on [`DynamoStore`] against DynamoDB Local (or any endpoint in
//! `EVE_TEST_DYNAMODB_ENDPOINT`), one fresh random table per store. Without the variable every
//! case prints `skipped:` and passes; `bash .ci/dynamodb-local.sh` starts a server.

use async_trait::async_trait;
use eve_conformance::{Opened, StoreFactory};
use eve_core::{JournalStore, StoreError};
use eve_storage_dynamodb::{DynamoConfig, DynamoStore};
use std::sync::Arc;

#[derive(Debug)]
struct DynamoFactory {
    endpoint: String,
}

impl DynamoFactory {
    fn from_env() -> Option<Self> {
        // Never let the SDK look for credentials or probe instance metadata.
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
        let endpoint = std::env::var("EVE_TEST_DYNAMODB_ENDPOINT").ok()?;
        Some(Self { endpoint })
    }
}

#[async_trait]
impl StoreFactory for DynamoFactory {
    async fn create(&self) -> Result<Opened, StoreError> {
        let table = format!("eve_conf_{}", uuid::Uuid::new_v4().simple());
        let store = DynamoStore::connect(DynamoConfig::local(&self.endpoint, &table)).await?;
        store.create_table().await?;
        Ok(Opened {
            store: Arc::new(store),
            location: table,
        })
    }

    async fn open(&self, location: &str) -> Result<Option<Arc<dyn JournalStore>>, StoreError> {
        let store = DynamoStore::connect(DynamoConfig::local(&self.endpoint, location)).await?;
        Ok(Some(Arc::new(store)))
    }
}

eve_conformance::store_suite!(
    skip_unless = "EVE_TEST_DYNAMODB_ENDPOINT",
    DynamoFactory::from_env()
);
