//! What a store holds, measured from beside it: the bytes its storage takes, and, on DynamoDB,
//! the capacity units its requests consumed.
//!
//! - SQLite: `(page_count - freelist_count) × page_size` read on a second connection (WAL
//!   pages are counted as the database they make; no checkpoint is needed).
//! - Postgres: `pg_total_relation_size` (table, indexes, TOAST) summed over the tables of the
//!   bench's schema.
//! - DynamoDB: a scan of the bench's table, each item sized by DynamoDB's billing rules
//!   (attribute names plus values; see [`item_bytes`]). DynamoDB Local's `TableSizeBytes` is
//!   not used: AWS refreshes it only every six hours, so the two would not compare.

use crate::error::CliError;
use crate::store_url::StoreUrl;
use eve_core::JournalStore;
use std::sync::Arc;

/// A store opened for the bench, with what is needed to look at its storage.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    /// The store, as the workloads use it.
    pub(crate) store: Arc<dyn JournalStore>,
    /// Where it is: a file, a schema, a table.
    pub(crate) location: String,
    #[cfg(feature = "dynamodb")]
    dynamo: Option<Arc<eve_storage_dynamodb::DynamoStore>>,
    url: StoreUrl,
}

/// Read and write capacity units.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Units {
    pub(crate) read: f64,
    pub(crate) write: f64,
    /// Successful requests whose answer carried no figure.
    pub(crate) unreported: u64,
}

impl Units {
    pub(crate) fn since(self, earlier: Units) -> Units {
        Units {
            read: self.read - earlier.read,
            write: self.write - earlier.write,
            unreported: self.unreported - earlier.unreported,
        }
    }
}

impl Probe {
    /// Opens the store at `location` (made by the bench's factory) of `url`'s backend; on
    /// DynamoDB keeps the concrete handle, whose consumed capacity the bench reads.
    pub(crate) async fn open(
        url: &StoreUrl,
        location: String,
        store: Arc<dyn JournalStore>,
    ) -> Result<Self, CliError> {
        #[cfg(feature = "dynamodb")]
        if let StoreUrl::Dynamo { .. } = url {
            let dynamo = Arc::new(
                url.dynamo_store(&location)
                    .await
                    .map_err(CliError::store("cannot open the bench table"))?,
            );
            return Ok(Self {
                store: dynamo.clone(),
                location,
                dynamo: Some(dynamo),
                url: url.clone(),
            });
        }
        Ok(Self {
            store,
            location,
            #[cfg(feature = "dynamodb")]
            dynamo: None,
            url: url.clone(),
        })
    }

    /// Capacity units consumed so far by this handle: `None` but on DynamoDB.
    pub(crate) fn units(&self) -> Option<Units> {
        #[cfg(feature = "dynamodb")]
        if let Some(d) = &self.dynamo {
            let c = d.consumed_capacity();
            return Some(Units {
                read: c.read_units,
                write: c.write_units,
                unreported: c.unreported,
            });
        }
        None
    }

    /// The bytes the store's storage takes now (see the module docs for how, per backend).
    pub(crate) async fn bytes(&self) -> Result<u64, CliError> {
        let fail = |e: String| CliError::Bench(format!("cannot size {}: {e}", self.location));
        match &self.url {
            StoreUrl::Sqlite { .. } => {
                use sqlx::{ConnectOptions, Connection};
                let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(&self.location)
                    .read_only(true)
                    .connect()
                    .await
                    .map_err(|e| fail(e.to_string()))?;
                let pragma = |name: &'static str| {
                    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!("PRAGMA {name}")))
                };
                let pages = pragma("page_count")
                    .fetch_one(&mut conn)
                    .await
                    .map_err(|e| fail(e.to_string()))?;
                let free = pragma("freelist_count")
                    .fetch_one(&mut conn)
                    .await
                    .map_err(|e| fail(e.to_string()))?;
                let size = pragma("page_size")
                    .fetch_one(&mut conn)
                    .await
                    .map_err(|e| fail(e.to_string()))?;
                let _ = conn.close().await;
                Ok(((pages - free) * size).max(0) as u64)
            }
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres { url, .. } => {
                use sqlx::Connection;
                let mut conn = sqlx::PgConnection::connect(url)
                    .await
                    .map_err(|e| fail(e.to_string()))?;
                let bytes: i64 = sqlx::query_scalar(
                    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint \
                     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                     WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')",
                )
                .bind(&self.location)
                .fetch_one(&mut conn)
                .await
                .map_err(|e| fail(e.to_string()))?;
                let _ = conn.close().await;
                Ok(bytes.max(0) as u64)
            }
            #[cfg(feature = "dynamodb")]
            StoreUrl::Dynamo { .. } => {
                // A client of its own: the scan's capacity is not the workload's.
                let client = self
                    .url
                    .dynamo_config(&self.location)
                    .map_err(|e| fail(e.to_string()))?
                    .sdk_client();
                table_bytes(&client, &self.location).await.map_err(fail)
            }
            #[allow(unreachable_patterns)]
            _ => Err(fail("backend not compiled in".into())),
        }
    }
}

/// The size of every item of the store's table, summed.
#[cfg(feature = "dynamodb")]
async fn table_bytes(
    client: &eve_storage_dynamodb::aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<u64, String> {
    let mut total = 0u64;
    let mut start = None;
    loop {
        let page = client
            .scan()
            .table_name(table)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| {
                eve_storage_dynamodb::aws_sdk_dynamodb::error::DisplayErrorContext(e).to_string()
            })?;
        total += page.items().iter().map(item_bytes).sum::<u64>();
        start = page.last_evaluated_key;
        if start.is_none() {
            return Ok(total);
        }
    }
}

/// An item's size as DynamoDB counts it for storage and capacity: for each attribute, its
/// name's UTF-8 length plus its value's size (strings: UTF-8 length; binary: length; numbers:
/// about one byte per two digits plus one; booleans and nulls: one byte; maps and lists: three
/// bytes plus one per element plus the elements' sizes).
#[cfg(feature = "dynamodb")]
pub(crate) fn item_bytes(
    item: &std::collections::HashMap<
        String,
        eve_storage_dynamodb::aws_sdk_dynamodb::types::AttributeValue,
    >,
) -> u64 {
    item.iter()
        .map(|(k, v)| k.len() as u64 + value_bytes(v))
        .sum()
}

#[cfg(feature = "dynamodb")]
fn value_bytes(v: &eve_storage_dynamodb::aws_sdk_dynamodb::types::AttributeValue) -> u64 {
    use eve_storage_dynamodb::aws_sdk_dynamodb::types::AttributeValue as A;
    match v {
        A::S(s) => s.len() as u64,
        A::B(b) => b.as_ref().len() as u64,
        A::N(n) => {
            let digits = n.chars().filter(char::is_ascii_digit).count() as u64;
            digits.div_ceil(2) + 1
        }
        A::Bool(_) | A::Null(_) => 1,
        A::Ss(v) => v.iter().map(|s| s.len() as u64).sum(),
        A::Bs(v) => v.iter().map(|b| b.as_ref().len() as u64).sum(),
        A::Ns(v) => v
            .iter()
            .map(|n| (n.chars().filter(char::is_ascii_digit).count() as u64).div_ceil(2) + 1)
            .sum(),
        A::M(m) => 3 + m.len() as u64 + item_bytes(m),
        A::L(l) => 3 + l.len() as u64 + l.iter().map(value_bytes).sum::<u64>(),
        _ => 0,
    }
}
