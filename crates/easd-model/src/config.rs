//! Hyper-parameters of a qwen2/llama model, read from GGUF metadata.

use crate::error::{Error, Result};
use crate::gguf::Meta;
use candle_core::quantized::gguf_file::Content;

/// The architectures this crate runs. Both share one module shape (pre-norm decoder, GQA
/// attention with RoPE, SwiGLU MLP); they differ in the RoPE layout and default base.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Architecture {
    Qwen2,
    Llama,
}

impl Architecture {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "qwen2" => Ok(Self::Qwen2),
            "llama" => Ok(Self::Llama),
            other => Err(Error::UnsupportedArchitecture(other.to_string())),
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Qwen2 => "qwen2",
            Self::Llama => "llama",
        }
    }

    /// llama.cpp's converter permutes llama's q/k rows so rotation pairs are adjacent
    /// (`rope_i`); qwen2 keeps the halves layout (`rope`, "neox").
    pub(crate) fn interleaved_rope(&self) -> bool {
        matches!(self, Self::Llama)
    }

    fn default_rope_base(&self) -> f64 {
        match self {
            Self::Qwen2 => 1_000_000.0,
            Self::Llama => 10_000.0,
        }
    }
}

impl std::fmt::Display for Architecture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The context length a GGUF file declares, from its metadata alone (no weights are read): what a request can be
/// checked against before a model loads.
pub fn context_length_of(path: &std::path::Path) -> Result<usize> {
    Ok(ModelConfig::from_gguf(&crate::gguf::GgufFile::metadata_only(path)?)?.context_length)
}

/// Shapes and constants of one model.
#[derive(Clone, Debug)]
pub(crate) struct ModelConfig {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub context_length: usize,
    pub rms_eps: f64,
    pub rope_base: f64,
}

impl ModelConfig {
    pub fn from_gguf(content: &Content) -> Result<Self> {
        let meta = Meta(content);
        let architecture = Architecture::parse(meta.string("general.architecture")?)?;
        let a = architecture.as_str();
        let hidden_size = meta.usize(&format!("{a}.embedding_length"))?;
        let n_layers = meta.usize(&format!("{a}.block_count"))?;
        let n_heads = meta.usize(&format!("{a}.attention.head_count"))?;
        let n_kv_heads = meta.opt_usize(&format!("{a}.attention.head_count_kv"))?.unwrap_or(n_heads);
        let context_length = meta.usize(&format!("{a}.context_length"))?;
        let rms_eps = meta.opt_f64(&format!("{a}.attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6);
        let rope_base =
            meta.opt_f64(&format!("{a}.rope.freq_base"))?.unwrap_or_else(|| architecture.default_rope_base());
        let bad = |key: &str, reason: String| Error::InvalidMetadata { key: format!("{a}.{key}"), reason };
        if n_heads == 0 || n_kv_heads == 0 || n_layers == 0 || context_length == 0 {
            return Err(bad(
                "attention.head_count",
                format!(
                    "head_count {n_heads}, head_count_kv {n_kv_heads}, block_count {n_layers}, context_length {context_length}: all must be > 0"
                ),
            ));
        }
        if hidden_size % n_heads != 0 || n_heads % n_kv_heads != 0 {
            return Err(bad(
                "attention.head_count",
                format!(
                    "embedding_length {hidden_size} must divide by head_count {n_heads}, which must divide by head_count_kv {n_kv_heads}"
                ),
            ));
        }
        let head_dim = hidden_size / n_heads;
        if head_dim % 2 != 0 {
            return Err(bad("embedding_length", format!("head dimension {head_dim} is odd")));
        }
        if let Some(rope_dim) = meta.opt_usize(&format!("{a}.rope.dimension_count"))?
            && rope_dim != head_dim
        {
            return Err(bad(
                "rope.dimension_count",
                format!("partial rotary embeddings ({rope_dim} of {head_dim} dims) are not supported"),
            ));
        }
        Ok(Self {
            architecture,
            hidden_size,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            context_length,
            rms_eps,
            rope_base,
        })
    }
}
