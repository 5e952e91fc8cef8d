//! Schema names and the versioned migrations applied on connect.

use crate::error::map_err;
use eve_core::StoreError;
use sqlx::{AssertSqlSafe, PgPool};

/// The longest schema name accepted: the NOTIFY channel is `eve_<schema>` and Postgres
/// identifiers are at most 63 bytes.
pub(crate) const MAX_SCHEMA_LEN: usize = 58;

/// Checks that `schema` is a plain lowercase identifier (`[a-z_][a-z0-9_]*`, at most
/// [`MAX_SCHEMA_LEN`] bytes, not starting with `pg_`). It is still double-quoted in every
/// statement.
pub(crate) fn validate_schema(schema: &str) -> Result<(), StoreError> {
    let ok_first = schema
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let ok_rest = schema
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !ok_first || !ok_rest || schema.len() > MAX_SCHEMA_LEN || schema.starts_with("pg_") {
        return Err(StoreError::InvalidInput(format!(
            "schema name {schema:?} is not allowed: use 1 to {MAX_SCHEMA_LEN} characters of \
             a-z, 0-9 and _, starting with a letter or _, not starting with pg_"
        )));
    }
    Ok(())
}

/// The migrations, in order. `{s}` stands for the quoted schema. Never edit a released one:
/// add a new version.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "journal, runs, indexes, workers, sessions",
        r#"
CREATE TABLE {s}.runs (
    run_id           TEXT PRIMARY KEY,
    ord              BIGSERIAL NOT NULL UNIQUE,
    idempotency_key  TEXT NOT NULL UNIQUE,
    workflow_id      TEXT NOT NULL,
    deployment_id    TEXT NOT NULL,
    tool             TEXT NOT NULL,
    session_id       TEXT NOT NULL,
    call_id          TEXT NOT NULL,
    execution        TEXT NOT NULL,
    status           TEXT NOT NULL,
    next_seq         BIGINT NOT NULL,
    processed_seq    BIGINT NOT NULL,
    pending_at       BIGINT,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    activations      INTEGER NOT NULL DEFAULT 0,
    owner_worker     TEXT,
    owner_epoch      BIGINT,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
);
CREATE INDEX runs_deployment_status ON {s}.runs (deployment_id, status);
CREATE INDEX runs_session ON {s}.runs (session_id, ord);
CREATE INDEX runs_status ON {s}.runs (status, ord);
CREATE INDEX runs_owner ON {s}.runs (owner_worker, owner_epoch) WHERE owner_worker IS NOT NULL;

CREATE TABLE {s}.events (
    run_id    TEXT NOT NULL,
    first_seq BIGINT NOT NULL,
    count     INTEGER NOT NULL,
    at        BIGINT NOT NULL,
    version   SMALLINT NOT NULL,
    body      BYTEA NOT NULL,
    append_id TEXT,
    PRIMARY KEY (run_id, first_seq)
);
CREATE UNIQUE INDEX events_append_id ON {s}.events (run_id, append_id) WHERE append_id IS NOT NULL;

CREATE TABLE {s}.timers (
    run_id TEXT NOT NULL,
    cmd    BIGINT NOT NULL,
    due    BIGINT NOT NULL,
    PRIMARY KEY (run_id, cmd)
);

CREATE TABLE {s}.hooks (
    token   TEXT PRIMARY KEY,
    run_id  TEXT NOT NULL,
    cmd     BIGINT NOT NULL,
    webhook BOOLEAN NOT NULL
);
CREATE INDEX hooks_run ON {s}.hooks (run_id);

CREATE TABLE {s}.hook_dedupe (
    run_id TEXT NOT NULL,
    cmd    BIGINT NOT NULL,
    key    TEXT NOT NULL,
    seq    BIGINT NOT NULL,
    PRIMARY KEY (run_id, cmd, key)
);

CREATE TABLE {s}.requests (
    request_id   TEXT PRIMARY KEY,
    run_id       TEXT NOT NULL,
    session_id   TEXT NOT NULL,
    cmd          BIGINT NOT NULL,
    request      BYTEA NOT NULL,
    requested_at BIGINT NOT NULL,
    state        TEXT NOT NULL,
    response     BYTEA,
    answer_seq   BIGINT
);
CREATE INDEX requests_run ON {s}.requests (run_id) WHERE state = 'pending';
CREATE INDEX requests_session ON {s}.requests (session_id, requested_at) WHERE state = 'pending';

