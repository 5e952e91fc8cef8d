//! A run as MCP sees it: its task state read from the journal, its pending `ctx.ask` requests as
//! elicitation forms, and elicitation results as answers.

use crate::error::{from_store, invalid};
use crate::wire::clip;
use crate::{FIELD_OPTION, FIELD_TEXT};
use eve_core::event::DENY;
use eve_core::{
    Event, InputRequest, InputResponse, JournalStore, JournalStoreExt, Payload, RequestId, RunId,
    RunRecord, RunStatus, Timestamp,
};
use rmcp::model::{
    CallToolResult, ContentBlock, DetailedTask, InputRequests, JsonObject, Task, TaskPayload,
};
use rmcp::ErrorData;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// The longest task id accepted (run ids are `run_` + 32 hex digits; ids given by hosts may be
/// longer, not unbounded).
const MAX_TASK_ID: usize = 256;

/// What a run's journal says, as far as MCP cares.
#[derive(Debug, Default)]
pub(crate) struct RunView {
    /// Requests asked and neither answered nor withdrawn, in order.
    pub(crate) pending: Vec<(RequestId, InputRequest)>,
    /// Every request the run asked, in order.
    pub(crate) asked: Vec<(RequestId, InputRequest)>,
    /// The answers recorded, by request.
    pub(crate) answered: HashMap<RequestId, InputResponse>,
    /// The requests withdrawn unanswered.
    pub(crate) withdrawn: HashSet<RequestId>,
    /// The call's arguments, as recorded when the run started.
    pub(crate) input: Option<Payload>,
    /// The last progress value.
    pub(crate) progress: Option<Payload>,
    /// Every `post_message` of the run, in order.
    pub(crate) messages: Vec<Payload>,
    /// How the run ended, if it did.
    pub(crate) end: Option<End>,
    /// Why it is blocked, if it is.
    pub(crate) blocked: Option<String>,
    /// The journal's next seq: events from here on are not in this view.
    pub(crate) next_seq: u64,
}

/// How a run ended.
#[derive(Debug, Clone)]
pub(crate) enum End {
    Completed(Payload),
    Failed(String),
    Cancelled,
    /// Denied by the tool's approval policy or the person asked; the body never ran.
    Denied(String),
}

impl End {
    /// How it ended, as words after "task X".
    pub(crate) fn describe(&self) -> String {
        match self {
            End::Completed(output) => format!("completed: {}", render(output)),
            End::Failed(error) => format!("failed: {error}"),
            End::Cancelled => "was cancelled".to_owned(),
            End::Denied(reason) => format!("was denied: {reason}"),
        }
    }

    /// The session event name of this end (`task.completed`, …).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            End::Completed(_) | End::Denied(_) => "task.completed",
            End::Failed(_) => "task.failed",
            End::Cancelled => "task.cancelled",
        }
    }
}

impl RunView {
    /// Folds journal events into the view.
    pub(crate) fn apply(&mut self, events: impl IntoIterator<Item = (u64, Event)>) {
        for (seq, e) in events {
            self.next_seq = seq + 1;
            match e {
                Event::RunStarted { input, .. } => self.input = Some(input),
                Event::InputRequested {
                    request_id,
                    request,
                    ..
                } => {
                    self.asked.push((request_id.clone(), request.clone()));
                    self.pending.push((request_id, request));
                }
                Event::InputAnswered {
                    request_id,
                    response,
                } => {
                    self.pending.retain(|(id, _)| id != &request_id);
                    self.answered.insert(request_id, response);
                }
                Event::InputWithdrawn { request_id } => {
                    self.pending.retain(|(id, _)| id != &request_id);
                    self.withdrawn.insert(request_id);
                }
                Event::Progress { value, .. } => self.progress = Some(value),
                Event::MessagePosted { message, .. } => self.messages.push(message),
                Event::RunCompleted { output } => self.end = Some(End::Completed(output)),
                Event::RunFailed { error } => self.end = Some(End::Failed(error)),
                Event::RunTerminated { reason, by } => {
                    self.end = Some(End::Failed(Event::terminated_error(&reason, &by)));
                }
                Event::RunCancelled => self.end = Some(End::Cancelled),
                Event::RunDenied { reason } => self.end = Some(End::Denied(reason)),
                Event::RunBlocked { reason, .. } => self.blocked = Some(reason),
                Event::RunResumed => self.blocked = None,
                _ => {}
            }
        }
    }

