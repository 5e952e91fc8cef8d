//! API keys (contract clause 8) in the `api_keys` table. Key writes are rare single-statement
//! writes, so they go through the read pool's connections (each statement is atomic and waits
//! for the writer's lock like any other handle) rather than through the group-commit writer.

use crate::error::map_sqlx;
use crate::rows::{opt_i64, text};
use eve_core::{ApiKey, KeyScope, RequestId, StoreError, Timestamp};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqlitePool};

const COLS: &str = "id, name, scope, hash, created_at, revoked_at, expires_at, sessions, request";

fn key(row: &SqliteRow) -> Result<ApiKey, StoreError> {
    let scope = text(row, 2)?;
    Ok(ApiKey {
        id: text(row, 0)?,
        name: text(row, 1)?,
        scope: KeyScope::parse(&scope).ok_or_else(|| {
            crate::error::other(format!("api_keys row has an unknown scope {scope:?}"))
        })?,
        hash: text(row, 3)?,
        created_at: Timestamp(row.try_get(4).map_err(map_sqlx)?),
        revoked_at: opt_i64(row, 5)?.map(Timestamp),
        expires_at: opt_i64(row, 6)?.map(Timestamp),
        sessions: row
            .try_get::<Option<String>, _>(7)
            .map_err(map_sqlx)?
            .map(|s| {
                serde_json::from_str(&s).map_err(|e| {
                    crate::error::other(format!("api_keys row has unreadable sessions {s:?}: {e}"))
                })
            })
            .transpose()?,
        request: row
            .try_get::<Option<String>, _>(8)
            .map_err(map_sqlx)?
            .map(RequestId::new),
    })
}

/// The stored form of [`ApiKey::sessions`]: a JSON array of session ids, or NULL.
fn sessions_json(k: &ApiKey) -> Result<Option<String>, StoreError> {
    k.sessions
        .as_ref()
        .map(|s| {
            serde_json::to_string(s)
                .map_err(|e| crate::error::other(format!("cannot encode a key's sessions: {e}")))
        })
        .transpose()
}

pub(crate) async fn create(pool: &SqlitePool, k: ApiKey) -> Result<(), StoreError> {
    k.validate()?;
    let done = sqlx::query(
        "INSERT INTO api_keys (id, name, scope, hash, created_at, expires_at, sessions, request) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
    )
    .bind(&k.id)
    .bind(&k.name)
    .bind(k.scope.as_str())
    .bind(&k.hash)
    .bind(k.created_at.0)
    .bind(k.expires_at.map(|t| t.0))
    .bind(sessions_json(&k)?)
    .bind(k.request.as_ref().map(|r| r.as_str().to_owned()))
    .execute(pool)
    .await
    .map_err(map_sqlx)?;
    if done.rows_affected() == 0 {
        return Err(k.exists());
    }
    Ok(())
}

pub(crate) async fn list(pool: &SqlitePool) -> Result<Vec<ApiKey>, StoreError> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLS} FROM api_keys ORDER BY created_at, id"
    )))
    .fetch_all(pool)
    .await
    .map_err(map_sqlx)?
    .iter()
    .map(key)
    .collect()
}

pub(crate) async fn revoke(
    pool: &SqlitePool,
    id: &str,
    now: Timestamp,
) -> Result<ApiKey, StoreError> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE api_keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ? RETURNING {COLS}"
    )))
    .bind(now.0)
    .bind(id)
    .fetch_optional(pool)
    .await
    .map_err(map_sqlx)?
    .ok_or_else(|| StoreError::not_found("api key", id))?;
    key(&row)
}

pub(crate) async fn by_hash(pool: &SqlitePool, hash: &str) -> Result<Option<ApiKey>, StoreError> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLS} FROM api_keys WHERE hash = ?"
    )))
    .bind(hash)
    .fetch_optional(pool)
    .await
    .map_err(map_sqlx)?
    .as_ref()
    .map(key)
    .transpose()
}
