//! Causal grouped-query attention over a per-session KV cache, batch-invariant: each (query,
//! head) pair is computed as if alone — scores over exactly the keys up to its position, a softmax
//! and a weighted sum in a fixed order — so its result does not depend on how many queries share
//! the call or on the cache's capacity. The query heads that share a kv head are computed together
//! only so that they read its keys and values once: at long contexts those reads, not the
//! arithmetic, were the cost.

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
    // One piece per (position, kv head), writing the output rows of the `group` query heads that share the kv
    // head: they read its keys and values once between them instead of once each.
    pool().for_each_item(out.chunks_mut(group * hd).collect(), &|idx, o| {
        let (i, g) = (idx / n_kv_heads, idx % n_kv_heads);
        let keys = start + i + 1;
        let base = g * kv_capacity * hd;
        let qs = &q[(i * n_heads + g * group) * hd..(i * n_heads + (g + 1) * group) * hd];
        let (k, v) = (&k[base..base + keys * hd], &v[base..base + keys * hd]);
        SCORES.with_borrow_mut(|scores| heads(isa, hd, qs, k, v, scale, scores, o));
    });
    out
}

/// Attention of the query heads `qs` (`[heads][hd]`) that share one kv head over its `k`, `v` (`[keys][hd]`) into
/// `out` (`[heads][hd]`). Each head's arithmetic is that of a head computed alone (see `heads_body`).
#[allow(clippy::too_many_arguments)]
fn heads(isa: Isa, hd: usize, qs: &[f32], k: &[f32], v: &[f32], scale: f32, scores: &mut Vec<f32>, out: &mut [f32]) {
    match isa {
        // SAFETY: `Isa::active` only returns paths the CPU has.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni | Isa::Amx => unsafe { heads_avx2(hd, qs, k, v, scale, scores, out) },
        // SAFETY: the portable loops need no feature.
        _ => unsafe { heads_body::<Portable>(hd, qs, k, v, scale, scores, out) },
    }
}

/// The two inner loops of attention: scoring keys, and adding weighted values. Each path performs the portable
/// path's IEEE operations in the same order (a multiply, then an add: never fused), so all give the same bits.
/// Safety (both methods): the CPU has the implementation's features.
trait HeadOps {
    /// Each lane of [`dot`] for `q` against the [`KEYS_AT_ONCE`] keys in `keys`, before the lanes' tree.
    unsafe fn dot_lanes(q: &[f32], keys: &[f32]) -> [[f32; LANES]; KEYS_AT_ONCE];
    /// `out[e] += ps[j] · vals[j][e]` for j in order, every element e alone.
    unsafe fn add_weighted(out: &mut [f32], ps: &[f32], vals: &[f32]);
}

struct Portable;

impl HeadOps for Portable {
    #[inline(always)]
    unsafe fn dot_lanes(q: &[f32], keys: &[f32]) -> [[f32; LANES]; KEYS_AT_ONCE] {
        let hd = q.len();
        std::array::from_fn(|j| dot_lanes(q, &keys[j * hd..(j + 1) * hd]))
    }

    #[inline(always)]
    unsafe fn add_weighted(out: &mut [f32], ps: &[f32], vals: &[f32]) {
        for (&p, val) in ps.iter().zip(vals.chunks_exact(out.len())) {
            for (o, &x) in out.iter_mut().zip(val) {
                *o += p * x;
            }
        }
    }
}

/// The loops with AVX2 intrinsics (the compiler vectorised the portable ones across keys, with shuffles).
#[cfg(target_arch = "x86_64")]
struct Avx2;

