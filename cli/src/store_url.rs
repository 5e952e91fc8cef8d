//! Backend choice by URL: the one place that turns `sqlite://…`, `postgres://…` and
//! `dynamodb://…` into a [`JournalStore`].

use eve_core::{JournalStore, StoreError};
#[cfg(feature = "dynamodb")]
use eve_storage_dynamodb::{DynamoConfig, DynamoStore};
#[cfg(feature = "postgres")]
use eve_storage_postgres::{PostgresOptions, PostgresStore};
use eve_storage_sqlite::{SqliteOptions, SqliteStore, Synchronous};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

/// The store URL used when neither `--store` nor `EVE_STORE_URL` names one: a SQLite file
/// `eve.db` in the working directory.
pub const DEFAULT_STORE_URL: &str = "sqlite://eve.db";

/// The environment variable that names the store when `--store` is not given.
pub const STORE_URL_ENV: &str = "EVE_STORE_URL";

/// Why a store URL was refused. The message names the URL's problem and the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad store URL {url:?}: {reason}; expected sqlite://PATH, postgres://USER@HOST:PORT/DB[?schema=NAME] or dynamodb://TABLE?endpoint=URL[&region=REGION]")]
pub struct BadStoreUrl {
    /// The URL as given, with any password replaced by `***`.
    pub url: String,
    /// What is wrong with it.
    pub reason: String,
}

/// The Postgres schema a `postgres://` URL without `?schema=` uses (eve-storage-postgres's
/// default; a test checks they agree).
pub const DEFAULT_POSTGRES_SCHEMA: &str = "eve";

/// Why [`open_store`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The URL does not parse.
    #[error(transparent)]
    BadUrl(#[from] BadStoreUrl),
    /// A command that reads the store was pointed at a SQLite file that does not exist.
    #[error("no store at {path} ({url}; a relative sqlite:// path is relative to the working directory): run the command where the store is, or pass --store sqlite:///absolute/path.db")]
    Missing {
        /// The URL as given.
        url: String,
        /// The file's absolute path.
        path: String,
    },
    /// The URL names a backend this build of eve leaves out (the Postgres and DynamoDB
    /// backends are cargo features of eve-cli, off by default so the first build is fast).
    #[error("cannot open store {url}: this eve was built without the {backend} backend; rebuild with the cargo feature `{backend}` (e.g. cargo build -p eve-examples --features {backend})")]
    NotCompiled {
        /// The URL, password redacted.
        url: String,
        /// The backend and the name of the cargo feature that builds it: "postgres" or
        /// "dynamodb".
        backend: &'static str,
    },
    /// The backend refused or did not answer.
    #[error("cannot open store {url}: {source}")]
    Store {
        /// The URL, password redacted.
        url: String,
        /// The backend's error.
        #[source]
        source: StoreError,
    },
}

/// A parsed store URL: which backend, and where its storage lives.
///
/// `Display` gives the URL back in canonical form with any password redacted, so it is safe to
/// print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `sqlite://PATH` (relative to the working directory, or absolute as `sqlite:///abs/path`);
    /// `?synchronous=normal` opts into `synchronous=NORMAL`.
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// WAL sync mode (FULL unless the URL says `synchronous=normal`).
        synchronous: Synchronous,
    },
    /// `postgres://…` or `postgresql://…`; `?schema=NAME` picks the schema (default `eve`), every
    /// other part goes to the driver unchanged.
    Postgres {
        /// The connection URL without the `schema` parameter.
        url: String,
        /// The schema holding the tables.
        schema: String,
    },
    /// `dynamodb://TABLE?endpoint=URL&region=REGION`.
    Dynamo {
        /// The table (created when missing).
        table: String,
        /// The endpoint, e.g. `http://127.0.0.1:8000` for DynamoDB Local; `None` uses AWS's
        /// regional endpoint with the credentials in `AWS_ACCESS_KEY_ID` and
        /// `AWS_SECRET_ACCESS_KEY`.
        endpoint: Option<String>,
        /// The region to sign for (default `us-east-1`).
        region: String,
    },
}

