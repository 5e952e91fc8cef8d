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

/// Drops schema `schema` on the server at `url` with everything in it (`DROP SCHEMA IF EXISTS
/// … CASCADE`), over a connection of its own: what a test or a benchmark that made a fresh
/// schema calls so that it leaves nothing behind. A schema that does not exist is no error. A
/// store still open on the schema fails its next statement.
///
/// # Errors
/// `InvalidInput` for a malformed URL or a schema name a store would refuse; `Unavailable` when
/// the server does not answer; the server's error for the statement.
pub async fn drop_schema(url: &str, schema: &str) -> Result<(), StoreError> {
    use sqlx::Connection;
    validate_schema(schema)?;
    let mut conn = sqlx::PgConnection::connect_with(&crate::config::parse_url(url)?)
        .await
        .map_err(map_err)?;
    // Validated above: a plain lowercase identifier, so quoting it is enough.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
    )))
    .execute(&mut conn)
    .await
    .map_err(map_err)?;
    let _ = conn.close().await;
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
    (
        5,
        "appends and writes as server-side functions: one round trip per append or batch",
        r#"
-- A NOTIFY payload, or '*' (wake everything) when it is 8000 bytes or more (wake.rs `fit`).
CREATE FUNCTION {s}.eve_payload(p text) RETURNS text IMMUTABLE LANGUAGE sql AS
$fn$ SELECT CASE WHEN octet_length(p) < 8000 THEN p ELSE '*' END $fn$;

-- Writes events at p_first with the index changes they imply (commit.rs `effects_json` builds
-- p_fx from eve_core::Effects): the caller locked the run row and checked its preconditions.
-- p_append_id marks a worker append (sets processed_seq, resets activations); NULL a delivery,
-- which wakes the run's watchers, and idle workers when it leaves the run running with work no
-- worker has seen (nothing was unprocessed before it). Returns NULL, or the first hook token that another hook holds, after undoing the hooks it
-- inserted (nothing else is written before the hooks).
CREATE FUNCTION {s}.eve_write(
    p_run text, p_session text, p_call text, p_background boolean, p_first bigint,
    p_now bigint, p_version smallint, p_body bytea, p_append_id text, p_fx jsonb,
    p_channel text)
RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    v_count    integer := (p_fx->>'count')::integer;
    v_next     bigint  := p_first + (p_fx->>'count')::bigint;
    v_ended    boolean := (p_fx->>'ended')::boolean;
    v_worker   boolean := p_append_id IS NOT NULL;
    v_inserted text[];
    v_taken    text;
    v_req      jsonb;
    v_session  jsonb;
    v_status   text;
    v_processed bigint;
    v_deployment text;
    v_n        bigint;
    v_end      bigint;
BEGIN
    IF jsonb_array_length(p_fx->'hooks') > 0 THEN
        WITH want AS (
            SELECT h->>0 AS token, (h->>1)::bigint AS cmd, (h->>2)::boolean AS webhook, i
            FROM jsonb_array_elements(p_fx->'hooks') WITH ORDINALITY AS u(h, i)),
        ins AS (
            INSERT INTO {s}.hooks (token, run_id, cmd, webhook)
            SELECT token, p_run, cmd, webhook FROM want
            ON CONFLICT (token) DO NOTHING RETURNING token)
        SELECT (SELECT array_agg(ins.token) FROM ins),
               (SELECT want.token FROM want
                WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.token = want.token)
                ORDER BY want.i LIMIT 1)
        INTO v_inserted, v_taken;
        IF v_taken IS NOT NULL THEN
            DELETE FROM {s}.hooks WHERE token = ANY(v_inserted);
            RETURN v_taken;
        END IF;
    END IF;
    INSERT INTO {s}.events (run_id, first_seq, count, at, version, body, append_id)
    VALUES (p_run, p_first, v_count, p_now, p_version, p_body, p_append_id);
    UPDATE {s}.runs SET next_seq = v_next, updated_at = p_now,
        status = coalesce(p_fx->>'status', status),
        cancel_requested = cancel_requested OR (p_fx->>'cancel')::boolean,
        owner_worker = CASE WHEN v_ended THEN NULL ELSE owner_worker END,
        owner_epoch = CASE WHEN v_ended THEN NULL ELSE owner_epoch END,
        processed_seq = CASE WHEN v_worker THEN v_next ELSE processed_seq END,
        activations = CASE WHEN v_worker THEN 0 ELSE activations END,
        pending_at = CASE WHEN v_worker THEN NULL
                          WHEN processed_seq < p_first THEN pending_at ELSE p_now END
    WHERE run_id = p_run
    RETURNING status, processed_seq, deployment_id INTO v_status, v_processed, v_deployment;
    IF v_ended THEN
        DELETE FROM {s}.timers WHERE run_id = p_run;
    ELSE
        -- Sets first (p_fx holds one per cmd), then clears, as MemoryStore applies them.
        IF jsonb_array_length(p_fx->'timers_set') > 0 THEN
            INSERT INTO {s}.timers (run_id, cmd, due)
            SELECT p_run, (t->>0)::bigint, (t->>1)::bigint
            FROM jsonb_array_elements(p_fx->'timers_set') AS u(t)
            ON CONFLICT (run_id, cmd) DO UPDATE SET due = excluded.due;
        END IF;
        IF jsonb_array_length(p_fx->'timers_cleared') > 0 THEN
            DELETE FROM {s}.timers WHERE run_id = p_run AND cmd IN
                (SELECT c::bigint FROM jsonb_array_elements_text(p_fx->'timers_cleared') AS u(c));
        END IF;
    END IF;
    FOR v_req IN SELECT r FROM jsonb_array_elements(p_fx->'requests_opened') AS u(r) LOOP
        INSERT INTO {s}.requests (request_id, run_id, session_id, cmd, request, requested_at, state)
        VALUES (v_req->>0, p_run, p_session, (v_req->>1)::bigint, convert_to(v_req->>2, 'UTF8'),
                p_now, 'pending')
        ON CONFLICT (request_id) DO UPDATE SET run_id = excluded.run_id,
            session_id = excluded.session_id, cmd = excluded.cmd, request = excluded.request,
            requested_at = excluded.requested_at, state = 'pending', response = NULL,
            answer_seq = NULL;
    END LOOP;
    IF jsonb_array_length(p_fx->'requests_closed') > 0 THEN
        UPDATE {s}.requests SET state = 'withdrawn'
        WHERE request_id IN (SELECT jsonb_array_elements_text(p_fx->'requests_closed'))
          AND state = 'pending';
    END IF;
    IF v_ended THEN
        UPDATE {s}.requests SET state = 'withdrawn' WHERE run_id = p_run AND state = 'pending';
        DELETE FROM {s}.hooks WHERE run_id = p_run;
    END IF;
    v_session := CASE WHEN p_background AND p_fx ? 'session_background'
                      THEN p_fx->'session_background' ELSE p_fx->'session' END;
    v_n := jsonb_array_length(v_session);
    IF v_n > 0 THEN
        INSERT INTO {s}.session_heads (session_id, next_seq) VALUES (p_session, v_n)
        ON CONFLICT (session_id) DO UPDATE SET next_seq = {s}.session_heads.next_seq + v_n
        RETURNING next_seq INTO v_end;
        INSERT INTO {s}.session_log (session_id, seq, at, run_id, call_id, body)
        SELECT p_session, v_end - v_n + i - 1, p_now, p_run, p_call, convert_to(b, 'UTF8')
        FROM jsonb_array_elements_text(v_session) WITH ORDINALITY AS u(b, i);
        PERFORM pg_notify(p_channel, {s}.eve_payload('s:' || p_session));
    END IF;
    IF NOT v_worker THEN
        PERFORM pg_notify(p_channel, {s}.eve_payload('r:' || p_run));
        IF v_status = 'running' AND v_processed >= p_first THEN
            PERFORM pg_notify(p_channel, {s}.eve_payload('d:' || v_deployment));
        END IF;
    END IF;
    RETURN NULL;
