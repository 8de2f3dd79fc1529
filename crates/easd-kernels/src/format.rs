//! GGML block layouts of the weight formats the kernels read, and their plain dequantization.
//!
//! Layouts (little-endian, as in GGUF files):
//! * Q8_0, 32 weights, 34 bytes: `f16 d, i8 q[32]`; w = d·q.
//! * Q5_0, 32 weights, 22 bytes: `f16 d, u8 qh[4], u8 qs[16]`; weight j (< 16) is the low nibble of
//!   `qs[j]`, weight j + 16 its high nibble, bit j of `qh` is the fifth bit; w = d·(q − 16).
//! * Q4_K, 256 weights, 144 bytes: `f16 d, f16 dmin, u8 scales[12], u8 qs[128]`; eight sub-blocks of 32
//!   with 6-bit scale s and min m; w = d·s·q − dmin·m.
//! * Q6_K, 256 weights, 210 bytes: `u8 ql[128], u8 qh[64], i8 scales[16], f16 d`; sixteen groups of 16
//!   with an 8-bit scale; w = d·s·(q − 32).
//!
//! Repacked at load: a Q4_K block is held as `f16 d, f16 dmin, u8 scales[8], u8 mins[8], u8 qs[128]`
//! (148 bytes) so the kernels do not unpack the 6-bit fields on every product, and its weights are
//! reordered so that one 64-byte load gives 128 consecutive weights: byte `64h + i` holds weight
//! `128h + i` in its low nibble and `128h + 64 + i` in its high nibble (the file pairs weights 32
//! apart). Every other format is held as stored.

use crate::KernelError;

/// A weight format with a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    Q4K,
    Q6K,
    Q8_0,
    Q5_0,
}

/// How a weight format's activations are quantized (once per row, before any product).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActFormat {
    /// 256-value blocks: f32 scale, i8 values, sums of each 16 (ggml's Q8_K) — for the K-quants.
    Q8K,
    /// 32-value blocks: f32 scale, i8 values, block sum — for Q8_0 and Q5_0.
    Q8x32,
}

impl Format {
    pub const ALL: [Format; 4] = [Format::Q4K, Format::Q6K, Format::Q8_0, Format::Q5_0];

    /// Weights per block.
    pub const fn block_len(self) -> usize {
        match self {
            Format::Q4K | Format::Q6K => 256,
            Format::Q8_0 | Format::Q5_0 => 32,
        }
    }

    /// Bytes per block in a GGUF file.
    pub const fn block_bytes(self) -> usize {
        match self {
            Format::Q4K => 144,
            Format::Q6K => 210,
            Format::Q8_0 => 34,
            Format::Q5_0 => 22,
        }
    }

    /// Bytes per block as the kernels hold it (see the module doc).
    pub const fn held_block_bytes(self) -> usize {
        match self {
            Format::Q4K => Q4K_HELD_BYTES,
            other => other.block_bytes(),
        }
    }

    pub const fn act_format(self) -> ActFormat {
        match self {
            Format::Q4K | Format::Q6K => ActFormat::Q8K,
            Format::Q8_0 | Format::Q5_0 => ActFormat::Q8x32,
        }
    }

    /// Bytes of one row of `cols` weights in a GGUF file; an error when `cols` is not a whole
    /// number of blocks.
    pub fn row_bytes(self, cols: usize) -> Result<usize, KernelError> {
        if cols == 0 || !cols.is_multiple_of(self.block_len()) {
            return Err(KernelError::Columns { format: self, cols, block: self.block_len() });
        }
        Ok(cols / self.block_len() * self.block_bytes())
    }

    /// Converts one GGUF block to the held layout, appending it to `out`.
    pub(crate) fn hold_block(self, block: &[u8], out: &mut Vec<u8>) {
        match self {
            Format::Q4K => {
                out.extend_from_slice(&block[..4]);
                let packed = &block[4..16];
                out.extend((0..8).map(|j| q4k_scale_min(packed, j).0));
                out.extend((0..8).map(|j| q4k_scale_min(packed, j).1));
                let file_q = |e: usize| {
                    let byte = block[16 + 32 * (e / 64) + e % 32];
                    if e % 64 < 32 { byte & 0x0F } else { byte >> 4 }
                };
                out.extend((0..128).map(|k| {
                    let e = 128 * (k / 64) + k % 64;
                    file_q(e) | (file_q(e + 64) << 4)
                }));
            }
            _ => out.extend_from_slice(block),
        }
    }
}

