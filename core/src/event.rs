//! The journal model: one append-only, totally ordered log of [`Event`]s per run.

use crate::ids::{CallId, DeploymentId, RequestId, RunId, SessionId, WorkflowId};
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::fmt;

/// A JSON value kept as the exact bytes it was written with, so it round-trips byte for byte
/// through every store.
///
/// Only JSON that parses as data is a payload: a number out of range (`1e999`) or a string with
/// a lone surrogate escape (`"\ud800"`) is valid raw JSON text but fails every later parse, so
/// [`Payload::from_json`] and decoding refuse it where it comes in.
#[derive(Clone, Serialize)]
#[serde(transparent)]
pub struct Payload(Box<RawValue>);

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        if may_fail_check(raw.get()) {
            check_data(raw.get()).map_err(serde::de::Error::custom)?;
        }
        Ok(Self(raw))
    }
}

/// Whether `json`, text already known to be valid JSON syntax, could fail [`check_data`]; a
/// cheap scan that spares the second parse of nearly every payload read back. Only a `\u`
/// escape can be a lone surrogate, and only a number with an exponent or with 300 or more
/// digits in a row can be out of range (`f64` ends near 1.8e308), so text with no backslash,
/// no exponent and no such run of digits passes: without escapes, every `"` opens or closes a
/// string, and outside strings an `e` after a digit is an exponent (`true` and `false` hold
/// theirs after letters).
fn may_fail_check(json: &str) -> bool {
    let mut in_string = false;
    let mut digits = 0usize;
    for &b in json.as_bytes() {
        match b {
            b'\\' => return true,
            b'"' => in_string = !in_string,
            _ if in_string => {}
            b'0'..=b'9' => {
                digits += 1;
                if digits >= 300 {
                    return true;
                }
            }
            b'e' | b'E' if digits > 0 => return true,
            _ => digits = 0,
        }
    }
    false
}

/// Parses `json` fully, keeping nothing: numbers must be in range and strings' escapes valid.
fn check_data(json: &str) -> Result<(), serde_json::Error> {
    serde_json::from_str::<Checked>(json).map(|_| ())
}

/// A JSON value walked the way a full parse walks it (unlike `IgnoredAny`, which skips numbers
/// and strings without reading them), allocating nothing.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> serde::de::Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

impl Payload {
    /// Serializes `value` as a payload.
    ///
    /// # Errors
    /// When `value` cannot be serialized as JSON (a map with non-string keys, say).
    pub fn from_value<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(Self)
    }

    /// Checks that `json` is one valid JSON value that parses as data and keeps its exact text.
    ///
    /// # Errors
    /// When `json` is not valid JSON, holds a number out of range (`1e999`) or a lone surrogate
    /// escape (`"\ud800"`).
    pub fn from_json(json: impl Into<String>) -> Result<Self, serde_json::Error> {
        let raw = RawValue::from_string(json.into())?;
        check_data(raw.get())?;
        Ok(Self(raw))
    }

    /// The JSON `null`.
    pub fn null() -> Self {
        Self::from_json("null").expect("null is valid JSON")
    }

    /// The exact JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// Size of the JSON text in bytes; this is what the payload limits count.
    pub fn len(&self) -> usize {
        self.0.get().len()
    }

    /// Whether the JSON text is empty (never, for a valid payload).
    pub fn is_empty(&self) -> bool {
        self.0.get().is_empty()
    }

    /// Whether this is the JSON `null`.
    pub fn is_null(&self) -> bool {
        self.0.get().trim() == "null"
    }

    /// Deserializes the payload.
    ///
    /// # Errors
    /// When the JSON does not match `T`.
    pub fn to_value<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }
}

/// Any JSON value: the schema of a payload says nothing of its shape (a tool's input, a step's
/// output, a delivered body: each is the workflow's own).
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for Payload {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::schema::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::SchemaType::AnyValue)
            .description(Some(
                "Any JSON value, kept byte for byte as it was written.",
            ))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for Payload {}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for Payload {}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 200;
        let s = self.get();
        if s.len() <= SHOWN {
            write!(f, "Payload({s})")
        } else {
            let mut end = SHOWN;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            write!(f, "Payload({}… {} bytes)", &s[..end], s.len())
        }
    }
}

impl From<serde_json::Value> for Payload {
    fn from(v: serde_json::Value) -> Self {
        Self::from_value(&v).expect("a serde_json::Value always serializes")
    }
}

