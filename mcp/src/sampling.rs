//! `ctx.agent` over MCP: a pending subagent call ([`InputRequest::agent`]) as a
//! `sampling/createMessage` request, and a sampling result (`CreateMessageResult`) as the
//! call's [`AgentReply`].
//!
//! The request a standard client can serve as it is: one user message (the call's message; a
//! JSON message as its JSON text), a system prompt naming the subagent and, when the call has
//! an output schema, asking for a JSON value that satisfies it, and `maxTokens`
//! ([`McpConfig::sampling_max_tokens`](crate::McpConfig::sampling_max_tokens)). What eve knows
//! about the call rides in `_meta` under `eve/` keys ([`META_RUN`], [`META_REQUEST`],
//! [`META_AGENT_KEY`], [`META_TARGET`], [`META_MESSAGE`], [`META_AGENT_ID`],
//! [`META_OUTPUT_SCHEMA`]), for a host that runs its own subagent instead of sampling a model.
//!
//! The result's text content (its text blocks joined) is the child's output: parsed as JSON
//! when the call has an output schema (a surrounding Markdown code fence is removed first),
//! the text itself otherwise. `_meta["eve/agentError"]` (a string) reports that the child
//! failed instead.

use crate::error::invalid;
use eve_core::{AgentReply, AgentRequest, RequestId, RunId};
use serde_json::{json, Value};

/// `_meta` of a sampling request: the run (the task id) whose subagent call it is.
pub const META_RUN: &str = "eve/runId";
/// `_meta` of a sampling request: the input request id (the key of `inputRequests`, the id
/// `POST /v1/agents/{id}/result` answers).
pub const META_REQUEST: &str = "eve/requestId";
/// `_meta` of a sampling request: the agent call's key, unique within its run.
pub const META_AGENT_KEY: &str = "eve/agentKey";
/// `_meta` of a sampling request: the model-visible subagent name (`target`).
pub const META_TARGET: &str = "eve/target";
/// `_meta` of a sampling request: the call's message as the workflow gave it (any JSON).
pub const META_MESSAGE: &str = "eve/message";
/// `_meta` of a sampling request: the child to continue, when the call continues one.
pub const META_AGENT_ID: &str = "eve/agentId";
/// `_meta` of a sampling request: the JSON schema the output must satisfy, when there is one.
pub const META_OUTPUT_SCHEMA: &str = "eve/outputSchema";
/// `_meta` of a sampling result: the child failed, and this string says why (recorded as the
/// call's error instead of an output).
pub const META_AGENT_ERROR: &str = "eve/agentError";

/// The params of the `sampling/createMessage` request that serves `call`, request `id` of run
/// `run`.
pub(crate) fn params(run: &RunId, id: &RequestId, call: &AgentRequest, max_tokens: u32) -> Value {
    let text = match &call.message {
        Value::String(s) => s.clone(),
        other => serde_json::to_string_pretty(other).unwrap_or_default(),
    };
    let mut system = format!(
        "You are the subagent {:?} of a workflow run; answer the user's message.",
        call.target
    );
    if let Some(agent) = &call.agent_id {
        system.push_str(&format!(
            " You continue the conversation of agent {agent:?}."
        ));
    }
    if let Some(schema) = &call.output_schema {
        system.push_str(&format!(
            " Reply with nothing but one JSON value (no prose, no code fence) that satisfies this JSON schema:\n{}",
            serde_json::to_string(schema).unwrap_or_default()
        ));
    }
    let mut meta = serde_json::Map::new();
    meta.insert(META_RUN.into(), json!(run.as_str()));
    meta.insert(META_REQUEST.into(), json!(id.as_str()));
    meta.insert(META_AGENT_KEY.into(), json!(call.key));
    meta.insert(META_TARGET.into(), json!(call.target));
    meta.insert(META_MESSAGE.into(), call.message.clone());
    if let Some(agent) = &call.agent_id {
        meta.insert(META_AGENT_ID.into(), json!(agent));
    }
    if let Some(schema) = &call.output_schema {
        meta.insert(META_OUTPUT_SCHEMA.into(), schema.clone());
    }
    json!({
        "_meta": meta,
        "messages": [{ "role": "user", "content": { "type": "text", "text": text } }],
        "systemPrompt": system,
        "maxTokens": max_tokens,
    })
}

