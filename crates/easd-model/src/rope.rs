//! Rotary position embeddings with precomputed tables.

use crate::error::Result;
use candle_core::{DType, Device, Tensor};

pub(crate) struct Rope {
    cos: Tensor,
    sin: Tensor,
    /// The tables as host vectors `[max_len][head_dim / 2]` (CPU models; the tensors stay empty).
    cos_host: Vec<f32>,
    sin_host: Vec<f32>,
    head_dim: usize,
    interleaved: bool,
}

impl Rope {
    /// Tables `[max_len, head_dim / 2]` for frequencies `base^(-2i/head_dim)`.
    pub fn new(head_dim: usize, max_len: usize, base: f64, interleaved: bool, device: &Device) -> Result<Self> {
        let half = head_dim / 2;
        let inv_freq: Vec<f32> =
            (0..half).map(|i| (1.0 / base.powf(2.0 * i as f64 / head_dim as f64)) as f32).collect();
        if device.is_cpu() {
            let angles: Vec<f32> = (0..max_len).flat_map(|p| inv_freq.iter().map(move |&f| p as f32 * f)).collect();
            let empty = Tensor::zeros(0, DType::F32, device)?;
            return Ok(Self {
                cos: empty.clone(),
                sin: empty,
                cos_host: angles.iter().map(|a| a.cos()).collect(),
                sin_host: angles.iter().map(|a| a.sin()).collect(),
                head_dim,
                interleaved,
            });
        }
        let inv_freq = Tensor::from_vec(inv_freq, (1, half), device)?;
        let positions = Tensor::arange(0u32, max_len as u32, device)?.to_dtype(DType::F32)?.reshape((max_len, 1))?;
        let angles = positions.broadcast_mul(&inv_freq)?;
        Ok(Self {
            cos: angles.cos()?,
            sin: angles.sin()?,
            cos_host: Vec::new(),
            sin_host: Vec::new(),
            head_dim,
            interleaved,
        })
    }

    /// Rotates rows `x: [seq][heads · head_dim]` at positions `start..` in place (CPU models).
    pub fn apply_host(&self, x: &mut [f32], heads: usize, start: usize) {
        easd_kernels::rope_rows(x, self.head_dim, heads, start, &self.cos_host, &self.sin_host, self.interleaved);
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