    /// Reads the journal from where the view stopped.
    pub(crate) async fn refresh(
        &mut self,
        store: &dyn JournalStore,
        run: &RunId,
    ) -> Result<(), ErrorData> {
        let events = store
            .read_all(run, self.next_seq)
            .await
            .map_err(from_store)?;
        self.apply(events.into_iter().map(|e| (e.seq, e.event)));
        Ok(())
    }
}

/// Checks a task id's shape before it reaches the store.
pub(crate) fn run_id(task_id: &str) -> Result<RunId, ErrorData> {
    let ok = !task_id.is_empty()
        && task_id.len() <= MAX_TASK_ID
        && task_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b));
    if ok {
        Ok(RunId::new(task_id))
    } else {
        Err(invalid(
            "malformed",
            format!("malformed taskId {:?}: a task id is the taskId a tools/call returned (1 to {MAX_TASK_ID} characters of A-Z a-z 0-9 _ - . :)", clip(task_id)),
        ))
    }
}

/// The run of a task id, or -32602 when there is none.
pub(crate) async fn get_run(
    store: &dyn JournalStore,
    task_id: &str,
) -> Result<RunRecord, ErrorData> {
    let run = run_id(task_id)?;
    store.get_run(&run).await.map_err(|e| match e {
        eve_core::StoreError::NotFound { .. } => invalid(
            "not_found",
            format!(
                "unknown task {:?}: no run has this id in this server's store",
                clip(task_id)
            ),
        ),
        e => from_store(e),
    })
}

fn rfc3339(t: Timestamp) -> String {
    chrono::DateTime::from_timestamp_millis(t.millis())
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// A payload as text for a person: a JSON string as itself, anything else as JSON.
pub(crate) fn render(p: &Payload) -> String {
    match p.to_value::<Value>() {
        Ok(Value::String(s)) => s,
        _ => p.get().to_owned(),
    }
}

/// The base task fields of a run (status filled in by [`DetailedTask::new`]).
pub(crate) fn base_task(run: &RunRecord, poll: Duration) -> Task {
    Task::new(
        run.run_id.as_str(),
        Default::default(),
        rfc3339(run.created_at),
        rfc3339(run.updated_at),
    )
    .with_poll_interval_ms(u64::try_from(poll.as_millis()).unwrap_or(u64::MAX))
}

/// A run's output as a tool result: `structuredContent` = the output, plus its text rendering
/// (rmcp drops a non-object `structuredContent` for clients before protocol 2026-07-28).
pub(crate) fn completed(output: &Payload) -> CallToolResult {
    let value: Value = output.to_value().unwrap_or(Value::Null);
    let mut result = CallToolResult::success(vec![ContentBlock::text(render(output))]);
    result.structured_content = Some(value);
    result
}

/// The receipt a blocking call of a background tool answers at once: `structuredContent`
/// `{"status": "working", "taskId"}` (the HTTP API's receipt), and a text saying how the
/// outcome arrives.
pub(crate) fn receipt(run: &RunRecord) -> CallToolResult {
    let value = json!({ "status": "working", "taskId": run.run_id.as_str() });
    let mut result = CallToolResult::success(vec![ContentBlock::text(format!(
        "started background task {}: it runs on its own; its messages and outcome arrive as notifications/message, and tasks/get or GET /v1/sessions/{}/tasks show it",
        run.run_id, run.session_id
    ))]);
    result.structured_content = Some(value);
    result
}

/// A denied call as a tool result: `isError: true`, the reason as text, and `_meta`
/// [`META_DENIED`](crate::META_DENIED) `{"reason"}` so a host tells a denial from a failure.
pub(crate) fn denied(reason: &str) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(format!(
        "the call was denied: {reason}"
    ))]);
    let mut meta = JsonObject::new();
    meta.insert(crate::META_DENIED.into(), json!({ "reason": reason }));
    result.meta = Some(rmcp::model::MetaObject(meta));
    result
}

/// A failed run as a JSON-RPC error object: -32603 with the run's error, its bracketed eve code
/// (`[EVE-…]`) in `data.code` when it has one.
pub(crate) fn failure(error: &str) -> JsonObject {
    let code = error
        .strip_prefix('[')
        .and_then(|rest| rest.split_once(']'))
        .map(|(code, _)| code.to_owned())
        .unwrap_or_else(|| "run_failed".to_owned());
    object(json!({ "code": -32603, "message": error, "data": { "code": code } }))
}

fn object(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        _ => JsonObject::new(),
    }
}

