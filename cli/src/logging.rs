//! The binary's tracing subscriber: `RUST_LOG` filters (default: info for eve's crates, warn
//! for the rest), `--log-format text|json`, written to stderr; and the process's [`Metrics`],
//! fed by the engine's spans, which `eve serve` shows at `/metrics`.

use eve_server::Metrics;
use std::io::IsTerminal;
use std::sync::{Arc, OnceLock};
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;

/// How log lines look.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per event.
    Json,
}

/// The filter used when `RUST_LOG` is unset.
pub const DEFAULT_FILTER: &str = "warn,eve_core=info,eve_server=info,eve_cli=info";

static METRICS: OnceLock<Arc<Metrics>> = OnceLock::new();

/// The process's metrics: those [`init`] feeds from the engine's spans, or fresh ones.
pub fn metrics() -> Arc<Metrics> {
    METRICS.get_or_init(Metrics::new).clone()
}

/// Whether log lines get ANSI colours: only on a terminal, and not when `NO_COLOR` is set to
/// anything but the empty string (<https://no-color.org>). Redirected to a file or a pipe, or
/// collected by a service manager, they are plain text.
pub fn colour(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Installs the subscriber (once per process; later calls do nothing).
pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    // The metrics see the engine's info spans whatever RUST_LOG says.
    let spans = Targets::new().with_target("eve_core", Level::INFO);
    let registry = tracing_subscriber::registry().with(metrics().layer().with_filter(spans));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        ));
    let _ = match format {
        LogFormat::Text => registry.with(fmt.with_filter(filter)).try_init(),
        LogFormat::Json => registry.with(fmt.json().with_filter(filter)).try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::colour;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some("".into())), "an empty NO_COLOR is unset");
        assert!(!colour(true, Some("1".into())));
        assert!(!colour(false, None));
    }
}
