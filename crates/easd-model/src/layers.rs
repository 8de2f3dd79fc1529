//! The decoder block shared by qwen2 and llama: RMSNorm → GQA attention with RoPE → residual,
//! RMSNorm → SwiGLU MLP → residual. Private building blocks; weights come from `load.rs`.

use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::rope::Rope;
use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use easd_kernels::{AttentionShape, QMatrix};
use std::sync::Arc;

pub(crate) struct RmsNorm {
    pub weight: Tensor,
    pub eps: f32,
}

impl RmsNorm {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(x, &self.weight, self.eps)?)
    }
}

/// A quantized weight: on the CPU the project's batch-invariant kernels, elsewhere candle's.
pub(crate) enum Weight {
    Kernel(Arc<QMatrix>),
    Candle(QMatMul),
}

/// The token embedding table (also the head when the model ties them).
pub(crate) enum Embedding {
    Kernel(Arc<QMatrix>),
    Candle(Arc<QTensor>),
}

impl Embedding {
    /// `[1, seq, hidden]` rows of `tokens`.
    pub fn lookup(&self, tokens: &[u32], device: &Device) -> Result<Tensor> {
        match self {
            Embedding::Kernel(m) => {
                let h = m.cols();
                let mut data = vec![0f32; tokens.len() * h];
                for (row, &t) in data.chunks_exact_mut(h).zip(tokens) {
                    m.dequantize_row(t as usize, row)?;
                }
                Ok(Tensor::from_vec(data, (1, tokens.len(), h), device)?)
            }
            Embedding::Candle(q) => Ok(q.embedding(&Tensor::new(tokens, device)?.unsqueeze(0)?)?),
        }
    }
}

/// A quantized projection with an optional bias (qwen2 has q/k/v biases, llama none).
pub(crate) struct Linear {
    pub weight: Weight,
    pub bias: Option<Tensor>,
}

impl Linear {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(project(&[self], x)?.pop().expect("one projection"))
    }
}

fn kernel_project(ws: &[&QMatrix], x: &Tensor) -> Result<Vec<Tensor>> {
    let dims = x.dims().to_vec();
    let k = *dims.last().expect("input has a last dimension");
    let input = x.flatten_all()?.to_vec1::<f32>()?;
    let outs = easd_kernels::matmul(ws, &input, x.elem_count() / k)?;
    let mut ys = Vec::with_capacity(ws.len());
    for (out, w) in outs.into_iter().zip(ws) {
        let mut shape = dims.clone();
        *shape.last_mut().expect("non-empty") = w.rows();
        ys.push(Tensor::from_vec(out, shape, x.device())?);
    }
    Ok(ys)
}

/// Several projections of one input `[.., k]`. On the CPU one kernel call: one quantization of
/// the input and one parallel region for all of them. Biases are added here.
pub(crate) fn project(ls: &[&Linear], x: &Tensor) -> Result<Vec<Tensor>> {
    let kernels: Option<Vec<&QMatrix>> = ls
        .iter()
        .map(|l| match &l.weight {
            Weight::Kernel(m) => Some(m.as_ref()),
            Weight::Candle(_) => None,
        })
        .collect();
    let ys = match kernels {
        Some(ws) => kernel_project(&ws, x)?,
        None => ls
            .iter()
            .map(|l| match &l.weight {
                Weight::Candle(q) => Ok(q.forward(x)?),
                Weight::Kernel(m) => Ok(kernel_project(&[m], x)?.remove(0)),
            })
            .collect::<Result<Vec<_>>>()?,
    };
    ys.into_iter()
        .zip(ls)
        .map(|(y, l)| match &l.bias {
            Some(b) => Ok(y.broadcast_add(b)?),
            None => Ok(y),
        })
        .collect()
}

pub(crate) struct Mlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut gate_up = project(&[&self.gate, &self.up], x)?;
        let up = gate_up.pop().expect("two outputs");
        let gate = gate_up.pop().expect("two outputs");
        let gate = candle_nn::ops::silu(&gate)?;
        self.down.forward(&(gate * up)?)
    }
}

