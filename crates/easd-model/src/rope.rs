//! Rotary position embeddings with precomputed tables.

use crate::error::Result;
use candle_core::{DType, Device, Tensor};

pub(crate) struct Rope {
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
}

impl Rope {
    /// Tables `[max_len, head_dim / 2]` for frequencies `base^(-2i/head_dim)`.
    pub fn new(head_dim: usize, max_len: usize, base: f64, interleaved: bool, device: &Device) -> Result<Self> {
        let half = head_dim / 2;
        let inv_freq: Vec<f32> =
            (0..half).map(|i| (1.0 / base.powf(2.0 * i as f64 / head_dim as f64)) as f32).collect();
        let inv_freq = Tensor::from_vec(inv_freq, (1, half), device)?;
        let positions = Tensor::arange(0u32, max_len as u32, device)?.to_dtype(DType::F32)?.reshape((max_len, 1))?;
        let angles = positions.broadcast_mul(&inv_freq)?;
        Ok(Self { cos: angles.cos()?, sin: angles.sin()?, interleaved })
    }

    /// Rotates `x: [b, heads, seq, head_dim]` (contiguous) for positions `start..start+seq`.
    pub fn apply(&self, x: &Tensor, start: usize) -> Result<Tensor> {
        let seq = x.dim(2)?;
        let cos = self.cos.narrow(0, start, seq)?;
        let sin = self.sin.narrow(0, start, seq)?;
        Ok(if self.interleaved {
            candle_nn::rotary_emb::rope_i(x, &cos, &sin)?
        } else {
            candle_nn::rotary_emb::rope(x, &cos, &sin)?
        })
    }
}
