//! The commands that read or poke a store: runs, journals, pending requests, answers, hook
//! payloads, cancellation, operator decisions on blocked runs.

use crate::error::CliError;
use crate::format::{describe, event_line, run_header, run_row, utc};
use crate::target::Target;
use eve_core::{
    CancelOutcome, Delivered, Event, InputResponse, Payload, PendingRequest, RequestId, Resolution,
    RunFilter, RunId, RunQuery, RunStatus, SessionId, Timestamp, WatchKey,
};
use std::collections::BTreeSet;
use std::io::Write;
use std::time::Duration;

/// Parses a run status name (`running`, `blocked`, `completed`, `failed`, `cancelled`).
///
/// # Errors
/// [`CliError::Usage`] naming the accepted values.
pub fn parse_status(s: &str) -> Result<RunStatus, CliError> {
    RunStatus::parse(&s.to_ascii_lowercase()).ok_or_else(|| {
        CliError::Usage(format!(
            "unknown run status {s:?}; use one of running, blocked, completed, failed, cancelled"
        ))
    })
}

/// `eve runs list`: the runs matching the filters in the filter's order (newest first unless
/// `--oldest-first`), one row each, and the flag that gives the next page: `--before RUN`
/// newest first, `--after RUN` oldest first.
///
/// # Errors
/// The store's error.
pub async fn runs_list(
    target: &Target,
    session: Option<SessionId>,
    filter: &RunFilter,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let query = RunQuery {
        session,
        ..RunQuery::default()
    };
    let runs = target
        .search_runs(&query, filter.query.as_ref())
        .await
        .map_err(CliError::at("cannot list runs"))?;
    let cursor = if filter.newest_first {
        "--before"
    } else {
        "--after"
    };
    let page = filter
        .page(runs)
        .map_err(|e| CliError::Usage(format!("{cursor}: {e}")))?;
    if json {
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string(&page).expect("a page serializes")
        );
        return Ok(());
    }
    let _ = writeln!(out, "{}", run_header());
    for r in &page.runs {
        let _ = writeln!(out, "{}", run_row(r));
    }
    match &page.next {
        Some(next) => {
            let _ = writeln!(
                out,
                "{} run(s) shown; the next page: {cursor} {next}",
                page.runs.len()
            );
        }
        None => {
            let _ = writeln!(out, "{} run(s)", page.runs.len());
        }
    }
    Ok(())
}

/// `eve runs show <run>`: the run's record, its pending requests, and how it ended.
///
/// # Errors
/// `NotFound` for an unknown run; the store's error.
pub async fn runs_show(
    target: &Target,
    run: &str,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let id = RunId::new(run);
    let doing = || format!("cannot show run {run}");
    let (r, events) = target
        .run_and_journal(&id)
        .await
        .map_err(CliError::at(doing()))?;
    let pending: Vec<PendingRequest> = target
        .pending_requests(&r.session_id)
        .await
        .map_err(CliError::at(doing()))?
        .into_iter()
        .filter(|p| p.run_id == id)
        .collect();
    let outcome = events
        .iter()
        .rev()
        .find(|e| e.event.is_terminal() || matches!(e.event, Event::RunBlocked { .. }));
    // A run started by a reset or retry names the run and the seq it was cut from.
    let reset_from = events.first().and_then(|e| match &e.event {
        Event::RunStarted { reset_from, .. } => reset_from.clone(),
        _ => None,
    });
    if json {
        let _ = writeln!(
            out,
            "{}",
            serde_json::json!({ "run": r, "pending": pending, "outcome": outcome, "reset_from": reset_from })
        );
        return Ok(());
    }
    let lines = [
        ("run", r.run_id.to_string()),
        ("status", r.status.as_str().to_owned()),
        ("tool", r.tool.clone()),
        ("workflow", r.workflow_id.to_string()),
        ("deployment", r.deployment_id.to_string()),
        ("session", r.session_id.to_string()),
        ("call", r.call_id.to_string()),
        (
            "execution",
            format!("{:?}", r.execution).to_ascii_lowercase(),
        ),
        ("events", r.next_seq.to_string()),
        ("processed", r.processed_seq.to_string()),
        ("cancel", r.cancel_requested.to_string()),
        (
            "owner",
            r.owner
                .as_ref()
                .map_or("-".into(), |(w, epoch)| format!("{w} (epoch {epoch})")),
        ),
        ("created", utc(r.created_at)),
        ("updated", utc(r.updated_at)),
    ];
    for (k, v) in lines {
        let _ = writeln!(out, "{k:<11} {v}");
    }
    if let Some(from) = &reset_from {
        let _ = writeln!(
            out,
            "{:<11} {} at seq {} (a reset: its events before that seq were copied)",
            "reset from", from.run, from.seq
        );
    }
    if !r.attributes.is_empty() {
        let attrs: Vec<String> = r
            .attributes
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(out, "{:<11} {}", "attributes", attrs.join(" "));
    }
    for p in &pending {
        let _ = writeln!(out, "{:<11} {}", "pending", request_line(p));
    }
    if let Some(end) = outcome {
        let _ = writeln!(out, "{:<11} {}", "outcome", describe(&end.event));
    }
    Ok(())
}

