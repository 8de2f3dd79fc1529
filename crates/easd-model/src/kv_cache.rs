//! Per-session key/value cache with cheap rollback.
//!
//! Each layer keeps one preallocated buffer `[1, n_kv_heads, capacity, head_dim]` for keys and
//! one for values; `len` says how many positions are valid. Appending writes in place
//! (`slice_set`), attention reads a narrowed view, and truncation only lowers `len`: rolling
//! back rejected draft tokens copies nothing. Capacity grows by doubling (one copy per growth,
//! amortised) up to the model's context length.

use crate::error::{Error, Result};
use candle_core::{DType, Device, Storage, Tensor};

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

struct LayerCache {
    k: Tensor,
    v: Tensor,
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

    /// Makes room for `extra` more positions, growing every layer's buffers when needed.
    pub(crate) fn reserve(&mut self, extra: usize) -> Result<()> {
        let needed = self.len + extra;
        if needed <= self.capacity {
            return Ok(());
        }
        let mut capacity = self.capacity.max(INITIAL_CAPACITY);
        while capacity < needed {
            capacity *= 2;
        }
        let capacity = capacity.min(self.max_len).max(needed);
        let shape = (1, self.n_kv_heads, capacity, self.head_dim);
        let mut layers = Vec::with_capacity(self.n_layers);
        for i in 0..self.n_layers {
            let k = Tensor::zeros(shape, DType::F32, &self.device)?;
            let v = Tensor::zeros(shape, DType::F32, &self.device)?;
            if let Some(old) = self.layers.get(i)
                && self.len > 0
            {
                k.slice_set(&old.k.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
                v.slice_set(&old.v.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
            }
            layers.push(LayerCache { k, v });
        }
        self.layers = layers;
        self.capacity = capacity;
        Ok(())
    }

    /// Writes this step's keys/values `[1, n_kv, seq, hd]` of `layer` at position `self.len()`
    /// and returns views over all valid positions including them. The caller bumps the length
    /// with [`KvCache::advance`] once every layer has been written.
    pub(crate) fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let seq = k.dim(2)?;
        let l = &self.layers[layer];
        l.k.slice_set(k, 2, self.len)?;
        l.v.slice_set(v, 2, self.len)?;
        Ok((l.k.narrow(2, 0, self.len + seq)?, l.v.narrow(2, 0, self.len + seq)?))
    }

    /// Writes this step's keys/values like [`KvCache::append`] without making views.
    pub(crate) fn write(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let l = &self.layers[layer];
        l.k.slice_set(k, 2, self.len)?;
        l.v.slice_set(v, 2, self.len)?;
        Ok(())
    }

    /// Positions allocated per kv head: the stride of the buffers.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Runs `f` on layer `layer`'s CPU key and value buffers, each `[n_kv_heads][capacity][head_dim]`.
    pub(crate) fn with_layer_buffers<T>(&self, layer: usize, f: impl FnOnce(&[f32], &[f32]) -> T) -> Result<T> {
        let l = &self.layers[layer];
        let (ks, kl) = l.k.storage_and_layout();
        let (vs, vl) = l.v.storage_and_layout();
        let (Storage::Cpu(k), Storage::Cpu(v)) = (&*ks, &*vs) else {
            return Err(candle_core::Error::Msg("KV cache buffers are not on the CPU".into()).into());
        };
        let n = kl.shape().elem_count();
        let k = &k.as_slice::<f32>()?[kl.start_offset()..kl.start_offset() + n];
        let v = &v.as_slice::<f32>()?[vl.start_offset()..vl.start_offset() + n];
        Ok(f(k, v))
    }

    pub(crate) fn advance(&mut self, seq: usize) {
        self.len += seq;
    }
}