#[cfg(target_arch = "x86_64")]
impl HeadOps for Avx2 {
    #[inline(always)]
    unsafe fn dot_lanes(q: &[f32], keys: &[f32]) -> [[f32; LANES]; KEYS_AT_ONCE] {
        use core::arch::x86_64::*;
        let hd = q.len();
        let whole = hd - hd % LANES;
        assert!(keys.len() == KEYS_AT_ONCE * hd);
        let mut lanes = [[0f32; LANES]; KEYS_AT_ONCE];
        // SAFETY: AVX2 is the caller's contract; every load reads 8 floats inside `q` or one key of `keys`
        // (`c + 8 ≤ whole ≤ hd`, lengths asserted above).
        unsafe {
            let mut acc = [_mm256_setzero_ps(); KEYS_AT_ONCE];
            for c in (0..whole).step_by(LANES) {
                let x = _mm256_loadu_ps(q.as_ptr().add(c));
                for (j, acc) in acc.iter_mut().enumerate() {
                    let y = _mm256_loadu_ps(keys.as_ptr().add(j * hd + c));
                    *acc = _mm256_add_ps(*acc, _mm256_mul_ps(x, y));
                }
            }
            for (lanes, acc) in lanes.iter_mut().zip(acc) {
                _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
            }
        }
        for (j, lanes) in lanes.iter_mut().enumerate() {
            for (l, (x, y)) in q[whole..].iter().zip(&keys[j * hd + whole..(j + 1) * hd]).enumerate() {
                lanes[l] += x * y;
            }
        }
        lanes
    }

    #[inline(always)]
    unsafe fn add_weighted(out: &mut [f32], ps: &[f32], vals: &[f32]) {
        use core::arch::x86_64::*;
        let hd = out.len();
        assert!(vals.len() >= ps.len() * hd);
        // Four registers of outputs at a time stay in registers over all the values.
        const SPAN: usize = 4 * LANES;
        let whole = hd - hd % SPAN;
        // SAFETY: AVX2 is the caller's contract; loads and stores stay inside `out` (`c + 32 ≤ whole ≤ hd`) and
        // value row j of `vals` (`j < ps.len()`, length asserted above).
        unsafe {
            for c in (0..whole).step_by(SPAN) {
                let o = out.as_mut_ptr().add(c);
                let mut acc: [__m256; 4] = std::array::from_fn(|r| _mm256_loadu_ps(o.add(r * LANES)));
                for (j, &p) in ps.iter().enumerate() {
                    let p = _mm256_set1_ps(p);
                    let x = vals.as_ptr().add(j * hd + c);
                    for (r, acc) in acc.iter_mut().enumerate() {
                        *acc = _mm256_add_ps(*acc, _mm256_mul_ps(p, _mm256_loadu_ps(x.add(r * LANES))));
                    }
                }
                for (r, acc) in acc.into_iter().enumerate() {
                    _mm256_storeu_ps(o.add(r * LANES), acc);
                }
            }
        }
        for (&p, val) in ps.iter().zip(vals.chunks_exact(hd)) {
            for (o, &x) in out[whole..].iter_mut().zip(&val[whole..]) {
                *o += p * x;
            }
        }
    }
}

/// The attention of a head group with the AVX2 loops. Safety: the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn heads_avx2(hd: usize, qs: &[f32], k: &[f32], v: &[f32], scale: f32, scores: &mut Vec<f32>, out: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe { heads_body::<Avx2>(hd, qs, k, v, scale, scores, out) }
}

/// Keys scored together: each key's dot product is one chain of dependent adds, so several keys at once keep the
/// adder busy (each still summed in `dot`'s order); the block stays in L1 while every head of the group scores it.
const KEYS_AT_ONCE: usize = 4;

/// Values a block of the weighted sums holds in L1 while every head of the group adds them in.
const VALUES_AT_ONCE: usize = 16;