impl ActFormat {
    pub const fn block_len(self) -> usize {
        match self {
            ActFormat::Q8K => 256,
            ActFormat::Q8x32 => 32,
        }
    }

    /// Values covered by one entry of the activation sums (16 for Q8_K's bsums, 32 for Q8x32).
    pub const fn sum_len(self) -> usize {
        match self {
            ActFormat::Q8K => 16,
            ActFormat::Q8x32 => 32,
        }
    }
}

/// Bytes of a held Q4_K block; its scales start at 4, its mins at 12, its weights at 20.
pub(crate) const Q4K_HELD_BYTES: usize = 148;
pub(crate) const Q4K_QS: usize = 20;

#[inline(always)]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Scale and min of sub-block `j` (0..8) of a Q4_K block from its 12 packed bytes.
#[inline(always)]
pub(crate) fn q4k_scale_min(q: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// The unsigned 5-bit value (0..32) of weight `j` of a Q5_0 block.
#[inline(always)]
pub(crate) fn q5_0_value(block: &[u8], j: usize) -> u8 {
    let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
    let nibble = if j < 16 { block[6 + j] & 0x0F } else { block[6 + j - 16] >> 4 };
    nibble | ((((qh >> j) & 1) as u8) << 4)
}

/// The unsigned 6-bit value (0..64) of weight `e` (0..256) of a Q6_K block.
#[inline(always)]
pub(crate) fn q6k_value(block: &[u8], e: usize) -> u8 {
    let (half, within) = (e / 128, e % 128);
    let (quarter, l) = (within / 32, within % 32);
    let ql = &block[64 * half..];
    let qh = block[128 + 32 * half + l];
    let low = match quarter {
        0 => ql[l] & 0x0F,
        1 => ql[l + 32] & 0x0F,
        2 => ql[l] >> 4,
        _ => ql[l + 32] >> 4,
    };
    low | (((qh >> (2 * quarter)) & 3) << 4)
}

/// The unsigned 4-bit value of weight `e` (0..256) of a held Q4_K block and its sub-block.
#[inline(always)]
pub(crate) fn q4k_value(block: &[u8], e: usize) -> (u8, usize) {
    let (half, within) = (e / 128, e % 128);
    let byte = block[Q4K_QS + 64 * half + within % 64];
    (if within < 64 { byte & 0x0F } else { byte >> 4 }, e / 32)
}

/// Dequantizes one held block into `out` (`format.block_len()` values).
pub(crate) fn dequantize_block(format: Format, block: &[u8], out: &mut [f32]) {
    match format {
        Format::Q8_0 => {
            let d = f16_at(block, 0);
            for (o, &q) in out.iter_mut().zip(&block[2..34]) {
                *o = d * f32::from(q as i8);
            }
        }
        Format::Q5_0 => {
            let d = f16_at(block, 0);
            for (j, o) in out.iter_mut().enumerate().take(32) {
                *o = d * f32::from(q5_0_value(block, j) as i8 - 16);
            }
        }
        Format::Q4K => {
            let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
            for (e, o) in out.iter_mut().enumerate().take(256) {
                let (q, sub) = q4k_value(block, e);
                let (s, m) = (block[4 + sub], block[12 + sub]);
                *o = d * f32::from(s) * f32::from(q) - dmin * f32::from(m);
            }
        }
        Format::Q6K => {
            let d = f16_at(block, 208);
            for (e, o) in out.iter_mut().enumerate().take(256) {
                let s = block[192 + e / 16] as i8;
                *o = d * f32::from(s) * f32::from(q6k_value(block, e) as i8 - 32);
            }
        }
    }
}
