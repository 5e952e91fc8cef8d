//! Subagents: [`AgentCall`] (what `ctx.agent` asks for), the [`AgentHost`] an in-process host
//! implements to start children, [`complete_agent`] to report a child's result, and
//! [`ScriptedAgentHost`], a stand-in for the model in tests and examples.
//!
//! An agent call is a request the host fulfils, journaled once per `(run, key)` before anyone
//! is asked to serve it and resolved by one result. It takes one of two forms, chosen when the
//! call is first recorded and kept on every replay (a journal recorded in one form replays in
//! that form whatever the registry has since):
//!
//! - **Host form** (the registry has an [`AgentHost`]): the intent is a `HookCreated` with the
//!   token `agent:{run}:{key}` ([`agent_token`]); the host is asked at least once per
//!   `(run, key)` until it acknowledges (`AgentStarted`), and the child's result arrives as the
//!   payload of that token, once: a crash between starting the child and recording it never
//!   starts two children as long as the host is idempotent per `(run, key)`, which the trait
//!   requires.
//! - **Wire form** (no [`AgentHost`]: a host on the other side of MCP or HTTP serves it): the
//!   intent is an `InputRequested` whose request carries the call
//!   ([`InputRequest::agent`](crate::InputRequest::agent), request id `{run}:{cmd}`). It is
//!   listed with the pending requests and answered, once, with an
//!   [`InputResponse::agent`](crate::InputResponse::agent) reply; the store checks the output
//!   against the call's `output_schema` before recording it, so a non-matching output is
//!   refused and nothing is recorded. Ending the run withdraws it, like an ask.
//!
//! [`complete_agent`] reports a result in either form.

use super::clock::{Clock, SystemClock};
use super::error::EngineError;
use crate::error::StoreError;
use crate::event::{
    AgentReply, AgentRequest, Display, Event, InputRequest, InputResponse, Payload,
};
use crate::ids::{RequestId, RunId, SessionId};
use crate::store::{Delivered, JournalStore, JournalStoreExt};
use crate::time::Timestamp;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// What `ctx.agent` asks for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentCall {
    /// Required, non-empty, unique within the run: names the child for idempotency.
    pub key: String,
    /// The model-visible subagent name.
    pub target: String,
    /// The message the child starts with.
    pub message: serde_json::Value,
    /// Continue this existing child instead of starting a new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// A JSON schema the child's output must satisfy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<serde_json::Value>,
}

impl AgentCall {
    /// A call of `target` with `message`, named `key`.
    pub fn new(
        key: impl Into<String>,
        target: impl Into<String>,
        message: impl Into<serde_json::Value>,
    ) -> Self {
        Self {
            key: key.into(),
            target: target.into(),
            message: message.into(),
            agent_id: None,
            output_schema: None,
        }
    }

    /// Continues the existing child `agent_id`.
    pub fn continuing(mut self, agent_id: impl Into<String>) -> Self {
        self.agent_id = Some(agent_id.into());
        self
    }

    /// Validates the child's output against this JSON schema.
    pub fn schema(mut self, schema: serde_json::Value) -> Self {
        self.output_schema = Some(schema);
        self
    }

    /// The call as the request a wire host serves (the wire form, see the module docs):
    /// display [`Display::Agent`], no options, the call in [`InputRequest::agent`].
    pub fn to_request(&self) -> InputRequest {
        InputRequest {
            prompt: format!("Subagent {:?} (call {:?})", self.target, self.key),
            display: Display::Agent,
            options: Vec::new(),
            allow_freeform: false,
            approval: None,
            agent: Some(AgentRequest {
                key: self.key.clone(),
                target: self.target.clone(),
                message: self.message.clone(),
                agent_id: self.agent_id.clone(),
                output_schema: self.output_schema.clone(),
            }),
        }
    }
}

/// Why an agent call did not give an output.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The key is empty or was used before in this run (raised at the call).
    #[error("invalid agent key {key:?}: {reason}")]
    InvalidKey {
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// The host could not start the child, or the child failed.
    #[error("agent call {key:?} failed: {message}")]
    Failed {
        /// The call's key.
        key: String,
        /// Why.
        message: String,
    },
    /// The child's output does not satisfy the call's `output_schema`.
    #[error("agent call {key:?} returned an output that does not match its output_schema: {errors}; fix the subagent's instructions or the schema")]
    SchemaMismatch {
        /// The call's key.
        key: String,
        /// The validation errors, joined.
        errors: String,
    },
}

/// What the host is asked to start (see [`AgentHost::start`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentStart {
    /// The run that asks.
    pub run_id: RunId,
    /// Its session.
    pub session_id: SessionId,
    /// The call's key: `(run_id, key)` identifies the child.
    pub key: String,
    /// The subagent name.
    pub target: String,
    /// The first message.
    pub message: serde_json::Value,
    /// The child to continue, if any.
    pub agent_id: Option<String>,
}

