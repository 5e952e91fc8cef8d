//! Shared set-up for the criterion benchmarks in `benches/`: stores for every backend and runs
//! ready to append to. Not published.

use eve_core::{
    AppendId, CallId, DeploymentId, Event, Execution, JournalStore, Lease, NewRun, Payload, RunId,
    SessionId, StoreError, Timestamp, WorkerId, WorkflowId,
};
use std::sync::Arc;
use std::time::Duration;

/// The deployment every bench run belongs to.
pub const DEPLOYMENT: &str = "bench";

/// A small step result, the typical journal event.
pub fn step_event(cmd: u64) -> Event {
    Event::StepCompleted {
        cmd,
        name: "step".into(),
        attempt: 1,
        output: Payload::from_json(format!(r#"{{"ok":true,"n":{cmd}}}"#)).expect("valid JSON"),
    }
}

/// A worker lease valid for an hour of simulated time.
pub async fn lease(store: &dyn JournalStore, now: Timestamp) -> Result<Lease, StoreError> {
    store
        .register_worker(
            &WorkerId::random(),
            &DeploymentId::new(DEPLOYMENT),
            Duration::from_secs(3600),
            now,
        )
        .await
}

/// Creates `n` runs and claims them all under `lease`, ready for appends at seq 1.
pub async fn claimed_runs(
    store: &dyn JournalStore,
    lease: &Lease,
    n: usize,
    now: Timestamp,
) -> Result<Vec<RunId>, StoreError> {
    let session = SessionId::new(format!("s_{}", uuid_like()));
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let run = NewRun {
            run_id: RunId::random(),
            idempotency_key: None,
            workflow_id: WorkflowId::new("bench::workflow"),
            deployment_id: DeploymentId::new(DEPLOYMENT),
            tool: "bench".into(),
            input: Payload::from_json("{}").expect("valid JSON"),
            session_id: session.clone(),
            call_id: CallId::new(format!("call_{i}")),
            execution: Execution::Default,
            traceparent: None,
            reset_from: None,
        };
        ids.push(store.create_run(run, now).await?.run.run_id);
    }
    let mut claimed = 0;
    while claimed < n {
        let got = store.claim(lease, n, now).await?;
        if got.is_empty() {
            return Err(StoreError::InvalidInput(format!(
                "only {claimed} of {n} new runs were claimable"
            )));
        }
        claimed += got.len();
    }
    Ok(ids)
}

/// Appends `batches` batches of `batch` step events to `run`, starting at `next_seq`; returns
/// the next seq.
pub async fn append_batches(
    store: &dyn JournalStore,
    lease: &Lease,
    run: &RunId,
    mut next_seq: u64,
    batches: usize,
    batch: usize,
    now: Timestamp,
) -> Result<u64, StoreError> {
    for _ in 0..batches {
        let events = (0..batch)
            .map(|i| step_event(next_seq + i as u64))
            .collect();
        let done = store
            .append(eve_core::Append {
                run: run.clone(),
                expected_seq: next_seq,
                lease: lease.clone(),
                append_id: AppendId::random(),
                events,
                now,
            })
            .await?;
        next_seq = done.next_seq;
    }
    Ok(next_seq)
}

/// A backend under measurement.
#[derive(Debug)]
pub struct Backend {
    /// Label in the report.
    pub name: String,
    /// The store.
    pub store: Arc<dyn JournalStore>,
}

fn uuid_like() -> String {
    RunId::random()
        .as_str()
        .trim_start_matches("run_")
        .to_owned()
}

/// Every backend this build and environment can measure: memory always, SQLite files (FULL and
/// NORMAL synchronous) always, Postgres (a fresh schema) when `EVE_TEST_POSTGRES_URL` is set and
/// DynamoDB Local (a fresh table) when `EVE_TEST_DYNAMODB_ENDPOINT` is set.
///
/// # Panics
/// When a configured server does not answer: a bench run should fail loudly, not skip.
pub async fn backends() -> Vec<Backend> {
    use eve_storage_sqlite::{SqliteOptions, SqliteStore, Synchronous};
    let mut out = vec![Backend {
        name: "memory".into(),
        store: Arc::new(eve_core::MemoryStore::new()),
    }];
    let dir = std::env::temp_dir().join(format!("eve-bench-{}", uuid_like()));
    std::fs::create_dir_all(&dir).expect("temp dir for SQLite files");
    for (name, synchronous) in [
        ("sqlite-full", Synchronous::Full),
        ("sqlite-normal", Synchronous::Normal),
    ] {
        let options = SqliteOptions {
            synchronous,
            ..SqliteOptions::default()
        };
        let store = SqliteStore::open_with(dir.join(format!("{name}.db")), options)
            .await
            .expect("SQLite file");
        out.push(Backend {
            name: name.into(),
            store: Arc::new(store),
        });
    }
    if let Ok(url) = std::env::var("EVE_TEST_POSTGRES_URL") {
        let options = eve_storage_postgres::PostgresOptions {
            schema: created_schema(format!("bench_{}", &uuid_like()[..12])),
            ..Default::default()
        };
        let store = eve_storage_postgres::PostgresStore::connect_with(&url, options)
            .await
            .expect("Postgres at EVE_TEST_POSTGRES_URL");
        out.push(Backend {
            name: "postgres".into(),
            store: Arc::new(store),
        });
    }
    if std::env::var("EVE_TEST_DYNAMODB_ENDPOINT").is_ok() {
        let table = format!("bench_{}", &uuid_like()[..12]);
        let store = dynamodb_local(&table)
            .await
            .expect("DynamoDB at EVE_TEST_DYNAMODB_ENDPOINT");
        store.create_table().await.expect("bench table");
        let store = Arc::new(store);
        created().push(Created::Table(store.clone()));
        out.push(Backend {
            name: "dynamodb".into(),
            store,
        });
    }
    out
}

/// What this process made on a server for its measurements, removed by [`drop_created`].
enum Created {
    Schema(String),
    Table(Arc<eve_storage_dynamodb::DynamoStore>),
}

fn created() -> std::sync::MutexGuard<'static, Vec<Created>> {
    static CREATED: std::sync::Mutex<Vec<Created>> = std::sync::Mutex::new(Vec::new());
    CREATED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records `schema` as made by this process (for [`drop_created`]) and returns it.
pub fn created_schema(schema: String) -> String {
    created().push(Created::Schema(schema.clone()));
    schema
}

/// Drops the Postgres schemas ([`backends`], [`created_schema`]) and deletes the DynamoDB
/// tables ([`backends`]) this process made, so repeated bench runs leave nothing behind on the
/// server. Call it once the measurements are out: a failure is printed, not fatal.
pub async fn drop_created() {
    let made = std::mem::take(&mut *created());
    for m in made {
        let result = match m {
            Created::Schema(schema) => {
                eve_storage_postgres::drop_schema(&postgres_url(), &schema).await
            }
            Created::Table(store) => store.delete_table().await,
        };
        if let Err(e) = result {
            eprintln!("cleanup: {e}");
        }
    }
}

/// Removes what `target` names on its server: the schema of `postgres:SCHEMA` (at
/// `EVE_TEST_POSTGRES_URL`), the table of `dynamodb:TABLE` (at `EVE_TEST_DYNAMODB_ENDPOINT`);
/// a SQLite file is left to its temp directory. For the tests and the `fleet` binary, which
/// name their targets themselves and check the journals before removing them. A failure is
/// printed, not fatal.
pub async fn drop_target(target: &str) {
    let result = match target.split_once(':') {
        Some(("postgres", schema)) => {
            eve_storage_postgres::drop_schema(&postgres_url(), schema).await
        }
        Some(("dynamodb", table)) => match dynamodb_local(table).await {
            Ok(store) => store.delete_table().await,
            Err(e) => Err(e),
        },
        _ => Ok(()),
    };
    if let Err(e) = result {
        eprintln!("cleanup of {target}: {e}");
    }
}

/// `EVE_TEST_POSTGRES_URL`, else the local server.
fn postgres_url() -> String {
    std::env::var("EVE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Table `table` on DynamoDB Local at `EVE_TEST_DYNAMODB_ENDPOINT` (not created here).
///
/// # Errors
/// `InvalidInput` when the variable is unset; what connecting returns.
async fn dynamodb_local(
    table: &str,
) -> Result<eve_storage_dynamodb::DynamoStore, eve_core::StoreError> {
    let endpoint = std::env::var("EVE_TEST_DYNAMODB_ENDPOINT").map_err(|_| {
        eve_core::StoreError::InvalidInput(
            "set EVE_TEST_DYNAMODB_ENDPOINT (e.g. http://127.0.0.1:8000) for DynamoDB".into(),
        )
    })?;
    eve_storage_dynamodb::DynamoStore::connect(eve_storage_dynamodb::DynamoConfig::local(
        endpoint, table,
    ))
    .await
}

/// Like [`open_target`], for a target that does not exist yet: a `dynamodb:TABLE` target's
/// table is created (the other kinds create their file or schema on open).
///
/// # Panics
/// As [`open_target`], and when the table cannot be created.
pub async fn open_new_target(target: &str) -> Arc<dyn JournalStore> {
    match target.split_once(':') {
        Some(("dynamodb", table)) => {
            let store = dynamodb_local(table)
                .await
                .expect("DynamoDB at EVE_TEST_DYNAMODB_ENDPOINT");
            store.create_table().await.expect("create the table");
            Arc::new(store)
        }
        _ => open_target(target).await,
    }
}

/// Opens a store named `sqlite-full:PATH`, `sqlite-normal:PATH`, `postgres:SCHEMA` (at
/// `EVE_TEST_POSTGRES_URL`, by default the local server) or `dynamodb:TABLE` (an existing table
/// at `EVE_TEST_DYNAMODB_ENDPOINT`): the targets of the bench binaries' processes and of the
/// restart and fleet tests.
///
/// # Panics
/// On an unknown kind, or when the store cannot be opened.
pub async fn open_target(target: &str) -> Arc<dyn JournalStore> {
    use eve_storage_sqlite::{SqliteOptions, SqliteStore, Synchronous};
    let (kind, rest) = target
        .split_once(':')
        .unwrap_or_else(|| panic!("target {target}: expected KIND:WHERE"));
    match kind {
        "sqlite-full" | "sqlite-normal" => {
            let synchronous = if kind == "sqlite-full" {
                Synchronous::Full
            } else {
                Synchronous::Normal
            };
            let options = SqliteOptions {
                synchronous,
                ..SqliteOptions::default()
            };
            Arc::new(
                SqliteStore::open_with(rest, options)
                    .await
                    .expect("open the SQLite file"),
            )
        }
        "postgres" => {
            let options = eve_storage_postgres::PostgresOptions {
                schema: rest.into(),
                ..Default::default()
            };
            Arc::new(
                eve_storage_postgres::PostgresStore::connect_with(&postgres_url(), options)
                    .await
                    .expect("Postgres at EVE_TEST_POSTGRES_URL"),
            )
        }
        "dynamodb" => Arc::new(
            dynamodb_local(rest)
                .await
                .expect("DynamoDB at EVE_TEST_DYNAMODB_ENDPOINT"),
        ),
        other => panic!("unknown target kind {other}"),
    }
}
