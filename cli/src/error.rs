//! The CLI's one error type: every command fails with one of these, printed as one line.

use crate::remote::RemoteError;
use crate::store_url::{BadStoreUrl, OpenError};
use crate::target::TargetError;
use eve_core::engine::EngineError;
use eve_core::StoreError;

/// Why an `eve` command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The store URL does not parse.
    #[error(transparent)]
    BadUrl(#[from] BadStoreUrl),
    /// The store could not be opened.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// A command-line value is wrong (a status that does not exist, a payload that is not JSON).
    #[error("{0}")]
    Usage(String),
    /// A store call failed; `doing` says which.
    #[error("{doing}: {source}")]
    Store {
        /// What the command was doing, e.g. "cannot answer request run_1:3".
        doing: String,
        /// The store's error (its message says what to do).
        #[source]
        source: StoreError,
    },
    /// The server refused a request of the remote CLI (`--url`); `doing` says which. A 403
    /// says which scope the route needs.
    #[error("{doing}: {source}")]
    Remote {
        /// What the command was doing.
        doing: String,
        /// The server's refusal.
        #[source]
        source: RemoteError,
    },
    /// The server of `--url` could not be reached: nothing was done.
    #[error(transparent)]
    Unreachable(RemoteError),
    /// The engine refused (a worker that cannot register, a tool that does not exist).
    #[error("{doing}: {source}")]
    Engine {
        /// What the command was doing.
        doing: String,
        /// The engine's error.
        #[source]
        source: EngineError,
    },
    /// The command or option needs a part of eve this build leaves out (a cargo feature of
    /// eve-cli, off by default so the first build is fast).
    #[error("{what} is not in this build of eve; rebuild with the cargo feature `{feature}` (e.g. cargo build -p eve-examples --features {feature})")]
    NotCompiled {
        /// What was asked for, e.g. "`eve conformance`".
        what: &'static str,
        /// The cargo feature that builds it.
        feature: &'static str,
    },
    /// The conformance suite ran and some cases failed.
    #[error(
        "conformance: {failed} of {total} cases failed on {backend}; the failures are listed above"
    )]
    ConformanceFailed {
        /// Failed cases.
        failed: usize,
        /// All cases.
        total: usize,
        /// The backend's name.
        backend: &'static str,
    },
    /// `eve replay` checked every journal and some do not replay against the current code.
    #[error("replay: {failed} of {total} journal(s) do not replay against these tools; see the lines above")]
    ReplayFailed {
        /// Journals that failed (diverged, missing workflow, unreadable).
        failed: usize,
        /// All journals checked.
        total: usize,
    },
    /// A benchmark run did not end as expected.
    #[error("bench: {0}")]
    Bench(String),
    /// Serving failed (the address is taken, the server stopped with an error).
    #[error("serve: {0}")]
    Serve(String),
    /// `eve call --wait`: the run did not end in time (it keeps running).
    #[error("call: {0}")]
    Wait(String),
    /// An operator action on a run that has ended (`eve runs terminate RUN`): nothing was
    /// written.
    #[error("run {run} already ended ({status}); nothing to {action}")]
    NotLive {
        /// The run.
        run: String,
        /// How it ended.
        status: &'static str,
        /// What was asked.
        action: &'static str,
    },
    /// A batch action (`eve runs cancel|terminate` by filter) failed on some runs.
    #[error("{failed} of {total} run(s) failed; see the lines above")]
    BatchFailed {
        /// Runs whose action failed.
        failed: usize,
        /// Runs acted on.
        total: usize,
    },
}

impl CliError {
    /// Wraps a store error with what the command was doing.
    pub fn store(doing: impl Into<String>) -> impl FnOnce(StoreError) -> CliError {
        let doing = doing.into();
        move |source| CliError::Store { doing, source }
    }

    /// Wraps a store's or server's error with what the command was doing; an unreachable
    /// server is [`CliError::Unreachable`] whatever the command.
    pub fn at(doing: impl Into<String>) -> impl FnOnce(TargetError) -> CliError {
        let doing = doing.into();
        move |e| match e {
            TargetError::Store(source) => CliError::Store { doing, source },
            TargetError::Remote(source @ RemoteError::Unreachable { .. }) => {
                CliError::Unreachable(source)
            }
            TargetError::Remote(source) => CliError::Remote { doing, source },
        }
    }

    /// Wraps an engine error with what the command was doing.
    pub fn engine(doing: impl Into<String>) -> impl FnOnce(EngineError) -> CliError {
        let doing = doing.into();
        move |source| CliError::Engine { doing, source }
    }

    /// The same error, a `NotFound` naming the store it looked in (`store`, the URL as
    /// printed, password redacted).
    pub fn naming_store(self, store: &str) -> Self {
        match self {
            CliError::Store {
                doing,
                source: source @ StoreError::NotFound { .. },
            } if !store.is_empty() => CliError::Store {
                doing: format!("{doing} in store {store}"),
                source,
            },
            other => other,
        }
    }

    /// The process exit code: 2 for a usage error (a bad URL or argument, a backend or command
    /// this build leaves out) and a server that
    /// cannot be reached, 1 for every other failure (a 403 included). Success is 0.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::BadUrl(_) | CliError::Usage(_) | CliError::Unreachable(_) => 2,
            CliError::Open(OpenError::BadUrl(_) | OpenError::NotCompiled { .. }) => 2,
            CliError::NotCompiled { .. } => 2,
            _ => 1,
        }
    }

    /// The error as the one line printed on stderr (line breaks in backend messages folded).
    pub fn one_line(&self) -> String {
        let text = self.to_string();
        text.split(['\n', '\r'])
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" / ")
    }
}
