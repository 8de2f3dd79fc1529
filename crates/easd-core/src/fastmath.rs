//! Vectorisable kernels for 152k-entry logit vectors: a branch-free `exp` for arguments
//! <= 0, lane-parallel sums, and a sampler walk that reuses the per-block sums (Rust does not reassociate float adds, so plain `sum()` is
//! scalar; eight independent accumulators let the compiler use SIMD).

pub(crate) const LANES: usize = 8;
/// Lane accumulators are flushed into f64 (and, for samplers, recorded) every SUM_BLOCK
/// logits: f32 rounding stays ~1e-7 relative per block.
pub(crate) const SUM_BLOCK: usize = 128;

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// Minimax coefficients of (e^r - 1)/r on [-ln2/2, ln2/2], fitted for relative error:
/// degree 5 gives 9e-8 (below f32 rounding), degree 4 gives 2.8e-6.
const P5: [f32; 5] = [0.999_999_7, 0.499_991_5, 0.166_676_36, 0.041_897_933, 0.008_290_307];
const P4: [f32; 4] = [0.999_966_8, 0.500_030_1, 0.167_874_78, 0.041_513_81];

/// e^x for x in [-87, 0]: x = n·ln2 + r (Cody–Waite), e^r by polynomial, 2^n through the
/// exponent bits. Branch-free, so loops over it vectorise.
#[inline(always)]
fn exp_reduced<const PRECISE: bool>(x: f32) -> f32 {
    let k = x * LOG2E + ROUND_MAGIC;
    let n = k - ROUND_MAGIC;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = if PRECISE {
        1.0 + r * (P5[0] + r * (P5[1] + r * (P5[2] + r * (P5[3] + r * P5[4]))))
    } else {
        1.0 + r * (P4[0] + r * (P4[1] + r * (P4[2] + r * P4[3])))
    };
    let bits = ((k.to_bits() as i32 - 0x4B40_0000 + 127) << 23) as u32;
    p * f32::from_bits(bits)
}

/// (e^s, s') with s = (l - max)·inv_t: e^s to ~1.5e-7 relative (`PRECISE`, else ~3e-6),
/// exactly 0 below -87 and for -inf or NaN logits; s' = max(s, -87), so that s'·e^s is the
/// entropy term and never NaN. Comparisons are written as selects so they compile to one
/// SIMD instruction each. The same operations run on every path, so a scalar call and a
/// vectorised loop agree bit for bit.
#[inline(always)]
pub(crate) fn weight_arg<const PRECISE: bool>(l: f32, max: f32, inv_t: f32) -> (f32, f32) {
    let s = (l - max) * inv_t;
    let xc = if s > -87.0 { s } else { -87.0 };
    let y = exp_reduced::<PRECISE>(xc);
    (if s >= -87.0 { y } else { 0.0 }, xc)
}

/// e^((l - max) / T): the unnormalised softmax weight of one logit.
#[inline(always)]
pub(crate) fn weight(l: f32, max: f32, inv_t: f32) -> f32 {
    weight_arg::<true>(l, max, inv_t).0
}

#[cfg(test)]
fn exp_neg(x: f32) -> f32 {
    weight(x, 0.0, 1.0)
}

/// 1/T, kept finite so that a tiny temperature behaves as a (tie-splitting) argmax.
pub(crate) fn inv_temperature(t: f32) -> f32 {
    (1.0 / t).min(f32::MAX)
}

/// Sums over the softmax at one temperature: Z = Σ e^s and Σ s e^s, with s = (l - max)/T.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ExpSums {
    pub z: f64,
    pub s_e: f64,
}

impl ExpSums {
    /// Shannon entropy (nats) of the softmax: H = ln Z - Σ s e^s / Z.
    pub fn entropy(&self) -> f32 {
        if self.z > 0.0 { (self.z.ln() - self.s_e / self.z).max(0.0) as f32 } else { 0.0 }
    }
}