/// A sampling result (`CreateMessageResult` as JSON) as the reply to `call`: the error of
/// `_meta["eve/agentError"]`, else the text content, parsed as JSON when the call has an
/// output schema. The schema itself is checked later, by `InputRequest::accepts`.
///
/// # Errors
/// -32602 `invalid_answer` naming what is wrong: not a sampling result, a role that is not
/// `assistant`, no text content, text that is not JSON where an output schema asks for JSON.
pub(crate) fn reply(call: &AgentRequest, result: &Value) -> Result<AgentReply, rmcp::ErrorData> {
    let bad = |why: String| {
        invalid(
            "invalid_answer",
            format!(
                "the sampling result for agent call {:?} ({}): {why}",
                crate::wire::clip(&call.key),
                crate::wire::clip(&call.target)
            ),
        )
    };
    let Value::Object(result) = result else {
        return Err(bad(
            "a sampling result is a CreateMessageResult object ({role, content, model})".into(),
        ));
    };
    if let Some(error) = result.get("_meta").and_then(|m| m.get(META_AGENT_ERROR)) {
        return match error {
            Value::String(e) => Ok(AgentReply::Error(e.clone())),
            other => Err(bad(format!(
                "_meta[{META_AGENT_ERROR:?}] must be a string saying why the child failed, got {}",
                crate::wire::clip(&other.to_string())
            ))),
        };
    }
    match result.get("role") {
        None | Some(Value::Null) => {}
        Some(Value::String(r)) if r == "assistant" => {}
        Some(other) => {
            return Err(bad(format!(
                "role must be \"assistant\", got {}",
                crate::wire::clip(&other.to_string())
            )))
        }
    }
    let blocks: Vec<&Value> = match result.get("content") {
        Some(Value::Array(blocks)) => blocks.iter().collect(),
        Some(block @ Value::Object(_)) => vec![block],
        _ => {
            return Err(bad(
                "content is missing; reply with a text content block holding the output".into(),
            ))
        }
    };
    let texts: Vec<&str> = blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect();
    if texts.is_empty() {
        return Err(bad(
            "the content has no text block; the output is read from text content".into(),
        ));
    }
    let text = texts.concat();
    if call.output_schema.is_none() {
        return Ok(AgentReply::Output(Value::String(text)));
    }
    serde_json::from_str(unfence(&text)).map(AgentReply::Output).map_err(|e| {
        bad(format!(
            "the call has an outputSchema, so its text must be one JSON value, but it is not JSON ({e}): {}",
            crate::wire::clip(&text)
        ))
    })
}

/// `text` without a surrounding Markdown code fence (```` ```json … ``` ````), trimmed.
fn unfence(text: &str) -> &str {
    let t = text.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return t;
    };
    let Some(body) = rest.strip_suffix("```") else {
        return t;
    };
    // The info string (`json`) runs to the first newline.
    body.split_once('\n').map_or(body, |(_, b)| b).trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(schema: Option<Value>) -> AgentRequest {
        AgentRequest {
            key: "review".into(),
            target: "security-reviewer".into(),
            message: json!({ "diff": "+x" }),
            agent_id: Some("agent_7".into()),
            output_schema: schema,
        }
    }

    #[test]
    fn the_request_carries_the_call_in_meta_and_a_prompt_a_model_can_serve() {
        let schema = json!({ "type": "object", "required": ["ok"] });
        let p = params(
            &RunId::new("run_1"),
            &RequestId::new("run_1:3"),
            &call(Some(schema.clone())),
            512,
        );
        assert_eq!(p["_meta"][META_RUN], "run_1");
        assert_eq!(p["_meta"][META_REQUEST], "run_1:3");
        assert_eq!(p["_meta"][META_AGENT_KEY], "review");
        assert_eq!(p["_meta"][META_TARGET], "security-reviewer");
        assert_eq!(p["_meta"][META_AGENT_ID], "agent_7");
        assert_eq!(p["_meta"][META_OUTPUT_SCHEMA], schema);
        assert_eq!(p["_meta"][META_MESSAGE], json!({ "diff": "+x" }));
        assert_eq!(p["maxTokens"], 512);
        assert_eq!(p["messages"][0]["role"], "user");
        assert!(p["messages"][0]["content"]["text"]
            .as_str()
            .unwrap()
            .contains("\"diff\""));
        let system = p["systemPrompt"].as_str().unwrap();
        assert!(system.contains("security-reviewer") && system.contains("\"required\""));
        // It parses as rmcp's request.
        #[allow(deprecated)]
        let parsed: rmcp::model::CreateMessageRequestParams = serde_json::from_value(p).unwrap();
        #[allow(deprecated)]
        parsed.validate().unwrap();
    }

    #[test]
    fn results_become_replies() {
        let text = |t: &str| json!({ "role": "assistant", "model": "m", "content": { "type": "text", "text": t } });
        let typed = call(Some(json!({ "type": "object" })));
        assert_eq!(
            reply(&typed, &text("{\"ok\": true}")).unwrap(),
            AgentReply::Output(json!({ "ok": true }))
        );
        assert_eq!(
            reply(&typed, &text("```json\n{\"ok\": 1}\n```")).unwrap(),
            AgentReply::Output(json!({ "ok": 1 }))
        );
        assert_eq!(
            reply(&call(None), &text("looks fine")).unwrap(),
            AgentReply::Output(json!("looks fine"))
        );
        let blocks = json!({ "role": "assistant", "model": "m", "content": [
            { "type": "text", "text": "{\"a\":" }, { "type": "text", "text": "2}" }
        ] });
        assert_eq!(
            reply(&typed, &blocks).unwrap(),
            AgentReply::Output(json!({ "a": 2 }))
        );
        let failed = json!({ "role": "assistant", "model": "m", "content": { "type": "text", "text": "" }, "_meta": { META_AGENT_ERROR: "rate limited" } });
        assert_eq!(
            reply(&typed, &failed).unwrap(),
            AgentReply::Error("rate limited".into())
        );
        for bad in [
            json!("text"),
            text("not json"),
            json!({ "role": "user", "content": { "type": "text", "text": "{}" } }),
            json!({ "role": "assistant", "content": { "type": "image", "data": "", "mimeType": "image/png" } }),
            json!({ "role": "assistant" }),
            json!({ "content": { "type": "text", "text": "{}" }, "_meta": { META_AGENT_ERROR: 5 } }),
        ] {
            let e = reply(&typed, &bad).unwrap_err();
            assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS, "{bad}");
            assert!(e.message.contains("\"review\""), "{}", e.message);
        }
    }
}
