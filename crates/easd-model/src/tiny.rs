//! Tiny GGUF models written from code, for tests in this and other crates.
//!
//! Same architectures, metadata keys, tensor names and tokenizer kind as the real pair, with
//! random weights from a fixed seed. The vocabulary is byte-level BPE (all 256 bytes plus a few
//! dozen merges) with ChatML specials and a ChatML template, so encode/decode/chat behave like
//! Qwen2.5's. The FFN weights are stored as Q5_0/Q5_1/Q4_1 to exercise re-quantization.

use crate::config::Architecture;
use crate::error::{Error, Result};
use crate::tokenizer::byte_encoder;
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::path::Path;

/// Shape and randomness of a tiny model.
#[derive(Clone, Debug)]
pub struct TinySpec {
    pub architecture: Architecture,
    pub seed: u64,
    pub hidden_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub intermediate_size: usize,
    pub context_length: usize,
    /// weights = base(seed) + scale * noise(noise_seed), noise relative to each tensor's spread:
    /// a "draft" close to a "target" (high but imperfect agreement).
    pub perturbation: Option<(u64, f32)>,
    /// Changes the merges so the tokenizer fingerprint differs (0 = the standard vocabulary).
    pub tokenizer_variant: u32,
}

impl TinySpec {
    /// Hidden 64, 2 layers, 4 heads / 2 kv heads, FFN 128, context 512.
    pub fn qwen2(seed: u64) -> Self {
        Self {
            architecture: Architecture::Qwen2,
            seed,
            hidden_size: 64,
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            intermediate_size: 128,
            context_length: 512,
            perturbation: None,
            tokenizer_variant: 0,
        }
    }

    /// Same shape as [`TinySpec::qwen2`], llama architecture (no biases, untied head).
    pub fn llama(seed: u64) -> Self {
        Self { architecture: Architecture::Llama, ..Self::qwen2(seed) }
    }
}

const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Words whose byte sequences get merged left to right into tokens.
const WORDS: [&str; 40] = [
    " the", " a", "in", "ing", "er", " is", " of", "ed", " to", " and", "the", "re", "on", " th", "fn", " fn", "let",
    " let", "  ", "    ", "\n\n", "()", " =", "::", "//", " return", "self", " x", "ion", " in", "an", "at", "en",
    "es", "or", " s", " c", " w", " p", "ll",
];
const VARIANT_WORDS: [&str; 4] = [" model", " token", "ment", " def"];

struct Vocab {
    tokens: Vec<String>,
    types: Vec<i32>,
    merges: Vec<String>,
    bos: u32,
    eos: u32,
}

fn vocab(variant: u32) -> Vocab {
    let enc = byte_encoder();
    let mut tokens: Vec<String> = enc.iter().map(|c| c.to_string()).collect();
    let mut merges = Vec::new();
    let words: Vec<&str> = if variant == 0 {
        WORDS.to_vec()
    } else {
        // Drop a few merges and add others: same bytes, different ids and fingerprint.
        let mut w: Vec<&str> = WORDS[(variant as usize % 5)..].to_vec();
        w.extend(VARIANT_WORDS);
        w
    };
    for word in words {
        let chars: Vec<String> = word.bytes().map(|b| enc[b as usize].to_string()).collect();
        let mut prefix = chars[0].clone();
        for c in &chars[1..] {
            let merged = format!("{prefix}{c}");
            if !tokens.contains(&merged) {
                merges.push(format!("{prefix} {c}"));
                tokens.push(merged.clone());
            }
            prefix = merged;
        }
    }
    let mut types = vec![1; tokens.len()];
    let bos = tokens.len() as u32;
    for special in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(special.to_string());
        types.push(3);
    }
    Vocab { tokens, types, merges, bos, eos: bos + 2 }
}

/// Deterministic per-tensor uniform values with standard deviation `std` around `mean`.
fn values(seed: u64, name: &str, n: usize, mean: f32, std: f32) -> Vec<f32> {
    let mut key = seed ^ 0x9e37_79b9_7f4a_7c15;
    for b in name.bytes() {
        key = (key ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    let mut rng = StdRng::seed_from_u64(key);
    let half_width = std * 3f32.sqrt();
    (0..n).map(|_| mean + half_width * (2.0 * rng.random::<f32>() - 1.0)).collect()
}

struct Builder<'a> {
    spec: &'a TinySpec,
    tensors: Vec<(String, QTensor)>,
}

impl Builder<'_> {
    fn add(&mut self, name: &str, shape: &[usize], mean: f32, std: f32, dtype: GgmlDType) -> Result<()> {
        let n: usize = shape.iter().product();
        let mut data = values(self.spec.seed, name, n, mean, std);
        if let Some((noise_seed, scale)) = self.spec.perturbation {
            let noise = values(noise_seed, name, n, 0.0, std * scale);
            data.iter_mut().zip(noise).for_each(|(d, e)| *d += e);
        }
        let t = Tensor::from_vec(data, shape, &Device::Cpu)?;
        self.tensors.push((name.to_string(), QTensor::quantize(&t, dtype)?));
        Ok(())
    }
}