/// Per head: scores over the keys (`dot`, × scale), a softmax (max, `exp_nonpositive`, the sum in eight lanes and
/// the fixed tree), and the weighted sum of the values in key order. The heads only share the reads.
/// Safety: the CPU has `O`'s features.
#[inline(always)]
unsafe fn heads_body<O: HeadOps>(
    hd: usize,
    qs: &[f32],
    k: &[f32],
    v: &[f32],
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let (group, keys) = (qs.len() / hd, k.len() / hd);
    scores.clear();
    // Each head's scores, then one 1/Σ per head.
    scores.resize(group * keys + group, 0.0);
    let (all, inv) = scores.split_at_mut(group * keys);
    for (b, block) in k.chunks(KEYS_AT_ONCE * hd).enumerate() {
        for (q, head_scores) in qs.chunks_exact(hd).zip(all.chunks_exact_mut(keys)) {
            let dst = &mut head_scores[b * KEYS_AT_ONCE..][..block.len() / hd];
            if let Ok(whole) = <&mut [f32; KEYS_AT_ONCE]>::try_from(&mut *dst) {
                // SAFETY: `O`'s features are the caller's contract.
                *whole = unsafe { O::dot_lanes(q, block) }.map(|lanes| reduce_lanes(&lanes));
            } else {
                for (d, key) in dst.iter_mut().zip(block.chunks_exact(hd)) {
                    *d = dot(q, key);
                }
            }
            for d in dst {
                *d *= scale;
            }
        }
    }
    for (head_scores, inv) in all.chunks_exact_mut(keys).zip(inv.iter_mut()) {
        let max = head_scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        let mut lanes = [0f32; LANES];
        for chunk in head_scores.chunks_mut(LANES) {
            for (l, s) in chunk.iter_mut().enumerate() {
                *s = exp_nonpositive(*s - max);
                lanes[l] += *s;
            }
        }
        *inv = 1.0 / reduce_lanes(&lanes);
    }
    out.fill(0.0);
    for (b, block) in v.chunks(VALUES_AT_ONCE * hd).enumerate() {
        for ((o, head_scores), &inv) in out.chunks_exact_mut(hd).zip(all.chunks_exact(keys)).zip(inv.iter()) {
            let mut ps = [0f32; VALUES_AT_ONCE];
            let ps = &mut ps[..block.len() / hd];
            for (p, &e) in ps.iter_mut().zip(&head_scores[b * VALUES_AT_ONCE..]) {
                *p = e * inv;
            }
            // SAFETY: as above.
            unsafe { O::add_weighted(o, ps, block) };
        }
    }
}

/// Dot product with eight lane accumulators (element j into lane j % 8), then the fixed tree.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    reduce_lanes(&dot_lanes(a, b))
}

/// [`dot`]'s lanes before the tree.
#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> [f32; LANES] {
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
    lanes
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

    /// One element after another into lane j % 8, then the fixed tree: what `dot` and `dots` must give.
    fn dot_reference(a: &[f32], b: &[f32]) -> f32 {
        let mut lanes = [0f32; LANES];
        for (j, (x, y)) in a.iter().zip(b).enumerate() {
            lanes[j % LANES] += x * y;
        }
        reduce_lanes(&lanes)
    }

    /// The head as it was first written: one key at a time.
    fn head_reference(q: &[f32], k: &[f32], v: &[f32], scale: f32) -> Vec<f32> {
        let hd = q.len();
        let scores: Vec<f32> = k.chunks_exact(hd).map(|key| dot_reference(q, key) * scale).collect();
        let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        let e: Vec<f32> = scores.iter().map(|s| exp_nonpositive(s - max)).collect();
        let mut lanes = [0f32; LANES];
        for (i, x) in e.iter().enumerate() {
            lanes[i % LANES] += x;
        }
        let inv = 1.0 / reduce_lanes(&lanes);
        let mut out = vec![0f32; hd];
        for (&x, val) in e.iter().zip(v.chunks_exact(hd)) {
            let p = x * inv;
            for (o, &y) in out.iter_mut().zip(val) {
                *o += p * y;
            }
        }
        out
    }

    #[test]
    fn heads_and_keys_taken_together_give_the_bits_of_each_alone_on_every_path() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        };
        for hd in [64, 128, 20] {
            for keys in [1, 3, 4, 5, 9, 130] {
                let q: Vec<f32> = (0..hd).map(|_| next()).collect();
                let k: Vec<f32> = (0..keys * hd).map(|_| next()).collect();
                let v: Vec<f32> = (0..keys * hd).map(|_| next()).collect();
                for key in k.chunks_exact(hd) {
                    assert_eq!(dot(&q, key).to_bits(), dot_reference(&q, key).to_bits());
                }
                // A group of heads sharing the kv head: each gets the bits it gets alone.
                for group in [1, 6, 7] {
                    let qs: Vec<f32> = (0..group * hd).map(|_| next()).collect();
                    let expected: Vec<f32> =
                        qs.chunks_exact(hd).flat_map(|q| head_reference(q, &k, &v, 0.09)).collect();
                    for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
                        let (mut scores, mut out) = (Vec::new(), vec![f32::NAN; group * hd]);
                        heads(isa, hd, &qs, &k, &v, 0.09, &mut scores, &mut out);
                        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&out), bits(&expected), "{isa:?}, head_dim {hd}, {keys} keys, {group} heads");
                    }
                }
            }
        }
    }

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
