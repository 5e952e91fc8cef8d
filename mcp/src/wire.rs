//! The JSON-RPC checks eve makes on every incoming message before rmcp parses it, on stdio and
//! on HTTP alike. rmcp drops invalid JSON and oversized lines silently, answers a request whose
//! params do not fit with -32600 or -32601 (it falls back to a custom request), and on HTTP
//! answers any of these with 415. Here each gets the JSON-RPC error that says what is wrong:
//!
//! | input | reply |
//! | --- | --- |
//! | not JSON | -32700, `"id": null` |
//! | JSON but not a request, notification or response (a batch, no `jsonrpc: "2.0"`, an id that is neither an integer nor a string of at most [`MAX_ID`] characters, a method that is not a string); nested deeper than serde_json's 128 levels; longer than the message limit | -32600, `"id": null` |
//! | a method eve serves with params that do not fit it (`tasks/get {}`, `tools/call` with `arguments` that are not an object) | -32602 naming the field, with the request's id |
//!
//! A notification that does not parse is dropped (a notification gets no reply), and so is a
//! response the client sends to a request of ours that does not parse. Text from the message
//! (method names, serde's excerpts of values) is cut to [`MAX_ECHO`] characters.

use rmcp::model::{
    CallToolRequestParams, CancelTaskParams, ClientJsonRpcMessage, ErrorCode, GetTaskParams,
    InitializeRequestParams, PaginatedRequestParams, UpdateTaskParams,
};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

/// The longest string request id accepted: ids are echoed in replies and logs.
pub(crate) const MAX_ID: usize = 256;
/// The longest text taken from a message into an error message or a log line.
pub(crate) const MAX_ECHO: usize = 200;

/// What to do with one incoming message.
#[derive(Debug)]
pub(crate) enum Checked {
    /// A well-formed message for rmcp.
    Message(Box<ClientJsonRpcMessage>),
    /// Answer with this JSON-RPC error (serialized, one line) and go on.
    Reply(Rejection),
    /// Drop it (a notification or a response that does not parse).
    Ignore,
}

/// A JSON-RPC error reply to a message that did not pass the checks.
#[derive(Debug)]
pub(crate) struct Rejection {
    /// The request's id, or `null` when it could not be read.
    pub(crate) id: Value,
    /// -32700, -32600 or -32602.
    pub(crate) code: ErrorCode,
    pub(crate) message: String,
    pub(crate) data: Option<Value>,
}

impl Rejection {
    fn new(id: Value, code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            id,
            code,
            message: message.into(),
            data: None,
        }
    }

    /// -32700: not JSON.
    pub(crate) fn parse(message: impl Into<String>) -> Self {
        Self::new(Value::Null, ErrorCode::PARSE_ERROR, message)
    }

    /// -32600: JSON, but not a JSON-RPC message eve can read.
    pub(crate) fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(Value::Null, ErrorCode::INVALID_REQUEST, message)
    }

    /// The message too long for the limit: -32600.
    pub(crate) fn too_long(limit: usize) -> Self {
        Self::invalid_request(format!(
            "Invalid Request: the message is longer than {limit} bytes; pass large data by reference"
        ))
    }

    /// The reply as one JSON-RPC error object, `"id"` always present (`null` when unknown).
    pub(crate) fn to_json(&self) -> Value {
        let mut error = json!({ "code": self.code.0, "message": self.message });
        if let Some(data) = &self.data {
            error["data"] = data.clone();
        }
        json!({ "jsonrpc": "2.0", "id": self.id, "error": error })
    }

    /// The reply as a line of bytes (without the newline).
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&self.to_json()).unwrap_or_default()
    }
}

/// `s` cut to at most [`MAX_ECHO`] characters (marked with `…` when cut).
pub(crate) fn clip(s: &str) -> String {
    match s.char_indices().nth(MAX_ECHO) {
        None => s.to_owned(),
        Some((at, _)) => format!("{}…", &s[..at]),
    }
}

/// Checks one message of at most `limit` bytes (a longer one is rejected).
pub(crate) fn check(raw: &[u8], limit: usize) -> Checked {
    match check_inner(raw, limit) {
        Ok(c) => c,
        Err(r) => Checked::Reply(r),
    }
}