END
$fn$;

-- One worker append: locks the run row, then (fresh snapshots, after the lock) finds a landed
-- append with p_append_id, checks status, owner and the owner worker's epoch, and the expected
-- seq, in MemoryStore's order, and writes through eve_write. A failed check writes nothing.
-- outcome: ok | duplicate (o_first, o_next of the landed append) | not_found | ended | fenced
-- | conflict (o_next = the journal's next seq) | token_taken (o_detail = the token).
-- The lock-then-read and the lease check are written out here and in the functions below rather
-- than called: as nested PL/pgSQL calls they cost about 0.08 ms per append (W1 went from 4.3
-- to 5.3 ms per call).
CREATE FUNCTION {s}.eve_append(
    p_run text, p_append_id text, p_expected bigint, p_worker text, p_epoch bigint,
    p_now bigint, p_version smallint, p_body bytea, p_fx jsonb, p_channel text,
    OUT outcome text, OUT o_first bigint, OUT o_next bigint, OUT o_detail text)
LANGUAGE plpgsql AS $fn$
DECLARE
    r {s}.runs%ROWTYPE;
BEGIN
    -- Lock, then read with a fresh snapshot (a statement that waited for the lock would keep
    -- the other rows of its old one).
    PERFORM 1 FROM {s}.runs WHERE run_id = p_run FOR UPDATE;
    SELECT * INTO r FROM {s}.runs WHERE run_id = p_run;
    IF r.run_id IS NULL THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    SELECT e.first_seq, e.first_seq + e.count INTO o_first, o_next
    FROM {s}.events e WHERE e.run_id = p_run AND e.append_id = p_append_id;
    IF FOUND THEN
        outcome := 'duplicate';
        RETURN;
    END IF;
    IF r.status IN ('completed', 'failed', 'cancelled') THEN
        outcome := 'ended';
        RETURN;
    END IF;
    IF r.owner_worker IS DISTINCT FROM p_worker OR r.owner_epoch IS DISTINCT FROM p_epoch
       OR NOT EXISTS (SELECT 1 FROM {s}.workers w
                      WHERE w.worker_id = p_worker AND w.epoch = p_epoch AND NOT w.retired) THEN
        outcome := 'fenced';
        RETURN;
    END IF;
    IF r.next_seq <> p_expected THEN
        outcome := 'conflict';
        o_next := r.next_seq;
        RETURN;
    END IF;
    o_detail := {s}.eve_write(p_run, r.session_id, r.call_id, r.execution = 'background',
        r.next_seq, p_now, p_version, p_body, p_append_id, p_fx, p_channel);
    IF o_detail IS NOT NULL THEN
        outcome := 'token_taken';
        RETURN;
    END IF;
    outcome := 'ok';
    o_first := r.next_seq;
    o_next := r.next_seq + (p_fx->>'count')::bigint;
END
$fn$;

-- A hook delivery, p_body being HookReceived for (p_run, p_cmd), which the caller read from the
-- token: locks the run row, then re-checks that the token is still the run's hook (a run that
-- ended released it meanwhile) and the dedupe key, writes through eve_write and records the key.
-- outcome: ok | duplicate (o_seq of the accepted delivery) | not_found (no such run) | released
-- (the token is no longer this run's hook).
CREATE FUNCTION {s}.eve_deliver_hook(
    p_token text, p_run text, p_cmd bigint, p_key text, p_now bigint, p_version smallint,
    p_body bytea, p_channel text, OUT outcome text, OUT o_seq bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    r {s}.runs%ROWTYPE;
BEGIN
    PERFORM 1 FROM {s}.runs WHERE run_id = p_run FOR UPDATE;
    SELECT * INTO r FROM {s}.runs WHERE run_id = p_run;
    IF r.run_id IS NULL THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    PERFORM 1 FROM {s}.hooks WHERE token = p_token AND run_id = p_run AND cmd = p_cmd;
    IF NOT FOUND THEN
        outcome := 'released';
        RETURN;
    END IF;
    IF p_key IS NOT NULL THEN
        SELECT d.seq INTO o_seq FROM {s}.hook_dedupe d
        WHERE d.run_id = p_run AND d.cmd = p_cmd AND d.key = p_key;
        IF FOUND THEN
            outcome := 'duplicate';
            RETURN;
        END IF;
    END IF;
    PERFORM {s}.eve_write(p_run, r.session_id, r.call_id, r.execution = 'background',
        r.next_seq, p_now, p_version, p_body, NULL,
        jsonb_build_object('count', 1, 'ended', false, 'cancel', false), p_channel);
    IF p_key IS NOT NULL THEN
        INSERT INTO {s}.hook_dedupe (run_id, cmd, key, seq, token)
        VALUES (p_run, p_cmd, p_key, r.next_seq, p_token);
    END IF;
    outcome := 'ok';
    o_seq := r.next_seq;
END
$fn$;

-- An answer, p_body being its InputAnswered and p_fx its effects, which the
-- caller checked against the request it read: locks the run row, then the request row, re-checks
-- the request's state and the run's status, writes through eve_write and marks the request
-- answered. outcome: ok (o_seq) | answered (o_seq, o_response: the answer accepted before) |
-- withdrawn (the request, or the run ended) | not_found (no such run or request).
CREATE FUNCTION {s}.eve_answer(
    p_request text, p_run text, p_response bytea, p_now bigint, p_version smallint,
    p_body bytea, p_fx jsonb, p_channel text,
    OUT outcome text, OUT o_seq bigint, OUT o_response bytea)
LANGUAGE plpgsql AS $fn$
DECLARE
    r       {s}.runs%ROWTYPE;
    v_state text;
BEGIN
    PERFORM 1 FROM {s}.runs WHERE run_id = p_run FOR UPDATE;
    SELECT * INTO r FROM {s}.runs WHERE run_id = p_run;
    IF r.run_id IS NULL THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    SELECT q.state, q.response, q.answer_seq INTO v_state, o_response, o_seq
    FROM {s}.requests q WHERE q.request_id = p_request AND q.run_id = p_run FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    IF v_state <> 'pending' THEN
        outcome := v_state;
        RETURN;
    END IF;
    IF r.status IN ('completed', 'failed', 'cancelled') THEN
        outcome := 'withdrawn';
        RETURN;
    END IF;
    PERFORM {s}.eve_write(p_run, r.session_id, r.call_id, r.execution = 'background',
        r.next_seq, p_now, p_version, p_body, NULL,
        p_fx, p_channel);
    UPDATE {s}.requests SET state = 'answered', response = p_response, answer_seq = r.next_seq
    WHERE request_id = p_request;
    outcome := 'ok';
    o_seq := r.next_seq;
    o_response := NULL;
END
$fn$;

-- A release by the run's owner: locks the run row, checks the lease as eve_append does, clears
-- the owner, raises processed_seq to p_processed (at most the journal's end; pending_at then
-- becomes the time of the first event left unprocessed) and wakes idle workers if the run still
-- has work (unprocessed events or a timer). Returns ok | not_found | fenced.
CREATE FUNCTION {s}.eve_release(
    p_run text, p_worker text, p_epoch bigint, p_processed bigint, p_now bigint,
    p_channel text)
RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    r           {s}.runs%ROWTYPE;
    v_processed bigint;
    v_pending   bigint;
BEGIN
    PERFORM 1 FROM {s}.runs WHERE run_id = p_run FOR UPDATE;
    SELECT * INTO r FROM {s}.runs WHERE run_id = p_run;
    IF r.run_id IS NULL THEN
        RETURN 'not_found';
    END IF;
    IF r.owner_worker IS DISTINCT FROM p_worker OR r.owner_epoch IS DISTINCT FROM p_epoch
       OR NOT EXISTS (SELECT 1 FROM {s}.workers w
                      WHERE w.worker_id = p_worker AND w.epoch = p_epoch AND NOT w.retired) THEN
        RETURN 'fenced';
    END IF;
    v_processed := greatest(r.processed_seq, least(p_processed, r.next_seq));
    v_pending := CASE
        WHEN v_processed = r.processed_seq THEN r.pending_at
        WHEN v_processed >= r.next_seq THEN NULL
        ELSE (SELECT e.at FROM {s}.events e WHERE e.run_id = p_run AND e.first_seq <= v_processed
              ORDER BY e.first_seq DESC LIMIT 1) END;
    UPDATE {s}.runs SET owner_worker = NULL, owner_epoch = NULL, updated_at = p_now,
        processed_seq = v_processed, pending_at = v_pending
    WHERE run_id = p_run;
    IF r.status = 'running' AND (v_pending IS NOT NULL
        OR EXISTS (SELECT 1 FROM {s}.timers t WHERE t.run_id = p_run)) THEN
        PERFORM pg_notify(p_channel, {s}.eve_payload('d:' || r.deployment_id));
    END IF;
    RETURN 'ok';
END
$fn$;
"#,
    ),
    (
        6,
        "API keys may expire; existing keys never do",
        r#"
ALTER TABLE {s}.api_keys ADD COLUMN expires_at BIGINT;
"#,
    ),
    (
        7,
        "run attributes (ctx.set_attributes), indexed by (key, value); eve_write applies them",
        r#"
CREATE TABLE {s}.run_attributes (
    run_id text NOT NULL,
    key    text NOT NULL,
    value  text NOT NULL,
    PRIMARY KEY (run_id, key)
);
CREATE INDEX run_attributes_key_value ON {s}.run_attributes (key, value);

-- As version 5's, plus the attribute changes of p_fx->'attributes'.
CREATE OR REPLACE FUNCTION {s}.eve_write(
    p_run text, p_session text, p_call text, p_background boolean, p_first bigint,
    p_now bigint, p_version smallint, p_body bytea, p_append_id text, p_fx jsonb,
    p_channel text)
RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    v_count    integer := (p_fx->>'count')::integer;
    v_next     bigint  := p_first + (p_fx->>'count')::bigint;
    v_ended    boolean := (p_fx->>'ended')::boolean;
    v_worker   boolean := p_append_id IS NOT NULL;
    v_inserted text[];
    v_taken    text;
    v_req      jsonb;
    v_session  jsonb;
    v_status   text;
    v_processed bigint;
    v_deployment text;
    v_n        bigint;
    v_end      bigint;
    v_attr     jsonb;
BEGIN
    IF jsonb_array_length(p_fx->'hooks') > 0 THEN
        WITH want AS (
            SELECT h->>0 AS token, (h->>1)::bigint AS cmd, (h->>2)::boolean AS webhook, i
            FROM jsonb_array_elements(p_fx->'hooks') WITH ORDINALITY AS u(h, i)),
        ins AS (
            INSERT INTO {s}.hooks (token, run_id, cmd, webhook)
            SELECT token, p_run, cmd, webhook FROM want
            ON CONFLICT (token) DO NOTHING RETURNING token)
        SELECT (SELECT array_agg(ins.token) FROM ins),
               (SELECT want.token FROM want
                WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.token = want.token)
                ORDER BY want.i LIMIT 1)
        INTO v_inserted, v_taken;
        IF v_taken IS NOT NULL THEN
            DELETE FROM {s}.hooks WHERE token = ANY(v_inserted);
            RETURN v_taken;
        END IF;
    END IF;
    INSERT INTO {s}.events (run_id, first_seq, count, at, version, body, append_id)
    VALUES (p_run, p_first, v_count, p_now, p_version, p_body, p_append_id);
    UPDATE {s}.runs SET next_seq = v_next, updated_at = p_now,
        status = coalesce(p_fx->>'status', status),
        cancel_requested = cancel_requested OR (p_fx->>'cancel')::boolean,
        owner_worker = CASE WHEN v_ended THEN NULL ELSE owner_worker END,
        owner_epoch = CASE WHEN v_ended THEN NULL ELSE owner_epoch END,
        processed_seq = CASE WHEN v_worker THEN v_next ELSE processed_seq END,
        activations = CASE WHEN v_worker THEN 0 ELSE activations END,
        pending_at = CASE WHEN v_worker THEN NULL
                          WHEN processed_seq < p_first THEN pending_at ELSE p_now END
    WHERE run_id = p_run
    RETURNING status, processed_seq, deployment_id INTO v_status, v_processed, v_deployment;
    -- Attribute changes, one per key (the last of the append): [key, value] sets (value is
    -- eve_core::search::index_value), [key, null] removes.
    FOR v_attr IN SELECT a FROM jsonb_array_elements(coalesce(p_fx->'attributes', '[]'::jsonb)) AS u(a) LOOP
        IF jsonb_typeof(v_attr->1) = 'null' THEN
            DELETE FROM {s}.run_attributes WHERE run_id = p_run AND key = v_attr->>0;
        ELSE
            INSERT INTO {s}.run_attributes (run_id, key, value)
            VALUES (p_run, v_attr->>0, v_attr->>1)
            ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value;
        END IF;
    END LOOP;
    IF v_ended THEN
        DELETE FROM {s}.timers WHERE run_id = p_run;
    ELSE
        -- Sets first (p_fx holds one per cmd), then clears, as MemoryStore applies them.
        IF jsonb_array_length(p_fx->'timers_set') > 0 THEN
            INSERT INTO {s}.timers (run_id, cmd, due)
            SELECT p_run, (t->>0)::bigint, (t->>1)::bigint
            FROM jsonb_array_elements(p_fx->'timers_set') AS u(t)
            ON CONFLICT (run_id, cmd) DO UPDATE SET due = excluded.due;
        END IF;
        IF jsonb_array_length(p_fx->'timers_cleared') > 0 THEN
            DELETE FROM {s}.timers WHERE run_id = p_run AND cmd IN
                (SELECT c::bigint FROM jsonb_array_elements_text(p_fx->'timers_cleared') AS u(c));
        END IF;
    END IF;
    FOR v_req IN SELECT r FROM jsonb_array_elements(p_fx->'requests_opened') AS u(r) LOOP
        INSERT INTO {s}.requests (request_id, run_id, session_id, cmd, request, requested_at, state)
        VALUES (v_req->>0, p_run, p_session, (v_req->>1)::bigint, convert_to(v_req->>2, 'UTF8'),
                p_now, 'pending')
        ON CONFLICT (request_id) DO UPDATE SET run_id = excluded.run_id,
            session_id = excluded.session_id, cmd = excluded.cmd, request = excluded.request,
            requested_at = excluded.requested_at, state = 'pending', response = NULL,
            answer_seq = NULL;
    END LOOP;
    IF jsonb_array_length(p_fx->'requests_closed') > 0 THEN
        UPDATE {s}.requests SET state = 'withdrawn'
        WHERE request_id IN (SELECT jsonb_array_elements_text(p_fx->'requests_closed'))
          AND state = 'pending';
    END IF;
    IF v_ended THEN
        UPDATE {s}.requests SET state = 'withdrawn' WHERE run_id = p_run AND state = 'pending';
        DELETE FROM {s}.hooks WHERE run_id = p_run;
    END IF;
    v_session := CASE WHEN p_background AND p_fx ? 'session_background'
                      THEN p_fx->'session_background' ELSE p_fx->'session' END;
    v_n := jsonb_array_length(v_session);
    IF v_n > 0 THEN
        INSERT INTO {s}.session_heads (session_id, next_seq) VALUES (p_session, v_n)
        ON CONFLICT (session_id) DO UPDATE SET next_seq = {s}.session_heads.next_seq + v_n
        RETURNING next_seq INTO v_end;
        INSERT INTO {s}.session_log (session_id, seq, at, run_id, call_id, body)
        SELECT p_session, v_end - v_n + i - 1, p_now, p_run, p_call, convert_to(b, 'UTF8')
        FROM jsonb_array_elements_text(v_session) WITH ORDINALITY AS u(b, i);
        PERFORM pg_notify(p_channel, {s}.eve_payload('s:' || p_session));
    END IF;
    IF NOT v_worker THEN
        PERFORM pg_notify(p_channel, {s}.eve_payload('r:' || p_run));
        IF v_status = 'running' AND v_processed >= p_first THEN
            PERFORM pg_notify(p_channel, {s}.eve_payload('d:' || v_deployment));
        END IF;
    END IF;
    RETURN NULL;
END
$fn$;
"#,
    ),
    (
        8,
        "fewer statements per worker append: lock and read the run at once, the dedupe and lease checks in one read, loops only when there is something to loop over",
        r#"
-- As version 7's, with the attribute and request loops run only when p_fx has some (each
-- loop is a query, run at every append before).
CREATE OR REPLACE FUNCTION {s}.eve_write(
    p_run text, p_session text, p_call text, p_background boolean, p_first bigint,
    p_now bigint, p_version smallint, p_body bytea, p_append_id text, p_fx jsonb,
    p_channel text)
RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    v_count    integer := (p_fx->>'count')::integer;
    v_next     bigint  := p_first + (p_fx->>'count')::bigint;
    v_ended    boolean := (p_fx->>'ended')::boolean;
    v_worker   boolean := p_append_id IS NOT NULL;
    v_inserted text[];
    v_taken    text;
    v_req      jsonb;
    v_session  jsonb;
    v_status   text;
    v_processed bigint;
    v_deployment text;
    v_n        bigint;
    v_end      bigint;
    v_attr     jsonb;
BEGIN
    IF jsonb_array_length(p_fx->'hooks') > 0 THEN
        WITH want AS (
            SELECT h->>0 AS token, (h->>1)::bigint AS cmd, (h->>2)::boolean AS webhook, i
            FROM jsonb_array_elements(p_fx->'hooks') WITH ORDINALITY AS u(h, i)),
        ins AS (
            INSERT INTO {s}.hooks (token, run_id, cmd, webhook)
            SELECT token, p_run, cmd, webhook FROM want
            ON CONFLICT (token) DO NOTHING RETURNING token)
        SELECT (SELECT array_agg(ins.token) FROM ins),
               (SELECT want.token FROM want
                WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.token = want.token)
                ORDER BY want.i LIMIT 1)
        INTO v_inserted, v_taken;
        IF v_taken IS NOT NULL THEN
            DELETE FROM {s}.hooks WHERE token = ANY(v_inserted);
            RETURN v_taken;
        END IF;
    END IF;
    INSERT INTO {s}.events (run_id, first_seq, count, at, version, body, append_id)
    VALUES (p_run, p_first, v_count, p_now, p_version, p_body, p_append_id);
    UPDATE {s}.runs SET next_seq = v_next, updated_at = p_now,
        status = coalesce(p_fx->>'status', status),
        cancel_requested = cancel_requested OR (p_fx->>'cancel')::boolean,
        owner_worker = CASE WHEN v_ended THEN NULL ELSE owner_worker END,
        owner_epoch = CASE WHEN v_ended THEN NULL ELSE owner_epoch END,
        processed_seq = CASE WHEN v_worker THEN v_next ELSE processed_seq END,
        activations = CASE WHEN v_worker THEN 0 ELSE activations END,
        pending_at = CASE WHEN v_worker THEN NULL
                          WHEN processed_seq < p_first THEN pending_at ELSE p_now END
    WHERE run_id = p_run
    RETURNING status, processed_seq, deployment_id INTO v_status, v_processed, v_deployment;
    -- Attribute changes, one per key (the last of the append): [key, value] sets (value is
    -- eve_core::search::index_value), [key, null] removes.
    IF jsonb_array_length(coalesce(p_fx->'attributes', '[]'::jsonb)) > 0 THEN
    FOR v_attr IN SELECT a FROM jsonb_array_elements(p_fx->'attributes') AS u(a) LOOP
        IF jsonb_typeof(v_attr->1) = 'null' THEN
            DELETE FROM {s}.run_attributes WHERE run_id = p_run AND key = v_attr->>0;
        ELSE
            INSERT INTO {s}.run_attributes (run_id, key, value)
            VALUES (p_run, v_attr->>0, v_attr->>1)
            ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value;
        END IF;
    END LOOP;
    END IF;
    IF v_ended THEN
        DELETE FROM {s}.timers WHERE run_id = p_run;
    ELSE
        -- Sets first (p_fx holds one per cmd), then clears, as MemoryStore applies them.
        IF jsonb_array_length(p_fx->'timers_set') > 0 THEN
            INSERT INTO {s}.timers (run_id, cmd, due)
            SELECT p_run, (t->>0)::bigint, (t->>1)::bigint
            FROM jsonb_array_elements(p_fx->'timers_set') AS u(t)
            ON CONFLICT (run_id, cmd) DO UPDATE SET due = excluded.due;
        END IF;
        IF jsonb_array_length(p_fx->'timers_cleared') > 0 THEN
            DELETE FROM {s}.timers WHERE run_id = p_run AND cmd IN
                (SELECT c::bigint FROM jsonb_array_elements_text(p_fx->'timers_cleared') AS u(c));
        END IF;
    END IF;
    IF jsonb_array_length(p_fx->'requests_opened') > 0 THEN
    FOR v_req IN SELECT r FROM jsonb_array_elements(p_fx->'requests_opened') AS u(r) LOOP
        INSERT INTO {s}.requests (request_id, run_id, session_id, cmd, request, requested_at, state)
        VALUES (v_req->>0, p_run, p_session, (v_req->>1)::bigint, convert_to(v_req->>2, 'UTF8'),
                p_now, 'pending')
        ON CONFLICT (request_id) DO UPDATE SET run_id = excluded.run_id,
            session_id = excluded.session_id, cmd = excluded.cmd, request = excluded.request,
            requested_at = excluded.requested_at, state = 'pending', response = NULL,
            answer_seq = NULL;
    END LOOP;
    END IF;
    IF jsonb_array_length(p_fx->'requests_closed') > 0 THEN
        UPDATE {s}.requests SET state = 'withdrawn'
        WHERE request_id IN (SELECT jsonb_array_elements_text(p_fx->'requests_closed'))
          AND state = 'pending';
    END IF;
    IF v_ended THEN
        UPDATE {s}.requests SET state = 'withdrawn' WHERE run_id = p_run AND state = 'pending';
        DELETE FROM {s}.hooks WHERE run_id = p_run;
    END IF;
    v_session := CASE WHEN p_background AND p_fx ? 'session_background'
                      THEN p_fx->'session_background' ELSE p_fx->'session' END;
    v_n := jsonb_array_length(v_session);
    IF v_n > 0 THEN
        INSERT INTO {s}.session_heads (session_id, next_seq) VALUES (p_session, v_n)
        ON CONFLICT (session_id) DO UPDATE SET next_seq = {s}.session_heads.next_seq + v_n
        RETURNING next_seq INTO v_end;
        INSERT INTO {s}.session_log (session_id, seq, at, run_id, call_id, body)
        SELECT p_session, v_end - v_n + i - 1, p_now, p_run, p_call, convert_to(b, 'UTF8')
        FROM jsonb_array_elements_text(v_session) WITH ORDINALITY AS u(b, i);
        PERFORM pg_notify(p_channel, {s}.eve_payload('s:' || p_session));
    END IF;
    IF NOT v_worker THEN
        PERFORM pg_notify(p_channel, {s}.eve_payload('r:' || p_run));
        IF v_status = 'running' AND v_processed >= p_first THEN
            PERFORM pg_notify(p_channel, {s}.eve_payload('d:' || v_deployment));
        END IF;
    END IF;
    RETURN NULL;
