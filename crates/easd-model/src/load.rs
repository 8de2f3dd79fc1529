//! Reading weights out of a GGUF file into the decoder's blocks. Weight names live only here.
//!
//! Re-quantization: candle's CPU kernels have SIMD dot products for Q4_0, Q8_0 and the K-quants,
//! but Q5_0, Q5_1 and Q4_1 fall back to scalar code (the default 0.5B draft is mostly Q5_0,
//! because 896 is not a multiple of 256). With `requantize` on (the default), such tensors are
//! converted to Q8_0 at load: more memory (8.5 vs 5.5-6 bits/weight) but several times faster;
//! Q8_0 is finer than the source, so the error added is tiny. See docs/BENCHMARKS.md.

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
}

pub(crate) struct Weights {
    pub embed: Arc<QTensor>,
    pub blocks: Vec<Block>,
    pub norm: RmsNorm,
    pub lm_head: QMatMul,
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

    fn matmul(&mut self, name: &str, out: usize, inp: usize) -> Result<QMatMul> {
        Ok(QMatMul::from_qtensor(self.qtensor(name, &[out, inp])?)?)
    }

    fn dense(&mut self, name: &str, len: usize) -> Result<Tensor> {
        let t = self.qtensor(name, &[len])?;
        Ok(t.dequantize(self.device)?.to_dtype(DType::F32)?)
    }

    fn opt_dense(&mut self, name: &str, len: usize) -> Result<Option<Tensor>> {
        if self.has(name) { self.dense(name, len).map(Some) } else { Ok(None) }
    }

    fn linear(&mut self, prefix: &str, out: usize, inp: usize) -> Result<Linear> {
        Ok(Linear {
            weight: self.matmul(&format!("{prefix}.weight"), out, inp)?,
            bias: self.opt_dense(&format!("{prefix}.bias"), out)?,
        })
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
    let embed = Arc::new(l.qtensor("token_embd.weight", &[vocab_size, h])?);
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
    let lm_head = if l.has("output.weight") {
        l.matmul("output.weight", vocab_size, h)?
    } else {
        QMatMul::from_arc(embed.clone())?
    };
    Ok(Weights { embed, blocks, norm, lm_head, vocab_size, stats: l.stats })
}
