//! `eve runs cancel` and `eve runs terminate`: an operator action on one run, or on every live
//! run a filter selects (the filters of `eve runs list`), on the store or through a server.
//!
//! A batch lists the matching runs that have not ended, then asks before it acts (`y/N` on a
//! terminal; `--yes` otherwise), shows a progress bar on stderr and prints one line per run and
//! a summary (`--json`: an array of per-run results). A run that ended between the listing and
//! the action is skipped, not an error. `--dry-run` prints what would be acted on and changes
//! nothing; a batch without a filter is refused unless `--all`.

use crate::error::CliError;
use crate::target::{Target, TargetError};
use eve_core::{
    CancelOutcome, RunFilter, RunId, RunRecord, SessionId, TerminateOutcome, Timestamp,
};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::io::{BufRead, IsTerminal, Write};

/// What to do to each run.
#[derive(Clone, Debug)]
pub enum Action {
    /// A cooperative cancel: the body gets its grace period and cleanup steps.
    Cancel {
        /// Why.
        reason: String,
    },
    /// End the run at once.
    Terminate {
        /// Why.
        reason: String,
        /// Who (over HTTP the server records its key's name instead).
        by: String,
    },
}

impl Action {
    fn verb(&self) -> &'static str {
        match self {
            Action::Cancel { .. } => "cancel",
            Action::Terminate { .. } => "terminate",
        }
    }
}

/// Which runs a batch acts on: the live runs of `session` that `filter` selects.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// Only this session's runs.
    pub session: Option<SessionId>,
    /// The filters of `eve runs list` (its paging fields are ignored).
    pub filter: RunFilter,
    /// Act on every live run when no filter is given.
    pub all: bool,
}

impl Selection {
    fn filtered(&self) -> bool {
        let f = &self.filter;
        self.session.is_some()
            || f.status.is_some()
            || f.tool.is_some()
            || f.text.is_some()
            || f.since.is_some()
            || f.until.is_some()
            || f.query.is_some()
    }
}

/// How a batch asks before it acts.
#[derive(Clone, Copy, Debug, Default)]
pub struct Confirm {
    /// Print what would be done and do nothing.
    pub dry_run: bool,
    /// Act without asking.
    pub yes: bool,
}

/// One run's result, as `--json` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunResult {
    /// The run.
    pub run: RunId,
    /// `terminated`, `cancelRequested`, `alreadyRequested`, `skipped` (it had ended, or is
    /// gone) or `error`.
    pub outcome: &'static str,
    /// The seq the action wrote at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// How a skipped run had ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<&'static str>,
    /// What went wrong.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RunResult {
    fn new(run: &RunId, outcome: &'static str) -> Self {
        Self {
            run: run.clone(),
            outcome,
            seq: None,
            status: None,
            error: None,
        }
    }

    fn line(&self) -> String {
        match (self.outcome, self.seq, self.status, &self.error) {
            ("terminated", Some(seq), ..) => format!("{}  terminated (seq {seq})", self.run),
            ("cancelRequested", Some(seq), ..) => {
                format!("{}  cancel requested (seq {seq})", self.run)
            }
            ("alreadyRequested", ..) => format!("{}  cancel already requested", self.run),
            ("skipped", _, Some(status), _) => {
                format!("{}  skipped: already ended ({status})", self.run)
            }
            ("skipped", ..) => format!("{}  skipped: no such run any more", self.run),
            (_, _, _, Some(e)) => format!("{}  error: {e}", self.run),
            (o, ..) => format!("{}  {o}", self.run),
        }
    }
}

/// Acts on one run: its result, or the store's or server's error.
async fn try_act(
    target: &Target,
    run: &RunId,
    action: &Action,
    now: Timestamp,
) -> Result<RunResult, TargetError> {
    Ok(match action {
        Action::Cancel { reason } => match target.request_cancel(run, reason, now).await? {
            CancelOutcome::Requested { seq } => RunResult {
                seq: Some(seq),
                ..RunResult::new(run, "cancelRequested")
            },
            CancelOutcome::AlreadyRequested => RunResult::new(run, "alreadyRequested"),
            CancelOutcome::AlreadyEnded { status } => RunResult {
                status: Some(status.as_str()),
                ..RunResult::new(run, "skipped")
            },
        },
        Action::Terminate { reason, by } => match target.terminate(run, reason, by, now).await? {
            TerminateOutcome::Terminated { seq } => RunResult {
                seq: Some(seq),
                ..RunResult::new(run, "terminated")
            },
            TerminateOutcome::NotLive { status } => RunResult {
                status: Some(status.as_str()),
                ..RunResult::new(run, "skipped")
            },
        },
    })
}

/// Acts on one run of a batch: a run gone meanwhile (purged) is skipped, an error is a result.
async fn act(target: &Target, run: &RunId, action: &Action, now: Timestamp) -> RunResult {
    try_act(target, run, action, now).await.unwrap_or_else(|e| {
        let gone = match &e {
            TargetError::Store(eve_core::StoreError::NotFound { .. }) => true,
            TargetError::Remote(r) => r.status() == Some(404),
            _ => false,
        };
        if gone {
            RunResult::new(run, "skipped")
        } else {
            RunResult {
                error: Some(e.to_string()),
                ..RunResult::new(run, "error")
            }
        }
    })
}

/// `eve runs cancel RUN` / `eve runs terminate RUN`: one run. A terminate of an ended run is
/// an error naming its status; a cancel of one prints that it was skipped, as `eve cancel`
/// does.
///
/// # Errors
/// `NotLive` (terminate); unknown run; the store's or the server's.
pub async fn one(
    target: &Target,
    run: &str,
    action: &Action,
    json: bool,
    now: Timestamp,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let id = RunId::new(run);
    let verb = action.verb();
    let r = try_act(target, &id, action, now)
        .await
        .map_err(CliError::at(format!("cannot {verb} {run}")))?;
    if let (Action::Terminate { .. }, Some(status)) = (action, r.status) {
        return Err(CliError::NotLive {
            run: run.to_owned(),
            status,
            action: verb,
        });
    }
    print_one(&r, json, out);
    Ok(())
}