END
$fn$;

-- As version 5's eve_append, in fewer statements: the run row is locked and read by one
-- statement (a single-table SELECT … FOR UPDATE that waited for the lock returns the row as the
-- lock holder left it), and the landed-append lookup and the worker's lease are read together
-- by the next (a fresh snapshot, after the lock). Checks in MemoryStore's order, as before.
CREATE OR REPLACE FUNCTION {s}.eve_append(
    p_run text, p_append_id text, p_expected bigint, p_worker text, p_epoch bigint,
    p_now bigint, p_version smallint, p_body bytea, p_fx jsonb, p_channel text,
    OUT outcome text, OUT o_first bigint, OUT o_next bigint, OUT o_detail text)
LANGUAGE plpgsql AS $fn$
DECLARE
    r {s}.runs%ROWTYPE;
    v_live boolean;
BEGIN
    SELECT * INTO r FROM {s}.runs WHERE run_id = p_run FOR UPDATE;
    IF r.run_id IS NULL THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    SELECT e.first_seq, e.first_seq + e.count,
           EXISTS (SELECT 1 FROM {s}.workers w
                   WHERE w.worker_id = p_worker AND w.epoch = p_epoch AND NOT w.retired)
    INTO o_first, o_next, v_live
    FROM (SELECT 1) AS one
    LEFT JOIN {s}.events e ON e.run_id = p_run AND e.append_id = p_append_id;
    IF o_first IS NOT NULL THEN
        outcome := 'duplicate';
        RETURN;
    END IF;
    IF r.status IN ('completed', 'failed', 'cancelled') THEN
        outcome := 'ended';
        RETURN;
    END IF;
    IF r.owner_worker IS DISTINCT FROM p_worker OR r.owner_epoch IS DISTINCT FROM p_epoch
       OR NOT v_live THEN
        outcome := 'fenced';
        RETURN;
    END IF;
    IF r.next_seq <> p_expected THEN
        outcome := 'conflict';
        o_next := r.next_seq;
        RETURN;
    END IF;
    o_detail := {s}.eve_write(p_run, r.session_id, r.call_id, r.execution = 'background',
        r.next_seq, p_now, p_version, p_body, p_append_id, p_fx, p_channel);
    IF o_detail IS NOT NULL THEN
        outcome := 'token_taken';
        RETURN;
    END IF;
    outcome := 'ok';
    o_first := r.next_seq;
    o_next := r.next_seq + (p_fx->>'count')::bigint;