/// Starts child agents for `ctx.agent`; implemented by the host (the agent runtime).
#[async_trait]
pub trait AgentHost: fmt::Debug + Send + Sync + 'static {
    /// Starts (or continues, with `agent_id`) the child of `(req.run_id, req.key)` and returns
    /// its agent id. Called at least once per `(run, key)` — again after a crash between the
    /// start and its record — so it must be idempotent per `(run, key)`: a repeated call
    /// returns the same child and starts nothing. The child's result is reported later with
    /// [`complete_agent`].
    ///
    /// # Errors
    /// A message; the agent call then fails with [`AgentError::Failed`].
    async fn start(&self, req: AgentStart) -> Result<String, String>;

    /// Cancels the child of `(run, key)` (the run was cancelled). Best effort; idempotent.
    async fn cancel(&self, run: &RunId, key: &str);
}

/// The hook token an agent call's result is delivered to.
pub fn agent_token(run: &RunId, key: &str) -> String {
    format!("agent:{run}:{key}")
}

/// The recorded result payload: `{"ok": output}` or `{"error": message}`.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum AgentResult {
    Ok(serde_json::Value),
    Error(String),
}

/// The recorded result payload of a wire reply (`None`: an answer without a reply, which the
/// store never accepts for an agent request).
pub(crate) fn reply_payload(reply: Option<&AgentReply>) -> Payload {
    result_payload(match reply {
        Some(AgentReply::Output(v)) => Ok(v.clone()),
        Some(AgentReply::Error(e)) => Err(e.clone()),
        None => Err("the recorded answer carries no agent reply".into()),
    })
}

pub(crate) fn result_payload(result: Result<serde_json::Value, String>) -> Payload {
    let r = match result {
        Ok(v) => AgentResult::Ok(v),
        Err(e) => AgentResult::Error(e),
    };
    Payload::from_value(&r).expect("an agent result serializes")
}

/// Turns a recorded result into the call's outcome, validating `output_schema`.
pub(crate) fn agent_outcome(
    call: &AgentCall,
    payload: &Payload,
) -> Result<serde_json::Value, AgentError> {
    let failed = |message: String| AgentError::Failed {
        key: call.key.clone(),
        message,
    };
    let output = match payload.to_value::<AgentResult>() {
        Ok(AgentResult::Ok(v)) => v,
        Ok(AgentResult::Error(e)) => return Err(failed(e)),
        Err(e) => return Err(failed(format!("the recorded result is malformed: {e}"))),
    };
    if let Some(schema) = &call.output_schema {
        let validator = jsonschema::validator_for(schema)
            .map_err(|e| failed(format!("output_schema is not a valid JSON schema: {e}")))?;
        let errors: Vec<String> = validator
            .iter_errors(&output)
            .map(|e| e.to_string())
            .collect();
        if !errors.is_empty() {
            return Err(AgentError::SchemaMismatch {
                key: call.key.clone(),
                errors: errors.join("; "),
            });
        }
    }
    Ok(output)
}

/// Reports the result of the child of `(run, key)`: its output or why it failed, in either
/// form of the call (see the module docs). Exactly once: a retry of the same report is a
/// duplicate success.
///
/// In the host form the output is recorded as given and checked against `output_schema` when
/// the body takes it (a mismatch is the call's [`AgentError::SchemaMismatch`]); in the wire
/// form the store checks it before recording, and a mismatch is refused with nothing recorded.
///
/// # Errors
/// [`StoreError::NotFound`] when the run has no such agent call (unknown run or key, or a
/// host-form call whose run ended). For a wire-form call, as
/// [`JournalStore::answer`]: `AlreadyAnswered` (another result was recorded), `Withdrawn` (the
/// run ended), `InvalidAnswer` (the output does not match the call's `output_schema`).
pub async fn complete_agent(
    store: &dyn JournalStore,
    run: &RunId,
    key: &str,
    result: Result<serde_json::Value, String>,
    now: Timestamp,
) -> Result<Delivered, EngineError> {
    let payload = result_payload(result.clone());
    let not_found = match store
        .deliver_hook(&agent_token(run, key), payload, Some("agent-result"), now)
        .await
    {
        Err(e @ StoreError::NotFound { .. }) => e,
        other => return Ok(other?),
    };
    // No live hook: the call may be in the wire form, a request in the run's journal.
    let Some(request_id) = agent_request_id(store, run, key).await? else {
        return Err(not_found.into());
    };
    let reply = match result {
        Ok(v) => AgentReply::Output(v),
        Err(e) => AgentReply::Error(e),
    };
    let response = InputResponse {
        agent: Some(reply),
        ..InputResponse::default()
    };
    Ok(store.answer(&request_id, response, now).await?)
}