/// How a workflow tool's call relates to the parent agent's turn.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Execution {
    /// The call stays pending until the run ends; the run's output settles it.
    #[default]
    Default,
    /// The call returns `{status: "working", taskId}` at once; the run ends with a task
    /// notification.
    Background,
}

/// How a channel renders an input request.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Display {
    /// Buttons, one per option.
    #[default]
    Confirmation,
    /// A choice among the options.
    Select,
    /// Free text.
    Text,
    /// A subagent call for the host to serve ([`InputRequest::agent`]); answered with an
    /// [`AgentReply`], never by a person's button.
    Agent,
    /// A tool's approval policy asks whether the call may run ([`InputRequest::approval`]):
    /// the tool and the model's input, with the options `approve` and `deny`.
    Approval,
}

/// Visual weight of an option.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OptionStyle {
    /// The recommended choice.
    Primary,
    /// A destructive choice.
    Danger,
    /// Neither.
    #[default]
    Default,
}

/// One option offered by an input request.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputOption {
    /// The id an answer names.
    pub id: String,
    /// What the person sees.
    pub label: String,
    /// Longer explanation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Visual weight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub style: Option<OptionStyle>,
}

impl InputOption {
    /// An option with this id and label, default style, no description.
    pub fn new(id: impl Into<String>, label: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            label: label.into(),
            description: None,
            style: None,
        }
    }

    /// With a style (how a channel renders its button).
    pub fn style(mut self, style: OptionStyle) -> Self {
        self.style = Some(style);
        self
    }

    /// With a description.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }
}

/// What `ctx.ask` publishes on the session channel.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(deny_unknown_fields)]
pub struct InputRequest {
    /// The question.
    pub prompt: String,
    /// How to render it.
    #[serde(default)]
    pub display: Display,
    /// The options offered; empty means free text only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<InputOption>,
    /// Whether an answer may carry free text instead of (or beside) an option.
    #[serde(default)]
    pub allow_freeform: bool,
    /// Set when this request is a subagent call (`ctx.agent` served by the host over MCP or
    /// HTTP): what the child is asked; the answer is an [`InputResponse::agent`] reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentRequest>,
    /// Set when this request is a tool's approval gate (see
    /// [`WorkflowTool::approval`](crate::engine::WorkflowTool::approval)): the tool and the
    /// input the model called it with. Answered with the option [`APPROVE`] or [`DENY`]; any
    /// text beside `deny` is the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Box<ApprovalRequest>>,
}

/// The option id that lets a gated call run.
pub const APPROVE: &str = "approve";
/// The option id that denies a gated call: it settles `denied` and its body never runs.
pub const DENY: &str = "deny";

/// What an approval request shows: the tool and the model's input, nothing the body computed
/// (the body has not run).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(deny_unknown_fields)]
pub struct ApprovalRequest {
    /// The model-visible tool name.
    pub tool: String,
    /// The input the model called the tool with.
    pub input: serde_json::Value,
}

/// A subagent call as a request: what `ctx.agent` asked the host for (wire hosts, Wave 3
/// decision "`ctx.agent` through the host").
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(deny_unknown_fields)]
pub struct AgentRequest {
    /// The call's key, unique within the run.
    pub key: String,
    /// The model-visible subagent name.
    pub target: String,
    /// The message the child starts with.
    pub message: serde_json::Value,
    /// The child to continue, when continuing one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// A JSON schema the child's output must satisfy; checked before an answer is recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<serde_json::Value>,
}

/// The host's reply to an [`AgentRequest`]: the child's output or why it failed.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AgentReply {
    /// The child's output (`{"output": …}`).
    Output(serde_json::Value),
    /// Why the child failed (`{"error": "…"}`).
    Error(String),
}

impl InputRequest {
    /// The approval gate of a call of `tool` with `input`: display
    /// [`Display::Approval`], options [`APPROVE`] (primary) and [`DENY`] (danger), a reason
    /// may be given as text beside `deny`.
    pub fn approval(tool: impl Into<String>, input: serde_json::Value) -> Self {
        let tool = tool.into();
        Self {
            prompt: format!("Allow the call of {tool}?"),
            display: Display::Approval,
            options: vec![
                InputOption::new(APPROVE, "Approve").style(OptionStyle::Primary),
                InputOption::new(DENY, "Deny").style(OptionStyle::Danger),
            ],
            allow_freeform: false,
            agent: None,
            approval: Some(Box::new(ApprovalRequest { tool, input })),
        }
    }

