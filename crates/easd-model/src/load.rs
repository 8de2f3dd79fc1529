//! Reading weights out of a GGUF file into the decoder's blocks. Weight names live only here.
//!
//! Re-quantization: candle's CPU kernels have SIMD dot products for Q4_0, Q8_0 and the K-quants,
//! but Q5_0, Q5_1 and Q4_1 fall back to scalar code (the default 0.5B draft is mostly Q5_0,
//! because 896 is not a multiple of 256). With `requantize` on (the default), such tensors are
//! converted to Q8_0 at load: more memory (8.5 vs 5.5-6 bits/weight) but several times faster;
//! Q8_0 is finer than the source, so the error added is tiny. See docs/BENCHMARKS.md.
//!
//! Padding: candle's fast AVX-512 VNNI kernels for Q8_0 (repacked tiles) need the inner
//! dimension to be a multiple of 256. The 0.5B model's is 896, so with `requantize` on, its Q8_0
//! weights get zero columns up to 1024 and the inputs are zero-padded to match: 14% more
//! weight bytes, but several times faster batched (k-token) forwards and faster decoding.

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::layers::{Attention, Block, Linear, Mlp, RmsNorm};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Tensor};
use std::sync::Arc;

/// What the loader did, for logs and the benchmark.
#[derive(Clone, Debug, Default)]
pub struct LoadStats {
    /// Tensors converted to Q8_0, and their element count.
    pub requantized_tensors: usize,
    pub requantized_elements: usize,
    /// Q8_0 weights zero-padded to an inner dimension that is a multiple of 256.
    pub padded_tensors: usize,
}

/// Inner-dimension multiple and output-dimension multiple of candle's repacked x86 kernels.
const REPACK_K: usize = 256;
const REPACK_N: usize = 16;

pub(crate) struct Weights {
    pub embed: Arc<QTensor>,
    pub blocks: Vec<Block>,
    pub norm: RmsNorm,
    pub lm_head: Linear,
    pub vocab_size: usize,
    pub stats: LoadStats,
}

struct Loader<'a> {
    file: &'a mut GgufFile,
    device: &'a Device,
    requantize: bool,
    stats: LoadStats,
}

impl Loader<'_> {
    fn has(&self, name: &str) -> bool {
        self.file.content.tensor_infos.contains_key(name)
    }

    fn qtensor(&mut self, name: &str, expected: &[usize]) -> Result<QTensor> {
        let info = self.file.content.tensor_infos.get(name).ok_or_else(|| Error::MissingTensor(name.to_string()))?;
        if info.shape.dims() != expected {
            return Err(Error::TensorShape {
                name: name.to_string(),
                actual: info.shape.dims().to_vec(),
                expected: expected.to_vec(),
            });
        }
        let slow = matches!(info.ggml_dtype, GgmlDType::Q5_0 | GgmlDType::Q5_1 | GgmlDType::Q4_1);
        let path = self.file.path.clone();
        let corrupt =
            |e: candle_core::Error| Error::Corrupt { path: path.clone(), reason: format!("tensor `{name}`: {e}") };
        if self.requantize && slow && self.device.is_cpu() {
            let t = self.file.content.tensor(&mut self.file.reader, name, &Device::Cpu).map_err(corrupt)?;
            let dense = t.dequantize(&Device::Cpu)?;
            self.stats.requantized_tensors += 1;
            self.stats.requantized_elements += dense.elem_count();
            return Ok(QTensor::quantize(&dense, GgmlDType::Q8_0)?);
        }
        self.file.content.tensor(&mut self.file.reader, name, self.device).map_err(corrupt)
    }

    fn matmul(&mut self, name: &str, out: usize, inp: usize) -> Result<Linear> {
        let t = self.qtensor(name, &[out, inp])?;
        let (t, in_pad) = self.pad_for_repack(t)?;
        Ok(Linear { weight: QMatMul::from_qtensor(t)?, bias: None, in_pad })
    }

    /// Zero-pads a Q8_0 weight's inner dimension to a multiple of 256 (see the module doc).
    fn pad_for_repack(&mut self, t: QTensor) -> Result<(QTensor, usize)> {
        let (n, k) = t.shape().dims2()?;
        let pad = k.next_multiple_of(REPACK_K) - k;
        if !self.requantize || !self.device.is_cpu() || t.dtype() != GgmlDType::Q8_0 || pad == 0 || n % REPACK_N != 0 {
            return Ok((t, 0));
        }
        let dense = t.dequantize(&Device::Cpu)?.pad_with_zeros(1, 0, pad)?;
        self.stats.padded_tensors += 1;
        Ok((QTensor::quantize(&dense, GgmlDType::Q8_0)?, pad))
    }

    fn dense(&mut self, name: &str, len: usize) -> Result<Tensor> {
        let t = self.qtensor(name, &[len])?;
        Ok(t.dequantize(self.device)?.to_dtype(DType::F32)?)
    }

    fn opt_dense(&mut self, name: &str, len: usize) -> Result<Option<Tensor>> {
        if self.has(name) { self.dense(name, len).map(Some) } else { Ok(None) }
    }

    fn linear(&mut self, prefix: &str, out: usize, inp: usize) -> Result<Linear> {
        let mut l = self.matmul(&format!("{prefix}.weight"), out, inp)?;
        l.bias = self.opt_dense(&format!("{prefix}.bias"), out)?;
        Ok(l)
    }
}

