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
//! Tiled at load: every format is held in tiles of [`TILE`] weight rows, block by block,
//! with the sixteen rows' values interleaved so that one 64-byte line holds four consecutive weights
//! of every row (byte `4o + i`: row `o`, weight `i` of the quad). A SIMD register then carries one
//! output per lane, an activation quad is broadcast to all of them, and no horizontal reduction is
//! needed (ggml's "repacked" GEMV idea, here with sixteen rows). Rows are padded with zero blocks to a
//! whole tile. The tile block of sixteen rows' block `b`:
//! * Q4_K (2368 bytes): `f16 d[16]`, `f16 dmin[16]`, `u8 scales[4][16][2]`, `u8 mins[4][16][2]` (pair
//!   `p` holds sub-blocks 2p and 2p + 1), then 32 lines: line `4j + q` holds in its low nibbles weights
//!   `32j + 4q ..+4` and in its high nibbles `32j + 16 + 4q ..+4`.
//! * Q6_K (3360 bytes): `f16 d[16]`, `i8 scales[8][16][2]` (pair `p`: groups 2p, 2p + 1), 32 lines of
//!   low four bits (line `2g + h`: low nibbles weights `16g + 8h ..+4`, high nibbles `16g + 8h + 4 ..+4`),
//!   then 16 lines of high two bits (line `g`: bits `2t, 2t + 1` of byte `4o + i` belong to weight
//!   `16g + 4t + i`).
//! * Q8_0 (544 bytes): `f16 d[16]`, then 8 lines (line `q`: weights `4q ..+4`), each value held as
//!   `q + 128` (u8), the unsigned operand `vpdpbusd` wants; the activations' block sum takes the
//!   128 back out.
//! * Q5_0 (352 bytes): `f16 d[16]`, 4 lines of low four bits (line `q`: low nibbles weights
//!   `4q ..+4`, high nibbles `16 + 4q ..+4`), then 1 line of fifth bits (byte `4o + i`: bit `2q` for
//!   weight `4q + i`, bit `2q + 1` for weight `16 + 4q + i`).
//!
//! Every tiled block is exactly as dense as the sixteen file blocks it holds, except Q4_K's, whose
//! scales and mins are unpacked to a byte each (2368 bytes against 2304).

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

    /// Bytes of one tile block: [`TILE`] rows' block `b`.
    pub(crate) const fn tile_block_bytes(self) -> usize {
        match self {
            Format::Q4K => Q4K_TILE_BYTES,
            _ => TILE * self.block_bytes(), // as dense as the file
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

    /// Writes the tile block made of `rows`' blocks (GGUF layout; `None`: a padding row of zeros)
    /// into `t` (`tile_block_bytes` long, zeroed).
    pub(crate) fn tile_block(self, rows: &[Option<&[u8]>; TILE], t: &mut [u8]) {
        let zero = [0u8; 210];
        let blk = |o: usize| rows[o].unwrap_or(&zero[..self.block_bytes()]);
        debug_assert_eq!(t.len(), self.tile_block_bytes());
        match self {
            Format::Q4K => {
                for o in 0..TILE {
                    let b = blk(o);
                    t[2 * o..2 * o + 2].copy_from_slice(&b[..2]);
                    t[32 + 2 * o..32 + 2 * o + 2].copy_from_slice(&b[2..4]);
                    for j in 0..8 {
                        let (s, m) = q4k_scale_min(&b[4..16], j);
                        t[Q4K_SCALES + 32 * (j / 2) + 2 * o + j % 2] = s;
                        t[Q4K_MINS + 32 * (j / 2) + 2 * o + j % 2] = m;
                    }
                    let file_q = |e: usize| {
                        let byte = b[16 + 32 * (e / 64) + e % 32];
                        if e % 64 < 32 { byte & 0x0F } else { byte >> 4 }
                    };
                    for j in 0..8 {
                        for q in 0..4 {
                            for i in 0..4 {
                                let e = 32 * j + 4 * q + i;
                                t[Q4K_LINES + 64 * (4 * j + q) + 4 * o + i] = file_q(e) | (file_q(e + 16) << 4);
                            }
                        }
                    }
                }
            }
            Format::Q6K => {
                for o in 0..TILE {
                    let b = blk(o);
                    t[2 * o..2 * o + 2].copy_from_slice(&b[208..210]);
                    for g in 0..16 {
                        t[Q6K_SCALES + 32 * (g / 2) + 2 * o + g % 2] = b[192 + g];
                        for i in 0..4 {
                            for h in 0..2 {
                                let e = 16 * g + 8 * h + i;
                                t[Q6K_LOW + 64 * (2 * g + h) + 4 * o + i] =
                                    (q6k_value(b, e) & 0x0F) | ((q6k_value(b, e + 4) & 0x0F) << 4);
                            }
                            t[Q6K_HIGH + 64 * g + 4 * o + i] =
                                (0..4).fold(0, |acc, q| acc | ((q6k_value(b, 16 * g + 4 * q + i) >> 4) << (2 * q)));
                        }
                    }
                }
            }
            Format::Q8_0 => {
                for o in 0..TILE {
                    let b = blk(o);
                    t[2 * o..2 * o + 2].copy_from_slice(&b[..2]);
                    for (e, &q) in b[2..34].iter().enumerate() {
                        t[32 + 64 * (e / 4) + 4 * o + e % 4] = q ^ 0x80;
                    }
                }
            }
            Format::Q5_0 => {
                for o in 0..TILE {
                    let b = blk(o);
                    t[2 * o..2 * o + 2].copy_from_slice(&b[..2]);
                    for q in 0..4 {
                        for i in 0..4 {
                            let (lo, hi) = (q5_0_value(b, 4 * q + i), q5_0_value(b, 16 + 4 * q + i));
                            t[32 + 64 * q + 4 * o + i] = (lo & 0x0F) | (hi << 4);
                            t[Q5_0_HIGH + 4 * o + i] |= ((lo >> 4) << (2 * q)) | ((hi >> 4) << (2 * q + 1));
                        }
                    }
                }
            }
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

/// Weight rows per tile.
pub(crate) const TILE: usize = 16;

/// Offsets in a Q4_K tile block: scale pairs, min pairs, weight lines; and its size.
pub(crate) const Q4K_SCALES: usize = 64;
pub(crate) const Q4K_MINS: usize = 192;
pub(crate) const Q4K_LINES: usize = 320;
pub(crate) const Q4K_TILE_BYTES: usize = Q4K_LINES + 32 * 64;

/// Offsets in a Q6_K tile block: scale pairs, low-bit lines, high-bit lines.
pub(crate) const Q6K_SCALES: usize = 32;
pub(crate) const Q6K_LOW: usize = 288;
pub(crate) const Q6K_HIGH: usize = Q6K_LOW + 32 * 64;

/// Offset of the weight lines in a Q8_0 or Q5_0 tile block, and of Q5_0's fifth-bit line.
pub(crate) const Q32_LINES: usize = 32;
pub(crate) const Q5_0_HIGH: usize = Q32_LINES + 4 * 64;

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

/// Weight `e` (0..256) of row `o` in a Q4_K tile block: its 4-bit value and its sub-block.
#[inline(always)]
pub(crate) fn q4k_tile_value(t: &[u8], o: usize, e: usize) -> (u8, usize) {
    let (j, within) = (e / 32, e % 32);
    let (high, q, i) = (within / 16, within % 16 / 4, within % 4);
    let byte = t[Q4K_LINES + 64 * (4 * j + q) + 4 * o + i];
    (if high == 0 { byte & 0x0F } else { byte >> 4 }, j)
}

/// Scale and min of sub-block `j` of row `o` in a Q4_K tile block.
#[inline(always)]
pub(crate) fn q4k_tile_scale_min(t: &[u8], o: usize, j: usize) -> (u8, u8) {
    let at = 32 * (j / 2) + 2 * o + j % 2;
    (t[Q4K_SCALES + at], t[Q4K_MINS + at])
}

/// Weight `e` (0..256) of row `o` in a Q6_K tile block: its unsigned 6-bit value.
#[inline(always)]
pub(crate) fn q6k_tile_value(t: &[u8], o: usize, e: usize) -> u8 {
    let (g, within) = (e / 16, e % 16);
    let (quad, i) = (within / 4, within % 4);
    let low = t[Q6K_LOW + 64 * (2 * g + quad / 2) + 4 * o + i];
    let low = if quad % 2 == 0 { low & 0x0F } else { low >> 4 };
    let high = (t[Q6K_HIGH + 64 * g + 4 * o + i] >> (2 * quad)) & 3;
    low | (high << 4)
}

/// Scale of group `g` (0..16) of row `o` in a Q6_K tile block.
#[inline(always)]
pub(crate) fn q6k_tile_scale(t: &[u8], o: usize, g: usize) -> i8 {
    t[Q6K_SCALES + 32 * (g / 2) + 2 * o + g % 2] as i8
}

/// Weight `e` (0..32) of row `o` in a Q8_0 tile block.
#[inline(always)]
pub(crate) fn q8_0_tile_value(t: &[u8], o: usize, e: usize) -> i8 {
    (t[Q32_LINES + 64 * (e / 4) + 4 * o + e % 4] ^ 0x80) as i8
}

/// Weight `e` (0..32) of row `o` in a Q5_0 tile block: its unsigned 5-bit value.
#[inline(always)]
pub(crate) fn q5_0_tile_value(t: &[u8], o: usize, e: usize) -> u8 {
    let (high, q, i) = (e / 16, e % 16 / 4, e % 4);
    let byte = t[Q32_LINES + 64 * q + 4 * o + i];
    let nibble = if high == 0 { byte & 0x0F } else { byte >> 4 };
    nibble | (((t[Q5_0_HIGH + 4 * o + i] >> (2 * q + high)) & 1) << 4)
}

/// Dequantizes row `o` of one tile block into `out` (`format.block_len()` values).
pub(crate) fn dequantize_tile_row(format: Format, t: &[u8], o: usize, out: &mut [f32]) {
    match format {
        Format::Q4K => {
            let (d, dmin) = (f16_at(t, 2 * o), f16_at(t, 32 + 2 * o));
            for (e, v) in out.iter_mut().enumerate().take(256) {
                let (q, sub) = q4k_tile_value(t, o, e);
                let (s, m) = q4k_tile_scale_min(t, o, sub);
                *v = d * f32::from(s) * f32::from(q) - dmin * f32::from(m);
            }
        }
        Format::Q6K => {
            let d = f16_at(t, 2 * o);
            for (e, v) in out.iter_mut().enumerate().take(256) {
                let s = q6k_tile_scale(t, o, e / 16);
                *v = d * f32::from(s) * f32::from(q6k_tile_value(t, o, e) as i8 - 32);
            }
        }
        Format::Q8_0 => {
            let d = f16_at(t, 2 * o);
            for (e, v) in out.iter_mut().enumerate().take(32) {
                *v = d * f32::from(q8_0_tile_value(t, o, e));
            }
        }
        Format::Q5_0 => {
            let d = f16_at(t, 2 * o);
            for (e, v) in out.iter_mut().enumerate().take(32) {
                *v = d * f32::from(q5_0_tile_value(t, o, e) as i8 - 16);
            }
        }
    }
}