    /// A confirmation: buttons `approve` (primary) and `cancel`.
    pub fn confirmation(prompt: impl Into<String>) -> Self {
        Self {
            prompt: prompt.into(),
            display: Display::Confirmation,
            options: vec![
                InputOption::new("approve", "Approve").style(OptionStyle::Primary),
                InputOption::new("cancel", "Cancel"),
            ],
            allow_freeform: false,
            agent: None,
            approval: None,
        }
    }

    /// A choice among `options`.
    pub fn select(prompt: impl Into<String>, options: Vec<InputOption>) -> Self {
        Self {
            prompt: prompt.into(),
            display: Display::Select,
            options,
            allow_freeform: false,
            agent: None,
            approval: None,
        }
    }

    /// A free-text question.
    pub fn text(prompt: impl Into<String>) -> Self {
        Self {
            prompt: prompt.into(),
            display: Display::Text,
            options: Vec::new(),
            allow_freeform: true,
            agent: None,
            approval: None,
        }
    }

    /// Also accepts a free-text answer.
    pub fn freeform(mut self) -> Self {
        self.allow_freeform = true;
        self
    }

    /// Checks that `response` is an answer this request accepts: an offered option id, or free
    /// text where free text is allowed (a request with no options always takes text).
    ///
    /// # Errors
    /// A message that says what was wrong with the response.
    pub fn accepts(&self, response: &InputResponse) -> Result<(), String> {
        match (&self.agent, &response.agent) {
            (Some(call), Some(reply)) => return call.accepts(reply),
            (Some(call), None) => {
                return Err(format!(
                    "request is the subagent call {:?}: answer it with an agent reply (output or error), not an option or text",
                    call.key
                ))
            }
            (None, Some(_)) => {
                return Err("this request is not a subagent call; answer with an optionId or a text".into())
            }
            (None, None) => {}
        }
        match (&response.option_id, &response.text) {
            (None, None) => Err("an answer needs an optionId or a text".into()),
            (Some(id), _) => {
                if self.options.iter().any(|o| &o.id == id) {
                    Ok(())
                } else {
                    let offered: Vec<&str> = self.options.iter().map(|o| o.id.as_str()).collect();
                    Err(format!(
                        "option {id:?} is not offered; offered options are {offered:?}"
                    ))
                }
            }
            (None, Some(_)) => {
                if self.allow_freeform || self.options.is_empty() {
                    Ok(())
                } else {
                    Err("this request does not allow free text; answer with an optionId".into())
                }
            }
        }
    }
}

impl AgentRequest {
    /// Checks that `reply` answers this call: an error, or an output that satisfies
    /// `output_schema` when there is one.
    ///
    /// # Errors
    /// A message naming what in the output does not match the schema.
    pub fn accepts(&self, reply: &AgentReply) -> Result<(), String> {
        let (AgentReply::Output(output), Some(schema)) = (reply, &self.output_schema) else {
            return Ok(());
        };
        let validator = jsonschema::validator_for(schema)
            .map_err(|e| format!("the call's outputSchema is not a valid JSON schema: {e}"))?;
        let errors: Vec<String> = validator
            .iter_errors(output)
            .map(|e| {
                let at = e.instance_path().to_string();
                if at.is_empty() {
                    format!("{e} (at the root)")
                } else {
                    format!("{e} (at {at})")
                }
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the output does not match the call's outputSchema: {}",
                errors.join("; ")
            ))
        }
    }
}

/// What a webhook answers each delivery with, set by `ctx.create_webhook_with` and recorded in
/// its `HookCreated` event so every server process answers the same.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookResponse {
    /// HTTP status (default 200).
    #[serde(default = "WebhookResponse::default_status")]
    pub status: u16,
    /// Response headers.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub headers: std::collections::BTreeMap<String, String>,
    /// The JSON body.
    #[serde(default)]
    pub body: serde_json::Value,
}

impl WebhookResponse {
    fn default_status() -> u16 {
        200
    }

    /// A 200 response with this JSON body.
    pub fn json(body: serde_json::Value) -> Self {
        Self {
            status: 200,
            headers: std::collections::BTreeMap::new(),
            body,
        }
    }
}

/// The HTTP request a webhook delivery carries (the payload of its `HookReceived` event).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookRequest {
    /// The HTTP method.
    pub method: String,
    /// Request headers (lower-case names; repeated headers joined with ", ").
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// The body: its JSON when it parses as JSON, else the text as a JSON string.
    #[serde(default)]
    pub body: serde_json::Value,
}