impl StoreUrl {
    /// The backend's short name: "sqlite", "postgres" or "dynamodb".
    pub fn backend(&self) -> &'static str {
        match self {
            StoreUrl::Sqlite { .. } => "sqlite",
            StoreUrl::Postgres { .. } => "postgres",
            StoreUrl::Dynamo { .. } => "dynamodb",
        }
    }

    /// Opens the store this URL names: opens (creating) the SQLite file, connects to Postgres
    /// and applies its migrations, or connects to DynamoDB with static credentials (never the
    /// instance-metadata service) and creates the table when it is missing.
    ///
    /// # Errors
    /// [`OpenError::Store`] with the backend's error (a server that does not answer, a file
    /// that cannot be opened, missing AWS credentials for a real AWS endpoint).
    /// [`OpenError::NotCompiled`] when the URL's backend is not built in (cargo features
    /// `postgres`, `dynamodb`).
    pub async fn open(&self) -> Result<Arc<dyn JournalStore>, OpenError> {
        let wrap = |source| OpenError::Store {
            url: self.to_string(),
            source,
        };
        self.check_compiled()?;
        match self {
            StoreUrl::Sqlite { path, synchronous } => {
                let options = SqliteOptions {
                    synchronous: *synchronous,
                    ..SqliteOptions::default()
                };
                let store = SqliteStore::open_with(path, options).await.map_err(wrap)?;
                Ok(Arc::new(store))
            }
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres { url, schema } => {
                let options = PostgresOptions {
                    schema: schema.clone(),
                    ..PostgresOptions::default()
                };
                let store = PostgresStore::connect_with(url, options)
                    .await
                    .map_err(wrap)?;
                Ok(Arc::new(store))
            }
            #[cfg(feature = "dynamodb")]
            StoreUrl::Dynamo { table, .. } => {
                let store = self.dynamo_store(table).await.map_err(wrap)?;
                store.create_table().await.map_err(wrap)?;
                Ok(Arc::new(store))
            }
            #[allow(unreachable_patterns)] // every backend compiled in
            _ => Err(self.not_compiled()),
        }
    }

    /// Whether this build has the URL's backend: the backends other than SQLite are cargo
    /// features (`postgres`, `dynamodb`).
    pub fn compiled_in(&self) -> bool {
        match self {
            StoreUrl::Sqlite { .. } => true,
            StoreUrl::Postgres { .. } => cfg!(feature = "postgres"),
            StoreUrl::Dynamo { .. } => cfg!(feature = "dynamodb"),
        }
    }

    /// `Ok` when the URL's backend is built in, else [`OpenError::NotCompiled`].
    ///
    /// # Errors
    /// [`OpenError::NotCompiled`] naming the cargo feature to turn on.
    pub fn check_compiled(&self) -> Result<(), OpenError> {
        if self.compiled_in() {
            Ok(())
        } else {
            Err(self.not_compiled())
        }
    }

    fn not_compiled(&self) -> OpenError {
        OpenError::NotCompiled {
            url: self.to_string(),
            backend: self.backend(),
        }
    }

    /// [`open`](Self::open) for a command that reads or acts on what is stored: a SQLite file
    /// that does not exist is refused with [`OpenError::Missing`] naming its absolute path
    /// (a relative `sqlite://eve.db` run from another directory would otherwise create an empty
    /// store and report every run as not found).
    ///
    /// # Errors
    /// As [`open`](Self::open), and `Missing`.
    pub async fn open_existing(&self) -> Result<Arc<dyn JournalStore>, OpenError> {
        if let StoreUrl::Sqlite { path, .. } = self {
            if !path.exists() {
                let absolute = std::path::absolute(path).unwrap_or_else(|_| path.clone());
                return Err(OpenError::Missing {
                    url: self.to_string(),
                    path: absolute.display().to_string(),
                });
            }
        }
        self.open().await
    }

    /// A DynamoDB store on `table` at this URL's endpoint and region (the table is not
    /// created). Only for [`StoreUrl::Dynamo`].
    #[cfg(feature = "dynamodb")]
    pub(crate) async fn dynamo_store(&self, table: &str) -> Result<DynamoStore, StoreError> {
        DynamoStore::connect(self.dynamo_config(table)?).await
    }

    /// How [`StoreUrl::dynamo_store`] connects to `table`. Only for [`StoreUrl::Dynamo`].
    #[cfg(feature = "dynamodb")]
    pub(crate) fn dynamo_config(&self, table: &str) -> Result<DynamoConfig, StoreError> {
        let StoreUrl::Dynamo {
            endpoint, region, ..
        } = self
        else {
            return Err(StoreError::InvalidInput(format!(
                "{self} is not a DynamoDB URL"
            )));
        };
        let mut config = DynamoConfig::local(endpoint.clone().unwrap_or_default(), table);
        config.region = region.clone();
        if endpoint.is_none() {
            config.endpoint_url = None;
            let key = |var: &str| {
                std::env::var(var)
                    .ok()
                    .filter(|v| !v.is_empty())
                    .ok_or_else(|| {
                        StoreError::InvalidInput(format!(
                            "a dynamodb:// URL without endpoint= talks to AWS and needs {var} set \
                         (or add ?endpoint=http://127.0.0.1:8000 for DynamoDB Local)"
                        ))
                    })
            };
            config.access_key_id = key("AWS_ACCESS_KEY_ID")?;
            config.secret_access_key = key("AWS_SECRET_ACCESS_KEY")?;
        }
        Ok(config)
    }
}