/// The shortest and longest pause of `eve runs show --follow` between two reads of a live run
/// that wrote nothing new: it doubles from the first to the second while the run is quiet and
/// starts over at each new event. A store that notifies (memory, SQLite and Postgres in this
/// process) wakes it at once when the run's session log grows (a request, an end).
pub const FOLLOW_PAUSE: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// `eve runs show RUN --follow`: after the run's record, its journal, one event per line as
/// `eve journal` prints it (tokens masked; `json`: one JSON object a line), and every event it
/// writes from then on as it comes, until the run ends (the last line is its end event). On the
/// store it reads from the last seq seen, woken by the store's notifications where it has them;
/// over HTTP it polls the run, with the same backoff ([`FOLLOW_PAUSE`]).
///
/// # Errors
/// `NotFound` for an unknown run; the store's or server's error.
pub async fn follow(
    target: &Target,
    run: &str,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let id = RunId::new(run);
    let doing = || format!("cannot follow run {run}");
    let record = target.get_run(&id).await.map_err(CliError::at(doing()))?;
    let mut wake = match target {
        Target::Local(s) => s.watch(&WatchKey::Session(record.session_id.clone())).await,
        Target::Remote(_) => None,
    };
    let (mut next, mut pause) = (0u64, FOLLOW_PAUSE.0);
    loop {
        let events = target
            .read_from(&id, next)
            .await
            .map_err(CliError::at(doing()))?;
        let mut ended = false;
        let new = !events.is_empty();
        let from = next;
        for mut e in events.into_iter().filter(|e| e.seq >= from) {
            e.event.mask_webhook_token();
            let line = if json {
                serde_json::to_string(&e).unwrap_or_else(|err| format!("(unserializable: {err})"))
            } else {
                event_line(&e)
            };
            let _ = writeln!(out, "{line}");
            next = e.seq + 1;
            ended |= e.event.is_terminal();
        }
        let _ = out.flush();
        if ended {
            return Ok(());
        }
        pause = if new {
            FOLLOW_PAUSE.0
        } else {
            (pause * 2).min(FOLLOW_PAUSE.1)
        };
        match wake.as_mut() {
            Some(rx) => {
                tokio::select! {
                    changed = rx.changed() => if changed.is_err() { wake = None },
                    _ = tokio::time::sleep(pause) => {}
                }
            }
            None => tokio::time::sleep(pause).await,
        }
    }
}

/// `eve sessions show S [--json]`: whether the session ended, its queued messages and its runs
/// (oldest first); `json`: `{"session": SessionRecord, "runs": [RunRecord…]}`.
///
/// # Errors
/// The store's or server's error (a store without sessions).
pub async fn session_show(
    target: &Target,
    session: &str,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let id = SessionId::new(session);
    let doing = || format!("cannot show session {session}");
    let record = target
        .get_session(&id)
        .await
        .map_err(CliError::at(doing()))?;
    let mut runs = target
        .list_runs(&RunQuery {
            session: Some(id),
            ..RunQuery::default()
        })
        .await
        .map_err(CliError::at(doing()))?;
    runs.sort_by(|a, b| (a.created_at, &a.run_id).cmp(&(b.created_at, &b.run_id)));
    if json {
        let _ = writeln!(
            out,
            "{}",
            serde_json::json!({ "session": record, "runs": runs })
        );
        return Ok(());
    }
    let _ = writeln!(out, "{:<11} {}", "session", record.session_id);
    let ended = record.ended_at.map_or("- (live)".to_owned(), utc);
    let _ = writeln!(out, "{:<11} {ended}", "ended");
    for m in &record.queued {
        let _ = writeln!(
            out,
            "{:<11} #{} {} {}",
            "queued",
            m.seq,
            utc(m.at),
            m.message.get()
        );
    }
    let _ = writeln!(out, "{}", run_header());
    for r in &runs {
        let _ = writeln!(out, "{}", run_row(r));
    }
    let _ = writeln!(out, "{} run(s)", runs.len());
    Ok(())
}

