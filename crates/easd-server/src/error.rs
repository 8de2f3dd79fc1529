//! The one place where server errors become gRPC statuses.

use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("invalid {field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    #[error("unknown session {0}: resend the full context")]
    SessionNotFound(String),
    #[error(
        "session {session}: prefix claim (length {claimed_len}) does not match the {held_len} tokens held; resend the full context"
    )]
    PrefixMismatch { session: String, claimed_len: usize, held_len: usize },
    #[error("context overflow: {needed} tokens needed, the model's context length is {limit}")]
    ContextOverflow { needed: usize, limit: usize },
    #[error("incompatible models: {0}")]
    Incompatible(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    DeadlineExceeded(String),
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("model error: {0}")]
    Model(#[from] easd_model::Error),
    #[error("worker error: {0}")]
    Worker(Status),
    #[error("internal error: {0}")]
    Internal(String),
}

impl ServerError {
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument { field, reason: reason.into() }
    }

    pub fn code(&self) -> Code {
        match self {
            Self::InvalidArgument { .. } | Self::ContextOverflow { .. } => Code::InvalidArgument,
            Self::SessionNotFound(_) => Code::NotFound,
            Self::PrefixMismatch { .. } | Self::Incompatible(_) => Code::FailedPrecondition,
            Self::Unavailable(_) => Code::Unavailable,
            Self::DeadlineExceeded(_) => Code::DeadlineExceeded,
            Self::ResourceExhausted(_) => Code::ResourceExhausted,
            Self::Worker(status) => status.code(),
            Self::Model(_) | Self::Internal(_) => Code::Internal,
        }
    }
}

impl From<easd_core::ParamError> for ServerError {
    fn from(e: easd_core::ParamError) -> Self {
        Self::InvalidArgument { field: e.field, reason: e.reason }
    }
}

impl From<ServerError> for Status {
    fn from(e: ServerError) -> Self {
        match e {
            // Keep the worker's own message: it already names the field or the session.
            ServerError::Worker(status) => status,
            other => Status::new(other.code(), other.to_string()),
        }
    }
}