impl FromStr for StoreUrl {
    type Err = BadStoreUrl;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| BadStoreUrl {
            url: redact(s),
            reason: reason.to_owned(),
        };
        let s = s.trim();
        if s.is_empty() {
            return Err(bad("it is empty"));
        }
        let Some((scheme, _)) = s.split_once(':') else {
            return Err(bad("it has no scheme"));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "sqlite" => parse_sqlite(s).map_err(|r| bad(&r)),
            "postgres" | "postgresql" => parse_postgres(s).map_err(|r| bad(&r)),
            "dynamodb" => parse_dynamo(s).map_err(|r| bad(&r)),
            other => Err(bad(&format!("unknown scheme {other:?}"))),
        }
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Sqlite { path, synchronous } => {
                write!(f, "sqlite://{}", path.display())?;
                if *synchronous == Synchronous::Normal {
                    write!(f, "?synchronous=normal")?;
                }
                Ok(())
            }
            StoreUrl::Postgres { url, schema } => {
                let url = redact(url);
                let sep = if url.contains('?') { '&' } else { '?' };
                write!(f, "{url}{sep}schema={schema}")
            }
            StoreUrl::Dynamo {
                table,
                endpoint,
                region,
            } => {
                write!(f, "dynamodb://{table}?region={region}")?;
                if let Some(e) = endpoint {
                    write!(f, "&endpoint={e}")?;
                }
                Ok(())
            }
        }
    }
}

/// Parses `url` and opens the store it names; see [`StoreUrl`] for the forms and
/// [`StoreUrl::open`] for what opening does.
///
/// # Errors
/// [`OpenError::BadUrl`] for a URL that does not parse, [`OpenError::Store`] when the backend
/// refuses or does not answer.
pub async fn open_store(url: &str) -> Result<Arc<dyn JournalStore>, OpenError> {
    url.parse::<StoreUrl>()?.open().await
}

/// `url` with the password of its userinfo (if any) replaced by `***`.
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_owned(),
    }
}

fn split_query(rest: &str) -> (&str, Vec<(String, String)>) {
    match rest.split_once('?') {
        Some((before, q)) => (
            before,
            url::form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        ),
        None => (rest, Vec::new()),
    }
}