/// Writes a tiny model of `spec` to `path` (any existing file is replaced).
pub fn write_tiny_gguf(path: &Path, spec: &TinySpec) -> Result<()> {
    let v = vocab(spec.tokenizer_variant);
    let n_vocab = v.tokens.len();
    let (h, f) = (spec.hidden_size, spec.intermediate_size);
    let hd = h / spec.n_heads.max(1);
    let kv = spec.n_kv_heads * hd;
    let mut b = Builder { spec, tensors: Vec::new() };
    let q8 = GgmlDType::Q8_0;
    let f32t = GgmlDType::F32;
    // Embedding spread sets the logit scale (tied head): std 0.5 over 64 dims gives logits
    // with std ~4, so greedy choices are well separated.
    b.add("token_embd.weight", &[n_vocab, h], 0.0, 0.5, q8)?;
    let w_std = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
    for i in 0..spec.n_layers {
        let p = format!("blk.{i}");
        b.add(&format!("{p}.attn_norm.weight"), &[h], 1.0, 0.05, f32t)?;
        b.add(&format!("{p}.attn_q.weight"), &[h, h], 0.0, w_std(h), q8)?;
        b.add(&format!("{p}.attn_k.weight"), &[kv, h], 0.0, w_std(h), q8)?;
        b.add(&format!("{p}.attn_v.weight"), &[kv, h], 0.0, w_std(h), q8)?;
        if spec.architecture == Architecture::Qwen2 {
            b.add(&format!("{p}.attn_q.bias"), &[h], 0.0, 0.1, f32t)?;
            b.add(&format!("{p}.attn_k.bias"), &[kv], 0.0, 0.1, f32t)?;
            b.add(&format!("{p}.attn_v.bias"), &[kv], 0.0, 0.1, f32t)?;
        }
        b.add(&format!("{p}.attn_output.weight"), &[h, h], 0.0, w_std(h), q8)?;
        b.add(&format!("{p}.ffn_norm.weight"), &[h], 1.0, 0.05, f32t)?;
        b.add(&format!("{p}.ffn_gate.weight"), &[f, h], 0.0, w_std(h), GgmlDType::Q5_0)?;
        b.add(&format!("{p}.ffn_up.weight"), &[f, h], 0.0, w_std(h), GgmlDType::Q5_1)?;
        b.add(&format!("{p}.ffn_down.weight"), &[h, f], 0.0, w_std(f), GgmlDType::Q4_1)?;
    }
    b.add("output_norm.weight", &[h], 1.0, 0.05, f32t)?;
    if spec.architecture == Architecture::Llama {
        b.add("output.weight", &[n_vocab, h], 0.0, 0.5, q8)?;
    }

    let a = spec.architecture.as_str();
    let u32v = |x: usize| Value::U32(x as u32);
    let strings = |xs: &[String]| Value::Array(xs.iter().cloned().map(Value::String).collect());
    let pre = match spec.architecture {
        Architecture::Qwen2 => "qwen2",
        Architecture::Llama => "llama3",
    };
    let metadata: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        ("general.name".into(), Value::String(format!("tiny-{a}"))),
        (format!("{a}.context_length"), u32v(spec.context_length)),
        (format!("{a}.embedding_length"), u32v(h)),
        (format!("{a}.block_count"), u32v(spec.n_layers)),
        (format!("{a}.feed_forward_length"), u32v(f)),
        (format!("{a}.attention.head_count"), u32v(spec.n_heads)),
        (format!("{a}.attention.head_count_kv"), u32v(spec.n_kv_heads)),
        (format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
        (format!("{a}.rope.freq_base"), Value::F32(10_000.0)),
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
        ("tokenizer.ggml.tokens".into(), strings(&v.tokens)),
        ("tokenizer.ggml.token_type".into(), Value::Array(v.types.iter().map(|&t| Value::I32(t)).collect())),
        ("tokenizer.ggml.merges".into(), strings(&v.merges)),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(v.bos)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(v.eos)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
        ("tokenizer.chat_template".into(), Value::String(CHATML_TEMPLATE.into())),
    ];
    let meta_refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = b.tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    let mut w = std::io::BufWriter::new(file);
    gguf_file::write(&mut w, &meta_refs, &tensor_refs)?;
    use std::io::Write;
    w.flush().map_err(|e| Error::io(path, e))?;
    Ok(())
}
