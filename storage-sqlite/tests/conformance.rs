//! The store conformance suite on [`SqliteStore`], one fresh file per store.

use async_trait::async_trait;
use eve_conformance::{Corruption, Opened, StoreFactory};
use eve_core::{JournalStore, RunId, StoreError};
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

    /// Rewrites the run's last `events` row through a second connection to the file.
    async fn corrupt(
        &self,
        location: &str,
        run: &RunId,
        how: Corruption,
    ) -> Result<bool, StoreError> {
        use sqlx::Connection;
        let set = match how {
            Corruption::Truncated => "body = substr(body, 1, length(body) / 2)",
            Corruption::Garbage => "body = X'00FF6E6F74206A736F6E'",
            Corruption::UnknownVersion => "version = 9999",
            _ => return Ok(false),
        };
        let sql = format!(
            "UPDATE events SET {set} WHERE run_id = ?1 AND first_seq = \
             (SELECT MAX(first_seq) FROM events WHERE run_id = ?1)"
        );
        let fail = |e: sqlx::Error| StoreError::Other {
            backend: "sqlite",
            source: Box::new(e),
        };
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{location}"))
            .await
            .map_err(fail)?;
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(run.as_str())
            .execute(&mut conn)
            .await
            .map_err(fail)?;
        Ok(done.rows_affected() == 1)
    }
}

eve_conformance::store_suite!(SqliteFactory::default());
