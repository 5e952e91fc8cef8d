//! Connecting: [`PostgresOptions`], the connection pool, migrations and the store's id.

use crate::commit::{writer, Job};
use crate::error::BACKEND;
use crate::{Db, Inner, PostgresStore};
use eve_core::{StoreError, WatchHub};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Mutex, OnceCell};

/// How [`PostgresStore::connect_with`] sets up the store.
#[derive(Clone, Debug)]
pub struct PostgresOptions {
    /// The schema holding every table (created if missing). Default `eve`.
    pub schema: String,
    /// Most connections in the pool (the listener connection comes on top). Default 8.
    pub pool_size: u32,
    /// How long to wait for a connection (at connect and later). Default 10 s.
    pub connect_timeout: Duration,
    /// Group-commit writer tasks, each with its own transaction in flight. Default 2.
    pub writers: usize,
    /// Most appends folded into one group-commit transaction. Default 64.
    pub max_batch: usize,
    /// `application_name` of the store's connections (visible in `pg_stat_activity`).
    /// Default `eve-workflow`.
    pub application_name: String,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            schema: "eve".into(),
            pool_size: 8,
            connect_timeout: Duration::from_secs(10),
            writers: 2,
            max_batch: 64,
            application_name: "eve-workflow".into(),
        }
    }
}

impl PostgresStore {
    /// Connects with default [`PostgresOptions`] (schema `eve`) and applies migrations.
    ///
    /// # Errors
    /// `InvalidInput` for a malformed URL; `Unavailable` when the server does not answer.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, PostgresOptions::default()).await
    }

    /// Connects with `options` and applies migrations.
    ///
    /// # Errors
    /// `InvalidInput` for a malformed URL or schema name; `Unavailable` when the server does not
    /// answer within `connect_timeout`.
    pub async fn connect_with(url: &str, options: PostgresOptions) -> Result<Self, StoreError> {
        crate::schema::validate_schema(&options.schema)?;
        let connect = parse_url(url)?.application_name(&options.application_name);
        let (host, port) = (connect.get_host().to_owned(), connect.get_port());
        let refused = |e: String| {
            StoreError::Unavailable {
            backend: BACKEND,
            message: format!(
                "cannot connect to PostgreSQL at {host}:{port}: {e}; check that the server runs and the URL is right"
            ),
        }
        };
        // One direct attempt first: the pool retries refused connections until its acquire
        // timeout, but a server that is not there should be reported at once.
        {
            use sqlx::Connection;
            match tokio::time::timeout(
                options.connect_timeout,
                PgConnection::connect_with(&connect),
            )
            .await
            {
                Ok(Ok(conn)) => {
                    let _ = conn.close().await;
                }
                Ok(Err(e)) => return Err(refused(e.to_string())),
                Err(_) => {
                    return Err(refused(format!(
                        "no answer within {:?}",
                        options.connect_timeout
                    )))
                }
            }
        }
        let pool = PgPoolOptions::new()
            .max_connections(options.pool_size.max(1))
            .acquire_timeout(options.connect_timeout)
            .connect_with(connect)
            .await
            .map_err(|e| refused(e.to_string()))?;
        Self::start(pool, &options.schema, options.writers, options.max_batch).await
    }

    /// A store on an existing pool, in `schema`, with 2 writers of batches up to 64; applies
    /// migrations. (The one sqlx type in this API: bring your own pool.)
    ///
    /// # Errors
    /// `InvalidInput` for a bad schema name; `Unavailable` when the server does not answer.
    pub async fn from_pool(pool: PgPool, schema: &str) -> Result<Self, StoreError> {
        Self::start(pool, schema, 2, 64).await
    }

    async fn start(
        pool: PgPool,
        schema: &str,
        writers: usize,
        max_batch: usize,
    ) -> Result<Self, StoreError> {
        crate::schema::validate_schema(schema)?;
        let quoted = format!("\"{schema}\"");
        crate::schema::migrate(&pool, schema, &quoted).await?;
        let id = store_id(pool.connect_options().as_ref(), schema);
        let db = Arc::new(Db {
            pool,
            schema: schema.to_owned(),
            quoted,
            channel: format!("eve_{schema}"),
            id,
        });
        let (tx, rx) = mpsc::channel::<Job>(1024);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..writers.max(1) {
            tokio::spawn(writer(db.clone(), rx.clone(), max_batch.max(1)));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                db,
                jobs: tx,
                hub: WatchHub::default(),
                listener: OnceCell::new(),
            }),
        })
    }
}

/// `postgres://host:port/database#schema`: the same in every process that opens the store,
/// whatever user or password it connects with.
fn store_id(o: &PgConnectOptions, schema: &str) -> String {
    let host = match o.get_socket() {
        Some(socket) => socket.display().to_string(),
        None if o.get_host().contains(':') => format!("[{}]", o.get_host()),
        None => o.get_host().to_owned(),
    };
    // Without a database name Postgres uses the user's name.
    let database = o.get_database().unwrap_or(o.get_username());
    format!("postgres://{host}:{}/{database}#{schema}", o.get_port())
}

/// `url` as connect options, or `InvalidInput` saying what a URL looks like.
pub(crate) fn parse_url(url: &str) -> Result<PgConnectOptions, StoreError> {
    PgConnectOptions::from_str(url).map_err(|e| {
        StoreError::InvalidInput(format!(
            "PostgreSQL URL is malformed: {e}; expected postgres://user@host:port/database"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_id_names_host_port_database_and_schema_only() {
        let o = PgConnectOptions::from_str("postgres://alice:secret@db.example:6543/prod")
            .expect("url");
        assert_eq!(store_id(&o, "eve"), "postgres://db.example:6543/prod#eve");
        let o = PgConnectOptions::from_str("postgres://bob@db.example/prod").expect("url");
        assert_eq!(
            store_id(&o, "eve_b"),
            "postgres://db.example:5432/prod#eve_b"
        );
    }
}
