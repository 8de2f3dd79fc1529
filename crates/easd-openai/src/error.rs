//! Errors of the HTTP API and the one place where they become HTTP statuses and OpenAI error objects
//! (`{"error": {"message", "type", "param", "code"}}`), which the official clients turn into typed exceptions.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use easd_server::ServerError;
use serde_json::json;
use tonic::Code;

use crate::endpoint::Endpoint;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field is missing, of the wrong type, out of range or not supported; `field` is its OpenAI name.
    #[error("invalid {field}: {reason}")]
    InvalidField { field: String, reason: String },
    #[error("the request body is not valid JSON: {0}")]
    BadJson(String),
    #[error("the model `{requested}` does not exist; this server serves `{served}` (see GET /v1/models)")]
    ModelNotFound { requested: String, served: String },
    #[error("{0}")]
    Unauthorized(&'static str),
    #[error("the request body exceeds the limit of {limit_bytes} bytes")]
    BodyTooLarge { limit_bytes: usize },
    #[error("the request body could not be read: {0}")]
    BodyUnreadable(String),
    #[error("no route for {0}")]
    NoRoute(String),
    #[error("method {0} is not allowed here")]
    MethodNotAllowed(String),
    /// The coordinator refused or failed the request; `endpoint` renames its field names to OpenAI's.
    #[error("{}", server_message(.error, *.endpoint))]
    Server { error: ServerError, endpoint: Endpoint },
}

impl Error {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidField { field: field.into(), reason: reason.into() }
    }

    pub fn server(error: ServerError, endpoint: Endpoint) -> Self {
        Self::Server { error, endpoint }
    }

    /// HTTP status, OpenAI error type, error code and the offending parameter: the one exhaustive mapping.
    pub fn classify(&self) -> (StatusCode, &'static str, Option<&'static str>, Option<String>) {
        const INVALID: &str = "invalid_request_error";
        match self {
            Self::InvalidField { field, .. } => (StatusCode::BAD_REQUEST, INVALID, None, Some(field.clone())),
            Self::BadJson(_) => (StatusCode::BAD_REQUEST, INVALID, None, None),
            Self::ModelNotFound { .. } => {
                (StatusCode::NOT_FOUND, INVALID, Some("model_not_found"), Some("model".into()))
            }
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, INVALID, Some("invalid_api_key"), None),
            Self::BodyTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, INVALID, Some("request_too_large"), None),
            Self::BodyUnreadable(_) => (StatusCode::BAD_REQUEST, INVALID, None, None),
            Self::NoRoute(_) => (StatusCode::NOT_FOUND, INVALID, Some("unknown_url"), None),
            Self::MethodNotAllowed(_) => (StatusCode::METHOD_NOT_ALLOWED, INVALID, None, None),
            Self::Server { error, endpoint } => match error {
                ServerError::InvalidArgument { field, .. } => {
                    (StatusCode::BAD_REQUEST, INVALID, None, Some(openai_field(field, *endpoint).into()))
                }
                ServerError::ContextOverflow { .. }
                | ServerError::ContextLengthExceeded { .. }
                | ServerError::KvBudgetExceeded { .. } => (
                    StatusCode::BAD_REQUEST,
                    INVALID,
                    Some("context_length_exceeded"),
                    Some(openai_field("input", *endpoint).into()),
                ),
                // The coordinator re-feeds lost sessions itself; reaching the client means no replica could serve.
                ServerError::SessionNotFound(_)
                | ServerError::PrefixMismatch { .. }
                | ServerError::Incompatible(_)
                | ServerError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "server_error", None, None),
                // Every replica is at capacity and the admission queue is full: OpenAI clients back off and retry a
                // 429 (with `Retry-After`); 503 stays for "no replica can serve".
                ServerError::ResourceExhausted(_) => (StatusCode::TOO_MANY_REQUESTS, "server_error", None, None),
                ServerError::DeadlineExceeded(_) => (StatusCode::GATEWAY_TIMEOUT, "server_error", None, None),
                ServerError::AlreadyExists(_) => (StatusCode::CONFLICT, INVALID, None, None),
                ServerError::Worker(status) => {
                    let http = http_status_of(status.code());
                    let kind = if http.is_client_error() { INVALID } else { "server_error" };
                    (http, kind, None, None)
                }
                ServerError::Model(_) | ServerError::Internal(_) => {
                    (StatusCode::INTERNAL_SERVER_ERROR, "server_error", None, None)
                }
            },
        }
    }

    /// The OpenAI error object, as sent in a response body or an SSE `data:` line.
    pub fn to_json(&self) -> serde_json::Value {
        let (_, kind, code, param) = self.classify();
        json!({ "error": { "message": self.to_string(), "type": kind, "param": param, "code": code } })
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, ..) = self.classify();
        if status.is_server_error() {
            tracing::warn!(%status, error = %self, "request failed");
        }
        let mut response = crate::response::json_response(status, &self.to_json());
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(axum::http::header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        }
        response
    }
}