CREATE TABLE {s}.session_heads (
    session_id TEXT PRIMARY KEY,
    next_seq   BIGINT NOT NULL
);

CREATE TABLE {s}.session_log (
    session_id TEXT NOT NULL,
    seq        BIGINT NOT NULL,
    at         BIGINT NOT NULL,
    run_id     TEXT NOT NULL,
    call_id    TEXT NOT NULL,
    body       BYTEA NOT NULL,
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE {s}.workers (
    worker_id     TEXT PRIMARY KEY,
    deployment_id TEXT NOT NULL,
    epoch         BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL,
    retired       BOOLEAN NOT NULL DEFAULT FALSE
);
"#,
    ),
    (
        2,
        "api keys",
        r#"
CREATE TABLE {s}.api_keys (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    scope      TEXT NOT NULL,
    hash       TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT
);
"#,
    ),
    (
        3,
        "keyed webhook deliveries answerable after their run ended",
        r#"
ALTER TABLE {s}.hook_dedupe ADD COLUMN token TEXT;
UPDATE {s}.hook_dedupe d SET token = h.token
  FROM {s}.hooks h WHERE h.run_id = d.run_id AND h.cmd = d.cmd;
CREATE INDEX hook_dedupe_token ON {s}.hook_dedupe (token, key);
"#,
    ),
    (
        4,
        "sessions and turns: ended sessions and queued user messages",
        r#"
CREATE TABLE {s}.session_records (
    session_id   TEXT PRIMARY KEY,
    ended_at     BIGINT,
    next_message BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE {s}.session_messages (
    session_id TEXT NOT NULL,
    seq        BIGINT NOT NULL,
    at         BIGINT NOT NULL,
    message    TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
"#,
    ),
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// Creates the schema if needed and applies every migration not yet applied, each in its own
/// transaction under an advisory lock keyed by the schema name, so concurrent connects are safe
/// and a rerun is a no-op.
pub(crate) async fn migrate(pool: &PgPool, schema: &str, quoted: &str) -> Result<(), StoreError> {
    let mut tx = pool.begin().await.map_err(map_err)?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('eve-migrate:' || $1))")
        .bind(schema)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE SCHEMA IF NOT EXISTS {quoted}; \
         CREATE TABLE IF NOT EXISTS {quoted}.eve_migrations ( \
             version INTEGER PRIMARY KEY, description TEXT NOT NULL, \
             applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
    )))
    .execute(&mut *tx)
    .await
    .map_err(map_err)?;
    let applied: Option<i32> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT max(version) FROM {quoted}.eve_migrations"
    )))
    .fetch_one(&mut *tx)
    .await
    .map_err(map_err)?;
    let applied = applied.unwrap_or(0);
    if applied > SCHEMA_VERSION {
        return Err(StoreError::InvalidInput(format!(
            "schema {schema} is at version {applied}, newer than this build's {SCHEMA_VERSION}; \
             upgrade eve-storage-postgres"
        )));
    }
    for (version, description, sql) in MIGRATIONS.iter().filter(|m| m.0 > applied) {
        sqlx::raw_sql(AssertSqlSafe(sql.replace("{s}", quoted)))
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {quoted}.eve_migrations (version, description) VALUES ($1, $2)"
        )))
        .bind(version)
        .bind(description)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
    }
    tx.commit().await.map_err(map_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_validated() {
        for ok in ["eve", "_x", "eve_prod_2", &"a".repeat(MAX_SCHEMA_LEN)] {
            assert!(validate_schema(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Eve",
            "1eve",
            "eve-prod",
            "eve\"; DROP",
            "pg_catalog",
            &"a".repeat(MAX_SCHEMA_LEN + 1),
        ] {
            assert!(
                matches!(validate_schema(bad), Err(StoreError::InvalidInput(_))),
                "{bad}"
            );
        }
    }
}