pub(crate) struct Attention {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl Attention {
    /// `x`: `[1, seq, hidden]` at positions `cache.len()..`; writes this layer's keys/values.
    fn forward(
        &self,
        x: &Tensor,
        layer: usize,
        cache: &mut KvCache,
        rope: &Rope,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (b, seq, _) = x.dims3()?;
        let start = cache.len();
        let heads = |t: Tensor, n: usize| -> Result<Tensor> {
            Ok(t.reshape((b, seq, n, self.head_dim))?.transpose(1, 2)?.contiguous()?)
        };
        let mut qkv = project(&[&self.q, &self.k, &self.v], x)?;
        let v = qkv.pop().expect("three outputs");
        let k = qkv.pop().expect("three outputs");
        let q = qkv.pop().expect("three outputs");
        let q = heads(q, self.n_heads)?;
        let k = heads(k, self.n_kv_heads)?;
        let v = heads(v, self.n_kv_heads)?;
        let q = rope.apply(&q, start)?;
        let k = rope.apply(&k, start)?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let out = if x.device().is_cpu() {
            // The batch-invariant kernel reads the cache buffers in place.
            cache.write(layer, &k, &v)?;
            let shape = AttentionShape {
                n_heads: self.n_heads,
                n_kv_heads: self.n_kv_heads,
                head_dim: self.head_dim,
                seq,
                start,
                kv_capacity: cache.capacity(),
            };
            let q = q.flatten_all()?.to_vec1::<f32>()?;
            let out = cache.with_layer_buffers(layer, |k, v| easd_kernels::attention(shape, &q, k, v, scale as f32))?;
            Tensor::from_vec(out, (b, seq, self.n_heads * self.head_dim), x.device())?
        } else {
            let (k_all, v_all) = cache.append(layer, &k, &v)?;
            // Grouped-query attention without copying the cache: the query heads that share one
            // kv head are stacked along the row axis, so each kv head is used as is.
            let n_rep = self.n_heads / self.n_kv_heads;
            let q = q.reshape((b, self.n_kv_heads, n_rep * seq, self.head_dim))?;
            let scores = (q.matmul(&k_all.t()?)? * scale)?;
            let scores = match mask {
                Some(m) => scores.broadcast_add(m)?,
                None => scores,
            };
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            let out = probs.matmul(&v_all)?; // [b, n_kv, n_rep*seq, hd]
            out.reshape((b, self.n_heads, seq, self.head_dim))?.transpose(1, 2)?.reshape((
                b,
                seq,
                self.n_heads * self.head_dim,
            ))?
        };
        self.o.forward(&out)
    }
}

pub(crate) struct Block {
    pub attn_norm: RmsNorm,
    pub attn: Attention,
    pub mlp_norm: RmsNorm,
    pub mlp: Mlp,
}

impl Block {
    pub fn forward(
        &self,
        x: &Tensor,
        layer: usize,
        cache: &mut KvCache,
        rope: &Rope,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let h = self.attn.forward(&self.attn_norm.forward(x)?, layer, cache, rope, mask)?;
        let x = (x + h)?;
        let h = self.mlp.forward(&self.mlp_norm.forward(&x)?)?;
        Ok((x + h)?)
    }
}

/// Causal mask for `seq` new queries at positions `start..start+seq` over `start+seq` keys,
/// laid out for the stacked-GQA rows (`n_rep` copies of the `seq` rows). None for one token.
pub(crate) fn causal_mask(
    seq: usize,
    start: usize,
    n_rep: usize,
    device: &candle_core::Device,
) -> Result<Option<Tensor>> {
    if seq == 1 {
        return Ok(None);
    }
    let total = start + seq;
    let mut data = Vec::with_capacity(n_rep * seq * total);
    for _ in 0..n_rep {
        for i in 0..seq {
            data.extend((0..total).map(|j| if j > start + i { f32::NEG_INFINITY } else { 0.0 }));
        }
    }
    Ok(Some(Tensor::from_vec(data, (n_rep * seq, total), device)?))
}
