//! Per-session key/value cache with cheap rollback.
//!
//! Each layer keeps one preallocated buffer `[1, n_kv_heads, capacity, head_dim]` for keys and
//! one for values; `len` says how many positions are valid. Appending writes in place
//! (`slice_set`), attention reads a narrowed view, and truncation only lowers `len`: rolling
//! back rejected draft tokens copies nothing. Capacity grows by doubling (one copy per growth,
//! amortised) up to the model's context length.

use crate::error::{Error, Result};
use candle_core::{DType, Device, Tensor};

/// First allocation, in positions: enough for a prompt, small enough for many idle sessions.
const INITIAL_CAPACITY: usize = 256;

/// Per-session KV cache (one per session; owned by the service's session table).
/// Buffers are allocated lazily on the first forward, so an idle session costs nothing.
pub struct KvCache {
    pub(crate) model_id: u64,
    layers: Vec<LayerCache>,
    n_layers: usize,
    len: usize,
    capacity: usize,
    max_len: usize,
    n_kv_heads: usize,
    head_dim: usize,
    device: Device,
}

/// One layer's buffers: plain vectors on the CPU (read in place by the attention kernel),
/// candle tensors on other devices.
enum LayerCache {
    Host { k: Vec<f32>, v: Vec<f32> },
    Device { k: Tensor, v: Tensor },
}

impl KvCache {
    pub(crate) fn new(
        model_id: u64,
        n_layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        max_len: usize,
        device: Device,
    ) -> Self {
        Self { model_id, layers: Vec::new(), n_layers, len: 0, capacity: 0, max_len, n_kv_heads, head_dim, device }
    }

    /// Committed positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops every position from `len` on. `len > self.len()` is an error. O(1): no copy.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(Error::TruncateBeyondLength { len: self.len, requested: len });
        }
        self.len = len;
        Ok(())
    }

    /// Bytes held by the buffers (allocated capacity, not just the valid positions).
    pub fn bytes(&self) -> usize {
        self.layers.len() * 2 * self.n_kv_heads * self.capacity * self.head_dim * 4
    }

    /// Bytes the buffers take once they hold `positions` positions (the capacity [`KvCache::reserve`] grows to),
    /// whatever they hold now: what a session of that length costs a worker's memory budget.
    pub fn bytes_for(&self, positions: usize) -> usize {
        self.n_layers * 2 * self.n_kv_heads * self.capacity_for(positions) * self.head_dim * 4
    }

    fn capacity_for(&self, needed: usize) -> usize {
        let mut capacity = self.capacity.max(INITIAL_CAPACITY);
        while capacity < needed {
            capacity *= 2;
        }
        capacity.min(self.max_len).max(needed)
    }

    /// Makes room for `extra` more positions, growing every layer's buffers when needed.
    pub(crate) fn reserve(&mut self, extra: usize) -> Result<()> {
        let needed = self.len + extra;
        if needed <= self.capacity {
            return Ok(());
        }
        let capacity = self.capacity_for(needed);
        let shape = (1, self.n_kv_heads, capacity, self.head_dim);
        let (hd, old_cap, len) = (self.head_dim, self.capacity, self.len);
        let mut layers = Vec::with_capacity(self.n_layers);
        for i in 0..self.n_layers {
            let layer = match (&self.device, self.layers.get(i)) {
                (Device::Cpu, old) => {
                    let mut k = vec![0f32; self.n_kv_heads * capacity * hd];
                    let mut v = vec![0f32; self.n_kv_heads * capacity * hd];
                    if let Some(LayerCache::Host { k: ok, v: ov }) = old {
                        for h in 0..self.n_kv_heads {
                            let (src, dst) = (h * old_cap * hd, h * capacity * hd);
                            k[dst..dst + len * hd].copy_from_slice(&ok[src..src + len * hd]);
                            v[dst..dst + len * hd].copy_from_slice(&ov[src..src + len * hd]);
                        }
                    }
                    LayerCache::Host { k, v }
                }
                (device, old) => {
                    let k = Tensor::zeros(shape, DType::F32, device)?;
                    let v = Tensor::zeros(shape, DType::F32, device)?;
                    if let Some(LayerCache::Device { k: ok, v: ov }) = old
                        && len > 0
                    {
                        k.slice_set(&ok.narrow(2, 0, len)?.contiguous()?, 2, 0)?;
                        v.slice_set(&ov.narrow(2, 0, len)?.contiguous()?, 2, 0)?;
                    }
                    LayerCache::Device { k, v }
                }
            };
            layers.push(layer);
        }
        self.layers = layers;
        self.capacity = capacity;
        Ok(())
    }

    /// Writes this step's keys/values `[1, n_kv, seq, hd]` of `layer` at position `self.len()`
    /// and returns views over all valid positions including them (device caches). The caller
    /// bumps the length with [`KvCache::advance`] once every layer has been written.
    pub(crate) fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let seq = k.dim(2)?;
        let LayerCache::Device { k: kb, v: vb } = &self.layers[layer] else {
            return Err(candle_core::Error::Msg("append on a host KV cache".into()).into());
        };
        kb.slice_set(k, 2, self.len)?;
        vb.slice_set(v, 2, self.len)?;
        Ok((kb.narrow(2, 0, self.len + seq)?, vb.narrow(2, 0, self.len + seq)?))
    }

    /// Writes `seq` positions of keys and values given as rows `[seq][n_kv_heads · head_dim]`
    /// at position `self.len()` of a host cache's `layer`.
    pub(crate) fn write_rows(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        let (hd, cap, len, n_kv) = (self.head_dim, self.capacity, self.len, self.n_kv_heads);
        let LayerCache::Host { k: kb, v: vb } = &mut self.layers[layer] else {
            return Err(candle_core::Error::Msg("host write on a device KV cache".into()).into());
        };
        for (i, (kr, vr)) in k.chunks_exact(n_kv * hd).zip(v.chunks_exact(n_kv * hd)).enumerate() {
            for h in 0..n_kv {
                let at = (h * cap + len + i) * hd;
                kb[at..at + hd].copy_from_slice(&kr[h * hd..(h + 1) * hd]);
                vb[at..at + hd].copy_from_slice(&vr[h * hd..(h + 1) * hd]);
            }
        }
        Ok(())
    }

    /// Positions allocated per kv head: the stride of the buffers.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Layer `layer`'s host key and value buffers, each `[n_kv_heads][capacity][head_dim]`.
    pub(crate) fn host_buffers(&self, layer: usize) -> Result<(&[f32], &[f32])> {
        match &self.layers[layer] {
            LayerCache::Host { k, v } => Ok((k, v)),
            LayerCache::Device { .. } => Err(candle_core::Error::Msg("device KV cache read as host".into()).into()),
        }
    }

    pub(crate) fn advance(&mut self, seq: usize) {
        self.len += seq;
    }
}