/// The coordinator names fields after the gRPC `GenerateRequest`; clients know them by their OpenAI names.
fn openai_field(field: &str, endpoint: Endpoint) -> &str {
    match (field, endpoint) {
        ("input" | "prompt" | "chat.messages", Endpoint::Chat) => "messages",
        ("input" | "prompt", Endpoint::Completions) => "prompt",
        ("chat.messages.role", _) => "messages.role",
        ("mode", _) => "easd.mode",
        ("k", _) => "easd.k",
        (other, _) => other,
    }
}

fn server_message(error: &ServerError, endpoint: Endpoint) -> String {
    match error {
        ServerError::InvalidArgument { field, reason } => {
            format!("invalid {}: {reason}", openai_field(field, endpoint))
        }
        other => other.to_string(),
    }
}

/// HTTP status for a worker's gRPC status that reached the client unchanged.
fn http_status_of(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinator_field_names_become_openai_names_in_message_and_param() {
        let e = Error::server(ServerError::invalid("chat.messages", "must hold at least one message"), Endpoint::Chat);
        assert_eq!(e.to_string(), "invalid messages: must hold at least one message");
        let (status, kind, _, param) = e.classify();
        assert_eq!(
            (status, kind, param.as_deref()),
            (StatusCode::BAD_REQUEST, "invalid_request_error", Some("messages"))
        );
        let e = Error::server(ServerError::invalid("temperature", "must be in [0, 2], got 3"), Endpoint::Completions);
        assert_eq!(e.to_json()["error"]["param"], "temperature");
        assert_eq!(e.to_json()["error"]["message"], "invalid temperature: must be in [0, 2], got 3");
    }

    #[test]
    fn a_prompt_too_long_for_the_context_is_context_length_exceeded_on_its_input_field() {
        let prompt = easd_server::error::PromptLength::Tokens(700);
        let error = || ServerError::ContextLengthExceeded { prompt, max_tokens: Some(24), limit: 512 };
        let e = Error::server(error(), Endpoint::Chat);
        let (status, kind, code, param) = e.classify();
        assert_eq!(
            (status, kind, code, param.as_deref()),
            (StatusCode::BAD_REQUEST, "invalid_request_error", Some("context_length_exceeded"), Some("messages"))
        );
        assert_eq!(Error::server(error(), Endpoint::Completions).to_json()["error"]["param"], "prompt");
    }

    #[test]
    fn an_unavailable_verifier_is_a_503_server_error() {
        let e = Error::server(ServerError::Unavailable("verifier down".into()), Endpoint::Chat);
        let (status, kind, ..) = e.classify();
        assert_eq!((status, kind), (StatusCode::SERVICE_UNAVAILABLE, "server_error"));
    }

    #[test]
    fn a_full_server_is_a_429_with_retry_after() {
        let e = Error::server(ServerError::ResourceExhausted("the admission queue is full".into()), Endpoint::Chat);
        let response = e.into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[axum::http::header::RETRY_AFTER], "1");
    }

    #[test]
    fn worker_statuses_keep_their_meaning_over_http() {
        let e = Error::server(ServerError::Worker(tonic::Status::invalid_argument("bad")), Endpoint::Chat);
        assert_eq!(e.classify().0, StatusCode::BAD_REQUEST);
        let e = Error::server(ServerError::Worker(tonic::Status::internal("boom")), Endpoint::Chat);
        assert_eq!(e.classify().0, StatusCode::INTERNAL_SERVER_ERROR);
    }
}
