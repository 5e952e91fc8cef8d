//! `eve conformance --store URL`: the store conformance suite against a live backend, with a
//! progress bar.

//!
//! The suite is the cargo feature `conformance` (off by default); without it `run` is not
//! built and `eve conformance` says which feature to turn on.

#[cfg(feature = "conformance")]
use crate::{error::CliError, factory::UrlFactory, store_url::StoreUrl};
#[cfg(feature = "conformance")]
use eve_conformance::{engine_cases, run_case, store_cases, Report};
#[cfg(feature = "conformance")]
use indicatif::{ProgressBar, ProgressStyle};
#[cfg(feature = "conformance")]
use std::io::Write;

/// Which levels of the suite to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Level {
    /// The store contract's cases (a few seconds on SQLite).
    Store,
    /// The engine's fault families over the store (minutes).
    Engine,
    /// Both, store first.
    All,
}

/// Runs the store and/or engine cases of `eve-conformance` (`level`) against fresh, isolated
/// storage on the backend `url` names (a temp file for SQLite, a random schema for Postgres, a random table for
/// DynamoDB; the URL's own storage is never touched), one case after another, printing one
/// `ok`/`FAILED` line per case and the summary on `out`, with a progress bar on stderr when it
/// is a terminal. The schemas and tables it made are dropped at the end. `filter` keeps only
/// the cases whose name contains it.
///
/// Must run on a multi-thread tokio runtime.
///
/// # Errors
/// [`CliError::ConformanceFailed`] when a case failed; [`CliError::Usage`] when `filter`
/// matches no case; the backend's error when the factory cannot be made.
#[cfg(feature = "conformance")]
pub async fn run(
    url: &StoreUrl,
    level: Level,
    filter: Option<&str>,
    out: &mut dyn Write,
) -> Result<Report, CliError> {
    url.check_compiled()?;
    let factory =
        UrlFactory::new(url.clone()).map_err(CliError::store("cannot make a temp dir"))?;
    let levels: &[_] = match level {
        Level::Store => &[store_cases()],
        Level::Engine => &[engine_cases()],
        Level::All => &[store_cases(), engine_cases()],
    };
    let cases: Vec<_> = levels
        .iter()
        .flat_map(|l| l.iter())
        .filter(|(name, _)| filter.is_none_or(|f| name.contains(f)))
        .collect();
    if cases.is_empty() {
        return Err(CliError::Usage(format!(
            "no conformance case matches {:?}",
            filter.unwrap_or_default()
        )));
    }
    let _ = writeln!(
        out,
        "conformance: {} cases on {url} (fresh {} per case)",
        cases.len(),
        match url {
            StoreUrl::Sqlite { .. } => "temp file",
            StoreUrl::Postgres { .. } => "random schema",
            StoreUrl::Dynamo { .. } => "random table",
        }
    );
    let bar = ProgressBar::new(cases.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40.cyan/blue} {pos}/{len} {elapsed_precise} {msg}")
            .expect("valid template"),
    );
    // A failing case panics; its message is kept in the report, so the default hook's
    // backtrace note would only tear the progress bar.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut report = Report::default();
    for (name, case) in cases {
        bar.set_message(*name);
        let result = run_case(&factory, name, *case).await;
        bar.suspend(|| {
            let _ = writeln!(out, "{result}");
        });
        report.cases.push(result);
        bar.inc(1);
    }
    std::panic::set_hook(hook);
    bar.finish_and_clear();
    let cleanup = factory.cleanup().await;
    let (passed, skipped, failed) = report.counts();
    let total = report.cases.len();
    let _ = writeln!(out, "{passed} passed, {skipped} skipped, {failed} failed");
    if let Err(e) = cleanup {
        let _ = writeln!(out, "note: could not remove every test schema/table: {e}");
    }
    if failed > 0 {
        return Err(CliError::ConformanceFailed {
            failed,
            total,
            backend: url.backend(),
        });
    }
    Ok(report)
}