/// `eve sessions end S`: ends the session (no new call starts in it) and requests cancellation
/// of its runs that had not ended; ending again keeps the first time.
///
/// # Errors
/// The store's or server's error.
pub async fn session_end(
    target: &Target,
    session: &str,
    now: Timestamp,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let end = target
        .end_session(&SessionId::new(session), now)
        .await
        .map_err(CliError::at(format!("cannot end session {session}")))?;
    let runs: Vec<String> = end.cancelled.iter().map(ToString::to_string).collect();
    let _ = writeln!(
        out,
        "session {session} ended at {}; cancel requested for {} run(s){}{}",
        utc(end.ended_at),
        runs.len(),
        if runs.is_empty() { "" } else { ": " },
        runs.join(", ")
    );
    Ok(())
}

/// `eve journal <run>`: every event of the run, one line each, in seq order. Webhook tokens are
/// masked ([`Event::mask_webhook_token`]) unless `reveal`: they are capabilities, and a journal
/// is pasted into tickets and exported for `eve replay`, which passes on a masked export.
/// [`journal_range`] with the whole journal.
///
/// # Errors
/// `NotFound` for an unknown run; the store's error.
pub async fn journal(
    target: &Target,
    run: &str,
    json: bool,
    reveal: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    journal_range(target, run, 0, None, json, reveal, out).await
}

/// The page size `eve journal` reads and prints by: it holds one page of events at a time,
/// however long the journal.
pub const JOURNAL_PRINT_PAGE: usize = 1000;

/// `eve journal <run> [--from SEQ] [--limit N]`: the events from seq `from` on (at most
/// `limit` of them, all when `None`), printed as [`journal`] does. The journal is read and
/// printed a page ([`JOURNAL_PRINT_PAGE`] events) at a time, so a journal of a million events
/// streams out without being held.
///
/// # Errors
/// `NotFound` for an unknown run; a `from` past the journal's end; the store's error.
pub async fn journal_range(
    target: &Target,
    run: &str,
    from: u64,
    limit: Option<u64>,
    json: bool,
    reveal: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let run_id = RunId::new(run);
    let mut seq = from;
    let mut left = limit.unwrap_or(u64::MAX);
    while left > 0 {
        let want = usize::try_from(left)
            .unwrap_or(usize::MAX)
            .min(JOURNAL_PRINT_PAGE);
        let mut page = target
            .read_page(&run_id, seq, want)
            .await
            .map_err(CliError::at(format!(
                "cannot read the journal of run {run}"
            )))?;
        let Some(last) = page.last() else {
            break;
        };
        seq = last.seq + 1;
        left -= page.len() as u64;
        for e in &mut page {
            if !reveal {
                e.event.mask_webhook_token();
            }
            let line = if json {
                serde_json::to_string(e).unwrap_or_else(|err| format!("(unserializable: {err})"))
            } else {
                event_line(e)
            };
            let _ = writeln!(out, "{line}");
        }
    }
    Ok(())
}

/// `eve requests`: pending questions (`ctx.ask`), of one session or of every session with a live
/// run; pending subagent calls are listed by `eve agents list`.
///
/// # Errors
/// The store's error.
pub async fn requests(
    target: &Target,
    session: Option<String>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    list_pending(target, session, json, out, "request", |p| {
        p.request.agent.is_none().then(|| request_line(p))
    })
    .await
}

/// `eve agents list [--session S] [--json]`: the pending subagent calls (pending requests
/// carrying a call), one line each: id, run, target, key and message; or a JSON array.
///
/// # Errors
/// Store failures.
pub async fn agents(
    target: &Target,
    session: Option<String>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    list_pending(target, session, json, out, "agent call", |p| {
        let a = p.request.agent.as_ref()?;
        Some(format!(
            "{}  run {}  subagent {:?} key {:?}  message {}{}",
            p.request_id,
            p.run_id,
            a.target,
            a.key,
            a.message,
            if a.output_schema.is_some() {
                "  (output schema)"
            } else {
                ""
            }
        ))
    })
    .await
}

