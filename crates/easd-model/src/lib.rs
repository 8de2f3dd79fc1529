//! Model runtime for EASD: qwen2/llama GGUF models on candle with logits for every input
//! position and a per-session KV cache that rolls back in O(1).
//!
//! * [`Model`] holds the weights (shared by all sessions, `Send + Sync`); [`KvCache`] is one
//!   session's state. `forward(cache, tokens, start_pos)` first truncates the cache to
//!   `start_pos` — rejected draft tokens are dropped by simply starting the next forward
//!   earlier — then returns [`Logits`] for every input position.
//! * [`Tokenizer`] comes from the same GGUF metadata: byte-level BPE, the chat template
//!   (rendered with minijinja), stop tokens and a fingerprint two services compare.
//! * [`tiny`] writes small random models of the same format for tests; [`pull`] fetches the
//!   default draft/target pair, [`hub`] GGUF files of hub repositories (`hf:OWNER/NAME/FILE`),
//!   and [`resolve_model`] turns any model name into a local file.
//!
//! Numerics: on the CPU the projections and attention run on `easd-kernels`, which are
//! batch-invariant — a position's logits are bitwise identical whether it is computed alone, in
//! a verify block or in a full-context rebuild — so greedy speculative decoding equals greedy
//! target decoding token for token. On CUDA, candle's kernels run and that does not hold.

mod config;
mod error;
mod generate;
mod gguf;
mod head;
pub mod hub;
mod kv_cache;
mod layers;
mod load;
mod logits;
mod model;
pub mod pull;
mod resolve;
mod rope;
pub mod tiny;
mod tokenizer;

pub use candle_core::Device;
pub use config::{Architecture, context_length_of};
pub use error::{Error, Result};
pub use generate::{BlockAgreement, block_agreement, greedy_generate};
pub use head::HeadVocab;
pub use hub::{HubFile, HubSettings};
pub use kv_cache::KvCache;
pub use load::LoadStats;
pub use logits::Logits;
pub use model::{BatchItem, LoadOptions, Model, ModelInfo};
pub use pull::{DefaultModel, ModelStatus, default_models_dir, list, pull};
pub use resolve::{ModelSources, ModelSpec, resolve_model};
pub use tiny::{TinySpec, write_tiny_gguf};
pub use tokenizer::{ChatMessage, IncrementalDecoder, Tokenizer};

/// Sets the number of CPU kernel threads for the process (0 = all cores). Call it before the
/// first model loads; afterwards only the same count is accepted.
pub fn set_threads(n: usize) -> Result<()> {
    Ok(easd_kernels::set_threads(n)?)
}

/// The CPU kernels' thread count and instruction-set path, for logs and summaries.
pub fn kernel_description() -> String {
    format!("{} threads, {}", easd_kernels::threads(), easd_kernels::Isa::active().name())
}

/// `"cpu"`, `"cuda"` or `"cuda:N"` to a device (CUDA needs the `cuda` feature).
pub fn parse_device(s: &str) -> Result<Device> {
    let s = s.trim();
    let err = |reason: &str| Error::Device { spec: s.to_string(), reason: reason.to_string() };
    if s == "cpu" {
        return Ok(Device::Cpu);
    }
    let ordinal = match s.strip_prefix("cuda") {
        Some("") => 0,
        Some(rest) => rest
            .strip_prefix(':')
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| err("expected `cuda` or `cuda:N`"))?,
        None => return Err(err("expected `cpu`, `cuda` or `cuda:N`")),
    };
    if !cfg!(feature = "cuda") {
        return Err(err("this build has no CUDA support (build with the `cuda` feature)"));
    }
    Device::new_cuda(ordinal).map_err(|e| err(&e.to_string()))
}
