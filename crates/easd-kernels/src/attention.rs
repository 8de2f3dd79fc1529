//! Causal grouped-query attention over a per-session KV cache, batch-invariant: each (query,
//! head) pair is computed alone — scores over exactly the keys up to its position, a softmax and
//! a weighted sum in a fixed order — so its result does not depend on how many queries share the
//! call or on the cache's capacity.

use std::cell::RefCell;

use crate::isa::Isa;
use crate::pool::pool;
use crate::scalar::{LANES, reduce_lanes};

thread_local! {
    /// Each thread's buffer for one head's scores.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The layout of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Queries in this call, at positions `start..start + seq`.
    pub seq: usize,
    pub start: usize,
    /// Positions allocated per kv head in the cache buffers (their stride).
    pub kv_capacity: usize,
}

/// `q`: `[seq][n_heads][head_dim]` (rotated); `k`, `v`: `[n_kv_heads][kv_capacity][head_dim]`
/// holding positions `0..start + seq`. Returns `[seq][n_heads · head_dim]`.
pub fn attention(shape: AttentionShape, q: &[f32], k: &[f32], v: &[f32], scale: f32) -> Vec<f32> {
    let AttentionShape { n_heads, n_kv_heads, head_dim: hd, seq, start, kv_capacity } = shape;
    assert!(n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads), "heads {n_heads} / kv heads {n_kv_heads}");
    assert_eq!(q.len(), n_heads * seq * hd, "query buffer");
    assert!(start + seq <= kv_capacity, "positions beyond the cache");
    assert_eq!(k.len(), n_kv_heads * kv_capacity * hd, "key buffer");
    assert_eq!(v.len(), k.len(), "value buffer");
    let group = n_heads / n_kv_heads;
    let isa = Isa::active();
    let mut out = vec![0f32; seq * n_heads * hd];
    let one = |scores: &mut Vec<f32>, (idx, o): (usize, &mut [f32])| {
        let (i, h) = (idx / n_heads, idx % n_heads);
        let keys = start + i + 1;
        let base = (h / group) * kv_capacity * hd;
        let qrow = &q[(i * n_heads + h) * hd..(i * n_heads + h + 1) * hd];
        head(isa, qrow, &k[base..base + keys * hd], &v[base..base + keys * hd], scale, scores, o);
    };
    // One piece per (position, head), each writing its own output row.
    pool().for_each_item(out.chunks_mut(hd).collect(), &|idx, o| {
        SCORES.with_borrow_mut(|scores| one(scores, (idx, o)));
    });
    out
}

fn head(isa: Isa, q: &[f32], k: &[f32], v: &[f32], scale: f32, scores: &mut Vec<f32>, out: &mut [f32]) {
    match isa {
        // SAFETY: `Isa::active` only returns paths the CPU has.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => unsafe { head_avx2(q, k, v, scale, scores, out) },
        _ => head_body(q, k, v, scale, scores, out),
    }
}

/// The same code compiled for AVX2: wider registers, the same IEEE operations in the same order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn head_avx2(q: &[f32], k: &[f32], v: &[f32], scale: f32, scores: &mut Vec<f32>, out: &mut [f32]) {
    head_body(q, k, v, scale, scores, out)
}

#[inline(always)]
fn head_body(q: &[f32], k: &[f32], v: &[f32], scale: f32, scores: &mut Vec<f32>, out: &mut [f32]) {
    let hd = q.len();
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for key in k.chunks_exact(hd) {
        let s = dot(q, key) * scale;
        max = max.max(s);
        scores.push(s);
    }
    let mut lanes = [0f32; LANES];
    for chunk in scores.chunks_mut(LANES) {
        for (l, s) in chunk.iter_mut().enumerate() {
            *s = exp_nonpositive(*s - max);
            lanes[l] += *s;
        }
    }
    let inv = 1.0 / reduce_lanes(&lanes);
    out.fill(0.0);
    for (&e, val) in scores.iter().zip(v.chunks_exact(hd)) {
        let p = e * inv;
        for (o, &x) in out.iter_mut().zip(val) {
            *o += p * x;
        }
    }
}

/// Dot product with eight lane accumulators (element j into lane j % 8), then the fixed tree.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            lanes[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        lanes[l] += x * y;
    }
    reduce_lanes(&lanes)
}

/// e^x for x ≤ 0 (Cody–Waite reduction, degree-6 Taylor on |r| ≤ ln2/2: ~1e-7 relative); 0
/// below −87. Branch-free so the loops above vectorise.
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2^23
    let xc = if x > -87.0 { x } else { -87.0 };
    let k = xc * LOG2E + ROUND;
    let n = k - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let pow2 = f32::from_bits(((k.to_bits() as i32 - 0x4B40_0000 + 127) << 23) as u32);
    if x >= -87.0 { p * pow2 } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_the_library_to_float_rounding() {
        for i in 0..10_000 {
            let x = -(i as f32) * 0.0087;
            let (ours, std) = (exp_nonpositive(x), x.exp());
            assert!((ours - std).abs() <= 4e-7 * std + 1e-38, "x {x}: {ours} vs {std}");
        }
        assert_eq!(exp_nonpositive(-100.0), 0.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpositive(0.0), 1.0);
    }
}
