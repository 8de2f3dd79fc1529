//! The decoder block shared by qwen2 and llama: RMSNorm → GQA attention with RoPE → residual,
//! RMSNorm → SwiGLU MLP → residual. Private building blocks; weights come from `load.rs`.
//! Two paths: on the CPU (`*_host`) every operation runs on `easd-kernels` over plain row-major
//! vectors (batch-invariant, no candle ops), over the rows of one or several sessions at once (each with its own
//! KV cache and positions); on other devices candle tensors and kernels, one session at a time.

use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::rope::Rope;
use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use easd_kernels::{AttentionShape, QMatrix};
use std::sync::Arc;

pub(crate) struct RmsNorm {
    pub weight: Tensor,
    /// The weight as a host vector (CPU models).
    pub host: Vec<f32>,
    pub eps: f32,
}

impl RmsNorm {
    pub fn new(weight: Tensor, eps: f32) -> Result<Self> {
        let host = if weight.device().is_cpu() { weight.to_vec1::<f32>()? } else { Vec::new() };
        Ok(Self { weight, host, eps })
    }

    fn forward_host(&self, x: &[f32]) -> Vec<f32> {
        let mut y = x.to_vec();
        easd_kernels::rms_norm_rows(&mut y, &self.host, self.eps);
        y
    }

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
    /// `[1, seq, hidden]` rows of `tokens` (device models).
    pub fn lookup(&self, tokens: &[u32], device: &Device) -> Result<Tensor> {
        match self {
            Embedding::Kernel(m) => {
                Ok(Tensor::from_vec(self.lookup_host(tokens)?, (1, tokens.len(), m.cols()), device)?)
            }
            Embedding::Candle(q) => Ok(q.embedding(&Tensor::new(tokens, device)?.unsqueeze(0)?)?),
        }
    }

    /// Rows `[seq][hidden]` of `tokens` (CPU models).
    pub fn lookup_host(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let Embedding::Kernel(m) = self else {
            return Err(candle_core::Error::Msg("host lookup of a device embedding".into()).into());
        };
        let h = m.cols();
        let mut data = vec![0f32; tokens.len() * h];
        for (row, &t) in data.chunks_exact_mut(h).zip(tokens) {
            m.dequantize_row(t as usize, row)?;
        }
        Ok(data)
    }
}

/// A quantized projection with an optional bias (qwen2 has q/k/v biases, llama none).
pub(crate) struct Linear {
    pub weight: Weight,
    pub bias: Option<Tensor>,
    /// The bias as a host vector (CPU models).
    pub bias_host: Option<Vec<f32>>,
}

impl Linear {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(project(&[self], x)?.pop().expect("one projection"))
    }
}

/// Several projections of the rows `x` (`rows × k`) on the CPU kernels, biases added.
pub(crate) fn project_host(ls: &[&Linear], x: &[f32], rows: usize) -> Result<Vec<Vec<f32>>> {
    let ws = ls
        .iter()
        .map(|l| match &l.weight {
            Weight::Kernel(m) => Ok(m.as_ref()),
            Weight::Candle(_) => Err(candle_core::Error::Msg("host projection of a device weight".into()).into()),
        })
        .collect::<Result<Vec<_>>>()?;
    let mut ys = easd_kernels::matmul(&ws, x, rows)?;
    for (y, l) in ys.iter_mut().zip(ls) {
        if let Some(b) = &l.bias_host {
            easd_kernels::add_bias_rows(y, b);
        }
    }
    Ok(ys)
}

/// Several projections of one input `[.., k]` on a device (candle's kernels), biases added.
pub(crate) fn project(ls: &[&Linear], x: &Tensor) -> Result<Vec<Tensor>> {
    ls.iter()
        .map(|l| {
            let y = match &l.weight {
                Weight::Candle(q) => q.forward(x)?,
                Weight::Kernel(_) => {
                    return Err(candle_core::Error::Msg("device projection of a host weight".into()).into());
                }
            };
            Ok(match &l.bias {
                Some(b) => y.broadcast_add(b)?,
                None => y,
            })
        })
        .collect()
}

pub(crate) struct Mlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

impl Mlp {
    fn forward_host(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        let mut gate_up = project_host(&[&self.gate, &self.up], x, rows)?;
        let up = gate_up.pop().expect("two outputs");
        let mut gate = gate_up.pop().expect("two outputs");
        easd_kernels::silu_mul(&mut gate, &up);
        Ok(project_host(&[&self.down], &gate, rows)?.remove(0))
    }

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
    /// CPU path over the rows of several sessions (`segments`, in order, each at positions `cache.len()..` of
    /// its own cache): the projections run once over all rows (one read of the weights), RoPE, the KV writes
    /// and attention per session. Returns the attention block's output rows.
    fn forward_host(&self, x: &[f32], segments: &mut [Segment<'_>], layer: usize, rope: &Rope) -> Result<Vec<f32>> {
        let total = segments.iter().map(|s| s.rows).sum();
        let mut qkv = project_host(&[&self.q, &self.k, &self.v], x, total)?;
        let v = qkv.pop().expect("three outputs");
        let mut k = qkv.pop().expect("three outputs");
        let mut q = qkv.pop().expect("three outputs");
        let (q_width, kv_width) = (self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim);
        let mut out = Vec::with_capacity(total * q_width);
        let mut row = 0;
        for seg in segments.iter_mut() {
            let (start, rows) = (seg.cache.len(), seg.rows);
            let q = &mut q[row * q_width..(row + rows) * q_width];
            let k = &mut k[row * kv_width..(row + rows) * kv_width];
            rope.apply_host(q, self.n_heads, start);
            rope.apply_host(k, self.n_kv_heads, start);
            seg.cache.write_rows(layer, k, &v[row * kv_width..(row + rows) * kv_width])?;
            let shape = AttentionShape {
                n_heads: self.n_heads,
                n_kv_heads: self.n_kv_heads,
                head_dim: self.head_dim,
                seq: rows,
                start,
                kv_capacity: seg.cache.capacity(),
            };
            let (kb, vb) = seg.cache.host_buffers(layer)?;
            out.extend(easd_kernels::attention(shape, q, kb, vb, 1.0 / (self.head_dim as f32).sqrt()));
            row += rows;
        }
        Ok(project_host(&[&self.o], &out, total)?.remove(0))
    }

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
        let out = {
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

/// One session's rows in a host forward: `rows` consecutive activation rows at positions `cache.len()..`.
pub(crate) struct Segment<'a> {
    pub cache: &'a mut KvCache,
    pub rows: usize,
}

pub(crate) struct Block {
    pub attn_norm: RmsNorm,
    pub attn: Attention,
    pub mlp_norm: RmsNorm,
    pub mlp: Mlp,
}

impl Block {
    /// CPU path over the `[rows][hidden]` rows of `segments` (concatenated in their order), in place.
    pub fn forward_host(&self, x: &mut [f32], segments: &mut [Segment<'_>], layer: usize, rope: &Rope) -> Result<()> {
        let rows = segments.iter().map(|s| s.rows).sum();
        let h = self.attn.forward_host(&self.attn_norm.forward_host(x), segments, layer, rope)?;
        easd_kernels::add_assign(x, &h);
        let h = self.mlp.forward_host(&self.mlp_norm.forward_host(x), rows)?;
        easd_kernels::add_assign(x, &h);
        Ok(())
    }

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
