//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong loading or running a model, tokenizing, or pulling files.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("model file not found: {}", .0.display())]
    NotFound(PathBuf),
    #[error("{} is not a GGUF file (magic bytes {magic:?}, expected \"GGUF\")", path.display())]
    NotGguf { path: PathBuf, magic: Vec<u8> },
    #[error("{} is a corrupt or truncated GGUF file: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error("unsupported model architecture `{0}` (supported: qwen2, llama)")]
    UnsupportedArchitecture(String),
    #[error("missing GGUF metadata key `{0}`")]
    MissingMetadata(String),
    #[error("invalid GGUF metadata `{key}`: {reason}")]
    InvalidMetadata { key: String, reason: String },
    #[error("missing tensor `{0}` in the GGUF file")]
    MissingTensor(String),
    #[error("tensor `{name}` has shape {actual:?}, expected {expected:?}")]
    TensorShape { name: String, actual: Vec<usize>, expected: Vec<usize> },
    #[error("forward called with no tokens")]
    EmptyInput,
    #[error("asked for logits of the last {n_rows} positions of a {tokens}-token forward (must be 1..={tokens})")]
    RowsOutOfRange { n_rows: usize, tokens: usize },
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    TokenOutOfRange { id: u32, vocab_size: usize },
    #[error("context overflow: positions {start_pos}..{end} exceed the model's maximum context of {max} tokens")]
    ContextOverflow { start_pos: usize, end: usize, max: usize },
    #[error("start position {start_pos} is beyond the {cache_len} positions held in the KV cache")]
    StartBeyondCache { start_pos: usize, cache_len: usize },
    #[error("cannot truncate a KV cache of {len} positions to {requested}")]
    TruncateBeyondLength { len: usize, requested: usize },
    #[error("KV cache belongs to a different model (cache for model #{cache_model}, used with #{model})")]
    CacheMismatch { cache_model: u64, model: u64 },
    #[error("device `{spec}`: {reason}")]
    Device { spec: String, reason: String },
    #[error("tokenizer: {context}: {source}")]
    Tokenizer {
        context: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("the model has no chat template (GGUF key `tokenizer.chat_template`)")]
    NoChatTemplate,
    #[error("chat template: {0}")]
    ChatTemplate(#[from] minijinja::Error),
    #[error("model `{model}`: {reason}")]
    Pull { model: String, reason: String },
    #[error("model `{spec}`: {reason}")]
    InvalidModelSpec { spec: String, reason: String },
    #[error("model `{spec}`: {context}: {source}")]
    Hub {
        spec: String,
        context: String,
        #[source]
        source: Box<hf_hub::api::sync::ApiError>,
    },
    #[error("head ranking {}: {reason}", path.display())]
    InvalidHeadRanking { path: PathBuf, reason: String },
    #[error("checksum mismatch for {}: expected sha256 {expected}, got {actual}", path.display())]
    Checksum { path: PathBuf, expected: String, actual: String },
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error("kernel: {0}")]
    Kernel(#[from] easd_kernels::KernelError),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
}
