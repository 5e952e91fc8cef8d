//! Errors: this crate's own, and the store's and engine's as JSON-RPC errors.

use eve_core::engine::EngineError;
use eve_core::StoreError;
use rmcp::ErrorData;
use serde_json::json;

/// What serving MCP can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpServeError {
    /// The client did not complete the MCP handshake (bad first message, closed early).
    #[error("MCP handshake failed: {0}; check that the client speaks MCP on this transport")]
    Handshake(String),
    /// The transport broke while serving.
    #[error("MCP transport failed: {0}")]
    Transport(String),
    /// `serve_stdio` could not give the protocol its own descriptor for stdout and point fd 1
    /// at stderr.
    #[error("cannot take over stdout for MCP (dup of fd 1, dup2 of fd 2 onto it): {0}")]
    Stdout(#[source] std::io::Error),
}

/// -32602 with the HTTP API's error code in `data.code`.
pub(crate) fn invalid(code: &'static str, message: impl Into<String>) -> ErrorData {
    ErrorData::invalid_params(message.into(), Some(json!({ "code": code })))
}

/// A store error as a JSON-RPC error: what the caller got wrong is -32602 (with the HTTP API's
/// code), a transient fault or a backend failure -32603.
pub(crate) fn from_store(e: StoreError) -> ErrorData {
    let message = e.to_string();
    let code = match &e {
        StoreError::NotFound { .. } => "not_found",
        StoreError::AlreadyAnswered { .. } => "already_answered",
        StoreError::SessionEnded { .. } => "session_ended",
        StoreError::Withdrawn { .. } | StoreError::RunEnded { .. } => "withdrawn",
        StoreError::InvalidAnswer { .. } => "invalid_answer",
        StoreError::InvalidInput(_) | StoreError::IdempotencyMismatch { .. } => "invalid_input",
        StoreError::LimitExceeded { .. } => "too_large",
        StoreError::Unavailable { .. } => {
            return ErrorData::internal_error(message, Some(json!({ "code": "unavailable" })))
        }
        _ => {
            tracing::error!(error = %e, "store error");
            return ErrorData::internal_error(message, Some(json!({ "code": "internal" })));
        }
    };
    invalid(code, message)
}

/// An engine error (starting a call) as a JSON-RPC error.
pub(crate) fn from_engine(e: EngineError) -> ErrorData {
    match e {
        EngineError::Store(s) => from_store(s),
        EngineError::UnknownTool { name } => invalid(
            "not_found",
            format!(
                "unknown tool {:?}; tools/list names the tools this server has",
                crate::wire::clip(&name)
            ),
        ),
        other => invalid("invalid_input", other.to_string()),
    }
}

/// A blocking call whose run waits for a subagent call the client cannot serve: it did not
/// declare the `sampling` capability. -32600 with `data.code` = `missing_capability`,
/// `data.capability` = `sampling`, and the run and request, which stay as they are.
pub(crate) fn missing_sampling(
    run: &eve_core::RunId,
    request: &eve_core::RequestId,
    call: &eve_core::AgentRequest,
) -> ErrorData {
    ErrorData::invalid_request(
        format!(
            "the client did not declare the `sampling` capability, and run {run} waits for the subagent call {:?} (target {:?}, request {request}), which eve sends as sampling/createMessage; declare `sampling` and call again with the same identity, call with the tasks extension and answer it with tasks/update, or answer it over HTTP (POST /v1/agents/{request}/result). The call stays pending; the run goes on waiting",
            crate::wire::clip(&call.key),
            crate::wire::clip(&call.target),
        ),
        Some(json!({
            "code": "missing_capability",
            "capability": "sampling",
            "taskId": run.as_str(),
            "requestId": request.as_str(),
        })),
    )
}