fn parse_sqlite(s: &str) -> Result<StoreUrl, String> {
    let rest = &s["sqlite:".len()..];
    // `sqlite://rel/path`, `sqlite:///abs/path` and sqlx's `sqlite:path` all name a file.
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (path, params) = split_query(rest);
    if path.is_empty() {
        return Err("it names no file; write sqlite://eve.db or sqlite:///abs/path.db".into());
    }
    if path == ":memory:" || path.starts_with(":memory:") {
        return Err(
            "an in-memory SQLite database is not supported (it would vanish with the process); \
             name a file"
                .into(),
        );
    }
    let mut synchronous = Synchronous::Full;
    for (k, v) in params {
        match (k.as_str(), v.to_ascii_lowercase().as_str()) {
            ("synchronous", "full") => synchronous = Synchronous::Full,
            ("synchronous", "normal") => synchronous = Synchronous::Normal,
            ("synchronous", _) => {
                return Err(format!("synchronous={v:?} is neither full nor normal"))
            }
            _ => return Err(format!("unknown parameter {k:?} (known: synchronous)")),
        }
    }
    Ok(StoreUrl::Sqlite {
        path: PathBuf::from(path),
        synchronous,
    })
}

fn parse_postgres(s: &str) -> Result<StoreUrl, String> {
    let mut u = url::Url::parse(s).map_err(|e| format!("it does not parse ({e})"))?;
    if u.host_str().is_none_or(str::is_empty) {
        return Err("it names no host".into());
    }
    let mut schema = None;
    let mut kept = Vec::new();
    for (k, v) in u.query_pairs() {
        if k == "schema" {
            schema = Some(v.into_owned());
        } else {
            kept.push((k.into_owned(), v.into_owned()));
        }
    }
    if kept.is_empty() {
        u.set_query(None);
    } else {
        u.query_pairs_mut().clear().extend_pairs(kept);
    }
    let schema = schema.unwrap_or_else(|| DEFAULT_POSTGRES_SCHEMA.to_owned());
    if !valid_schema(&schema) {
        return Err(format!(
            "schema {schema:?} is not a plain identifier (letters, digits, _; 1-63 chars; not starting with a digit)"
        ));
    }
    Ok(StoreUrl::Postgres {
        url: u.to_string(),
        schema,
    })
}