/// The request id of the wire-form agent call `key` of `run`, read from its journal; `None`
/// when the run has no such request (or does not exist).
///
/// # Errors
/// Store faults other than a missing run.
pub async fn agent_request_id(
    store: &dyn JournalStore,
    run: &RunId,
    key: &str,
) -> Result<Option<RequestId>, StoreError> {
    let events = match store.read_all(run, 0).await {
        Ok(events) => events,
        Err(StoreError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(events.into_iter().find_map(|e| match e.event {
        Event::InputRequested {
            request_id,
            request: InputRequest {
                agent: Some(call), ..
            },
            ..
        } if call.key == key => Some(request_id),
        _ => None,
    }))
}

type Reply = Arc<dyn Fn(&AgentStart) -> Result<serde_json::Value, String> + Send + Sync>;
/// Per `(run, key)`: the child's id and how many times `start` was called.
type Starts = HashMap<(RunId, String), (String, u32)>;

/// A stand-in for the model: replies to each target with a scripted function, at once (through
/// [`complete_agent`] on its store) or only when [`ScriptedAgentHost::finish`] is called. It
/// is idempotent per `(run, key)` and counts starts, so tests can prove a child started once.
#[derive(Clone)]
pub struct ScriptedAgentHost {
    store: Arc<dyn JournalStore>,
    replies: Arc<Mutex<HashMap<String, Reply>>>,
    starts: Arc<Mutex<Starts>>,
    cancelled: Arc<Mutex<Vec<(RunId, String)>>>,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for ScriptedAgentHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedAgentHost").finish_non_exhaustive()
    }
}

impl ScriptedAgentHost {
    /// A host that reports results to `store`; targets without a reply stay running until
    /// [`finish`](Self::finish).
    pub fn new(store: Arc<dyn JournalStore>) -> Self {
        Self {
            store,
            replies: Arc::default(),
            starts: Arc::default(),
            cancelled: Arc::default(),
            clock: Arc::new(SystemClock),
        }
    }

    /// Stamps the results it reports with this clock (a `ManualClock` in tests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Children of `target` complete at once with `reply(start)`.
    pub fn reply(
        self,
        target: impl Into<String>,
        reply: impl Fn(&AgentStart) -> Result<serde_json::Value, String> + Send + Sync + 'static,
    ) -> Self {
        self.replies
            .lock()
            .expect("scripted host lock")
            .insert(target.into(), Arc::new(reply));
        self
    }

    /// Reports the result of the child of `(run, key)` now.
    ///
    /// # Errors
    /// As [`complete_agent`].
    pub async fn finish(
        &self,
        run: &RunId,
        key: &str,
        result: Result<serde_json::Value, String>,
        now: Timestamp,
    ) -> Result<Delivered, EngineError> {
        complete_agent(&*self.store, run, key, result, now).await
    }

    /// How many times `start` was called for `(run, key)`, and the child's id.
    pub fn starts(&self, run: &RunId, key: &str) -> Option<(String, u32)> {
        self.starts
            .lock()
            .expect("scripted host lock")
            .get(&(run.clone(), key.to_owned()))
            .cloned()
    }

    /// The `(run, key)` pairs cancelled so far.
    pub fn cancelled(&self) -> Vec<(RunId, String)> {
        self.cancelled.lock().expect("scripted host lock").clone()
    }
}

#[async_trait]
impl AgentHost for ScriptedAgentHost {
    async fn start(&self, req: AgentStart) -> Result<String, String> {
        let (id, first) = {
            let mut starts = self.starts.lock().expect("scripted host lock");
            let entry = starts
                .entry((req.run_id.clone(), req.key.clone()))
                .or_insert_with(|| {
                    let id = req
                        .agent_id
                        .clone()
                        .unwrap_or_else(|| format!("agent-{}-{}", req.run_id, req.key));
                    (id, 0)
                });
            entry.1 += 1;
            (entry.0.clone(), entry.1 == 1)
        };
        let reply = self
            .replies
            .lock()
            .expect("scripted host lock")
            .get(&req.target)
            .cloned();
        if let (true, Some(reply)) = (first, reply) {
            let result = reply(&req);
            complete_agent(
                &*self.store,
                &req.run_id,
                &req.key,
                result,
                self.clock.now(),
            )
            .await
            .map_err(|e| e.to_string())?;
        }
        Ok(id)
    }

    async fn cancel(&self, run: &RunId, key: &str) {
        self.cancelled
            .lock()
            .expect("scripted host lock")
            .push((run.clone(), key.to_owned()));
    }
}