/// The run's task state (`sampling_max_tokens`: the `maxTokens` of a subagent call's sampling
/// request).
pub(crate) fn detailed(
    run: &RunRecord,
    view: &RunView,
    poll: Duration,
    sampling_max_tokens: u32,
) -> DetailedTask {
    let mut task = base_task(run, poll);
    let payload = match (&view.end, run.status) {
        (Some(End::Completed(output)), _) => TaskPayload::Completed {
            result: object(serde_json::to_value(completed(output)).unwrap_or_default()),
        },
        (Some(End::Failed(error)), _) => TaskPayload::Failed {
            error: failure(error),
        },
        (Some(End::Cancelled), _) | (None, RunStatus::Cancelled) => TaskPayload::Cancelled,
        (Some(End::Denied(reason)), _) => TaskPayload::Completed {
            result: object(serde_json::to_value(denied(reason)).unwrap_or_default()),
        },
        _ if !view.pending.is_empty() && !run.cancel_requested => TaskPayload::InputRequired {
            input_requests: input_requests(&run.run_id, &view.pending, sampling_max_tokens),
        },
        _ => TaskPayload::Working,
    };
    let message = if let Some(reason) = &view.blocked {
        Some(format!(
            "blocked until an operator resumes or fails it: {reason}"
        ))
    } else if run.cancel_requested && view.end.is_none() {
        Some("cancelling: cleanup steps run in the tool's grace period".to_owned())
    } else {
        view.progress.as_ref().map(render)
    };
    if let Some(m) = message {
        task = task.with_status_message(m);
    }
    DetailedTask::new(task, payload)
}

/// The elicitation form of one request: a confirmation or select is an enum of the option ids
/// titled with their labels (`option`); free text a string (`text`), required when there are no
/// options.
pub(crate) fn form(request: &InputRequest) -> Value {
    let mut properties = serde_json::Map::new();
    let mut required = Vec::new();
    if !request.options.is_empty() {
        let one_of: Vec<Value> = request
            .options
            .iter()
            .map(|o| json!({ "const": o.id, "title": o.label }))
            .collect();
        properties.insert(
            FIELD_OPTION.into(),
            json!({ "type": "string", "title": "Choice", "oneOf": one_of }),
        );
        if !request.allow_freeform {
            required.push(FIELD_OPTION);
        }
    }
    if request.approval.is_some() {
        // A denial may say why; the text beside `deny` is the call's `denied` reason.
        properties.insert(
            FIELD_TEXT.into(),
            json!({ "type": "string", "title": "Reason (sent with a denial)" }),
        );
    } else if request.allow_freeform || request.options.is_empty() {
        properties.insert(
            FIELD_TEXT.into(),
            json!({ "type": "string", "title": "Answer" }),
        );
        if request.options.is_empty() {
            required.push(FIELD_TEXT);
        }
    }
    // An approval request shows the model's input: the body has not run, so that is all a
    // person can judge.
    let message = match &request.approval {
        Some(gate) => format!("{}\n\n{} input: {}", request.prompt, gate.tool, gate.input),
        None => request.prompt.clone(),
    };
    json!({
        "mode": "form",
        "message": message,
        "requestedSchema": { "type": "object", "properties": properties, "required": required },
    })
}

/// `inputRequests` of run `run` keyed by request id: an ask as `elicitation/create`, a
/// subagent call as `sampling/createMessage` (see [`crate::sampling`]).
pub(crate) fn input_requests(
    run: &RunId,
    pending: &[(RequestId, InputRequest)],
    sampling_max_tokens: u32,
) -> InputRequests {
    pending
        .iter()
        .filter_map(|(id, request)| {
            let wire = match &request.agent {
                Some(call) => json!({
                    "method": "sampling/createMessage",
                    "params": crate::sampling::params(run, id, call, sampling_max_tokens),
                }),
                None => json!({ "method": "elicitation/create", "params": form(request) }),
            };
            match serde_json::from_value(wire) {
                Ok(r) => Some((id.as_str().to_owned(), r)),
                Err(e) => {
                    tracing::error!(request = %id, error = %e, "an input request does not fit an MCP input request");
                    None
                }
            }
        })
        .collect()
}