/// Reference: softmax sums with a known maximum (the one-pass `scan` is tested against it).
/// One pass: softmax sums at `inv_t`, and when `TWO` also at temperature 1. When `blocks` is
/// given, it receives Σ e^s (at `inv_t`) of every SUM_BLOCK-long block, for [`tail_walk`].
#[cfg(test)]
fn sums_kernel<const TWO: bool>(
    logits: &[f32],
    max: f32,
    inv_t: f32,
    mut blocks: Option<&mut Vec<f64>>,
) -> (ExpSums, ExpSums) {
    let (mut a, mut b) = (ExpSums::default(), ExpSums::default());
    if let Some(v) = blocks.as_deref_mut() {
        v.clear();
        v.reserve(logits.len().div_ceil(SUM_BLOCK));
    }
    let to_f64 = |v: &[f32; LANES]| v.iter().map(|&x| x as f64).sum::<f64>();
    for block in logits.chunks(SUM_BLOCK) {
        let (mut za, mut sa, mut zb, mut sb) = ([0f32; LANES], [0f32; LANES], [0f32; LANES], [0f32; LANES]);
        let chunks = block.chunks_exact(LANES);
        let rest = chunks.remainder();
        for c in chunks {
            for l in 0..LANES {
                let (e, s) = weight_arg::<true>(c[l], max, inv_t);
                za[l] += e;
                sa[l] += s * e;
                if TWO {
                    let (e1, s1) = weight_arg::<true>(c[l], max, 1.0);
                    zb[l] += e1;
                    sb[l] += s1 * e1;
                }
            }
        }
        for (l, &x) in rest.iter().enumerate() {
            let (e, s) = weight_arg::<true>(x, max, inv_t);
            za[l] += e;
            sa[l] += s * e;
            if TWO {
                let (e1, s1) = weight_arg::<true>(x, max, 1.0);
                zb[l] += e1;
                sb[l] += s1 * e1;
            }
        }
        let block_z = to_f64(&za);
        if let Some(v) = blocks.as_deref_mut() {
            v.push(block_z);
        }
        a.z += block_z;
        a.s_e += to_f64(&sa);
        if TWO {
            b.z += to_f64(&zb);
            b.s_e += to_f64(&sb);
        }
    }
    (a, if TWO { b } else { a })
}

/// One pass: softmax sums at `inv_t` (see [`sums_kernel`] for `blocks`).
#[cfg(test)]
pub(crate) fn exp_sums(logits: &[f32], max: f32, inv_t: f32, blocks: Option<&mut Vec<f64>>) -> ExpSums {
    sums_kernel::<false>(logits, max, inv_t, blocks).0
}

/// One pass, two temperatures (the request's, then 1): used when T != 1 and both the
/// sampling distribution and raw log-probabilities are needed. `blocks` are at `inv_t`.
#[cfg(test)]
pub(crate) fn exp_sums_two(logits: &[f32], max: f32, inv_t: f32, blocks: Option<&mut Vec<f64>>) -> (ExpSums, ExpSums) {
    sums_kernel::<true>(logits, max, inv_t, blocks)
}