END
$fn$;
"#,
    ),
    (
        9,
        "a group-commit batch as one function call, its plain appends applied set-based",
        r#"
-- A writer's batch of worker appends in one call: every run of the batch is locked in run id
-- order, then the appends marked plain in p_plain (commit.rs: distinct runs, effects limited to
-- the count, status, cancel and timers) are checked by one read and written by one statement per
-- table; the others go through eve_append one by one, in order. Outcomes as eve_append's, one
-- row per append in input order. Checks and writes are those of eve_append and eve_write.
CREATE FUNCTION {s}.eve_append_batch(
    p_runs text[], p_ids text[], p_expected bigint[], p_workers text[], p_epochs bigint[],
    p_nows bigint[], p_version smallint, p_bodies bytea[], p_fxs jsonb[], p_plain boolean[],
    p_channel text, p_repeated text[])
RETURNS TABLE (outcome text, o_first bigint, o_next bigint, o_detail text)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_n       integer := cardinality(p_runs);
    v_outcome text[];
    v_first   bigint[];
    v_next    bigint[];
    v_detail  text[] := array_fill(NULL::text, ARRAY[cardinality(p_runs)]);
    v_timers  boolean;
    v_ok      boolean;
    o         record;
BEGIN
    PERFORM 1 FROM {s}.runs WHERE run_id = ANY(p_runs) ORDER BY run_id FOR UPDATE;
    -- After the locks, a fresh snapshot: MemoryStore's order of checks, for the plain appends.
    SELECT array_agg(c.outcome ORDER BY c.i),
           array_agg(CASE c.outcome WHEN 'ok' THEN c.at WHEN 'duplicate' THEN c.dup_first END
                     ORDER BY c.i),
           array_agg(CASE c.outcome WHEN 'ok' THEN c.at + (c.fx->>'count')::bigint
                                    WHEN 'duplicate' THEN c.dup_next
                                    WHEN 'conflict' THEN c.at END ORDER BY c.i),
           coalesce(bool_or(c.outcome = 'ok'), false),
           coalesce(bool_or(c.outcome = 'ok' AND (jsonb_array_length(c.fx->'timers_set') > 0
                            OR jsonb_array_length(c.fx->'timers_cleared') > 0)), false)
    INTO v_outcome, v_first, v_next, v_ok, v_timers
    FROM (
        SELECT q.i, q.fx,
               CASE WHEN NOT q.plain THEN NULL
                    WHEN r.run_id IS NULL THEN 'not_found'
                    WHEN e.first_seq IS NOT NULL THEN 'duplicate'
                    WHEN r.status IN ('completed', 'failed', 'cancelled') THEN 'ended'
                    WHEN r.owner_worker IS DISTINCT FROM q.worker
                         OR r.owner_epoch IS DISTINCT FROM q.epoch
                         OR NOT EXISTS (SELECT 1 FROM {s}.workers w WHERE w.worker_id = q.worker
                                        AND w.epoch = q.epoch AND NOT w.retired) THEN 'fenced'
                    WHEN r.next_seq <> q.expected THEN 'conflict'
                    ELSE 'ok' END AS outcome,
               r.next_seq AS at, e.first_seq AS dup_first, e.first_seq + e.count AS dup_next
        FROM unnest(p_runs, p_ids, p_expected, p_workers, p_epochs, p_fxs, p_plain)
             WITH ORDINALITY AS q(run, id, expected, worker, epoch, fx, plain, i)
        -- LIMIT 1 keeps the lookups index probes per append (joined, the planner may scan).
        LEFT JOIN LATERAL (SELECT * FROM {s}.runs WHERE run_id = q.run LIMIT 1) r ON true
        LEFT JOIN LATERAL (SELECT first_seq, count FROM {s}.events
                           WHERE q.plain AND run_id = q.run AND append_id = q.id LIMIT 1) e
               ON true
    ) c;
    IF v_ok THEN
        INSERT INTO {s}.events (run_id, first_seq, count, at, version, body, append_id)
        SELECT q.run, q.seq, (q.fx->>'count')::integer, q.at, p_version, q.body, q.id
        FROM unnest(p_runs, p_ids, v_first, p_nows, p_bodies, p_fxs, v_outcome)
             AS q(run, id, seq, at, body, fx, outcome)
        WHERE q.outcome = 'ok';
        UPDATE {s}.runs r SET next_seq = q.seq, updated_at = q.at,
            status = coalesce(q.fx->>'status', r.status),
            cancel_requested = r.cancel_requested OR (q.fx->>'cancel')::boolean,
            processed_seq = q.seq, activations = 0, pending_at = NULL
        FROM unnest(p_runs, v_next, p_nows, p_fxs, v_outcome) AS q(run, seq, at, fx, outcome)
        WHERE q.outcome = 'ok' AND r.run_id = q.run;
    END IF;
    IF v_timers THEN
        -- Sets first (one per cmd), then clears, as MemoryStore applies them.
        INSERT INTO {s}.timers (run_id, cmd, due)
        SELECT q.run, (t->>0)::bigint, (t->>1)::bigint
        FROM unnest(p_runs, p_fxs, v_outcome) AS q(run, fx, outcome),
             jsonb_array_elements(q.fx->'timers_set') AS u(t)
        WHERE q.outcome = 'ok'
        ON CONFLICT (run_id, cmd) DO UPDATE SET due = excluded.due;
        DELETE FROM {s}.timers t
        USING unnest(p_runs, p_fxs, v_outcome) AS q(run, fx, outcome),
              jsonb_array_elements_text(q.fx->'timers_cleared') AS u(c)
        WHERE q.outcome = 'ok' AND t.run_id = q.run AND t.cmd = u.c::bigint;
    END IF;
    FOR i IN 1..v_n LOOP
        IF NOT p_plain[i] THEN
            IF p_repeated[i] IS NULL THEN
                SELECT * INTO o FROM {s}.eve_append(p_runs[i], p_ids[i], p_expected[i],
                    p_workers[i], p_epochs[i], p_nows[i], p_version, p_bodies[i], p_fxs[i],
                    p_channel);
            ELSE
                -- An append creating a hook token twice (p_fxs holds its hooks before the
                -- repeat): the run's checks and the earlier tokens decide as usual, and if
                -- they all pass, its writes are undone and the repeated token refused.
                BEGIN
                    SELECT * INTO o FROM {s}.eve_append(p_runs[i], p_ids[i], p_expected[i],
                        p_workers[i], p_epochs[i], p_nows[i], p_version, p_bodies[i],
                        p_fxs[i], p_channel);
                    IF o.outcome = 'ok' THEN
                        RAISE EXCEPTION 'undo' USING ERRCODE = 'EV001';
                    END IF;
                EXCEPTION WHEN SQLSTATE 'EV001' THEN
                    -- o holds eve_append's 'ok' row (variables are not rolled back).
                    o.outcome := 'token_taken';
                    o.o_first := NULL;
                    o.o_next := NULL;
                    o.o_detail := p_repeated[i];
                END;
            END IF;
            v_outcome[i] := o.outcome;
            v_first[i] := o.o_first;
            v_next[i] := o.o_next;
            v_detail[i] := o.o_detail;
        END IF;
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(v_outcome, v_first, v_next, v_detail);
END
$fn$;
"#,
    ),
    (
        10,
        "claims and next_wake find due runs through indexes, not by reading every running run",
        r#"
-- A claim reads the runs with an event pending and the due timers through these (claims.rs
-- `due_ids!`), so its cost does not grow with the runs parked on a wait. A worker's append
-- leaves pending_at NULL and status 'running', so its run update stays HOT.
CREATE INDEX runs_pending ON {s}.runs (deployment_id, pending_at)
    WHERE status = 'running' AND pending_at IS NOT NULL;
CREATE INDEX timers_due ON {s}.timers (due);
"#,
    ),
    (
        11,
        "API keys may be limited to sessions, and answer links to one request; existing keys are unlimited",
        r#"
ALTER TABLE {s}.api_keys ADD COLUMN sessions TEXT[], ADD COLUMN request TEXT;
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