fn check_inner(raw: &[u8], limit: usize) -> Result<Checked, Rejection> {
    // RFC 8259 §8.1 lets a parser ignore a leading byte order mark; rmcp does.
    let raw = raw.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(raw);
    if raw.len() > limit {
        return Err(Rejection::too_long(limit));
    }
    // Parsed once: the checks and rmcp's message are both read from this value.
    let value: Value = serde_json::from_slice(raw).map_err(|e| {
        if e.to_string().starts_with("recursion limit exceeded") {
            Rejection::invalid_request(
                "Invalid Request: the message is nested deeper than 128 levels",
            )
        } else {
            Rejection::parse(format!("Parse error: the message is not JSON ({e})"))
        }
    })?;
    let Value::Object(obj) = &value else {
        return Err(Rejection::invalid_request(
            "Invalid Request: a JSON-RPC message is one JSON object (batches are not supported)",
        ));
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(Rejection::invalid_request(
            "Invalid Request: a JSON-RPC message has \"jsonrpc\": \"2.0\"",
        ));
    }
    let id = match obj.get("id") {
        None => None,
        Some(Value::String(s)) if s.chars().count() <= MAX_ID => Some(value["id"].clone()),
        Some(Value::Number(n)) if n.is_i64() => Some(value["id"].clone()),
        Some(Value::Null) if obj.contains_key("error") => None,
        Some(_) => {
            return Err(Rejection::invalid_request(format!(
            "Invalid Request: \"id\" must be an integer or a string of at most {MAX_ID} characters"
        )))
        }
    };
    let method = match obj.get("method") {
        None => None,
        Some(Value::String(m)) => Some(m.as_str()),
        Some(_) => {
            return Err(Rejection::invalid_request(
                "Invalid Request: \"method\" must be a string",
            ))
        }
    };
    match (method, id) {
        // A request: its params must fit the method.
        (Some(method), Some(id)) => {
            let params = obj.get("params");
            if let Some(reason) = params_problem(method, params) {
                let (field, problem) = reason;
                let mut r = Rejection::new(
                    id,
                    ErrorCode::INVALID_PARAMS,
                    clip(&format!("Invalid params of {method}: {problem}")),
                );
                r.data = Some(json!({ "code": "invalid_input", "field": field }));
                return Err(r);
            }
            match ClientJsonRpcMessage::deserialize(&value) {
                Ok(m) => Ok(Checked::Message(Box::new(m))),
                Err(e) => {
                    let mut r = Rejection::new(
                        id,
                        ErrorCode::INVALID_PARAMS,
                        clip(&format!("Invalid params of {}: {e}", clip(method))),
                    );
                    r.data = Some(json!({ "code": "invalid_input" }));
                    Err(r)
                }
            }
        }
        // A notification, or a response to one of our requests: never answered.
        (Some(_), None) | (None, _) => {
            if method.is_none() && !obj.contains_key("result") && !obj.contains_key("error") {
                return Err(Rejection::invalid_request(
                    "Invalid Request: a message needs a \"method\" (a request or notification) or a \"result\" or \"error\" (a response)",
                ));
            }
            match ClientJsonRpcMessage::deserialize(&value) {
                Ok(m) => Ok(Checked::Message(Box::new(m))),
                Err(e) => {
                    tracing::debug!(method = %clip(method.unwrap_or("")), error = %clip(&e.to_string()), "dropping a notification or response that does not parse");
                    Ok(Checked::Ignore)
                }
            }
        }
    }
}

/// For a method eve serves: what is wrong with its params (the field's path and the problem),
/// if anything. Other methods are left to rmcp (which answers -32601 for those eve does not
/// serve).
fn params_problem(method: &str, params: Option<&Value>) -> Option<(String, String)> {
    if let Some(p) = params {
        if !p.is_object() {
            return Some(("params".into(), "params must be an object".into()));
        }
    }
    let empty = Value::Object(Default::default());
    let params = params.unwrap_or(&empty);
    match method {
        "initialize" => fits::<InitializeRequestParams>(params),
        "tools/call" => fits::<CallToolRequestParams>(params),
        "tools/list" => fits::<PaginatedRequestParams>(params),
        "tasks/get" => fits::<GetTaskParams>(params),
        "tasks/update" => fits::<UpdateTaskParams>(params),
        "tasks/cancel" => fits::<CancelTaskParams>(params),
        _ => None,
    }
}