/// Continues an inverse-CDF walk over every id not in `excluded` (sorted ascending), in id
/// order, with weights e^((l - max)·inv_t), until `remaining` is used up. `blocks` are the
/// per-block sums from the exp pass, so only the block where the walk ends is scanned.
/// Returns None only when no id outside `excluded` has positive weight.
pub(crate) fn tail_walk(
    logits: &[f32],
    max: f32,
    inv_t: f32,
    blocks: &[f64],
    excluded: &[u32],
    mut remaining: f64,
) -> Option<u32> {
    let mut last_block = None;
    let mut ex = 0usize;
    for (b, &block_sum) in blocks.iter().enumerate() {
        let (lo, hi) = (b * SUM_BLOCK, ((b + 1) * SUM_BLOCK).min(logits.len()));
        let ex_start = ex;
        while ex < excluded.len() && (excluded[ex] as usize) < hi {
            ex += 1;
        }
        let here = &excluded[ex_start..ex];
        let w = block_sum - here.iter().map(|&i| weight(logits[i as usize], max, inv_t) as f64).sum::<f64>();
        if w <= 0.0 {
            continue;
        }
        last_block = Some((lo, hi, ex_start, ex));
        if w <= remaining {
            remaining -= w;
            continue;
        }
        for (i, &l) in (lo..hi).zip(&logits[lo..hi]) {
            if here.contains(&(i as u32)) {
                continue;
            }
            let wi = weight(l, max, inv_t) as f64;
            if wi > 0.0 {
                if wi > remaining {
                    return Some(i as u32);
                }
                remaining -= wi;
            }
        }
    }
    // Rounding left a sliver: take the last positive-weight tail id.
    let (lo, hi, e0, e1) = last_block?;
    (lo..hi)
        .rev()
        .find(|&i| !excluded[e0..e1].contains(&(i as u32)) && weight(logits[i], max, inv_t) > 0.0)
        .map(|i| i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_matches_std_exp_to_a_few_ulps() {
        let mut x = -87.0f32;
        while x <= 0.0 {
            let (fast, exact) = (exp_neg(x) as f64, (x as f64).exp());
            assert!(((fast - exact) / exact).abs() < 5e-7, "x={x}: {fast} vs {exact}");
            x += 0.0137;
        }
        assert_eq!(exp_neg(0.0), 1.0);
        assert_eq!(exp_neg(-87.5), 0.0);
        assert_eq!(exp_neg(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn sums_and_entropy_match_a_direct_f64_computation() {
        let logits: Vec<f32> = (0..5003).map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0).collect();
        let max = logits.iter().cloned().fold(f32::MIN, f32::max);
        for t in [0.3f32, 1.0, 2.5] {
            let z: f64 = logits.iter().map(|&l| ((l - max) as f64 / t as f64).exp()).sum();
            let h: f64 = -logits
                .iter()
                .map(|&l| {
                    let p = ((l - max) as f64 / t as f64).exp() / z;
                    p * p.ln()
                })
                .sum::<f64>();
            let sums = exp_sums(&logits, max, 1.0 / t, None);
            assert!((sums.z / z - 1.0).abs() < 1e-5);
            assert!((sums.entropy() as f64 - h).abs() < 1e-4);
            let (a, b) = exp_sums_two(&logits, max, 1.0 / t, None);
            assert_eq!(a.z, sums.z);
            assert_eq!(b.z, exp_sums(&logits, max, 1.0, None).z);
        }
    }

    #[test]
    fn masked_logits_contribute_nothing() {
        let logits = [0.0, f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY];
        let sums = exp_sums(&logits, 0.0, 1.0, None);
        assert_eq!(sums.z, 2.0);
        assert!((sums.entropy() - std::f32::consts::LN_2).abs() < 1e-6);
    }
}

#[cfg(test)]
mod walk_tests {
    use super::*;

    /// The id where a walk over all non-excluded ids crosses `target`, computed naively.
    fn naive(logits: &[f32], excluded: &[u32], target: f64) -> Option<u32> {
        let mut acc = 0.0;
        for (i, &l) in logits.iter().enumerate() {
            if excluded.contains(&(i as u32)) {
                continue;
            }
            let w = weight(l, 0.0, 1.0) as f64;
            if w > 0.0 {
                acc += w;
                if acc > target {
                    return Some(i as u32);
                }
            }
        }
        None
    }

    #[test]
    fn the_tail_walk_lands_where_a_naive_walk_does() {
        let logits: Vec<f32> = (0..1000u32).map(|i| -((i.wrapping_mul(2654435761) >> 24) as f32) / 40.0).collect();
        let mut blocks = Vec::new();
        let z = exp_sums(&logits, 0.0, 1.0, Some(&mut blocks)).z;
        assert_eq!(blocks.len(), 8);
        let excluded = [3u32, 127, 128, 129, 500, 999];
        let ex_mass: f64 = excluded.iter().map(|&i| weight(logits[i as usize], 0.0, 1.0) as f64).sum();
        for k in 1..50 {
            let target = (z - ex_mass) * k as f64 / 50.0;
            assert_eq!(
                tail_walk(&logits, 0.0, 1.0, &blocks, &excluded, target),
                naive(&logits, &excluded, target),
                "k={k}"
            );
        }
        // Past the end by rounding: the last positive id that is not excluded.
        assert_eq!(tail_walk(&logits, 0.0, 1.0, &blocks, &excluded, z), Some(998));
    }

    #[test]
    fn a_tail_without_mass_yields_nothing() {
        let logits = [0.0, f32::NEG_INFINITY, f32::NEG_INFINITY];
        let mut blocks = Vec::new();
        exp_sums(&logits, 0.0, 1.0, Some(&mut blocks));
        assert_eq!(tail_walk(&logits, 0.0, 1.0, &blocks, &[0], 0.0), None);
    }
}