/// An answer to an [`InputRequest`].
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
#[serde(deny_unknown_fields)]
pub struct InputResponse {
    /// The chosen option.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub option_id: Option<String>,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The name of the credential or person that answered (e.g. the API key's name on the
    /// HTTP surface), recorded by the surface that took the answer and shown to people. The
    /// store does not check it, and it is not part of the answer for idempotency: see
    /// [`InputResponse::same_answer`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<String>,
    /// The host's reply to a subagent call ([`InputRequest::agent`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentReply>,
}

impl InputResponse {
    /// An answer choosing `option_id`.
    pub fn option(option_id: impl Into<String>) -> Self {
        Self {
            option_id: Some(option_id.into()),
            ..Self::default()
        }
    }

    /// A free-text answer.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: Some(text.into()),
            ..Self::default()
        }
    }

    /// The same answer recorded as given by `who`.
    pub fn by(mut self, who: impl Into<String>) -> Self {
        self.answered_by = Some(who.into());
        self
    }

    /// Whether `self` and `other` answer the same: the same option and the same text.
    /// [`answered_by`](Self::answered_by) is ignored, so a retry of an answer by another
    /// credential (or by none) is a duplicate of the first, not a conflicting answer; the
    /// journal keeps the first answer's `answered_by`. Every store's
    /// [`answer`](crate::JournalStore::answer) compares with this.
    pub fn same_answer(&self, other: &InputResponse) -> bool {
        self.option_id == other.option_id && self.text == other.text && self.agent == other.agent
    }
}

/// Where a reset run came from: its `RunStarted` names the old run and the cut (see
/// [`crate::JournalStoreExt::reset`]). The new run's journal holds the old run's events before
/// `seq`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResetFrom {
    /// The old run (its journal is kept as it was).
    pub run: RunId,
    /// The cut: the old run's events with `0 < seq < this` were copied.
    pub seq: u64,
}

