//! The store conformance suite on [`DynamoStore`] against DynamoDB Local (or any endpoint in
//! `EVE_TEST_DYNAMODB_ENDPOINT`), one fresh random table per store. Without the variable every
//! case prints `skipped:` and passes; `bash .ci/dynamodb-local.sh` starts a server.

use async_trait::async_trait;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use eve_conformance::{Corruption, Opened, StoreFactory};
use eve_core::{JournalStore, RunId, StoreError};
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
    /// Rewrites the run's last event batch item (the highest `EV#` sort key) in table
    /// `location` with the SDK, behind the store's back.
    async fn corrupt(
        &self,
        location: &str,
        run: &RunId,
        how: Corruption,
    ) -> Result<bool, StoreError> {
        let (name, value) = match how {
            Corruption::Truncated => ("b", None),
            Corruption::Garbage => (
                "b",
                Some(AttributeValue::B(Blob::new(&b"\x00\xffnot json"[..]))),
            ),
            Corruption::UnknownVersion => ("v", Some(AttributeValue::N("9999".into()))),
            _ => return Ok(false),
        };
        let fail = |e: String| StoreError::Other {
            backend: "dynamodb",
            source: e.into(),
        };
        let client = DynamoConfig::local(&self.endpoint, location).sdk_client();
        let page = client
            .query()
            .table_name(location)
            .key_condition_expression("pk = :pk AND begins_with(sk, :ev)")
            .expression_attribute_values(":pk", AttributeValue::S(format!("RUN#{run}")))
            .expression_attribute_values(":ev", AttributeValue::S("EV#".into()))
            .scan_index_forward(false)
            .limit(1)
            .send()
            .await
            .map_err(|e| fail(format!("{e:?}")))?;
        let Some(mut item) = page.items.and_then(|mut v| v.pop()) else {
            return Ok(false);
        };
        let value = match value {
            Some(v) => v,
            None => {
                let Some(AttributeValue::B(body)) = item.get("b") else {
                    return Ok(false);
                };
                let body = body.as_ref();
                AttributeValue::B(Blob::new(&body[..body.len() / 2]))
            }
        };
        item.insert(name.to_owned(), value);
        client
            .put_item()
            .table_name(location)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| fail(format!("{e:?}")))?;
        Ok(true)
    }
}

eve_conformance::store_suite!(
    skip_unless = "EVE_TEST_DYNAMODB_ENDPOINT",
    DynamoFactory::from_env()
);
