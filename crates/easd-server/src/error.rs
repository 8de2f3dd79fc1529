//! The one place where server errors become gRPC statuses, and where a worker's status is classified: the reasons
//! a caller acts on (session lost, incompatible models) travel as an [`pb::ErrorDetail`] in the status details,
//! never as message text.

use easd_proto::v1 as pb;
use prost::Message;
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
    /// A request's prompt and completion do not fit the context window. `max_tokens` is what the client asked for
    /// (`None`: it set no limit, and the completion needs at least one token).
    #[error("{}", context_length_exceeded(*prompt, *max_tokens, *limit))]
    ContextLengthExceeded { prompt: PromptLength, max_tokens: Option<usize>, limit: usize },
    /// A session would need more KV cache than a worker's whole memory budget: it could only evict every other
    /// session and still not fit. Not worth retrying: the prompt and `max_tokens`, or the budget, must change.
    #[error(
        "a session of {tokens} tokens needs {} of KV cache on this {role} worker, more than its whole budget of {} (--kv-budget-mib): shorten the prompt or max_tokens, or raise the budget",
        human_bytes(*needed_bytes),
        human_bytes(*budget_bytes)
    )]
    KvBudgetExceeded { tokens: usize, role: &'static str, needed_bytes: usize, budget_bytes: usize },
    #[error("incompatible models: {0}")]
    Incompatible(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    DeadlineExceeded(String),
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("model error: {0}")]
    Model(#[from] easd_model::Error),
    #[error("worker error: {}", .0.message())]
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
            Self::InvalidArgument { .. } | Self::ContextOverflow { .. } | Self::ContextLengthExceeded { .. } => {
                Code::InvalidArgument
            }
            Self::KvBudgetExceeded { .. } => Code::OutOfRange,
            Self::SessionNotFound(_) => Code::NotFound,
            Self::PrefixMismatch { .. } | Self::Incompatible(_) => Code::FailedPrecondition,
            Self::Unavailable(_) => Code::Unavailable,
            Self::DeadlineExceeded(_) => Code::DeadlineExceeded,
            Self::ResourceExhausted(_) => Code::ResourceExhausted,
            Self::AlreadyExists(_) => Code::AlreadyExists,
            Self::Worker(status) => status.code(),
            Self::Model(_) | Self::Internal(_) => Code::Internal,
        }
    }

    /// The machine-readable reason sent with the status, for the errors a caller acts on.
    pub fn reason(&self) -> pb::ErrorReason {
        match self {
            Self::SessionNotFound(_) => pb::ErrorReason::SessionNotFound,
            Self::PrefixMismatch { .. } => pb::ErrorReason::PrefixMismatch,
            Self::Incompatible(_) => pb::ErrorReason::IncompatibleModels,
            Self::ContextOverflow { .. } | Self::ContextLengthExceeded { .. } => pb::ErrorReason::ContextLengthExceeded,
            Self::Worker(status) => error_reason(status),
            Self::InvalidArgument { .. }
            | Self::Unavailable(_)
            | Self::DeadlineExceeded(_)
            | Self::ResourceExhausted(_)
            | Self::AlreadyExists(_)
            | Self::KvBudgetExceeded { .. }
            | Self::Model(_)
            | Self::Internal(_) => pb::ErrorReason::Unspecified,
        }
    }
}

/// How long a prompt that does not fit is: counted, or shown to be too long from its size alone, before tokenizing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptLength {
    Tokens(usize),
    /// At least `tokens` tokens, bounded from its `bytes` (`easd_model::Tokenizer::tokens_exceed`).
    AtLeast {
        tokens: usize,
        bytes: usize,
    },
}

impl std::fmt::Display for PromptLength {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tokens(n) => write!(f, "{n} tokens"),
            Self::AtLeast { tokens, bytes } => write!(f, "at least {tokens} tokens ({bytes} bytes)"),
        }
    }
}

fn context_length_exceeded(prompt: PromptLength, max_tokens: Option<usize>, limit: usize) -> String {
    match max_tokens {
        Some(m) => format!(
            "context length exceeded: the prompt has {prompt} and max_tokens is {m}, more than the context length of {limit} tokens"
        ),
        None => format!(
            "context length exceeded: the prompt has {prompt}, which leaves no room for a completion in the context length of {limit} tokens"
        ),
    }
}

/// `bytes` in the largest binary unit that keeps it at least 1 (one decimal from GiB up).
fn human_bytes(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30)),
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b => format!("{} KiB", b >> 10),
    }
}

/// The reason a status carries in its details (`Unspecified` when it carries none).
pub fn error_reason(status: &Status) -> pb::ErrorReason {
    pb::ErrorDetail::decode(status.details())
        .ok()
        .and_then(|d| pb::ErrorReason::try_from(d.reason).ok())
        .unwrap_or(pb::ErrorReason::Unspecified)
}

/// The worker no longer holds (or never held) what was claimed: safe to resend the full context.
pub fn is_session_lost(status: &Status) -> bool {
    matches!(error_reason(status), pb::ErrorReason::SessionNotFound | pb::ErrorReason::PrefixMismatch)
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
            other => match other.reason() {
                pb::ErrorReason::Unspecified => Status::new(other.code(), other.to_string()),
                reason => {
                    let detail = pb::ErrorDetail { reason: reason as i32 }.encode_to_vec();
                    Status::with_details(other.code(), other.to_string(), detail.into())
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_carry_the_reason_a_caller_acts_on() {
        let lost: Status = ServerError::SessionNotFound("s".into()).into();
        assert_eq!(lost.code(), Code::NotFound);
        assert!(is_session_lost(&lost));
        let mismatch: Status = ServerError::PrefixMismatch { session: "s".into(), claimed_len: 3, held_len: 2 }.into();
        assert!(is_session_lost(&mismatch));
        let incompatible: Status = ServerError::Incompatible("session lost? no: other tokenizer".into()).into();
        assert_eq!(incompatible.code(), Code::FailedPrecondition);
        assert_eq!(error_reason(&incompatible), pb::ErrorReason::IncompatibleModels);
        assert!(!is_session_lost(&incompatible));
    }

    #[test]
    fn a_prompt_that_does_not_fit_names_its_length_the_limit_and_max_tokens() {
        let e =
            ServerError::ContextLengthExceeded { prompt: PromptLength::Tokens(700), max_tokens: Some(24), limit: 512 };
        assert_eq!(
            e.to_string(),
            "context length exceeded: the prompt has 700 tokens and max_tokens is 24, more than the context length of 512 tokens"
        );
        let status: Status = e.into();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(error_reason(&status), pb::ErrorReason::ContextLengthExceeded);
        let bounded = PromptLength::AtLeast { tokens: 9000, bytes: 117_000 };
        let e = ServerError::ContextLengthExceeded { prompt: bounded, max_tokens: None, limit: 512 };
        assert!(e.to_string().contains("at least 9000 tokens (117000 bytes), which leaves no room"), "{e}");
    }

    #[test]
    fn a_status_without_details_is_not_mistaken_for_a_lost_session() {
        assert!(!is_session_lost(&Status::not_found("unknown session x: resend the full context")));
        assert_eq!(ServerError::Worker(Status::internal("boom")).reason(), pb::ErrorReason::Unspecified);
    }
}