/// One journal entry. `cmd` is the body's command counter: the n-th durable operation it issued.
///
/// Every change to the format (a new variant, a new field, even an optional one) needs a new
/// [`crate::codec::FORMAT_VERSION`]: a field this build does not know is refused, never
/// silently dropped (`deny_unknown_fields` here and on every type an event holds), so an older
/// eve never misreads a newer one's events.
///
/// Stored externally tagged (`{"StepCompleted": {..}}`): unlike an internally tagged enum, that
/// lets payloads stay raw JSON bytes when decoding.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Event {
    /// Always seq 0.
    RunStarted {
        /// Module path + function name of the body.
        workflow_id: WorkflowId,
        /// The deployment the run is pinned to.
        deployment_id: DeploymentId,
        /// The model-visible tool name.
        tool: String,
        /// The tool input: a JSON object.
        input: Payload,
        /// The session the call belongs to.
        session_id: SessionId,
        /// The tool call that started the run.
        call_id: CallId,
        /// Default or background.
        execution: Execution,
        /// The caller's W3C `traceparent`, when the call carried one: the run's root span is
        /// its child. Absent from journals written before traces, and when there was none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        traceparent: Option<String>,
        /// Where this run was reset from ([`crate::JournalStoreExt::reset`]): the old run and
        /// the seq its journal was cut at. Absent for every other run, and from journals
        /// written before resets.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reset_from: Option<ResetFrom>,
    },
    /// A step attempt succeeded.
    StepCompleted {
        /// Command counter.
        cmd: u64,
        /// Step name.
        name: String,
        /// 1-based attempt number.
        attempt: u32,
        /// The step's result.
        output: Payload,
    },
    /// A step attempt failed. `retry_at` is set when another attempt will follow.
    StepFailed {
        /// Command counter.
        cmd: u64,
        /// Step name.
        name: String,
        /// 1-based attempt number.
        attempt: u32,
        /// The error message.
        error: String,
        /// A fatal error is never retried.
        fatal: bool,
        /// When the next attempt is due, if any.
        retry_at: Option<Timestamp>,
    },
    /// A durable timer.
    SleepScheduled {
        /// Command counter.
        cmd: u64,
        /// When it fires.
        wake_at: Timestamp,
    },
    /// The timer of `cmd` fired.
    SleepFired {
        /// Command counter.
        cmd: u64,
    },
    /// A hook (caller-chosen token) or webhook (random token) now takes payloads.
    HookCreated {
        /// Command counter.
        cmd: u64,
        /// The token; live tokens are unique across the store.
        token: String,
        /// Whether it is a webhook served over HTTP.
        webhook: bool,
        /// A webhook's custom HTTP response to each delivery (`None`: 202 Accepted).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        respond_with: Option<WebhookResponse>,
    },
    /// A payload delivered to the hook of `cmd`.
    HookReceived {
        /// Command counter of the hook.
        cmd: u64,
        /// The delivered payload.
        payload: Payload,
    },
    /// `ctx.ask` published a request.
    InputRequested {
        /// Command counter.
        cmd: u64,
        /// Store-wide unique request id.
        request_id: RequestId,
        /// What was asked.
        request: InputRequest,
    },
    /// The request was answered (at most once).
    InputAnswered {
        /// The request.
        request_id: RequestId,
        /// The answer.
        response: InputResponse,
    },
    /// The request can no longer be answered (the run ended).
    InputWithdrawn {
        /// The request.
        request_id: RequestId,
    },
    /// `ctx.agent` started or continued a child agent.
    AgentStarted {
        /// Command counter.
        cmd: u64,
        /// Unique within the run.
        key: String,
        /// Model-visible subagent name.
        target: String,
        /// The child, when continuing an existing one.
        agent_id: Option<String>,
    },
    /// The child agent of `key` finished.
    AgentCompleted {
        /// Key of the call.
        key: String,
        /// Its output.
        output: Payload,
    },
    /// The child agent of `key` failed.
    AgentFailed {
        /// Key of the call.
        key: String,
        /// Why.
        error: String,
    },
    /// `ctx.progress(value)`.
    Progress {
        /// Command counter.
        cmd: u64,
        /// The snapshot.
        value: Payload,
    },
    /// `task.post_message(message)` in a background run.
    MessagePosted {
        /// Command counter.
        cmd: u64,
        /// The message.
        message: Payload,
    },
    /// `ctx.set_attributes(patch)`: the run's attributes change (set keys overwrite, `null`
    /// removes). Added after format version 1 without a bump (like `RunTerminated`): older
    /// readers do not know it, journals without it read as before.
    AttributesSet {
        /// Command counter.
        cmd: u64,
        /// The patch: a JSON object of key → string, number, boolean or null
        /// ([`crate::search::parse_patch`]).
        attributes: Payload,
    },
    /// `ctx.patched(id)` returned true at `cmd`: the run took the patched branch, on its first
    /// execution and on every replay.
    Patched {
        /// Command counter.
        cmd: u64,
        /// The patch id.
        id: String,
    },
    /// Cancellation was requested; the body gets its grace period.
    CancelRequested {
        /// Why.
        reason: String,
    },
    /// The run ended with an output.
    RunCompleted {
        /// The output that settles the call.
        output: Payload,
    },
    /// The run ended with an error.
    RunFailed {
        /// The error.
        error: String,
    },
    /// The run ended cancelled.
    RunCancelled,
    /// The run is parked (non-determinism, a panicking body, a poison loop) until an operator
    /// resumes or fails it. Not an end: requests stay pending, hooks stay live.
    RunBlocked {
        /// Why, with the error code.
        reason: String,
    },
    /// An operator resumed a blocked run.
    RunResumed,
    /// The run ended denied by the tool's approval policy or the person who answered its
    /// approval request: the body never ran. The run's status is `failed`; its call settles
    /// `denied`.
    RunDenied {
        /// Why (the policy's reason, or the person's).
        reason: String,
    },
    /// An operator terminated the run: it ended at once, without a grace period or cleanup
    /// steps (unlike a cancel). The run's status is `failed`; its call settles failed with
    /// [`Event::terminated_error`].
    RunTerminated {
        /// Why.
        reason: String,
        /// Who terminated it (an API key's name, `--as`, or `operator`).
        by: String,
    },
}

/// How many leading characters of a webhook token [`Event::mask_webhook_token`] keeps: `wh_` and
/// four hex digits, enough to tell a run's webhooks apart, far too few to deliver to one.
pub const MASKED_TOKEN_CHARS: usize = 7;

impl Event {
    /// Hides a webhook's token (a `HookCreated` with `webhook: true`) but its first
    /// [`MASKED_TOKEN_CHARS`] characters, followed by `…`: the token is a capability, whoever
    /// has it can deliver to the run. Every other event, a plain hook's caller-chosen token
    /// included, is left as it is. A masked journal still replays: the engine reads a
    /// webhook's token back from the journal and never compares it with a fresh one.
    pub fn mask_webhook_token(&mut self) {
        if let Event::HookCreated {
            token,
            webhook: true,
            ..
        } = self
        {
            let shown: String = token.chars().take(MASKED_TOKEN_CHARS).collect();
            *token = format!("{shown}…");
        }
    }

