//! The decoder block shared by qwen2 and llama: RMSNorm → GQA attention with RoPE → residual,
//! RMSNorm → SwiGLU MLP → residual. Private building blocks; weights come from `load.rs`.

use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::rope::Rope;
use candle_core::quantized::QMatMul;
use candle_core::{Module, Tensor};

pub(crate) struct RmsNorm {
    pub weight: Tensor,
    pub eps: f32,
}

impl RmsNorm {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(x, &self.weight, self.eps)?)
    }
}

/// A quantized projection with an optional bias (qwen2 has q/k/v biases, llama none).
/// `in_pad` zero columns were appended to the weight at load (see `load.rs`); the input gets
/// the same zero padding, which leaves the product unchanged.
pub(crate) struct Linear {
    pub weight: QMatMul,
    pub bias: Option<Tensor>,
    pub in_pad: usize,
}

impl Linear {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = if self.in_pad > 0 {
            self.weight.forward(&x.pad_with_zeros(candle_core::D::Minus1, 0, self.in_pad)?)?
        } else {
            self.weight.forward(x)?
        };
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// Several projections of one input in a single kernel call (one input quantization, one
/// parallel region) when candle has a fused kernel for them (x86 AVX-512 VNNI, same dtype and
/// padding); None otherwise. Biases are added here like in [`Linear::forward`].
fn fused(ls: &[&Linear], x: &Tensor) -> Result<Option<Vec<Tensor>>> {
    let pad = ls[0].in_pad;
    let mut ts = Vec::with_capacity(ls.len());
    for l in ls {
        match &l.weight {
            QMatMul::QTensor(t) if l.in_pad == pad => ts.push(t.as_ref()),
            _ => return Ok(None),
        }
    }
    let x = if pad > 0 { x.pad_with_zeros(candle_core::D::Minus1, 0, pad)? } else { x.clone() };
    let Some(outs) = candle_core::quantized::QTensor::gemv_fused_shared_lhs(&ts, &x)? else {
        return Ok(None);
    };
    let mut res = Vec::with_capacity(outs.len());
    for (y, l) in outs.into_iter().zip(ls) {
        res.push(match &l.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        });
    }
    Ok(Some(res))
}

pub(crate) struct Mlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (gate, up) = match fused(&[&self.gate, &self.up], x)? {
            Some(mut out) => {
                let up = out.pop().expect("two outputs");
                (out.pop().expect("two outputs"), up)
            }
            None => (self.gate.forward(x)?, self.up.forward(x)?),
        };
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
        let (q, k, v) = match fused(&[&self.q, &self.k, &self.v], x)? {
            Some(mut out) => {
                let v = out.pop().expect("three outputs");
                let k = out.pop().expect("three outputs");
                (out.pop().expect("three outputs"), k, v)
            }
            None => (self.q.forward(x)?, self.k.forward(x)?, self.v.forward(x)?),
        };
        let q = heads(q, self.n_heads)?;
        let k = heads(k, self.n_kv_heads)?;
        let v = heads(v, self.n_kv_heads)?;
        let q = rope.apply(&q, start)?;
        let k = rope.apply(&k, start)?;
        let (k_all, v_all) = cache.append(layer, &k, &v)?;

        // Grouped-query attention without copying the cache: the query heads that share one
        // kv head are stacked along the row axis, so each kv head is used as is.
        let n_rep = self.n_heads / self.n_kv_heads;
        let q = q.reshape((b, self.n_kv_heads, n_rep * seq, self.head_dim))?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let scores = (q.matmul(&k_all.t()?)? * scale)?;
        let scores = match mask {
            Some(m) => scores.broadcast_add(m)?,
            None => scores,
        };
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let out = probs.matmul(&v_all)?; // [b, n_kv, n_rep*seq, hd]
        let out = out.reshape((b, self.n_heads, seq, self.head_dim))?.transpose(1, 2)?.reshape((
            b,
            seq,
            self.n_heads * self.head_dim,
        ))?;
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
