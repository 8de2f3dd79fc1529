//! The decoder's small per-row operations, written once so every row is computed the same way
//! however many rows a forward holds.

use crate::attention::exp_nonpositive;
use crate::pool::pool;
use crate::scalar::{LANES, reduce_lanes};

/// RMS norm of each `weight.len()`-wide row of `x` in place: `x / sqrt(mean(x²) + eps) · weight`.
pub fn rms_norm_rows(x: &mut [f32], weight: &[f32], eps: f32) {
    let n = weight.len();
    for row in x.chunks_exact_mut(n) {
        let mut lanes = [0f32; LANES];
        for (l, &v) in row.iter().enumerate() {
            lanes[l % LANES] += v * v;
        }
        let scale = 1.0 / (reduce_lanes(&lanes) / n as f32 + eps).sqrt();
        for (v, &w) in row.iter_mut().zip(weight) {
            *v = *v * scale * w;
        }
    }
}

/// Elements per parallel piece of [`silu_mul`]: a decode step's 8,960 in a few pieces.
const SILU_PIECE: usize = 4096;

/// `silu(gate) · up`, element-wise, into `gate`; pieces in parallel (each element is computed
/// alone, so the split changes nothing). Its exp is most of a forward's time outside the products.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "silu_mul operands");
    pool().for_each_item(gate.chunks_mut(SILU_PIECE).collect(), &|i, piece| {
        silu_mul_piece(piece, &up[i * SILU_PIECE..]);
    });
}

fn silu_mul_piece(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        // e^{-|x|} ≤ 1 keeps the one exp in range: silu(x) = x·σ(x).
        let e = exp_nonpositive(-x.abs());
        let sigmoid = if x >= 0.0 { 1.0 / (1.0 + e) } else { e / (1.0 + e) };
        *g = x * sigmoid * u;
    }
}

/// `x += y`, element-wise.
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Adds `bias` to each `bias.len()`-wide row of `x`.
pub fn add_bias_rows(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_assign(row, bias);
    }
}

/// Rotary embedding of `x` (`rows × heads × head_dim`, row i at position `start + i`) with tables
/// `cos`/`sin` (`positions × head_dim/2`). `interleaved`: pairs (2j, 2j+1); else halves (j, j+hd/2).
pub fn rope_rows(
    x: &mut [f32],
    head_dim: usize,
    heads: usize,
    start: usize,
    cos: &[f32],
    sin: &[f32],
    interleaved: bool,
) {
    let half = head_dim / 2;
    for (i, row) in x.chunks_exact_mut(heads * head_dim).enumerate() {
        let (c, s) = (&cos[(start + i) * half..][..half], &sin[(start + i) * half..][..half]);
        for head in row.chunks_exact_mut(head_dim) {
            for j in 0..half {
                let (a, b) = if interleaved { (2 * j, 2 * j + 1) } else { (j, j + half) };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * c[j] - x1 * s[j];
                head[b] = x0 * s[j] + x1 * c[j];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_matches_its_definition() {
        let mut g: Vec<f32> = (-5000..5000).map(|i| i as f32 * 0.004).collect();
        let want: Vec<f32> = g.iter().map(|&x| x / (1.0 + (-x).exp()) * 2.0).collect();
        silu_mul(&mut g, &vec![2.0; 10_000]);
        for (a, b) in g.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
        }
    }

    #[test]
    fn rms_norm_gives_unit_rms_before_the_weight() {
        let mut x: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) * 0.3).collect();
        rms_norm_rows(&mut x, &[1.0; 32], 1e-6);
        for row in x.chunks(32) {
            let ms = row.iter().map(|v| v * v).sum::<f32>() / 32.0;
            assert!((ms - 1.0).abs() < 1e-4, "{ms}");
        }
    }
}
