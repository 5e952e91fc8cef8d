//! Shared test support: a factory of fresh random schemas on the server named by
//! `EVE_TEST_POSTGRES_URL`, dropped when the factory is dropped.
#![allow(dead_code, unreachable_pub)]

use async_trait::async_trait;
use eve_conformance::{Corruption, Opened, StoreFactory};
use eve_core::{JournalStore, RunId, StoreError};
use eve_storage_postgres::{PostgresOptions, PostgresStore};
use std::sync::{Arc, Mutex};

/// The variable naming the test server.
pub const URL_VAR: &str = "EVE_TEST_POSTGRES_URL";

/// The server URL, or `None` after printing loudly why the Postgres tests are skipped.
pub fn url_or_skip(test: &str) -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(u) if !u.is_empty() => Some(u),
        _ => {
            println!(
                "skipped: {test}: {URL_VAR} is unset, so the PostgreSQL tests did not run; \
                 set it (e.g. postgres://postgres@127.0.0.1:5432/test) to run them"
            );
            None
        }
    }
}

/// A fresh schema name.
pub fn random_schema() -> String {
    format!("eve_t_{}", uuid::Uuid::new_v4().simple())
}

/// Options for a test store in `schema` (application_name = schema, so tests can find its
/// connections in pg_stat_activity).
pub fn options(schema: &str) -> PostgresOptions {
    PostgresOptions {
        schema: schema.to_owned(),
        pool_size: 4,
        application_name: schema.to_owned(),
        ..PostgresOptions::default()
    }
}

/// Makes stores in fresh random schemas; drops every schema it made when dropped.
#[derive(Debug)]
pub struct PgFactory {
    pub url: String,
    schemas: Mutex<Vec<String>>,
}

impl PgFactory {
    pub fn from_env() -> Option<Self> {
        std::env::var(URL_VAR)
            .ok()
            .filter(|u| !u.is_empty())
            .map(|url| Self {
                url,
                schemas: Mutex::new(Vec::new()),
            })
    }

    /// A fresh store in a fresh schema.
    pub async fn store(&self) -> PostgresStore {
        let schema = random_schema();
        self.schemas.lock().unwrap().push(schema.clone());
        PostgresStore::connect_with(&self.url, options(&schema))
            .await
            .unwrap_or_else(|e| panic!("{URL_VAR}={} does not answer: {e}", self.url))
    }
}

#[async_trait]
impl StoreFactory for PgFactory {
    async fn create(&self) -> Result<Opened, StoreError> {
        let store = self.store().await;
        Ok(Opened {
            location: store.schema().to_owned(),
            store: Arc::new(store),
        })
    }

    async fn open(&self, location: &str) -> Result<Option<Arc<dyn JournalStore>>, StoreError> {
        let store = PostgresStore::connect_with(&self.url, options(location)).await?;
        Ok(Some(Arc::new(store)))
    }
    /// Rewrites the run's last `events` row in schema `location` over a connection of its own.
    async fn corrupt(
        &self,
        location: &str,
        run: &RunId,
        how: Corruption,
    ) -> Result<bool, StoreError> {
        use sqlx::Connection;
        let set = match how {
            Corruption::Truncated => "body = substring(body from 1 for length(body) / 2)",
            Corruption::Garbage => "body = '\\x00ff6e6f74206a736f6e'::bytea",
            Corruption::UnknownVersion => "version = 9999",
            _ => return Ok(false),
        };
        let sql = format!(
            "UPDATE \"{location}\".events SET {set} WHERE run_id = $1 AND first_seq = \
             (SELECT MAX(first_seq) FROM \"{location}\".events WHERE run_id = $1)"
        );
        let fail = |e: sqlx::Error| StoreError::Other {
            backend: "postgres",
            source: Box::new(e),
        };
        let mut conn = sqlx::PgConnection::connect(&self.url).await.map_err(fail)?;
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(run.as_str())
            .execute(&mut conn)
            .await
            .map_err(fail)?;
        Ok(done.rows_affected() == 1)
    }
}

impl Drop for PgFactory {
    fn drop(&mut self) {
        let schemas = std::mem::take(&mut *self.schemas.lock().unwrap());
        if schemas.is_empty() {
            return;
        }
        let url = self.url.clone();
        // Drop is synchronous and may run inside a runtime: clean up on a thread of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("cleanup runtime");
            rt.block_on(async move {
                for s in schemas {
                    let _ = eve_storage_postgres::drop_schema(&url, &s).await;
                }
            });
        })
        .join();
    }
}
