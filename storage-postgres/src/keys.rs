//! API keys (contract clause 8) in the `api_keys` table: single-statement reads and writes.

use crate::error::{bad_row, map_err};
use crate::Db;
use eve_core::{ApiKey, KeyScope, RequestId, SessionId, StoreError, Timestamp};
use sqlx::postgres::PgRow;
use sqlx::Row;

const COLS: &str = "id, name, scope, hash, created_at, revoked_at, expires_at, sessions, request";

fn key(row: &PgRow) -> Result<ApiKey, StoreError> {
    let scope: String = row.try_get("scope").map_err(map_err)?;
    Ok(ApiKey {
        id: row.try_get("id").map_err(map_err)?,
        name: row.try_get("name").map_err(map_err)?,
        scope: KeyScope::parse(&scope).ok_or_else(|| bad_row("scope", &scope))?,
        hash: row.try_get("hash").map_err(map_err)?,
        created_at: Timestamp(row.try_get("created_at").map_err(map_err)?),
        revoked_at: row
            .try_get::<Option<i64>, _>("revoked_at")
            .map_err(map_err)?
            .map(Timestamp),
        expires_at: row
            .try_get::<Option<i64>, _>("expires_at")
            .map_err(map_err)?
            .map(Timestamp),
        sessions: row
            .try_get::<Option<Vec<String>>, _>("sessions")
            .map_err(map_err)?
            .map(|s| s.into_iter().map(SessionId::new).collect()),
        request: row
            .try_get::<Option<String>, _>("request")
            .map_err(map_err)?
            .map(RequestId::new),
    })
}

impl Db {
    pub(crate) async fn create_key(&self, k: ApiKey) -> Result<(), StoreError> {
        k.validate()?;
        let done = sqlx::query(self.sql(
            "INSERT INTO {s}.api_keys \
             (id, name, scope, hash, created_at, expires_at, sessions, request) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
        ))
        .bind(&k.id)
        .bind(&k.name)
        .bind(k.scope.as_str())
        .bind(&k.hash)
        .bind(k.created_at.0)
        .bind(k.expires_at.map(|t| t.0))
        .bind(
            k.sessions
                .as_ref()
                .map(|s| s.iter().map(|s| s.as_str().to_owned()).collect::<Vec<_>>()),
        )
        .bind(k.request.as_ref().map(|r| r.as_str().to_owned()))
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        if done.rows_affected() == 0 {
            return Err(k.exists());
        }
        Ok(())
    }

    pub(crate) async fn list_keys(&self) -> Result<Vec<ApiKey>, StoreError> {
        sqlx::query(self.sql(&format!(
            "SELECT {COLS} FROM {{s}}.api_keys ORDER BY created_at, id"
        )))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?
        .iter()
        .map(key)
        .collect()
    }

    pub(crate) async fn revoke_key(&self, id: &str, now: Timestamp) -> Result<ApiKey, StoreError> {
        let row = sqlx::query(self.sql(&format!(
            "UPDATE {{s}}.api_keys SET revoked_at = coalesce(revoked_at, $1) WHERE id = $2 \
             RETURNING {COLS}"
        )))
        .bind(now.0)
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?
        .ok_or_else(|| StoreError::not_found("api key", id))?;
        key(&row)
    }

    pub(crate) async fn key_by_hash(&self, hash: &str) -> Result<Option<ApiKey>, StoreError> {
        sqlx::query(self.sql(&format!(
            "SELECT {COLS} FROM {{s}}.api_keys WHERE hash = $1"
        )))
        .bind(hash)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?
        .as_ref()
        .map(key)
        .transpose()
    }
}
