//! Helpers for the session examples: one line per channel event, the event's wire name, and a
//! follower that prints a session's channel until a call's run has ended.

use eve_core::engine::{Session, SessionError, SessionEventExt};
use eve_core::{RunId, SessionEntry, SessionEvent};
use futures::StreamExt;

/// The event's name on the wire (`input.requested`, `task.completed`, …).
pub fn kind(event: &SessionEvent) -> String {
    serde_json::to_value(event)
        .ok()
        .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_owned))
        .unwrap_or_default()
}

/// One line per channel entry, for the examples' output: seq, kind, what it carries, and
/// whether it requests a parent-agent turn or only streams to the user.
pub fn describe_entry(e: &SessionEntry) -> String {
    let detail = match &e.event {
        SessionEvent::InputRequested {
            request_id,
            request,
        } => {
            let options: Vec<&str> = request.options.iter().map(|o| o.id.as_str()).collect();
            format!("{request_id} {:?} options {options:?}", request.prompt)
        }
        SessionEvent::InputAnswered {
            request_id,
            answered_by: Some(by),
        } => format!("{request_id} by {by}"),
        SessionEvent::InputAnswered { request_id, .. }
        | SessionEvent::InputWithdrawn { request_id } => request_id.to_string(),
        SessionEvent::ActionPartial { value } | SessionEvent::TaskProgress { value } => {
            value.get().to_owned()
        }
        SessionEvent::TaskMessage { message } => message.get().to_owned(),
        SessionEvent::TaskCompleted { output } => output.get().to_owned(),
        SessionEvent::TaskFailed { error } => error.clone(),
        SessionEvent::TaskCancelled => String::new(),
        SessionEvent::TaskDenied { reason } => reason.clone(),
        SessionEvent::ToolSettled { result } => serde_json::to_string(result).unwrap_or_default(),
        SessionEvent::AgentRequested { request_id, agent } => {
            format!(
                "{request_id} subagent {:?} key {:?}",
                agent.target, agent.key
            )
        }
        SessionEvent::AgentCompleted {
            request_id, error, ..
        } => match error {
            Some(e) => format!("{request_id} failed: {e}"),
            None => request_id.to_string(),
        },
    };
    format!(
        "channel seq {:>2}  {:<16} {}{}",
        e.seq,
        kind(&e.event),
        detail,
        if e.event.requests_turn() {
            "   [wakes the agent]"
        } else {
            ""
        }
    )
}

/// Whether the entry ends `run`'s call: its `tool.settled`, or its task's completion, failure
/// or cancellation.
pub fn ends_run(e: &SessionEntry, run: &RunId) -> bool {
    &e.run_id == run
        && matches!(
            e.event,
            SessionEvent::ToolSettled { .. }
                | SessionEvent::TaskCompleted { .. }
                | SessionEvent::TaskFailed { .. }
                | SessionEvent::TaskCancelled
                | SessionEvent::TaskDenied { .. }
        )
}

/// Follows the session's channel from seq 0, handing every entry to `on_entry`, until the entry
/// that ends `run`; returns every entry seen, that one last.
///
/// # Errors
/// The store's error.
pub async fn follow_until_ended(
    session: &Session,
    run: &RunId,
    mut on_entry: impl FnMut(&SessionEntry),
) -> Result<Vec<SessionEntry>, SessionError> {
    let mut seen = Vec::new();
    let mut stream = Box::pin(session.follow(0));
    while let Some(entry) = stream.next().await {
        let entry = entry?;
        on_entry(&entry);
        let done = ends_run(&entry, run);
        seen.push(entry);
        if done {
            break;
        }
    }
    Ok(seen)
}
