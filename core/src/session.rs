//! The session channel's event types and the per-session log entries stores keep.

use crate::event::{AgentRequest, InputRequest, Payload};
use crate::ids::{CallId, RequestId, RunId, SessionId};
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};

/// One event on a session's channel. Stores write these in the same transaction as the journal
/// event that causes them, so none is lost or doubled.
///
/// Serialized as `{"type": "input.requested", "data": {..}}` (adjacently tagged, so payloads stay
/// raw JSON).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum SessionEvent {
    /// `ctx.ask` published a request.
    #[serde(rename = "input.requested")]
    InputRequested {
        /// The request id to answer.
        request_id: RequestId,
        /// What is asked.
        request: InputRequest,
    },
    /// A request was answered.
    #[serde(rename = "input.answered")]
    InputAnswered {
        /// The request.
        request_id: RequestId,
        /// Who answered, as the answering surface recorded it ([`InputResponse::answered_by`](crate::InputResponse::answered_by)).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answered_by: Option<String>,
    },
    /// A request can no longer be answered.
    #[serde(rename = "input.withdrawn")]
    InputWithdrawn {
        /// The request.
        request_id: RequestId,
    },
    /// A progress snapshot of a default-execution call: last-write-wins per call id, never in
    /// model history.
    #[serde(rename = "action.partial")]
    ActionPartial {
        /// The snapshot.
        value: Payload,
    },
    /// Stream-only progress of a background task.
    #[serde(rename = "task.progress")]
    TaskProgress {
        /// The snapshot.
        value: Payload,
    },
    /// A background task's message to the parent agent (requests a turn).
    #[serde(rename = "task.message")]
    TaskMessage {
        /// The message.
        message: Payload,
    },
    /// A background task completed.
    #[serde(rename = "task.completed")]
    TaskCompleted {
        /// Its output.
        output: Payload,
    },
    /// A background task failed.
    #[serde(rename = "task.failed")]
    TaskFailed {
        /// Why.
        error: String,
    },
    /// A background task was cancelled.
    #[serde(rename = "task.cancelled")]
    TaskCancelled,
    /// A default-execution call was settled: one call, one result.
    #[serde(rename = "tool.settled")]
    ToolSettled {
        /// The result.
        result: ToolResult,
    },
    /// `ctx.agent` asked the host for a subagent call (the wire form: no in-process
    /// `AgentHost`). Written instead of `input.requested` for such a request; the host serves
    /// it and reports the child's result to the request id (`POST /v1/agents/{id}/result`,
    /// MCP sampling). Ending the run withdraws it with `input.withdrawn`.
    #[serde(rename = "agent.requested")]
    AgentRequested {
        /// The request id the result is reported to.
        request_id: RequestId,
        /// The call: key, target, message, child to continue, output schema.
        agent: AgentRequest,
    },
    /// The host reported the result of a subagent call, once (written instead of
    /// `input.answered` for such a request).
    #[serde(rename = "agent.completed")]
    AgentCompleted {
        /// The request.
        request_id: RequestId,
        /// Who reported it, as the reporting surface recorded it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answered_by: Option<String>,
        /// Why the child failed, when it did; `None` when it gave an output (which the run's
        /// journal holds).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A background task was denied by its tool's approval policy or the person asked: its
    /// body never ran.
    #[serde(rename = "task.denied")]
    TaskDenied {
        /// Why.
        reason: String,
    },
}

/// How a default-execution tool call was settled.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", content = "data", rename_all = "lowercase")]
pub enum ToolResult {
    /// The run's output.
    Completed {
        /// The output.
        output: Payload,
    },
    /// The run's error.
    Failed {
        /// The error.
        error: String,
    },
    /// The run was cancelled.
    Cancelled,
    /// The call was denied by its tool's approval policy or the person asked; the body never
    /// ran.
    Denied {
        /// Why.
        reason: String,
    },
}

/// One entry of a session's log, with its own per-session seq (from 0).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionEntry {
    /// The session.
    pub session_id: SessionId,
    /// Position in the session's log, from 0; SSE resume replays from here.
    pub seq: u64,
    /// When it was written.
    pub at: Timestamp,
    /// The run that caused it.
    pub run_id: RunId,
    /// The tool call of that run (the task id of a background run is its run id).
    pub call_id: CallId,
    /// The event.
    pub event: SessionEvent,
}

/// A user message persisted in a session's queue until the host takes it to start a turn
/// ([`JournalStore::queue_message`](crate::JournalStore::queue_message)).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuedMessage {
    /// The session.
    pub session_id: SessionId,
    /// Position in the session's message order, from 0; never reused.
    pub seq: u64,
    /// When it was queued.
    pub at: Timestamp,
    /// The message, as the host gave it.
    pub message: Payload,
}

/// A session as the store keeps it (contract clause 10): whether it ended, and the user
/// messages queued for its next turn. A session the store never heard of reads as live with
/// an empty queue.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionRecord {
    /// The session.
    pub session_id: SessionId,
    /// When it was ended (the first end's time); `None` while it takes new calls.
    pub ended_at: Option<Timestamp>,
    /// The queued messages not yet taken, oldest first.
    pub queued: Vec<QueuedMessage>,
}

/// What [`JournalStore::end_session`](crate::JournalStore::end_session) did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionEnd {
    /// When the session was ended (the first end's time, also on a repeated end).
    pub ended_at: Timestamp,
    /// The runs of the session that had not ended (running or blocked) at the end's commit,
    /// oldest first: every run created before the end is here or had ended.
    pub live: Vec<RunId>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_events_round_trip_with_raw_payloads() {
        let events = vec![
            SessionEvent::ToolSettled {
                result: ToolResult::Completed {
                    output: Payload::from_json(r#"{"x": [1, 2]}"#).unwrap(),
                },
            },
            SessionEvent::TaskCancelled,
            SessionEvent::ActionPartial {
                value: Payload::from_json("7").unwrap(),
            },
        ];
        let json = serde_json::to_string(&events).unwrap();
        assert!(json.contains(r#""type":"tool.settled""#), "{json}");
        let back: Vec<SessionEvent> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, events);
    }
}