fn print_one(r: &RunResult, json: bool, out: &mut dyn Write) {
    let _ = if json {
        writeln!(
            out,
            "{}",
            serde_json::to_string(r).expect("a result serializes")
        )
    } else {
        writeln!(out, "{}", r.line())
    };
}

/// `eve runs cancel|terminate` by filter.
///
/// # Errors
/// `Usage` for a batch without a filter (and no `--all`) or without `--yes` when stdin is not
/// a terminal; `BatchFailed` when the action failed on some runs; the listing's error.
pub async fn batch(
    target: &Target,
    selection: &Selection,
    action: &Action,
    confirm: Confirm,
    json: bool,
    now: Timestamp,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let verb = action.verb();
    if !selection.filtered() && !selection.all {
        return Err(CliError::Usage(format!(
            "eve runs {verb} without a run id acts on every run a filter selects: give a filter (--status, --session, --tool, --since, --until, --query), or --all for every live run"
        )));
    }
    let runs: Vec<RunRecord> = target
        .select_runs(selection.session.as_ref(), &selection.filter)
        .await
        .map_err(CliError::at("cannot list runs"))?
        .into_iter()
        .filter(|r| !r.status.is_terminal())
        .collect();
    if confirm.dry_run {
        if json {
            let ids: Vec<&RunId> = runs.iter().map(|r| &r.run_id).collect();
            let _ = writeln!(
                out,
                "{}",
                serde_json::json!({ "dryRun": true, "action": verb, "count": runs.len(), "runs": ids })
            );
        } else {
            let _ = writeln!(
                out,
                "would {verb} {} run(s) (dry run: nothing changed)",
                runs.len()
            );
            for r in &runs {
                let _ = writeln!(out, "{}", r.run_id);
            }
        }
        return Ok(());
    }
    if runs.is_empty() {
        let _ = if json {
            writeln!(out, "[]")
        } else {
            writeln!(out, "no live run matches; nothing to {verb}")
        };
        return Ok(());
    }
    if !confirm.yes {
        if !std::io::stdin().is_terminal() {
            return Err(CliError::Usage(format!(
                "eve runs {verb} would act on {} run(s) and asks first, but stdin is not a terminal: pass --yes to {verb} them without asking (or --dry-run to list them)",
                runs.len()
            )));
        }
        eprint!("{verb} {} run(s)? [y/N] ", runs.len());
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
            let _ = writeln!(out, "nothing done");
            return Ok(());
        }
    }
    let bar = ProgressBar::with_draw_target(Some(runs.len() as u64), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} ({eta})")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(format!("{verb}ing"));
    let mut results = Vec::with_capacity(runs.len());
    for r in &runs {
        let result = act(target, &r.run_id, action, now).await;
        if !json {
            bar.suspend(|| {
                let _ = writeln!(out, "{}", result.line());
            });
        }
        results.push(result);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let count = |o: &str| results.iter().filter(|r| r.outcome == o).count();
    let failed = count("error");
    if json {
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string(&results).expect("results serialize")
        );
    } else {
        let done = match action {
            Action::Cancel { .. } => format!(
                "cancel requested {}, already requested {}",
                count("cancelRequested"),
                count("alreadyRequested")
            ),
            Action::Terminate { .. } => format!("terminated {}", count("terminated")),
        };
        let _ = writeln!(
            out,
            "{done}, skipped {} (ended meanwhile), failed {failed}; {} run(s) in all",
            count("skipped"),
            results.len()
        );
    }
    if failed > 0 {
        return Err(CliError::BatchFailed {
            failed,
            total: results.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use eve_core::{JournalStore, JournalStoreExt, MemoryStore, RunStatus};
    use std::sync::Arc;

    /// A run that ended between the listing and the action is skipped, naming its status; a
    /// run purged meanwhile is skipped too; neither is an error.
    #[tokio::test]
    async fn runs_ended_meanwhile_are_skipped() {
        let store = Arc::new(MemoryStore::new());
        let run = store
            .create_run(
                eve_core::NewRun {
                    run_id: RunId::new("run-batch"),
                    idempotency_key: None,
                    workflow_id: eve_core::WorkflowId::new("batch::workflow"),
                    deployment_id: eve_core::DeploymentId::new("d1"),
                    tool: "batch_tool".into(),
                    input: eve_core::Payload::from_json("{}").unwrap(),
                    session_id: eve_core::SessionId::new("s"),
                    call_id: eve_core::CallId::new("c"),
                    execution: eve_core::Execution::Default,
                    traceparent: None,
                    reset_from: None,
                },
                Timestamp(0),
            )
            .await
            .unwrap()
            .run
            .run_id;
        store
            .terminate(&run, "first", "alice", Timestamp(1))
            .await
            .unwrap();
        let target = Target::Local(store.clone());
        for action in [
            Action::Terminate {
                reason: "again".into(),
                by: "bob".into(),
            },
            Action::Cancel {
                reason: "again".into(),
            },
        ] {
            let r = act(&target, &run, &action, Timestamp(2)).await;
            assert_eq!(
                (r.outcome, r.status),
                ("skipped", Some(RunStatus::Failed.as_str()))
            );
            let gone = act(&target, &RunId::new("gone"), &action, Timestamp(2)).await;
            assert_eq!(gone.outcome, "skipped");
        }
    }
}