pub(crate) fn load_weights(
    file: &mut GgufFile,
    cfg: &ModelConfig,
    device: &Device,
    requantize: bool,
) -> Result<Weights> {
    let vocab_size = match file.content.tensor_infos.get("token_embd.weight") {
        Some(info) => info.shape.dims().first().copied().unwrap_or(0),
        None => return Err(Error::MissingTensor("token_embd.weight".into())),
    };
    let mut l = Loader { file, device, requantize, stats: LoadStats::default() };
    let h = cfg.hidden_size;
    let hd = cfg.head_dim;
    let tied = !l.has("output.weight");
    let embed = l.qtensor("token_embd.weight", &[vocab_size, h])?;
    // A tied embedding is also the head: pad it like any projection; lookups drop the padding.
    let (embed, embed_pad) = if tied { l.pad_for_repack(embed)? } else { (embed, 0) };
    let embed = Arc::new(embed);
    let mut blocks = Vec::with_capacity(cfg.n_layers);
    for i in 0..cfg.n_layers {
        let p = format!("blk.{i}");
        let ffn = match l.file.content.tensor_infos.get(&format!("{p}.ffn_up.weight")) {
            Some(info) => info.shape.dims().first().copied().unwrap_or(0),
            None => return Err(Error::MissingTensor(format!("{p}.ffn_up.weight"))),
        };
        let norm = |l: &mut Loader, name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm { weight: l.dense(name, h)?, eps: cfg.rms_eps as f32 })
        };
        blocks.push(Block {
            attn_norm: norm(&mut l, &format!("{p}.attn_norm.weight"))?,
            attn: Attention {
                q: l.linear(&format!("{p}.attn_q"), cfg.n_heads * hd, h)?,
                k: l.linear(&format!("{p}.attn_k"), cfg.n_kv_heads * hd, h)?,
                v: l.linear(&format!("{p}.attn_v"), cfg.n_kv_heads * hd, h)?,
                o: l.linear(&format!("{p}.attn_output"), h, cfg.n_heads * hd)?,
                n_heads: cfg.n_heads,
                n_kv_heads: cfg.n_kv_heads,
                head_dim: hd,
            },
            mlp_norm: norm(&mut l, &format!("{p}.ffn_norm.weight"))?,
            mlp: Mlp {
                gate: l.matmul(&format!("{p}.ffn_gate.weight"), ffn, h)?,
                up: l.matmul(&format!("{p}.ffn_up.weight"), ffn, h)?,
                down: l.matmul(&format!("{p}.ffn_down.weight"), h, ffn)?,
            },
        });
    }
    let norm = RmsNorm { weight: l.dense("output_norm.weight", h)?, eps: cfg.rms_eps as f32 };
    // Tied embeddings (qwen2 small models): no `output.weight`, the embedding doubles as head.
    let lm_head = if tied {
        Linear { weight: QMatMul::from_arc(embed.clone())?, bias: None, in_pad: embed_pad }
    } else {
        l.matmul("output.weight", vocab_size, h)?
    };
    Ok(Weights { embed, blocks, norm, lm_head, vocab_size, stats: l.stats })
}