/// Prints the pending requests `line` gives a line for (the others are not listed), as those
/// lines and a count of `what`s, or as a JSON array.
async fn list_pending(
    target: &Target,
    session: Option<String>,
    json: bool,
    out: &mut dyn Write,
    what: &str,
    line: impl Fn(&PendingRequest) -> Option<String>,
) -> Result<(), CliError> {
    let mut all = pending(target, session, &format!("cannot list pending {what}s")).await?;
    all.retain(|p| line(p).is_some());
    if json {
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string(&all).expect("requests serialize")
        );
        return Ok(());
    }
    for l in all.iter().filter_map(&line) {
        let _ = writeln!(out, "{l}");
    }
    let _ = writeln!(out, "{} pending {what}(s)", all.len());
    Ok(())
}

/// `eve agents complete ID (--output JSON | --error WHY)`: reports a subagent call's result,
/// once (the same result again is a duplicate).
///
/// # Errors
/// The store's refusal: `InvalidAnswer` when the output does not match the call's schema
/// (nothing is recorded), `AlreadyAnswered`, `Withdrawn`, `NotFound`.
pub async fn complete_agent(
    target: &Target,
    id: &str,
    response: InputResponse,
    now: Timestamp,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let d = target
        .answer(&RequestId::new(id), response, now)
        .await
        .map_err(CliError::at(format!("cannot complete agent call {id}")))?;
    let _ = if d.duplicate {
        writeln!(
            out,
            "agent call {id} already had this result (run {}); nothing new was written",
            d.run
        )
    } else {
        writeln!(
            out,
            "completed agent call {id} (run {}, seq {})",
            d.run, d.seq
        )
    };
    Ok(())
}

/// Pending requests of `session`, or of every live run's session.
async fn pending(
    target: &Target,
    session: Option<String>,
    what: &str,
) -> Result<Vec<PendingRequest>, CliError> {
    let doing = || what.to_owned();
    let sessions: BTreeSet<SessionId> = match session {
        Some(s) => [SessionId::new(s)].into(),
        None => {
            let mut all = BTreeSet::new();
            for status in [RunStatus::Running, RunStatus::Blocked] {
                let query = RunQuery {
                    status: Some(status),
                    ..RunQuery::default()
                };
                let runs = target
                    .list_runs(&query)
                    .await
                    .map_err(CliError::at(doing()))?;
                all.extend(runs.into_iter().map(|r| r.session_id));
            }
            all
        }
    };
    let mut all = Vec::new();
    for s in &sessions {
        all.extend(
            target
                .pending_requests(s)
                .await
                .map_err(CliError::at(doing()))?,
        );
    }
    Ok(all)
}

/// One pending request: id, run, prompt and what an answer may be.
pub fn request_line(p: &PendingRequest) -> String {
    let options: Vec<&str> = p.request.options.iter().map(|o| o.id.as_str()).collect();
    let accepts = match (options.is_empty(), p.request.allow_freeform) {
        (true, _) => "--text".to_owned(),
        (false, false) => options.join("|"),
        (false, true) => format!("{}|--text", options.join("|")),
    };
    // An approval gate: the tool and the model's input, and a denial may carry a reason.
    if let Some(gate) = &p.request.approval {
        return format!(
            "{}  run {}  approval: {} {}  answer: {} [--text REASON]",
            p.request_id, p.run_id, gate.tool, gate.input, accepts
        );
    }
    format!(
        "{}  run {}  {:?}  answer: {}",
        p.request_id, p.run_id, p.request.prompt, accepts
    )
}

/// `eve answer <request> [option] [--text …] [--as NAME]`: writes `response` (its
/// `answered_by` is recorded as given, unchecked).
///
/// # Errors
/// [`CliError::Usage`] when neither an option nor a text is given; the store's typed errors
/// (unknown request, already answered, withdrawn, an option not offered).
pub async fn answer(
    target: &Target,
    request: &str,
    response: InputResponse,
    now: Timestamp,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    if response.option_id.is_none() && response.text.is_none() {
        return Err(CliError::Usage(
            "give an option id (eve answer REQUEST approve) or --text \"…\"".into(),
        ));
    }
    let d = target
        .answer(&RequestId::new(request), response, now)
        .await
        .map_err(CliError::at(format!("cannot answer request {request}")))?;
    let _ = if d.duplicate {
        writeln!(
            out,
            "request {request} already had this answer (run {}); nothing new was written",
            d.run
        )
    } else {
        writeln!(
            out,
            "answered request {request} (run {}, seq {})",
            d.run, d.seq
        )
    };
    Ok(())
}

/// The answer of `POST /v1/hooks/{token}` (its `token` is the one sent).
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct HookDelivered {
    run_id: RunId,
    seq: u64,
    duplicate: bool,
}

