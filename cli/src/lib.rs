//! eve-cli: the `eve` command, for any set of tools: [`App`] gives a user's binary the whole
//! command line serving its tools (the `eve` binary itself is the examples' app).
//!
//! - Backend choice by URL in one place: [`open_store`] / [`StoreUrl`] (`sqlite://PATH`,
//!   `postgres://…`, `dynamodb://TABLE?endpoint=…&region=…`), from `--store` or
//!   `EVE_STORE_URL`, a SQLite file `eve.db` in the working directory by default.
//! - Or a server: with `--url` / `EVE_URL` (and `--key` / `EVE_KEY`) the commands that read or
//!   act go through its HTTP API ([`target::Target`], [`remote::Remote`]), keys and scopes
//!   applying, and print the same as on the store.
//! - The commands ([`cli::Command`]): `eve serve [--retain AGE]`, `eve mcp`, `eve call`,
//!   `eve runs list|show|resume|fail|purge`,
//!   `eve journal`, `eve requests`, `eve answer`, `eve hook resume`, `eve cancel`,
//!   `eve sessions show|end`, `eve keys create|list|revoke`, `eve replay`, `eve conformance`, `eve bench`. Each fails with one [`CliError`], printed as one line on
//!   stderr with a non-zero exit code.
//!
//! Cargo features, all off by default so the first build (the SQLite backend and the commands
//! that serve and inspect it) is fast: `postgres` and `dynamodb` (those store URLs),
//! `conformance` (`eve conformance`, `eve bench`), `otlp` (span export with `--otlp` or the
//! `OTEL_*` variables), `full` (all of them). Asking for a part left out fails with exit code 2
//! and names the feature to turn on.

pub mod app;
pub mod batch;
pub mod bench;
pub mod call;
pub mod cli;
pub mod conformance;
pub mod demo;
pub mod error;
#[cfg(feature = "conformance")]
pub mod factory;
pub mod format;
pub mod inspect;
pub mod keys;
pub mod logging;
pub mod mcp;
pub mod otlp;
pub mod profile;
pub mod remote;
pub mod replay;
pub mod retention;
pub mod serve;
pub mod store_url;
pub mod target;
pub mod wire;

pub use app::App;
pub use error::CliError;
#[cfg(feature = "conformance")]
pub use factory::UrlFactory;
pub use store_url::{
    open_store, BadStoreUrl, OpenError, StoreUrl, DEFAULT_STORE_URL, STORE_URL_ENV,
};
