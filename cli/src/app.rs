//! [`App`]: a user's own `eve`. A binary that registers its tools and calls [`App::run`] gets
//! the whole command line (`serve`, `mcp`, `call`, `runs`, `journal`, `requests`, `answer`, `hook`,
//! `cancel`, `keys`, `conformance`, `bench`, the backend by `--store` URL), serving its tools.

use crate::cli::{Cli, Command};
use crate::error::CliError;
use clap::Parser;
use eve_core::engine::{AgentHost, Registrable, Registry};
use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

/// A deployment's tools and the `eve` command line that serves them.
///
/// ```no_run
/// # use eve_core::engine::{Registry, WorkflowTool};
/// # fn deploy() -> WorkflowTool { unimplemented!() }
/// fn main() -> std::process::ExitCode {
///     eve_cli::App::new("shop-2026-12").tool(deploy()).run()
/// }
/// ```
///
/// The deployment id names the code: a worker runs only runs started under its deployment, so
/// change it when a change to a body would replay differently (see the design's *Deployments*).
#[derive(Clone, Debug)]
pub struct App {
    registry: Registry,
}

impl App {
    /// An app serving no tools yet, for deployment `deployment`.
    pub fn new(deployment: impl Into<String>) -> Self {
        Self {
            registry: Registry::new(deployment.into()),
        }
    }

    /// An app serving `registry`'s tools (and its agent host), under its deployment.
    pub fn from_registry(registry: Registry) -> Self {
        Self { registry }
    }

    /// Adds a tool: a workflow tool (a `#[workflow]` function, a
    /// [`eve_core::engine::WorkflowTool`]) or an ordinary one (a `#[tool]` function, a
    /// [`eve_core::engine::Tool`]), served by `serve`, `mcp` and `call`.
    ///
    /// # Panics
    /// When another tool has the same name or workflow id (a programming error at startup).
    pub fn tool(mut self, tool: impl Registrable) -> Self {
        self.registry = self.registry.with(tool);
        self
    }

    /// Starts the children of the tools' `ctx.agent` calls with `host`.
    pub fn agent_host(mut self, host: Arc<dyn AgentHost>) -> Self {
        self.registry = self.registry.with_agent_host(host);
        self
    }

    /// The tools this app serves.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Parses this process' arguments and runs the command on a multi-thread tokio runtime;
    /// an error is printed as one line on stderr, with a non-zero exit code (2 for bad usage).
    pub fn run(self) -> ExitCode {
        self.run_from(std::env::args_os())
    }

    /// [`App::run`] with these arguments (the first is the program name).
    pub fn run_from(self, args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> ExitCode {
        let cli = match Cli::try_parse_from(args) {
            Ok(cli) => cli,
            Err(e) => e.exit(),
        };
        if matches!(cli.command, Command::Bench(_) | Command::BenchChild(_))
            && std::env::var_os("RUST_LOG").is_none()
        {
            // A line per run would cost the bench's figures: warnings only (the W2 child
            // processes inherit it). Set before any thread exists.
            std::env::set_var("RUST_LOG", "warn");
        }
        crate::logging::init(cli.log_format);
        if let Command::Conformance { cases: Some(n), .. } = &cli.command {
            // Read by the suite's model-based case; set before any thread exists.
            std::env::set_var("EVE_CONFORMANCE_CASES", n.to_string());
        }
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("error: cannot start the async runtime: {e}");
                return ExitCode::FAILURE;
            }
        };
        let mut out = std::io::stdout();
        match runtime.block_on(self.execute(cli, &mut out)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                let _ = out.flush();
                eprintln!("error: {}", e.one_line());
                ExitCode::from(e.exit_code())
            }
        }
    }

    /// Runs a parsed command, writing its output to `out` (for embedding and tests).
    ///
    /// # Errors
    /// The command's [`CliError`].
    pub async fn execute(&self, cli: Cli, out: &mut dyn Write) -> Result<(), CliError> {
        crate::cli::run(cli, &self.registry, out).await
    }
}