/// The answers `responses` (elicitation results, and sampling results for subagent calls, keyed
/// by request id) write to a run whose journal `view` shows, every one checked before any is
/// written: a key that is not one of the run's requests, a malformed result, an option not
/// offered, an output that does not satisfy the call's output schema, an answer to a request
/// answered otherwise or withdrawn, each rejects the whole update. The same answer again (a
/// retry) writes nothing. A declined or cancelled form answers the request's deny/cancel option
/// ([`response`]); one that offers neither rejects the update (`still_pending`): nothing is
/// recorded, and `tasks/update` never acknowledges what it did not do.
///
/// # Errors
/// -32602 for the first bad entry, with the HTTP API's code.
pub(crate) fn plan(
    view: &RunView,
    run: &RunId,
    responses: &rmcp::model::InputResponses,
) -> Result<Vec<(RequestId, InputResponse)>, ErrorData> {
    let mut answers = Vec::new();
    for (key, result) in responses {
        let id = RequestId::new(key.as_str());
        let Some((_, request)) = view.asked.iter().find(|(r, _)| r == &id) else {
            return Err(invalid(
                "not_found",
                format!(
                    "{:?} is not an input request of task {run}; answer the keys of the task's inputRequests",
                    clip(key)
                ),
            ));
        };
        let response = match &request.agent {
            // A subagent call: the result is a sampling result.
            Some(call) => InputResponse {
                agent: Some(crate::sampling::reply(call, result)?),
                ..InputResponse::default()
            },
            None => match self::response(request, result)? {
                Some(response) => response,
                None => return Err(still_pending(run, &id, request)),
            },
        };
        if let Some(previous) = view.answered.get(&id) {
            if previous.same_answer(&response) {
                continue;
            }
            return Err(from_store(eve_core::StoreError::AlreadyAnswered {
                request: id,
            }));
        }
        if view.withdrawn.contains(&id) {
            return Err(from_store(eve_core::StoreError::Withdrawn { request: id }));
        }
        request.accepts(&response).map_err(|reason| {
            from_store(eve_core::StoreError::InvalidAnswer {
                request: id.clone(),
                reason,
            })
        })?;
        answers.push((id, response));
    }
    Ok(answers)
}

/// An elicitation result (`{"action": "accept", "content": {...}}`) as an answer to `request`.
/// `decline` and `cancel` answer what the person chose: an approval's [`DENY`] (the call
/// settles `denied`), otherwise the request's `deny` option for a decline and its `cancel`
/// option for a cancel, each falling back to the other. `None`: the request offers neither, so
/// nothing can be answered for the person and the request stays pending.
pub(crate) fn response(
    request: &InputRequest,
    result: &Value,
) -> Result<Option<InputResponse>, ErrorData> {
    let action = result.get("action").and_then(Value::as_str).unwrap_or("");
    match action {
        "accept" => {
            let content = result.get("content").cloned().unwrap_or(Value::Null);
            let field = |name: &str| match content.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(invalid(
                    "invalid_answer",
                    format!("the form field {name:?} must be a string, got {other}"),
                )),
            };
            let option_id = field(FIELD_OPTION)?;
            let text = field(FIELD_TEXT)?;
            if option_id.is_none() && text.is_none() {
                return Err(invalid(
                    "invalid_answer",
                    format!("an accepted answer needs content.{FIELD_OPTION} (an option id) or content.{FIELD_TEXT}"),
                ));
            }
            Ok(Some(InputResponse {
                option_id,
                text,
                answered_by: None,
                agent: None,
            }))
        }
        "decline" | "cancel" => {
            let offers = |id: &str| request.options.iter().any(|o| o.id == id);
            let order: [&str; 2] = if action == "decline" {
                [DENY, "cancel"]
            } else {
                ["cancel", DENY]
            };
            let chosen = if request.approval.is_some() {
                Some(DENY)
            } else {
                order.into_iter().find(|id| offers(id))
            };
            Ok(chosen.map(|id| {
                let mut answer = InputResponse::option(id);
                if request.approval.is_some() {
                    // The call's `denied` reason says who denied it and how.
                    answer.text = Some(format!("the person chose {action} in the agent host"));
                }
                answer
            }))
        }
        other => Err(invalid(
            "invalid_answer",
            format!("an input response is an elicitation result with action \"accept\", \"decline\" or \"cancel\", got {other:?}"),
        )),
    }
}

