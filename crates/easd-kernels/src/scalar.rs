//! The portable path, and the reference every SIMD path is tested against bit for bit.
//!
//! Canonical arithmetic (shared by every path, so all of them give identical bits): each block's
//! dot product is an exact integer sum; a few f32 operations turn it into the block's value
//! ([`q8_value`], [`q4k_value`], [`q6k_value`]); block `b`'s value is added to lane `b % 8`; the
//! eight lanes are summed in one fixed tree ([`reduce_lanes`]). Nothing depends on how many rows
//! are computed together, which is what makes the products batch-invariant.

use crate::act::ActRow;
use crate::format::{
    Format, f16_at, q4k_tile_scale_min, q4k_tile_value, q5_0_tile_value, q6k_tile_scale, q6k_tile_value,
    q8_0_tile_value,
};

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

/// Row `o` of a stripe of tile blocks (one tile's blocks in order) against one activation row.
pub(crate) fn dot_tile_row(format: Format, stripe: &[u8], o: usize, a: ActRow<'_>) -> f32 {
    let mut acc = [0f32; LANES];
    let (n, sums_per_block) = (format.block_len(), format.block_len() / format.act_format().sum_len());
    for (b, t) in stripe.chunks_exact(format.tile_block_bytes()).enumerate() {
        let qa = &a.qs[n * b..n * (b + 1)];
        let sums = &a.sums[sums_per_block * b..sums_per_block * (b + 1)];
        let value = match format {
            Format::Q8_0 => {
                let isum: i32 = (0..32).map(|e| i32::from(q8_0_tile_value(t, o, e)) * i32::from(qa[e])).sum();
                q8_value(f16_at(t, 2 * o), a.scales[b], isum)
            }
            Format::Q5_0 => {
                let dot: i32 = (0..32).map(|e| i32::from(q5_0_tile_value(t, o, e)) * i32::from(qa[e])).sum();
                q8_value(f16_at(t, 2 * o), a.scales[b], dot - 16 * sums[0])
            }
            Format::Q4K => {
                let (mut isum, mut summin) = (0i32, 0i32);
                for j in 0..8 {
                    let dot: i32 =
                        (32 * j..32 * j + 32).map(|e| i32::from(q4k_tile_value(t, o, e).0) * i32::from(qa[e])).sum();
                    let (s, m) = q4k_tile_scale_min(t, o, j);
                    isum += i32::from(s) * dot;
                    summin += i32::from(m) * (sums[2 * j] + sums[2 * j + 1]);
                }
                q4k_value(a.scales[b], f16_at(t, 2 * o), f16_at(t, 32 + 2 * o), isum, summin)
            }
            Format::Q6K => {
                let (mut isum, mut offset) = (0i32, 0i32);
                for (g, &group_sum) in sums.iter().enumerate() {
                    let dot: i32 =
                        (16 * g..16 * g + 16).map(|e| i32::from(q6k_tile_value(t, o, e)) * i32::from(qa[e])).sum();
                    let s = i32::from(q6k_tile_scale(t, o, g));
                    isum += s * dot;
                    offset += s * group_sum;
                }
                q6k_value(a.scales[b], f16_at(t, 2 * o), isum - 32 * offset)
            }
        };
        acc[b % LANES] += value;
    }
    reduce_lanes(&acc)
}