    /// The variant's name, as stored in the tag.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::RunStarted { .. } => "RunStarted",
            Event::StepCompleted { .. } => "StepCompleted",
            Event::StepFailed { .. } => "StepFailed",
            Event::SleepScheduled { .. } => "SleepScheduled",
            Event::SleepFired { .. } => "SleepFired",
            Event::HookCreated { .. } => "HookCreated",
            Event::HookReceived { .. } => "HookReceived",
            Event::InputRequested { .. } => "InputRequested",
            Event::InputAnswered { .. } => "InputAnswered",
            Event::InputWithdrawn { .. } => "InputWithdrawn",
            Event::AgentStarted { .. } => "AgentStarted",
            Event::AgentCompleted { .. } => "AgentCompleted",
            Event::AgentFailed { .. } => "AgentFailed",
            Event::Progress { .. } => "Progress",
            Event::MessagePosted { .. } => "MessagePosted",
            Event::Patched { .. } => "Patched",
            Event::AttributesSet { .. } => "AttributesSet",
            Event::CancelRequested { .. } => "CancelRequested",
            Event::RunCompleted { .. } => "RunCompleted",
            Event::RunFailed { .. } => "RunFailed",
            Event::RunCancelled => "RunCancelled",
            Event::RunBlocked { .. } => "RunBlocked",
            Event::RunResumed => "RunResumed",
            Event::RunDenied { .. } => "RunDenied",
            Event::RunTerminated { .. } => "RunTerminated",
        }
    }

    /// Whether this event ends the run.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Event::RunCompleted { .. }
                | Event::RunFailed { .. }
                | Event::RunCancelled
                | Event::RunDenied { .. }
                | Event::RunTerminated { .. }
        )
    }

    /// The error a terminated run's call settles with: `terminated by {by}: {reason}`.
    pub fn terminated_error(reason: &str, by: &str) -> String {
        format!("terminated by {by}: {reason}")
    }

    /// Total bytes of the JSON payloads the event carries (what the payload limits count).
    pub fn payload_bytes(&self) -> usize {
        match self {
            Event::RunStarted { input: p, .. }
            | Event::StepCompleted { output: p, .. }
            | Event::HookReceived { payload: p, .. }
            | Event::AgentCompleted { output: p, .. }
            | Event::Progress { value: p, .. }
            | Event::MessagePosted { message: p, .. }
            | Event::AttributesSet { attributes: p, .. }
            | Event::RunCompleted { output: p } => p.len(),
            Event::StepFailed { error, .. }
            | Event::AgentFailed { error, .. }
            | Event::RunFailed { error } => error.len(),
            Event::CancelRequested { reason }
            | Event::RunBlocked { reason }
            | Event::RunDenied { reason } => reason.len(),
            Event::RunTerminated { reason, by } => reason.len() + by.len(),
            Event::InputRequested { request, .. } => {
                request.prompt.len()
                    + request
                        .options
                        .iter()
                        .map(|o| {
                            o.id.len()
                                + o.label.len()
                                + o.description.as_ref().map_or(0, String::len)
                        })
                        .sum::<usize>()
                    + request.agent.as_ref().map_or(0, |a| {
                        json_len(&a.message) + a.output_schema.as_ref().map_or(0, json_len)
                    })
            }
            Event::InputAnswered { response, .. } => {
                response.option_id.as_ref().map_or(0, String::len)
                    + response.text.as_ref().map_or(0, String::len)
                    + match &response.agent {
                        Some(AgentReply::Output(v)) => json_len(v),
                        Some(AgentReply::Error(e)) => e.len(),
                        None => 0,
                    }
            }
            _ => 0,
        }
    }
}

/// Bytes of `v` as compact JSON (what an agent call's message or output counts against the
/// payload limits).
fn json_len(v: &serde_json::Value) -> usize {
    serde_json::to_string(v).map_or(0, |s| s.len())
}

/// An event as stored: its seq and the time the writer stamped on it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredEvent {
    /// Position in the run's journal, from 0.
    pub seq: u64,
    /// When it was appended (the writer's `now`).
    pub at: Timestamp,
    /// The event.
    pub event: Event,
}
