//! The portable path, and the reference every SIMD path is tested against bit for bit.
//!
//! Canonical arithmetic (shared by every path, so all of them give identical bits): each block's
//! dot product is an exact integer sum; a few f32 operations turn it into the block's value
//! ([`q8_value`], [`q4k_value`], [`q6k_value`]); block `b`'s value is added to lane `b % 8`; the
//! eight lanes are summed in one fixed tree ([`reduce_lanes`]). Nothing depends on how many rows
//! are computed together, which is what makes the products batch-invariant.

use crate::act::ActRow;
use crate::format::{Format, f16_at, q4k_value as q4k_weight, q5_0_value, q6k_value as q6k_weight};

pub(crate) const LANES: usize = 8;

#[inline(always)]
pub(crate) fn reduce_lanes(a: &[f32; LANES]) -> f32 {
    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

/// Q8_0 / Q5_0 block: weight scale × activation scale × integer dot.
#[inline(always)]
pub(crate) fn q8_value(dw: f32, da: f32, isum: i32) -> f32 {
    (dw * da) * isum as f32
}

/// Q4_K block: `da·d·Σ s·(q·a) − da·dmin·Σ m·(Σa)`.
#[inline(always)]
pub(crate) fn q4k_value(da: f32, d: f32, dmin: f32, isum: i32, summin: i32) -> f32 {
    (da * d) * isum as f32 - (da * dmin) * summin as f32
}

/// Q6_K block: `da·d·Σ s·((q − 32)·a)`.
#[inline(always)]
pub(crate) fn q6k_value(da: f32, d: f32, isum: i32) -> f32 {
    (da * d) * isum as f32
}

/// `Σ m_j · (sum of sub-block j's activations)` of a Q4_K block (exact).
#[inline(always)]
pub(crate) fn q4k_summin(mins: &[u8], bsums: &[i32]) -> i32 {
    (0..8).map(|j| i32::from(mins[j]) * (bsums[2 * j] + bsums[2 * j + 1])).sum()
}

/// `32 · Σ s_g · (sum of group g's activations)` of a Q6_K block (exact): the −32 offset.
#[inline(always)]
pub(crate) fn q6k_offset(scales: &[u8], bsums: &[i32]) -> i32 {
    32 * (0..16).map(|g| i32::from(scales[g] as i8) * bsums[g]).sum::<i32>()
}

/// One weight row (`format` blocks) against one activation row.
pub(crate) fn dot_row(format: Format, w: &[u8], a: ActRow<'_>) -> f32 {
    let bb = format.held_block_bytes();
    let mut acc = [0f32; LANES];
    for (b, blk) in w.chunks_exact(bb).enumerate() {
        let value = match format {
            Format::Q8_0 => {
                let qa = &a.qs[32 * b..32 * b + 32];
                let isum: i32 = blk[2..34].iter().zip(qa).map(|(&w, &x)| i32::from(w as i8) * i32::from(x)).sum();
                q8_value(f16_at(blk, 0), a.scales[b], isum)
            }
            Format::Q5_0 => {
                let qa = &a.qs[32 * b..32 * b + 32];
                let dot: i32 = (0..32).map(|j| i32::from(q5_0_value(blk, j)) * i32::from(qa[j])).sum();
                q8_value(f16_at(blk, 0), a.scales[b], dot - 16 * a.sums[b])
            }
            Format::Q4K => {
                let qa = &a.qs[256 * b..256 * b + 256];
                let (scales, mins) = (&blk[4..12], &blk[12..20]);
                let isum: i32 = (0..8)
                    .map(|j| {
                        let dot: i32 =
                            (32 * j..32 * j + 32).map(|e| i32::from(q4k_weight(blk, e).0) * i32::from(qa[e])).sum();
                        i32::from(scales[j]) * dot
                    })
                    .sum();
                let summin = q4k_summin(mins, &a.sums[16 * b..16 * b + 16]);
                q4k_value(a.scales[b], f16_at(blk, 0), f16_at(blk, 2), isum, summin)
            }
            Format::Q6K => {
                let qa = &a.qs[256 * b..256 * b + 256];
                let scales = &blk[192..208];
                let isum: i32 = (0..16)
                    .map(|g| {
                        let dot: i32 =
                            (16 * g..16 * g + 16).map(|e| i32::from(q6k_weight(blk, e)) * i32::from(qa[e])).sum();
                        i32::from(scales[g] as i8) * dot
                    })
                    .sum();
                let offset = q6k_offset(scales, &a.sums[16 * b..16 * b + 16]);
                q6k_value(a.scales[b], f16_at(blk, 208), isum - offset)
            }
        };
        acc[b % LANES] += value;
    }
    reduce_lanes(&acc)
}