/// `eve hook resume <token> <json> [--dedupe-key K]`: delivers a JSON payload to a live hook,
/// on the store or, with `--url`, through the server's `POST /v1/hooks/{token}` (an operate
/// key; the dedupe key is sent as `Idempotency-Key`). Both print the same line.
///
/// # Errors
/// [`CliError::Usage`] when the payload is not JSON; `NotFound` (404 over HTTP) when no live
/// hook has the token; over HTTP also 409 `idempotency_mismatch` for a dedupe key delivered
/// before with another payload, and the key's scope (403).
pub async fn hook_resume(
    target: &Target,
    token: &str,
    json: &str,
    key: Option<&str>,
    now: Timestamp,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let value: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| CliError::Usage(format!("the hook payload is not JSON: {e}")))?;
    let doing = format!("cannot resume hook {token:?}");
    let d = match target {
        Target::Local(store) => {
            let payload = Payload::from_value(&value)
                .map_err(|e| CliError::Usage(format!("the hook payload is not JSON: {e}")))?;
            store
                .deliver_hook(token, payload, key, now)
                .await
                .map_err(CliError::store(doing))?
        }
        Target::Remote(r) => {
            let path = format!("/v1/hooks/{}", crate::remote::segment(token));
            let headers: Vec<(&str, &str)> =
                key.map(|k| ("idempotency-key", k)).into_iter().collect();
            let (_, v) = r
                .post_with_headers(&path, &value, &headers)
                .await
                .map_err(|e| CliError::at(doing.clone())(e.into()))?;
            let d: HookDelivered = serde_json::from_value(v).map_err(|e| {
                CliError::at(doing.clone())(
                    crate::remote::RemoteError::Unexpected {
                        url: r.url().to_owned(),
                        reason: format!("the answer to POST {path} is not a delivery: {e}"),
                    }
                    .into(),
                )
            })?;
            Delivered {
                run: d.run_id,
                seq: d.seq,
                duplicate: d.duplicate,
            }
        }
    };
    let _ = if d.duplicate {
        writeln!(
            out,
            "hook {token:?} already received the delivery with this key (run {}); nothing new was written",
            d.run
        )
    } else {
        writeln!(
            out,
            "delivered to hook {token:?} (run {}, seq {})",
            d.run, d.seq
        )
    };
    Ok(())
}

/// `eve cancel <task>`: requests cancellation of a run (a background task or any run).
///
/// # Errors
/// `NotFound` for an unknown run; the store's error.
pub async fn cancel(
    target: &Target,
    task: &str,
    reason: &str,
    now: Timestamp,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let outcome = target
        .request_cancel(&RunId::new(task), reason, now)
        .await
        .map_err(CliError::at(format!("cannot cancel {task}")))?;
    let _ = match outcome {
        CancelOutcome::Requested { seq } => writeln!(
            out,
            "cancel requested for {task} (seq {seq}); its body gets its grace period, then it ends cancelled"
        ),
        CancelOutcome::AlreadyRequested => {
            writeln!(out, "cancel was already requested for {task}; nothing new was written")
        }
        CancelOutcome::AlreadyEnded { status } => writeln!(
            out,
            "{task} already ended ({}); nothing to cancel",
            status.as_str()
        ),
    };
    Ok(())
}

/// `eve runs resume <run>` / `eve runs fail <run> --error …`: an operator's decision on a
/// blocked run.
///
/// # Errors
/// `InvalidInput` when the run is not blocked; `NotFound`; the store's error.
pub async fn resolve(
    target: &Target,
    run: &str,
    resolution: Resolution,
    now: Timestamp,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let what = match &resolution {
        Resolution::Resume => "resumed",
        Resolution::Fail { .. } => "failed",
        Resolution::Terminate { .. } => "terminated",
    };
    let seq = target
        .resolve_blocked(&RunId::new(run), resolution, now)
        .await
        .map_err(CliError::at(format!("cannot resolve blocked run {run}")))?;
    let _ = writeln!(out, "{what} run {run} (seq {seq})");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_approval_request_shows_the_tool_and_its_input() {
        let run = eve_core::RunId::new("run_1");
        let p = PendingRequest {
            request_id: RequestId::for_command(&run, 0),
            run_id: run,
            session_id: SessionId::new("s"),
            cmd: 0,
            request: eve_core::InputRequest::approval(
                "deploy",
                serde_json::json!({"service": "api"}),
            ),
            requested_at: Timestamp(0),
        };
        assert_eq!(
            request_line(&p),
            r#"run_1:0  run run_1  approval: deploy {"service":"api"}  answer: approve|deny [--text REASON]"#
        );
    }
}