/// The -32602 `still_pending` error of a decline or cancel that `request` cannot take: it
/// offers no deny or cancel option, so nothing was recorded and it waits for an answer.
pub(crate) fn still_pending(run: &RunId, id: &RequestId, request: &InputRequest) -> ErrorData {
    let options: Vec<&str> = request.options.iter().map(|o| o.id.as_str()).collect();
    invalid(
        "still_pending",
        format!(
            "request {id} of task {run} offers no deny or cancel option (its options: {options:?}), so a decline or cancel records nothing: the request stays pending and the task keeps waiting. Answer it with action \"accept\", or on the page or with `eve answer {id} <option>`; to stop the task, tasks/cancel it"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use eve_core::InputOption;

    #[test]
    fn free_text_is_a_required_string_and_select_with_freeform_adds_an_optional_one() {
        let text = form(&InputRequest::text("Why?"));
        assert_eq!(
            text["requestedSchema"],
            json!({
                "type": "object",
                "properties": { "text": { "type": "string", "title": "Answer" } },
                "required": ["text"],
            })
        );
        let select = form(
            &InputRequest::select(
                "Which?",
                vec![InputOption::new("a", "A"), InputOption::new("b", "B")],
            )
            .freeform(),
        );
        let schema = &select["requestedSchema"];
        assert_eq!(
            schema["properties"]["option"]["oneOf"],
            json!([{ "const": "a", "title": "A" }, { "const": "b", "title": "B" }])
        );
        assert_eq!(schema["properties"]["text"]["type"], "string");
        assert_eq!(schema["required"], json!([]));
        // Every form parses as rmcp's elicitation request.
        let requests = input_requests(
            &RunId::new("run_1"),
            &[
                (RequestId::new("r1"), InputRequest::text("Why?")),
                (RequestId::new("r2"), InputRequest::confirmation("Go?")),
            ],
            100,
        );
        assert_eq!(requests.len(), 2);
    }

    #[test]
    fn elicitation_results_become_answers() {
        let confirm = InputRequest::confirmation("Go?");
        let accept = json!({ "action": "accept", "content": { "option": "approve" } });
        assert_eq!(
            response(&confirm, &accept).unwrap(),
            Some(InputResponse::option("approve"))
        );
        let text = json!({ "action": "accept", "content": { "text": "because" } });
        let free = InputRequest::text("Why?");
        assert_eq!(
            response(&free, &text).unwrap().unwrap().text.as_deref(),
            Some("because")
        );
        let decline = json!({ "action": "decline" });
        let cancel = json!({ "action": "cancel" });
        // A confirmation offers cancel: both actions choose it.
        for action in [&decline, &cancel] {
            assert_eq!(
                response(&confirm, action).unwrap(),
                Some(InputResponse::option("cancel"))
            );
        }
        // An approval is always denied, with a reason saying how.
        let gate = InputRequest::approval("deploy", json!({ "service": "api" }));
        for action in [&decline, &cancel] {
            let answer = response(&gate, action).unwrap().unwrap();
            assert_eq!(answer.option_id.as_deref(), Some(DENY));
            assert!(answer.text.unwrap().contains("agent host"));
        }
        // A select offering both: decline denies, cancel cancels.
        let both = InputRequest::select(
            "Refund?",
            vec![
                InputOption::new("approve", "Approve"),
                InputOption::new("deny", "Deny"),
                InputOption::new("cancel", "Cancel"),
            ],
        );
        assert_eq!(
            response(&both, &decline).unwrap(),
            Some(InputResponse::option("deny"))
        );
        assert_eq!(
            response(&both, &cancel).unwrap(),
            Some(InputResponse::option("cancel"))
        );
        // Neither offered: nothing is answered.
        assert_eq!(response(&free, &decline).unwrap(), None);
        for bad in [
            json!({ "action": "accept", "content": {} }),
            json!({ "action": "accept", "content": { "option": 3 } }),
            json!({ "action": "shrug" }),
        ] {
            assert_eq!(
                response(&confirm, &bad).unwrap_err().code,
                rmcp::model::ErrorCode::INVALID_PARAMS,
                "{bad}"
            );
        }
    }

    #[test]
    fn a_decline_nothing_can_take_rejects_the_update() {
        let run = RunId::new("run_1");
        let id = RequestId::new("run_1:1");
        let mut view = RunView::default();
        view.apply([(
            1,
            Event::InputRequested {
                request_id: id.clone(),
                request: InputRequest::text("Why?"),
                cmd: 1,
            },
        )]);
        let responses: rmcp::model::InputResponses =
            [(id.as_str().to_owned(), json!({ "action": "decline" }))]
                .into_iter()
                .collect();
        let e = plan(&view, &run, &responses).unwrap_err();
        assert_eq!(e.data.unwrap()["code"], "still_pending");
        assert!(e.message.contains("stays pending"), "{}", e.message);
    }

    #[test]
    fn task_ids_are_checked_before_the_store() {
        assert!(run_id("run_0123abcd").is_ok());
        for bad in ["", "a b", "../x", &"x".repeat(MAX_TASK_ID + 1)] {
            assert!(run_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_failed_run_carries_its_eve_code() {
        let e = failure("[EVE-ND-001] the body changed");
        assert_eq!(e["code"], -32603);
        assert_eq!(e["data"]["code"], "EVE-ND-001");
        assert_eq!(failure("boom")["data"]["code"], "run_failed");
    }
}