fn valid_schema(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn parse_dynamo(s: &str) -> Result<StoreUrl, String> {
    let rest = s["dynamodb:".len()..]
        .strip_prefix("//")
        .ok_or("write it as dynamodb://TABLE?endpoint=URL")?;
    let (table, params) = split_query(rest);
    let table = table.trim_end_matches('/');
    if table.is_empty() {
        return Err("it names no table".into());
    }
    if !(3..=255).contains(&table.len())
        || !table
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(format!(
            "table {table:?} is not a DynamoDB table name (3-255 of letters, digits, _ - .)"
        ));
    }
    let mut endpoint = None;
    let mut region = "us-east-1".to_owned();
    for (k, v) in params {
        match k.as_str() {
            "endpoint" => {
                let e = url::Url::parse(&v)
                    .map_err(|e| format!("endpoint {v:?} is not a URL ({e})"))?;
                if !matches!(e.scheme(), "http" | "https") {
                    return Err(format!("endpoint {v:?} is not an http(s) URL"));
                }
                endpoint = Some(v.trim_end_matches('/').to_owned());
            }
            "region" if !v.is_empty() => region = v,
            "region" => return Err("region is empty".into()),
            _ => return Err(format!("unknown parameter {k:?} (known: endpoint, region)")),
        }
    }
    Ok(StoreUrl::Dynamo {
        table: table.to_owned(),
        endpoint,
        region,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<StoreUrl, BadStoreUrl> {
        s.parse()
    }

    #[test]
    fn sqlite_relative_absolute_and_sqlx_forms() {
        assert_eq!(
            parse("sqlite://eve.db").unwrap(),
            StoreUrl::Sqlite {
                path: "eve.db".into(),
                synchronous: Synchronous::Full
            }
        );
        assert_eq!(
            parse("sqlite://data/runs.db").unwrap(),
            StoreUrl::Sqlite {
                path: "data/runs.db".into(),
                synchronous: Synchronous::Full
            }
        );
        assert_eq!(
            parse("sqlite:///var/lib/eve/eve.db").unwrap(),
            StoreUrl::Sqlite {
                path: "/var/lib/eve/eve.db".into(),
                synchronous: Synchronous::Full
            }
        );
        assert_eq!(
            parse("sqlite:eve.db?synchronous=NORMAL").unwrap(),
            StoreUrl::Sqlite {
                path: "eve.db".into(),
                synchronous: Synchronous::Normal
            }
        );
        assert_eq!(
            parse(DEFAULT_STORE_URL).unwrap().to_string(),
            DEFAULT_STORE_URL
        );
        let shown = parse("sqlite:///tmp/x.db?synchronous=normal")
            .unwrap()
            .to_string();
        assert_eq!(shown, "sqlite:///tmp/x.db?synchronous=normal");
        assert_eq!(parse(&shown).unwrap().backend(), "sqlite");
    }

    #[test]
    fn sqlite_refusals_say_why() {
        let e = parse("sqlite://").unwrap_err();
        assert!(e.reason.contains("names no file"), "{e}");
        let e = parse("sqlite::memory:").unwrap_err();
        assert!(e.reason.contains("in-memory"), "{e}");
        let e = parse("sqlite://eve.db?mode=rwc").unwrap_err();
        assert!(e.reason.contains("unknown parameter \"mode\""), "{e}");
        let e = parse("sqlite://eve.db?synchronous=off").unwrap_err();
        assert!(e.reason.contains("neither full nor normal"), "{e}");
        // One line, naming the URL and the accepted forms.
        let msg = e.to_string();
        assert!(!msg.contains('\n'));
        assert!(msg.contains("sqlite://eve.db?synchronous=off"));
        assert!(msg.contains("expected sqlite://PATH"));
    }

    #[test]
    fn postgres_schema_is_taken_out_of_the_url() {
        assert_eq!(
            parse("postgres://postgres@127.0.0.1:5432/test").unwrap(),
            StoreUrl::Postgres {
                url: "postgres://postgres@127.0.0.1:5432/test".into(),
                schema: "eve".into()
            }
        );
        assert_eq!(
            parse("postgresql://u:pw@db.internal/app?sslmode=disable&schema=tenant_7").unwrap(),
            StoreUrl::Postgres {
                url: "postgresql://u:pw@db.internal/app?sslmode=disable".into(),
                schema: "tenant_7".into()
            }
        );
        // Display never shows the password.
        let shown = parse("postgres://u:secret@h/db").unwrap().to_string();
        assert_eq!(shown, "postgres://u:***@h/db?schema=eve");
        let e = parse("postgres://u:secret@h/db?schema=bad-name").unwrap_err();
        assert!(e.reason.contains("not a plain identifier"), "{e}");
        assert!(!e.to_string().contains("secret"), "{e}");
        let e = parse("postgres:///db").unwrap_err();
        assert!(e.reason.contains("no host"), "{e}");
    }

    #[test]
    fn dynamodb_table_endpoint_region() {
        assert_eq!(
            parse("dynamodb://eve_runs?endpoint=http://127.0.0.1:8000").unwrap(),
            StoreUrl::Dynamo {
                table: "eve_runs".into(),
                endpoint: Some("http://127.0.0.1:8000".into()),
                region: "us-east-1".into()
            }
        );
        assert_eq!(
            parse(
                "dynamodb://eve.runs-2?region=eu-west-1&endpoint=http%3A%2F%2Flocalhost%3A8000%2F"
            )
            .unwrap(),
            StoreUrl::Dynamo {
                table: "eve.runs-2".into(),
                endpoint: Some("http://localhost:8000".into()),
                region: "eu-west-1".into()
            }
        );
        assert_eq!(
            parse("dynamodb://eve_runs").unwrap(),
            StoreUrl::Dynamo {
                table: "eve_runs".into(),
                endpoint: None,
                region: "us-east-1".into()
            }
        );
        let round = "dynamodb://t_1?region=us-east-1&endpoint=http://127.0.0.1:8000";
        assert_eq!(parse(round).unwrap().to_string(), round);
        for (url, why) in [
            ("dynamodb://", "names no table"),
            ("dynamodb:table", "dynamodb://TABLE"),
            ("dynamodb://ab", "not a DynamoDB table name"),
            ("dynamodb://a b c", "not a DynamoDB table name"),
            ("dynamodb://tbl?endpoint=localhost", "not a URL"),
            ("dynamodb://tbl?endpoint=ftp://x", "not an http(s) URL"),
            ("dynamodb://tbl?table=x", "unknown parameter \"table\""),
        ] {
            let e = parse(url).unwrap_err();
            assert!(e.reason.contains(why), "{url}: {e}");
        }
    }

    #[test]
    fn unknown_or_missing_schemes() {
        assert!(parse("mysql://x/y")
            .unwrap_err()
            .reason
            .contains("unknown scheme \"mysql\""));
        assert!(parse("eve.db").unwrap_err().reason.contains("no scheme"));
        assert!(parse("  ").unwrap_err().reason.contains("empty"));
    }

    #[tokio::test]
    async fn open_store_opens_a_sqlite_file_and_reports_bad_urls() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("open.db");
        let store = open_store(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        assert_eq!(store.backend(), "sqlite");
        assert!(path.exists());
        let err = open_store("redis://x").await.unwrap_err();
        assert!(matches!(err, OpenError::BadUrl(_)), "{err}");
        // A file that cannot be created is the backend's error, with the URL named.
        let err = open_store("sqlite:///proc/no/such/dir/x.db")
            .await
            .unwrap_err();
        assert!(matches!(err, OpenError::Store { .. }), "{err}");
        assert!(err.to_string().contains("sqlite:///proc/no/such/dir/x.db"));
    }

    #[cfg(feature = "dynamodb")]
    #[tokio::test]
    async fn aws_without_endpoint_needs_static_credentials() {
        let url: StoreUrl = "dynamodb://eve_runs".parse().unwrap();
        if std::env::var_os("AWS_ACCESS_KEY_ID").is_some() {
            return; // the message is only given when the variable is missing
        }
        let err = url.open().await.unwrap_err();
        assert!(err.to_string().contains("AWS_ACCESS_KEY_ID"), "{err}");
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn default_schema_is_the_backends() {
        assert_eq!(DEFAULT_POSTGRES_SCHEMA, PostgresOptions::default().schema);
    }

    /// A backend left out of the build is refused before any connection, with the cargo
    /// feature to turn on; the error is a usage error (exit code 2).
    #[tokio::test]
    async fn a_backend_not_compiled_in_names_its_feature() {
        let cases = [
            (
                "postgres://u:secret@127.0.0.1:1/db",
                "postgres",
                cfg!(feature = "postgres"),
            ),
            (
                "dynamodb://eve_runs?endpoint=http://127.0.0.1:1",
                "dynamodb",
                cfg!(feature = "dynamodb"),
            ),
        ];
        for (url, backend, compiled) in cases {
            let parsed: StoreUrl = url.parse().unwrap();
            assert_eq!(parsed.compiled_in(), compiled, "{url}");
            assert_eq!(parsed.check_compiled().is_ok(), compiled, "{url}");
            if compiled {
                continue;
            }
            let err = open_store(url).await.unwrap_err();
            let OpenError::NotCompiled { backend: b, .. } = &err else {
                panic!("{url}: {err:?}");
            };
            assert_eq!(*b, backend);
            let text = err.to_string();
            assert!(
                text.contains(&format!("cargo feature `{backend}`")),
                "{text}"
            );
            assert!(!text.contains("secret"), "{text}");
            assert_eq!(crate::CliError::Open(err).exit_code(), 2);
        }
        assert!("sqlite://eve.db".parse::<StoreUrl>().unwrap().compiled_in());
    }
}
