//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in the harness. Causes are kept as sources.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} line {line}: {reason}")]
    Dataset { path: PathBuf, line: usize, reason: String },
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("invalid {field}: {reason}")]
    InvalidValue { field: &'static str, reason: String },
    #[error("generation failed for problem {problem} in mode {mode} after {attempts} attempt(s): {source}")]
    Generation {
        problem: usize,
        mode: String,
        attempts: u32,
        #[source]
        source: BoxError,
    },
    #[error("model scoring failed on calibration question {question}: {source}")]
    Scoring {
        question: usize,
        #[source]
        source: BoxError,
    },
    #[error("plot {path}: {reason}")]
    Plot { path: PathBuf, reason: String },
}

/// The error a [`crate::Generator`] or [`crate::EntropyScorer`] backend returns.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }

    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
        Error::InvalidValue { field, reason: reason.into() }
    }
}

/// easd-core's parameter checks (the coordinator's own) name the field the same way.
impl From<easd_core::ParamError> for Error {
    fn from(e: easd_core::ParamError) -> Error {
        Error::InvalidValue { field: e.field, reason: e.reason }
    }
}
