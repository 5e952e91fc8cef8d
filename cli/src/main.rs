//! The `eve` binary: parses the command line, runs the command on a multi-thread tokio runtime,
//! and turns an error into one line on stderr and a non-zero exit code.

use clap::Parser;
use eve_cli::cli::{Cli, Command};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    eve_cli::logging::init(cli.log_format);
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
    match runtime.block_on(eve_cli::cli::run(cli, &mut out)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", e.one_line());
            ExitCode::from(e.exit_code())
        }
    }
}