/// The path and message of the first place where `params` does not deserialize as `T`.
fn fits<T: DeserializeOwned>(params: &Value) -> Option<(String, String)> {
    match serde_path_to_error::deserialize::<_, T>(params) {
        Ok(_) => None,
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            // serde names a missing field in its message; a wrong type is named by the path.
            let field = match (path.as_str(), inner.strip_prefix("missing field `")) {
                (".", Some(rest)) => rest.trim_end_matches('`').to_owned(),
                (".", None) => "params".to_owned(),
                (p, _) => p.to_owned(),
            };
            let problem = if path == "." {
                inner
            } else {
                format!("params.{path}: {inner}")
            };
            Some((field, problem))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(raw: &str) -> Value {
        match check(raw.as_bytes(), 1024) {
            Checked::Reply(r) => r.to_json(),
            other => panic!("{raw}: expected a reply, got {other:?}"),
        }
    }

    #[test]
    fn each_bad_message_gets_the_error_that_names_it() {
        let r = reply("{not json");
        assert_eq!(
            (r["error"]["code"].clone(), r["id"].clone()),
            (json!(-32700), Value::Null)
        );
        for invalid in [
            "[]",
            "3",
            r#"{"id":1,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":7}"#,
            r#"{"jsonrpc":"2.0","id":1}"#,
        ] {
            let r = reply(invalid);
            assert_eq!(r["error"]["code"], -32600, "{invalid}");
            assert!(
                r.as_object().unwrap().contains_key("id") && r["id"].is_null(),
                "{invalid}"
            );
        }
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert_eq!(reply(&deep)["error"]["code"], -32600);
        let long = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"{}"}}"#,
            "x".repeat(2000)
        );
        assert_eq!(reply(&long)["error"]["code"], -32600);
        let long_id = format!(
            r#"{{"jsonrpc":"2.0","id":"{}","method":"ping"}}"#,
            "i".repeat(MAX_ID + 1)
        );
        assert_eq!(reply(&long_id)["error"]["code"], -32600);

        let r = reply(r#"{"jsonrpc":"2.0","id":5,"method":"tasks/get","params":{}}"#);
        assert_eq!(
            (r["error"]["code"].clone(), r["id"].clone()),
            (json!(-32602), json!(5))
        );
        assert_eq!(r["error"]["data"]["field"], "taskId");
        assert!(
            r["error"]["message"].as_str().unwrap().contains("taskId"),
            "{r}"
        );
        let r = reply(
            r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"x","arguments":"y"}}"#,
        );
        assert_eq!(r["error"]["data"]["field"], "arguments");
        let r = reply(r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":5}}"#);
        assert_eq!(r["error"]["data"]["field"], "name");
        let r = reply(
            r#"{"jsonrpc":"2.0","id":1,"method":"tasks/update","params":{"taskId":"run_1"}}"#,
        );
        assert_eq!(r["error"]["data"]["field"], "inputResponses");
        let r = reply(r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":[1]}"#);
        assert_eq!(r["error"]["code"], -32602);
    }

    #[test]
    fn good_messages_pass_and_bad_notifications_are_dropped() {
        for good in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"run_1"}}"#,
            r#"{"jsonrpc":"2.0","id":"x","method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}",
        ] {
            assert!(
                matches!(check(good.as_bytes(), 1024), Checked::Message(_)),
                "{good}"
            );
        }
        // An error response of the client that does not parse gets no reply.
        assert!(matches!(
            check(br#"{"jsonrpc":"2.0","id":1,"error":7}"#, 1024),
            Checked::Ignore
        ));
    }

    #[test]
    fn echoed_text_is_clipped() {
        let s = "é".repeat(MAX_ECHO + 10);
        let c = clip(&s);
        assert_eq!(c.chars().count(), MAX_ECHO + 1);
        assert_eq!(clip("short"), "short");
    }
}
