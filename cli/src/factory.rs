//! Fresh, isolated storage on the backend a store URL names, for the conformance suite and the
//! benchmarks: a temp file for SQLite, a random schema for Postgres, a random table for
//! DynamoDB. Everything it made is removed when it is [cleaned up](UrlFactory::cleanup).

use crate::store_url::StoreUrl;
use async_trait::async_trait;
use eve_conformance::{Opened, StoreFactory};
use eve_core::{JournalStore, StoreError};
#[cfg(feature = "postgres")]
use eve_storage_postgres::{PostgresOptions, PostgresStore};
use eve_storage_sqlite::{SqliteOptions, SqliteStore};
use std::sync::{Arc, Mutex};
use tempfile::TempDir;

/// A [`StoreFactory`] that makes stores beside (never inside) the storage a URL names:
/// SQLite files in a temp directory (the URL's path is not touched), fresh schemas on the
/// Postgres server, fresh tables on the DynamoDB endpoint.
#[derive(Debug)]
pub struct UrlFactory {
    url: StoreUrl,
    dir: TempDir,
    made: Mutex<Vec<String>>,
}

impl UrlFactory {
    /// A factory for the backend of `url`.
    ///
    /// # Errors
    /// When the temp directory for SQLite files cannot be made.
    pub fn new(url: StoreUrl) -> Result<Self, StoreError> {
        let dir = tempfile::Builder::new()
            .prefix("eve-cli-")
            .tempdir()
            .map_err(|e| other("sqlite", e))?;
        Ok(Self {
            url,
            dir,
            made: Mutex::new(Vec::new()),
        })
    }

    /// Like [`UrlFactory::new`], but SQLite files go to a temp directory beside the URL's file
    /// (on the same disk, so timings are that disk's), removed when the factory is dropped.
    ///
    /// # Errors
    /// When the temp directory cannot be made there.
    pub fn beside(url: StoreUrl) -> Result<Self, StoreError> {
        let parent = match &url {
            StoreUrl::Sqlite { path, .. } => path
                .parent()
                .map(|p| {
                    if p.as_os_str().is_empty() {
                        std::path::Path::new(".")
                    } else {
                        p
                    }
                })
                .map(std::path::Path::to_path_buf),
            _ => None,
        };
        let Some(parent) = parent else {
            return Self::new(url);
        };
        let dir = tempfile::Builder::new()
            .prefix(".eve-bench-")
            .tempdir_in(&parent)
            .map_err(|e| other("sqlite", e))?;
        Ok(Self {
            url,
            dir,
            made: Mutex::new(Vec::new()),
        })
    }

    /// The URL the factory makes stores beside.
    pub fn url(&self) -> &StoreUrl {
        &self.url
    }

    /// Drops every schema or table this factory made (SQLite files go with the temp directory
    /// when the factory is dropped). Best effort: a failure is reported, not retried.
    ///
    /// # Errors
    /// The first backend error met; the remaining locations are still tried.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "dynamodb")),
        allow(unused_mut, unused_variables)
    )]
    pub async fn cleanup(&self) -> Result<(), StoreError> {
        let made = std::mem::take(&mut *self.made.lock().expect("factory lock"));
        let mut first_err = None;
        match &self.url {
            StoreUrl::Sqlite { .. } => {}
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres { url, .. } => {
                for schema in made {
                    if let Err(e) = eve_storage_postgres::drop_schema(url, &schema).await {
                        first_err.get_or_insert(e);
                    }
                }
            }
            #[cfg(feature = "dynamodb")]
            StoreUrl::Dynamo { .. } => {
                for table in made {
                    let result = match self.url.dynamo_store(&table).await {
                        Ok(store) => store.delete_table().await,
                        Err(e) => Err(e),
                    };
                    if let Err(e) = result {
                        first_err.get_or_insert(e);
                    }
                }
            }
            // A backend not compiled in made nothing (open_at refused it).
            #[allow(unreachable_patterns)]
            _ => {}
        }
        first_err.map_or(Ok(()), Err)
    }

    fn fresh_name(&self) -> String {
        let name = format!("eve_cli_{}", uuid::Uuid::new_v4().simple());
        self.made.lock().expect("factory lock").push(name.clone());
        name
    }

    async fn open_at(&self, location: &str) -> Result<Arc<dyn JournalStore>, StoreError> {
        Ok(match &self.url {
            StoreUrl::Sqlite { synchronous, .. } => {
                let options = SqliteOptions {
                    synchronous: *synchronous,
                    ..SqliteOptions::default()
                };
                Arc::new(SqliteStore::open_with(location, options).await?)
            }
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres { url, .. } => {
                let options = PostgresOptions {
                    schema: location.to_owned(),
                    pool_size: 4,
                    application_name: location.to_owned(),
                    ..PostgresOptions::default()
                };
                Arc::new(PostgresStore::connect_with(url, options).await?)
            }
            #[cfg(feature = "dynamodb")]
            StoreUrl::Dynamo { .. } => Arc::new(self.url.dynamo_store(location).await?),
            #[allow(unreachable_patterns)]
            _ => {
                return Err(StoreError::InvalidInput(
                    self.url.check_compiled().err().map_or_else(
                        || format!("{} cannot be opened", self.url),
                        |e| e.to_string(),
                    ),
                ))
            }
        })
    }
}

#[async_trait]
impl StoreFactory for UrlFactory {
    async fn create(&self) -> Result<Opened, StoreError> {
        let location = match &self.url {
            StoreUrl::Sqlite { .. } => {
                let name = format!("{}.db", uuid::Uuid::new_v4().simple());
                self.dir.path().join(name).to_string_lossy().into_owned()
            }
            StoreUrl::Postgres { .. } | StoreUrl::Dynamo { .. } => self.fresh_name(),
        };
        #[cfg(feature = "dynamodb")]
        if let StoreUrl::Dynamo { .. } = &self.url {
            self.url
                .dynamo_store(&location)
                .await?
                .create_table()
                .await?;
        }
        let store = self.open_at(&location).await?;
        Ok(Opened { store, location })
    }

    async fn open(&self, location: &str) -> Result<Option<Arc<dyn JournalStore>>, StoreError> {
        self.open_at(location).await.map(Some)
    }
}

fn other(backend: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::Other {
        backend,
        source: Box::new(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eve_core::RunQuery;

    #[tokio::test]
    async fn sqlite_stores_are_fresh_isolated_and_reopenable() {
        let url: StoreUrl = "sqlite://never-created.db".parse().unwrap();
        let factory = UrlFactory::new(url).unwrap();
        let a = factory.create().await.unwrap();
        let b = factory.create().await.unwrap();
        assert_ne!(a.location, b.location);
        assert!(a
            .location
            .starts_with(&*factory.dir.path().to_string_lossy()));
        assert!(!std::path::Path::new("never-created.db").exists());
        let again = factory.open(&a.location).await.unwrap().unwrap();
        assert_eq!(again.backend(), "sqlite");
        assert!(again
            .list_runs(&RunQuery::default())
            .await
            .unwrap()
            .is_empty());
        factory.cleanup().await.unwrap();
    }
}
