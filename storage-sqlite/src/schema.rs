//! The embedded, versioned schema, applied on open.

use crate::error::map_sqlx;
use eve_core::StoreError;
use sqlx::{Row, SqliteConnection};

/// The schema version this build writes and reads.
pub(crate) const SCHEMA_VERSION: i64 = 8;

/// Migrations in order; entry `i` brings the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY,
    idempotency_key  TEXT NOT NULL UNIQUE,
    workflow_id      TEXT NOT NULL,
    deployment_id    TEXT NOT NULL,
    tool             TEXT NOT NULL,
    session_id       TEXT NOT NULL,
    call_id          TEXT NOT NULL,
    execution        TEXT NOT NULL,
    status           TEXT NOT NULL,
    next_seq         INTEGER NOT NULL,
    processed_seq    INTEGER NOT NULL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    activations      INTEGER NOT NULL DEFAULT 0,
    owner_worker     TEXT,
    owner_epoch      INTEGER,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    pending_at       INTEGER,
    timer_due        INTEGER,
    wake_at          INTEGER GENERATED ALWAYS AS (
        CASE WHEN status = 'running'
             THEN min(coalesce(pending_at, timer_due), coalesce(timer_due, pending_at)) END
    ) VIRTUAL
);
CREATE INDEX runs_session ON runs (session_id);
CREATE INDEX runs_status ON runs (status);
CREATE INDEX runs_created ON runs (created_at, run_id);
CREATE INDEX runs_owner ON runs (owner_worker, owner_epoch);
CREATE INDEX runs_wake ON runs (deployment_id, wake_at);

CREATE TABLE events (
    run_id    TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    count     INTEGER NOT NULL,
    at        INTEGER NOT NULL,
    version   INTEGER NOT NULL,
    body      BLOB NOT NULL,
    append_id TEXT,
    PRIMARY KEY (run_id, first_seq)
);
CREATE UNIQUE INDEX events_append_id ON events (run_id, append_id) WHERE append_id IS NOT NULL;

CREATE TABLE timers (
    run_id TEXT NOT NULL,
    cmd    INTEGER NOT NULL,
    due    INTEGER NOT NULL,
    PRIMARY KEY (run_id, cmd)
) WITHOUT ROWID;

CREATE TABLE hooks (
    token   TEXT PRIMARY KEY,
    run_id  TEXT NOT NULL,
    cmd     INTEGER NOT NULL,
    webhook INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX hooks_run ON hooks (run_id);

CREATE TABLE hook_dedupe (
    run_id TEXT NOT NULL,
    cmd    INTEGER NOT NULL,
    key    TEXT NOT NULL,
    seq    INTEGER NOT NULL,
    PRIMARY KEY (run_id, cmd, key)
) WITHOUT ROWID;

CREATE TABLE requests (
    request_id   TEXT PRIMARY KEY,
    run_id       TEXT NOT NULL,
    session_id   TEXT NOT NULL,
    cmd          INTEGER NOT NULL,
    request      TEXT NOT NULL,
    requested_at INTEGER NOT NULL,
    state        TEXT NOT NULL,
    response     TEXT,
    answered_seq INTEGER
);
CREATE INDEX requests_session ON requests (session_id, state);
CREATE INDEX requests_run ON requests (run_id, state);

CREATE TABLE session_log (
    session_id TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    at         INTEGER NOT NULL,
    run_id     TEXT NOT NULL,
    call_id    TEXT NOT NULL,
    event      TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE workers (
    worker_id  TEXT PRIMARY KEY,
    deployment TEXT NOT NULL,
    epoch      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    retired    INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
"#,
    r#"
CREATE TABLE api_keys (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    scope      TEXT NOT NULL,
    hash       TEXT NOT NULL UNIQUE,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);
"#,
    r#"
CREATE TABLE session_heads (
    session_id TEXT PRIMARY KEY,
    next_seq   INTEGER NOT NULL
) WITHOUT ROWID;
"#,
    // A keyed webhook delivery stays answerable after its run ended (the hook's token is then
    // released): the token is kept beside the key, backfilled from the live hooks.
    r#"
ALTER TABLE hook_dedupe ADD COLUMN token TEXT;
UPDATE hook_dedupe SET token = (SELECT h.token FROM hooks h
                                WHERE h.run_id = hook_dedupe.run_id AND h.cmd = hook_dedupe.cmd);
CREATE INDEX hook_dedupe_token ON hook_dedupe (token, key);
"#,
    // Contract clause 10: ended sessions and queued user messages.
    r#"
CREATE TABLE session_records (
    session_id   TEXT PRIMARY KEY,
    ended_at     INTEGER,
    next_message INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE TABLE session_messages (
    session_id TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    at         INTEGER NOT NULL,
    message    TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
"#,
    // API keys may expire (contract clause 8); existing keys never do.
    r#"
ALTER TABLE api_keys ADD COLUMN expires_at INTEGER;
"#,
    // Run attributes (`ctx.set_attributes`), indexed by (key, value) for `--query attr.k = v`;
    // `value` is the compact JSON of eve_core::search::index_value.
    r#"
CREATE TABLE run_attributes (
    run_id TEXT NOT NULL,
    key    TEXT NOT NULL,
    value  TEXT NOT NULL,
    PRIMARY KEY (run_id, key)
) WITHOUT ROWID;
CREATE INDEX run_attributes_key_value ON run_attributes (key, value);
"#,
    // Keys limited to sessions (a JSON array of session ids) and answer links (the one request
    // a link answers); existing keys are unlimited API keys.
    r#"
ALTER TABLE api_keys ADD COLUMN sessions TEXT;
ALTER TABLE api_keys ADD COLUMN request TEXT;
"#,
];

/// Brings the database to [`SCHEMA_VERSION`] in one `BEGIN IMMEDIATE` transaction, so two
/// processes opening a fresh file at once apply each migration once.
pub(crate) async fn migrate(conn: &mut SqliteConnection) -> Result<(), StoreError> {
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut *conn)
        .await
        .map_err(map_sqlx)?;
    let result = apply(conn).await;
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    let ended = sqlx::query(end).execute(&mut *conn).await.map_err(map_sqlx);
    result.and(ended.map(|_| ()))
}

async fn apply(conn: &mut SqliteConnection) -> Result<(), StoreError> {
    sqlx::query("CREATE TABLE IF NOT EXISTS eve_schema (version INTEGER NOT NULL)")
        .execute(&mut *conn)
        .await
        .map_err(map_sqlx)?;
    let row = sqlx::query("SELECT max(version) FROM eve_schema")
        .fetch_one(&mut *conn)
        .await
        .map_err(map_sqlx)?;
    let current: i64 = row
        .try_get::<Option<i64>, _>(0)
        .map_err(map_sqlx)?
        .unwrap_or(0);
    if current > SCHEMA_VERSION {
        return Err(StoreError::Other {
            backend: "sqlite",
            source: format!(
                "the database has schema version {current}, newer than this build's {SCHEMA_VERSION}; open it with a newer eve"
            )
            .into(),
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        sqlx::query(*sql)
            .execute(&mut *conn)
            .await
            .map_err(map_sqlx)?;
        sqlx::query("INSERT INTO eve_schema (version) VALUES (?)")
            .bind(i as i64 + 1)
            .execute(&mut *conn)
            .await
            .map_err(map_sqlx)?;
    }
    Ok(())
}
