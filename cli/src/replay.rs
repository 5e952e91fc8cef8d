//! `eve replay`: checks the app's current code against exported journals before it is
//! deployed. Each journal (the lines `eve journal RUN --json` writes, in a file named
//! `RUN.jsonl`) is replayed against the app's tools without a store and without running any
//! step; the report says per journal whether it replays cleanly, where the code diverges
//! (non-determinism at command N: recorded X, issued Y), or that its workflow is missing.

use crate::error::CliError;
use eve_core::engine::{Registry, ReplayError, Worker};
use eve_core::{Event, RunId, StoredEvent};
use std::io::Write;
use std::path::{Path, PathBuf};

/// One journal's verdict.
#[derive(Debug)]
enum Verdict {
    Clean {
        events: u64,
        commands: u64,
        finished: bool,
    },
    Failed(ReplayError),
    Unreadable(String),
}

/// Replays every journal of `paths` (files, or directories whose `*.jsonl` files are taken in
/// name order) and prints one line per journal and a summary.
///
/// # Errors
/// [`CliError::Usage`] when a path does not exist or names no journal;
/// [`CliError::ReplayFailed`] when any journal does not replay cleanly (after every journal was
/// checked).
pub fn run(paths: &[PathBuf], registry: &Registry, out: &mut dyn Write) -> Result<(), CliError> {
    let files = journal_files(paths)?;
    let mut failed = 0;
    for file in &files {
        let run = RunId::new(
            file.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        let (verdict, tool) = match read_journal(file) {
            Err(why) => (Verdict::Unreadable(why), None),
            Ok(events) => {
                let tool = events.first().and_then(|e| match &e.event {
                    Event::RunStarted { tool, .. } => Some(tool.clone()),
                    _ => None,
                });
                let verdict = match Worker::replay_journal(registry, &run, &events) {
                    Ok(r) => Verdict::Clean {
                        events: r.events,
                        commands: r.commands,
                        finished: r.finished,
                    },
                    Err(e) => Verdict::Failed(e),
                };
                (verdict, tool)
            }
        };
        let what = match &tool {
            Some(t) => format!("{} (run {run}, tool {t})", file.display()),
            None => file.display().to_string(),
        };
        let _ = match &verdict {
            Verdict::Clean {
                events,
                commands,
                finished,
            } => writeln!(
                out,
                "ok       {what}: replays cleanly ({events} events, {commands} commands; the body {})",
                if *finished { "returns" } else { "waits where the run stopped" }
            ),
            Verdict::Failed(e @ ReplayError::MissingWorkflow { .. }) => {
                writeln!(out, "MISSING  {what}: {e}")
            }
            Verdict::Failed(e) => writeln!(out, "FAILED   {what}: {e}"),
            Verdict::Unreadable(why) => writeln!(out, "INVALID  {why}"),
        };
        if !matches!(verdict, Verdict::Clean { .. }) {
            failed += 1;
        }
    }
    let total = files.len();
    let _ = writeln!(
        out,
        "{total} journal(s): {} replay cleanly, {failed} do not",
        total - failed
    );
    if failed > 0 {
        return Err(CliError::ReplayFailed { failed, total });
    }
    Ok(())
}

/// The files to check: each path itself, or a directory's `*.jsonl` files by name.
fn journal_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, CliError> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let entries = std::fs::read_dir(path).map_err(|e| {
                CliError::Usage(format!("cannot list the directory {}: {e}", path.display()))
            })?;
            let mut found: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "jsonl"))
                .collect();
            if found.is_empty() {
                return Err(CliError::Usage(format!(
                    "{} holds no *.jsonl journal (write one with `eve journal RUN --json > RUN.jsonl`)",
                    path.display()
                )));
            }
            found.sort();
            files.extend(found);
        } else if path.exists() {
            files.push(path.clone());
        } else {
            return Err(CliError::Usage(format!(
                "{} does not exist (give a RUN.jsonl file written by `eve journal RUN --json`, or a directory of them)",
                path.display()
            )));
        }
    }
    Ok(files)
}

/// One event per non-empty line; the first bad line is named `FILE:LINE`.
fn read_journal(file: &Path) -> Result<Vec<StoredEvent>, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("{}: cannot read: {e}", file.display()))?;
    let mut events = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let event = serde_json::from_str(line).map_err(|e| {
            format!(
                "{}:{}: not a journal event (a line of `eve journal RUN --json`): {e}",
                file.display(),
                n + 1
            )
        })?;
        events.push(event);
    }
    if events.is_empty() {
        return Err(format!("{}: no events", file.display()));
    }
    Ok(events)
}
